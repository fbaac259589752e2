"""`reach gateway` as a process in front of real `reach worker` processes: the official
``a2a-sdk`` client resolves a capability's card, sends, streams, reads the task back and
cancels a running one;
SIGTERM stops the gateway cleanly; without tokens it refuses an address that is not
loopback (docs/cli.md, docs/a2a.md)."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from a2a.helpers.proto_helpers import get_data_parts, new_data_part, new_text_part
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetTaskRequest,
    Message,
    Role,
    SendMessageRequest,
    TaskState,
)
from a2a.utils.errors import TaskNotCancelableError
from reach_cli.app import app
from typer.testing import CliRunner

from reach.embedded import free_port
from reach.envelope import new_id
from tests.support.gateway import a2a_client, http, start_gateway_process, stop_process
from tests.support.jwts import RSA_KEY, jwk_of, write_jwks
from tests.support.waiting import wait_until
from tests.support.workers import Workers

pytestmark = pytest.mark.anyio
TOKEN = "cli-test-token-0123456789abcdef"


@pytest.fixture
def workers(redis_url: str, ns: str) -> Iterator[Workers]:
    w = Workers(redis_url, ns, "tests.support.agents_gateway")
    try:
        yield w
    finally:
        w.stop_all()


def start_gateway(
    redis_url: str, ns: str, port: int, *extra: str, log: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    return start_gateway_process(redis_url, ns, port, *extra, log=log, env=env)


def msg(*parts: object) -> SendMessageRequest:
    return SendMessageRequest(
        message=Message(role=Role.ROLE_USER, message_id=new_id(), parts=list(parts))  # type: ignore[arg-type]
    )


async def test_gateway_process_in_front_of_a_worker_process(
    redis_url: str, ns: str, workers: Workers, tmp_path: Path
) -> None:
    workers.start("echo_agent")
    workers.start("words_agent")
    workers.start("slow_agent")
    tokens = tmp_path / "tokens.txt"
    tokens.write_text(f"# who may call\nops:{TOKEN}\n")
    port = free_port()
    log = tmp_path / "gateway.log"
    gw = start_gateway(redis_url, ns, port, "--token-file", str(tokens), log=log)
    url = f"http://127.0.0.1:{port}"
    try:
        async with http(TOKEN) as h:

            async def card_served() -> bool:
                assert gw.poll() is None, log.read_text()
                try:
                    r = await h.get(f"{url}/caps/gw.words/.well-known/agent-card.json")
                except httpx.TransportError:
                    return False
                return r.status_code == 200

            await wait_until(card_served, timeout_s=60, what="the gateway to serve gw.words")
            first = log.read_text().splitlines()[0]
            assert first.startswith(
                f"reach gateway: namespace {ns!r} on {redis_url}, serving "
                f"http://127.0.0.1:{port} (1 token(s); at most "
            ), first
            words, card = await a2a_client(h, f"{url}/caps/gw.words")
            assert card.security_schemes["bearer"].http_auth_security_scheme.scheme == "Bearer"
            events = [e async for e in words.send_message(msg(new_text_part("a b c")))]
            chunks = [
                p.text
                for e in events
                if e.HasField("artifact_update") and e.artifact_update.artifact.name == "stream"
                for p in e.artifact_update.artifact.parts
            ]
            assert chunks == ["a", "b", "c"]
            assert events[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED

            echo, _ = await a2a_client(h, f"{url}/agents/gw-echo-1", streaming=False)
            req = msg(new_data_part({"k": "v"}))
            req.message.metadata.update({"capability": "gw.echo"})
            [resp] = [e async for e in echo.send_message(req)]
            task = resp.task
            assert task.status.state == TaskState.TASK_STATE_COMPLETED
            [art] = task.artifacts
            res = get_data_parts(art.parts)[0]
            assert (res["echo"], res["agent"], res["caller"]) == ({"k": "v"}, "gw-echo-1", "ops")
            got = await echo.get_task(GetTaskRequest(id=task.id))
            assert got.status.state == TaskState.TASK_STATE_COMPLETED
            with pytest.raises(TaskNotCancelableError):  # finished
                await echo.cancel_task(CancelTaskRequest(id=task.id))
            # cancel a task a worker process runs: canceled, and cancelled in reach
            slow, _ = await a2a_client(h, f"{url}/caps/gw.slow", streaming=False)
            req = msg(new_data_part(60))
            req.configuration.return_immediately = True
            [first] = [e async for e in slow.send_message(req)]

            async def working() -> bool:
                got = await slow.get_task(GetTaskRequest(id=first.task.id))
                return got.status.state == TaskState.TASK_STATE_WORKING

            await wait_until(working, what="the slow task to be working")
            got = await slow.cancel_task(CancelTaskRequest(id=first.task.id))
            assert got.status.state == TaskState.TASK_STATE_CANCELED
    finally:
        code = stop_process(gw)
    assert code == 0, log.read_text()


def test_gateway_without_tokens_refuses_an_open_address(
    redis_url: str, ns: str, tmp_path: Path
) -> None:
    log = tmp_path / "gateway.log"
    p = start_gateway(
        redis_url, ns, free_port(), "--host", "0.0.0.0", log=log, env={"REACH_GATEWAY_TOKENS": ""}
    )
    assert p.wait(timeout=60) == 2
    err = log.read_text()
    assert err.startswith("error: No tokens and 0.0.0.0 is not a loopback address"), err
    assert "--token-file" in err


def test_a_short_token_is_refused(redis_url: str, ns: str, tmp_path: Path) -> None:
    log = tmp_path / "gateway.log"
    p = start_gateway(
        redis_url, ns, free_port(), log=log, env={"REACH_GATEWAY_TOKENS": "name:short"}
    )
    assert p.wait(timeout=60) == 2
    assert "has 5 characters: use at least 16" in log.read_text()


def test_a_port_in_use_is_one_error_line(redis_url: str, ns: str, tmp_path: Path) -> None:
    """uvicorn exits with its own code (3) when it cannot bind: the command says so in one
    error line and exits 2, as for any other bad option."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        log = tmp_path / "gateway.log"
        p = start_gateway(redis_url, ns, taken.getsockname()[1], log=log)
        assert p.wait(timeout=60) == 2, log.read_text()
        errors = [ln for ln in log.read_text().splitlines() if ln.startswith("error:")]
        assert len(errors) == 1 and "choose another with --port" in errors[0], log.read_text()
    finally:
        taken.close()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--jwks", "JWKS"], "need --jwt-audience and --jwt-issuer"),
        (["--jwks", "JWKS", "--jwt-audience", "a", "--jwt-issuer", "i", "--jwt-algorithms",
          "none"], "never 'none'"),
        (["--jwks", "JWKS", "--jwt-audience", "a", "--jwt-issuer", "i", "--jwt-algorithms",
          "HS256"], "need an explicit shared secret"),
        (["--jwks", "missing.json", "--jwt-audience", "a", "--jwt-issuer", "i"],
         "Cannot read the JWKS file"),
        (["--jwks", "http://keys.example/jwks", "--jwt-audience", "a", "--jwt-issuer", "i"],
         "https"),
        (["--jwt-audience", "a"], "need --jwks"),
        (["--burst", "5"], "--burst goes with --rate-per-caller"),
        (["--rate-per-caller", "fast"], "Invalid rate limit"),
        (["--deny-ip", "10.0.0.0/99"], "--deny-ip"),
    ],
)  # fmt: skip
def test_identity_options_are_checked_at_start(
    redis_url: str, ns: str, tmp_path: Path, args: list[str], says: str
) -> None:
    jwks = write_jwks(tmp_path / "jwks.json", jwk_of(RSA_KEY, "k", "RS256"))
    args = [jwks if a == "JWKS" else a for a in args]
    res = CliRunner().invoke(app, ["gateway", "--redis-url", redis_url, "--namespace", ns, *args])
    assert res.exit_code == 2, res.output
    assert says in res.stderr
