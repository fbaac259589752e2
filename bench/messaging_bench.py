"""Messaging benchmark: one Redis, one worker process (the engine is reach_cli.tools.bench;
the same as `reach bench`).

Phases: a fire-and-forget backlog (throughput), a streaming workload (one caller sending
with Client.send, 50 in flight, while the worker runs) and sequential request/reply
(latency). --floor runs the streaming and latency workloads on the bare redis-py Streams
loop too (reach_cli.tools.floor: no guarantees), in the same run on the same Redis, and
prints reach's figures as ratios to it; --repeat K runs K alternated rounds (medians).

Run:  python bench/messaging_bench.py [--messages 30000] [--requests 3000]
          [--stream-messages 20000] [--concurrency 64] [--floor] [--repeat 1] [--json]
"""

import sys

from reach_cli.tools.bench import main

if __name__ == "__main__":
    sys.exit(main())
