"""The script layer: the Lua scripts of ``lua/`` and their typed calls.

* :mod:`reach.scripts._loader` - loads each script with its includes expanded and calls it
  by SHA, recovering from NOSCRIPT (:func:`call`, :func:`call_sync`, :func:`op`,
  :func:`run_pipeline`, :func:`run_checked`);
* :mod:`reach.scripts.codes` - the codes the scripts answer with, as IntEnums (the Lua side
  is rendered from them);
* one typed call per script: :mod:`reach.scripts.agents` (the registry),
  :mod:`reach.scripts.delivery` (fetch, claim, give_up, complete, settle) and
  :mod:`reach.scripts.inbox` (send, enqueue, mark_pending, drop_inbox). Each encodes keyword arguments
  into KEYS and ARGV and decodes the reply into a typed result; the batched ones take
  ``cluster`` and choose between one call and a pipeline of per-slot calls.
"""

from __future__ import annotations

from . import agents, delivery, inbox
from ._call import Call, run_calls
from ._loader import (
    Op,
    Script,
    ScriptError,
    all_scripts,
    call,
    call_sync,
    expand,
    first_error,
    is_data_error,
    load_all,
    names,
    op,
    run_checked,
    run_pipeline,
    script,
)
from .codes import (
    CancelCode,
    ClaimCode,
    DeregisterCode,
    DrainCode,
    DropInboxCode,
    HeartbeatCode,
    MarkReadyCode,
    RegisterCode,
    SettleCode,
    SweepCode,
)

__all__ = [
    "Call",
    "CancelCode",
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
    "agents",
    "all_scripts",
    "call",
    "call_sync",
    "delivery",
    "expand",
    "first_error",
    "inbox",
    "is_data_error",
    "load_all",
    "names",
    "op",
    "run_calls",
    "run_checked",
    "run_pipeline",
    "script",
]
