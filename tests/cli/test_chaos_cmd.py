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
from reach_cli.tools.chaos.cli import main as harness_main
from reach_cli.tools.chaos.plan import ChaosConfig, DeployConfig
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


def test_each_scenario_gets_its_defaults_and_the_options_given() -> None:
    def cfg(*argv: str) -> ChaosConfig | DeployConfig:
        return config_from_args(build_parser().parse_args(list(argv)))

    # crash: the medium run by default, ChaosConfig's (the CI run) with --short.
    assert cfg() == ChaosConfig(messages=2000, workers=4, kills=6)
    assert cfg("--short") == ChaosConfig()
    assert cfg("--short", "--kills", "2") == ChaosConfig(kills=2)
    # rolling-deploy: DeployConfig's, or DeployConfig.short(); options given apply.
    assert cfg("--scenario", "rolling-deploy") == DeployConfig()
    assert cfg("--scenario", "rolling-deploy", "--short") == DeployConfig.short()
    got = cfg(
        "--scenario", "rolling-deploy", "--rounds", "5", "--workers", "2", "--seed", "9",
        "--deadline-s", "20", "40", "--lease-s", "2",
    )  # fmt: skip
    assert got == DeployConfig(rounds=5, workers=2, seed=9, deadline_s=(20.0, 40.0), lease_s=2.0)


def test_an_option_of_the_other_scenario_is_a_usage_error(
    handed: list[list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    for argv, flag in (
        (["--scenario", "rolling-deploy", "--messages", "10"], "--messages"),
        (["--scenario", "rolling-deploy", "--stops", "1"], "--stops"),
        (["--rounds", "3"], "--rounds"),
        (["--stream-share", "0.5"], "--stream-share"),
    ):
        with pytest.raises(SystemExit) as e:
            harness_main(argv, prog="reach chaos")
        assert e.value.code == 2
        assert flag in capsys.readouterr().err
    res = CliRunner().invoke(app, ["chaos", "--scenario", "no-such"])
    assert res.exit_code == 2 and not handed
