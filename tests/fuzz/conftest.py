"""Hypothesis profiles for the fuzzing suite.

``ci`` (the default) runs a bounded number of examples so the whole suite stays within a
few minutes; ``long`` is the documented deep run (docs/reliability.md):

    .venv/bin/pytest tests/fuzz --hypothesis-profile=long

Every fuzz test talks to a real Redis and real workers, so examples are slow by unit-test
standards: no per-example deadline, and health checks about slow data generation and
function-scoped fixtures are off (a fixture here is a live server, shared on purpose).
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

_COMMON = {
    "deadline": None,
    "suppress_health_check": [
        HealthCheck.too_slow,
        HealthCheck.function_scoped_fixture,
        HealthCheck.data_too_large,
    ],
    "derandomize": False,
    "print_blob": True,
}
settings.register_profile("ci", max_examples=40, **_COMMON)
settings.register_profile("long", max_examples=2000, **_COMMON)
settings.load_profile("ci")
