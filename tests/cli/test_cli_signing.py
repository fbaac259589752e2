"""`reach worker --require-signed` as a user runs it: without a secret it refuses to start
(one error line); with REACH_SECRET it dead-letters what `reach send` sends unsigned and
runs what it sends signed."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import redis

from reach.keys import Keys
from reach.tasks import parse_dead_letter

ROOT = Path(__file__).resolve().parents[2]
SECRET = "cli-team-secret-0123456789"
TARGET = "tests.cli.worker_targets:app"


def run(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "reach_cli.app", *args],
        cwd=ROOT,
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def clean_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("REACH_SECRET", "REACH_REQUIRE_SIGNED", "REACH_IDENTITY_FILE")
    }
    env.update(extra)
    return env


def test_require_signed_without_a_secret_does_not_start(redis_url: str, ns: str) -> None:
    p = run(
        "worker", TARGET, "--redis-url", redis_url, "-n", ns, "--require-signed", env=clean_env()
    )
    assert p.returncode == 2, p.stderr
    errors = [line for line in p.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "REACH_SECRET" in errors[0], p.stderr
    assert "Traceback" not in p.stderr
    p = run(
        "worker",
        TARGET,
        "--redis-url",
        redis_url,
        "-n",
        ns,
        env=clean_env(REACH_REQUIRE_SIGNED="1"),
    )
    assert p.returncode == 2 and "REACH_SECRET" in p.stderr, p.stderr


def test_a_worker_requiring_signatures(redis_url: str, ns: str) -> None:
    from tests.cli import worker_targets

    cap = worker_targets.app.capabilities[0]
    signed = clean_env(REACH_SECRET=SECRET)
    w = subprocess.Popen(
        [sys.executable, "-m", "reach_cli.app", "worker", TARGET, "--redis-url", redis_url]
        + ["-n", ns, "--require-signed", "--heartbeat-s", "0.2", "--lease-s", "1"]
        + ["--evict-after-s", "2"],
        cwd=ROOT,
        env=signed,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        r = redis.Redis.from_url(redis_url)
        dlq = Keys(ns).dlq(cap)
        deadline = time.monotonic() + 30
        while True:  # until the worker is registered and ready
            p = run("send", cap, '"x"', "--redis-url", redis_url, "-n", ns, env=clean_env())
            if p.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert p.returncode == 0, p.stderr
        while time.monotonic() < deadline and not r.xlen(dlq):
            time.sleep(0.1)
        rows: Any = r.xrange(dlq)
        [(entry_id, fields)] = rows
        letter = parse_dead_letter(entry_id, fields)
        assert letter.reason == "unauthenticated" and "unsigned" in letter.error
        p = run("send", cap, '"x"', "--wait", "--redis-url", redis_url, "-n", ns, env=signed)
        assert p.returncode == 0, (p.stdout, p.stderr)
        assert r.xlen(dlq) == 1
    finally:
        w.terminate()
        w.wait(timeout=30)
