"""The client's calls of many messages: ``send_many`` and ``request_many`` (one message
per payload), ``broadcast`` and ``gather`` (one copy per agent). A base class of
:class:`~reach.Client`, apart so the one-message path reads on its own there; the work is
done in :mod:`reach._many` and :mod:`reach.gather`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Unpack, cast

from . import _many
from ._defaults import CallDefaults
from .gather import Gathered
from .gather import gather as _gather
from .tenants import by_tenant

if TYPE_CHECKING:
    from .client import Client, MessageOptions


class ManyCalls(CallDefaults):
    """``send_many``, ``request_many``, ``broadcast`` and ``gather`` of a client."""

    @by_tenant
    async def send_many(
        self,
        capability: str,
        payloads: Iterable[Any],
        *,
        where: Mapping[str, Any] | None = None,
        idempotency_keys: Sequence[str | None] | None = None,
        **opts: Unpack[MessageOptions],
    ) -> list[str | Exception]:
        """Send one message per payload without waiting; the batch form of :meth:`send`.

        Each message is routed on its own (its policy picks an agent per message, as
        :meth:`send` would) and the inbox writes of the whole batch go to Redis together:
        the messages to one agent in ``send.lua`` calls of its batch form, on standalone
        Redis handed to the connection 128 at a time while the next are encoded (on a
        Cluster, one pipeline grouped per node). ``opts`` are the options of every message, as for :meth:`build`; a
        per-message ``idempotency_keys`` (one key or None per payload, as many as the
        payloads) replaces the single ``idempotency_key``, which is refused here.

        Returns one item per payload, in order: the message's msg_id when it was added to
        an inbox, else the error that stopped it, as an exception *instance* (not raised):
        :class:`PayloadTooLarge`, :class:`NoAgentAvailable`, :class:`Overloaded`,
        :class:`DeadlineExceeded`, :class:`~reach.errors.RedisUnavailable`, or a refusal of
        Redis. One message's error never stops the others. Raised, for the whole call:
        :class:`ConfigError` for options that are wrong for every message (and a length of
        ``idempotency_keys`` that does not match), :class:`NotStarted`. Without a deadline,
        ``default_send_timeout_s`` applies, as for :meth:`send`.
        """
        self._send_deadline(opts)
        me = cast("Client", self)
        return await _many.send_many(me, capability, payloads, where, idempotency_keys, opts)

    @by_tenant
    async def request_many(
        self,
        capability: str,
        payloads: Iterable[Any],
        *,
        where: Mapping[str, Any] | None = None,
        idempotency_keys: Sequence[str | None] | None = None,
        **opts: Unpack[MessageOptions],
    ) -> list[Any]:
        """Send one message per payload and wait for every result; the batch form of
        :meth:`request` (sent as :meth:`send_many` sends: routed per message, the inbox
        writes in one pipeline).

        ``opts`` as for :meth:`request` (with neither ``timeout_s`` nor ``deadline_ms``, the
        capability's advertised timeout, else ``default_timeout_s``, applies to each message); ``idempotency_keys`` as
        for :meth:`send_many`. Returns one item per payload, in order: the handler's result,
        or the error of that message as an exception *instance* (not raised): what
        :meth:`request` would raise (:class:`RemoteError`, :class:`DeadlineExceeded`,
        :class:`Rejected`, :class:`NoAgentAvailable`, ...) or :meth:`send_many` would report.
        With a ``fallback``, a message no agent can take gets the fallback's answer. Raised
        for the whole call: what :meth:`send_many` raises, and cancellation.
        """
        if opts.get("timeout_s") is None and opts.get("deadline_ms") is None:
            opts["timeout_s"] = await self.timeout_for(capability)
        me = cast("Client", self)
        return await _many.request_many(me, capability, payloads, where, idempotency_keys, opts)

    @by_tenant
    async def broadcast(
        self,
        capability: str,
        payload: Any,
        *,
        where: Mapping[str, Any] | None = None,
        timeout_s: float | None = None,
        idempotency_key: str | None = None,
        **kw: Any,
    ) -> dict[str, Any]:
        """Send one copy to every eligible agent; returns agent_id -> result or exception."""
        return await _many.broadcast(
            cast("Client", self), capability, payload, where, timeout_s, idempotency_key, kw
        )

    @by_tenant
    async def gather(
        self,
        capability: str,
        payload: Any,
        *,
        quorum: int | str = "majority",
        n: int | None = None,
        timeout_s: float | None = None,
        where: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        **kw: Any,
    ) -> Gathered:
        """Ask every eligible agent (or ``n``) and return once ``quorum`` answered (a
        number, ``"majority"``, ``"all"``): a :class:`reach.Gathered`; :mod:`reach.gather`."""
        return await _gather(
            cast("Client", self),
            capability,
            payload,
            quorum,
            n,
            timeout_s,
            where,
            idempotency_key,
            kw,
        )
