"""Tools shipped with the ``reach`` command, not part of the library.

* :mod:`reach_cli.tools.bench` - the messaging benchmark (``reach bench``,
  ``bench/messaging_bench.py``, and the reach rows of ``bench/compare_queues.py``);
* :mod:`reach_cli.tools.floor` - the bare redis-py Streams loop ``reach bench --floor``
  compares reach with;
* :mod:`reach_cli.tools.scaling` - scaling figures (``reach bench-scaling``,
  ``bench/scaling_bench.py``): workers, agents, payload sizes, a one-caller fan-out;
* :mod:`reach_cli.tools.chaos` - the chaos harness (``reach chaos``, ``bench/chaos.py``,
  ``tests/chaos/``).

They drive real ``reach worker`` processes and a Redis of their own; an application that
only imports ``reach`` never loads them.
"""
