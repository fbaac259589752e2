"""The worker behind ``reach.Agent.run()``: private, its parts named for what they do.

One inbox entry goes forward through them, never back up:

* ``runtime``    - wires the parts below and owns the task group and the lifecycle;
* ``liveness``   - registration, the heartbeat thread, signals, the drain flag and
  leaving the inbox on a clean stop;
* ``readiness``  - the ``ready`` flag: the progress watchdog, the application's readiness
  check and pause, and what ``/healthz`` and ``/readyz`` read;
* ``consumer``   - reads the inbox (priority fetch, blocking read, its own pending
  entries), decodes entries and hands them on;
* ``execution``  - claims idempotency keys (taking over a dead owner's), runs handlers
  under their deadline, replays stored results, parks copies of busy keys;
* ``outcome``    - pure: what a handler's result or exception means (retry, dead letter,
  expiry) and what settling it writes;
* ``settlement`` - writes outcomes in batches: fenced completion, reply, dead letter or
  retry, ack and delete;
* ``sweeping``   - the cluster-wide chores, done by whichever agent holds the lock.

Beside them: ``items`` (what travels: a delivered message or an ack-only entry),
``state`` (the counters and flags the parts share, and ``Shared``/``Part``: the wiring
each part gets), ``letters`` (dead letters of entries that cannot be handled),
``hookchain`` (calls the hooks of reach.hooks) and ``stats`` (the built-in statistics).
"""
