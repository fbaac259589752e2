"""Every Redis key reach uses is built here, and only here.

Layout (``ns`` is the namespace, ids are stripped of ``{``/``}`` first):

* registry of a namespace, one hash slot per namespace::

    reach:{ns}:agents            zset  agent_id -> lease expiry (epoch ms)
    reach:{ns}:agent:<id>        hash  the agent record
    reach:{ns}:cap:<cap>         set   agent ids that declare <cap>
    reach:{ns}:caps              zset  capability -> number of agents declaring it
    reach:{ns}:events            stream registry events (bounded)
    reach:{ns}:lock:sweeper      string the sweeper lock
    reach:{ns}:delayed           zset  retry envelopes due at (epoch ms)
    reach:{ns}:dlq:<cap>         stream dead letters of <cap>
    reach:{ns}:parked:<cap>      stream messages waiting for an agent of <cap>
    reach:{ns}:parked            set   capabilities with parked messages
    reach:{ns}:reroute           set   evicted agents whose inbox is still to be moved

* an agent's inbox, one slot per agent::

    reach:ns:{a:<id>}:in:high | :in:normal | :in:low

* a client's reply stream, one slot per client::

    reach:ns:{c:<id>}:replies

* idempotency / task / session records, each in the slot of its own id.

Redis Cluster hashes only the part between the first ``{`` and the next ``}``, so
ids must never carry braces: :func:`clean_id` removes them.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ConfigError

PREFIX = "reach"
PRIORITIES: tuple[str, ...] = ("high", "normal", "low")
GROUP = "reach"  # the one consumer group on every inbox stream


def clean_id(value: str) -> str:
    """Return ``value`` with the hash-tag characters ``{`` and ``}`` removed."""
    return value.replace("{", "").replace("}", "")


@dataclass(frozen=True, slots=True)
class Keys:
    """The key builder for one namespace."""

    namespace: str

    def __post_init__(self) -> None:
        ns = clean_id(self.namespace)
        # A namespace goes into SCAN patterns (queues, dead letters): a glob character in
        # it would reach other namespaces' keys ('*' would purge every namespace's).
        if not ns or any(c in ns for c in "*?[]\\") or not ns.isprintable():
            raise ConfigError(
                f"Invalid namespace {self.namespace!r}: use a non-empty name without "
                "'*', '?', '[', ']', '\\' or control characters, e.g. 'prod' or 'team-a'."
            )
        object.__setattr__(self, "namespace", ns)

    # -- registry slot: reach:{ns}:... -------------------------------------------------
    @property
    def _reg(self) -> str:
        return f"{PREFIX}:{{{self.namespace}}}"

    @property
    def agents(self) -> str:
        return f"{self._reg}:agents"

    def agent(self, agent_id: str) -> str:
        return f"{self._reg}:agent:{clean_id(agent_id)}"

    @property
    def agent_prefix(self) -> str:
        """Prefix of every agent hash; Lua scripts append an agent id to it."""
        return f"{self._reg}:agent:"

    def cap(self, capability: str) -> str:
        return f"{self._reg}:cap:{capability}"

    @property
    def cap_prefix(self) -> str:
        """Prefix of every capability set; Lua scripts append a capability to it."""
        return f"{self._reg}:cap:"

    @property
    def caps(self) -> str:
        return f"{self._reg}:caps"

    @property
    def events(self) -> str:
        return f"{self._reg}:events"

    @property
    def sweeper_lock(self) -> str:
        return f"{self._reg}:lock:sweeper"

    @property
    def delayed(self) -> str:
        return f"{self._reg}:delayed"

    def dlq(self, capability: str) -> str:
        return f"{self._reg}:dlq:{capability}"

    @property
    def dlq_pattern(self) -> str:
        """SCAN pattern matching every dead-letter stream of the namespace."""
        return f"{self._reg}:dlq:*"

    def capability_of_dlq(self, key: str) -> str:
        """Inverse of :meth:`dlq`."""
        return key[len(f"{self._reg}:dlq:") :]

    def parked(self, capability: str) -> str:
        return f"{self._reg}:parked:{capability}"

    @property
    def parked_caps(self) -> str:
        """Set of capabilities that have parked messages."""
        return f"{self._reg}:parked"

    @property
    def reroute(self) -> str:
        """Set of evicted agents whose inboxes still have to be moved to live agents."""
        return f"{self._reg}:reroute"

    # -- per-agent slot ---------------------------------------------------------------
    def inbox(self, agent_id: str, priority: str) -> str:
        return f"{PREFIX}:{self.namespace}:{{a:{clean_id(agent_id)}}}:in:{priority}"

    def inboxes(self, agent_id: str) -> list[str]:
        """The three priority streams of an agent, highest first."""
        return [self.inbox(agent_id, p) for p in PRIORITIES]

    # -- per-client slot --------------------------------------------------------------
    def replies(self, client_id: str) -> str:
        return f"{PREFIX}:{self.namespace}:{{c:{clean_id(client_id)}}}:replies"

    # -- per-record slots -------------------------------------------------------------
    def idem(self, idempotency_key: str) -> str:
        return f"{PREFIX}:{self.namespace}:{{i:{clean_id(idempotency_key)}}}:idem"

    def task(self, msg_id: str) -> str:
        return f"{PREFIX}:{self.namespace}:{{t:{clean_id(msg_id)}}}:task"

    def session(self, session_id: str) -> str:
        return f"{PREFIX}:{self.namespace}:{{s:{clean_id(session_id)}}}:session"

    def session_history(self, session_id: str) -> str:
        return f"{PREFIX}:{self.namespace}:{{s:{clean_id(session_id)}}}:history"

    def effects(self, name: str) -> str:
        """A counter hash for test and chaos handlers that count side effects."""
        return f"{PREFIX}:{self.namespace}:{{x:{clean_id(name)}}}:effects"

    # -- scanning ---------------------------------------------------------------------
    @property
    def inbox_pattern(self) -> str:
        """SCAN pattern matching every inbox stream of the namespace."""
        return f"{PREFIX}:{self.namespace}:{{a:*}}:in:*"

    def agent_id_of_inbox(self, key: str) -> str:
        """Inverse of :meth:`inbox`: the agent id inside an inbox key."""
        start = key.index("{a:") + 3
        return key[start : key.index("}", start)]
