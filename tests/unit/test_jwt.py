"""The JWT verifier of the HTTP faces (reach._jwt): what it takes, what it refuses and
says why, and how it keeps a JWKS (docs/a2a.md, *Identity*)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import time
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization

from reach._jwt import JwtRefused, JwtVerifier, KeySource, caller_of, parse_jwks
from reach.errors import ConfigError
from tests.support.jwts import (
    AUD,
    EC_KEY,
    ED_KEY,
    ISS,
    OTHER_RSA,
    RSA_KEY,
    claims,
    jwk_of,
    sign,
    write_jwks,
)

pytestmark = pytest.mark.anyio


@pytest.fixture
async def verifier(tmp_path: Path) -> JwtVerifier:
    where = write_jwks(
        tmp_path / "jwks.json",
        jwk_of(RSA_KEY, "rsa-1", "RS256"),
        jwk_of(EC_KEY, "ec-1", "ES256"),
        jwk_of(ED_KEY, "ed-1", "EdDSA"),
    )
    source = KeySource(where)
    await source.load()
    return JwtVerifier(source, audience=AUD, issuer=ISS)


@pytest.mark.parametrize(
    ("private", "alg", "kid"),
    [(RSA_KEY, "RS256", "rsa-1"), (EC_KEY, "ES256", "ec-1"), (ED_KEY, "EdDSA", "ed-1")],
)
async def test_a_token_signed_by_a_jwks_key_names_its_caller(
    verifier: JwtVerifier, private: Any, alg: str, kid: str
) -> None:
    assert await verifier.verify(sign(private, alg, kid)) == "alice"


async def refused(verifier: JwtVerifier, token: str) -> str:
    with pytest.raises(JwtRefused) as e:
        await verifier.verify(token)
    return str(e.value)


async def test_a_wrong_signature_is_refused(verifier: JwtVerifier) -> None:
    # signed by another key under the JWKS key's kid
    why = await refused(verifier, sign(OTHER_RSA, "RS256", "rsa-1"))
    assert why.startswith("Bad signature")
    # a token whose payload was changed after signing
    head, body, sig = sign(RSA_KEY, "RS256", "rsa-1").split(".")
    forged = json.loads(base64.urlsafe_b64decode(body + "=="))
    forged["sub"] = "mallory"
    body = base64.urlsafe_b64encode(json.dumps(forged).encode()).rstrip(b"=").decode()
    assert (await refused(verifier, f"{head}.{body}.{sig}")).startswith("Bad signature")


async def test_wrong_audience_or_issuer_is_refused(verifier: JwtVerifier) -> None:
    assert (await refused(verifier, sign(RSA_KEY, "RS256", "rsa-1", aud="other"))).startswith(
        "Wrong audience"
    )
    assert (await refused(verifier, sign(RSA_KEY, "RS256", "rsa-1", iss="evil"))).startswith(
        "Wrong issuer"
    )
    no_aud = claims()
    del no_aud["aud"]
    token = jwt.encode(no_aud, RSA_KEY, algorithm="RS256", headers={"kid": "rsa-1"})
    assert "'aud'" in await refused(verifier, token)


async def test_expiry_and_not_before_with_their_leeway(verifier: JwtVerifier) -> None:
    now = int(time.time())
    assert "expired" in await refused(verifier, sign(RSA_KEY, "RS256", "rsa-1", exp=now - 60))
    # within the 30 s leeway: taken
    assert await verifier.verify(sign(RSA_KEY, "RS256", "rsa-1", exp=now - 5)) == "alice"
    why = await refused(verifier, sign(RSA_KEY, "RS256", "rsa-1", nbf=now + 120))
    assert "not valid yet" in why
    assert await verifier.verify(sign(RSA_KEY, "RS256", "rsa-1", nbf=now + 5)) == "alice"
    no_exp = claims()
    del no_exp["exp"]
    token = jwt.encode(no_exp, RSA_KEY, algorithm="RS256", headers={"kid": "rsa-1"})
    assert "'exp'" in await refused(verifier, token)


async def test_alg_none_and_hmac_are_refused(verifier: JwtVerifier) -> None:
    unsigned = jwt.encode(claims(), None, algorithm="none", headers={"kid": "rsa-1"})
    assert "algorithm 'none'" in await refused(verifier, unsigned)
    # HS256 keyed with the RSA public key (the algorithm-confusion forgery)
    head = base64.urlsafe_b64encode(b'{"alg":"HS256","typ":"JWT","kid":"rsa-1"}').rstrip(b"=")
    body = base64.urlsafe_b64encode(json.dumps(claims()).encode()).rstrip(b"=")
    pem = RSA_KEY.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    sig = base64.urlsafe_b64encode(
        hmac.new(pem, head + b"." + body, hashlib.sha256).digest()
    ).rstrip(b"=")
    forged = (head + b"." + body + b"." + sig).decode()
    assert "algorithm 'HS256'" in await refused(verifier, forged)


async def test_an_unknown_kid_and_a_key_of_another_algorithm_are_refused(
    verifier: JwtVerifier,
) -> None:
    assert (await refused(verifier, sign(RSA_KEY, "RS256", "nope"))).startswith(
        "Unknown signing key"
    )
    # the EC key's kid on an RS256 token
    assert "is for ES256" in await refused(verifier, sign(RSA_KEY, "RS256", "ec-1"))
    # no kid among several keys
    assert "no kid" in await refused(verifier, sign(RSA_KEY, "RS256", None))
    assert "not a well-formed JWT" in await refused(verifier, "a.b.c")


async def test_the_caller_claim_is_encoded_and_checked(tmp_path: Path) -> None:
    source = KeySource(write_jwks(tmp_path / "k.json", jwk_of(RSA_KEY, "k", "RS256")))
    await source.load()
    v = JwtVerifier(source, audience=AUD, issuer=ISS, caller_claim="email")
    token = sign(RSA_KEY, "RS256", "k", email="a:b@example.com")
    assert await v.verify(token) == "a%3Ab@example.com"  # no ':' in a caller name
    assert "'email'" in await refused(v, sign(RSA_KEY, "RS256", "k"))
    assert "'email'" in await refused(v, sign(RSA_KEY, "RS256", "k", email=7))
    # one key without a kid: a token without a kid uses it
    lone = jwk_of(EC_KEY, "x", "ES256")
    del lone["kid"]
    source2 = KeySource(write_jwks(tmp_path / "one.json", lone))
    await source2.load()
    v2 = JwtVerifier(source2, audience=AUD, issuer=ISS)
    assert await v2.verify(sign(EC_KEY, "ES256", None)) == "alice"
    assert caller_of("auth0|123", "sub") == "auth0|123"
    with pytest.raises(JwtRefused):
        caller_of("x" * 200, "sub")


async def test_the_configuration_is_checked(tmp_path: Path) -> None:
    where = write_jwks(tmp_path / "k.json", jwk_of(RSA_KEY, "k", "RS256"))
    with pytest.raises(ConfigError, match="--jwt-audience"):
        JwtVerifier(KeySource(where), audience="", issuer=ISS)
    with pytest.raises(ConfigError, match="--jwt-audience"):
        JwtVerifier(KeySource(where), audience=AUD, issuer="")
    with pytest.raises(ConfigError, match="never 'none'"):
        JwtVerifier(KeySource(where), audience=AUD, issuer=ISS, algorithms=["none"])
    with pytest.raises(ConfigError, match="shared secret"):
        JwtVerifier(KeySource(where), audience=AUD, issuer=ISS, algorithms=["HS256"])
    with pytest.raises(ConfigError, match="32"):
        JwtVerifier(None, audience=AUD, issuer=ISS, shared_secret=b"short")
    with pytest.raises(ConfigError, match="https"):
        KeySource("http://keys.example/jwks.json")
    KeySource("http://127.0.0.1:1/jwks.json")  # loopback: plain http allowed
    with pytest.raises(ConfigError, match="no RSA, EC or OKP"):
        parse_jwks(json.dumps({"keys": [{"kty": "oct", "k": "c2VjcmV0"}]}), where="x")
    with pytest.raises(ConfigError, match="not a JWKS"):
        parse_jwks("[]", where="x")


async def test_a_shared_secret_takes_hs256_only_with_it() -> None:
    secret = os.urandom(32)
    v = JwtVerifier(None, audience=AUD, issuer=ISS, shared_secret=secret)
    assert "HS256" in v.algorithms
    token = jwt.encode(claims(), secret, algorithm="HS256")
    assert await v.verify(token) == "alice"
    assert (await refused(v, jwt.encode(claims(), os.urandom(32), algorithm="HS256"))).startswith(
        "Bad signature"
    )


async def test_a_jwks_file_is_read_again_on_an_unknown_kid_when_changed(tmp_path: Path) -> None:
    path = tmp_path / "jwks.json"
    write_jwks(path, jwk_of(RSA_KEY, "old", "RS256"))
    source = KeySource(str(path), min_refresh_s=0.0)
    await source.load()
    v = JwtVerifier(source, audience=AUD, issuer=ISS)
    assert "Unknown" in await refused(v, sign(EC_KEY, "ES256", "new"))
    write_jwks(path, jwk_of(RSA_KEY, "old", "RS256"), jwk_of(EC_KEY, "new", "ES256"))
    os.utime(path, (time.time() + 5, time.time() + 5))  # a change the mtime shows
    assert await v.verify(sign(EC_KEY, "ES256", "new")) == "alice"


async def test_unknown_kids_refetch_at_most_once_per_interval(tmp_path: Path) -> None:
    path = tmp_path / "jwks.json"
    write_jwks(path, jwk_of(RSA_KEY, "k", "RS256"))
    source = KeySource(str(path), min_refresh_s=3600.0)
    await source.load()
    v = JwtVerifier(source, audience=AUD, issuer=ISS)
    before = source.fetches
    for n in range(20):
        os.utime(path, (time.time() + n + 1, time.time() + n + 1))
        await refused(v, sign(RSA_KEY, "RS256", f"kid-{n}"))
    assert source.fetches == before  # the last read is under min_refresh_s old
