"""The public error tree and outcome vocabulary are importable from ``reach`` itself."""

from __future__ import annotations

import inspect
from pathlib import Path

import reach
import reach.admin
import reach.errors
import reach.outcomes


def _errors() -> set[str]:
    """The exception classes defined in reach.errors (Reject and Retry included)."""
    return {
        name
        for name, obj in vars(reach.errors).items()
        if inspect.isclass(obj)
        and issubclass(obj, BaseException)
        and obj.__module__ == "reach.errors"
    }


def test_every_error_of_the_tree_is_exported() -> None:
    errors = _errors()
    assert "ReachError" in errors and "DeadLetterNotFound" in errors
    assert errors <= set(reach.__all__), errors - set(reach.__all__)
    for name in errors:
        assert getattr(reach, name) is getattr(reach.errors, name)


def test_admin_errors_are_the_tree_s() -> None:
    # Defined once in reach.errors; reach.admin re-exports them for its callers.
    assert reach.admin.BadDeadLetterId is reach.errors.BadDeadLetterId
    assert reach.admin.DeadLetterNotFound is reach.errors.DeadLetterNotFound
    assert issubclass(reach.BadDeadLetterId, reach.ConfigError)
    assert issubclass(reach.DeadLetterNotFound, reach.ReachError)
    assert issubclass(reach.DeadLetterNotFound, LookupError)


def test_outcome_enums_are_exported() -> None:
    assert reach.Status is reach.outcomes.Status
    assert reach.DeadReason is reach.outcomes.DeadReason
    assert reach.Unavailable is reach.outcomes.Unavailable
    assert reach.Status.DEAD == "dead" and reach.DeadReason.TOO_LARGE == "too_large"


def test_all_is_sorted_and_resolves() -> None:
    assert reach.__all__ == sorted(reach.__all__)
    for name in reach.__all__:
        assert hasattr(reach, name), name


def test_docs_errors_md_lists_every_error() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "errors.md").read_text()
    for name in _errors():
        assert f"`{name}`" in text or f"`reach.{name}" in text, f"docs/errors.md lacks {name}"
