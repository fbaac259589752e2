"""Three reach agents that work together: a planner, a summariser and a reviewer.

See examples/README.md; run each with ``reach worker examples.<name>:app``.
"""
