"""The ``reach`` command: see and operate a reach namespace.

One sub-app per noun (``reach agents ...``, ``reach dlq ...``); every command takes
``--redis-url`` (``REACH_REDIS_URL``) and ``--namespace`` (``REACH_NAMESPACE``), and every
listing ``--json``.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Optional, TypedDict

import typer
from typer.core import TyperArgument, TyperGroup, TyperOption

import reach
from reach import admin, audit
from reach.client import Client
from reach.config import ENV_URL, PROJECT_FILES, URL_KEY, read_project_file, write_project_url
from reach.connection import redact
from reach.embedded import RedisServer, free_port, port_free
from reach.envelope import encode_payload, now_ms
from reach.errors import ConfigError, ReachError
from reach.keys import PRIORITIES, Keys
from reach.registry import Registry

from . import caps_access_cmd  # noqa: F401 - adds allow, deny and access to `reach caps`
from .acl_cmd import acl_cmd
from .agents_cmd import agents_app
from .audit_cmd import audit_cmd
from .cancel_cmd import cancel as cancel_cmd
from .caps_cmd import caps_app
from .chaos_cmd import chaos as chaos_cmd
from .common import (
    DEFAULT_NS,
    DEFAULT_REDIS,
    Json,
    Namespace,
    RedisUrl,
    add_secret_file_options,
    add_wide_option,
    age,
    cli_errors,
    command,
    err_console,
    fail,
    json_line,
    open_control,
    open_control_apart,
    open_redis,
    print_json,
    progress,
    registry_url_for,
    require_text,
    safe_text,
    table,
)
from .completion import complete_agent_id, complete_capability
from .dlq_cmd import dlq_app
from .doctor_cmd import doctor as doctor_cmd
from .gateway_cmd import gateway as gateway_cmd
from .keys_cmd import keys_app
from .mcp_cmd import mcp as mcp_cmd
from .mcp_cmd import mcp_proxy as mcp_proxy_cmd
from .quota_cmd import quota_app
from .task_cmd import task_app
from .tasks_cmd import tasks as tasks_cmd
from .top import top as top_cmd
from .web_cmd import web as web_cmd
from .worker_cmd import worker

app = typer.Typer(
    name="reach",
    help="reach: AI agents reaching each other by capability, on Redis Streams.\n\n"
    "Start a local Redis with `reach redis`, run agents with `reach worker MODULE:APP`, "
    "and look around with `reach caps`, `reach agents`, `reach queues`, `reach dlq list`.",
    no_args_is_help=True,
    add_completion=True,  # --install-completion, --show-completion (completion.py)
    rich_markup_mode="markdown",
)
app.add_typer(agents_app, name="agents")
app.add_typer(dlq_app, name="dlq")
app.add_typer(caps_app, name="caps")
app.add_typer(quota_app, name="quota")
app.add_typer(keys_app, name="keys")


def _version(value: bool) -> None:
    if value:
        print(f"reach {reach.__version__}")
        raise typer.Exit()


@app.callback()
def main_callback(
    ctx: typer.Context,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
    as_: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            "--as",
            metavar="NAME",
            envvar=audit.ENV_OPERATOR,
            show_envvar=True,
            help="Who you are, for the audit trail (reach audit): the operator named in "
            "the entries of the changes you make. Default: your OS user at this host.",
        ),
    ] = None,
) -> None:
    """reach command line."""
    require_text({"as": as_})
    token = audit.acting_as(as_, via="cli")
    # Undone when the command ends: a program (or a test) running commands in-process
    # does not stay "the CLI" afterwards.
    ctx.call_on_close(lambda: audit.reset_operator(token))


# -- caps: cli/reach_cli/caps_cmd.py ------------------------------------------------------

# -- audit: cli/reach_cli/audit_cmd.py ----------------------------------------------------
app.command("audit")(audit_cmd)


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
    r = await open_control(redis_url)
    reg = Registry(r, namespace)
    try:
        evs = await reg.recent_events(count) if count else []  # XREVRANGE refuses COUNT 0
        if json_ and not follow:
            print_json(evs)
            return
        for e in evs:
            _print_event(e, json_)
        # From a position, not "$": an event landing between two reads is not missed.
        last = evs[-1].id if evs else (await reg.events_position() if follow else "")
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
    if getattr(e, "detail", ""):  # replaced: the host, pid and successor of an instance
        fields["detail"] = e.detail
    if as_json:
        print(json_line(fields))
    else:
        text = {k: safe_text(v, oneline=True) for k, v in fields.items()}
        line = f"{_event_time(fields['ts'])}  {text['type']:<13} {text['agent_id']}"
        if "detail" in fields:
            line += f"  instance={text['instance_id']} {text['detail']}"
        print(line)


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
    control = await open_control_apart(redis_url)
    try:
        res = await admin.sweep_once(r, Keys(namespace), owner="cli", lock_ms=0, control=control)
    finally:
        await r.aclose()
        if control is not None:
            await control.aclose()
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

    Prints its URL and writes it to .reach/config, where every reach command run in this
    directory or below finds it (elsewhere, export REACH_REDIS_URL); stops on Ctrl-C. One
    server per data directory: a second one on the same --dir is refused.
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
            project = write_project_url(server.url, Path(PROJECT_FILES[1]))
            print(server.url, flush=True)
            err_console.print(
                f"{server.binary.origin} server {server.binary.version_str} "
                f"({server.binary.path}), data in {data_dir}/. reach commands run in "
                f"this directory or below find it ({project}); elsewhere: "
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


# -- init ---------------------------------------------------------------------------------
@app.command()
def init(
    redis_url: Annotated[
        str,
        typer.Option(
            "--redis-url",
            metavar="URL",
            show_default=False,
            help="The Redis this project uses (else REACH_REDIS_URL).",
        ),
    ] = "",
    force: Annotated[
        bool, typer.Option("--force", help="Replace the redis_url of an existing reach.toml.")
    ] = False,
) -> None:
    """Write reach.toml here: the Redis every reach command (and reach.Client, reach.Agent)
    run in this directory or below uses when no --redis-url / REACH_REDIS_URL is given.

    Example: reach init --redis-url redis://redis.internal:6379/0
    """
    require_text({"redis_url": redis_url})
    with cli_errors():
        url = redis_url or os.environ.get(ENV_URL, "").strip()
        if not url:
            raise ConfigError(
                "reach init needs the Redis to write down: --redis-url URL (or "
                "REACH_REDIS_URL). For a local development Redis, run `reach redis` "
                "instead: it writes .reach/config by itself."
            )
        target = Path(PROJECT_FILES[0])
        if target.is_file() and not force:
            old = read_project_file(target).get(URL_KEY)
            if old is not None and old != url:
                raise ConfigError(
                    f"{target.resolve()} already names {redact(str(old))}: pass --force to "
                    "replace it."
                )
        write_project_url(url, target)
    print(f"wrote {target.resolve()}: {URL_KEY} = {redact(url)}")


# -- worker -------------------------------------------------------------------------------
app.command()(worker)
app.command("tasks")(tasks_cmd)  # recent messages, as the console lists them

# -- doctor -------------------------------------------------------------------------------
app.command("doctor")(doctor_cmd)
app.command("acl")(acl_cmd)  # least-privilege Redis users (docs/security.md)
app.command("gateway")(gateway_cmd)  # A2A servers over HTTP (the gateway extra; docs/a2a.md)
app.command("mcp")(mcp_cmd)  # capabilities as MCP tools (the mcp extra; docs/mcp.md)
app.command("mcp-proxy")(mcp_proxy_cmd)  # an MCP server's tools as capabilities (docs/mcp.md)


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
    capability: Annotated[
        str,
        typer.Argument(
            help="Capability to reach, e.g. text.summarize.", autocompletion=complete_capability
        ),
    ],
    payload: Annotated[str, typer.Argument(help='The payload as JSON, e.g. \'{"text": "hi"}\'.')],
    wait: Annotated[bool, typer.Option("--wait", help="Wait for the result and print it.")] = False,
    stream: Annotated[
        bool,
        typer.Option(
            "--stream",
            help="Print the handler's streamed chunks as they come, then its result.",
        ),
    ] = False,
    priority: Annotated[str, typer.Option(help="high, normal or low.")] = "normal",
    session: Annotated[Optional[str], typer.Option(help="Session id (sticky state).")] = None,  # noqa: UP045
    timeout_s: Annotated[Optional[float], typer.Option(help="Deadline from now, seconds.")] = None,  # noqa: UP045
    idempotency_key: Annotated[Optional[str], typer.Option(help="Same key, same result.")] = None,  # noqa: UP045
    target: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(help="Send to this agent id.", autocompletion=complete_agent_id),
    ] = None,
    at: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            "--at",
            metavar="WHEN",
            help="Send it then: ISO 8601 with a timezone (2030-01-01T09:00:00+00:00) or epoch "
            "seconds; kept in Redis until due (see `reach tasks --scheduled`).",
        ),
    ] = None,
    delay_s: Annotated[
        Optional[float],  # noqa: UP045
        typer.Option("--delay-s", help="Send it this many seconds from now (kept in Redis)."),
    ] = None,
    redis_url: RedisUrl = DEFAULT_REDIS,
    namespace: Namespace = DEFAULT_NS,
    json_: Json = False,
) -> None:
    """Send one message to a capability (and with --wait, print the result; with
    --stream, each streamed chunk as it comes, then the result; with --at or --delay-s,
    later: --timeout-s then counts from its due time).

    Example: reach send text.summarize '{"text": "long text"}' --wait --timeout-s 10
    """
    when = _when(at)
    if (when is not None or delay_s is not None) and (wait or stream):
        raise ConfigError(
            "--at and --delay-s schedule a send: use them without --wait or --stream."
        )
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
    registry_url = registry_url_for(redis_url)
    async with Client(
        redis_url=redis_url, registry_url=registry_url, namespace=namespace
    ) as client:
        kw: _SendOptions = {
            "session_id": session,
            "priority": priority,
            "timeout_s": timeout_s,
            "idempotency_key": idempotency_key,
            "target": target,
        }
        if stream:
            await print_stream(client, capability, body, kw, json_=json_)
        elif wait:
            result = await client.request(capability, body, **kw)
            if json_:
                print_json({"result": result})
            else:
                print(json.dumps(result, default=str))
        else:
            msg_id = await client.send(capability, body, at=when, delay_s=delay_s, **kw)
            if json_:
                print_json({"msg_id": msg_id})
            else:
                print(msg_id)


def _when(at: str | None) -> datetime | float | None:
    """``--at``: epoch seconds, or an ISO 8601 time (its timezone is checked by the send)."""
    if at is None:
        return None
    try:
        return float(at)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(at)
    except ValueError as e:
        raise ConfigError(
            f"--at {at!r}: give ISO 8601 with a timezone (2030-01-01T09:00:00+00:00) or epoch "
            "seconds."
        ) from e


async def print_stream(
    client: Client, capability: str, body: Any, kw: _SendOptions, *, json_: bool
) -> None:
    """``reach send --stream``: each chunk on its own line as it comes (a text chunk as it
    is, others as JSON), then the final result unless None; with --json one JSON line per
    chunk (``{"chunk": ...}``), then ``{"result": ...}``."""
    s = client.stream(capability, body, **kw)
    async for chunk in s:
        if json_:
            line = json_line({"chunk": chunk})
        else:  # text as it is (a token stream reads as text), anything else as JSON
            line = chunk if isinstance(chunk, str) else json_line(chunk)
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
    if json_:
        sys.stdout.write(json_line({"result": s.result}) + "\n")
    elif s.result is not None:
        sys.stdout.write(json_line(s.result) + "\n")


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


# -- top ----------------------------------------------------------------------------------
app.add_typer(task_app(), name="task")  # reach task MSG_ID, reach task answer MSG_ID JSON
app.command("cancel")(cancel_cmd)  # reach cancel MSG_ID (reach task MSG_ID shows it)
app.command("top")(top_cmd)  # the live view lives in top.py


# -- web: the operator console (cli/reach_cli/web_cmd.py; the reach-fabric[web] extra) -----------
app.command("web")(web_cmd)


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
    messages: Annotated[
        int, typer.Option(help="Backlog of fire-and-forget messages (throughput phase).")
    ] = 30_000,
    requests: Annotated[
        int, typer.Option(help="Sequential request/reply calls (latency phase).")
    ] = 3_000,
    stream_messages: Annotated[
        int,
        typer.Option(
            help="Messages of the streaming workload: sent with Client.send, 50 in flight, "
            "while the worker runs (0 skips it; --floor needs it)."
        ),
    ] = 20_000,
    concurrency: Annotated[int, typer.Option(help="The worker's handlers at once.")] = 64,
    floor: Annotated[
        bool,
        typer.Option(
            "--floor",
            help="Also run the streaming and latency workloads on two redis-py Streams loops, "
            "the bare floor (no guarantees) and the lean floor (reach's core guarantees kept), "
            "same Redis, same run, and print reach's figures as ratios to each.",
        ),
    ] = False,
    repeat: Annotated[
        int,
        typer.Option(
            help="Rounds of every phase (reach and the floor alternating which goes first); "
            "figures are medians, each ratio the median of the rounds' ratios."
        ),
    ] = 1,
    json_: Json = False,
) -> None:
    """Measure messaging on an embedded Redis with one `reach worker` process.

    Phases, each with a fresh worker process (`--concurrency` handlers): throughput of a
    fire-and-forget backlog loaded while the worker is stopped (claim, handler, fenced
    completion, ack); streaming throughput, one caller sending while the worker runs
    (processed = the inbox's consumer group has read and acked every entry); request/reply
    latency p50/p99 with one sequential caller; Redis commands and round trips per message.

    --floor adds two floors, run alternately with reach in every round. The bare floor
    (reach_cli.tools.floor), no guarantees: a caller pipelining XADD 500 per batch and a
    worker process doing XREADGROUP COUNT 100 and one pipeline of reply XADDs and an XACK
    per batch. The lean floor (reach_cli.tools.lean_floor), the simplest code keeping
    reach's core guarantees: one Lua call per 500 messages adds each inbox entry with its
    idempotency record (pending, claimed at send, fence 1, 24 h TTL); a worker process
    reads XREADGROUP COUNT 100 and completes each batch in one Lua call (fence check,
    result into the record, reply XADD, XACK, XDEL). Ratios: throughput = reach msgs/s /
    floor msgs/s, p50, p99 = reach's / the floor's, and CPU per processed message of each
    process (caller, worker, Redis). Goals against the bare floor: throughput >= 0.9, p50
    <= 1.5, p99 <= 2; against the lean floor: throughput >= 0.8, p50 <= 1.3, p99 <= 1.5,
    CPU caller <= 2, worker <= 1.5, Redis <= 1.25. Only figures of the same run are
    compared. Example: reach bench --floor --repeat 3
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
                stream_messages=stream_messages,
                concurrency=concurrency,
                floor=floor,
                repeat=repeat,
                progress=on_progress,
            )
    finally:
        for b in bars.values():
            b.__exit__(None, None, None)
    if json_:
        print_json(out)
    else:
        print(format_report(out))


@app.command(
    "bench-scaling",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def bench_scaling(ctx: typer.Context) -> None:
    """Scaling figures: 1/2/4 workers, 1/10/100 agents, 1 KB/64 KB payloads, a 10,000-way fan-out (--help: options)."""
    from .tools.scaling import main as scaling_main

    raise typer.Exit(scaling_main(ctx.args, prog="reach bench-scaling"))


# -- chaos --------------------------------------------------------------------------------
app.command("chaos")(chaos_cmd)  # its options are the harness parser's (chaos_cmd.py)


add_secret_file_options(app)  # --redis-url-file, --redis-password-file wherever --redis-url is
# --wide wherever --json is: listings fit the terminal, or not. Not on chaos: it prints no
# table, and its options are the harness parser's, as bench/chaos.py takes them.
add_wide_option(app, skip=frozenset({"chaos"}))

METAVARS = {"where": "KEY=VALUE", "namespace": "NS", "redis_url": "URL", "timeout_s": "SECONDS"}


def tidy_help(cmd: Any) -> Any:
    """``cmd`` (and its sub-commands) with real placeholders in help and usage: flags show
    none, an option or argument its name in capitals (``--cap CAP``, ``AGENT_ID``), never
    a type name (``<bool>``, ``<list[str]>``) or a ``{name}``."""
    for p in cmd.params:
        if p.metavar is not None or not p.name:
            continue
        if isinstance(p, TyperOption) and p.is_flag:
            p.metavar = ""
        else:
            p.metavar = METAVARS.get(p.name, p.name.upper())
        if isinstance(p, TyperArgument):  # typer writes {NAME} and <str> for these
            _plain_argument(p)
    get_help = cmd.get_help_option

    def help_option(ctx: Any) -> Any:  # --help is a flag: no placeholder either
        opt = get_help(ctx)
        if opt is not None:
            opt.metavar = ""
        return opt

    cmd.get_help_option = help_option
    if isinstance(cmd, TyperGroup):
        for sub in cmd.commands.values():
            tidy_help(sub)
    return cmd


def _plain_argument(p: Any) -> None:
    """Show argument ``p`` as its metavar in usage (``AGENT_ID``, ``[ENTRY_ID]``) and with
    no type name in the arguments table."""
    shown = p.metavar if p.required else f"[{p.metavar}]"

    def usage_name() -> str:
        return str(shown)

    def no_type(ctx: Any) -> str:
        return ""

    p._usage_display_name = usage_name
    p.display_type_rich = no_type


def command_line() -> Any:
    """The ``reach`` command as it runs (:func:`main`), help placeholders tidied."""
    return tidy_help(typer.main.get_command(app))


def main() -> None:
    command_line()(prog_name="reach")


if __name__ == "__main__":  # pragma: no cover
    main()
