"""Per-tenant quotas: what one namespace lets its callers put in, whatever their code does.

An operator sets them (``reach quota set --max-inbox 1000 --send-rate 100/s``, or
:func:`set_quotas`); they are kept in the namespace's ``quotas`` hash
(:attr:`reach.keys.Keys.quotas`) and enforced at every new send of a
:class:`reach.Client`:

* ``max_inbox``: an agent's inbox (its three priority streams together) holds at most
  this many messages, queued and being handled. It is checked where the message is
  written, in the same script as the write (``lua/send.lua``, ``lua/enqueue.lua``: the
  XLEN of the three streams, which hold exactly the messages not settled yet, since a
  runtime deletes an entry once settled), so any number of concurrent senders never push
  an inbox past it. It tightens each agent's own ``max_queue`` (the lower of the two
  applies).
* ``send_rate``: each caller identity (:func:`identity_of`) sends at most this many
  messages per period, ``burst`` at once: a GCRA bucket per identity in Redis
  (``lua/rate_limit.lua``, the algorithm of the capabilities' rate limits), so it is exact
  over any number of processes sending as the same identity.

Over a quota, the send raises :class:`reach.Overloaded` naming the quota; nothing is
written. The quotas apply to *new* sends: a message accepted once and placed again by the
sweeper (a retry, an evicted agent's inbox moved, a parked message released) is never
refused by them, since refusing it would lose an accepted message. Clients re-read the
quotas every :data:`QUOTAS_REFRESH_S` (a change applies within it).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import Any

from . import audit
from .connection import AnyRedis, as_text
from .errors import ConfigError
from .keys import Keys
from .limits import RateLimit, Taken, parse_limit
from .scripts._call import Call, as_int
from .signing import IdentityKeys, Signer

QUOTAS_REFRESH_S = 1.0
"""How often a client re-reads its namespace's quotas (a change takes effect within it)."""

MAX_INBOX = 999_999_999_999_999
"""The largest ``max_inbox`` (the bound send.lua takes)."""

MAX_TAKE = 100_000
"""Sends one ``rate_limit.lua`` call takes at most."""

MAX_INBOX_FIELD = "max_inbox"
SEND_RATE_FIELD = "send_rate"


@dataclass(frozen=True, slots=True)
class Quotas:
    """A namespace's quotas: ``max_inbox`` messages per agent's inbox (0: none) and a
    ``send_rate`` per caller identity (None: none)."""

    max_inbox: int = 0
    send_rate: RateLimit | None = None

    @property
    def any(self) -> bool:
        return bool(self.max_inbox or self.send_rate)

    def as_dict(self) -> dict[str, Any]:
        """The JSON form (``reach quota show --json``)."""
        rate = self.send_rate
        return {
            "max_inbox": self.max_inbox or None,
            "send_rate": None if rate is None else str(rate).split(" ")[0],
            "send_rate_per_s": None if rate is None else rate.per_second,
            "burst": None if rate is None else rate.burst,
        }


NO_QUOTAS = Quotas()


def check_max_inbox(n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_INBOX:
        raise ConfigError(f"Invalid max_inbox {n!r}: want an integer 1..{MAX_INBOX}.")
    return n


async def set_quotas(
    redis: AnyRedis,
    keys: Keys,
    *,
    max_inbox: int | None = None,
    send_rate: RateLimit | None = None,
) -> None:
    """Set the quotas given (the others are kept); clients apply them within
    :data:`QUOTAS_REFRESH_S`."""
    fields: dict[str, str] = {}
    if max_inbox is not None:
        fields[MAX_INBOX_FIELD] = str(check_max_inbox(max_inbox))
    if send_rate is not None:
        fields[SEND_RATE_FIELD] = send_rate.stored()
    if fields:
        async with audit.operator_action(
            redis, keys, "quota.set", target=keys.namespace, detail=fields
        ):
            await redis.hset(keys.quotas, mapping=fields)


async def clear_quotas(
    redis: AnyRedis, keys: Keys, *, max_inbox: bool = True, send_rate: bool = True
) -> None:
    """Remove the quotas named (both by default)."""
    fields = [f for f, on in ((MAX_INBOX_FIELD, max_inbox), (SEND_RATE_FIELD, send_rate)) if on]
    if fields:
        async with audit.operator_action(
            redis, keys, "quota.clear", target=keys.namespace, detail={"quotas": fields}
        ):
            await redis.hdel(keys.quotas, *fields)


def parse_quotas(raw: Any) -> Quotas:
    """The quotas in an HGETALL reply of the quotas hash. A field that does not parse
    (written behind reach's back) counts as no quota: garbage must not stop a sender."""
    if not isinstance(raw, dict):
        return NO_QUOTAS
    fields: dict[str, str] = {}
    for k, v in raw.items():
        with contextlib.suppress(UnicodeDecodeError, TypeError, ValueError):
            fields[as_text(k)] = as_text(v)
    max_inbox = 0
    text = fields.get(MAX_INBOX_FIELD, "").strip()
    # isascii: str.isdigit() also takes digits int() refuses ('²')
    if text.isascii() and text.isdigit() and 1 <= int(text) <= MAX_INBOX:
        max_inbox = int(text)
    rate: RateLimit | None = None
    if SEND_RATE_FIELD in fields:
        with contextlib.suppress(ConfigError, ValueError):
            rate = parse_limit(fields[SEND_RATE_FIELD])
    return Quotas(max_inbox, rate)


async def get_quotas(redis: AnyRedis, keys: Keys) -> Quotas:
    """The namespace's quotas (:func:`parse_quotas` of its hash)."""
    return parse_quotas(await redis.hgetall(keys.quotas))


def identity_of(signer: Signer | None, client_id: str) -> str:
    """Whom a send-rate quota counts a client's sends against: its Ed25519 identity (the
    name its messages are signed as, which agents verify) when it signs with one, else its
    ``client_id`` (which a caller chooses freely: without per-identity keys the quota guards
    against runaway callers, not against a caller that lies about who it is)."""
    if isinstance(signer, IdentityKeys):
        return signer.kid
    return client_id


def take_call(keys: Keys, identity: str, rate: RateLimit, n: int) -> Call[Taken]:
    """One ``rate_limit.lua`` call: take up to ``n`` sends from ``identity``'s bucket."""
    return Call(
        "rate_limit",
        (keys.send_rate_state(identity),),
        (max(1, min(n, MAX_TAKE)), rate.interval_us, rate.burst),
        _taken,
    )


def _taken(reply: Any) -> Taken:
    return Taken(as_int(reply[0]), as_int(reply[1]))


class SendBucket:
    """Takes single sends from one identity's bucket through ``commands`` (an
    auto-pipelined client), coalescing those of one event-loop turn as
    :class:`reach._sending.coalesce.Coalescer` coalesces inbox writes: the first take of a turn
    goes out at once, the others of the same turn (concurrent sends) as one
    ``rate_limit.lua`` call for all of them at the end of the turn, granted in the order
    they asked. One script call per turn instead of one per send; the bucket stays exact
    (every grant is GCRA's, in Redis)."""

    def __init__(self, commands: AnyRedis, keys: Keys, identity: str) -> None:
        self.commands = commands
        self.keys = keys
        self.identity = identity
        self._turn = False
        self._group: list[tuple[RateLimit, asyncio.Future[Taken]]] = []
        self._tasks: set[asyncio.Task[None]] = set()

    async def take(self, rate: RateLimit) -> Taken:
        """One send from the bucket: ``granted`` 1 or 0, and the µs until the next fits."""
        loop = asyncio.get_running_loop()
        if not self._turn:
            self._turn = True
            loop.call_soon(self._end_turn)
            return await take_call(self.keys, self.identity, rate, 1).run(self.commands)
        fut: asyncio.Future[Taken] = loop.create_future()
        self._group.append((rate, fut))
        return await fut

    def _end_turn(self) -> None:
        self._turn = False
        group, self._group = self._group, []
        group = [(r, f) for r, f in group if not f.done()]  # a cancelled caller takes none
        if group:
            task = asyncio.get_running_loop().create_task(self._take_group(group))
            self._tasks.add(task)  # held until done (the loop keeps weak references)
            task.add_done_callback(self._tasks.discard)

    async def _take_group(self, group: list[tuple[RateLimit, asyncio.Future[Taken]]]) -> None:
        # The turn's sends ask together, under the rate the first of them read (they all
        # read the same copy of the quotas, but for a refresh landing mid-turn).
        try:
            taken = await take_call(self.keys, self.identity, group[0][0], len(group)).run(
                self.commands
            )
        except BaseException as e:
            for _, fut in group:
                if not fut.done():
                    if isinstance(e, Exception):
                        fut.set_exception(e)
                    else:
                        fut.cancel()
            if isinstance(e, Exception):
                return
            raise
        for k, (_, fut) in enumerate(group):
            if not fut.done():
                fut.set_result(Taken(int(k < taken.granted), taken.wait_us))


class QuotaCache:
    """A client's copy of its namespace's quotas, read again when older than
    ``refresh_s``. Only the first read is waited for: after that a stale copy is used while
    one background read (shared by every caller) refreshes it, so a send waits for no
    extra round trip. A read that fails keeps the last copy (the send itself meets the same
    Redis and reports its trouble)."""

    def __init__(self, keys: Keys, *, refresh_s: float = QUOTAS_REFRESH_S) -> None:
        self.keys = keys
        self.refresh_s = refresh_s
        self._value: Quotas | None = None
        self._read_at = 0.0
        self._reading: asyncio.Task[Quotas] | None = None

    def invalidate(self) -> None:
        """Make the next send read the quotas again (and wait for them)."""
        self._value = None

    def fresh(self) -> Quotas | None:
        """The quotas when the copy is fresh (nothing to read first), else None."""
        if self._value is not None and time.monotonic() - self._read_at < self.refresh_s:
            return self._value
        return None

    async def get(self, redis: AnyRedis) -> Quotas:
        stale = time.monotonic() - self._read_at >= self.refresh_s
        if self._value is not None and not stale:
            return self._value
        task = self._reading
        if task is None or task.done():
            task = self._reading = asyncio.ensure_future(self._read(redis))
        if self._value is not None:
            return self._value  # stale: refreshed in the background
        return await asyncio.shield(task)

    async def _read(self, redis: AnyRedis) -> Quotas:
        try:
            value = await get_quotas(redis, self.keys)
        except Exception:
            # A background refresh (a copy is there) reports to nobody: the copy stays.
            if self._value is not None:
                return self._value
            raise
        self._value, self._read_at = value, time.monotonic()
        return value
