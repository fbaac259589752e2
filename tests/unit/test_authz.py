"""reach.authz without Redis: the entries, the levels, what a handler declares and
publishes, the decision, roles from the trusted-keys file, the early look and the card."""

from __future__ import annotations

from importlib.util import find_spec
from pathlib import Path

import pytest

from reach import Agent, ConfigError, Context
from reach.authz import (
    ACCESS_KEY,
    Caller,
    Declared,
    OperatorRules,
    Policy,
    capability_security,
    check_declared_keys,
    check_entry,
    decide,
    declared_of,
    declared_rules,
    precheck,
)
from reach.card import agent_card
from reach.registry import AgentInfo
from reach.signing import keygen, read_trusted

needs_cryptography = pytest.mark.skipif(
    find_spec("cryptography") is None, reason="needs cryptography"
)

ALICE = Caller("alice", frozenset({"billing"}))
BOB = Caller("bob", frozenset())
TEAM = Caller(None)  # the HMAC mode: any holder of the namespace's secret


@pytest.mark.parametrize("entry", ["*", "id:alice", "id:svc/billing@eu", "role:billing", " id:a "])
def test_the_three_forms_of_an_entry(entry: str) -> None:
    assert check_entry(entry) == entry.strip()


@pytest.mark.parametrize(
    "entry", ["alice", "team:billing", "id:", "role:", "role:a,b", "id:" + "x" * 65, "**", ""]
)
def test_anything_else_is_refused_saying_the_forms(entry: str) -> None:
    with pytest.raises(ConfigError, match="id:NAME.*role:NAME.*'\\*'"):
        check_entry(entry)


def _agent() -> Agent:
    return Agent("a-1", capabilities=["pay.refund", "pay.quote", "pay.secret"])


def test_a_handler_publishes_its_rules_with_the_registration() -> None:
    app = _agent()

    async def run(payload: object, ctx: Context) -> None: ...

    app.handler("pay.refund", allow=["role:billing", "id:bob", "id:bob"])(run)
    app.handler("pay.quote")(run)
    app.handler("pay.secret", allow=["id:alice"], security="sensitive")(run)
    assert app.metadata[ACCESS_KEY] == {
        "pay.refund": {"allow": ["role:billing", "id:bob"], "security": "public"},
        "pay.secret": {"allow": ["id:alice"], "security": "sensitive"},
    }
    rules = declared_rules(app.metadata)
    assert rules["pay.secret"] == Declared(("id:alice",), "sensitive")
    assert "pay.quote" not in rules
    # The copy a worker runs under another id keeps them.
    assert declared_rules(app.renamed("a-2").metadata) == rules


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"security": "sensitive"}, "needs allow="),
        ({"security": "secret"}, "'public', 'internal', 'sensitive'"),
        ({"allow": ["billing"]}, "is not an entry"),
        ({"allow": "id:alice"}, "give a list"),
    ],
)
def test_a_handler_with_unclear_rules_is_refused(kw: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        _agent().handler("pay.refund", **kw)  # type: ignore[arg-type]


def test_rules_need_keys_to_check_callers_with() -> None:
    rules = {"pay.refund": Declared(("id:alice",))}
    with pytest.raises(ConfigError, match="no keys to verify its callers"):
        check_declared_keys(rules, "a-1", has_keys=False)
    check_declared_keys(rules, "a-1", has_keys=True)
    check_declared_keys({}, "a-1", has_keys=False)


def test_who_may_call_what() -> None:
    cap = "pay.refund"
    open_ = Policy()
    assert decide(cap, open_, None) is None  # no rule: unsigned callers too
    listed = Policy(Declared(("role:billing", "id:bob")))
    assert decide(cap, listed, ALICE) is None
    assert decide(cap, listed, BOB) is None
    assert "not in the allow list" in (decide(cap, listed, Caller("carol")) or "")
    assert "unsigned" in (decide(cap, listed, None) or "")
    # The HMAC mode's team has no name and no roles: only '*' names it.
    assert decide(cap, listed, TEAM) is not None
    assert decide(cap, Policy(Declared(("*",))), TEAM) is None
    # internal: any verified signer; sensitive: with its allow list.
    internal = Policy(Declared(None, "internal"))
    assert decide(cap, internal, TEAM) is None and "internal" in (decide(cap, internal, None) or "")
    sensitive = Policy(Declared(("id:alice",), "sensitive"))
    assert decide(cap, sensitive, ALICE) is None
    assert "is sensitive" in (decide(cap, sensitive, None) or "")
    assert decide(cap, sensitive, BOB) is not None


def test_an_operator_narrows_never_widens() -> None:
    cap = "pay.refund"
    declared = Declared(("role:billing",))
    # Not in the handler's list: the operator's allow does not let bob in.
    widened = Policy(declared, OperatorRules(allow=("id:bob",)))
    assert decide(cap, widened, BOB) is not None
    assert "operator's allow list" in (decide(cap, widened, ALICE) or "")
    denied = Policy(declared, OperatorRules(deny=("id:alice",)))
    assert "denied" in (decide(cap, denied, ALICE) or "")
    # A deny on an open capability makes it take signed callers only (else a denied caller
    # would stop signing); '*' switches it off for everyone.
    assert "unsigned" in (decide(cap, Policy(operator=OperatorRules(deny=("id:x",))), None) or "")
    assert decide(cap, Policy(operator=OperatorRules(deny=("*",))), ALICE) is not None
    assert decide(cap, Policy(operator=OperatorRules(deny=("role:billing",))), BOB) is None


def test_rules_written_by_something_else_refuse_rather_than_open() -> None:
    meta = {ACCESS_KEY: {"pay.refund": {"allow": ["not an entry"]}}}
    d = declared_of(meta, "pay.refund")
    assert d is not None and decide("pay.refund", Policy(d), ALICE) is not None


@needs_cryptography
def test_roles_come_from_the_trusted_keys_file(tmp_path: Path) -> None:
    _, a1 = keygen("alice")
    _, a2 = keygen("alice")  # a rollover: two keys, the roles of both lines
    _, b = keygen("bob")
    f = tmp_path / "trusted"
    f.write_text(a1.rstrip() + " billing,ops\n" + a2.rstrip() + " audit  # new key\n" + b)
    keys, roles = read_trusted(f)
    assert len(keys["alice"]) == 2 and len(keys["bob"]) == 1
    assert roles == {"alice": {"billing", "ops", "audit"}, "bob": frozenset()}
    f.write_text(a1.rstrip() + " bill!ng\n")
    with pytest.raises(ConfigError, match="role 'bill!ng'"):
        read_trusted(f)
    f.write_text(a1.rstrip() + " billing extra\n")
    with pytest.raises(ConfigError, match=r"\[ROLE,ROLE...\]"):
        read_trusted(f)


def _info(agent_id: str, meta: dict[str, object], caps: list[str]) -> AgentInfo:
    return AgentInfo(agent_id=agent_id, capabilities=caps, metadata=meta, ready=True)


def test_the_early_look_refuses_only_when_every_agent_would() -> None:
    strict = {ACCESS_KEY: {"pay.refund": {"allow": ["id:alice"], "security": "public"}}}
    agents = [_info("a-1", strict, ["pay.refund"])]
    assert precheck("pay.refund", agents, None) is not None  # unsigned
    assert precheck("pay.refund", [], None) is None  # nobody to ask: routing says so
    # An agent without rules next to it may take the message.
    assert precheck("pay.refund", [*agents, _info("a-2", {}, ["pay.refund"])], None) is None


def test_the_level_in_reach_caps_and_the_card() -> None:
    app = _agent()

    async def run(payload: object, ctx: Context) -> None: ...

    app.handler("pay.secret", allow=["id:alice"], security="sensitive")(run)
    app.handler("pay.refund", security="internal")(run)
    info = _info("a-1", app.metadata, app.capabilities)
    assert capability_security([info], "pay.secret") == "sensitive"
    assert capability_security([info], "pay.quote") == "public"
    skills = {s["id"]: s for s in agent_card(info, namespace="ns")["skills"]}
    assert "security:sensitive" in skills["pay.secret"]["tags"]
    assert "security:internal" in skills["pay.refund"]["tags"]
    assert not any(t.startswith("security:") for t in skills["pay.quote"]["tags"])


def test_a_worker_lets_an_open_capability_through_without_a_look() -> None:
    """Gate.passes: True only for a message with no call path to a capability nobody
    restricts, under operator rules read lately; anything else goes to Gate.refuse."""
    import time

    from reach._worker.authz import Gate
    from reach.envelope import Envelope
    from reach.keys import Keys

    async def run(payload: dict[str, int], ctx: Context) -> None: ...

    app = Agent("gate-1", capabilities=["open.one", "pay.refund"])
    app.handler("open.one")(run)
    app.handler("pay.refund", allow=["id:bob"])(run)
    gate = Gate(app, Keys("ns"), redis=None)  # type: ignore[arg-type]
    open_env = Envelope(msg_id="m1", capability="open.one")
    assert not gate.passes(open_env)  # the operator's rules not read yet
    gate.rules._read_at = time.monotonic()  # as if read now
    assert gate.passes(open_env)
    assert not gate.passes(Envelope(msg_id="m2", capability="pay.refund"))  # declared allow
    assert not gate.passes(Envelope(msg_id="m3", capability="open.one", hops=1))  # a call path
    gate.rules._rules = {"open.one": OperatorRules(deny=("id:eve",))}  # the operator's rule
    assert not gate.passes(open_env)
