"""Durable steps: ``await ctx.step(name, fn, *args, **kwargs)`` inside a handler.

A step's result is journaled in the message's idempotency record (``lua/step.lua``), only
while the run that called ``fn`` still holds the message's claim. Any later run of the same
idempotency key - the message taken over after its worker died, a retry, a redelivery -
reads the journal at its first step and returns the journaled result instead of calling
``fn`` again, so an outside effect (a payment, a paid model call) happens once per key.

The bounds (:data:`RESULT_MAX_BYTES`, :data:`MAX_STEPS`, :data:`NAME_MAX_BYTES`) are those
``step.lua`` enforces; what they mean for a handler is in docs/concepts.md, *Durable
steps*.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import anyio

from .connection import AnyRedis
from .envelope import decode_payload, encode_payload
from .errors import ConfigError, StaleRun, StepRefused, StepTooLarge, TooManySteps
from .scripts.codes import StepCode
from .scripts.steps import (
    FIELD_PREFIX,
    MAX_STEPS,
    NAME_MAX_BYTES,
    RESULT_MAX_BYTES,
    step_call,
)

__all__ = ["MAX_STEPS", "NAME_MAX_BYTES", "RESULT_MAX_BYTES", "StepJournal", "check_name"]

_PREFIX = FIELD_PREFIX.encode()


def check_name(name: object) -> str:
    """``name`` if it is a valid step name (a non-empty ``str`` of at most
    :data:`NAME_MAX_BYTES` bytes of UTF-8), else :class:`~reach.ConfigError`."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"A step name must be a non-empty string, got {name!r}.")
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError as e:  # a lone surrogate: Redis would never get it
        raise ConfigError(f"The step name {name!r} is not valid UTF-8 text ({e}).") from e
    if size > NAME_MAX_BYTES:
        raise ConfigError(
            f"The step name {name[:40]!r}... is over {NAME_MAX_BYTES} bytes of UTF-8: "
            "use a short fixed name per step (it is a label, not data)."
        )
    return name


async def _call(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``fn(*args, **kwargs)``: awaited when ``fn`` is a coroutine function, else run in a
    worker thread (a blocking call must not stall the other handlers), its result awaited
    when it is awaitable."""
    if inspect.iscoroutinefunction(fn):
        return await fn(*args, **kwargs)
    result = await anyio.to_thread.run_sync(
        functools.partial(fn, *args, **kwargs), abandon_on_cancel=True
    )
    if inspect.isawaitable(result):
        result = await result
    return result


class StepJournal:
    """The step journal of one run of a message: its idempotency ``record``, held by the
    claim of ``owner`` with ``fence``.

    The journal is read once, at the run's first step (one ``HGETALL``); afterwards only
    this run can add to it while its claim holds, so the copy kept here stays true. Steps
    of one name run one at a time within the run: a second call of a name waits for the
    first and returns its result.
    """

    def __init__(self, redis: AnyRedis, *, record: str, owner: str, fence: int) -> None:
        self._redis = redis
        self._record = record
        self._owner = owner
        self._fence = fence
        self._results: dict[str, bytes] | None = None  # name -> encoded result, once read
        self._reading = anyio.Lock()
        self._names: dict[str, anyio.Lock] = {}

    async def journaled(self) -> dict[str, bytes]:
        """The results journaled for the message so far, by step name (encoded)."""
        if self._results is None:
            async with self._reading:
                if self._results is None:
                    self._results = await self._read()
        return self._results

    async def _read(self) -> dict[str, bytes]:
        raw = await self._redis.hgetall(self._record)
        found: dict[str, bytes] = {}
        for field, value in raw.items():
            f = field if isinstance(field, bytes) else str(field).encode()
            if f.startswith(_PREFIX):
                v = value if isinstance(value, bytes) else str(value).encode()
                found[f[len(_PREFIX) :].decode("utf-8", "replace")] = v
        return found

    async def run(
        self, name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """The result of step ``name``: the journaled one, or ``fn(*args, **kwargs)``'s,
        journaled before it is returned. Both come back decoded from the journal's bytes,
        so a first run and a re-run see the same value (a tuple as a list, a Struct as a
        dict). What it raises: docs/concepts.md, *Durable steps*."""
        check_name(name)
        lock = self._names.setdefault(name, anyio.Lock())
        async with lock:
            results = await self.journaled()
            data = results.get(name)
            if data is None:
                if len(results) >= MAX_STEPS:
                    raise _too_many(name)
                data = await self._journal(name, await _call(fn, args, kwargs))
                results[name] = data
        return decode_payload(data)

    async def _journal(self, name: str, result: Any) -> bytes:
        """Encode ``result`` and store it as step ``name``: the bytes journaled (those of an
        earlier call of the name, if one won the race)."""
        try:
            data = bytes(encode_payload(result))
        except ConfigError as e:
            raise StepRefused(f"The result of step {name!r} cannot be journaled: {e}") from e
        if len(data) > RESULT_MAX_BYTES:
            raise StepTooLarge(
                f"The result of step {name!r} is {len(data)} bytes encoded, over the "
                f"{RESULT_MAX_BYTES} a step may journal: return a reference to the data "
                "(a key, a URL, the id the outside service gave) instead of the data."
            )
        call = step_call(self._record, owner=self._owner, fence=self._fence, name=name, result=data)
        answer = await call.run(self._redis)
        if answer.code == StepCode.FENCED:
            raise StaleRun(
                f"Step {name!r} ran, but this run no longer holds the message's claim (taken "
                "over by another run after this worker was paused or cut off, or cancelled, "
                "or done): its result was not journaled. Stop: the other run's outcome is "
                "the message's."
            )
        if answer.code == StepCode.FULL:
            raise _too_many(name)
        if answer.code == StepCode.KEPT:
            return answer.stored
        return data


def _too_many(name: str) -> TooManySteps:
    return TooManySteps(
        f"Step {name!r} not run: the message has journaled {MAX_STEPS} steps, the most it "
        "may. Group small steps into one (a step may return a list), or split the work "
        "over several messages."
    )
