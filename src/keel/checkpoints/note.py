"""The text that tells the model what an `/undo` reverted (the caller queues it with
`Agent.add_note`, so it reaches the model inside `<system-note>` with the next prompt and the
transcript is not rewritten). Pure: no I/O."""

from __future__ import annotations

from pathlib import Path

from keel.checkpoints.store import TreeCheck, UndoSummary

_LABEL_CHARS = 80


def _show(path: Path, cwd: Path | None) -> str:
    if cwd is not None and path.is_relative_to(cwd):
        return str(path.relative_to(cwd))
    return str(path)


def check_line(check: TreeCheck, *, cwd: Path | None = None) -> str:
    """One line on a restored tree against its checkpoint digest (shown to the user and told to
    the model)."""
    where = "the project" if check.root == cwd else _show(check.root, cwd) or "."
    if check.why:
        return f"Tree check: {where} was not checked against its checkpoint: {check.why}."
    if check.matches:
        return (
            f"Tree check: {where} matches the checkpoint taken before the request "
            f"(sha256 {check.checkpoint[:12]}, {check.count:,} entries)."
        )
    shown = ", ".join(_show(p, cwd) for p in check.differing)
    more = (
        f" and {check.count - len(check.differing):,} more"
        if check.count > len(check.differing)
        else ""
    )
    return (
        f"Tree check: {where} differs from the checkpoint taken before the request at "
        f"{check.count:,} path(s): {shown}{more}."
    )


def undo_note(summary: UndoSummary, *, cwd: Path | None = None) -> str:
    """What the model needs to know after `summary`'s undo: which files went back, which could
    not, and that what it read of them is out of date. Paths are shown relative to `cwd`."""
    label = " ".join(summary.label.split())
    if len(label) > _LABEL_CHARS:
        label = label[: _LABEL_CHARS - 1] + "…"
    request = f'the request "{label}"' if label else "an earlier request"
    lines = [f"The user ran /undo: the file changes made for {request} were reverted."]
    if summary.restored:
        shown = ", ".join(_show(p, cwd) for p in summary.restored)
        lines.append(f"Restored to their earlier content: {shown}.")
    if summary.removed:
        shown = ", ".join(_show(p, cwd) for p in summary.removed)
        lines.append(f"Deleted (they did not exist before): {shown}.")
    if summary.failed:
        shown = "; ".join(f"{_show(p.path, cwd)} ({p.why})" for p in summary.failed)
        lines.append(f"Not reverted: {shown}.")
    lines.extend(summary.notes)
    lines.extend(check_line(c, cwd=cwd) for c in summary.checks)
    if summary.files:
        lines.append(
            "What you read of these files before is out of date: read a file again before "
            "relying on it or changing it."
        )
    return "\n".join(lines)
