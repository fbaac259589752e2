"""reach.vote and the quorum words of Client.gather, without Redis."""

from __future__ import annotations

import pytest

from reach import Answer, ConfigError, Gathered, vote
from reach.gather import quorum_of


@pytest.mark.parametrize(
    ("quorum", "asked", "need"),
    [
        (3, 5, 3),
        (7, 5, 7),
        ("majority", 5, 3),
        ("majority", 4, 3),
        ("majority", 1, 1),
        ("all", 5, 5),
    ],
)
def test_quorum_of(quorum: int | str, asked: int, need: int) -> None:
    assert quorum_of(quorum, asked) == need


@pytest.mark.parametrize("quorum", [0, -1, True, 2.5, "most", ""])
def test_a_bad_quorum_is_refused_with_what_to_pass(quorum: object) -> None:
    with pytest.raises(ConfigError, match="majority"):
        quorum_of(quorum, 5)  # type: ignore[arg-type]


def test_vote_counts_equal_dicts_whatever_their_key_order() -> None:
    answers = [
        Answer("a", {"label": "yes", "score": 1}),
        Answer("b", {"score": 1, "label": "yes"}),
        Answer("c", {"label": "no", "score": 1}),
    ]
    v = vote(answers)
    assert (v.value, v.support, v.total, v.agents, v.majority) == (
        {"label": "yes", "score": 1},
        2,
        3,
        ["a", "b"],
        True,
    )


def test_vote_with_a_key_and_plain_values_and_ties() -> None:
    v = vote(
        [{"label": "x", "n": 1}, {"label": "y"}, {"label": "x", "n": 2}], key=lambda r: r["label"]
    )
    assert (v.value, v.support, v.agents) == ({"label": "x", "n": 1}, 2, [])
    tie = vote(["b", "a", "a", "b"])  # the first value to reach the top support wins
    assert (tie.value, tie.support, tie.majority) == ("b", 2, False)
    g = Gathered(capability="c.x", quorum=1, asked=["a"], answers=[Answer("a", b"\x00")])
    assert vote(g).value == b"\x00"  # bytes vote as JSON too
    assert vote([object, object]).support == 2  # no JSON form: compared by repr


def test_vote_on_nothing_says_what_to_do() -> None:
    with pytest.raises(ConfigError, match="at least one answer"):
        vote([])
