"""Client.gather and reach.vote with real worker processes: a quorum met without waiting
for a slow agent (the copies still out are cancelled), failures counted not raised, a
quorum that becomes impossible raised at once (not at the deadline), a quorum met while
an agent is SIGKILLed mid-handler, and gathering from ``n`` agents only."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import anyio
import pytest

from reach import Gathered, QuorumFailed, RemoteError, vote
from reach.client import Client
from reach.connection import AnyRedis
from reach.errors import ConfigError, NoAgentAvailable
from reach.keys import Keys
from reach.registry import Registry
from tests.support.agents_gather import ADVERTISED_S, CAP
from tests.support.agents_messaging import effects
from tests.support.waiting import wait_until
from tests.support.workers import Workers

pytestmark = pytest.mark.anyio

ANSWER = {"label": "yes", "score": 3}
# The gathers here end long before this: reaching it means the gather waited for a copy it
# should have cancelled or given up on.
GENEROUS_S = 60


@pytest.fixture
def workers(redis_url: str, ns: str) -> Iterator[Workers]:
    w = Workers(redis_url, ns, "tests.support.agents_gather")
    yield w
    w.stop_all()


async def start(workers: Workers, r: AnyRedis, ns: str, *names: str) -> None:
    for name in names:
        workers.start(name)
    reg = Registry(r, ns)

    async def ready() -> bool:
        return len(await reg.agents(CAP, ready=True)) == len(names)

    await wait_until(ready, what=f"{len(names)} agents ready")


async def test_a_quorum_of_three_is_met_without_the_slow_agent_and_it_is_cancelled(
    workers: Workers, r: AnyRedis, redis_url: str, ns: str
) -> None:
    """Five agents: three that agree, one that never answers in time (600 s), one that
    fails. A quorum of 3 returns with the three answers, each with its agent id; the slow
    agent's copy is cancelled (its handler sees the cancel), not waited for."""
    await start(workers, r, ns, "voter_1", "voter_2", "voter_3", "slow_voter", "failing_voter")
    async with Client(redis_url=redis_url, namespace=ns) as c:
        with anyio.fail_after(GENEROUS_S):
            g = await c.gather(CAP, {"answer": ANSWER}, quorum=3, max_attempts=1)
        assert isinstance(g, Gathered) and g.met and g.quorum == 3
        assert sorted(g.asked) == sorted(
            ["voter-1", "voter-2", "voter-3", "slow-voter", "failing-voter"]
        )
        assert sorted(a.agent_id for a in g.answers) == ["voter-1", "voter-2", "voter-3"]
        assert g.results == [ANSWER] * 3
        # the failing agent's copy failed (counted) or was still out (cancelled)
        assert {f.agent_id for f in g.failures} <= {"failing-voter"}
        assert all(isinstance(f.error, RemoteError) for f in g.failures)
        assert "slow-voter" in g.cancelled
        v = vote(g)
        assert (v.value, v.support, v.total, v.majority) == (ANSWER, 3, 3, True)
        assert sorted(v.agents) == ["voter-1", "voter-2", "voter-3"]

        async def slow_cancelled() -> bool:
            return (await effects(r, ns, "vote.cancelled")).get("slow-voter") == 1

        await wait_until(slow_cancelled, what="the slow agent's copy cancelled")
    assert "slow-voter" not in await effects(r, ns, "vote.finished")


async def test_a_quorum_that_becomes_impossible_is_raised_at_once_with_what_was_gathered(
    workers: Workers, r: AnyRedis, redis_url: str, ns: str
) -> None:
    """Five agents, two of which fail and one that is slow: a quorum of 4 cannot be met
    once both failed, so QuorumFailed is raised then (long before the 600 s the slow agent
    would take, or the 120 s deadline), holding the two failures and whatever answered;
    the copies still out are cancelled."""
    await start(
        workers,
        r,
        ns,
        "voter_1",
        "voter_2",
        "slow_voter",
        "failing_voter",
        "failing_voter_2",
    )
    async with Client(redis_url=redis_url, namespace=ns) as c:
        with anyio.fail_after(GENEROUS_S), pytest.raises(QuorumFailed) as info:
            await c.gather(CAP, {"answer": ANSWER}, quorum=4, timeout_s=120, max_attempts=1)
    g = info.value.gathered
    assert sorted(f.agent_id for f in g.failures) == ["failing-voter", "failing-voter-2"]
    # the two that agree may not have answered yet when it became impossible: cancelled
    answered = {a.agent_id for a in g.answers}
    assert answered <= {"voter-1", "voter-2"}
    assert sorted(g.cancelled) == sorted({"voter-1", "voter-2", "slow-voter"} - answered)
    assert not g.met
    msg = str(info.value)
    assert "quorum of 4" in msg and "2 failed" in msg and "Lower the quorum" in msg


async def test_the_quorum_is_met_while_an_agent_is_sigkilled_mid_handler(
    workers: Workers, r: AnyRedis, redis_url: str, ns: str
) -> None:
    """Four agents each taking 3 s; one is SIGKILLed while its handler runs. A majority
    (3 of 4) is still met by the other three."""
    await start(
        workers, r, ns, "sleepy_voter_1", "sleepy_voter_2", "sleepy_voter_3", "sleepy_voter_4"
    )
    victim = workers.procs["sleepy_voter_4"]
    async with Client(redis_url=redis_url, namespace=ns) as c:
        got: list[Gathered] = []
        async with anyio.create_task_group() as tg:

            async def ask() -> None:
                got.append(
                    await c.gather(
                        CAP, {"answer": ANSWER, "seconds": 3}, quorum="majority", timeout_s=30
                    )
                )

            tg.start_soon(ask)

            async def all_started() -> bool:
                return len(await effects(r, ns, "vote.started")) == 4

            await wait_until(all_started, what="every agent's handler started")
            os.kill(victim.pid, signal.SIGKILL)
        (g,) = got
    assert g.met and g.quorum == 3
    assert sorted(a.agent_id for a in g.answers) == ["sleepy-1", "sleepy-2", "sleepy-3"]
    assert victim.wait(timeout=10) == -signal.SIGKILL
    assert "sleepy-4" not in await effects(r, ns, "vote.finished")


async def test_n_agents_are_asked_and_the_vote_names_the_majority(
    workers: Workers, r: AnyRedis, redis_url: str, ns: str
) -> None:
    """n=3 of four agents: exactly three copies go out; with 'all' every one must answer;
    the vote is the answer most gave, with its support."""
    await start(workers, r, ns, "voter_1", "voter_2", "voter_3", "dissenter")
    async with Client(redis_url=redis_url, namespace=ns) as c:
        g = await c.gather(CAP, {"answer": ANSWER}, n=3, quorum="all")
        assert len(g.asked) == 3 and len(g.answers) == 3 and g.quorum == 3
        g = await c.gather(CAP, {"answer": ANSWER}, quorum="all")
        v = vote(g)
        assert (v.value, v.support, v.total, v.majority) == (ANSWER, 3, 4, True)
        assert "dissenter" not in v.agents
        with pytest.raises(QuorumFailed, match="only 4 eligible"):
            await c.gather(CAP, {"answer": ANSWER}, quorum=5)
        with pytest.raises(ConfigError, match="quorum"):
            await c.gather(CAP, {"answer": ANSWER}, quorum=0)


async def test_a_gather_without_timeout_s_takes_the_capability_s_advertised_timeout(
    workers: Workers, r: AnyRedis, redis_url: str, ns: str
) -> None:
    """The agents advertise 45 s and the client's default is 30 s: every copy of a gather
    that names no timeout gets the advertised one, as a request would."""
    await start(workers, r, ns, "voter_1", "voter_2")
    async with Client(redis_url=redis_url, namespace=ns, default_timeout_s=30) as c:
        before_ms = time.time() * 1000
        g = await c.gather(CAP, {"answer": ANSWER}, quorum="all")
        after_ms = time.time() * 1000
    assert g.met
    raw = await r.hgetall(Keys(ns).effects("vote.deadline"))
    deadlines = {k.decode(): int(v) for k, v in raw.items()}
    assert set(deadlines) == {"voter-1", "voter-2"}
    assert len(set(deadlines.values())) == 1  # one deadline shared by every copy
    (d,) = set(deadlines.values())
    # clocks of one host (Redis-corrected, within a second): 45 s, not the default 30 s
    assert before_ms + (ADVERTISED_S - 1) * 1000 <= d <= after_ms + (ADVERTISED_S + 1) * 1000


async def test_a_gather_with_no_agent_says_so_before_sending(redis_url: str, ns: str) -> None:
    async with Client(redis_url=redis_url, namespace=ns) as c:
        with pytest.raises(NoAgentAvailable, match=CAP):
            await c.gather(CAP, {"answer": ANSWER})
