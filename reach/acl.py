"""Least-privilege Redis users for a namespace: the roles, what each may run, and the
``ACL SETUSER`` line that grants exactly that (``reach acl``); ``reach doctor`` checks a
user against the same tables (:func:`role_commands`), so the two cannot disagree.

Roles:

* ``agent`` - a worker process (``reach worker``, ``Agent.run``): registers, heartbeats,
  reads its inboxes, settles, answers, sweeps;
* ``caller`` - a :class:`reach.Client` (and ``reach send`` / ``reach task``): reads the
  registry, writes inboxes, reads its own reply stream;
* ``operator`` - the CLI's looking and repairing (``reach agents``, ``caps``, ``queues``,
  ``dlq``, ``events``, ``sweep``, ``top``, ``doctor``, ``quota``).

Keys: every role gets the keys of its namespace and nothing else. The patterns are derived
from :class:`reach.keys.Keys` (the part of a key before anything variable, up to its hash
tag), so they follow the key scheme, and each is exact enough that no other namespace's
key matches it: ``reach:{ns}:*`` and ``reach:{ns:r<j>}:*`` (the registry shards of a
standalone Redis and of a Cluster: exact tags, since a namespace ``ns:rx`` is valid but
``ns:r<digits>`` is reserved) and ``reach:ns:{*`` (per-agent, per-client and per-record
slots: the ``{`` right after ``ns:`` is what keeps ``ns:x`` and ``nsx`` out, neither can
have a key starting ``reach:ns:{``). Channels: ``reach:ns:{*`` only, the agents' wake-up
channels on a Cluster (sharded pub/sub, named as inbox streams).

Scripts: Redis ACLs cannot restrict which script a user runs (``EVALSHA`` and ``SCRIPT
LOAD`` are all or nothing), but a script runs with its caller's permissions: each command
it calls is checked against the user's commands and key patterns. So the lists below
include the commands reach's scripts call, and a script cannot reach past the namespace.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import quote

from .errors import ConfigError
from .keys import CLUSTER_SHARDS, GROUP, PRIORITIES, Keys

ROLES: tuple[str, ...] = ("agent", "caller", "operator")
ROLE_HELP = {
    "agent": "a worker process (reach worker, Agent.run)",
    "caller": "a reach.Client (and reach send, reach task)",
    "operator": "the CLI's looking and repairing (agents, caps, queues, dlq, events, "
    "sweep, top, doctor, quota)",
}

# The commands every role runs: the connection's own, reading the registry, and scripts
# (a script's commands are checked against the user's ACL as if sent one by one).
_COMMON = (
    "ping",
    "info",
    "time",
    "client|setname",
    "evalsha",
    "script|load",
    "hgetall",
    "hmget",
    "hlen",  # send.lua: is a record there (and a hash) before it writes one
    "smembers",
    "zrange",
    "zrangebyscore",
    "xread",
    "xrevrange",
    "get",
    "type",
    # a Redis Cluster client: the slot map and the key positions of each command
    "cluster|slots",
    "command",
)

# A Client (and reach send / task): send.lua's commands, its reply stream's
_CALLER = (
    *_COMMON,
    "xadd",
    "xtrim",  # the audit trail's retention (reach.audit): a cancel, an answer are recorded
    "xdel",
    "xinfo|stream",
    "xlen",
    "set",
    "exists",
    "hset",
    "hsetnx",
    "copy",  # send.lua's batch form: a fresh record like the one before it is a copy of it
    "sadd",
    "zadd",
    "pexpire",
    # the wake-up of an agent waiting on a Cluster (enqueue.lua, an unbounded send); a
    # task's changes announced by cancel.lua, followed by client.watch / reach task -f
    "spublish",
    "ssubscribe",
    "sunsubscribe",
    # count_agents.lua: the registry's figures a NoAgentAvailable for an unknown
    # capability gives (reads only, of keys the role reads already)
    "zcard",
    "zrandmember",
    # a scheduled send (schedule.lua: is it there already?) and its cancel (unschedule.lua)
    "zscore",
    "zrem",
    "hdel",
    # the A2A gateway, a caller with a task store in the namespace (reach/gateway/store.py):
    # a task's owner, the chunks of its stream (a list), the store's byte count, a caller's
    # task list, a task dropped or deleted. DEL ends no more than PEXPIRE already could.
    "hget",
    "hincrby",
    "rpush",
    "lrange",
    "incrby",
    "decrby",
    "zrevrange",
    "zremrangebyscore",
    "del",
    "multi",  # its saves and trims are transactions (each command in them checked as well)
    "exec",
)

# Per role, the commands reach runs (from ACL LOG of a worker, a client and every CLI
# command run under least-privilege users: tests/integration/test_acl_roles.py), the
# scripts' own commands included.
_ROLE_COMMANDS: dict[str, tuple[str, ...]] = {
    "agent": (
        *_COMMON,
        "xgroup|create",
        "xreadgroup",
        "xack",
        "xdel",
        "xpending",
        "xlen",
        "xadd",
        # the sweeper an agent's process runs reads in ranges: a gone agent's inbox it
        # moves, the parked messages it releases
        "xrange",
        "xtrim",  # the audit trail of audited capabilities' calls (reach.audit)
        "hset",
        "hsetnx",
        "copy",  # its handlers' sends: send.lua's batch form (as a caller's)
        "set",
        "exists",
        "del",
        "pexpire",
        "sadd",
        "srem",
        "scard",
        "zadd",
        "zrem",
        "zcard",
        "zrandmember",
        # the sweeper's agents in their grace after leaving (when each left: S:left)
        "zscore",
        "zmscore",
        "xinfo|stream",  # the sweeper's look at inboxes
        # a handler's session store (ctx.session)
        "hget",
        "hdel",
        "rpush",
        "ltrim",
        "lrange",
        "llen",
        "incr",  # its version (session_write.lua), announced to the agents caching it
        "publish",
        "subscribe",  # the 'cached' tier hears every session write of its namespace
        "unsubscribe",
        # agents of one process waiting together: one XREAD, restarted when one joins
        "client|id",
        "client|unblock",
        # on a Cluster: its wake-ups (sharded pub/sub), and an agent's sends publish them
        "ssubscribe",
        "sunsubscribe",
        "spublish",
    ),
    "caller": _CALLER,
    "operator": (
        *_CALLER,  # reach dlq replay sends again, as a caller does
        "scan",  # reach queues, dlq list, doctor: the namespace's inboxes and dead letters
        "xrange",
        "xpending",
        "xinfo|groups",
        "del",
        "zcard",
        # reach sweep: the sweeper's chores (sweep.lua, moving evicted agents' inboxes)
        "zrem",
        "srem",
        "scard",
        "zrandmember",
        "zscore",  # reach sweep: agents in their grace after leaving
        "zmscore",
        "hdel",  # reach caps limit --clear, reach quota clear
        "hget",  # reach sweep: a due scheduled send's envelope (take_due.lua)
        "client|list",  # reach dlq replay: is the caller still connected?
        "script|exists",  # reach doctor: the script cache
        "acl|whoami",  # reach doctor: which user to check
        "cluster|info",  # reach doctor: are the slots covered
    ),
}


@dataclass(frozen=True)
class _Sample:
    """Keys of the namespace for :func:`role_commands`' probes."""

    inbox: str
    wake: str
    replies: str
    agent: str
    agents: str
    cap: str
    idem: str
    task: str
    dlq: str
    events: str
    scan: str
    session: str
    history: str
    version: str
    changes: str


def _sample(keys: Keys) -> _Sample:
    probe = "doctor-probe"
    return _Sample(
        inbox=keys.inbox(probe, PRIORITIES[1]),
        wake=keys.wake(probe),
        replies=keys.replies(probe),
        agent=keys.agent(probe),
        agents=keys.agents,
        cap=keys.cap("doctor.probe"),
        idem=keys.idem(probe),
        task=keys.task(probe),
        dlq=keys.dlq("doctor.probe"),
        events=keys.events,
        scan=keys.inbox_pattern,
        session=keys.session(probe),
        history=keys.session_history(probe),
        version=keys.session_version(probe),
        changes=keys.session_changes,
    )


_SHA = "0" * 40
# ACL command name -> a call of it (for ACL DRYRUN), with a key of the namespace when the
# command takes one, so DRYRUN checks the key patterns too.
_PROBES: dict[str, Callable[[_Sample], tuple[str, ...]]] = {
    "ping": lambda s: ("PING",),
    "info": lambda s: ("INFO", "server"),
    "time": lambda s: ("TIME",),
    "client|setname": lambda s: ("CLIENT", "SETNAME", "reach"),
    "client|id": lambda s: ("CLIENT", "ID"),
    "client|unblock": lambda s: ("CLIENT", "UNBLOCK", "1"),
    "spublish": lambda s: ("SPUBLISH", s.wake, ""),
    "publish": lambda s: ("PUBLISH", s.changes, ""),
    "subscribe": lambda s: ("SUBSCRIBE", s.changes),
    "unsubscribe": lambda s: ("UNSUBSCRIBE", s.changes),
    "ssubscribe": lambda s: ("SSUBSCRIBE", s.wake),
    "sunsubscribe": lambda s: ("SUNSUBSCRIBE", s.wake),
    "client|list": lambda s: ("CLIENT", "LIST"),
    "evalsha": lambda s: ("EVALSHA", _SHA, "1", s.inbox),
    "script|load": lambda s: ("SCRIPT", "LOAD", "return 1"),
    "hgetall": lambda s: ("HGETALL", s.agent),
    "hmget": lambda s: ("HMGET", s.agent, "state"),
    "hlen": lambda s: ("HLEN", s.idem),
    "hset": lambda s: ("HSET", s.agent, "f", "v"),
    "hsetnx": lambda s: ("HSETNX", s.idem, "f", "v"),
    "copy": lambda s: ("COPY", s.idem, s.task),
    "smembers": lambda s: ("SMEMBERS", s.cap),
    "sadd": lambda s: ("SADD", s.cap, "x"),
    "srem": lambda s: ("SREM", s.cap, "x"),
    "scard": lambda s: ("SCARD", s.cap),
    "zrange": lambda s: ("ZRANGE", s.agents, "0", "-1"),
    "zrangebyscore": lambda s: ("ZRANGEBYSCORE", s.agents, "0", "1"),
    "zadd": lambda s: ("ZADD", s.agents, "1", "x"),
    "zrem": lambda s: ("ZREM", s.agents, "x"),
    "zcard": lambda s: ("ZCARD", s.agents),
    "zrandmember": lambda s: ("ZRANDMEMBER", s.agents),
    "zscore": lambda s: ("ZSCORE", s.agents, "x"),
    "zmscore": lambda s: ("ZMSCORE", s.agents, "x"),
    "zrevrange": lambda s: ("ZREVRANGE", s.agents, "0", "-1"),
    "zremrangebyscore": lambda s: ("ZREMRANGEBYSCORE", s.agents, "0", "1"),
    "xread": lambda s: ("XREAD", "STREAMS", s.events, "0"),
    "xrevrange": lambda s: ("XREVRANGE", s.inbox, "+", "-", "COUNT", "1"),
    "xrange": lambda s: ("XRANGE", s.dlq, "-", "+"),
    "xadd": lambda s: ("XADD", s.replies, "*", "f", "v"),
    "xdel": lambda s: ("XDEL", s.inbox, "0-1"),
    "xtrim": lambda s: ("XTRIM", s.dlq, "MAXLEN", "~", "1000"),
    "xlen": lambda s: ("XLEN", s.inbox),
    "xack": lambda s: ("XACK", s.inbox, GROUP, "0-1"),
    "xpending": lambda s: ("XPENDING", s.inbox, GROUP),
    "xgroup|create": lambda s: ("XGROUP", "CREATE", s.inbox, GROUP, "$", "MKSTREAM"),
    "xreadgroup": lambda s: (
        "XREADGROUP",
        "GROUP",
        GROUP,
        "c",
        "COUNT",
        "1",
        "STREAMS",
        s.inbox,
        ">",
    ),
    "xinfo|stream": lambda s: ("XINFO", "STREAM", s.replies),
    "xinfo|groups": lambda s: ("XINFO", "GROUPS", s.inbox),
    "hget": lambda s: ("HGET", s.session, "k"),
    "hdel": lambda s: ("HDEL", s.session, "k"),
    "hincrby": lambda s: ("HINCRBY", s.session, "k", "1"),
    "incrby": lambda s: ("INCRBY", s.task, "1"),
    "decrby": lambda s: ("DECRBY", s.task, "1"),
    "multi": lambda s: ("MULTI",),
    "exec": lambda s: ("EXEC",),
    "rpush": lambda s: ("RPUSH", s.history, "v"),
    "ltrim": lambda s: ("LTRIM", s.history, "0", "9"),
    "lrange": lambda s: ("LRANGE", s.history, "0", "-1"),
    "llen": lambda s: ("LLEN", s.history),
    "incr": lambda s: ("INCR", s.version),
    "script|exists": lambda s: ("SCRIPT", "EXISTS", _SHA),
    "acl|whoami": lambda s: ("ACL", "WHOAMI"),
    "get": lambda s: ("GET", s.task),
    "type": lambda s: ("TYPE", s.task),
    "set": lambda s: ("SET", s.idem, "v"),
    "exists": lambda s: ("EXISTS", s.idem),
    "del": lambda s: ("DEL", s.idem),
    "pexpire": lambda s: ("PEXPIRE", s.idem, "1000"),
    "scan": lambda s: ("SCAN", "0", "MATCH", s.scan),
    "cluster|slots": lambda s: ("CLUSTER", "SLOTS"),
    "cluster|info": lambda s: ("CLUSTER", "INFO"),
    "command": lambda s: ("COMMAND", "COUNT"),
}


def check_role(role: str) -> str:
    if role not in ROLES:
        raise ConfigError(f"Unknown role {role!r}: use one of {', '.join(ROLES)}.")
    return role


def commands_of(role: str) -> tuple[str, ...]:
    """The ACL command names (``xadd``, ``client|setname``) ``role`` needs, each once."""
    return tuple(dict.fromkeys(_ROLE_COMMANDS[check_role(role)]))


def role_probes(keys: Keys) -> dict[str, list[tuple[str, tuple[str, ...]]]]:
    """Per role, each command it needs as (ACL name, a call of it with a key of the
    namespace): ``ACL DRYRUN`` of the call checks the command and the key patterns."""
    s = _sample(keys)
    return {role: [(c, _PROBES[c](s)) for c in commands_of(role)] for role in ROLES}


def role_commands(keys: Keys) -> dict[str, list[tuple[str, ...]]]:
    """Per role, one call of each command it needs (:func:`role_probes` without names)."""
    return {role: [call for _, call in probes] for role, probes in role_probes(keys).items()}


def key_patterns(namespace: str) -> list[str]:
    """The key patterns (without ``~``) matching every key of ``namespace`` and no key of
    any other namespace: one per registry shard tag (standalone and Cluster shard counts),
    and one for the per-agent, per-client and per-record slots. Derived from
    :class:`Keys`: the shard keys up to their hash tag, the others up to their ``{``."""
    base = Keys(namespace)
    if any(c.isspace() for c in base.namespace):
        # ACL SETUSER refuses a space in a key pattern, and '?' in its place would also
        # match other namespaces ('a?b': 'a_b' too)
        raise ConfigError(
            f"Namespace {base.namespace!r} holds white space, which Redis ACL key patterns "
            "cannot hold: a user cannot be confined to it. Use a namespace without spaces "
            "(e.g. 'team-a') for ACL users."
        )
    pats: list[str] = []
    for shards in dict.fromkeys((1, CLUSTER_SHARDS)):
        keys = Keys(base.namespace, shards)
        for k in range(shards):
            key = keys.agents_of(k)
            pats.append(key[: key.index("}") + 1] + ":*")
    record = base.task("x")
    pats.append(record[: record.index("{") + 1] + "*")
    return list(dict.fromkeys(pats))


def channel_pattern(namespace: str) -> str:
    """The pub/sub channels of ``namespace`` (without ``&``): the agents' wake-up channels
    (:meth:`Keys.wake`, named as an inbox stream), so the per-agent slot pattern."""
    key_patterns(namespace)  # the same checks of the namespace
    wake = Keys(namespace).wake("x")
    return wake[: wake.index("{") + 1] + "*"


def default_user(namespace: str, role: str) -> str:
    """``reach-<ns>-<role>``, the namespace percent-encoded where Redis refuses a character
    in a user name (a space) or it could confuse (``%`` itself, quotes): one name per
    namespace, so two namespaces never share (and overwrite) a user."""
    ns = quote(Keys(namespace).namespace, safe="!#$&()*+,./:;<=>?@[]^_`{|}~-")
    return f"reach-{ns}-{check_role(role)}"


def rules(namespace: str, role: str, *, password: str | None = None) -> list[str]:
    """The ``ACL SETUSER`` rules (after the user name) for ``role`` in ``namespace``:
    reset, on, the password as its SHA-256 (never in clear; none: the user cannot log in
    until one is added), the key patterns, the namespace's channels, no command but the
    role's."""
    out = ["reset", "on"]
    if password is not None:
        out.append("#" + hashlib.sha256(password.encode("utf-8")).hexdigest())
    out += [f"~{p}" for p in key_patterns(namespace)]
    out += ["resetchannels", f"&{channel_pattern(namespace)}", "-@all"]
    out += [f"+{c}" for c in commands_of(role)]
    return out


def setuser_line(user: str, rule_list: Sequence[str]) -> str:
    """``ACL SETUSER user rule ...`` as one line ``redis-cli`` reads (a word holding a
    space or a quote is quoted)."""
    return " ".join(_quote(w) for w in ("ACL", "SETUSER", user, *rule_list))


def _quote(word: str) -> str:
    if word and not any(c.isspace() or c in "\"'\\" for c in word):
        return word
    escaped = word.replace("\\", "\\\\").replace('"', '\\"')
    escaped = escaped.replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
    return f'"{escaped}"'
