"""When a worker may take over the claims of the live process it replaced at its start
(reach._worker.state.Predecessor): only once that process is provably gone; and the claims of
an owner the registry says was evicted (reach._worker.state.owner_may_run)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import msgspec

from reach._worker.state import EVICTED_GRACE_MIN_MS, Predecessor, owner_may_run
from reach.registry import AgentInfo

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


def test_an_evicted_owner_keeps_its_claims_for_a_lease_after_its_eviction() -> None:
    """A live agent evicted by a Redis outage registers again at its next heartbeat: until
    a lease has passed since its eviction a peer must not take its running messages over
    (it would run them a second time beside it)."""
    info = AgentInfo(
        agent_id="a", instance_id="i1", state="evicted", state_ms=10_000, lease_ms=3_000
    )
    assert owner_may_run(info, "i1", 10_000 + 2_999)
    assert not owner_may_run(info, "i1", 10_000 + 3_000)
    assert not owner_may_run(info, "i0", 10_000)  # another instance: the one replaced
    short = msgspec.structs.replace(info, lease_ms=300)  # sub-second leases: a second at least
    assert owner_may_run(short, "i1", 10_000 + EVICTED_GRACE_MIN_MS - 1)
    assert not owner_may_run(short, "i1", 10_000 + EVICTED_GRACE_MIN_MS)
    live = msgspec.structs.replace(info, state="active")
    assert owner_may_run(live, "i1", 10**12)
