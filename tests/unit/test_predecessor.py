"""When a worker may take over the claims of the live process it replaced at its start
(reach._worker.state.Predecessor): only once that process is provably gone."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

from reach._worker.state import Predecessor

HOST = socket.gethostname()


def _pred(pid: int, host: str = HOST) -> Predecessor:
    return Predecessor(owner="a/1", host=host, pid=pid)


def test_this_process_own_pid_is_a_predecessor_gone() -> None:
    """A container restarted with its host name reuses its pid: the older one is gone."""
    assert _pred(os.getpid()).provably_gone()


def test_a_running_process_on_this_host_is_not_gone() -> None:
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert not _pred(p.pid).provably_gone()
    finally:
        p.kill()
        p.wait()


def test_a_killed_process_is_gone_reaped_or_not() -> None:
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    os.kill(p.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while not _pred(p.pid).provably_gone():  # a zombie once the kill has landed
        assert time.monotonic() < deadline, "the killed child never read as gone"
        time.sleep(0.01)
    p.wait()
    assert _pred(p.pid).provably_gone()


def test_another_host_or_no_pid_is_never_provably_gone() -> None:
    assert not _pred(os.getpid(), host=HOST + "-elsewhere").provably_gone()
    assert not _pred(0).provably_gone()
    assert not _pred(os.getpid(), host="").provably_gone()
