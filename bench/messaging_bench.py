"""Messaging benchmark: one Redis, one worker process (the engine is reach_cli.tools.bench;
the same as `reach bench`).

Phases: a fire-and-forget backlog (throughput), a streaming workload (one caller sending
with Client.send, 50 in flight, while the worker runs) and sequential request/reply
(latency). --floor runs the streaming and latency workloads on two redis-py Streams loops
too, in the same run on the same Redis: the bare floor (reach_cli.tools.floor: no
guarantees) and the lean floor (reach_cli.tools.lean_floor: the simplest code keeping
reach's core guarantees), and prints reach's figures as ratios to each (against the lean
floor with the CPU per message of each process); --repeat K runs K alternated rounds
(medians).

Run:  python bench/messaging_bench.py [--messages 30000] [--requests 3000]
          [--stream-messages 20000] [--concurrency 64] [--floor] [--repeat 1] [--json]
"""

import sys

from reach_cli.tools.bench import main

if __name__ == "__main__":
    sys.exit(main())
