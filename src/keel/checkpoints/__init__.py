"""Checkpoints for `/undo`: snapshots of what each user prompt's file writes and (in git
repositories) bash commands replaced, kept beside the session. See docs/checkpoints.md.

A front end opens one store per session (`Checkpoints.for_session`), sets it on the agent's tool
context (`agent.ctx.checkpoints`), calls `begin_unit(prompt)` before each prompt, and for `/undo`
calls `undo()`, then `agent.add_note(undo_note(summary))` and `session.undo(summary)`.
"""

from keel.checkpoints.note import undo_note
from keel.checkpoints.store import (
    BASH_FILE_BYTES,
    BASH_MAX_FILES,
    BASH_TOTAL_BYTES,
    MAX_FILE_BYTES,
    RETENTION,
    BashToken,
    CheckpointError,
    Checkpoints,
    NothingToUndo,
    Problem,
    UndoSummary,
    UnitInfo,
    prune_all,
)

__all__ = [
    "BASH_FILE_BYTES",
    "BASH_MAX_FILES",
    "BASH_TOTAL_BYTES",
    "MAX_FILE_BYTES",
    "RETENTION",
    "BashToken",
    "CheckpointError",
    "Checkpoints",
    "NothingToUndo",
    "Problem",
    "UndoSummary",
    "UnitInfo",
    "prune_all",
    "undo_note",
]
