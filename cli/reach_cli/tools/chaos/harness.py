"""The chaos harness: kill workers and Redis mid-stream, then prove nothing was lost or
run twice.

``reach chaos`` and ``bench/chaos.py`` are thin wrappers of
:func:`reach_cli.tools.chaos.cli.main`; the CI suite (``tests/chaos/``) calls
:func:`run_chaos` with a short :class:`~reach_cli.tools.chaos.plan.ChaosConfig`.

What one run does
-----------------
* starts a Redis of its own (AOF, ``appendfsync everysec``) in a temp dir, and N
  ``reach worker`` processes of :func:`~reach_cli.tools.chaos.agent.chaos_agent` (agent
  ids ``w-0`` ... ``w-<N-1>``, read from ``REACH_CHAOS_AGENT_ID``) with sub-second leases
  (heartbeat 0.1 s, lease 0.3 s, evict after 0.6 s, sweep every 0.1 s);
* sends M messages from caller clients, at a steady rate: requests with deadlines and
  fire-and-forget sends, mixed priorities, some sessions (consistent hashing), and a few
  sent twice under one idempotency key (a caller's own retry). Every message carries a
  caller-chosen idempotency key; a caller that gets a typed :class:`~reach.ReachError`
  (Redis away, no agent, deadline) sends again under the same key, as users are told to;
* each handler sleeps a little (a few ms to ~100 ms) and makes one counted side effect per
  idempotency key, an idempotent Lua write (``HSETNX done:<key>`` + ``HINCRBY effects``),
  and logs the run (agent, pid, fence, start, end) so re-executions and overlapping runs
  can be found afterwards;
* meanwhile the chaos schedule: SIGKILLs of workers while they have messages in flight
  (restarted with the same agent_id after a short pause, or after they were evicted, or
  never: a replacement with a new id takes their place), SIGSTOP of a worker past its lease
  and then SIGCONT, SIGKILL of Redis and a restart from its AOF;
* then waits, bounded, until everything is quiet and checks the invariants (see
  :meth:`_Run.verify`): nothing lost, one side effect per key, every caller answered (or
  told with a typed error, and the retry under the same key answered), no pending entries,
  empty inboxes, nothing parked or delayed, no dead letters, no two live workers running
  one key at once. Recovery after a kill: for each killed worker, the time from the kill
  until every message that was in its inbox at that moment completed.
"""

from __future__ import annotations

import logging
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

import anyio
from redis import exceptions as rexc

from reach import Client, admin
from reach.connection import AnyRedis, as_text, connect
from reach.embedded import RedisServer, _die_with_parent_hook
from reach.envelope import BadEnvelope, decode_envelope, now_ms, scoped_key
from reach.errors import ConfigError, ReachError
from reach.keys import GROUP, Keys
from reach.registry import Registry, default_shards
from reach.tasks import get_status

from .agent import AGENT_ENV, CAPABILITY, EFFECTS
from .plan import ChaosConfig, ChaosEvent, MessageSpec, plan_events, plan_messages
from .report import ChaosReport, KillRecord


@dataclass
class _Rec:
    """What a key's idempotency record says once the run is quiet."""

    done: bool
    status: str
    updated_ms: int
    claims: int  # handler runs started (claim.lua counts them)
    agent_id: str  # who completed it
    fence: int = 0  # the fence of the last claim (once done: of the run that completed it)


@dataclass
class _Outcome:
    """What the callers of one planned message saw, over all their attempts."""

    msg_ids: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # msg_id -> error the caller got
    done: bool = False
    wrong: bool = False
    gave_up: bool = False


def _pct(xs: Sequence[float], p: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    k = max(0, min(len(s) - 1, math.ceil(p / 100 * len(s)) - 1))
    return round(s[k], 3)


# -- the run ------------------------------------------------------------------------------------
@dataclass
class _Worker:
    agent_id: str
    proc: subprocess.Popen[bytes]
    started_ms: int
    stopped: bool = False


class WorkerSettings(Protocol):
    """What starting workers needs from a run's configuration (every scenario has it)."""

    agent: str
    namespace: str
    concurrency: int
    heartbeat_s: float
    lease_s: float
    evict_after_s: float
    sweep_interval_s: float
    startup_timeout_s: float
    cwd: str | None


class Cluster:
    """A run's processes and what is read of them: its Redis, its `reach worker`
    processes (started, ready, their pending entries and inbox contents, killed at the
    end), and the read-outs every scenario checks (idempotency records, what is left in
    inboxes and parked/delayed sets, marks in the workers' logs)."""

    def __init__(
        self, settings: WorkerSettings, data_dir: str | None, capabilities: Sequence[str]
    ) -> None:
        self.settings = settings
        self.capabilities = list(capabilities)
        self.keys = Keys(settings.namespace)
        self.workers: dict[str, _Worker] = {}  # agent_id -> its current process
        self.procs: list[subprocess.Popen[bytes]] = []
        self.worker_env: dict[str, str] = {}  # added to every worker's environment
        self.redis_outages: list[float] = []
        self.redis_at: list[float] = []
        self.redis_windows: list[tuple[int, int]] = []  # (killed_ms, back_ms) per restart
        self.redis_done = 0
        self.t0 = 0.0
        self.t_start = time.monotonic()
        self.dir = Path(data_dir) if data_dir else Path(tempfile.mkdtemp(prefix="reach-chaos-"))
        self.logs = self.dir / "logs"
        self.server: RedisServer | None = None
        self.r: AnyRedis = cast(AnyRedis, None)  # connected in run(), before any use
        self.url = ""

    # -- workers ----------------------------------------------------------------------
    def start_worker(self, agent_id: str) -> _Worker:
        c = self.settings
        cmd = [
            sys.executable,
            "-m",
            "reach_cli.app",
            "worker",
            c.agent,
            "--redis-url",
            self.url,
            "--namespace",
            c.namespace,
            "--concurrency",
            str(c.concurrency),
            "--heartbeat-s",
            str(c.heartbeat_s),
            "--lease-s",
            str(c.lease_s),
            "--evict-after-s",
            str(c.evict_after_s),
            "--sweep-interval-s",
            str(c.sweep_interval_s),
            "--log-level",
            "warning",
        ]
        self.logs.mkdir(parents=True, exist_ok=True)
        with open(self.logs / f"{agent_id}.log", "ab") as err:
            proc = subprocess.Popen(
                cmd,
                cwd=c.cwd or os.getcwd(),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                env={**os.environ, **self.worker_env, AGENT_ENV: agent_id},
                preexec_fn=_die_with_parent_hook(),  # noqa: PLW1509 - prctl only
            )
        self.procs.append(proc)
        w = _Worker(agent_id, proc, now_ms())
        self.workers[agent_id] = w
        return w

    def alive(self) -> list[_Worker]:
        return [w for w in self.workers.values() if w.proc.poll() is None and not w.stopped]

    async def wait_ready(self, ids: set[str]) -> None:
        reg = Registry(self.r, self.settings.namespace)
        with anyio.fail_after(self.settings.startup_timeout_s):
            while True:
                ready = [
                    {a.agent_id for a in await reg.agents(cap, ready=True, state="active")}
                    for cap in self.capabilities
                ]
                if all(ids <= got for got in ready):
                    return
                for i in ids:
                    p = self.workers[i].proc
                    if p.poll() is not None:
                        raise RuntimeError(
                            f"worker {i} exited with {p.returncode} at start; see "
                            f"{self.logs / (i + '.log')}"
                        )
                await anyio.sleep(0.05)

    async def pending_of(self, agent_id: str) -> int:
        n = 0
        for k in self.keys.inboxes(agent_id):
            try:
                n += int((await self.r.xpending(k, GROUP))["pending"])
            except rexc.ResponseError:  # no stream or group yet
                pass
        return n

    async def inbox_keys(self, agent_id: str) -> list[str]:
        out: list[str] = []
        for k in self.keys.inboxes(agent_id):
            for _, fields in await self.r.xrange(k, "-", "+"):
                try:
                    env = decode_envelope(fields.get(b"e", b""))
                    out.append(env.idempotency_key or env.msg_id)  # the key it sent
                except BadEnvelope:
                    pass
        return out

    async def restart_redis(self) -> None:
        assert self.server is not None
        t = time.monotonic()
        down_ms = now_ms()
        self.redis_at.append(round(t - self.t0, 3))
        await anyio.to_thread.run_sync(self.server.restart)
        self.redis_outages.append(round(time.monotonic() - t, 3))
        self.redis_windows.append((down_ms, now_ms()))
        self.redis_done += 1

    async def shutdown(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.kill(p.pid, signal.SIGCONT)
                    p.kill()
                except ProcessLookupError:
                    pass
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    # -- read-outs ---------------------------------------------------------------------
    async def scan(self, match: str) -> list[str]:
        return sorted({as_text(k) async for k in self.r.scan_iter(match=match, count=1000)})

    async def leftovers(self) -> dict[str, int]:
        inboxes = await admin.inbox_stats(
            self.r, self.keys, await admin.inbox_agents(self.r, self.keys)
        )
        pending = sum(s.pending for s in inboxes)
        entries = sum(s.queued for s in inboxes)
        parked = 0
        for cap in await self.r.smembers(self.keys.parked_caps):
            parked += int(await self.r.xlen(self.keys.parked(as_text(cap))))
        for cap in self.capabilities:
            parked += int(await self.r.xlen(self.keys.parked(cap)))
        return {
            "pending": pending,
            "entries": entries,
            "parked": parked,
            "delayed": int(await self.r.zcard(self.keys.delayed)),
            "reroute": sum(
                [int(await self.r.scard(self.keys.reroute_of(k))) for k in range(self.keys.shards)]
            ),
        }

    async def records(self, keys: Sequence[str], capability: str = CAPABILITY) -> dict[str, _Rec]:
        """What each key's idempotency record says (done, status, completion time...)."""
        out: dict[str, _Rec] = {}
        keys = list(keys)
        for i in range(0, len(keys), 500):
            chunk = keys[i : i + 500]
            pipe = self.r.pipeline(transaction=False)
            for k in chunk:
                pipe.hmget(
                    self.keys.idem(scoped_key(capability, k)),
                    "done",
                    "status",
                    "updated_ms",
                    "runs",
                    "agent_id",
                    "fence",
                )
            for k, (d, st, up, runs, agent, fence) in zip(chunk, await pipe.execute(), strict=True):
                out[k] = _Rec(
                    d == b"1",
                    as_text(st or b""),
                    int(up or 0),
                    int(runs or 0),
                    as_text(agent or b""),
                    int(fence or 0),
                )
        return out

    async def eviction_events(self) -> list[tuple[str, int]]:
        """(agent_id, ts) of every eviction the registry recorded."""
        return [
            (as_text(f.get(b"agent_id", b"")), int(f.get(b"ts", 0)))
            for k in range(self.keys.shards)
            for _, f in await self.r.xrange(self.keys.events_of(k))
            if f.get(b"type") == b"evicted"
        ]

    async def delivered(self, msg_ids: Sequence[str]) -> tuple[int, Counter[str]]:
        """How many of ``msg_ids`` reached an inbox (their task pointer exists), and the
        task statuses other than succeeded among them (each must read succeeded)."""
        not_ok: Counter[str] = Counter()
        deliveries = 0
        for i in range(0, len(msg_ids), 500):
            chunk = msg_ids[i : i + 500]
            pipe = self.r.pipeline(transaction=False)
            for m in chunk:
                pipe.exists(self.keys.task(m))
            present = [m for m, e in zip(chunk, await pipe.execute(), strict=True) if e]
            deliveries += len(present)
            for m in present:
                status = (await get_status(self.r, self.keys, m)).status
                if status != "succeeded":
                    not_ok[status] += 1
        return deliveries, not_ok

    async def dead_letters(self, told: Mapping[str, str]) -> tuple[dict[str, int], list[str]]:
        """Dead letters by reason, and those whose caller was not told (``told``: msg_id ->
        the typed error its caller got): a dead letter is accounted for when the caller of
        that very message was told and then retried."""
        dead: dict[str, int] = {}
        unaccounted: list[str] = []
        for k in await self.scan(self.keys.dlq_pattern):
            for _, f in await self.r.xrange(k):
                reason = as_text(f.get(b"reason", b"?"))
                dead[reason] = dead.get(reason, 0) + 1
                if as_text(f.get(b"msg_id", b"")) not in told:
                    unaccounted.append(f"{reason}:{as_text(f.get(b'msg_id', b''))}")
        return dead, unaccounted

    def log_markers(self) -> dict[str, int]:
        marks = {
            "fenced": b"late completion of ",
            "inbox_moved": b"inbox of evicted agent ",
            "re_registered": b"registration lost",
            "read_failed": b"inbox read failed",
        }
        out = dict.fromkeys(marks, 0)
        for p in self.logs.glob("*.log"):
            data = p.read_bytes()
            for name, m in marks.items():
                out[name] += data.count(m)
        return out


class _Run(Cluster):
    cfg: ChaosConfig

    def __init__(self, cfg: ChaosConfig, on_progress: Callable[[dict[str, Any]], None] | None):
        super().__init__(cfg, cfg.dir, (CAPABILITY,))
        self.cfg = cfg
        self.on_progress = on_progress
        plan_rng = random.Random(cfg.seed)  # the plan: the same for the same seed
        self.rng = random.Random(cfg.seed + 1)  # choices made during the run
        self.specs = plan_messages(cfg, plan_rng)
        n_events = cfg.kills + cfg.stops + cfg.redis_restarts
        send_s = cfg.messages / cfg.max_rate
        if cfg.rate > 0:
            send_s = cfg.messages / cfg.rate
        elif n_events:
            send_s = max(send_s, n_events * cfg.event_gap_s)
        self.send_s = send_s
        self.events = plan_events(cfg, plan_rng, send_s)
        self.outcomes = [_Outcome() for _ in self.specs]
        self.next_id = cfg.workers
        self.kill_log: list[KillRecord] = []
        self.kill_keys: list[list[str]] = []
        self.stop_log: list[tuple[int, list[str], int]] = []  # (stop_ms, keys, pid)
        self.stop_windows: list[tuple[int, int, int]] = []  # (pid, stop_ms, cont_ms)
        self.evictions: list[tuple[str, int]] = []
        self.restarts = self.never = self.replacements = 0
        self.started = self.finished = 0
        self.stops_done = 0
        self.phase = "starting"
        self.done = anyio.Event()

    async def pick_victim(self, others_needed: int) -> tuple[_Worker | None, bool]:
        """A live worker with messages in flight, leaving ``others_needed`` live ones."""
        deadline = time.monotonic() + self.cfg.kill_wait_s
        while True:
            # Not one that is still starting: its pending entries are its predecessor's.
            cands = [w for w in self.alive() if now_ms() - w.started_ms > 1500]
            if len(cands) <= others_needed:
                if time.monotonic() > deadline:
                    return None, False
                await anyio.sleep(0.05)
                continue
            self.rng.shuffle(cands)
            for w in cands:
                if await self.pending_of(w.agent_id) > 0:
                    return w, True
            if time.monotonic() > deadline:
                return cands[0], False
            await anyio.sleep(0.01)

    # -- chaos events ----------------------------------------------------------------
    async def chaos(self, tg: anyio.abc.TaskGroup) -> None:
        for ev in self.events:
            await anyio.sleep(max(0.0, self.t0 + ev.at - time.monotonic()))
            for attempt in (1, 2):
                try:
                    if ev.kind == "kill":
                        await self.kill(tg, ev)
                    elif ev.kind == "stop":
                        await self.stop()
                    else:
                        await self.restart_redis()
                    break
                except (rexc.RedisError, OSError):  # Redis away at that moment: once more
                    if attempt == 2 or ev.kind == "redis":
                        raise
                    await anyio.sleep(0.5)

    async def kill(self, tg: anyio.abc.TaskGroup, ev: ChaosEvent) -> None:
        w, mid = await self.pick_victim(1)
        if w is None:
            return
        kill_ms = now_ms()
        at = time.monotonic() - self.t0
        w.proc.send_signal(signal.SIGKILL)
        w.proc.wait()
        keys = await self.inbox_keys(w.agent_id)
        self.kill_log.append(
            KillRecord(w.agent_id, round(at, 3), kill_ms, mid, len(keys), ev.fate, ev.delay)
        )
        self.kill_keys.append(keys)
        tg.start_soon(self._come_back, w.agent_id, ev.fate, ev.delay)

    async def _come_back(self, agent_id: str, fate: str, delay: float) -> None:
        await anyio.sleep(delay)
        if fate == "never":
            self.workers.pop(agent_id, None)
            self.never += 1
            self.replacements += 1
            new_id = f"w-{self.next_id}"
            self.next_id += 1
            self.start_worker(new_id)
        else:
            self.restarts += 1
            self.start_worker(agent_id)

    async def stop(self) -> None:
        w, _ = await self.pick_victim(1)
        if w is None:
            return
        c = self.cfg
        stop_s = c.stop_s or 2 * (c.lease_s + c.evict_after_s) + 0.3
        w.stopped = True
        stop_ms = now_ms()
        os.kill(w.proc.pid, signal.SIGSTOP)
        keys = await self.inbox_keys(w.agent_id)
        await anyio.sleep(stop_s)
        os.kill(w.proc.pid, signal.SIGCONT)
        self.stop_windows.append((w.proc.pid, stop_ms, now_ms()))
        self.stop_log.append((stop_ms, keys, w.proc.pid))
        w.stopped = False
        self.stops_done += 1

    # -- callers ------------------------------------------------------------------------
    async def produce(self, clients: list[Client], tg: anyio.abc.TaskGroup) -> None:
        limiter = anyio.Semaphore(self.cfg.inflight)
        rate = len(self.specs) / self.send_s if self.send_s else 0
        for s in self.specs:
            if rate:
                await anyio.sleep(max(0.0, self.t0 + s.i / rate - time.monotonic()))
            await limiter.acquire()
            tg.start_soon(self.one, clients[s.i % len(clients)], s, limiter)

    async def one(self, c: Client, s: MessageSpec, limiter: anyio.Semaphore) -> None:
        out = self.outcomes[s.i]
        self.started += 1
        give_up = time.monotonic() + self.cfg.caller_give_up_s
        try:
            while True:
                env = c.build(
                    CAPABILITY,
                    {"n": s.n, "s": s.sleep_ms},
                    idempotency_key=s.key,
                    priority=s.priority,
                    session_id=s.session or None,
                    policy="consistent_hash" if s.session else None,
                    timeout_s=s.deadline_s if s.kind == "request" else None,
                    reply=s.kind == "request",
                )
                out.msg_ids.append(env.msg_id)
                try:
                    if s.kind == "request":
                        res = await c.call(env)
                        if res != {"k": s.key, "n": s.n}:
                            out.wrong = True
                    else:
                        await c.deliver(env)
                    out.done = True
                    return
                except ReachError as e:
                    out.errors.append(type(e).__name__)
                    out.failed[env.msg_id] = type(e).__name__
                except Exception as e:  # noqa: BLE001 - untyped: a violation, still retried
                    out.errors.append(f"untyped:{type(e).__module__}.{type(e).__name__}")
                if time.monotonic() > give_up:
                    out.gave_up = True
                    return
                c.invalidate()
                await anyio.sleep(self.rng.uniform(0.05, 0.3))
        finally:
            self.finished += 1
            limiter.release()

    # -- quiet and checks ---------------------------------------------------------------
    async def quiet(self) -> float:
        """Wait until every key is done and the inboxes, parked and delayed sets are empty."""
        t = time.monotonic()
        keys = sorted({s.key for s in self.specs})
        with anyio.move_on_after(self.cfg.quiet_timeout_s):
            while True:
                try:
                    recs = await self.records(keys)
                    left = await self.leftovers()
                    if all(x.done for x in recs.values()) and not any(left.values()):
                        break
                except (rexc.RedisError, OSError):
                    pass
                await anyio.sleep(0.1)
        return time.monotonic() - t

    async def verify(self, quiet_s: float) -> ChaosReport:
        c = self.cfg
        keys = sorted({s.key for s in self.specs})
        recs = await self.records(keys)
        fx = {
            as_text(k): as_text(v)
            for k, v in (await self.r.hgetall(self.keys.effects(EFFECTS))).items()
        }
        effects = int(fx.get("effects", 0))
        lost = [
            k
            for k in keys
            if not recs[k].done or recs[k].status != "succeeded" or f"done:{k}" not in fx
        ]
        dup = sum(max(0, int(fx.get(f"applied:{k}", 0)) - 1) for k in keys)
        dup += sum(1 for f in fx if f.startswith("done:") and f[5:] not in recs)
        runs_by_key: dict[str, list[tuple[str, int, int, int, int]]] = {}
        for f, v in fx.items():
            if f.startswith("run:"):
                k = f[4:].rsplit(":", 1)[0]
                a, pid, fence, st, en = v.split("|")
                runs_by_key.setdefault(k, []).append((a, int(pid), int(fence), int(st), int(en)))
        re_exec = sum(1 for rs in runs_by_key.values() if len(rs) > 1)
        restarted = sum(1 for k in keys if recs[k].claims > 1)
        # Evictions seen by the registry: a run whose agent was evicted while it ran is a
        # zombie's (its completion is fenced), like the SIGSTOPped worker's.
        self.evictions = await self.eviction_events()
        overlapping = zombie = 0
        overlaps: list[str] = []
        for k, rs in runs_by_key.items():
            rs.sort(key=lambda x: x[3])
            for i, first in enumerate(rs):
                for later in rs[i + 1 :]:
                    if later[3] >= first[4]:
                        continue
                    if self._in_stop(first) or self._in_stop(later):
                        zombie += 1
                    else:
                        overlapping += 1
                        overlaps.append(f"{k}: {first} / {later}")
        deliveries, not_ok = await self.delivered([m for o in self.outcomes for m in o.msg_ids])
        errors: Counter[str] = Counter()
        untyped: Counter[str] = Counter()
        for o in self.outcomes:
            for e in o.errors:
                (untyped if e.startswith("untyped:") else errors)[e.removeprefix("untyped:")] += 1
        wrong = sum(o.wrong for o in self.outcomes)
        gave_up = sum(o.gave_up or not o.done for o in self.outcomes)
        left = await self.leftovers()
        # A dead letter is accounted for when the caller of that very message was told
        # (a typed error, e.g. DeadlineExceeded for an expired attempt) and then retried.
        told = {m: e for o in self.outcomes for m, e in o.failed.items()}
        dead, dead_unaccounted = await self.dead_letters(told)
        # Recovery after each kill: until the last message in its inbox at the kill completed.
        for rec, ks in zip(self.kill_log, self.kill_keys, strict=True):
            done_at = [recs[k].updated_ms for k in ks if k in recs and recs[k].done]
            if ks and len(done_at) == len(ks):
                rec.recovery_s = round(max(0, max(done_at) - rec.kill_ms) / 1000, 3)
                rec.slowest_key = max(ks, key=lambda k: recs[k].updated_ms)
            elif not ks:
                rec.recovery_s = 0.0
            after = [k for k in ks if k in recs and recs[k].updated_ms >= rec.kill_ms]
            rec.completed_by_same_id = sum(recs[k].agent_id == rec.agent_id for k in after)
            rec.completed_by_others = len(after) - rec.completed_by_same_id
        stop_rec: list[float] = []
        for stop_ms, ks, _pid in self.stop_log:
            done_at = [recs[k].updated_ms for k in ks if k in recs and recs[k].done]
            if ks and len(done_at) == len(ks):
                stop_rec.append(round(max(0, max(done_at) - stop_ms) / 1000, 3))
        rec_all = [k.recovery_s for k in self.kill_log if k.recovery_s is not None and k.inbox]
        by_fate: dict[str, dict[str, float]] = {}
        for fate in ("restart_quick", "restart_after_eviction", "never"):
            xs = [
                k.recovery_s
                for k in self.kill_log
                if k.fate == fate and k.recovery_s is not None and k.inbox
            ]
            if xs:
                by_fate[fate] = {"n": len(xs), "p50": _pct(xs, 50) or 0.0, "max": max(xs)}
        bad: list[str] = []
        if lost:
            bad.append(f"{len(lost)} keys lost (not succeeded or no side effect), e.g. {lost[:5]}")
        if dup or effects != len(keys):
            bad.append(f"side effects: {effects} applied for {len(keys)} keys, {dup} duplicates")
        if not_ok:
            bad.append(f"delivered msg_ids not succeeded: {dict(not_ok)}")
        if untyped:
            bad.append(f"callers got untyped errors: {dict(untyped)}")
        if wrong:
            bad.append(f"{wrong} requests got a wrong result")
        if gave_up:
            bad.append(f"{gave_up} callers gave up without a result")
        if left["pending"]:
            bad.append(f"{left['pending']} inbox entries still pending")
        if left["entries"] or left["parked"] or left["delayed"] or left["reroute"]:
            bad.append(f"memory not back to zero: {left}")
        if dead_unaccounted:
            bad.append(f"dead letters whose caller was not told: {dead_unaccounted[:5]}")
        if overlapping:
            bad.append(f"{overlapping} overlapping runs of one key by live workers: {overlaps[:3]}")
        if len(self.kill_log) < c.kills:
            bad.append(f"only {len(self.kill_log)} of {c.kills} kills happened")
        if self.redis_done < c.redis_restarts or self.stops_done < c.stops:
            bad.append("not every planned Redis restart / stop happened")
        if any(k.recovery_s is None for k in self.kill_log):
            bad.append("a killed worker's messages never completed")
        markers = self.log_markers()
        return ChaosReport(
            ok=not bad,
            violations=bad,
            config={k: val for k, val in asdict(c).items()},
            messages=len(self.specs),
            requests=sum(s.kind == "request" for s in self.specs),
            sends=sum(s.kind == "send" for s in self.specs),
            keys=len(keys),
            sent_twice=sum(s.dup for s in self.specs),
            deliveries=deliveries,
            kills=len(self.kill_log),
            kills_mid_handler=sum(k.mid_handler for k in self.kill_log),
            restarts=self.restarts,
            never_back=self.never,
            replacements=self.replacements,
            stops=self.stops_done,
            redis_restarts=self.redis_done,
            redis_outage_s=self.redis_outages,
            redis_restart_at_s=self.redis_at,
            lost=len(lost),
            duplicate_side_effects=dup,
            effects=effects,
            re_executions=re_exec,
            handler_restarts=restarted,
            runs=sum(len(rs) for rs in runs_by_key.values()),
            overlapping_runs=overlapping,
            zombie_runs=zombie,
            evictions=len(self.evictions),
            fenced_late_completions=markers["fenced"],
            caller_errors=dict(errors),
            untyped_errors=dict(untyped),
            wrong_results=wrong,
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
            recovery_p99_s=_pct(rec_all, 99),
            recovery_max_s=max(rec_all) if rec_all else None,
            recovery_target_s=3.0,
            recovery_bound_s=round(c.lease_s + c.evict_after_s + c.sweep_interval_s, 3),
            recovery_by_fate=by_fate,
            stop_recovery_s=stop_rec,
            send_phase_s=round(self.send_s, 1),
            quiet_s=round(quiet_s, 2),
            wall_s=round(time.monotonic() - self.t_start, 1),
            data_dir=str(self.dir),
            kill_log=[asdict(k) for k in self.kill_log],
            log_markers=markers,
        )

    def _in_stop(self, run: tuple[str, int, int, int, int]) -> bool:
        """The run's worker was paused, or evicted (presumed dead), while it ran."""
        agent, pid, _, st, en = run
        if any(p == pid and st <= cont and en >= stop for p, stop, cont in self.stop_windows):
            return True
        return any(a == agent and st <= ts <= en for a, ts in self.evictions)

    # -- progress ----------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        return {
            "phase": self.phase,
            "elapsed_s": round(time.monotonic() - self.t_start, 1),
            "messages": len(self.specs),
            "started": self.started,
            "answered": self.finished,
            "kills": len(self.kill_log),
            "kills_planned": self.cfg.kills,
            "stops": self.stops_done,
            "redis_restarts": self.redis_done,
            "alive": len(self.alive()),
        }

    async def progress(self) -> None:
        while not self.done.is_set():
            if self.on_progress:
                self.on_progress(self.snapshot())
            with anyio.move_on_after(0.5):
                await self.done.wait()

    # -- main -------------------------------------------------------------------------
    async def run(self) -> ChaosReport:
        c = self.cfg
        ok = False
        if (self.dir / "redis").exists() and any((self.dir / "redis").iterdir()):
            raise ConfigError(f"{self.dir} holds an earlier run's Redis data: use an empty dir.")
        self.server = RedisServer(data_dir=self.dir / "redis", persistent=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        # The callers' own warnings (Redis away, retries) go to a file, not the terminal.
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
            self.url = self.server.url
            self.r = await connect(self.url)
            # The registry's shards as every process derives them (one on standalone).
            self.keys = Keys(self.cfg.namespace, default_shards(self.r))
            async with anyio.create_task_group() as outer, AsyncExitStack() as stack:
                outer.start_soon(self.progress)
                try:
                    for i in range(c.workers):
                        self.start_worker(f"w-{i}")
                    await self.wait_ready({f"w-{i}" for i in range(c.workers)})
                    clients: list[Client] = []
                    for i in range(c.callers):
                        client = Client(
                            redis_url=self.url,
                            namespace=c.namespace,
                            client_id=f"chaos-{i}",
                            slow_start_s=0,
                        )
                        clients.append(await stack.enter_async_context(client))
                    self.phase = "sending"
                    self.t0 = time.monotonic()
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(self.produce, clients, tg)
                        tg.start_soon(self.chaos, tg)
                    self.phase = "quiet"
                    quiet_s = await self.quiet()
                    self.phase = "checking"
                    report = await self.verify(quiet_s)
                finally:
                    self.done.set()  # ends the progress task (no cancel: clients' scopes)
            ok = report.ok
            return report
        finally:
            self.phase = "stopping"
            rlog.removeHandler(handler)
            handler.close()
            rlog.propagate, _ = saved
            rlog.setLevel(saved[1])
            await self.shutdown()
            if self.r is not None:
                with anyio.CancelScope(shield=True):
                    await self.r.aclose()
            if self.server is not None:
                self.server.stop()
            if ok and not c.keep and not c.dir:
                shutil.rmtree(self.dir, ignore_errors=True)


async def run_chaos(
    cfg: ChaosConfig, on_progress: Callable[[dict[str, Any]], None] | None = None
) -> ChaosReport:
    """Run one chaos scenario end to end and return what was measured and checked."""
    return await _Run(cfg, on_progress).run()
