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
    "--tenant",
    "--registry-url",
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


# `pip install reach`, `pip install -q 'reach[web]'`: a hint naming the PyPI project `reach`
# (another project's package), not ours; `reach-fabric` or a path (`'.[web]'`) do not match
_FOREIGN_INSTALL = re.compile(r"pip install\s+(?:-\S+\s+)*['\"]?reach(?![\w.-])")


def test_no_install_hint_names_another_projects_package() -> None:
    import tomllib

    name = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["name"]
    assert name == "reach-fabric", name
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for top in ("reach", "cli"):
        files += [
            p
            for p in sorted((ROOT / top).rglob("*"))
            if p.suffix in {".py", ".html", ".js", ".md"} and p.is_file()
        ]
    wrong = [
        f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
        for p in files
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if _FOREIGN_INSTALL.search(line)
    ]
    assert not wrong, "install hints naming the PyPI project `reach`:\n" + "\n".join(wrong)
    hints = [
        line
        for p in files
        for line in p.read_text(encoding="utf-8").splitlines()
        if f"pip install '{name}[" in line
    ]
    assert hints, "the hints this test checks were not found: is the pattern stale?"


def test_installed_distribution_is_ours() -> None:
    """`importlib.metadata` finds this checkout under the new name, at reach's version."""
    from importlib import metadata

    import reach

    assert metadata.version("reach-fabric") == reach.__version__
    top = (metadata.distribution("reach-fabric").read_text("top_level.txt") or "").split()
    assert not top or "reach" in top


def test_protocol_md_states_what_the_code_does() -> None:
    """docs/protocol.md, which other implementations are written from, names the protocol
    version, every claim.lua and cancel.lua answer, and the bounds the runtime writes with,
    as the code has them."""
    from reach._emitting import MAX_ENTRY_CHUNKS
    from reach._sending.delivery import CLAIM_AT_SEND_LEASE_MS
    from reach._version import PROTOCOL_VERSION
    from reach.keys import KEY_SCHEME
    from reach.scripts.cancelling import CANCELS_MAXLEN
    from reach.scripts.codes import CancelCode, ClaimCode, StreamBound
    from reach.signing import MIN_SECRET_BYTES
    from reach.tasks import DLQ_MAXLEN, DLQ_RAW_MAX_BYTES, TASK_TTL_MS

    raw = (ROOT / "docs" / "protocol.md").read_text(encoding="utf-8")
    text = " ".join(raw.split())  # figures may be wrapped over lines
    assert (
        f"**protocol version {PROTOCOL_VERSION}** (envelope version 1, key scheme {KEY_SCHEME})"
        in text
    )
    rows = {line.split("|")[1].strip(): line for line in raw.splitlines() if line.startswith("| `")}
    answers = (
        "{1, fence}",
        "{2, reply, status, agent_id, msg_id}",
        "{3, owner}",
        "{4, ''}",
        "{5, runs, takeovers}",
    )
    for code, answer in zip(ClaimCode, answers, strict=True):
        assert answer in rows["`claim.lua`"] and answer.startswith("{" + str(int(code))), answer
    for answer in ("{1, status}", "{2, 'cancelled'}", "{0, status}", "{-1, ''}"):
        assert answer in rows["`cancel.lua`"], answer
    assert {int(c) for c in CancelCode} == {1, 2, 0, -1}
    for figure in (
        f"MAXLEN ~ {int(StreamBound.REPLIES)}",
        f"MAXLEN ~ {CANCELS_MAXLEN}",
        f"MAXLEN ~ {DLQ_MAXLEN}",
        f"the first {DLQ_RAW_MAX_BYTES} kept",
        f"PEXPIRE <stream> {TASK_TTL_MS}",
        f"{CLAIM_AT_SEND_LEASE_MS} ms",
        f"at most {MAX_ENTRY_CHUNKS} of them",
        f"At least {MIN_SECRET_BYTES} bytes",
    ):
        assert figure in text, figure
