"""The script layer: the Lua scripts of ``lua/``, loaded with their includes and called by
SHA (:mod:`reach.scripts._loader`), and the codes they answer with
(:mod:`reach.scripts.codes`)."""

from __future__ import annotations

from ._loader import (
    Op,
    Script,
    ScriptError,
    all_scripts,
    call,
    call_sync,
    expand,
    is_data_error,
    load_all,
    names,
    op,
    run_pipeline,
    script,
)
from .codes import (
    ClaimCode,
    DeregisterCode,
    DrainCode,
    DropInboxCode,
    HeartbeatCode,
    MarkReadyCode,
    RegisterCode,
    SettleCode,
    SweepCode,
    TakeoverCode,
)

__all__ = [
    "ClaimCode",
    "DeregisterCode",
    "DrainCode",
    "DropInboxCode",
    "HeartbeatCode",
    "MarkReadyCode",
    "Op",
    "RegisterCode",
    "Script",
    "ScriptError",
    "SettleCode",
    "SweepCode",
    "TakeoverCode",
    "all_scripts",
    "call",
    "call_sync",
    "expand",
    "is_data_error",
    "load_all",
    "names",
    "op",
    "run_pipeline",
    "script",
]
