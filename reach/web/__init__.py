"""``reach web``: an operator console in the browser (the ``reach-fabric[web]`` extra).

Pages rendered on the server, live over Server-Sent Events, no build step and nothing
fetched from elsewhere at run time: what ``reach top`` shows and more (capabilities,
agents, rates, charts of the last minutes, a message's task record, the dead letters with
replay and purge, draining an agent, the registry events as they come). docs/web.md
describes the pages and what guards them.

Nothing here is imported by ``import reach``: the core needs no web framework.
"""

from __future__ import annotations

from .app import create_app
from .security import Guard
from .server import serve

__all__ = ["Guard", "create_app", "serve"]
