"""``reach cancel MSG_ID``: cancel a message sent earlier (reach.Client.cancel)."""

from __future__ import annotations

import os
import socket
from typing import Annotated

import typer

from reach._cancel import cancel_message
from reach.connection import is_cluster
from reach.keys import Keys

from .common import (
    DEFAULT_NS,
    DEFAULT_REDIS,
    Json,
    Namespace,
    RedisUrl,
    command,
    open_control_apart,
    open_redis,
    print_json,
    table,
)


@command
async def cancel(
    msg_id: Annotated[str, typer.Argument(help="The msg_id printed by `reach send`.")],
    redis_url: RedisUrl = DEFAULT_REDIS,
    namespace: Namespace = DEFAULT_NS,
    json_: Json = False,
) -> None:
    """Cancel a message: not started, it never runs; running, its handler is told
    (ctx.cancelled) and stopped after its grace. A finished one is left as it is (exit 1).

    Example: reach cancel 019a...e3 --json
    """
    r = await open_redis(redis_url)
    control = await open_control_apart(redis_url)  # the audit trail's, when apart
    try:
        res = await cancel_message(
            r,
            Keys(namespace),
            msg_id,
            cluster=is_cluster(r),
            by=f"reach cancel on {socket.gethostname()} (pid {os.getpid()})",
            control=control,
        )
    finally:
        await r.aclose()
        if control is not None:
            await control.aclose()
    row = {"msg_id": res.msg_id, "outcome": str(res.outcome), "status": res.status}
    if json_:
        print_json(row)
    else:
        table(f"cancel {msg_id}", ["field", "value"], list(row.items()))
    if not res.cancelled:
        raise typer.Exit(1)
