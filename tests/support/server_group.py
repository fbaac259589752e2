"""A context manager for test helpers that start several Redis processes together."""

from __future__ import annotations

from types import TracebackType
from typing import Self


class ServerGroup:
    """Subclasses define ``start`` (returns self) and ``stop`` (stops whatever runs).

    Entering starts the group; a start that fails half way stops what it had started, so
    a broken fixture never leaves servers behind.
    """

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
