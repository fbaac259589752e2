"""How a Sentinel-managed connection waits for a reachable master (reach.connection)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from redis import exceptions as rexc

from reach.connection import _MasterWait


def test_pauses_grow_to_half_a_second() -> None:
    wait = _MasterWait(SimpleNamespace(master_wait_s=60))
    pauses = [wait.pause_after(rexc.ConnectionError("down")) for _ in range(6)]
    assert pauses == [0.05, 0.1, 0.2, 0.4, 0.5, 0.5]


def test_a_wrong_password_is_not_waited_for() -> None:
    wait = _MasterWait(SimpleNamespace(master_wait_s=60))
    with pytest.raises(rexc.AuthenticationError):
        wait.pause_after(rexc.AuthenticationError("wrong password"))


def test_the_failure_is_raised_once_the_wait_is_spent() -> None:
    wait = _MasterWait(SimpleNamespace(master_wait_s=0))
    failure = rexc.TimeoutError("no master")
    with pytest.raises(rexc.TimeoutError) as ei:
        wait.pause_after(failure)
    assert ei.value is failure


def test_a_pool_without_the_setting_waits_the_default() -> None:
    wait = _MasterWait(SimpleNamespace())
    assert wait.pause_after(rexc.ConnectionError("down")) == 0.05
