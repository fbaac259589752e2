"""Signed envelopes and replies (reach.signing): what is covered, what is not, rotation, and
the client's reply reader dropping forged replies."""

from __future__ import annotations

import time
from importlib.util import find_spec
from pathlib import Path

import msgspec
import pytest

from reach import logs
from reach._replies import ReplyReader
from reach._sending.delivery import seal
from reach.agent import RuntimeOptions, worker_signing
from reach.envelope import (
    Envelope,
    Reply,
    decode_envelope,
    decode_reply,
    encode,
    encode_payload,
    new_id,
)
from reach.errors import ConfigError
from reach.signing import (
    IdentityKeys,
    Keyring,
    key_id,
    keygen,
    load_identity,
    load_trusted,
    make_signer,
)
from reach.signing import main as signing_main

S1 = "first-secret-0123456789"
S2 = "second-secret-0123456789"


def env(**kw: object) -> Envelope:
    base: dict[str, object] = {
        "msg_id": "m1",
        "capability": "x.y",
        "payload": encode_payload({"a": 1}),
        "source": "c-1",
        "reply_to": "c-1",
        "deadline_ms": 1_900_000_000_000,
        "idempotency_key": "k",
        "headers": {"h": "v"},
        "sent_ms": 1_800_000_000_000,
    }
    base.update(kw)
    return Envelope(**base)  # type: ignore[arg-type]


def ring(*secrets: str, ns: str = "ns") -> Keyring:
    k = Keyring.from_option(ns, list(secrets))
    assert k is not None
    return k


def test_an_unsigned_envelope_encodes_as_before() -> None:
    e = env()
    assert b"kid" not in encode(e) and b"sig" not in encode(e)


def test_a_signed_envelope_verifies_after_the_wire() -> None:
    k = ring(S1)
    e = env()
    k.sign_envelope(e)
    assert e.kid == key_id(S1.encode()) and len(e.sig) == 32
    back = decode_envelope(encode(e))
    assert k.check_envelope(back) is None
    assert k.sender(back) == "c-1"


@pytest.mark.parametrize(
    "change",
    [
        {"msg_id": "m2"},
        {"capability": "x.z"},
        {"payload": encode_payload({"a": 2})},
        {"session_id": "s"},
        {"trace_id": "t"},
        {"source": "someone-else"},
        {"priority": "high"},
        {"deadline_ms": 0},
        {"max_attempts": 9},
        {"idempotency_key": "other"},
        {"reply_to": "c-2"},
        {"headers": {"h": "w"}},
        {"sent_ms": 1},
    ],
    ids=lambda c: next(iter(c)),
)
def test_changing_a_signed_field_breaks_the_signature(change: dict[str, object]) -> None:
    k = ring(S1)
    e = env()
    k.sign_envelope(e)
    forged = msgspec.structs.replace(e, **change)
    assert k.check_envelope(decode_envelope(encode(forged))) == "bad signature"


@pytest.mark.parametrize(
    "change",
    [{"attempt": 2}, {"avoid": "a-1"}, {"busy_waits": 3}, {"target": ""}, {"policy": "direct"}],
    ids=lambda c: next(iter(c)),
)
def test_what_the_runtime_rewrites_is_not_signed(change: dict[str, object]) -> None:
    # A retry (attempt, avoid), a parked copy (busy_waits), the sweeper's reroute (target,
    # policy): copies made by whoever holds no sender's key keep a valid signature.
    k = ring(S1)
    e = env(target="a-0")
    k.sign_envelope(e)
    copy = msgspec.structs.replace(e, **change)
    assert k.check_envelope(decode_envelope(encode(copy))) is None


def test_unsigned_unknown_key_and_other_namespace() -> None:
    k = ring(S1)
    assert k.check_envelope(env()) == "unsigned"
    e = env()
    ring(S2).sign_envelope(e)
    assert "unknown key id" in (k.check_envelope(e) or "")
    e = env()
    ring(S1, ns="other").sign_envelope(e)
    assert k.check_envelope(e) == "bad signature"  # same secret, another namespace


def test_rotation_signs_with_the_first_and_accepts_either() -> None:
    old, rolling, new = ring(S1), ring(S2, S1), ring(S2)
    e_old, e_new = env(), env()
    old.sign_envelope(e_old)
    rolling.sign_envelope(e_new)
    assert e_new.kid == new.kid != old.kid
    assert rolling.check_envelope(e_old) is None
    assert rolling.check_envelope(e_new) is None
    assert new.check_envelope(e_new) is None
    assert new.check_envelope(e_old) is not None  # after the rollover, the old key is gone


def test_replies_are_signed_over_every_field() -> None:
    k = ring(S1)
    r = k.sign_reply(Reply(msg_id="m1", status="succeeded", result=encode_payload(5), agent_id="a"))
    back = decode_reply(encode(r))
    assert k.check_reply(back) is None
    for change in (
        {"msg_id": "m2"},
        {"status": "dead"},
        {"result": encode_payload(6)},
        {"error": "e"},
        {"error_type": "E"},
        {"reason": "rejected"},
        {"agent_id": "b"},
        {"attempt": 2},
    ):
        assert k.check_reply(msgspec.structs.replace(back, **change)) == "bad signature", change
    assert k.check_reply(Reply(msg_id="m1", status="succeeded")) == "unsigned"


def test_secrets_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REACH_SECRET", raising=False)
    assert Keyring.from_option("ns", None) is None
    monkeypatch.setenv("REACH_SECRET", f" {S2} , {S1} ")
    k = Keyring.from_option("ns", None)
    assert k is not None and k.kid == key_id(S2.encode()) and len(k.secrets) == 2
    assert S1 not in repr(k) and S2 not in repr(k)
    with pytest.raises(ConfigError, match="at least 16 bytes"):
        Keyring.from_option("ns", "short")


def test_requiring_signatures_needs_a_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REACH_SECRET", raising=False)
    monkeypatch.delenv("REACH_REQUIRE_SIGNED", raising=False)
    assert worker_signing(RuntimeOptions()) is None
    with pytest.raises(ConfigError, match="REACH_SECRET"):
        worker_signing(RuntimeOptions(require_signed=True))
    monkeypatch.setenv("REACH_REQUIRE_SIGNED", "1")
    with pytest.raises(ConfigError, match="REACH_SECRET"):
        worker_signing(RuntimeOptions())
    w = worker_signing(RuntimeOptions(secret=S1))
    assert w is not None and w.required
    w = worker_signing(RuntimeOptions(secret=S1, require_signed=False))
    assert w is not None and not w.required
    assert S1 not in repr(RuntimeOptions(secret=S1))


def _reader(verifier: Keyring | None) -> ReplyReader:
    return ReplyReader(
        "replies", client_id="c-1", max_unclaimed=10, unclaimed_ttl_s=60, verifier=verifier
    )


def test_the_reply_reader_drops_and_counts_forged_and_unsigned_replies() -> None:
    k = ring(S1)
    reader = _reader(k)
    ev = reader.expect("m1")
    now = time.monotonic()
    forged = Reply(msg_id="m1", status="succeeded", result=encode_payload("forged"))
    forged.kid, forged.sig = k.kid, b"\x00" * 32
    reader._on_reply(b"1-0", {b"r": encode(forged)}, now)
    reader._on_reply(b"1-1", {b"r": encode(Reply(msg_id="m1", status="succeeded"))}, now)
    other = ring(S2).sign_reply(Reply(msg_id="m1", status="succeeded"))
    reader._on_reply(b"1-2", {b"r": encode(other)}, now)
    assert reader.forged == 3 and not ev.is_set() and "m1" not in reader.replies
    assert reader.answered == [b"1-0", b"1-1", b"1-2"]  # deleted from the stream
    real = k.sign_reply(Reply(msg_id="m1", status="succeeded", result=encode_payload("ok")))
    reader._on_reply(b"1-3", {b"r": encode(real)}, now)
    assert ev.is_set() and reader.take("m1").result == encode_payload("ok")
    assert reader.forged == 3


def test_a_reader_without_a_secret_takes_any_reply() -> None:
    reader = _reader(None)
    ev = reader.expect("m1")
    reader._on_reply(b"1-0", {b"r": encode(Reply(msg_id="m1", status="succeeded"))}, 0.0)
    assert ev.is_set() and reader.forged == 0


# -- Ed25519: a key pair per identity -----------------------------------------------------
needs_cryptography = pytest.mark.skipif(
    find_spec("cryptography") is None, reason="the Ed25519 mode needs `cryptography`"
)


def identity(tmp_path: Path, name: str) -> tuple[str, str]:
    """(its private key file, its trusted-keys line)."""
    private, line = keygen(name)
    f = tmp_path / f"{name}.key"
    f.write_text(private)
    return str(f), line


def trusted(tmp_path: Path, *lines: str) -> str:
    f = tmp_path / "trusted"
    f.write_text("# the identities of ns\n" + "".join(lines))
    return str(f)


@needs_cryptography
def test_identity_keys_sign_as_a_name_and_verify_the_trusted(tmp_path: Path) -> None:
    a_file, a_line = identity(tmp_path, "caller-1")
    b_file, b_line = identity(tmp_path, "agent-a")
    t = trusted(tmp_path, a_line, b_line)
    a = IdentityKeys.from_files("ns", a_file, t)
    b = IdentityKeys.from_files("ns", b_file, t)
    assert a is not None and b is not None and a.kid == "caller-1"
    e = env()
    a.sign_envelope(e)
    back = decode_envelope(encode(e))
    assert len(e.sig) == 64 and b.check_envelope(back) is None and b.sender(back) == "caller-1"
    assert b.check_envelope(msgspec.structs.replace(back, payload=encode_payload(2))) == (
        "bad signature"
    )
    assert b.check_envelope(msgspec.structs.replace(back, kid="agent-a")) == "bad signature"
    assert b.check_envelope(msgspec.structs.replace(back, attempt=2)) is None
    r = b.sign_reply(Reply(msg_id="m1", status="succeeded", agent_id="agent-a"))
    assert a.check_reply(decode_reply(encode(r))) is None and r.kid == "agent-a"
    assert a.check_reply(msgspec.structs.replace(r, status="dead")) == "bad signature"


@needs_cryptography
def test_an_identity_not_in_the_trusted_file_is_refused(tmp_path: Path) -> None:
    a_file, a_line = identity(tmp_path, "caller-1")
    x_file, _ = identity(tmp_path, "intruder")
    t = trusted(tmp_path, a_line)
    a = IdentityKeys.from_files("ns", a_file, t)
    x = IdentityKeys.from_files("ns", x_file, t)
    assert a is not None and x is not None
    e = env()
    x.sign_envelope(e)
    assert "unknown identity 'intruder'" in (a.check_envelope(e) or "")
    # Claiming a trusted name without its key: a bad signature.
    e.kid = "caller-1"
    assert a.check_envelope(e) == "bad signature"
    assert a.check_envelope(env()) == "unsigned"


@needs_cryptography
def test_an_identity_rollover_trusts_two_keys_of_one_name(tmp_path: Path) -> None:
    (tmp_path / "old").mkdir()
    (tmp_path / "new").mkdir()
    old_file, old_line = identity(tmp_path / "old", "caller-1")
    new_file, new_line = identity(tmp_path / "new", "caller-1")
    t = trusted(tmp_path, old_line, new_line)
    verifier = IdentityKeys.from_files("ns", old_file, t)
    new = IdentityKeys.from_files("ns", new_file, t)
    assert verifier is not None and new is not None
    e = env()
    new.sign_envelope(e)
    assert verifier.check_envelope(e) is None


@needs_cryptography
def test_identity_files_and_mode_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("REACH_SECRET", "REACH_IDENTITY_FILE", "REACH_TRUSTED_KEYS_FILE"):
        monkeypatch.delenv(var, raising=False)
    a_file, a_line = identity(tmp_path, "caller-1")
    t = trusted(tmp_path, a_line)
    assert make_signer("ns") is None
    with pytest.raises(ConfigError, match="REACH_TRUSTED_KEYS_FILE"):
        make_signer("ns", identity_file=a_file)
    with pytest.raises(ConfigError, match="REACH_IDENTITY_FILE"):
        make_signer("ns", trusted_keys_file=t)
    with pytest.raises(ConfigError, match="choose one"):
        make_signer("ns", S1, a_file, t)
    monkeypatch.setenv("REACH_IDENTITY_FILE", a_file)
    monkeypatch.setenv("REACH_TRUSTED_KEYS_FILE", t)
    assert isinstance(make_signer("ns"), IdentityKeys)
    bad = tmp_path / "bad"
    bad.write_text("not a key")
    with pytest.raises(ConfigError, match="not a reach identity key file"):
        load_identity(bad)
    bad.write_text("caller-1 AAAA\n")
    with pytest.raises(ConfigError, match="not 32 bytes"):
        load_trusted(bad)
    with pytest.raises(ConfigError, match="identity name"):
        keygen("has space")
    seed = Path(a_file).read_text().split()[2]
    assert seed not in repr(make_signer("ns"))


@needs_cryptography
def test_keygen_command_writes_a_private_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "me.key"
    assert signing_main(["keygen", "me", str(f)]) == 0
    assert f.stat().st_mode & 0o777 == 0o600
    name, _ = load_identity(f)
    assert name == "me" and capsys.readouterr().out.startswith("me ")
    assert signing_main(["keygen", "me", str(f)]) == 2  # never overwrites a key


def test_seal_leaves_a_valid_signed_envelope_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    # The sweeper places retries and parked messages through its runtime's Client: with
    # tracing on, writing a trace header into a signed envelope broke its signature.
    def inject(headers: dict[str, str]) -> None:
        headers["traceparent"] = f"00-{new_id()}-01"

    monkeypatch.setattr(logs, "inject", inject)
    k = ring(S1)
    signed = env()
    k.sign_envelope(signed)
    before = encode(signed)
    for signer in (None, k, ring(S2, S1)):
        seal(signed, signer, tracing=True)
        assert encode(signed) == before
    fresh = env()
    seal(fresh, k, tracing=True)
    assert "traceparent" in fresh.headers and k.check_envelope(fresh) is None
    replayed = msgspec.structs.replace(signed, deadline_ms=0, headers=dict(signed.headers))
    seal(replayed, k, tracing=True)  # no longer verifies: signed again
    assert k.check_envelope(replayed) is None and replayed.sig != signed.sig
