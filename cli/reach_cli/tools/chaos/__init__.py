"""Chaos runs: kill workers and Redis mid-stream, then prove nothing was lost or run twice.

Two scenarios: ``crash`` (SIGKILLs mid-handler, a SIGSTOP past the lease, Redis restarts)
and ``rolling-deploy`` (every worker replaced by SIGTERM after its successor is ready,
twice, with a few SIGKILLs and a Redis restart among them).

The parts: :mod:`.plan` (configuration, messages, schedules), :mod:`.agent` (what the
workers run), :mod:`.harness` (the processes, and the crash run and its checks),
:mod:`.deploy` (the rolling-deploy run and its checks), :mod:`.report` (the reports and
their text), :mod:`.cli` (the command line of ``reach chaos`` and ``bench/chaos.py``).
"""

from __future__ import annotations

from .agent import chaos_agent, deploy_agent
from .cli import main
from .deploy import run_deploy
from .harness import run_chaos
from .plan import (
    ChaosConfig,
    ChaosEvent,
    DeployConfig,
    DeployStep,
    MessageSpec,
    plan_deploy,
    plan_events,
    plan_messages,
)
from .report import (
    ChaosReport,
    DeployReport,
    DrainRecord,
    KillRecord,
    format_deploy_report,
    format_report,
)

__all__ = [
    "ChaosConfig",
    "ChaosEvent",
    "ChaosReport",
    "DeployConfig",
    "DeployReport",
    "DeployStep",
    "DrainRecord",
    "KillRecord",
    "MessageSpec",
    "chaos_agent",
    "deploy_agent",
    "format_deploy_report",
    "format_report",
    "main",
    "plan_deploy",
    "plan_events",
    "plan_messages",
    "run_chaos",
    "run_deploy",
]
