"""The memory store interface (`MemoryStore`), its errors, and the file backend.

A store keeps notes per scope (`project`: this project, keyed by its git root; `user`: every
project of this user) and gives each saved version a revision. `save` with no revision creates
(and fails with `NoteExists` if the name is taken); with a revision it is a compare-and-swap
(`StaleNote` when the note changed since that revision). Every store checks each note
(`keel.memory.note.check_note`) and the per-scope count before writing.

The file backend: one folder per scope (0700), one `<name>.md` per note (0600), written to a
temporary file and then linked (create: fails if the name exists) or renamed (update) into
place, under an exclusive lock per folder, so a compare-and-swap cannot interleave with another
writer. Notes and folders are opened with O_NOFOLLOW: a symbolic link is refused, never
followed. A file's revision is a hash of its bytes.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

from keel.frozen import frozen
from keel.memory.note import (
    MAX_BODY_BYTES,
    MAX_NOTES,
    NAME,
    InvalidNote,
    MemoryError_,
    Note,
    Scope,
    check_name,
    check_note,
    now,
    parse,
)


class NoteNotFound(MemoryError_):
    pass


class NoteExists(MemoryError_):
    pass


class StaleNote(MemoryError_):
    """The note changed (or went) since the revision the writer read."""


class TooManyNotes(InvalidNote):
    pass


class StoreUnavailable(MemoryError_):
    """The store cannot be reached or used (a server down, a folder that is a symlink)."""


@frozen
class Entry:
    scope: Scope
    note: Note
    revision: str


class MemoryStore(Protocol):
    #: "files" or "nats".
    backend: str
    #: Problems met while listing (a file that is not a note), for the caller to show once.
    warnings: list[str]

    def where(self, scope: Scope) -> str:
        """Where `scope`'s notes are kept, for people (a folder, a bucket and key prefix)."""
        ...

    async def list(self, scope: Scope) -> list[Entry]:
        """The scope's notes, sorted by name."""
        ...

    async def read(self, scope: Scope, name: str) -> Entry: ...

    async def save(self, scope: Scope, note: Note, *, revision: str | None) -> Entry:
        """Create (`revision` None) or compare-and-swap update `note`; the stored entry."""
        ...

    async def delete(self, scope: Scope, name: str, *, revision: str | None) -> None:
        """Delete; with `revision`, only if the note is still at it (else `StaleNote`)."""
        ...

    async def aclose(self) -> None: ...


def stamped(note: Note, previous: Note | None) -> Note:
    """`note` with its times: created kept from `previous`, updated now."""
    at = now()
    created = previous.created if previous is not None and previous.created else at
    return Note(note.name, note.description.strip(), note.body, note.type, created, at)


def not_found(scope: Scope, name: str) -> NoteNotFound:
    return NoteNotFound(
        f"no {scope} note named {name!r} (memory action=list shows the notes of each scope)"
    )


def exists(scope: Scope, name: str) -> NoteExists:
    return NoteExists(
        f"a {scope} note named {name!r} exists already: read it first (action=read), then "
        "save again to overwrite it, or choose another name"
    )


def stale(scope: Scope, name: str) -> StaleNote:
    return StaleNote(
        f"the {scope} note {name!r} changed since you read it (another session wrote or "
        "deleted it): read it again, then save your version if it still applies"
    )


def too_many(scope: Scope) -> TooManyNotes:
    return TooManyNotes(
        f"the {scope} scope holds {MAX_NOTES} notes, the most it may: delete notes that are no "
        "longer useful (or merge related ones) first"
    )


def _revision(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


class FileStore:
    """Notes as files: `<base>/<project_key>/` for the project, `<base>/_user/` for the user."""

    backend = "files"

    def __init__(self, base: Path, project_key: str) -> None:
        self.base = base
        self.dirs: dict[Scope, Path] = {"project": base / project_key, "user": base / "_user"}
        self.warnings: list[str] = []

    def where(self, scope: Scope) -> str:
        return str(self.dirs[scope])

    # -- folders -------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _folder(self, scope: Scope, *, create: bool) -> Iterator[int | None]:
        """The scope's folder as an open descriptor (None: it does not exist and `create` is
        False). Refuses a folder that is a symbolic link or not a folder."""
        path = self.dirs[scope]
        if create:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            with contextlib.suppress(FileExistsError):
                path.mkdir(mode=0o700)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except FileNotFoundError:
            if create:
                raise
            yield None
            return
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise StoreUnavailable(
                    f"the memory folder {path} is a symbolic link or not a folder; keel refuses "
                    "to follow it (make it a real folder)"
                ) from exc
            raise
        try:
            if stat.S_IMODE(os.fstat(fd).st_mode) != 0o700:
                os.fchmod(fd, 0o700)
            yield fd
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def _locked(self, scope: Scope) -> Iterator[int]:
        with self._folder(scope, create=True) as fd:
            assert fd is not None
            lock = os.open(".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600, dir_fd=fd)
            try:
                fcntl.flock(lock, fcntl.LOCK_EX)
                yield fd
            finally:
                os.close(lock)  # releases the lock

    # -- files ---------------------------------------------------------------------------------

    def _read_bytes(self, fd: int, scope: Scope, name: str) -> bytes | None:
        try:
            f = os.open(f"{name}.md", os.O_RDONLY | os.O_NOFOLLOW, dir_fd=fd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise MemoryError_(
                    f"the {scope} note {name!r} is a symbolic link; keel refuses to follow it "
                    f"(remove {self.dirs[scope] / (name + '.md')})"
                ) from exc
            raise
        try:
            info = os.fstat(f)
            if not stat.S_ISREG(info.st_mode):
                raise MemoryError_(f"the {scope} note {name!r} is not a regular file")
            cap = MAX_BODY_BYTES + 4096
            data = os.read(f, cap + 1)
            if len(data) > cap:
                raise InvalidNote(
                    f"the {scope} note {name!r} is larger than a note may be ({cap} bytes); "
                    f"shorten {self.dirs[scope] / (name + '.md')}"
                )
            return data
        finally:
            os.close(f)

    def _entry(self, scope: Scope, name: str, data: bytes) -> Entry:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidNote(f"the {scope} note {name!r} is not UTF-8 text") from exc
        return Entry(scope, parse(text, name), _revision(data))

    def _write_tmp(self, fd: int, data: bytes) -> str:
        tmp = f".tmp-{secrets.token_hex(6)}"
        f = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=fd)
        try:
            os.fchmod(f, 0o600)
            os.write(f, data)
            os.fsync(f)
        finally:
            os.close(f)
        return tmp

    # -- the interface -------------------------------------------------------------------------

    async def list(self, scope: Scope) -> list[Entry]:
        with self._folder(scope, create=False) as fd:
            if fd is None:
                return []
            out = []
            for file in sorted(os.listdir(fd)):
                if not file.endswith(".md") or file.startswith("."):
                    continue
                name = file[:-3]
                if not NAME.match(name):
                    self.warnings.append(
                        f"{self.dirs[scope] / file}: not a valid note name; skipped (use lower "
                        "case letters, digits, '-' and '_')"
                    )
                    continue
                try:
                    data = self._read_bytes(fd, scope, name)
                    if data is not None:
                        out.append(self._entry(scope, name, data))
                except MemoryError_ as exc:
                    self.warnings.append(f"{exc}; skipped")
            return out

    async def read(self, scope: Scope, name: str) -> Entry:
        check_name(name)
        with self._folder(scope, create=False) as fd:
            data = None if fd is None else self._read_bytes(fd, scope, name)
            if data is None:
                raise not_found(scope, name)
            return self._entry(scope, name, data)

    async def save(self, scope: Scope, note: Note, *, revision: str | None) -> Entry:
        check_note(note)
        with self._locked(scope) as fd:
            current = self._read_bytes(fd, scope, note.name)
            previous = None if current is None else self._entry(scope, note.name, current)
            if revision is None and previous is not None:
                raise exists(scope, note.name)
            if revision is not None and (previous is None or previous.revision != revision):
                raise stale(scope, note.name)
            if previous is None and self._count(fd) >= MAX_NOTES:
                raise too_many(scope)
            stored = stamped(note, previous.note if previous else None)
            from keel.memory.note import render

            data = render(stored).encode("utf-8")
            tmp = self._write_tmp(fd, data)
            try:
                if previous is None:
                    os.link(tmp, f"{note.name}.md", src_dir_fd=fd, dst_dir_fd=fd)
                else:
                    os.rename(tmp, f"{note.name}.md", src_dir_fd=fd, dst_dir_fd=fd)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp, dir_fd=fd)
            os.fsync(fd)
            return Entry(scope, stored, _revision(data))

    def _count(self, fd: int) -> int:
        return sum(
            1 for f in os.listdir(fd) if f.endswith(".md") and NAME.match(f[:-3]) is not None
        )

    async def delete(self, scope: Scope, name: str, *, revision: str | None) -> None:
        check_name(name)
        with self._locked(scope) as fd:
            current = self._read_bytes(fd, scope, name)
            if current is None:
                if revision is not None:
                    raise stale(scope, name)
                raise not_found(scope, name)
            if revision is not None and _revision(current) != revision:
                raise stale(scope, name)
            os.unlink(f"{name}.md", dir_fd=fd)
            os.fsync(fd)

    async def aclose(self) -> None:
        return None
