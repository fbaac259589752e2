"""Scaling figures: throughput with 1, 2 and 4 worker processes, with 1, 10 and 100 agents
sharing a capability, with 1 KB and 64 KB payloads, and a 10,000-way fan-out from one
Client (time to all answered, caller connections from CLIENT LIST, caller max RSS). The
engine is reach_cli.tools.scaling (its docstring says what each set measures); each run
has an embedded Redis of its own and fresh worker processes.

Run:  python bench/scaling_bench.py [--sets workers,agents,payloads,fanout]
          [--workers 1,2,4] [--agents 1,10,100] [--agent-processes 1] [--payloads 1k,64k]
          [--messages 20000] [--payload-mib 200] [--fanout 10000] [--concurrency 64]
          [--repeat 1] [--json]
"""

import sys

from reach_cli.tools.scaling import main

if __name__ == "__main__":
    sys.exit(main())
