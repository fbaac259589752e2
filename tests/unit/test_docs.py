"""docs/ stays true to the code: docs/cli.md documents every `reach` command and each of its
options as the CLI defines them, and the documentation links of the README resolve."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer
from reach_cli.app import app
from typer.core import TyperArgument, TyperGroup, TyperOption

ROOT = Path(__file__).resolve().parents[2]
CLI_MD = ROOT / "docs" / "cli.md"
COMMON = {  # documented once, at the top
    "--redis-url",
    "--redis-url-file",
    "--redis-password-file",
    "--namespace",
    "--json",
    "--wide",
    "--help",
}


def _commands() -> list[tuple[str, object]]:
    out: list[tuple[str, object]] = []

    def walk(cmd: object, path: list[str]) -> None:
        if isinstance(cmd, TyperGroup):
            if path and any(not isinstance(p, TyperArgument) for p in cmd.params):
                out.append((" ".join(path), cmd))  # a group with options of its own
            for name in cmd.list_commands(None):  # type: ignore[arg-type]
                walk(cmd.get_command(None, name), [*path, name])  # type: ignore[arg-type]
        else:
            out.append((" ".join(path), cmd))

    walk(typer.main.get_command(app), [])
    return out


def _sections() -> dict[str, str]:
    text = CLI_MD.read_text()
    parts = re.split(r"^### `reach ([a-z -]+?)((?: [A-Z_\[\]]+)*)`$", text, flags=re.MULTILINE)
    # name -> the heading's arguments and the section's text
    return {parts[i].strip(): parts[i + 1] + parts[i + 2] for i in range(1, len(parts) - 2, 3)}


@pytest.mark.parametrize("name,cmd", _commands(), ids=lambda x: x if isinstance(x, str) else "")
def test_cli_md_documents_every_command_and_option(name: str, cmd: object) -> None:
    sections = _sections()
    assert name in sections, f"docs/cli.md has no section for `reach {name}`"
    body = sections[name]
    assert "```sh" in body, f"`reach {name}`: no example"
    for p in cmd.params:  # type: ignore[attr-defined]
        if isinstance(p, TyperOption) and p.opts[0] not in COMMON and not p.hidden:
            assert f"`{p.opts[0]}" in body, f"`reach {name}`: option {p.opts[0]} undocumented"
        if isinstance(p, TyperArgument):
            assert p.name.upper() in body, f"`reach {name}`: argument {p.name} undocumented"


def test_cli_md_documents_no_command_that_does_not_exist() -> None:
    names = {n for n, _ in _commands()} | {"agents", "dlq"}
    assert set(_sections()) <= names


def test_readme_and_docs_links_resolve() -> None:
    for md in [
        ROOT / "README.md",
        *sorted((ROOT / "docs").glob("*.md")),
        ROOT / "examples" / "README.md",
    ]:
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", md.read_text()):
            if "://" in target:
                continue
            assert (md.parent / target).exists(), f"{md.name}: broken link {target}"
