"""``reach dlq``: list, show, replay and purge dead letters (the work is in ``reach.admin``; this module parses and renders)."""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer

from reach import admin
from reach.envelope import decode_payload
from reach.errors import ConfigError
from reach.keys import Keys

from .common import (
    DEFAULT_NS,
    DEFAULT_REDIS,
    Json,
    Namespace,
    RedisUrl,
    command,
    open_redis,
    print_json,
    progress,
    safe_text,
    table,
)

dlq_app = typer.Typer(help="Dead letters: list, show, replay, purge.", no_args_is_help=True)


# -- dead letters ---------------------------------------------------------------------------
CapOpt = Annotated[Optional[str], typer.Option("--cap", help="Only this capability.")]  # noqa: UP045


@dlq_app.command("list")
@command
async def dlq_list(
    cap: CapOpt = None,
    limit: Annotated[int, typer.Option(min=1, help="At most this many per capability.")] = 100,
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
                safe_text(d.error)[:80],
            )
            for d in letters
        ],
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
    redis_url: RedisUrl = DEFAULT_REDIS,
    namespace: Namespace = DEFAULT_NS,
    json_: Json = False,
) -> None:
    """Show one dead letter with its original envelope."""
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
        print_json(row)
    else:
        table(f"dead letter {entry_id}", ["field", "value"], [(k, v) for k, v in row.items()])


@dlq_app.command("replay")
@command
async def dlq_replay(
    entry_id: Annotated[Optional[str], typer.Argument(help="Dead letter id to replay.")] = None,  # noqa: UP045
    all_: Annotated[
        bool, typer.Option("--all", help="Replay every dead letter (of --cap).")
    ] = False,
    cap: CapOpt = None,
    redis_url: RedisUrl = DEFAULT_REDIS,
    namespace: Namespace = DEFAULT_NS,
    json_: Json = False,
) -> None:
    """Send dead letters again (same msg_id and idempotency key, attempts from 1).

    Examples: reach dlq replay 1717171717171-0;  reach dlq replay --all --cap text.summarize
    """
    if bool(entry_id) == bool(all_):
        raise ConfigError("Give either a dead letter ID or --all.")
    r = await open_redis(redis_url)
    keys = Keys(namespace)
    try:
        if entry_id:
            targets = [await admin.find_dead_letter(r, keys, entry_id, capability=cap)]
        else:
            targets = await admin.list_dead_letters(r, keys, capability=cap, limit=None)
        with progress(len(targets), "replayed") as step:  # a bar on a tty, else lines
            res = await admin.replay_dead_letters(r, keys, targets, on_each=step)
    finally:
        await r.aclose()
    if json_:
        print_json(
            {
                "replayed": res.replayed,
                "failed": [{"id": f.id, "error": f.error} for f in res.failed],
            }
        )
    else:
        print(f"replayed {res.replayed}, failed {len(res.failed)}")
        for f in res.failed:
            print(f"  {f.id}: {f.error}")
    if res.failed:
        raise typer.Exit(1)


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
    try:
        n = await admin.purge_dead_letters(r, Keys(namespace), capability=cap)
    finally:
        await r.aclose()
    print(f"purged {n} dead letters")
