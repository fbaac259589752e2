"""reach._http, in processes of its own where limits are set: the open-files limit raised at
start and the connection bound fitted to it; a face out of file descriptors writes one
warning line per period, not a traceback per failed accept; uvicorn's per-request warnings
likewise (docs/a2a.md and docs/web.md, *Limits*)."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import time
from pathlib import Path

from reach._http import _Repeats

ROOT = Path(__file__).resolve().parents[2]

# A server out of descriptors: every one its open-files limit allows is taken, so each
# accept of a waiting connection fails with EMFILE (asyncio retries it every second).
STARVED_SERVER = """
import asyncio, logging, os, resource, sys
from reach._http import quiet_accept_errors

logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))

async def main():
    quiet_accept_errors(asyncio.get_running_loop(), logging.getLogger("face"), every_s=60)
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    held = []
    try:
        while True:
            held.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        pass
    print(port, flush=True)
    await asyncio.sleep(float(sys.argv[1]))

asyncio.run(main())
"""


def test_accept_errors_are_one_line_per_period_not_a_traceback_each() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", STARVED_SERVER, "3.5"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    waiting: list[socket.socket] = []
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        for _ in range(5):  # queued in the backlog: each accept attempt fails
            waiting.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        _, err = proc.communicate(timeout=60)
    finally:
        for s in waiting:
            s.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err, err[-2000:]
    assert len(lines) == 1, err[-2000:]
    assert "cannot accept connections: out of file descriptors" in lines[0]
    assert "open-files limit 64" in lines[0]


def test_uvicorn_repeats_are_one_line_per_period_with_the_count_left_out() -> None:
    log = logging.getLogger("test.http.repeats")
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    log.addHandler(Keep())
    log.propagate = False
    log.addFilter(_Repeats(every_s=0.2))
    for _ in range(50):
        log.warning("Exceeded concurrency limit.")
        log.warning("ASGI callable returned without completing response.")
    log.warning("something else")
    log.warning("something else")
    assert seen == [
        "Exceeded concurrency limit.",
        "ASGI callable returned without completing response.",
        "something else",
        "something else",
    ]
    time.sleep(0.25)  # the period is time itself: nothing to await
    log.warning("Exceeded concurrency limit.")
    assert seen[-1].startswith("Exceeded concurrency limit. (49 more like it in the last")


RAISED = """
import resource
from reach._http import Limits, raise_open_files_limit

resource.setrlimit(resource.RLIMIT_NOFILE, (256, 1024))
soft = raise_open_files_limit()
print(soft, resource.getrlimit(resource.RLIMIT_NOFILE)[0], Limits().fitted(soft).max_connections)
"""


def test_the_soft_open_files_limit_is_raised_and_connections_fitted_to_it() -> None:
    """A face starting with a soft limit of 256 under a hard one of 1,024 serves with
    1,024, and at most 924 connections (100 descriptors kept for Redis and the rest)."""
    out = subprocess.run(
        [sys.executable, "-c", RAISED],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1024", "1024", "924"]
