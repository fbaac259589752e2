"""Fixtures that start real Redis servers on free ports (never 6379, never shared).

* ``redis_server`` - one standalone server for the whole session; tests stay apart by
  each taking its own namespace (``ns`` fixture);
* ``fresh_redis`` - a standalone server of its own, for tests that restart or flush it;
* ``redis_cluster`` - a 3-master Redis Cluster built from Python, for the session;
* ``redis_sentinel`` - 1 master, 1 replica and 3 sentinels of the test's own;
* ``registry_server`` - a second standalone server for the session: the control plane's
  when ``split_planes`` (or ``REACH_TEST_SPLIT_PLANES=1``, for every test) puts it apart
  (``REACH_REGISTRY_URL``, which clients, ``Agent.run`` and worker processes read); a
  test that writes control-plane keys through ``r`` / ``redis_url`` itself assumes one
  Redis (the rate limit, quota and audit modules do).
"""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis

from reach.connection import AnyRedis, connect
from reach.embedded import RedisServer, find_server_binary
from tests.support.cluster import RedisTestCluster
from tests.support.sentinel import RedisTestSentinel

# Started as a background job of a non-interactive shell, the suite would inherit SIGINT
# ignored and pass that on to every process it starts: the Ctrl-C tests would then test
# nothing but the runner. A handler (not "ignore") is reset to the default on exec.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


_ROOT = Path(__file__).resolve().parent.parent
_PROJECT_FILES = (_ROOT / "reach.toml", _ROOT / ".reach" / "config")


@pytest.fixture(scope="session", autouse=True)
def _no_project_file_left_in_the_repository() -> Iterator[None]:
    """A test that runs `reach redis` or `reach init` in the repository would leave a
    project file there, and every later command started there (tests, the demo, .ci/run)
    would quietly use that test's Redis: such a test must run in a directory of its own."""
    before = {p for p in _PROJECT_FILES if p.exists()}
    yield
    left = sorted(str(p) for p in _PROJECT_FILES if p.exists() and p not in before)
    assert not left, f"a test wrote {left}: run it in a directory of its own (cwd=tmp_path)"


@pytest.fixture(autouse=True)
def _no_terminal_size_from_the_runner(monkeypatch: pytest.MonkeyPatch) -> None:
    """pytest-xdist's workers have COLUMNS=80 and LINES=24 in their environment (readline,
    loaded there, exports them), a plain run has none: CLI tables would fit 80 columns in
    one and be piped-wide (200) in the other. Every test starts as a plain run does; a test
    that wants a width sets COLUMNS itself."""
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("LINES", raising=False)


@pytest.fixture(scope="session")
def server_binary():  # type: ignore[no-untyped-def]
    return find_server_binary(use_path=os.environ.get("REACH_TEST_NO_PATH_SERVER") != "1")


@pytest.fixture(scope="session")
def redis_server(server_binary) -> Iterator[RedisServer]:  # type: ignore[no-untyped-def]
    with RedisServer(binary=server_binary) as server:
        yield server


@pytest.fixture
def fresh_redis(server_binary, tmp_path) -> Iterator[RedisServer]:  # type: ignore[no-untyped-def]
    """A server of the test's own, with AOF on, so it can be restarted without loss.

    ``appendfsync always``: with ``everysec`` (the embedded default) a busy disk makes
    Redis write the AOF after it has replied (it postpones the write while an fsync is
    slow), so a SIGKILL can lose acknowledged writes, and a test restarting the server
    under a loaded machine saw data vanish."""
    with RedisServer(
        binary=server_binary,
        data_dir=tmp_path / "redis",
        persistent=True,
        extra_args=("--appendfsync", "always"),
    ) as s:
        yield s


@pytest.fixture
def ns() -> str:
    """A namespace no other test uses."""
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    return redis_server.url


@pytest.fixture(scope="session")
def registry_server(server_binary) -> Iterator[RedisServer]:  # type: ignore[no-untyped-def]
    with RedisServer(binary=server_binary) as server:
        yield server


@pytest.fixture
def split_planes(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The namespace's control plane (registry, limits, quotas, audit, access rules) on
    ``registry_server``, its data plane on ``redis_url``'s: every Client, ``Agent.run``
    and worker process of the test finds it in ``REACH_REGISTRY_URL``. Returns that URL."""
    url: str = request.getfixturevalue("registry_server").url
    monkeypatch.setenv("REACH_REGISTRY_URL", url)
    return url


@pytest.fixture(autouse=True)
def _split_planes_everywhere(request: pytest.FixtureRequest) -> None:
    """``REACH_TEST_SPLIT_PLANES=1``: every test runs with the control plane apart."""
    if os.environ.get("REACH_TEST_SPLIT_PLANES") == "1":
        request.getfixturevalue("split_planes")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def r(redis_url: str) -> AsyncIterator[AnyRedis]:
    client = await connect(redis_url)
    yield client
    await client.aclose()


@pytest.fixture
def sync_r(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture(scope="session")
def redis_cluster(server_binary) -> Iterator[RedisTestCluster]:  # type: ignore[no-untyped-def]
    with RedisTestCluster(binary=server_binary, masters=3) as cluster:
        yield cluster


@pytest.fixture
def redis_sentinel(server_binary) -> Iterator[RedisTestSentinel]:  # type: ignore[no-untyped-def]
    """1 master, 1 replica and 3 sentinels (quorum 2) of the test's own: a test may kill
    the master. Its ``url`` is the ``redis+sentinel://`` URL of the service."""
    with RedisTestSentinel(binary=server_binary) as deployment:
        yield deployment
