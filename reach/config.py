"""Where the Redis is: one order for the CLI, ``reach.Agent`` / ``reach worker`` and
``reach.Client``.

1. the URL given in code or on the command line (``redis_url=...``, ``--redis-url``), or
   a file holding it (``--redis-url-file``);
2. the ``REACH_REDIS_URL`` environment variable, or ``REACH_REDIS_URL_FILE`` naming a file
   holding it;
3. a project file, ``reach.toml`` or ``.reach/config``, in the current directory or the
   nearest parent that has one (``reach redis`` writes ``.reach/config``, ``reach init``
   writes ``reach.toml``); both are TOML with a top-level ``redis_url = "..."``;
4. otherwise a :class:`ConfigError` that says how to set one.

There is no default URL: a guessed ``localhost:6379`` may be someone else's Redis.

The password can stay out of the URL, out of the process list (``ps`` shows arguments) and
out of the environment: ``--redis-password-file`` / ``REACH_REDIS_PASSWORD_FILE`` name a
file holding it, and it is put into the URL in memory only (whatever step gave the URL).
Giving a URL both ways at one step (``--redis-url`` and ``--redis-url-file``) or a password
both in the URL and in a file is a :class:`ConfigError`: reach never picks one silently.
"""

from __future__ import annotations

import json
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlsplit, urlunsplit

from .errors import ConfigError

ENV_URL = "REACH_REDIS_URL"
ENV_URL_FILE = "REACH_REDIS_URL_FILE"
ENV_PASSWORD_FILE = "REACH_REDIS_PASSWORD_FILE"
PROJECT_FILES = ("reach.toml", ".reach/config")  # per directory, in this order
URL_KEY = "redis_url"

NO_REDIS_HELP = (
    "pass --redis-url or --redis-url-file (redis_url=... in Python), set REACH_REDIS_URL "
    "or REACH_REDIS_URL_FILE, or run `reach redis` "
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


def read_secret_file(path: str | os.PathLike[str]) -> str:
    """The text of a file holding a secret (a Redis URL, a password): UTF-8, the line end
    after it dropped. Errors name the file, never what it holds."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise ConfigError(f"Cannot read the secret file {p}: {e.strerror or e}.") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"The secret file {p} is not UTF-8 text.") from None
    text = text.rstrip("\r\n")
    if not text.strip():
        raise ConfigError(f"The secret file {p} is empty.")
    if "\n" in text or "\r" in text:
        raise ConfigError(
            f"The secret file {p} has more than one line: put the secret alone in it."
        )
    return text


def with_password(url: str, password: str, *, source: str = "the password file") -> str:
    """``url`` with ``password`` as its password (percent-encoded: any character may be in
    it). A URL that has another password already is a :class:`ConfigError` (which one is
    meant?); one that has this one is returned as it is."""
    parts = urlsplit(url)
    if "://" not in url or not parts.scheme:
        raise ConfigError("A password file needs a Redis URL like redis://host:port/0.")
    if parts.password is not None and unquote(parts.password) == password:
        return url  # given twice the same (a URL resolved once, resolved again)
    in_query = any(k == "password" for k, _ in parse_qsl(parts.query, keep_blank_values=True))
    if parts.password is not None or in_query:
        raise ConfigError(
            f"The Redis URL has a password already and {source} gives one too: keep one."
        )
    netloc = parts.netloc
    user, at, host = netloc.rpartition("@")
    if not at:
        user, host = "", netloc
    netloc = f"{user}:{quote(password, safe='')}@{host}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def locate_redis_url(
    explicit: str | None = None,
    *,
    start: Path | None = None,
    url_file: str | os.PathLike[str] | None = None,
    password_file: str | os.PathLike[str] | None = None,
) -> RedisLocation:
    """The Redis URL to use and where it came from, in the documented order; a
    :class:`ConfigError` saying how to set one when nothing names a Redis.

    ``url_file`` (``--redis-url-file``) ranks with ``explicit``; ``password_file``
    (``--redis-password-file``, else ``REACH_REDIS_PASSWORD_FILE``) is put into the URL
    found, whichever step found it."""
    loc = _locate(explicit, start, url_file)
    pw_file: str | os.PathLike[str] | None = password_file
    pw_source = "--redis-password-file"
    if not pw_file:
        pw_file = os.environ.get(ENV_PASSWORD_FILE, "").strip() or None
        pw_source = ENV_PASSWORD_FILE
    if pw_file:
        url = with_password(loc.url, read_secret_file(pw_file), source=pw_source)
        loc = RedisLocation(url, f"{loc.source}, password from {pw_source}")
    return loc


def _locate(
    explicit: str | None, start: Path | None, url_file: str | os.PathLike[str] | None
) -> RedisLocation:
    if explicit and url_file:
        raise ConfigError("Give --redis-url or --redis-url-file, not both.")
    if explicit:
        return RedisLocation(explicit, "--redis-url")
    if url_file:
        return RedisLocation(read_secret_file(url_file), "--redis-url-file")
    env = os.environ.get(ENV_URL, "").strip()
    env_file = os.environ.get(ENV_URL_FILE, "").strip()
    if env and env_file:
        raise ConfigError(f"Both {ENV_URL} and {ENV_URL_FILE} are set: unset one.")
    if env:
        return RedisLocation(env, ENV_URL)
    if env_file:
        return RedisLocation(read_secret_file(env_file), ENV_URL_FILE)
    f = find_project_file(start)
    if f is not None:
        return RedisLocation(str(read_project_file(f)[URL_KEY]).strip(), str(f))
    here = (start or Path.cwd()).resolve()
    raise ConfigError(
        f"No Redis configured: {NO_REDIS_HELP}. (No {' or '.join(PROJECT_FILES)} with "
        f"{URL_KEY} in {here} or any parent; reach never guesses localhost:6379, which "
        "may be someone else's Redis.)"
    )


def resolve_redis_url(
    explicit: str | None = None,
    *,
    start: Path | None = None,
    url_file: str | os.PathLike[str] | None = None,
    password_file: str | os.PathLike[str] | None = None,
) -> str:
    """The Redis URL to use: ``explicit`` (or ``url_file``'s), else ``REACH_REDIS_URL`` (or
    ``REACH_REDIS_URL_FILE``'s), else the nearest project file's ``redis_url``, with the
    password of ``password_file`` / ``REACH_REDIS_PASSWORD_FILE`` if one is given; else a
    :class:`ConfigError` saying how to set one."""
    return locate_redis_url(
        explicit, start=start, url_file=url_file, password_file=password_file
    ).url


def write_project_url(url: str, path: Path) -> Path:
    """Set ``redis_url`` in the project file ``path`` (made with its directory if need be),
    keeping the file's other settings, its tables (``[tenants.acme]``...) included.
    Returns ``path``."""
    data: dict[str, Any] = {}
    if path.is_file():
        try:
            data = read_project_file(path)
        except ConfigError:
            data = {}  # an unreadable file is replaced: it named no usable Redis anyway
    data[URL_KEY] = url
    lines = ["# reach project settings (see docs/cli.md, 'Which Redis')"]
    _toml_table(data, (), lines)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(path)
    return path


def _toml_table(table: dict[str, Any], where: tuple[str, ...], lines: list[str]) -> None:
    """``table``'s values as TOML lines: its plain values, then each table under it."""
    for k, v in table.items():
        if isinstance(v, (str, int, float, bool)):
            lines.append(f"{_toml_key(k)} = {_toml_value(v)}")
        elif isinstance(v, list) and all(isinstance(x, (str, int, float, bool)) for x in v):
            lines.append(f"{_toml_key(k)} = [{', '.join(_toml_value(x) for x in v)}]")
    for k, v in table.items():
        if isinstance(v, dict):
            here = (*where, k)
            lines.append("")
            lines.append(f"[{'.'.join(_toml_key(p) for p in here)}]")
            _toml_table(v, here, lines)


def _toml_key(k: str) -> str:
    bare = k and all(c.isascii() and (c.isalnum() or c in "-_") for c in k)
    return k if bare else json.dumps(k)


def _toml_value(v: str | float | bool) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    return json.dumps(v)  # a JSON string is a valid TOML basic string
