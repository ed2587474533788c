"""One `/undo`, the same for every front end (the TUI, `keel undo SESSION`, `Agent.undo`): put
back the newest unit that changed files, build the note that tells the model, and hand both to
whoever records them (the session file). Never imports sessions or the loop."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from keel.checkpoints.note import undo_note
from keel.checkpoints.store import Checkpoints, UndoSummary

Record = Callable[[UndoSummary, str], None]


def undo_last(
    store: Checkpoints, *, cwd: Path, record: Record | None = None
) -> tuple[UndoSummary, str]:
    """Undo the newest unit of `store` (raises `NothingToUndo`); `record(summary, note)` is
    called once the files are back. Returns the summary and the note for the model."""
    summary = store.undo()
    note = undo_note(summary, cwd=cwd)
    if record is not None:
        record(summary, note)
    return summary, note


__all__ = ["undo_last"]
