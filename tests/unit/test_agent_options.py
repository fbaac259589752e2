"""Agent.run()'s settings: a RuntimeOptions, its fields as keywords, or both; the typed
keywords stay the fields of RuntimeOptions."""

from __future__ import annotations

import dataclasses
import typing

import anyio
import pytest

from reach import Agent, ConfigError, RuntimeOptions
from reach.agent import RunOptions


def test_the_run_keywords_are_the_fields_of_runtime_options() -> None:
    fields = {f.name: f.type for f in dataclasses.fields(RuntimeOptions)}
    assert typing.get_type_hints(RunOptions).keys() == fields.keys()


def test_options_and_keywords_combine_keywords_winning() -> None:
    base = RuntimeOptions(namespace="a", concurrency=4)
    opts = base.replace(concurrency=8)
    assert (opts.namespace, opts.concurrency, base.concurrency) == ("a", 8, 4)
    with pytest.raises(ConfigError, match="concurrency"):
        base.replace(concurrency=0)  # checked again
    with pytest.raises(ConfigError, match="Unknown runtime option"):
        base.replace(concurency=8)


def test_run_refuses_bad_options_before_connecting() -> None:
    app = Agent("opts-1", capabilities=["x.y"])

    async def run(**kw: typing.Any) -> None:
        await app.run(RuntimeOptions(redis_url="redis://127.0.0.1:1/0"), **kw)

    with pytest.raises(ConfigError, match="Unknown runtime option"):
        anyio.run(lambda: run(bogus=1))
    with pytest.raises(ConfigError, match="heartbeat_s"):
        anyio.run(lambda: run(heartbeat_s=20))
