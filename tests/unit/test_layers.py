"""The library's modules import downward only.

A request's path through the code reads forward (client -> routing -> script layer ->
inbox; consumer -> execution -> settlement -> reply) only if no module imports one above
it. These tests read the import statements of every module of ``reach/`` (those inside
functions included: they run too; those under ``TYPE_CHECKING`` excluded: they never run)
and hold them to a rank per module, so a new upward import fails here with the edge named.
Importing ``reach.a.b`` runs ``reach/a/__init__.py`` too, so that package counts as
imported. No module may form an import cycle, and none may be over 800 lines (one
responsibility per module: a longer one is split along its seams).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import reach

ROOT = Path(reach.__file__).parent

# Lower ranks never import higher ones. Within one rank, imports go either way but must
# not form a cycle (checked below).
RANKS: dict[str, int] = {
    # foundations: no Redis logic of their own
    "reach._version": 0,
    "reach.errors": 0,
    "reach.clock": 0,  # the host's clock corrected by its offset to Redis's TIME
    "reach._expiry": 0,  # time limits of single awaits, one loop timer for all
    "reach.untrusted": 0,
    "reach.outcomes": 0,
    "reach.keys": 0,
    "reach.envelope": 0,
    "reach.signing": 0,  # HMAC signatures of envelopes and replies (no Redis)
    "reach.connection": 0,
    "reach._redis_url": 0,  # a Redis URL: its scheme, redacted, the errors with hints
    "reach._sentinel": 0,  # redis+sentinel:// URLs and the clients of the current master
    "reach._pool": 0,
    "reach._redislike": 0,
    "reach.embedded": 0,
    "reach.breaker": 0,
    "reach.logs": 0,
    "reach.config": 0,  # where the Redis is: redis_url=, REACH_REDIS_URL, project file
    "reach.tenants": 1,  # the tenant map: tenant id -> Redis URL and namespace
    "reach.planes": 0,  # the control plane's Redis: registry_url=, REACH_REGISTRY_URL, reach.toml
    "reach.callpath": 0,  # call paths: hop limit, loops, self-calls (no Redis)
    "reach._tokens": 0,  # bearer tokens of the HTTP faces (gateway, MCP), constant-time checks
    "reach._jwt": 0,  # JWT bearer tokens of the HTTP faces (PyJWT, a JWKS file or URL)
    # the script layer: one typed call per Lua script
    "reach.scripts": 1,
    "reach._autopipe": 1,  # auto-pipelining of the commands a Client issues (script layer)
    "reach._autopipe.pending": 1,  # the queued command and the limits every path shares
    "reach._autopipe.mux": 1,  # the multiplexed connection (standalone, one per Cluster node)
    "reach._autopipe.cluster": 1,  # a Cluster's commands routed by slot to the node's mux
    "reach._autopipe.core": 1,  # AutoPipeline: the client surface, the queue, the pipelines
    # state in Redis, read and written through the script layer
    "reach.registry": 2,
    "reach.registry.records": 2,  # AgentInfo, Event, the limits: a record as read from Redis
    "reach.registry.operations": 2,  # Registry: the scripts and the reads over the shards
    "reach.tasks": 2,
    "reach.recent": 2,  # the index of recent messages (settle writes it, listings read it)
    "reach.session": 2,
    "reach.schemas": 2,  # capability schemas from handler annotations (msgspec JSON Schema)
    "reach.view": 2,
    "reach.limits": 2,  # rate limits per capability (set by operators, taken by workers)
    "reach.quotas": 2,  # per-tenant quotas (set by operators, applied by clients)
    "reach.acl": 2,  # least-privilege users per role (reach acl, reach doctor's ACL check)
    "reach.doctor": 2,  # checks of the Redis under reach (reach doctor, start-up warnings)
    "reach._blocking": 2,  # a connection held for one task's blocking stream reads
    "reach._replies": 2,  # a Client's reply stream: its reader and the waiting calls
    "reach._chunks": 2,  # a streamed call's chunks, reassembled in order, each once
    "reach._control": 2,  # a Client's connection to the control plane (registry_url)
    "reach._cancel": 2,  # cancelling a message: cancel.lua and the workers' notice
    "reach.steps": 2,  # ctx.step: a handler's durable steps, journaled in its record
    "reach.watch": 2,  # following a task's changes (client.watch, ctx.progress)
    "reach.authz": 2,  # who may call what: allow lists, levels, the operator's rules
    "reach.asking": 2,  # ctx.ask / client.answer: human input, kept in the task record
    "reach.guards": 2,  # guards on content: what a guard is, the built-ins (no Redis)
    "reach.audit": 2,  # the audit trail: operator actions and audited calls (reach audit)
    # routing: pure picks over the view
    "reach.routing": 3,
    # the caller side and what watches it
    "reach.hooks": 4,
    "reach.metrics": 4,
    "reach.client": 4,
    "reach._sending": 4,  # the caller's send path (a package of the three below)
    "reach._sending.delivery": 4,  # a Client's routing and inbox writes (one and many)
    "reach._sending.plain": 4,  # the plain send's fast path: one look, one pick, the write
    "reach.splits": 4,  # version canaries: capabilities' splits in Redis, session pins
    "reach._versions": 4,  # a Client's split and pinned version of each message it routes
    "reach._sending.coalesce": 4,  # concurrent single deliveries gathered into batch calls
    "reach._reroute": 4,  # moving a message a slow agent has not started (reroute_after_s)
    "reach._hedge": 4,  # hedge_after_s: a second copy of a slow request to another agent
    "reach._task_calls": 4,  # Client.answer, scheduled (a base class)
    "reach._batches": 4,  # Client.send_many, request_many, broadcast, gather (a base class)
    "reach._defaults": 4,  # what a call gets unsaid: its deadline, the fallback per failure
    "reach._buffer": 4,  # a Client's sends held locally through a Redis outage
    "reach.context": 4,
    "reach._sessions": 4,  # session tiers: cached copies, write-behind, best effort
    "reach._sessions.tiers": 4,  # SessionTier: the consistency a handler declares
    "reach._sessions.cache": 4,  # a process's copies of cached sessions, and their channel
    "reach._sessions.buffered": 4,  # the write-behind session (cached, best_effort)
    "reach._sessions.store": 4,  # what a worker gives its contexts: ctx.session by tier
    "reach._streaming": 4,  # Client.stream: a streamed call's iterator
    "reach._many": 4,  # Client.send_many, request_many, broadcast: the batch forms
    "reach._later": 4,  # after a send: cancel on a caller's abort, Client.result later
    "reach.resume": 4,  # Client.resume: a streamed message's kept chunks, from any process
    "reach.scheduling": 4,  # scheduled sends: kept in Redis until due (Client.send(at=))
    "reach.gather": 4,  # Client.gather (a quorum of agents' answers) and vote
    "reach._emitting": 4,  # ctx.emit / async-generator handlers: chunks to the caller
    "reach.card": 4,
    # namespace-wide chores and operator operations
    "reach.sweeper": 5,
    "reach.admin": 5,
    "reach.overview": 5,  # a namespace at a glance (reach top, reach web)
    # the worker process, and the public face of it
    "reach._worker": 6,
    "reach.agent": 7,
    "reach.health": 7,  # /healthz and /readyz of a process's agents, beside /metrics
    "reach.a2a": 7,  # reach.a2a.remote: an external A2A agent served as a reach agent
    "reach": 8,
    # faces over the library, never imported by it (optional extras)
    "reach._http": 9,  # the HTTP faces' limits (fds, connections, bodies, slow readers)
    "reach._access": 9,  # the HTTP faces' IP lists, bearer tokens and JWTs, rate per caller
    "reach._tenant_apps": 9,  # every tenant behind one HTTP face (X-Reach-Tenant)
    "reach.web": 9,  # reach web: the operator console (starlette)
    "reach.web.formatting": 9,  # how the pages write times, rates, JSON, query strings
    "reach.web.console": 9,  # Console: what the pages share, the contexts they render
    "reach.web.routes": 9,  # the routes by group: overview, messages, dead letters, forms
    "reach.web.app": 9,  # the app: the guard in front, the route table, the lifespan
    "reach.gateway": 9,  # reach gateway: A2A servers over HTTP (a2a-sdk, starlette)
    "reach.gateway.executor": 9,  # an A2A message as a reach streamed request
    "reach.gateway.handler": 9,  # the JSON-RPC methods (tasks/get, tasks/cancel from reach)
    "reach.gateway.cards": 9,  # the gateway's, a capability's and an agent's card
    "reach.gateway.resuming": 9,  # SSE event ids and Last-Event-ID on the A2A streams
    "reach.gateway.server": 9,  # Gateway: the app, its limits and auth, routing a message
    "reach.gateway.tenants": 9,  # every tenant of the map behind one gateway (a header)
    "reach.mcp": 9,  # reach mcp and reach.mcp.remote: MCP both ways (the mcp SDK)
    "reach.mcp.mapping": 9,  # capabilities, calls, chunks and errors in MCP terms
    "reach.mcp.server": 9,  # McpFace: the tools, the calls, stdio and streamable HTTP
    "reach.mcp.remote": 9,  # reach.mcp.remote: an outside MCP server's tools as capabilities
}

# The worker's own data path, in order: a part may call the parts after it, never before.
WORKER_PATH = [
    "reach._worker.runtime",
    "reach._worker.liveness",
    "reach._worker.consumer",
    "reach._worker.execution",
    "reach._worker.preempting",
    "reach._worker.cancelling",
    "reach._worker.outcome",
    "reach._worker.settlement",
]


def _modules() -> dict[str, tuple[Path, bool]]:
    mods: dict[str, tuple[Path, bool]] = {}
    for f in ROOT.rglob("*.py"):
        parts = list(f.relative_to(ROOT.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts = parts[:-1]
        mods[".".join(parts)] = (f, is_pkg)
    return mods


MODULES = _modules()


def _imports(name: str) -> set[str]:
    """The reach modules ``name`` imports when it runs."""
    path, is_pkg = MODULES[name]
    here = name.split(".") if is_pkg else name.split(".")[:-1]
    found: set[str] = set()

    class Visitor(ast.NodeVisitor):
        def visit_If(self, node: ast.If) -> None:
            # Only ``if TYPE_CHECKING:`` never runs its body (``if not TYPE_CHECKING:`` does).
            if ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
                for stmt in node.orelse:
                    self.visit(stmt)
            else:
                self.generic_visit(node)

        def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
            if node.level:
                base = here[: len(here) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            for alias in node.names:
                full = f"{mod}.{alias.name}"
                found.add(full if full in MODULES else mod)

        def visit_Import(self, node: ast.Import) -> None:
            found.update(alias.name for alias in node.names)

    Visitor().visit(ast.parse(path.read_text()))
    # Importing reach.a.b runs reach/a/__init__.py first: an edge to that package too,
    # unless it is one of this module's own packages (already being imported).
    own = {".".join(name.split(".")[:i]) for i in range(1, len(name.split(".")) + 1)}
    for m in list(found):
        parts = m.split(".")
        found.update(".".join(parts[:i]) for i in range(2, len(parts)))
    return {m for m in found if m in MODULES and m not in own}


GRAPH = {m: _imports(m) for m in MODULES}


def _rank(module: str) -> int:
    best = ""
    for prefix in RANKS:
        if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > len(best):
            best = prefix
    assert best, f"{module} has no rank in tests/unit/test_layers.py: give it one"
    return RANKS[best]


def test_every_module_has_a_rank() -> None:
    for module in MODULES:
        _rank(module)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_imports_one_above_it(module: str) -> None:
    upward = sorted(d for d in GRAPH[module] if _rank(d) > _rank(module))
    assert not upward, f"{module} (rank {_rank(module)}) imports {upward}, which rank above it"


def test_the_worker_path_reads_forward() -> None:
    for i, module in enumerate(WORKER_PATH):
        back = sorted(set(WORKER_PATH[:i]) & GRAPH[module])
        assert not back, f"{module} imports {back}, which come before it on the worker's path"


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (its modules in order, the first repeated at the end),
    or None."""
    seen: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def walk(module: str, path: list[str]) -> list[str] | None:
        seen[module] = 1
        for dep in sorted(graph.get(module, ())):
            if seen.get(dep) == 1:
                return path[path.index(dep) :] + [dep]
            if dep not in seen and (found := walk(dep, [*path, dep])):
                return found
        seen[module] = 2
        return None

    for module in sorted(graph):
        if module not in seen and (found := walk(module, [module])):
            return found
    return None


def test_no_import_cycle() -> None:
    cycle = _cycle(GRAPH)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_check_finds_a_cycle() -> None:
    """Through a package's __init__ too (importing reach.p.m runs reach/p/__init__.py)."""
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert "reach._worker" in GRAPH["reach.agent"]  # the package of reach._worker.runtime
    assert "reach._worker" not in GRAPH["reach._worker.runtime"]  # its own package


# A module longer than this holds more than one responsibility: split it along its seams
# (a package, or a sibling module) so the path a reader follows fits in one view.
MAX_LINES = 800


def _lines(module: str) -> int:
    return len(MODULES[module][0].read_text().splitlines())


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_is_over_800_lines(module: str) -> None:
    lines = _lines(module)
    assert lines <= MAX_LINES, (
        f"{MODULES[module][0].relative_to(ROOT.parent)} ({module}) has {lines} lines, over "
        f"{MAX_LINES}: split it along its seams (docs/architecture.md, The parts)"
    )


def test_the_checker_sees_an_upward_import(tmp_path: Path) -> None:
    """The parser above finds imports in functions and ignores TYPE_CHECKING ones: a check
    that would pass whatever the code is would be no check."""
    assert "reach.client" in GRAPH["reach.sweeper"]
    assert "reach.agent" not in GRAPH["reach._worker.runtime"]  # TYPE_CHECKING only
    assert any("reach._worker" in d for d in GRAPH["reach.agent"])
