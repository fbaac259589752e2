"""The tenant map: tenant ids to the Redis and namespace that hold each tenant's messages
(docs/operations.md, *Tenants on their own Redis*).

A big tenant gets a Redis of its own; small ones share one, each in its own namespace (its
keys under its own prefix). The map is written in the project file::

    redis_url = "redis://shared:6379/0"     # what an entry without redis_url uses

    [tenants.acme]                          # acme: its own Redis, namespace "acme"
    redis_url = "redis://acme-redis:6379/0"

    [tenants.globex]
    redis_url_file = "/run/secrets/globex-redis-url"   # the URL kept out of the file
    namespace = "globex-prod"

    [tenants.default]                       # every other tenant id (optional)
    namespace = "t-{tenant}"                # its own namespace on the shared Redis

or given in code: ``reach.Client(tenants={"acme": ("redis://...", "acme")})`` (the key
``"default"`` is the default there too), or a :class:`Tenants`. Without a default an id
the map does not name is refused (:class:`~reach.errors.UnknownTenant`): a typo never
lands a tenant's messages on someone else's Redis.

:class:`TenantClients` is a :class:`~reach.Client`'s side: one inner client per tenant's
Redis and namespace, opened at its first call (with the client's own options) and closed
with the client; :func:`by_tenant` routes a call that names ``tenant=`` to it.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, Self, TypeVar, Union, cast

import anyio
import anyio.abc

from .config import (
    PROJECT_FILES,
    URL_KEY,
    read_project_file,
    read_secret_file,
    resolve_redis_url,
)
from .errors import ConfigError, NotStarted, UnknownTenant
from .keys import Keys

if TYPE_CHECKING:
    from .client import Client

ENV_TENANT = "REACH_TENANT"
TENANT_HEADER = "X-Reach-Tenant"
DEFAULT_TENANT = "default"
TABLE = "tenants"
PLACEHOLDER = "{tenant}"
MAX_TENANT_CHARS = 64
_TENANT_ID = re.compile(rf"[A-Za-z0-9][A-Za-z0-9_.-]{{0,{MAX_TENANT_CHARS - 1}}}")
_ENTRY_KEYS = ("redis_url", "redis_url_file", "namespace")


@dataclass(frozen=True)
class Tenant:
    """Where one tenant's messages are: a Redis URL and a namespace on it."""

    redis_url: str
    namespace: str


TenantSpec = Union[Tenant, tuple[str, str]]  # noqa: UP007 (a runtime alias)
TenantsOption = Union["Tenants", Mapping[str, TenantSpec], None]


def check_tenant_id(tenant: object, *, where: str = "tenant") -> str:
    """``tenant`` when it is a valid tenant id (a namespace's alphabet), else a
    :class:`ConfigError` saying what one looks like."""
    if not isinstance(tenant, str) or not _TENANT_ID.fullmatch(tenant):
        raise ConfigError(
            f"Invalid {where} {tenant!r}: use 1-{MAX_TENANT_CHARS} characters of a-z, A-Z, "
            "0-9, '-', '_' and '.', starting with a letter or digit, e.g. 'acme'."
        )
    return tenant


class Tenants:
    """A tenant map: tenant id -> :class:`Tenant`, and an optional default for the ids it
    does not name (the entry ``"default"``, whose namespace may hold ``{tenant}``: each
    tenant then gets a namespace of its own on the default's Redis).

    ``Tenants({"acme": ("redis://a:6379/0", "acme"), "default": ("redis://s:6379/0",
    "t-{tenant}")})``; :meth:`load` reads the project file's ``[tenants]``."""

    def __init__(self, tenants: Mapping[str, TenantSpec], *, source: str = "tenants=") -> None:
        self.source = source
        self._named: dict[str, Tenant] = {}
        self.default: Tenant | None = None
        for tid, spec in tenants.items():
            where = f"{source}: tenant {tid!r}"
            check_tenant_id(tid, where=f"tenant id in {source}")
            t = _as_tenant(spec, where)
            if PLACEHOLDER in t.namespace and tid != DEFAULT_TENANT:
                raise ConfigError(
                    f"{where}: only the default's namespace may hold {PLACEHOLDER} "
                    f"(got {t.namespace!r}); name this tenant's namespace."
                )
            try:
                Keys(t.namespace.replace(PLACEHOLDER, "x"))  # a namespace's alphabet
            except ConfigError as e:
                raise ConfigError(f"{where}: {e}") from None
            if tid == DEFAULT_TENANT:
                self.default = t
            else:
                self._named[tid] = t

    @classmethod
    def of(cls, value: TenantsOption) -> Tenants | None:
        """``value`` as a :class:`Tenants` (a mapping is checked; None stays None)."""
        if value is None or isinstance(value, Tenants):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(
                "tenants= takes a reach.Tenants or a mapping of tenant id -> "
                f"(redis_url, namespace), not {type(value).__name__}."
            )
        return cls(value)

    @classmethod
    def load(cls, start: Path | None = None) -> Tenants | None:
        """The tenant map of the nearest project file that has a ``[tenants]`` table (from
        ``start``, default the current directory, up to the root); None when none has."""
        f = find_tenant_file(start)
        return None if f is None else read_tenants(f)

    @property
    def ids(self) -> tuple[str, ...]:
        """The tenant ids the map names (the default apart), sorted."""
        return tuple(sorted(self._named))

    def resolve(self, tenant: str) -> Tenant:
        """Where ``tenant``'s messages are: its entry, else the default's (with
        ``{tenant}`` replaced), else :class:`UnknownTenant`."""
        check_tenant_id(tenant)
        t = self._named.get(tenant)
        if t is not None:
            return t
        if self.default is None:
            known = self.ids
            raise UnknownTenant(
                f"Unknown tenant {tenant!r}: the tenant map ({self.source}) names "
                f"{', '.join(known) or 'no tenant'} and has no default for the rest. Add "
                f"[tenants.{tenant}] (or a [tenants.default]) to the map.",
                tenant=tenant,
                known=known,
            )
        ns = self.default.namespace.replace(PLACEHOLDER, tenant)
        Keys(ns)  # a namespace too long once the id is in it is refused here
        return Tenant(self.default.redis_url, ns)

    def targets(self) -> dict[str, Tenant]:
        """Every entry: the named tenants, then ``"default"`` when there is one (its
        namespace as written, ``{tenant}`` included)."""
        out = dict(sorted(self._named.items()))
        if self.default is not None:
            out[DEFAULT_TENANT] = self.default
        return out

    def __repr__(self) -> str:
        return f"Tenants({', '.join(self.targets())}; from {self.source})"


def _as_tenant(spec: object, where: str) -> Tenant:
    if isinstance(spec, Tenant):
        t = spec
    elif isinstance(spec, tuple) and len(spec) == 2:
        t = Tenant(*spec)
    else:
        raise ConfigError(f"{where}: give (redis_url, namespace) or a reach.Tenant, not {spec!r}.")
    if not isinstance(t.redis_url, str) or not t.redis_url.strip():
        raise ConfigError(f"{where}: redis_url must be a non-empty string, not {t.redis_url!r}.")
    if not isinstance(t.namespace, str):
        raise ConfigError(f"{where}: namespace must be a string, not {t.namespace!r}.")
    return Tenant(t.redis_url.strip(), t.namespace)


# -- the project file -----------------------------------------------------------------------
def find_tenant_file(start: Path | None = None) -> Path | None:
    """The nearest project file (reach.toml, .reach/config) with a ``[tenants]`` table."""
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        for name in PROJECT_FILES:
            f = d / name
            if f.is_file() and TABLE in read_project_file(f):
                return f
    return None


def read_tenants(path: Path) -> Tenants:
    """The ``[tenants]`` of the project file ``path``; every mistake is a
    :class:`ConfigError` naming the file, the table and what is wrong."""
    data = read_project_file(path)
    table = data.get(TABLE)
    if not isinstance(table, dict):
        raise ConfigError(
            f"{path}: {TABLE} must be a table of tenants ([tenants.acme] with redis_url "
            f"and namespace), not {table!r}."
        )
    top_url = data.get(URL_KEY)
    specs: dict[str, TenantSpec] = {}
    for tid, entry in table.items():
        where = f"{path}: [tenants.{tid}]"
        check_tenant_id(tid, where=f"tenant id [tenants.{tid}] in {path}")
        if not isinstance(entry, dict):
            raise ConfigError(
                f"{where} must be a table (redis_url = ..., namespace = ...), not {entry!r}."
            )
        unknown = sorted(set(entry) - set(_ENTRY_KEYS))
        if unknown:
            raise ConfigError(
                f"{where}: unknown setting {', '.join(unknown)}; a tenant takes "
                f"{', '.join(_ENTRY_KEYS)}."
            )
        for k in _ENTRY_KEYS:
            if k in entry and (not isinstance(entry[k], str) or not entry[k].strip()):
                raise ConfigError(f"{where}: {k} must be a non-empty string, not {entry[k]!r}.")
        if "redis_url" in entry and "redis_url_file" in entry:
            raise ConfigError(f"{where}: give redis_url or redis_url_file, not both.")
        if "redis_url_file" in entry:
            f = Path(os.path.expanduser(entry["redis_url_file"]))
            url = read_secret_file(f if f.is_absolute() else path.parent / f)
        elif "redis_url" in entry:
            url = entry["redis_url"]
        elif isinstance(top_url, str):
            url = top_url
        else:
            raise ConfigError(
                f"{where} names no Redis: give it redis_url (or redis_url_file), or put a "
                f"top-level {URL_KEY} in {path} for the tenants that share one."
            )
        ns = entry.get("namespace")
        if ns is None:
            ns = PLACEHOLDER if tid == DEFAULT_TENANT else tid
        specs[tid] = Tenant(url, ns.strip())
    return Tenants(specs, source=str(path))


# -- a Client's tenants -----------------------------------------------------------------------
class TenantClients:
    """The inner clients of a :class:`~reach.Client` made with ``tenants=`` (or asked for
    a ``tenant=`` with a project file's map): one per Redis and namespace, made with the
    client's own options at its first call, closed with the client. A tenant that maps to
    the client's own Redis and namespace is the client itself."""

    def __init__(self, owner: Client, tenants: TenantsOption, options: Mapping[str, Any]) -> None:
        self._owner = owner
        self._map = Tenants.of(tenants)
        self._options = {k: v for k, v in options.items() if k not in ("self", "tenants")}
        self._open: dict[Tenant, Client] = {}
        self._locks: dict[Tenant, anyio.Lock] = {}
        self._stops: list[tuple[anyio.Event, anyio.Event]] = []

    @property
    def map(self) -> Tenants:
        """The tenant map (``tenants=``, else the project file's, read at first use)."""
        if self._map is None:
            self._map = Tenants.load()
            if self._map is None:
                raise ConfigError(
                    "tenant= needs a tenant map: pass reach.Client(tenants=...) or add "
                    f"[tenants.<id>] tables to reach.toml ({', '.join(PROJECT_FILES)} here "
                    "or in a parent have none)."
                )
        return self._map

    def resolve(self, tenant: str) -> Tenant:
        return self.map.resolve(tenant)

    def own(self, redis_url: str | None, namespace: str) -> tuple[str, str]:
        """The client's own Redis URL and namespace (its calls without ``tenant=``): found
        as without tenants (``redis_url=``, ``REACH_REDIS_URL``, the project file's
        ``redis_url``); where none is, the tenant ``default``'s, when the map (given, or
        the project file's) has one, with its namespace unless ``namespace`` names one."""
        try:
            return resolve_redis_url(redis_url), namespace
        except ConfigError as e:
            found = self._map or Tenants.load()
            if found is None:
                raise
            try:
                t = found.resolve(DEFAULT_TENANT)
            except UnknownTenant:
                raise ConfigError(
                    f"{e} A Client with a tenant map has a Redis of its own too, for the "
                    f"calls without tenant=: pass redis_url=, or give the map ({found.source}) "
                    "a default."
                ) from None
            self._map = found
            named = namespace != "default"  # the Client's own default: none was named
            return t.redis_url, (namespace if named else t.namespace)

    async def client(self, tenant: str) -> Client:
        """The started client of ``tenant``'s Redis and namespace."""
        t = self.resolve(tenant)
        owner = self._owner
        if owner.redis_url == t.redis_url and owner.namespace == t.namespace:
            return owner
        inner = self._open.get(t)
        if inner is not None:
            return inner
        lock = self._locks.setdefault(t, anyio.Lock())
        async with lock:
            inner = self._open.get(t)
            if inner is None:
                tg = owner._tg
                if tg is None:
                    raise NotStarted("Client is not started: use `async with reach.Client(...)`.")
                opts = dict(self._options)
                opts.update(redis_url=t.redis_url, namespace=t.namespace, redis=None)
                opts["breakers"] = None  # a breaker listens to one client's routing
                inner = type(owner)(**opts)
                # Entered and left in a task of the owner's, whichever task called first:
                # a task group is left in the task that entered it.
                await tg.start(self._keep, inner, t)
        return inner

    async def _keep(
        self, inner: Client, t: Tenant, *, task_status: anyio.abc.TaskStatus[None]
    ) -> None:
        stop, done = anyio.Event(), anyio.Event()
        try:
            async with inner:
                self._open[t] = inner
                self._stops.append((stop, done))
                task_status.started()
                await stop.wait()
        finally:
            self._open.pop(t, None)
            done.set()

    @property
    def opened(self) -> dict[Tenant, Client]:
        """The inner clients open now."""
        return dict(self._open)

    async def aclose(self) -> None:
        """Close the inner clients (each in the task that opened it), newest first."""
        stops, self._stops = self._stops, []
        for stop, _ in stops:
            stop.set()
        with anyio.CancelScope(shield=True):
            for _, done in reversed(stops):
                await done.wait()


P = ParamSpec("P")
R = TypeVar("R")


def by_tenant(
    fn: Callable[P, Coroutine[Any, Any, R]],
) -> Callable[P, Coroutine[Any, Any, R]]:
    """A client method that takes ``tenant=``: named, the call runs on that tenant's
    client (:class:`TenantClients`), else on the client itself. Without a tenant the
    method's own coroutine is returned as it is: no extra frame on the message path."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> Coroutine[Any, Any, R]:
        tenant = kwargs.pop("tenant", None)
        if tenant is None:
            return fn(*args, **kwargs)
        return _on_tenant(fn, cast(str, tenant), args, kwargs)

    return wrapper


async def _on_tenant(
    fn: Callable[..., Coroutine[Any, Any, R]],
    tenant: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> R:
    me = cast("Client", args[0])
    inner = await me.tenants.client(tenant)
    return await fn(inner, *args[1:], **kwargs)


def by_tenant_lazily(fn: Callable[P, R]) -> Callable[P, R]:
    """:func:`by_tenant` for a method that returns an async iterator at once
    (:meth:`~reach.Client.stream`): with ``tenant=`` it returns a :class:`Deferred` that
    opens the tenant's client at its first iteration (or ``async with``, ``start()``)."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        tenant = kwargs.pop("tenant", None)
        if tenant is None:
            return fn(*args, **kwargs)
        me = cast("Client", args[0])
        me.tenants.resolve(cast(str, tenant))  # an unknown tenant is refused at once

        async def make() -> Any:
            inner = await me.tenants.client(cast(str, tenant))
            return fn(*(inner, *args[1:]), **kwargs)  # type: ignore[arg-type]

        return cast(R, Deferred(make))

    return wrapper


class Deferred:
    """An async iterator (a :class:`~reach.Stream`) made on a tenant's client once that
    client is open: at the first iteration, ``async with`` or
    :meth:`start`. Its other attributes (``msg_id``, ``result``, ``seq``...) are the inner
    iterator's, there once it is made."""

    def __init__(self, make: Callable[[], Awaitable[Any]]) -> None:
        self._make = make
        self._inner: Any = None

    async def _get(self) -> Any:
        if self._inner is None:
            self._inner = await self._make()
        return self._inner

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Any:
        inner = await self._get()
        if not hasattr(inner, "__anext__"):
            self._inner = inner = inner.__aiter__()
        return await inner.__anext__()

    async def __aenter__(self) -> Self:
        inner = await self._get()
        if hasattr(inner, "__aenter__"):
            await inner.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._inner is not None and hasattr(self._inner, "__aexit__"):
            await self._inner.__aexit__(*exc)

    async def start(self) -> None:
        inner = await self._get()
        if hasattr(inner, "start"):
            await inner.start()

    async def aclose(self) -> None:
        if self._inner is not None and hasattr(self._inner, "aclose"):
            await self._inner.aclose()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if self._inner is None:
            raise AttributeError(
                f"{name!r} is there once the tenant's client is open: iterate first, or "
                "`await it.start()` (a stream) / use `async with`."
            )
        return getattr(self._inner, name)
