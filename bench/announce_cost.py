"""What announcing task changes (lua/includes/announce.lua, for ``client.watch``) costs
Redis: for messages nobody watches, for watched ones, and what announcing every change
of every message would cost.

On an embedded Redis, batches of 100 fresh records go through the worker's two writes of
a message, ``claim.lua`` (announces 'running') and ``complete.lua`` (announces
'succeeded'), in three variants: ``silent`` (``announce`` made a no-op: the scripts as if
watching did not exist, but for the field they read), ``as shipped`` (records not
watched: nothing announced), ``always`` (the check of the ``watched`` field removed: every
change announced, what a design without the flag would cost). ``--watched`` marks every
record watched and subscribes a connection to its channel (``as shipped`` then announces
each change; the cost of a message somebody follows). The variants alternate, round by
round; each round reads Redis's own time for the calls (``INFO commandstats``: µs inside
EVALSHA, none of the client's), per message. Reports the median of each variant.

    .venv/bin/python -m bench.announce_cost --rounds 9 --batches 50
"""

from __future__ import annotations

import argparse
import hashlib
import statistics

import redis

from reach.embedded import RedisServer
from reach.keys import Keys
from reach.scripts import script

BATCH = 100
ANNOUNCE = "redis.pcall('SPUBLISH', key, change)"


GATES = {"claim": "if s[12] then announce(", "complete": "if rec[4] then announce("}


def _variants(r: redis.Redis) -> dict[str, dict[str, str]]:
    """variant -> script name -> SHA loaded in ``r``."""
    out: dict[str, dict[str, str]] = {"silent": {}, "as shipped": {}, "always": {}}
    for name in ("claim", "complete"):
        source = script(name).source
        assert ANNOUNCE in source and GATES[name] in source, f"{name}.lua changed: fix the bench"
        texts = {
            "silent": source.replace(ANNOUNCE, ""),
            "as shipped": source,
            "always": source.replace(GATES[name], "if true then announce("),
        }
        for variant, text in texts.items():
            sha = r.script_load(text)
            assert sha == hashlib.sha1(text.encode()).hexdigest()
            out[variant][name] = sha
    return out


def _evalsha_us(r: redis.Redis) -> float:
    stats = r.info("commandstats").get("cmdstat_evalsha", {})
    return float(stats.get("usec", 0))


def _round(
    r: redis.Redis, shas: dict[str, str], keys: Keys, tag: str, batches: int, watched: bool
) -> float:
    """µs of Redis time per message over ``batches`` claim + complete batches."""
    subs = []
    records = [[keys.idem(f"{tag}-{b}-{i}") for i in range(BATCH)] for b in range(batches)]
    if watched:
        for recs in records:
            for k in recs:
                r.hset(k, "watched", 1)
        sub = r.pubsub()
        for recs in records:
            sub.execute_command("SSUBSCRIBE", *recs)
        subs.append(sub)
    r.config_resetstat()
    for recs in records:
        claim = ["w-1/i1", 60_000, "w-1", 3]
        for i in range(BATCH):
            claim += [60_000, f"m{i}", ""]
        r.evalsha(shas["claim"], len(recs), *recs, *claim)
        done: list[object] = [60_000]
        for _ in recs:
            done += [1, "succeeded", b"ok", "done", ""]
        r.evalsha(shas["complete"], len(recs), *recs, *done)
    us = _evalsha_us(r) / (batches * BATCH)
    for sub in subs:
        sub.close()
    r.delete(*[k for recs in records for k in recs])
    return us


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--batches", type=int, default=50)
    p.add_argument("--watched", action="store_true")
    a = p.parse_args()
    keys = Keys("announcebench")
    with RedisServer() as server:
        r = redis.Redis.from_url(server.url)
        variants = _variants(r)
        got: dict[str, list[float]] = {v: [] for v in variants}
        for n in range(a.rounds):
            for v, shas in variants.items():
                got[v].append(_round(r, shas, keys, f"{v}{n}", a.batches, a.watched))
        r.close()
    med = {v: statistics.median(xs) for v, xs in got.items()}
    print(
        f"{a.rounds} rounds x {a.batches * BATCH} messages, claim.lua + complete.lua, "
        f"{'every record watched' if a.watched else 'nobody watching'}"
    )
    base = med["silent"]
    for v, m in med.items():
        print(f"  {v:10s} median {m:6.2f} µs of Redis time per message ({m - base:+.2f} µs)")


if __name__ == "__main__":
    main()
