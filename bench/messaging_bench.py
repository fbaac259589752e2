"""Messaging benchmark: one Redis, one worker process (the engine is reach_cli.tools.bench;
the same as `reach bench`).

Run:  python bench/messaging_bench.py [--messages 30000] [--requests 3000] [--concurrency 64] [--json]
"""

import sys

from reach_cli.tools.bench import main

if __name__ == "__main__":
    sys.exit(main())
