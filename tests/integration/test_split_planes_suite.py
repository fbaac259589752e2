"""The messaging integration tests run again with the control plane apart
(issue 32, item 2): the registry, its events, rate limits, quotas and the audit trail on
one Redis (``registry_server``), inboxes, records, replies and sessions on another
(``redis_url``'s), every process finding the split in ``REACH_REGISTRY_URL`` (the
``split_planes`` fixture). The tests are those of their own modules, collected here a
second time (the registry's: test_split_planes_registry.py); ``REACH_TEST_SPLIT_PLANES=1``
runs the whole suite that way."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.test_messaging import *
from tests.integration.test_messaging_more import *
from tests.support.planes import assert_apart

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def _apart(split_planes: str, redis_url: str, ns: str) -> Iterator[None]:
    """Every test of this module runs with the control plane on ``registry_server``; after
    it, each plane's keys of its namespace are on their own Redis only."""
    yield
    assert_apart(redis_url, split_planes, ns)
