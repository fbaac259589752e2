"""The console answers a task waiting for input (``ctx.ask``): its page shows the question
and an Answer link, the form (with the session's CSRF token) resumes the handler, and a
form without the token, or for a question answered already, changes nothing. HTTP level
(httpx on the ASGI app), with an agent running in process on a real Redis."""

from __future__ import annotations

import html
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from reach import Agent, Context
from reach.connection import AnyRedis
from reach.web.app import create_app
from reach.web.security import Guard, loopback_hosts
from tests.integration.test_web import HOST, _csrf
from tests.support.agents_messaging import serving
from tests.support.waiting import wait_until

pytestmark = pytest.mark.anyio
CAP = "web.approve"


def _asking_agent() -> Agent:
    app = Agent("web-asker", capabilities=[CAP])

    @app.handler(CAP)
    async def approve(payload: Any, ctx: Context) -> Any:
        return {"answer": await ctx.ask(f"Approve <{payload}>?", timeout_s=60)}

    return app


@pytest.fixture
async def console(r: AnyRedis, ns: str) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(r, ns, Guard(token=None, allowed_hosts=loopback_hosts("127.0.0.1")))
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=HOST) as client,
    ):
        yield client


async def test_the_console_shows_the_question_and_answers_it(
    console: httpx.AsyncClient, redis_url: str, ns: str
) -> None:
    async with serving(redis_url, ns, _asking_agent()) as c:
        msg_id = await c.send(CAP, "invoice 7", timeout_s=60)

        async def waiting() -> bool:
            return (await c.task(msg_id)).status == "input_required"

        await wait_until(waiting, what="the handler asking")
        page = await console.get("/message", params={"id": msg_id})
        assert page.status_code == 200
        assert 'id="task-question">Approve &lt;invoice 7&gt;?<' in page.text, "escaped"
        assert 'id="answer-msg"' in page.text
        form = await console.get("/message/answer", params={"id": msg_id})
        assert html.escape("Approve <invoice 7>?") in form.text
        token = _csrf(form.text)

        refused = await console.post(
            "/message/answer", data={"id": msg_id, "ask": "1", "answer": "true", "csrf": "0" * 64}
        )
        assert refused.status_code == 403
        assert (await c.task(msg_id)).status == "input_required", "nothing changed"

        done = await console.post(
            "/message/answer",
            data={"id": msg_id, "ask": "1", "answer": '{"approved": true}', "csrf": token},
        )
        assert done.status_code == 303
        assert done.headers["location"] == f"/message?id={msg_id}&note=answered"
        assert await c.result(msg_id, timeout_s=30) == {"answer": {"approved": True}}

        again = await console.post(
            "/message/answer", data={"id": msg_id, "ask": "1", "answer": "no", "csrf": token}
        )
        assert again.status_code == 409
        assert "answered already" in again.text
        page = await console.get("/message", params={"id": msg_id})
        assert 'id="answer-msg"' not in page.text


async def test_plain_text_is_an_answer_too(
    console: httpx.AsyncClient, redis_url: str, ns: str
) -> None:
    async with serving(redis_url, ns, _asking_agent()) as c:
        msg_id = await c.send(CAP, "order 9", timeout_s=60)

        async def waiting() -> bool:
            return (await c.task(msg_id)).status == "input_required"

        await wait_until(waiting, what="the handler asking")
        token = _csrf((await console.get("/message/answer", params={"id": msg_id})).text)
        res = await console.post(
            "/message/answer", data={"id": msg_id, "ask": "1", "answer": "yes, go", "csrf": token}
        )
        assert res.status_code == 303
        assert await c.result(msg_id, timeout_s=30) == {"answer": "yes, go"}
