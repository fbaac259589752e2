"""Routing: pick which live agent gets a message. Pure Python; a pick touches no Redis.

Two steps per pick, **eligibility then policy**. Each part is a module of its own, readable
alone; only :mod:`~reach.routing.router` puts them together, and none of them calls back into
it:

============================  ================================================================
:mod:`.eligibility`           which agents may take a message now (:func:`eligible`), and why
                              not (the ``reason`` of :class:`~reach.errors.NoAgentAvailable`)
:mod:`.weights`               the weight floor (:data:`MIN_WEIGHT`) and slow start
:mod:`.cache`                 the statically eligible agents per ``(capability, where)``, and
                              what ``version=`` promises
:mod:`.wrr`                   ``weighted_rr``: smooth weighted round-robin (EEVDF), O(log N)
:mod:`.least_conn`            ``least_conn``: outstanding work per unit of weight
:mod:`.capacity`              free slots per agent (its reports and this client's own
                              sends), the expected wait when every agent is full
:mod:`.ring`                  ``consistent_hash``: the ketama continuum (uhashring-compatible)
:mod:`.router`                :class:`Router`: the policies' walks, the dynamic checks
                              (breaker, queue bound, ``avoid``), ``direct`` and broadcast
============================  ================================================================

A caller keeps one :class:`Router` per client (it is not thread-safe) and calls
:meth:`Router.pick` (or :meth:`Router.pick_many` for a broadcast) with the registry snapshot.
"""

from __future__ import annotations

from .eligibility import Inflight, eligible, over_bound
from .ring import ketama_points
from .router import DEFAULT_POLICY, MAX_SKIPS, POLICIES, Policy, Router
from .weights import MIN_WEIGHT, SLOW_START_STEPS, slow_start_factor

__all__ = [
    "DEFAULT_POLICY",
    "MAX_SKIPS",
    "MIN_WEIGHT",
    "POLICIES",
    "SLOW_START_STEPS",
    "Inflight",
    "Policy",
    "Router",
    "eligible",
    "ketama_points",
    "over_bound",
    "slow_start_factor",
]
