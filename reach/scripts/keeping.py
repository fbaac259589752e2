"""The typed call of ``lua/keep_chunks.lua``: a streaming handler's chunk entry kept in its
message's kept-chunks stream, bounded (reach._emitting writes, reach.resume reads)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ._call import Arg, Call, as_int
from .codes import KeepCode


@dataclass(frozen=True, slots=True)
class Kept:
    """``keep_chunks.lua``'s answer: ``code``, then the record's ``chunks`` (the number of
    the last chunk kept so far, from 1) and ``chunks_from`` (the oldest still held)."""

    code: KeepCode
    chunks: int
    chunks_from: int


def _kept(reply: Any) -> Kept:
    return Kept(KeepCode(as_int(reply[0])), as_int(reply[1]), as_int(reply[2]))


def keep_call(
    record: str,
    stream: str,
    entries: Sequence[tuple[int, int, bytes]],
    *,
    max_chunks: int,
    max_bytes: int,
    keep_ms: int,
) -> Call[Kept]:
    """Keep ``entries`` (1..256 of one run, in order: each ``(seq, n, bytes)``, chunks
    ``seq``.. of its run, ``n`` of them) of the message whose idempotency record is
    ``record`` in ``stream``, within the bounds."""
    args: list[Arg] = [max_chunks, max_bytes, keep_ms]
    for seq, n, entry in entries:
        args += [seq, n, entry]
    return Call("keep_chunks", (record, stream), tuple(args), _kept)
