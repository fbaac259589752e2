"""Health a platform reads: ``/healthz`` and ``/readyz`` of the agents a process runs,
served beside Prometheus ``/metrics`` (``reach worker --metrics-port``, or :func:`serve`).

* ``GET /healthz`` (liveness): 200 while every running agent's event loop makes progress
  and its heartbeat thread comes round; 503 when one has not for ``stall_s`` (the loop) or
  ``evict_after_s`` (the thread): restarting the process is what helps. Redis being away
  is not a liveness failure (a restart would not bring it back), nor is starting (before
  the agents run) or draining.
* ``GET /readyz`` (readiness): 200 when every agent of the process is registered, its
  lease running (a heartbeat answered within ``lease_s``), ready in the registry (its
  ``@app.readiness`` check passing, not paused by ``set_ready(False)``, its consumer
  moving) and not draining; 503 otherwise, and before the agents have started.

Both answer from the process's own state, without a Redis call, so a probe costs
microseconds and never waits on Redis. The body is a short JSON object saying why::

    {"status": "ok", "agents": 2}
    {"status": "not ready", "why": {"summarizer-1": ["readiness check returned False"]}}

Every other path serves the metrics, as prometheus-client's own server does.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import REGISTRY, CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from .agent import Agent

__all__ = ["HEALTHZ", "READYZ", "Health", "serve"]

log = logging.getLogger("reach.health")

HEALTHZ = "/healthz"
READYZ = "/readyz"

MAX_LISTED = 20
"""Agents named in a 503's body at most (a process may run a thousand): the rest counted."""

Probe = tuple[int, dict[str, Any]]


class Health:
    """The liveness and readiness of the agents of this process (``agents`` may be set
    after the probes are served: a worker serves them while it still imports its agent)."""

    def __init__(self, agents: Iterable[Agent] = ()) -> None:
        self.agents: Sequence[Agent] = list(agents)

    def live(self) -> Probe:
        """``/healthz``: (200 or 503, the body)."""
        failing: dict[str, list[str]] = {}
        running = 0
        for a in self.agents:
            rt = a.runtime
            readiness = rt.readiness if rt is not None else None
            if readiness is None:  # not started yet, or stopped: nothing to judge
                continue
            running += 1
            why = readiness.not_alive()
            if why:
                failing[a.agent_id] = why
        if failing:
            return 503, {"status": "failing", "why": _listed(failing)}
        return 200, {"status": "ok", "agents": running}

    def ready(self) -> Probe:
        """``/readyz``: (200 or 503, the body)."""
        if not self.agents:
            return 503, {"status": "not ready", "why": {"process": ["starting: no agent yet"]}}
        held: dict[str, list[str]] = {}
        for a in self.agents:
            rt = a.runtime
            readiness = rt.readiness if rt is not None else None
            why = ["not running"] if readiness is None else readiness.not_ready()
            if why:
                held[a.agent_id] = why
        if held:
            return 503, {"status": "not ready", "why": _listed(held)}
        return 200, {"status": "ready", "agents": len(self.agents)}


def _listed(why: dict[str, list[str]]) -> dict[str, Any]:
    if len(why) <= MAX_LISTED:
        return why
    out: dict[str, Any] = dict(list(why.items())[:MAX_LISTED])
    out["..."] = [f"{len(why) - MAX_LISTED} more agents"]
    return out


class _Quiet(WSGIRequestHandler):
    """A request handler that logs nothing (probes come every few seconds)."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


def app(health: Health, registry: CollectorRegistry = REGISTRY) -> Callable[..., Any]:
    """The WSGI app: the two probes, and the metrics on every other path."""
    metrics = make_wsgi_app(registry)
    probes: dict[str, Callable[[], Probe]] = {HEALTHZ: health.live, READYZ: health.ready}

    def serve_request(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        probe = probes.get(environ.get("PATH_INFO", ""))
        if probe is None:
            return metrics(environ, start_response)
        method = environ.get("REQUEST_METHOD", "GET")
        if method not in ("GET", "HEAD"):
            start_response("405 Method Not Allowed", [("Allow", "GET, HEAD")])
            return [b""]
        try:
            code, body = probe()
        except Exception:  # a bug: say so rather than drop the connection
            log.exception("%s failed", environ.get("PATH_INFO"))
            code, body = 503, {"status": "error", "why": {"process": ["the probe failed"]}}
        data = json.dumps(body, separators=(",", ":")).encode()
        start_response(
            "200 OK" if code == 200 else "503 Service Unavailable",
            [
                ("Content-Type", "application/json"),
                ("Content-Length", str(len(data))),
                ("Cache-Control", "no-store"),
            ],
        )
        return [b"" if method == "HEAD" else data]

    return serve_request


def serve(
    port: int,
    addr: str = "0.0.0.0",
    health: Health | None = None,
    registry: CollectorRegistry = REGISTRY,
) -> Any:
    """Serve ``/healthz``, ``/readyz`` and ``/metrics`` on ``addr:port`` from a daemon
    thread; returns the server (``server.server_port``: the port, useful with ``port=0``;
    ``server.shutdown()`` stops it)."""

    class Server(ThreadingWSGIServer):
        pass

    # an IPv6 address needs an IPv6 socket (as prometheus-client's own server does)
    family, _, _, _, sockaddr = socket.getaddrinfo(
        addr, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    Server.address_family = family
    httpd = make_server(
        str(sockaddr[0]), port, app(health or Health(), registry), Server, handler_class=_Quiet
    )
    threading.Thread(target=httpd.serve_forever, name="reach-metrics", daemon=True).start()
    return httpd
