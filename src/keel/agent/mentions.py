"""`@path` mentions in a prompt, and attaching the files they name: shared by the front ends
(what the user types) and custom commands (`@file` in a command's body), so both attach alike.

A mention is `@` at the start of the text or after whitespace, then a path (`@"a b.txt"` for a
path with spaces). Each mention of a readable file attaches the file (up to `MAX_LINES` lines /
`MAX_BYTES`) after the text in an `<attached-file>` block; a folder attaches its listing. The text
itself is kept as written. A file or folder whose content a `read` deny rule keeps from the
model (`refuse`: the agent's `import_refusal`, which asks `PermissionGate.content_denied`) is not
read: its block says it was refused and why. Nothing here writes a file or decides what may be
read: callers that attach on behalf of a file (not the user) filter the paths first.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import TypeAlias

from keel.frozen import frozen
from keel.llm.messages import without_context

MAX_BYTES = 100_000
MAX_LINES = 2000
MAX_LISTING = 200
#: Folders a listing leaves out (and completion does not walk).
SKIP_DIRS = {".git", "node_modules", "__pycache__", ".venv", "venv", ".mypy_cache", ".tox"}

_MENTION = re.compile(r'(?:(?<=\s)|^)@(?:"([^"\n]+)"|([^\s"]+))')
_TRAILING = ".,;:!?)]}'"


@frozen
class Attachment:
    #: As written in the prompt (relative to cwd).
    path: str
    resolved: Path
    text: str
    #: Whole file attached (so the model has read it all).
    complete: bool
    #: Why it was not read (a `read` deny rule), or "" when it was.
    refused: str = ""


def mentions(text: str) -> list[str]:
    """The paths mentioned in `text`, in order, without duplicates."""
    found: list[str] = []
    for match in _MENTION.finditer(text):
        path = match.group(1) or match.group(2).rstrip(_TRAILING)
        if path and path not in found:
            found.append(path)
    return found


#: Why the model may not see a path's content, or None (`Agent.import_refusal`).
Refuse: TypeAlias = Callable[[Path], str | None]


def attach(text: str, cwd: Path, *, refuse: Refuse | None = None) -> tuple[str, list[Attachment]]:
    """The prompt to send for `text`: the text as typed, then one block per mentioned file or
    folder that exists (a refused one's block says why it is not there). Mentions of missing
    paths stay plain text."""
    attachments = [
        a for p in mentions(text) if (a := read_mention(p, cwd, refuse=refuse)) is not None
    ]
    if not attachments:
        return text, []
    return text + "\n\n" + attachment_blocks(attachments), attachments


def read_mention(path: str, cwd: Path, *, refuse: Refuse | None = None) -> Attachment | None:
    target = (cwd / Path(path).expanduser()).resolve()
    if not target.exists():
        return None
    if refuse is not None and (why := refuse(target)) is not None:
        return Attachment(path, target, f"(not attached: {why})", False, refused=why)
    if target.is_dir():
        entries = sorted(
            p.name + ("/" if p.is_dir() else "")
            for p in target.iterdir()
            if p.name not in SKIP_DIRS
        )
        listing = "\n".join(entries[:MAX_LISTING])
        if len(entries) > MAX_LISTING:
            listing += f"\n… {len(entries) - MAX_LISTING} more entries"
        return Attachment(path, target, listing or "(empty folder)", True)
    try:
        data = target.read_bytes()
    except OSError:
        return None
    if b"\0" in data[:8000]:
        return Attachment(path, target, "(a binary file; not attached)", False)
    text = data.decode("utf-8", errors="replace")
    lines = text.splitlines()
    complete = len(data) <= MAX_BYTES and len(lines) <= MAX_LINES
    if not complete:
        kept: list[str] = []
        size = 0
        for line in lines[:MAX_LINES]:
            size += len(line) + 1
            if size > MAX_BYTES:
                break
            kept.append(line)
        text = "\n".join(kept) + (
            f"\n… cut after {len(kept)} of {len(lines)} lines; read the rest with the read tool"
        )
    return Attachment(path, target, text.rstrip("\n"), complete)


def attachment_blocks(attachments: list[Attachment]) -> str:
    return "\n\n".join(
        f'<attached-file path="{a.path}">\n{a.text}\n</attached-file>' for a in attachments
    )


_NOTE = re.compile(r"\A<system-note>\n.*?\n</system-note>\n\n", re.DOTALL)
_ATTACHED = re.compile(r"\n\n<attached-file [^>]*>.*\Z", re.DOTALL)


def typed_prompt(stored: str) -> str:
    """A stored user message as the user typed it: without the context and the notes keel
    prepended and the files it attached (a transcript shown again: the TUI's, an editor's over
    ACP)."""
    return _ATTACHED.sub("", _NOTE.sub("", without_context(stored)))


__all__ = [
    "MAX_BYTES",
    "MAX_LINES",
    "MAX_LISTING",
    "SKIP_DIRS",
    "Attachment",
    "Refuse",
    "attach",
    "attachment_blocks",
    "mentions",
    "read_mention",
    "typed_prompt",
]
