"""The include step: every script is loaded with its ``--!include`` lines expanded, and
what Redis runs is that expanded text."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from reach import scripts
from reach.connection import AnyRedis
from reach.scripts import ScriptError, codes, expand

LUA = Path(__file__).resolve().parents[2] / "lua"
INCLUDES = LUA / "includes"
NAMES = scripts.names()


def _include_names() -> list[str]:
    return sorted(p.stem for p in INCLUDES.glob("*.lua"))


def test_the_scripts_are_the_lua_files_not_the_includes() -> None:
    assert NAMES == sorted(p.stem for p in LUA.glob("*.lua"))
    assert not set(NAMES) & set(_include_names())
    assert "codes" in _include_names()


@pytest.mark.parametrize("name", NAMES)
def test_every_script_expands_completely(name: str) -> None:
    s = scripts.script(name)
    assert not [line for line in s.source.splitlines() if line.startswith("--!")]
    assert s.source.startswith(f"-- {name}.lua: "), "the contract (header) stays on top"
    assert s.sha == hashlib.sha1(s.source.encode()).hexdigest()
    for inc in s.includes:
        text = codes.render_lua() if inc == "codes" else (INCLUDES / f"{inc}.lua").read_text()
        for part in re.split(r"^--!include .*\n", text, flags=re.MULTILINE):
            assert part in s.source, f"{name}: the text of {inc}.lua is not in it"
        assert s.source.count(text.splitlines()[0]) == 1, f"{name}: {inc}.lua twice"


def test_every_include_is_used_and_every_script_uses_one() -> None:
    used = {inc for n in NAMES for inc in scripts.script(n).includes}
    assert used == set(_include_names())
    assert all(scripts.script(n).includes for n in NAMES)


def test_the_codes_file_is_the_rendering_of_the_python_enums() -> None:
    assert (INCLUDES / "codes.lua").read_text() == codes.render_lua(), (
        f"lua/includes/codes.lua is out of date: {codes.REGENERATE}"
    )


def _expand_as_documented(name: str) -> str:
    """The rule docs/protocol.md gives loaders in other languages, from the files alone."""
    seen: set[str] = set()

    def walk(text: str) -> str:
        out = []
        for line in text.splitlines(keepends=True):
            m = re.match(r"--!include (\S+)\s*$", line)
            if not m:
                out.append(line)
            elif m.group(1) not in seen:
                seen.add(m.group(1))
                out.append(walk((INCLUDES / f"{m.group(1)}.lua").read_text()))
        return "".join(out)

    return walk((LUA / f"{name}.lua").read_text())


@pytest.mark.parametrize("name", NAMES)
def test_a_loader_following_the_protocol_doc_gets_the_same_sha(name: str) -> None:
    assert hashlib.sha1(_expand_as_documented(name).encode()).hexdigest() == (
        scripts.script(name).sha
    )


def test_nested_includes_are_expanded_once_each(tmp_path: Path) -> None:
    (tmp_path / "includes").mkdir()
    (tmp_path / "includes" / "a.lua").write_text("--!include b\nlocal A = B\n")
    (tmp_path / "includes" / "b.lua").write_text("local B = 1")  # no final newline
    (tmp_path / "includes" / "c.lua").write_text("--!include b\nlocal C = B\n")
    text, included = expand(
        "-- s.lua: x\n--!include c\n--!include a\n--!include c\nreturn A + C\n",
        origin="s.lua",
        lua_dir=tmp_path,
    )
    assert text == "-- s.lua: x\nlocal B = 1\nlocal C = B\nlocal A = B\nreturn A + C\n"
    assert included == ("c", "b", "a")


def test_an_include_cycle_ends(tmp_path: Path) -> None:
    (tmp_path / "includes").mkdir()
    (tmp_path / "includes" / "a.lua").write_text("--!include b\nlocal A = 1\n")
    (tmp_path / "includes" / "b.lua").write_text("--!include a\nlocal B = 2\n")
    text, included = expand("--!include a\n", origin="s.lua", lua_dir=tmp_path)
    assert (text, included) == ("local B = 2\nlocal A = 1\n", ("a", "b"))


def test_a_missing_include_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "includes").mkdir()
    (tmp_path / "includes" / "a.lua").write_text("--!include nowhere\n")
    with pytest.raises(ScriptError, match=r"includes/a\.lua line 1: include 'nowhere' not found"):
        expand("--!include a\n", origin="s.lua", lua_dir=tmp_path)
    with pytest.raises(ScriptError, match=r"s\.lua line 2: include 'gone' not found.*reinstall"):
        expand("-- s\n--!include gone\n", origin="s.lua", lua_dir=tmp_path)


@pytest.mark.parametrize("line", ["--!include", "--!include A", "--!includes x", "--!inc x y"])
def test_a_malformed_directive_is_an_error(tmp_path: Path, line: str) -> None:
    with pytest.raises(ScriptError, match="is not an include directive"):
        expand(f"-- s\n{line}\n", origin="s.lua", lua_dir=tmp_path)


def test_a_script_with_a_missing_include_fails_to_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "includes").mkdir()
    (tmp_path / "broken.lua").write_text("-- broken.lua: x\n--!include gone\nreturn 1\n")
    monkeypatch.setattr(scripts._loader, "_lua_dir", lambda: tmp_path)
    with pytest.raises(ScriptError, match=r"broken\.lua line 2: include 'gone' not found"):
        scripts.script.__wrapped__("broken")


@pytest.mark.anyio
async def test_redis_loads_every_expanded_script(r: AnyRedis) -> None:
    for s in scripts.all_scripts():
        assert await r.script_load(s.source) == s.sha, s.name


@pytest.mark.anyio
async def test_the_lua_codes_are_the_python_codes(r: AnyRedis) -> None:
    names = [f"{e.__name__}_{m.name}" for e in codes.CODES for m in e]
    table = ", ".join(f"{n} = {n}" for n in names)
    got = json.loads(await r.eval(f"{codes.render_lua()}return cjson.encode({{{table}}})", 0))
    assert got == {f"{e.__name__}_{m.name}": int(m) for e in codes.CODES for m in e}
    assert len(got) == len(names)  # no two members share a Lua name
