"""compose/: the YAML is well-formed, every file it mounts exists, redis.conf has the
documented durability, and the real server binary accepts the config files and the
server command lines it runs; the example agents' commands run for real and serve the
/metrics that compose/prometheus.yml scrapes (Docker itself is not needed)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from reach.embedded import RedisServer, ServerBinary, _die_with_parent_hook, free_port
from reach.keys import Keys

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_DIR = ROOT / "compose"
COMPOSE_FILE = COMPOSE_DIR / "docker-compose.yml"
REDIS_CONF = COMPOSE_DIR / "redis.conf"
SENTINEL_CONFS = [COMPOSE_DIR / f"sentinel-{i}.conf" for i in (1, 2, 3)]
PROMETHEUS_CONF = COMPOSE_DIR / "prometheus.yml"
EXAMPLE_AGENTS = {
    "agent-planner": "planner",
    "agent-summarizer": "summarizer",
    "agent-reviewer": "reviewer",
}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE_FILE.read_text())
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    svcs = compose["services"]
    assert isinstance(svcs, dict) and svcs
    return svcs


def _profiles(svc: dict[str, Any]) -> set[str]:
    return set(svc.get("profiles") or [])


def _volumes(svc: dict[str, Any]) -> list[tuple[str, str]]:
    """(source, target) of each volume of a service, short or long syntax."""
    out = []
    for v in svc.get("volumes") or []:
        if isinstance(v, str):
            parts = v.split(":")
            out.append((parts[0], parts[1]) if len(parts) > 1 else ("", parts[0]))
        else:
            out.append((v.get("source", ""), v["target"]))
    return out


def _is_bind(source: str) -> bool:
    return source.startswith((".", "/", "~"))


def _command(svc: dict[str, Any]) -> list[str]:
    cmd = svc.get("command") or []
    return cmd.split() if isinstance(cmd, str) else [str(c) for c in cmd]


def _directives(path: Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, *args = line.split()
            out.setdefault(key.lower(), []).append(" ".join(args))
    return out


# --- the YAML ---------------------------------------------------------------------------


def test_profiles_and_services(services: dict[str, dict[str, Any]]) -> None:
    default = {n for n, s in services.items() if not _profiles(s)}
    assert default == {"redis"}
    by_profile: dict[str, set[str]] = {}
    for name, svc in services.items():
        for p in _profiles(svc):
            by_profile.setdefault(p, set()).add(name)
    assert by_profile["sentinel"] == {
        "redis-primary",
        "redis-replica",
        "sentinel-1",
        "sentinel-2",
        "sentinel-3",
    }
    assert by_profile["cluster"] == {"redis-node-1", "redis-node-2", "redis-node-3", "cluster-init"}
    assert by_profile["examples"] == {*EXAMPLE_AGENTS, "prometheus"}
    for name, svc in services.items():
        if name in EXAMPLE_AGENTS:
            assert "build" in svc, name
        elif name == "prometheus":
            assert re.fullmatch(r"prom/prometheus:v\d+\.\d+\.\d+", svc["image"]), "pinned"
        else:
            assert re.fullmatch(r"redis:7(\.\d+)*(-\w+)?", svc["image"]), (name, svc["image"])


def test_default_redis_uses_redis_conf_and_is_published_on_localhost(
    services: dict[str, dict[str, Any]],
) -> None:
    redis_svc = services["redis"]
    cmd = _command(redis_svc)
    assert cmd[0] == "redis-server"
    assert ("./redis.conf", cmd[1]) in _volumes(redis_svc)
    assert all(p.startswith("127.0.0.1:") for p in redis_svc["ports"]), "no password: local only"


def test_sentinel_set_up(services: dict[str, dict[str, Any]]) -> None:
    replica = _command(services["redis-replica"])
    i = replica.index("--replicaof")
    assert replica[i + 1 : i + 3] == ["redis-primary", "6379"]
    for n in (1, 2, 3):
        svc = services[f"sentinel-{n}"]
        assert "--sentinel" in " ".join(_command(svc))
        assert (f"./sentinel-{n}.conf", "/etc/reach/sentinel.conf") in _volumes(svc)


def test_cluster_set_up(services: dict[str, dict[str, Any]]) -> None:
    for n in (1, 2, 3):
        cmd = _command(services[f"redis-node-{n}"])
        assert cmd[cmd.index("--cluster-enabled") + 1] == "yes"
    init = services["cluster-init"]
    script = " ".join(_command(init))
    assert "redis-cli --cluster create" in script
    assert "--cluster-replicas 0" in script
    assert init["restart"] == "no"
    assert set(init["depends_on"]) == {"redis-node-1", "redis-node-2", "redis-node-3"}


def test_every_mounted_file_exists(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    declared = set(compose.get("volumes") or {})
    for name, svc in services.items():
        for source, _target in _volumes(svc):
            if _is_bind(source):
                assert (COMPOSE_DIR / source).exists(), f"{name} mounts missing {source}"
            elif source:
                assert source in declared, f"{name} uses undeclared volume {source}"
        for env_file in [svc["env_file"]] if isinstance(svc.get("env_file"), str) else []:
            assert (COMPOSE_DIR / env_file).exists(), f"{name}: missing env_file {env_file}"
        build = svc.get("build")
        if build:
            context = build if isinstance(build, str) else build.get("context", ".")
            assert (COMPOSE_DIR / context).is_dir(), f"{name}: missing build context"
            dockerfile = (
                "Dockerfile" if isinstance(build, str) else build.get("dockerfile", "Dockerfile")
            )
            assert (COMPOSE_DIR / context / dockerfile).is_file(), f"{name}: missing {dockerfile}"
    for section in ("configs", "secrets"):
        for name, item in (compose.get(section) or {}).items():
            if "file" in item:
                assert (COMPOSE_DIR / item["file"]).exists(), f"{section}.{name}"


def test_config_files_used_in_commands_are_mounted(services: dict[str, dict[str, Any]]) -> None:
    for name, svc in services.items():
        targets = {t for _s, t in _volumes(svc)}
        script = " ".join(_command(svc))
        for path in re.findall(r"(/\S+\.conf)\b", script):
            # /data/... is the service's own volume (sentinels copy their file there)
            assert path in targets or path.startswith("/data/"), f"{name}: {path} not mounted"


def test_depends_on_stays_within_profiles(services: dict[str, dict[str, Any]]) -> None:
    for name, svc in services.items():
        for dep in svc.get("depends_on") or []:
            assert dep in services, f"{name} depends on unknown {dep}"
            assert _profiles(services[dep]) <= _profiles(svc) or not _profiles(services[dep]), (
                f"{name} depends on {dep}, which its profiles do not start"
            )


def test_shell_dollars_are_escaped_for_compose(services: dict[str, dict[str, Any]]) -> None:
    """Compose interpolates `$VAR` itself; a shell variable must be written `$$VAR`."""
    for name, svc in services.items():
        for part in _command(svc):
            for m in re.finditer(r"\$+", part):
                dollars = m.group()
                nxt = part[m.end() : m.end() + 1]
                assert len(dollars) % 2 == 0 or nxt == "{", f"{name}: unescaped $ in {part!r}"


# --- redis.conf and the real server -----------------------------------------------------


def test_redis_conf_has_documented_durability() -> None:
    d = _directives(REDIS_CONF)
    assert d["appendonly"] == ["yes"]
    assert d["appendfsync"] == ["everysec"]
    assert d["maxmemory-policy"] == ["noeviction"], "stream data must never be evicted"
    assert "dir" not in d, "keep the image's /data default so --dir works outside Docker"


@contextmanager
def _server(argv: list[str], port: int, cwd: Path) -> Iterator[redis.Redis]:
    """Run a server command line (on ``port``, never 6379) until it answers PING."""
    assert port != 6379
    with (cwd / "stderr.log").open("wb") as err:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=err,
            stderr=err,
            preexec_fn=_die_with_parent_hook(),  # noqa: PLW1509 - prctl only
        )
    client = redis.Redis(port=port, decode_responses=True, socket_timeout=5)
    try:
        deadline = time.monotonic() + 15
        while True:
            if proc.poll() is not None:
                pytest.fail(f"{argv} exited {proc.returncode}: {(cwd / 'stderr.log').read_text()}")
            try:
                if client.ping():
                    break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
        yield client
    finally:
        client.close()
        proc.kill()
        proc.wait(timeout=10)


def _local_argv(binary: ServerBinary, svc: dict[str, Any], port: int, data: Path) -> list[str]:
    """A service's `redis-server ...` command with its mounted files mapped to the repo."""
    mounts = {t: str((COMPOSE_DIR / s).resolve()) for s, t in _volumes(svc) if _is_bind(s)}
    cmd = _command(svc)
    assert cmd[0] == "redis-server"
    argv = [binary.path] + [mounts.get(a, a) for a in cmd[1:]]
    # Last options win: a free port on loopback and a temp dir instead of 6379 and /data.
    return argv + ["--port", str(port), "--bind", "127.0.0.1", "--dir", str(data)]


def test_redis_conf_is_accepted_by_the_real_server(
    server_binary: ServerBinary, tmp_path: Path
) -> None:
    port = free_port()
    argv = [server_binary.path, str(REDIS_CONF)]
    argv += ["--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp_path)]
    with _server(argv, port, tmp_path) as client:
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        assert client.config_get("appendfsync") == {"appendfsync": "everysec"}
        assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
        assert client.config_get("port") == {"port": str(port)}
        client.xadd("s", {"k": "v"})
    assert list(tmp_path.rglob("*.aof")), "the AOF is written in --dir"


def test_compose_server_commands_are_accepted(
    server_binary: ServerBinary, services: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    """Each `redis-server` command of the compose file, run for real (mounts mapped)."""
    with RedisServer(binary=server_binary) as primary:
        for name, svc in services.items():
            if _command(svc)[:1] != ["redis-server"]:
                continue
            cluster = "--cluster-enabled" in _command(svc)
            port = free_port(also_free=(10000,) if cluster else ())
            data = tmp_path / name
            data.mkdir()
            argv = _local_argv(server_binary, svc, port, data)
            if "--replicaof" in argv:  # point the replica at a local test primary
                i = argv.index("--replicaof")
                argv[i + 1 : i + 3] = ["127.0.0.1", str(primary.port)]
            with _server(argv, port, data) as client:
                assert client.config_get("appendfsync") == {"appendfsync": "everysec"}, name
                info = client.info()
                if cluster:
                    assert info["cluster_enabled"] == 1, name
                if "--replicaof" in argv:
                    assert info["role"] == "slave", name
                    assert client.config_get("replica-announce-ip") == {
                        "replica-announce-ip": "redis-replica"
                    }


@pytest.mark.parametrize("conf", SENTINEL_CONFS, ids=lambda p: p.name)
def test_sentinel_conf_is_accepted_by_the_real_server(
    server_binary: ServerBinary, conf: Path, tmp_path: Path
) -> None:
    d = _directives(conf)
    monitor = d["sentinel"]
    assert "monitor reach redis-primary 6379 2" in monitor
    assert f"announce-ip {conf.stem}" in monitor
    assert any(m == "resolve-hostnames yes" for m in monitor)
    # resolve-hostnames must precede the monitor line that names a host
    text = conf.read_text()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    first = {ln.split()[1]: i for i, ln in reversed(list(enumerate(lines)))}
    assert first["resolve-hostnames"] < first["monitor"]

    with RedisServer(binary=server_binary) as primary:
        # The copy points at a local test primary (never at redis-primary:6379 / 6379 here).
        local = tmp_path / "sentinel.conf"
        local.write_text(text.replace("redis-primary 6379", f"127.0.0.1 {primary.port}"))
        directives = re.sub(r"^#.*$", "", local.read_text(), flags=re.MULTILINE)
        assert "6379" not in directives.replace("26379", "")
        port = free_port()
        argv = [server_binary.path, str(local), "--sentinel"]
        argv += ["--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp_path)]
        with _server(argv, port, tmp_path) as client:
            master = client.sentinel_master("reach")
            assert master["ip"] == "127.0.0.1"
            assert str(master["port"]) == str(primary.port)
            assert str(master["quorum"]) == "2"
            assert str(master["down-after-milliseconds"]) == "1000"
            assert master["is_master"]
        assert "sentinel myid" in local.read_text(), "sentinel could rewrite its copy"


# --- the example agents and Prometheus (profile "examples") ------------------------------


def _worker_options() -> set[str]:
    """The options `reach worker` accepts, from its own --help."""
    res = subprocess.run(
        [sys.executable, "-m", "reach_cli.app", "worker", "--help"],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    return set(re.findall(r"(--[a-z][a-z0-9-]*)", res.stdout))


def test_example_agents_run_examples_with_metrics(services: dict[str, dict[str, Any]]) -> None:
    accepted = _worker_options()
    for name, module in EXAMPLE_AGENTS.items():
        svc = services[name]
        cmd = _command(svc)
        assert cmd[:3] == ["reach", "worker", f"examples.{module}:app"], name
        assert (ROOT / "examples" / f"{module}.py").is_file()
        assert "app = reach.Agent(" in (ROOT / "examples" / f"{module}.py").read_text()
        options = [a for a in cmd if a.startswith("--")]
        assert set(options) <= accepted, f"{name}: `reach worker` has no {set(options) - accepted}"
        assert cmd[cmd.index("--metrics-port") + 1] == "9100", name
        env = svc["environment"]
        assert env["REACH_REDIS_URL"] == "redis://redis:6379/0", "the compose Redis service"
        assert env["REACH_NAMESPACE"] == "examples"
        assert "redis" in svc["depends_on"] and not _profiles(services["redis"])
        # SIGTERM drains for up to --drain-timeout-s (30 s): compose must wait that long
        grace = str(svc.get("stop_grace_period", "10s"))
        assert grace.endswith("s") and float(grace[:-1]) > 30, name
        assert svc["build"] == services["agent-planner"]["build"], "one image for the three"


def test_example_image_dockerfile_copies_what_exists() -> None:
    dockerfile = COMPOSE_DIR / "Dockerfile"
    lines = [ln.split() for ln in dockerfile.read_text().splitlines() if ln and ln[0] != "#"]
    copies = [ln[1:-1] for ln in lines if ln[0] == "COPY"]
    sources = {src for srcs in copies for src in srcs}
    assert {"pyproject.toml", "README.md", "reach", "cli", "lua", "examples"} <= sources
    for src in sources:  # the build context is the repository root
        assert (ROOT / src).exists(), src
    # BuildKit's per-Dockerfile ignore file keeps exactly those sources in the context
    ignore = (COMPOSE_DIR / "Dockerfile.dockerignore").read_text().split()
    kept = {p[1:].rstrip("/") for p in ignore if p.startswith("!")}
    assert sources <= kept, sources - kept


def test_prometheus_scrapes_every_example_agent(services: dict[str, dict[str, Any]]) -> None:
    conf = yaml.safe_load(PROMETHEUS_CONF.read_text())
    (job,) = conf["scrape_configs"]
    assert job.get("metrics_path", "/metrics") == "/metrics"
    targets = {t for sc in job["static_configs"] for t in sc["targets"]}
    want = set()
    for name in EXAMPLE_AGENTS:
        cmd = _command(services[name])
        want.add(f"{name}:{cmd[cmd.index('--metrics-port') + 1]}")
    assert targets == want
    prom = services["prometheus"]
    assert ("./prometheus.yml", "/etc/prometheus/prometheus.yml") in _volumes(prom)
    assert set(prom["depends_on"]) == set(EXAMPLE_AGENTS)
    assert all(p.startswith("127.0.0.1:") for p in prom["ports"])


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return resp.read().decode()


def test_example_agent_commands_run_and_serve_metrics(
    services: dict[str, dict[str, Any]], redis_url: str, ns: str
) -> None:
    """Each agent service's command, run for real as in its container (working directory =
    the repository, as /app in the image; the test Redis instead of redis:6379; a free
    metrics port instead of 9100): it registers, becomes ready and serves /metrics."""
    procs: list[tuple[str, int, subprocess.Popen[bytes]]] = []
    r = redis.Redis.from_url(redis_url)
    try:
        for name in EXAMPLE_AGENTS:
            cmd = _command(services[name])
            port = free_port()
            cmd[cmd.index("--metrics-port") + 1] = str(port)
            env = {
                **os.environ,
                **services[name]["environment"],
                "REACH_REDIS_URL": redis_url,
                "REACH_NAMESPACE": ns,
            }
            argv = [sys.executable, "-m", "reach_cli.app", *cmd[1:], "--log-level", "warning"]
            p = subprocess.Popen(argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL)
            procs.append((name, port, p))
        for name, port, p in procs:
            agent_id = f"{EXAMPLE_AGENTS[name]}-1"
            deadline = time.monotonic() + 30
            while r.hget(Keys(ns).agent(agent_id), "ready") != b"1":
                assert p.poll() is None, f"{name} exited {p.returncode}"
                assert time.monotonic() < deadline, f"{name} never became ready"
                time.sleep(0.05)
            assert "reach_" in _scrape(port), name
    finally:
        r.close()
        for _name, _port, p in procs:
            p.terminate()
        for _name, _port, p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
