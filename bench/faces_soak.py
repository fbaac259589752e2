"""The soak of reach's HTTP faces: two ``reach gateway`` processes and one ``reach web``
console on one Redis, legitimate A2A callers (the official ``a2a-sdk`` client) while
hostile ones attack, every process under a low open-files limit (docs/a2a.md and
docs/web.md, *The soak*).

Hostile callers, all at once with the legitimate ones:

* streams opened and never read (a handler streaming far past ``--max-task-bytes``);
* oversized bodies (declared by Content-Length, and chunked without one);
* another caller's task ids (get and cancel through the other gateway process) and
  context ids (a send naming them: the session must be the sender's own);
* idle sockets past each process's open-files limit, opened in waves.

Checked: every legitimate request answered with its own result (a caller retries a 503
or a refused connection, as a well-behaved client does), every hostile request refused
as documented, each process's RSS under its bound throughout (sampled every 0.2 s),
each log under its bound (no flood)::

    python bench/faces_soak.py                 # 1,000 legitimate requests (the long form)
    python bench/faces_soak.py --legit 100 --idle 300 --open-files 256   # the CI form

``tests/integration/test_faces_soak.py`` runs the short form; the figures of the long one
are in docs/a2a.md and docs/web.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parent.parent
NS = "soak"
TOKENS = {
    "alice": "alice-soak-token-0123456789",
    "bob": "bob-soak-token-0123456789ab",
    "mallory": "mallory-soak-token-01234567",
}
MiB = 1024 * 1024


def agent() -> Any:
    """The soak's agent (``reach worker bench.faces_soak:agent``): ``soak.echo`` (the
    payload back, with the session and caller it saw), ``soak.flood`` (streams ``n``
    chunks of ``size`` characters), ``soak.slow`` (sleeps the payload's seconds)."""
    from reach import Agent, Context

    app = Agent(
        os.environ.get("SOAK_AGENT_ID", "soak-1"),
        capabilities=["soak.echo", "soak.flood", "soak.slow"],
    )

    @app.handler("soak.echo")
    async def echo(payload: Any, ctx: Context) -> Any:
        return {
            "echo": payload,
            "session": ctx.session_id,
            "caller": ctx.envelope.headers.get("a2a-caller", ""),
        }

    @app.handler("soak.flood")
    async def flood(payload: Any, ctx: Context) -> AsyncIterator[Any]:
        chunk = "x" * int(payload["size"])
        for _ in range(int(payload["n"])):
            yield chunk

    @app.handler("soak.slow")
    async def slow(payload: Any, ctx: Context) -> Any:
        await anyio.sleep(float(payload))
        return "late"

    return app


def rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return 0
    return 0


def _limit(open_files: int) -> Callable[[], None]:
    def set_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files))

    return set_limit


@dataclass
class Report:
    """What a soak saw (see :func:`soak`)."""

    legit: int = 0
    answered: int = 0
    retries: int = 0
    wrong: list[str] = field(default_factory=list)
    legit_wall_s: float = 0.0
    console_polls: int = 0
    console_answered: int = 0
    streams_opened: int = 0
    oversized_sent: int = 0
    oversized_refused: int = 0
    foreign_ids_tried: int = 0
    foreign_ids_refused: int = 0
    foreign_contexts_tried: int = 0
    foreign_contexts_own_session: int = 0
    idle_opened: int = 0
    peak_rss: dict[str, int] = field(default_factory=dict)
    log_bytes: dict[str, int] = field(default_factory=dict)
    alive: dict[str, bool] = field(default_factory=dict)

    def lines(self) -> list[str]:
        mb = {k: v / MiB for k, v in self.peak_rss.items()}
        return [
            (
                f"legitimate A2A requests: {self.answered}/{self.legit} answered with their "
                f"own result in {self.legit_wall_s:.1f} s ({self.retries} retries after a 503 "
                f"or a refused connection); wrong answers: {len(self.wrong)}"
            ),
            f"console pages: {self.console_answered}/{self.console_polls} answered",
            (
                f"hostile: {self.streams_opened} never-read streams, "
                f"{self.oversized_refused}/{self.oversized_sent} oversized bodies refused 413, "
                f"{self.foreign_ids_refused}/{self.foreign_ids_tried} foreign task ids not "
                f"found, {self.foreign_contexts_own_session}/{self.foreign_contexts_tried} "
                f"foreign context ids given their own session, {self.idle_opened} idle sockets"
            ),
            "peak RSS: " + ", ".join(f"{k} {v:.0f} MB" for k, v in mb.items()),
            "log bytes: " + ", ".join(f"{k} {v}" for k, v in self.log_bytes.items()),
        ]


def _start(cmd: list[str], log: Path, open_files: int, env: dict[str, str]) -> Any:
    with open(log, "wb") as out:
        return subprocess.Popen(
            cmd,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            env=env,
            preexec_fn=_limit(open_files),  # noqa: PLW1509 - only sets limits, before exec
        )


def _stop(proc: Any) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return int(proc.wait(timeout=30))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _free_port() -> int:
    from reach.embedded import free_port

    return free_port()


async def _wait_http(url: str, proc: Any, log: Path, timeout_s: float = 60) -> None:
    import httpx

    async with httpx.AsyncClient(timeout=5) as h:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{url} exited: {log.read_text()[-2000:]}")
            try:
                if (await h.get(url)).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await anyio.sleep(0.2)
    raise RuntimeError(f"{url} did not answer in {timeout_s} s")


def _stream_request(port: int, token: str) -> bytes:
    body = json.dumps(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "SendStreamingMessage",
            "params": {
                "message": {
                    "messageId": f"flood-{time.monotonic_ns()}",
                    "role": "ROLE_USER",
                    "parts": [{"data": {"n": 600, "size": 65536}}],
                }
            },
        }
    ).encode()
    head = (
        f"POST /caps/soak.flood HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Authorization: Bearer {token}\r\nA2A-Version: 1.0\r\n"
        "Content-Type: application/json\r\nAccept: text/event-stream\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def _open_idle(port: int, n: int, held: list[socket.socket]) -> int:
    opened = 0
    for _ in range(n):
        s = socket.socket()
        s.setblocking(False)
        try:
            s.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        except OSError:
            s.close()
            break
        held.append(s)
        opened += 1
    return opened


async def soak(
    redis_url: str,
    workdir: Path,
    *,
    legit: int = 1000,
    streams: int = 6,
    oversized: int = 6,
    foreign: int = 40,
    idle: int = 1100,
    open_files: int = 1024,
    namespace: str = NS,
) -> Report:
    """Run the soak against ``redis_url`` (processes started here, logs in ``workdir``)."""
    import httpx
    from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
    from a2a.helpers.proto_helpers import get_data_parts, new_data_part
    from a2a.types.a2a_pb2 import (
        CancelTaskRequest,
        GetTaskRequest,
        Message,
        Role,
        SendMessageRequest,
        TaskState,
    )
    from a2a.utils.errors import TaskNotFoundError

    from reach.envelope import new_id

    report = Report(legit=legit)
    env = {**os.environ, "REACH_GATEWAY_TOKENS": ",".join(f"{k}:{v}" for k, v in TOKENS.items())}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "cli"), env.get("PYTHONPATH", "")])
    common = ["--redis-url", redis_url, "--namespace", namespace]
    procs: dict[str, Any] = {}
    logs: dict[str, Path] = {}
    ports: dict[str, int] = {}
    worker_log = workdir / "worker.log"
    worker = _start(
        [sys.executable, "-m", "reach_cli.app", "worker", "bench.faces_soak:agent",
         *common, "--concurrency", "64", "--log-level", "warning"],
        worker_log, 4096, env,
    )  # fmt: skip
    for name in ("gateway1", "gateway2"):
        ports[name] = _free_port()
        logs[name] = workdir / f"{name}.log"
        procs[name] = _start(
            [sys.executable, "-m", "reach_cli.app", "gateway", "--port", str(ports[name]),
             *common, "--timeout-s", "300", "--max-task-bytes", str(8 * MiB),
             "--send-timeout-s", "5", "--header-timeout-s", "3"],
            logs[name], open_files, env,
        )  # fmt: skip
    ports["console"] = _free_port()
    logs["console"] = workdir / "console.log"
    procs["console"] = _start(
        [sys.executable, "-m", "reach_cli.app", "web", "--port", str(ports["console"]),
         *common, "--header-timeout-s", "3"],
        logs["console"], open_files, env,
    )  # fmt: skip
    urls = {n: f"http://127.0.0.1:{p}" for n, p in ports.items()}
    held: list[socket.socket] = []
    done = anyio.Event()
    try:
        for name in ("gateway1", "gateway2"):
            await _wait_http(f"{urls[name]}/.well-known/agent-card.json", procs[name], logs[name])
            await _wait_http(
                f"{urls[name]}/caps/soak.echo/.well-known/agent-card.json",
                procs[name],
                logs[name],
            )
        await _wait_http(urls["console"] + "/", procs["console"], logs["console"])
        for name, p in procs.items():
            report.peak_rss[name] = rss_bytes(p.pid)

        async def sample() -> None:
            while not done.is_set():
                for name, p in procs.items():
                    report.peak_rss[name] = max(report.peak_rss[name], rss_bytes(p.pid))
                await anyio.sleep(0.2)

        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        pools: dict[tuple[str, str], list[httpx.AsyncClient]] = {}
        clients: dict[tuple[str, str], list[Any]] = {}
        for gw in ("gateway1", "gateway2"):
            for who in ("alice", "bob", "mallory"):
                hs = [
                    httpx.AsyncClient(
                        headers={"Authorization": f"Bearer {TOKENS[who]}"},
                        timeout=300,
                        limits=limits,
                    )
                    for _ in range(10 if who != "mallory" else 1)
                ]
                pools[gw, who] = hs
                url = f"{urls[gw]}/caps/soak.echo"
                card = await A2ACardResolver(hs[0], url).get_agent_card()
                clients[gw, who] = [
                    ClientFactory(ClientConfig(httpx_client=h, streaming=False)).create(card)
                    for h in hs
                ]
        finished: list[tuple[str, str, str]] = []  # (gateway, caller, task id)

        def request(i: int, context_id: str) -> Any:
            return SendMessageRequest(
                message=Message(
                    role=Role.ROLE_USER,
                    message_id=new_id(),
                    context_id=context_id,
                    parts=[new_data_part({"i": i})],
                )
            )

        async def one(i: int) -> None:
            gw = "gateway1" if i % 2 == 0 else "gateway2"
            who = "alice" if i % 4 < 2 else "bob"
            a2a = clients[gw, who][i % len(clients[gw, who])]
            deadline = time.monotonic() + 240
            while True:
                try:
                    resp = [e async for e in a2a.send_message(request(i, f"ctx-{i}"))]
                    break
                except Exception as e:  # noqa: BLE001 - a 503 or a refused connection: retry
                    if time.monotonic() > deadline:
                        report.wrong.append(f"{i}: no answer ({type(e).__name__}: {e})")
                        return
                    report.retries += 1
                    await anyio.sleep(0.5)
            task = resp[-1].task
            got = get_data_parts(task.artifacts[0].parts)[0] if task.artifacts else None
            want = {"echo": {"i": i}, "session": f"a2a:{who}:ctx-{i}", "caller": who}
            if task.status.state != TaskState.TASK_STATE_COMPLETED or got != want:
                report.wrong.append(f"{i}: {TaskState.Name(task.status.state)} {got}")
                return
            report.answered += 1
            finished.append((gw, who, task.id))

        async def legit_all() -> None:
            t0 = time.monotonic()
            async with anyio.create_task_group() as tg:
                for i in range(legit):
                    tg.start_soon(one, i)
            report.legit_wall_s = time.monotonic() - t0

        async def console() -> None:
            async with httpx.AsyncClient(timeout=30) as h:
                while not done.is_set():
                    report.console_polls += 1
                    for _ in range(60):
                        try:
                            if (await h.get(urls["console"] + "/")).status_code == 200:
                                report.console_answered += 1
                                break
                        except httpx.TransportError:
                            pass
                        await anyio.sleep(0.5)
                    await anyio.sleep(0.5)

        async def never_read() -> None:
            for k in range(streams):
                gw = "gateway1" if k % 2 == 0 else "gateway2"
                s = socket.create_connection(("127.0.0.1", ports[gw]))
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                s.sendall(_stream_request(ports[gw], TOKENS["mallory"]))
                held.append(s)
                report.streams_opened += 1
                await anyio.sleep(0.3)

        async def too_large() -> None:
            big = json.dumps({"pad": "x" * (40 * MiB)}).encode()

            async def chunks() -> AsyncIterator[bytes]:
                for _ in range(40):
                    yield b"x" * MiB

            async with httpx.AsyncClient(
                headers={"Authorization": f"Bearer {TOKENS['mallory']}", "A2A-Version": "1.0"},
                timeout=120,
            ) as h:
                for k in range(oversized):
                    gw = "gateway1" if k % 2 == 0 else "gateway2"
                    report.oversized_sent += 1
                    for _ in range(120):  # past a 503 (the connection bound) or a refusal
                        try:
                            if k % 2:
                                r = await h.post(f"{urls[gw]}/caps/soak.echo", content=chunks())
                            else:
                                r = await h.post(f"{urls[gw]}/caps/soak.echo", content=big)
                        except httpx.TransportError:
                            await anyio.sleep(0.5)
                            continue
                        if r.status_code != 503:
                            report.oversized_refused += r.status_code == 413
                            break
                        await anyio.sleep(0.5)

        async def foreign_ids() -> None:
            seen = 0
            while report.foreign_ids_tried < foreign and not done.is_set():
                if seen >= len(finished):
                    await anyio.sleep(0.2)
                    continue
                gw, _, task_id = finished[seen]
                seen += 1
                other = "gateway2" if gw == "gateway1" else "gateway1"
                mallory = clients[other, "mallory"][0]
                report.foreign_ids_tried += 1
                for _ in range(120):  # past a 503 or a refused connection, as legit ones
                    try:
                        if seen % 2:
                            await mallory.get_task(GetTaskRequest(id=task_id))
                        else:
                            await mallory.cancel_task(CancelTaskRequest(id=task_id))
                        break  # answered with the task: another caller's, a leak
                    except TaskNotFoundError:
                        report.foreign_ids_refused += 1
                        break
                    except Exception:  # noqa: BLE001 - a 503 or a refused connection
                        await anyio.sleep(0.5)
                if seen % 4 == 0:  # and a send under the owner's context id
                    report.foreign_contexts_tried += 1
                    i = 1_000_000 + seen
                    for _ in range(120):
                        try:
                            resp = [
                                e async for e in mallory.send_message(request(i, f"ctx-{seen}"))
                            ]
                        except Exception:  # noqa: BLE001 - a 503 or a refused connection
                            await anyio.sleep(0.5)
                            continue
                        art = resp[-1].task.artifacts
                        got = get_data_parts(art[0].parts)[0] if art else {}
                        if got.get("session") == f"a2a:mallory:ctx-{seen}":
                            report.foreign_contexts_own_session += 1
                        break

        async def idle_waves() -> None:
            for _ in range(2):
                for name in procs:
                    report.idle_opened += _open_idle(ports[name], idle, held)
                await anyio.sleep(4)

        async with anyio.create_task_group() as tg:
            tg.start_soon(sample)
            tg.start_soon(console)
            tg.start_soon(never_read)
            tg.start_soon(too_large)
            tg.start_soon(idle_waves)
            tg.start_soon(foreign_ids)
            await legit_all()
            with anyio.move_on_after(60):
                while report.foreign_ids_tried < min(foreign, report.answered):
                    await anyio.sleep(0.2)
            done.set()
        for hs in pools.values():
            for h in hs:
                await h.aclose()
    finally:
        done.set()
        for s in held:
            s.close()
        for name, p in procs.items():
            report.alive[name] = p.poll() is None
        for p in procs.values():
            _stop(p)
        _stop(worker)
        for name, log in logs.items():
            report.log_bytes[name] = log.stat().st_size if log.exists() else 0
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--legit", type=int, default=1000, help="legitimate A2A requests")
    ap.add_argument("--idle", type=int, default=1100, help="idle sockets per process per wave")
    ap.add_argument("--open-files", type=int, default=1024, help="each server's RLIMIT_NOFILE")
    ap.add_argument("--streams", type=int, default=6, help="never-read streams")
    ap.add_argument("--oversized", type=int, default=6, help="oversized bodies")
    ap.add_argument("--workdir", type=Path, default=None, help="keep the logs here")
    args = ap.parse_args()
    from reach.embedded import RedisServer

    print(f"python {' '.join(sys.argv)}")
    with RedisServer() as srv, tempfile.TemporaryDirectory() as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        report = anyio.run(
            lambda: soak(
                srv.url,
                workdir,
                legit=args.legit,
                idle=args.idle,
                open_files=args.open_files,
                streams=args.streams,
                oversized=args.oversized,
            )
        )
    for line in report.lines():
        print(line)
    for w in report.wrong[:10]:
        print("  wrong:", w)


if __name__ == "__main__":
    main()
