"""Help shows real placeholders: `--cap CAP`, `AGENT_ID`, flags with none; never a type
name (`<bool>`, `<str>`, `<list[str]>`) or a `{name}` (what `reach` prints, through main)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from reach_cli.app import command_line
from typer.core import TyperGroup

# argparse-based commands keep their own help (reach bench-scaling)
OWN_HELP = {"bench-scaling"}


def _paths() -> list[list[str]]:
    out: list[list[str]] = []

    def walk(cmd: object, path: list[str]) -> None:
        out.append(path)
        if isinstance(cmd, TyperGroup):
            for name, sub in cmd.commands.items():
                if name not in OWN_HELP:
                    walk(sub, [*path, name])

    walk(command_line(), [])
    return out


@pytest.mark.parametrize("path", _paths(), ids=lambda p: " ".join(p) or "reach")
def test_help_has_real_placeholders(path: list[str]) -> None:
    p = subprocess.run(
        [sys.executable, "-m", "reach_cli.app", *path, "--help"],
        env={**os.environ, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert p.returncode == 0, p.stderr
    text = p.stdout
    for bad in re.findall(r"<[a-z][a-z_\[\], ]*>", text):
        pytest.fail(f"reach {' '.join(path)} --help shows {bad}:\n{text}")
    usage = next(ln for ln in text.splitlines() if "Usage:" in ln)
    assert "{" not in usage, usage
