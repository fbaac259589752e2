"""Long chaos run: kill workers and Redis mid-stream, check nothing lost or run twice.

A thin wrapper of reach_cli.tools.chaos (the same engine as `reach chaos` and tests/chaos/).

Run:  python bench/chaos.py --messages 10000 --workers 4 --kills 24 --redis-restarts 2 [--json]
      python bench/chaos.py --help   (every option)
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from reach_cli.tools.chaos import main

if __name__ == "__main__":
    sys.exit(main(prog="bench/chaos.py"))
