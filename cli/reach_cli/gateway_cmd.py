"""``reach gateway``: serve a namespace's capabilities and agents as A2A servers
(reach.gateway; the ``gateway`` extra; docs/a2a.md, *The gateway*)."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import math
import signal
import ssl
import sys
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from reach.connection import redact
from reach.errors import ConfigError
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

if TYPE_CHECKING:
    import uvicorn

EXTRA = "reach gateway needs the gateway extra: pip install 'reach-fabric[gateway]'"


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def gateway(
    port: Annotated[int, typer.Option(min=0, max=65535, help="TCP port to listen on.")] = 8080,
    host: Annotated[
        str, typer.Option(help="Address to listen on (0.0.0.0: every interface).")
    ] = "127.0.0.1",
    token_file: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(
            metavar="FILE",
            help="Bearer tokens callers must present, one a line (TOKEN or NAME:TOKEN); "
            "also REACH_GATEWAY_TOKENS (comma-separated).",
        ),
    ] = None,
    no_auth: Annotated[
        bool,
        typer.Option(
            "--no-auth",
            help="Serve without tokens on an address that is not loopback (refused otherwise).",
        ),
    ] = False,
    public_url: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            metavar="URL",
            help="The gateway's URL as callers reach it, for the cards (default: each "
            "request's Host).",
        ),
    ] = None,
    timeout_s: Annotated[
        float,
        typer.Option(
            help="A message's deadline when the caller sends no Reach-Timeout-S and its "
            "capability's agents advertise no timeout."
        ),
    ] = 30.0,
    max_task_bytes: Annotated[
        int,
        typer.Option(
            min=1024,
            help="Bytes one A2A task may hold (its input, chunks and result); a stream "
            "past it is ended, failed.",
        ),
    ] = 16 * 1024 * 1024,
    max_store_bytes: Annotated[
        int,
        typer.Option(
            min=1024,
            help="Bytes the finished tasks hold in Redis together (the oldest are dropped "
            "past it; tasks/get then reads the reach task record).",
        ),
    ] = 256 * 1024 * 1024,
    max_body_bytes: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(
            min=1024,
            help="Largest request body taken (413 past it); default: the fabric's payload "
            "limit as base64, plus 64 KiB.",
        ),
    ] = None,
    max_connections: Annotated[
        int,
        typer.Option(
            min=1,
            help="Connections served at once (503 past it); lowered to fit the open-files limit.",
        ),
    ] = 4096,
    header_timeout_s: Annotated[
        float,
        typer.Option(help="Close a connection that sends no request head for this long."),
    ] = 10.0,
    send_timeout_s: Annotated[
        float,
        typer.Option(help="Cut a response (a stream) its client does not read for this long."),
    ] = 30.0,
    identity_file: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(
            metavar="FILE",
            help="Sign what the gateway sends with this Ed25519 identity (else "
            "REACH_IDENTITY_FILE, or REACH_SECRET's shared secret).",
        ),
    ] = None,
    trusted_keys_file: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(
            metavar="FILE",
            help="Public keys of the agents whose replies are taken (with --identity-file).",
        ),
    ] = None,
    tls_cert: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(metavar="FILE", help="Serve HTTPS with this certificate (PEM)."),
    ] = None,
    tls_key: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(metavar="FILE", help="The certificate's private key (PEM)."),
    ] = None,
    tls_client_ca: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(
            metavar="FILE",
            help="Require client certificates signed by this CA (mutual TLS; the cards "
            "declare it).",
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
            help="Serve every tenant of the tenant map ([tenants] in reach.toml), each on "
            "its own Redis and namespace, picked per request by the X-Reach-Tenant header "
            "(none: the tenant 'default'); instead of --redis-url/--tenant.",
        ),
    ] = False,
    redis_url: RedisUrl = DEFAULT_REDIS,
    namespace: Namespace = DEFAULT_NS,
) -> None:
    """Serve every capability and live agent of the namespace as an A2A server (JSON-RPC,
    SSE streaming): /caps/CAPABILITY and /agents/AGENT_ID, each with its card at
    .well-known/agent-card.json below it, and the gateway's card at the root.

    Example: reach gateway --port 8080 --token-file tokens.txt
    """
    require_text({"host": host, "public_url": public_url, "namespace": namespace})
    tenants = None
    if all_tenants:
        if redis_url:
            fail("Give --all-tenants or --redis-url/--tenant, not both.")
        with cli_errors():
            tenants = Tenants.load()
            if tenants is None:
                raise ConfigError(
                    "--all-tenants: no tenant map here: add [tenants.<id>] tables (redis_url, "
                    "namespace) to reach.toml in this directory or a parent."
                )
    else:
        redis_url, _ = find_redis_source(redis_url)
    with cli_errors(redis_url or None):
        try:
            import uvicorn

            from reach._http import Limits, raise_open_files_limit, uvicorn_options
            from reach.client import Client
            from reach.gateway import Gateway, IpRules, Tokens
        except ImportError as e:
            raise ConfigError(f"{EXTRA} ({e}).") from e
        if not (math.isfinite(timeout_s) and timeout_s > 0):
            raise ConfigError(f"--timeout-s must be a number of seconds > 0, not {timeout_s}.")
        if (tls_cert is None) != (tls_key is None):
            raise ConfigError("--tls-cert and --tls-key go together.")
        if tls_client_ca is not None and tls_cert is None:
            raise ConfigError("--tls-client-ca (mutual TLS) needs --tls-cert and --tls-key.")
        tokens = Tokens.load(token_file)
        verifier = jwt_verifier(
            jwks, jwt_audience, jwt_issuer, jwt_algorithms, jwt_caller_claim, jwt_leeway_s,
            jwt_secret_file,
        )  # fmt: skip
        if (
            tokens is None
            and verifier is None
            and tls_client_ca is None
            and not no_auth
            and not _loopback(host)
        ):
            raise ConfigError(
                f"No tokens and {host} is not a loopback address: anyone who reaches it could "
                "call every agent. Give --token-file (or REACH_GATEWAY_TOKENS), --jwks or "
                "--tls-client-ca, or --no-auth if something in front authenticates."
            )
        rate = caller_rate(rate_per_caller, burst)
        ips = IpRules(allow_ip or [], deny_ip or [], trust_proxy=trust_proxy)
        client_opts: dict[str, Any] = {
            "identity_file": str(identity_file) if identity_file else None,
            "trusted_keys_file": str(trusted_keys_file) if trusted_keys_file else None,
        }
        gw_opts: dict[str, Any] = {
            "tokens": tokens,
            "public_url": public_url,
            "default_timeout_s": timeout_s,
            "max_task_bytes": max_task_bytes,
            "max_store_bytes": max_store_bytes,
            "max_body_bytes": max_body_bytes,
            "send_timeout_s": send_timeout_s,
            "mtls": tls_client_ca is not None,
            "jwt": verifier,
            "rate_per_caller": rate,
            "ips": ips,
        }
        app: Any
        if tenants is not None:
            from reach.gateway.tenants import TenantGateways, gateway_maker

            app = TenantGateways(tenants, gateway_maker(client_opts, gw_opts))
            where = f"tenants {', '.join(tenants.targets())} (by X-Reach-Tenant)"
        else:
            client = Client(
                redis_url=redis_url,
                registry_url=registry_url_for(redis_url),
                namespace=namespace,
                **client_opts,
            )
            app = Gateway(client, **gw_opts).app
            where = f"namespace {namespace!r} on {redact(redis_url)}"
        tls: dict[str, Any] = {}
        if tls_cert is not None:
            tls = {"ssl_certfile": str(tls_cert), "ssl_keyfile": str(tls_key)}
        if tls_client_ca is not None:
            tls |= {"ssl_ca_certs": str(tls_client_ca), "ssl_cert_reqs": ssl.CERT_REQUIRED}
        level = log_level.lower()
        if level not in ("debug", "info", "warning", "error"):
            raise ConfigError(f"--log-level {log_level!r}: use debug, info, warning or error.")
        logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(message)s")
        from reach.gateway import logs

        for handler in logging.getLogger().handlers:
            logs.install(handler)  # client errors: one line each, not the SDK's tracebacks
        for name, value in (
            ("--header-timeout-s", header_timeout_s),
            ("--send-timeout-s", send_timeout_s),
        ):
            if not (math.isfinite(value) and value > 0):
                raise ConfigError(f"{name} must be a number of seconds > 0, not {value}.")
        open_files = raise_open_files_limit()
        limits = Limits(max_connections=max_connections, header_timeout_s=header_timeout_s)
        limits = limits.fitted(open_files)
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level=level,
            lifespan="on",
            # the client's address is the peer's, or with --trust-proxy reach._access reads
            # X-Forwarded-For itself: uvicorn's own reading would let a caller on loopback
            # choose its address
            proxy_headers=False,
            **uvicorn_options(limits),
            **tls,
        )
        stopped_by: list[int] = []
        server = _server(config, stopped_by)
        scheme = "https" if tls else "http"
        parts = [f"{len(tokens)} token(s)"] if tokens is not None else []
        if verifier is not None:
            parts.append(f"JWTs ({', '.join(verifier.algorithms)})")
        if tls_client_ca:
            parts.append("client certificates")
        auth = " and ".join(parts) or "no authentication"
        if rate is not None:
            auth += f"; at most {rate} per caller"
        if ips.active:
            auth += f"; {len(ips.allow)} allow and {len(ips.deny)} deny IP rule(s)"
        serving = (
            f"reach gateway: {where}, serving "
            f"{scheme}://{host}:{port} ({auth}; at most {limits.max_connections} connections, "
            f"open-files limit {open_files})"
        )
        server.on_started = lambda: print(serving, file=sys.stderr, flush=True)
        try:
            asyncio.run(_serve(server))
        except SystemExit:  # uvicorn's own exit when it cannot start (e.g. the port is taken)
            if server.started:
                raise
        if not server.started:
            raise ConfigError(
                f"The gateway could not serve on {host}:{port} (the line above says why; "
                "a port in use: choose another with --port)."
            )
    if signal.SIGINT in stopped_by:
        raise typer.Exit(130)


async def _serve(server: uvicorn.Server) -> None:
    from reach._http import quiet_accept_errors

    quiet_accept_errors(asyncio.get_running_loop(), logging.getLogger("reach.gateway"))
    await server.serve()


def _server(config: uvicorn.Config, stopped_by: list[int]) -> Any:
    """uvicorn's Server, stopping on SIGTERM/SIGINT as it does (requests in flight are
    finished) but then returning, as a worker does (exit 0 after SIGTERM, 130 after
    Ctrl-C), instead of raising the signal again; the signals go into ``stopped_by``."""
    import uvicorn

    class Server(uvicorn.Server):
        on_started: Any = None

        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            if self.started and self.on_started is not None:
                self.on_started()  # "serving" once the port is bound, not before

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            if self.should_exit and sig == signal.SIGINT:
                self.force_exit = True  # a second Ctrl-C: stop waiting for requests
            stopped_by.append(sig)
            self.should_exit = True

    return Server(config)
