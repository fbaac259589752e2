"""_ShardWakeups.close (a worker on a Cluster): closing every node's subscriber while
another agent of the process subscribes (adding a node during the close's awaits) closes
that one too, instead of failing with 'dictionary changed size during iteration' (seen
once in CI, at the end of test_send_many_and_request_many_on_a_cluster)."""

from __future__ import annotations

from typing import Any

import pytest

from reach._worker.runtime import _ShardWakeups

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class FakeNode:
    def __init__(self, name: str, closed: list[str], on_close: Any = None) -> None:
        self.name, self.closed, self.on_close = name, closed, on_close

    async def close(self) -> None:
        if self.on_close is not None:
            self.on_close()
        self.closed.append(self.name)


async def test_a_node_added_during_close_is_closed_too() -> None:
    w = _ShardWakeups(raw=None)
    closed: list[str] = []

    def join_meanwhile() -> None:  # another agent subscribes on a new master meanwhile
        w.nodes["m3"] = FakeNode("m3", closed)  # type: ignore[assignment]

    w.nodes["m1"] = FakeNode("m1", closed, on_close=join_meanwhile)  # type: ignore[assignment]
    w.nodes["m2"] = FakeNode("m2", closed)  # type: ignore[assignment]
    await w.close()
    assert sorted(closed) == ["m1", "m2", "m3"] and w.nodes == {}
