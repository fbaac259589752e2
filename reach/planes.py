"""The control plane apart from the data plane (issue 32, item 2).

A namespace's control plane (its registry and registry events, rate limits, quotas, the
audit trail, the operator's access rules: :data:`reach.keys.CONTROL_BUILDERS`) may live on
a Redis of its own, ``registry_url``, while its data plane (inboxes, task records, replies,
delayed and scheduled sets, dead letters, sessions) stays on ``redis_url``, a standalone
Redis, a Sentinel or a Cluster. Nothing is set by default: one Redis holds both.

Every process of the namespace must agree, so the URL is found in the order of the data
one (:mod:`reach.config`):

1. ``registry_url=...`` in code, ``--registry-url`` on the command line;
2. ``REACH_REGISTRY_URL``;
3. ``registry_url = "..."`` in the project file (``reach.toml``), beside ``redis_url``;
4. none: the control plane is on ``redis_url``'s Redis.

A ``registry_url`` equal to the data URL is the same as none. No script spans the two
(as no script spans two hash slots on a Cluster): the split is which connection each
call uses. docs/operations.md, *The control plane apart*.
"""

from __future__ import annotations

import os
from pathlib import Path

from .config import PROJECT_FILES, read_project_file
from .errors import ConfigError

ENV_REGISTRY_URL = "REACH_REGISTRY_URL"
REGISTRY_URL_KEY = "registry_url"


def _project_registry_url(start: Path | None) -> tuple[str, str] | None:
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        for name in PROJECT_FILES:
            f = d / name
            if f.is_file():
                data = read_project_file(f)
                if REGISTRY_URL_KEY in data:
                    url = data[REGISTRY_URL_KEY]
                    if not isinstance(url, str) or not url.strip():
                        raise ConfigError(
                            f"{f}: {REGISTRY_URL_KEY} must be a non-empty string (the "
                            f"control plane's Redis URL), not {url!r}."
                        )
                    return url.strip(), str(f)
                if "redis_url" in data:  # the nearest project file decides
                    return None
    return None


def locate_registry_url(
    explicit: str | None = None, *, start: Path | None = None
) -> tuple[str, str] | None:
    """The control plane's Redis URL and where it was found, or None (the data Redis
    holds both planes)."""
    if explicit:
        return explicit, "--registry-url"
    env = os.environ.get(ENV_REGISTRY_URL, "").strip()
    if env:
        return env, ENV_REGISTRY_URL
    return _project_registry_url(start)


def resolve_registry_url(
    explicit: str | None = None, *, data_url: str | None = None, start: Path | None = None
) -> str | None:
    """The control plane's Redis URL when it is apart from ``data_url``'s, else None."""
    found = locate_registry_url(explicit, start=start)
    if found is None or found[0] == data_url:
        return None
    return found[0]
