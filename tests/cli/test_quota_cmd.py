"""`reach quota`: what it writes is what clients apply, its mistakes are one `error:` line,
and `reach send` over a quota says which quota refused it."""

from __future__ import annotations

import anyio
import pytest
from reach_cli.app import app as cli_app
from typer.testing import CliRunner, Result

from reach.connection import AnyRedis
from reach.keys import Keys
from reach.quotas import get_quotas
from reach.registry import Registry
from tests.support.registry_helpers import register

pytestmark = pytest.mark.anyio


class Cli:
    def __init__(self, redis_url: str, ns: str) -> None:
        self.common = ["--redis-url", redis_url, "--namespace", ns]

    async def __call__(self, *args: str) -> Result:
        runner = CliRunner()
        return await anyio.to_thread.run_sync(lambda: runner.invoke(cli_app, [*args, *self.common]))


def one_error_line(res: Result, *needles: str) -> None:
    assert res.exit_code != 0, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), res.output
    assert "Traceback" not in res.output
    for n in needles:
        assert n in lines[0], lines[0]


async def test_set_writes_what_clients_read(redis_url: str, ns: str, r: AnyRedis) -> None:
    cli = Cli(redis_url, ns)
    res = await cli("quota", "set", "--max-inbox", "7", "--send-rate", "3/10s", "--burst", "2")
    assert res.exit_code == 0, res.output
    q = await get_quotas(r, Keys(ns))
    assert q.max_inbox == 7 and q.send_rate is not None
    assert (q.send_rate.per_second, q.send_rate.burst) == (0.3, 2)
    # a quota not named is kept
    res = await cli("quota", "set", "--max-inbox", "9")
    q = await get_quotas(r, Keys(ns))
    assert q.max_inbox == 9 and q.send_rate is not None
    await cli("quota", "clear", "--max-inbox")
    q = await get_quotas(r, Keys(ns))
    assert q.max_inbox == 0 and q.send_rate is not None


@pytest.mark.parametrize(
    "args,needle",
    [
        ((), "--max-inbox"),
        (("--burst", "3"), "--burst goes with --send-rate"),
        (("--send-rate", "fast"), "Invalid rate limit 'fast'"),
        (("--send-rate", "0/s"), "above 0"),
    ],
)
async def test_a_bad_setting_is_one_error_line(
    redis_url: str, ns: str, r: AnyRedis, args: tuple[str, ...], needle: str
) -> None:
    res = await Cli(redis_url, ns)("quota", "set", *args)
    one_error_line(res, needle)
    assert not await r.exists(Keys(ns).quotas)  # nothing written


async def test_send_over_a_quota_names_it(redis_url: str, ns: str, r: AnyRedis) -> None:
    cli = Cli(redis_url, ns)
    await register(Registry(r, ns), "cq-1", ["test.quota"], ready=True)  # never reads
    assert (await cli("quota", "set", "--max-inbox", "2")).exit_code == 0
    for i in range(2):
        res = await cli("send", "test.quota", str(i))
        assert res.exit_code == 0, res.output
    res = await cli("send", "test.quota", "3")
    one_error_line(res, "holds 2 messages", "reach quota set --max-inbox 2")
    assert sum([await r.xlen(k) for k in Keys(ns).inboxes("cq-1")]) == 2
