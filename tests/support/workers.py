"""Real `reach worker` processes for the tests, started and always cleaned up."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Sub-second leases and sweeps: what the process tests run with.
FAST = [
    "--heartbeat-s",
    "0.1",
    "--lease-s",
    "0.3",
    "--evict-after-s",
    "0.6",
    "--sweep-interval-s",
    "0.1",
    "--retry-base-s",
    "0.02",
]


class Workers:
    """Starts ``reach worker <module>:<factory>`` processes; ``procs`` by factory name."""

    def __init__(self, url: str, ns: str, module: str, *, log_level: str = "error") -> None:
        self.url, self.ns, self.module, self.log_level = url, ns, module, log_level
        self.procs: dict[str, subprocess.Popen[bytes]] = {}  # the latest one of each name
        self._all: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, *extra: str, log: Path | None = None) -> subprocess.Popen[bytes]:
        """Start factory ``name``; its stderr goes to ``log`` when given (log level warning)."""
        cmd = [
            sys.executable,
            "-m",
            "reach_cli.app",
            "worker",
            f"{self.module}:{name}",
            "--redis-url",
            self.url,
            "--namespace",
            self.ns,
            "--log-level",
            "warning" if log else self.log_level,
            *FAST,
            *extra,
        ]
        err = open(log, "wb") if log else None  # noqa: SIM115 - the child owns it
        p = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.DEVNULL, stderr=err)
        if err is not None:
            err.close()
        self.procs[name] = p
        self._all.append(p)
        return p

    def stop_all(self) -> None:
        for p in self._all:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)  # a stopped process cannot die of SIGKILL
                p.kill()
            p.wait(timeout=10)
