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
from keel.session.records import Meta, RecordError, TerminalRecord, decode
from keel.session.store import keel_home, sessions_dir


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
    #: The agent type, for a subagent's session.
    agent: str = ""


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


def child_sessions(path: Path) -> list[Path]:
    """The session files of the subagents a session started (`<id>.agents/`), oldest first."""
    return sorted(path.with_name(f"{path.stem}.agents").glob("*.jsonl"), key=lambda p: p.stem)


def _child_files(cwd: Path | None) -> list[Path]:
    return [child for parent in session_files(cwd) for child in child_sessions(parent)]


def find_session(session_id: str, cwd: Path) -> Path:
    """The file of a session given its id or a unique prefix of it: this project's first, then
    every project's."""
    if not session_id or "/" in session_id or session_id.startswith("."):
        raise UserError(
            f"{session_id!r} is not a session id", hint="`keel sessions list` shows them"
        )
    for scope, files in (
        (cwd, session_files),
        (None, session_files),
        (cwd, _child_files),  # a subagent's session, by its own id
        (None, _child_files),
    ):
        matches = [p for p in files(scope) if p.stem.startswith(session_id)]
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
    """The project's most recently active session (last written to)."""
    files = session_files(cwd)
    if not files:
        raise UserError(
            f"no sessions for {cwd}", hint='start one with keel -p "…" in this directory'
        )
    return max(files, key=lambda p: p.stat().st_mtime_ns)


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


def _last_line(path: Path, size: int) -> bytes:
    """The file's last complete line (without reading the rest)."""
    with path.open("rb") as f:
        chunk = 4096
        while True:
            start = max(0, size - chunk)
            f.seek(start)
            data = f.read(size - start).rstrip(b"\n")
            nl = data.rfind(b"\n")
            if nl >= 0 or start == 0:
                return data[nl + 1 :]
            chunk *= 4


def summarize(path: Path) -> SessionSummary:
    """A session's summary from its first and last lines; a session that does not end with a
    terminal record (running, or crashed) is folded whole when small enough."""
    with path.open("rb") as f:
        first = f.readline()
        size = os.fstat(f.fileno()).st_size
    try:
        head = decode(first)
    except RecordError as exc:
        raise UserError(f"{path}: the first line is not a valid meta record ({exc})") from exc
    meta = head.payload
    if not isinstance(meta, Meta):
        raise UserError(f"{path}: the first record is not meta")
    last = _last_line(path, size) if size > len(first) else b""
    terminal = None
    if b'"type":"terminal"' in last:
        with contextlib.suppress(RecordError):
            payload = decode(last).payload
            terminal = payload if isinstance(payload, TerminalRecord) else None
    turns: int | None = None
    cost: float | None = None
    last_prompt = ""
    status: str
    if terminal is not None:
        status, turns, cost, last_prompt = (
            terminal.reason,
            terminal.turns,
            terminal.cost,
            terminal.prompt,
        )
    else:
        status = "running" if is_locked(path) else ("crashed" if last else "empty")
        if size <= 1 << 20:  # small enough to fold whole for its totals
            from keel.session.fold import fold

            with contextlib.suppress(UserError, ValueError):
                state = fold(read_records(path).records)
                turns, cost, last_prompt = state.turns, state.cost, state.last_prompt
                if state.recovered and state.terminal is not None and status == "crashed":
                    status = state.terminal.reason  # killed after its final answer: it ended
    first_line = last_prompt.strip().splitlines()[0][:80] if last_prompt.strip() else ""
    return SessionSummary(
        meta.id,
        path,
        head.ts,
        meta.cwd,
        meta.model,
        status,
        first_line,
        turns,
        cost,
        meta.parent,
        meta.agent,
    )
