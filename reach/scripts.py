"""Load the Lua scripts of ``lua/`` and call them by SHA, recovering from NOSCRIPT.

The script cache of a Redis server is neither replicated nor kept across a restart, so
every call is ``EVALSHA`` and a NOSCRIPT reply loads the script (on every primary of a
cluster) and tries once more; :func:`run_pipeline` does the same for pipelined calls.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from redis import exceptions as rexc


def _lua_dir() -> Path:
    # In a wheel the scripts live in reach/_lua; in a source checkout in ../lua.
    packaged = Path(str(resources.files("reach"))) / "_lua"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parent.parent / "lua"


@dataclass(frozen=True, slots=True)
class Script:
    name: str
    source: str
    sha: str


@cache
def script(name: str) -> Script:
    """Return the script ``lua/<name>.lua`` with its SHA1."""
    path = _lua_dir() / f"{name}.lua"
    source = path.read_text(encoding="utf-8")
    return Script(name, source, hashlib.sha1(source.encode()).hexdigest())


def all_scripts() -> list[Script]:
    return [script(n) for n in sorted(p.stem for p in _lua_dir().glob("*.lua"))]


def is_data_error(exc: Any) -> bool:
    """True for a refusal caused by what is stored in Redis or passed in: a script's
    ``reach: bad ...`` or a key of the wrong type (WRONGTYPE). Retrying the same call
    cannot succeed. False for everything that passes (a busy, loading, read-only or
    out-of-memory server, a lost connection) and for anything that is not a refusal."""
    if not isinstance(exc, rexc.ResponseError):
        return False
    text = str(exc)
    return text.startswith(("reach: ", "WRONGTYPE")) or " reach: " in text


def _is_noscript(exc: BaseException) -> bool:
    return isinstance(exc, rexc.NoScriptError) or (
        isinstance(exc, rexc.ResponseError) and str(exc).startswith("NOSCRIPT")
    )


async def call(r: Any, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
    """Run script ``name`` on an asyncio client (standalone or cluster)."""
    s = script(name)
    try:
        return await r.evalsha(s.sha, len(keys), *keys, *args)
    except rexc.ResponseError as e:
        if not _is_noscript(e):
            raise
    await r.script_load(s.source)
    return await r.evalsha(s.sha, len(keys), *keys, *args)


def call_sync(r: Any, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
    """Run script ``name`` on a synchronous client (used by the heartbeat thread)."""
    s = script(name)
    try:
        return r.evalsha(s.sha, len(keys), *keys, *args)
    except rexc.ResponseError as e:
        if not _is_noscript(e):
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

    Errors come back in place, not raised. Commands refused with NOSCRIPT (a restarted or
    failed-over server) did not run: the scripts are loaded and just those are sent again,
    so nothing else runs twice.
    """
    if not ops:
        return []
    pipe = r.pipeline(transaction=False)
    for o in ops:
        pipe.execute_command(*o)
    results: list[Any] = await pipe.execute(raise_on_error=False)
    retry = [i for i, x in enumerate(results) if isinstance(x, Exception) and _is_noscript(x)]
    if retry:
        await load_all(r)
        pipe = r.pipeline(transaction=False)
        for i in retry:
            pipe.execute_command(*ops[i])
        again = await pipe.execute(raise_on_error=False)
        for i, x in zip(retry, again, strict=True):
            results[i] = x
    return results


async def load_all(r: Any) -> None:
    """Load every script into the server's cache (all primaries of a cluster)."""
    for s in all_scripts():
        await r.script_load(s.source)
