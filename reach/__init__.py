"""reach: a messaging fabric that lets AI agents reach each other by capability."""

from ._version import __version__
from .errors import (
    ConfigError,
    DeadlineExceeded,
    FencedOut,
    InvalidCapability,
    NoAgentAvailable,
    NotRegistered,
    Overloaded,
    PayloadTooLarge,
    ReachError,
    RedisUnavailable,
    Reject,
    Rejected,
    RemoteError,
    Retry,
    StaleRegistration,
    UnknownAgent,
)
from .registry import AgentInfo, Registry, normalize_capability

__all__ = [
    "AgentInfo",
    "ConfigError",
    "DeadlineExceeded",
    "FencedOut",
    "InvalidCapability",
    "NoAgentAvailable",
    "NotRegistered",
    "Overloaded",
    "PayloadTooLarge",
    "ReachError",
    "RedisUnavailable",
    "Registry",
    "Reject",
    "Rejected",
    "RemoteError",
    "Retry",
    "StaleRegistration",
    "UnknownAgent",
    "__version__",
    "normalize_capability",
]
