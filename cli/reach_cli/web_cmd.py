"""``reach web``: serve the operator console (the work is in ``reach.web``, an extra)."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from reach.errors import ConfigError

from .common import (
    DEFAULT_NS,
    DEFAULT_REDIS,
    Namespace,
    RedisUrl,
    command,
    err_console,
    registry_url_for,
)

TOKEN_ENV = "REACH_WEB_TOKEN"
MIN_TOKEN_CHARS = 16


def read_token(token_file: Path | None) -> str | None:
    """The token: the file's first line, else ``REACH_WEB_TOKEN``, else None."""
    if token_file is not None:
        try:
            token = token_file.read_text().strip()
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"--token-file {token_file}: cannot read it ({e}).") from e
        if not token:
            raise ConfigError(f"--token-file {token_file} is empty: write the token in it.")
    else:
        token = os.environ.get(TOKEN_ENV, "").strip()
    if token and len(token) < MIN_TOKEN_CHARS:
        raise ConfigError(
            f"The console's token has {len(token)} characters: use at least "
            f"{MIN_TOKEN_CHARS} (e.g. `openssl rand -hex 24`)."
        )
    return token or None


@command
async def web(
    port: Annotated[
        int, typer.Option("--port", min=0, max=65535, help="TCP port (0: any free port).")
    ] = 8090,
    host: Annotated[
        str,
        typer.Option(
            "--host",
            help="Address to listen on. Anything but a loopback address needs a token.",
        ),
    ] = "127.0.0.1",
    token_file: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(
            "--token-file",
            metavar="FILE",
            help=f"A file holding the token every request must carry (else {TOKEN_ENV}). "
            "Browsers sign in with it once; scripts send Authorization: Bearer TOKEN.",
        ),
    ] = None,
    read_only: Annotated[
        bool,
        typer.Option(
            "--read-only", help="Show everything, change nothing (no replay, purge or drain)."
        ),
    ] = False,
    interval: Annotated[
        float, typer.Option("--interval", "-i", help="Seconds between readings of the namespace.")
    ] = 1.0,
    window_s: Annotated[
        float, typer.Option("--window-s", help="Seconds of history the charts show.")
    ] = 600.0,
    max_body_bytes: Annotated[
        int, typer.Option(min=1024, help="Largest request body (a form) taken; 413 past it.")
    ] = 65_536,
    max_connections: Annotated[
        int,
        typer.Option(
            min=1, help="Connections served at once (503 past it); fitted to the open-files limit."
        ),
    ] = 4096,
    header_timeout_s: Annotated[
        float,
        typer.Option(help="Close a connection that sends no request head for this long."),
    ] = 10.0,
    redis_url: RedisUrl = DEFAULT_REDIS,
    namespace: Namespace = DEFAULT_NS,
) -> None:
    """Serve the operator console in the browser: agents, rates, charts, messages, dead
    letters (replay, purge), drain, registry events; live. Needs `pip install 'reach-fabric[web]'`.

    Listens on 127.0.0.1 unless --host says otherwise (then a token is required); prints
    its URL and serves until Ctrl-C. Example: reach web --port 8090
    """
    if not (math.isfinite(interval) and 0.1 <= interval <= 3600):
        raise ConfigError(f"--interval must be 0.1..3600 seconds, not {interval}.")
    if not (math.isfinite(window_s) and interval * 2 <= window_s <= 86_400):
        raise ConfigError(
            f"--window-s must be at least two intervals and at most 86400, not {window_s}."
        )
    if not (math.isfinite(header_timeout_s) and header_timeout_s > 0):
        raise ConfigError(f"--header-timeout-s must be seconds > 0, not {header_timeout_s}.")
    try:
        from reach.web import serve
        from reach.web.security import is_loopback
    except ImportError as e:
        raise ConfigError(
            f"reach web needs the web extra ({e.name} is missing): pip install 'reach-fabric[web]'"
        ) from e
    token = read_token(token_file)
    if not is_loopback(host) and token is None:
        raise ConfigError(
            f"--host {host} is reachable from other machines: give the console a token "
            f"(--token-file FILE or {TOKEN_ENV}), or listen on 127.0.0.1."
        )

    def ready(url: str) -> None:
        print(url, flush=True)
        err_console.print(
            f"reach web: namespace {namespace!r}"
            + (", read-only" if read_only else "")
            + (", token required" if token else "")
            + " — Ctrl-C to stop.",
            highlight=False,
            markup=False,
        )

    try:
        await serve(
            redis_url,
            namespace,
            host=host,
            port=port,
            token=token,
            read_only=read_only,
            interval_s=interval,
            history_s=window_s,
            on_ready=ready,
            max_body_bytes=max_body_bytes,
            max_connections=max_connections,
            registry_url=registry_url_for(redis_url),
            header_timeout_s=header_timeout_s,
        )
    except OSError as e:
        if e.errno is not None and getattr(e, "strerror", None) and "ddress" in str(e):
            raise ConfigError(f"Cannot listen on {host}:{port}: {e.strerror}.") from e
        raise
    sys.stdout.flush()
