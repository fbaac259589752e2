"""A capability's split between application versions (version canaries), and the choice
of a version for a message. Pure: the split is stored and read by :mod:`reach.splits`.

A split names versions with shares, ``1.4=90 1.5=10``: the shares are relative (they need
not add up to 100), a version not named has share 0, and ``=90`` names the agents that
state no version (version ``""``). Only versions with a share above 0 (:attr:`Split.live`)
are ever chosen; ``among`` (the live versions that have an eligible agent now) narrows the
choice, the shares renormalised over it.

* A message of a session: :meth:`Split.for_session`, a point on [0, 1) from a hash of the
  session id (BLAKE2b, the same in every process) laid over the shares. The caller pins
  the result in Redis (``lua/pin_version.lua``), so the session keeps it when the split
  changes later.
* A message without a session: :meth:`Split.draw`, a random point per message.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Collection, Iterable, Sequence
from typing import Final

from ..errors import ConfigError
from ..registry import APP_VERSION_RE

__all__ = ["MAX_SHARE", "MAX_VERSIONS", "Split", "unit_of"]

MAX_VERSIONS: Final = 32
MAX_SHARE: Final = 1_000_000.0


def unit_of(session_id: str) -> float:
    """A point on [0, 1) for ``session_id``: the same in every process and after restarts."""
    digest = hashlib.blake2b(session_id.encode("utf-8", "surrogatepass"), digest_size=8)
    return int.from_bytes(digest.digest(), "big") / 2.0**64


class Split:
    """Versions and their shares, in the order given (the order points are laid over)."""

    __slots__ = ("live", "shares")

    def __init__(self, shares: Iterable[tuple[str, float]]) -> None:
        pairs = list(shares)
        if not 1 <= len(pairs) <= MAX_VERSIONS:
            raise ConfigError(
                f"A split names 1..{MAX_VERSIONS} versions, got {len(pairs)}: e.g. 1.4=90 1.5=10."
            )
        seen: set[str] = set()
        for version, share in pairs:
            if not isinstance(version, str) or not APP_VERSION_RE.fullmatch(version):
                raise ConfigError(
                    f"Invalid version {version!r} in a split: up to 64 letters, digits, '.', "
                    "'_', '+' or '-' ('' for agents without a version)."
                )
            if version in seen:
                raise ConfigError(f"Version {version!r} is named twice in the split.")
            seen.add(version)
            if (
                isinstance(share, bool)
                or not isinstance(share, int | float)
                or not (math.isfinite(share) and 0 <= share <= MAX_SHARE)
            ):
                raise ConfigError(
                    f"Invalid share {share!r} of version {version!r}: a number 0..{MAX_SHARE:g}."
                )
        self.shares: tuple[tuple[str, float], ...] = tuple((v, float(s)) for v, s in pairs)
        self.live: tuple[str, ...] = tuple(v for v, s in self.shares if s > 0)
        if not self.live:
            raise ConfigError(
                "A split needs a version with a share above 0 (to stop splitting, clear it: "
                "reach caps split CAP --clear)."
            )

    @classmethod
    def parse(cls, text: str | Sequence[str]) -> Split:
        """``"1.4=90 1.5=10"``, or those words as a sequence (the CLI's arguments)."""
        words = text.split() if isinstance(text, str) else [w for t in text for w in t.split()]
        pairs: list[tuple[str, float]] = []
        for word in words:
            version, eq, share = word.partition("=")
            if not eq:
                raise ConfigError(
                    f"Invalid split item {word!r}: write VERSION=SHARE, e.g. 1.5=10 (=90 for "
                    "the agents without a version)."
                )
            try:
                value = float(share) if share.strip() and len(share) <= 32 else math.nan
            except ValueError:
                value = math.nan
            if not math.isfinite(value):
                raise ConfigError(f"Invalid share {share!r} of version {version!r}: a number.")
            pairs.append((version, value))
        return cls(pairs)

    def __str__(self) -> str:
        return " ".join(f"{v}={s:g}" for v, s in self.shares)

    def __repr__(self) -> str:
        return f"Split({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Split) and other.shares == self.shares

    def __hash__(self) -> int:
        return hash(self.shares)

    def share(self, version: str) -> float:
        """The share of ``version`` (0 when the split does not name it)."""
        return next((s for v, s in self.shares if v == version), 0.0)

    def percent(self, version: str) -> float:
        """The share of ``version`` in percent of all shares."""
        return 100.0 * self.share(version) / sum(s for _, s in self.shares)

    def choose(self, point: float, among: Collection[str] | None = None) -> str | None:
        """The live version (of ``among``, when given) whose part of [0, 1) holds
        ``point``; None when none of them is live."""
        pool = [(v, s) for v, s in self.shares if s > 0 and (among is None or v in among)]
        if not pool:
            return None
        total = sum(s for _, s in pool)
        edge = point * total
        acc = 0.0
        for v, s in pool:
            acc += s
            if edge < acc:
                return v
        return pool[-1][0]  # rounding at the top end

    def for_session(self, session_id: str, among: Collection[str] | None = None) -> str | None:
        """The version a new session goes to (:func:`unit_of` its id, over the shares)."""
        return self.choose(unit_of(session_id), among)

    def draw(self, rng: random.Random, among: Collection[str] | None = None) -> str | None:
        """A version for one message without a session, at random by share."""
        return self.choose(rng.random(), among)

    def fallbacks(self, first: str, among: Collection[str]) -> list[str]:
        """The other versions of ``among`` with a share above 0, largest share first:
        where a message goes when ``first`` has no agent that can take it."""
        rest = [(v, s) for v, s in self.shares if s > 0 and v != first and v in among]
        return [v for v, _ in sorted(rest, key=lambda p: -p[1])]
