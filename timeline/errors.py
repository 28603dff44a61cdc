"""Errors a user can cause, and the one-line messages the CLI prints for them.

Every error the CLI reports without a traceback derives from :class:`UserError`. A run-file
problem carries its key path (``parallel.tp``) so the message names the file, the key and what
would be valid.
"""

from __future__ import annotations

from collections.abc import Sequence


class UserError(Exception):
    """A problem in the user's input: reported as ``error: ...`` lines, exit code 2."""

    def lines(self) -> list[str]:
        return [str(self)]


class SpecError(UserError):
    """One or more (key path, message) problems found while validating a run."""

    def __init__(self, problems: Sequence[tuple[str, str]], source: str | None = None) -> None:
        self.problems = list(problems)
        self.source = source
        super().__init__("; ".join(f"{k}: {m}" for k, m in self.problems))

    def with_source(self, source: str) -> SpecError:
        return SpecError(self.problems, source)

    def lines(self) -> list[str]:
        """One line (one ``error:`` per failure, however many problems it found), the file named once."""
        prefix = f"{self.source}: " if self.source else ""
        return [prefix + " | ".join(f"{key}: {message}" if key else message for key, message in self.problems)]
