"""Load the Lua scripts of ``lua/`` and call them by SHA, recovering from NOSCRIPT.

A script is read with its includes expanded: a line ``--!include <name>`` is replaced by
the text of ``lua/includes/<name>.lua`` (itself expanded the same way), each include at
most once per script, so snippets that several scripts share (argument checks, the server
time, the fence check...) are written once. ``codes`` is rendered from
:mod:`reach.scripts.codes`. The SHA is that of the expanded text, which is what Redis runs.

The script cache of a Redis server is neither replicated nor kept across a restart, so
every call is ``EVALSHA`` and a NOSCRIPT reply loads the script (on every primary of a
cluster) and tries once more; :func:`run_pipeline` does the same for pipelined calls.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from redis import exceptions as rexc

from ..errors import ReachError
from . import codes

INCLUDE_RE = re.compile(r"^--!include ([a-z][a-z0-9_]*)[ \t]*$")
_DIRECTIVE = "--!"


class ScriptError(ReachError):
    """A Lua script of reach cannot be loaded (a missing or malformed include): the
    installation is broken. Reinstall reach, or restore ``lua/`` in a source checkout."""


def _lua_dir() -> Path:
    # In a wheel the scripts live in reach/_lua; in a source checkout in ../lua.
    packaged = Path(str(resources.files("reach"))) / "_lua"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[2] / "lua"


@dataclass(frozen=True, slots=True)
class Script:
    """A script as Redis runs it: ``source`` with its includes expanded, ``sha`` its SHA1."""

    name: str
    source: str
    sha: str
    includes: tuple[str, ...] = ()
    """The includes expanded into it, in the order they first appear."""


def _include_text(name: str, lua_dir: Path) -> str | None:
    if name == "codes":
        return codes.render_lua()
    path = lua_dir / "includes" / f"{name}.lua"
    return path.read_text(encoding="utf-8") if path.is_file() else None


def expand(text: str, *, origin: str, lua_dir: Path | None = None) -> tuple[str, tuple[str, ...]]:
    """``text`` with every ``--!include <name>`` line replaced by that include (expanded
    in turn; an include already expanded into this text is left out the next time).

    Returns the text and the names of the includes it holds. Raises :class:`ScriptError`
    for an include that does not exist or a ``--!`` line that is not an include.
    """
    where = lua_dir or _lua_dir()
    done: list[str] = []

    def walk(text: str, origin: str) -> str:
        out: list[str] = []
        for number, line in enumerate(text.splitlines(keepends=True), 1):
            if not line.startswith(_DIRECTIVE):
                out.append(line)
                continue
            m = INCLUDE_RE.match(line.rstrip("\r\n"))
            if m is None:
                raise ScriptError(
                    f"{origin} line {number}: {line.strip()!r} is not an include directive "
                    "(want '--!include <name>', a name of [a-z0-9_])."
                )
            name = m.group(1)
            if name in done:
                continue
            included = _include_text(name, where)
            if included is None:
                raise ScriptError(
                    f"{origin} line {number}: include {name!r} not found: no "
                    f"{where / 'includes' / (name + '.lua')}. The installation of reach is "
                    "incomplete: reinstall it (or restore lua/includes/ in a checkout)."
                )
            done.append(name)
            expanded = walk(included, f"includes/{name}.lua")
            out.append(expanded if expanded.endswith("\n") else expanded + "\n")
        return "".join(out)

    return walk(text, origin), tuple(done)


@cache
def script(name: str) -> Script:
    """Return the script ``lua/<name>.lua``, includes expanded, with its SHA1."""
    lua_dir = _lua_dir()
    path = lua_dir / f"{name}.lua"
    source, included = expand(
        path.read_text(encoding="utf-8"), origin=f"{name}.lua", lua_dir=lua_dir
    )
    return Script(name, source, hashlib.sha1(source.encode()).hexdigest(), included)


def names() -> list[str]:
    """The names of the scripts (``lua/*.lua``; the includes are not scripts)."""
    return sorted(p.stem for p in _lua_dir().glob("*.lua"))


def all_scripts() -> list[Script]:
    return [script(n) for n in names()]


def is_data_error(exc: Any) -> bool:
    """True for a refusal caused by what is stored in Redis or passed in: a script's
    ``reach: bad ...`` or a key of the wrong type (WRONGTYPE). Retrying the same call
    cannot succeed. False for everything that passes (a busy, loading, read-only or
    out-of-memory server, a lost connection) and for anything that is not a refusal."""
    if not isinstance(exc, rexc.ResponseError):
        return False
    text = str(exc)
    return text.startswith(("reach: ", "WRONGTYPE")) or " reach: " in text


def is_noscript(exc: BaseException) -> bool:
    """True for a NOSCRIPT refusal: the script is not in the server's cache (it did not run)."""
    return isinstance(exc, rexc.NoScriptError) or (
        isinstance(exc, rexc.ResponseError) and str(exc).startswith("NOSCRIPT")
    )


async def call(r: Any, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
    """Run script ``name`` on an asyncio client (standalone or cluster)."""
    s = script(name)
    try:
        return await r.evalsha(s.sha, len(keys), *keys, *args)
    except rexc.ResponseError as e:
        if not is_noscript(e):
            raise
    await r.script_load(s.source)
    return await r.evalsha(s.sha, len(keys), *keys, *args)


def call_sync(r: Any, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
    """Run script ``name`` on a synchronous client (used by the heartbeat thread)."""
    s = script(name)
    try:
        return r.evalsha(s.sha, len(keys), *keys, *args)
    except rexc.ResponseError as e:
        if not is_noscript(e):
            raise
    r.script_load(s.source)
    return r.evalsha(s.sha, len(keys), *keys, *args)


Op = tuple[Any, ...]
"""One pipelined command: its words, as for ``execute_command`` (e.g. ``("XACK", k, g, id)``)."""


def op(name: str, keys: Sequence[str], args: Sequence[Any]) -> Op:
    """The pipelined form of a call to script ``name``."""
    return ("EVALSHA", script(name).sha, len(keys), *keys, *args)


async def run_pipeline(r: Any, ops: Sequence[Op]) -> list[Any]:
    """Send ``ops`` in one pipeline (one round trip per node) and return their replies.

    Errors come back in place, not raised: a caller that deletes anything after these
    writes checks them first (:func:`run_checked` raises the first). Commands refused with NOSCRIPT (a restarted or
    failed-over server) did not run: the scripts are loaded and just those are sent again,
    so nothing else runs twice.
    """
    if not ops:
        return []
    pipe = r.pipeline(transaction=False)
    for o in ops:
        pipe.execute_command(*o)
    results: list[Any] = await pipe.execute(raise_on_error=False)
    retry = [i for i, x in enumerate(results) if isinstance(x, Exception) and is_noscript(x)]
    if retry:
        await load_all(r)
        pipe = r.pipeline(transaction=False)
        for i in retry:
            pipe.execute_command(*ops[i])
        again = await pipe.execute(raise_on_error=False)
        for i, x in zip(retry, again, strict=True):
            results[i] = x
    return results


def first_error(replies: Sequence[Any]) -> Exception | None:
    """The first error among pipeline ``replies`` (None when every command succeeded)."""
    return next((x for x in replies if isinstance(x, Exception)), None)


async def run_checked(r: Any, ops: Sequence[Op]) -> list[Any]:
    """:func:`run_pipeline`, then the first error reply raised (a refused write is a
    failed write: ``OutOfMemoryError`` from a full Redis, ``WRONGTYPE``...). For a step
    that must not go on when any of ``ops`` failed, e.g. deleting a message after writing
    it somewhere new: a move is both steps or the source stays."""
    replies = await run_pipeline(r, ops)
    err = first_error(replies)
    if err is not None:
        raise err
    return replies


async def load_all(r: Any) -> None:
    """Load every script into the server's cache (all primaries of a cluster)."""
    for s in all_scripts():
        await r.script_load(s.source)
