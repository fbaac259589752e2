"""Version canaries (issue 31 item 4): agents register an application version, a
capability's split (reach.splits, Redis) sends each version its share of new sessions and
of messages without a session, sessions stay on their version, a version with share 0
never gets a message, a split change reaches a running client within about a second, and
the handler metrics carry the version."""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from typing import Any

import anyio
import pytest

import reach
from reach import Agent, Client, Context
from reach.keys import Keys
from reach.metrics import REGISTRY
from reach.routing.split import Split
from reach.splits import SPLITS_REFRESH_S, set_split
from tests.support.agents_messaging import serving
from tests.support.waiting import wait_until

pytestmark = pytest.mark.anyio

CAP = "canary.work"
# The two tests that send thousands of messages at once run the agents and the callers on
# one event loop: a sub-second lease (the helpers' default) can lapse on a slow machine
# while that loop works through them, and the agents, missed by the sweeper, turn
# probation and refuse the rest. Liveness is not what they test.
BUSY_LOOP = {"heartbeat_s": 0.2, "lease_s": 3.0, "evict_after_s": 6.0}


class Seen:
    """What the in-process agents handled: per version, and per session the versions."""

    def __init__(self) -> None:
        self.by_version: Counter[str] = Counter()
        self.sessions: dict[str, list[str]] = defaultdict(list)
        self.total = 0

    def agent(self, agent_id: str, version: str | None, cap: str = CAP) -> Agent:
        app = Agent(agent_id, capabilities=[cap], version=version)

        @app.handler(cap)
        async def work(payload: Any, ctx: Context) -> Any:
            v = ctx.agent.version
            self.by_version[v] += 1
            if ctx.envelope.session_id:
                self.sessions[ctx.envelope.session_id].append(v)
            self.total += 1
            return v

        return app

    async def until(self, n: int, timeout_s: float = 60) -> None:
        async def done() -> bool:
            return self.total >= n

        await wait_until(done, timeout_s=timeout_s, interval_s=0.02, what=f"{n} handled")


def handled_by(version: str) -> float:
    return (
        REGISTRY.get_sample_value(
            "reach_handler_duration_seconds_count",
            {"capability": CAP, "outcome": "succeeded", "version": version},
        )
        or 0.0
    )


async def test_ten_thousand_messages_split_within_two_percent(redis_url: str, ns: str) -> None:
    """1.4=90 1.5=10 over two 1.4 agents and one 1.5: the 10,000 messages (no session)
    land within 2 points of the shares; the 1.6 agent (not named: share 0) and the agent
    without a version get none; the handler metrics count them per version."""
    seen = Seen()
    agents = [
        seen.agent("cn-a", "1.4"),
        seen.agent("cn-b", "1.4"),
        seen.agent("cn-c", "1.5"),
        seen.agent("cn-d", "1.6"),
        seen.agent("cn-e", None),
    ]
    before = {v: handled_by(v) for v in ("1.4", "1.5", "1.6", "")}
    async with serving(redis_url, ns, *agents, **BUSY_LOOP) as client:
        await set_split(client.redis, Keys(ns), CAP, Split.parse("1.4=90 1.5=10"))
        n = 10_000
        for start in range(0, n, 1000):
            out = await client.send_many(CAP, list(range(start, start + 1000)))
            assert all(isinstance(x, str) for x in out), [x for x in out if not isinstance(x, str)]
        await seen.until(n)
    print(f"{n} messages under 1.4=90 1.5=10, handled per version: {dict(seen.by_version)}")
    assert sum(seen.by_version.values()) == n
    assert seen.by_version["1.6"] == 0 and seen.by_version[""] == 0, seen.by_version
    assert abs(seen.by_version["1.4"] / n - 0.90) <= 0.02, seen.by_version
    assert abs(seen.by_version["1.5"] / n - 0.10) <= 0.02, seen.by_version
    for v in ("1.4", "1.5", "1.6", ""):
        assert handled_by(v) - before[v] == seen.by_version[v], v


async def test_sessions_keep_their_version_across_a_split_change_and_processes(
    redis_url: str, ns: str
) -> None:
    """300 sessions of 4 messages each under 1.4=50 1.5=50: each session on one version.
    Then, from another client (another process would do the same: the pin is in Redis),
    the split becomes 1.4=10 1.5=90: the sessions already started stay where they were
    (both versions keep a share), new sessions go 90 % to 1.5. Then 1.4=0 1.5=100: the
    sessions of 1.4 move to 1.5, and none reaches 1.4 any more."""
    seen = Seen()
    agents = [seen.agent("cs-a", "1.4"), seen.agent("cs-b", "1.5"), seen.agent("cs-c", "1.5")]
    old = [f"old-{i}" for i in range(300)]
    new = [f"new-{i}" for i in range(300)]

    async def send_all(client: Client, sessions: list[str], per: int) -> None:
        async with anyio.create_task_group() as tg:
            for sid in sessions:
                for k in range(per):
                    tg.start_soon(lambda s=sid, k=k: client.send(CAP, k, session_id=s))

    async with serving(redis_url, ns, *agents, **BUSY_LOOP) as client:
        await set_split(client.redis, Keys(ns), CAP, Split.parse("1.4=50 1.5=50"))
        await send_all(client, old, 4)
        await seen.until(1200)
        first = {sid: seen.sessions[sid][0] for sid in old}
        assert all(len(set(seen.sessions[sid])) == 1 for sid in old)
        on_14 = sum(v == "1.4" for v in first.values())
        assert 90 <= on_14 <= 210, on_14  # half of 300, loosely: it is a hash of the id

        await set_split(client.redis, Keys(ns), CAP, Split.parse("1.4=10 1.5=90"))
        async with Client(redis_url=redis_url, namespace=ns) as other:
            await send_all(other, old, 2)
            await send_all(other, new, 2)
            await seen.until(1200 + 1200)
        for sid in old:
            assert set(seen.sessions[sid]) == {first[sid]}, (sid, seen.sessions[sid])
        for sid in new:
            assert len(set(seen.sessions[sid])) == 1, (sid, seen.sessions[sid])
        new_on_15 = sum(seen.sessions[sid][0] == "1.5" for sid in new)
        assert new_on_15 >= 0.8 * len(new), new_on_15

        await set_split(client.redis, Keys(ns), CAP, Split.parse("1.4=0 1.5=100"))
        before_14 = seen.by_version["1.4"]
        async with Client(redis_url=redis_url, namespace=ns) as third:
            await send_all(third, old, 1)
            await seen.until(2400 + 300)
        assert seen.by_version["1.4"] == before_14
        assert all(seen.sessions[sid][-1] == "1.5" for sid in old)


async def test_a_split_change_reaches_a_running_client_within_about_a_second(
    redis_url: str, ns: str
) -> None:
    """A client sending all the time: 1.4=100 -> 1.5=100 is in effect for its messages
    within SPLITS_REFRESH_S (plus a read), without a restart or an invalidation; and
    --clear (no split) lets every agent take messages again."""
    seen = Seen()
    async with serving(redis_url, ns, seen.agent("ch-a", "1.4"), seen.agent("ch-b", "1.5")) as c:
        keys = Keys(ns)
        await set_split(c.redis, keys, CAP, Split.parse("1.4=100"))
        # the first send reads the split; every one of these lands on 1.4
        for i in range(20):
            assert await c.request(CAP, i, timeout_s=30) == "1.4"
        await set_split(c.redis, keys, CAP, Split.parse("1.5=100"))
        changed_at = time.monotonic()
        while await c.request(CAP, 0, timeout_s=30) != "1.5":
            assert time.monotonic() - changed_at < 10, "the split change never applied"
        took = time.monotonic() - changed_at
        assert took <= SPLITS_REFRESH_S + 0.75, took
        for i in range(20):  # and it stays
            assert await c.request(CAP, i, timeout_s=30) == "1.5"

        await set_split(c.redis, keys, CAP, None)
        got: set[str] = set()
        deadline = time.monotonic() + 20
        while got != {"1.4", "1.5"}:
            assert time.monotonic() < deadline, got
            got.add(await c.request(CAP, 0, timeout_s=30))


async def test_no_agent_of_a_chosen_version_falls_back_and_none_at_all_is_version(
    redis_url: str, ns: str
) -> None:
    """A version with a share but no agent: its messages (and sessions) go to the other
    versions with a share. No agent of any version with a share: NoAgentAvailable, reason
    'version', naming the versions; a targeted message goes where it is told."""
    seen = Seen()
    async with serving(redis_url, ns, seen.agent("cf-a", "1.4"), seen.agent("cf-b", None)) as c:
        keys = Keys(ns)
        await set_split(c.redis, keys, CAP, Split.parse("1.4=50 1.7=50"))
        for i in range(40):
            assert await c.request(CAP, i, timeout_s=30) == "1.4"
            assert await c.request(CAP, i, session_id=f"s{i}", timeout_s=30) == "1.4"

        await set_split(c.redis, keys, CAP, Split.parse("1.7=100 1.4=0"))
        c._delivery.versions.cache.invalidate()  # this test is about the error, not the wait
        with pytest.raises(reach.NoAgentAvailable) as err:
            await c.request(CAP, 0, timeout_s=30)
        assert err.value.reason == "version"
        assert "'1.7'" in str(err.value) and "reach caps split" in str(err.value)
        with pytest.raises(reach.NoAgentAvailable) as err:
            await c.request(CAP, 0, session_id="s-new", timeout_s=30)
        assert err.value.reason == "version"
        # a message sent to one agent ignores the split
        assert await c.request(CAP, 0, target="cf-a", timeout_s=30) == "1.4"

        # agents without a version are named by '='
        await set_split(c.redis, keys, CAP, Split.parse("=100"))
        c._delivery.versions.cache.invalidate()
        for i in range(10):
            assert await c.request(CAP, i, timeout_s=30) == ""


async def test_every_policy_picks_within_the_chosen_version(redis_url: str, ns: str) -> None:
    """consistent_hash and least_conn, like weighted_rr, pick among the chosen version's
    agents only: 1.4=0 1.5=100 with two agents of each sends nothing to 1.4."""
    seen = Seen()
    agents = [seen.agent(f"cp-{i}", v) for i, v in enumerate(("1.4", "1.4", "1.5", "1.5"))]
    async with serving(redis_url, ns, *agents) as c:
        await set_split(c.redis, Keys(ns), CAP, Split.parse("1.4=0 1.5=100"))
        for i in range(30):
            assert await c.request(CAP, i, policy="least_conn", timeout_s=30) == "1.5"
            got = await c.request(
                CAP, i, policy="consistent_hash", session_id=f"h{i}", timeout_s=30
            )
            assert got == "1.5"
    assert seen.by_version["1.4"] == 0


async def test_a_batch_keeps_each_session_on_its_version(redis_url: str, ns: str) -> None:
    """send_many of messages of many sessions (the batch form pins each session once):
    every message of a session lands where its first one did, and a second batch finds
    the pins the first made."""
    seen = Seen()
    async with serving(redis_url, ns, seen.agent("cb-a", "1.4"), seen.agent("cb-b", "1.5")) as c:
        await set_split(c.redis, Keys(ns), CAP, Split.parse("1.4=50 1.5=50"))
        for sid in (f"b{i}" for i in range(100)):
            out = await c.send_many(CAP, [1, 2, 3], session_id=sid)
            assert all(isinstance(x, str) for x in out), out
        await seen.until(300)
        await set_split(c.redis, Keys(ns), CAP, Split.parse("1.4=1 1.5=99"))
        c._delivery.versions.cache.invalidate()
        for sid in (f"b{i}" for i in range(100)):
            await c.send_many(CAP, [4], session_id=sid)
        await seen.until(400)
    assert all(len(set(vs)) == 1 and len(vs) == 4 for vs in seen.sessions.values())
    assert 20 <= sum(vs[0] == "1.4" for vs in seen.sessions.values()) <= 80


async def test_a_hedge_stays_on_the_first_copys_version(redis_url: str, ns: str) -> None:
    """hedge_after_s on a split capability: the first copy (1.4) stalls, the hedge goes to
    the other 1.4 agent, never to the 1.6 one (not named: share 0), 12 times over."""
    ran: Counter[str] = Counter()

    def hedged(agent_id: str, version: str) -> Agent:
        app = Agent(agent_id, capabilities=[CAP], version=version)

        @app.handler(CAP, idempotent=True)
        async def work(payload: Any, ctx: Context) -> Any:
            ran[version] += 1
            if not ctx.envelope.idempotency_key.endswith(":hedge"):
                await anyio.sleep(60)  # the first copy stalls: the hedge answers
            return version

        return app

    agents = [hedged("ch-a", "1.4"), hedged("ch-b", "1.4"), hedged("ch-c", "1.6")]
    async with serving(redis_url, ns, *agents) as c:
        await set_split(c.redis, Keys(ns), CAP, Split.parse("1.4=100"))
        for i in range(12):
            with anyio.fail_after(30):
                assert await c.request(CAP, i, timeout_s=60, hedge_after_s=0.1) == "1.4"
    assert ran["1.6"] == 0 and ran["1.4"] == 24


async def test_gather_asks_the_versions_with_a_share_and_broadcast_every_agent(
    redis_url: str, ns: str
) -> None:
    seen = Seen()
    agents = [seen.agent("cg-a", "1.4"), seen.agent("cg-b", "1.4"), seen.agent("cg-c", "1.6")]
    async with serving(redis_url, ns, *agents) as c:
        await set_split(c.redis, Keys(ns), CAP, Split.parse("1.4=100"))
        got = await c.gather(CAP, 1, quorum="all", timeout_s=30)
        assert sorted(got.asked) == ["cg-a", "cg-b"]
        sent = await c.broadcast(CAP, 2)
        assert len(sent) == 3
        await seen.until(5)
    assert seen.by_version == {"1.4": 4, "1.6": 1}


@pytest.mark.cluster
async def test_splits_and_session_pins_on_a_cluster(redis_cluster: Any, ns: str) -> None:
    """On the 3-master cluster: the split is read from the namespace's slot, each
    session's pin lives in its own slot, and sessions stay on their version."""
    seen = Seen()
    agents = [seen.agent("cc-a", "1.4"), seen.agent("cc-b", "1.5")]
    async with serving(redis_cluster.url, ns, *agents) as c:
        await set_split(c.redis, Keys(ns), CAP, Split.parse("1.4=50 1.5=50"))
        for i in range(40):
            for k in range(3):
                await c.request(CAP, k, session_id=f"cl-{i}", timeout_s=30)
        await set_split(c.redis, Keys(ns), CAP, Split.parse("1.4=0 1.5=100"))
        c._delivery.versions.cache.invalidate()
        for i in range(40):
            assert await c.request(CAP, 0, timeout_s=30) == "1.5"
    firsts = [vs[0] for vs in seen.sessions.values()]
    assert all(len(set(vs[:3])) == 1 for vs in seen.sessions.values())
    assert {"1.4", "1.5"} == set(firsts)
