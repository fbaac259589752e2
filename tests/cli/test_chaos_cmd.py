"""`reach chaos` is a typer command like the others, over the harness's own parser.

Its options are the parser's (bench/chaos.py uses that parser as it is), with the same
defaults, and what it is given reaches the harness as the parser reads it.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from reach_cli import chaos_cmd
from reach_cli.app import app, command_line
from reach_cli.tools.chaos.cli import build_parser, config_from_args
from typer.testing import CliRunner


def parser_flags() -> set[str]:
    return {s for a in build_parser()._actions for s in a.option_strings}


def test_the_options_are_the_harness_parsers() -> None:
    cmd = command_line().commands["chaos"]
    flags = {s for p in cmd.params for s in getattr(p, "opts", [])} | {"--help", "-h"}
    assert flags == parser_flags()


@pytest.fixture
def handed(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """What the command hands the harness's entry point (the run itself: tests/chaos)."""
    calls: list[list[str]] = []

    def fake_main(argv: Sequence[str], prog: str | None = None) -> int:
        assert prog == "reach chaos"
        calls.append(list(argv))
        return 0

    monkeypatch.setattr(chaos_cmd, "chaos_main", fake_main)
    return calls


def test_defaults_and_given_options_reach_the_harness(handed: list[list[str]]) -> None:
    runner = CliRunner()
    res = runner.invoke(app, ["chaos"])
    assert res.exit_code == 0, res.output
    defaults = config_from_args(build_parser().parse_args([]))
    assert config_from_args(build_parser().parse_args(handed[-1])) == defaults
    args = [
        "--messages", "80", "--workers", "2", "--kills", "1", "--deadline-s", "1.5", "4",
        "--dir", "/tmp/x", "--keep", "--json", "--agent", "m:f", "--rate", "12.5",
    ]  # fmt: skip
    res = runner.invoke(app, ["chaos", *args])
    assert res.exit_code == 0, res.output
    got = build_parser().parse_args(handed[-1])
    assert got == build_parser().parse_args(args)
    assert got.deadline_s == [1.5, 4.0] and got.keep and got.json and got.dir == "/tmp/x"


def test_a_bad_option_is_a_usage_error(handed: list[list[str]]) -> None:
    res = CliRunner().invoke(app, ["chaos", "--workers", "many"])
    assert res.exit_code == 2 and "--workers" in res.output and not handed
    res = CliRunner().invoke(app, ["chaos", "--no-such-option"])
    assert res.exit_code == 2 and not handed
