"""The one polling helper of the tests: wait for a condition, with a generous bound."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio

T = TypeVar("T")


async def wait_until(
    probe: Callable[[], Awaitable[T]],
    *,
    timeout_s: float = 20.0,
    interval_s: float = 0.02,
    what: str = "condition",
) -> T:
    """Call ``probe`` until it returns something truthy (returned); fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = await probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout_s}s (last: {value!r})")
        await anyio.sleep(interval_s)
