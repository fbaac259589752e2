"""The A2A gateway (``pip install 'reach-fabric[gateway]'``; ``reach gateway``): a namespace's
capabilities and agents as A2A servers (docs/a2a.md, *The gateway*).

Not imported by ``import reach``: it needs the ``gateway`` extra (``a2a-sdk``, Starlette,
``sse-starlette``, uvicorn), which the core does not.
"""

from __future__ import annotations

import os

# The SDK wraps each of its calls in an OpenTelemetry span when opentelemetry is installed
# (about a hundred per request, a third of the gateway's CPU per request in
# bench/gateway_bench.py), whether or not anything collects them. Off unless asked for;
# read when the SDK is first imported, hence here, before it.
os.environ.setdefault("OTEL_INSTRUMENTATION_A2A_SDK_ENABLED", "false")

from .._access import IpRules
from .._jwt import JwtVerifier, KeySource
from .auth import TOKENS_ENV, Tokens
from .server import (
    CALLER_HEADER,
    TIMEOUT_HEADER,
    BearerAuth,
    Gateway,
    Target,
)
from .store import RedisTaskStore
from .tenants import TenantGateways

__all__ = [
    "CALLER_HEADER",
    "TIMEOUT_HEADER",
    "TOKENS_ENV",
    "BearerAuth",
    "Gateway",
    "IpRules",
    "JwtVerifier",
    "KeySource",
    "RedisTaskStore",
    "Target",
    "TenantGateways",
    "Tokens",
]
