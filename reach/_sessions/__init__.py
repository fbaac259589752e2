"""Session tiers: what ``ctx.session`` is in a handler declared with
``@app.handler(cap, session=...)`` (docs/concepts.md, *Session tiers*).

* :mod:`reach._sessions.tiers` - :class:`~reach._sessions.tiers.SessionTier`, the choice;
* :mod:`reach._sessions.buffered` - the write-behind session of the ``cached`` and
  ``best_effort`` tiers (one round trip for a run's writes, at its end);
* :mod:`reach._sessions.cache` - a process's copies of cached sessions, dropped when a
  write is announced;
* :mod:`reach._sessions.store` - what a worker gives its handlers' contexts.
"""
