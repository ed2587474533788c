"""What was at a path before a unit changed it, and putting it back: one file at a time.

`Saved` is one manifest entry (bytes and mode of a regular file, a symlink's target, "did not
exist", a directory the unit created, or "not kept, and why"). `state_of` is a short fingerprint
of what is at a path now, used to tell whether a file changed after the unit left it. Restores
go through a temp file and an atomic rename, never through a symlink on the way. This module does
no bookkeeping of units and must not import anything above it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
from pathlib import Path
from typing import Any, Literal, TypeAlias

from keel.frozen import frozen

FILE_MODE = 0o600
DIR_MODE = 0o700
_CHUNK = 1 << 20

#: `file`: content in `blob`; `absent`: nothing was there; `symlink`: a link to `target`;
#: `newdir`: a directory the unit created; `dir`: a directory that was there with `mode` (a
#: command deleted it or changed its mode); `uncaptured`: the unit changed it, but what was there
#: was not kept (`why`).
Kind: TypeAlias = Literal["file", "absent", "symlink", "newdir", "dir", "uncaptured"]
KINDS = ("file", "absent", "symlink", "newdir", "dir", "uncaptured")


@frozen
class Saved:
    path: str
    kind: Kind
    blob: str = ""
    mode: int = 0
    sha256: str = ""
    target: str = ""
    why: str = ""
    #: What changed it: `write` (a file tool) or `bash`.
    by: str = "write"
    #: Where in `blob` the bytes are, when `blob` is a pack of several (-1: the whole blob).
    offset: int = -1
    length: int = 0

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"op": self.kind, "path": self.path, "by": self.by}
        if self.kind == "file":
            d.update(blob=self.blob, mode=self.mode, sha256=self.sha256)
            if self.offset >= 0:
                d.update(offset=self.offset, length=self.length)
        elif self.kind == "dir":
            d["mode"] = self.mode
        elif self.kind == "symlink":
            d["target"] = self.target
        elif self.kind == "uncaptured":
            d["why"] = self.why
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Saved:
        return cls(
            str(d["path"]),
            d["op"],
            str(d.get("blob", "")),
            int(d.get("mode", 0)),
            str(d.get("sha256", "")),
            str(d.get("target", "")),
            str(d.get("why", "")),
            str(d.get("by", "write")),
            int(d.get("offset", -1)),
            int(d.get("length", 0)),
        )


def size_text(n: int) -> str:
    """`2 MB` for whole megabytes, else `1,234 bytes`."""
    return f"{n // 2**20} MB" if n >= 2**20 and n % 2**20 == 0 else f"{n:,} bytes"


class SnapshotError(OSError):
    """Saving or restoring one path failed; `str()` is a short reason."""


def lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None


def stamp(st: os.stat_result | None) -> tuple[int, ...] | None:
    """Changes whenever the file's content, mode or identity does (ctime cannot be set back)."""
    if st is None:
        return None
    return (st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino, st.st_mode)


def state_of(path: str, *, hash_limit: int) -> str:
    """What is at `path`, in a few bytes: `absent`, `link:<target>`, `sha256:<hex>` (a regular
    file up to `hash_limit` bytes), `size:<n>` (a larger one), `dir` or `other`."""
    st = lstat(path)
    if st is None:
        return "absent"
    if stat.S_ISLNK(st.st_mode):
        return "link:" + os.readlink(path)
    if stat.S_ISDIR(st.st_mode):
        return "dir"
    if not stat.S_ISREG(st.st_mode):
        return "other"
    if st.st_size > hash_limit:
        return f"size:{st.st_size}"
    digest = hashlib.sha256()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return "other"
    with os.fdopen(fd, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return "sha256:" + digest.hexdigest()


def _create(path: Path) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, FILE_MODE)


def save_file(source: str, blob: Path, *, limit: int) -> tuple[int, str] | str:
    """Copy the regular file `source` to `blob` (0600). Returns (mode, sha256), or why it was not
    kept (larger than `limit`, not a regular file). Raises `SnapshotError` when I/O fails."""
    try:
        fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise SnapshotError(f"cannot read it: {exc.strerror}") from exc
    with os.fdopen(fd, "rb") as src:
        st = os.fstat(src.fileno())
        if not stat.S_ISREG(st.st_mode):
            return "not a regular file"
        if st.st_size > limit:
            return f"larger than {size_text(limit)}"
        digest = hashlib.sha256()
        try:
            with os.fdopen(_create(blob), "wb") as out:
                while chunk := src.read(_CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
        except OSError as exc:
            blob.unlink(missing_ok=True)
            raise SnapshotError(f"cannot save a copy: {exc.strerror or exc}") from exc
    return stat.S_IMODE(st.st_mode), digest.hexdigest()


def save_bytes(data: bytes, blob: Path) -> str:
    """Write `data` to `blob` (0600); returns its sha256."""
    try:
        with os.fdopen(_create(blob), "wb") as out:
            out.write(data)
    except OSError as exc:
        blob.unlink(missing_ok=True)
        raise SnapshotError(f"cannot save a copy: {exc.strerror or exc}") from exc
    return hashlib.sha256(data).hexdigest()


def check_parents(path: str) -> None:
    """Refuse a restore through a symlink: the nearest existing ancestor of `path` must be a real
    directory at its recorded place (paths are recorded with symlinks resolved). Creates missing
    directories below it."""
    parent = Path(path).parent
    existing = parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing.resolve() != existing:
        raise SnapshotError(f"{existing} is now a symlink; not following it")
    if not existing.is_dir():
        raise SnapshotError(f"{existing} is no longer a directory")
    if existing != parent:
        parent.mkdir(parents=True, exist_ok=True)


def _temp_beside(path: str) -> Path:
    p = Path(path)
    return p.with_name(f".{p.name}.{os.getpid()}.keel-undo")


def restore_file(
    path: str, blob: Path, *, mode: int, sha256: str, offset: int = -1, length: int = 0
) -> None:
    """Put the content of `blob` (or of its `length` bytes at `offset`) at `path` with `mode`,
    atomically; the content's hash must match."""
    current = lstat(path)
    if current is not None and stat.S_ISDIR(current.st_mode):
        raise SnapshotError("it is now a directory; left in place")
    check_parents(path)
    tmp = _temp_beside(path)
    digest = hashlib.sha256()
    try:
        with open(blob, "rb") as src, os.fdopen(_create(tmp), "wb") as out:
            left = length if offset >= 0 else -1
            if offset >= 0:
                src.seek(offset)
            while left != 0 and (chunk := src.read(_CHUNK if left < 0 else min(left, _CHUNK))):
                left -= len(chunk) if left > 0 else 0
                digest.update(chunk)
                out.write(chunk)
        if digest.hexdigest() != sha256:
            raise SnapshotError("its saved copy is damaged; left as it is")
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except FileNotFoundError as exc:
        tmp.unlink(missing_ok=True)
        raise SnapshotError("its saved copy is missing; left as it is") from exc
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def restore_symlink(path: str, target: str) -> None:
    current = lstat(path)
    if current is not None and stat.S_ISDIR(current.st_mode):
        raise SnapshotError("it is now a directory; left in place")
    check_parents(path)
    tmp = _temp_beside(path)
    tmp.unlink(missing_ok=True)
    os.symlink(target, tmp)
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def remove(path: str) -> bool:
    """Delete what the unit created at `path`. False if nothing is there any more."""
    current = lstat(path)
    if current is None:
        return False
    if stat.S_ISDIR(current.st_mode):
        raise SnapshotError("it is now a directory; left in place")
    check_parents(path)
    os.unlink(path)
    return True


def restore_dir(path: str, mode: int) -> None:
    """Make the directory at `path` exist again with `mode` (recreated, or its mode set back)."""
    current = lstat(path)
    if current is not None and not stat.S_ISDIR(current.st_mode):
        raise SnapshotError("it is no longer a directory; left in place")
    if current is None:
        check_parents(os.path.join(path, "x"))
    os.chmod(path, mode)


def remove_dir(path: str) -> bool:
    """Remove a directory the unit created, if it is empty. False if it is gone already."""
    current = lstat(path)
    if current is None:
        return False
    if not stat.S_ISDIR(current.st_mode):
        raise SnapshotError("it is no longer a directory; left in place")
    try:
        os.rmdir(path)
    except OSError as exc:
        raise SnapshotError("the directory is not empty; left in place") from exc
    return True


def copy_aside(path: str, dest: Path) -> bool:
    """Keep a copy of the regular file at `path` in `dest` (before undo overwrites it)."""
    with contextlib.suppress(SnapshotError):
        return isinstance(save_file(path, dest, limit=1 << 62), tuple)
    return False
