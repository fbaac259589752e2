"""The messaging benchmark: one Redis, one `reach worker` process (`reach bench`,
`bench/messaging_bench.py`). A tool shipped with the CLI, not part of the library.

It measures
* fire-and-forget throughput on a backlog: N messages are sent to the inbox of the worker
  while it is stopped (SIGSTOP; loading is not timed); after SIGCONT it processes them
  (batch reads, claim, handler, fenced completion, ack + delete): messages/s until the
  inbox is empty;
* request/reply latency with one sequential caller (``Client.request``): p50 / p99;
* Redis commands and round trips per message, for each phase: commands from INFO
  commandstats (those inside scripts included), round trips as the reads Redis processed
  (INFO stats ``total_reads_processed``: one per request or pipeline a client sends), with
  the benchmark's own polling taken out; and the worker's own count of its round trips
  (logged by the runtime when it stops);
* streaming throughput (``stream_messages`` > 0): the worker runs while one caller sends
  with ``Client.send``, ``STREAM_INFLIGHT`` sends in flight; the clock runs from the first
  send until every message is processed (see "processed" below);
* ``Client.send_many`` streaming (with the streaming workload): the same messages sent
  ``FLOOR_BATCH`` per ``send_many`` call, one call at a time, while the worker runs; its
  enqueue rate (messages sent per second of sending) is compared with the floor's
  pipelined XADDs (goal: >= 80 %);
* with ``floor=True``, the floor (:mod:`reach_cli.tools.floor`): the bare redis-py loop on
  Redis Streams, no guarantees, measured in the same run on the same Redis with the same
  two workloads (streaming throughput: XADD pipelined ``FLOOR_BATCH`` per batch, the
  worker replying to each message in one pipeline with the batch's XACK; sequential
  request/reply latency), and reach's figures as ratios to it;
* with ``floor=True`` too, the lean floor (:mod:`reach_cli.tools.lean_floor`): the simplest
  code keeping reach's core guarantees (an idempotency record per message written with its
  inbox entry, claimed at send; a fenced completion storing the result with the reply,
  XACK and XDEL, one Lua call per batch at each end), the same workloads in the same
  rounds, and reach's figures as ratios to it, the CPU per message of each process
  included (the goals of :data:`LEAN_GOALS`); and the lean floor's figures as ratios to
  the bare floor's (what the guarantees cost the simplest code keeping them).

"Processed", for both systems in the streaming workload: the stream's consumer group has
read every entry added and has none pending (XINFO STREAM / XINFO GROUPS, polled every
5 ms once the caller has sent all): reach acknowledges an entry after its fenced
completion (and then deletes it), the floor after its reply.

Each phase has a worker process of its own (started fresh, waited for until it is ready),
so its figures are its own. ``repeat`` runs every phase that many times, the systems
alternating which goes first; the figures are medians of the rounds and each ratio is the
median of the rounds' ratios (a ratio only ever compares two runs of the same round).
"""

from __future__ import annotations

from .measure import entries_added, load_backlog, stream_figures
from .processes import (
    AGENT_ID,
    CAP,
    FLOOR_BATCH,
    NS,
    POLL_S,
    STREAM_INFLIGHT,
    Progress,
    _popen,
    _reach_worker_cmd,
    _wait_ready,
    bench_agent,
    reach_worker,
    send_stopped,
)
from .report import format_report, main, progress_lines
from .rounds import medians, run_bench

__all__ = [
    "AGENT_ID",
    "CAP",
    "FLOOR_BATCH",
    "NS",
    "POLL_S",
    "STREAM_INFLIGHT",
    "Progress",
    "_popen",
    "_reach_worker_cmd",
    "_wait_ready",
    "bench_agent",
    "entries_added",
    "format_report",
    "load_backlog",
    "main",
    "medians",
    "progress_lines",
    "reach_worker",
    "run_bench",
    "send_stopped",
    "stream_figures",
]
