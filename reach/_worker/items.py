"""What travels through the worker: one inbox entry, from read to settled.

Two kinds, settled alike (settlement.py):

* :class:`Delivery` - an entry decoded into an envelope. It is claimed, then handled,
  replayed or parked, and settled with its fenced completion, its reply and the commands
  that follow (dead letter, retry) before its ack;
* :class:`AckOnly` - an entry with no message to handle: bytes that are not an envelope
  (dead-lettered as they were read) or an entry deleted while this worker held it. It is
  settled by its dead letter, if any, and its ack.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..envelope import Envelope
from ..keys import Keys
from ..outcomes import Settled
from ..scripts.delivery import Completion, FollowUp


@dataclass(slots=True, eq=False, kw_only=True)
class _Entry:
    stream: str  # the inbox stream it was read from
    entry_id: Any  # its id there, as read
    raw: bytes = b""  # its bytes as read (dead-lettered as they are if unprocessable)
    follow_up: FollowUp | None = None  # its dead letter or retry, written before the ack
    outcome: Settled | None = None  # how it is settled (None until decided)
    reason: str = ""  # the dead-letter reason, if any
    queued: bool = False  # handed to settlement: its outcome is on its way to Redis

    # Read by reach.scripts.delivery.settle (SettleLike): an entry is settled as it is.
    @property
    def inbox(self) -> str:
        return self.stream


@dataclass(slots=True, eq=False, kw_only=True)
class AckOnly(_Entry):
    """An inbox entry without a message to handle: settled by its follow-up (a dead letter), if any, and its ack."""

    @property
    def completion(self) -> Completion | None:
        return None

    @property
    def reply(self) -> bytes:
        return b""

    @property
    def reply_stream(self) -> str:
        return ""


@dataclass(slots=True, eq=False, kw_only=True)
class Delivery(_Entry):
    """An inbox entry decoded into an envelope, on its way through claim -> handle -> settle."""

    env: Envelope
    idem: str = ""  # its idempotency record's key (set when it is claimed)
    fence: int = 0  # the claim's fence token (0: not claimed by this worker)
    claimed_at_send: bool = False  # send.lua claimed it for this runtime (fence 1)
    epoch: int = 0  # the runtime's registrations lost when it was read (see WorkerState)
    judged_again: bool = False  # its claim taken up again after it may have been lost
    complete: Completion | None = None  # set when its idempotency key is to be settled
    reply: bytes = b""  # the reply: stored by a 'done' completion, and published...
    reply_key: str = ""  # ... to this reply stream ('' = nobody waits for it)
    started_ms: int = 0  # when its handling began (0: not handled here; reach.recent)
    key: str = ""  # env.key, its idempotency key (read often on the hot path: kept)

    def __post_init__(self) -> None:
        if not self.key:
            self.key = self.env.key

    @property
    def completion(self) -> Completion | None:
        return self.complete

    @property
    def reply_stream(self) -> str:
        return self.reply_key

    def answer(self, keys: Keys, reply: bytes, *, publish: bool) -> None:
        """Set the reply, published to the caller's reply stream when ``publish``."""
        self.reply = reply
        self.reply_key = keys.replies(self.env.reply_to) if (publish and self.env.reply_to) else ""


Settleable = Delivery | AckOnly
