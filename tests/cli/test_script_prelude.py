"""bench/script_prelude.py: what a one-message call of send.lua and settle.lua costs Redis
before its check, counted under callgrind. A short run: each form counted, in the order a
script runs them (floor < prelude < whole), and a second run counting the same."""

from __future__ import annotations

import shutil

import pytest

from bench import redis_instructions as ri
from bench import script_prelude as sp
from reach.embedded import find_server_binary

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(
        shutil.which("valgrind") is None or shutil.which("callgrind_control") is None,
        reason="valgrind not installed (apt-get install valgrind)",
    ),
]


async def _run(calls: int) -> dict[str, dict[str, float]]:
    with ri.counted_redis(find_server_binary().path) as (url, counter):
        return await sp.measure(url, counter, calls)


async def test_each_form_is_counted_in_order_and_a_second_run_counts_the_same() -> None:
    first, second = await _run(150), await _run(150)
    for script in ("send", "settle"):
        f = first[script]
        # the floor is an EVALSHA with the real arguments: thousands of instructions
        assert 5_000 < f["floor"] < f["prelude"] < f["whole"], (script, f)
        for form in ("floor", "prelude", "whole"):
            a, b = f[form], second[script][form]
            # Idle, two runs agree to a few tenths of a per cent; on a loaded machine
            # Redis's timer work (by the wall clock, which Valgrind slows) lands in some
            # forms' counts: a CI run saw 5.5 % on a short prelude form.
            assert abs(a - b) / a < 0.10, (script, form, a, b)


def test_the_prelude_is_cut_right_before_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, (marker, ret) in sp.CUTS.items():
        prelude = sp._forms(name)["prelude"]
        assert f"do return {ret} end\n{marker}" in prelude, name
    # A script whose check line changed fails the benchmark rather than measure elsewhere.
    monkeypatch.setitem(sp.CUTS, "settle", ("local no_such_line = check()", "{1}"))
    with pytest.raises(ValueError):
        sp._forms("settle")
