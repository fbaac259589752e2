"""`reach cancel MSG_ID` against a real Redis and an agent in the test's loop: a running
message is cancelled (exit 0, `reach task` shows it), a second cancel says so (exit 0), a
finished one is refused (exit 1)."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest
from reach_cli.app import app as cli_app
from typer.testing import CliRunner

from reach.connection import AnyRedis
from tests.integration.test_cancel import wait_effect
from tests.support.agents_cancel import make
from tests.support.agents_messaging import serving, wait_status

pytestmark = pytest.mark.anyio


async def cli(url: str, ns: str, *args: str, code: int = 0) -> Any:
    common = ["--redis-url", url, "--namespace", ns, "--json"]
    res = await anyio.to_thread.run_sync(lambda: CliRunner().invoke(cli_app, [*args, *common]))
    assert res.exit_code == code, (args, res.exit_code, res.output)
    return json.loads(res.stdout)


async def test_reach_cancel(redis_url: str, ns: str, r: AnyRedis) -> None:
    async with serving(redis_url, ns, make(), cancel_grace_s=30) as client:
        held = await client.send("can.hold", 60)
        await wait_effect(r, ns, "started", held)
        got = await cli(redis_url, ns, "cancel", held)
        assert got == {"msg_id": held, "outcome": "cancelled", "status": "running"}
        await wait_effect(r, ns, "saw_cancel", held)  # the handler was told
        task = await cli(redis_url, ns, "task", held)
        assert task["status"] == "cancelled" and task["error"].startswith(
            "cancelled by reach cancel"
        )
        again = await cli(redis_url, ns, "cancel", held)
        assert again["outcome"] == "already_cancelled"
        done = await client.send("can.work", 1)
        await wait_status(client, done, "succeeded")
        refused = await cli(redis_url, ns, "cancel", done, code=1)
        assert (refused["outcome"], refused["status"]) == ("already_done", "succeeded")
