"""The agent of the authorization tests (reach.authz), run as a real `reach worker` process
with an Ed25519 identity (REACH_IDENTITY_FILE, REACH_TRUSTED_KEYS_FILE in its environment):
signing is optional for it, so only the capabilities' own rules refuse unsigned callers."""

from __future__ import annotations

from typing import Any

from reach import Agent, Context

AGENT = "authz-1"
REFUND = "pay.refund"  # allow=["role:billing", "id:bob"]
QUOTE = "pay.quote"  # no rules: anyone
SECRET = "pay.secret"  # allow=["id:alice"], security="sensitive"


def w1() -> Agent:
    app = Agent(AGENT, capabilities=[REFUND, QUOTE, SECRET])

    async def run(payload: Any, ctx: Context) -> str:
        # Every run is counted, so a test sees that a refused message never ran.
        await ctx.redis.hincrby(ctx.keys.effects("authz"), f"runs:{ctx.capability}", 1)
        return ctx.sender or "<unsigned>"

    app.handler(REFUND, allow=["role:billing", "id:bob"])(run)
    app.handler(QUOTE)(run)
    app.handler(SECRET, allow=["id:alice"], security="sensitive")(run)
    return app
