"""Checkpoints for `/undo`: snapshots of what each user prompt's file writes and bash commands
replaced (git status in a repository, a scan of the tree elsewhere), kept beside the session, and
a digest of the project tree to check a restore against. See docs/checkpoints.md.

The loop begins one unit per prompt for every front end (`Agent._begin_unit`), opening the store
beside the session file (`Checkpoints.for_session`) on the agent's tool context
(`agent.ctx.checkpoints`) unless the caller set one. `/undo`, `keel undo SESSION` and
`Agent.undo` all go through `undo_last`: the files go back, the session records it, and the model
is told with the next prompt.
"""

from keel.checkpoints.note import check_line, undo_note
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
    TreeCheck,
    UndoSummary,
    UnitInfo,
    prune_all,
)
from keel.checkpoints.tree import TreeLimits
from keel.checkpoints.undo import undo_last

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
    "TreeCheck",
    "TreeLimits",
    "UndoSummary",
    "UnitInfo",
    "check_line",
    "prune_all",
    "undo_last",
    "undo_note",
]
