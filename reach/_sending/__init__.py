"""The caller's send path: how a :class:`reach.Client` gets a built envelope into an
agent's inbox.

- :mod:`.delivery`: the full path, a message at a time or a batch: quotas, version
  splits, the pick, the inbox write, refusals and reroutes;
- :mod:`.plain`: the fast path of a plain ``send`` (nothing but a pick applies);
- :mod:`.coalesce`: single inbox writes of concurrent sends gathered into batch calls.

Private: the public face is :class:`reach.Client`.
"""
