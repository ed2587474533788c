"""`@path` mentions in a prompt: completing them while the user types, and attaching the files
they name when the prompt is sent (`keel.agent.mentions`, shared with custom commands).

A mention is `@` at the start of the prompt or after whitespace, then a path (`@"a b.txt"` for a
path with spaces). On send, each mention of a readable file inside the project attaches the file
(up to `MAX_LINES` lines / `MAX_BYTES`) after the prompt in an `<attached-file>` block; a folder
attaches its listing. The prompt text itself is kept as typed. Nothing here writes a file.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable
from pathlib import Path

from keel.agent.mentions import (  # one implementation, shared with custom commands
    MAX_BYTES,
    MAX_LINES,
    MAX_LISTING,
    SKIP_DIRS,
    Attachment,
    attach,
    mentions,
)

#: Files offered for completion at most (a huge tree is cut, not walked to the end).
MAX_FILES = 20_000


# -- completion --------------------------------------------------------------------------------


def project_files(root: Path) -> list[str]:
    """Files under `root`, relative to it: what git tracks or would (ignored files left out), or
    a walk that skips hidden and build folders when `root` is not in a git work tree."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=root,
            capture_output=True,
            timeout=5,
            check=True,
        ).stdout
        files = [f for f in out.decode("utf-8", errors="replace").split("\0") if f]
        return sorted(set(files))[:MAX_FILES]
    except (OSError, subprocess.SubprocessError):
        pass
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("."))
        rel = Path(dirpath).relative_to(root)
        files += [str(rel / f) if str(rel) != "." else f for f in sorted(filenames)]
        if len(files) >= MAX_FILES:
            break
    return files[:MAX_FILES]


def with_folders(files: Iterable[str]) -> list[str]:
    """The files and every folder above them (`src/`, `src/keel/`)."""
    out = set(files)
    for f in list(out):
        parts = f.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            out.add("/".join(parts[:i]) + "/")
    return sorted(out)


def complete(fragment: str, candidates: Iterable[str], limit: int = 8) -> list[str]:
    """Candidates for `@fragment`, best first: a file name starting with the fragment, then a path
    starting with it, then any path containing it (case-insensitive); shorter paths first."""
    needle = fragment.lower()
    ranked: list[tuple[int, int, str]] = []
    for path in candidates:
        low = path.lower()
        name = low.rstrip("/").rsplit("/", 1)[-1]
        if name.startswith(needle):
            rank = 0
        elif low.startswith(needle):
            rank = 1
        elif needle in low:
            rank = 2
        else:
            continue
        ranked.append((rank, len(path), path))
    return [p for _, _, p in sorted(ranked)[:limit]]


def mention_at(text: str, cursor: int) -> tuple[int, str] | None:
    """The mention being typed at `cursor`: (index of its `@`, the fragment after it), or None."""
    start = cursor
    while start > 0 and not text[start - 1].isspace():
        start -= 1
    word = text[start:cursor]
    if not word.startswith("@") or '"' in word:
        return None
    return start, word[1:]


def mention_text(path: str) -> str:
    return f'@"{path}"' if " " in path else f"@{path}"


__all__ = [
    "MAX_BYTES",
    "MAX_LINES",
    "MAX_LISTING",
    "Attachment",
    "attach",
    "complete",
    "mention_at",
    "mention_text",
    "mentions",
    "project_files",
    "with_folders",
]
