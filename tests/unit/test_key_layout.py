"""reach.keys.LAYOUT is the one list of the keys reach writes: every key a :class:`Keys`
member builds has the form that names that member, on one shard and on many, and every
form names a member that builds it. ``reach doctor`` checks a namespace against it."""

from __future__ import annotations

import inspect

import pytest

from reach.keys import LAYOUT, PRIORITIES, Keys, form_of, form_regex

# sample arguments of the builders that take some (ids with the characters ids may have)
ARGS: dict[str, tuple[object, ...]] = {
    "agents_of": (3,),
    "agent": ("agent/with:odd.chars",),
    "cap_of": ("text.summarize", 5),
    "caps_of": (7,),
    "events_of": (15,),
    "sweeper_lock_of": (2,),
    "reroute_of": (9,),
    "left_of": (9,),
    "dlq": ("text.summarize",),
    "parked": ("text.summarize",),
    "rate_state": ("text.summarize",),
    "agent_rate_state": ("text.summarize", "a-1/x"),
    "inbox": ("a-{1}", "low"),
    "replies": ("c-1",),
    "send_rate_state": ("ed25519:abc",),
    "caller_rate_state": ("gateway", "alice"),
    "idem": ("order:42",),
    "task": ("0190-msg",),
    "kept_chunks": ("order:42",),
    "session": ("s:1",),
    "session_history": ("s:1",),
    "session_version": ("s:1",),
    "version_pins": ("s:1",),
    "effects": ("echo",),
    "gateway_task": ("task-1",),
    "gateway_task_parts": ("task-1",),
    "gateway_owned": ("caller:ed25519/x",),
}
# members that return a key name but are not a kind of key of their own
NOT_KEYS = {
    "wake",  # a pub/sub channel, named as the high-priority inbox
    "task_changes",  # a pub/sub channel, named as the task record
    "session_changes",  # a pub/sub channel: every session write, announced
    "agent_prefix_of",  # prefixes Lua appends an id to (their keys: agent, cap_of)
    "cap_prefix_of",
    "agent_prefix",
    "cap_prefix",
    "dlq_pattern",  # SCAN patterns
    "inbox_pattern",
    "agents",  # shard 0's names of agents_of, caps_of, ... (checked through those)
    "cap",
    "caps",
    "events",
    "sweeper_lock",
    "reroute",
    "parked_caps",
}
PROPERTIES = {
    "delayed",
    "scheduled",
    "scheduled_envelopes",
    "cancels",
    "limits",
    "access",
    "quotas",
    "splits",
    "parked_caps",
    "recent",
    "audit",
    "gateway_finished",
    "gateway_bytes",
}


def built(keys: Keys, builder: str) -> str:
    member = getattr(keys, builder)
    if builder in PROPERTIES:
        return str(member)
    # a shard index within the namespace's shards
    args = [min(a, keys.shards - 1) if isinstance(a, int) else a for a in ARGS.get(builder, ())]
    return str(member(*args))


@pytest.mark.parametrize("shards", [1, 16])
@pytest.mark.parametrize("form", LAYOUT, ids=lambda f: f.builder)
def test_each_form_matches_what_its_builder_builds(form, shards: int) -> None:  # type: ignore[no-untyped-def]
    keys = Keys("prod-1", shards)
    key = built(keys, form.builder)
    assert form_regex(form, "prod-1").match(key), (form.template, key)
    assert form_of(key, "prod-1") is form
    assert form_of(key, "prod") is None  # another namespace's key is not this one's


def test_every_shard_and_priority_has_its_form() -> None:
    keys = Keys("prod", 16)
    for k in range(16):
        for key in (keys.agents_of(k), keys.caps_of(k), keys.events_of(k), keys.cap_of("x", k)):
            assert form_of(key, "prod") is not None, key
    for p in PRIORITIES:
        assert form_of(keys.inbox("a", p), "prod") is not None


def test_every_member_that_builds_a_key_is_in_the_layout() -> None:
    named = {f.builder for f in LAYOUT}
    members = {
        name
        for name, value in inspect.getmembers(Keys)
        if not name.startswith("_")
        and (isinstance(value, property) or inspect.isfunction(value))
        # inboxes and record_keys return other members' keys (tested as those)
        and name
        not in {"shard", "capability_of_dlq", "agent_id_of_inbox", "inboxes", "record_keys"}
    }
    missing = members - named - NOT_KEYS
    assert not missing, f"Keys members without a form in reach.keys.LAYOUT: add one: {missing}"
    assert named <= members, named - members


def test_unknown_keys_have_no_form() -> None:
    for key in (
        "reach:{prod}:inboxes-v0",
        "reach:prod:{a:x}:in:urgent",
        "reach:prod:{z:x}:thing",
        "reach:{prod}:rate",
        "reach:{prod:rx}:agents",
    ):
        assert form_of(key, "prod") is None, key


@pytest.mark.parametrize(
    ("key", "msg_id"),
    [("m1", "m1"), ("{x}y", "a{b"), ("k}", "}{"), ("", ""), ("cap:caller:key", "01ab")],
)
def test_record_keys_are_idem_and_task(key: str, msg_id: str) -> None:
    # The batch send's one-call form must name exactly the records idem() and task() name,
    # braces cleaned the same way, or a send and its settle would touch different records.
    keys = Keys("prod")
    assert keys.record_keys(key, msg_id) == (keys.idem(key), keys.task(msg_id))
