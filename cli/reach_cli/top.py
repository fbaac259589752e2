"""``reach top``: a live view of a namespace (capabilities, agents, rates, dead letters).

What it shows, and how each figure is read from Redis (nothing is added to the message
path for it), is :mod:`reach.overview`; this module renders it.

``reach top`` refreshes in place until ``q`` or Ctrl-C; ``--once`` prints one frame (two
samples ``--interval`` apart, for the rates; ``--interval 0`` for a single sample) and
exits; ``--json`` prints the frame's data as JSON instead (one line per refresh when live).
"""

from __future__ import annotations

import contextlib
import math
import os
import select
import sys
import time
from typing import Annotated, Any, Self

import anyio
import typer
from redis import exceptions as rexc
from rich.console import Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from reach.connection import AnyRedis, redact
from reach.errors import ReachError
from reach.keys import PRIORITIES
from reach.overview import Sample, collect, frame_data
from reach.overview import empty_sample as _empty

from .common import (
    DEFAULT_NS,
    DEFAULT_REDIS,
    Json,
    Namespace,
    RedisUrl,
    age,
    cell,
    cli_errors,
    console,
    fail,
    find_redis,
    json_line,
    open_control_apart,
    require_text,
    safe_text,
)
from .common import open_redis as _open_redis

__all__ = ["Sample", "collect", "frame_data", "render", "top"]

SORTS = ("id", "queue", "inflight", "rate")


def _fmt_rate(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}"


_STATE_STYLE = {
    "active": "green",
    "routable": "green",
    "starting": "cyan",
    "draining": "yellow",
    "probation": "yellow",
    "evicted": "red",
}


def _sort_key(sort: str) -> Any:
    if sort == "queue":
        return lambda x: (-sum(x["queue"].values()), x["agent_id"])
    if sort == "inflight":
        return lambda x: (-x["inflight"], x["agent_id"])
    if sort == "rate":
        return lambda x: (-(x["in_per_s"] or 0.0), x["agent_id"])
    return lambda x: x["agent_id"]


def _number(v: Any) -> str:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return f"{v:g}"
    return safe_text(v)


def render(
    data: dict[str, Any],
    *,
    url: str = "",
    limit: int = 50,
    sort: str = "id",
    live: bool = False,
    error: str = "",
) -> Group:
    """One frame: a header line, capabilities, agents."""
    t = data["totals"]
    when = time.strftime("%H:%M:%S", time.localtime(data["ts_ms"] / 1000))
    states = "  ".join(f"{n} {s}" for s, n in sorted(t["agents"].items())) or "no agents"
    if t.get("routing"):
        states += (
            " (" + ", ".join(f"{n} {s}" for s, n in sorted(t["routing"].items()) if s != "-") + ")"
        )
    head = Text.assemble(
        ("reach top", "bold"),
        f"  ns={safe_text(data['namespace'], oneline=True)}",
        f"  {redact(url)}" if url else "",
        f"  {when}\n",
        f"agents: {states}   in {_fmt_rate(t['in_per_s'])}/s   "
        f"taken {_fmt_rate(t['taken_per_s'])}/s   queued {t['queued']}   "
        f"in-flight {t['inflight']}   dead letters {t['dead_letters']}",
    )
    parts: list[Any] = [head]
    if error:
        parts.append(Text(f"refresh failed: {error}", style="red"))

    # Every cell is a Text (never rich markup): names and ids come from Redis.
    ct = Table(title="capabilities", title_justify="left", header_style="bold", expand=False)
    for c in ("capability", "agents", "routable", "queued", "in-flight", "dead letters", "dead/s"):
        ct.add_column(c, justify="left" if c == "capability" else "right")
    for c in data["capabilities"]:
        ct.add_row(
            cell(c["capability"]),
            cell(c["agents"]),
            cell(c["routable"]),
            cell(c["queued"]),
            cell(c["inflight"]),
            Text(str(c["dead_letters"]), style="red" if c["dead_letters"] else ""),
            _fmt_rate(c["dead_per_s"]),
        )
    parts.append(ct)

    at = Table(title="agents", title_justify="left", header_style="bold", expand=False)
    cols = (
        "agent",
        "state",
        "routing",
        "weight",
        "in-flight",
        *PRIORITIES,
        "pending",
        "in/s",
        "taken/s",
        "lease age",
        "capabilities",
    )
    for c in cols:
        at.add_column(
            c,
            justify="left" if c in ("agent", "state", "routing", "capabilities") else "right",
            overflow="fold",
        )
    rows = sorted(data["agents"], key=_sort_key(sort))
    for x in rows[:limit]:
        lease = (
            "-"
            if x["lease_age_ms"] is None
            else age(data["ts_ms"] - x["lease_age_ms"], data["ts_ms"])
        )
        at.add_row(
            cell(x["agent_id"]),
            Text(safe_text(x["state"]), style=_STATE_STYLE.get(x["state"], "")),
            Text(safe_text(x["routing"]), style=_STATE_STYLE.get(x["routing"], "")),
            _number(x["weight"]),
            cell(x["inflight"]),
            *(cell(x["queue"].get(p, 0)) for p in PRIORITIES),
            cell(x["pending"]),
            _fmt_rate(x["in_per_s"]),
            _fmt_rate(x["taken_per_s"]),
            lease,
            cell(x["capabilities"]),
        )
    parts.append(at)
    if len(rows) > limit:
        parts.append(
            Text(f"... and {len(rows) - limit} more agents (--limit, --sort)", style="dim")
        )
    if live:
        parts.append(Text("q or Ctrl-C to quit", style="dim"))
    return Group(*parts)


class _Keyboard:
    """Single key presses from a terminal's stdin (cbreak mode, restored on exit)."""

    def __init__(self) -> None:
        self.fd: int | None = None
        self._old: Any = None

    def __enter__(self) -> Self:
        try:
            import termios
            import tty

            if sys.stdin.isatty():
                fd = sys.stdin.fileno()
                self._old = termios.tcgetattr(fd)
                tty.setcbreak(fd)
                self.fd = fd
        except (ImportError, OSError, ValueError):  # no tty / not POSIX: Ctrl-C only
            self.fd = None
        return self

    def read(self) -> str:
        if self.fd is None:
            return ""
        ready, _, _ = select.select([self.fd], [], [], 0)
        return os.read(self.fd, 64).decode(errors="ignore") if ready else ""

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            import termios

            termios.tcsetattr(self.fd, termios.TCSADRAIN, self._old)


async def _sample(r: AnyRedis, namespace: str, control: AnyRedis | None = None) -> Sample:
    try:
        return await collect(r, namespace, control=control)
    except (rexc.ConnectionError, rexc.TimeoutError, OSError) as e:
        raise ReachError(f"Redis stopped answering: {e}") from e


async def _once(
    url: str, namespace: str, interval: float, as_json: bool, limit: int, sort: str
) -> None:
    r = await _open_redis(url)
    control = await open_control_apart(url)  # the registry's Redis, when apart
    try:
        prev = None
        if interval > 0:
            prev = await _sample(r, namespace, control)
            await anyio.sleep(interval)
        cur = await _sample(r, namespace, control)
    finally:
        await r.aclose()
        if control is not None:
            await control.aclose()
    data = frame_data(cur, prev, namespace)
    if as_json:
        sys.stdout.write(json_line(data) + "\n")
    else:
        console.print(render(data, url=url, limit=limit, sort=sort))


async def _loop(
    url: str, namespace: str, interval: float, as_json: bool, limit: int, sort: str
) -> None:
    r = await _open_redis(url)
    control = await open_control_apart(url)  # the registry's Redis, when apart
    prev: Sample | None = None
    batch = as_json or not console.is_terminal  # piped: frames one after another (like top -b)
    try:
        with _Keyboard() as kb, contextlib.ExitStack() as stack:
            live = None
            if not batch:
                live = stack.enter_context(
                    Live(console=console, auto_refresh=False, vertical_overflow="crop")
                )
            last: dict[str, Any] | None = None
            while True:
                error = ""
                try:
                    cur = await collect(r, namespace, control=control)
                    last = frame_data(cur, prev, namespace)
                    prev = cur
                except (rexc.RedisError, OSError) as e:
                    error = str(e) or type(e).__name__
                if as_json:
                    if last is not None and not error:
                        sys.stdout.write(json_line(last) + "\n")
                        sys.stdout.flush()
                elif last is not None or error:
                    frame = render(
                        last or frame_data(_empty(), None, namespace),
                        url=url,
                        limit=limit,
                        sort=sort,
                        live=live is not None,
                        error=error,
                    )
                    if live is not None:
                        live.update(frame, refresh=True)
                    else:
                        console.print(frame)
                end = time.monotonic() + interval
                while time.monotonic() < end:
                    if "q" in kb.read().lower():
                        return
                    await anyio.sleep(min(0.05, max(0.0, end - time.monotonic())))
    finally:
        with anyio.CancelScope(shield=True):
            await r.aclose()
            if control is not None:
                await control.aclose()


def top(
    once: Annotated[bool, typer.Option("--once", help="Print one frame and exit.")] = False,
    interval: Annotated[
        float, typer.Option("--interval", "-i", min=0.0, help="Seconds between refreshes.")
    ] = 1.0,
    limit: Annotated[int, typer.Option("--limit", min=1, help="At most this many agents.")] = 50,
    sort: Annotated[
        str, typer.Option("--sort", help="Agents by: id, queue, inflight, rate.")
    ] = "id",
    redis_url: RedisUrl = DEFAULT_REDIS,
    namespace: Namespace = DEFAULT_NS,
    json_: Json = False,
) -> None:
    """A live view of capabilities, agents, message rates and dead letters (q to quit).

    Examples: reach top;  reach top --once;  reach top --once --json --interval 0
    """
    require_text({"sort": sort, "redis_url": redis_url, "namespace": namespace})
    if sort not in SORTS:
        fail(f"--sort takes one of {', '.join(SORTS)}, not {sort!r}")
    if not once and interval <= 0:
        fail("--interval must be > 0 for the live view")
    if not math.isfinite(interval) or interval > 86_400:
        fail(f"--interval must be a number of seconds up to 86400, not {interval}")
    redis_url = find_redis(redis_url)
    fn = _once if once else _loop
    # Ctrl-C ends the live view, as it interrupts any command: exit code 130.
    with cli_errors(redis_url):
        anyio.run(fn, redis_url, namespace, interval, json_, limit, sort)
