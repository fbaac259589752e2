"""The plan of a chaos run: its configuration, the messages and the chaos schedule.

Both are drawn from the run's seed, so one seed gives the same run (tests check it).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from typing import Any

from .agent import DEFAULT_AGENT, DEPLOY_AGENT


@dataclass
class ChaosConfig:
    """One run. Defaults are the short CI run; the long run raises messages and kills."""

    messages: int = 600
    workers: int = 3
    kills: int = 4
    stops: int = 1
    redis_restarts: int = 1
    seed: int = 1
    rate: float = 0.0  # messages/s; 0 = as fast as max_rate allows with event_gap_s
    max_rate: float = 150.0
    event_gap_s: float = 3.0  # mean time between chaos events
    permanent_share: float = 0.3  # kills whose worker never comes back (a new id replaces it)
    slow_restart_share: float = 0.4  # restarted ones that come back only after eviction
    request_share: float = 0.6  # the rest are fire-and-forget sends
    session_share: float = 0.2
    dup_share: float = 0.02  # messages that reuse an earlier message's idempotency key
    sessions: int = 40
    min_sleep_ms: int = 2
    max_sleep_ms: int = 100
    deadline_s: tuple[float, float] = (10.0, 30.0)  # request deadlines, uniform in range
    callers: int = 2  # Client instances
    inflight: int = 64  # caller tasks at once
    concurrency: int = 16  # handlers per worker
    heartbeat_s: float = 0.1
    lease_s: float = 0.3
    evict_after_s: float = 0.6
    sweep_interval_s: float = 0.1
    stop_s: float = 0.0  # SIGSTOP length; 0 = 2 * (lease + evict_after) + 0.3
    kill_wait_s: float = 3.0  # how long to wait for a victim with messages in flight
    quiet_timeout_s: float = 120.0
    caller_give_up_s: float = 180.0
    startup_timeout_s: float = 60.0
    agent: str = DEFAULT_AGENT
    namespace: str = "chaos"
    dir: str | None = None  # data dir (Redis AOF, worker logs); None = a temp dir
    keep: bool = False  # keep the dir (it is always kept when the run fails)
    cwd: str | None = None  # workers' working directory (to import the agent module)


@dataclass
class MessageSpec:
    """One message the callers send: its key, kind (request or send) and handler sleep."""

    i: int
    key: str
    kind: str  # request | send (| stream in the rolling-deploy scenario)
    priority: str
    session: str
    sleep_ms: int
    n: int
    deadline_s: float
    dup: bool
    chunks: int = 0  # streams: the chunks its handler yields


def plan_messages(cfg: ChaosConfig, rng: random.Random) -> list[MessageSpec]:
    """The messages of a run, drawn from ``rng`` (the same seed gives the same plan); a
    share of them reuse an earlier message's idempotency key, as a caller's retry does."""
    specs: list[MessageSpec] = []
    for i in range(cfg.messages):
        kind = "request" if rng.random() < cfg.request_share else "send"
        prio = rng.choices(("high", "normal", "low"), weights=(2, 6, 2))[0]
        dl = rng.uniform(*cfg.deadline_s)
        if i > 20 and rng.random() < cfg.dup_share:
            o = specs[rng.randrange(len(specs))]
            specs.append(MessageSpec(i, o.key, kind, prio, o.session, o.sleep_ms, o.n, dl, True))
            continue
        session = f"s{rng.randrange(cfg.sessions)}" if rng.random() < cfg.session_share else ""
        sleep_ms = rng.randint(cfg.min_sleep_ms, cfg.max_sleep_ms)
        specs.append(MessageSpec(i, f"k{i}", kind, prio, session, sleep_ms, i, dl, False))
    return specs


@dataclass
class ChaosEvent:
    """One chaos event of the schedule: a worker SIGKILL, a SIGSTOP, or a Redis restart."""

    at: float  # seconds after sending started
    kind: str  # kill | stop | redis
    fate: str = ""  # kills: restart_quick | restart_after_eviction | never
    delay: float = 0.0  # kills: seconds until it (or its replacement) starts


def plan_events(cfg: ChaosConfig, rng: random.Random, send_s: float) -> list[ChaosEvent]:
    """The chaos schedule: when, what, and what becomes of each killed worker. With two
    kills or more, at least one worker comes back with its id and one never does."""
    k = cfg.kills
    never = round(k * cfg.permanent_share)
    if k >= 2:
        never = min(max(never, 1), k - 1)
    slow = round((k - never) * cfg.slow_restart_share)
    fates = ["never"] * never + ["restart_after_eviction"] * slow
    fates += ["restart_quick"] * (k - len(fates))
    rng.shuffle(fates)
    kinds = ["kill"] * k + ["stop"] * cfg.stops + ["redis"] * cfg.redis_restarts
    rng.shuffle(kinds)
    n = len(kinds)
    delays = {
        "never": (0.5, 2.0),
        "restart_after_eviction": (1.2, 2.5),
        "restart_quick": (0.0, 0.4),
    }
    out = []
    for j, kind in enumerate(kinds):
        ev = ChaosEvent(round(send_s * (j + rng.uniform(0.25, 0.75)) / n, 3), kind)
        if kind == "kill":
            ev.fate = fates.pop()
            ev.delay = round(rng.uniform(*delays[ev.fate]), 3)
        out.append(ev)
    return out


# -- the rolling-deploy scenario ------------------------------------------------------------
@dataclass
class DeployConfig:
    """One rolling-deploy run. Defaults are the medium run; :meth:`short` the CI one."""

    workers: int = 4
    rounds: int = 2  # times every worker is replaced
    kills: int = 3  # worker SIGKILLs among the replacements
    redis_restarts: int = 1
    seed: int = 1
    rate: float = 25.0  # messages/s, for as long as the deploy goes on
    request_share: float = 0.6  # the rest: streams (stream_share) and fire-and-forget sends
    stream_share: float = 0.2
    session_share: float = 0.1
    dup_share: float = 0.02
    sessions: int = 40
    min_sleep_ms: int = 50  # handler times are log-uniform in [min, max]
    max_sleep_ms: int = 5000
    max_chunks: int = 8  # a stream yields 2..max_chunks chunks over its handler time
    deadline_s: tuple[float, float] = (30.0, 60.0)
    callers: int = 2
    inflight: int = 64
    concurrency: int = 16
    heartbeat_s: float = 0.2
    lease_s: float = 1.0
    evict_after_s: float = 2.0
    sweep_interval_s: float = 0.2
    gap_s: float = 0.5  # between one replacement (or kill) and the next step
    busy_wait_s: float = 3.0  # how long a step waits for its worker to have work in flight
    tail_s: float = 3.0  # load goes on this long after the last step
    drain_bound_s: float = 20.0  # a SIGTERMed worker must have exited this long after
    quiet_timeout_s: float = 120.0
    caller_give_up_s: float = 180.0
    startup_timeout_s: float = 60.0
    agent: str = DEPLOY_AGENT
    namespace: str = "chaos"
    dir: str | None = None
    keep: bool = False
    cwd: str | None = None

    @classmethod
    def short(cls, **over: Any) -> DeployConfig:
        """The CI form (about a minute on a busy 2-core machine): 3 workers replaced twice,
        2 SIGKILLs, 1 Redis restart, 15 messages/s."""
        return replace(cls(workers=3, kills=2, rate=15.0, gap_s=0.3), **over)


@dataclass
class DeployStep:
    """One step of a rolling deploy: replace a worker (a new one started and ready, then
    SIGTERM to the old one), SIGKILL one, or restart Redis."""

    kind: str  # replace | kill | redis
    slot: int = -1  # replace: the worker slot whose worker is replaced
    round: int = 0  # replace: which pass over the workers
    fate: str = ""  # kill: same_id (restarted with its agent id) | new_id (a new one)


def plan_deploy(cfg: DeployConfig, rng: random.Random) -> list[DeployStep]:
    """The steps: every worker replaced in turn, ``rounds`` times; the SIGKILLs at drawn
    places in between (never first: the deploy is under way), each Redis restart right
    after a replacement (its worker is draining then). Kills alternate between a restart
    with the same agent id and a new one."""
    steps = [DeployStep("replace", s, r) for r in range(cfg.rounds) for s in range(cfg.workers)]
    for j in range(cfg.kills):
        fate = "same_id" if j % 2 == 0 else "new_id"
        steps.insert(rng.randint(1, len(steps)), DeployStep("kill", fate=fate))
    for _ in range(cfg.redis_restarts):
        after = [
            i + 1
            for i, st in enumerate(steps)
            if st.kind == "replace" and (i + 1 == len(steps) or steps[i + 1].kind != "redis")
        ]
        steps.insert(rng.choice(after or [len(steps)]), DeployStep("redis"))
    return steps


def deploy_message(
    cfg: DeployConfig, rng: random.Random, i: int, earlier: list[MessageSpec]
) -> MessageSpec:
    """Message ``i`` of a rolling-deploy run (drawn from ``rng``: one seed, one sequence).
    Handler times are log-uniform in [min_sleep_ms, max_sleep_ms], so most are short and
    some run for seconds, as real agents' do; a share reuses an earlier key of its kind."""
    x = rng.random()
    kind = (
        "request"
        if x < cfg.request_share
        else "stream"
        if x < cfg.request_share + cfg.stream_share
        else "send"
    )
    prio = rng.choices(("high", "normal", "low"), weights=(2, 6, 2))[0]
    dl = rng.uniform(*cfg.deadline_s)
    same = [o for o in earlier[-200:] if o.kind == kind and not o.dup]
    if i > 20 and same and rng.random() < cfg.dup_share:
        o = same[rng.randrange(len(same))]
        return MessageSpec(i, o.key, kind, prio, o.session, o.sleep_ms, o.n, dl, True, o.chunks)
    session = f"s{rng.randrange(cfg.sessions)}" if rng.random() < cfg.session_share else ""
    lo, hi = math.log(cfg.min_sleep_ms), math.log(max(cfg.min_sleep_ms, cfg.max_sleep_ms))
    sleep_ms = round(math.exp(rng.uniform(lo, hi)))
    chunks = rng.randint(2, max(2, cfg.max_chunks)) if kind == "stream" else 0
    return MessageSpec(i, f"k{i}", kind, prio, session, sleep_ms, i, dl, False, chunks)
