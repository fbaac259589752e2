"""Fuzzing the `reach` command line: every command and sub-command, found by walking the
typer app (a new command is fuzzed without touching this file), is run in-process with
arguments drawn by hypothesis: hostile text, numbers out of range, NaN and infinities,
unknown options, missing and extra arguments, bad Redis URLs, odd namespaces. Whatever
the arguments, the command must end with an exit code docs/cli.md documents (0, 1 or 2)
and never with a traceback.

Commands run against a Redis server of this module's own: a namespace with glob
characters (``*``) reaches every namespace of the server it runs on, and ``dlq purge
--yes`` deletes what it matches.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import uuid
from collections.abc import Iterator
from typing import Any, Literal, get_args, get_origin

import anyio
import pytest
import typer.main
from hypothesis import given
from hypothesis import strategies as st
from reach_cli.app import app
from typer.testing import CliRunner

from reach.connection import connect
from reach.embedded import RedisServer, ServerBinary
from reach.registry import Registry

runner = CliRunner()

# Commands that run until stopped, or for long, are not fuzzed here; each says why and
# where its arguments are tested instead.
SKIP: dict[tuple[str, ...], str] = {
    ("worker",): "serves until a signal (and configures the process's logging); its target "
    "loading and option checks are tested in tests/cli/test_cli_errors.py",
    ("redis",): "runs a server until Ctrl-C; tested in tests/cli/test_cli_redis.py",
    ("demo",): "a tour of a minute with worker processes; run by .ci/run",
    ("bench",): "a benchmark of seconds to minutes; tests/cli/test_cli_bench.py",
    ("chaos",): "minutes of killing workers; its own argparse; tests/chaos",
    ("gateway",): "serves until a signal once its options are valid; tested in "
    "tests/cli/test_gateway_cmd.py and tests/integration/test_gateway.py",
    ("web",): "serves until a signal once its options are valid; tested in "
    "tests/integration/test_web.py and tests/cli/test_web_browser.py",
    ("bench-scaling",): "a benchmark of minutes; its own argparse; tests/cli/test_scaling.py",
}
# Options never drawn for a command (they make it run until stopped) and arguments always
# given (they bound it).
NEVER: dict[tuple[str, ...], set[str]] = {
    ("events",): {"--follow", "-f"},
    ("audit",): {"--follow", "-f"},
    ("top",): {"--once"},
}
# Given before the drawn options (a drawn value of the same option wins).
ALWAYS: dict[tuple[str, ...], list[str]] = {("top",): ["--once"], ("send",): ["--timeout-s", "0.2"]}
# `top --once` waits --interval between its two samples, `send --wait` up to --timeout-s
# for an agent that never answers: only short or invalid values.
SHORT_OR_INVALID = ["0", "0.01", "-1", "nan", "inf", "-inf", "1e309", "abc", ""]
SAFE_VALUES: dict[tuple[tuple[str, ...], str], list[str]] = {
    (("top",), "interval"): SHORT_OR_INVALID,
    (("send",), "timeout_s"): SHORT_OR_INVALID,
}


def _walk(cmd: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    yield path, cmd
    for name, sub in sorted(getattr(cmd, "commands", {}).items()):
        yield from _walk(sub, (*path, name))


COMMANDS = dict(_walk(typer.main.get_command(app)))
FUZZED = [p for p in COMMANDS if p not in SKIP]
COMMAND_NAMES = {name for path in COMMANDS for name in path}


# -- values ------------------------------------------------------------------------------
# argv can carry any bytes but NUL; Python decodes what is not UTF-8 to lone surrogates.
HOSTILE = st.sampled_from(
    [
        "",
        " ",
        "-",
        "--",
        "-x",
        "--nope",
        "[/red]",
        "[bold]x",
        "*",
        "?",
        "[a-z]",
        "{a}",
        "{",
        "}",
        "a:b",
        "\udcff\udcfe",
        "é🤖",
        "\x1b[31m",
        "\n",
        "a" * 3000,
        "../..",
        "%s%n",
        "nan",
        "-1",
        "0",
        "1e309",
        "0-0",
        "1-1",
        "9" * 30,
        "text.summarize",
        "_malformed",
        "fz-1",
        "fz.cap",
        "fz-ready",
        "fz.ready",
        "null",
        "{}",
        "[1, 2]",
        '{"a": 1}',
        "1" * 30,
        '"\\ud800"',
        "[" * 5000,
        '{"a": NaN}',
        "1e400",
    ]
)
TEXT = st.one_of(HOSTILE, st.text(st.characters(blacklist_characters="\x00"), max_size=30))
INT = st.one_of(
    st.sampled_from(
        [
            "0",
            "-1",
            "1",
            "65535",
            "65536",
            str(2**31),
            str(2**63),
            str(10**30),
            "-" + str(10**30),
            "1.5",
            "abc",
            "",
            "0x10",
        ]
    ),
    st.integers(-(10**6), 10**6).map(str),
)
FLOAT = st.one_of(
    st.sampled_from(
        [
            "0",
            "-0",
            "-1",
            "0.001",
            "1e-300",
            "1e308",
            "1e309",
            "nan",
            "inf",
            "-inf",
            "abc",
            "",
            "1,5",
        ]
    ),
    st.floats(allow_nan=False, allow_infinity=False, min_value=-1e6, max_value=1e6).map(repr),
)
PAYLOAD = st.one_of(
    TEXT,
    st.recursive(
        st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=10)),
        lambda c: st.one_of(
            st.lists(c, max_size=3), st.dictionaries(st.text(max_size=5), c, max_size=3)
        ),
        max_leaves=8,
    ).map(json.dumps),
)


def _value(path: tuple[str, ...], param: Any) -> st.SearchStrategy[str]:
    safe = SAFE_VALUES.get((path, param.name))
    if safe is not None:
        return st.sampled_from(safe)
    ann = param.type_descriptor.annotation
    args = get_args(ann)
    if get_origin(ann) is list and args:
        ann = args[0]
    if get_origin(ann) is Literal:
        return st.one_of(st.sampled_from([str(a) for a in get_args(ann)]), TEXT)
    if ann is int:
        return st.one_of(INT, TEXT)
    if ann is float:
        return st.one_of(FLOAT, TEXT)
    if param.name == "payload":
        return PAYLOAD
    return TEXT


@st.composite
def argv(
    draw: st.DrawFn, path: tuple[str, ...], redis_url: str, namespaces: list[str]
) -> list[str]:
    """One command line for the command at ``path``."""
    cmd = COMMANDS[path]
    out: list[str] = list(path)
    names = {p.name for p in cmd.params}
    # First, so that a fuzzed option left without its value cannot swallow them.
    if "redis_url" in names:
        out += ["--redis-url", draw(st.sampled_from([redis_url] * 6 + BAD_URLS))]
    if "namespace" in names:
        out += ["--namespace", draw(st.one_of(st.sampled_from(namespaces), TEXT))]
    out += ALWAYS.get(path, [])
    never = NEVER.get(path, set())
    for p in cmd.params:
        opts = list(getattr(p, "opts", []) or [])
        if p.name in ("redis_url", "namespace"):
            continue
        if opts and set(opts) & never:
            continue
        if type(p).__name__.endswith("Argument"):
            if draw(st.integers(0, 9)) > 0:  # sometimes missing
                out.append(draw(_value(path, p)))
            continue
        if not draw(st.booleans()):
            continue
        name = draw(st.sampled_from(opts))
        if getattr(p, "is_flag", False):
            out.append(name)
            continue
        for _ in range(draw(st.integers(1, 3)) if p.multiple else 1):
            out += [name, draw(_value(path, p))]
    if draw(st.integers(0, 9)) == 0:  # something it does not know
        out += draw(
            st.sampled_from([["--nope"], ["extra-arg"], ["--help"], ["-n"], ["--json", "x"]])
        )
    if path == () and draw(st.booleans()):  # the bare `reach` with a word that is no command
        out.append(draw(TEXT.filter(lambda w: w.strip() not in COMMAND_NAMES)))
    return out


# Never one without a host and port: redis-py would take localhost:6379, a server that is
# not the test's.
BAD_URLS = [
    "redis://127.0.0.1:1/0",  # nothing listens: refused at once
    "redis://127.0.0.1:1",
    "http://127.0.0.1:1/",
    "",
    "redis://127.0.0.1:notaport/0",
    "redis://127.0.0.1:99999/0",
    "unix:///nonexistent/reach.sock",
    "redis+sentinel://",
    "redis+sentinel://127.0.0.1:1/svc?master_wait_s=0.2&socket_connect_timeout=0.2",
    "redis+sentinel://127.0.0.1:1/svc/x",
]


# -- the server, the namespaces ----------------------------------------------------------
@pytest.fixture(scope="module", autouse=True)
def built_once() -> Iterator[None]:
    """Typer builds the click command from the app on every invoke (~80% of a run's time
    here); the fuzzing reuses the one built when this module was imported."""
    import typer.testing

    with pytest.MonkeyPatch.context() as mp:
        built = COMMANDS[()]
        original = typer.testing._get_command
        mp.setattr(typer.testing, "_get_command", lambda a: built if a is app else original(a))
        yield


@pytest.fixture(scope="module")
def fuzz_redis(server_binary: ServerBinary) -> Iterator[RedisServer]:
    with RedisServer(binary=server_binary) as server:
        yield server


@pytest.fixture(scope="module")
def seeded(fuzz_redis: RedisServer) -> str:
    """A namespace with something in it: a registered agent that is not ready (fz-1, of
    fz.cap), a ready one that never answers (fz-ready, of fz.ready: messages are sent to
    its inbox, `send --wait` waits for its --timeout-s), their events."""
    ns = f"fz{uuid.uuid4().hex[:8]}"

    async def seed() -> None:
        r = await connect(fuzz_redis.url)
        try:
            reg = Registry(r, ns)
            for agent_id, cap, ready in (("fz-1", "fz.cap", False), ("fz-ready", "fz.ready", True)):
                await reg.register(
                    agent_id,
                    instance_id="i",
                    version=1,
                    ready=ready,
                    capabilities=[cap],
                    lease_ms=3_600_000,
                    evict_after_ms=7_200_000,
                )
        finally:
            await r.aclose()

    anyio.run(seed)
    return ns


# -- the tests ---------------------------------------------------------------------------
def test_every_command_is_fuzzed_or_skipped_with_a_reason() -> None:
    assert set(SKIP) <= set(COMMANDS), f"stale SKIP entries: {set(SKIP) - set(COMMANDS)}"
    assert set(NEVER) | set(ALWAYS) <= set(FUZZED)
    assert len(FUZZED) >= 15, sorted(FUZZED)  # the walk found the sub-commands too
    for path in FUZZED:
        assert COMMANDS[path].callback is not None or hasattr(COMMANDS[path], "commands")


def run_cli(args: list[str], env: dict[str, str]) -> None:
    # In a directory of its own: `reach init` / `reach redis` write a project file where
    # they run, which every later command (and test) started there would then find.
    with tempfile.TemporaryDirectory() as cwd, contextlib.chdir(cwd):
        res = runner.invoke(app, args, env=env)
    shown = f"reach {' '.join(map(repr, args))}\n{res.output[-2000:]}"
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise AssertionError(f"traceback: {shown}") from res.exception
    assert res.exit_code in (0, 1, 2), f"exit code {res.exit_code}: {shown}"
    assert "Traceback (most recent call last)" not in res.output, shown
    if res.exit_code == 2 and "error:" in res.stderr:
        errors = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
        assert len(errors) == 1, shown  # one error line


@pytest.mark.parametrize("path", FUZZED, ids=lambda p: " ".join(p) or "reach")
@given(data=st.data())
def test_fuzzed_command_lines_end_cleanly(
    path: tuple[str, ...], data: st.DataObject, fuzz_redis: RedisServer, seeded: str
) -> None:
    fresh = f"fz{uuid.uuid4().hex[:10]}"
    args = data.draw(argv(path, fuzz_redis.url, [fresh, fresh, seeded]), label="argv")
    # A command that ends up without --redis-url uses this one (never a default server).
    run_cli(args, env={"REACH_REDIS_URL": fuzz_redis.url, "REACH_NAMESPACE": fresh})


def test_numbers_out_of_range_are_usage_errors(fuzz_redis: RedisServer, seeded: str) -> None:
    """A few fixed cases the fuzzing may take long to draw."""
    url = ["--redis-url", fuzz_redis.url]
    for args in (
        ["events", "--count", "-1"],
        ["dlq", "list", "--limit", "0"],
        ["top", "--once", "--interval", "nan"],
        ["top", "--once", "--limit", "0"],
        ["send", "a.b", "1", "--timeout-s", "nan"],
        ["send", "a.b", "1", "--timeout-s", "-1"],
        ["send", "a.b", "1", "--priority", "urgent"],
        ["dlq", "show", "not-an-id"],
        ["events", "--count", str(10**30)],
        ["send", "fz.ready", "1" * 30, "-n", seeded],
        ["send", "fz.ready", '"\\ud800"', "-n", seeded],
        ["send", "fz.ready", "[" * 100_000, "-n", seeded],
    ):
        res = runner.invoke(
            app,
            [*args, *url],
            env={"REACH_REDIS_URL": fuzz_redis.url, "REACH_NAMESPACE": "fzfixed"},
        )
        assert res.exception is None or isinstance(res.exception, SystemExit), (args, res.exception)
        assert res.exit_code == 2, (args, res.output)
        assert "Traceback" not in res.output
