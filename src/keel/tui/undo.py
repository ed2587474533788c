"""`/undo` for the interactive session: the seam between the controller and `keel.checkpoints`.

The store lives beside the session file (`Checkpoints.for_session`), so a resumed session can
still undo what its earlier prompts did; without a session file (`--no-session`) it is a temp
directory deleted on close. The store is set on the agent's tool context, where the file tools,
bash and subagents (which share the parent's context's store) find it. An undo puts the files
back, queues a note for the model (`<system-note>` with the next prompt) and records it in the
session file.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from keel.checkpoints import Checkpoints, UndoSummary, check_line, undo_note
from keel.frozen import frozen

if TYPE_CHECKING:
    from keel.agent.loop import Agent


@frozen
class Undone:
    """What an undo did, for the transcript (paths relative to the project)."""

    label: str
    restored: tuple[str, ...]
    removed: tuple[str, ...]
    failed: tuple[str, ...]
    notes: tuple[str, ...] = ()

    def describe(self) -> str:
        head = f"Put back the files changed by “{self.label}”." if self.label else "Undone."
        lines = [head, ""] if self.restored or self.removed or self.failed else [head]
        lines += [f"- restored `{p}`" for p in self.restored]
        lines += [f"- removed `{p}` (the prompt created it)" for p in self.removed]
        lines += [f"- **not restored** {p}" for p in self.failed]
        if self.notes:
            lines += ["", *self.notes]
        lines += ["", "The model is told with your next prompt."]
        return "\n".join(lines)


class SessionUndo:
    """The checkpoint store of one agent's session, opened when the session has a file (or at the
    first prompt), and what `/undo` does with it."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.store: Checkpoints | None = None
        if agent.session is not None:
            self._open()

    def _open(self) -> Checkpoints:
        if self.store is None:
            session = self.agent.session
            self.store = (
                Checkpoints.for_session(session.path)
                if session is not None
                else Checkpoints.temporary()
            )
            self.agent.ctx.checkpoints = self.store
        return self.store

    def begin(self, label: str) -> None:
        """A prompt is about to run: what it changes is one unit."""
        self._open().begin_unit(label)

    def undo(self) -> Undone:
        """Put back the last unit that changed files. Raises `NothingToUndo` (a `UserError`)."""
        summary = self._open().undo()
        note = undo_note(summary, cwd=self.agent.cwd)
        self.agent.add_note(note)
        if self.agent.session is not None:
            self.agent.session.undo(summary, note)
        return self.describe(summary)

    def describe(self, summary: UndoSummary) -> Undone:
        cwd = self.agent.cwd
        return Undone(
            " ".join(summary.label.split()),
            tuple(relative(p, cwd) for p in summary.restored),
            tuple(relative(p, cwd) for p in summary.removed),
            tuple(f"`{relative(f.path, cwd)}`: {f.why}" for f in summary.failed),
            tuple(f"`{relative(f.path, cwd)}`: {f.why}" for f in summary.overwritten)
            + summary.notes
            + tuple(check_line(c, cwd=cwd) for c in summary.checks),
        )

    def close(self) -> None:
        """Delete a temporary store (a session's store stays beside it)."""
        if self.store is not None:
            self.store.close()


def relative(path: Path, cwd: Path | None) -> str:
    """`path` as the transcript shows it: relative to the project when inside it."""
    return str(path.relative_to(cwd)) if cwd is not None and path.is_relative_to(cwd) else str(path)


__all__ = ["SessionUndo", "Undone", "relative"]
