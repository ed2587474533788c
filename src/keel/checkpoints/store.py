"""Checkpoints: what each user prompt's changes replaced, kept so that `/undo` can put it back.

One store per session, in `<session stem>.checkpoints/` beside the session file (directories
0700, files 0600), or in a temp directory for library use without a session. A *unit* is one user
prompt: the front end calls `begin_unit` before each prompt, and everything the prompt changes
(its subagents included: they share the store) belongs to it. The first write to a path in a unit
keeps what was there (bytes and mode, a symlink's target, or that nothing was); in a git
repository a bash command's changes are captured by comparing `git status` before and after it,
anywhere else by scanning the project tree before and after it (`keel.checkpoints.tree`: the
first scan keeps copies of the files that changed since the last one). A unit keeps the digest of
the project tree as it was before its first command, and `undo` checks the restored tree against
it. `undo` restores the newest unit that changed files and retires it.

Layout: `<id>/manifest.jsonl` (a header line, then one line per kept path, appended) with the
copies as `<n>.bin` (a command's captured files share one `<n>.pack`) and the tree a checkpoint
digest was taken of as `tree-<n>.z`; a session's copies of the project files live in
`cache/` (rebuilt after a restart); an undone unit is renamed `undone-<id>-<ms>/` (it also keeps copies of files
the undo overwrote), and everything older than the retention (7 days) is pruned when a store
opens. Nothing is fsynced: a snapshot survives keel crashing, not necessarily the machine.

Safe for concurrent use by the tasks of one event loop: state changes happen in synchronous
stretches, and the bash capture, which awaits git, holds one asyncio lock. This module never
imports tools, sessions or the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import os
import re
import shutil
import stat
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, BinaryIO

from keel.checkpoints import git
from keel.checkpoints.snapshot import (
    DIR_MODE,
    FILE_MODE,
    KINDS,
    Kind,
    Saved,
    SnapshotError,
    copy_aside,
    lstat,
    remove,
    remove_dir,
    restore_dir,
    restore_file,
    restore_symlink,
    save_bytes,
    save_file,
    size_text,
    stamp,
    state_of,
)
from keel.checkpoints.tree import (
    ContentStore,
    Kept,
    Scan,
    TreeLimits,
    TreeTooLarge,
    Watched,
    describe_tree,
    differing,
    digest,
    outside_paths,
    pack_described,
    scan,
    tree_changed,
    unpack_described,
    watch,
    watch_changes,
)
from keel.errors import RunError, UserError
from keel.frozen import frozen, mutable
from keel.session.journal import make_dirs

RETENTION = timedelta(days=7)
#: A file-tool write keeps the previous content of a file up to this size.
MAX_FILE_BYTES = 64 * 2**20
#: Shell capture: above this many paths differing from the last commit, nothing is captured.
BASH_MAX_FILES = 2000
#: Shell capture: dirty files are copied before each command up to this size each…
BASH_FILE_BYTES = 2 * 2**20
#: …and this much in all (and a command's changed committed files are fetched up to this much).
BASH_TOTAL_BYTES = 64 * 2**20
#: Kernel file timestamps may lag the clock by a tick; a created file's ctime is compared with
#: the command's start less this.
_CTIME_SLACK_NS = 50_000_000
#: Dirty files read before a command on a worker thread above this many bytes.
_THREAD_BYTES = 1 << 20
MANIFEST = "manifest.jsonl"
_UNIT_DIR = re.compile(r"^\d{4,}$")
_UNDONE_DIR = re.compile(r"^undone-\d{4,}-(\d+)$")
#: The session's copies of the project files (rebuilt after a restart: the index is in memory).
CACHE = "cache"
#: Paths named in a tree check's summary when it does not match.
_SHOWN_DIFFERING = 20
_OUTSIDE_WHY = "outside the project; /undo keeps only the project's files"


class CheckpointError(RunError):
    """What a write would replace could not be kept (the write is not made)."""


class NothingToUndo(UserError):
    def __init__(self) -> None:
        super().__init__(
            "nothing to undo",
            hint="undo covers keel's file edits and bash commands' changes in the project",
        )


@frozen
class UnitInfo:
    id: str
    label: str
    time: datetime
    #: Paths the unit changed (whose earlier state it keeps, or knows it could not keep).
    files: tuple[Path, ...]
    #: What the unit could not capture (bash changes above the bounds, a git failure).
    notes: tuple[str, ...] = ()


@frozen
class Problem:
    path: Path
    why: str


@frozen
class TreeCheck:
    """A restored project tree compared with the digest taken at the checkpoint (before the
    unit's first command there): `matches`, or the paths that differ (`differing`, at most 20
    of `count`). `why` is set when the tree could not be checked."""

    root: Path
    matches: bool
    checkpoint: str
    now: str = ""
    differing: tuple[Path, ...] = ()
    count: int = 0
    why: str = ""


@frozen
class UndoSummary:
    """What `undo` did. `restored` and `removed` are the files put back; `overwritten` lists
    files that had changed after the unit (restored anyway; `why` says where the newer version
    was kept); `failed` the ones left as they are, and why."""

    unit: str
    label: str
    time: datetime
    restored: tuple[Path, ...] = ()
    removed: tuple[Path, ...] = ()
    failed: tuple[Problem, ...] = ()
    overwritten: tuple[Problem, ...] = ()
    #: What the unit (and any later unit it took along) could not capture.
    notes: tuple[str, ...] = ()
    #: The project trees checked against their checkpoint digest after the restore.
    checks: tuple[TreeCheck, ...] = ()

    @property
    def files(self) -> tuple[Path, ...]:
        return self.restored + self.removed


@frozen
class BashToken:
    """Returned by `before_bash`; hand it to `after_bash`."""

    top: Path
    command: str
    #: Captured by scanning the tree at `top` (no git repository there).
    tree: bool = False
    #: What the command names outside the project, as it was before.
    outside: Watched | None = None


@mutable
class _Unit:
    id: str
    label: str
    time: float
    directory: Path
    saved: dict[str, Saved] = field(default_factory=dict)
    #: What each changed path held when the unit last changed it (see `state_of`).
    left: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    blobs: int = 0
    on_disk: bool = False
    #: Checkpoint digests of project trees: root → (digest, file of descriptions, file_bytes).
    trees: dict[str, tuple[str, str, int]] = field(default_factory=dict)
    #: Trees described before the unit wrote anything to disk (written when it does).
    pending_trees: dict[str, tuple[dict[str, str], int]] = field(default_factory=dict)

    def info(self) -> UnitInfo:
        files = tuple(Path(s.path) for s in self.saved.values() if s.kind != "newdir")
        return UnitInfo(
            self.id, self.label, datetime.fromtimestamp(self.time, UTC), files, tuple(self.notes)
        )


@mutable
class _Pre:
    """A path `git status` listed before a command: its stamp, and what was there."""

    stamp: tuple[int, ...] | None
    kind: Kind
    data: bytes | None = None
    mode: int = 0
    target: str = ""
    why: str = ""
    #: Already kept by the unit: no copy needed.
    known: bool = False

    @property
    def size(self) -> int:
        return len(self.data) if self.data is not None else 0


@mutable
class _TreeBaseline:
    """A project tree (no git) scanned before the first of the commands running in it."""

    root: Path
    entries: Scan | None
    skipped: str | None = None
    users: int = 0


@mutable
class _Baseline:
    """The state of one work tree before the first of the commands running in it."""

    top: Path
    start_ns: int
    dirty: dict[str, _Pre]
    skipped: str | None = None
    users: int = 0


class Checkpoints:
    """Snapshots for `/undo`, bound to one directory. See the module docstring."""

    def __init__(
        self, directory: Path, *, retention: timedelta | None = RETENTION, temporary: bool = False
    ) -> None:
        self.directory = directory
        self.retention = retention
        self._temporary = temporary
        #: Units that kept something, oldest first.
        self._units: list[_Unit] = []
        self._current: _Unit | None = None
        self._next = 1
        self._baselines: dict[Path, _Baseline] = {}
        #: Copies of dirty files from the last command, reused while their stamps hold.
        self._cache: dict[str, _Pre] = {}
        self._tops: dict[Path, Path | None] = {}
        self._bash_lock = asyncio.Lock()
        #: Bounds of the capture outside git (the bash tool passes the settings' each time).
        self.limits = TreeLimits()
        self._tree_bases: dict[Path, _TreeBaseline] = {}
        self._contents: dict[Path, ContentStore] = {}
        #: Trees found over the bounds: not scanned again in this process (a home directory
        #: would cost a scan up to the bound before every command).
        self._too_large: dict[Path, str] = {}
        #: The paths the last shell command changed (absolute), as `git status` saw them.
        self.last_changed: tuple[str, ...] = ()
        if retention is not None:
            self.prune(older_than=retention)
        # Copies left by an earlier process: their index was in memory, so they are useless.
        shutil.rmtree(self.directory / CACHE, ignore_errors=True)
        self._load()

    @classmethod
    def for_session(
        cls, session_file: Path, *, retention: timedelta | None = RETENTION
    ) -> Checkpoints:
        """The store beside `session_file` (`<stem>.checkpoints/`), with what it already holds."""
        return cls(session_file.with_name(session_file.stem + ".checkpoints"), retention=retention)

    @classmethod
    def temporary(cls) -> Checkpoints:
        """A store in a new temp directory (no session); `close` deletes it."""
        return cls(
            Path(tempfile.mkdtemp(prefix="keel-checkpoints-")), retention=None, temporary=True
        )

    def drop_copies(self) -> None:
        """Delete the copies of project files kept for the next command (the session ends);
        what units kept stays. A later command copies the tree again."""
        for contents in self._contents.values():
            contents.close()
        self._contents.clear()
        shutil.rmtree(self.directory / CACHE, ignore_errors=True)
        with contextlib.suppress(OSError):
            self.directory.rmdir()  # only if no unit was kept: a store that kept nothing

    def close(self) -> None:
        """Delete the copies of project files, and the directory of a temporary store (a
        session's store stays)."""
        self.drop_copies()
        if self._temporary:
            shutil.rmtree(self.directory, ignore_errors=True)

    # -- units ------------------------------------------------------------------------------------

    def begin_unit(self, label: str = "") -> str:
        """Start the undo unit of a new user prompt (`label`: the prompt); returns its id.
        Subagents do not call it: their changes belong to the prompt that started them."""
        current = self._current
        unit_id = current.id if current is not None and not current.on_disk else self._new_id()
        self._current = _Unit(unit_id, label, time.time(), self.directory / unit_id)
        return unit_id

    def units(self) -> list[UnitInfo]:
        """Units that kept something, oldest first (units that changed nothing are not listed)."""
        return [u.info() for u in self._units]

    # -- file tools -------------------------------------------------------------------------------

    def before_write(self, path: Path | str) -> None:
        """Keep what is at `path` before a file tool writes it: once per path per unit. Raises
        `CheckpointError` if it cannot (the write should then not happen)."""
        key = os.path.abspath(path)
        unit = self._unit()
        if key in unit.saved:
            return
        try:
            for d in _missing_dirs(key):
                if d not in unit.saved:
                    self._add(unit, Saved(d, "newdir"))
            self._add(unit, self._save_current(unit, key, by="write"))
        except OSError as exc:
            why = str(exc) if isinstance(exc, SnapshotError) else exc.strerror or str(exc)
            raise CheckpointError(
                f"could not keep {key} for /undo: {why}",
                hint=f"check free space and permissions of {self.directory}",
            ) from exc

    def after_write(self, path: Path | str) -> None:
        """Note what the write left at `path`, so `undo` can tell a later change by someone else."""
        key = os.path.abspath(path)
        unit = self._current
        if unit is not None and key in unit.saved:
            self._set_left(unit, key)

    # -- bash -------------------------------------------------------------------------------------

    async def before_bash(
        self,
        cwd: Path,
        command: str = "",
        *,
        root: Path | None = None,
        limits: TreeLimits | None = None,
    ) -> BashToken | None:
        """Before a command in `cwd`: in a git work tree, note what differs from the last commit
        and copy it (within the bounds); anywhere else scan the project tree at `root` (`cwd`
        when it is not below `root`) and copy what changed since the last scan (`limits`).
        Paths the command names outside the project are watched, to report changes there."""
        if limits is not None:
            self.limits = limits
        top = self._top(cwd)
        if top is None:
            tree_root = root if root is not None and cwd.is_relative_to(root) else cwd
            return await self._before_tree(tree_root, command)
        outside = watch(outside_paths(command, top, home=_home(), keep_out=(self.directory,)))
        async with self._bash_lock:
            base = self._baselines.get(top)
            if base is None:
                # Commands already running share the first one's baseline: what changed since was
                # changed by one of them, and all of it belongs to the current unit.
                base = await self._baseline(top)
                self._baselines[top] = base
            base.users += 1
        return BashToken(top, command, outside=outside)

    async def after_bash(self, token: BashToken) -> None:
        """After the command: keep, in the current unit, what each path it changed held before."""
        if token.tree:
            await self._after_tree(token)
            return
        async with self._bash_lock:
            base = self._baselines[token.top]
            try:
                await self._record_command(base)
            finally:
                base.users -= 1
                if base.users == 0:
                    del self._baselines[token.top]
                self._record_outside(token)

    @contextlib.asynccontextmanager
    async def bash(
        self,
        cwd: Path,
        command: str = "",
        *,
        root: Path | None = None,
        limits: TreeLimits | None = None,
    ) -> AsyncIterator[None]:
        """`before_bash` … `after_bash` around a command (also when it fails or is cancelled)."""
        token = await self.before_bash(cwd, command, root=root, limits=limits)
        try:
            yield
        finally:
            if token is not None:
                await self.after_bash(token)

    # -- undo -------------------------------------------------------------------------------------

    def undo(self) -> UndoSummary:
        """Restore the newest unit that changed files: kept files get their bytes and mode back,
        files it created are deleted (and directories it created, when empty), in reverse order.
        A file changed since by something else is restored anyway and its newer version kept
        aside (`UndoSummary.overwritten`). Later units that kept nothing but notes go with it.
        Raises `NothingToUndo`. Call it between prompts, not while a turn runs."""
        if not self._units:
            raise NothingToUndo
        with_files = [i for i, u in enumerate(self._units) if u.saved]
        first = with_files[-1] if with_files else 0
        taken = self._units[first:]
        target = taken[-1] if not with_files else taken[0]
        ms = time.time_ns() // 1_000_000
        retired: dict[str, Path] = {}
        for unit in taken:
            dest = self.directory / f"undone-{unit.id}-{ms}"
            try:
                os.rename(unit.directory, dest)
            except OSError as exc:
                raise CheckpointError(
                    f"cannot undo: {unit.directory} cannot be renamed ({exc.strerror})",
                    hint="nothing was changed; check the permissions of that directory",
                ) from exc
            retired[unit.id] = dest
        del self._units[first:]
        if self._current is not None and self._current.id in retired:
            self._current = None
        summary = _restore(target, retired[target.id])
        notes = [n for u in taken for n in u.notes]
        checks = tuple(
            self._check_tree(Path(root), *tree, retired[target.id])
            for root, tree in sorted(target.trees.items())
        )
        return dataclasses.replace(summary, notes=tuple(dict.fromkeys(notes)), checks=checks)

    # -- pruning ----------------------------------------------------------------------------------

    def prune(self, *, older_than: timedelta = RETENTION) -> int:
        """Delete units (and undone units) older than `older_than`; returns how many."""
        keep = {self._current.id} if self._current is not None else set()
        removed = _prune_dir(self.directory, time.time() - older_than.total_seconds(), keep)
        self._units = [u for u in self._units if u.id not in removed]
        return len(removed)

    # -- internals --------------------------------------------------------------------------------

    def _new_id(self) -> str:
        n = self._next
        self._next += 1
        return f"{n:04d}"

    def _unit(self) -> _Unit:
        if self._current is None:
            self.begin_unit()
        assert self._current is not None
        return self._current

    def _load(self) -> None:
        if not self.directory.is_dir():
            return
        for child in sorted(self.directory.iterdir()):
            if _UNIT_DIR.match(child.name):
                self._next = max(self._next, int(child.name) + 1)
                unit = _read_unit(child)
                if unit is not None:
                    self._units.append(unit)
            elif m := re.match(r"^undone-(\d{4,})-", child.name):
                self._next = max(self._next, int(m.group(1)) + 1)

    def _ensure_on_disk(self, unit: _Unit) -> None:
        if unit.on_disk:
            return
        make_dirs(self.directory)  # 0700, like the session's own directory
        unit.directory.mkdir(mode=DIR_MODE)
        header = {"op": "unit", "v": 1, "id": unit.id, "label": unit.label, "time": unit.time}
        _append(unit.directory, header)
        unit.on_disk = True
        self._units.append(unit)
        for root, (described, file_bytes) in unit.pending_trees.items():
            self._write_tree(unit, root, described, file_bytes)
        unit.pending_trees.clear()

    def _add(self, unit: _Unit, saved: Saved) -> None:
        self._ensure_on_disk(unit)
        _append(unit.directory, saved.to_json())
        unit.saved[saved.path] = saved

    def _blob(self, unit: _Unit, *, suffix: str = "bin") -> tuple[str, Path]:
        self._ensure_on_disk(unit)
        unit.blobs += 1
        name = f"{unit.blobs}.{suffix}"
        return name, unit.directory / name

    def _save_current(self, unit: _Unit, key: str, *, by: str) -> Saved:
        st = lstat(key)
        if st is None:
            return Saved(key, "absent", by=by)
        if stat.S_ISLNK(st.st_mode):
            return Saved(key, "symlink", target=os.readlink(key), by=by)
        if not stat.S_ISREG(st.st_mode):
            return Saved(key, "uncaptured", why="not a regular file", by=by)
        name, blob = self._blob(unit)
        got = save_file(key, blob, limit=MAX_FILE_BYTES)
        if isinstance(got, str):
            return Saved(key, "uncaptured", why=got, by=by)
        mode, sha = got
        return Saved(key, "file", name, mode, sha, by=by)

    def _set_left(self, unit: _Unit, key: str) -> None:
        state = state_of(key, hash_limit=MAX_FILE_BYTES)
        if unit.left.get(key) != state:
            _append(unit.directory, {"op": "left", "path": key, "state": state})
            unit.left[key] = state

    def _note(self, text: str) -> None:
        unit = self._unit()
        if text in unit.notes:
            return
        unit.notes.append(text)
        self._ensure_on_disk(unit)
        _append(unit.directory, {"op": "note", "text": text})

    def _top(self, cwd: Path) -> Path | None:
        if cwd not in self._tops:
            self._tops[cwd] = git.repo_top(cwd)
        return self._tops[cwd]

    def _write_tree(
        self, unit: _Unit, root: str, described: dict[str, str], file_bytes: int
    ) -> None:
        name = f"tree-{len(unit.trees) + 1}.z"
        (unit.directory / name).write_bytes(pack_described(described))
        os.chmod(unit.directory / name, FILE_MODE)
        d = digest(described)
        _append(
            unit.directory,
            {
                "op": "tree",
                "root": root,
                "digest": d,
                "file": name,
                "count": len(described),
                "file_bytes": file_bytes,
            },
        )
        unit.trees[root] = (d, name, file_bytes)

    def _ours(self, path: str) -> bool:
        return path.startswith(str(self.directory) + os.sep)

    async def _baseline(self, top: Path) -> _Baseline:
        start = time.time_ns()
        try:
            listed = [p for p in await git.status(top) if not self._ours(p)]
        except git.GitError as exc:
            return _Baseline(top, start, {}, skipped=f"git status failed ({exc})")
        if len(listed) > BASH_MAX_FILES:
            return _Baseline(
                top,
                start,
                {},
                skipped=f"{len(listed):,} files differ from the last commit "
                f"(the limit is {BASH_MAX_FILES:,})",
            )
        known = self._current.saved if self._current is not None else {}
        dirty: dict[str, _Pre] = {}
        to_read: list[str] = []
        total = 0
        for path in listed:
            st = lstat(path)
            s = stamp(st)
            cached = self._cache.get(path)
            if path in known:
                dirty[path] = _Pre(s, "uncaptured", known=True)
            elif cached is not None and cached.stamp == s:
                dirty[path] = cached
                total += cached.size
            elif st is None:
                dirty[path] = _Pre(s, "absent")
            elif stat.S_ISLNK(st.st_mode):
                dirty[path] = _Pre(s, "symlink", target=os.readlink(path))
            elif not stat.S_ISREG(st.st_mode):
                dirty[path] = _Pre(s, "uncaptured", why="not a regular file")
            elif st.st_size > BASH_FILE_BYTES:
                dirty[path] = _Pre(s, "uncaptured", why=f"larger than {size_text(BASH_FILE_BYTES)}")
            else:
                to_read.append(path)
                total += st.st_size
        if total > BASH_TOTAL_BYTES:
            return _Baseline(
                top,
                start,
                {},
                skipped="the files that differ from the last commit hold more than "
                + size_text(BASH_TOTAL_BYTES),
            )
        unread = total - sum(dirty[p].size for p in dirty if dirty[p].data is not None)
        if unread > _THREAD_BYTES:
            dirty.update(await asyncio.to_thread(_read_all, to_read))
        else:
            dirty.update(_read_all(to_read))
        self._cache = {p: pre for p, pre in dirty.items() if pre.data is not None}
        return _Baseline(top, start, dirty)

    async def _record_command(self, base: _Baseline) -> None:
        self.last_changed = ()  # never an earlier command's, whichever way this one ends
        if base.skipped is not None:
            self._note(f"Changes made by shell commands were not captured: {base.skipped}.")
            return
        try:
            after = [p for p in await git.status(base.top) if not self._ours(p)]
            changed: list[tuple[str, _Pre | None]] = []
            for path in sorted(set(base.dirty) | set(after)):
                pre = base.dirty.get(path)
                if pre is None or stamp(lstat(path)) != pre.stamp:
                    changed.append((path, pre))
            self.last_changed = tuple(path for path, _ in changed)
            if not changed:
                return
            if len(changed) > BASH_MAX_FILES:
                self._note(
                    f"Changes made by shell commands were not captured: a command changed "
                    f"{len(changed):,} files (the limit is {BASH_MAX_FILES:,})."
                )
                return
            known = self._unit().saved
            clean = [p for p, pre in changed if pre is None and p not in known]
            head = await git.head_entries(base.top, clean) if clean else {}
            wanted = {e.sha: e.size for e in head.values() if e.kind == "blob"}
            if sum(wanted.values()) > BASH_TOTAL_BYTES:
                self._note(
                    "Changes made by shell commands were not captured: the committed files a "
                    f"command changed hold more than {size_text(BASH_TOTAL_BYTES)}."
                )
                return
            contents = await git.blobs(base.top, wanted)
        except git.GitError as exc:
            self._note(f"Changes made by shell commands were not captured: {exc}.")
            return
        # No awaits from here on: the unit cannot change under the loop below.
        unit = self._unit()
        for path, pre in changed:
            if path not in unit.saved:
                try:
                    saved = self._saved_before(unit, path, pre, head.get(path), contents, base)
                except OSError as exc:
                    why = str(exc) if isinstance(exc, SnapshotError) else exc.strerror or str(exc)
                    saved = Saved(path, "uncaptured", why=why, by="bash")
                if saved is None:
                    continue
                self._add(unit, saved)
            self._set_left(unit, path)

    def _saved_before(
        self,
        unit: _Unit,
        path: str,
        pre: _Pre | None,
        entry: git.HeadEntry | None,
        contents: dict[str, bytes],
        base: _Baseline,
    ) -> Saved | None:
        """What `path` held before the command, or None if the command did not change it."""
        if pre is not None:  # it differed from the last commit before the command
            if pre.known:
                return Saved(
                    path, "uncaptured", why="not kept (a new request began meanwhile)", by="bash"
                )
            if pre.kind == "file" and pre.data is not None:
                name, blob = self._blob(unit)
                return Saved(path, "file", name, pre.mode, save_bytes(pre.data, blob), by="bash")
            return Saved(path, pre.kind, target=pre.target, why=pre.why, by="bash")
        if entry is not None:  # clean before: the last commit holds what was there
            if entry.kind != "blob":
                return None  # a submodule
            data = contents[entry.sha]
            if entry.mode == "120000":
                return Saved(path, "symlink", target=os.fsdecode(data), by="bash")
            name, blob = self._blob(unit)
            mode = _mode_for(path, executable=entry.mode == "100755")
            return Saved(path, "file", name, mode, save_bytes(data, blob), by="bash")
        st = lstat(path)
        if st is None or st.st_ctime_ns < base.start_ns - _CTIME_SLACK_NS:
            return None  # not there, or there before the command (an ignored file it un-ignored)
        return Saved(path, "absent", by="bash")

    # -- bash outside git -------------------------------------------------------------------------

    async def _before_tree(self, root: Path, command: str) -> BashToken:
        outside = watch(outside_paths(command, root, home=_home(), keep_out=(self.directory,)))
        async with self._bash_lock:
            base = self._tree_bases.get(root)
            if base is None:
                base = await self._tree_baseline(root)
                self._tree_bases[root] = base
            base.users += 1
        return BashToken(root, command, tree=True, outside=outside)

    async def _tree_baseline(self, root: Path) -> _TreeBaseline:
        limits = self.limits
        if root in self._too_large:
            return _TreeBaseline(root, None, skipped=self._too_large[root])
        contents = self._contents.get(root)
        if contents is None:
            try:
                make_dirs(self.directory / CACHE)  # 0700, like the session's own directory
            except OSError as exc:
                why = f"cannot keep copies in {self.directory} ({exc.strerror or exc})"
                return _TreeBaseline(root, None, skipped=why)
            contents = ContentStore(self.directory / CACHE, f"{len(self._contents) + 1}")
            self._contents[root] = contents
        unit = self._unit()
        need_tree = str(root) not in unit.trees and str(root) not in unit.pending_trees

        def work() -> tuple[Scan, dict[str, str] | None]:
            entries = scan(root, limits, skip=self._skip(root))
            contents.refresh(entries, limits)
            described = describe_tree(root, entries, contents.index, limits) if need_tree else None
            return entries, described

        try:
            entries, described = await asyncio.to_thread(work)
        except TreeTooLarge as exc:
            self._too_large[root] = f"{exc} (not scanned again in this session)"
            return _TreeBaseline(root, None, skipped=str(exc))
        except OSError as exc:
            return _TreeBaseline(root, None, skipped=f"cannot keep copies ({exc})")
        if described is not None:
            # The tree before the unit: what file tools already changed counts as it was.
            for key, saved in unit.saved.items():
                if key.startswith(str(root) + os.sep):
                    rel = key[len(str(root)) + 1 :]
                    before = _described_before(saved)
                    if before is None:
                        described.pop(rel, None)
                    elif before:
                        described[rel] = before
            if unit.on_disk:
                self._write_tree(unit, str(root), described, limits.file_bytes)
            else:
                unit.pending_trees[str(root)] = (described, limits.file_bytes)
        return _TreeBaseline(root, entries)

    def _skip(self, root: Path) -> Callable[[str], bool]:
        """What a scan of `root` leaves out: this store, and the directory of the session files
        beside it (a session's journal grows while a command runs; restoring it would be
        wrong). A temporary store's parent is not keel's."""
        dirs = [self.directory] if self._temporary else [self.directory, self.directory.parent]
        skipped = tuple(str(d) for d in dirs if d.is_relative_to(root) and d != root)

        def skip(path: str) -> bool:
            return any(path == d or path.startswith(d + os.sep) for d in skipped)

        return skip

    async def _after_tree(self, token: BashToken) -> None:
        async with self._bash_lock:
            base = self._tree_bases[token.top]
            try:
                await self._record_tree_command(base)
            finally:
                base.users -= 1
                if base.users == 0:
                    del self._tree_bases[token.top]
                self._record_outside(token)

    async def _record_tree_command(self, base: _TreeBaseline) -> None:
        self.last_changed = ()
        if base.entries is None:
            self._note(f"Changes made by shell commands were not captured: {base.skipped}.")
            return
        limits = self.limits
        try:
            after = await asyncio.to_thread(scan, base.root, limits, skip=self._skip(base.root))
        except TreeTooLarge as exc:
            self._note(f"Changes made by shell commands were not captured: {exc}.")
            return
        paths = tree_changed(base.entries, after)
        self.last_changed = tuple(paths)
        if not paths:
            return
        # No awaits from here on: the unit cannot change under the loop below.
        unit = self._unit()
        contents = self._contents.get(base.root) or ContentStore(self.directory / CACHE, "gone")
        with _Copier(self, unit, contents) as copier:
            for path in paths:
                if path not in unit.saved:
                    self._add(unit, _saved_before_tree(path, base.entries, after, contents, copier))
                self._set_left(unit, path)

    def _record_outside(self, token: BashToken) -> None:
        """Changes the command made to paths it names outside the project: reported, not kept."""
        if token.outside is None:
            return
        found = watch_changes(token.outside)
        if not found:
            return
        unit = self._unit()
        for path in found:
            if path not in unit.saved:
                self._add(unit, Saved(path, "uncaptured", why=_OUTSIDE_WHY, by="bash"))

    def _check_tree(
        self, root: Path, expected: str, name: str, file_bytes: int, directory: Path
    ) -> TreeCheck:
        """Compare the restored tree at `root` with the checkpoint digest."""
        limits = dataclasses.replace(self.limits, file_bytes=file_bytes)
        try:
            entries = scan(root, limits, skip=self._skip(root))
        except TreeTooLarge as exc:
            return TreeCheck(root, False, expected, why=str(exc))
        contents = self._contents.get(root)
        index = contents.index if contents is not None else {}
        described = describe_tree(root, entries, index, limits)
        now = digest(described)
        if now == expected:
            return TreeCheck(root, True, expected, now, count=len(described))
        try:
            before = unpack_described((directory / name).read_bytes())
        except (OSError, ValueError):
            return TreeCheck(root, False, expected, now, why="its checkpoint listing is missing")
        diff = differing(before, described)
        shown = tuple(root / p for p in diff[:_SHOWN_DIFFERING])
        return TreeCheck(root, False, expected, now, shown, len(diff))


# -- helpers ------------------------------------------------------------------------------------


def _saved_before_tree(
    path: str, before: Scan, after: Scan, contents: ContentStore, copier: _Copier
) -> Saved:
    """What `path` held before a command changed it, from the scans and the content store."""
    entry = before.get(path)
    try:
        if entry is None:
            now = after.get(path)
            return Saved(
                path, "newdir" if now is not None and now.kind == "dir" else "absent", by="bash"
            )
        if entry.kind == "link":
            return Saved(path, "symlink", target=entry.target, by="bash")
        if entry.kind == "dir":
            return Saved(path, "dir", mode=entry.mode, by="bash")
        if entry.kind != "file":
            return Saved(path, "uncaptured", why="not a regular file", by="bash")
        kept = contents.index.get(path)
        if kept is None or kept.stamp != entry.stamp or kept.offset < 0:
            why = kept.why if kept is not None and kept.why else "it changed while being copied"
            return Saved(path, "uncaptured", why=why, by="bash")
        name, offset = copier.copy(kept)
        return Saved(
            path, "file", name, entry.mode, kept.sha256, by="bash", offset=offset, length=kept.size
        )
    except OSError as exc:
        why = str(exc) if isinstance(exc, SnapshotError) else exc.strerror or str(exc)
        return Saved(path, "uncaptured", why=why, by="bash")


class _Copier:
    """Copies kept file contents from a content store into one pack of a unit (`<n>.pack`),
    through one handle on each side however many files a command changed."""

    def __init__(self, store: Checkpoints, unit: _Unit, contents: ContentStore) -> None:
        self.store, self.unit, self.contents = store, unit, contents
        self.name = ""
        self.end = 0
        self._stack = contextlib.ExitStack()
        self._src: BinaryIO | None = None
        self._out: BinaryIO | None = None

    def __enter__(self) -> _Copier:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def copy(self, kept: Kept) -> tuple[str, int]:
        """Copy one file's kept bytes; returns the pack's name and where they start in it."""
        if self._src is None:
            self._src = self._stack.enter_context(self.contents.pack.open("rb"))
        data = self.contents.read(kept, self._src)
        if self._out is None:
            self.name, path = self.store._blob(self.unit, suffix="pack")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, FILE_MODE)
            self._out = self._stack.enter_context(os.fdopen(fd, "wb"))
        offset = self.end
        self._out.write(data)
        self._out.flush()
        self.end += len(data)
        return self.name, offset


def _newest(directory: Path) -> float:
    """The latest modification time in `directory` (itself and what is directly in it)."""
    times = [directory.stat().st_mtime]
    with contextlib.suppress(OSError):
        times += [c.stat().st_mtime for c in directory.iterdir()]
    return max(times)


def _home() -> str:
    return os.path.expanduser("~")


def _described_before(saved: Saved) -> str | None:
    """How the tree digest describes what a file tool's snapshot kept ("" when unknown,
    None when nothing was there)."""
    match saved.kind:
        case "file":
            return f"file {saved.mode:o} {saved.sha256}"
        case "symlink":
            return f"link {saved.target}"
        case "absent" | "newdir":
            return None
        case _:
            return ""


def _append(directory: Path, obj: dict[str, Any]) -> None:
    line = json.dumps(obj, separators=(",", ":")) + "\n"
    fd = os.open(directory / MANIFEST, os.O_WRONLY | os.O_APPEND | os.O_CREAT, FILE_MODE)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _read_unit(directory: Path) -> _Unit | None:
    try:
        lines = (directory / MANIFEST).read_bytes().splitlines()
    except OSError:
        return None
    unit: _Unit | None = None
    for line in lines:
        try:
            d = json.loads(line)
        except ValueError:
            continue  # a torn last line (keel stopped mid-append)
        if not isinstance(d, dict):
            continue
        op = d.get("op")
        if op == "unit":
            unit = _Unit(
                str(d.get("id", directory.name)),
                str(d.get("label", "")),
                float(d.get("time", 0)),
                directory,
                on_disk=True,
            )
        elif unit is None:
            return None
        elif op == "left":
            unit.left[str(d["path"])] = str(d["state"])
        elif op == "note":
            unit.notes.append(str(d["text"]))
        elif op == "tree":
            unit.trees[str(d["root"])] = (
                str(d["digest"]),
                str(d["file"]),
                int(d.get("file_bytes", TreeLimits().file_bytes)),
            )
        elif op in KINDS:
            saved = Saved.from_json(d)
            unit.saved[saved.path] = saved
            if saved.blob:
                unit.blobs = max(unit.blobs, int(saved.blob.split(".")[0]))
    return unit


def _unit_time(directory: Path) -> float:
    try:
        with open(directory / MANIFEST, "rb") as f:
            return float(json.loads(f.readline())["time"])
    except (OSError, ValueError, KeyError, TypeError):
        return directory.stat().st_mtime


def _prune_dir(directory: Path, cutoff: float, keep: set[str]) -> set[str]:
    """Delete unit and undone directories in `directory` from before `cutoff` (epoch seconds)."""
    removed: set[str] = set()
    if not directory.is_dir():
        return removed
    for child in directory.iterdir():
        if _UNIT_DIR.match(child.name):
            if child.name not in keep and _unit_time(child) < cutoff:
                shutil.rmtree(child)
                removed.add(child.name)
        elif (m := _UNDONE_DIR.match(child.name)) and int(m.group(1)) / 1000 < cutoff:
            shutil.rmtree(child)
        elif child.name == CACHE and _newest(child) < cutoff:  # a keel killed mid-session
            shutil.rmtree(child, ignore_errors=True)
    return removed


def prune_all(sessions_root: Path, *, older_than: timedelta = RETENTION) -> int:
    """Prune the checkpoints of every session under `sessions_root` (`<KEEL_HOME>/sessions`):
    units older than `older_than`, and whole stores whose session file is gone. Returns how many
    units went. For a front end's startup: sessions never opened again are pruned too."""
    cutoff = time.time() - older_than.total_seconds()
    count = 0
    for store in sessions_root.glob("*/*.checkpoints"):
        if not store.with_name(store.name.removesuffix(".checkpoints") + ".jsonl").exists():
            count += sum(1 for c in store.iterdir() if _UNIT_DIR.match(c.name))
            shutil.rmtree(store)
            continue
        count += len(_prune_dir(store, cutoff, set()))
    return count


def _missing_dirs(path: str) -> list[str]:
    """Ancestors of `path` that do not exist, outermost first."""
    missing = []
    parent = os.path.dirname(path)
    while lstat(parent) is None and parent != os.path.dirname(parent):
        missing.append(parent)
        parent = os.path.dirname(parent)
    return missing[::-1]


def _read_all(paths: list[str]) -> dict[str, _Pre]:
    out: dict[str, _Pre] = {}
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            out[path] = _Pre(None, "absent")
            continue
        except OSError as exc:
            out[path] = _Pre(
                stamp(lstat(path)), "uncaptured", why=f"cannot read it: {exc.strerror}"
            )
            continue
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            data = f.read()
        out[path] = _Pre(stamp(st), "file", data, stat.S_IMODE(st.st_mode))
    return out


@functools.cache
def _umask() -> int:
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    return 0o022


def _mode_for(path: str, *, executable: bool) -> int:
    """The mode a committed file had before a command changed it: its present mode with the
    executable bits git recorded, or the default for a new file if it is gone."""
    st = lstat(path)
    if st is not None and stat.S_ISREG(st.st_mode):
        mode = stat.S_IMODE(st.st_mode)
        return mode | (mode & 0o444) >> 2 if executable else mode & ~0o111
    return (0o777 if executable else 0o666) & ~_umask()


def _saved_state(saved: Saved) -> str:
    match saved.kind:
        case "file":
            return "sha256:" + saved.sha256
        case "symlink":
            return "link:" + saved.target
        case "absent":
            return "absent"
        case _:
            return ""


def _restore(unit: _Unit, directory: Path) -> UndoSummary:
    restored: list[Path] = []
    removed: list[Path] = []
    failed: list[Problem] = []
    overwritten: list[Problem] = []
    for saved in reversed(list(unit.saved.values())):
        path = Path(saved.path)
        try:
            if saved.kind == "uncaptured":
                failed.append(Problem(path, f"its earlier content was not kept ({saved.why})"))
                continue
            if saved.kind == "newdir":
                if remove_dir(saved.path):
                    removed.append(path)
                continue
            if saved.kind == "dir":
                restore_dir(saved.path, saved.mode)
                restored.append(path)
                continue
            now = state_of(saved.path, hash_limit=MAX_FILE_BYTES)
            left = unit.left.get(saved.path)
            if left is not None and now not in (left, _saved_state(saved)):
                overwritten.append(
                    Problem(path, _keep_aside(saved.path, now, directory, len(overwritten)))
                )
            if saved.kind == "absent":
                if remove(saved.path):
                    removed.append(path)
            elif saved.kind == "symlink":
                restore_symlink(saved.path, saved.target)
                restored.append(path)
            else:
                restore_file(
                    saved.path,
                    directory / saved.blob,
                    mode=saved.mode,
                    sha256=saved.sha256,
                    offset=saved.offset,
                    length=saved.length,
                )
                restored.append(path)
        except OSError as exc:
            why = str(exc) if isinstance(exc, SnapshotError) else exc.strerror or str(exc)
            failed.append(Problem(path, why))
    return UndoSummary(
        unit.id,
        unit.label,
        datetime.fromtimestamp(unit.time, UTC),
        tuple(reversed(restored)),
        tuple(reversed(removed)),
        tuple(reversed(failed)),
        tuple(reversed(overwritten)),
    )


def _keep_aside(path: str, now: str, directory: Path, n: int) -> str:
    why = "it changed after that request; restored anyway"
    if now.startswith(("sha256:", "size:")):
        dest = directory / f"overwritten-{n + 1}.bin"
        if copy_aside(path, dest):
            return f"{why} (the newer version is kept in {dest})"
    return why
