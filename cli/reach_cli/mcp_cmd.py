"""``reach mcp``: a namespace's capabilities as MCP tools, over stdio or streamable HTTP;
``reach mcp-proxy``: an outside MCP server's tools as reach capabilities (reach.mcp; the
``mcp`` extra; docs/mcp.md)."""

from __future__ import annotations

import asyncio
import logging
import math
import signal
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from reach.connection import redact
from reach.errors import ConfigError, ReachError
from reach.tenants import Tenants

from .common import (
    DEFAULT_NS,
    DEFAULT_REDIS,
    Namespace,
    RedisUrl,
    cli_errors,
    fail,
    find_redis_source,
    registry_url_for,
    require_text,
)
from .gateway_cmd import _loopback, _server
from .identity_opts import (
    AllowIp,
    Burst,
    DenyIp,
    Jwks,
    JwtAlgorithms,
    JwtAudience,
    JwtCallerClaim,
    JwtIssuer,
    JwtLeewayS,
    JwtSecretFile,
    RatePerCaller,
    TrustProxy,
    caller_rate,
    jwt_verifier,
)

EXTRA = "reach mcp needs the mcp extra: pip install 'reach-fabric[mcp]'"


def _where(values: list[str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for w in values or []:
        if "=" not in w:
            fail(f"--where takes KEY=VALUE, got {w!r}")
        k, v = w.split("=", 1)
        out[k] = v
    return out


def _seconds(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{name} must be a number of seconds > 0, not {value}.")


def _logging(log_level: str) -> None:
    level = log_level.lower()
    if level not in ("debug", "info", "warning", "error"):
        raise ConfigError(f"--log-level {log_level!r}: use debug, info, warning or error.")
    # stderr only: over stdio, stdout is the MCP wire
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr
    )


def _tenant_map() -> Tenants:
    with cli_errors():
        found = Tenants.load()
        if found is None:
            raise ConfigError(
                "--all-tenants: no tenant map here: add [tenants.<id>] tables (redis_url, "
                "namespace) to reach.toml in this directory or a parent."
            )
        return found


def mcp(
    stdio: Annotated[
        bool,
        typer.Option(
            "--stdio", help="Serve one MCP client on stdin/stdout (a model client starts it)."
        ),
    ] = False,
    port: Annotated[
        int, typer.Option(min=0, max=65535, help="TCP port of the streamable HTTP endpoint.")
    ] = 8091,
    host: Annotated[
        str, typer.Option(help="Address to listen on (0.0.0.0: every interface).")
    ] = "127.0.0.1",
    path: Annotated[str, typer.Option(help="The MCP endpoint's path.")] = "/mcp",
    token_file: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(
            metavar="FILE",
            help="Bearer tokens HTTP clients must present, one a line (TOKEN or NAME:TOKEN); "
            "also REACH_MCP_TOKENS (comma-separated).",
        ),
    ] = None,
    no_auth: Annotated[
        bool,
        typer.Option(
            "--no-auth",
            help="Serve HTTP without tokens (refused otherwise: every tool reaches agents).",
        ),
    ] = False,
    cap: Annotated[
        Optional[list[str]],  # noqa: UP045
        typer.Option("--cap", help="Offer only this capability (repeatable)."),
    ] = None,
    where: Annotated[
        Optional[list[str]],  # noqa: UP045
        typer.Option(
            "--where", help="Only agents whose metadata has KEY=VALUE (repeatable); calls too."
        ),
    ] = None,
    timeout_s: Annotated[
        float,
        typer.Option(help="A call's deadline when its capability's agents advertise none."),
    ] = 30.0,
    poll_s: Annotated[
        float,
        typer.Option(help="How often the registry's events are read for tool-list changes."),
    ] = 0.5,
    identity_file: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(
            metavar="FILE",
            help="Sign the calls with this Ed25519 identity (else REACH_IDENTITY_FILE, or "
            "REACH_SECRET's shared secret).",
        ),
    ] = None,
    trusted_keys_file: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(
            metavar="FILE",
            help="Public keys of the agents whose replies are taken (with --identity-file).",
        ),
    ] = None,
    jwks: Jwks = None,
    jwt_audience: JwtAudience = None,
    jwt_issuer: JwtIssuer = None,
    jwt_algorithms: JwtAlgorithms = None,
    jwt_caller_claim: JwtCallerClaim = "sub",
    jwt_leeway_s: JwtLeewayS = 30.0,
    jwt_secret_file: JwtSecretFile = None,
    rate_per_caller: RatePerCaller = None,
    burst: Burst = None,
    allow_ip: AllowIp = None,
    deny_ip: DenyIp = None,
    trust_proxy: TrustProxy = False,
    log_level: Annotated[str, typer.Option(help="debug, info, warning, error.")] = "warning",
    all_tenants: Annotated[
        bool,
        typer.Option(
            "--all-tenants",
            help="Over HTTP: serve every tenant of the tenant map ([tenants] in reach.toml), "
            "each its own Redis, namespace and tools, picked per request by the "
            "X-Reach-Tenant header (none: the tenant 'default'). Over stdio: --tenant.",
        ),
    ] = False,
    redis_url: RedisUrl = DEFAULT_REDIS,
    namespace: Namespace = DEFAULT_NS,
) -> None:
    """Serve the namespace's capabilities as MCP tools (their input schemas from the
    handlers' annotations; the list follows agents as they come and go): over stdio with
    --stdio, else over streamable HTTP at http://HOST:PORT/mcp (a token required).

    Examples: reach mcp --stdio;  reach mcp --port 8091 --token-file tokens.txt
    """
    require_text({"host": host, "path": path, "namespace": namespace, "cap": cap, "where": where})
    filt = _where(where)
    tenants = None
    if all_tenants:
        if stdio:
            fail("--all-tenants serves HTTP: over stdio give one --tenant.")
        if redis_url:
            fail("Give --all-tenants or --redis-url/--tenant, not both.")
        tenants = _tenant_map()
    else:
        redis_url, _ = find_redis_source(redis_url)
    with cli_errors(redis_url or None):
        try:
            import uvicorn

            from reach.client import Client
            from reach.mcp import TOKENS_ENV, McpFace
        except ImportError as e:
            raise ConfigError(f"{EXTRA} ({e}).") from e
        from reach._tokens import Tokens

        _seconds("--timeout-s", timeout_s)
        _seconds("--poll-s", poll_s)
        _logging(log_level)
        client_opts: dict[str, Any] = {
            "default_timeout_s": timeout_s,
            "identity_file": str(identity_file) if identity_file else None,
            "trusted_keys_file": str(trusted_keys_file) if trusted_keys_file else None,
        }

        def face_of(url: str, ns: str) -> McpFace:
            client = Client(
                redis_url=url, registry_url=registry_url_for(url), namespace=ns, **client_opts
            )
            return McpFace(client, capabilities=cap or None, where=filt or None, poll_s=poll_s)

        if stdio:
            face = face_of(redis_url, namespace)
            print(
                f"reach mcp: namespace {namespace!r} on {redact(redis_url)}, serving stdio",
                file=sys.stderr,
                flush=True,
            )
            asyncio.run(face.serve_stdio())
            return
        from reach._access import IpRules

        tokens = Tokens.load(token_file, env_name=TOKENS_ENV)
        verifier = jwt_verifier(
            jwks, jwt_audience, jwt_issuer, jwt_algorithms, jwt_caller_claim, jwt_leeway_s,
            jwt_secret_file,
        )  # fmt: skip
        if tokens is None and verifier is None and not no_auth:
            raise ConfigError(
                "No tokens: anyone who reaches the port could call every agent. Give "
                f"--token-file (or {TOKENS_ENV}) or --jwks, or --no-auth if something in "
                "front authenticates."
            )
        rate = caller_rate(rate_per_caller, burst)
        ips = IpRules(allow_ip or [], deny_ip or [], trust_proxy=trust_proxy)
        if not path.startswith("/"):
            raise ConfigError(f"--path must start with '/', not {path!r}.")
        http: dict[str, Any] = {
            "tokens": tokens,
            "host": host,
            "path": path,
            "jwt": verifier,
            "rate_per_caller": rate,
            "ips": ips,
        }
        app: Any
        if tenants is not None:
            from reach._tenant_apps import TenantApps

            app = TenantApps(
                tenants, lambda t: face_of(t.redis_url, t.namespace), lambda f: f.http_app(**http)
            )
            served = f"tenants {', '.join(tenants.targets())} (by X-Reach-Tenant)"
        else:
            app = face_of(redis_url, namespace).http_app(**http)
            served = f"namespace {namespace!r} on {redact(redis_url)}"
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level=log_level.lower(),
            lifespan="on",
            proxy_headers=False,  # the peer's address, or X-Forwarded-For with --trust-proxy
        )
        stopped_by: list[int] = []
        server = _server(config, stopped_by)
        parts = [f"{len(tokens)} token(s)"] if tokens is not None else []
        if verifier is not None:
            parts.append(f"JWTs ({', '.join(verifier.algorithms)})")
        auth = " and ".join(parts) or "no authentication"
        if rate is not None:
            auth += f"; at most {rate} per caller"
        if ips.active:
            auth += f"; {len(ips.allow)} allow and {len(ips.deny)} deny IP rule(s)"
        where_note = "" if _loopback(host) else " (not loopback: DNS-rebinding checks off)"
        serving = f"reach mcp: {served}, serving http://{host}:{port}{path} ({auth}){where_note}"
        server.on_started = lambda: print(serving, file=sys.stderr, flush=True)
        try:
            asyncio.run(server.serve())
        except SystemExit:  # uvicorn's own exit when it cannot start (a port in use)
            if server.started:
                raise
        if not server.started:
            raise ConfigError(
                f"reach mcp could not serve on {host}:{port} (the line above says why; a "
                "port in use: choose another with --port)."
            )
    if signal.SIGINT in stopped_by:
        raise typer.Exit(130)


def mcp_proxy(
    target: Annotated[
        list[str],
        typer.Argument(
            help="The MCP server: a URL (http://host/mcp) or a command and its arguments "
            "(after --), run over stdio."
        ),
    ],
    cap: Annotated[
        Optional[list[str]],  # noqa: UP045
        typer.Option(
            "--cap",
            help="Serve this capability (repeatable): CAP (a tool giving that name) or "
            "CAP=TOOL_NAME; default: every tool.",
        ),
    ] = None,
    agent_id: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option("--agent-id", help="The proxy agent's id (default: mcp-SERVER_NAME)."),
    ] = None,
    token_file: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(
            metavar="FILE", help="Send the token on its first line as Authorization: Bearer."
        ),
    ] = None,
    timeout_s: Annotated[float, typer.Option(help="Seconds per HTTP request.")] = 60.0,
    concurrency: Annotated[int, typer.Option(min=1, help="Tool calls running at once.")] = 16,
    heartbeat_s: Annotated[float, typer.Option(help="Seconds between heartbeats.")] = 3.0,
    lease_s: Annotated[float, typer.Option(help="Without a heartbeat this long: probation.")] = 9.0,
    evict_after_s: Annotated[
        float, typer.Option(help="Without a heartbeat this long: evicted.")
    ] = 18.0,
    sweep_interval_s: Annotated[float, typer.Option(help="Seconds between sweeps.")] = 1.0,
    drain_s: Annotated[
        float, typer.Option("--drain-s", help="Drain grace on SIGTERM/SIGINT.")
    ] = 30.0,
    log_level: Annotated[str, typer.Option(help="debug, info, warning, error.")] = "info",
    redis_url: RedisUrl = DEFAULT_REDIS,
    namespace: Namespace = DEFAULT_NS,
) -> None:
    """Serve an outside MCP server's tools as reach capabilities: a proxy agent forwards
    each message to its tool (reach.mcp.remote), until SIGTERM/SIGINT (then drain).

    Examples: reach mcp-proxy -- npx -y @modelcontextprotocol/server-everything;
    reach mcp-proxy https://tools.example/mcp --token-file t.txt --cap weather.today=get_weather
    """
    require_text({"target": target, "cap": cap, "agent_id": agent_id, "namespace": namespace})
    redis_url, _ = find_redis_source(redis_url)
    with cli_errors(redis_url):
        try:
            import anyio

            from reach.mcp import remote
        except ImportError as e:
            raise ConfigError(f"{EXTRA} ({e}).") from e
        from reach import logs

        from .worker_cmd import _check_times, _serve

        _check_times(
            heartbeat_s=heartbeat_s,
            lease_s=lease_s,
            evict_after_s=evict_after_s,
            sweep_interval_s=sweep_interval_s,
            drain_s=drain_s,
        )
        _seconds("--timeout-s", timeout_s)
        logs.setup_logging(log_level.lower(), "text")
        token = None
        if token_file is not None:
            try:
                token = (token_file.read_text().splitlines() or [""])[0].strip() or None
            except OSError as e:
                raise ConfigError(f"Cannot read the token file {token_file}: {e}") from e
        caps: list[str] | dict[str, str] | None = None
        if cap:
            if all("=" in c for c in cap):
                caps = dict(c.split("=", 1) for c in cap)
            elif any("=" in c for c in cap):
                raise ConfigError("--cap: give every one as CAP=TOOL_NAME, or none of them.")
            else:
                caps = list(cap)
        server = target[0] if len(target) == 1 and "://" in target[0] else target
        from reach.mcp.remote import RemoteMCPError

        try:
            agent = anyio.run(
                lambda: remote(
                    server, capabilities=caps, agent_id=agent_id, token=token, timeout_s=timeout_s
                )
            )
        except RemoteMCPError as e:
            # One line, as for every error the user or the environment caused.
            raise ReachError(
                f"{e}. Give the server's URL (reach mcp-proxy http://host:port/mcp) or the "
                "command that starts it after -- (reach mcp-proxy -- python server.py)."
            ) from e
        opts = {
            "redis_url": redis_url,
            "namespace": namespace,
            "concurrency": concurrency,
            "heartbeat_s": heartbeat_s,
            "lease_s": lease_s,
            "evict_after_s": evict_after_s,
            "sweep_interval_s": sweep_interval_s,
            "drain_timeout_s": drain_s,
        }
        print(
            f"reach mcp-proxy: {agent.agent_id} serving {', '.join(agent.capabilities)} on "
            f"{redact(redis_url)} ns={namespace}",
            file=sys.stderr,
            flush=True,
        )
        sig = anyio.run(_serve, [agent], opts)
    if sig == signal.SIGINT:
        raise typer.Exit(130)
