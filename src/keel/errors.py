"""The three error roots every keel error descends from (STYLE.md 7).

- `UserError`: the caller asked for something wrong (a bad flag, a missing key, an unknown model).
- `RunError`: a run that failed; carries what it had done so far.
- `ModelBehaviorError`: the model did something the loop cannot accept (a scripted run that
  diverged, a reply the protocol forbids).

Each carries a one-line message and an optional hint; front ends print `error: … (hint: …)` and
show a traceback only under `--debug`. This module imports nothing from keel.
"""

from __future__ import annotations


class KeelError(Exception):
    """Base of keel's errors. `hint` says how to fix it, in a few words."""

    def __init__(self, message: str, *, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message

    def one_line(self) -> str:
        line = self.message.replace("\n", " ")
        return f"{line} (hint: {self.hint})" if self.hint else line


class UserError(KeelError):
    """Misuse by the caller: bad arguments, configuration or input."""


class RunError(KeelError):
    """A run that failed. `partial` is whatever the run had produced before failing."""

    def __init__(self, message: str, *, hint: str = "", partial: object = None) -> None:
        super().__init__(message, hint=hint)
        self.partial = partial


class ModelBehaviorError(KeelError):
    """The model (or a scripted stand-in) behaved in a way the loop cannot accept."""
