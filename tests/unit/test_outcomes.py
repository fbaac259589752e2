"""The outcome vocabulary: its values are the strings on the wire, every status and reason
the code writes is a member, the predicates answer as their table says, the Python client
and the A2A mapping follow them, and the docs list the same values."""

from __future__ import annotations

import ast
import itertools
import re
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from reach import outcomes
from reach.card import A2A_TASK_STATES, a2a_task_state
from reach.client import Client
from reach.envelope import Reply, decode_reply, encode
from reach.errors import Cancelled, Rejected, RemoteError
from reach.outcomes import (
    BLAMELESS,
    COMPLETION_STATUSES,
    FINAL_STATUSES,
    RAW_REASONS,
    REFUSALS,
    REJECTIONS,
    RETRYABLE,
    STORED_STATUSES,
    DeadReason,
    Status,
    Unavailable,
    blames_agent,
    is_refusal,
    is_rejection,
    is_retryable,
)

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


# -- the values are today's strings ----------------------------------------------------------
def test_values_are_the_strings_stored_and_sent() -> None:
    assert [s.value for s in Status] == [
        "scheduled",
        "pending",
        "running",
        "input_required",
        "retrying",
        "succeeded",
        "failed",
        "expired",
        "dead",
        "cancelled",
        "unknown",
    ]
    assert {r.value for r in DeadReason} == {
        "max_attempts",
        "rejected",
        "invalid_payload",
        "no_handler",
        "bad_result",
        "expired",
        "timeout",
        "target_gone",
        "malformed",
        "version",
        "too_large",
        "unroutable",
        "unprocessable",
        "unauthenticated",
        "cancelled",
        "poisoned",
        "hop_limit",
        "loop",
        "refused_by_guard",
        "forbidden",
    }
    assert {u.value for u in Unavailable} == {
        "no_agent",
        "filter",
        "draining",
        "not_ready",
        "breaker_open",
        "overloaded",
        "target_unavailable",
        "would_deadlock",
        "version",
    }
    assert [s.value for s in STORED_STATUSES] == [
        "scheduled",
        "pending",
        "running",
        "input_required",
        "succeeded",
        "failed",
        "retrying",
        "expired",
        "dead",
        "cancelled",
    ]


@pytest.mark.parametrize("member", [*Status, *DeadReason, *Unavailable], ids=str)
def test_a_member_is_its_string_on_the_wire(member: str) -> None:
    plain = str(member.value)  # type: ignore[attr-defined]
    assert member == plain and hash(member) == hash(plain) and f"{member}" == plain
    assert msgspec.msgpack.encode(member) == msgspec.msgpack.encode(plain)
    assert msgspec.json.encode(member) == msgspec.json.encode(plain)
    reply = Reply(msg_id="m", status=Status.DEAD, reason=member)
    assert encode(reply) == encode(Reply(msg_id="m", status="dead", reason=plain))
    assert decode_reply(encode(reply)).reason == plain


# -- every status and reason the code writes is a member ---------------------------------------
_REASON_CALLS = {"NoAgentAvailable", "Overloaded", "_unavailable"}  # routing refusals


def _name(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _strings(node: ast.AST | None) -> Iterator[str]:
    """The string constants of an expression: a constant, a tuple/set/list of them, or the
    two branches of ``a if c else b``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node.value
    elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        for elt in node.elts:
            yield from _strings(elt)
    elif isinstance(node, ast.IfExp):
        yield from _strings(node.body)
        yield from _strings(node.orelse)


def _written(tree: ast.AST) -> Iterator[tuple[str, str, int]]:
    """(kind, value, line) for each literal status or reason in a module: keyword arguments
    ``status=``/``reason=``, a reason given to ``BadEnvelope``, the status and reason given
    to a worker ``Outcome``, a ``'status', <value>`` pair in a Redis command, and values
    compared with something named ``status`` or ``reason``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = _name(node.func)
            reason_kind = "unavailable" if func in _REASON_CALLS else "reason"
            for kw in node.keywords:
                if kw.arg in ("status", "reason"):
                    kind = "status" if kw.arg == "status" else reason_kind
                    for v in _strings(kw.value):
                        yield kind, v, node.lineno
            if func == "BadEnvelope" and node.args:
                for v in _strings(node.args[0]):
                    yield "reason", v, node.lineno
            if func == "Outcome" and len(node.args) >= 2:
                for v in _strings(node.args[0]):
                    yield "status", v, node.lineno
                for v in _strings(node.args[1]):
                    yield "reason", v, node.lineno
            if func == "_unavailable" and len(node.args) >= 2:
                for v in _strings(node.args[1]):
                    yield "unavailable", v, node.lineno
        elif isinstance(node, (ast.Tuple, ast.List)):
            elts = node.elts
            for a, b in itertools.pairwise(elts):
                if isinstance(a, ast.Constant) and a.value == "status":
                    for v in _strings(b):
                        yield "status", v, node.lineno
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            named = {_name(s) for s in sides}
            for kind in ("status", "reason"):
                if kind in named:
                    for s in sides:
                        for v in _strings(s):
                            yield kind, v, node.lineno


def _library_writes() -> list[tuple[str, str, str]]:
    out = []
    for path in sorted((ROOT / "reach").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for kind, value, line in _written(tree):
            out.append((kind, value, f"{path.relative_to(ROOT)}:{line}"))
    return out


def test_every_status_and_reason_the_library_writes_is_a_member() -> None:
    members = {
        "status": {s.value for s in Status},
        "reason": {r.value for r in DeadReason} | {""},  # "": no reason (a success)
        "unavailable": {u.value for u in Unavailable},
    }
    writes = _library_writes()
    strays = [(k, v, where) for k, v, where in writes if v not in members[k]]
    assert not strays, f"not in reach.outcomes: {strays}"


def test_the_scan_finds_each_way_of_writing_one() -> None:
    sample = """
Reply(msg_id=m, status="s1", reason="r1")
BadEnvelope("r2", "detail")
Outcome("s2", "r3", "error", "Type")
NoAgentAvailable("msg", capability=c, reason="u1")
_unavailable(capability, "u2", "msg")
ops = [("HSETNX", rec, "status", "s3")]
if reply.status == "s4" or outcome.reason in ("r4", "r5"):
    pass
x = f(reason="r6" if a else "r7")
"""
    got = {(k, v) for k, v, _ in _written(ast.parse(sample))}
    assert got == {
        *(("status", s) for s in ("s1", "s2", "s3", "s4")),
        *(("reason", r) for r in ("r1", "r2", "r3", "r4", "r5", "r6", "r7")),
        ("unavailable", "u1"),
        ("unavailable", "u2"),
    }


def test_every_status_a_script_writes_is_a_member() -> None:
    scripts = sorted((ROOT / "lua").rglob("*.lua"))
    written: set[str] = set()
    accepted: list[set[str]] = []
    for path in scripts:
        # The fields a script reads ('status', 'watched' in an HMGET) are no status written.
        text = re.sub(r"(?:'HMGET'|\bread_record\b|\brecord\b)[^)]*\)", "", path.read_text())
        written |= set(re.findall(r"'status',\s*'([a-z_]+)'", text))
        # What a completion may set: the words the status check compares with (fence.lua's
        # completion_bad: "if s ~= 'succeeded' and s ~= 'failed' ... then").
        for chain in re.findall(r"if (s ~= '[a-z_]+'(?:\s+and\s+s ~= '[a-z_]+')*) then", text):
            accepted.append(set(re.findall(r"s ~= '([a-z_]+)'", chain)))
    # send.lua, claim.lua (dead: a poisoned key), cancel.lua, mark_scheduled.lua, ask.lua
    assert written == {
        Status.PENDING,
        Status.RUNNING,
        Status.INPUT_REQUIRED,
        Status.CANCELLED,
        Status.DEAD,
        Status.SCHEDULED,
    }
    assert accepted, "no completion status check found in lua/"
    for table in accepted:  # complete / settle: what a completion may set
        assert table == COMPLETION_STATUSES


# -- the predicates ----------------------------------------------------------------------------
def _docstring_table() -> dict[str, dict[str, bool]]:
    doc = outcomes.__doc__ or ""
    rows = re.findall(
        r"^``([a-z_]+)``\s+(yes|no)\s+(yes|no)\s+(yes|no)\s+(yes|no)\s", doc, re.MULTILINE
    )
    cols = ("rejection", "retryable", "blames", "refusal")
    return {r[0]: {c: v == "yes" for c, v in zip(cols, r[1:], strict=True)} for r in rows}


def test_the_predicates_answer_as_the_module_table_says() -> None:
    table = _docstring_table()
    assert set(table) == set(DeadReason)
    for reason, row in table.items():
        got = {
            "rejection": is_rejection(reason),
            "retryable": is_retryable(reason),
            "blames": blames_agent(reason),
            "refusal": is_refusal(reason),
        }
        assert got == row, reason


def test_each_final_reason_has_one_caller_outcome() -> None:
    for reason in DeadReason:
        kinds = [
            is_rejection(reason),
            is_retryable(reason),
            reason == DeadReason.EXPIRED,
            reason == DeadReason.CANCELLED,  # reach.Cancelled
        ]
        assert kinds.count(True) == 1, reason
    assert REFUSALS <= REJECTIONS  # the agent refusing it is one way of refusing it for good
    assert RAW_REASONS <= REFUSALS
    assert not RETRYABLE & BLAMELESS  # a handler failure always counts against the agent


@pytest.mark.parametrize("reason", ["", "dead", "oops", "REJECTED", "rejected "])
def test_a_reason_reach_does_not_know_gets_the_conservative_answer(reason: str) -> None:
    assert not is_rejection(reason)
    assert not is_retryable(reason)
    assert not is_refusal(reason)
    assert blames_agent(reason)


def test_the_lists_client_and_card_kept_are_unchanged() -> None:
    # Reasons added since, each a refusal (so a rejection, blameless): unauthenticated,
    # an agent requiring signatures refusing an unsigned or forged message (reach.signing).
    # hop_limit and loop: a handler's call deeper than max_hops, or entering a caller that
    # waits for it (reach.callpath): refused for what the message is.
    # refused_by_guard: a guard of the agent refused the content (reach.guards).
    # forbidden: the verified signer is not allowed to call the capability (reach.authz).
    new = {"unauthenticated", "hop_limit", "loop", "refused_by_guard", "forbidden"}
    # poisoned: a message whose runs never ended (each agent running it killed, evicted or
    # stalled) was taken over max_takeovers times: refused for good, blaming the agent
    # (its handler blocked or crashed it), A2A "failed".
    poisoned = {"poisoned"}
    # reach.client.REJECTIONS before reach.outcomes (the caller gets reach.Rejected)
    assert (
        REJECTIONS
        == {
            "rejected",
            "invalid_payload",
            "no_handler",
            "too_large",
            "malformed",
            "version",
            "target_gone",
            "bad_result",
            "unroutable",
            "unprocessable",
        }
        | new
        | poisoned
    )
    # reach.card.REJECTED_REASONS (A2A "rejected")
    assert (
        REFUSALS
        == {"rejected", "invalid_payload", "no_handler", "malformed", "version"}
        | {"too_large"}
        | new
    )
    # reach.client.BLAMELESS, plus malformed and version: raw letters that no reply carries,
    # now blameless like too_large (the bytes were the problem, not the agent)
    old_blameless = {
        "rejected",
        "invalid_payload",
        "expired",
        "no_handler",
        "too_large",
        "unroutable",
        "unprocessable",
    }
    # cancelled: neither a rejection nor the agent's fault (reach.Cancelled)
    assert BLAMELESS == old_blameless | {"malformed", "version", "cancelled"} | new


# -- the callers follow them -------------------------------------------------------------------
@pytest.mark.parametrize("reason", [*DeadReason, "", "oops"], ids=str)
def test_the_client_maps_a_dead_reply_by_the_predicates(reason: str) -> None:
    reply = Reply(msg_id="m1", status="dead", reason=str(reason), error="no", error_type="X")
    with pytest.raises((Rejected, RemoteError, Cancelled)) as ei:
        Client._outcome_of("cap.x", "m1", reply)
    if reason == DeadReason.CANCELLED:
        assert isinstance(ei.value, Cancelled)
    elif is_rejection(reason):
        assert isinstance(ei.value, Rejected) and ei.value.reason == reason
    else:
        assert isinstance(ei.value, RemoteError)
        assert ei.value.retryable == is_retryable(reason)


@pytest.mark.parametrize("reason", [*DeadReason, "", "oops"], ids=str)
def test_the_a2a_state_of_a_dead_message_follows_is_refusal(reason: str) -> None:
    assert set(A2A_TASK_STATES) == set(Status)
    want = "rejected" if is_refusal(reason) else "failed"
    if reason == DeadReason.CANCELLED:
        want = "canceled"  # A2A's own state (tasks/cancel)
    assert a2a_task_state("dead", reason) == want
    assert a2a_task_state("expired", reason) == "failed"


# -- the docs list the same values -------------------------------------------------------------
def _ticked(text: str) -> set[str]:
    return set(re.findall(r"`([a-z_]+)`", text))


def _section(path: Path, heading: str) -> str:
    text = path.read_text()
    start = text.index(heading)
    end = text.find("\n#", start + len(heading))
    return text[start : end if end != -1 else len(text)]


def test_operations_md_lists_every_dead_letter_reason() -> None:
    text = (DOCS / "operations.md").read_text()
    table = text[text.index("| reason | meaning | what to do |") :]
    rows = re.findall(r"^\| ([^|]+) \|", table, re.MULTILINE)
    listed: set[str] = set()
    for first in rows[2:]:  # after the header and the rule
        listed |= _ticked(first)
        if not first.strip().startswith("`"):
            break
    assert listed == set(DeadReason)


def test_protocol_md_reply_fields_agree() -> None:
    reply = _section(DOCS / "protocol.md", "## Reply")
    status_row = re.search(r"^\| `status` \|.*$", reply, re.MULTILINE)
    reason_row = re.search(r"^\| `reason` \|.*$", reply, re.MULTILINE)
    assert status_row and reason_row
    meaning = status_row.group(0).split("|")[4]
    assert _ticked(meaning) == FINAL_STATUSES
    listed = _ticked(reason_row.group(0).split("|")[4])
    # protocol.md names every reason a reply may carry (all but the raw ones)
    assert listed == set(DeadReason) - RAW_REASONS
    mapping = re.search(r"`dead` with reason (.*?) → `RemoteError`", reply, re.DOTALL)
    assert mapping and _ticked(mapping.group(1)) == RETRYABLE


def test_protocol_md_task_status_lists_every_status() -> None:
    assert set(Status) <= _ticked(_section(DOCS / "protocol.md", "### Task status"))


def test_routing_md_lists_every_unavailable_reason() -> None:
    text = (DOCS / "routing.md").read_text()
    para = text[text.index("`.reason`") : text.index("2. **Policy**")]
    assert _ticked(para) == set(Unavailable)


def test_a2a_md_rejected_row_names_only_refusals() -> None:
    text = _section(DOCS / "a2a.md", "## Task states")
    rejected = re.search(r"^\| `dead`, reason (.*?) \| `rejected`", text, re.MULTILINE)
    failed = re.search(r"^\| `dead`, reason (.*?) \| `failed`", text, re.MULTILINE)
    assert rejected and failed
    assert _ticked(rejected.group(1)) <= REFUSALS
    assert not _ticked(failed.group(1)) & REFUSALS
