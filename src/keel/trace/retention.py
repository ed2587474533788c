"""Pruning old traces: `*.trace` folders older than the retention (`trace_retention_days`,
default 14) under every project's sessions folder and under `keel_home()/traces`.

Age is the last time the trace was written (its `events.jsonl`, else the folder). Only real
folders named `*.trace` directly in those places are removed: a symlink is never followed, so a
link planted there cannot make keel delete something else.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

DEFAULT_RETENTION_DAYS = 14


def trace_roots(home: Path) -> Iterator[Path]:
    """The folders traces live in: each project's sessions folder, and `traces`."""
    sessions = home / "sessions"
    try:
        with os.scandir(sessions) as entries:
            projects = [Path(e.path) for e in entries if e.is_dir(follow_symlinks=False)]
    except OSError:
        projects = []
    yield from sorted(projects)
    yield home / "traces"


def _age_mark(folder: Path) -> float:
    for path in (folder / "events.jsonl", folder):
        try:
            return path.stat(follow_symlinks=False).st_mtime
        except OSError:
            continue
    return time.time()


def prune(
    days: int = DEFAULT_RETENTION_DAYS,
    *,
    home: Path | None = None,
    env: Mapping[str, str] | None = None,
    keep: Path | None = None,
    now: float | None = None,
) -> list[Path]:
    """Remove traces not written for more than `days` days (never `keep`); the removed ones."""
    if home is None:
        from keel.session.store import keel_home

        home = keel_home(env)
    cutoff = (time.time() if now is None else now) - days * 86_400
    keep_resolved = keep.resolve() if keep is not None else None
    removed: list[Path] = []
    for root in trace_roots(home):
        try:
            with os.scandir(root) as entries:
                found = [
                    Path(e.path)
                    for e in entries
                    if e.name.endswith(".trace") and e.is_dir(follow_symlinks=False)
                ]
        except OSError:
            continue
        for folder in found:
            if keep_resolved is not None and folder.resolve() == keep_resolved:
                continue
            if _age_mark(folder) >= cutoff:
                continue
            try:
                shutil.rmtree(folder)
            except OSError:
                continue  # another keel may be pruning it too; it goes next time
            removed.append(folder)
    return removed


__all__ = ["DEFAULT_RETENTION_DAYS", "prune", "trace_roots"]
