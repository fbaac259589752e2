"""`reach worker --tenant a --tenant b`: one process serves the app on each tenant's Redis
and namespace (issue 32 item 1)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import reach
from reach.embedded import RedisServer
from tests.support.agents_messaging import FAST_CLI, wait_eligible
from tests.support.tenants import keys_of, write_map

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def two_servers(server_binary) -> Iterator[tuple[RedisServer, RedisServer]]:  # type: ignore[no-untyped-def]
    with RedisServer(binary=server_binary) as a, RedisServer(binary=server_binary) as b:
        yield a, b


def worker_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REACH_")}
    return {**env, "PYTHONPATH": str(ROOT)}


@pytest.fixture
def two_tenant_worker(
    two_servers: tuple[RedisServer, RedisServer], ns: str, tmp_path: Path
) -> Iterator[subprocess.Popen[bytes]]:
    a, b = two_servers
    write_map(tmp_path, {"acme": (a.url, f"{ns}-acme"), "beta": (b.url, f"{ns}-beta")})
    cmd = [sys.executable, "-m", "reach_cli.app", "worker", "tests.support.tenants:tenant_worker"]
    cmd += ["--tenant", "acme", "--tenant", "beta", *FAST_CLI]
    p = subprocess.Popen(cmd, cwd=tmp_path, env=worker_env(), stdin=subprocess.DEVNULL)
    yield p
    p.kill()
    p.wait(timeout=10)


async def test_one_worker_process_serves_two_tenants(
    two_servers: tuple[RedisServer, RedisServer],
    ns: str,
    tmp_path: Path,
    two_tenant_worker: subprocess.Popen[bytes],
) -> None:
    a, b = two_servers
    ns_a, ns_b = f"{ns}-acme", f"{ns}-beta"
    p = two_tenant_worker
    tenants = reach.Tenants.load(tmp_path)
    async with reach.Client(redis_url=a.url, namespace=f"{ns}-own", tenants=tenants) as c:
        for t in ("acme", "beta"):
            await wait_eligible(await c.tenants.client(t), "where", ["tenant-worker"])
        got_a = await c.request("where", {"tenant": "acme"}, tenant="acme", timeout_s=20)
        got_b = await c.request("where", {"tenant": "beta"}, tenant="beta", timeout_s=20)
    assert got_a == {"served_by": ns_a, "tenant": "acme"}
    assert got_b == {"served_by": ns_b, "tenant": "beta"}
    assert keys_of(a.url, ns_b) == [] and keys_of(b.url, ns_a) == []
    assert p.poll() is None
    p.terminate()
    assert p.wait(timeout=30) == 0  # both tenants' agents drained on SIGTERM


def test_tenant_with_redis_url_is_refused(tmp_path: Path) -> None:
    write_map(tmp_path, {"acme": ("redis://127.0.0.1:1/0", "acme")})
    cmd = [sys.executable, "-m", "reach_cli.app", "worker", "tests.support.tenants:tenant_worker"]
    cmd += ["--tenant", "acme", "--redis-url", "redis://127.0.0.1:1/0"]
    res = subprocess.run(
        cmd, check=False, cwd=tmp_path, env=worker_env(), capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 2 and "not both" in res.stderr
