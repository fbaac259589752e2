"""Where the Redis is: one order for the CLI, ``reach.Agent`` / ``reach worker`` and
``reach.Client``.

1. the URL given in code or on the command line (``redis_url=...``, ``--redis-url``);
2. the ``REACH_REDIS_URL`` environment variable;
3. a project file, ``reach.toml`` or ``.reach/config``, in the current directory or the
   nearest parent that has one (``reach redis`` writes ``.reach/config``, ``reach init``
   writes ``reach.toml``); both are TOML with a top-level ``redis_url = "..."``;
4. otherwise a :class:`ConfigError` that says how to set one.

There is no default URL: a guessed ``localhost:6379`` may be someone else's Redis.
"""

from __future__ import annotations

import json
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ConfigError

ENV_URL = "REACH_REDIS_URL"
PROJECT_FILES = ("reach.toml", ".reach/config")  # per directory, in this order
URL_KEY = "redis_url"

NO_REDIS_HELP = (
    "pass --redis-url (redis_url=... in Python), set REACH_REDIS_URL, or run `reach redis` "
    "(a local Redis; it writes .reach/config) or `reach init --redis-url URL` (writes "
    "reach.toml) in the project's directory"
)


@dataclass(frozen=True)
class RedisLocation:
    """A Redis URL and where it was found (``--redis-url``, ``REACH_REDIS_URL``, a file)."""

    url: str
    source: str


def find_project_file(start: Path | None = None) -> Path | None:
    """The nearest project file that names a Redis URL, from ``start`` (default: the
    current directory) up to the file system's root; None when there is none."""
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        for name in PROJECT_FILES:
            f = d / name
            if f.is_file() and URL_KEY in read_project_file(f):
                return f
    return None


def read_project_file(path: Path) -> dict[str, Any]:
    """The settings of a project file (TOML); a file that is not TOML is a ConfigError."""
    try:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(
            f"{path} is not valid TOML ({e}); it should hold a line like "
            f'{URL_KEY} = "redis://127.0.0.1:6390/0".'
        ) from e
    except OSError as e:
        raise ConfigError(f"Cannot read {path}: {e}.") from e
    url = data.get(URL_KEY)
    if url is not None and (not isinstance(url, str) or not url.strip()):
        raise ConfigError(f"{path}: {URL_KEY} must be a non-empty string, not {url!r}.")
    return data


def locate_redis_url(explicit: str | None = None, *, start: Path | None = None) -> RedisLocation:
    """The Redis URL to use and where it came from, in the documented order; a
    :class:`ConfigError` saying how to set one when nothing names a Redis."""
    if explicit:
        return RedisLocation(explicit, "--redis-url")
    env = os.environ.get(ENV_URL, "").strip()
    if env:
        return RedisLocation(env, ENV_URL)
    f = find_project_file(start)
    if f is not None:
        return RedisLocation(str(read_project_file(f)[URL_KEY]).strip(), str(f))
    here = (start or Path.cwd()).resolve()
    raise ConfigError(
        f"No Redis configured: {NO_REDIS_HELP}. (No {' or '.join(PROJECT_FILES)} with "
        f"{URL_KEY} in {here} or any parent; reach never guesses localhost:6379, which "
        "may be someone else's Redis.)"
    )


def resolve_redis_url(explicit: str | None = None, *, start: Path | None = None) -> str:
    """The Redis URL to use: ``explicit``, else ``REACH_REDIS_URL``, else the nearest
    project file's ``redis_url``; else a :class:`ConfigError` saying how to set one."""
    return locate_redis_url(explicit, start=start).url


def write_project_url(url: str, path: Path) -> Path:
    """Set ``redis_url`` in the project file ``path`` (made with its directory if need be),
    keeping the file's other top-level settings. Returns ``path``."""
    data: dict[str, Any] = {}
    if path.is_file():
        try:
            data = read_project_file(path)
        except ConfigError:
            data = {}  # an unreadable file is replaced: it named no usable Redis anyway
    data[URL_KEY] = url
    lines = ["# reach project settings (see docs/cli.md, 'Which Redis')"]
    for k, v in data.items():
        if isinstance(v, (str, int, float, bool)):
            lines.append(f"{k} = {_toml_value(v)}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(path)
    return path


def _toml_value(v: str | float | bool) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    return json.dumps(v)  # a JSON string is a valid TOML basic string
