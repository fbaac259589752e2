"""The ``cached`` tier's copies: one per session, in the agent's process.

A copy is the session's values (and, once read, its history) as of one version of it (the
counter ``lua/session_write.lua`` raises with every write). It is served while it is
younger than the handler's ``cache_ttl_s`` and no write of the session was announced
since: every write, whatever its tier and its agent, is announced on the namespace's
channel (:attr:`reach.keys.Keys.session_changes`) as ``<version>:<session id>``, and one
subscription per process hears them; a copy of another version is dropped. A write of this
process is applied to its copy instead (when the version it made follows the copy's).

While the subscription is not confirmed (starting, or its connection lost) nothing is
served from copies and none is kept: the session is read from Redis each time, as the
``strong`` tier reads it. A lost subscription drops every copy (writes may have been missed
meanwhile).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import anyio
from redis import exceptions as rexc

from .. import metrics
from ..connection import AnyRedis, as_text, is_cluster
from ..keys import Keys
from ..scripts._call import Arg
from ..scripts.sessions import APPEND, CLEAR, DELETE, SET, read_history_call, read_values_call
from ..untrusted import strict_text

log = logging.getLogger("reach.session")

DEFAULT_MAX_SESSIONS = 10_000
"""How many sessions' copies one process keeps (the least recently used go first)."""

READ_S = 10.0
"""How long the subscription waits for a message before it pings its connection."""


@dataclass(slots=True)
class _Copy:
    version: int
    at: float  # time.monotonic() when it was known to be the session as Redis holds it
    values: dict[str, bytes] | None = None
    history: list[bytes] | None = None


def apply_ops(
    values: dict[str, bytes] | None, history: list[bytes] | None, ops: Sequence[Arg]
) -> None:
    """Apply session_write.lua's ``ops`` to a copy's ``values`` and ``history`` (in place;
    None: not held)."""
    p = 0
    while p < len(ops):
        o = ops[p]
        if o == SET:
            if values is not None:
                values[str(ops[p + 1])] = bytes(ops[p + 2])  # type: ignore[arg-type]
            p += 3
        elif o == DELETE:
            if values is not None:
                values.pop(str(ops[p + 1]), None)
            p += 2
        elif o == APPEND:
            if history is not None:
                history.append(bytes(ops[p + 1]))  # type: ignore[arg-type]
                m = int(ops[p + 2])
                if m > 0 and len(history) > m:
                    del history[: len(history) - m]
            p += 3
        else:
            assert o == CLEAR
            if values is not None:
                values.clear()
            if history is not None:
                history.clear()
            p += 1


class SessionCache:
    """The copies of one process and namespace, and the subscription that drops them."""

    def __init__(
        self,
        redis: AnyRedis,
        raw: AnyRedis,
        keys: Keys,
        *,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
    ) -> None:
        self.redis = redis  # reads (session_read.lua)
        self.raw = raw  # where the subscription's own connection comes from
        self.keys = keys
        self.max_sessions = max_sessions
        self.listening = False
        self._copies: OrderedDict[str, _Copy] = OrderedDict()
        self._epoch = 0  # subscriptions confirmed so far
        self._gen = 0  # announcements heard so far
        self._heard: OrderedDict[str, int] = OrderedDict()  # session -> _gen of its last one
        self._forgot = 0  # _gen when _heard last let an entry go
        self._writing: dict[str, int] = {}  # sessions this process is writing now
        self._held: dict[str, set[int]] = {}  # versions announced while it wrote them
        self.subscribed = anyio.Event()

    # -- reads --------------------------------------------------------------------------
    def _fresh(self, session_id: str, ttl_s: float) -> _Copy | None:
        c = self._copies.get(session_id)
        if c is None or not self.listening:
            return None
        if time.monotonic() - c.at > ttl_s:
            del self._copies[session_id]
            return None
        self._copies.move_to_end(session_id)
        return c

    async def values(self, session_id: str, ttl_s: float) -> dict[str, bytes]:
        """The session's values (encoded), from the copy when it may serve them."""
        c = self._fresh(session_id, ttl_s)
        if c is not None and c.values is not None:
            metrics.session_cache("hit")
            return c.values
        metrics.session_cache("miss")
        gen, epoch = self._gen, self._epoch
        version, raw = await read_values_call(self.keys, session_id).run(self.redis)
        values = {as_text(k): v for k, v in raw.items()}
        c = self._keep(session_id, version, gen, epoch)
        if c is not None:
            c.values = dict(values)
        return values

    async def history(self, session_id: str, ttl_s: float) -> list[bytes]:
        """The session's whole history (encoded items), from the copy when it may."""
        c = self._fresh(session_id, ttl_s)
        if c is not None and c.history is not None:
            metrics.session_cache("hit")
            return c.history
        metrics.session_cache("miss")
        gen, epoch = self._gen, self._epoch
        version, items = await read_history_call(self.keys, session_id).run(self.redis)
        c = self._keep(session_id, version, gen, epoch)
        if c is not None:
            c.history = list(items)
        return items

    def _keep(self, session_id: str, version: int, gen: int, epoch: int) -> _Copy | None:
        """The copy to fill with what was read at ``version`` (begun when ``gen``
        announcements had been heard, under subscription ``epoch``), or None when it must
        not be kept: not listening, or the session announced (or the memory of that let
        go) while it was read."""
        if not self.listening or epoch != self._epoch:
            return None
        if self._heard.get(session_id, 0) > gen or self._forgot > gen:
            return None
        c = self._copies.get(session_id)
        if c is None or c.version != version:
            c = self._copies[session_id] = _Copy(version, time.monotonic())
            while len(self._copies) > self.max_sessions:
                self._copies.popitem(last=False)
        self._copies.move_to_end(session_id)
        return c

    # -- writes of this process ---------------------------------------------------------
    def writing(self, session_id: str) -> None:
        """A write of ``session_id`` by this process is on its way (:meth:`wrote` follows)."""
        self._writing[session_id] = self._writing.get(session_id, 0) + 1

    def wrote(self, session_id: str, version: int | None, ops: Sequence[Arg]) -> None:
        """The write announced by :meth:`writing` made ``version`` with ``ops`` (None: it
        failed). The copy takes ``ops`` when it was the version just before and no other
        write was announced meanwhile; else it is dropped."""
        n = self._writing.get(session_id, 1) - 1
        held = self._held.get(session_id, set())
        if n:
            self._writing[session_id] = n
        else:
            self._writing.pop(session_id, None)
            self._held.pop(session_id, None)
        c = self._copies.get(session_id)
        if c is None:
            return
        if version is None or n or held - {version} or c.version != version - 1:
            del self._copies[session_id]
            return
        apply_ops(c.values, c.history, ops)
        c.version, c.at = version, time.monotonic()

    # -- announcements ------------------------------------------------------------------
    def heard(self, data: bytes) -> None:
        """An announcement ``<version>:<session id>``: the session's copy of another
        version goes."""
        head, sep, session_id = data.partition(b":")
        sid = strict_text(session_id)
        if not sep or not head.isdigit() or sid is None:  # not one of reach's: ignored
            return
        version = int(head)
        self._gen += 1
        self._heard[sid] = self._gen
        self._heard.move_to_end(sid)
        while len(self._heard) > 2 * self.max_sessions:
            self._heard.popitem(last=False)
            self._forgot = self._gen
        if sid in self._writing:  # perhaps its own: wrote() decides
            self._held.setdefault(sid, set()).add(version)
            return
        c = self._copies.get(sid)
        if c is not None and c.version != version:
            del self._copies[sid]

    def _forget_all(self) -> None:
        self.listening = False
        self._copies.clear()

    async def run(self) -> None:
        """Hear the namespace's session writes until cancelled: subscribe, and subscribe
        again after a lost connection (backing off up to 2 s)."""
        delay = 0.05
        while True:
            conn: Any = None
            try:
                conn = self._connection()
                await conn.connect()
                await conn.send_command("SUBSCRIBE", self.keys.session_changes)
                await self._confirmed(conn)
                self._copies.clear()
                self._epoch += 1
                self.listening = True
                self.subscribed.set()
                delay = 0.05
                await self._listen(conn)
            except (rexc.RedisError, OSError, TimeoutError) as e:
                if self.listening or delay == 0.05:
                    log.warning(
                        "session cache: the subscription to session writes is lost (%s); "
                        "cached sessions are read from Redis until it is back",
                        e,
                    )
            except Exception:  # the worker goes on: its sessions are read from Redis
                log.exception("session cache: the subscription to session writes failed")
            finally:
                self._forget_all()
                if conn is not None:
                    with anyio.CancelScope(shield=True):
                        try:
                            await conn.disconnect()
                        except Exception:  # noqa: BLE001, S110 - it may be broken already
                            pass
            await anyio.sleep(delay)
            delay = min(2.0, delay * 2)

    def _connection(self) -> Any:
        """A connection of its own (a subscribed connection serves nothing else); on a
        Cluster any node's: a PUBLISH reaches every node."""
        raw: Any = self.raw
        if is_cluster(raw):
            node = raw.get_random_node()
            return node.connection_class(**node.connection_kwargs)
        return raw.connection_pool.make_connection()

    async def _confirmed(self, conn: Any) -> None:
        while True:
            msg = await conn.read_response(disable_decoding=True, timeout=30.0, push_request=True)
            if msg is None:
                raise rexc.TimeoutError("SUBSCRIBE not confirmed in 30 s")
            if isinstance(msg, list) and msg and msg[0] == b"subscribe":
                return

    async def _listen(self, conn: Any) -> None:
        pinged = False
        while True:
            msg = await conn.read_response(disable_decoding=True, timeout=READ_S, push_request=True)
            if msg is None:
                if pinged:  # no answer to the ping either: the connection is gone
                    raise rexc.TimeoutError(f"no answer on the subscription in {2 * READ_S:g} s")
                await conn.send_command("PING")
                pinged = True
                continue
            pinged = False
            if isinstance(msg, list) and len(msg) >= 3 and msg[0] == b"message":
                self.heard(bytes(msg[2]))
