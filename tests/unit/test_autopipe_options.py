"""AutoPipeline's bounds are checked when it is made (reach._autopipe)."""

from __future__ import annotations

import pytest

from reach._autopipe import AutoPipeline
from reach.errors import ConfigError


@pytest.mark.parametrize(("pipelines", "batch"), [(0, 512), (4, 0)])
def test_a_bound_below_one_is_a_config_error(pipelines: int, batch: int) -> None:
    with pytest.raises(ConfigError, match="must be >= 1"):
        AutoPipeline(object(), max_pipelines=pipelines, max_batch=batch)  # type: ignore[arg-type]
