"""The agents `reach demo` runs as real `reach worker` processes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio

from reach import Agent, Context


def summarizer(agent_id: str = "summarizer-1", region: str = "eu", weight: float = 1) -> Agent:
    app = Agent(
        agent_id,
        capabilities=["text.summarize", "text.stream", "text.flaky"],
        weight=weight,
        metadata={"region": region, "model": "tiny"},
    )

    @app.handler("text.summarize")
    async def summarize(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
        words = str(payload.get("text", "")).split()
        work_s = float(payload.get("work_s", 0))
        if work_s:
            with anyio.move_on_after(work_s):  # the work, unless the caller cancels it
                await ctx.wait_cancelled()
            if ctx.cancelled:
                await ctx.redis.hset(ctx.keys.effects("demo"), "saw_cancel", ctx.msg_id)
        if payload.get("explain_first"):
            # A summariser that wants the code explained before it summarises: it asks
            # code.explain, whose handler (the caller, waiting) asks for this summary:
            # a loop, refused at once with reach.LoopDetected instead of waiting.
            await ctx.client.request("code.explain", payload)
        return {
            "summary": " ".join(words[:5]) + (" ..." if len(words) > 5 else ""),
            "by": ctx.agent_id,
            "priority": ctx.priority,
        }

    @app.handler("text.stream")
    async def stream(payload: dict[str, Any], ctx: Context) -> AsyncIterator[str]:
        # A streaming summariser (an async generator): each word goes to the caller as it
        # is "generated", as a model's tokens would; the final result is ctx.result.
        words = str(payload.get("text", "")).split()[:12]
        for w in words:
            await anyio.sleep(float(payload.get("token_s", 0.03)))
            yield w
        ctx.result = {"words": len(words), "by": ctx.agent_id}

    @app.handler("text.flaky")
    async def flaky(payload: dict[str, Any], ctx: Context) -> str:
        # Fails until an operator "repairs" it: shows retries, a dead letter and its replay.
        repaired = await ctx.redis.hget(ctx.keys.effects("demo"), "repaired")
        if not repaired:
            raise RuntimeError("downstream service unavailable")
        return f"done by {ctx.agent_id} on attempt {ctx.attempt}"

    return app


def reviewer() -> Agent:
    app = Agent(
        "reviewer-1",
        capabilities=["code.review", "code.audit", "code.explain", "code.merge"],
        metadata={"region": "us"},
    )

    @app.handler("code.explain")
    async def explain(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
        # Explaining starts from a summary of the code (text.summarize, which here wants
        # the explanation first: the loop of the demo's step 5c).
        summary = await ctx.client.request("text.summarize", payload)
        return {"explanation": f"in short: {summary['summary']}"}

    @app.handler("code.audit")
    async def audit(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
        # A parent task: it asks a summariser for a long sub-task through ctx.client, so
        # cancelling the audit cancels the summary too.
        child = await ctx.client.send(
            "text.summarize", {"text": "the audited module, at length", "work_s": 60}
        )
        await ctx.redis.hset(ctx.keys.effects("demo"), "audit_child", child)
        with anyio.move_on_after(60):
            await ctx.wait_cancelled()
        return {"child": child}

    @app.handler("code.merge")
    async def merge(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
        # A person decides (ctx.ask): the task waits input_required, its slot given back,
        # until someone answers (client.answer, reach task answer, the console, A2A).
        answer = await ctx.ask(f"Merge {payload['change']} into main?", timeout_s=60)
        merged = answer is True or (isinstance(answer, dict) and answer.get("merge") is True)
        return {"change": payload["change"], "merged": merged, "answer": answer}

    @app.handler("code.review")
    def review(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
        code = str(payload.get("code", ""))
        return {"ok": "eval(" not in code, "lines": code.count("\n") + 1}

    return app


def summarizer_1() -> Agent:
    return summarizer("summarizer-1", "eu", 2)


def summarizer_2() -> Agent:
    return summarizer("summarizer-2", "us", 1)


def broken() -> Agent:
    """A summarizer whose model is down: every call fails (the breaker demo)."""
    app = Agent("summarizer-3", capabilities=["text.summarize"], metadata={"region": "eu"})

    @app.handler("text.summarize")
    async def summarize(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
        raise RuntimeError("model backend unavailable")

    return app
