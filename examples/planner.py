"""The planner: capability ``assistant.chat``, a conversation kept across turns.

Each turn it plans two calls over reach: ``text.summarize`` (the summariser) and then
``text.review`` (the reviewer). The session (``ctx.session``, stored in Redis under the
message's ``session_id``) keeps every turn, so a follow-up needs no text of its own:

* turn 1: ``{"text": "<a document>"}`` (optionally ``"max_words"``): summarise it;
* turn 2: ``{"ask": "shorter"}`` (or ``"longer"``): summarise the same document again,
  with half (or twice) the previous word budget.

Calls made through ``ctx.client`` carry this message's session, trace and deadline.

Run it:  reach worker examples.planner:app
Talk to it:  reach send assistant.chat '{"text": "..."}' --session s1 --wait
"""

from __future__ import annotations

from typing import Any

import reach

DEFAULT_MAX_WORDS = 40

app = reach.Agent(
    "planner-1",
    capabilities=["assistant.chat"],
    metadata={"version": "1.0.0"},
    card={
        "description": "Summarises documents in a conversation: asks a summariser, then "
        "a reviewer, and remembers the document across turns.",
        "skills": [
            {
                "id": "assistant.chat",
                "name": "Summarise in a conversation",
                "description": 'Turn 1: {"text": ...}; later turns: {"ask": "shorter"} or '
                '{"ask": "longer"}. Needs a session_id.',
                "tags": ["chat", "planner", "summarization"],
                "examples": ['{"text": "A long article ..."}', '{"ask": "shorter"}'],
            }
        ],
    },
)


def plan(payload: dict[str, Any], history: list[dict[str, Any]]) -> tuple[str, int]:
    """What to summarise this turn, and within how many words."""
    last = history[-1] if history else None
    text = payload.get("text") or (last and last["document"])
    if not text:
        raise reach.Reject('nothing to summarise yet: start the session with {"text": ...}')
    if payload.get("max_words"):
        return text, int(payload["max_words"])
    budget = last["max_words"] if last and not payload.get("text") else DEFAULT_MAX_WORDS
    ask = payload.get("ask", "")
    if ask == "shorter":
        budget = max(5, budget // 2)
    elif ask == "longer":
        budget *= 2
    return text, budget


@app.handler("assistant.chat")
async def chat(payload: dict, ctx: reach.Context) -> dict:
    if not ctx.session_id:
        raise reach.Reject("assistant.chat keeps a conversation: send it with a session_id")
    history = await ctx.session.history()
    # A redelivered turn (its worker crashed after saving it) answers what it saved.
    for turn in history:
        if turn["key"] == ctx.idempotency_key:
            return turn["answer"]

    text, max_words = plan(payload, history)
    summary = await ctx.client.request("text.summarize", {"text": text, "max_words": max_words})
    review = await ctx.client.request(
        "text.review", {"text": text, "summary": summary["summary"], "max_words": max_words}
    )
    answer = {
        "turn": len(history) + 1,
        "summary": summary["summary"],
        "max_words": max_words,
        "review": {"ok": review["ok"], "score": review["score"], "notes": review["notes"]},
        "agents": [ctx.agent_id, summary["by"], review["by"]],
    }
    await ctx.session.append(
        {
            "key": ctx.idempotency_key,
            "request": payload,
            "document": text,
            "max_words": max_words,
            "answer": answer,
        }
    )
    return answer
