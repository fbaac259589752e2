"""Authenticated envelopes and replies, in two modes: HMAC-SHA256 with a shared
per-namespace secret (:class:`Keyring`, one team), or Ed25519 with a key pair per identity
(:class:`IdentityKeys`: each agent and caller signs as itself, and believes the public keys
of a trusted-keys file an operator hands out). The Ed25519 mode needs the optional
``cryptography`` package; the rest of this module does not.

A signer (:class:`Keyring`) holds one or more secrets of a namespace: it signs with the
first and accepts any (a key rollover: put the new secret first, keep the old one after it
until every process has the new one, then drop it). The secrets come from ``secret=`` on
:class:`reach.Agent.run` / :class:`reach.Client`, else ``REACH_SECRET`` (comma-separated for
a rollover). No secret: nothing is signed or checked, and nothing here runs per message.

What is signed (docs/security.md, *Signed envelopes*): a canonical msgpack array of the
namespace and the fields the sender decides and nobody rewrites -- ``v, msg_id,
capability, payload bytes, session_id, trace_id, source, priority, deadline_ms,
max_attempts, idempotency_key, reply_to, headers, sent_ms`` (and ``hops, path`` when a
handler's call carries them: :func:`envelope_data`). Left out, because the runtime
rewrites them on its own copies without the sender's key (a retry, a parked copy, the
sweeper's reroute of an evicted agent's inbox): ``attempt``, ``avoid``, ``busy_waits``, ``preempts``, ``holds``,
``target`` and ``policy``. Changing them only changes where, or how often, an authentic
message runs, which anyone able to write an inbox can do anyway by adding a copy of the
entry: signatures do not stop replays, idempotency keys bound their effects.

In the Ed25519 mode the same bytes are signed, ``kid`` is the signer's identity name, and
``ctx.sender`` is that name (verified: only its private key makes that signature).

A reply is signed by the agent that answers, over the namespace and every reply field
(``msg_id, status, result bytes, error_type, error, reason, agent_id, attempt``). A chunk
entry of a streamed result (status ``chunk``) is signed alike, over ``msg_id, seq, result
bytes, agent_id, attempt`` under its own label, and checked by the same ``check_reply``.

The key id (``kid``) sent with a signature is an HMAC of a fixed label under the secret
(8 bytes, hex): both ends derive it, it names which secret of a rollover signed, and it says
nothing more about the secret than the signature itself does.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from .envelope import CHUNK, Envelope, Reply
from .errors import ConfigError

SECRET_ENV = "REACH_SECRET"
REQUIRE_ENV = "REACH_REQUIRE_SIGNED"
MIN_SECRET_BYTES = 16

_ENV_LABEL = b"reach/envelope/1"
_REPLY_LABEL = b"reach/reply/1"
_CHUNK_LABEL = b"reach/chunk/1"
_KID_LABEL = b"reach/key-id/1"
_enc = msgspec.msgpack.Encoder()

SecretOption = str | bytes | Sequence[str | bytes] | None
"""``secret=``: one secret, several (the first signs, all verify), or None (REACH_SECRET).
Text (``secret=`` or ``REACH_SECRET``) is read by one rule, :func:`split_secrets`; bytes
are one raw key, taken as they are; each item of a list is one secret."""


def split_secrets(text: str) -> list[str]:
    """The secrets a text names: comma-separated, each stripped, empty parts dropped
    (``"new,old"``: a rollover pair, the first signs and both verify)."""
    return [s for s in (p.strip() for p in text.split(",")) if s]


def _as_secrets(secret: SecretOption) -> list[bytes]:
    items: list[str | bytes]
    if secret is None:
        items = list(split_secrets(os.environ.get(SECRET_ENV, "")))
    elif isinstance(secret, str):
        # The same rule as REACH_SECRET: a Client given the variable's value must agree
        # with the workers that read the variable, or every reply looks forged.
        items = list(split_secrets(secret))
        if not items:
            raise ConfigError(
                "secret= is empty: pass a secret (make one with `reach keys secret`), or "
                "leave secret= out to use REACH_SECRET."
            )
    elif isinstance(secret, bytes):
        items = [secret]
    else:
        items = list(secret)
    out: list[bytes] = []
    for s in items:
        b = s.encode() if isinstance(s, str) else bytes(s)
        if len(b) < MIN_SECRET_BYTES:
            raise ConfigError(
                f"A signing secret must be at least {MIN_SECRET_BYTES} bytes (got {len(b)}): "
                "make one with `reach keys secret`."
            )
        out.append(b)
    return out


def require_signed_env() -> bool:
    """``REACH_REQUIRE_SIGNED`` set to 1 (or true/yes/on)."""
    return os.environ.get(REQUIRE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def key_id(secret: bytes) -> str:
    """The key id of ``secret`` (what signed messages carry in ``kid``)."""
    return hmac.new(secret, _KID_LABEL, hashlib.sha256).digest()[:8].hex()


def envelope_data(namespace: str, env: Envelope) -> bytes:
    """The bytes an envelope's signature covers (docs/protocol.md, *Envelope*).

    A child call's ``hops`` and ``path`` are appended when present (a message that
    carries neither is signed over the same bytes as before they existed, so its
    signature still verifies); once present they are covered: stripping or changing
    them breaks the signature."""
    fields: tuple[Any, ...] = (
        _ENV_LABEL,
        namespace,
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
    if env.hops or env.path:
        fields += (env.hops, env.path)
    return _enc.encode(fields)


def reply_data(namespace: str, r: Reply) -> bytes:
    """The bytes a reply's signature covers (docs/protocol.md, *Reply*); a chunk entry's
    (docs/protocol.md, *Chunk*) under a label of its own and with its ``seq``, so neither
    passes for the other."""
    if r.status == CHUNK:
        return _enc.encode(
            (_CHUNK_LABEL, namespace, r.msg_id, r.seq, r.result, r.agent_id, r.attempt)
        )
    return _enc.encode(
        (
            _REPLY_LABEL,
            namespace,
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


class Signer(Protocol):
    """What signs and checks envelopes and replies: :class:`Keyring` (HMAC, a shared secret)
    or :class:`IdentityKeys` (Ed25519, a key pair per identity)."""

    kid: str

    def sign_envelope(self, env: Envelope) -> None: ...
    def check_envelope(self, env: Envelope) -> str | None: ...
    def sender(self, env: Envelope) -> str: ...
    def sign_reply(self, reply: Reply) -> Reply: ...
    def check_reply(self, reply: Reply) -> str | None: ...


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
        return envelope_data(self.namespace, env)

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
        return reply_data(self.namespace, r)

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


# -- Ed25519: one key pair per identity -------------------------------------------------

IDENTITY_ENV = "REACH_IDENTITY_FILE"
TRUSTED_ENV = "REACH_TRUSTED_KEYS_FILE"
_PRIVATE_TAG = "reach-ed25519-private"
NAME_PATTERN = re.compile(r"^[A-Za-z0-9_.:@/-]{1,64}$")

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )


def _ed25519() -> Any:
    try:
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError as e:  # an optional dependency: only this mode needs it
        raise ConfigError(
            "Per-identity signing (Ed25519) needs the `cryptography` package: "
            "pip install 'reach-fabric[ed25519]'."
        ) from e
    return ed25519


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(text: str, what: str, n: int) -> bytes:
    try:
        raw = base64.b64decode(text, validate=True)
    except ValueError:
        raw = b""
    if len(raw) != n:
        raise ConfigError(f"{what}: not {n} bytes in base64.")
    return raw


def _check_name(name: str, where: str) -> str:
    if not NAME_PATTERN.match(name):
        raise ConfigError(
            f"{where}: identity name {name[:80]!r} must be 1-64 letters, digits or _.:@/-."
        )
    return name


def keygen(name: str) -> tuple[str, str]:
    """A new identity ``name``: (its private key file's text, its trusted-keys line)."""
    _check_name(name, "keygen")
    ed = _ed25519()
    sk = ed.Ed25519PrivateKey.generate()
    seed = sk.private_bytes_raw()
    pub = sk.public_key().public_bytes_raw()
    return f"{_PRIVATE_TAG} {name} {_b64(seed)}\n", f"{name} {_b64(pub)}\n"


def load_identity(path: str | Path) -> tuple[str, Ed25519PrivateKey]:
    """(name, private key) from a file :func:`keygen` wrote: ``reach-ed25519-private
    NAME BASE64-SEED``. Errors name the file, never what it holds."""
    ed = _ed25519()
    try:
        words = Path(path).read_text().split()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"Cannot read the identity key file {path}: {e}") from e
    if len(words) != 3 or words[0] != _PRIVATE_TAG:
        raise ConfigError(
            f"{path} is not a reach identity key file (`python -m reach.signing keygen NAME` "
            "writes one)."
        )
    name = _check_name(words[1], str(path))
    seed = _unb64(words[2], str(path), 32)
    return name, ed.Ed25519PrivateKey.from_private_bytes(seed)


ROLE_PATTERN = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
"""A role name (the trusted-keys file's third column, ``role:NAME`` in an allow list)."""


def _check_roles(text: str, where: str) -> frozenset[str]:
    roles = frozenset(r for r in (p.strip() for p in text.split(",")) if r)
    for r in roles:
        if not ROLE_PATTERN.match(r):
            raise ConfigError(
                f"{where}: role {r[:80]!r} must be 1-64 letters, digits or _.- "
                "(roles are comma-separated, e.g. billing,ops)."
            )
    return roles


def read_trusted(
    path: str | Path,
) -> tuple[dict[str, list[Ed25519PublicKey]], dict[str, frozenset[str]]]:
    """The trusted public keys and the roles of each identity: one ``NAME BASE64-KEY
    [ROLE,ROLE...]`` a line (``#`` comments). A name may have two keys during a rollover;
    its roles are those of all its lines. Roles are as trusted as the keys: whoever may
    edit this file may make any identity anything (docs/security.md, *Who may call what*)."""
    ed = _ed25519()
    try:
        lines = Path(path).read_text().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"Cannot read the trusted keys file {path}: {e}") from e
    out: dict[str, list[Ed25519PublicKey]] = {}
    roles: dict[str, frozenset[str]] = {}
    for i, line in enumerate(lines, 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        if len(words) not in (2, 3):
            raise ConfigError(f"{path}:{i}: expected `NAME BASE64-PUBLIC-KEY [ROLE,ROLE...]`.")
        name = _check_name(words[0], f"{path}:{i}")
        key = ed.Ed25519PublicKey.from_public_bytes(_unb64(words[1], f"{path}:{i}", 32))
        out.setdefault(name, []).append(key)
        got = _check_roles(words[2], f"{path}:{i}") if len(words) == 3 else frozenset()
        roles[name] = roles.get(name, frozenset()) | got
    return out, roles


def load_trusted(path: str | Path) -> dict[str, list[Ed25519PublicKey]]:
    """The trusted public keys of :func:`read_trusted` (without the roles)."""
    return read_trusted(path)[0]


class IdentityKeys:
    """Ed25519: signs as one identity (``kid`` = its name), verifies the identities of a
    trusted-keys file. The signed bytes are the HMAC mode's."""

    __slots__ = ("_invalid", "_sk", "kid", "namespace", "roles", "trusted")

    def __init__(
        self,
        namespace: str,
        name: str,
        private_key: Ed25519PrivateKey,
        trusted: dict[str, list[Ed25519PublicKey]],
        roles: dict[str, frozenset[str]] | None = None,
    ) -> None:
        from cryptography.exceptions import InvalidSignature

        self.namespace = namespace
        self.kid = name
        self._sk = private_key
        self.trusted = trusted
        self.roles = roles or {}  # identity -> its roles (the trusted-keys file's 3rd column)
        self._invalid = InvalidSignature

    def __repr__(self) -> str:
        return f"IdentityKeys({self.namespace!r}, {self.kid!r}, trusted={sorted(self.trusted)})"

    @classmethod
    def from_files(
        cls, namespace: str, identity_file: str | None, trusted_file: str | None
    ) -> IdentityKeys | None:
        """From the files (else ``REACH_IDENTITY_FILE`` and ``REACH_TRUSTED_KEYS_FILE``);
        None when no identity file is set."""
        identity_file = identity_file or os.environ.get(IDENTITY_ENV) or None
        trusted_file = trusted_file or os.environ.get(TRUSTED_ENV) or None
        if identity_file is None:
            if trusted_file is not None:
                raise ConfigError(
                    f"A trusted keys file without an identity: set {IDENTITY_ENV} (or "
                    "identity_file=) too; replies and messages are signed by each side."
                )
            return None
        if trusted_file is None:
            raise ConfigError(
                f"An identity without trusted keys verifies nothing: set {TRUSTED_ENV} (or "
                "trusted_keys_file=) to the file of the identities' public keys."
            )
        name, sk = load_identity(identity_file)
        trusted, roles = read_trusted(trusted_file)
        return cls(namespace, name, sk, trusted, roles)

    def _check(self, kid: str, sig: bytes, data: bytes) -> str | None:
        if not sig:
            return "unsigned"
        keys = self.trusted.get(kid)
        if not keys:
            return f"signed by unknown identity {kid[:64]!r}"
        for pk in keys:
            try:
                pk.verify(sig, data)
            except self._invalid:
                continue
            return None
        return "bad signature"

    def sign_envelope(self, env: Envelope) -> None:
        env.kid = self.kid
        env.sig = self._sk.sign(envelope_data(self.namespace, env))

    def check_envelope(self, env: Envelope) -> str | None:
        return self._check(env.kid, env.sig, envelope_data(self.namespace, env))

    def sender(self, env: Envelope) -> str:
        """The verified identity that signed ``env``: its key's name."""
        return env.kid

    def sign_reply(self, reply: Reply) -> Reply:
        reply.kid = self.kid
        reply.sig = self._sk.sign(reply_data(self.namespace, reply))
        return reply

    def check_reply(self, reply: Reply) -> str | None:
        return self._check(reply.kid, reply.sig, reply_data(self.namespace, reply))


def make_signer(
    namespace: str,
    secret: SecretOption = None,
    identity_file: str | None = None,
    trusted_keys_file: str | None = None,
) -> Signer | None:
    """The signer of a Client or an agent: Ed25519 when an identity file is set (argument
    or ``REACH_IDENTITY_FILE``), else HMAC when a secret is (``REACH_SECRET``), else None.
    Both set: an error (one mode per process)."""
    ident = IdentityKeys.from_files(namespace, identity_file, trusted_keys_file)
    ring = Keyring.from_option(namespace, secret)
    if ident is not None and ring is not None:
        raise ConfigError(
            "Both a shared secret (REACH_SECRET / secret=) and an identity key "
            f"({IDENTITY_ENV} / identity_file=) are set: choose one signing mode."
        )
    return ident if ident is not None else ring


@dataclass(frozen=True, slots=True)
class WorkerSigning:
    """A running agent's signing: its keys and whether unsigned messages are refused."""

    keys: Signer
    required: bool


# The signing of each running agent of this process, by (namespace, agent_id). The worker's
# parts that sign replies (reach._worker.outcome, .letters) and check envelopes (.consumer,
# reach.context) find it here from the namespace and agent id they are given; an explicit
# parameter would need the runtime's wiring (runtime.py, execution.py) to carry it.
_workers: dict[tuple[str, str], WorkerSigning] = {}


def register_worker(namespace: str, agent_id: str, signing: WorkerSigning | None) -> None:
    """Set the signing of a running agent (with None: none)."""
    if signing is None:
        _workers.pop((namespace, agent_id), None)
    else:
        _workers[(namespace, agent_id)] = signing


def unregister_worker(namespace: str, agent_id: str, signing: WorkerSigning | None) -> None:
    """An agent run that set ``signing`` ended: clear it, unless another run of the same
    agent id in this process set its own since (a newer instance; it keeps it)."""
    if signing is not None and _workers.get((namespace, agent_id)) is signing:
        del _workers[(namespace, agent_id)]


def worker(namespace: str, agent_id: str) -> WorkerSigning | None:
    """The signing of the running agent ``agent_id`` (None: it signs nothing)."""
    if not _workers:
        return None
    return _workers.get((namespace, agent_id))


def sign_reply_for(namespace: str, agent_id: str, reply: Reply) -> bytes:
    """``reply`` encoded, signed first when the agent has a secret."""
    sign_reply_as(namespace, agent_id, reply)
    return _enc.encode(reply)


def sign_reply_as(namespace: str, agent_id: str, reply: Reply) -> None:
    """Sign ``reply`` in place when the agent has a secret (else leave it as it is)."""
    w = worker(namespace, agent_id) if _workers else None
    if w is not None:
        w.keys.sign_reply(reply)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m reach.signing keygen NAME FILE``: write a new identity's private key to
    FILE (mode 0600, refused if it exists) and print its trusted-keys line."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 3 or args[0] != "keygen":
        print("usage: python -m reach.signing keygen NAME FILE", file=sys.stderr)
        return 2
    try:
        private, line = keygen(args[1])
        fd = os.open(args[2], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except (ConfigError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    with os.fdopen(fd, "w") as f:
        f.write(private)
    print(line, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
