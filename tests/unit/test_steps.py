"""Durable steps without Redis: step names, the errors' place in the tree and what a
handler raising one ends as, and the bounds as the docs state them."""

from __future__ import annotations

from pathlib import Path

import pytest

import reach
from reach._worker import outcome as oc
from reach.context import Context
from reach.envelope import Envelope
from reach.keys import Keys
from reach.outcomes import DeadReason, Status
from reach.scripts.codes import StepBound
from reach.steps import MAX_STEPS, NAME_MAX_BYTES, RESULT_MAX_BYTES, check_name

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]


def test_the_bounds_are_step_lua_s() -> None:
    assert (RESULT_MAX_BYTES, MAX_STEPS, NAME_MAX_BYTES) == (65_536, 100, 200)
    assert (StepBound.RESULT_BYTES, StepBound.STEPS, StepBound.NAME_BYTES) == (
        RESULT_MAX_BYTES,
        MAX_STEPS,
        NAME_MAX_BYTES,
    )


@pytest.mark.parametrize("name", ["charge", "é" * 100, "n" * NAME_MAX_BYTES, "a b/c:d"])
def test_names_accepted(name: str) -> None:
    assert check_name(name) == name


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("", "non-empty string"),
        (7, "non-empty string"),
        (None, "non-empty string"),
        ("n" * (NAME_MAX_BYTES + 1), "over 200 bytes"),
        ("é" * 101, "over 200 bytes"),  # 101 characters, 202 bytes
        ("a\ud800", "not valid UTF-8"),
    ],
)
def test_names_refused(name: object, why: str) -> None:
    with pytest.raises(reach.ConfigError, match=why):
        check_name(name)


def test_the_step_errors_are_reach_errors_and_the_bound_ones_rejections() -> None:
    for cls in (reach.StepRefused, reach.StepTooLarge, reach.TooManySteps):
        assert issubclass(cls, reach.ReachError) and issubclass(cls, reach.Reject)
    assert issubclass(reach.StepTooLarge, reach.StepRefused)
    assert issubclass(reach.TooManySteps, reach.StepRefused)
    assert issubclass(reach.StaleRun, reach.ReachError)
    assert not issubclass(reach.StaleRun, reach.Reject)


@pytest.mark.parametrize("exc", [reach.StepTooLarge("big"), reach.TooManySteps("many")])
def test_a_bound_raised_out_of_a_handler_is_dead_at_once(exc: Exception) -> None:
    env = Envelope(msg_id="m", capability="c", attempt=1, max_attempts=3)
    out = oc.raised(env, exc, timed_out=False, now_ms=0, backoff_ms=10)
    assert (out.status, out.reason, out.error_type) == (
        Status.DEAD,
        DeadReason.REJECTED,
        type(exc).__name__,
    )


def test_a_stale_run_raised_out_of_a_handler_is_an_ordinary_failure() -> None:
    env = Envelope(msg_id="m", capability="c", attempt=1, max_attempts=3)
    out = oc.raised(env, reach.StaleRun("lost"), timed_out=False, now_ms=0, backoff_ms=10)
    assert out.status == Status.RETRYING  # its completion is fenced anyway


async def test_a_context_without_a_worker_refuses_steps() -> None:
    ctx = Context(
        Envelope(msg_id="m", capability="c"),
        1,
        agent_id="a",
        redis=None,  # type: ignore[arg-type]
        keys=Keys("ns"),
        client=None,  # type: ignore[arg-type]
    )
    ran: list[int] = []
    with pytest.raises(reach.ConfigError, match="needs a message claimed by a reach worker"):
        await ctx.step("charge", ran.append, 1)
    with pytest.raises(reach.ConfigError, match="non-empty string"):
        await ctx.step("", ran.append, 1)
    assert ran == []
    assert ctx.step_key("charge") == "m/charge"


def test_the_docs_state_the_bounds() -> None:
    protocol = " ".join((ROOT / "docs" / "protocol.md").read_text().split())
    concepts = " ".join((ROOT / "docs" / "concepts.md").read_text().split())
    for figure in (
        f"at most {RESULT_MAX_BYTES} bytes",
        f"names of 1..{NAME_MAX_BYTES} bytes",
        f"at most {MAX_STEPS})",
        f"1..{RESULT_MAX_BYTES} bytes",
        f"`{{3, n}}` the journal holds n = {MAX_STEPS} results",
    ):
        assert figure in protocol, figure
    for figure in (
        f"at most {RESULT_MAX_BYTES // 1024} KiB encoded",
        f"at most {MAX_STEPS} steps",
        f"at most {NAME_MAX_BYTES} bytes of UTF-8",
    ):
        assert figure in concepts, figure
