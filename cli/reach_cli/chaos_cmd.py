"""``reach chaos``: the chaos run (:mod:`reach_cli.tools.chaos`) as a typer command.

Its options, defaults and help text come from the harness's own parser
(:func:`reach_cli.tools.chaos.cli.build_parser`, which ``bench/chaos.py`` uses as it is):
this command only shows them as every other ``reach`` command shows its options, and hands
what it was given back to that parser, which checks it and runs the harness. A test keeps
the two option lists equal (tests/cli/test_chaos_cmd.py).
"""

from __future__ import annotations

import argparse
from typing import Annotated, Any, Optional

import typer

from .tools.chaos.cli import build_parser
from .tools.chaos.cli import main as chaos_main


def _parser_options() -> dict[str, argparse.Action]:
    return {a.dest: a for a in build_parser()._actions if a.dest != "help"}


_OPTS = _parser_options()


def _default(dest: str) -> Any:
    return _OPTS[dest].default


def _help(dest: str) -> str:
    text = _OPTS[dest].help or dest.replace("_", " ")
    return text[0].upper() + text[1:] + "."


def chaos(
    messages: Annotated[int, typer.Option(help=_help("messages"))] = _default("messages"),
    workers: Annotated[int, typer.Option(help=_help("workers"))] = _default("workers"),
    kills: Annotated[int, typer.Option(help=_help("kills"))] = _default("kills"),
    stops: Annotated[int, typer.Option(help=_help("stops"))] = _default("stops"),
    redis_restarts: Annotated[int, typer.Option(help=_help("redis_restarts"))] = _default(
        "redis_restarts"
    ),
    seed: Annotated[int, typer.Option(help="Seed of the plan (messages, schedule).")] = _default(
        "seed"
    ),
    rate: Annotated[float, typer.Option(help=_help("rate"))] = _default("rate"),
    max_rate: Annotated[float, typer.Option(help="Highest messages/s.")] = _default("max_rate"),
    event_gap_s: Annotated[float, typer.Option(help=_help("event_gap_s"))] = _default(
        "event_gap_s"
    ),
    permanent_share: Annotated[float, typer.Option(help=_help("permanent_share"))] = _default(
        "permanent_share"
    ),
    request_share: Annotated[
        float, typer.Option(help="Share of messages sent with request() (the rest: send()).")
    ] = _default("request_share"),
    concurrency: Annotated[int, typer.Option(help=_help("concurrency"))] = _default("concurrency"),
    callers: Annotated[int, typer.Option(help=_help("callers"))] = _default("callers"),
    inflight: Annotated[int, typer.Option(help=_help("inflight"))] = _default("inflight"),
    max_sleep_ms: Annotated[int, typer.Option(help=_help("max_sleep_ms"))] = _default(
        "max_sleep_ms"
    ),
    deadline_s: Annotated[
        tuple[float, float], typer.Option(metavar="MIN MAX", help=_help("deadline_s"))
    ] = _default("deadline_s"),
    heartbeat_s: Annotated[
        float, typer.Option(help="Workers' seconds between heartbeats.")
    ] = _default("heartbeat_s"),
    lease_s: Annotated[float, typer.Option(help="Workers' lease.")] = _default("lease_s"),
    evict_after_s: Annotated[
        float, typer.Option(help="Workers' seconds without a heartbeat before eviction.")
    ] = _default("evict_after_s"),
    sweep_interval_s: Annotated[
        float, typer.Option(help="Workers' seconds between sweeps.")
    ] = _default("sweep_interval_s"),
    quiet_timeout_s: Annotated[
        float, typer.Option(help="How long the end of the run waits for every message to be done.")
    ] = _default("quiet_timeout_s"),
    agent: Annotated[str, typer.Option(metavar="MODULE:FACTORY", help=_help("agent"))] = _default(
        "agent"
    ),
    dir: Annotated[
        Optional[str],  # noqa: UP045 - typer reads the annotation at run time
        typer.Option("--dir", metavar="DIR", show_default=False, help=_help("dir")),
    ] = None,
    keep: Annotated[bool, typer.Option("--keep", help=_help("keep"))] = False,
    json_: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Kill workers and Redis mid-stream, then check that no message was lost and no side
    effect ran twice.

    Starts its own Redis (AOF everysec) and --workers `reach worker` processes, sends
    --messages messages whose handlers count a side effect per idempotency key, SIGKILLs
    workers mid-handler, pauses one past its lease and restarts Redis; then checks nothing
    was lost, nothing ran twice, every caller was answered and nothing is left pending.
    Exit code 0 only when every check passed. Example: reach chaos --messages 10000
    --workers 4 --kills 24 --redis-restarts 2
    """
    given = dict(locals())
    argv: list[str] = []
    for dest, action in _OPTS.items():
        value = given["json_" if dest == "json" else dest]
        flag = action.option_strings[0]
        if isinstance(action, argparse._StoreTrueAction):
            argv += [flag] if value else []
        elif value is None:
            continue
        elif isinstance(value, tuple):
            argv += [flag, *(str(v) for v in value)]
        else:
            argv += [flag, str(value)]
    raise typer.Exit(chaos_main(argv, prog="reach chaos"))
