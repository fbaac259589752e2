"""The reviewer: capability ``text.review``.

Checks a summary against its source: within the word budget, not empty, and covering
the source's key terms. Returns a score and notes, so a planner can decide what to do.

Run it:  reach worker examples.reviewer:app
"""

from __future__ import annotations

from collections import Counter

import reach
from examples.summarizer import STOPWORDS, words

app = reach.Agent(
    "reviewer-1",
    capabilities=["text.review"],
    metadata={"version": "1.0.0"},
    card={
        "description": "Reviews a summary against its source text.",
        "skills": [
            {
                "id": "text.review",
                "name": "Review a summary",
                "description": "Payload {text, summary, max_words}; returns {ok, score, "
                "notes, by}.",
                "tags": ["text", "review", "quality"],
            }
        ],
    },
)


def key_terms(text: str, n: int = 5) -> list[str]:
    counts = Counter(w for w in words(text) if w not in STOPWORDS and len(w) > 3)
    return [w for w, _ in counts.most_common(n)]


@app.handler("text.review")
async def review(payload: dict, ctx: reach.Context) -> dict:
    text, summary = payload["text"], payload["summary"]
    max_words = int(payload.get("max_words") or 0)
    notes = []
    n = len(summary.split())
    if not summary.strip():
        notes.append("the summary is empty")
    if max_words and n > max_words:
        notes.append(f"{n} words, over the budget of {max_words}")
    terms = key_terms(text)
    have = set(words(summary))
    covered = [t for t in terms if t in have]
    missing = [t for t in terms if t not in have]
    if missing:
        notes.append("key terms missing: " + ", ".join(missing))
    score = round(len(covered) / len(terms), 2) if terms else 1.0
    ok = bool(summary.strip()) and (not max_words or n <= max_words)
    return {"ok": ok, "score": score, "notes": notes, "by": ctx.agent_id}
