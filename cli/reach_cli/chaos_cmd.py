"""``reach chaos``: the chaos run (:mod:`reach_cli.tools.chaos`) as a typer command.

Its options, defaults and help text come from the harness's own parser
(:func:`reach_cli.tools.chaos.cli.build_parser`, which ``bench/chaos.py`` uses as it is):
this command only shows them as every other ``reach`` command shows its options, and hands
what it was given back to that parser, which checks it and runs the harness. A test keeps
the two option lists equal (tests/cli/test_chaos_cmd.py).
"""

from __future__ import annotations

import argparse
from typing import Annotated, Any, Literal, Optional

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


Scenario = Literal["crash", "rolling-deploy"]
OptInt = Optional[int]  # noqa: UP045 - typer reads the annotation at run time
OptFloat = Optional[float]  # noqa: UP045
OptStr = Optional[str]  # noqa: UP045
OptRange = Optional[tuple[float, float]]  # noqa: UP045


def chaos(
    scenario: Annotated[Scenario, typer.Option(help=_help("scenario"))] = "crash",
    short: Annotated[bool, typer.Option("--short", help=_help("short"))] = False,
    messages: Annotated[OptInt, typer.Option(help=_help("messages"))] = None,
    workers: Annotated[OptInt, typer.Option(help=_help("workers"))] = None,
    kills: Annotated[OptInt, typer.Option(help=_help("kills"))] = None,
    stops: Annotated[OptInt, typer.Option(help=_help("stops"))] = None,
    redis_restarts: Annotated[int, typer.Option(help=_help("redis_restarts"))] = _default(
        "redis_restarts"
    ),
    rounds: Annotated[OptInt, typer.Option(help=_help("rounds"))] = None,
    seed: Annotated[int, typer.Option(help="Seed of the plan (messages, schedule).")] = _default(
        "seed"
    ),
    rate: Annotated[OptFloat, typer.Option(help=_help("rate"))] = None,
    max_rate: Annotated[OptFloat, typer.Option(help=_help("max_rate"))] = None,
    event_gap_s: Annotated[OptFloat, typer.Option(help=_help("event_gap_s"))] = None,
    gap_s: Annotated[OptFloat, typer.Option(help=_help("gap_s"))] = None,
    permanent_share: Annotated[OptFloat, typer.Option(help=_help("permanent_share"))] = None,
    request_share: Annotated[
        float, typer.Option(help="Share of messages sent with request() (the rest: send()).")
    ] = _default("request_share"),
    stream_share: Annotated[OptFloat, typer.Option(help=_help("stream_share"))] = None,
    concurrency: Annotated[int, typer.Option(help=_help("concurrency"))] = _default("concurrency"),
    callers: Annotated[int, typer.Option(help=_help("callers"))] = _default("callers"),
    inflight: Annotated[int, typer.Option(help=_help("inflight"))] = _default("inflight"),
    min_sleep_ms: Annotated[OptInt, typer.Option(help=_help("min_sleep_ms"))] = None,
    max_sleep_ms: Annotated[OptInt, typer.Option(help=_help("max_sleep_ms"))] = None,
    deadline_s: Annotated[
        OptRange, typer.Option(metavar="MIN MAX", show_default=False, help=_help("deadline_s"))
    ] = None,
    heartbeat_s: Annotated[OptFloat, typer.Option(help=_help("heartbeat_s"))] = None,
    lease_s: Annotated[OptFloat, typer.Option(help=_help("lease_s"))] = None,
    evict_after_s: Annotated[OptFloat, typer.Option(help=_help("evict_after_s"))] = None,
    sweep_interval_s: Annotated[OptFloat, typer.Option(help=_help("sweep_interval_s"))] = None,
    quiet_timeout_s: Annotated[
        float, typer.Option(help="How long the end of the run waits for every message to be done.")
    ] = _default("quiet_timeout_s"),
    agent: Annotated[OptStr, typer.Option(metavar="MODULE:FACTORY", help=_help("agent"))] = None,
    dir: Annotated[
        OptStr,
        typer.Option("--dir", metavar="DIR", show_default=False, help=_help("dir")),
    ] = None,
    keep: Annotated[bool, typer.Option("--keep", help=_help("keep"))] = False,
    json_: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Kill workers and Redis mid-stream, or replace every worker by SIGTERM under load; then
    check that no message was lost, every caller was answered and nothing ran twice.

    Starts its own Redis (AOF everysec) and --workers `reach worker` processes whose
    handlers count their runs and side effects per idempotency key. --scenario crash (the
    default) sends --messages messages, SIGKILLs workers mid-handler, pauses one past its
    lease and restarts Redis. --scenario rolling-deploy sends continuously (requests,
    streams, sends; handlers of 0.05-5 s) while every worker is replaced in turn, --rounds
    times: its successor started and ready, then SIGTERM; with --kills SIGKILLs and a Redis
    restart among the replacements. Then it checks: nothing lost, every caller answered,
    each key's handler run once (a second run only after a SIGKILL), no message on two
    agents at once, nothing left pending. Exit code 0 only when every check passed.
    Examples: reach chaos --messages 10000 --workers 4 --kills 24 --redis-restarts 2;
    reach chaos --scenario rolling-deploy --short
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
