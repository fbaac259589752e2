"""A namespace at a glance: what ``reach top`` and ``reach web`` show, read from Redis.

Nothing is added to the message path for it:

* agents, states, weights, in-flight counts and lease ages: the registry hashes;
* queue depth per priority and pending entries: :func:`reach.admin.inbox_stats` (the
  entries of each inbox stream, and its consumer group's pending entries, the oldest of
  which says how long the longest-waiting delivered message has been in the inbox);
* message rates: deltas between two samples of counters that Redis keeps itself, per
  inbox stream: ``entries-added`` (``XINFO STREAM``, messages sent to the agent, kept
  exact although the runtime deletes entries once acked) and the consumer group's
  ``entries-read`` (``XINFO GROUPS``, messages the agent took). Redis maintains both on
  every XADD/XREADGROUP at no extra cost, so the runtime needs no counter of its own,
  and agents written in other languages are counted the same way. The price is two
  XINFO calls per inbox per sample (pipelined with the depth and pending reads), paid
  by the viewer only; counters of a stream that was deleted and re-created restart at 0
  (such a delta is not counted). Needs Redis >= 7 (older servers lack the two fields:
  rates are None);
* dead letters per capability: :func:`reach.admin.dead_letter_counts` (the length of each
  dead-letter stream, and its ``entries-added`` for the rate of new dead letters); the
  cancelled ones among them (:class:`CancelledCounts`: counted from the letters as they
  are filed, so a view that keeps one reads each letter once), shown apart from failures.

Queued and in-flight figures per capability are those of the inboxes of the agents that
serve it: an agent serving two capabilities has one inbox, counted under both (``shared``
names the other capabilities); the totals count each inbox once.

:func:`collect` takes a :class:`Sample`; :func:`frame_data` turns two samples into plain
data (rates need two): the ``reach top --json`` output, and what the web console renders.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from . import admin
from .authz import capability_security
from .connection import AnyRedis
from .envelope import now_ms
from .keys import PRIORITIES, Keys
from .outcomes import DeadReason
from .registry import AgentInfo, Registry
from .untrusted import safe_text

__all__ = [
    "ROUTING",
    "CancelledCounts",
    "Sample",
    "collect",
    "empty_sample",
    "frame_data",
    "rate",
    "routing_of",
]

ROUTING = ("routable", "starting", "draining", "-")
"""What routing does with an agent, in every view (agents, top, caps, web, docs):
``routable`` (active, ready, not draining: what reach_registry_agents_routable counts),
``starting`` (active, not ready yet), ``draining`` (finishing its work, then leaving),
``-`` (in probation or evicted: not routed to)."""


def routing_of(a: AgentInfo) -> str:
    """Whether an agent may be given new work: ``routable`` (active, ready, not
    draining), ``starting`` (active, not ready yet), ``draining``, or ``-`` (not active:
    probation or evicted)."""
    if a.state != "active":
        return "-"
    if a.draining:
        return "draining"
    return "routable" if a.ready else "starting"


def _age(now: int, then: int | None) -> int | None:
    return None if then is None else max(0, now - then)


@dataclass
class Sample:
    """One reading of a namespace."""

    mono: float  # time.monotonic() of the reading, for rates
    ts_ms: int
    agents: list[AgentInfo]
    capabilities: list[tuple[str, int]]
    depth: dict[str, dict[str, int]] = field(default_factory=dict)  # agent -> prio -> length
    pending: dict[str, int] = field(default_factory=dict)  # agent -> delivered, not acked
    oldest_pending_ms: dict[str, int] = field(default_factory=dict)  # agent -> epoch ms
    added: dict[str, int] = field(default_factory=dict)  # inbox key -> entries-added
    read: dict[str, int] = field(default_factory=dict)  # inbox key -> group entries-read
    dlq: dict[str, int] = field(default_factory=dict)  # capability -> dead letters now
    dlq_added: dict[str, int] = field(default_factory=dict)  # capability -> entries-added
    # capability -> cancelled letters among them (None: not counted, see CancelledCounts)
    dlq_cancelled: dict[str, int] | None = None


CANCELLED_FIRST_SCAN = 10_000
"""Letters a :class:`CancelledCounts` reads of a stream it has not seen (the newest)."""


class CancelledCounts:
    """How many letters of each dead-letter stream are cancelled messages (reason
    ``cancelled``), kept up to date by reading only the letters filed since the last
    update. A stream seen for the first time, or one that shrank (purged, replayed), is
    read anew: its newest :data:`CANCELLED_FIRST_SCAN` letters. Past a stream's trim
    (``dlq_maxlen``) the count can run ahead of the letters still kept."""

    def __init__(self, *, first_scan: int = CANCELLED_FIRST_SCAN) -> None:
        self.first_scan = first_scan
        self._state: dict[str, tuple[str, int, int | None, int]] = {}  # last id, len, added, n

    async def update(
        self, r: AnyRedis, keys: Keys, counts: list[admin.DeadLetterCount]
    ) -> dict[str, int]:
        out: dict[str, int] = {}
        for dl in counts:
            stream = keys.dlq(dl.capability)
            st = self._state.get(dl.capability)
            if st is not None and st[1] == dl.count and st[2] == dl.added:
                out[dl.capability] = st[3]  # nothing filed since
                continue
            if st is None or dl.count < st[1]:
                entries = await r.xrevrange(stream, "+", "-", count=self.first_scan)
                last = safe_text(entries[0][0]) if entries else "0-0"
                n = sum(1 for _, f in entries if _cancelled(f))
            else:
                last, n = st[0], st[3]
                while True:
                    new = await r.xrange(stream, f"({last}", "+", count=1000)
                    if not new:
                        break
                    n += sum(1 for _, f in new if _cancelled(f))
                    last = safe_text(new[-1][0])
                    if len(new) < 1000:
                        break
            self._state[dl.capability] = (last, dl.count, dl.added, min(n, dl.count))
            out[dl.capability] = min(n, dl.count)
        for gone in set(self._state) - {dl.capability for dl in counts}:
            del self._state[gone]
        return out


def _cancelled(fields: Any) -> bool:
    reason = fields.get(b"reason") or fields.get("reason") if isinstance(fields, dict) else None
    return safe_text(reason or b"") == DeadReason.CANCELLED


async def collect(
    r: AnyRedis,
    namespace: str,
    *,
    cancelled: CancelledCounts | None = None,
    control: AnyRedis | None = None,
) -> Sample:
    """Read everything one frame shows (a few pipelined round trips); with ``cancelled``,
    also how many dead letters are cancelled messages (the letters filed since its last
    update are read). ``control``: the registry's Redis when not ``r`` (reach.planes)."""
    keys = Keys(namespace)
    reg = Registry(control or r, namespace)
    mono = time.monotonic()
    agents = await reg.agents()
    caps = await reg.capabilities()
    s = Sample(mono=mono, ts_ms=now_ms(), agents=agents, capabilities=caps)
    ids = [a.agent_id for a in agents]
    for st in await admin.inbox_stats(r, keys, ids, counters=True):
        s.depth[st.agent_id] = st.depth
        s.pending[st.agent_id] = st.pending
        if st.oldest_pending_ms is not None:
            s.oldest_pending_ms[st.agent_id] = st.oldest_pending_ms
        s.added.update({keys.inbox(st.agent_id, p): n for p, n in st.added.items()})
        s.read.update({keys.inbox(st.agent_id, p): n for p, n in st.read.items()})
    counts = await admin.dead_letter_counts(r, keys)
    for dl in counts:
        s.dlq[dl.capability] = dl.count
        if dl.added is not None:
            s.dlq_added[dl.capability] = dl.added
    if cancelled is not None:
        s.dlq_cancelled = await cancelled.update(r, keys, counts)
    return s


def rate(
    cur: dict[str, int], prev: dict[str, int] | None, keys: list[str], dt: float
) -> float | None:
    """Per-second growth of the summed counters ``keys`` (None when it cannot be known)."""
    if prev is None or dt <= 0:
        return None
    total, known = 0, False
    for k in keys:
        if k in cur and k in prev:
            known = True
            total += max(0, cur[k] - prev[k])  # a re-created stream restarts at 0
    return total / dt if known else None


def frame_data(cur: Sample, prev: Sample | None, namespace: str) -> dict[str, Any]:
    """What a frame shows, as plain data (also the ``--json`` output)."""
    keys = Keys(namespace)
    dt = cur.mono - prev.mono if prev is not None else 0.0
    pa, pr = (prev.added, prev.read) if prev is not None else (None, None)
    agents: list[dict[str, Any]] = []
    for a in cur.agents:
        ks = [keys.inbox(a.agent_id, p) for p in PRIORITIES]
        depth = cur.depth.get(a.agent_id, {p: 0 for p in PRIORITIES})
        agents.append(
            {
                "agent_id": a.agent_id,
                "state": a.state,
                "routing": routing_of(a),
                "weight": a.weight,
                "version": a.app_version,
                "inflight": a.inflight,
                "queue": dict(depth),
                "pending": cur.pending.get(a.agent_id, 0),
                "oldest_pending_age_ms": _age(cur.ts_ms, cur.oldest_pending_ms.get(a.agent_id)),
                "in_per_s": rate(cur.added, pa, ks, dt),
                "taken_per_s": rate(cur.read, pr, ks, dt),
                "lease_age_ms": max(0, cur.ts_ms - a.last_heartbeat_ms)
                if a.last_heartbeat_ms
                else None,
                "capabilities": a.capabilities,
            }
        )
    by_id = {x["agent_id"]: x for x in agents}
    live_caps = dict(cur.capabilities)
    caps: list[dict[str, Any]] = []
    for cap in sorted(set(live_caps) | set(cur.dlq)):
        mine = [
            by_id[a.agent_id] for a in cur.agents if cap in a.capabilities and a.state != "evicted"
        ]
        dl_rate = rate(cur.dlq_added, prev.dlq_added if prev else None, [cap], dt)
        shared = sorted({c for x in mine for c in x["capabilities"]} - {cap})
        n_cancelled = None if cur.dlq_cancelled is None else cur.dlq_cancelled.get(cap, 0)
        caps.append(
            {
                "capability": cap,
                "agents": live_caps.get(cap, 0),
                "routable": sum(1 for x in mine if x["routing"] == "routable"),
                # The inboxes of the agents serving it: shared with ``shared``.
                "queued": sum(sum(x["queue"].values()) for x in mine),
                "inflight": sum(x["inflight"] for x in mine),
                "shared": shared,
                "dead_letters": cur.dlq.get(cap, 0),
                "failed": None if n_cancelled is None else cur.dlq.get(cap, 0) - n_cancelled,
                "cancelled": n_cancelled,
                "dead_per_s": dl_rate,
                "security": capability_security(cur.agents, cap),  # reach.authz's level
            }
        )
    states: dict[str, int] = {}
    for x in agents:
        states[x["state"]] = states.get(x["state"], 0) + 1
    routing: dict[str, int] = {}
    for x in agents:
        routing[x["routing"]] = routing.get(x["routing"], 0) + 1
    all_inboxes = [keys.inbox(a.agent_id, p) for a in cur.agents for p in PRIORITIES]
    n_all = None if cur.dlq_cancelled is None else sum(cur.dlq_cancelled.values())
    return {
        "namespace": namespace,
        "ts_ms": cur.ts_ms,
        "interval_s": round(dt, 3) if prev is not None else None,
        "totals": {
            "agents": states,
            "routing": routing,
            "in_per_s": rate(cur.added, pa, all_inboxes, dt),
            "taken_per_s": rate(cur.read, pr, all_inboxes, dt),
            "queued": sum(sum(x["queue"].values()) for x in agents),
            "inflight": sum(x["inflight"] for x in agents),
            "dead_letters": sum(cur.dlq.values()),
            # Failed and cancelled apart (None when the sample did not count them).
            "failed": None if n_all is None else sum(cur.dlq.values()) - n_all,
            "cancelled": n_all,
        },
        "capabilities": caps,
        "agents": agents,
    }


def empty_sample() -> Sample:
    """A sample of a namespace with nothing in it (what a view shows before its first
    reading)."""
    return Sample(mono=time.monotonic(), ts_ms=now_ms(), agents=[], capabilities=[])
