"""Authenticated envelopes and replies: HMAC-SHA256 with a shared per-namespace secret.

A signer (:class:`Keyring`) holds one or more secrets of a namespace: it signs with the
first and accepts any (a key rollover: put the new secret first, keep the old one after it
until every process has the new one, then drop it). The secrets come from ``secret=`` on
:class:`reach.Agent.run` / :class:`reach.Client`, else ``REACH_SECRET`` (comma-separated for
a rollover). No secret: nothing is signed or checked, and nothing here runs per message.

What is signed (docs/security.md, *Signed envelopes*): a canonical msgpack array of the
namespace and the fields the sender decides and nobody rewrites -- ``v, msg_id,
capability, payload bytes, session_id, trace_id, source, priority, deadline_ms,
max_attempts, idempotency_key, reply_to, headers, sent_ms``. Left out, because the runtime
rewrites them on its own copies without the sender's key (a retry, a parked copy, the
sweeper's reroute of an evicted agent's inbox): ``attempt``, ``avoid``, ``busy_waits``,
``target`` and ``policy``. Changing them only changes where, or how often, an authentic
message runs, which anyone able to write an inbox can do anyway by adding a copy of the
entry: signatures do not stop replays, idempotency keys bound their effects.

A reply is signed by the agent that answers, over the namespace and every reply field
(``msg_id, status, result bytes, error_type, error, reason, agent_id, attempt``).

The key id (``kid``) sent with a signature is an HMAC of a fixed label under the secret
(8 bytes, hex): both ends derive it, it names which secret of a rollover signed, and it says
nothing more about the secret than the signature itself does.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

from .envelope import Envelope, Reply
from .errors import ConfigError

SECRET_ENV = "REACH_SECRET"
REQUIRE_ENV = "REACH_REQUIRE_SIGNED"
MIN_SECRET_BYTES = 16

_ENV_LABEL = b"reach/envelope/1"
_REPLY_LABEL = b"reach/reply/1"
_KID_LABEL = b"reach/key-id/1"
_enc = msgspec.msgpack.Encoder()

SecretOption = str | bytes | Sequence[str | bytes] | None
"""``secret=``: one secret, several (the first signs, all verify), or None (REACH_SECRET)."""


def _as_secrets(secret: SecretOption) -> list[bytes]:
    if secret is None:
        text = os.environ.get(SECRET_ENV, "")
        items: list[str | bytes] = [s for s in (p.strip() for p in text.split(",")) if s]
    elif isinstance(secret, (str, bytes)):
        items = [secret]
    else:
        items = list(secret)
    out: list[bytes] = []
    for s in items:
        b = s.encode() if isinstance(s, str) else bytes(s)
        if len(b) < MIN_SECRET_BYTES:
            raise ConfigError(
                f"A signing secret must be at least {MIN_SECRET_BYTES} bytes (got {len(b)}): "
                "make one with `python -c 'import secrets; print(secrets.token_urlsafe(32))'`."
            )
        out.append(b)
    return out


def require_signed_env() -> bool:
    """``REACH_REQUIRE_SIGNED`` set to 1 (or true/yes/on)."""
    return os.environ.get(REQUIRE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def key_id(secret: bytes) -> str:
    """The key id of ``secret`` (what signed messages carry in ``kid``)."""
    return hmac.new(secret, _KID_LABEL, hashlib.sha256).digest()[:8].hex()


class Keyring:
    """The HMAC secrets of one namespace: signs with the first, verifies with any."""

    __slots__ = ("_macs", "kid", "namespace", "secrets")

    def __init__(self, namespace: str, secrets: Sequence[bytes]) -> None:
        if not secrets:
            raise ConfigError("A Keyring needs at least one secret.")
        self.namespace = namespace
        self.secrets = list(secrets)
        # A keyed hash object per secret, copied per message: the key schedule is done once.
        self._macs = {key_id(s): hmac.new(s, digestmod=hashlib.sha256) for s in self.secrets}
        self.kid = key_id(self.secrets[0])

    def __repr__(self) -> str:  # never the secrets
        return f"Keyring({self.namespace!r}, kids={list(self._macs)})"

    @classmethod
    def from_option(cls, namespace: str, secret: SecretOption) -> Keyring | None:
        """The keyring of ``secret=`` (None: ``REACH_SECRET``); None when there is none."""
        secrets = _as_secrets(secret)
        return cls(namespace, secrets) if secrets else None

    def _mac(self, kid: str, data: bytes) -> bytes | None:
        base = self._macs.get(kid)
        if base is None:
            return None
        m = base.copy()
        m.update(data)
        return m.digest()

    # -- envelopes ---------------------------------------------------------------------
    def _env_data(self, env: Envelope) -> bytes:
        return _enc.encode(
            (
                _ENV_LABEL,
                self.namespace,
                env.v,
                env.msg_id,
                env.capability,
                env.payload,
                env.session_id,
                env.trace_id,
                env.source,
                env.priority,
                env.deadline_ms,
                env.max_attempts,
                env.idempotency_key,
                env.reply_to,
                env.headers,
                env.sent_ms,
            )
        )

    def sign_envelope(self, env: Envelope) -> None:
        """Sign ``env`` in place (its ``kid`` and ``sig``), as the last step before encoding."""
        env.kid = self.kid
        env.sig = self._mac(self.kid, self._env_data(env)) or b""

    def check_envelope(self, env: Envelope) -> str | None:
        """None when ``env`` carries a valid signature by one of these keys, else why not
        (``unsigned``, ``unknown key id ...``, ``bad signature``)."""
        if not env.sig:
            return "unsigned"
        want = self._mac(env.kid, self._env_data(env))
        if want is None:
            return f"signed with unknown key id {env.kid[:32]!r}"
        if not hmac.compare_digest(want, env.sig):
            return "bad signature"
        return None

    def sender(self, env: Envelope) -> str:
        """The identity a verified ``env`` names: its ``source`` (any holder of the shared
        secret may choose it), else the namespace."""
        return env.source or self.namespace

    # -- replies -----------------------------------------------------------------------
    def _reply_data(self, r: Reply) -> bytes:
        return _enc.encode(
            (
                _REPLY_LABEL,
                self.namespace,
                r.msg_id,
                r.status,
                r.result,
                r.error_type,
                r.error,
                r.reason,
                r.agent_id,
                r.attempt,
            )
        )

    def sign_reply(self, reply: Reply) -> Reply:
        """``reply`` signed in place (returned for chaining)."""
        reply.kid = self.kid
        reply.sig = self._mac(self.kid, self._reply_data(reply)) or b""
        return reply

    def check_reply(self, reply: Reply) -> str | None:
        """None when ``reply`` is signed by one of these keys, else why not."""
        if not reply.sig:
            return "unsigned"
        want = self._mac(reply.kid, self._reply_data(reply))
        if want is None:
            return f"signed with unknown key id {reply.kid[:32]!r}"
        if not hmac.compare_digest(want, reply.sig):
            return "bad signature"
        return None


@dataclass(frozen=True, slots=True)
class WorkerSigning:
    """A running agent's signing: its keys and whether unsigned messages are refused."""

    keys: Keyring
    required: bool


# The signing of each running agent of this process, by (namespace, agent_id). The worker's
# parts that sign replies (reach._worker.outcome, .letters) and check envelopes (.consumer,
# reach.context) find it here from the namespace and agent id they are given; an explicit
# parameter would need the runtime's wiring (runtime.py, execution.py) to carry it.
_workers: dict[tuple[str, str], WorkerSigning] = {}


def register_worker(namespace: str, agent_id: str, signing: WorkerSigning | None) -> None:
    """Set (or with None, clear) the signing of a running agent."""
    if signing is None:
        _workers.pop((namespace, agent_id), None)
    else:
        _workers[(namespace, agent_id)] = signing


def worker(namespace: str, agent_id: str) -> WorkerSigning | None:
    """The signing of the running agent ``agent_id`` (None: it signs nothing)."""
    if not _workers:
        return None
    return _workers.get((namespace, agent_id))


def sign_reply_for(namespace: str, agent_id: str, reply: Reply) -> bytes:
    """``reply`` encoded, signed first when the agent has a secret."""
    w = worker(namespace, agent_id) if _workers else None
    if w is not None:
        w.keys.sign_reply(reply)
    return _enc.encode(reply)
