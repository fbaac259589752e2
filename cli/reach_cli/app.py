"""The ``reach`` command: see and operate a reach namespace.

One sub-app per noun (``reach agents ...``, ``reach dlq ...``); every command takes
``--redis-url`` (``REACH_REDIS_URL``) and ``--namespace`` (``REACH_NAMESPACE``), and every
listing ``--json``.
"""

from __future__ import annotations

import gc
import importlib
import inspect
import json
import logging
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, TypedDict

import anyio
import typer

import reach
from reach import admin
from reach.client import Client
from reach.connection import redact
from reach.embedded import RedisServer, free_port, port_free
from reach.envelope import decode_payload, encode_payload, now_ms
from reach.errors import ConfigError, ReachError, UnknownAgent
from reach.keys import PRIORITIES, Keys
from reach.outcomes import Status
from reach.registry import STATES, Registry
from reach.tasks import get_status

from .common import (
    DEFAULT_NS,
    DEFAULT_REDIS,
    Json,
    Namespace,
    RedisUrl,
    age,
    cli_errors,
    command,
    err_console,
    fail,
    json_line,
    open_redis,
    print_json,
    progress,
    require_text,
    run,
    safe_text,
    table,
    warn,
)
from .top import top as top_cmd

app = typer.Typer(
    name="reach",
    help="reach: AI agents reaching each other by capability, on Redis Streams.\n\n"
    "Start a local Redis with `reach redis`, run agents with `reach worker MODULE:APP`, "
    "and look around with `reach caps`, `reach agents`, `reach queues`, `reach dlq list`.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="markdown",
)
agents_app = typer.Typer(
    help="List, inspect and drain agents.", invoke_without_command=True, no_args_is_help=False
)
dlq_app = typer.Typer(help="Dead letters: list, show, replay, purge.", no_args_is_help=True)
app.add_typer(agents_app, name="agents")
app.add_typer(dlq_app, name="dlq")


def _version(value: bool) -> None:
    if value:
        print(f"reach {reach.__version__}")
        raise typer.Exit()


@app.callback()
def main_callback(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    """reach command line."""


# -- caps ---------------------------------------------------------------------------------
@app.command()
@command
async def caps(
    redis_url: RedisUrl = DEFAULT_REDIS, namespace: Namespace = DEFAULT_NS, json_: Json = False
) -> None:
    """List capabilities and how many live agents declare each.

    Example: reach caps --namespace prod
    """
    r = await open_redis(redis_url)
    try:
        reg = Registry(r, namespace)
        rows = await reg.capabilities()
        ready: dict[str, int] = {}
        for cap, _ in rows:
            ready[cap] = len(await reg.agents(cap, ready=True, state="active"))
    finally:
        await r.aclose()
    if json_:
        print_json([{"capability": c, "agents": n, "ready": ready[c]} for c, n in rows])
        return
    table(
        f"capabilities in {namespace!r}",
        ["capability", "agents", "ready"],
        [(c, n, ready[c]) for c, n in rows],
    )


# -- agents -------------------------------------------------------------------------------
def _agent_row(a: reach.AgentInfo, now: int) -> dict[str, Any]:
    return {
        "agent_id": a.agent_id,
        "state": a.state,
        "ready": a.ready,
        "draining": a.draining,
        "weight": a.weight,
        "version": a.version,
        "instance_id": a.instance_id,
        "capabilities": a.capabilities,
        "metadata": a.metadata,
        "last_heartbeat_ms": a.last_heartbeat_ms,
        "lease_age_ms": _lease_age(a.last_heartbeat_ms, now),
        "queue_depth": a.queue_depth,
        "inflight": a.inflight,
        "registered_ms": a.registered_ms,
    }


@agents_app.callback()
def agents_list(
    ctx: typer.Context,
    cap: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option("--cap", help="Only agents of this capability."),
    ] = None,
    state: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option("--state", help=f"Only agents in this state: {', '.join(STATES)}."),
    ] = None,
    where: Annotated[
        Optional[list[str]], typer.Option("--where", help="Metadata filter KEY=VALUE (repeatable).")  # noqa: UP045
    ] = None,
    redis_url: RedisUrl = DEFAULT_REDIS,
    namespace: Namespace = DEFAULT_NS,
    json_: Json = False,
) -> None:
    """List agents with state, readiness, weight and lease age.

    Examples: reach agents --cap text.summarize --state active;  reach agents --json
    """
    if ctx.invoked_subcommand is not None:
        return
    require_text(
        {"cap": cap, "state": state, "where": where, "redis_url": redis_url, "namespace": namespace}
    )
    if state is not None and state not in STATES:
        fail(f"unknown state {state!r}: use {', '.join(STATES)}")
    filt: dict[str, str] = {}
    for w in where or []:
        if "=" not in w:
            fail(f"--where takes KEY=VALUE, got {w!r}")
        k, v = w.split("=", 1)
        filt[k] = v

    async def body() -> list[reach.AgentInfo]:
        r = await open_redis(redis_url)
        try:
            return await Registry(r, namespace).agents(cap, state=state, where=filt or None)
        finally:
            await r.aclose()

    agents = run(body, url=redis_url)
    now = now_ms()
    if json_:
        print_json([_agent_row(a, now) for a in agents])
        return
    rows = [
        (
            a.agent_id,
            a.state,
            "yes" if a.ready else "no",
            "yes" if a.draining else "",
            _number(a.weight),
            ",".join(map(safe_text, a.capabilities)),
            age(a.last_heartbeat_ms, now),
            a.queue_depth,
            a.inflight,
            " ".join(f"{safe_text(k)}={safe_text(v)}" for k, v in _items(a.metadata)),
        )
        for a in agents
    ]
    table(
        f"agents in {namespace!r}",
        [
            "agent",
            "state",
            "ready",
            "draining",
            "weight",
            "capabilities",
            "lease age",
            "queue",
            "in-flight",
            "metadata",
        ],
        rows,
    )


def _lease_age(last_heartbeat_ms: Any, now: int) -> int | None:
    if isinstance(last_heartbeat_ms, int) and last_heartbeat_ms:
        return max(0, now - last_heartbeat_ms)
    return None


def _number(v: Any) -> str:
    """A number from a record for a table: compact, or as stored when it is not one."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return f"{v:g}"
    return safe_text(v)


def _items(d: Any) -> list[tuple[Any, Any]]:
    return list(d.items()) if isinstance(d, dict) else []


async def _get_agent(redis_url: str, namespace: str, agent_id: str) -> reach.AgentInfo:
    """One agent's record (live or shadow), or UnknownAgent that says where to look."""
    r = await open_redis(redis_url)
    try:
        a = await Registry(r, namespace).get(agent_id)
    finally:
        await r.aclose()
    if a is None:
        raise UnknownAgent(
            f"No agent {agent_id!r} in namespace {namespace!r} (see `reach agents`)."
        )
    return a


@agents_app.command("show")
@command
async def agents_show(
    agent_id: Annotated[str, typer.Argument(help="The agent's id.")],
    redis_url: RedisUrl = DEFAULT_REDIS,
    namespace: Namespace = DEFAULT_NS,
    json_: Json = False,
) -> None:
    """Show one agent's whole record (also shadows of evicted agents).

    Example: reach agents show summarizer-1
    """
    a = await _get_agent(redis_url, namespace, agent_id)
    row = _agent_row(a, now_ms())
    row.update(
        lease_ms=a.lease_ms,
        evict_after_ms=a.evict_after_ms,
        state_ms=a.state_ms,
        ready_ms=a.ready_ms,
        max_queue=a.max_queue,
        card=a.card,
    )
    if json_:
        print_json(row)
        return
    table(f"agent {agent_id}", ["field", "value"], [(k, v) for k, v in row.items()])


@agents_app.command("card")
@command
async def agents_card(
    agent_id: Annotated[str, typer.Argument(help="The agent's id.")],
    redis_url: RedisUrl = DEFAULT_REDIS,
    namespace: Namespace = DEFAULT_NS,
    json_: Json = False,
) -> None:
    """Show an agent as an A2A Agent Card (the card JSON with --json; see docs/a2a.md).

    Example: reach agents card summarizer-1 --json > summarizer-1.agent-card.json
    """
    from reach.card import agent_card, card_problems

    a = await _get_agent(redis_url, namespace, agent_id)
    card = agent_card(a, namespace=namespace)
    for problem in card_problems(card):  # only a card the agent registered with can cause these
        warn(problem)
    if json_:
        print_json(card)
        return
    iface = "\n".join(
        f"{i.get('url')} ({i.get('protocolBinding')})" for i in card["supportedInterfaces"]
    )
    rows = [
        ("name", card["name"]),
        ("description", card["description"]),
        ("version", card["version"]),
        ("interfaces", iface),
        ("input modes", ", ".join(card["defaultInputModes"])),
        ("output modes", ", ".join(card["defaultOutputModes"])),
    ]
    if isinstance(card.get("provider"), dict):
        rows.append(("provider", card["provider"].get("organization", "")))
    table(f"A2A Agent Card of {agent_id}", ["field", "value"], rows)
    table(
        "skills",
        ["id", "name", "description", "tags"],
        [
            (s.get("id"), s.get("name"), s.get("description"), ", ".join(s.get("tags") or []))
            for s in card["skills"]
        ],
    )


@agents_app.command("drain")
@command
async def agents_drain(
    agent_id: Annotated[str, typer.Argument(help="The agent to drain.")],
    redis_url: RedisUrl = DEFAULT_REDIS,
    namespace: Namespace = DEFAULT_NS,
) -> None:
    """Stop routing new work to an agent; it finishes what it holds, then deregisters.

    Example: reach agents drain summarizer-1
    """
    r = await open_redis(redis_url)
    try:
        code = await Registry(r, namespace).drain(agent_id)
    finally:
        await r.aclose()
    print(f"{agent_id}: {'already draining' if code == 2 else 'draining'}")


# -- events -------------------------------------------------------------------------------
@app.command()
@command
async def events(
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new events.")
    ] = False,
    count: Annotated[
        int, typer.Option("--count", min=0, help="How many past events to show (0: none).")
    ] = 50,
    redis_url: RedisUrl = DEFAULT_REDIS,
    namespace: Namespace = DEFAULT_NS,
    json_: Json = False,
) -> None:
    """Show registry events (registered, ready, draining, unstable, evicted, recovered, ...).

    Example: reach events --follow
    """
    r = await open_redis(redis_url)
    reg = Registry(r, namespace)
    try:
        evs = await reg.recent_events(count) if count else []  # XREVRANGE refuses COUNT 0
        last = evs[-1].id if evs else "$"
        if json_ and not follow:
            print_json(evs)
            return
        for e in evs:
            _print_event(e, json_)
        while follow:
            new = await reg.tail_events(last_id=last, block_ms=1000)
            for e in new:
                _print_event(e, json_)
                last = e.id
            sys.stdout.flush()
    finally:
        await r.aclose()


def _print_event(e: Any, as_json: bool) -> None:
    """One event, one line. Anyone holding the namespace's keys can write the events
    stream: whatever a field holds is printed safely (bytes that are not UTF-8 replaced,
    control characters escaped, a time that is not one shown as it is)."""
    fields = {f: getattr(e, f, None) for f in ("id", "type", "agent_id", "instance_id", "ts")}
    if as_json:
        print(json_line(fields))
    else:
        text = {k: safe_text(v, oneline=True) for k, v in fields.items()}
        print(f"{_event_time(fields['ts'])}  {text['type']:<13} {text['agent_id']}")


def _event_time(ts: Any) -> str:
    """``HH:MM:SS.mmm`` of an epoch-ms time; '?' for none (0, what the reader makes of a
    time that is not a number) and anything else as it is."""
    if isinstance(ts, int) and not isinstance(ts, bool) and ts > 0:
        try:
            return time.strftime("%H:%M:%S", time.localtime(ts / 1000)) + f".{ts % 1000:03d}"
        except (OverflowError, OSError, ValueError):
            pass
    if isinstance(ts, int) or not ts:
        return "?"
    return safe_text(ts, oneline=True)


# -- sweep --------------------------------------------------------------------------------
@app.command()
@command
async def sweep(
    redis_url: RedisUrl = DEFAULT_REDIS,
    namespace: Namespace = DEFAULT_NS,
    json_: Json = False,
) -> None:
    """Run the cluster-wide chores once: leases, due retries, inboxes of evicted agents, parked.

    Runtimes do this on their own; use it when no agent is running.
    """
    r = await open_redis(redis_url)
    try:
        res = await admin.sweep_once(r, Keys(namespace), owner="cli", lock_ms=0)
    finally:
        await r.aclose()
    out = {
        "probation": res.probation,
        "evicted": res.evicted,
        "deleted": res.deleted,
        "retries_moved": res.retries_moved,
        "rerouted": res.rerouted,
        "parked": res.parked,
        "released": res.released,
        "expired": res.expired,
        "dead_lettered": res.dead_lettered,
    }
    if json_:
        print_json(out)
    else:
        print(
            f"probation: {res.probation}  evicted: {len(res.evicted)} "
            f"{' '.join(res.evicted)}  shadows deleted: {res.deleted}  "
            f"retries moved: {res.retries_moved}  rerouted: {res.rerouted}  "
            f"parked: {res.parked}  released: {res.released}  expired: {res.expired}"
        )


# -- redis --------------------------------------------------------------------------------
@app.command("redis")
def redis_cmd(
    port: Annotated[
        int, typer.Option("--port", min=0, max=65535, help="TCP port (0 = any free port).")
    ] = 6390,
    data_dir: Annotated[Path, typer.Option("--dir", help="Where data is kept (AOF).")] = Path(
        ".reach/redis"
    ),
) -> None:
    """Run a persistent local Redis for development (AOF everysec, data in .reach/).

    Prints the URL to export as REACH_REDIS_URL; stops on Ctrl-C. One server per data
    directory: a second one on the same --dir is refused.
    """
    with cli_errors():
        server = RedisServer(
            port=port or None, data_dir=data_dir.resolve(), persistent=True, die_with_parent=True
        )
        server.claim_data_dir()  # first: this directory may be served already
        interrupted, exited = False, 0
        try:
            if not port_free(server.port):
                chosen = free_port()
                err_console.print(f"port {server.port} is busy; using {chosen}")
                server.port = chosen
            server.start()
            (data_dir / "url").write_text(server.url + "\n")
            print(server.url, flush=True)
            err_console.print(
                f"{server.binary.origin} server {server.binary.version_str} "
                f"({server.binary.path}), data in {data_dir}/. "
                f"export REACH_REDIS_URL={server.url}  — Ctrl-C to stop.",
                highlight=False,
                markup=False,
            )
            assert server.proc is not None
            # Wait in short steps, not one blocking waitpid(): a Ctrl-C that lands just
            # before the call would otherwise only be seen when Redis exits, i.e. never.
            while True:
                try:
                    exited = server.proc.wait(timeout=0.5)
                    break
                except subprocess.TimeoutExpired:
                    continue
        except KeyboardInterrupt:
            interrupted = True
        finally:
            try:
                server.stop()  # also gives the data directory back
            except KeyboardInterrupt:  # a second Ctrl-C: Redis has its SIGTERM, ends alone
                interrupted = True
        if interrupted:
            raise typer.Exit(130)
        if exited:
            fail(f"Redis exited with code {exited}; see {data_dir / 'server.log'}")


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


LogLevel = Literal["debug", "info", "warning", "error"]
LogFormat = Literal["text", "json"]


async def _serve(agent: reach.Agent, opts: dict[str, Any]) -> int:
    """Run ``agent`` until it stops; return the signal that stopped it (0: none).

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
                    agent.stop()
                else:
                    wlog.warning("second signal: stopping without draining")
                    scope.cancel()
                    return

    async with anyio.create_task_group() as tg:
        tg.start_soon(signals, tg.cancel_scope)
        await agent.run(**opts, handle_signals=False)
        tg.cancel_scope.cancel()
    return got[0] if got else 0


@app.command()
def worker(
    target: Annotated[
        str, typer.Argument(help="MODULE:ATTR of a reach.Agent, e.g. agents.echo:app")
    ],
    redis_url: RedisUrl = DEFAULT_REDIS,
    namespace: Namespace = DEFAULT_NS,
    concurrency: Annotated[int, typer.Option(min=1, help="Handlers running at once.")] = 16,
    heartbeat_s: Annotated[float, typer.Option(help="Seconds between heartbeats.")] = 3.0,
    lease_s: Annotated[float, typer.Option(help="Without a heartbeat this long: probation.")] = 9.0,
    evict_after_s: Annotated[
        float, typer.Option(help="Without a heartbeat this long: evicted.")
    ] = 18.0,
    stall_s: Annotated[
        float, typer.Option(help="Event loop stuck this long: stop heartbeats.")
    ] = 30.0,
    drain_timeout_s: Annotated[
        float, typer.Option(help="Time in-flight work gets on SIGTERM.")
    ] = 30.0,
    sweep_interval_s: Annotated[float, typer.Option(help="Seconds between sweeps.")] = 1.0,
    claim_lease_s: Annotated[
        float, typer.Option(help="Claim lease of messages without deadline.")
    ] = 60.0,
    retry_base_s: Annotated[float, typer.Option(help="First retry backoff.")] = 0.2,
    log_level: Annotated[
        LogLevel, typer.Option(case_sensitive=False, help="debug, info, warning, error.")
    ] = "info",
    log_format: Annotated[
        LogFormat, typer.Option(help="text, or json (one object per line, with the message ids).")
    ] = "text",
    metrics_port: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(min=0, max=65535, help="Serve Prometheus /metrics on this port."),
    ] = None,
    metrics_addr: Annotated[str, typer.Option(help="Address /metrics listens on.")] = "0.0.0.0",
) -> None:
    """Run the reach.Agent found at MODULE:ATTR until SIGTERM/SIGINT (then drain).

    Exit code 0 after SIGTERM, 130 after Ctrl-C (SIGINT), 2 on an error (bad target or
    option, Redis unreachable or refusing, a newer instance of the same agent).

    Example: reach worker examples.summarizer:app --concurrency 32 --lease-s 2 --evict-after-s 4
    """
    from reach import logs, metrics

    require_text(
        {
            "target": target,
            "redis_url": redis_url,
            "namespace": namespace,
            "metrics_addr": metrics_addr,
        }
    )
    with cli_errors(redis_url):
        _check_times(
            heartbeat_s=heartbeat_s,
            lease_s=lease_s,
            evict_after_s=evict_after_s,
            stall_s=stall_s,
            drain_timeout_s=drain_timeout_s,
            sweep_interval_s=sweep_interval_s,
            claim_lease_s=claim_lease_s,
            retry_base_s=retry_base_s,
        )
        logs.setup_logging(log_level.lower(), log_format)
        wlog = logging.getLogger("reach.worker")
        if metrics_port is not None:
            try:
                srv = metrics.serve(metrics_port, metrics_addr)
            except (OSError, ValueError, OverflowError) as e:
                raise ConfigError(
                    f"Cannot serve /metrics on {metrics_addr}:{metrics_port}: {e}"
                ) from e
            wlog.info("metrics on http://%s:%d/metrics", metrics_addr, srv.server_port)
        agent = load_agent(target)
        opts = {
            "redis_url": redis_url,
            "namespace": namespace,
            "concurrency": concurrency,
            "heartbeat_s": heartbeat_s,
            "lease_s": lease_s,
            "evict_after_s": evict_after_s,
            "stall_s": stall_s,
            "drain_timeout_s": drain_timeout_s,
            "sweep_interval_s": sweep_interval_s,
            "claim_lease_s": claim_lease_s,
            "retry_base_s": retry_base_s,
        }
        if log_format == "json":  # stderr stays one JSON object per line
            wlog.info("reach worker: %s on %s ns=%s", agent.agent_id, redact(redis_url), namespace)
        else:
            err_console.print(
                f"reach worker: {agent.agent_id} on {redact(redis_url)} ns={namespace}",
                highlight=False,
                markup=False,
            )
        # Everything imported so far lives as long as the process: keep it out of the
        # collector's generations, so collections stay short on the message path.
        gc.freeze()
        sig = anyio.run(_serve, agent, opts)
    if sig == signal.SIGINT:
        raise typer.Exit(130)


def _check_times(**seconds: float) -> None:
    """Durations must be finite and positive (NaN slips through every comparison); a
    drain timeout and a retry backoff may be 0."""
    for name, v in seconds.items():
        low_ok = name in ("drain_timeout_s", "retry_base_s") and v == 0
        if not (math.isfinite(v) and (v > 0 or low_ok)):
            raise ConfigError(
                f"--{name.replace('_', '-')} must be a number of seconds > 0, not {v}."
            )


# -- messaging ----------------------------------------------------------------------------
class _SendOptions(TypedDict):
    """The options ``reach send`` passes on to :meth:`Client.request` / :meth:`Client.send`."""

    session_id: str | None
    priority: str
    timeout_s: float | None
    idempotency_key: str | None
    target: str | None


@app.command()
@command
async def send(
    capability: Annotated[str, typer.Argument(help="Capability to reach, e.g. text.summarize.")],
    payload: Annotated[str, typer.Argument(help='The payload as JSON, e.g. \'{"text": "hi"}\'.')],
    wait: Annotated[bool, typer.Option("--wait", help="Wait for the result and print it.")] = False,
    priority: Annotated[str, typer.Option(help="high, normal or low.")] = "normal",
    session: Annotated[Optional[str], typer.Option(help="Session id (sticky state).")] = None,  # noqa: UP045
    timeout_s: Annotated[Optional[float], typer.Option(help="Deadline from now, seconds.")] = None,  # noqa: UP045
    idempotency_key: Annotated[Optional[str], typer.Option(help="Same key, same result.")] = None,  # noqa: UP045
    target: Annotated[Optional[str], typer.Option(help="Send to this agent id.")] = None,  # noqa: UP045
    redis_url: RedisUrl = DEFAULT_REDIS,
    namespace: Namespace = DEFAULT_NS,
    json_: Json = False,
) -> None:
    """Send one message to a capability (and with --wait, print the result).

    Example: reach send text.summarize '{"text": "long text"}' --wait --timeout-s 10
    """
    if timeout_s is not None and not (math.isfinite(timeout_s) and timeout_s > 0):
        raise ConfigError(f"--timeout-s must be a number of seconds > 0, not {timeout_s}.")
    try:
        body = json.loads(payload)
    except (json.JSONDecodeError, RecursionError) as e:
        raise ConfigError(f"PAYLOAD is not valid JSON ({e}); quote it, e.g. '{{\"a\": 1}}'.") from e
    try:  # what JSON has and msgpack has not: integers beyond 64 bits, lone surrogates
        encode_payload(body)
    except ReachError:
        raise
    except (OverflowError, ValueError, RecursionError) as e:
        raise ConfigError(
            f"PAYLOAD cannot be sent ({e}): integers must fit in 64 bits and text must be "
            "valid Unicode."
        ) from e
    async with Client(redis_url=redis_url, namespace=namespace) as client:
        kw: _SendOptions = {
            "session_id": session,
            "priority": priority,
            "timeout_s": timeout_s,
            "idempotency_key": idempotency_key,
            "target": target,
        }
        if wait:
            result = await client.request(capability, body, **kw)
            if json_:
                print_json({"result": result})
            else:
                print(json.dumps(result, default=str))
        else:
            msg_id = await client.send(capability, body, **kw)
            if json_:
                print_json({"msg_id": msg_id})
            else:
                print(msg_id)


@app.command()
@command
async def task(
    msg_id: Annotated[str, typer.Argument(help="The msg_id printed by `reach send`.")],
    redis_url: RedisUrl = DEFAULT_REDIS,
    namespace: Namespace = DEFAULT_NS,
    json_: Json = False,
) -> None:
    """Show a message's status: pending, running, succeeded, failed, retrying, expired, dead.

    Example: reach task 019a...e3 --json
    """
    r = await open_redis(redis_url)
    try:
        st = await get_status(r, Keys(namespace), msg_id)
    finally:
        await r.aclose()
    result: Any = None
    if st.reply is not None and st.reply.status == Status.SUCCEEDED:
        try:
            result = decode_payload(st.reply.result)
        except Exception:  # noqa: BLE001 - whatever the stored bytes are, the rest is shown
            result = "<undecodable>"
    row = {
        "msg_id": st.msg_id,
        "status": st.status,
        "capability": st.capability,
        "agent_id": st.agent_id,
        "attempt": st.attempt,
        "runs": st.runs,
        "error": st.error,
        "updated_ms": st.updated_ms,
        "idempotency_key": st.idempotency_key or st.msg_id,
        "result": result,
    }
    if json_:
        print_json(row)
    else:
        table(f"task {msg_id}", ["field", "value"], [(k, v) for k, v in row.items()])
    if st.status == Status.UNKNOWN:
        raise typer.Exit(1)


@app.command()
@command
async def queues(
    redis_url: RedisUrl = DEFAULT_REDIS, namespace: Namespace = DEFAULT_NS, json_: Json = False
) -> None:
    """Per agent inbox: depth per priority, pending (delivered, not acked), oldest pending age."""
    r = await open_redis(redis_url)
    keys = Keys(namespace)
    try:
        stats = await admin.inbox_stats(r, keys, await admin.inbox_agents(r, keys))
    finally:
        await r.aclose()
    now = now_ms()
    out = [
        {
            "agent_id": x.agent_id,
            **x.depth,
            "pending": x.pending,
            "oldest_pending_ms": x.oldest_pending_ms,
            "oldest_pending_age_ms": now - x.oldest_pending_ms if x.oldest_pending_ms else None,
        }
        for x in stats
    ]
    if json_:
        print_json(out)
        return
    table(
        f"inboxes in {namespace!r}",
        ["agent", *PRIORITIES, "pending", "oldest pending"],
        [
            (
                x["agent_id"],
                *(x[p] for p in PRIORITIES),
                x["pending"],
                age(x["oldest_pending_ms"] or 0, now),
            )
            for x in out
        ],
    )


# -- dead letters ---------------------------------------------------------------------------
CapOpt = Annotated[Optional[str], typer.Option("--cap", help="Only this capability.")]  # noqa: UP045


@dlq_app.command("list")
@command
async def dlq_list(
    cap: CapOpt = None,
    limit: Annotated[int, typer.Option(min=1, help="At most this many per capability.")] = 100,
    redis_url: RedisUrl = DEFAULT_REDIS,
    namespace: Namespace = DEFAULT_NS,
    json_: Json = False,
) -> None:
    """List dead letters (newest last) with reason, attempts and last error."""
    r = await open_redis(redis_url)
    try:
        found = await admin.list_dead_letters(r, Keys(namespace), capability=cap, limit=limit)
    finally:
        await r.aclose()
    letters = [e.letter for e in found]
    if json_:
        print_json([{k: v for k, v in _dl_row(d).items()} for d in letters])
        return
    table(
        f"dead letters in {namespace!r}",
        ["id", "capability", "reason", "attempts", "agent", "msg_id", "error"],
        [
            (
                d.id,
                d.capability,
                d.reason,
                d.attempts,
                d.agent_id,
                d.msg_id,
                safe_text(d.error)[:80],
            )
            for d in letters
        ],
    )


def _dl_row(d: Any) -> dict[str, Any]:
    return {
        "id": d.id,
        "capability": d.capability,
        "reason": d.reason,
        "attempts": d.attempts,
        "agent_id": d.agent_id,
        "msg_id": d.msg_id,
        "error": d.error,
        "error_type": d.error_type,
        "ts": d.ts,
    }


@dlq_app.command("show")
@command
async def dlq_show(
    entry_id: Annotated[str, typer.Argument(help="Dead letter id (from `reach dlq list`).")],
    cap: CapOpt = None,
    redis_url: RedisUrl = DEFAULT_REDIS,
    namespace: Namespace = DEFAULT_NS,
    json_: Json = False,
) -> None:
    """Show one dead letter with its original envelope."""
    r = await open_redis(redis_url)
    try:
        found = await admin.find_dead_letter(r, Keys(namespace), entry_id, capability=cap)
    finally:
        await r.aclose()
    d = found.letter
    row = _dl_row(d)
    env = d.envelope
    if env is not None:
        row["envelope"] = {f: getattr(env, f) for f in env.__struct_fields__ if f != "payload"}
        try:
            row["payload"] = decode_payload(env.payload)
        except Exception:  # noqa: BLE001 - whatever the failure, the rest is still shown
            row["payload"] = "<undecodable>"
    else:
        row["raw"] = d.raw[:200].hex()
    if json_:
        print_json(row)
    else:
        table(f"dead letter {entry_id}", ["field", "value"], [(k, v) for k, v in row.items()])


@dlq_app.command("replay")
@command
async def dlq_replay(
    entry_id: Annotated[Optional[str], typer.Argument(help="Dead letter id to replay.")] = None,  # noqa: UP045
    all_: Annotated[
        bool, typer.Option("--all", help="Replay every dead letter (of --cap).")
    ] = False,
    cap: CapOpt = None,
    redis_url: RedisUrl = DEFAULT_REDIS,
    namespace: Namespace = DEFAULT_NS,
    json_: Json = False,
) -> None:
    """Send dead letters again (same msg_id and idempotency key, attempts from 1).

    Examples: reach dlq replay 1717171717171-0;  reach dlq replay --all --cap text.summarize
    """
    if bool(entry_id) == bool(all_):
        raise ConfigError("Give either a dead letter ID or --all.")
    r = await open_redis(redis_url)
    keys = Keys(namespace)
    try:
        if entry_id:
            targets = [await admin.find_dead_letter(r, keys, entry_id, capability=cap)]
        else:
            targets = await admin.list_dead_letters(r, keys, capability=cap, limit=None)
        with progress(len(targets), "replayed") as step:  # a bar on a tty, else lines
            res = await admin.replay_dead_letters(r, keys, targets, on_each=step)
    finally:
        await r.aclose()
    if json_:
        print_json(
            {
                "replayed": res.replayed,
                "failed": [{"id": f.id, "error": f.error} for f in res.failed],
            }
        )
    else:
        print(f"replayed {res.replayed}, failed {len(res.failed)}")
        for f in res.failed:
            print(f"  {f.id}: {f.error}")
    if res.failed:
        raise typer.Exit(1)


@dlq_app.command("purge")
@command
async def dlq_purge(
    cap: CapOpt = None,
    yes: Annotated[bool, typer.Option("--yes", help="Really delete them.")] = False,
    redis_url: RedisUrl = DEFAULT_REDIS,
    namespace: Namespace = DEFAULT_NS,
) -> None:
    """Delete dead letters for good (all, or one capability's). Needs --yes."""
    if not yes:
        raise ConfigError("This deletes dead letters for good: add --yes to confirm.")
    r = await open_redis(redis_url)
    try:
        n = await admin.purge_dead_letters(r, Keys(namespace), capability=cap)
    finally:
        await r.aclose()
    print(f"purged {n} dead letters")


# -- top ----------------------------------------------------------------------------------
app.command("top")(top_cmd)  # the live view lives in top.py


# -- demo ---------------------------------------------------------------------------------
@app.command()
def demo(
    fast: Annotated[bool, typer.Option(help="Shorter pauses (used by the tests).")] = False,
) -> None:
    """A guided tour on an embedded Redis: agents register, talk, fail, get evicted."""
    from .demo import run_demo

    with cli_errors():
        run_demo(fast=fast)


# -- bench --------------------------------------------------------------------------------
@app.command()
def bench(
    messages: Annotated[int, typer.Option(help="Backlog of fire-and-forget messages.")] = 30_000,
    requests: Annotated[int, typer.Option(help="Sequential request/reply calls.")] = 3_000,
    concurrency: Annotated[int, typer.Option(help="The worker's handlers at once.")] = 64,
    json_: Json = False,
) -> None:
    """Measure messaging on an embedded Redis with one `reach worker` process.

    Throughput of a fire-and-forget backlog (claim, handler, fenced completion, ack),
    request/reply latency p50/p99 with one sequential caller, Redis commands and round
    trips per message. Example: reach bench --messages 30000 --requests 3000
    """
    from .tools.bench import format_report, run_bench

    bars: dict[str, Any] = {}
    counts: dict[str, int] = {}

    def on_progress(phase: str, done: int, total: int) -> None:
        if phase not in bars:
            for other in list(bars):  # one phase at a time
                bars.pop(other).__exit__(None, None, None)
            bars[phase] = progress(total, phase, every=max(1, total // 10))
            counts[phase] = 0
            bars[phase].__enter__()
        bars[phase].step(done - counts[phase])
        counts[phase] = done

    try:
        with cli_errors():  # out-of-range figures: ConfigError, one error line
            out = run_bench(
                messages=messages,
                requests=requests,
                concurrency=concurrency,
                progress=on_progress,
            )
    finally:
        for b in bars.values():
            b.__exit__(None, None, None)
    if json_:
        print_json(out)
    else:
        print(format_report(out))


# -- chaos --------------------------------------------------------------------------------
@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def chaos(ctx: typer.Context) -> None:
    """Kill workers and Redis mid-stream, check nothing is lost or run twice (--help: options)."""
    from .tools.chaos import main as chaos_main

    raise typer.Exit(chaos_main(ctx.args, prog="reach chaos"))


def main() -> None:
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
