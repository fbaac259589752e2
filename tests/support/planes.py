"""Which plane's keys a namespace left on which Redis (reach.planes): for the tests that
run with the control plane apart."""

from __future__ import annotations

import redis

from reach.keys import CONTROL, DATA, plane_of, scan_patterns


def planes_on(url: str, namespace: str) -> dict[str, set[str]]:
    """The keys of ``namespace`` on the Redis at ``url`` (standalone or a Cluster: every
    master is scanned), by plane (``control``, ``data``; ``None`` for a key no form of
    reach.keys.LAYOUT has)."""
    found: dict[str, set[str]] = {}
    probe = redis.Redis.from_url(url)
    try:
        cluster = probe.info("cluster").get("cluster_enabled") == 1
    finally:
        probe.close()
    client: redis.Redis | redis.RedisCluster
    client = redis.RedisCluster.from_url(url) if cluster else redis.Redis.from_url(url)
    try:
        for pattern in scan_patterns(namespace):
            if cluster:
                keys = client.scan_iter(match=pattern, count=1000, target_nodes="primaries")  # type: ignore[call-arg]
            else:
                keys = client.scan_iter(match=pattern, count=1000)
            for raw in keys:
                key = raw.decode() if isinstance(raw, bytes) else str(raw)
                found.setdefault(str(plane_of(key, namespace)), set()).add(key)
    finally:
        client.close()
    return found


def assert_apart(data_url: str, registry_url: str, namespace: str) -> None:
    """Each plane's keys of ``namespace`` only on its own Redis."""
    on_data = planes_on(data_url, namespace)
    on_registry = planes_on(registry_url, namespace)
    assert CONTROL not in on_data, f"control-plane keys on the data Redis: {on_data[CONTROL]}"
    assert DATA not in on_registry, f"data-plane keys on the registry Redis: {on_registry[DATA]}"
