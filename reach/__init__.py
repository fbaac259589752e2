"""reach: a messaging fabric that lets AI agents reach each other by capability."""

from ._buffer import PendingLocal
from ._cancel import CancelOutcome, CancelResult
from ._streaming import Stream
from ._version import __version__
from .agent import Agent, RuntimeOptions
from .client import Client
from .context import Context
from .envelope import Envelope, Hop, Reply
from .errors import (
    AmbiguousDeadLetterId,
    BadDeadLetterId,
    Cancelled,
    ChunksNotKept,
    ConfigError,
    ConnectionsExhausted,
    DeadLetterNotFound,
    DeadlineExceeded,
    HopLimitExceeded,
    InvalidCapability,
    LoopDetected,
    NoAgentAvailable,
    NotStarted,
    Overloaded,
    PayloadTooLarge,
    QuorumFailed,
    RateLimited,
    ReachError,
    RedisFull,
    RedisUnavailable,
    Reject,
    Rejected,
    RemoteError,
    Retry,
    StaleRegistration,
    StaleRun,
    StepRefused,
    StepTooLarge,
    StreamTooLarge,
    TooManySteps,
    UnknownAgent,
    WouldDeadlock,
)
from .gather import Answer, Failure, Gathered, Vote, vote
from .hooks import Hooks
from .outcomes import DeadReason, Status, Unavailable
from .registry import AgentInfo, Registry, normalize_capability
from .resume import Resumed
from .scheduling import ScheduledSend
from .session import Session
from .tasks import DeadLetter, TaskStatus
from .watch import TaskChange

__all__ = [
    "Agent",
    "AgentInfo",
    "AmbiguousDeadLetterId",
    "Answer",
    "BadDeadLetterId",
    "CancelOutcome",
    "CancelResult",
    "Cancelled",
    "ChunksNotKept",
    "Client",
    "ConfigError",
    "ConnectionsExhausted",
    "Context",
    "DeadLetter",
    "DeadLetterNotFound",
    "DeadReason",
    "DeadlineExceeded",
    "Envelope",
    "Failure",
    "Gathered",
    "Hooks",
    "Hop",
    "HopLimitExceeded",
    "InvalidCapability",
    "LoopDetected",
    "NoAgentAvailable",
    "NotStarted",
    "Overloaded",
    "PayloadTooLarge",
    "PendingLocal",
    "QuorumFailed",
    "RateLimited",
    "ReachError",
    "RedisFull",
    "RedisUnavailable",
    "Registry",
    "Reject",
    "Rejected",
    "RemoteError",
    "Reply",
    "Resumed",
    "Retry",
    "RuntimeOptions",
    "ScheduledSend",
    "Session",
    "StaleRegistration",
    "StaleRun",
    "Status",
    "StepRefused",
    "StepTooLarge",
    "Stream",
    "StreamTooLarge",
    "TaskChange",
    "TaskStatus",
    "TooManySteps",
    "Unavailable",
    "UnknownAgent",
    "Vote",
    "WouldDeadlock",
    "__version__",
    "normalize_capability",
    "vote",
]
