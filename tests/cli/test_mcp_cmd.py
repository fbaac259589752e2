"""``reach mcp`` on the command line: it refuses HTTP without tokens, and the endpoint
answers 401 to every request without a valid token or JWT (docs/mcp.md, *Security*);
``reach mcp-proxy`` says in one line when its server cannot be started."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import httpx2
import pytest
from reach_cli.app import app
from typer.testing import CliRunner

from tests.support.gateway import stop_process
from tests.support.jwts import AUD, ISS, RSA_KEY, jwk_of, sign, write_jwks
from tests.support.waiting import wait_until
from tests.support.workers import ROOT

pytestmark = pytest.mark.anyio
TOKEN = "mcp-cli-token-0123456789abcdef"


def test_http_without_tokens_is_refused(
    redis_url: str, ns: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("REACH_MCP_TOKENS", raising=False)
    res = CliRunner().invoke(app, ["mcp", "--redis-url", redis_url, "--namespace", ns])
    assert res.exit_code == 2
    assert "No tokens" in res.stderr and "--no-auth" in res.stderr
    res = CliRunner().invoke(
        app, ["mcp", "--redis-url", redis_url, "--namespace", ns, "--where", "nokeyvalue"]
    )
    assert res.exit_code == 2 and "--where takes KEY=VALUE" in res.stderr


def test_a_proxy_whose_server_cannot_start_says_so_in_one_line(redis_url: str, ns: str) -> None:
    # Found by the CLI fuzzer: a command that is no program ended in a traceback.
    res = CliRunner().invoke(
        app, ["mcp-proxy", "--redis-url", redis_url, "--namespace", ns, "--", "no-such-mcp-server"]
    )
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    assert res.exit_code == 2, res.output
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "could not be reached" in errors[0], res.stderr
    assert "reach mcp-proxy -- python server.py" in errors[0]
    assert "Traceback" not in res.output


async def test_the_endpoint_needs_a_token(redis_url: str, ns: str, tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    tokens = tmp_path / "tokens"
    tokens.write_text(f"model:{TOKEN}\n")
    log = tmp_path / "mcp.log"
    cmd = [sys.executable, "-m", "reach_cli.app", "mcp", "--port", str(port), "--token-file",
           str(tokens), "--redis-url", redis_url, "--namespace", ns]  # fmt: skip
    with open(log, "wb") as err:  # noqa: ASYNC230 - a local file, before the process
        proc = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.DEVNULL, stderr=err)  # noqa: ASYNC220
    try:

        async def serving() -> bool:
            assert proc.poll() is None, log.read_text()
            return "serving http://" in log.read_text()

        await wait_until(serving, timeout_s=60, what="reach mcp serving")
        assert "(1 token(s))" in log.read_text()
        url = f"http://127.0.0.1:{port}/mcp"
        body = {"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {}}
        headers = {"Accept": "application/json, text/event-stream"}
        async with httpx2.AsyncClient(timeout=30) as h:
            for auth in ({}, {"Authorization": "Bearer wrong-token-0123456789"}):
                for method in ("POST", "GET", "DELETE"):
                    r = await h.request(method, url, json=body, headers={**headers, **auth})
                    assert r.status_code == 401, (method, auth, r.text)
                    assert r.headers["www-authenticate"].startswith("Bearer")
            r = await h.post(
                url, json=body, headers={**headers, "Authorization": f"Bearer {TOKEN}"}
            )
            assert r.status_code != 401, r.text
    finally:
        stop_process(proc)


async def test_the_endpoint_takes_a_jwt(redis_url: str, ns: str, tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    jwks = write_jwks(tmp_path / "jwks.json", jwk_of(RSA_KEY, "k", "RS256"))
    log = tmp_path / "mcp.log"
    cmd = [sys.executable, "-m", "reach_cli.app", "mcp", "--port", str(port), "--jwks", jwks,
           "--jwt-audience", AUD, "--jwt-issuer", ISS, "--redis-url", redis_url,
           "--namespace", ns]  # fmt: skip
    with open(log, "wb") as err:  # noqa: ASYNC230 - a local file, before the process
        proc = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.DEVNULL, stderr=err)  # noqa: ASYNC220
    try:

        async def serving() -> bool:
            assert proc.poll() is None, log.read_text()
            return "serving http://" in log.read_text()

        await wait_until(serving, timeout_s=60, what="reach mcp serving")
        assert "(JWTs (RS256, ES256, EdDSA))" in log.read_text()
        url = f"http://127.0.0.1:{port}/mcp"
        body = {"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {}}
        headers = {"Accept": "application/json, text/event-stream"}
        async with httpx2.AsyncClient(timeout=30) as h:
            wrong = {"Authorization": f"Bearer {sign(RSA_KEY, 'RS256', 'k', aud='other')}"}
            for method in ("POST", "GET"):
                r = await h.request(method, url, json=body, headers={**headers, **wrong})
                assert r.status_code == 401, (method, r.text)
                assert r.headers["www-authenticate"].startswith('Bearer realm="reach mcp"')
                assert "Wrong audience" in r.headers["www-authenticate"]
            good = {"Authorization": f"Bearer {sign(RSA_KEY, 'RS256', 'k')}"}
            r = await h.post(url, json=body, headers={**headers, **good})
            assert r.status_code != 401, r.text
    finally:
        stop_process(proc)
