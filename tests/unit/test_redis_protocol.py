"""reach.connection.RedisLike (``AnyRedis``) is the Redis surface reach uses.

Both asyncio clients :func:`reach.connection.connect` can return must satisfy it: at run
time (every listed method exists on them) and under mypy strict (their signatures fit the
protocol's), and a method the protocol does not list must be a type error, else the
protocol checks nothing. No Redis server is needed: the clients are built, never connected.
"""

from __future__ import annotations

import inspect
import textwrap
from pathlib import Path

import pytest
import redis.asyncio as aredis
from redis.asyncio.cluster import RedisCluster

from reach.connection import AnyRedis, RedisLike, SentinelRedis, _GatedCluster

PROTOCOL_METHODS = sorted(
    name
    for name, member in vars(RedisLike).items()
    if inspect.isfunction(member) and not name.startswith("_")
)


def test_any_redis_is_the_protocol() -> None:
    assert AnyRedis is RedisLike
    assert "xreadgroup" in PROTOCOL_METHODS and "evalsha" in PROTOCOL_METHODS


@pytest.mark.parametrize("cls", [aredis.Redis, SentinelRedis])
def test_standalone_clients_satisfy_the_protocol(cls: type[aredis.Redis]) -> None:
    client = cls(host="127.0.0.1", port=1)  # never connected
    assert isinstance(client, RedisLike)
    for name in PROTOCOL_METHODS:
        assert callable(getattr(client, name)), name


@pytest.mark.parametrize("cls", [RedisCluster, _GatedCluster])
def test_cluster_clients_satisfy_the_protocol(cls: type[RedisCluster]) -> None:
    # A RedisCluster connects in initialize(), not in its constructor.
    client = cls(host="127.0.0.1", port=1, max_connections=4)
    assert isinstance(client, RedisLike)
    for name in PROTOCOL_METHODS:
        assert callable(getattr(client, name)), name


def test_an_object_without_the_methods_does_not() -> None:
    assert not isinstance(object(), RedisLike)


def test_mypy_accepts_both_clients_and_refuses_an_unlisted_method(tmp_path: Path) -> None:
    api = pytest.importorskip("mypy.api")
    probe = tmp_path / "probe.py"
    probe.write_text(
        textwrap.dedent(
            """
            import redis.asyncio as aredis
            from redis.asyncio.cluster import RedisCluster

            from reach.connection import AnyRedis, SentinelRedis, _GatedCluster

            def standalone(r: aredis.Redis) -> AnyRedis:
                return r

            def sentinel(r: SentinelRedis) -> AnyRedis:
                return r

            def cluster(r: RedisCluster) -> AnyRedis:
                return r

            def gated(r: _GatedCluster) -> AnyRedis:
                return r

            async def unlisted(r: AnyRedis) -> None:
                await r.flushall()  # not in the protocol: must be an error
            """
        )
    )
    out, err, status = api.run(
        [
            "--strict",
            "--no-incremental",
            "--cache-dir=/dev/null",
            "--python-version=3.11",
            "--follow-imports=silent",
            str(probe),
        ]
    )
    errors = [line for line in out.splitlines() if ": error:" in line]
    assert len(errors) == 1, out + err
    assert 'has no attribute "flushall"' in errors[0] and str(probe) in errors[0], out
    assert status == 1
