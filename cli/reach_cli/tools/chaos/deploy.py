"""The rolling-deploy scenario (``reach chaos --scenario rolling-deploy``): every worker
replaced in turn by SIGTERM, twice, under continuous load, with a few SIGKILLs and a
Redis restart among the replacements; then the pass criteria, checked from a ledger the
handlers write.

What one run does
-----------------
* starts a Redis of its own with AOF (``appendfsync everysec``) for the messages, and a
  second one, never restarted, for the ledger: every handler run writes its start (agent,
  pid, fence, time) and its end there, so runs are counted per message whatever happens
  to the first Redis;
* starts N ``reach worker`` processes of :func:`~reach_cli.tools.chaos.agent.deploy_agent`
  (a request/send handler and a streaming one, each running 0.05-5 s, log-uniform);
* sends continuously, at ``rate`` messages/s, for as long as the deploy goes on: requests
  with deadlines, streams (chunks checked: 0..n-1, each once, in order) and
  fire-and-forget sends, mixed priorities, some sessions, a few idempotency keys sent
  twice; a caller told a typed error sends again under the same key;
* meanwhile the deploy: for each worker slot in turn, ``rounds`` times over, a new worker
  (a new agent id) is started and waited for until ready, then the old one gets SIGTERM
  (while it has entries in flight when it can) and drains on its own; at drawn places in
  between, a worker is SIGKILLed (restarted with its id, or replaced by a new one) and
  Redis is SIGKILLed and restarted from its AOF (right after a SIGTERM, during a drain);
* then waits, bounded, until every key is done, every SIGTERMed worker exited and nothing
  is left in inboxes, and checks (see :meth:`_DeployRun.verify`):

  - 0 lost: every key done and succeeded, with its side effect; every delivered msg_id
    succeeded; nothing pending, queued, parked or delayed; no dead letter unaccounted;
  - every caller answered: each request and stream got its right result (no
    DeadlineExceeded, no untyped error), each send's task succeeded;
  - each completed key's handler ran once: a run besides the one that completed the key
    is allowed only when its worker was SIGKILLed while it ran; a run that started and
    never ended needs a SIGKILL too;
  - no message ran on two agents at once: no two runs of one key overlap in time (a
    SIGKILLed run ends at its kill);
  - every SIGTERMed worker exited 0 within ``drain_bound_s``.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import signal
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import asdict, dataclass, field
from typing import Any

import anyio
from redis import exceptions as rexc

from reach import Client
from reach.connection import AnyRedis, as_text, connect
from reach.embedded import RedisServer
from reach.envelope import now_ms
from reach.errors import ConfigError, DeadlineExceeded, ReachError
from reach.registry import Registry, default_shards

from .agent import CAPABILITY, LEDGER, LEDGER_ENV, STREAM_CAPABILITY
from .harness import Cluster, _Outcome, _pct, _Rec, _Worker
from .plan import DeployConfig, DeployStep, MessageSpec, deploy_message, plan_deploy
from .report import DeployReport, DrainRecord, KillRecord

SCENARIO = "rolling-deploy"


@dataclass
class _Run1:
    """One handler run as the ledger has it."""

    key: str
    n: int
    agent: str
    pid: int
    fence: int
    start_ms: int
    end_ms: int | None
    how: str  # how it ended: ok, the exception that ended it, or "" (no end recorded)


@dataclass
class _Call(_Outcome):
    first_try: bool = False
    chunks_wrong: bool = False
    chunks_got: list[Any] = field(default_factory=list)  # a wrong stream's chunks
    deadline_exceeded: int = 0
    error_at: list[float] = field(default_factory=list)


@dataclass
class _Judged:
    """What :meth:`_DeployRun.judge_runs` found, in counts (see the report's fields)."""

    cut: int
    unexplained: int
    unfinished: int
    unmatched: int
    twice: int
    overlapping: int
    by_drain: int
    again_outage: int
    again_outage_drain: int
    failed: dict[str, int]


def _cap(s: MessageSpec) -> str:
    return STREAM_CAPABILITY if s.kind == "stream" else CAPABILITY


class _DeployRun(Cluster):
    def __init__(self, cfg: DeployConfig, on_progress: Callable[[dict[str, Any]], None] | None):
        super().__init__(cfg, cfg.dir, (CAPABILITY, STREAM_CAPABILITY))
        self.cfg = cfg
        self.on_progress = on_progress
        self.plan_rng = random.Random(cfg.seed)  # the plan: one seed, one deploy and load
        self.rng = random.Random(cfg.seed + 1)  # choices made during the run
        self.steps = plan_deploy(cfg, self.plan_rng)
        self.msg_rng = random.Random(cfg.seed + 2)
        self.specs: list[MessageSpec] = []
        self.outcomes: list[_Call] = []
        self.slots = [f"w{i}-g0" for i in range(cfg.workers)]
        self.generation = [0] * cfg.workers
        self.drain_log: list[DrainRecord] = []
        self.kill_log: list[KillRecord] = []
        self.kill_keys: list[list[str]] = []
        self.killed_pids: dict[int, int] = {}  # pid -> kill_ms
        self.exited_ms: dict[int, int] = {}  # pid -> when it was seen gone
        self.started = self.finished = 0
        self.replaced = 0
        self.load_s = 0.0
        self.t0_ms = 0
        self.load_max = 0.0
        self.sending = True
        self.ledger_server: RedisServer | None = None
        self.ledger: AnyRedis | None = None
        self.phase = "starting"
        self.done = anyio.Event()

    # -- the deploy ---------------------------------------------------------------------
    async def deploy(self, tg: anyio.abc.TaskGroup) -> None:
        for step in self.steps:
            for attempt in (1, 2):
                try:
                    if step.kind == "replace":
                        await self.replace(tg, step)
                    elif step.kind == "kill":
                        await self.kill(step)
                    else:
                        await self.restart_redis()
                    break
                except (rexc.RedisError, OSError):  # Redis away at that moment: once more
                    if attempt == 2 or step.kind == "redis":
                        raise
                    await anyio.sleep(0.5)
            await anyio.sleep(self.cfg.gap_s)
        await anyio.sleep(self.cfg.tail_s)
        self.sending = False

    async def busy(self, w: _Worker) -> bool:
        """Wait (bounded) until ``w`` has entries in flight; False if it never had."""
        give_up = time.monotonic() + self.cfg.busy_wait_s
        while time.monotonic() < give_up:
            if w.proc.poll() is not None:
                return False
            if await self.pending_of(w.agent_id) > 0:
                return True
            await anyio.sleep(0.02)
        return False

    async def replace(self, tg: anyio.abc.TaskGroup, step: DeployStep) -> None:
        slot = step.slot
        old = self.workers[self.slots[slot]]
        self.generation[slot] += 1
        new_id = f"w{slot}-g{self.generation[slot]}"
        self.start_worker(new_id)
        await self.wait_ready({new_id})  # the overlapping start: ready before the SIGTERM
        self.slots[slot] = new_id
        if old.proc.poll() is not None:
            return
        mid = await self.busy(old)
        keys = await self.inbox_keys(old.agent_id)
        rec = DrainRecord(
            agent_id=old.agent_id,
            pid=old.proc.pid,
            replaced_by=new_id,
            round=step.round,
            at_s=round(time.monotonic() - self.t0, 3),
            sigterm_ms=0,
            mid_handler=mid,
            inbox=len(keys),
        )
        rec.sigterm_ms = now_ms()
        old.proc.send_signal(signal.SIGTERM)
        self.drain_log.append(rec)
        self.replaced += 1
        tg.start_soon(self.watch_exit, rec, old)

    async def watch_exit(self, rec: DrainRecord, w: _Worker) -> None:
        give_up = time.monotonic() + self.cfg.drain_bound_s
        while time.monotonic() < give_up:
            code = w.proc.poll()
            if code is not None:
                self.exited_ms[w.proc.pid] = now_ms()
                rec.exit_code = code
                rec.drain_s = round((self.exited_ms[w.proc.pid] - rec.sigterm_ms) / 1000, 3)
                return
            await anyio.sleep(0.02)

    async def kill(self, step: DeployStep) -> None:
        give_up = time.monotonic() + self.cfg.busy_wait_s
        victim: _Worker | None = None
        mid = False
        while victim is None:
            # Serving ones only, past their start (their first pending entries may be a
            # predecessor's), leaving one other serving.
            cands = [
                w
                for w in self.alive()
                if w.agent_id in self.slots and now_ms() - w.started_ms > 1500
            ]
            if len(cands) >= 2:
                self.rng.shuffle(cands)
                for w in cands:
                    if await self.pending_of(w.agent_id) > 0:
                        victim, mid = w, True
                        break
                if victim is None and time.monotonic() > give_up:
                    victim = cands[0]
            elif time.monotonic() > give_up:
                return
            if victim is None:
                await anyio.sleep(0.02)
        reg = Registry(self.r, self.settings.namespace)
        before = await reg.get(victim.agent_id)
        kill_ms = now_ms()
        at = time.monotonic() - self.t0
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait()
        self.killed_pids[victim.proc.pid] = kill_ms
        keys = await self.inbox_keys(victim.agent_id)
        delay = 0.3 if step.fate == "same_id" else 0.0
        self.kill_log.append(
            KillRecord(victim.agent_id, round(at, 3), kill_ms, mid, len(keys), step.fate, delay)
        )
        self.kill_keys.append(keys)
        slot = self.slots.index(victim.agent_id)
        if step.fate == "same_id":  # a crashed process restarted in place
            await anyio.sleep(delay)
            new_id = victim.agent_id
        else:  # replaced by a new one (its inbox moves once it is evicted)
            self.generation[slot] += 1
            new_id = f"w{slot}-g{self.generation[slot]}"
            self.slots[slot] = new_id
        self.start_worker(new_id)
        if step.fate == "same_id" and before is not None:
            # The killed process's record stays active and ready until its lease runs
            # out: wait for the restarted process's own registration.
            gone = before.instance_id
            with anyio.fail_after(self.settings.startup_timeout_s):
                while (a := await reg.get(new_id)) is None or a.instance_id == gone:
                    await anyio.sleep(0.05)
        await self.wait_ready({new_id})

    # -- the load -----------------------------------------------------------------------
    async def produce(self, clients: list[Client], tg: anyio.abc.TaskGroup) -> None:
        limiter = anyio.Semaphore(self.cfg.inflight)
        i = 0
        while self.sending:
            await anyio.sleep(max(0.0, self.t0 + i / self.cfg.rate - time.monotonic()))
            s = deploy_message(self.cfg, self.msg_rng, i, self.specs)
            self.specs.append(s)
            self.outcomes.append(_Call())
            await limiter.acquire()
            tg.start_soon(self.one, clients[i % len(clients)], s, limiter)
            i += 1
        self.load_s = time.monotonic() - self.t0

    async def one(self, c: Client, s: MessageSpec, limiter: anyio.Semaphore) -> None:
        out = self.outcomes[s.i]
        self.started += 1
        give_up = time.monotonic() + self.cfg.caller_give_up_s
        want = {"k": s.key, "n": s.n}
        payload = {"n": s.n, "s": s.sleep_ms, "c": s.chunks}
        first = True
        try:
            while True:
                opts: dict[str, Any] = {
                    "idempotency_key": s.key,
                    "priority": s.priority,
                    "session_id": s.session or None,
                    "policy": "consistent_hash" if s.session else None,
                }
                try:
                    if s.kind == "stream":
                        st = c.stream(STREAM_CAPABILITY, payload, timeout_s=s.deadline_s, **opts)
                        out.msg_ids.append(st.msg_id)
                        async with st:
                            got = [ch.get("i") async for ch in st]
                        if st.result != want:
                            out.wrong = True
                        # A first answer carries every chunk; a retry may be answered from
                        # the stored result alone.
                        if first and not s.dup and got != list(range(s.chunks)):
                            out.chunks_wrong = True
                            out.chunks_got = got
                    else:
                        env = c.build(
                            CAPABILITY,
                            payload,
                            timeout_s=s.deadline_s if s.kind == "request" else None,
                            reply=s.kind == "request",
                            **opts,
                        )
                        out.msg_ids.append(env.msg_id)
                        if s.kind == "request":
                            if await c.call(env) != want:
                                out.wrong = True
                        else:
                            await c.deliver(env)
                    out.done = True
                    out.first_try = first
                    return
                except ReachError as e:
                    out.errors.append(type(e).__name__)
                    out.failed[out.msg_ids[-1]] = type(e).__name__
                    out.error_at.append(round(time.monotonic() - self.t0, 2))
                    if isinstance(e, DeadlineExceeded):
                        out.deadline_exceeded += 1
                except Exception as e:  # noqa: BLE001 - untyped: a violation, still retried
                    out.errors.append(f"untyped:{type(e).__module__}.{type(e).__name__}")
                first = False
                if time.monotonic() > give_up:
                    out.gave_up = True
                    return
                c.invalidate()
                await anyio.sleep(self.rng.uniform(0.05, 0.3))
        finally:
            self.finished += 1
            limiter.release()

    # -- quiet and checks ---------------------------------------------------------------
    async def all_records(self) -> dict[str, _Rec]:
        recs: dict[str, _Rec] = {}
        for cap in (CAPABILITY, STREAM_CAPABILITY):
            keys = sorted({s.key for s in self.specs if _cap(s) == cap})
            recs.update(await self.records(keys, cap))
        return recs

    async def quiet(self) -> float:
        """Wait until every key is done, every SIGTERMed worker gone, and the inboxes,
        parked and delayed sets are empty."""
        t = time.monotonic()
        with anyio.move_on_after(self.cfg.quiet_timeout_s):
            while True:
                try:
                    recs = await self.all_records()
                    left = await self.leftovers()
                    drained = all(d.exit_code is not None for d in self.drain_log)
                    if all(x.done for x in recs.values()) and not any(left.values()) and drained:
                        break
                except (rexc.RedisError, OSError):
                    pass
                await anyio.sleep(0.1)
        return time.monotonic() - t

    async def ledger_runs(self) -> tuple[dict[str, list[_Run1]], dict[str, str]]:
        assert self.ledger is not None
        fx = {as_text(k): as_text(v) for k, v in (await self.ledger.hgetall(LEDGER)).items()}
        runs: dict[str, list[_Run1]] = {}
        for f, v in fx.items():
            if f.startswith("run:"):
                k, n = f[4:].rsplit(":", 1)
                agent, pid, fence, start = v.split("|")
                end, _, how = fx.get(f"end:{k}:{n}", "").partition("|")
                runs.setdefault(k, []).append(
                    _Run1(
                        k,
                        int(n),
                        agent,
                        int(pid),
                        int(fence),
                        int(start),
                        int(end) if end else None,
                        how,
                    )
                )
        for rs in runs.values():
            rs.sort(key=lambda r: r.start_ms)
        return runs, fx

    def run_end(self, r: _Run1, now: int) -> int:
        """When a run stopped: its end, else its worker's SIGKILL or exit, else now."""
        if r.end_ms is not None:
            return r.end_ms
        return self.killed_pids.get(r.pid) or self.exited_ms.get(r.pid) or now

    def judge_runs(
        self,
        keys: Sequence[str],
        recs: Mapping[str, _Rec],
        runs: Mapping[str, list[_Run1]],
        fx: Mapping[str, str],
        now: int,
        example: Callable[[str, str], None],
    ) -> _Judged:
        """Each key's runs against the criteria "run once" and "not on two agents at
        once", from the ledger (``runs``, ``fx``), the idempotency records and what the run
        did to the workers (SIGKILLs, SIGTERMs) and to Redis (its outages)."""
        # Runs: one completes each key (its fence is the record's, and it ran to its end).
        # Any other was cut by a SIGKILL (its worker died while it ran), or failed and was
        # retried (it raised, or the runtime closed its stream, e.g. when Redis went away
        # under it); a run the drain cancelled, or a second one for no such reason, is a
        # violation.
        cut = unexplained = unfinished = unmatched = twice = overlapping = by_drain = 0
        again_outage = again_outage_drain = 0
        failed: Counter[str] = Counter()
        term = {d.pid: d.sigterm_ms for d in self.drain_log}
        for k in keys:
            rs = runs.get(k, [])
            if int(fx.get(f"ends:{k}", 0)) > 1:
                twice += 1
            rec = recs[k]
            completing = [r for r in rs if r.fence == rec.fence and r.how == "ok"]
            if rec.done and len(completing) != 1:
                unmatched += 1
                example("completion", self._describe(k, rs, rec))
            first = completing[0] if completing else None
            for r in rs:
                killed = self.killed_pids.get(r.pid)
                was_cut = killed is not None and r.start_ms <= killed
                if r is first:
                    pass
                elif was_cut:
                    cut += 1
                elif r.how == "CancelledError" and r.pid in term and term[r.pid] <= (r.end_ms or 0):
                    by_drain += 1
                    example("cancelled by the drain", self._describe(k, rs, rec))
                elif r.how not in ("", "ok"):
                    failed[r.how] += 1
                elif self._ended_in_outage(r):
                    again_outage += 1
                    if r.pid in term and term[r.pid] <= (r.end_ms or 0):
                        again_outage_drain += 1
                        kind = "run again: ended in a drain while Redis was away"
                    else:
                        kind = "run again: ended while Redis was away"
                    example(kind, self._describe(k, rs, rec))
                else:
                    unexplained += 1
                    example("run again", self._describe(k, rs, rec))
                if r.end_ms is None and not was_cut:
                    unfinished += 1
                    example("unfinished", self._describe(k, rs, rec))
            for i, a in enumerate(rs):
                for b in rs[i + 1 :]:
                    if b.start_ms < self.run_end(a, now):
                        overlapping += 1
                        example("overlap", self._describe(k, rs, rec))
        return _Judged(
            cut=cut,
            unexplained=unexplained,
            unfinished=unfinished,
            unmatched=unmatched,
            twice=twice,
            overlapping=overlapping,
            by_drain=by_drain,
            again_outage=again_outage,
            again_outage_drain=again_outage_drain,
            failed=dict(failed),
        )

    async def verify(self, quiet_s: float) -> DeployReport:
        c = self.cfg
        now = now_ms()
        keys = sorted({s.key for s in self.specs})
        recs = await self.all_records()
        runs, fx = await self.ledger_runs()
        examples: dict[str, list[str]] = {}

        def example(kind: str, text: str) -> None:
            xs = examples.setdefault(kind, [])
            if len(xs) < 5 and text not in xs:
                xs.append(text)

        lost = [
            k
            for k in keys
            if not recs[k].done or recs[k].status != "succeeded" or f"done:{k}" not in fx
        ]
        for k in lost[:5]:
            example("lost", f"{k}: record {asdict(recs[k])}, runs {len(runs.get(k, []))}")
        effects = int(fx.get("effects", 0))
        dup = sum(1 for f in fx if f.startswith("done:") and f[5:] not in recs)

        j = self.judge_runs(keys, recs, runs, fx, now, example)
        term = {d.pid: d.sigterm_ms for d in self.drain_log}
        # Runs a worker started after its own SIGTERM (entries it had read ahead).
        late = [
            r.start_ms - term[r.pid]
            for rs in runs.values()
            for r in rs
            if r.pid in term and r.start_ms > term[r.pid]
        ]
        # What each SIGTERM caught running, and how much of it was still to run.
        for d in self.drain_log:
            going = [
                r
                for rs in runs.values()
                for r in rs
                if r.pid == d.pid and r.start_ms <= d.sigterm_ms < self.run_end(r, now)
            ]
            d.runs_in_flight = len(going)
            d.longest_left_s = round(
                max((self.run_end(r, now) - d.sigterm_ms for r in going), default=0) / 1000, 3
            )
        deliveries, not_ok = await self.delivered([m for o in self.outcomes for m in o.msg_ids])
        errors: Counter[str] = Counter()
        untyped: Counter[str] = Counter()
        for o in self.outcomes:
            for e in o.errors:
                (untyped if e.startswith("untyped:") else errors)[e.removeprefix("untyped:")] += 1
        for s, o in zip(self.specs, self.outcomes, strict=True):
            if o.deadline_exceeded:
                example(
                    "deadline",
                    f"{s.key} ({s.kind}, {s.sleep_ms} ms): errors at {o.error_at} s, {self._describe(s.key, runs.get(s.key, []), recs[s.key])}",
                )
            if o.chunks_wrong:
                example(
                    "stream chunks",
                    f"{s.key} (msg {o.msg_ids[0]}): chunks {o.chunks_got}, not "
                    f"0..{s.chunks - 1}; {self._describe(s.key, runs.get(s.key, []), recs[s.key])}",
                )
        wrong = sum(o.wrong for o in self.outcomes)
        chunks_wrong = sum(o.chunks_wrong for o in self.outcomes)
        gave_up = sum(o.gave_up or not o.done for o in self.outcomes)
        deadline = sum(o.deadline_exceeded for o in self.outcomes)
        left = await self.leftovers()
        told = {m: e for o in self.outcomes for m, e in o.failed.items()}
        dead, dead_unaccounted = await self.dead_letters(told)
        evictions = await self.eviction_events()
        for rec_k, ks in zip(self.kill_log, self.kill_keys, strict=True):
            done_at = [recs[k].updated_ms for k in ks if k in recs and recs[k].done]
            if ks and len(done_at) == len(ks):
                rec_k.recovery_s = round(max(0, max(done_at) - rec_k.kill_ms) / 1000, 3)
                rec_k.slowest_key = max(ks, key=lambda k: recs[k].updated_ms)
            elif not ks:
                rec_k.recovery_s = 0.0
        rec_all = [k.recovery_s for k in self.kill_log if k.recovery_s is not None and k.inbox]
        drains = [d.drain_s for d in self.drain_log if d.drain_s is not None]
        codes = Counter(
            "running" if d.exit_code is None else str(d.exit_code) for d in self.drain_log
        )
        bad: list[str] = []
        if lost or not_ok:
            bad.append(f"{len(lost)} keys lost, delivered msg_ids not succeeded: {dict(not_ok)}")
        if effects != len(keys) or dup:
            bad.append(f"side effects: {effects} applied for {len(keys)} keys, {dup} unknown")
        if gave_up or deadline or wrong or chunks_wrong:
            bad.append(
                f"callers not answered: {gave_up} without a result, {deadline} DeadlineExceeded, "
                f"{wrong} wrong results, {chunks_wrong} streams with wrong chunks"
            )
        if untyped:
            bad.append(f"callers got untyped errors: {dict(untyped)}")
        if j.by_drain:
            bad.append(f"{j.by_drain} handler runs cancelled during their worker's drain")
        if j.again_outage:
            bad.append(
                f"{j.again_outage} handler runs ran to their end while Redis was away and their "
                f"message ran again ({j.again_outage_drain} of them on a draining worker: the "
                "message ran again on another agent after the worker left)"
            )
        if j.unexplained or j.unmatched:
            bad.append(
                f"{j.unexplained} handler runs besides the completing one for no reason (no "
                "SIGKILL, no failure, no Redis outage) "
                f"({j.twice} keys ran to their end twice; {j.unmatched} keys whose completing run "
                "is not one run of the ledger)"
            )
        if j.unfinished:
            bad.append(
                f"{j.unfinished} handler runs started and never ended, their worker not SIGKILLed"
            )
        if j.overlapping:
            bad.append(f"{j.overlapping} times one message ran twice at once")
        if codes.get("0", 0) != len(self.drain_log):
            bad.append(
                f"SIGTERMed workers' exits: {dict(codes)} (each must exit 0 within {c.drain_bound_s:.0f} s)"
            )
        if (
            left["pending"]
            or left["entries"]
            or left["parked"]
            or left["delayed"]
            or left["reroute"]
        ):
            bad.append(f"left at the end: {left}")
        if dead_unaccounted:
            bad.append(f"dead letters whose caller was not told: {dead_unaccounted[:5]}")
        if (
            self.replaced < c.workers * c.rounds
            or len(self.kill_log) < c.kills
            or self.redis_done < c.redis_restarts
        ):
            bad.append(
                f"the deploy did not happen as planned: {self.replaced} replacements, "
                f"{len(self.kill_log)} kills, {self.redis_done} Redis restarts"
            )
        for kind, xs in examples.items():
            bad.extend(f"  e.g. ({kind}) {x}" for x in xs)
        markers = self.log_markers()
        return DeployReport(
            ok=not bad,
            violations=bad,
            scenario=SCENARIO,
            config=asdict(c),
            messages=len(self.specs),
            requests=sum(s.kind == "request" for s in self.specs),
            sends=sum(s.kind == "send" for s in self.specs),
            streams=sum(s.kind == "stream" for s in self.specs),
            keys=len(keys),
            sent_twice=sum(s.dup for s in self.specs),
            deliveries=deliveries,
            replacements=self.replaced,
            sigterms_mid_handler=sum(d.mid_handler for d in self.drain_log),
            runs_in_flight_at_sigterm=sum(d.runs_in_flight for d in self.drain_log),
            runs_started_after_sigterm=len(late),
            latest_start_after_sigterm_s=max(late, default=0) / 1000,
            drain_p50_s=_pct(drains, 50),
            drain_max_s=max(drains) if drains else None,
            drain_exit_codes=dict(codes),
            kills=len(self.kill_log),
            kills_mid_handler=sum(k.mid_handler for k in self.kill_log),
            redis_restarts=self.redis_done,
            redis_outage_s=self.redis_outages,
            redis_restart_at_s=self.redis_at,
            lost=len(lost),
            effects=effects,
            duplicate_side_effects=dup,
            runs=sum(len(rs) for rs in runs.values()),
            keys_run_more_than_once=sum(1 for rs in runs.values() if len(rs) > 1),
            runs_cut_by_kill=j.cut,
            runs_failed=j.failed,
            runs_cancelled_by_drain=j.by_drain,
            runs_again_after_redis_outage=j.again_outage,
            runs_again_after_outage_in_drain=j.again_outage_drain,
            unexplained_runs=j.unexplained,
            keys_completed_twice=j.twice,
            unfinished_runs=j.unfinished,
            overlapping_runs=j.overlapping,
            evictions=len(evictions),
            fenced_late_completions=markers["fenced"],
            callers_answered=sum(o.done and not o.wrong for o in self.outcomes),
            answered_first_try=sum(o.first_try for o in self.outcomes),
            caller_errors=dict(errors),
            deadline_exceeded=deadline,
            untyped_errors=dict(untyped),
            wrong_results=wrong,
            streams_chunks_wrong=chunks_wrong,
            callers_gave_up=gave_up,
            not_succeeded=dict(not_ok),
            pending_left=left["pending"],
            inbox_entries_left=left["entries"],
            parked_left=left["parked"],
            delayed_left=left["delayed"],
            reroute_left=left["reroute"],
            dead_letters=dead,
            dead_letters_unaccounted=len(dead_unaccounted),
            recovery_p50_s=_pct(rec_all, 50),
            recovery_max_s=max(rec_all) if rec_all else None,
            load_avg_max_1m=round(self.load_max, 2),
            load_avg_end=[round(x, 2) for x in os.getloadavg()],
            load_s=round(self.load_s, 1),
            quiet_s=round(quiet_s, 2),
            wall_s=round(time.monotonic() - self.t_start, 1),
            data_dir=str(self.dir),
            drain_log=[asdict(d) for d in self.drain_log],
            kill_log=[asdict(k) for k in self.kill_log],
            examples=examples,
            log_markers=markers,
        )

    def _ended_in_outage(self, r: _Run1) -> bool:
        """``r``, not its key's completing run, ran to its end while Redis was away (from
        a second before its SIGKILL to two seconds after it was back: the worker's settle
        of that outcome failed), so the message ran again."""
        return (
            r.how == "ok"
            and r.end_ms is not None
            and any(down - 1000 <= r.end_ms <= up + 2000 for down, up in self.redis_windows)
        )

    def _describe(self, key: str, rs: list[_Run1], rec: _Rec) -> str:
        """A key's runs, for a violation's example: who ran it, when (seconds since the
        load started), under which fence, and what happened to its worker and to Redis
        around that time."""

        def at(ms: int) -> str:
            return f"{(ms - self.t0_ms) / 1000:.2f}"

        term = {d.pid: d.sigterm_ms for d in self.drain_log}
        parts = []
        for r in rs:
            end = "no end" if r.end_ms is None else at(r.end_ms)
            if r.how not in ("", "ok"):
                end += f" ({r.how})"
            what = [f"run {r.n} on {r.agent} pid {r.pid} fence {r.fence}: {at(r.start_ms)}-{end}"]
            if r.pid in term:
                what.append(f"its worker SIGTERMed at {at(term[r.pid])}")
            if r.pid in self.killed_pids:
                what.append(f"SIGKILLed at {at(self.killed_pids[r.pid])}")
            parts.append(", ".join(what))
        redis = [f"{at(down)}-{at(up)}" for down, up in self.redis_windows]
        return (
            f"{key} [{rec.status}, completed by fence {rec.fence} on {rec.agent_id}; "
            f"Redis down {', '.join(redis) or 'never'}]: " + "; ".join(parts)
        )

    # -- progress ----------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        return {
            "scenario": SCENARIO,
            "phase": self.phase,
            "elapsed_s": round(time.monotonic() - self.t_start, 1),
            "started": self.started,
            "answered": self.finished,
            "replaced": self.replaced,
            "replacements_planned": self.cfg.workers * self.cfg.rounds,
            "kills": len(self.kill_log),
            "redis_restarts": self.redis_done,
            "alive": len(self.alive()),
            "draining": sum(1 for d in self.drain_log if d.exit_code is None),
        }

    async def progress(self) -> None:
        while not self.done.is_set():
            self.load_max = max(self.load_max, os.getloadavg()[0])
            if self.on_progress:
                self.on_progress(self.snapshot())
            with anyio.move_on_after(0.5):
                await self.done.wait()

    # -- main -------------------------------------------------------------------------
    async def run(self) -> DeployReport:
        c = self.cfg
        ok = False
        if (self.dir / "redis").exists() and any((self.dir / "redis").iterdir()):
            raise ConfigError(f"{self.dir} holds an earlier run's Redis data: use an empty dir.")
        self.server = RedisServer(data_dir=self.dir / "redis", persistent=True)
        self.ledger_server = RedisServer()  # in memory, never restarted
        self.logs.mkdir(parents=True, exist_ok=True)
        rlog = logging.getLogger("reach")
        handler = logging.FileHandler(self.logs / "callers.log")
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
        saved = (rlog.propagate, rlog.level)
        rlog.addHandler(handler)
        rlog.propagate = False
        if rlog.level == logging.NOTSET or rlog.level > logging.WARNING:
            rlog.setLevel(logging.WARNING)
        try:
            self.server.start()
            self.ledger_server.start()
            self.url = self.server.url
            self.worker_env[LEDGER_ENV] = self.ledger_server.url
            self.r = await connect(self.url)
            self.ledger = await connect(self.ledger_server.url)
            self.keys = type(self.keys)(c.namespace, default_shards(self.r))
            async with anyio.create_task_group() as outer, AsyncExitStack() as stack:
                outer.start_soon(self.progress)
                try:
                    for slot in self.slots:
                        self.start_worker(slot)
                    await self.wait_ready(set(self.slots))
                    clients: list[Client] = []
                    for i in range(c.callers):
                        client = Client(
                            redis_url=self.url,
                            namespace=c.namespace,
                            client_id=f"deploy-{i}",
                            slow_start_s=0,
                        )
                        clients.append(await stack.enter_async_context(client))
                    self.phase = "deploying"
                    self.t0 = time.monotonic()
                    self.t0_ms = now_ms()
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(self.produce, clients, tg)
                        tg.start_soon(self.deploy, tg)
                    self.phase = "quiet"
                    quiet_s = await self.quiet()
                    self.phase = "checking"
                    report = await self.verify(quiet_s)
                finally:
                    self.done.set()
            ok = report.ok
            return report
        finally:
            self.phase = "stopping"
            rlog.removeHandler(handler)
            handler.close()
            rlog.propagate, _ = saved
            rlog.setLevel(saved[1])
            await self.shutdown()
            with anyio.CancelScope(shield=True):
                if self.r is not None:
                    await self.r.aclose()
                if self.ledger is not None:
                    await self.ledger.aclose()
            self.server.stop()
            self.ledger_server.stop()
            if ok and not c.keep and not c.dir:
                shutil.rmtree(self.dir, ignore_errors=True)


async def run_deploy(
    cfg: DeployConfig, on_progress: Callable[[dict[str, Any]], None] | None = None
) -> DeployReport:
    """Run the rolling-deploy scenario end to end and return what was measured and checked."""
    return await _DeployRun(cfg, on_progress).run()
