"""Keys, JWKS documents and signed JWTs for the tests of the faces' JWT bearer tokens."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

AUD, ISS = "reach-gateway", "https://issuer.test"

RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
OTHER_RSA = rsa.generate_private_key(public_exponent=65537, key_size=2048)
EC_KEY = ec.generate_private_key(ec.SECP256R1())
ED_KEY = ed25519.Ed25519PrivateKey.generate()


def jwk_of(private: Any, kid: str, alg: str) -> dict[str, Any]:
    """The public JWK of ``private`` for ``alg``, with its kid."""
    algo = jwt.get_algorithm_by_name(alg)
    jwk: dict[str, Any] = json.loads(algo.to_jwk(private.public_key()))
    return {**jwk, "kid": kid, "use": "sig", "alg": alg}


def jwks_of(*keys: dict[str, Any]) -> dict[str, Any]:
    return {"keys": list(keys)}


def write_jwks(path: Path, *keys: dict[str, Any]) -> str:
    path.write_text(json.dumps(jwks_of(*keys)))
    return str(path)


def claims(**over: Any) -> dict[str, Any]:
    now = int(time.time())
    return {"sub": "alice", "aud": AUD, "iss": ISS, "iat": now, "exp": now + 300, **over}


def sign(private: Any, alg: str, kid: str | None, **over: Any) -> str:
    """A JWT of :func:`claims` (``over`` changing them) signed by ``private``."""
    headers = {"kid": kid} if kid is not None else {}
    return jwt.encode(claims(**over), private, algorithm=alg, headers=headers)
