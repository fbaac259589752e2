"""The summariser: capability ``text.summarize``.

An extractive summary (no model, no network): sentences are scored by how often their
words occur in the whole text, and the best ones are kept, in their original order,
within ``max_words``. Swap the body of :func:`summarize_text` for an LLM call and
nothing else changes.

Run it:  reach worker examples.summarizer:app
"""

from __future__ import annotations

import re
from collections import Counter

import msgspec

import reach

STOPWORDS = frozenset(
    {
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "but",
        "by",
        "can",
        "for",
        "from",
        "has",
        "have",
        "in",
        "is",
        "it",
        "its",
        "not",
        "of",
        "on",
        "or",
        "that",
        "the",
        "their",
        "this",
        "to",
        "was",
        "were",
        "which",
        "who",
        "will",
        "with",
    }
)

app = reach.Agent(
    "summarizer-1",
    capabilities=["text.summarize"],
    metadata={"model": "extractive-v1", "version": "1.0.0"},
    card={
        "description": "Summarises a text by keeping its most representative sentences.",
        "skills": [
            {
                "id": "text.summarize",
                "name": "Summarise text",
                "description": "Payload {text, max_words?}; returns {summary, words, by}.",
                "tags": ["text", "summarization", "extractive"],
                "examples": ['{"text": "A long article ...", "max_words": 40}'],
            }
        ],
    },
)


class SummarizeRequest(msgspec.Struct):
    """The payload: a struct annotation makes reach validate it (a bad one is rejected)."""

    text: str
    max_words: int = 40


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


def sentences(text: str) -> list[str]:
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+", text.strip()) if s.strip()]


def summarize_text(text: str, max_words: int) -> str:
    sents = sentences(text)
    freq = Counter(w for w in words(text) if w not in STOPWORDS)

    def score(s: str) -> float:
        ws = [w for w in words(s) if w not in STOPWORDS]
        return sum(freq[w] for w in ws) / (len(ws) or 1)

    ranked = sorted(range(len(sents)), key=lambda i: (-score(sents[i]), i))
    chosen: list[int] = []
    used = 0
    for i in ranked:
        n = len(sents[i].split())
        if used + n <= max_words:
            chosen.append(i)
            used += n
    if not chosen and sents:  # even the best sentence is too long: cut it
        return " ".join(sents[ranked[0]].split()[:max_words])
    return " ".join(sents[i] for i in sorted(chosen))


@app.handler("text.summarize")
async def summarize(payload: SummarizeRequest, ctx: reach.Context) -> dict:
    if payload.max_words < 1:
        raise reach.Reject("max_words must be >= 1")
    summary = summarize_text(payload.text, payload.max_words)
    return {"summary": summary, "words": len(summary.split()), "by": ctx.agent_id}
