"""``reach task``: ``reach task MSG_ID`` shows a message's task (``show``, the default
when the first word is a msg_id), ``reach task answer MSG_ID JSON`` answers the question
its handler asked (reach.Client.answer)."""

from __future__ import annotations

import json as jsonlib
from typing import Annotated, Any

import typer
from rich.markup import escape
from typer.core import TyperGroup

from reach.asking import answer_task
from reach.envelope import decode_payload
from reach.errors import AnswerRefused
from reach.keys import Keys
from reach.outcomes import Status
from reach.recent import attempts_of
from reach.tasks import get_status

from .common import (
    DEFAULT_NS,
    DEFAULT_REDIS,
    Json,
    Namespace,
    RedisUrl,
    age,
    command,
    err_console,
    open_control_apart,
    open_redis,
    print_json,
    print_traceback,
    safe_text,
    table,
)
from .follow import follow


class _ShowByDefault(TyperGroup):
    """``reach task MSG_ID ...`` is ``reach task show MSG_ID ...``: a first word that names
    no subcommand (a msg_id, an option) goes to ``show``."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["show", *args]
        return super().parse_args(ctx, args)


def task_app() -> typer.Typer:
    """The ``reach task`` group: ``show`` (also run for ``reach task MSG_ID``) and
    ``answer``."""
    group = typer.Typer(
        cls=_ShowByDefault,
        no_args_is_help=True,
        help="A message's task: `reach task MSG_ID` shows it (status, question, progress, "
        "result; --follow for each change), `reach task answer MSG_ID JSON` answers the "
        "question its handler asked (status input_required).",
    )
    group.command("show")(show)
    group.command("answer")(answer)
    return group


def parse_answer(text: str) -> Any:
    """The JSON value of ``text``, else the usage error that says how to write one."""
    try:
        return jsonlib.loads(text)
    except jsonlib.JSONDecodeError as e:
        raise typer.BadParameter(
            f"{text[:60]!r} is not JSON ({e.msg}). Text needs its quotes inside the shell's: "
            "'\"yes, refund it\"'; or true, 42, '{\"approved\": true}'.",
            param_hint="JSON",
        ) from None
    except RecursionError:
        raise typer.BadParameter(
            f"{text[:60]!r}... is nested too deeply to read: flatten the answer.",
            param_hint="JSON",
        ) from None


@command
async def show(
    msg_id: Annotated[str, typer.Argument(help="The msg_id printed by `reach send`.")],
    redis_url: RedisUrl = DEFAULT_REDIS,
    namespace: Namespace = DEFAULT_NS,
    json_: Json = False,
    follow_: Annotated[
        bool,
        typer.Option(
            "--follow",
            "-f",
            help="Print each change as it happens (status, the handler's progress) until the "
            "final one; with --json one JSON object per line.",
        ),
    ] = False,
) -> None:
    """Show a message's status: scheduled, pending, running, input_required (with the
    question its handler asked: `reach task answer` answers it), succeeded, failed,
    retrying, expired, dead, cancelled. `reach task MSG_ID` is short for this.

    Example: reach task 019a...e3 --json; reach task 019a...e3 --follow
    """
    r = await open_redis(redis_url)
    if follow_:
        try:
            final = await follow(r, Keys(namespace), msg_id, json_=json_)
        finally:
            await r.aclose()
        if final == Status.UNKNOWN:
            raise typer.Exit(1)
        return
    try:
        st = await get_status(r, Keys(namespace), msg_id)
        runs = await attempts_of(r, Keys(namespace), msg_id)
    finally:
        await r.aclose()
    result: Any = None
    if st.reply is not None and st.reply.status == Status.SUCCEEDED:
        try:
            result = decode_payload(st.reply.result)
        except Exception:  # noqa: BLE001 - whatever the stored bytes are, the rest is shown
            result = "<undecodable>"
    row = {
        "msg_id": st.msg_id,
        "status": st.status,
        "capability": st.capability,
        "agent_id": st.agent_id,
        "attempt": st.attempt,
        "runs": st.runs,
        "error": st.error,
        "error_type": st.error_type,
        "updated_ms": st.updated_ms,
        "idempotency_key": st.idempotency_key or st.msg_id,
        "result": result,
        "progress": st.progress,
        "progress_note": st.progress_note,
    }
    if st.due_ms:  # a scheduled send (send(at=...)): when it is (or was) due
        row["due_ms"] = st.due_ms
    if st.status == Status.INPUT_REQUIRED:  # what `reach task answer` answers
        row["question"] = st.question
        row["asking"] = st.asking
        row["ask_until_ms"] = st.ask_until_ms
    if st.asked:
        row["asked"] = st.asked
    attempts: list[dict[str, Any]] = [
        {
            "attempt": a.attempt,
            "agent_id": a.agent_id,
            "status": a.status,
            "reason": a.reason,
            "error_type": a.error_type,
            "started_ms": a.started_ms,
            "ended_ms": a.ended_ms,
        }
        for a in runs
    ]
    if json_:
        print_json({**row, "traceback": st.traceback, "attempts": attempts})
    else:
        shown = {**row, "error": st.error_text}  # `KeyError: 'txt'`, not `'txt'`
        table(f"task {msg_id}", ["field", "value"], [(k, v) for k, v in shown.items()])
        if attempts:
            table(
                "attempts (the index of recent messages)",
                ["attempt", "agent", "ended as", "error", "ran", "settled"],
                [
                    (
                        a["attempt"],
                        a["agent_id"],
                        a["status"] + (f" ({a['reason']})" if a["reason"] else ""),
                        a["error_type"],
                        f"{a['ended_ms'] - a['started_ms']}ms" if a["started_ms"] else "-",
                        age(a["ended_ms"]),
                    )
                    for a in attempts
                ],
            )
        print_traceback(st.traceback)
    if st.status == Status.UNKNOWN:
        raise typer.Exit(1)


@command
async def answer(
    msg_id: Annotated[str, typer.Argument(help="The msg_id of the task waiting for input.")],
    json: Annotated[
        str,
        typer.Argument(
            help="The answer, as JSON: true, 42, '\"text in quotes\"', '{\"approved\": true}'.",
        ),
    ],
    ask: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="The number of the question this answers (`reach task MSG_ID` shows it as "
            "asking): refused if another one waits. Default: whichever waits.",
        ),
    ] = None,
    redis_url: RedisUrl = DEFAULT_REDIS,
    namespace: Namespace = DEFAULT_NS,
    json_: Json = False,
) -> None:
    """Answer the question a task's handler asked (ctx.ask): the handler goes on with the
    answer, and the task is running again. The answer stays with the task, so a run of
    the message after a crash gets it without asking again.

    Exit 1, with the reason, when the task waits for no answer (it asked none, its
    question timed out, it finished), was answered already, or does not exist.

    Example: reach task 019a...e3 (shows the question), then
    reach task answer 019a...e3 '{"refund": true}'
    """
    data = parse_answer(json)
    r = await open_redis(redis_url)
    control = await open_control_apart(redis_url)  # the audit trail's, when apart
    try:
        n = await answer_task(r, Keys(namespace), msg_id, data, ask=ask, control=control)
    except AnswerRefused as e:
        err_console.print(f"[red]error:[/red] {escape(safe_text(e))}", highlight=False)
        raise typer.Exit(1) from None
    finally:
        await r.aclose()
        if control is not None:
            await control.aclose()
    row = {"msg_id": msg_id, "answered": n}
    if json_:
        print_json(row)
    else:
        table(f"answer {msg_id}", ["field", "value"], list(row.items()))
