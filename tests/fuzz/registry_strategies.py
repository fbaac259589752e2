"""Hostile inputs for the registry fuzz: script arguments at the edges of what Lua's
``tonumber``, cjson and the scripts' checks take, agent records with any field broken, and
events-stream entries of any shape."""

from __future__ import annotations

from hypothesis import strategies as st

from tests.fuzz.strategies import EDGE_INTS

# Every spelling of a number Lua's tonumber or Python's float would take, and the limits
# of the scripts' ranges, just in and out.
NUMBER_EDGES = [
    "",
    "0",
    "1",
    "2",
    "-1",
    "-0",
    "+1",
    "nan",
    "-nan",
    "NaN",
    "inf",
    "-inf",
    "+inf",
    "Infinity",
    "1e309",
    "-1e309",
    "1e3",
    "1E3",
    "1.5",
    "0.0",
    ".5",
    "5.",
    " 5",
    "5 ",
    "0x10",
    "0X1p4",
    "007",
    "00",
    "1_000",
    "\u0661",
    str(2**31),
    str(2**53 - 1),
    str(2**53),
    str(2**53 + 1),
    str(2**63),
    str(2**64),
    "9" * 16,
    "9" * 17,
    "9" * 40,
    "1000",
    "1000.0",
    "1000.0001",
    "1e-300",
    "5e-324",
    "86400000",
    "86400001",
    "3600000",
    "3600001",
    "2592000000",
    "2592000001",
    "100000",
    "100001",
    "10000000",
    "10000001",
    "1000000000",
    "1000000001",
]

JSON_EDGES = [
    "",
    "{}",
    "[]",
    "null",
    "1",
    '"x"',
    "{",
    "}",
    "not json",
    '{"a":1}',
    '{"a":nan}',
    '{"a":NaN}',
    '{"a":inf}',
    '{"a":Infinity}',
    '{"a":0x10}',
    '{"a":01}',
    '{"a":+1}',
    '{"a":1.}',
    '{"a":.5}',
    '{"a":-0}',
    '{"a":1E+2}',
    '{"a":"\\u00e9"}',
    '{"a":"\\ud800"}',
    '{"a":"\x01"}',
    '{"a":1} x',
    '{"a":1,}',
    "{'a':1}",
    '{"a":[1,{"b":null}]}',
    '{"a":true,"a":false}',
    " {} ",
    "{" + '"a":' * 0 + "}",
    '{"a":"' + "x" * 70_000 + '"}',
    '{"a":' + "[" * 70 + "]" * 70 + "}",
    '{"a":' + "[" * 2000 + "]" * 2000 + "}",
]

TEXT_EDGES = [
    "",
    " ",
    "a",
    "x" * 256,
    "x" * 257,
    "{",
    "}",
    "{x}",
    "a,b",
    ",",
    "a..b",
    "A",
    "é",
    "🤖",
    "\x00",
    "\n",
    "c",
    "fz.a",
    "fz.b",
    "t1",
    "t2",
    "ghost",
    "0",
    "1",
    "active",
    "evicted",
]

BYTES_EDGES = [
    b"\xff",
    b"\xfe\xff",
    b"\xc0\x80",
    b"\xed\xa0\x80",
    b"\xf4\x90\x80\x80",
    b"a\xffb",
    b"\x80",
]

FUZZ_ARG = st.one_of(
    st.sampled_from(NUMBER_EDGES),
    st.sampled_from(JSON_EDGES),
    st.sampled_from(TEXT_EDGES),
    st.sampled_from(BYTES_EDGES),
    EDGE_INTS.map(str),
    st.integers(-5, 20).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(max_size=12),
    st.binary(max_size=12),
)

# Field names an agent record has (and a few it does not), for hostile HSETs.
RECORD_FIELDS = [
    "agent_id",
    "instance_id",
    "version",
    "weight",
    "caps",
    "metadata",
    "card",
    "state",
    "ready",
    "draining",
    "registered_ms",
    "last_heartbeat_ms",
    "state_ms",
    "ready_ms",
    "lease_ms",
    "evict_after_ms",
    "queue_depth",
    "inflight",
    "max_queue",
    "draining_ms",
    "junk",
]

FIELD_VALUE = st.one_of(
    FUZZ_ARG,
    st.sampled_from(["active", "probation", "evicted", "1", "0", "fz.a", "fz.a,fz.b", "Bad Cap"]),
)


@st.composite
def hostile_records(draw: st.DrawFn) -> dict[bytes | str, bytes | str]:
    """Fields to HSET onto a proper record: a few of its own fields broken, sometimes a
    field name that is not UTF-8."""
    out: dict[bytes | str, bytes | str] = {}
    for name in draw(st.lists(st.sampled_from(RECORD_FIELDS), min_size=1, max_size=4)):
        out[name] = draw(FIELD_VALUE)
    if draw(st.booleans()):
        out[draw(st.binary(min_size=1, max_size=6))] = draw(st.one_of(FIELD_VALUE, st.binary()))
    return out


EVENT_FIELDS = ["type", "agent_id", "instance_id", "ts", "x"]


@st.composite
def hostile_events(draw: st.DrawFn) -> dict[bytes | str, bytes | str]:
    """One events-stream entry: the usual fields with any values, or any fields at all."""
    if draw(st.booleans()):
        names: list[bytes | str] = draw(
            st.lists(st.sampled_from(EVENT_FIELDS), min_size=1, max_size=5, unique=True)
        )
    else:
        names = draw(
            st.lists(
                st.one_of(st.binary(min_size=1, max_size=6), st.text(min_size=1, max_size=6)),
                min_size=1,
                max_size=4,
                unique=True,
            )
        )
    return {n: draw(st.one_of(FIELD_VALUE, st.binary(max_size=20))) for n in names}
