"""What every command shares: the options, the Redis connection, output helpers."""

from __future__ import annotations

import contextlib
import functools
import inspect
import io
import json
import math
import os
import re
import shutil
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, NoReturn, Optional, TypeVar, get_type_hints

import anyio
import msgspec
import typer
from redis import exceptions as rexc
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from reach.config import locate_redis_url
from reach.connection import AnyRedis, connect, redact, unreachable
from reach.errors import ConfigError, ReachError
from reach.planes import resolve_registry_url
from reach.tenants import Tenant, Tenants

RedisUrl = Annotated[
    str,
    typer.Option(
        "--redis-url",
        show_default=False,
        metavar="URL",
        help="Redis to use: redis://host:port/db, rediss://... (TLS), unix:///path, or "
        "redis+sentinel://host:port,host:port/service (Sentinel). Not given: "
        "REACH_REDIS_URL, else redis_url in reach.toml or .reach/config here or in a "
        "parent directory (`reach redis` and `reach init` write them); never a guess.",
    ),
]
RedisUrlFile = Annotated[
    Optional[Path],  # noqa: UP045
    typer.Option(
        "--redis-url-file",
        show_default=False,
        metavar="FILE",
        help="A file holding the Redis URL (instead of --redis-url: the URL, password "
        "included, stays out of the process list). Env: REACH_REDIS_URL_FILE.",
    ),
]
RedisPasswordFile = Annotated[
    Optional[Path],  # noqa: UP045
    typer.Option(
        "--redis-password-file",
        show_default=False,
        metavar="FILE",
        help="A file holding the Redis password, put into the URL in memory only (the URL "
        "then has none). Env: REACH_REDIS_PASSWORD_FILE.",
    ),
]
RegistryUrlOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--registry-url",
        envvar="REACH_REGISTRY_URL",
        show_envvar=True,
        show_default=False,
        metavar="URL",
        help="Redis of the namespace's control plane (registry, events, rate limits, "
        "quotas, audit trail, access rules) when it is not --redis-url's. Not given: "
        "registry_url in reach.toml, else --redis-url's. See docs/operations.md, The "
        "control plane apart.",
    ),
]
TenantOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--tenant",
        envvar="REACH_TENANT",
        show_envvar=True,
        show_default=False,
        metavar="ID",
        help="The tenant to work on: its Redis URL and namespace come from the tenant map "
        "([tenants.ID] in reach.toml here or in a parent; [tenants.default] for the rest), "
        "instead of --redis-url and --namespace. See docs/operations.md, Tenants on their "
        "own Redis.",
    ),
]
Namespace = Annotated[
    str,
    typer.Option(
        "--namespace",
        "-n",
        envvar="REACH_NAMESPACE",
        show_envvar=True,
        help="Namespace (tenant/environment) to look at.",
    ),
]
Json = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
Wide = Annotated[
    bool,
    typer.Option(
        "--wide",
        help="Every column, whole, however wide the lines get (else a table fits the "
        "terminal: long cells are cut with …, the least needed columns left out). "
        "Env: REACH_WIDE=1.",
    ),
]

DEFAULT_NS = "default"
DEFAULT_REDIS = ""  # not given: reach.config finds it (REACH_REDIS_URL, a project file)

# Piped output gets wide lines rather than folded columns.
console = Console(width=None if sys.stdout.isatty() else 200)
err_console = Console(stderr=True)

T = TypeVar("T")


def fail(message: object) -> NoReturn:
    """Print one ``error:`` line on stderr and exit with code 2."""
    err_console.print(
        f"[red]error:[/red] {escape(safe_text(message))}", highlight=False, soft_wrap=True
    )
    raise typer.Exit(2)


def warn(message: object) -> None:
    err_console.print(
        f"[yellow]warning:[/yellow] {escape(safe_text(message))}", highlight=False, soft_wrap=True
    )


def explain(exc: BaseException, url: str | None = None) -> str | None:
    """The one-line message for an error the user or the environment caused, or None.

    Covered: every :class:`ReachError`; every error from Redis or redis-py (refused
    credentials, a missing ACL permission, a DB index out of range, a server that does not
    speak the Redis protocol, an unreachable server, an error reply, a bad value for a
    command); OS errors (a file or port that cannot be used). Anything else is a bug in
    reach and keeps its traceback (None). An exception group is explained when every
    exception in it is.
    """
    if isinstance(exc, BaseExceptionGroup):
        parts = [explain(e, url) for e in exc.exceptions]
        if parts and all(parts):
            return "; ".join(dict.fromkeys(p for p in parts if p))
        return None
    at = f" at {redact(url)}" if url else ""
    if isinstance(exc, ReachError):
        if isinstance(exc.__cause__, rexc.AuthenticationError):
            return _bad_credentials(exc.__cause__, at)
        if _noperm(exc.__cause__):
            return _refused(exc.__cause__, at)  # type: ignore[arg-type]
        return str(exc)
    if isinstance(exc, (rexc.AuthenticationError, rexc.AuthenticationWrongNumberOfArgsError)):
        return _bad_credentials(exc, at)
    if _noperm(exc):
        return _refused(exc, at)
    if isinstance(exc, rexc.ResponseError) and "DB index is out of range" in str(exc):
        db = url.rsplit("/", 1)[-1] if url and url.count("/") >= 3 else "?"
        return (
            f"Redis{at} says: DB index is out of range (/{db}). The number at the end of "
            "--redis-url must be below the server's `databases` setting (16 by default); "
            "most setups use /0."
        )
    if isinstance(exc, rexc.InvalidResponse):
        return (
            f"The server{at} does not answer like a Redis server ({exc}). Check the host "
            "and port in --redis-url (Redis listens on 6379 by default; `reach redis` "
            "on 6390)."
        )
    if isinstance(exc, rexc.OutOfMemoryError):
        return (
            f"Redis{at} is out of memory and refused a write ({exc}): its used memory is over "
            "its maxmemory setting, and with maxmemory-policy noeviction it refuses writes "
            "(what it holds is kept). Free memory (reach dlq purge, delete keys you do not "
            "need), raise maxmemory (CONFIG SET maxmemory) or give Redis more memory."
        )
    if isinstance(exc, rexc.ReadOnlyError):
        return f"Redis{at} is a read-only replica ({exc}): point --redis-url at the master."
    if isinstance(exc, (rexc.ConnectionError, rexc.TimeoutError)):
        return str(unreachable(url, exc)) if url else f"Redis stopped answering: {exc}"
    if isinstance(exc, rexc.ResponseError):
        return f"Redis{at} answered with an error: {exc}"
    if isinstance(exc, rexc.DataError):
        return f"A value Redis cannot take: {exc}"
    if isinstance(exc, (rexc.RedisError, rexc.RedisClusterException)):
        return f"Redis{at}: {type(exc).__name__}: {exc}"
    if isinstance(exc, OSError):
        return str(exc) or type(exc).__name__
    return None


_SCRIPT_REFUSED = "The user executing the script can't"
_COMMAND = re.compile(r"permissions to run the '([^']+)' command")


def _noperm(exc: BaseException | None) -> bool:
    return isinstance(exc, rexc.NoPermissionError) or (
        isinstance(exc, rexc.ResponseError) and str(exc).startswith(_SCRIPT_REFUSED)
    )


def _refused(exc: BaseException, at: str) -> str:
    """One line for an ACL refusal: the command Redis names (or what it says), and the
    grant that fixes it."""
    text = str(exc)
    m = _COMMAND.search(text)
    if m:
        what = f"the command {m.group(1).upper()} ({text}; the grant: +{m.group(1)})"
    elif "key" in text and text.startswith(_SCRIPT_REFUSED):
        what = f"a key a reach script uses ({text}): a key outside the user's key patterns"
    elif "key" in text:
        what = f"a key ({text}): a key outside the user's key patterns, check --namespace"
    elif text.startswith(_SCRIPT_REFUSED):
        what = f"a command a reach script runs ({text}; ACL LOG names the command)"
    else:
        what = f"a command ({text})"
    return (
        f"Redis{at} refused {what}: the Redis user lacks an ACL permission reach needs. "
        "Fix: give the user the rules `reach acl --namespace NS --role agent|caller|operator` "
        "prints for its role (docs/security.md), or check the user with `reach doctor "
        "--acl-user USER`."
    )


def _bad_credentials(exc: BaseException, at: str) -> str:
    return (
        f"Redis{at} refused the credentials ({exc}). Check the user and password in "
        "--redis-url (redis://user:password@host:port/db)."
    )


def _interrupted(exc: BaseException) -> bool:
    if isinstance(exc, KeyboardInterrupt):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return exc.subgroup(KeyboardInterrupt) is not None
    return False


@contextlib.contextmanager
def cli_errors(url: str | None = None) -> Iterator[None]:
    """Turn what :func:`explain` covers into one ``error:`` line and exit code 2, and
    Ctrl-C into exit code 130 (128 + SIGINT, as shells report it). Typer's own exits and
    usage errors pass through; any other exception is a bug and keeps its traceback."""
    try:
        yield
    except (typer.Exit, typer.Abort, typer.TyperException):  # exits and usage errors
        raise
    except BrokenPipeError:
        # The reader went away (`reach events | head -1`): it has what it wanted. Later
        # writes (the interpreter's last flush) go nowhere instead of failing again.
        _quiet_stdout()
        raise typer.Exit(0) from None
    except BaseException as e:
        if _interrupted(e):
            raise typer.Exit(130) from None
        msg = explain(e, url) if isinstance(e, Exception) else None
        if msg is None:
            raise
        fail(msg)


def _quiet_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, io.UnsupportedOperation):  # no real stdout (tests)
        pass


def run(fn: Callable[..., Awaitable[T]], *args: Any, url: str | None = None) -> T:
    """Run an async command body under :func:`cli_errors` (``url`` for the messages)."""
    with cli_errors(url):
        return anyio.run(fn, *args)


def command(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Any]:
    """Decorator: a typer command written as an async function (errors as in :func:`run`;
    arguments checked by :func:`require_text`)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        require_text(kwargs)
        if "redis_url" in kwargs:
            kwargs["redis_url"] = find_redis(kwargs["redis_url"])
        return run(functools.partial(fn, *args, **kwargs), url=kwargs.get("redis_url"))

    return wrapper


def find_redis(given: str | None) -> str:
    """The Redis URL a command uses: ``--redis-url`` / ``REACH_REDIS_URL`` (``given``), else
    the nearest project file's (:mod:`reach.config`); none is one ``error:`` line, exit 2."""
    return find_redis_source(given)[0]


def find_redis_source(given: str | None) -> tuple[str, str]:
    """:func:`find_redis` and where the URL came from (an option, the variable, a file)."""
    url_file, password_file = _secret_files.get()
    with cli_errors():
        loc = locate_redis_url(given or None, url_file=url_file, password_file=password_file)
    return loc.url, loc.source


# --redis-url-file / --redis-password-file of the command running (set by the wrapper
# with_secret_file_options puts around it, read by find_redis_source)
_secret_files: ContextVar[tuple[Path | None, Path | None]] = ContextVar(
    "reach_secret_files", default=(None, None)
)


# --registry-url of the command running (reach.planes), read by open_control
_registry_url: ContextVar[str | None] = ContextVar("reach_registry_url", default=None)


def with_secret_file_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` (a command that takes ``--redis-url``) with ``--redis-url-file``,
    ``--redis-password-file`` (handed to :func:`find_redis_source`) and ``--registry-url``
    (to :func:`open_control`) after it; other commands unchanged."""
    sig = inspect.signature(fn)
    if "redis_url" not in sig.parameters or "redis_url_file" in sig.parameters:
        return fn
    hints = get_type_hints(fn, include_extras=True)
    if hints.get("redis_url") != RedisUrl:
        return fn  # not the shared option (reach init writes its URL down: no secrets there)
    params: list[inspect.Parameter] = []
    for p in sig.parameters.values():
        params.append(p.replace(annotation=hints.get(p.name, p.annotation)))
        if p.name == "redis_url":
            kind = inspect.Parameter.POSITIONAL_OR_KEYWORD  # typer passes keywords
            params.append(
                inspect.Parameter("redis_url_file", kind, default=None, annotation=RedisUrlFile)
            )
            params.append(
                inspect.Parameter(
                    "redis_password_file", kind, default=None, annotation=RedisPasswordFile
                )
            )
            if "registry_url" not in sig.parameters:  # reach worker has its own
                params.append(
                    inspect.Parameter(
                        "registry_url", kind, default=None, annotation=RegistryUrlOption
                    )
                )
            if "tenant" not in sig.parameters:  # a command with its own (reach worker's)
                params.append(
                    inspect.Parameter("tenant", kind, default=None, annotation=TenantOption)
                )

    @functools.wraps(fn)
    def wrapper(
        *args: Any,
        redis_url_file: Path | None = None,
        redis_password_file: Path | None = None,
        **kwargs: Any,
    ) -> Any:
        registry = (
            kwargs.pop("registry_url", None) if "registry_url" not in sig.parameters else None
        )
        if "tenant" not in sig.parameters:
            tenant = kwargs.pop("tenant", None)
            if tenant:
                apply_tenant(tenant, kwargs, url_file=redis_url_file)
        token = _secret_files.set((redis_url_file, redis_password_file))
        given = _registry_url.set(registry)
        try:
            return fn(*args, **kwargs)
        finally:
            _registry_url.reset(given)
            _secret_files.reset(token)

    wrapper.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    return wrapper


def tenant_location(tenant: str) -> Tenant:
    """The Redis URL and namespace of ``tenant`` in the project file's tenant map; no map
    or an unknown tenant is one ``error:`` line, exit 2."""
    with cli_errors():
        found = Tenants.load()
        if found is None:
            raise ConfigError(
                f"--tenant {tenant}: no tenant map here: add [tenants.{tenant}] (redis_url, "
                "namespace) to reach.toml in this directory or a parent."
            )
        return found.resolve(tenant)


def apply_tenant(tenant: str, kwargs: dict[str, Any], *, url_file: Path | None = None) -> None:
    """Put ``tenant``'s Redis URL and namespace into a command's arguments; a
    ``--redis-url`` or ``--namespace`` that says otherwise is an error (which one is meant?)."""
    t = tenant_location(tenant)
    if kwargs.get("redis_url") or url_file is not None:
        fail(f"Give --tenant {tenant} or --redis-url/--redis-url-file, not both.")
    kwargs["redis_url"] = t.redis_url
    if "namespace" in kwargs:
        if kwargs["namespace"] not in (DEFAULT_NS, t.namespace):
            fail(
                f"--tenant {tenant} is namespace {t.namespace!r}, but --namespace (or "
                f"REACH_NAMESPACE) says {kwargs['namespace']!r}: give one."
            )
        kwargs["namespace"] = t.namespace


def add_secret_file_options(app: typer.Typer) -> None:
    """Give every command of ``app`` (sub-apps included) that takes ``--redis-url`` the
    options ``--redis-url-file``, ``--redis-password-file`` and ``--tenant``."""
    for info in app.registered_commands:
        if info.callback is not None:
            info.callback = with_secret_file_options(info.callback)
    top = app.registered_callback  # a group's own command (`reach agents` lists)
    if top is not None and top.callback is not None:
        top.callback = with_secret_file_options(top.callback)
    for group in app.registered_groups:
        if group.typer_instance is not None:
            add_secret_file_options(group.typer_instance)


def require_text(params: dict[str, Any]) -> None:
    """Refuse (one ``error:`` line, exit 2) an argument that is not text: a command line
    can carry bytes that are not UTF-8 (Python keeps them as lone surrogates), which
    cannot go into a Redis key or a message."""
    for name, value in params.items():
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(v, str) and _unsurrogate(v) != v:
                flag = "--" + name.rstrip("_").replace("_", "-")
                fail(f"{flag} {safe_text(v)!r} is not valid UTF-8 text.")


async def open_redis(url: str) -> AnyRedis:
    return await connect(url)


def registry_url_for(data_url: str) -> str | None:
    """The control plane's Redis URL of the command running (``--registry-url``,
    ``REACH_REGISTRY_URL``, reach.toml's ``registry_url``) when apart from ``data_url``."""
    with cli_errors():
        return resolve_registry_url(_registry_url.get(), data_url=data_url)


async def open_control_apart(data_url: str) -> AnyRedis | None:
    """A connection to the control plane's own Redis, None when it is the data Redis's."""
    url = registry_url_for(data_url)
    return None if url is None else await connect(url)


async def open_control(data_url: str) -> AnyRedis:
    """A connection to the namespace's control plane (registry, limits, quotas, audit,
    access rules): its own Redis when one is named (:func:`registry_url_for`), else the
    data Redis at ``data_url``. The caller closes it."""
    return await connect(registry_url_for(data_url) or data_url)


# C0 and C1 control characters (escape sequences a terminal would act on) but newline and tab.
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_CONTROLS_ONELINE = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def safe_text(value: Any, *, oneline: bool = False) -> str:
    """``value`` as text that is safe to print whatever it holds: undecodable bytes and
    lone surrogates become U+FFFD, control characters (terminal escapes) become ``\\xNN``
    (``oneline``: newlines and tabs too). Values come from Redis, written by anyone."""
    if value is None:
        return ""
    if isinstance(value, (bytes, bytearray, memoryview)):
        s = bytes(value).decode("utf-8", "replace")
    else:
        try:
            s = value if isinstance(value, str) else str(value)
        except Exception:  # noqa: BLE001 - a value whose __str__ fails is still shown
            s = f"<{type(value).__name__}>"
    s = _unsurrogate(s)
    pattern = _CONTROLS_ONELINE if oneline else _CONTROLS
    return pattern.sub(lambda m: f"\\x{ord(m.group()):02x}", s)


def _unsurrogate(s: str) -> str:
    """``s`` with lone surrogates (bytes decoded with ``surrogateescape``, or garbage)
    replaced by U+FFFD, so it can be encoded as UTF-8."""
    try:
        s.encode("utf-8")
        return s
    except UnicodeEncodeError:
        pass
    try:
        raw = s.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raw = s.encode("utf-8", "surrogatepass")
    return raw.decode("utf-8", "replace")


MAX_JSON_DEPTH = 100  # deeper lists and maps are elided: every step below is recursive


def to_jsonable(obj: Any) -> Any:
    return _clean_json(msgspec.to_builtins(_cap_depth(obj), enc_hook=repr))


def _cap_depth(obj: Any, depth: int = 0) -> Any:
    """``obj`` with lists and maps nested deeper than :data:`MAX_JSON_DEPTH` replaced by a
    note (a stored result may be nested as deep as msgpack allows)."""
    if isinstance(obj, (list, tuple, dict)):
        if depth >= MAX_JSON_DEPTH:
            return f"<nested deeper than {MAX_JSON_DEPTH} levels: not shown>"
        if isinstance(obj, dict):
            return {k: _cap_depth(v, depth + 1) for k, v in obj.items()}
        return [_cap_depth(v, depth + 1) for v in obj]
    return obj


def _clean_json(obj: Any) -> Any:
    """Text that JSON can carry: lone surrogates replaced (``json.dumps`` would write them
    as ``\\udcxx`` escapes, which strict JSON readers refuse); non-finite floats as text."""
    if isinstance(obj, str):
        return _unsurrogate(obj)
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else repr(obj)
    if isinstance(obj, dict):
        return {_clean_json(k): _clean_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean_json(v) for v in obj]
    return obj


def json_line(obj: Any, *, indent: int | None = None) -> str:
    """``obj`` as JSON text, whatever values it holds."""
    return json.dumps(to_jsonable(obj), indent=indent, default=safe_text)


def print_json(obj: Any) -> None:
    sys.stdout.write(json_line(obj, indent=2) + "\n")


def readable(value: Any) -> str:
    """A value as a table shows it: a map as ``k=v, k=v``, a list as ``a, b``, nested ones
    in brackets, never a Python repr; everything else as :func:`safe_text`."""
    if isinstance(value, dict):
        return ", ".join(f"{readable(k)}={_nested(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple, set, frozenset)):
        return ", ".join(_nested(v) for v in value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    return safe_text(value)


def _nested(v: Any) -> str:
    if isinstance(v, dict):
        return "{" + readable(v) + "}"
    if isinstance(v, (list, tuple, set, frozenset)):
        return "[" + readable(v) + "]"
    return readable(v)


def cell(value: Any) -> Text:
    """A table cell: plain text (never rich markup: values come from Redis), safe to print;
    maps and lists as readable text (:func:`readable`)."""
    if isinstance(value, Text):
        return value
    return Text(readable(value))


# --wide of the command running (set by the wrapper add_wide_option puts around it)
_wide: ContextVar[bool] = ContextVar("reach_wide", default=False)
PIPED_WIDTH = 200  # piped output: wide lines rather than folded columns
CUT_AT_LEAST = 20  # a listing leaves optional columns out before it cuts one under this


def terminal_width() -> int:
    """The width tables fit: ``COLUMNS`` when set, else the terminal's, else (piped)
    :data:`PIPED_WIDTH`."""
    cols = os.environ.get("COLUMNS", "")
    if cols.isdigit() and 20 <= int(cols) <= 10_000:
        return int(cols)
    if sys.stdout.isatty():
        return shutil.get_terminal_size().columns
    return PIPED_WIDTH


def _natural(text: Text) -> int:
    return max((len(line) for line in text.plain.split("\n")), default=0)


def table(
    title: str | None,
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    *,
    optional: Sequence[str] = (),
    wrap: Sequence[str] = (),
) -> None:
    """The one table helper every listing uses. It fits the terminal
    (:func:`terminal_width`): the ``optional`` columns are left out, in that order, while
    fitting would cut a column under :data:`CUT_AT_LEAST` characters (a last line names
    them), then the widest cells are cut with
    ``…`` (never the first column's: it names the row; a two-column field/value table
    wraps instead; so do the ``wrap`` columns: their text is already cut to a length, with
    a note at its end). A terminal too narrow even for those gets lines wider than itself,
    not a cut first column. ``--wide`` (or REACH_WIDE=1): every column, every cell
    whole."""
    wide = _wide.get() or os.environ.get("REACH_WIDE") == "1"
    cells = [[cell(v) for v in row] for row in rows]
    natural = [
        max([len(c), *(_natural(r[i]) for r in cells if i < len(r))]) for i, c in enumerate(columns)
    ]
    width = terminal_width()

    def total(ix: Sequence[int]) -> int:  # the cells, their padding and the borders
        return sum(natural[i] + 3 for i in ix) + 1

    shown = list(range(len(columns)))
    hidden: list[str] = []

    def cramped(ix: Sequence[int]) -> bool:  # a column would be cut under 20 characters
        fit = _fit([natural[i] for i in ix], [len(columns[i]) for i in ix], width)
        return total(ix) > width and any(
            w < min(natural[i], CUT_AT_LEAST) for i, w in zip(ix, fit, strict=True)
        )

    if not wide:
        for name in optional:
            if not cramped(shown):
                break
            if name in columns:
                shown.remove(columns.index(name))
                hidden.append(name)
    t = Table(
        title=None if title is None else cell(title), header_style="bold", title_justify="left"
    )
    kv = len(shown) <= 2
    fitted = _fit([natural[i] for i in shown], [len(columns[i]) for i in shown], width)
    for i, w in zip(shown, fitted, strict=True):
        if wide or kv:
            t.add_column(columns[i], overflow="fold", no_wrap=wide)
        elif columns[i] in wrap:
            t.add_column(columns[i], overflow="fold", width=w)
        else:  # the widest are cut first: short ids and figures stay whole
            t.add_column(columns[i], overflow="ellipsis", no_wrap=True, width=w)
    for r in cells:
        t.add_row(*(r[i] if i < len(r) else Text("") for i in shown))
    # A terminal narrower than the columns' floors (the whole first column, each header)
    # gets lines wider than itself rather than a cut id: Rich would shrink every column.
    least = sum(fitted) + 3 * len(shown) + 1
    console.print(t, width=max(width, total(shown)) if wide else max(width, least))
    if hidden:
        console.print(
            Text(f"(not shown: {', '.join(hidden)}; --wide shows every column)", style="dim"),
            width=width,
        )


def _fit(natural: Sequence[int], headers: Sequence[int], width: int) -> list[int]:
    """Column widths that fit ``width`` (with 3 characters a column of padding and border,
    and 1 more): every column whose natural width is under a common cap keeps it, the
    wider ones are cut to the cap (never under their header, or 4; the first never)."""
    room = width - 3 * len(natural) - 1
    if sum(natural) <= room:
        return list(natural)
    floor = [min(n, max(h, 4)) for n, h in zip(natural, headers, strict=True)]
    floor[0] = natural[0]  # the first column names the row (an id): never cut
    lo, hi = 0, max(natural)
    while lo < hi:  # the largest cap whose widths fit
        cap = (lo + hi + 1) // 2
        if sum(max(f, min(n, cap)) for n, f in zip(natural, floor, strict=True)) <= room:
            lo = cap
        else:
            hi = cap - 1
    return [max(f, min(n, lo)) for n, f in zip(natural, floor, strict=True)]


def with_wide_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` (a command with ``--json``: a listing) with ``--wide`` after ``--json``, set
    for :func:`table` while it runs; other commands unchanged."""
    sig = inspect.signature(fn)
    if "json_" not in sig.parameters or "wide" in sig.parameters:
        return fn
    hints = get_type_hints(fn, include_extras=True)
    params = [
        p.replace(annotation=hints.get(p.name, p.annotation)) for p in sig.parameters.values()
    ]
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD  # typer passes keywords
    params.append(inspect.Parameter("wide", kind, default=False, annotation=Wide))

    @functools.wraps(fn)
    def wrapper(*args: Any, wide: bool = False, **kwargs: Any) -> Any:
        token = _wide.set(wide)
        try:
            return fn(*args, **kwargs)
        finally:
            _wide.reset(token)

    wrapper.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    return wrapper


def add_wide_option(app: typer.Typer, *, skip: frozenset[str] = frozenset()) -> None:
    """Give every listing of ``app`` (a command with ``--json``; sub-apps included)
    ``--wide``, but the commands named in ``skip``."""
    for info in app.registered_commands:
        if info.callback is not None and info.name not in skip:
            info.callback = with_wide_option(info.callback)
    top = app.registered_callback
    if top is not None and top.callback is not None:
        top.callback = with_wide_option(top.callback)
    for group in app.registered_groups:
        if group.typer_instance is not None:
            add_wide_option(group.typer_instance, skip=skip)


def print_traceback(text: str) -> None:
    """A stored traceback under a table, as Python printed it (safe to print: control
    characters escaped); nothing when there is none."""
    if not text:
        return
    sys.stdout.flush()
    console.print(Text("traceback:", style="bold"))
    console.print(Text(safe_text(text.rstrip("\n"))), soft_wrap=True, highlight=False)


def age(ms: Any, now_ms: int | None = None) -> str:
    """A short human age of an epoch-ms timestamp: '850ms', '12.3s', '4m', '2h'; '-' for
    none, '?' for a value that is not a timestamp (records are read from Redis)."""
    if not ms:
        return "-"
    if isinstance(ms, bool) or not isinstance(ms, (int, float)) or not math.isfinite(ms):
        return "?"
    if abs(ms) > 2**62:
        return "?"
    now = now_ms if now_ms is not None else time.time_ns() // 1_000_000
    d = max(0, now - int(ms))
    if d < 1000:
        return f"{d}ms"
    if d < 60_000:
        return f"{d / 1000:.1f}s"
    if d < 3_600_000:
        return f"{d // 60_000}m"
    return f"{d // 3_600_000}h"


class progress:  # used like a function: `with progress(n, "replayed") as step:`
    """Progress of a long operation, on stderr: a rich bar on a terminal, plain lines
    (``label n/total`` every ``every`` items and at the end) when piped; nothing for a
    single item. ``step()`` (or ``step(k)``) counts items done."""

    def __init__(self, total: int, label: str, *, every: int = 100) -> None:
        self.total, self.label, self.every = total, label, max(1, every)
        self.done = 0
        self._bar: Any = None
        self._task: Any = None

    def __enter__(self) -> Callable[..., None]:
        if self.total > 1 and err_console.is_terminal:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=err_console,
            )
            self._bar.__enter__()
            self._task = self._bar.add_task(self.label, total=self.total)
        return self.step

    def step(self, n: int = 1) -> None:
        before, self.done = self.done, self.done + n
        if self._bar is not None:
            self._bar.advance(self._task, n)
        elif self.total > 1 and (
            self.done // self.every > before // self.every or self.done == self.total
        ):
            sys.stderr.write(f"{self.label} {self.done}/{self.total}\n")
            sys.stderr.flush()

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.__exit__(None, None, None)
