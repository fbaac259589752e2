"""A library user's first contact with a bad Redis URL is one typed reach error that says
what to do, never a raw redis-py error (issue 9: the CLI had these as tracebacks, and
`Agent.run` / `Client` still raised them). Also: namespaces that would act as SCAN globs
and payloads msgpack cannot carry are refused up front."""

from __future__ import annotations

import pytest
import redis

from reach import Client, ConfigError, RedisUnavailable
from reach.connection import connect, connect_sync
from reach.envelope import encode_payload
from reach.keys import Keys
from tests.cli.test_cli_errors import no_info_url, not_redis  # noqa: F401 - fixtures

pytestmark = pytest.mark.anyio


async def test_db_index_out_of_range(redis_server) -> None:  # type: ignore[no-untyped-def]
    url = f"redis://127.0.0.1:{redis_server.port}/99999"
    with pytest.raises(ConfigError, match="DB index is out of range"):
        await connect(url)
    with pytest.raises(ConfigError, match="DB index is out of range"):
        connect_sync(url)


async def test_a_server_that_is_not_redis(not_redis: str) -> None:  # noqa: F811
    with pytest.raises(RedisUnavailable, match="does not answer like a Redis server"):
        await connect(not_redis)


async def test_a_missing_acl_permission(no_info_url: str) -> None:  # noqa: F811
    with pytest.raises(RedisUnavailable, match="refused a command reach needs"):
        await connect(no_info_url)


async def test_wrong_password(redis_server, sync_r: redis.Redis) -> None:  # type: ignore[no-untyped-def]
    sync_r.acl_setuser("pwuser", enabled=True, passwords=["+right"], keys=["*"], commands=["+@all"])
    try:
        with pytest.raises(RedisUnavailable, match="refused the credentials"):
            await connect(f"redis://pwuser:wrong@127.0.0.1:{redis_server.port}/0")
        with pytest.raises(RedisUnavailable, match="refused the credentials"):
            async with Client(redis_url=f"redis://pwuser:wrong@127.0.0.1:{redis_server.port}/0"):
                pass
    finally:
        sync_r.acl_deluser("pwuser")


@pytest.mark.parametrize(
    "ns",
    ["*", "a?", "[ab]", "x\\y", "", "tab\there", "prod:x", "a b", "{x}", "x}", "-a", "é", "x" * 65],
)
def test_a_namespace_outside_the_safe_alphabet_is_refused(ns: str) -> None:
    with pytest.raises(ConfigError, match="Invalid namespace .*a-z, A-Z, 0-9"):
        Keys(ns)


@pytest.mark.parametrize("ns", ["prod", "team-a", "a.b_c", "T1", "x" * 64])
def test_a_namespace_in_the_safe_alphabet_is_taken_as_it_is(ns: str) -> None:
    assert Keys(ns).namespace == ns


def test_scan_patterns_escape_the_namespace() -> None:
    from reach.keys import glob_escape

    assert glob_escape("a*b?[c]\\d") == "a\\*b\\?\\[c\\]\\\\d"
    k = Keys("prod")
    assert k.dlq_pattern == "reach:{prod}:dlq:*" and k.inbox_pattern == "reach:prod:{a:*}:in:*"


@pytest.mark.parametrize("payload", [2**70, "\ud800", [[[[[]]]]]])
def test_a_payload_msgpack_cannot_carry_is_a_config_error(payload: object) -> None:
    if payload == [[[[[]]]]]:
        deep: list[object] = []
        for _ in range(100_000):
            deep = [deep]
        payload = deep
    with pytest.raises(ConfigError):
        encode_payload(payload)
