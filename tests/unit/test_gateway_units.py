"""reach.gateway's pure parts: tokens (parsing, the check), the payload/result/state/error
mapping (docs/a2a.md, *Mapping*), the bounded task store."""

from __future__ import annotations

from pathlib import Path

import pytest
from a2a.types.a2a_pb2 import Part, TaskState
from a2a.utils.errors import ContentTypeNotSupportedError, InternalError, InvalidParamsError
from google.protobuf import struct_pb2
from google.protobuf.json_format import MessageToDict, ParseDict

from reach.errors import ConfigError, NoAgentAvailable, Overloaded, PayloadTooLarge
from reach.gateway import Tokens
from reach.gateway.mapping import error_of, payload_of, result_parts, takes_json_text, task_state

GOOD = "a-token-of-sixteen+"


def test_tokens_from_a_file_and_the_environment(tmp_path: Path) -> None:
    f = tmp_path / "tokens"
    f.write_text(f"# comment\n\nops:{GOOD}1\n{GOOD}2\nnot a name:{GOOD}3\n")
    tokens = Tokens.load(f, env=f"ci:{GOOD}4")
    assert tokens is not None and len(tokens) == 4
    assert tokens.check(f"Bearer {GOOD}1") == "ops"
    assert tokens.check(f"bearer  {GOOD}2 ") == "token-2"
    assert tokens.check(f"Bearer not a name:{GOOD}3") == "token-3"  # the whole line
    assert tokens.check(f"Bearer {GOOD}4") == "ci"
    for bad in (None, "", f"Basic {GOOD}1", "Bearer ", f"Bearer {GOOD}", f"{GOOD}1"):
        assert tokens.check(bad) is None, bad
    assert Tokens.load(None, env="") is None
    with pytest.raises(ConfigError, match="at least 16"):
        Tokens.load(None, env="x:short")
    with pytest.raises(ConfigError, match="given twice"):
        Tokens.load(None, env=f"a:{GOOD}1,a:{GOOD}2")
    with pytest.raises(ConfigError, match="Cannot read the token file"):
        Tokens.load(tmp_path / "missing", env="")


def data(value: object) -> Part:
    return Part(data=ParseDict(value, struct_pb2.Value()))


def test_payload_of_parts() -> None:
    assert payload_of([data({"a": [1, "x"]})], json_text=True) == {"a": [1, "x"]}
    assert payload_of([Part(text='{"a": 1}')], json_text=True) == {"a": 1}
    assert payload_of([Part(text='{"a": 1}')], json_text=False) == '{"a": 1}'
    assert payload_of([Part(text="[2]", media_type="application/json")], json_text=False) == [2]
    assert payload_of([Part(raw=b"\x00\xff")], json_text=True) == b"\x00\xff"
    assert payload_of([Part(text="a"), data(1)], json_text=False) == ["a", 1]
    with pytest.raises(InvalidParamsError, match="takes JSON input"):
        payload_of([Part(text="plain words")], json_text=True)
    with pytest.raises(InvalidParamsError, match="no parts"):
        payload_of([], json_text=True)
    with pytest.raises(ContentTypeNotSupportedError):
        payload_of([Part(url="https://example.org/f")], json_text=True)
    assert takes_json_text(["application/json"])
    assert not takes_json_text(["application/json", "text/plain"])
    assert not takes_json_text(["text/plain"])


def test_result_parts() -> None:
    [p] = result_parts("hi")
    assert p.text == "hi" and p.media_type == "text/plain"
    [p] = result_parts(b"\x01")
    assert p.raw == b"\x01"
    [p] = result_parts({"n": 1, "b": b"\x01", "l": [None, True]})
    assert MessageToDict(p.data) == {"n": 1.0, "b": "AQ==", "l": [None, True]}
    [p] = result_parts(None)
    assert p.HasField("data") and MessageToDict(p.data) is None


def test_task_states_follow_docs_a2a_md() -> None:
    assert task_state("pending") == TaskState.TASK_STATE_SUBMITTED
    assert task_state("running") == TaskState.TASK_STATE_WORKING
    assert task_state("retrying") == TaskState.TASK_STATE_WORKING
    assert task_state("succeeded") == TaskState.TASK_STATE_COMPLETED
    assert task_state("expired") == TaskState.TASK_STATE_FAILED
    assert task_state("dead", "rejected") == TaskState.TASK_STATE_REJECTED
    assert task_state("dead", "max_attempts") == TaskState.TASK_STATE_FAILED
    assert task_state("cancelled") == TaskState.TASK_STATE_CANCELED
    assert task_state("unknown") == TaskState.TASK_STATE_UNSPECIFIED


def test_errors_map_to_json_rpc_errors() -> None:
    e = error_of(NoAgentAvailable("no agent for x", capability="x", reason="none"))
    assert isinstance(e, InternalError) and e.data == {
        "reachError": "NoAgentAvailable",
        "reason": "none",
    }
    e = error_of(Overloaded("full", limit="send_rate", retry_after_s=1.5))
    assert isinstance(e, InternalError) and e.data is not None and e.data["retryAfterS"] == 1.5
    assert isinstance(error_of(PayloadTooLarge("big")), InvalidParamsError)
    assert isinstance(error_of(ConfigError("bad")), InvalidParamsError)


def test_the_log_filter_drops_client_errors_and_keeps_the_gateways_own_faults() -> None:
    """What reach.gateway.logs lets through a handler: the SDK's records of an error a
    caller gets go (reach logs one line for it instead); a fault of the gateway itself,
    logged with any other exception, keeps its traceback."""
    import io
    import logging
    import sys

    from a2a.utils.errors import TaskNotFoundError

    from reach.gateway import logs

    out = io.StringIO()
    handler = logging.StreamHandler(out)
    logs.install(handler)

    def emit(name: str, exc: BaseException | None, msg: str = "request failed") -> None:
        info = None
        if exc is not None:
            try:
                raise exc
            except BaseException:  # noqa: BLE001 - the record wants it with its traceback
                info = sys.exc_info()
        record = logging.LogRecord(name, logging.ERROR, __file__, 1, msg, None, info)
        if handler.filter(record):
            handler.handle(record)

    emit("a2a.server.request_handlers", TaskNotFoundError())
    emit("a2a.server.request_handlers", InvalidParamsError(message="bad capability name"))
    emit("a2a.server.events", None, "Dispatcher task was cancelled or finished")
    assert out.getvalue() == ""  # a caller's errors: nothing from the SDK
    emit("a2a.server.request_handlers", RuntimeError("the store is broken"))
    emit("reach.gateway", None, "client error: code -32001, caller ops, method GetTask: x")
    text = out.getvalue()
    assert (
        "Traceback (most recent call last)" in text and "RuntimeError: the store is broken" in text
    )
    assert "client error: code -32001" in text


# -- SSE ids (reach.gateway.resuming) ------------------------------------------------------
def test_each_data_event_gets_the_next_id_and_comments_none() -> None:
    from collections import deque

    from reach.gateway.resuming import _split

    ids = deque(["t/0", "", "t/1"])
    data = b"data: a\r\n\r\n: ping\r\n\r\ndata: b\r\n\r\ndata: c\n\ndata: d"
    out, rest = _split(data, ids)
    assert out == (
        b"id: t/0\r\ndata: a\r\n\r\n"  # the first id
        b": ping\r\n\r\n"  # a comment takes none
        b"data: b\r\n\r\n"  # an event the handler gave no id to ("")
        b"id: t/1\ndata: c\n\n"  # the separator of the event itself
    )
    assert rest == b"data: d" and not ids  # not complete yet: kept for the next body
    out, rest = _split(rest + b"\r\n\r\n", ids)
    assert out == b"data: d\r\n\r\n" and rest == b""  # no id left: none written


def test_last_event_id_is_read_as_the_gateway_writes_it() -> None:
    from a2a.server.context import ServerCallContext
    from a2a.utils.errors import InvalidParamsError

    from reach.gateway.resuming import last_event

    def ctx(value: str | None) -> ServerCallContext:
        headers = {} if value is None else {"last-event-id": value}
        return ServerCallContext(state={"headers": headers})

    assert last_event(ctx(None)) is None and last_event(ctx("")) is None
    assert last_event(ctx("01abc/12")) == ("01abc", 12)
    for bad in ("12", "/3", "t/", "t/-1", "t/x", "t/" + "9" * 17):
        with pytest.raises(InvalidParamsError):
            last_event(ctx(bad))
