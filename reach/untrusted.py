"""Read values that came from Redis without trusting them.

Anything in the namespace's keys may have been written by someone other than reach (a
bug, an operator's mistake, a hostile writer). These readers never raise: undecodable
text gets replacement characters, a bad number becomes the default (and ranges clamp).
"""

from __future__ import annotations

import math
from typing import Any


def safe_text(value: Any, *, limit: int = 0) -> str:
    """``value`` as text: bytes decoded as UTF-8 with replacement characters, anything
    else through ``str()``; cut to ``limit`` characters when ``limit`` > 0."""
    text = value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else str(value)
    return text[:limit] if limit > 0 else text


def strict_text(value: Any) -> str | None:
    """``value`` as text when it is valid UTF-8 (or already text), else None."""
    if isinstance(value, (bytes, bytearray)):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return value if isinstance(value, str) else None


def safe_int(value: Any, default: int = 0, *, lo: int | None = None, hi: int | None = None) -> int:
    """``value`` as an int (``b"12"``, ``"12"``, ``12``, ``"12.0"``), else ``default``;
    clamped to ``[lo, hi]`` when given. Never raises (nan, inf, ``"abc"``, None...)."""
    try:
        if isinstance(value, (bytes, bytearray)):
            value = value.decode("ascii")
        if isinstance(value, str):
            value = value.strip()
            n = int(value) if value.lstrip("-").isdigit() else float(value)
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            return default
        else:
            n = value
        if isinstance(n, float):
            if not math.isfinite(n):
                return default
            n = int(n)
    except (ValueError, UnicodeDecodeError, OverflowError):
        return default
    if lo is not None and n < lo:
        n = lo
    if hi is not None and n > hi:
        n = hi
    return n
