"""The seam between `/undo` and file checkpoints (`keel.checkpoints`).

What the front end needs from checkpoints is small: start an undo unit before each prompt, and
put back the files of the last unit that changed any, with a summary to show, a note for the model
and a record for the session file. `Undo` is that; `undo_for(agent)` wires the real store into the
agent (the file tools find it in `ToolContext.checkpoints`) or, in a build without checkpoints,
returns one that says so.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Protocol

from keel.errors import UserError
from keel.frozen import frozen

if TYPE_CHECKING:
    from keel.agent.loop import Agent


@frozen
class Undone:
    """What an undo did, for the transcript."""

    label: str
    restored: tuple[str, ...]
    removed: tuple[str, ...]
    failed: tuple[str, ...]

    def describe(self) -> str:
        lines = [f"Undid the file changes of “{self.label}”." if self.label else "Undone."]
        lines += [f"- restored `{p}`" for p in self.restored]
        lines += [f"- removed `{p}` (the prompt created it)" for p in self.removed]
        lines += [f"- **not restored** `{p}`" for p in self.failed]
        return "\n".join(lines)


class Undo(Protocol):
    available: bool

    def begin(self, label: str) -> None:
        """A prompt is about to run: its file changes form one unit."""

    def undo(self) -> Undone:
        """Put back the last unit that changed files (raises `UserError` if there is none)."""


class NoCheckpoints:
    """A build without `keel.checkpoints`: nothing is captured, and `/undo` says why."""

    available = False

    def begin(self, label: str) -> None:
        return None

    def undo(self) -> Undone:
        raise UserError(
            "undo is not available: this build of keel has no file checkpoints",
            hint="use git to put files back (git diff, git checkout -- FILE)",
        )


class CheckpointUndo:
    """`/undo` over a `keel.checkpoints.Checkpoints` store wired into `agent`."""

    available = True

    def __init__(self, agent: Agent, store: Any, module: Any) -> None:
        self.agent = agent
        self.store = store
        self.module = module

    def begin(self, label: str) -> None:
        self.store.begin_unit(label)

    def undo(self) -> Undone:
        summary = self.store.undo()
        if summary is None:
            raise UserError("nothing to undo: no prompt of this session changed files")
        note = getattr(self.module, "undo_note", None)
        if note is not None:
            self.agent.add_note(note(summary))
        if self.agent.session is not None:
            self.agent.session.undo(summary)
        return Undone(
            str(getattr(summary, "label", "")),
            tuple(str(p) for p in getattr(summary, "restored", ())),
            tuple(str(p) for p in getattr(summary, "removed", ())),
            tuple(f"{f.path}: {f.why}" for f in getattr(summary, "failed", ())),
        )


def undo_for(agent: Agent) -> Undo:
    """The undo of `agent`'s session: a checkpoint store set on its tool context when
    `keel.checkpoints` is there, else `NoCheckpoints`."""
    try:
        module = importlib.import_module("keel.checkpoints")
    except ImportError:
        return NoCheckpoints()
    store = (
        module.Checkpoints.for_agent(agent) if hasattr(module.Checkpoints, "for_agent") else None
    )
    if store is None:
        return NoCheckpoints()
    agent.ctx.checkpoints = store
    return CheckpointUndo(agent, store, module)


__all__ = ["CheckpointUndo", "NoCheckpoints", "Undo", "Undone", "undo_for"]
