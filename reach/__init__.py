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
from .client import Client
from .envelope import Envelope, Reply
from .registry import AgentInfo, Registry, normalize_capability
from .runtime import Agent, Context
from .session import Session
from .tasks import DeadLetter, TaskStatus

__all__ = [
    "Agent",
    "AgentInfo",
    "Client",
    "Context",
    "DeadLetter",
    "Envelope",
    "Reply",
    "Session",
    "TaskStatus",
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
