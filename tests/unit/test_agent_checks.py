"""What an Agent refuses before it runs: a declared capability without a handler, a
payload annotation no payload can be validated into."""

from __future__ import annotations

import dataclasses
from typing import Any, TypedDict

import anyio
import msgspec
import pytest

from reach import Agent, ConfigError, Context


class Opaque:
    """A class msgspec cannot decode into."""


class S(msgspec.Struct):
    a: int


class T(TypedDict):
    a: int


@dataclasses.dataclass
class D:
    a: int


def test_a_capability_without_a_handler_is_refused_at_run() -> None:
    app = Agent("c-1", capabilities=["c.done", "c.missing", "c.other"])

    @app.handler("c.done")
    async def done(payload: Any, ctx: Context) -> None: ...

    with pytest.raises(ConfigError, match=r"'c.missing', 'c.other'.*@app.handler\('c.missing'\)"):
        anyio.run(lambda: app.run(redis_url="redis://127.0.0.1:1/0"))  # before connecting


@pytest.mark.parametrize("t", [Opaque, S | dict])  # type: ignore[operator]
def test_a_payload_annotation_that_cannot_be_validated_is_refused_at_registration(
    t: Any,
) -> None:
    app = Agent("c-2", capabilities=["c.x"])

    async def bad(payload: Any, ctx: Context) -> None: ...

    bad.__annotations__["payload"] = t
    with pytest.raises(ConfigError, match="payload annotation"):
        app.handler("c.x")(bad)
    assert "c.x" not in app.handlers


@pytest.mark.parametrize("t", [dict, dict[str, int], list[int], S, T, D, int, str])
def test_types_payloads_are_validated_into(t: Any) -> None:
    app = Agent("c-3", capabilities=["c.x"])

    async def h(payload: Any, ctx: Context) -> None: ...

    h.__annotations__["payload"] = t
    app.handler("c.x")(h)
    assert app.handlers["c.x"].payload_type == t


@pytest.mark.parametrize("t", [Any, object])
def test_any_and_object_take_the_payload_as_decoded(t: Any) -> None:
    app = Agent("c-4", capabilities=["c.x"])

    async def h(payload: Any, ctx: Context) -> None: ...

    h.__annotations__["payload"] = t
    app.handler("c.x")(h)
    assert app.handlers["c.x"].payload_type is Any
