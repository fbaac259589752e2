"""``reach worker MODULE:APP``: run an agent defined in your code, as a process (and ``load_agent``, which finds it)."""

from __future__ import annotations

import gc
import importlib
import inspect
import logging
import math
import os
import signal
import socket
import sys
from collections.abc import Callable
from typing import Annotated, Any, Literal, Optional, cast

import anyio
import typer

import reach
from reach._emitting import KEEP_BYTES, KEEP_CHUNKS, KEEP_S
from reach.connection import redact
from reach.errors import ConfigError
from reach.registry import check_app_version

from .common import (
    DEFAULT_NS,
    DEFAULT_REDIS,
    Namespace,
    RedisUrl,
    cli_errors,
    err_console,
    fail,
    find_redis_source,
    require_text,
    tenant_location,
)


# -- worker -------------------------------------------------------------------------------
def load_agent(target: str) -> reach.Agent:
    """Import ``module:attr`` (``module.path:app``) and return the reach.Agent there.

    ``attr`` may also be a function without arguments that returns one. Anything else
    (a missing attribute, a handler function, a value of another type) is a
    :class:`ConfigError` that says what was found.
    """
    from reach import Agent

    if ":" not in target:
        raise ConfigError(f"Expected MODULE:ATTR (e.g. myagents.summarizer:app), got {target!r}.")
    mod_name, attr = target.split(":", 1)
    if not mod_name or not attr:
        raise ConfigError(f"Expected MODULE:ATTR (e.g. myagents.summarizer:app), got {target!r}.")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as e:
        raise ConfigError(f"Cannot import {mod_name!r}: {e}") from e
    except (TypeError, ValueError) as e:  # a name import_module refuses, e.g. '.x' or 'a\0'
        raise ConfigError(f"Cannot import {mod_name!r}: {e}") from e
    want = "a reach.Agent (or a function without arguments that returns one)"
    if not hasattr(mod, attr):
        agents = sorted(k for k, v in vars(mod).items() if isinstance(v, Agent))
        found = f" (its reach.Agent objects: {', '.join(agents)})" if agents else ""
        raise ConfigError(f"Module {mod_name!r} has no attribute {attr!r}{found}.")
    obj = getattr(mod, attr)
    if isinstance(obj, Agent):
        return obj
    if inspect.iscoroutinefunction(obj):
        raise ConfigError(f"{target} is an async function (a handler?), not {want}.")
    if callable(obj):
        try:
            inspect.signature(obj).bind()
        except TypeError:
            raise ConfigError(
                f"{target} is a callable that takes arguments (a handler?), not {want}."
            ) from None
        except ValueError:  # no signature to look at (some builtins): try it
            pass
        made = obj()
        if not isinstance(made, Agent):
            raise ConfigError(f"{target}() returned {type(made).__name__}, not {want}.")
        return made
    raise ConfigError(f"{target} is {type(obj).__name__}, not {want}.")


def load_redactor(target: str) -> Callable[[str], str]:
    """Import ``module:attr`` for ``--redact-traceback``: a plain function taking the
    traceback's text and returning the text to store. Anything else is a
    :class:`ConfigError` that says what was found."""
    want = "a function taking the traceback's text and returning the text to keep"
    mod_name, _, attr = target.partition(":")
    if not mod_name or not attr:
        raise ConfigError(
            f"--redact-traceback: expected MODULE:ATTR (e.g. myagents.safety:mask), got {target!r}."
        )
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        mod = importlib.import_module(mod_name)
    except (ImportError, TypeError, ValueError) as e:
        raise ConfigError(f"--redact-traceback: cannot import {mod_name!r}: {e}") from e
    fn = getattr(mod, attr, None)
    if fn is None:
        raise ConfigError(f"--redact-traceback: module {mod_name!r} has no attribute {attr!r}.")
    if inspect.iscoroutinefunction(fn) or not callable(fn):
        kind = "an async function" if callable(fn) else type(fn).__name__
        raise ConfigError(f"--redact-traceback: {target} is {kind}, not {want}.")
    try:
        inspect.signature(fn).bind("text")
    except TypeError:
        raise ConfigError(
            f"--redact-traceback: {target} does not take one argument: {want}."
        ) from None
    except ValueError:  # no signature to look at (some builtins): try it
        pass
    return cast(Callable[[str], str], fn)


LogLevel = Literal["debug", "info", "warning", "error"]
LogFormat = Literal["text", "json"]


def agent_ids(template: str, instances: int) -> list[str]:
    """The ids of ``--agent-id TEMPLATE --instances N``: ``{hostname}`` is this host's name,
    ``{n}`` the copy's number, 1..N. Several copies need ``{n}`` (else they would share one
    id, and each would replace the one before)."""
    if instances > 1 and "{n}" not in template:
        raise ConfigError(
            f"--instances {instances} needs '{{n}}' in --agent-id (got {template!r}), so each "
            "copy gets its own id, e.g. --agent-id 'summarizer-{hostname}-{n}'."
        )
    host = socket.gethostname().split(".")[0] or "host"
    try:
        return [template.format(hostname=host, n=n) for n in range(1, instances + 1)]
    except (KeyError, IndexError, ValueError) as e:
        raise ConfigError(
            f"--agent-id {template!r}: only {{hostname}} and {{n}} may be filled in ({e!r})."
        ) from None


async def _serve(
    agents: list[reach.Agent],
    opts: dict[str, Any],
    overrides: list[dict[str, Any]] | None = None,
) -> int:
    """Run ``agents`` (one or more, in this process) until they stop; return the signal
    that stopped them (0: none). ``overrides``: each agent's own options over ``opts``
    (the Redis URL and namespace of its tenant, for --tenant).

    The signals are handled here rather than by the runtime, which does the same (first
    signal: drain, second: stop at once) but cannot tell which one it got: a Ctrl-C'd
    worker exits 130, like any interrupted command, and a SIGTERM'd one 0, the normal end
    of a worker under a supervisor.
    """
    got: list[int] = []
    wlog = logging.getLogger("reach.worker")

    async def signals(scope: anyio.CancelScope) -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as sigs:
            async for sig in sigs:
                got.append(int(sig))
                if len(got) == 1:
                    wlog.info("signal %s: draining (again to stop at once)", sig)
                    for agent in agents:
                        agent.stop()
                else:
                    wlog.warning("second signal: stopping without draining")
                    scope.cancel()
                    return

    async def one(agent: reach.Agent, extra: dict[str, Any]) -> None:
        await agent.run(**{**opts, **extra}, handle_signals=False)

    async with anyio.create_task_group() as tg:
        tg.start_soon(signals, tg.cancel_scope)
        async with anyio.create_task_group() as running:
            for i, agent in enumerate(agents):
                running.start_soon(one, agent, overrides[i] if overrides else {})
        tg.cancel_scope.cancel()
    return got[0] if got else 0


def worker(
    target: Annotated[
        str, typer.Argument(help="MODULE:ATTR of a reach.Agent, e.g. agents.echo:app")
    ],
    agent_id: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            "--agent-id",
            help="Serve the agent under this id instead of its own; a template with "
            "{hostname} and {n} (1..--instances), e.g. 'summarizer-{hostname}-{n}'.",
        ),
    ] = None,
    instances: Annotated[
        int,
        typer.Option(
            min=1,
            max=1000,
            help="Copies of the agent served by this process, each under its own id "
            "(--agent-id with {n}).",
        ),
    ] = 1,
    app_version: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            "--version",
            help="The application version the agent registers (e.g. 1.5; reach agents shows "
            "it, reach caps split routes by it). Overrides the agent's Agent(version=...); "
            "without either, REACH_AGENT_VERSION.",
        ),
    ] = None,
    redis_url: RedisUrl = DEFAULT_REDIS,
    namespace: Namespace = DEFAULT_NS,
    session_url: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            help="Redis of the session store (ctx.session) when not --redis-url's: a "
            "best_effort session then answers empty while that Redis is down.",
        ),
    ] = None,
    registry_url: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            help="Redis of the control plane (registry, limits, quotas, audit, access "
            "rules) when not --redis-url's; every process of the namespace must name the "
            "same. Env: REACH_REGISTRY_URL, else registry_url in reach.toml.",
        ),
    ] = None,
    concurrency: Annotated[int, typer.Option(min=1, help="Handlers running at once.")] = 16,
    max_waiting_handlers: Annotated[
        int,
        typer.Option(
            min=0,
            max=100_000,
            help="Handlers waiting for input (ctx.ask) that give their slot back while "
            "they wait, at most; each holds a Redis connection (0: they wait in their slots).",
        ),
    ] = 100,
    prefetch: Annotated[
        int,
        typer.Option(
            min=0,
            max=10_000,
            help="Messages read and claimed ahead of free handler slots while handlers are "
            "quick (0: none).",
        ),
    ] = 64,
    heartbeat_s: Annotated[float, typer.Option(help="Seconds between heartbeats.")] = 3.0,
    lease_s: Annotated[float, typer.Option(help="Without a heartbeat this long: probation.")] = 9.0,
    evict_after_s: Annotated[
        float, typer.Option(help="Without a heartbeat this long: evicted.")
    ] = 18.0,
    stall_s: Annotated[
        float, typer.Option(help="Event loop stuck this long: stop heartbeats.")
    ] = 30.0,
    max_takeovers: Annotated[
        int,
        typer.Option(
            min=0,
            max=1_000_000,
            help="Times a run that never ended (its agent killed, evicted or stalled) is "
            "taken over before the message is dead-lettered poisoned.",
        ),
    ] = 3,
    drain_s: Annotated[
        float,
        typer.Option(
            "--drain-s",
            "--drain-timeout-s",
            help="Drain grace: on SIGTERM/SIGINT, how long running handlers get to finish "
            "before they are cancelled (their messages then run again); a second signal "
            "stops at once.",
        ),
    ] = 30.0,
    sweep_interval_s: Annotated[float, typer.Option(help="Seconds between sweeps.")] = 1.0,
    cancel_grace_s: Annotated[
        float, typer.Option(help="A cancelled handler is cut this long after it is told.")
    ] = 3.0,
    preempt_after_s: Annotated[
        Optional[float],  # noqa: UP045
        typer.Option(
            help="Cut a low-priority run for a high-priority message waiting this long "
            "(off by default)."
        ),
    ] = None,
    claim_lease_s: Annotated[
        float, typer.Option(help="Claim lease of messages without deadline.")
    ] = 60.0,
    retry_base_s: Annotated[float, typer.Option(help="First retry backoff.")] = 0.2,
    stream_keep_chunks: Annotated[
        int,
        typer.Option(
            min=0,
            max=10**9,
            help="A streamed message's newest chunks kept for client.resume (0: none).",
        ),
    ] = KEEP_CHUNKS,
    stream_keep_bytes: Annotated[
        int,
        typer.Option(min=1, max=2**40, help="...and at most this many bytes of them."),
    ] = KEEP_BYTES,
    stream_keep_s: Annotated[
        float,
        typer.Option(
            min=0.001, max=30 * 86_400.0, help="...kept this long after the latest chunk."
        ),
    ] = KEEP_S,
    log_level: Annotated[
        LogLevel, typer.Option(case_sensitive=False, help="debug, info, warning, error.")
    ] = "info",
    log_format: Annotated[
        LogFormat, typer.Option(help="text, or json (one object per line, with the message ids).")
    ] = "text",
    metrics_port: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(
            min=0,
            max=65535,
            help="Serve Prometheus /metrics on this port, and the probes /healthz (liveness) "
            "and /readyz (readiness).",
        ),
    ] = None,
    metrics_addr: Annotated[
        str, typer.Option(help="Address /metrics, /healthz and /readyz listen on.")
    ] = "0.0.0.0",
    require_signed: Annotated[
        bool,
        typer.Option(
            "--require-signed",
            help="Dead-letter (unauthenticated) messages not signed with REACH_SECRET "
            "(also: REACH_REQUIRE_SIGNED=1).",
        ),
    ] = False,
    traceback_max_bytes: Annotated[
        int,
        typer.Option(
            min=0,
            max=1024 * 1024,
            help="A failed handler's traceback is stored with its outcome (task record, "
            "dead letter) up to its last this many bytes; 0: none stored.",
        ),
    ] = 8192,
    redact_traceback: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            "--redact-traceback",
            metavar="MODULE:ATTR",
            help="A function each traceback passes through before it is stored or logged "
            "(text in, the text to keep out), e.g. to mask tokens.",
        ),
    ] = None,
    tenant: Annotated[
        Optional[list[str]],  # noqa: UP045
        typer.Option(
            "--tenant",
            envvar="REACH_TENANT",
            show_envvar=True,
            show_default=False,
            metavar="ID",
            help="Serve this tenant: its Redis URL and namespace from the tenant map "
            "([tenants.ID] in reach.toml), instead of --redis-url and --namespace. Repeat "
            "it to serve several tenants from one process, each on its own Redis.",
        ),
    ] = None,
) -> None:
    """Run the reach.Agent found at MODULE:ATTR until SIGTERM/SIGINT (then drain).

    The first SIGTERM/SIGINT drains: the worker stops reading, lets running handlers
    finish for up to --drain-s (then cancels them: their messages run again elsewhere),
    writes every outcome and deregisters. A second signal stops at once, at that cost.

    One agent id is one running process: a second process started with the same id
    replaces the first, which logs who replaced it and exits 0. Run several copies of one
    agent with an id each: --agent-id ID, or --agent-id 'NAME-{hostname}-{n}' --instances N
    (N agents in this process).

    Exit code 0 after SIGTERM and when replaced by a newer process with the same agent id,
    130 after Ctrl-C (SIGINT), 2 on an error (bad target or option, an agent declaring a
    capability without a handler, Redis unreachable or refusing).

    A canary: run the new code with --version 1.5 beside the old (--version 1.4), then
    reach caps split CAP 1.4=90 1.5=10 (docs/routing.md, "Version canaries").

    Example: reach worker examples.summarizer:app --concurrency 32 --lease-s 2 --evict-after-s 4
    """
    from reach import health, logs

    require_text(
        {
            "target": target,
            "redis_url": redis_url,
            "namespace": namespace,
            "metrics_addr": metrics_addr,
        }
    )
    placed = _tenants(tenant or [], redis_url, namespace)
    if placed:
        redis_url, url_source = placed[0][1], "the tenant map"
    else:
        redis_url, url_source = find_redis_source(redis_url)
    with cli_errors(redis_url):
        _check_times(
            heartbeat_s=heartbeat_s,
            lease_s=lease_s,
            evict_after_s=evict_after_s,
            stall_s=stall_s,
            drain_s=drain_s,
            sweep_interval_s=sweep_interval_s,
            claim_lease_s=claim_lease_s,
            retry_base_s=retry_base_s,
            cancel_grace_s=cancel_grace_s,
        )
        logs.setup_logging(log_level.lower(), log_format)
        wlog = logging.getLogger("reach.worker")
        probes = health.Health()  # the agents join once loaded: /readyz is 503 until then
        if metrics_port is not None:
            try:
                srv = health.serve(metrics_port, metrics_addr, probes)
            except (OSError, ValueError, OverflowError) as e:
                raise ConfigError(
                    f"Cannot serve /metrics on {metrics_addr}:{metrics_port}: {e}"
                ) from e
            wlog.info(
                "metrics on http://%s:%d/metrics (probes: /healthz, /readyz)",
                metrics_addr,
                srv.server_port,
            )
        agent = load_agent(target)
        if app_version is not None:
            agent.version = check_app_version(app_version)
        if instances > 1 and agent_id is None:
            raise ConfigError(
                f"--instances {instances} needs --agent-id with {{n}}, so each copy gets its "
                "own id, e.g. --agent-id 'summarizer-{hostname}-{n}'."
            )
        agents = (
            [agent.renamed(i) for i in agent_ids(agent_id, instances)]
            if agent_id is not None
            else [agent]
        )
        overrides: list[dict[str, Any]] | None = None
        if placed:  # a copy of every agent per tenant: an Agent runs once at a time
            overrides = [{"redis_url": u, "namespace": n} for _, u, n in placed for _ in agents]
            agents = [a.renamed(a.agent_id) for _ in placed for a in agents]
        probes.agents = agents
        opts = {
            "redis_url": redis_url,
            "namespace": namespace,
            "concurrency": concurrency,
            "max_waiting_handlers": max_waiting_handlers,
            "prefetch": prefetch,
            "heartbeat_s": heartbeat_s,
            "lease_s": lease_s,
            "evict_after_s": evict_after_s,
            "stall_s": stall_s,
            "max_takeovers": max_takeovers,
            "drain_timeout_s": drain_s,
            "sweep_interval_s": sweep_interval_s,
            "claim_lease_s": claim_lease_s,
            "retry_base_s": retry_base_s,
            "cancel_grace_s": cancel_grace_s,
            "stream_keep_chunks": stream_keep_chunks,
            "stream_keep_bytes": stream_keep_bytes,
            "stream_keep_s": stream_keep_s,
        }
        if preempt_after_s is not None:
            opts["preempt_after_s"] = preempt_after_s
        if session_url is not None:
            opts["session_url"] = session_url
        if registry_url is not None:
            opts["registry_url"] = registry_url
        if require_signed:  # else REACH_REQUIRE_SIGNED decides (the secret: REACH_SECRET)
            opts["require_signed"] = True
        opts["traceback_max_bytes"] = traceback_max_bytes
        if redact_traceback is not None:
            opts["redact_traceback"] = load_redactor(redact_traceback)
        src = "" if url_source == "--redis-url" else f" (from {url_source})"
        ids = ", ".join(dict.fromkeys(a.agent_id for a in agents))
        lines = [(redact(u), f" (tenant {tid})", n) for tid, u, n in placed]
        for url, where, ns in lines or [(redact(redis_url), src, namespace)]:
            _say(log_format, f"reach worker: {ids} on {url}{where} ns={ns}")
        # Everything imported so far lives as long as the process: keep it out of the
        # collector's generations, so collections stay short on the message path.
        gc.freeze()
        sig = anyio.run(_serve, agents, opts, overrides)
    if sig == signal.SIGINT:
        raise typer.Exit(130)


def _say(log_format: str, line: str) -> None:
    if log_format == "json":  # stderr stays one JSON object per line
        logging.getLogger("reach.worker").info("%s", line)
    else:
        err_console.print(line, highlight=False, markup=False)


def _tenants(ids: list[str], redis_url: str, namespace: str) -> list[tuple[str, str, str]]:
    """(tenant, Redis URL, namespace) of each ``--tenant``, once each."""
    if not ids:
        return []
    if redis_url:
        fail("Give --tenant or --redis-url, not both.")
    if namespace != DEFAULT_NS:
        fail("Give --tenant or --namespace, not both: each tenant names its namespace.")
    placed = {}
    for tid in dict.fromkeys(ids):
        t = tenant_location(tid)
        placed[(t.redis_url, t.namespace)] = tid  # two ids on one namespace: served once
    return [(tid, u, n) for (u, n), tid in placed.items()]


def _check_times(**seconds: float) -> None:
    """Durations must be finite and positive (NaN slips through every comparison); a
    drain timeout and a retry backoff may be 0."""
    for name, v in seconds.items():
        low_ok = name in ("drain_s", "retry_base_s", "cancel_grace_s") and v == 0
        if not (math.isfinite(v) and (v > 0 or low_ok)):
            raise ConfigError(
                f"--{name.replace('_', '-')} must be a number of seconds > 0, not {v}."
            )
