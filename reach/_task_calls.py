"""A client's calls about one task sent earlier that are not on the path of a send:
``answer`` (human input) and ``scheduled``. A base class of :class:`~reach.Client`, apart
so that module stays within its size."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from . import scheduling
from .asking import answer_task

if TYPE_CHECKING:
    from .client import Client


class TaskCalls:
    """``answer`` and ``scheduled`` of a client."""

    async def answer(self, msg_id: str, value: Any, *, ask: int | None = None) -> int:
        """Answer the question ``msg_id``'s handler asked (``ctx.ask``) with ``value``, any
        JSON value: it is stored in the task's record, the task is ``running`` again and
        the handler goes on with it. Returns the number of the ask answered (a handler's
        first is 1). ``ask``: the number of the ask this answers (``task.asking`` when the
        question was shown), so an answer meant for one question never lands on a later
        one; None: whichever waits. Raises :class:`reach.UnknownTask` (no such task),
        :class:`reach.NotWaitingForInput` (it waits for no answer: its ``status`` says
        what it is), :class:`reach.AlreadyAnswered` (the first answer stands), all
        :class:`reach.AnswerRefused`; :class:`reach.ConfigError` for a value that is no
        JSON or over 64 KiB. docs/concepts.md, *Human input*."""
        c = cast("Client", self)
        return await answer_task(c.commands, c.keys, msg_id, value, ask=ask, control=c.control)

    async def scheduled(self, *, limit: int = 100) -> list[scheduling.ScheduledSend]:
        """The sends waiting for their due time (``send(at=...)``), the earliest first."""
        c = cast("Client", self)
        return await scheduling.list_scheduled(c.commands, c.keys, limit=limit)
