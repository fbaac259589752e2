"""A Client's connection to its namespace's control plane (:mod:`reach.planes`).

With no ``registry_url`` the control plane is the data Redis and this holds nothing: every
call goes through the Client's one auto-pipelined client. With one, the registry view,
the rate limits, the quotas and the access rules a Client reads go through an
auto-pipelined client of that Redis, opened and closed with the Client.
"""

from __future__ import annotations

from ._autopipe import AutoPipeline
from .connection import AnyRedis, connect, redact
from .planes import resolve_registry_url


class ControlPlane:
    """Where one Client's control-plane calls go.

    ``url``: ``registry_url=`` (resolved as :func:`reach.planes.resolve_registry_url`
    says, unless ``redis`` is given); ``redis``: a connection to it made by someone else
    (a worker's agents share their process's), used as it is and never closed here;
    ``resolve``: False for a Client given its data connection (``redis=``), which takes
    no registry URL from the environment either."""

    def __init__(
        self, url: str | None, redis: AnyRedis | None, data_url: str, resolve: bool
    ) -> None:
        self.url = None
        if redis is None and (url or resolve):
            self.url = resolve_registry_url(url, data_url=data_url or None)
        self._given = redis
        self._raw: AnyRedis | None = None
        self._auto: AutoPipeline | None = None

    def label(self, data_url: str) -> str:
        """How an outage message names the Redis: ``data_url`` (redacted), and the control
        plane's too when it is apart (either being away holds a send)."""
        return (
            data_url if self.url is None else f"{data_url} (or the registry's, {redact(self.url)})"
        )

    async def open(self, max_connections: int, namespace: str, client_id: str) -> None:
        if self.url is not None and self._raw is None:
            self._raw = await connect(
                self.url,
                max_connections=max_connections,
                client_name=f"reach:{namespace}:{client_id}",
            )

    def commands(self, data: AutoPipeline) -> AutoPipeline:
        """The auto-pipelined client of the control plane (``data`` when it is not apart)."""
        if self._auto is None:
            r = self._given if self._given is not None else self._raw
            if r is None:
                return data
            self._auto = r if isinstance(r, AutoPipeline) else AutoPipeline(r)
        return self._auto

    async def aclose(self) -> None:
        auto, self._auto = self._auto, None
        raw, self._raw = self._raw, None
        if raw is None:  # not apart, or given: not ours to close
            return
        if auto is not None:
            await auto.aclose()  # waits for the batches in flight, closes ``raw``
        else:
            await raw.aclose()
