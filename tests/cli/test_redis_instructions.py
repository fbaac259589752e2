"""bench/redis_instructions.py: Redis's instructions per message, counted under callgrind.
A tiny run: every phase of both systems counted, and the count repeatable (the tool's
reason to exist: a timed figure on this VM moves by a third between runs)."""

from __future__ import annotations

import shutil

import pytest

from bench import redis_instructions as ri
from reach.embedded import find_server_binary

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(
        shutil.which("valgrind") is None or shutil.which("callgrind_control") is None,
        reason="valgrind not installed (apt-get install valgrind)",
    ),
]


async def test_each_phase_is_counted_and_a_second_run_counts_the_same() -> None:
    binary = find_server_binary().path
    first = await ri.measure(binary, 340, 34)
    second = await ri.measure(binary, 340, 34)
    for side in ("reach", "lean_floor"):
        for phase in (*ri.PHASES, "total"):
            a, b = first[side][phase], second[side][phase]
            # an XREADGROUP, a script call: thousands of instructions a message at least
            assert a > 1000, (side, phase, a)
            # Redis's timer work, by the wall clock, moves a phase's count a little
            assert abs(a - b) / a < (0.03 if phase == "total" else 0.10), (side, phase, a, b)
    assert first["ratios"]["total"] == pytest.approx(
        first["reach"]["total"] / first["lean_floor"]["total"]
    )
