"""The registry view's integration tests run again with the control plane apart (issue 32,
item 2): their Redis (``r``) is the control plane's (``registry_server``), while the data
plane is ``redis_url``'s and every process finds the split in ``REACH_REGISTRY_URL``. The
tests are those of tests/integration/test_registry_view.py, collected here a second time;
the messaging ones are in test_split_planes_suite.py."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from reach.connection import AnyRedis, connect
from tests.integration.test_registry_view import *
from tests.support.planes import assert_apart

pytestmark = pytest.mark.anyio


@pytest.fixture
async def r(split_planes: str) -> AsyncIterator[AnyRedis]:
    """The registry's Redis: what the registry tests read and write is the control plane."""
    client = await connect(split_planes)
    yield client
    await client.aclose()


@pytest.fixture(autouse=True)
def _apart(split_planes: str, redis_url: str, ns: str) -> Iterator[None]:
    yield
    assert_apart(redis_url, split_planes, ns)
