"""Shell capture outside git: a metadata scan of the project tree, a content store of its files,
a digest of the whole tree, and the paths outside the project a command names.

Before a command the tree is scanned (`scan`: path → kind, mode, stamp; symlinks not followed),
and `ContentStore.refresh` keeps a copy of every regular file whose stamp changed since the last
scan (appended to one pack file, so a 10,000-file tree costs one sequential write, not 10,000
creates), within `TreeLimits`. After the command a second scan is diffed against the first
(`tree_changed`), and the store still holds what each changed file held. `digest` hashes the tree
(paths, kinds, modes, contents of the files in scope) so a restore can be checked against it.
`outside_paths` finds the paths a command line names outside the project, to report changes
there (they cannot be restored).

Pure file-system work, safe to run on a worker thread; no units, no undo, nothing above it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import stat
import time
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import field
from pathlib import Path
from typing import BinaryIO, Literal, TypeAlias

from keel.checkpoints.snapshot import FILE_MODE, size_text
from keel.frozen import frozen, mutable

EntryKind: TypeAlias = Literal["file", "dir", "link", "other"]

#: A pack holding this many times its live bytes (and over `_PACK_SLACK`) is rewritten.
_PACK_GARBAGE = 3
_PACK_SLACK = 8 * 2**20
#: Entries of one directory named by a command that are watched for changes outside the project.
_WATCH_CHILDREN = 1000
#: System trees whose changes are not the user's files (and which a command names all the time).
_NOT_WATCHED = ("/dev", "/proc", "/sys", "/run")


@frozen
class TreeLimits:
    """Bounds of the shell capture outside git (settings `checkpoints.*`)."""

    #: Files above this size are not kept (a change to one is reported as not restorable).
    file_bytes: int = 4 * 2**20
    #: Copies kept of one project's files, in all.
    total_bytes: int = 256 * 2**20
    #: A project with more entries (files, directories, links) than this is not captured.
    max_files: int = 50_000
    #: Nor one whose scan takes longer than this.
    scan_seconds: float = 3.0


class TreeTooLarge(Exception):
    """The scan went over `max_files` or `scan_seconds`; `str()` says which."""


@frozen
class Entry:
    kind: EntryKind
    mode: int
    #: (mtime_ns, ctime_ns, size, inode, st_mode): changes whenever content, mode or identity do.
    stamp: tuple[int, ...]
    target: str = ""

    @property
    def size(self) -> int:
        return self.stamp[2]

    def same(self, other: Entry | None) -> bool:
        """Whether `other` is this entry unchanged. A directory changes only by its mode or
        identity (its mtime moves whenever an entry in it does, which is the entry's change)."""
        if other is None or other.kind != self.kind:
            return False
        if self.kind == "dir":
            return (self.mode, self.stamp[3]) == (other.mode, other.stamp[3])
        return self.stamp == other.stamp and self.target == other.target


Scan: TypeAlias = dict[str, Entry]


def _entry(path: str, st: os.stat_result) -> Entry:
    s = (st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino, st.st_mode)
    mode = stat.S_IMODE(st.st_mode)
    if stat.S_ISREG(st.st_mode):
        return Entry("file", mode, s)
    if stat.S_ISDIR(st.st_mode):
        return Entry("dir", mode, s)
    if stat.S_ISLNK(st.st_mode):
        try:
            return Entry("link", mode, s, os.readlink(path))
        except OSError:
            return Entry("other", mode, s)
    return Entry("other", mode, s)


def scan(root: Path, limits: TreeLimits, *, skip: Callable[[str], bool] | None = None) -> Scan:
    """Every entry below `root` (absolute paths; `root` itself not included), symlinks not
    followed. `skip(path)` leaves a directory or file out. Raises `TreeTooLarge`."""
    out: Scan = {}
    deadline = time.monotonic() + limits.scan_seconds
    stack = [str(root)]
    while stack:
        directory = stack.pop()
        try:
            it = os.scandir(directory)
        except OSError:
            continue  # unreadable, or gone meanwhile: the command cannot have kept it either
        with it:
            for e in it:
                if skip is not None and skip(e.path):
                    continue
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                entry = _entry(e.path, st)
                out[e.path] = entry
                if entry.kind == "dir":
                    stack.append(e.path)
        if len(out) > limits.max_files:
            raise TreeTooLarge(f"the project holds more than {limits.max_files:,} files")
        if time.monotonic() > deadline:
            raise TreeTooLarge(f"scanning the project took over {limits.scan_seconds:g} s")
    return out


def tree_changed(before: Scan, after: Scan) -> list[str]:
    """Paths that differ between two scans (created, deleted, changed), sorted so a directory
    comes before what is in it."""
    paths = [p for p, e in after.items() if not e.same(before.get(p))]
    paths += [p for p in before if p not in after]
    return sorted(paths)


@mutable
class Kept:
    """What the content store knows of one file: its stamp when read, sha256 of its bytes, and
    where they are in the pack (`offset` -1: hashed, not kept; `why` says why)."""

    stamp: tuple[int, ...]
    sha256: str
    offset: int = -1
    size: int = 0
    why: str = ""


@mutable
class ContentStore:
    """Copies of a project's files, in one append-only pack file (`directory/<name>.pack`).
    The index lives in memory: a store reopened after a restart starts empty."""

    directory: Path
    name: str
    index: dict[str, Kept] = field(default_factory=dict)
    #: Bytes in the pack (live copies and ones the index no longer points at).
    _end: int = 0

    @property
    def pack(self) -> Path:
        return self.directory / f"{self.name}.pack"

    def refresh(self, entries: Scan, limits: TreeLimits) -> None:
        """Bring the store up to `entries`: read every regular file whose stamp is not the
        one kept (smallest first, within the bounds); forget paths no longer there."""
        for path in [p for p in self.index if p not in entries]:
            del self.index[path]
        wanted: list[tuple[int, str, Entry]] = []
        for path, entry in entries.items():
            if entry.kind != "file":
                self.index.pop(path, None)
                continue
            kept = self.index.get(path)
            if kept is None or kept.stamp != entry.stamp:
                self.index.pop(path, None)
                wanted.append((entry.size, path, entry))
        live = sum(k.size for k in self.index.values() if k.offset >= 0)
        if not wanted:
            return
        wanted.sort()
        if self._end > _PACK_SLACK and self._end > _PACK_GARBAGE * max(live, 1):
            self._compact()
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.pack, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, FILE_MODE)
        try:
            for size, path, entry in wanted:
                if size > limits.file_bytes:
                    self.index[path] = Kept(
                        entry.stamp, "", why=f"larger than {size_text(limits.file_bytes)}"
                    )
                    continue
                try:
                    data = _read_if_unchanged(path, entry)
                except OSError as exc:
                    why = f"cannot read it: {exc.strerror or exc}"
                    self.index[path] = Kept(entry.stamp, "", why=why)
                    continue
                if data is None:
                    continue  # changed or gone while being read: the next scan sees it again
                sha = hashlib.sha256(data).hexdigest()
                if live + len(data) > limits.total_bytes:
                    self.index[path] = Kept(
                        entry.stamp,
                        sha,
                        why=f"the project's files hold more than {size_text(limits.total_bytes)}",
                    )
                    continue
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                self.index[path] = Kept(entry.stamp, sha, self._end, len(data))
                self._end += len(data)
                live += len(data)
        finally:
            os.close(fd)

    def read(self, kept: Kept, pack: BinaryIO | None = None) -> bytes:
        """The bytes kept for one file (checked against its hash), read through `pack` (this
        store's pack, opened by the caller for many reads) or a handle of its own. Raises
        OSError."""
        with contextlib.nullcontext(pack) if pack is not None else open(self.pack, "rb") as f:
            f.seek(kept.offset)
            data = f.read(kept.size)
        if hashlib.sha256(data).hexdigest() != kept.sha256:
            raise OSError(f"the copy kept in {self.pack} is damaged")
        return data

    def _compact(self) -> None:
        """Rewrite the pack with only what the index still points at."""
        fresh = self.pack.with_suffix(".new")
        fresh.unlink(missing_ok=True)
        end = 0
        with open(self.pack, "rb") as src, open(fresh, "wb") as out:
            os.chmod(fresh, FILE_MODE)
            for kept in self.index.values():
                if kept.offset < 0:
                    continue
                src.seek(kept.offset)
                out.write(src.read(kept.size))
                kept.offset = end
                end += kept.size
        os.replace(fresh, self.pack)
        self._end = end

    def close(self) -> None:
        self.index.clear()
        self.pack.unlink(missing_ok=True)


def _read_if_unchanged(path: str, entry: Entry) -> bytes | None:
    """The bytes of the file at `path` if it is still what `entry` saw (None if it changed or
    went meanwhile). Raises OSError when it cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except (FileNotFoundError, NotADirectoryError):
        return None
    with os.fdopen(fd, "rb") as f:
        data = f.read()
        st = os.fstat(f.fileno())
    now = (st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino, st.st_mode)
    return data if now == entry.stamp else None


# -- the tree's digest --------------------------------------------------------------------------


def describe(entry: Entry, kept: Kept | None) -> str:
    """One entry as the digest sees it: a file by mode and content hash (or size and mtime when
    its content is not in scope), a link by target, a directory by mode."""
    match entry.kind:
        case "file":
            if kept is not None and kept.sha256:
                return f"file {entry.mode:o} {kept.sha256}"
            return f"file {entry.mode:o} size={entry.size} mtime={entry.stamp[0]}"
        case "link":
            return f"link {entry.target}"
        case "dir":
            return f"dir {entry.mode:o}"
        case _:
            return "other"


def digest(described: Mapping[str, str]) -> str:
    """sha256 over the sorted `relative path → description` lines."""
    h = hashlib.sha256()
    for rel in sorted(described):
        h.update(os.fsencode(rel) + b"\0" + described[rel].encode() + b"\n")
    return h.hexdigest()


def describe_tree(
    root: Path, entries: Scan, index: Mapping[str, Kept], limits: TreeLimits
) -> dict[str, str]:
    """Each entry's description keyed by its path relative to `root`; files under the per-file
    bound that the store has not hashed (restored ones, say) are hashed now."""
    out: dict[str, str] = {}
    prefix = len(str(root)) + 1
    for path, entry in entries.items():
        kept = index.get(path)
        if kept is not None and kept.stamp != entry.stamp:
            kept = None
        if entry.kind == "file" and kept is None and entry.size <= limits.file_bytes:
            data = None
            with contextlib.suppress(OSError):  # unreadable: described by size and time
                data = _read_if_unchanged(path, entry)
            if data is not None:
                kept = Kept(entry.stamp, hashlib.sha256(data).hexdigest())
        out[path[prefix:]] = describe(entry, kept)
    return out


def pack_described(described: Mapping[str, str]) -> bytes:
    """The descriptions, compressed, to keep beside a checkpoint (to name what differs later)."""
    lines = "".join(f"{rel}\0{d}\n" for rel, d in sorted(described.items()))
    return zlib.compress(lines.encode("utf-8", "surrogateescape"), 6)


def unpack_described(data: bytes) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in zlib.decompress(data).decode("utf-8", "surrogateescape").splitlines():
        rel, _, d = line.partition("\0")
        out[rel] = d
    return out


def differing(expected: Mapping[str, str], actual: Mapping[str, str]) -> list[str]:
    """Relative paths whose description differs (or that exist in only one of the two)."""
    return sorted(p for p in expected.keys() | actual.keys() if expected.get(p) != actual.get(p))


# -- outside the project ------------------------------------------------------------------------

#: A path a command line names: absolute, or in the home directory (`~/`, `$HOME/`).
_PATHLIKE = re.compile(r"""(?:^|(?<=[\s'"=<>;|&(:]))(~|\$HOME|\$\{HOME\})?(/[^\s'";|&<>()`]*)""")


def outside_paths(
    command: str, root: Path, *, home: str, keep_out: Iterable[Path] = ()
) -> list[str]:
    """Absolute paths `command` names outside `root` (and outside `keep_out`: keel's own
    directories), which a command could change and /undo cannot restore."""
    found: dict[str, None] = {}
    for prefix, rest in _PATHLIKE.findall(command):
        if "$" in rest:
            continue  # expanded by the shell: not a path keel can name
        if glob := re.search(r"[*?\[]", rest):  # a pattern: watch the directory it lists
            rest = rest[: glob.start()].rpartition("/")[0] or "/"
        path = os.path.normpath((home if prefix else "") + rest)
        if not os.path.isabs(path) or path.startswith(_NOT_WATCHED) or path == "/":
            continue
        if any(_within(path, str(p)) for p in (root, *keep_out)):
            continue
        found[path] = None
    return list(found)


def _within(path: str, base: str) -> bool:
    return path == base or path.startswith(base.rstrip(os.sep) + os.sep)


@mutable
class Watched:
    """Stamps of the paths a command names outside the project (`roots`) and, for a directory,
    of what is directly in it."""

    roots: tuple[str, ...]
    stamps: dict[str, tuple[int, ...] | None]


def watch(paths: Iterable[str]) -> Watched:
    roots = tuple(paths)
    stamps: dict[str, tuple[int, ...] | None] = {}
    for path in roots:
        stamps[path] = _stamp(path)
        if os.path.isdir(path) and not os.path.islink(path):
            with contextlib.suppress(OSError), os.scandir(path) as it:
                for n, e in enumerate(it):
                    if n >= _WATCH_CHILDREN:
                        break
                    stamps[e.path] = _stamp(e.path)
    return Watched(roots, stamps)


def watch_changes(before: Watched) -> list[str]:
    """The watched paths that changed since `before` (new entries of a watched directory too)."""
    if not before.roots:
        return []
    after = watch(before.roots).stamps
    keys = before.stamps.keys() | after.keys()
    return sorted(p for p in keys if before.stamps.get(p) != after.get(p))


def _stamp(path: str) -> tuple[int, ...] | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if stat.S_ISDIR(st.st_mode):
        return (st.st_ino, st.st_mode)
    return (st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino, st.st_mode)
