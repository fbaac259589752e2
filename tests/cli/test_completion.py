"""Shell completion: `reach --install-completion` / `--show-completion`, and capabilities
and agent ids completed from the live registry (the Redis found as every command finds
it), nothing at all, quickly, when there is no Redis to ask."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
import typer
from reach_cli.app import command_line
from reach_cli.completion import TIMEOUT_S, complete_agent_id, complete_capability

from reach.connection import connect
from reach.registry import Registry

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def registry(redis_url: str, ns: str) -> None:
    async def setup() -> None:
        r = await connect(redis_url)
        reg = Registry(r, ns)
        for agent_id, caps in (
            ("sum-1", ["text.summarize", "text.translate"]),
            ("sum-2", ["text.summarize"]),
            ("rev-1", ["code.review"]),
        ):
            await reg.register(
                agent_id,
                instance_id=agent_id,
                version=1,
                ready=True,
                capabilities=caps,
                lease_ms=60_000,
                evict_after_ms=120_000,
            )
        await r.aclose()

    anyio.run(setup)


def ctx(**params: str) -> typer.Context:
    c = typer.Context(command_line())
    c.params.update(params)
    return c


def complete(words: str, cwd: Path, **env: str) -> list[str]:
    """What bash completion offers for ``words`` (the real entry point, as the installed
    script calls it)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("REACH_")}
    p = subprocess.run(
        [sys.executable, "-m", "reach_cli.app"],
        env={
            **base,
            "PYTHONPATH": str(ROOT),
            "_REACH_COMPLETE": "complete_bash",
            "COMP_WORDS": words,
            "COMP_CWORD": str(len(words.split(" ")) - 1),
            **env,
        },
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert p.returncode == 0, p.stderr
    return p.stdout.split()


def test_callbacks_offer_the_registry(registry: None, redis_url: str, ns: str) -> None:
    c = ctx(redis_url=redis_url, namespace=ns)
    assert complete_capability(c, "") == ["code.review", "text.summarize", "text.translate"]
    assert complete_capability(c, "text.s") == ["text.summarize"]
    assert complete_agent_id(c, "") == ["rev-1", "sum-1", "sum-2"]
    assert complete_agent_id(c, "sum") == ["sum-1", "sum-2"]
    assert complete_agent_id(ctx(redis_url=redis_url, namespace="other-ns"), "") == []


def test_the_shell_gets_them_from_the_project_files_redis(
    registry: None, redis_url: str, ns: str, tmp_path: Path
) -> None:
    (tmp_path / "reach.toml").write_text(f'redis_url = "{redis_url}"\n')
    sub = tmp_path / "deeper"
    sub.mkdir()
    env = {"REACH_NAMESPACE": ns}
    assert complete("reach agents show ", sub, **env) == ["rev-1", "sum-1", "sum-2"]
    assert complete("reach agents drain s", sub, **env) == ["sum-1", "sum-2"]
    assert complete("reach send text.", sub, **env) == ["text.summarize", "text.translate"]
    assert complete("reach dlq list --cap c", sub, **env) == ["code.review"]
    assert complete(f"reach agents --namespace {ns} --cap c", sub) == ["code.review"]
    assert complete(f"reach send --namespace {ns} --target r", sub) == ["rev-1"]


def test_no_redis_configured_offers_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert complete("reach agents show ", tmp_path) == []
    monkeypatch.delenv("REACH_REDIS_URL", raising=False)
    monkeypatch.chdir(tmp_path)
    assert complete_agent_id(ctx(), "") == []


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A TCP server that accepts connections and never answers."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        s.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(s.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield f"redis://127.0.0.1:{s.getsockname()[1]}/0"
    stop.set()
    t.join(timeout=5)
    for c in held:
        c.close()
    s.close()


def test_a_redis_that_does_not_answer_offers_nothing_quickly(silent_server: str) -> None:
    t = time.monotonic()
    assert complete_capability(ctx(redis_url=silent_server), "") == []
    assert time.monotonic() - t < TIMEOUT_S + 1.0


def test_unreachable_redis_offers_nothing() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    assert complete_agent_id(ctx(redis_url=f"redis://127.0.0.1:{port}/0"), "") == []


def test_install_and_show_completion_are_offered(tmp_path: Path) -> None:
    p = subprocess.run(
        [sys.executable, "-m", "reach_cli.app", "--show-completion", "bash"],
        env={**os.environ, "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert p.returncode == 0, p.stderr
    assert "_REACH_COMPLETE=complete_bash" in p.stdout
    p = subprocess.run(
        [sys.executable, "-m", "reach_cli.app", "--install-completion", "bash"],
        env={**os.environ, "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert p.returncode == 0, p.stderr
    assert "_REACH_COMPLETE" in (tmp_path / ".bash_completions" / "reach.sh").read_text()
    assert "reach.sh" in (tmp_path / ".bashrc").read_text()
