"""Streamed results, the caller's reassembly: the chunks of one streamed call, in order,
each number once (docs/concepts.md, *Streamed results*).

The reply reader (:mod:`reach._replies`) hands every chunk entry of a call it streams for
to that call's :class:`ChunkSink`. An entry carries chunks ``seq, seq+1, ...`` of the run
that wrote it; a run numbers its chunks from 0, so after a redelivery (the handler runs
again from the start) the first chunks of the new run repeat numbers the caller has: the
sink keeps only the numbers it has not seen. Entries of one run arrive in order and
without gaps (the worker writes them one at a time, see :mod:`reach._emitting`), so an
entry starting past the next number expected is not from a run of this message as reach
writes them: it is dropped and counted, never allowed to make the sink skip chunks.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import anyio

from .envelope import BadEnvelope, Reply, decode_payload


class ChunkSink:
    """The chunks of one streamed call: :meth:`add` takes each chunk entry read, the call
    takes the chunks from :attr:`chunks` (oldest first) and waits on :meth:`wait`."""

    def __init__(self, *, max_bytes: int | None = None) -> None:
        self.chunks: deque[Any] = deque()
        # None: unbounded. Else the encoded bytes of chunks this call may receive in all;
        # past them nothing more is kept and `overflowed` is set (the call then fails).
        self.max_bytes = max_bytes
        self.received_bytes = 0
        self.overflowed = False
        self.next_seq = 0  # the number of the next chunk to keep
        self.duplicates = 0  # chunks dropped: their number was kept already
        self.dropped = 0  # chunk entries dropped: starting past next_seq
        self._news = anyio.Event()

    def add(self, entry: Reply) -> None:
        """Keep the new chunks of chunk entry ``entry``; raises :class:`BadEnvelope` when
        its ``result`` is not an array of chunks (nothing is kept from it)."""
        try:
            items = decode_payload(entry.result)
        except Exception as e:
            raise BadEnvelope("malformed", f"chunk entry's chunks do not decode ({e})") from e
        if not isinstance(items, list):
            raise BadEnvelope("malformed", f"chunk entry holds {type(items).__name__}, not a list")
        if self.overflowed:
            return
        skip = self.next_seq - entry.seq
        if skip < 0:
            self.dropped += 1
            return
        if skip >= len(items):
            self.duplicates += len(items)
            return
        self.duplicates += skip
        if self.max_bytes is not None:
            self.received_bytes += len(entry.result)
            if self.received_bytes > self.max_bytes:
                self.overflowed = True
                self.wake()
                return
        self.chunks.extend(items[skip:] if skip else items)
        self.next_seq = entry.seq + len(items)
        self.wake()

    def wake(self) -> None:
        """Wake the call waiting in :meth:`wait` (new chunks, or its final reply came)."""
        self._news.set()

    async def wait(self) -> None:
        """Wait until :meth:`wake` was called since the last wait returned."""
        await self._news.wait()
        self._news = anyio.Event()
