"""The journal: one append-only JSON-lines file per session, one writer at a time.

Contract (DESIGN.md invariant 4): `append(..., durable=True)` returns only after the line is
written and fsynced; the directory is fsynced when the file is created. Only an unterminated last
line (bytes after the last newline: a write the crash cut short) counts as torn: `open` finds it,
and it is cut off before the first append, its bytes saved beside the file
(`<id>.jsonl.torn-<time>`), so appending never glues a record onto a fragment and no byte is lost.
Any complete line that cannot be read (a newer format, an unknown record type, garbage), last or
not, raises `CorruptSession` with its line number, and nothing is written. A second writer gets
an error naming the holder's pid.
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
from keel.session.records import (
    NewerFormat,
    Payload,
    Record,
    RecordError,
    decode,
    encode,
    now,
)

if TYPE_CHECKING:
    from concurrent.futures import Future, ThreadPoolExecutor

FILE_MODE = 0o600
DIR_MODE = 0o700
#: Threads that run background syncs, shared by every journal of the process: a journal has at
#: most one sync running, and a server holding a thousand sessions must not hold a thread for
#: each one that ever ran (it did: ~20 KB of RSS and 8 MB of address space per idle session).
SYNC_THREADS = 8
_SYNC_POOLS: dict[int, ThreadPoolExecutor] = {}


def _sync_pool() -> ThreadPoolExecutor:
    """The process's sync threads, by pid (a forked child has none of its parent's threads)."""
    pool = _SYNC_POOLS.get(os.getpid())
    if pool is None:
        from concurrent.futures import ThreadPoolExecutor

        pool = ThreadPoolExecutor(SYNC_THREADS, thread_name_prefix="keel-journal-sync")
        _SYNC_POOLS[os.getpid()] = pool
    return pool


class SessionLocked(UserError):
    """Another process is writing this session."""


class CorruptSession(UserError):
    """A complete line of a session file cannot be read; the file is left as it is."""

    def __init__(self, path: Path, line: int, why: str, *, newer: bool = False) -> None:
        hint = (
            "upgrade keel to read this session; the file was left untouched"
            if newer
            else "the file was left untouched; inspect it (keel sessions show ID --json), or "
            "fork from an earlier prompt (keel fork ID --at SEQ)"
        )
        super().__init__(f"{path}: line {line} is not a valid record ({why})", hint=hint)
        self.path = path
        self.line = line


class JournalWriteError(RunError):
    """Appending to the session file failed (disk full, read-only file system, …)."""


@frozen
class Loaded:
    records: list[Record]
    #: Bytes of an unterminated last line (a torn write; 0 if none). A reader leaves them; the
    #: writer cuts them off, saved beside the file, before its first append.
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
    """Every record in `path`. An unterminated last line (a torn write) is left out (reported in
    `repaired_bytes`, the file untouched) unless `allow_torn_tail` is false; any complete line
    that cannot be read raises `CorruptSession`."""
    data = path.read_bytes()
    return _parse(path, data, allow_torn_tail)


def _parse(path: Path, data: bytes, allow_torn_tail: bool) -> Loaded:
    records: list[Record] = []
    lines = data.split(b"\n")
    tail = lines.pop()  # bytes after the last newline: empty unless the last line is torn
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            raise CorruptSession(path, number, "empty line")
        try:
            record = decode(line)
        except RecordError as exc:
            # A complete line is never a torn write: cutting it would lose a record (a newer
            # keel's, say). Only the unterminated tail may go.
            raise CorruptSession(
                path, number, str(exc), newer=isinstance(exc, NewerFormat)
            ) from exc
        expected = records[-1].seq + 1 if records else 1
        if record.seq != expected:
            raise CorruptSession(path, number, f"seq {record.seq}, expected {expected}")
        records.append(record)
    if tail and not allow_torn_tail:
        raise CorruptSession(path, len(lines) + 1, "torn last line")
    return Loaded(records, len(tail))


def torn_path(path: Path, stamp: str) -> Path:
    """Where the bytes of a torn last line cut off `path` are kept."""
    return path.with_name(f"{path.name}.torn-{stamp}")


class Journal:
    """Exclusive appender for one session file. Use `create` or `open`, then `append`."""

    def __init__(self, path: Path, fd: int, lock_fd: int, last_seq: int) -> None:
        self.path = path
        self._fd = fd
        self._lock_fd = lock_fd
        self.last_seq = last_seq
        self._synced_seq = last_seq
        self._background: Future[None] | None = None
        #: A torn last line found by `open`: (its offset, its bytes), cut by `repair`.
        self._torn: tuple[int, bytes] | None = None

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
        """Lock `path` and return the journal and the records. Nothing is written here: a torn
        tail is cut by `repair` (or the first append), once the caller's checks have passed."""
        if not path.exists():
            raise UserError(f"no session file at {path}")
        lock_fd = cls._lock(path)
        fd = -1
        try:
            fd = os.open(path, os.O_RDWR | os.O_APPEND)
            data = b""
            while chunk := os.read(fd, 1 << 20):
                data += chunk
            loaded = _parse(path, data, allow_torn_tail=True)
        except BaseException:
            if fd >= 0:
                os.close(fd)
            os.close(lock_fd)
            raise
        last = loaded.records[-1].seq if loaded.records else 0
        journal = cls(path, fd, lock_fd, last)
        if loaded.repaired_bytes:
            cut = len(data) - loaded.repaired_bytes
            journal._torn = (cut, data[cut:])
        return journal, loaded

    def repair(self) -> Path | None:
        """Cut the torn last line `open` found, after saving its bytes beside the file (0600,
        fsynced before the cut). Returns where they went; None when there was nothing to cut."""
        if self._torn is None:
            return None
        cut, fragment = self._torn
        saved = torn_path(self.path, now().replace(":", "").replace("-", ""))
        try:
            fd = os.open(saved, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
            try:
                os.write(fd, fragment)
                os.fsync(fd)
            finally:
                os.close(fd)
            _fsync_dir(self.path.parent)
            os.ftruncate(self._fd, cut)
            os.fsync(self._fd)
        except OSError as exc:
            raise JournalWriteError(
                f"cannot cut the torn last line of {self.path}: {exc.strerror or exc}",
                hint="free disk space or fix permissions; the file was not changed",
            ) from exc
        self._torn = None
        return saved

    # -- writing -----------------------------------------------------------------------------

    def append(self, payload: Payload, *, durable: bool = True) -> Record:
        """Write one record. With `durable`, also fsync it (and every earlier record) before
        returning. Without, the line is written (a killed process cannot lose it) and made durable
        by the next `sync`, `sync_in_background` or durable append."""
        if self._torn is not None:
            self.repair()  # never glue a record onto a fragment
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
        self._background = _sync_pool().submit(self._fsync, self.last_seq)

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
        os.close(self._fd)
        self._fd = -1
        with contextlib.suppress(OSError):
            os.ftruncate(self._lock_fd, 0)
        os.close(self._lock_fd)
        self._lock_fd = -1
