"""The gateway's identity (docs/a2a.md, *Identity*): JWT bearer tokens beside static ones,
a rate limit per caller, IP allow and deny lists; through the official ``a2a-sdk`` client
and raw HTTP, against a gateway in this process and ``reach gateway`` processes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from a2a.helpers.proto_helpers import get_data_parts, new_data_part
from a2a.types.a2a_pb2 import GetTaskRequest, Message, Role, SendMessageRequest, TaskState
from a2a.utils.errors import TaskNotFoundError

from reach.client import Client
from reach.embedded import free_port
from reach.envelope import new_id
from reach.gateway import Gateway, IpRules, JwtVerifier, KeySource, Tokens
from reach.limits import parse_limit
from tests.support.agents_gateway import echo_agent
from tests.support.agents_messaging import serving
from tests.support.gateway import (
    a2a_client,
    gateway_served,
    gateway_served_app,
    http,
    start_gateway_process,
    stop_process,
    wait_card,
)
from tests.support.jwts import (
    AUD,
    EC_KEY,
    ISS,
    OTHER_RSA,
    RSA_KEY,
    claims,
    jwk_of,
    jwks_of,
    sign,
    write_jwks,
)
from tests.support.waiting import wait_until

pytestmark = pytest.mark.anyio
STATIC = "static-token-of-the-tests-0123"
GET_TASK = {"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "no-such-task"}}
A2A_HEADERS = {"A2A-Version": "1.0"}


def message(payload: object) -> SendMessageRequest:
    return SendMessageRequest(
        message=Message(role=Role.ROLE_USER, message_id=new_id(), parts=[new_data_part(payload)])
    )


async def verifier_of(path: Path, **kw: Any) -> JwtVerifier:
    source = KeySource(write_jwks(path, jwk_of(RSA_KEY, "rsa-1", "RS256")))
    await source.load()
    return JwtVerifier(source, audience=AUD, issuer=ISS, **kw)


def alice() -> str:
    return sign(RSA_KEY, "RS256", "rsa-1")


def bob() -> str:
    return sign(RSA_KEY, "RS256", "rsa-1", sub="bob")


async def post(h: httpx.AsyncClient, url: str, token: str | None) -> httpx.Response:
    auth = {"Authorization": f"Bearer {token}"} if token else {}
    return await h.post(f"{url}/caps/gw.echo", json=GET_TASK, headers={**A2A_HEADERS, **auth})


async def test_a_jwt_caller_is_served_and_owns_its_tasks(
    redis_url: str, ns: str, tmp_path: Path
) -> None:
    """The SDK client with a JWT: served, the caller (its ``sub``) on the fabric as
    ``a2a-caller``, its task not there for another subject; a static token still taken."""
    async with serving(redis_url, ns, echo_agent()):
        gw = Gateway(
            Client(redis_url=redis_url, namespace=ns),
            tokens=Tokens([("svc", STATIC)]),
            jwt=await verifier_of(tmp_path / "jwks.json"),
        )
        async with (
            gateway_served(gw) as url,
            http(alice()) as ha,
            http(bob()) as hb,
            http(STATIC) as hs,
        ):
            a, card = await a2a_client(ha, f"{url}/caps/gw.echo", streaming=False)
            assert "bearer" in card.security_schemes
            b, _ = await a2a_client(hb, f"{url}/caps/gw.echo", streaming=False)
            s, _ = await a2a_client(hs, f"{url}/caps/gw.echo", streaming=False)
            [resp] = [e async for e in a.send_message(message({"x": 1}))]
            task = resp.task
            assert task.status.state == TaskState.TASK_STATE_COMPLETED
            [art] = [x for x in task.artifacts if x.name == "result"]
            result = get_data_parts(art.parts)[0]
            assert result["caller"] == "alice"
            assert result["session"].startswith("a2a:alice:")
            assert (await a.get_task(GetTaskRequest(id=task.id))).id == task.id
            with pytest.raises(TaskNotFoundError):
                await b.get_task(GetTaskRequest(id=task.id))
            with pytest.raises(TaskNotFoundError):
                await s.get_task(GetTaskRequest(id=task.id))
            [resp] = [e async for e in s.send_message(message({"x": 2}))]
            [art] = [x for x in resp.task.artifacts if x.name == "result"]
            assert get_data_parts(art.parts)[0]["caller"] == "svc"


async def test_jwt_refusals_say_what_was_wrong(redis_url: str, ns: str, tmp_path: Path) -> None:
    gw = Gateway(
        Client(redis_url=redis_url, namespace=ns), jwt=await verifier_of(tmp_path / "k.json")
    )
    async with gateway_served(gw) as url, http() as h:
        await _refusals(h, url)


async def _refusals(h: httpx.AsyncClient, url: str) -> None:
    """Each bad token: 401 with a challenge naming the fault; then a good one served."""
    now = claims()["iat"]
    cases = {
        "Bad signature": sign(OTHER_RSA, "RS256", "rsa-1"),
        "Wrong audience": sign(RSA_KEY, "RS256", "rsa-1", aud="another-service"),
        "expired": sign(RSA_KEY, "RS256", "rsa-1", exp=now - 3600),
        "algorithm 'none'": jwt.encode(claims(), None, algorithm="none"),
        "Unknown signing key": sign(RSA_KEY, "RS256", "not-in-the-jwks"),
        "not one of this server's": "just-some-token-0123456789",
    }
    for fault, token in cases.items():
        r = await post(h, url, token)
        assert r.status_code == 401, (fault, r.text)
        challenge = r.headers["www-authenticate"]
        assert challenge.startswith('Bearer realm="reach gateway", error="invalid_token"')
        assert fault in challenge, (fault, challenge)
        assert fault in r.json()["error"]
        assert "BEGIN" not in r.text and '"n"' not in r.text  # no key material
    r = await post(h, url, None)
    assert r.status_code == 401 and r.headers["www-authenticate"] == 'Bearer realm="reach gateway"'
    r = await post(h, url, alice())
    assert r.status_code == 200 and r.json()["error"]["code"] == -32001  # past auth: no task


async def test_a_caller_over_its_rate_gets_429_while_another_is_served(
    redis_url: str, ns: str
) -> None:
    other = "another-caller-token-0123"
    gw = Gateway(
        Client(redis_url=redis_url, namespace=ns),
        tokens=Tokens([("a", STATIC), ("b", other)]),
        rate_per_caller=parse_limit("1/m", burst=2),
    )
    async with gateway_served(gw) as url, http() as h:
        for _ in range(2):
            assert (await post(h, url, STATIC)).status_code == 200
        r = await post(h, url, STATIC)
        assert r.status_code == 429, r.text
        assert 1 <= int(r.headers["retry-after"]) <= 60
        err = r.json()["error"]
        assert err["data"]["reachError"] == "RateLimited" and 0 < err["data"]["retryAfterS"] <= 60
        assert r.json()["jsonrpc"] == "2.0"
        assert (await post(h, url, other)).status_code == 200  # b's own bucket
        # a refused token takes nothing from anyone's bucket, and is refused as such
        assert (await post(h, url, "not-a-token-0123456789")).status_code == 401
        # cards are not counted
        assert (await h.get(f"{url}/.well-known/agent-card.json")).status_code == 200


@pytest.mark.parametrize(
    "rules",
    [
        IpRules(deny=["127.0.0.1"]),
        IpRules(allow=["10.0.0.0/8"]),
        IpRules(allow=["127.0.0.0/8"], deny=["127.0.0.1/32"]),
    ],
    ids=["denied", "not-allowed", "deny-wins"],
)
async def test_a_refused_address_gets_403_before_its_body_is_read(
    redis_url: str, ns: str, rules: IpRules
) -> None:
    gw = Gateway(
        Client(redis_url=redis_url, namespace=ns), tokens=Tokens([("a", STATIC)]), ips=rules
    )
    async with gateway_served(gw) as url, http() as h:
        assert (await h.get(f"{url}/.well-known/agent-card.json")).status_code == 403
        r = await post(h, url, STATIC)
        assert r.status_code == 403 and "127.0.0.1" in r.json()["error"]
        # a head announcing a large body, none of which is ever sent: answered at once
        assert await _head_only(url) == 403


async def test_an_allowed_address_is_served_and_forwarded_for_needs_trust(
    redis_url: str, ns: str
) -> None:
    for rules, xff, status in [
        (IpRules(allow=["127.0.0.0/8"]), None, 200),
        (IpRules(deny=["203.0.113.7"]), "203.0.113.7", 200),  # the header is not trusted
        (IpRules(deny=["203.0.113.7"], trust_proxy=True), "203.0.113.7", 403),
        (IpRules(allow=["203.0.113.0/24"], trust_proxy=True), "203.0.113.8", 200),
    ]:
        gw = Gateway(Client(redis_url=redis_url, namespace=ns), ips=rules)
        headers = {"X-Forwarded-For": xff} if xff else {}
        async with gateway_served(gw) as url, http(headers=headers) as h:
            r = await post(h, url, None)
            assert r.status_code == status, (rules.allow, rules.deny, xff, r.text)


async def _head_only(url: str) -> int:
    """The status answering a POST whose head announces 10 MB and whose body never comes."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(
            b"POST /caps/gw.echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 10000000\r\nAuthorization: Bearer " + STATIC.encode() + b"\r\n\r\n"
        )
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), 30)
        return int(line.split()[1])
    finally:
        writer.close()


@pytest.fixture
async def jwks_server() -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """A JWKS URL on loopback: ``state["keys"]`` is what it serves, ``state["hits"]`` how
    often it was fetched."""
    state: dict[str, Any] = {"keys": [jwk_of(RSA_KEY, "rsa-1", "RS256")], "hits": 0}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                m = await receive()
                if m["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        state["hits"] += 1
        body = json.dumps(jwks_of(*state["keys"])).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": body})

    async with gateway_served_app(lambda base: app) as url:
        yield f"{url}/jwks.json", state


async def test_a_jwks_url_is_fetched_cached_and_refreshed_on_a_new_kid(
    jwks_server: tuple[str, dict[str, Any]],
) -> None:
    url, state = jwks_server
    source = KeySource(url, min_refresh_s=0.0)
    await source.load()
    v = JwtVerifier(source, audience=AUD, issuer=ISS)
    for _ in range(5):
        assert await v.verify(alice()) == "alice"
    assert state["hits"] == 1  # cached
    state["keys"].append(jwk_of(EC_KEY, "ec-2", "ES256"))  # the issuer rotates a key in
    assert await v.verify(sign(EC_KEY, "ES256", "ec-2")) == "alice"
    assert state["hits"] == 2
    # a caller spraying unknown kids: at most one fetch per min_refresh_s
    bounded = KeySource(url)
    await bounded.load()
    v2 = JwtVerifier(bounded, audience=AUD, issuer=ISS)
    hits = state["hits"]
    for n in range(20):
        with pytest.raises(Exception, match="Unknown signing key"):
            await v2.verify(sign(RSA_KEY, "RS256", f"kid-{n}"))
    assert state["hits"] == hits


# -- reach gateway processes ---------------------------------------------------------------
async def test_gateway_process_refuses_bad_jwts_and_limits_each_caller(
    redis_url: str, ns: str, tmp_path: Path, jwks_server: tuple[str, dict[str, Any]]
) -> None:
    jwks_url, _ = jwks_server
    port = free_port()
    log = tmp_path / "gateway.log"
    proc = start_gateway_process(
        redis_url, ns, port, "--jwks", jwks_url, "--jwt-audience", AUD, "--jwt-issuer", ISS,
        "--rate-per-caller", "1/m", "--burst", "3", log=log,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        async with http() as h:
            await wait_card(h, url, proc, log)
            await _refusals(h, url)  # alice's good token: one of her three
            for _ in range(2):
                assert (await post(h, url, alice())).status_code == 200
            r = await post(h, url, alice())
            assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1, r.text
            assert r.json()["error"]["data"]["reachError"] == "RateLimited"
            assert (await post(h, url, bob())).status_code == 200
    finally:
        assert stop_process(proc) == 0, log.read_text()
    assert "JWTs (RS256, ES256, EdDSA)" in log.read_text()


@pytest.mark.parametrize(
    "rule", [["--deny-ip", "127.0.0.1"], ["--allow-ip", "10.0.0.0/8", "--allow-ip", "::1"]]
)
async def test_gateway_process_ip_lists(
    redis_url: str, ns: str, tmp_path: Path, rule: list[str]
) -> None:
    port = free_port()
    log = tmp_path / "gateway.log"
    proc = start_gateway_process(redis_url, ns, port, *rule, log=log)
    url = f"http://127.0.0.1:{port}"
    try:
        async with http() as h:

            async def refused() -> bool:
                assert proc.poll() is None, log.read_text()
                try:
                    r = await h.get(f"{url}/.well-known/agent-card.json")
                except httpx.TransportError:
                    return False
                return r.status_code == 403

            await wait_until(refused, timeout_s=60, what="the gateway to answer 403")
            assert (await post(h, url, None)).status_code == 403
            assert await _head_only(url) == 403
    finally:
        assert stop_process(proc) == 0, log.read_text()
