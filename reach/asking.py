"""Human input: ``answer = await ctx.ask(question, timeout_s=...)`` inside a handler, and
``client.answer(msg_id, value)`` from anywhere.

An ask puts its question in the message's idempotency record and sets the task
``input_required`` (``lua/ask.lua``), so ``reach task``, ``client.watch``, the console and
the A2A gateway show it. The handler then waits on the record's channel
(:meth:`reach.keys.Keys.task_changes`), subscribed before it asks so no answer is missed;
``lua/answer.lua`` stores the answer in the record and publishes there. The answer stays in
the record: a later run of the message (after a crash and a takeover, a retry) gets it
from ``ask.lua`` at once, without the question being put again. The asks of a handler are
numbered in the order it makes them (its first is 1), which is what a re-run matches them
by: a handler's asks must come in the same order on every run.

While it waits, the handler gives its slot back (:class:`Slots`, the worker's
``max_waiting_handlers``) and takes one again once answered; its claim is renewed as any
running handler's. docs/concepts.md, *Human input*, says what bounds it and what survives
a crash.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Protocol

from redis import exceptions as rexc

from . import audit
from .connection import AnyRedis, as_text
from .envelope import now_ms
from .errors import (
    AlreadyAnswered,
    AskTimeout,
    ConfigError,
    NotWaitingForInput,
    StaleRun,
    TooManyAsks,
    UnknownTask,
)
from .keys import Keys
from .scripts.asking import (
    ANSWER_MAX_BYTES,
    ANSWER_PREFIX,
    MAX_ASKS,
    QUESTION_MAX_BYTES,
    answer_call,
    ask_call,
    withdraw_call,
)
from .scripts.codes import AnswerCode, AskCode
from .watch import READ_S, _Channel, _open

__all__ = [
    "ANSWER_MAX_BYTES",
    "MAX_ASKS",
    "QUESTION_MAX_BYTES",
    "Asker",
    "Slots",
    "answer_task",
    "encode_answer",
]


class Slots(Protocol):
    """What the worker lends an asking handler: its slot, given back while it waits."""

    def give_back(self) -> bool:
        """The handler waits: its slot goes to the next message. False when the worker
        already has its most handlers waiting (``max_waiting_handlers``): this one keeps
        its slot while it waits."""

    async def take_again(self) -> None:
        """The handler resumes: wait for a slot and take it."""

    def forget(self) -> None:
        """The handler ends while it waits (cancelled, its deadline, the worker stopping):
        its wait is over without a slot taken again."""


def check_question(question: object) -> str:
    """``question`` if it is non-empty text of at most :data:`QUESTION_MAX_BYTES` bytes
    of UTF-8, else :class:`~reach.ConfigError`."""
    if not isinstance(question, str) or not question:
        raise ConfigError(f"ctx.ask's question must be non-empty text, got {question!r}.")
    try:
        size = len(question.encode("utf-8"))
    except UnicodeEncodeError as e:
        raise ConfigError(f"ctx.ask's question is not valid UTF-8 text ({e}).") from e
    if size > QUESTION_MAX_BYTES:
        raise ConfigError(
            f"ctx.ask's question is {size} bytes of UTF-8, over the {QUESTION_MAX_BYTES} "
            "a question may be: ask briefly and point to the details (a URL, an id)."
        )
    return question


def encode_answer(value: Any) -> bytes:
    """``value`` as the JSON an answer is stored as; :class:`~reach.ConfigError` when it
    is not JSON-able or is over :data:`ANSWER_MAX_BYTES` bytes."""
    try:
        data = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ConfigError(
            f"An answer must be a JSON value (text, number, true/false, null, a list or an "
            f"object of them): {e}."
        ) from e
    raw = data.encode("utf-8", "surrogatepass")
    if len(raw) > ANSWER_MAX_BYTES:
        raise ConfigError(
            f"The answer is {len(raw)} bytes as JSON, over the {ANSWER_MAX_BYTES} an answer "
            "may be: answer with a reference to the data (a URL, an id) instead."
        )
    return raw


def decode_answer(data: bytes) -> Any:
    """A stored answer (JSON) as the value it encodes; text that is no JSON (written by
    something else than ``answer.lua``'s callers) is returned as it is."""
    text = data.decode("utf-8", "replace")
    try:
        return json.loads(text)
    except ValueError:
        return text


class Asker:
    """The asks of one run of a message: its idempotency ``record`` (named by ``key``),
    held by the claim of ``owner`` with ``fence``. ``redis`` serves the commands, ``raw``
    (the plain client under it) the subscription each wait holds."""

    def __init__(
        self,
        redis: AnyRedis,
        raw: AnyRedis,
        keys: Keys,
        *,
        key: str,
        owner: str,
        fence: int,
        slots: Slots | None,
    ) -> None:
        self._redis = redis
        self._raw = raw
        self._keys = keys
        self._key = key
        self._record = keys.idem(key)
        self._owner = owner
        self._fence = fence
        self._slots = slots
        self._asked = 0  # the number of the last ask of this run

    async def ask(self, question: str, timeout_s: float | None) -> Any:
        """Ask ``question`` (the next ask of this run) and return its answer. See
        :meth:`reach.Context.ask`."""
        check_question(question)
        if timeout_s is not None and not (
            isinstance(timeout_s, (int, float))
            and not isinstance(timeout_s, bool)
            and math.isfinite(timeout_s)
            and timeout_s > 0
        ):
            raise ConfigError(
                f"ctx.ask timeout_s must be a number > 0 (or None), got {timeout_s!r}."
            )
        self._asked += 1
        n = self._asked
        end = None if timeout_s is None else time.monotonic() + timeout_s
        until_ms = 0 if timeout_s is None else now_ms() + max(1, round(timeout_s * 1000))
        channel = _Channel(self._raw, self._keys.task_changes(self._key))
        try:
            await _open(channel, end)  # before the question: no answer goes unheard
            got = await ask_call(
                self._record,
                owner=self._owner,
                fence=self._fence,
                n=n,
                question=question,
                until_ms=until_ms,
            ).run(self._redis)
            if got.code == AskCode.ANSWERED:
                return decode_answer(got.answer)
            if got.code == AskCode.FENCED:
                raise _stale(n)
            if got.code == AskCode.FULL:
                raise TooManyAsks(
                    f"Ask {n} not put: the message has put {MAX_ASKS} questions, the most "
                    "it may. Ask for several things in one question, or split the work "
                    "over several messages."
                )
            async with self._waiting():
                data = await self._wait(channel, n, end)
            if data is not None:
                return decode_answer(data)
        finally:
            await channel.close()
        late = await withdraw_call(self._record, owner=self._owner, fence=self._fence, n=n).run(
            self._redis
        )
        if late.code == AskCode.ANSWERED:
            return decode_answer(late.answer)
        if late.code == AskCode.FENCED:
            raise _stale(n)
        raise AskTimeout(
            f"No answer to ask {n} ({question[:80]!r}) within timeout_s={timeout_s}: the "
            "question was taken back and the task is running again. Catch AskTimeout to go "
            "on without an answer, or ask with a longer timeout_s."
        )

    @asynccontextmanager
    async def _waiting(self) -> AsyncIterator[None]:
        """The handler's slot given back while it waits (when the worker lends it), taken
        again when the wait ends with an answer or a timeout."""
        lent = self._slots is not None and self._slots.give_back()
        try:
            yield
        except BaseException:
            if lent and self._slots is not None:
                self._slots.forget()
            raise
        if lent and self._slots is not None:
            await self._slots.take_again()

    async def _wait(self, channel: _Channel, n: int, end: float | None) -> bytes | None:
        """Ask ``n``'s answer, once stored; None once ``end`` has passed without one. The
        record is read on each message of its channel, and every :data:`READ_S` anyway."""
        field = f"{ANSWER_PREFIX}{n}"
        while True:
            answer, fence = await self._redis.hmget(self._record, [field, "fence"])
            if answer is not None:
                return bytes(answer) if not isinstance(answer, bytes) else answer
            if fence is None or as_text(fence) != str(self._fence):
                raise _stale(n)
            wait = READ_S if end is None else min(READ_S, end - time.monotonic())
            if wait <= 0:
                return None
            try:
                await channel.read(wait)
            except (rexc.ConnectionError, rexc.TimeoutError):
                await channel.close()
                await _open(channel, end)


def _stale(n: int) -> StaleRun:
    return StaleRun(
        f"Ask {n}: this run no longer holds the message's claim (taken over by another run "
        "after this worker was paused or cut off, or cancelled, or done). Stop: the other "
        "run's outcome is the message's."
    )


async def answer_task(
    redis: AnyRedis,
    keys: Keys,
    msg_id: str,
    value: Any,
    *,
    ask: int | None = None,
    control: AnyRedis | None = None,
) -> int:
    """Answer the question ``msg_id``'s handler waits on with ``value`` (see
    :meth:`reach.Client.answer`): the number of the ask answered. ``control``: the audit
    trail's Redis when the control plane is apart (reach.planes)."""
    data = encode_answer(value)
    if ask is not None and (isinstance(ask, bool) or not isinstance(ask, int) or ask < 1):
        raise ConfigError(f"ask must be an ask's number (1 or more) or None, got {ask!r}.")
    async with audit.operator_action(
        control or redis, keys, "task.answer", target=msg_id, msg_id=msg_id, detail={"ask": ask}
    ) as note:
        n = await _answer(redis, keys, msg_id, data, ask)
        note.detail["ask"] = n
    return n


async def _answer(redis: AnyRedis, keys: Keys, msg_id: str, data: bytes, ask: int | None) -> int:
    pointer = await redis.get(keys.task(msg_id))
    key = as_text(pointer) if pointer else msg_id
    got = await answer_call(keys.idem(key), answer=data, n=ask).run(redis)
    if got.code == AnswerCode.ANSWERED:
        return got.n
    if got.code == AnswerCode.UNKNOWN:
        raise UnknownTask(
            f"No task {msg_id!r}: never sent, or its record expired. Check the msg_id "
            "(reach tasks lists recent ones)."
        )
    if got.code == AnswerCode.ALREADY:
        raise AlreadyAnswered(
            f"Task {msg_id} had its question (ask {got.n}) answered already: the first "
            "answer stands. reach task MSG_ID shows what the task does now.",
            n=got.n,
        )
    status = got.status or "unknown"
    if ask is not None and status == "input_required":
        raise NotWaitingForInput(
            f"Task {msg_id} waits for the answer to another question, not to ask {ask}: "
            "reach task MSG_ID shows the one it asks now.",
            status=status,
        )
    raise NotWaitingForInput(
        f"Task {msg_id} waits for no answer (it is {status}): its handler asked nothing, "
        "or the question's timeout_s passed, or it finished. reach task MSG_ID shows it.",
        status=status,
    )
