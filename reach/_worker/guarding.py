"""Guards at work: a guarded handler is its function wrapped (:func:`guarded`, when
``@app.handler`` registers it) so that its guards (reach.guards) check the input before
it runs and the output before the reply, and a :class:`GuardRun` is its message's
``ctx._guards``: what ``ctx.emit`` asks before a chunk is written and ``ctx.client``
before an onward call is sent. A handler without guards is not wrapped: nothing of this
runs for its messages.

A refusal raises :class:`reach.GuardRefused` out of the handler; outcome.py
(:func:`refused_here`) dead-letters it at once, reason ``refused_by_guard``. It sticks:
once a guard refused something of a message (a chunk, an onward call the handler caught),
the message ends refused whatever the handler does next, and nothing more of it passes
(no chunk, no call, no result).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import anyio
import anyio.from_thread
import anyio.to_thread

from ..errors import ConfigError, GuardRefused
from ..guards import (
    CHUNK,
    INPUT,
    OUTPUT,
    Content,
    Guard,
    OnwardCalls,
    Refuse,
    as_guard,
    refusal_text,
)

if TYPE_CHECKING:
    from ..context import Context

_MARK = "_reach_guard_run"  # set on the refusals a GuardRun raised (not a callee's)


def refused_here(exc: BaseException) -> bool:
    """True when ``exc`` is a refusal by this agent's own guards (a callee's
    GuardRefused, raised out of a handler, is an error like any other)."""
    return isinstance(exc, GuardRefused) and getattr(exc, _MARK, False)


def check_guards(guards: Iterable[Any], who: str) -> list[Guard]:
    """``guards`` as Guard instances (ConfigError naming ``who`` otherwise)."""
    if isinstance(guards, Guard) or callable(guards):
        raise ConfigError(f"{who}: guards= takes a list, e.g. guards=[{guards!r}].")
    return [as_guard(g) for g in guards]


class HandlerGuards:
    """The guards of one handler (the agent's, then its own), by what they check."""

    def __init__(self, capability: str, guards: list[Guard]) -> None:
        self.capability = capability
        self.input = tuple(g for g in guards if INPUT in g.stages)
        self.output = tuple(g for g in guards if OUTPUT in g.stages)
        self.chunk = tuple(g for g in guards if CHUNK in g.stages)
        self.onward = tuple(g for g in guards if isinstance(g, OnwardCalls))

    def by_stage(self, stage: str) -> tuple[Guard, ...]:
        return self.input if stage == INPUT else self.output if stage == OUTPUT else self.chunk


class GuardRun:
    """The guards of one message (``ctx._guards``); ``refused`` once one refused."""

    __slots__ = ("ctx", "guards", "refused")

    def __init__(self, guards: HandlerGuards, ctx: Context) -> None:
        self.guards = guards
        self.ctx = ctx
        self.refused: GuardRefused | None = None

    def _verdict(self, g: Guard, stage: str, verdict: Any) -> None:
        if verdict is None or verdict is True:
            return
        if verdict is False:
            rule, why = g.rule, "refused"
        elif isinstance(verdict, str):
            rule, why = g.rule, verdict or "refused"
        elif isinstance(verdict, Refuse):
            rule, why = verdict.rule or g.rule, str(verdict)
        else:
            raise TypeError(
                f"guard {g!r} returned {verdict!r}: return None to pass, or a reason (str), "
                "False or reach.Refuse(...) to refuse"
            )
        self._refuse(
            GuardRefused(refusal_text(rule, stage, self.guards.capability, why), rule=rule)
        )

    def _refuse(self, err: GuardRefused) -> None:
        setattr(err, _MARK, True)
        if self.refused is None:
            self.refused = err
        raise err

    async def check(self, stage: str, content: Content) -> None:
        """Run the guards of ``stage`` on the event loop (a plain check that may block in a
        worker thread); raises the refusal."""
        for g in self.guards.by_stage(stage):
            try:
                if g.is_async:
                    verdict = await g.check(content, self.ctx)  # type: ignore[misc]
                elif g.threaded:
                    verdict = await anyio.to_thread.run_sync(g.check, content, self.ctx)
                else:
                    verdict = g.check(content, self.ctx)
            except Refuse as r:
                verdict = r
            self._verdict(g, stage, verdict)

    def check_sync(self, stage: str, content: Content) -> None:
        """:meth:`check` from a plain handler's worker thread (async checks on the loop)."""
        for g in self.guards.by_stage(stage):
            try:
                if g.is_async:
                    verdict: Any = anyio.from_thread.run(g.check, content, self.ctx)  # type: ignore[arg-type]
                else:
                    verdict = g.check(content, self.ctx)
            except Refuse as r:
                verdict = r
            self._verdict(g, stage, verdict)

    async def chunk(self, value: Any) -> None:
        """Before ``ctx.emit`` writes ``value``: refused once the message is."""
        if self.refused is not None:
            raise self.refused
        if self.guards.chunk:
            await self.check(CHUNK, Content(CHUNK, value, self.guards.capability))

    def onward(self, capability: str) -> None:
        """Before ``ctx.client`` sends a call to ``capability``: refused unless every
        allow-list has it (and once the message is refused, every call is)."""
        if self.refused is not None:
            raise self.refused
        for g in self.guards.onward:
            err = g.refuse(capability, self.guards.capability)
            if err is not None:
                self._refuse(err)

    def output(self, result: Any) -> Content | None:
        """The content of ``result`` to check; None when it cannot be encoded (the
        worker dead-letters it ``bad_result``: nothing of it is sent)."""
        if self.refused is not None:
            raise self.refused
        if not self.guards.output:
            return None
        content = Content(OUTPUT, result, self.guards.capability)
        try:
            content.data  # noqa: B018 - encoded once here, reused by every check
        except ConfigError:
            return None
        return content


def guarded(
    fn: Callable[[Any, Context], Any],
    is_async: bool,
    guards: list[Guard],
    capability: str,
    original: Callable[..., Any],
    payload_type: Any,
) -> Callable[[Any, Context], Any]:
    """``fn`` (a handler of ``capability``; ``original`` as written, for its
    annotations) with ``guards`` around it; ``fn`` itself when there are none."""
    bound = [g.bind(capability, original, payload_type) for g in guards]
    if not bound:
        return fn
    hg = HandlerGuards(capability, bound)

    def input_of(payload: Any, ctx: Context) -> Content:
        return Content(INPUT, payload, capability, bytes(ctx.envelope.payload))

    if is_async:

        async def run(payload: Any, ctx: Context) -> Any:
            g = ctx._guards = GuardRun(hg, ctx)
            try:
                if hg.input:
                    await g.check(INPUT, input_of(payload, ctx))
                result = await fn(payload, ctx)
            except Exception:
                if g.refused is not None:
                    raise g.refused from None
                raise
            content = g.output(result)
            if content is not None:
                await g.check(OUTPUT, content)
            return result

        wrapper: Callable[[Any, Context], Any] = run
    else:

        def run_plain(payload: Any, ctx: Context) -> Any:
            g = ctx._guards = GuardRun(hg, ctx)
            try:
                if hg.input:
                    g.check_sync(INPUT, input_of(payload, ctx))
                result = fn(payload, ctx)
            except Exception:
                if g.refused is not None:
                    raise g.refused from None
                raise
            content = g.output(result)
            if content is not None:
                g.check_sync(OUTPUT, content)
            return result

        wrapper = run_plain
    return functools.wraps(fn)(wrapper)
