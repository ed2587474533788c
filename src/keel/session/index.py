"""Finding sessions and summarising them without reading them whole.

A summary reads a file's first line (meta) and its last 64 kB (the latest terminal record carries
the session's totals), so listing a thousand sessions stays fast. Whether a session without a
final terminal record is running or crashed is told by its lock: held means running.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from keel.errors import UserError
from keel.frozen import frozen
from keel.session.journal import Journal, read_records
from keel.session.records import Meta, RecordError, TerminalRecord, UserRecord, decode
from keel.session.store import keel_home, sessions_dir

TAIL_BYTES = 64 * 1024


@frozen
class SessionSummary:
    id: str
    path: Path
    started: str
    cwd: str
    model: str
    status: str  # a terminal reason, or "running" / "crashed"
    last_prompt: str
    turns: int | None
    cost: float | None
    parent: str | None


def _all_files(cwd: Path | None) -> Iterator[Path]:
    if cwd is not None:
        directory = sessions_dir(cwd)
        if directory.is_dir():
            yield from directory.glob("*.jsonl")
        return
    root = keel_home() / "sessions"
    if root.is_dir():
        yield from root.glob("*/*.jsonl")


def session_files(cwd: Path | None) -> list[Path]:
    """Session files of the project at `cwd` (or of every project), newest first."""
    return sorted(_all_files(cwd), key=lambda p: p.stem, reverse=True)


def find_session(session_id: str, cwd: Path) -> Path:
    """The file of a session given its id or a unique prefix of it: this project's first, then
    every project's."""
    if not session_id or "/" in session_id or session_id.startswith("."):
        raise UserError(
            f"{session_id!r} is not a session id", hint="`keel sessions list` shows them"
        )
    for scope in (cwd, None):
        matches = [p for p in session_files(scope) if p.stem.startswith(session_id)]
        exact = [p for p in matches if p.stem == session_id]
        if exact:
            return exact[0]
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            raise UserError(
                f"session id prefix {session_id!r} is ambiguous: "
                + ", ".join(p.stem for p in matches[:5]),
                hint="give more of the id",
            )
    raise UserError(
        f"no session {session_id!r}", hint="`keel sessions list --all` shows every session"
    )


def latest_session(cwd: Path) -> Path:
    files = session_files(cwd)
    if not files:
        raise UserError(
            f"no sessions for {cwd}", hint='start one with keel -p "…" in this directory'
        )
    return files[0]


def is_locked(path: Path) -> bool:
    """True while a writer holds the session's lock."""
    lock = Journal.lock_path(path)
    try:
        fd = os.open(lock, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def lock_holder(path: Path) -> int | None:
    """The pid written in the lock file of a running session."""
    if not is_locked(path):
        return None
    with contextlib.suppress(OSError, ValueError):
        return int(Journal.lock_path(path).read_text(encoding="utf-8").strip())
    return None


def _tail_records(path: Path, size: int) -> list[object]:
    with path.open("rb") as f:
        start = max(0, size - TAIL_BYTES)
        f.seek(start)
        data = f.read()
    lines = data.split(b"\n")
    if start > 0:
        lines = lines[1:]  # the first line is probably cut
    out: list[object] = []
    for line in lines:
        if not line.strip():
            continue
        with contextlib.suppress(RecordError):
            out.append(decode(line).payload)
    return out


def summarize(path: Path) -> SessionSummary:
    with path.open("rb") as f:
        first = f.readline()
    try:
        meta = decode(first).payload
        started = decode(first).ts
    except RecordError as exc:
        raise UserError(f"{path}: the first line is not a valid meta record ({exc})") from exc
    if not isinstance(meta, Meta):
        raise UserError(f"{path}: the first record is not meta")
    size = path.stat().st_size
    tail = _tail_records(path, size)
    terminal_at = max((i for i, p in enumerate(tail) if isinstance(p, TerminalRecord)), default=-1)
    terminal = tail[terminal_at] if terminal_at >= 0 else None
    moved_on = any(not isinstance(p, TerminalRecord) for p in tail[terminal_at + 1 :])
    prompts = [p for p in tail if isinstance(p, UserRecord) and p.source == "prompt"]
    last_prompt = prompts[-1].message.text if prompts else ""
    turns: int | None = None
    cost: float | None = None
    status: str
    if isinstance(terminal, TerminalRecord) and not moved_on:
        status = terminal.reason
        turns, cost = terminal.turns, terminal.cost
        last_prompt = last_prompt or terminal.prompt
    else:
        status = "running" if is_locked(path) else ("crashed" if size > len(first) else "empty")
        if size <= 1 << 20:  # small enough to fold whole for its totals
            from keel.session.fold import fold

            with contextlib.suppress(UserError, ValueError):
                state = fold(read_records(path).records)
                turns, cost = state.turns, state.cost
                last_prompt = last_prompt or state.last_prompt
    return SessionSummary(
        meta.id,
        path,
        started,
        meta.cwd,
        meta.model,
        status,
        last_prompt.strip().splitlines()[0][:80] if last_prompt.strip() else "",
        turns,
        cost,
        meta.parent,
    )
