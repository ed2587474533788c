"""`ls`: one directory's entries, directories first, with file sizes.

What it hides by default is the same universe `glob` and `grep` search: entries ignored by a
`.gitignore` (from the repository's top down to the listed directory, read with git's rules by
`keel.globs`) and VCS internals (`.git`). It lists names only, so a `read` deny rule hides
nothing here (the gate still refuses to list a directory such a rule covers).
Dotfiles are shown: `.github/`, `.env.example` and `.gitignore` itself matter to a coding agent.
Hidden entries are counted and named in a note, never dropped silently, and `all=true` shows
everything. Listing a directory that is itself ignored shows all of it (the model asked for it).
This module reads directory entries only: it must never read file contents or write anything.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from keel.tools.base import ToolContext, ToolError, ToolOutput, tool

# The .gitignore matcher of the pure-Python search walk, so `ls` hides exactly what it skips.
from keel.tools.builtin.search import ALWAYS_SKIPPED, IgnoreFile, is_ignored, load_ignore_rules

MAX_ENTRIES = 500
MAX_BYTES = 30_000
#: Hidden entries named in the note before "…".
HIDDEN_NAMED = 10


class _Entry:
    # A plain class rather than a dataclass: this module is imported at startup.
    __slots__ = ("broken", "is_dir", "link", "name", "size")

    def __init__(
        self, name: str, is_dir: bool, size: int | None, link: str | None, broken: bool
    ) -> None:
        self.name = name
        self.is_dir = is_dir
        self.size = size
        self.link = link
        self.broken = broken

    def line(self) -> str:
        shown = self.name + ("/" if self.is_dir else "")
        if self.link is not None:
            shown += f" -> {self.link}" + (" (broken link)" if self.broken else "")
        if self.size is not None:
            shown += f"  {human_size(self.size)}"
        return "  " + shown


def human_size(size: int) -> str:
    """`512 B`, `1.5 kB`, `3.0 MB` (decimal units, one decimal place above bytes)."""
    if size < 1000:
        return f"{size} B"
    value = float(size)
    for unit in ("kB", "MB", "GB", "TB"):
        value /= 1000
        if value < 1000 or unit == "TB":
            break
    return f"{value:.1f} {unit}"


def _repository_top(directory: Path, root: Path) -> Path:
    """Where .gitignore files start to apply: the nearest enclosing git work tree, else the
    project root when the directory is inside it, else the directory itself."""
    for candidate in (directory, *directory.parents):
        if (candidate / ".git").exists():
            return candidate
    return root if directory.is_relative_to(root) else directory


def _rules_for(directory: Path, root: Path) -> tuple[list[IgnoreFile], bool]:
    """The .gitignore rules that apply inside `directory`, and whether `directory` itself (or a
    directory on the way down to it) is ignored."""
    top = _repository_top(directory, root)
    rules = load_ignore_rules(top)
    inside_ignored = False
    current = top
    for part in directory.relative_to(top).parts:
        current = current / part
        if part in ALWAYS_SKIPPED or is_ignored(current, True, rules):
            inside_ignored = True
        rules = rules + load_ignore_rules(current)
    return rules, inside_ignored


def _scan(directory: Path, root: Path, show_all: bool) -> tuple[list[_Entry], list[str], bool]:
    """(shown entries sorted directories first, hidden names, listing an ignored directory)."""
    rules, inside_ignored = ([], False) if show_all else _rules_for(directory, root)
    show_all = show_all or inside_ignored
    shown: list[_Entry] = []
    hidden: list[str] = []
    with os.scandir(directory) as it:
        for entry in it:
            entry_path = Path(entry.path)
            is_link = entry.is_symlink()
            is_dir = entry.is_dir()  # follows links: a link to a directory lists as one
            if not show_all and (
                entry.name in ALWAYS_SKIPPED or is_ignored(entry_path, is_dir, rules)
            ):
                hidden.append(entry.name + ("/" if is_dir else ""))
                continue
            link = os.readlink(entry.path) if is_link else None
            broken = is_link and not entry_path.exists()
            size = None
            if entry.is_file():
                try:
                    size = entry.stat().st_size
                except OSError:  # vanished between scandir and stat
                    continue
            shown.append(_Entry(entry.name, is_dir, size, link, broken))
    shown.sort(key=lambda e: (not e.is_dir, e.name.lower(), e.name))
    hidden.sort(key=lambda name: (not name.endswith("/"), name.lower(), name))
    return shown, hidden, inside_ignored


@tool(read_only=True, kind="builtin")
async def ls(ctx: ToolContext, path: str = ".", all: bool = False) -> ToolOutput:
    """List one directory: subdirectories first (with a trailing `/`), then files with their
    sizes. Hides what .gitignore ignores and .git, and says how many entries it hid; dotfiles
    are shown. At most 500 entries; use glob to find files deeper down.

    Args:
        path: The directory to list, relative to the working directory or absolute.
        all: Also show entries ignored by .gitignore, and .git.
    """
    target = ctx.resolve(path)
    if not target.exists():
        hint = " (a broken symlink)" if target.is_symlink() else ""
        raise ToolError(f"{path} does not exist{hint}; list its parent directory or use glob")
    if not target.is_dir():
        raise ToolError(f"{path} is a file, not a directory; use read to see its contents")
    directory = target.resolve()
    try:
        entries, hidden, inside_ignored = await asyncio.to_thread(
            _scan, directory, ctx.root.resolve(), all
        )
    except PermissionError:
        raise ToolError(f"cannot list {path}: permission denied") from None
    lines = [f"{directory}/"]
    size = len(lines[0]) + 1
    for count, entry in enumerate(entries):
        line = entry.line()
        if count >= MAX_ENTRIES or size + len(line) + 1 > MAX_BYTES:
            lines.append(
                f"[stopped at {count} of {len(entries)} entries; list a subdirectory or use "
                "glob with a pattern to narrow]"
            )
            break
        lines.append(line)
        size += len(line) + 1
    if not entries:
        lines.append("  (empty)" if not hidden else "  (nothing shown)")
    if inside_ignored:
        lines.append("[this directory is ignored by .gitignore; showing all of it]")
    if hidden:
        named = ", ".join(hidden[:HIDDEN_NAMED]) + (", …" if len(hidden) > HIDDEN_NAMED else "")
        lines.append(
            f"[{len(hidden)} hidden by .gitignore or as VCS data: {named}; all=true shows them]"
        )
    return ToolOutput("\n".join(lines))
