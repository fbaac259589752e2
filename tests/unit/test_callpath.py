"""The call path (reach.callpath): its wire form and bounds, its signature, loops, the
hop limit and the gate a handler's call is routed through."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

import reach
from reach import Agent, Client, ConfigError, Hop, HopLimitExceeded, LoopDetected, WouldDeadlock
from reach.callpath import (
    CallGate,
    SelfSlots,
    child_path,
    describe,
    find_loop,
    hop_limit,
    path_of,
)
from reach.envelope import MAX_PATH, BadEnvelope, Envelope, decode_envelope, encode
from reach.signing import Keyring, envelope_data

SECRET = b"0123456789abcdef0123456789abcdef"


def env(**kw: Any) -> Envelope:
    kw.setdefault("msg_id", "m1")
    kw.setdefault("capability", "a.x")
    return Envelope(**kw)


def raw(**fields: Any) -> bytes:
    return msgspec.msgpack.encode({"v": 1, "msg_id": "m1", "capability": "a.x", **fields})


# -- the wire ---------------------------------------------------------------------------
def test_a_message_without_a_call_path_encodes_as_before() -> None:
    data = encode(env())
    assert b"hops" not in data and b"path" not in data
    got = decode_envelope(data)
    assert got.hops == 0 and got.path == []


def test_a_call_path_round_trips_as_arrays() -> None:
    e = env(hops=2, path=[Hop("a.x", "a1", True), Hop("b.y", "b1", False)])
    decoded = msgspec.msgpack.decode(encode(e))
    assert decoded["hops"] == 2
    assert decoded["path"] == [["a.x", "a1", True], ["b.y", "b1", False]]
    assert decode_envelope(encode(e)).path == e.path


@pytest.mark.parametrize(
    "fields",
    [
        {"hops": -1},
        {"hops": 1_000_001},
        {"hops": "3"},
        {"path": "a.x@a1"},
        {"path": [["a.x", "a1"]]},  # waits missing
        {"path": [["A.X", "a1", True]]},  # not a capability
        {"path": [["a.x", "", True]]},  # no agent
        {"path": [["a.x", "a" * 1025, True]]},
        {"path": [["a.x", "a1", 1]]},  # not a bool
        {"path": [["a.x", "a1", True]] * (MAX_PATH + 1)},
        {"path": {"a.x": "a1"}},
    ],
    ids=str,
)
def test_a_call_path_out_of_bounds_is_malformed(fields: dict[str, Any]) -> None:
    with pytest.raises(BadEnvelope) as e:
        decode_envelope(raw(**fields))
    assert e.value.reason == "malformed"


def test_a_newer_field_is_ignored_by_an_envelope_of_before() -> None:
    # What an old reader does with a new envelope: unknown fields are skipped.
    class Before(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
        v: int = 1
        msg_id: str
        capability: str

    e = env(hops=1, path=[Hop("a.x", "a1", True)])
    old = msgspec.msgpack.decode(encode(e), type=Before)
    assert old.msg_id == "m1"
    # and a hop of a later version, with more items, is read for its first three
    later = decode_envelope(raw(hops=1, path=[["a.x", "a1", True, "more"]]))
    assert later.path == [Hop("a.x", "a1", True)]


# -- the signature ----------------------------------------------------------------------
def test_the_signature_covers_the_path_and_leaves_older_envelopes_alone() -> None:
    ring = Keyring("ns", [SECRET])
    plain = env(sent_ms=5)
    # without a path the signed bytes are the array of before: 16 items
    assert len(msgspec.msgpack.decode(envelope_data("ns", plain))) == 16
    ring.sign_envelope(plain)
    assert ring.check_envelope(plain) is None

    child = env(sent_ms=5, hops=1, path=[Hop("b.y", "b1", True)])
    assert len(msgspec.msgpack.decode(envelope_data("ns", child))) == 18
    ring.sign_envelope(child)
    assert ring.check_envelope(child) is None
    for change in (
        {"path": []},
        {"hops": 0, "path": []},
        {"hops": 2},
        {"path": [Hop("b.y", "b2", True)]},
        {"path": [Hop("b.y", "b1", False)]},
    ):
        forged = msgspec.structs.replace(child, **change)
        assert ring.check_envelope(forged) is not None, change


# -- loops ------------------------------------------------------------------------------
A, B, C = Hop("a.x", "a1", True), Hop("b.y", "b1", True), Hop("c.z", "c1", True)


def test_a_to_b_to_a_is_a_loop_naming_the_cycle() -> None:
    assert find_loop([A, B], "a.x", "a1") == [A, B]
    assert describe([A, B], "a.x", "a1") == "a.x@a1 -> b.y@b1 -> a.x@a1"
    assert find_loop([C, A, B], "a.x", "a1") == [A, B]  # the cycle, not the whole path


def test_the_same_capability_on_another_agent_is_no_loop() -> None:
    assert find_loop([A, B], "a.x", "a2") is None


def test_the_same_agent_under_another_capability_closes_a_loop_through_it() -> None:
    other_cap = Hop("a.w", "a1", True)
    assert find_loop([A, other_cap], "a.x", "a1") == [A, other_cap]


def test_a_send_on_the_way_breaks_the_waiting_chain() -> None:
    sent = Hop("b.y", "b1", False)  # b1 sent its call and went on
    assert find_loop([A, sent], "a.x", "a1") is None
    assert find_loop([A, sent, C], "a.x", "a1") is None
    assert find_loop([sent, C], "c.z", "c1") is None  # a self-call, judged by slots


def test_self_calls_alone_are_no_loop() -> None:
    assert find_loop([A], "a.x", "a1") is None
    assert find_loop([A, A, A], "a.x", "a1") is None
    assert find_loop([A, B, A], "a.x", "a1") == [A, B, A]


def test_child_path_adds_the_parent_hop_and_keeps_the_newest() -> None:
    parent = env(hops=3, path=[B])
    hops, path = child_path(parent, "a1", waits=True)
    assert hops == 4 and path == [B, A]
    long = env(hops=100, path=[B] * MAX_PATH)
    hops, path = child_path(long, "a1", waits=False)
    assert hops == 101 and len(path) == MAX_PATH and path[-1] == Hop("a.x", "a1", False)


# -- the hop limit ----------------------------------------------------------------------
def test_hop_limit_refuses_past_the_limit_only() -> None:
    assert hop_limit(env(hops=16, path=[B]), 16) is None
    err = hop_limit(env(hops=17, path=[B]), 16)
    assert isinstance(err, HopLimitExceeded) and isinstance(err, reach.Rejected)
    assert err.hops == 17 and err.max_hops == 16 and err.reason == "hop_limit"
    assert err.path == "b.y@b1 -> a.x" == path_of(str(err))
    assert "not sent" in str(err)
    by_agent = hop_limit(env(hops=17, path=[B]), 16, "a1")
    assert by_agent is not None and by_agent.path == "b.y@b1 -> a.x@a1"
    assert "agent 'a1' refused it" in str(by_agent)


@pytest.mark.parametrize("bad", [0, -1, 10_001, 2.5, True, "16"])
def test_max_hops_settings_are_checked(bad: Any) -> None:
    with pytest.raises(ConfigError, match="max_hops"):
        Client(redis_url="redis://127.0.0.1:1/0", max_hops=bad)
    with pytest.raises(ConfigError, match="max_hops"):
        Agent("a1", capabilities=["a.x"], max_hops=bad)
    app = Agent("a1", capabilities=["a.x"])
    with pytest.raises(ConfigError, match="max_hops"):
        app.handler("a.x", max_hops=bad)


def test_max_hops_travels_with_the_agent_and_its_handlers() -> None:
    app = Agent("a1", capabilities=["a.x", "b.y"], max_hops=4)

    @app.handler("a.x", max_hops=2)
    async def ax(payload: Any, ctx: Any) -> None: ...

    @app.handler("b.y")
    async def by(payload: Any, ctx: Any) -> None: ...

    assert app.handlers["a.x"].max_hops == 2 and app.handlers["b.y"].max_hops is None
    assert app.renamed("a2").max_hops == 4


# -- the gate ---------------------------------------------------------------------------
def test_the_gate_refuses_a_loop_and_lets_another_agent_take_the_call() -> None:
    call = env(hops=2, path=[A, B])
    gate = CallGate(call, "b1", None)
    err = gate("a1")
    assert isinstance(err, LoopDetected) and err.path == "a.x@a1 -> b.y@b1 -> a.x@a1"
    assert gate("a2") is None


def test_the_gate_counts_self_calls_not_started_as_slots_taken() -> None:
    busy = [1]  # the calling handler's own slot
    slots = SelfSlots(2, lambda: busy[0])
    first = CallGate(env(msg_id="c1", hops=1, path=[A]), "a1", slots)
    second = CallGate(env(msg_id="c2", hops=1, path=[A]), "a1", slots)
    assert first("a1") is None and slots.pending == {"c1"}
    refused = second("a1")
    assert isinstance(refused, WouldDeadlock) and refused.reason == "would_deadlock"
    assert isinstance(refused, reach.NoAgentAvailable)
    assert second("a2") is None  # another agent of the capability takes it
    # the first one started there: it is a running handler now, no longer pending
    slots.pending.discard("c1")
    busy[0] = 2
    assert isinstance(second("a1"), WouldDeadlock)
    busy[0] = 1  # it finished
    assert second("a1") is None
    second.release()
    assert slots.pending == set()


def test_a_send_to_its_own_agent_is_not_held_to_free_slots() -> None:
    slots = SelfSlots(1, lambda: 1)
    assert CallGate(env(hops=1, path=[Hop("a.x", "a1", False)]), "a1", None)("a1") is None
    assert slots.free() == 0
