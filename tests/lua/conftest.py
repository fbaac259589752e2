"""Fixtures of the Lua script tests: a :class:`Registry` on the session server, own namespace."""

from __future__ import annotations

import pytest

from reach.connection import AnyRedis
from reach.registry import Registry

EVENTS_MAXLEN = 1000


@pytest.fixture
def reg(r: AnyRedis, ns: str) -> Registry:
    return Registry(r, ns, events_maxlen=EVENTS_MAXLEN)
