"""What an Agent refuses before it runs: a declared capability without a handler, a
payload annotation no payload can be validated into."""

from __future__ import annotations

import dataclasses
from typing import Any, TypedDict

import anyio
import msgspec
import pytest

from reach import Agent, ConfigError, Context
from reach.envelope import Envelope
from reach.keys import Keys


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


def test_a_renamed_agent_keeps_everything_but_its_id() -> None:
    app = Agent("orig", capabilities=["c.x"], weight=2, metadata={"region": "eu"}, max_queue=5)

    @app.handler("c.x")
    async def h(payload: dict, ctx: Context) -> None: ...  # type: ignore[type-arg]

    copy = app.renamed("orig-2")
    assert copy.agent_id == "orig-2" and app.agent_id == "orig"
    assert (copy.capabilities, copy.weight, copy.metadata, copy.max_queue) == (
        ["c.x"],
        2.0,
        {"region": "eu", "schemas": {"c.x": {"input": {"type": "object"}}}},  # reach.schemas
        5,
    )
    assert copy.handlers == app.handlers and copy.handlers is not app.handlers
    with pytest.raises(ConfigError, match="agent_id"):
        app.renamed("has space")


def test_agent_id_templates() -> None:
    from reach_cli.worker_cmd import agent_ids

    assert agent_ids("s-{n}", 3) == ["s-1", "s-2", "s-3"]
    assert agent_ids("fixed", 1) == ["fixed"]
    assert agent_ids("s-{hostname}-{n}", 1)[0].startswith("s-")
    with pytest.raises(ConfigError, match=r"\{n\}"):
        agent_ids("same", 2)
    with pytest.raises(ConfigError, match="only"):
        agent_ids("s-{host}-{n}", 2)


def test_a_readiness_check_takes_no_arguments_and_a_bounded_timeout() -> None:
    app = Agent("r-1", capabilities=["c.x"])

    @app.readiness
    async def up() -> bool:
        return True

    assert app.readiness_check is not None and app.readiness_check.is_async
    assert app.readiness_check.timeout_s == 5.0

    @app.readiness(timeout_s=2)
    def plain_up() -> bool:
        return True

    assert app.readiness_check.fn is plain_up and not app.readiness_check.is_async
    assert app.readiness_check.timeout_s == 2.0
    assert app.renamed("r-2").readiness_check is app.readiness_check  # copies keep it

    def takes(x: int) -> bool:
        return True

    with pytest.raises(ConfigError, match="no arguments"):
        app.readiness(takes)
    for bad in (0, -1, 3601, float("nan"), True):
        with pytest.raises(ConfigError, match="timeout_s"):
            app.readiness(timeout_s=bad)


def test_set_ready_before_run_starts_paused_and_a_bare_context_has_no_agent() -> None:
    app = Agent("r-3", capabilities=["c.x"])
    assert not app.paused
    app.set_ready(False)  # no runtime yet: kept for the run
    assert app.paused
    app.set_ready(True)
    assert not app.paused
    ctx = Context(
        Envelope(msg_id="m", capability="c.x"),
        0,
        agent_id="r-3",
        redis=None,  # type: ignore[arg-type]
        keys=Keys("ns"),
        client=None,  # type: ignore[arg-type]
    )
    with pytest.raises(ConfigError, match="no agent"):
        _ = ctx.agent
