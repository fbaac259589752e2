"""Hostile inputs for the fuzzing suite: bytes, msgpack values, and valid envelopes with
one field broken at a time.

What reach reads from Redis may have been written by anyone holding the namespace's keys,
so these strategies aim at the decoder's edges: wrong types, huge and negative numbers,
unknown policies and priorities, deep nesting, long strings, non-UTF-8 bytes.
"""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import strategies as st

from reach.envelope import Envelope, encode, new_id, now_ms

# Integers at and beyond every width a decoder or a computation may choke on.
EDGE_INTS = st.sampled_from(
    [
        0,
        -1,
        1,
        2**31 - 1,
        2**31,
        -(2**31),
        2**53,
        2**63 - 1,
        -(2**63),
        2**64 - 1,
        10**6,
        5000,
        10**12,
        10**18,
    ]
)
EDGE_FLOATS = st.sampled_from(
    [0.0, -0.0, 1e308, -1e308, float("inf"), float("-inf"), float("nan"), 1e-308, 3.5]
)
ANY_INT = st.one_of(EDGE_INTS, st.integers(min_value=-(2**63), max_value=2**64 - 1))
ANY_FLOAT = st.one_of(EDGE_FLOATS, st.floats(allow_nan=True, allow_infinity=True))
TEXT = st.one_of(
    st.text(max_size=40),
    st.sampled_from(
        [
            "",
            " ",
            "{",
            "}",
            "{a:b}",
            "\x00",
            "é",
            "🤖",
            "a" * 5000,
            "direct",
            "broadcast",
            "weighted_rr",
            "high",
            "urgent",
            "../",
            "%s%n",
        ]
    ),
)
BYTES = st.one_of(st.binary(max_size=64), st.sampled_from([b"\xff\xfe", b"\xc1", b"\x80"]))

# Scalars msgpack can carry (msgspec encodes all of these).
SCALARS = st.one_of(st.none(), st.booleans(), ANY_INT, ANY_FLOAT, TEXT, BYTES)


def msgpack_values(max_leaves: int = 20) -> st.SearchStrategy[Any]:
    """Arbitrary msgpack-able values: scalars, lists and maps, nested."""
    return st.recursive(
        SCALARS,
        lambda children: st.one_of(
            st.lists(children, max_size=5),
            st.dictionaries(st.one_of(TEXT, st.integers(-5, 5)), children, max_size=5),
        ),
        max_leaves=max_leaves,
    )


def deep_nesting(depth: int, *, as_map: bool = False) -> bytes:
    """msgpack bytes of a value nested ``depth`` levels deep (built directly: encoding a
    100,000-deep Python list would itself hit the recursion limit)."""
    if as_map:  # fixmap of one entry, key "k", nested
        return b"\x81\xa1k" * depth + b"\xc0"
    return b"\x91" * depth + b"\xc0"  # fixarray of one element, nested


def valid_envelope(**over: Any) -> Envelope:
    fields: dict[str, Any] = {
        "msg_id": new_id(),
        "capability": "fuzz.echo",
        "payload": msgspec.Raw(encode({"n": 1})),
        "trace_id": "t",
        "priority": "normal",
        "deadline_ms": now_ms() + 60_000,
        "max_attempts": 2,
        "sent_ms": now_ms(),
    }
    fields.update(over)
    return Envelope(**fields)


ENVELOPE_FIELDS = [f for f in Envelope.__struct_fields__]


@st.composite
def mutated_envelopes(draw: st.DrawFn, capability: str = "fuzz.echo") -> bytes:
    """A valid envelope (as a msgpack map) with one field replaced by a hostile value,
    removed, or joined by an unknown field; sometimes the payload is deeply nested."""
    base = msgspec.msgpack.decode(encode(valid_envelope(capability=capability)))
    field = draw(st.sampled_from([*ENVELOPE_FIELDS, "__unknown__"]))
    how = draw(st.sampled_from(["replace", "remove", "deep"]))
    if how == "remove":
        base.pop(field, None)
    elif how == "deep":
        depth = draw(st.sampled_from([100, 1000, 100_000]))
        raw = encode(base)
        # splice a deep value in as an extra, unknown field: map header count + 1
        return _with_extra_field(raw, field, deep_nesting(depth, as_map=draw(st.booleans())))
    else:
        base[field] = draw(st.one_of(msgpack_values(8), EDGE_INTS, EDGE_FLOATS, TEXT, BYTES))
    return encode(base)


def _with_extra_field(raw: bytes, name: str, value: bytes) -> bytes:
    """Append ``name: <value bytes>`` to a msgpack map that has fewer than 15 entries
    (a fixmap), or re-encode it as a map16 when it has more."""
    head = raw[0]
    if 0x80 <= head <= 0x8E:
        body, n = raw[1:], head - 0x80
        return bytes([0x80 + n + 1]) + body + encode(name) + value
    if head == 0xDE:
        n = int.from_bytes(raw[1:3], "big")
        return b"\xde" + (n + 1).to_bytes(2, "big") + raw[3:] + encode(name) + value
    raise ValueError("not a map")


@st.composite
def hostile_entries(draw: st.DrawFn, capability: str = "fuzz.echo") -> bytes:
    """Anything that may sit in an ``e`` field: random bytes, a random msgpack value, a
    deeply nested value, or a valid envelope with one field broken."""
    kind = draw(st.sampled_from(["bytes", "value", "deep", "mutated", "mutated"]))
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    if kind == "value":
        return encode(draw(msgpack_values()))
    if kind == "deep":
        return deep_nesting(draw(st.sampled_from([200, 5000, 100_000])), as_map=draw(st.booleans()))
    return draw(mutated_envelopes(capability))
