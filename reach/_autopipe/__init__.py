"""Auto-pipelining: the commands that concurrent tasks issue in one event-loop turn go to
Redis in one write, over one connection (standalone, Sentinel) or one per node (Cluster)
whatever the concurrency.

Redis serves one connection's commands in order, so one connection carrying the commands
of many coroutines, written at once and answered in order, is both faster than a
connection per command and bounded. :class:`AutoPipeline` wraps an asyncio client
(standalone, Sentinel or Cluster) and is itself one (:class:`~reach.connection.RedisLike`):

* a command is queued, not sent; the commands queued while the tasks that are ready now
  run go out together once they have run (the writer is woken with ``call_soon``): a lone
  command therefore waits for nothing but the end of the current turn (no timer);
* each caller gets its own reply or its own error: Redis's error replies come back in
  place, so one refused command fails only its caller. A command redis-py refuses before
  anything is written (an argument it cannot encode, an empty ``HSET`` mapping, keys of
  different Cluster slots) fails only its caller;
* ``EVALSHA`` answered with NOSCRIPT (a restarted or failed-over server) did not run: the
  scripts are loaded (:func:`reach.scripts.load_all`) and just those commands are sent
  again, as :func:`reach.scripts.run_pipeline` does;
* a caller cancelled before its command was written is left out (nothing is sent for it);
  once written, its command runs and the reply is dropped.

Standalone and Sentinel: one multiplexed connection
---------------------------------------------------
The commands go out on one connection taken from the client's pool (given back after
:data:`IDLE_RELEASE_S` with nothing in flight, taken again by the next command): a writer
task writes each batch (at most ``max_batch`` commands, packed by the connection as
redis-py's pipeline packs them) as soon as it is ready, without waiting for the replies of
the batches before it, and a reader task takes the replies in order (Redis answers one
connection's commands in order, as ioredis and StackExchange.Redis rely on) and parses
each as redis-py's ``parse_response`` does (``NEVER_DECODE``, ``EMPTY_RESPONSE``, the
client's ``response_callbacks``), resolving its caller's future. redis-py's command
methods make the words: each call is captured from a redis-py pipeline's
``execute_command`` (so its checks, options and callbacks are redis-py's own). At most
``max_in_flight`` commands are written and unanswered at once (memory); more wait in the
queue. So batched commands use one connection whatever the concurrency, and fetch, claim
and settle of a worker no longer wait for each other's round trips.

A connection that fails (an error reading or writing, a reply that takes longer than the
connection's ``socket_timeout``, a Sentinel ``READONLY`` demotion) fails every command
written on it and not yet answered. As redis-py does for a pipeline today, those commands
are sent again after reconnecting, following the connection's ``Retry`` policy (its
retries, backoff and retryable errors: one retry here, see :mod:`reach.connection`), and
get the error once the retries are spent: such a command may have run, so it may run
twice, exactly as with a plain redis-py call retried after a broken connection (reach's
redelivery and idempotency are built for that); what the policy does not retry gets the
error at once. Commands not yet written wait for the reconnection; a reconnection that
fails counts as a failure for every command waiting, so no caller waits longer than the
policy's retries of a connection attempt: each gets a reply or an error, none hangs. On
Sentinel the reconnection asks the sentinels for the master, so after a failover the
commands go to the new master; while the connection is in use the pool is asked at most
once a second whether the master moved, as when it hands out a connection.

Cluster: one multiplexed connection per node
--------------------------------------------
Each command goes to the multiplexed connection (as above) of the master that holds its
keys' slot: redis-py's own routing (``RedisCluster._determine_slot``, the slot map of its
``nodes_manager``), run without asking a server; ``XREAD``/``XREADGROUP`` by the keys
after ``STREAMS``. A node's connection is taken from redis-py's ``ClusterNode`` but held
apart from its ``max_connections`` (the plain client's commands keep all of those) and
given back after :data:`IDLE_RELEASE_S` idle. So batched commands use one connection per
master whatever the concurrency, and a node's batches do not wait for another's. A
command without a key, with keys of several slots, or one redis-py sends to chosen nodes
or whose replies it merges (``PING``, ``SCRIPT LOAD``, ``target_nodes=``) goes through
the plain cluster client instead: correct, on a connection of the client's pool.

The slot map moves (resharding, failover) and a node says so in a reply; such a command
did not run there, and its caller does not see it:

* ``MOVED``: the slot map is patched as redis-py does (``nodes_manager.move_slot``; read
  again whole every ``reinitialize_steps`` moves) and the command goes to the new owner;
* ``ASK`` (a slot being migrated): ``ASKING`` and the command are written one after the
  other on the target node's connection, this once;
* ``TRYAGAIN`` (keys of a slot half moved): sent again after 50 ms; ``CLUSTERDOWN``: the
  map is read again after 250 ms and the command sent where it says;

each at most :data:`MAX_REDIRECTS` times (redis-py's TTL), then the caller gets the last
reply as its error. NOSCRIPT is reloaded on the node that answered it. A node's connection
that fails (a killed or failed-over master) fails its written, unanswered commands as
above, with the cluster client's ``Retry`` policy (redis-py's default: 10 retries, backoff
10 ms doubling up to 1 s); those it retries are sent again, after the slot map is read
again (the failed node asked last, as redis-py does), to whichever node holds their slot
then; so are those waiting to be written when the node cannot be reached. Commands
issued meanwhile wait for the map. A command may so run twice, as on standalone.
redis-py's startup nodes keep the connection they read the slot map on: it is closed, so a
client holds no idle connection beside its node connections and its blocking reads.

With ``multiplex=False``: pipelines
-----------------------------------
A batch goes out as one redis-py pipeline (``transaction=False``; on a Cluster
``ClusterPipeline`` splits it by node and follows MOVED/ASK). A batch of one is sent as
the plain command. At most ``max_pipelines`` batches are in flight; while they are, new
commands gather in the next batch, so the connections used are ``max_pipelines`` (per
node) plus the blocking reads. A command redis-py refuses before writing sends its batch
again one command at a time; an error of the connection (after redis-py's own retries)
fails the whole batch. A client pinned to one connection of its own
(``single_connection_client``) gets this mode too.

Commands that wait on the server (``XREAD``/``XREADGROUP`` with ``block``) and those that
are not one request and one reply (``scan_iter``, ``SCRIPT LOAD`` on every primary,
``INFO``, a ``MULTI`` pipeline) pass through to the wrapped client on a connection of their
own. ``pipeline(transaction=False)`` gives a pipeline whose commands join the current
batch, so code written with explicit pipelines shares the connection too.

The package's modules, in the order a command meets them: :mod:`.core` (the client
surface, the queue, the ``multiplex=False`` pipelines), :mod:`.cluster` (the routing of a
Cluster's commands by slot), :mod:`.mux` (the multiplexed connection, one or one per
node), :mod:`.pending` (the queued command and the limits, shared by all three).
"""

from .core import AutoPipeline, BatchPipeline
from .pending import (
    DEFAULT_MAX_BATCH,
    DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_MAX_PIPELINES,
    IDLE_RELEASE_S,
    MAX_REDIRECTS,
)

__all__ = [
    "DEFAULT_MAX_BATCH",
    "DEFAULT_MAX_IN_FLIGHT",
    "DEFAULT_MAX_PIPELINES",
    "IDLE_RELEASE_S",
    "MAX_REDIRECTS",
    "AutoPipeline",
    "BatchPipeline",
]
