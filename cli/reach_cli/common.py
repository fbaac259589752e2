"""What every command shares: the options, the Redis connection, output helpers."""

from __future__ import annotations

import functools
import json
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Annotated, Any, TypeVar

import anyio
import msgspec
import typer
from rich.console import Console
from rich.table import Table

from reach.connection import DEFAULT_URL, AnyRedis, connect
from reach.errors import ReachError

RedisUrl = Annotated[
    str,
    typer.Option(
        "--redis-url", envvar="REACH_REDIS_URL", show_envvar=True,
        help="Redis to use: redis://host:port/db, rediss://... (TLS), unix:///path, or "
        "redis+sentinel://host:port,host:port/service (Sentinel).",
    ),
]  # fmt: skip
Namespace = Annotated[
    str,
    typer.Option(
        "--namespace", "-n", envvar="REACH_NAMESPACE", show_envvar=True,
        help="Namespace (tenant/environment) to look at.",
    ),
]  # fmt: skip
Json = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]

DEFAULT_NS = "default"
DEFAULT_REDIS = DEFAULT_URL

# Piped output gets wide lines rather than folded columns.
console = Console(width=None if sys.stdout.isatty() else 200)
err_console = Console(stderr=True)

T = TypeVar("T")


def run(fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    """Run an async command body; a ReachError becomes one red line and exit code 2."""
    try:
        return anyio.run(fn, *args)
    except ReachError as e:
        err_console.print(f"[red]error:[/red] {e}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


def command(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Any]:
    """Decorator: a typer command written as an async function."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return run(functools.partial(fn, *args, **kwargs))

    return wrapper


async def open_redis(url: str) -> AnyRedis:
    return await connect(url)


def to_jsonable(obj: Any) -> Any:
    return msgspec.to_builtins(obj, enc_hook=repr)


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(to_jsonable(obj), indent=2, default=str) + "\n")


def table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """The one table helper every listing uses."""
    t = Table(title=title, header_style="bold", title_justify="left")
    for c in columns:
        t.add_column(c, overflow="fold")
    for row in rows:
        t.add_row(*("" if v is None else str(v) for v in row))
    console.print(t)


def age(ms: int, now_ms: int | None = None) -> str:
    """A short human age of an epoch-ms timestamp: '850ms', '12.3s', '4m', '2h'."""
    if not ms:
        return "-"
    now = now_ms if now_ms is not None else time.time_ns() // 1_000_000
    d = max(0, now - ms)
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
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                TimeElapsedColumn(), TimeRemainingColumn(), console=err_console,
            )  # fmt: skip
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
