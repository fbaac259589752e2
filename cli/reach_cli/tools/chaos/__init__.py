"""Chaos runs: kill workers and Redis mid-stream, then prove nothing was lost or run twice.

The parts: :mod:`.plan` (configuration, messages, schedule), :mod:`.agent` (what the
workers run), :mod:`.harness` (the run and its checks), :mod:`.report` (the report and
its text), :mod:`.cli` (the command line of ``reach chaos`` and ``bench/chaos.py``).
"""

from __future__ import annotations

from .agent import chaos_agent
from .cli import main
from .harness import run_chaos
from .plan import ChaosConfig, ChaosEvent, MessageSpec, plan_events, plan_messages
from .report import ChaosReport, KillRecord, format_report

__all__ = [
    "ChaosConfig",
    "ChaosEvent",
    "ChaosReport",
    "KillRecord",
    "MessageSpec",
    "chaos_agent",
    "format_report",
    "main",
    "plan_events",
    "plan_messages",
    "run_chaos",
]
