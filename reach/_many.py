"""The batch forms of a :class:`~reach.Client`'s calls: :meth:`~reach.Client.send_many`
and :meth:`~reach.Client.request_many` (an envelope per payload built from one, each
message routed on its own and the inbox writes sent together, each message's result or
error reported in its place), and :meth:`~reach.Client.broadcast` (one copy per eligible
agent).

Held apart from :mod:`reach.client` so the one-message path reads on its own there;
these functions use the client's parts (delivery, reply reader, breakers) as its methods
do, and the Client's methods of the same names call them.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import anyio
import msgspec

from . import metrics
from .envelope import Envelope, encode_payload, new_id, new_ids
from .errors import ConfigError, DeadlineExceeded, NoAgentAvailable, RemoteError
from .outcomes import RequestOutcome

if TYPE_CHECKING:  # annotations only: reach.client imports this module
    from .client import Client, MessageOptions


async def send_many(
    client: Client,
    capability: str,
    payloads: Iterable[Any],
    where: Mapping[str, Any] | None,
    idempotency_keys: Sequence[str | None] | None,
    opts: MessageOptions,
) -> list[str | Exception]:
    """:meth:`Client.send_many` (documented there)."""
    built = build_many(client, capability, payloads, idempotency_keys, opts, reply=False)
    envs = [b for b in built if isinstance(b, Envelope)]
    delivered = iter(await client._delivery.deliver_many(envs, where, track=False))
    out: list[str | Exception] = []
    for b in built:
        if isinstance(b, Exception):
            out.append(b)
            continue
        agent = next(delivered)
        out.append(agent if isinstance(agent, Exception) else b.msg_id)
    return out


async def request_many(
    client: Client,
    capability: str,
    payloads: Iterable[Any],
    where: Mapping[str, Any] | None,
    idempotency_keys: Sequence[str | None] | None,
    opts: MessageOptions,
) -> list[Any]:
    """:meth:`Client.request_many` (documented there; the default timeout is applied)."""
    built = build_many(client, capability, payloads, idempotency_keys, opts, reply=True)
    envs = [b for b in built if isinstance(b, Envelope)]
    client._ensure_reader()
    events = {env.msg_id: anyio.Event() for env in envs}
    client._reader.events.update(events)
    t0 = time.perf_counter()
    delivered: list[str | Exception] = []
    over: set[str] = set()  # calls already forgotten (see _forget)
    results: dict[str, Any] = {}
    try:
        delivered = await client._delivery.deliver_many(envs, where, track=True)
        for env, agent in zip(envs, delivered, strict=True):
            over.add(env.msg_id)  # result_of forgets it, whatever happens
            results[env.msg_id] = await result_of(client, env, agent, events[env.msg_id], t0)
    finally:
        # Stopped midway (cancelled): the calls not waited for yet are over too.
        for k, env in enumerate(envs):
            if env.msg_id not in over:
                agent = delivered[k] if k < len(delivered) else ""
                client._forget(env, agent if isinstance(agent, str) else "", ok=True)
    return [b if isinstance(b, Exception) else results[b.msg_id] for b in built]


async def result_of(
    client: Client, env: Envelope, agent: str | Exception, ev: anyio.Event, t0: float
) -> Any:
    """One message of :func:`request_many`: its result, or its error as an instance
    (counted in the metrics as :meth:`Client.call` counts it); the call is forgotten after."""
    try:
        if isinstance(agent, str):
            try:
                res = await client._answer(env, agent, ev)
            except (DeadlineExceeded, RemoteError) as e:
                if not client._falls_back(e):
                    raise
                res = await client._run_fallback(env)
        elif isinstance(agent, NoAgentAvailable) and client._falls_back(agent):
            try:
                res = await client._run_fallback(env)
            finally:
                client._forget(env, "", ok=True)
        else:
            client._forget(env, "", ok=True)
            raise agent
    except Exception as e:  # noqa: BLE001 - each message's error is reported in its place
        metrics.client_reply(env.capability, metrics.client_outcome(e), time.perf_counter() - t0)
        return e
    metrics.client_reply(env.capability, RequestOutcome.SUCCEEDED, time.perf_counter() - t0)
    return res


def build_many(
    client: Client,
    capability: str,
    payloads: Iterable[Any],
    idempotency_keys: Sequence[str | None] | None,
    opts: MessageOptions,
    *,
    reply: bool,
) -> list[Envelope | Exception]:
    """An envelope per payload, or the error that stopped it (a payload too large...);
    options wrong for every message raise :class:`ConfigError`."""
    items = list(payloads)
    if opts.pop("idempotency_key", None) is not None:
        raise ConfigError(
            "send_many and request_many take idempotency_keys=[...] (one key or None per "
            "payload), not idempotency_key."
        )
    if idempotency_keys is not None and len(idempotency_keys) != len(items):
        raise ConfigError(
            f"idempotency_keys holds {len(idempotency_keys)} keys for {len(items)} "
            "payloads: give one key (or None) per payload."
        )
    # One envelope built (options wrong for every message raise here), the others copied
    # from it with their own msg_id, payload and key: what build() would make of each.
    base = client.build(capability, None, reply=reply, **opts)
    own_trace = bool(opts.get("trace_id"))
    replace = msgspec.structs.replace
    out: list[Envelope | Exception] = []
    ids = new_ids(len(items))
    limit = client.max_payload_bytes
    headers = base.headers
    for i, payload in enumerate(items):
        try:
            raw = encode_payload(payload)
            if len(raw) > limit:
                raw = client._encode_payload(payload)  # raises PayloadTooLarge, worded once
        except Exception as e:  # noqa: BLE001 - this payload's error, in its place
            out.append(e)
            continue
        msg_id = ids[i]
        env = replace(
            base,
            msg_id=msg_id,
            payload=raw,
            trace_id=base.trace_id if own_trace else msg_id,
            headers=headers.copy(),
        )
        if idempotency_keys and idempotency_keys[i]:
            env = replace(env, idempotency_key=idempotency_keys[i])
        out.append(env)
    return out


async def broadcast(
    client: Client,
    capability: str,
    payload: Any,
    where: Mapping[str, Any] | None,
    timeout_s: float | None,
    idempotency_key: str | None,
    kw: dict[str, Any],
) -> dict[str, Any]:
    """:meth:`Client.broadcast` (documented there): one copy per eligible agent."""
    agents = await client.eligible(capability, where=where)  # every eligible agent
    base = idempotency_key or new_id()
    out: dict[str, Any] = {}
    timeout_s = timeout_s or await client.timeout_for(capability)

    async def one(agent_id: str) -> None:
        env = client.build(
            capability,
            payload,
            target=agent_id,
            timeout_s=timeout_s,
            idempotency_key=f"{base}:{agent_id}",
            policy="broadcast",
            **kw,
        )
        try:
            out[agent_id] = await client.call(env, where=where)
        except Exception as e:  # noqa: BLE001 - each agent's result or error is reported
            out[agent_id] = e

    async with anyio.create_task_group() as tg:
        for a in agents:
            tg.start_soon(one, a.agent_id)
    return out
