"""AutoPipeline's bounds are checked when it is made, and which mode it takes
(reach._autopipe): one multiplexed connection for a standalone or Sentinel client, one per
node for a Cluster client, pipelines when asked or when the client is pinned to a
connection of its own."""

from __future__ import annotations

import pytest
import redis.asyncio as aredis
from redis.asyncio.cluster import RedisCluster

from reach._autopipe import DEFAULT_MAX_IN_FLIGHT, AutoPipeline
from reach.errors import ConfigError


@pytest.mark.parametrize(("pipelines", "batch", "in_flight"), [(0, 512, 1), (4, 0, 1), (4, 1, 0)])
def test_a_bound_below_one_is_a_config_error(pipelines: int, batch: int, in_flight: int) -> None:
    with pytest.raises(ConfigError, match="must be >= 1"):
        AutoPipeline(
            object(),  # type: ignore[arg-type]
            max_pipelines=pipelines,
            max_batch=batch,
            max_in_flight=in_flight,
        )


def test_a_standalone_client_gets_one_multiplexed_connection() -> None:
    client = aredis.Redis(port=1)  # nothing is connected when it is made
    auto = AutoPipeline(client)
    assert auto.multiplexed and auto.max_in_flight == DEFAULT_MAX_IN_FLIGHT
    assert not AutoPipeline(client, multiplex=False).multiplexed


def test_a_client_pinned_to_one_connection_keeps_the_pipelines() -> None:
    client = aredis.Redis(port=1, single_connection_client=True)
    client.connection = client.connection_pool.make_connection()  # type: ignore[no-untyped-call]
    assert not AutoPipeline(client).multiplexed


def test_a_cluster_client_gets_a_multiplexed_connection_per_node() -> None:
    client = RedisCluster(host="127.0.0.1", port=1)  # nothing is connected when it is made
    auto = AutoPipeline(client)
    assert auto.multiplexed and auto._router is not None and auto._mux is None
    assert not AutoPipeline(client, multiplex=False).multiplexed
