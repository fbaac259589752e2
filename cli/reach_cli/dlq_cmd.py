"""``reach dlq``: list, show, replay and purge dead letters (the work is in ``reach.admin``; this module parses and renders)."""

from __future__ import annotations

import collections
import math
from typing import Annotated, Any, Optional

import anyio
import typer

from reach import admin
from reach.client import Client
from reach.envelope import decode_payload
from reach.errors import ConfigError, DeadlineExceeded, ReachError
from reach.keys import Keys
from reach.outcomes import Status

from .common import (
    DEFAULT_NS,
    DEFAULT_REDIS,
    Json,
    Namespace,
    RedisUrl,
    command,
    json_line,
    open_control_apart,
    open_redis,
    print_json,
    print_traceback,
    progress,
    readable,
    registry_url_for,
    safe_text,
    table,
)
from .completion import complete_capability

dlq_app = typer.Typer(help="Dead letters: list, show, replay, purge.", no_args_is_help=True)


# -- dead letters ---------------------------------------------------------------------------
CapOpt = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option("--cap", help="Only this capability.", autocompletion=complete_capability),
]
FullOpt = Annotated[
    bool, typer.Option("--full", help="Show every value whole (else long ones are cut).")
]
CUT_LIST = 80  # characters of an error in `reach dlq list`
CUT_SHOW = 400  # characters of a value in `reach dlq show`
LINES_PER_LETTER = 20  # `reach dlq replay` of more letters prints where replies went, summed


def cut(text: str, limit: int, full: bool) -> str:
    """``text``, or its first ``limit`` characters and how much more there is."""
    if full or len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text):,} characters: --full shows all)"


@dlq_app.command("list")
@command
async def dlq_list(
    cap: CapOpt = None,
    limit: Annotated[int, typer.Option(min=1, help="At most this many per capability.")] = 100,
    full: FullOpt = False,
    redis_url: RedisUrl = DEFAULT_REDIS,
    namespace: Namespace = DEFAULT_NS,
    json_: Json = False,
) -> None:
    """List dead letters (newest last) with reason, attempts and last error."""
    r = await open_redis(redis_url)
    try:
        found = await admin.list_dead_letters(r, Keys(namespace), capability=cap, limit=limit)
    finally:
        await r.aclose()
    letters = [e.letter for e in found]
    if json_:
        print_json([{k: v for k, v in _dl_row(d).items()} for d in letters])
        return
    table(
        f"dead letters in {namespace!r}",
        ["id", "capability", "reason", "attempts", "agent", "msg_id", "error"],
        [
            (
                d.id,
                d.capability,
                d.reason,
                d.attempts,
                d.agent_id,
                d.msg_id,
                cut(safe_text(d.error_text), CUT_LIST, full),
            )
            for d in letters
        ],
        wrap=("error",),  # cut to CUT_LIST already, with a note at the end
    )


def _dl_row(d: Any) -> dict[str, Any]:
    return {
        "id": d.id,
        "capability": d.capability,
        "reason": d.reason,
        "attempts": d.attempts,
        "agent_id": d.agent_id,
        "msg_id": d.msg_id,
        "error": d.error,
        "error_type": d.error_type,
        "ts": d.ts,
    }


@dlq_app.command("show")
@command
async def dlq_show(
    entry_id: Annotated[str, typer.Argument(help="Dead letter id (from `reach dlq list`).")],
    cap: CapOpt = None,
    full: FullOpt = False,
    redis_url: RedisUrl = DEFAULT_REDIS,
    namespace: Namespace = DEFAULT_NS,
    json_: Json = False,
) -> None:
    """Show one dead letter with its original envelope, one field a row.

    Values longer than 400 characters are cut (--full: whole; --json: always whole);
    long ones wrap within the terminal's width.
    """
    r = await open_redis(redis_url)
    try:
        found = await admin.find_dead_letter(r, Keys(namespace), entry_id, capability=cap)
    finally:
        await r.aclose()
    d = found.letter
    row = _dl_row(d)
    env = d.envelope
    if env is not None:
        row["envelope"] = {f: getattr(env, f) for f in env.__struct_fields__ if f != "payload"}
        try:
            row["payload"] = decode_payload(env.payload)
        except Exception:  # noqa: BLE001 - whatever the failure, the rest is still shown
            row["payload"] = "<undecodable>"
    else:
        row["raw"] = d.raw[:200].hex()
    if json_:
        print_json({**row, "traceback": d.traceback})
        return
    rows: list[tuple[str, str]] = []
    for k, v in row.items():
        if k == "envelope":  # one row per envelope field: a wide map reads badly
            rows += [(f"envelope.{f}", _shown(x, full)) for f, x in v.items()]
        elif k == "payload":  # as JSON: a nested payload stays readable
            rows.append((k, cut(json_line(v), CUT_SHOW, full)))
        elif k == "error":  # `KeyError: 'txt'`, not `'txt'`
            rows.append((k, _shown(d.error_text, full)))
        else:
            rows.append((k, _shown(v, full)))
    table(f"dead letter {entry_id}", ["field", "value"], rows)
    print_traceback(d.traceback)


def _shown(value: Any, full: bool) -> str:
    return cut(readable(value), CUT_SHOW, full)


@dlq_app.command("replay")
@command
async def dlq_replay(
    entry_id: Annotated[Optional[str], typer.Argument(help="Dead letter id to replay.")] = None,  # noqa: UP045
    all_: Annotated[
        bool, typer.Option("--all", help="Replay every dead letter (of --cap).")
    ] = False,
    cap: CapOpt = None,
    reply_to: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            "--reply-to",
            metavar="CLIENT_ID",
            help="Publish the outcomes to this client's reply stream (else: to the original "
            "caller while it is connected, else nowhere).",
        ),
    ] = None,
    wait: Annotated[
        bool,
        typer.Option("--wait", help="Wait for each replayed message's outcome and print it."),
    ] = False,
    timeout_s: Annotated[
        float, typer.Option("--timeout-s", help="With --wait: how long to wait in all.")
    ] = 30.0,
    as_operator: Annotated[
        bool,
        typer.Option(
            "--as-operator",
            help="Send each letter as this command's own message (its sender: this "
            "client, signed with REACH_SECRET), also letters whose signature does not "
            "verify; else those are refused.",
        ),
    ] = False,
    redis_url: RedisUrl = DEFAULT_REDIS,
    namespace: Namespace = DEFAULT_NS,
    json_: Json = False,
) -> None:
    """Send dead letters again (same msg_id and idempotency key, attempts from 1).

    With REACH_SECRET set, a letter is signed again only when its original signature
    verifies (its sender stays the original one); an unsigned or forged letter stays in
    the dead letters, unless --as-operator sends it as this command's own message.

    The outcome goes to the original caller only while it is connected (a connection named
    reach:NS:CLIENT_ID in CLIENT LIST); a caller that is gone gets nothing (with --wait:
    this command gets it), never a reply stream nobody reads. It is always in the task
    record: reach task MSG_ID.

    Examples: reach dlq replay 1717171717171-0 --wait;  reach dlq replay --all --cap text.summarize
    """
    if bool(entry_id) == bool(all_):
        raise ConfigError("Give either a dead letter ID or --all.")
    if not (math.isfinite(timeout_s) and timeout_s > 0):
        raise ConfigError(f"--timeout-s must be a number of seconds > 0, not {timeout_s}.")
    if reply_to is not None and not reply_to.strip():
        raise ConfigError("--reply-to needs a client id (the client_id of a reach.Client).")
    keys = Keys(namespace)
    outcomes: dict[str, dict[str, Any]] = {}
    # The command's own client names its connections like any Client: while it waits, it
    # is a live caller, and the replies of gone callers come to it.
    registry_url = registry_url_for(redis_url)
    async with Client(
        redis_url=redis_url, registry_url=registry_url, namespace=namespace
    ) as client:
        r = client.redis
        if entry_id:
            targets = [await admin.find_dead_letter(r, keys, entry_id, capability=cap)]
        else:
            targets = await admin.list_dead_letters(r, keys, capability=cap, limit=None)
        with progress(len(targets), "replayed") as step:  # a bar on a tty, else lines
            res = await admin.replay_dead_letters(
                r,
                keys,
                targets,
                on_each=step,
                reply_to=reply_to,
                fallback_reply_to=client.client_id if wait else "",
                client=client,
                as_operator=as_operator,
                control=client.control if registry_url else None,
            )
        if wait and res.sent:
            with anyio.move_on_after(timeout_s + 5):  # each wait is bounded; a margin
                async with anyio.create_task_group() as tg:
                    for s in res.sent:
                        tg.start_soon(_wait_outcome, client, s.msg_id, timeout_s, outcomes)
            # This command's client id is its own: a reply that came after the outcome was
            # read from the task record would otherwise sit in its stream for 24 h.
            await r.delete(keys.replies(client.client_id))
    sent: list[dict[str, Any]] = [
        {
            "id": s.id,
            "msg_id": s.msg_id,
            "reply_to": s.reply_to or None,
            "why": s.why,
            **({"outcome": outcomes.get(s.msg_id)} if wait else {}),
        }
        for s in res.sent
    ]
    unsuccessful = wait and any(
        outcomes.get(s.msg_id, {}).get("status") != Status.SUCCEEDED for s in res.sent
    )
    if json_:
        print_json(
            {
                "replayed": res.replayed,
                "sent": sent,
                "failed": [{"id": f.id, "error": f.error} for f in res.failed],
            }
        )
    else:
        print(f"replayed {res.replayed}, failed {len(res.failed)}")
        if len(sent) > LINES_PER_LETTER and not wait:  # many: where the replies went
            whys = collections.Counter(x["why"] for x in sent)
            print("  replies: " + ", ".join(f"{n} {why}" for why, n in whys.most_common()))
            sent = []
        for x in sent:
            where = f"reply to {x['reply_to']}" if x["reply_to"] else "no reply stream"
            print(f"  {x['id']}  msg {x['msg_id']}: {where} ({x['why']})")
            if wait:
                print(f"    {_outcome_text(x.get('outcome'))}")
        for f in res.failed:
            print(f"  {f.id}: {f.error}")
    if res.failed or unsuccessful:
        raise typer.Exit(1)


async def _wait_outcome(
    client: Client, msg_id: str, timeout_s: float, out: dict[str, dict[str, Any]]
) -> None:
    """The outcome of a replayed message (its reply, else its task record), into ``out``."""
    try:
        result = await client.result(msg_id, timeout_s=timeout_s)
        out[msg_id] = {"status": str(Status.SUCCEEDED), "result": result}
        return
    except DeadlineExceeded as e:
        error = str(e)
    except ReachError as e:
        error = f"{type(e).__name__}: {e}"
    st = await client.task(msg_id)
    out[msg_id] = {"status": st.status, "error": st.error or error}


def _outcome_text(o: dict[str, Any] | None) -> str:
    if o is None:
        return "no outcome"
    if o.get("status") == Status.SUCCEEDED:
        return f"succeeded: {json_line(o.get('result'))}"
    return f"{o.get('status')}: {safe_text(o.get('error'), oneline=True)}"


@dlq_app.command("purge")
@command
async def dlq_purge(
    cap: CapOpt = None,
    yes: Annotated[bool, typer.Option("--yes", help="Really delete them.")] = False,
    redis_url: RedisUrl = DEFAULT_REDIS,
    namespace: Namespace = DEFAULT_NS,
) -> None:
    """Delete dead letters for good (all, or one capability's). Needs --yes."""
    if not yes:
        raise ConfigError("This deletes dead letters for good: add --yes to confirm.")
    r = await open_redis(redis_url)
    control = await open_control_apart(redis_url)
    try:
        n = await admin.purge_dead_letters(r, Keys(namespace), capability=cap, control=control)
    finally:
        await r.aclose()
        if control is not None:
            await control.aclose()
    print(f"purged {n} dead letters")
