"""hedge_after_s's checks and the idempotent declaration, without Redis."""

from __future__ import annotations

import math

import pytest

from reach import Agent, ConfigError, Envelope
from reach._hedge import check_after
from reach.registry import IDEMPOTENT_KEY


def env(**kw: object) -> Envelope:
    return Envelope(msg_id="m1", capability="x.look", **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0, -1, math.inf, math.nan, True, "2"])
def test_a_bad_hedge_after_s_is_refused(bad: object) -> None:
    with pytest.raises(ConfigError, match="hedge_after_s"):
        check_after(bad, env())  # type: ignore[arg-type]


def test_hedge_after_s_with_a_target_is_refused_and_none_means_no_hedge() -> None:
    with pytest.raises(ConfigError, match="target"):
        check_after(1.0, env(target="a-1"))
    assert check_after(None, env(target="a-1")) is None
    assert check_after(2, env()) == 2.0


def test_the_idempotent_declaration_is_advertised_once_per_capability() -> None:
    app = Agent("a-1", capabilities=["x.look", "x.pay"])

    async def h(payload: object, ctx: object) -> object:
        return payload

    app.handler("x.look", idempotent=True)(h)
    app.handler("x.look", idempotent=True)(h)
    app.handler("x.pay")(h)
    assert app.metadata[IDEMPOTENT_KEY] == ["x.look"]
