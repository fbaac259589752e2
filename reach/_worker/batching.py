"""One script call per key, batched: a single call on standalone Redis, a pipeline of
calls (one slot each) on a Cluster."""

from __future__ import annotations

from typing import Any

from redis import exceptions as rexc

from .. import scripts
from ..connection import AnyRedis


async def per_key(
    redis: AnyRedis,
    cluster: bool,
    script: str,
    keys: list[str],
    head: list[Any],
    tails: list[list[Any]],
) -> list[Any]:
    """Run ``script`` for each key with ARGV ``head + tail``: one reply (or exception) per
    key. Standalone: one call with ``head`` then every tail (the script loops over them);
    a refusal then answers for every key."""
    if not cluster:
        args = head + [a for t in tails for a in t]
        try:
            return list(await scripts.call(redis, script, keys, args))
        except rexc.ResponseError as e:
            return [e] * len(keys)
    ops = [scripts.op(script, [k], head + t) for k, t in zip(keys, tails, strict=True)]
    res = await scripts.run_pipeline(redis, ops)
    return [r if isinstance(r, BaseException) else r[0] for r in res]
