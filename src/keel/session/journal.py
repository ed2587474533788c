"""The journal: one append-only JSON-lines file per session, one writer at a time.

Contract (DESIGN.md invariant 4): `append(..., durable=True)` returns only after the line is
written and fsynced; the directory is fsynced when the file is created; on open, a torn last line
is cut off *before* anything is appended (appending after a fragment would glue two records into
one corrupt line); a corrupt line in the middle is reported with its line number and nothing is
overwritten. A second writer gets an error naming the holder's pid.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from pathlib import Path
from typing import TYPE_CHECKING

from keel.errors import RunError, UserError
from keel.frozen import frozen
from keel.session.records import Payload, Record, RecordError, decode, encode, now

if TYPE_CHECKING:
    from concurrent.futures import Future, ThreadPoolExecutor

FILE_MODE = 0o600
DIR_MODE = 0o700


class SessionLocked(UserError):
    """Another process is writing this session."""


class CorruptSession(UserError):
    """A record in the middle of a session file cannot be read."""

    def __init__(self, path: Path, line: int, why: str) -> None:
        super().__init__(
            f"{path}: line {line} is not a valid record ({why})",
            hint="the file was left untouched; inspect it, or fork from an earlier record",
        )
        self.path = path
        self.line = line


class JournalWriteError(RunError):
    """Appending to the session file failed (disk full, read-only file system, …)."""


@frozen
class Loaded:
    records: list[Record]
    #: Bytes cut off the end because the last line was torn (0 if none).
    repaired_bytes: int = 0


def make_dirs(path: Path) -> None:
    """Create `path` and missing parents with mode 0700."""
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):
            d.mkdir(mode=DIR_MODE)


_datasync = getattr(os, "fdatasync", os.fsync)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_records(path: Path, *, allow_torn_tail: bool = True) -> Loaded:
    """Every record in `path`. A torn or unparsable last line is dropped (reported in
    `repaired_bytes`, the file untouched); any other bad line raises `CorruptSession`."""
    data = path.read_bytes()
    return _parse(path, data, allow_torn_tail)


def _parse(path: Path, data: bytes, allow_torn_tail: bool) -> Loaded:
    records: list[Record] = []
    lines = data.split(b"\n")
    tail = lines.pop()  # bytes after the last newline: empty unless the last line is torn
    torn = len(tail)
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            raise CorruptSession(path, number, "empty line")
        try:
            record = decode(line)
        except RecordError as exc:
            if number == len(lines) and not tail and allow_torn_tail:
                torn = len(line) + 1  # an unparsable final line is a torn write, not corruption
                break
            raise CorruptSession(path, number, str(exc)) from exc
        expected = records[-1].seq + 1 if records else 1
        if record.seq != expected:
            raise CorruptSession(path, number, f"seq {record.seq}, expected {expected}")
        records.append(record)
    if torn and not allow_torn_tail:
        raise CorruptSession(path, len(lines) + 1, "torn last line")
    return Loaded(records, torn)


class Journal:
    """Exclusive appender for one session file. Use `create` or `open`, then `append`."""

    def __init__(self, path: Path, fd: int, lock_fd: int, last_seq: int) -> None:
        self.path = path
        self._fd = fd
        self._lock_fd = lock_fd
        self.last_seq = last_seq
        self._synced_seq = last_seq
        self._background: Future[None] | None = None
        self._executor: ThreadPoolExecutor | None = None

    # -- opening -----------------------------------------------------------------------------

    @staticmethod
    def lock_path(path: Path) -> Path:
        return path.with_name(path.name + ".lock")

    @classmethod
    def _lock(cls, path: Path) -> int:
        lock = cls.lock_path(path)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, FILE_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise SessionLocked(
                f"session {path.stem} is already open for writing by pid {holder}",
                hint="wait for that run to finish, or suspend it with `keel suspend`",
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        return fd

    @classmethod
    def create(cls, path: Path, meta: Payload) -> Journal:
        """A new session file holding `meta`. The file appears under its name only once meta is
        durable in it (written to a temp name, fsynced, then hard-linked into place), so a crash
        never leaves a session file without its first record."""
        make_dirs(path.parent)
        if path.exists():
            raise UserError(f"session file {path} already exists")
        lock_fd = cls._lock(path)
        temp = path.with_name(f".{path.name}.{os.getpid()}.new")
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, FILE_MODE)
        except OSError:
            os.close(lock_fd)
            raise
        journal = cls(path, fd, lock_fd, 0)
        try:
            journal.append(meta)
            os.link(temp, path)  # atomic, and refuses to replace an existing session
        except FileExistsError:
            journal.close()
            raise UserError(f"session file {path} already exists") from None
        except BaseException:
            journal.close()
            raise
        finally:
            temp.unlink(missing_ok=True)
        _fsync_dir(path.parent)
        return journal

    @classmethod
    def open(cls, path: Path) -> tuple[Journal, Loaded]:
        """Lock `path`, cut a torn tail off, and return the journal and the records."""
        if not path.exists():
            raise UserError(f"no session file at {path}")
        lock_fd = cls._lock(path)
        try:
            fd = os.open(path, os.O_RDWR | os.O_APPEND)
            data = b""
            while chunk := os.read(fd, 1 << 20):
                data += chunk
            loaded = _parse(path, data, allow_torn_tail=True)
            if loaded.repaired_bytes:
                os.ftruncate(fd, len(data) - loaded.repaired_bytes)
                os.fsync(fd)
        except BaseException:
            os.close(lock_fd)
            raise
        last = loaded.records[-1].seq if loaded.records else 0
        return cls(path, fd, lock_fd, last), loaded

    # -- writing -----------------------------------------------------------------------------

    def append(self, payload: Payload, *, durable: bool = True) -> Record:
        """Write one record. With `durable`, also fsync it (and every earlier record) before
        returning. Without, the line is written (a killed process cannot lose it) and made durable
        by the next `sync`, `sync_in_background` or durable append."""
        record = Record(self.last_seq + 1, now(), payload)
        line = encode(record)
        try:
            written = os.write(self._fd, line)
            if written != len(line):
                raise OSError(errno.EIO, f"short write ({written} of {len(line)} bytes)")
        except OSError as exc:
            raise JournalWriteError(
                f"cannot write session file {self.path}: {exc.strerror or exc}",
                hint="free disk space or fix permissions; the run stopped and the file is readable",
            ) from exc
        self.last_seq = record.seq
        if durable:
            self.sync()
        return record

    def sync(self) -> None:
        """Make every appended record durable (waiting for a background sync if one runs)."""
        if self._background is not None:
            self._background.result()
            self._background = None
        if self._synced_seq < self.last_seq:
            self._fsync(self.last_seq)

    def sync_in_background(self) -> None:
        """Start making the records appended so far durable on a worker thread, so the fsync
        overlaps whatever the caller does next (a model request). `sync` waits for it."""
        if self._synced_seq >= self.last_seq or self._fd < 0:
            return
        if self._background is not None and not self._background.done():
            return  # the next sync() covers what this one misses
        if self._executor is None:
            from concurrent.futures import ThreadPoolExecutor

            self._executor = ThreadPoolExecutor(1, thread_name_prefix="keel-journal-sync")
        self._background = self._executor.submit(self._fsync, self.last_seq)

    def _fsync(self, upto: int) -> None:
        try:
            # fdatasync: an append changes the size, which it does flush; mtime it may skip.
            _datasync(self._fd)
        except OSError as exc:
            raise JournalWriteError(f"cannot sync session file {self.path}: {exc}") from exc
        self._synced_seq = max(self._synced_seq, upto)

    def close(self) -> None:
        if self._fd < 0:
            return
        with contextlib.suppress(OSError):
            self.sync()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        os.close(self._fd)
        self._fd = -1
        with contextlib.suppress(OSError):
            os.ftruncate(self._lock_fd, 0)
        os.close(self._lock_fd)
        self._lock_fd = -1
