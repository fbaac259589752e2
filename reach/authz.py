"""Who may call what (issue 31 item 1; docs/security.md, *Who may call what*).

An agent declares, per capability, who may call it and how sensitive it is::

    @app.handler("payments.refund", allow=["role:billing", "id:alice"], security="sensitive")

An allow list holds entries of three forms, matched against the *verified* signer of a
message (never its ``source``, which a caller chooses):

* ``id:NAME``  - the identity NAME: in the Ed25519 mode the name of the key that signed
  (``kid``, a name of the trusted-keys file);
* ``role:NAME`` - any identity the trusted-keys file gives role NAME (its third column,
  ``NAME BASE64-KEY billing,ops``);
* ``*``        - any verified signer. In the HMAC mode every holder of the namespace's
  secret is one identity with no name and no roles: only ``*`` matches it.

The security level is one of :data:`LEVELS`, in order: ``public`` (the default: unsigned
callers are served where signing is optional, unless an allow list says otherwise),
``internal`` (a verified signer is needed, any), ``sensitive`` (a verified signer *and* an
allow list it is in: declaring one without ``allow=`` is a :class:`ConfigError`).

An operator tightens it per namespace, never widens it (``reach caps allow|deny``): the
operator's allow list, when it has one, must match too, and a caller matching a deny
entry is refused. Any rule of either kind makes the capability need a verified signer
(otherwise a denied caller would only have to stop signing). The rules live in one hash
(:attr:`reach.keys.Keys.access`) with a version the workers poll (at most every
:data:`ACCESS_REFRESH_S`, only while messages come): a change applies within a second.

The worker enforces all of it before the handler runs (reach._worker.authz): a refused
message is dead-lettered ``forbidden`` and its caller gets :class:`reach.Forbidden`. A
:class:`reach.Client` looks first at what the registry publishes (``metadata["access"]``)
for an early error; that look is a courtesy, never the check.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from redis import exceptions as rexc

from . import audit
from .connection import AnyRedis
from .errors import ConfigError, Forbidden, RedisUnavailable
from .keys import Keys
from .registry import AgentInfo, normalize_capability
from .signing import NAME_PATTERN, ROLE_PATTERN, IdentityKeys, Signer
from .untrusted import safe_int, strict_text

if TYPE_CHECKING:
    from .envelope import Envelope
    from .view import RegistryView

log = logging.getLogger("reach.authz")

ACCESS_KEY: Final = "access"
"""The registration metadata key of the declared rules: capability -> ``{"allow": [...],
"security": "..."}`` (``allow`` left out when the handler declares none)."""

PUBLIC, INTERNAL, SENSITIVE = "public", "internal", "sensitive"
LEVELS: Final[tuple[str, ...]] = (PUBLIC, INTERNAL, SENSITIVE)
"""The security levels, least restricted first."""

ANY: Final = "*"
ACCESS_REFRESH_S: Final = 0.5
"""How stale a worker's copy of the operator's rules may be when it judges a message."""
MAX_ENTRIES: Final = 256
"""Most entries one allow or deny list holds."""

_VERSION = "version"  # the field of the access hash the workers poll
_KINDS = ("allow", "deny")


# -- entries and levels --------------------------------------------------------------------
def check_entry(entry: str, where: str = "allow") -> str:
    """``entry`` stripped, or :class:`ConfigError` saying the three forms."""
    text = entry.strip() if isinstance(entry, str) else ""
    kind, _, name = text.partition(":")
    ok = text == ANY or (
        (kind == "id" and NAME_PATTERN.match(name) is not None)
        or (kind == "role" and ROLE_PATTERN.match(name) is not None)
    )
    if not ok:
        raise ConfigError(
            f"{where}: {entry!r} is not an entry: use 'id:NAME' (a signer's identity, e.g. "
            "id:alice), 'role:NAME' (a role of the trusted-keys file, e.g. role:billing) or "
            "'*' (any verified signer)."
        )
    return text


def check_entries(entries: Iterable[str] | str, where: str = "allow") -> tuple[str, ...]:
    """Each entry checked, duplicates dropped, order kept."""
    if isinstance(entries, str):
        raise ConfigError(f"{where}: give a list of entries, e.g. {where}=['role:billing'].")
    out = tuple(dict.fromkeys(check_entry(e, where) for e in entries))
    if len(out) > MAX_ENTRIES:
        raise ConfigError(f"{where}: at most {MAX_ENTRIES} entries (got {len(out)}).")
    return out


def check_level(level: str | None) -> str:
    """``level`` (None: ``public``), or :class:`ConfigError` naming the levels."""
    if level is None:
        return PUBLIC
    if level not in LEVELS:
        raise ConfigError(
            f"security={level!r}: use one of {', '.join(map(repr, LEVELS))} "
            "(least restricted first)."
        )
    return level


# -- callers -------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Caller:
    """A message's verified signer: ``identity`` (None: the HMAC mode's team, which has no
    name) and its ``roles`` (None: not known, a caller's guess about itself)."""

    identity: str | None
    roles: frozenset[str] | None = frozenset()

    def describe(self) -> str:
        return f"identity {self.identity!r}" if self.identity else "the namespace's team (HMAC)"


def caller_of(keys: Signer, *, identity: str) -> Caller:
    """The caller a verified signature of ``keys``' mode names (``identity``: the
    signer's ``kid``): an Ed25519 identity with its roles, or the HMAC team."""
    if isinstance(keys, IdentityKeys):
        return Caller(identity, keys.roles.get(identity, frozenset()))
    return Caller(None)


def matches(entry: str, caller: Caller) -> bool:
    """Does ``entry`` name ``caller``? (Roles not known: a role entry might.)"""
    if entry == ANY:
        return True
    kind, _, name = entry.partition(":")
    if kind == "id":
        return caller.identity == name
    if kind == "role":
        return caller.identity is not None and (caller.roles is None or name in caller.roles)
    return False


# -- rules ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Declared:
    """What an agent declares for one capability (``@app.handler(allow=, security=)``)."""

    allow: tuple[str, ...] | None = None
    security: str = PUBLIC

    def published(self) -> dict[str, Any]:
        out: dict[str, Any] = {"security": self.security}
        if self.allow is not None:
            out["allow"] = list(self.allow)
        return out


@dataclass(frozen=True, slots=True)
class OperatorRules:
    """An operator's rules for one capability (``reach caps allow|deny``)."""

    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.allow or self.deny)


@dataclass(frozen=True, slots=True)
class Policy:
    """Everything that decides who may call a capability."""

    declared: Declared = field(default_factory=Declared)
    operator: OperatorRules = field(default_factory=OperatorRules)

    @property
    def needs_signer(self) -> bool:
        d = self.declared
        return d.allow is not None or d.security != PUBLIC or bool(self.operator)


def decide(capability: str, policy: Policy, caller: Caller | None) -> str | None:
    """None when ``caller`` (None: unsigned, or a signature that does not verify) may call
    ``capability`` under ``policy``; else why not, saying what to do."""
    if not policy.needs_signer:
        return None
    d, op = policy.declared, policy.operator
    if caller is None:
        why = (
            f"{capability!r} is {d.security}"
            if d.security != PUBLIC
            else f"{capability!r} says who may call it"
        )
        return (
            f"the message is unsigned (or its signature does not verify) and {why}: only "
            "verified signers may call it. Sign with an identity key (REACH_IDENTITY_FILE) "
            "the agent trusts."
        )
    if d.allow is not None and not any(matches(e, caller) for e in d.allow):
        return (
            f"{caller.describe()} is not in the allow list of {capability!r} "
            f"({', '.join(d.allow) or 'empty'}): ask its owner to add it, or call as an "
            "identity it allows."
        )
    if op.allow and not any(matches(e, caller) for e in op.allow):
        return (
            f"{caller.describe()} is not in the operator's allow list of {capability!r} "
            f"({', '.join(op.allow)}; `reach caps access {capability}` shows it)."
        )
    hit = next((e for e in op.deny if matches(e, caller)), None)
    if hit is not None and (caller.roles is not None or not hit.startswith("role:")):
        return (
            f"{caller.describe()} is denied {capability!r} by the operator (entry {hit!r}; "
            f"`reach caps deny {capability} --clear` lifts it)."
        )
    return None


# -- what an agent declares ----------------------------------------------------------------
def declared_for(capability: str, allow: Iterable[str] | None, security: str | None) -> Declared:
    """The rules ``@app.handler(capability, allow=, security=)`` declares, checked."""
    where = f"@app.handler({capability!r}, allow=...)"
    entries = None if allow is None else check_entries(allow, where)
    level = check_level(security)
    if level == SENSITIVE and entries is None:
        raise ConfigError(
            f"@app.handler({capability!r}, security='sensitive') needs allow=[...]: say who "
            "may call it (e.g. allow=['role:billing']; allow=['*'] for any verified signer)."
        )
    return Declared(entries, level)


def declare(metadata: dict[str, Any], capability: str, declared: Declared) -> None:
    """Publish ``declared`` for ``capability`` in an agent's registration ``metadata``."""
    given = metadata.get(ACCESS_KEY)
    every = dict(given) if isinstance(given, dict) else {}
    every[capability] = declared.published()
    metadata[ACCESS_KEY] = every


def declared_of(metadata: Mapping[str, Any], capability: str) -> Declared | None:
    """What a registration publishes for ``capability`` (None: nothing, or unreadable)."""
    every = metadata.get(ACCESS_KEY)
    got = every.get(capability) if isinstance(every, Mapping) else None
    if not isinstance(got, Mapping):
        return None
    try:
        level = check_level(got.get("security"))
        allow = got.get("allow")
        return Declared(None if allow is None else check_entries(allow), level)
    except (ConfigError, TypeError):
        # Written by something else: unknown rules must not read as "anyone may call".
        return Declared((), SENSITIVE)


def declared_rules(metadata: Mapping[str, Any]) -> dict[str, Declared]:
    """Every capability's declared rules in ``metadata``."""
    every = metadata.get(ACCESS_KEY)
    if not isinstance(every, Mapping):
        return {}
    return {c: d for c in every if (d := declared_of(metadata, str(c))) is not None}


def capability_security(agents: Iterable[AgentInfo], capability: str) -> str:
    """The security level of ``capability`` as its live agents publish it (the highest
    when they differ: a caller cannot tell which of them it reaches)."""
    best = PUBLIC
    for a in agents:
        if a.state == "evicted" or capability not in a.capabilities:
            continue
        d = declared_of(a.metadata, capability)
        if d is not None and LEVELS.index(d.security) > LEVELS.index(best):
            best = d.security
    return best


def check_declared_keys(declared: Mapping[str, Declared], agent_id: str, has_keys: bool) -> None:
    """An agent that declares rules must have keys to verify its callers with."""
    if declared and not has_keys:
        caps = ", ".join(sorted(declared))
        raise ConfigError(
            f"Agent {agent_id!r} says who may call {caps} (allow= or security=) but has no "
            "keys to verify its callers: set REACH_IDENTITY_FILE and REACH_TRUSTED_KEYS_FILE "
            "(per-identity keys, docs/security.md), or REACH_SECRET."
        )


# -- the operator's rules in Redis ---------------------------------------------------------
def _field(kind: str, capability: str, entry: str) -> str:
    return f"{kind}:{capability}:{entry}"


def _parse(raw: Mapping[Any, Any]) -> tuple[int, dict[str, OperatorRules]]:
    version = 0
    lists: dict[str, dict[str, list[str]]] = {}
    for k, v in raw.items():
        # Read as untrusted: a field reach did not write (not UTF-8, not a number) is
        # skipped, and never stops the rules around it from applying.
        name = strict_text(k)
        if name is None:
            continue
        if name == _VERSION:
            version = safe_int(v, -1)
            continue
        kind, _, rest = name.partition(":")
        cap, _, entry = rest.partition(":")
        if kind in _KINDS and cap and entry:
            lists.setdefault(cap, {"allow": [], "deny": []})[kind].append(entry)
    rules = {
        c: OperatorRules(tuple(sorted(k["allow"])), tuple(sorted(k["deny"])))
        for c, k in lists.items()
    }
    return version, rules


async def read_rules(redis: AnyRedis, keys: Keys) -> tuple[int, dict[str, OperatorRules]]:
    """The operator's rules of every capability, and their version."""
    return _parse(await redis.hgetall(keys.access))


async def change_rules(
    redis: AnyRedis,
    keys: Keys,
    capability: str,
    kind: str,
    entries: Sequence[str] = (),
    *,
    clear: bool = False,
) -> OperatorRules:
    """The one write of the operator's rules (``reach caps allow|deny``): add ``entries``
    to ``capability``'s ``kind`` list (``allow`` or ``deny``), or with ``clear`` empty that
    list. The version the workers poll moves in the same transaction. Returns the
    capability's rules after the change."""
    cap = normalize_capability(capability)
    if kind not in _KINDS:
        raise ConfigError(f"kind={kind!r}: 'allow' or 'deny'.")
    checked = check_entries(entries, f"reach caps {kind}")
    if not clear and not checked:
        raise ConfigError(f"reach caps {kind} {cap}: give entries (id:NAME, role:NAME, *).")
    detail = {"clear": True} if clear else {"entries": list(checked)}
    # recorded in the audit trail (reach audit), ok or with the error that stopped it
    async with audit.operator_action(redis, keys, f"caps.{kind}", target=cap, detail=detail):
        pipe = redis.pipeline(transaction=True)
        if clear:
            _, now = await read_rules(redis, keys)
            old = getattr(now.get(cap, OperatorRules()), kind)
            if old:
                pipe.hdel(keys.access, *(_field(kind, cap, e) for e in old))
        else:
            pipe.hset(keys.access, mapping={_field(kind, cap, e): "1" for e in checked})
        pipe.hincrby(keys.access, _VERSION, 1)
        await pipe.execute()
    _, after = await read_rules(redis, keys)
    return after.get(cap, OperatorRules())


class RulesCache:
    """The operator's rules as a worker knows them: the version polled at most every
    :data:`ACCESS_REFRESH_S` while messages come (an idle worker reads nothing), the rules
    read again when it moved. A failed read keeps the last known rules."""

    def __init__(self, refresh_s: float = ACCESS_REFRESH_S) -> None:
        self.refresh_s = refresh_s
        self._rules: dict[str, OperatorRules] = {}
        self._version: int | None = None
        self._read_at = -refresh_s

    def fresh(self) -> dict[str, OperatorRules] | None:
        """The rules known, if read within ``refresh_s`` (else None: :meth:`current` reads
        them again). A worker's check of a message that needs no read, with no await."""
        if time.monotonic() - self._read_at < self.refresh_s:
            return self._rules
        return None

    async def current(self, redis: AnyRedis, keys: Keys) -> dict[str, OperatorRules]:
        now = time.monotonic()
        if now - self._read_at < self.refresh_s:
            return self._rules
        self._read_at = now
        try:
            (raw,) = await redis.hmget(keys.access, [_VERSION])
            version = safe_int(raw, -1) if raw is not None else 0
            if version != self._version:
                self._version, self._rules = await read_rules(redis, keys)
        except (rexc.RedisError, OSError, ValueError) as e:
            log.warning("reading the operator's access rules failed (%s); the last apply", e)
        return self._rules


# -- the caller's early look ---------------------------------------------------------------
def caller_self(signer: Signer | None) -> Caller | None:
    """How a client sees itself: its identity and, when its own trusted-keys file lists
    it, its roles (else not known: a role entry might match)."""
    if signer is None:
        return None
    if isinstance(signer, IdentityKeys):
        known = signer.kid in signer.trusted
        return Caller(signer.kid, signer.roles.get(signer.kid, frozenset()) if known else None)
    return Caller(None)


def precheck(capability: str, agents: Iterable[AgentInfo], signer: Signer | None) -> str | None:
    """Why the agents of ``capability`` would refuse this caller, judged by what they
    publish (None: some of them might take it). Not a security check: the agent decides."""
    me = caller_self(signer)
    live = [a for a in agents if a.state != "evicted" and capability in a.capabilities]
    if not live:
        return None
    why: str | None = None
    for a in live:
        d = declared_of(a.metadata, capability)
        why = decide(capability, Policy(d or Declared()), me)
        if why is None:
            return None
    return why


def rules_json(capability: str, declared: Declared | None, op: OperatorRules) -> dict[str, Any]:
    """One capability's rules as ``reach caps access --json`` prints them."""
    return {
        "capability": capability,
        "security": declared.security if declared else PUBLIC,
        "declared_allow": list(declared.allow) if declared and declared.allow is not None else None,
        "operator_allow": list(op.allow),
        "operator_deny": list(op.deny),
    }


class Prechecks:
    """A client's early look (:func:`precheck`), kept per registry view version (it moves
    when an agent's metadata changes), so a call reads what its agents publish only after a
    change."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[int, str | None]] = {}

    def passed(self, capability: str, version: int) -> bool:
        """Did the look at ``capability`` pass at the view's ``version`` (nothing to read
        or judge again)? A send's fast path asks this before :meth:`check`."""
        seen = self._seen.get(capability)
        return seen is not None and seen[0] == version and seen[1] is None

    async def check(self, view: RegistryView, signer: Signer | None, env: Envelope) -> None:
        """Raise :class:`Forbidden` (nothing sent) when every live agent of ``env``'s
        capability publishes rules that refuse this caller. An envelope another signed (a
        dead letter replayed as it was) is judged by the agent alone."""
        if env.sig and env.kid != (signer.kid if signer is not None else ""):
            return
        capability = env.capability
        try:
            agents, version = await view.candidates(capability)
        except (RedisUnavailable, rexc.RedisError, OSError):
            return  # the send waits for Redis (or is held) or fails as it would have
        seen = self._seen.get(capability)
        if seen is None or seen[0] != version:
            if len(self._seen) >= 4096:
                self._seen.clear()
            seen = self._seen[capability] = (version, precheck(capability, agents, signer))
        if seen[1] is not None:
            raise Forbidden(
                f"{capability!r} would refuse this caller (nothing was sent): {seen[1]}"
            )
