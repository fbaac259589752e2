"""Every Redis key reach uses is built here, and only here.

Layout (``ns`` is the namespace, ids are stripped of ``{``/``}`` first):

* registry of a namespace, partitioned into ``shards`` registry shards (one on a
  standalone Redis, :data:`CLUSTER_SHARDS` on a Cluster; :func:`shard_of` puts an agent in
  shard ``crc32(agent_id) % shards``). Shard ``k`` is one hash slot, tagged ``{ns}`` for
  shard 0 (so a one-shard registry keeps the keys of reach before sharding) and
  ``{ns:r<j>}`` for the others, ``j`` chosen so the shards' slots fall in different
  ``16384 / shards`` bands of the slot space (:func:`shard_tags`); ``S`` below is the
  shard's prefix ``reach:{tag}``::

    reach:S:agents               zset  agent_id -> lease expiry (epoch ms), this shard's
    reach:S:agent:<id>           hash  the agent record (in the shard of <id>)
    reach:S:cap:<cap>            set   agent ids of this shard that declare <cap>
    reach:S:caps                 zset  capability -> agents of this shard declaring it
    reach:S:events               stream this shard's registry events (bounded)
    reach:S:lock:sweeper         string this shard's sweeper lock
    reach:S:reroute              set   evicted or deregistered agents of this shard whose
                                       inbox is still to be moved (or watched)
    reach:S:left                 zset  agent_id -> when it deregistered (epoch ms): its
                                       inbox is watched for late arrivals for a grace

* the rest of a namespace, one hash slot (shard 0's)::

    reach:{ns}:delayed           zset  retry envelopes due at (epoch ms)
    reach:{ns}:scheduled         zset  msg_id of a scheduled send -> due (epoch ms)
    reach:{ns}:scheduled:env     hash  msg_id of a scheduled send -> its sealed envelope
    reach:{ns}:dlq:<cap>         stream dead letters of <cap>
    reach:{ns}:parked:<cap>      stream messages waiting for an agent of <cap>
    reach:{ns}:parked            set   capabilities with parked messages
    reach:{ns}:limits            hash  capability -> its rate limit
    reach:{ns}:rate:<cap>        string the limit's state (GCRA's TAT, µs)
    reach:{ns}:rate:<cap>:agent:<id>  string the state of the limit agent <id> declared
                                       on its handler of <cap> (rate=)
    reach:{ns}:quotas            hash  the namespace's quotas (max_inbox, send_rate)
    reach:{ns}:access            hash  the operator's allow/deny rules per capability
                                       (``allow:<cap>:<entry>``) and their ``version``
    reach:{ns}:splits            hash  capability -> its split between versions
    reach:{ns}:gw:task:<id>      hash  an A2A gateway task (owner, context, task, size)
    reach:{ns}:gw:parts:<id>     list  parts streamed into that task since its last save
    reach:{ns}:gw:finished       zset  finished gateway tasks by finish time
    reach:{ns}:gw:bytes          string bytes the finished gateway tasks hold
    reach:{ns}:gw:owned:<owner>  zset  a gateway caller's tasks by last save
    reach:{ns}:cancels           stream cancel notices every worker reads
    reach:{ns}:audit             stream the audit trail: operator actions and audited
                                       calls (trimmed by age, bounded: reach.audit)

* an agent's inbox, one slot per agent::

    reach:ns:{a:<id>}:in:high | :in:normal | :in:low

* a client's reply stream, one slot per client::

    reach:ns:{c:<id>}:replies

* a caller identity's send-rate bucket (the quota's GCRA TAT, µs), one slot per identity::

    reach:ns:{q:<identity>}:rate

* an HTTP face's caller's rate-limit bucket (``reach gateway --rate-per-caller``), one slot
  per caller::

    reach:ns:{h:<face>/<caller>}:rate

* idempotency / task / session records, each in the slot of its own id (a streamed
  message's kept chunks in its record's; a session's version pins in its session's).

Two planes (:data:`CONTROL_BUILDERS`): the registry shards, ``limits``, ``rate:*``, ``quotas``,
``audit``, ``access`` and the ``{q:}``/``{h:}`` rate buckets are the control plane, on
``registry_url`` when a namespace keeps it apart; everything else is the data plane, on
``redis_url``. No script spans them, as no script spans two hash slots on a Cluster.

:data:`LAYOUT` lists every kind of key with its type and builder: ``reach doctor`` checks a
namespace's keys against it, so a key added here without a form there fails a test.

Redis Cluster hashes only the part between the first ``{`` and the next ``}``, so
ids must never carry braces: :func:`clean_id` removes them.
"""

from __future__ import annotations

import binascii
import functools
import re
import zlib
from dataclasses import dataclass

from .errors import ConfigError

PREFIX = "reach"
PRIORITIES: tuple[str, ...] = ("high", "normal", "low")
GROUP = "reach"  # the one consumer group on every inbox stream
CLUSTER_SHARDS = 16
"""Registry shards of a namespace on a Redis Cluster: 16 hash slots spread the registry's
work over the masters (on 3 masters a master holds about 5 of them); on a standalone Redis
or Sentinel, one (every key in one place: nothing to spread)."""
MAX_SHARDS = 1024
MAX_NAMESPACE_CHARS = 64
_NAMESPACE = re.compile(rf"[A-Za-z0-9][A-Za-z0-9_.-]{{0,{MAX_NAMESPACE_CHARS - 1}}}")
"""A namespace's alphabet (docs/concepts.md, *Namespaces*)."""


SLOTS = 16384


def slot_of_tag(tag: str) -> int:
    """The Redis Cluster slot of keys whose hash tag is ``tag`` (CRC-16/XMODEM mod 16384,
    as Redis computes it)."""
    return binascii.crc_hqx(tag.encode("utf-8", "surrogatepass"), 0) % SLOTS


@functools.lru_cache(maxsize=256)
def shard_tags(namespace: str, shards: int) -> tuple[str, ...]:
    """The hash tag of each registry shard of ``namespace`` (already cleaned).

    Shard 0's is the namespace itself. The others are ``<ns>:r<j>``, ``j`` = 1, 2, ...
    taken in turn: each shard in band order (the slot space cut into ``shards`` equal bands,
    less the band of shard 0) gets the first unused ``j`` whose slot falls in its band. So
    the shards' slots are spread evenly over the slot space, and a Cluster whose masters
    hold contiguous slot ranges (as ``redis-cli --cluster create`` splits them) gets about
    ``shards / masters`` shards per master, whatever the namespace (tags picked at random,
    16 shards over 3 masters gave 9 / 4 / 3). Deterministic: every process derives the
    same tags; changing this function moves the registry (a key-scheme change)."""
    if shards == 1:
        return (namespace,)
    band = SLOTS / shards
    taken = int(slot_of_tag(namespace) // band)
    free = [b for b in range(shards) if b != taken]
    pending: dict[int, int] = {}  # band -> shard index
    for i, b in enumerate(free[: shards - 1], start=1):
        pending[b] = i
    tags = [namespace] + [""] * (shards - 1)
    j = 0
    while pending:
        j += 1
        tag = f"{namespace}:r{j}"
        i = pending.pop(int(slot_of_tag(tag) // band), 0)
        if i:
            tags[i] = tag
    return tuple(tags)


def shard_of(agent_id: str, shards: int) -> int:
    """The registry shard (0..shards-1) of ``agent_id`` (braces removed first): CRC-32 of
    its UTF-8 bytes modulo ``shards``. Every process must compute the same: do not change."""
    if shards <= 1:
        return 0
    return zlib.crc32(clean_id(agent_id).encode("utf-8", "surrogatepass")) % shards


def glob_escape(text: str) -> str:
    """``text`` with every character a Redis glob pattern (SCAN MATCH, KEYS) treats as
    special escaped, so it matches only itself."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


def clean_id(value: str) -> str:
    """Return ``value`` with the hash-tag characters ``{`` and ``}`` removed."""
    return value.replace("{", "").replace("}", "")


@dataclass(frozen=True, slots=True)
class Keys:
    """The key builder for one namespace whose registry has ``shards`` shards (1..1024).

    The unsharded names (:attr:`agents`, :attr:`events`, :meth:`cap`...) are shard 0's:
    with one shard, the namespace's registry; with more, read every shard (``*_of``)."""

    namespace: str
    shards: int = 1

    def __post_init__(self) -> None:
        ns = self.namespace
        # A namespace is a tenant's boundary: it goes into key names, hash tags, SCAN
        # patterns and ACL key patterns. Outside this alphabet a name could glob ('*'
        # would reach every namespace's keys), break out of a hash tag ('{', '}'), or make
        # one namespace's keys a prefix match of another's pattern ('prod' and 'prod:x').
        if not isinstance(ns, str) or not _NAMESPACE.fullmatch(ns):
            raise ConfigError(
                f"Invalid namespace {ns!r}: use 1-{MAX_NAMESPACE_CHARS} characters of "
                "a-z, A-Z, 0-9, '-', '_' and '.', starting with a letter or digit "
                "(no ':', braces, spaces or glob characters), e.g. 'prod' or 'team-a'."
            )
        if isinstance(self.shards, bool) or not isinstance(self.shards, int):
            raise ConfigError(f"registry shards must be an integer, got {self.shards!r}.")
        if not 1 <= self.shards <= MAX_SHARDS:
            raise ConfigError(f"registry shards must be within 1..{MAX_SHARDS}, got {self.shards}.")

    # -- registry shards: reach:{ns}:... (shard 0), reach:{ns:r<j>}:... ------------------
    @property
    def _reg(self) -> str:
        return f"{PREFIX}:{{{self.namespace}}}"

    def _shard(self, k: int) -> str:
        if not 0 <= k < self.shards:
            raise ValueError(f"registry shard {k} is not within 0..{self.shards - 1}")
        return f"{PREFIX}:{{{shard_tags(self.namespace, self.shards)[k]}}}"

    def shard(self, agent_id: str) -> int:
        """The registry shard holding ``agent_id``'s record and lease."""
        return shard_of(agent_id, self.shards)

    def agents_of(self, k: int) -> str:
        """Shard ``k``'s agents zset (agent_id -> next lease deadline)."""
        return f"{self._shard(k)}:agents"

    def agent(self, agent_id: str) -> str:
        """The agent's record, in its shard."""
        return f"{self._shard(self.shard(agent_id))}:agent:{clean_id(agent_id)}"

    def agent_prefix_of(self, k: int) -> str:
        """Prefix of shard ``k``'s agent hashes; Lua scripts append an agent id to it."""
        return f"{self._shard(k)}:agent:"

    def cap_of(self, capability: str, k: int) -> str:
        """Shard ``k``'s set of agents declaring ``capability``."""
        return f"{self._shard(k)}:cap:{capability}"

    def cap_prefix_of(self, k: int) -> str:
        """Prefix of shard ``k``'s capability sets; Lua scripts append a capability."""
        return f"{self._shard(k)}:cap:"

    def caps_of(self, k: int) -> str:
        """Shard ``k``'s zset capability -> number of its agents declaring it."""
        return f"{self._shard(k)}:caps"

    def events_of(self, k: int) -> str:
        """Shard ``k``'s registry events stream."""
        return f"{self._shard(k)}:events"

    def sweeper_lock_of(self, k: int) -> str:
        """Shard ``k``'s sweeper lock."""
        return f"{self._shard(k)}:lock:sweeper"

    def reroute_of(self, k: int) -> str:
        """Shard ``k``'s set of evicted or deregistered agents whose inboxes still have to
        be moved (or, for a while after they left, watched for late arrivals)."""
        return f"{self._shard(k)}:reroute"

    def left_of(self, k: int) -> str:
        """Shard ``k``'s zset of agents that deregistered -> when (epoch ms, Redis's clock):
        the sweeper moves what callers with a stale view send them for a grace after it."""
        return f"{self._shard(k)}:left"

    # shard 0's names: with one shard, the namespace's registry
    @property
    def agents(self) -> str:
        return self.agents_of(0)

    @property
    def agent_prefix(self) -> str:
        return self.agent_prefix_of(0)

    def cap(self, capability: str) -> str:
        return self.cap_of(capability, 0)

    @property
    def cap_prefix(self) -> str:
        return self.cap_prefix_of(0)

    @property
    def caps(self) -> str:
        return self.caps_of(0)

    @property
    def events(self) -> str:
        return self.events_of(0)

    @property
    def sweeper_lock(self) -> str:
        """Shard 0's sweeper lock; its holder also does the namespace's chores (retries,
        evicted inboxes, parked messages)."""
        return self.sweeper_lock_of(0)

    @property
    def delayed(self) -> str:
        return f"{self._reg}:delayed"

    @property
    def scheduled(self) -> str:
        """Scheduled sends (``Client.send(at=...)``): msg_id -> due time (epoch ms); a
        mover pushes the score of an entry it took forward by its lease."""
        return f"{self._reg}:scheduled"

    @property
    def scheduled_envelopes(self) -> str:
        """Scheduled sends' envelopes, sealed at schedule time: msg_id -> bytes."""
        return f"{self._reg}:scheduled:env"

    def dlq(self, capability: str) -> str:
        return f"{self._reg}:dlq:{capability}"

    @property
    def dlq_pattern(self) -> str:
        """SCAN pattern matching every dead-letter stream of the namespace (the namespace
        glob-escaped, though its alphabet has no glob character)."""
        return f"{PREFIX}:{{{glob_escape(self.namespace)}}}:dlq:*"

    def capability_of_dlq(self, key: str) -> str:
        """Inverse of :meth:`dlq`."""
        return key[len(f"{self._reg}:dlq:") :]

    @property
    def cancels(self) -> str:
        """The namespace's cancel notices: a stream of (msg_id, idempotency record) that
        ``cancel.lua`` (or the client, on a Cluster) adds to and every worker reads, to
        stop a handler it runs (a hint: the record's status is the truth)."""
        return f"{self._reg}:cancels"

    @property
    def audit(self) -> str:
        """The namespace's audit trail (reach.audit): operator actions and calls of
        capabilities marked ``audited``, trimmed by age (``REACH_AUDIT_RETENTION``) and
        bounded in length."""
        return f"{self._reg}:audit"

    @property
    def recent(self) -> str:
        """The namespace's index of recently settled messages (reach.recent): a stream
        trimmed to about ``RECENT_MAXLEN`` entries, each the packed rows of up to 64
        messages of one settled batch, written by ``settle.lua`` in the same call."""
        return f"{self._reg}:recent"

    @property
    def limits(self) -> str:
        """The namespace's rate limits: capability -> ``"<starts>/<seconds>[,<burst>]"``."""
        return f"{self._reg}:limits"

    def rate_state(self, capability: str) -> str:
        """The state (GCRA's TAT) of ``capability``'s rate limit."""
        return f"{self._reg}:rate:{capability}"

    def agent_rate_state(self, capability: str, agent_id: str) -> str:
        """The state of the limit agent ``agent_id`` declared on its own handler of
        ``capability`` (``rate=``): its starts only."""
        return f"{self._reg}:rate:{capability}:agent:{clean_id(agent_id)}"

    @property
    def quotas(self) -> str:
        """The namespace's quotas (reach.quotas): ``max_inbox`` -> ``"<n>"``, ``send_rate``
        -> ``"<sends>/<seconds>s,<burst>"``."""
        return f"{self._reg}:quotas"

    @property
    def splits(self) -> str:
        """The capabilities' splits between application versions (``reach caps split``):
        capability -> ``"<version>=<share> ..."`` (:mod:`reach.splits`)."""
        return f"{self._reg}:splits"

    def parked(self, capability: str) -> str:
        return f"{self._reg}:parked:{capability}"

    @property
    def access(self) -> str:
        """The operator's access rules (reach.authz): ``allow:<cap>:<entry>`` and
        ``deny:<cap>:<entry>`` -> ``"1"``, and ``version`` (moved by every change)."""
        return f"{self._reg}:access"

    @property
    def parked_caps(self) -> str:
        """Set of capabilities that have parked messages."""
        return f"{self._reg}:parked"

    @property
    def reroute(self) -> str:
        """Shard 0's set of evicted agents whose inboxes still have to be moved (with one
        shard, the namespace's); :meth:`reroute_of` for the others."""
        return self.reroute_of(0)

    # -- the A2A gateway's task store (reach.gateway.store), the namespace's slot ---------
    def gateway_task(self, task_id: str) -> str:
        """A gateway task (hash: owner, context, the task as protobuf bytes, its size, its
        state), shared by every gateway process of the namespace."""
        return f"{self._reg}:gw:task:{clean_id(task_id)}"

    def gateway_task_parts(self, task_id: str) -> str:
        """The parts streamed into a gateway task's artifacts since its last whole save
        (list of protobuf ``Artifact`` bytes, appended in order)."""
        return f"{self._reg}:gw:parts:{clean_id(task_id)}"

    @property
    def gateway_finished(self) -> str:
        """Finished gateway tasks (zset ``"<task_id> <bytes>"`` -> finish time, ms): the
        oldest are dropped first past the store's byte bound."""
        return f"{self._reg}:gw:finished"

    @property
    def gateway_bytes(self) -> str:
        """The bytes held by the finished gateway tasks of :attr:`gateway_finished`."""
        return f"{self._reg}:gw:bytes"

    def gateway_owned(self, owner: str) -> str:
        """The gateway tasks of one caller (zset task_id -> last save, ms), for ListTasks."""
        return f"{self._reg}:gw:owned:{clean_id(owner)}"

    # -- per-agent slot ---------------------------------------------------------------
    def inbox(self, agent_id: str, priority: str) -> str:
        return f"{PREFIX}:{self.namespace}:{{a:{clean_id(agent_id)}}}:in:{priority}"

    def inboxes(self, agent_id: str) -> list[str]:
        """The three priority streams of an agent, highest first."""
        return [self.inbox(agent_id, p) for p in PRIORITIES]

    def wake(self, agent_id: str) -> str:
        """The sharded pub/sub channel (``SPUBLISH``) that wakes an agent waiting for its
        inbox on a Cluster: named as its high-priority inbox stream, so it is in the
        inbox's slot and a script given the inbox streams in KEYS publishes on one of
        them (``enqueue.lua``)."""
        return self.inbox(agent_id, PRIORITIES[0])

    # -- per-client slot --------------------------------------------------------------
    def replies(self, client_id: str) -> str:
        return f"{PREFIX}:{self.namespace}:{{c:{clean_id(client_id)}}}:replies"

    # -- per-caller slot --------------------------------------------------------------
    def send_rate_state(self, identity: str) -> str:
        """The state (GCRA's TAT) of ``identity``'s send-rate quota: in a slot of its own,
        so on a Cluster the callers' buckets spread over the masters."""
        return f"{PREFIX}:{self.namespace}:{{q:{clean_id(identity)}}}:rate"

    def caller_rate_state(self, face: str, caller: str) -> str:
        """The state (GCRA's TAT) of one caller's rate limit at an HTTP face (``gateway``,
        ``mcp``): every process of the face shares it, each caller in a slot of its own."""
        return f"{PREFIX}:{self.namespace}:{{h:{clean_id(face)}/{clean_id(caller)}}}:rate"

    # -- per-record slots -------------------------------------------------------------
    def idem(self, idempotency_key: str) -> str:
        return f"{PREFIX}:{self.namespace}:{{i:{clean_id(idempotency_key)}}}:idem"

    def task(self, msg_id: str) -> str:
        return f"{PREFIX}:{self.namespace}:{{t:{clean_id(msg_id)}}}:task"

    def record_keys(self, idempotency_key: str, msg_id: str) -> tuple[str, str]:
        """:meth:`idem` of ``idempotency_key`` and :meth:`task` of ``msg_id``, the two
        record keys every send names, in one call: a batch send builds them per message,
        and ids without braces (every id reach makes) skip the cleaning."""
        ns = self.namespace
        if "{" in idempotency_key or "}" in idempotency_key:
            idempotency_key = clean_id(idempotency_key)
        if "{" in msg_id or "}" in msg_id:
            msg_id = clean_id(msg_id)
        return f"{PREFIX}:{ns}:{{i:{idempotency_key}}}:idem", f"{PREFIX}:{ns}:{{t:{msg_id}}}:task"

    def kept_chunks(self, idempotency_key: str) -> str:
        """The chunks kept of a streamed message (``lua/keep_chunks.lua``), so that its
        stream can be resumed from any process (:meth:`reach.Client.resume`): in the slot
        of its idempotency record (:meth:`idem`), which holds how many are kept."""
        return f"{PREFIX}:{self.namespace}:{{i:{clean_id(idempotency_key)}}}:chunks"

    def task_changes(self, idempotency_key: str) -> str:
        """The sharded pub/sub channel (``SSUBSCRIBE``) on which the scripts announce each
        change of a task record (lua/includes/announce.lua): named as the record itself
        (:meth:`idem`), so it is in the record's slot and a script given the record in
        KEYS publishes on it. A channel, not a key: it holds nothing."""
        return self.idem(idempotency_key)

    def session(self, session_id: str) -> str:
        return f"{PREFIX}:{self.namespace}:{{s:{clean_id(session_id)}}}:session"

    def version_pins(self, session_id: str) -> str:
        """The application version each split capability's messages of a session go to:
        capability -> version (:mod:`reach.splits`), in the session's slot."""
        return f"{PREFIX}:{self.namespace}:{{s:{clean_id(session_id)}}}:pins"

    def session_history(self, session_id: str) -> str:
        return f"{PREFIX}:{self.namespace}:{{s:{clean_id(session_id)}}}:history"

    def session_version(self, session_id: str) -> str:
        """A counter raised by every write of the session (``lua/session_write.lua``): an
        agent caching the session knows from it which write its copy follows."""
        return f"{PREFIX}:{self.namespace}:{{s:{clean_id(session_id)}}}:version"

    @property
    def session_changes(self) -> str:
        """The pub/sub channel (``PUBLISH``, not sharded: one subscription hears every
        session of the namespace, on any node of a Cluster) on which
        ``lua/session_write.lua`` announces each write, ``<version>:<session id>``, to the
        agents caching sessions. A channel, not a key: it holds nothing."""
        return f"{PREFIX}:{self.namespace}:{{s}}:changes"

    def effects(self, name: str) -> str:
        """A counter hash for test and chaos handlers that count side effects."""
        return f"{PREFIX}:{self.namespace}:{{x:{clean_id(name)}}}:effects"

    # -- scanning ---------------------------------------------------------------------
    @property
    def inbox_pattern(self) -> str:
        """SCAN pattern matching every inbox stream of the namespace (the namespace
        glob-escaped, though its alphabet has no glob character)."""
        return f"{PREFIX}:{glob_escape(self.namespace)}:{{a:*}}:in:*"

    def agent_id_of_inbox(self, key: str) -> str:
        """Inverse of :meth:`inbox`: the agent id inside an inbox key."""
        start = key.index("{a:") + 3
        return key[start : key.index("}", start)]


# -- the layout: every kind of key reach writes (reach doctor checks a namespace against it)
KEY_SCHEME = 1
"""The version of the layout below. A change that moves or renames a key a deployed
process reads (not one that adds a kind of key) bumps it."""


@dataclass(frozen=True, slots=True)
class KeyForm:
    """One kind of key of a namespace: its name as a template, its Redis type, the
    :class:`Keys` member that builds it, and what it holds.

    Template placeholders: ``<ns>`` the namespace; ``<shard>`` a registry shard's hash tag
    (``<ns>`` for shard 0, ``<ns>:r<j>`` for the others: :func:`shard_tags`); ``<id>`` an
    id (agent, client, caller identity, idempotency key, msg id, session id: braces
    removed); ``<cap>`` a capability; ``<priority>`` ``high``, ``normal`` or ``low``."""

    template: str
    type: str
    builder: str
    what: str

    @property
    def plane(self) -> str:
        """Which Redis holds keys of this form when a namespace keeps its control plane
        apart (``registry_url``): :data:`CONTROL` or :data:`DATA` (:data:`CONTROL_BUILDERS`)."""
        return CONTROL if self.builder in CONTROL_BUILDERS else DATA


CONTROL = "control"
"""The control plane: the registry, its events, rate limits, quotas, the audit trail and the
operator's access rules. On ``registry_url`` when one is set (docs/operations.md, *The
control plane apart*), else on the one Redis."""
DATA = "data"
"""The data plane: inboxes, task records, replies, delayed and scheduled sets, dead letters,
parked messages, cancel notices, sessions, the gateway's tasks. Always on ``redis_url``."""
CONTROL_BUILDERS = frozenset(
    {
        "agents_of", "agent", "cap_of", "caps_of", "events_of", "sweeper_lock_of",
        "reroute_of", "left_of", "limits", "rate_state", "agent_rate_state", "quotas",
        "audit", "access", "send_rate_state", "caller_rate_state", "splits",
    }
)  # fmt: skip
"""The :data:`LAYOUT` forms (by builder) of the control plane; every other form is data.
A script touches keys of one plane only: no script spans the two Redis servers."""


LAYOUT: tuple[KeyForm, ...] = (
    # registry shards
    KeyForm("reach:{<shard>}:agents", "zset", "agents_of",
            "agent id -> lease deadline (epoch ms) of the shard's agents (shadows too)"),
    KeyForm("reach:{<shard>}:agent:<id>", "hash", "agent", "an agent's record"),
    KeyForm("reach:{<shard>}:cap:<cap>", "set", "cap_of",
            "the shard's agents declaring the capability"),
    KeyForm("reach:{<shard>}:caps", "zset", "caps_of",
            "capability -> the shard's agents declaring it"),
    KeyForm("reach:{<shard>}:events", "stream", "events_of", "the shard's registry events"),
    KeyForm("reach:{<shard>}:lock:sweeper", "string", "sweeper_lock_of",
            "the shard's sweeper lock"),
    KeyForm("reach:{<shard>}:reroute", "set", "reroute_of",
            "evicted or deregistered agents of the shard whose inboxes are moved"),
    KeyForm("reach:{<shard>}:left", "zset", "left_of",
            "agent id -> when it deregistered (epoch ms): its inbox watched a while"),
    # the namespace's own slot (shard 0's)
    KeyForm("reach:{<ns>}:delayed", "zset", "delayed", "retry envelopes -> due (epoch ms)"),
    KeyForm("reach:{<ns>}:scheduled", "zset", "scheduled",
            "msg ids of scheduled sends -> due (epoch ms)"),
    KeyForm("reach:{<ns>}:scheduled:env", "hash", "scheduled_envelopes",
            "msg id of a scheduled send -> its sealed envelope"),
    KeyForm("reach:{<ns>}:dlq:<cap>", "stream", "dlq", "the capability's dead letters"),
    KeyForm("reach:{<ns>}:parked:<cap>", "stream", "parked",
            "messages waiting for an agent of the capability"),
    KeyForm("reach:{<ns>}:parked", "set", "parked_caps", "capabilities with parked messages"),
    KeyForm("reach:{<ns>}:splits", "hash", "splits",
            "capability -> its split of new sessions between application versions"),
    KeyForm("reach:{<ns>}:cancels", "stream", "cancels",
            "cancel notices (msg id, record key) every worker reads"),
    KeyForm("reach:{<ns>}:limits", "hash", "limits", "capability -> its rate limit"),
    KeyForm("reach:{<ns>}:rate:<cap>", "string", "rate_state",
            "the capability's rate limit state (GCRA TAT, µs)"),
    KeyForm("reach:{<ns>}:rate:<cap>:agent:<id>", "string", "agent_rate_state",
            "the state of the limit an agent declared on its handler (rate=)"),
    KeyForm("reach:{<ns>}:quotas", "hash", "quotas", "the namespace's quotas"),
    KeyForm("reach:{<ns>}:audit", "stream", "audit",
            "the audit trail: operator actions and audited calls (trimmed by age)"),
    KeyForm("reach:{<ns>}:access", "hash", "access",
            "the operator's allow/deny rules per capability, and their version"),
    KeyForm("reach:{<ns>}:recent", "stream", "recent",
            "the index of recently settled messages (packed rows)"),
    # the A2A gateway's task store (reach.gateway.store)
    KeyForm("reach:{<ns>}:gw:task:<id>", "hash", "gateway_task", "a gateway task"),
    KeyForm("reach:{<ns>}:gw:parts:<id>", "list", "gateway_task_parts",
            "the parts streamed into a gateway task since its last whole save"),
    KeyForm("reach:{<ns>}:gw:finished", "zset", "gateway_finished",
            "finished gateway tasks (task id and size) -> finish time (epoch ms)"),
    KeyForm("reach:{<ns>}:gw:bytes", "string", "gateway_bytes",
            "the bytes the finished gateway tasks hold"),
    KeyForm("reach:{<ns>}:gw:owned:<id>", "zset", "gateway_owned",
            "a caller's gateway tasks -> last save (epoch ms)"),
    # one slot per agent, client, caller, record
    KeyForm("reach:<ns>:{a:<id>}:in:<priority>", "stream", "inbox",
            "an agent's inbox of one priority"),
    KeyForm("reach:<ns>:{c:<id>}:replies", "stream", "replies", "a client's reply stream"),
    KeyForm("reach:<ns>:{q:<id>}:rate", "string", "send_rate_state",
            "a caller identity's send-rate quota state (GCRA TAT, µs)"),
    KeyForm("reach:<ns>:{h:<id>}:rate", "string", "caller_rate_state",
            "an HTTP face's caller's rate limit state (GCRA TAT, µs)"),
    KeyForm("reach:<ns>:{i:<id>}:idem", "hash", "idem",
            "a message's idempotency record (its task status, result, fence)"),
    KeyForm("reach:<ns>:{i:<id>}:chunks", "stream", "kept_chunks",
            "the chunks kept of a streamed message, for a resume (bounded)"),
    KeyForm("reach:<ns>:{t:<id>}:task", "string", "task",
            "msg id -> idempotency record key, for a caller-chosen idempotency key"),
    KeyForm("reach:<ns>:{s:<id>}:pins", "hash", "version_pins",
            "capability -> the application version a session's messages go to (a split)"),
    KeyForm("reach:<ns>:{s:<id>}:session", "hash", "session", "a session's values"),
    KeyForm("reach:<ns>:{s:<id>}:history", "list", "session_history", "a session's history"),
    KeyForm("reach:<ns>:{s:<id>}:version", "string", "session_version",
            "a session's write counter (what a cached copy follows)"),
    KeyForm("reach:<ns>:{x:<id>}:effects", "hash", "effects",
            "side-effect counters of test and chaos handlers"),
)  # fmt: skip

_PLACEHOLDERS = {
    "<shard>": "{ns}(?::r[0-9]+)?",
    "<ns>": "{ns}",
    "<id>": "[^{}]+",
    "<cap>": "[^{}:]+",
    "<priority>": "(?:" + "|".join(PRIORITIES) + ")",
}


def form_regex(form: KeyForm, namespace: str) -> re.Pattern[str]:
    """The regular expression matching exactly the keys of ``form`` in ``namespace``."""
    out = ""
    for part in re.split(r"(<[a-z]+>)", form.template):
        if part in _PLACEHOLDERS:
            out += _PLACEHOLDERS[part].replace("{ns}", re.escape(namespace))
        else:
            out += re.escape(part)
    return re.compile(out + r"\Z")


@functools.lru_cache(maxsize=64)
def _layout_regexes(namespace: str) -> tuple[tuple[KeyForm, re.Pattern[str]], ...]:
    return tuple((form, form_regex(form, namespace)) for form in LAYOUT)


def form_of(key: str, namespace: str) -> KeyForm | None:
    """The :data:`LAYOUT` form ``key`` has in ``namespace``; None for a key reach does not
    write (another version's, or someone else's under reach's prefix)."""
    for form, regex in _layout_regexes(namespace):
        if regex.match(key):
            return form
    return None


def plane_of(key: str, namespace: str) -> str | None:
    """The plane (:data:`CONTROL` or :data:`DATA`) of ``key`` in ``namespace``; None for a
    key reach does not write."""
    form = form_of(key, namespace)
    return None if form is None else form.plane


def scan_patterns(namespace: str) -> tuple[str, ...]:
    """SCAN patterns that together match every key of ``namespace`` (and only keys of the
    namespace's two prefixes): its shard-0 slot, its other registry shards, the rest."""
    ns = glob_escape(namespace)
    return (f"{PREFIX}:{{{ns}}}:*", f"{PREFIX}:{{{ns}:r*}}:*", f"{PREFIX}:{ns}:*")
