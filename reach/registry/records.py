"""What a registry record is: the limits every stored record keeps, capability names,
:class:`AgentInfo` and :class:`Event` as read from Redis (never failing on a record
written behind the scripts' back: :func:`parse_agent`, :func:`decode_id`), and the error
of a capability no live agent has.

Held apart from the operations (:mod:`reach.registry.operations`) because routing, the
client and the views need these shapes without the registry's scripts.
"""

from __future__ import annotations

import difflib
import json
import logging
import math
import re
import time
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Any

import msgspec

from ..connection import as_text
from ..errors import (
    ConfigError,
    InvalidCapability,
    NoAgentAvailable,
    ReachError,
)
from ..keys import clean_id
from ..outcomes import Unavailable

log = logging.getLogger("reach.registry")

CAPABILITY_RE = re.compile(r"^[a-z0-9_]+(\.[a-z0-9_]+)*$")
STATES = ("active", "probation", "evicted")
EVENTS_MAXLEN = 10_000

MAX_ID_BYTES = 256
MAX_VERSION = 2**53 - 1
MAX_WEIGHT = 1000.0
MAX_LEASE_MS = 86_400_000  # lease_ms and evict_after_ms
MAX_QUEUE = 1_000_000_000
MAX_CAPABILITY_BYTES = 200
MAX_CAPABILITIES = 1000
MAX_METADATA_BYTES = 65_536
MAX_CARD_BYTES = 262_144
MAX_LOCK_MS = 3_600_000
MAX_SHADOW_TTL_MS = 30 * 86_400_000
MAX_BATCH = 100_000
MAX_EVENTS_MAXLEN = 10_000_000
MAX_LOAD = 2**53 - 1  # queue_depth and inflight reported by heartbeats
_MAX_MS = 2**63 - 1


class BadRecord(ReachError, ValueError):
    """A registry record that cannot be read (a field written behind the scripts' back).

    Raised by :meth:`AgentInfo.from_hash`; readers of the registry skip such a record.
    """


def normalize_capability(name: str) -> str:
    """Strip and lower-case ``name`` and check it is a dotted capability name.

    >>> normalize_capability("  Text.Summarize ")
    'text.summarize'
    """
    known = _NORMALIZED.get(name) if type(name) is str else None
    if known is not None:
        return known
    if not isinstance(name, str):
        raise InvalidCapability(f"A capability name must be a string, not {type(name).__name__}.")
    norm = name.strip().lower()
    if not CAPABILITY_RE.match(norm) or len(norm) > MAX_CAPABILITY_BYTES:
        raise InvalidCapability(
            f"Invalid capability name {name!r}: use lower-case words of letters, digits and "
            f"'_' joined by dots, at most {MAX_CAPABILITY_BYTES} characters, e.g. "
            "'text.summarize' or 'code.review_python'."
        )
    if len(_NORMALIZED) >= _NORMALIZED_MAX:  # bounded: names may come from anywhere
        _NORMALIZED.clear()
    _NORMALIZED[name] = norm
    return norm


# Names checked already (every send checks its capability's): a dict lookup, not a regex.
_NORMALIZED: dict[str, str] = {}
_NORMALIZED_MAX = 4096


def normalize_capabilities(names: Iterable[str]) -> list[str]:
    """Normalise each name, drop duplicates, keep order; at least one is required."""
    if isinstance(names, str):
        names = [names]
    out: list[str] = []
    for n in names:
        c = normalize_capability(n)
        if c not in out:
            out.append(c)
    if not out:
        raise InvalidCapability(
            "An agent must declare at least one capability, e.g. capabilities=['text.summarize']."
        )
    if len(out) > MAX_CAPABILITIES:
        raise InvalidCapability(
            f"An agent may declare at most {MAX_CAPABILITIES} capabilities, not {len(out)}."
        )
    return out


def agent_key_id(agent_id: str) -> str:
    """The id under which an agent is stored: ``agent_id`` without ``{``/``}``.

    Scripts find agent hashes by appending the stored id to the hash prefix (``sweep.lua``),
    so the id passed in ARGV must be the one the key names were built from.
    """
    if not isinstance(agent_id, str) or not clean_id(agent_id).strip():
        raise ConfigError(f"Invalid agent_id {agent_id!r}: use a non-empty string.")
    cleaned = clean_id(agent_id)
    try:
        size = len(cleaned.encode())
    except UnicodeEncodeError:
        raise ConfigError(f"Invalid agent_id {agent_id[:40]!r}: not encodable as UTF-8.") from None
    if size > MAX_ID_BYTES:
        raise ConfigError(
            f"Invalid agent_id {agent_id[:40]!r}...: at most {MAX_ID_BYTES} bytes (UTF-8)."
        )
    return cleaned


class AgentInfo(msgspec.Struct, kw_only=True):
    """An agent's registration as stored in Redis."""

    agent_id: str
    instance_id: str = ""
    version: int = 0
    weight: float = 1.0
    capabilities: list[str] = []
    metadata: dict[str, Any] = {}
    card: dict[str, Any] | None = None
    state: str = "active"
    ready: bool = False
    draining: bool = False
    registered_ms: int = 0
    last_heartbeat_ms: int = 0
    state_ms: int = 0
    ready_ms: int = 0
    lease_ms: int = 0
    evict_after_ms: int = 0
    queue_depth: int = 0
    """Entries in its inboxes (running, read ahead, unread), at its last heartbeat."""
    inflight: int = 0
    """Handlers running or waiting for a slot, at its last heartbeat."""
    max_queue: int = 0
    slots: int = 0
    """Handlers it runs at once (its concurrency); 0: not reported (an older agent)."""
    handler_us: int = 0
    """Its handlers' recent mean run time (µs) at its last heartbeat; 0: not known yet."""
    cap_us: dict[str, int] = {}
    """Per capability, the recent mean run time (µs) of a message of cost 1, at its last
    heartbeat (empty: not reported, an older agent or nothing run yet)."""
    protocol: int = 0
    """The protocol version the agent's runtime states (docs/protocol.md, *Protocol
    version*); 0: none stated (a runtime from before protocol versions: version 1)."""
    app_version: str = ""
    """The application version the agent runs (``Agent(version=...)``, ``reach worker
    --version``): what a capability's split routes by (docs/routing.md, *Version
    canaries*); ``""``: none given, or a record from before the field."""

    @classmethod
    def from_hash(
        cls, h: Mapping[bytes | str, bytes | str], *, agent_id: str | None = None
    ) -> AgentInfo:
        """Read a record (``HGETALL`` of an agent hash), checking every field.

        ``agent_id``: the id the record was looked up by; a record naming another id is
        refused. Raises :class:`BadRecord` (saying which field) when any field is not what
        the scripts write; fields reach does not know are ignored.
        """
        d = _decode_known(h)
        aid = d.get("agent_id", "")
        if not aid:
            raise BadRecord("agent_id: missing")
        if agent_id is not None and aid != agent_id:
            raise BadRecord(f"agent_id: {_show(aid)} stored under the key of {_show(agent_id)}")
        caps = [c for c in d.get("caps", "").split(",") if c]
        for c in caps:
            if not CAPABILITY_RE.match(c):
                raise BadRecord(f"caps: {_show(c)} is not a capability name")
        weight = _number(d, "weight", 1.0)
        if not 0.0 <= weight <= MAX_WEIGHT:
            raise BadRecord(f"weight: {weight!r} is not within 0..{MAX_WEIGHT:g}")
        state = d.get("state", "active")
        if state not in STATES:
            raise BadRecord(f"state: {_show(state)} is not one of {', '.join(STATES)}")
        ints: dict[str, int] = {}
        for name, hi in _INT_FIELDS:
            v = d.get(name)
            if v is None:
                continue
            if not (v.isdigit() and v.isascii() and len(v) <= 19) or int(v) > hi:
                raise BadRecord(f"{name}: {_show(v)} is not an integer within 0..{hi}")
            ints[name] = int(v)
        return cls(
            agent_id=aid,
            instance_id=d.get("instance_id", ""),
            weight=weight,
            capabilities=caps,
            metadata=_json_object(d, "metadata") or {},
            card=_json_object(d, "card"),
            state=state,
            ready=_flag(d, "ready"),
            draining=_flag(d, "draining"),
            cap_us=_cap_us(d.get("cap_us", "")),
            app_version=_app_version(d.get("app_version", "")),
            **ints,
        )

    def mean_us(self, capability: str) -> int:
        """The mean run time (µs) of a typical message of ``capability`` here: its own
        figure, else the agent's overall one (0: not known)."""
        return self.cap_us.get(capability, self.handler_us)

    def matches(self, where: Mapping[str, Any] | None) -> bool:
        """True when every ``key=value`` of ``where`` equals this agent's metadata."""
        if not where:
            return True
        return all(k in self.metadata and str(self.metadata[k]) == str(v) for k, v in where.items())

    @property
    def routable(self) -> bool:
        """Active, ready and not draining: may be given new work."""
        return self.state == "active" and self.ready and not self.draining

    def idempotent(self, capability: str) -> bool:
        """Whether this agent declares ``capability`` idempotent (a message of it may run
        twice without harm): listed in its metadata under :data:`IDEMPOTENT_KEY`."""
        listed = self.metadata.get(IDEMPOTENT_KEY)
        return isinstance(listed, list) and capability in listed

    def audited(self, capability: str) -> bool:
        """Whether this agent records the calls of ``capability`` in the audit trail
        (listed in its metadata under :data:`AUDITED_KEY`)."""
        listed = self.metadata.get(AUDITED_KEY)
        return isinstance(listed, list) and capability in listed

    def timeout_s(self, capability: str) -> float | None:
        """The default timeout this agent advertises for ``capability``
        (``@app.handler(cap, timeout_s=...)``, stored in its metadata under
        :data:`TIMEOUTS_KEY`); None when it advertises none, or a value that is not a
        number of seconds within (0, :data:`MAX_ADVERTISED_TIMEOUT_S`] (a hostile or
        older record is read, never trusted)."""
        adv = self.metadata.get(TIMEOUTS_KEY)
        if not isinstance(adv, dict):
            return None
        value = adv.get(capability)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        return float(value) if 0 < value <= MAX_ADVERTISED_TIMEOUT_S else None


IDEMPOTENT_KEY = "idempotent"
"""The metadata key under which an agent lists the capabilities it declares idempotent
(``@app.handler(cap, idempotent=True)``): ``{"idempotent": ["text.embed"]}``. A caller may
hedge a request of such a capability (``hedge_after_s``: reach._hedge)."""

AUDITED_KEY = "audited"
"""The metadata key under which an agent lists the capabilities whose calls it records in
the audit trail (``@app.handler(cap, audited=True)``): ``{"audited": ["payments.refund"]}``
(reach.audit)."""

TIMEOUTS_KEY = "timeouts"
"""The metadata key under which an agent advertises its capabilities' default timeouts:
``{"timeouts": {"text.summarize": 15.0}}`` (as ``"policies"`` advertises policies)."""
MAX_ADVERTISED_TIMEOUT_S = 86_400.0
"""The longest default timeout an agent may advertise (a day: a task record's life)."""


def advertised_timeout(agents: Iterable[AgentInfo], capability: str) -> float | None:
    """The default timeout of ``capability`` as its agents advertise it: the longest any
    agent that is not evicted advertises (a caller cannot know which of them its message
    reaches, so its deadline fits the slowest); None when none advertises one."""
    best: float | None = None
    for a in agents:
        if a.state == "evicted" or capability not in a.capabilities:
            continue
        t = a.timeout_s(capability)
        if t is not None and (best is None or t > best):
            best = t
    return best


_INT_FIELDS: tuple[tuple[str, int], ...] = (
    ("version", MAX_VERSION),
    ("registered_ms", _MAX_MS),
    ("last_heartbeat_ms", _MAX_MS),
    ("state_ms", _MAX_MS),
    ("ready_ms", _MAX_MS),
    ("lease_ms", _MAX_MS),
    ("evict_after_ms", _MAX_MS),
    ("queue_depth", _MAX_MS),
    ("inflight", _MAX_MS),
    ("max_queue", _MAX_MS),
    ("slots", _MAX_MS),
    ("handler_us", _MAX_MS),
    ("protocol", _MAX_MS),
)
_TEXT_FIELDS = (
    "agent_id",
    "instance_id",
    "weight",
    "caps",
    "metadata",
    "card",
    "state",
    "ready",
    "draining",
    "cap_us",
    "app_version",
    *(name for name, _ in _INT_FIELDS),
)
# A record's field names as Redis returns them (bytes) or as text, to the name: the one
# lookup per field a reload of every agent pays.
_FIELD_NAMES: dict[bytes | str, str] = {
    **{n: n for n in _TEXT_FIELDS},
    **{n.encode(): n for n in _TEXT_FIELDS},
}


def _decode_known(h: Mapping[bytes | str, bytes | str]) -> dict[str, str]:
    """The fields reach writes, as text; others (any name, any bytes) are ignored."""
    out: dict[str, str] = {}
    for k, v in h.items():
        name = _FIELD_NAMES.get(k)
        if name is None:
            continue
        if isinstance(v, bytes):
            try:
                out[name] = v.decode()
            except UnicodeDecodeError:
                raise BadRecord(f"{name}: not UTF-8 ({_show(v)})") from None
        else:
            out[name] = str(v)
    return out


def _show(value: object, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _number(d: Mapping[str, str], name: str, default: float) -> float:
    v = d.get(name, "")
    if not v:
        return default
    try:
        x = float(v) if len(v) <= 64 else math.nan
    except ValueError:
        x = math.nan
    if not math.isfinite(x):
        raise BadRecord(f"{name}: {_show(v)} is not a finite number")
    return x


def _cap_us(v: str) -> dict[str, int]:
    """The record's ``cap_us`` (``"<capability>=<µs> ..."``, heartbeat.lua's ARGV[9])."""
    out: dict[str, int] = {}
    for item in v.split(" ") if v else ():
        cap, _, us = item.partition("=")
        if not (CAPABILITY_RE.match(cap) and us.isdigit() and us.isascii() and len(us) <= 16):
            raise BadRecord(f"cap_us: {_show(item)} is not '<capability>=<µs>'")
        out[cap] = int(us)
    return out


APP_VERSION_RE = re.compile(r"[A-Za-z0-9._+-]{0,64}")
"""An application version: up to 64 letters, digits, ``.``, ``_``, ``+`` or ``-`` (no
``=``, ``,`` or space: a split names versions as ``1.4=90``)."""


def check_app_version(value: object) -> str:
    """``value`` as an application version (``None``: ``""``); :class:`ConfigError`
    when it is not one (:data:`APP_VERSION_RE`)."""
    if value is None:
        return ""
    if not isinstance(value, str) or not APP_VERSION_RE.fullmatch(value):
        raise ConfigError(
            f"Invalid version {value!r}: use up to 64 letters, digits, '.', '_', '+' or '-', "
            "e.g. '1.5' or '2024-06-01'."
        )
    return value


def _app_version(v: str) -> str:
    if not APP_VERSION_RE.fullmatch(v):
        raise BadRecord(f"app_version: {_show(v)} is not a version (A-Z a-z 0-9 . _ + -)")
    return v


def _flag(d: Mapping[str, str], name: str) -> bool:
    v = d.get(name, "0")
    if v not in ("0", "1"):
        raise BadRecord(f"{name}: {_show(v)} is not '0' or '1'")
    return v == "1"


_JSON = json.JSONDecoder(strict=False)  # control characters in strings, as cjson takes them


def _json_object(d: Mapping[str, str], name: str) -> dict[str, Any] | None:
    v = d.get(name, "")
    if not v:
        return None
    try:
        obj = _JSON.decode(v)
    except (ValueError, RecursionError):
        obj = None
    if not isinstance(obj, dict):
        raise BadRecord(f"{name}: not a JSON object ({_show(v)})")
    return obj


class _Reporter:
    """Logs each distinct problem once (remembering the last ``keep``), and at most
    ``per_minute`` lines a minute, so a bad record read on every reload, or a stream
    flooded with bad events, costs a few lines rather than one per read."""

    def __init__(self, *, keep: int = 4096, per_minute: int = 20) -> None:
        self.keep, self.per_minute = keep, per_minute
        self._seen: OrderedDict[Hashable, None] = OrderedDict()
        self._window = 0.0
        self._lines = 0
        self._suppressed = 0

    def report(self, key: Hashable, msg: str, *args: object) -> None:
        if key in self._seen:
            self._seen.move_to_end(key)
            return
        self._seen[key] = None
        if len(self._seen) > self.keep:
            self._seen.popitem(last=False)
        now = time.monotonic()
        if now - self._window >= 60.0:
            if self._suppressed:
                log.warning(
                    "%d more unreadable registry records or events were not logged",
                    self._suppressed,
                )
            self._window, self._lines, self._suppressed = now, 0, 0
        if self._lines < self.per_minute:
            self._lines += 1
            log.warning(msg, *args)
        else:
            self._suppressed += 1


_reporter = _Reporter()


def parse_agent(
    h: Mapping[bytes | str, bytes | str], *, agent_id: str | None = None, namespace: str = ""
) -> AgentInfo | None:
    """:meth:`AgentInfo.from_hash`, or None (and one log line per distinct problem) when
    the record cannot be read: the agent is left out, never routed to, and nothing fails."""
    try:
        return AgentInfo.from_hash(h, agent_id=agent_id)
    except BadRecord as e:
        reason = str(e)
    except Exception as e:  # noqa: BLE001 - whatever the bytes are, the reader goes on
        reason = f"{type(e).__name__}: {e}"
    _reporter.report(
        (namespace, agent_id, reason),
        "registry %s: agent record %s cannot be read and is ignored (not routed to): %s. "
        "Something wrote it behind reach's scripts; it goes when the sweeper evicts it or "
        "a new registration of that id replaces it.",
        namespace,
        _show(agent_id),
        reason,
    )
    return None


def decode_id(raw: bytes | str, *, namespace: str = "", where: str = "registry") -> str | None:
    """An id read from Redis as text, or None (reported once) when it is not UTF-8: no
    agent reach registered has such an id, so nothing can be looked up by it."""
    if isinstance(raw, str):
        return raw
    try:
        return raw.decode()
    except UnicodeDecodeError:
        _reporter.report(
            (namespace, where, raw[:64]),
            "registry %s: %s holds an id that is not UTF-8 (%s): ignored",
            namespace,
            where,
            _show(raw),
        )
        return None


class SweepResult(msgspec.Struct):
    """What one sweep of every registry shard did. ``locked``: other runtimes hold the
    sweeper lock of every shard (nothing was swept); ``swept``: the shards this sweep
    held (or all, swept without the lock); ``chores``: it held shard 0's lock (or swept
    without the lock), whose holder does the namespace's chores (retries, evicted inboxes,
    parked messages) and counts the registry gauges."""

    locked: bool = False
    due: int = 0
    probation: int = 0
    evicted: list[str] = []
    deleted: int = 0
    swept: int = 0
    chores: bool = False
    held: list[int] = []


class Event(msgspec.Struct):
    """One registry event (``type`` is registered, ready, draining, unstable, ...).

    Events are read as they are: bytes that are not UTF-8 come out with replacement
    characters, a ``ts`` that is not a number as 0 (both logged once). ``id``: the stream
    entry id; with several registry shards, followed by ``@<shard>`` (entries of two shards
    can have the same id), which :meth:`Registry.events` takes back as a place to resume.
    """

    id: str
    type: str
    agent_id: str
    instance_id: str
    ts: int
    detail: str = ""  # replaced: host=, pid=, live= of the replaced instance, by= the new one


def unknown_capability(
    capability: str, *, live_agents: int, capabilities: Sequence[str]
) -> NoAgentAvailable:
    """The error of a message for ``capability`` when no live agent declares it:
    ``live_agents`` and ``capabilities`` are the namespace's (what the registry holds, not
    the agents of ``capability``), and up to three close capability names are offered."""
    close = difflib.get_close_matches(capability, sorted(set(capabilities)), n=3)
    hint = f" Did you mean {' or '.join(map(repr, close))}?" if close else ""
    n = len(set(capabilities))
    return NoAgentAvailable(
        f"No agent has capability {capability!r} ({live_agents} live agent(s) declare "
        f"{n} {'capability' if n == 1 else 'capabilities'}).{hint} See `reach caps`.",
        capability=capability,
        reason=Unavailable.NO_AGENT,
    )


def _entry_order(entry_id: Any) -> tuple[int, int]:
    """A stream entry id as a comparable pair (``0-0`` for anything else)."""
    ms, _, seq = as_text(entry_id).partition("-")
    try:
        return int(ms), int(seq or 0)
    except ValueError:
        return 0, 0


def _event(
    entry_id: bytes | str, fields: Mapping[bytes | str, bytes | str], *, namespace: str = ""
) -> Event:
    eid = as_text(entry_id)
    f: dict[str, str] = {}
    bad = ""
    for k, v in fields.items():
        key = k.decode(errors="replace") if isinstance(k, bytes) else str(k)
        if isinstance(v, bytes):
            try:
                f[key] = v.decode()
            except UnicodeDecodeError:
                f[key] = v.decode(errors="replace")
                bad = f"{key} is not UTF-8"
        else:
            f[key] = str(v)
    ts_text = f.get("ts", "0")
    ts = int(ts_text) if ts_text.isascii() and ts_text.isdigit() and len(ts_text) <= 19 else -1
    if ts < 0:
        bad = bad or f"ts {_show(ts_text)} is not a number"
        ts = 0
    if bad:
        _reporter.report(
            (namespace, "event", eid),
            "registry %s: event %s read with replacements: %s",
            namespace,
            eid,
            bad,
        )
    return Event(
        id=eid,
        type=f.get("type", ""),
        agent_id=f.get("agent_id", ""),
        instance_id=f.get("instance_id", ""),
        ts=ts,
        detail=f.get("detail", ""),
    )
