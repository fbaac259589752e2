"""The A2A gateway (``pip install 'reach[gateway]'``; ``reach gateway``): a namespace's
capabilities and agents as A2A servers (docs/a2a.md, *The gateway*).

Not imported by ``import reach``: it needs the ``gateway`` extra (``a2a-sdk``, Starlette,
``sse-starlette``, uvicorn), which the core does not.
"""

from __future__ import annotations

from .auth import TOKENS_ENV, Tokens
from .server import CALLER_HEADER, TIMEOUT_HEADER, BearerAuth, BoundedTaskStore, Gateway, Target

__all__ = [
    "CALLER_HEADER",
    "TIMEOUT_HEADER",
    "TOKENS_ENV",
    "BearerAuth",
    "BoundedTaskStore",
    "Gateway",
    "Target",
    "Tokens",
]
