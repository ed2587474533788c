"""Checkpoints and /undo on real files: file tools and bash (in a git repository and outside one),
bounds, pruning, permissions, the session record and an agent run told of the undo."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from keel.agent.loop import Agent
from keel.checkpoints import (
    Checkpoints,
    NothingToUndo,
    Problem,
    UndoSummary,
    UnitInfo,
    prune_all,
    undo_note,
)
from keel.checkpoints import store as store_module
from keel.llm.messages import Message, Text, ToolUse, Usage
from keel.llm.providers.scripted import ScriptedProvider
from keel.llm.script import Reply, reply
from keel.permissions import AllowAll
from keel.session.fold import fold
from keel.session.journal import read_records
from keel.session.records import UndoRecord
from keel.session.store import SessionLog
from keel.tools.base import ToolContext, ToolError, ToolOutput
from keel.tools.builtin import bash, builtin_tools, edit, multi_edit, read, write

GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.com",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.com",
    "GIT_CONFIG_NOSYSTEM": "1",
}


def git(cwd: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        env={**os.environ, **GIT_ENV},
    )
    return done.stdout.decode()


def tree(root: Path) -> dict[str, tuple[Any, ...]]:
    """Everything under `root` but `.git`: files with bytes and mode, links, directories."""
    out: dict[str, tuple[Any, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != ".git"]
        for name in dirnames + filenames:
            p = Path(dirpath, name)
            rel = str(p.relative_to(root))
            st = p.lstat()
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", stat.S_IMODE(st.st_mode))
            else:
                out[rel] = ("file", p.read_bytes(), stat.S_IMODE(st.st_mode))
    return out


@pytest.fixture(autouse=True)
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    yield
    os.umask(old)


@pytest.fixture
def plain(tmp_path: Path) -> Path:
    """A directory that is not in a git repository."""
    root = (tmp_path / "plain").resolve()
    root.mkdir()
    (root / "app.py").write_text("def main():\n    return 1\n", encoding="utf-8")
    os.chmod(root / "app.py", 0o640)
    (root / "run.sh").write_text("#!/bin/sh\necho one\necho two\n", encoding="utf-8")
    os.chmod(root / "run.sh", 0o755)
    return root


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A git repository with one commit: text, an executable, binary data, a symlink."""
    root = (tmp_path / "repo").resolve()
    root.mkdir()
    git(root, "init", "-q")
    (root / "a.txt").write_text("alpha\n", encoding="utf-8")
    (root / "tool.sh").write_text("#!/bin/sh\necho hi\n", encoding="utf-8")
    os.chmod(root / "tool.sh", 0o755)
    (root / "data.bin").write_bytes(bytes(range(256)) * 4)
    (root / "docs").mkdir()
    (root / "docs" / "guide.md").write_text("# guide\n", encoding="utf-8")
    os.symlink("a.txt", root / "link")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "start")
    return root


@pytest.fixture
def store(tmp_path: Path) -> Checkpoints:
    return Checkpoints(tmp_path / "session" / "s1.checkpoints")


def context(root: Path, store: Checkpoints | None) -> ToolContext:
    return ToolContext(cwd=root, root=root, env=dict(os.environ), checkpoints=store)


async def run(t: object, ctx: ToolContext, **args: object) -> ToolOutput:
    assert hasattr(t, "run")
    return await t.run(ctx, args)  # type: ignore[no-any-return]


# -- file tools ---------------------------------------------------------------------------------


async def test_write_edit_multi_edit_then_undo_restores_bytes_and_modes(
    plain: Path, store: Checkpoints
) -> None:
    ctx = context(plain, store)
    before = tree(plain)
    unit = store.begin_unit("refactor main")
    await run(read, ctx, path="app.py")
    await run(read, ctx, path="run.sh")
    await run(edit, ctx, path="app.py", old_string="return 1", new_string="return 2")
    await run(
        multi_edit,
        ctx,
        path="run.sh",
        edits=[
            {"old_string": "echo one", "new_string": "echo 1"},
            {"old_string": "echo two", "new_string": "echo 2"},
        ],
    )
    await run(write, ctx, path="pkg/sub/new.py", content="X = 1\n")
    # A second write to a path keeps the first snapshot: undo goes back to before the unit.
    await run(edit, ctx, path="app.py", old_string="return 2", new_string="return 3")
    await run(write, ctx, path="pkg/sub/new.py", content="X = 2\n")
    assert (plain / "app.py").read_text(encoding="utf-8") == "def main():\n    return 3\n"

    (info,) = store.units()
    assert info == UnitInfo(
        unit,
        "refactor main",
        info.time,
        (plain / "app.py", plain / "run.sh", plain / "pkg" / "sub" / "new.py"),
    )
    summary = store.undo()
    assert summary == UndoSummary(
        unit,
        "refactor main",
        info.time,
        restored=(plain / "app.py", plain / "run.sh"),
        removed=(plain / "pkg", plain / "pkg" / "sub", plain / "pkg" / "sub" / "new.py"),
    )
    assert tree(plain) == before
    assert store.units() == []
    with pytest.raises(NothingToUndo) as caught:
        store.undo()
    assert caught.value.one_line() == (
        "nothing to undo (hint: undo covers keel's file edits and bash commands' changes in the "
        "project)"
    )


async def test_two_units_undo_newest_first(plain: Path, store: Checkpoints) -> None:
    ctx = context(plain, store)
    original = tree(plain)
    first = store.begin_unit("one")
    await run(read, ctx, path="app.py")
    await run(edit, ctx, path="app.py", old_string="return 1", new_string="return 2")
    after_first = tree(plain)
    second = store.begin_unit("two")
    await run(edit, ctx, path="app.py", old_string="return 2", new_string="return 3")
    await run(write, ctx, path="notes.md", content="hello\n")
    store.begin_unit("three: changes nothing")  # not listed, not undone

    assert [(u.id, u.label) for u in store.units()] == [(first, "one"), (second, "two")]
    two = store.undo()
    assert (two.unit, two.restored, two.removed) == (
        second,
        (plain / "app.py",),
        (plain / "notes.md",),
    )
    assert tree(plain) == after_first
    one = store.undo()
    assert (one.unit, one.restored, one.removed) == (first, (plain / "app.py",), ())
    assert tree(plain) == original


def test_before_write_keeps_binary_files_and_symlinks_and_bounds_large_files(
    plain: Path, store: Checkpoints, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_module, "MAX_FILE_BYTES", 1000)
    blob = plain / "image.bin"
    blob.write_bytes(b"\x00\xff\xfe binary \x80\x81")
    os.chmod(blob, 0o600)
    link = plain / "current"
    os.symlink("app.py", link)
    big = plain / "big.log"
    big.write_bytes(b"x" * 2000)
    unit = store.begin_unit("library use")
    for path in (blob, link, big):
        store.before_write(path)
    blob.write_bytes(b"text now")
    os.chmod(blob, 0o644)
    link.unlink()
    link.write_text("a file now", encoding="utf-8")
    big.write_bytes(b"short")
    for path in (blob, link, big):
        store.after_write(path)

    summary = store.undo()
    assert summary == UndoSummary(
        unit,
        "library use",
        summary.time,
        restored=(blob, link),
        failed=(Problem(big, "its earlier content was not kept (larger than 1,000 bytes)"),),
    )
    assert blob.read_bytes() == b"\x00\xff\xfe binary \x80\x81"
    assert stat.S_IMODE(blob.stat().st_mode) == 0o600
    assert os.readlink(link) == "app.py"
    assert big.read_bytes() == b"short"


async def test_a_file_changed_after_the_unit_is_restored_and_its_newer_version_kept(
    plain: Path, store: Checkpoints
) -> None:
    ctx = context(plain, store)
    unit = store.begin_unit("edit")
    await run(read, ctx, path="app.py")
    await run(edit, ctx, path="app.py", old_string="return 1", new_string="return 2")
    (plain / "app.py").write_text("the user's own edit\n", encoding="utf-8")

    summary = store.undo()
    kept = store.directory / f"undone-{unit}-{_undone_ms(store, unit)}" / "overwritten-1.bin"
    assert summary.restored == (plain / "app.py",)
    assert summary.overwritten == (
        Problem(
            plain / "app.py",
            f"it changed after that request; restored anyway (the newer version is kept in {kept})",
        ),
    )
    assert kept.read_bytes() == b"the user's own edit\n"
    assert (plain / "app.py").read_text(encoding="utf-8") == "def main():\n    return 1\n"


def _undone_ms(store: Checkpoints, unit: str) -> str:
    (name,) = [p.name for p in store.directory.iterdir() if p.name.startswith(f"undone-{unit}-")]
    return name.rsplit("-", 1)[1]


async def test_a_snapshot_that_cannot_be_kept_stops_the_write(plain: Path, tmp_path: Path) -> None:
    blocked = tmp_path / "blocked.checkpoints"
    blocked.write_text("a file where the store's directory should be", encoding="utf-8")
    store = Checkpoints(blocked)
    ctx = context(plain, store)
    store.begin_unit("edit")
    await run(read, ctx, path="app.py")
    with pytest.raises(ToolError) as caught:
        await run(edit, ctx, path="app.py", old_string="return 1", new_string="return 2")
    assert str(caught.value) == (
        f"could not keep {plain / 'app.py'} for /undo: Not a directory (hint: check free space "
        f"and permissions of {blocked}); nothing was written to app.py"
    )
    assert (plain / "app.py").read_text(encoding="utf-8") == "def main():\n    return 1\n"


async def test_units_survive_reopening_the_store(plain: Path, store: Checkpoints) -> None:
    ctx = context(plain, store)
    original = tree(plain)
    unit = store.begin_unit("before a restart")
    await run(write, ctx, path="made.txt", content="new\n")
    await run(read, ctx, path="run.sh")
    await run(edit, ctx, path="run.sh", old_string="echo one", new_string="echo uno")

    reopened = Checkpoints(store.directory)
    assert reopened.units() == store.units()
    assert reopened.begin_unit("next") != unit  # ids are not reused
    summary = reopened.undo()
    assert (summary.unit, summary.restored, summary.removed) == (
        unit,
        (plain / "run.sh",),
        (plain / "made.txt",),
    )
    assert tree(plain) == original


# -- bash ---------------------------------------------------------------------------------------


@pytest.mark.needs("git")
async def test_bash_changes_in_a_git_repo_are_captured_and_undone(
    repo: Path, store: Checkpoints
) -> None:
    # Dirty before the command: a changed committed file and an untracked one.
    (repo / "docs" / "guide.md").write_text("# guide\ndraft\n", encoding="utf-8")
    (repo / "scratch.txt").write_text("my notes\n", encoding="utf-8")
    before, status = tree(repo), git(repo, "status", "--porcelain")
    ctx = context(repo, store)
    unit = store.begin_unit("build it")
    out = await run(
        bash,
        ctx,
        command=(
            "echo more >> a.txt && rm tool.sh && mkdir -p gen && printf made > gen/out.txt && "
            "echo again >> docs/guide.md && rm scratch.txt && ln -sfn data.bin link && "
            "chmod +x data.bin"
        ),
    )
    assert out.content == "[exit code 0]"

    paths = ("a.txt", "data.bin", "docs/guide.md", "gen/out.txt", "link", "scratch.txt", "tool.sh")
    (info,) = store.units()
    assert info == UnitInfo(unit, "build it", info.time, tuple(repo / p for p in paths))
    summary = store.undo()
    assert summary == UndoSummary(
        unit,
        "build it",
        info.time,
        restored=tuple(repo / p for p in paths if p != "gen/out.txt"),
        removed=(repo / "gen" / "out.txt",),
    )
    # Directories a command created stay (empty); everything else is as it was, git included.
    assert tree(repo) == {**before, "gen": ("dir", 0o755)}
    assert git(repo, "status", "--porcelain") == status


@pytest.mark.needs("git")
async def test_file_edits_and_bash_in_one_unit_undo_to_before_both(
    repo: Path, store: Checkpoints
) -> None:
    ctx = context(repo, store)
    before = tree(repo)
    store.begin_unit("mixed")
    await run(read, ctx, path="a.txt")
    await run(edit, ctx, path="a.txt", old_string="alpha", new_string="beta")
    await run(bash, ctx, command="echo gamma >> a.txt && echo x > b.txt")
    await run(read, ctx, path="b.txt")
    await run(edit, ctx, path="b.txt", old_string="x", new_string="y")
    assert (repo / "a.txt").read_text(encoding="utf-8") == "beta\ngamma\n"

    summary = store.undo()
    assert (summary.restored, summary.removed, summary.overwritten) == (
        (repo / "a.txt",),
        (repo / "b.txt",),
        (),
    )
    assert tree(repo) == before


@pytest.mark.needs("git")
async def test_overlapping_commands_and_an_edit_share_the_unit(
    repo: Path, store: Checkpoints
) -> None:
    ctx = context(repo, store)
    before = tree(repo)
    store.begin_unit("parallel")
    await run(read, ctx, path="a.txt")
    outs = await asyncio.gather(
        run(bash, ctx, command="sleep 0.3; echo slow >> docs/guide.md"),
        run(bash, ctx, command="echo fast > fast.txt; rm data.bin"),
        run(edit, ctx, path="a.txt", old_string="alpha", new_string="omega"),
    )
    assert [o.content for o in outs] == [
        "[exit code 0]",
        "[exit code 0]",
        "Edited a.txt: 1 replacement.",
    ]
    summary = store.undo()
    assert sorted(summary.files) == sorted(
        [repo / "a.txt", repo / "docs" / "guide.md", repo / "fast.txt", repo / "data.bin"]
    )
    assert tree(repo) == before


async def test_bash_outside_a_git_repo_that_changes_nothing_keeps_no_unit(
    plain: Path, store: Checkpoints
) -> None:
    # Outside git the tree is scanned instead (tests/test_checkpoints_tree.py).
    ctx = context(plain, store)
    store.begin_unit("outside git")
    await run(bash, ctx, command="cat app.py > /dev/null")
    assert store.units() == []
    with pytest.raises(NothingToUndo):
        store.undo()
    assert [p.name for p in store.directory.iterdir()] == ["cache"]  # copies, no unit
    assert stat.S_IMODE((store.directory / "cache").stat().st_mode) == 0o700
    assert stat.S_IMODE(store.directory.stat().st_mode) == 0o700
    store.drop_copies()  # the session ends
    assert not store.directory.exists()


@pytest.mark.needs("git")
async def test_bash_capture_is_skipped_above_2000_dirty_files_with_a_note(
    repo: Path, store: Checkpoints
) -> None:
    ctx = context(repo, store)
    edited = store.begin_unit("edit first")
    await run(write, ctx, path="new.txt", content="from a tool\n")
    junk = repo / "junk"
    junk.mkdir()
    for i in range(2000):
        (junk / f"{i}.txt").write_bytes(b"")
    many = store.begin_unit("many dirty files")
    await run(bash, ctx, command="echo changed >> a.txt")

    note = (
        "Changes made by shell commands were not captured: 2,001 files differ from the last "
        "commit (the limit is 2,000)."
    )
    assert [(u.id, u.files, u.notes) for u in store.units()] == [
        (edited, (repo / "new.txt",), ()),
        (many, (), (note,)),
    ]
    # Undo takes the newest unit with files, and the note-only unit after it along.
    summary = store.undo()
    assert summary == UndoSummary(
        edited, "edit first", summary.time, removed=(repo / "new.txt",), notes=(note,)
    )
    assert (repo / "a.txt").read_text(encoding="utf-8") == "alpha\nchanged\n"
    assert store.units() == []


@pytest.mark.needs("git")
async def test_bash_capture_is_skipped_above_the_byte_bound(
    repo: Path, store: Checkpoints, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_module, "BASH_TOTAL_BYTES", 100)
    (repo / "docs" / "guide.md").write_text("g" * 101, encoding="utf-8")
    store.begin_unit("big dirty set")
    await run(bash, context(repo, store), command="rm a.txt")
    (info,) = store.units()
    assert info.notes == (
        "Changes made by shell commands were not captured: the files that differ from the last "
        "commit hold more than 100 bytes.",
    )
    assert info.files == ()


@pytest.mark.needs("git")
async def test_a_dirty_file_above_the_per_file_bound_is_reported_not_restored(
    repo: Path, store: Checkpoints, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_module, "BASH_FILE_BYTES", 10)
    (repo / "docs" / "guide.md").write_text("0123456789 and more\n", encoding="utf-8")
    unit = store.begin_unit("touch both")
    await run(bash, context(repo, store), command="echo x >> docs/guide.md; echo y >> a.txt")
    summary = store.undo()
    assert summary == UndoSummary(
        unit,
        "touch both",
        summary.time,
        restored=(repo / "a.txt",),
        failed=(
            Problem(
                repo / "docs" / "guide.md",
                "its earlier content was not kept (larger than 10 bytes)",
            ),
        ),
    )
    assert (repo / "a.txt").read_text(encoding="utf-8") == "alpha\n"
    assert (repo / "docs" / "guide.md").read_text(encoding="utf-8") == "0123456789 and more\nx\n"


# -- storage ------------------------------------------------------------------------------------


@pytest.mark.needs("git")
async def test_snapshots_are_0600_in_0700_directories(repo: Path, store: Checkpoints) -> None:
    ctx = context(repo, store)
    store.begin_unit("perms")
    await run(read, ctx, path="a.txt")
    await run(edit, ctx, path="a.txt", old_string="alpha", new_string="beta")
    await run(bash, ctx, command="echo z >> docs/guide.md")
    store.begin_unit("second")
    await run(write, ctx, path="c.txt", content="c\n")
    store.undo()

    modes = {}
    for dirpath, dirnames, filenames in os.walk(store.directory):
        for name in dirnames + filenames:
            p = Path(dirpath, name)
            modes[str(p.relative_to(store.directory))] = stat.S_IMODE(p.stat().st_mode)
    undone = next(k for k in modes if k.startswith("undone-"))
    assert modes == {
        "0001": 0o700,
        "0001/manifest.jsonl": 0o600,
        "0001/1.bin": 0o600,
        "0001/2.bin": 0o600,
        undone: 0o700,
        f"{undone}/manifest.jsonl": 0o600,
    }
    assert stat.S_IMODE(store.directory.stat().st_mode) == 0o700


def _age_unit(directory: Path, days: float) -> None:
    manifest = directory / "manifest.jsonl"
    lines = manifest.read_text(encoding="utf-8").splitlines()
    header = json.loads(lines[0])
    header["time"] -= days * 86400
    manifest.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n", encoding="utf-8")


def test_units_older_than_7_days_are_pruned_on_open(plain: Path, tmp_path: Path) -> None:
    directory = tmp_path / "s.checkpoints"
    store = Checkpoints(directory)
    store.begin_unit("old")
    store.before_write(plain / "app.py")
    store.begin_unit("recent")
    store.before_write(plain / "run.sh")
    _age_unit(directory / "0001", 7.01)
    _age_unit(directory / "0002", 6.9)
    stale = directory / f"undone-0000-{int((time.time() - 8 * 86400) * 1000)}"
    fresh = directory / f"undone-0000-{int(time.time() * 1000)}"
    stale.mkdir()
    fresh.mkdir()

    kept = Checkpoints(directory, retention=None)
    assert [u.label for u in kept.units()] == ["old", "recent"]
    reopened = Checkpoints(directory)
    assert [u.label for u in reopened.units()] == ["recent"]
    assert sorted(p.name for p in directory.iterdir()) == ["0002", fresh.name]
    assert reopened.prune(older_than=timedelta(days=1)) == 1
    assert reopened.units() == []


def test_prune_all_prunes_every_session_and_drops_stores_of_deleted_sessions(
    plain: Path, tmp_path: Path
) -> None:
    sessions = tmp_path / "sessions"
    live = sessions / "proj-1" / "20260101-000000-aaaaaa.checkpoints"
    orphan = sessions / "proj-2" / "20260101-000000-bbbbbb.checkpoints"
    for d in (live, orphan):
        store = Checkpoints(d)
        store.begin_unit("old")
        store.before_write(plain / "app.py")
        store.begin_unit("new")
        store.before_write(plain / "run.sh")
        _age_unit(d / "0001", 10)
    (live.parent / "20260101-000000-aaaaaa.jsonl").write_text("", encoding="utf-8")

    assert prune_all(sessions) == 3
    assert sorted(p.name for p in live.iterdir()) == ["0002"]
    assert not orphan.exists()


# -- the session and the model ------------------------------------------------------------------


def test_undo_note_names_what_was_reverted(plain: Path) -> None:
    summary = UndoSummary(
        "0003",
        "rename the\n helper   everywhere",
        datetime.now(UTC),
        restored=(plain / "app.py", plain / "lib" / "util.py"),
        removed=(plain / "new.py",),
        failed=(
            Problem(plain / "big.log", "its earlier content was not kept (larger than 64 MB)"),
        ),
        notes=("Changes made by shell commands were not captured: git status failed (boom).",),
    )
    assert undo_note(summary, cwd=plain) == (
        'The user ran /undo: the file changes made for the request "rename the helper '
        'everywhere" were reverted.\n'
        "Restored to their earlier content: app.py, lib/util.py.\n"
        "Deleted (they did not exist before): new.py.\n"
        "Not reverted: big.log (its earlier content was not kept (larger than 64 MB)).\n"
        "Changes made by shell commands were not captured: git status failed (boom).\n"
        "What you read of these files before is out of date: read a file again before relying "
        "on it or changing it."
    )


def _reply(*blocks: Any) -> Reply:
    return Reply(Message("assistant", tuple(blocks)), Usage(100, 20), None)


async def test_agent_edits_undo_note_reaches_the_model_and_the_session_folds(
    project: Path, tmp_path: Path
) -> None:
    project = project.resolve()
    util = project / "util.py"
    session = SessionLog.create(cwd=project, model="scripted", directory=tmp_path / "s")
    store = Checkpoints.for_session(session.path)
    assert store.directory == session.path.with_name(session.path.stem + ".checkpoints")
    provider = ScriptedProvider(
        [
            _reply(ToolUse("t1", "read", {"path": "util.py"})),
            _reply(
                ToolUse(
                    "t2", "edit", {"path": "util.py", "old_string": "X = 1", "new_string": "X = 2"}
                ),
                ToolUse("t3", "write", {"path": "extra.py", "content": "Y = 3\n"}),
            ),
            reply("Set X to 2."),
            reply("X is 1 again."),
        ]
    )
    agent = Agent(
        provider=provider,
        model="scripted",
        cwd=project,
        system="test",
        tools=builtin_tools(),
        session=session,
        gate=AllowAll(),
    )
    agent.ctx.checkpoints = store  # what a front end does once per session
    unit = store.begin_unit("set X to 2")
    result = await agent.run("set X to 2")
    assert result.stop_reason == "end_turn"
    assert util.read_text(encoding="utf-8") == "X = 2\n"

    summary = store.undo()
    note = undo_note(summary, cwd=project)
    agent.add_note(note)
    session.undo(summary, note)
    assert util.read_text(encoding="utf-8") == "X = 1\n"
    assert not (project / "extra.py").exists()
    assert note == (
        'The user ran /undo: the file changes made for the request "set X to 2" were reverted.\n'
        "Restored to their earlier content: util.py.\n"
        "Deleted (they did not exist before): extra.py.\n"
        "What you read of these files before is out of date: read a file again before relying "
        "on it or changing it."
    )
    # A resume at this point (before the next prompt) still owes the model the note.
    so_far = read_records(session.path).records
    pending = fold(so_far)
    assert pending.undo_notes == [note]
    assert pending.status == "completed"
    assert pending.messages == agent.messages
    assert so_far[-1].payload == UndoRecord(
        unit, "set X to 2", (str(util),), (str(project / "extra.py"),), (), note
    )

    store.begin_unit("what is X now?")
    await agent.run("what is X now?")
    assert provider.requests[-1].messages[-1] == Message(
        "user", (Text(f"<system-note>\n{note}\n</system-note>\n\nwhat is X now?"),)
    )
    agent.session = None
    session.close()
    records = read_records(session.path).records
    assert [r.payload.type for r in records] == [
        "meta",
        "user",
        "assistant",
        "tool_result",
        "assistant",
        "tool_result",
        "tool_result",
        "assistant",
        "terminal",
        "undo",
        "user",
        "assistant",
        "terminal",
    ]
    state = fold(records)
    assert state.messages == agent.messages
    assert state.undo_notes == []
    assert state.status == "completed"


async def test_a_subagents_edits_belong_to_the_parents_unit(project: Path) -> None:
    project = project.resolve()
    from keel.agent.subagents import enable_subagents

    provider = ScriptedProvider(
        [
            # the parent hands the work to a subagent…
            _reply(
                ToolUse(
                    "p1",
                    "task",
                    {"description": "add a file", "prompt": "create notes.md saying hi"},
                )
            ),
            # …which writes a file and reports back (the child shares the parent's provider)
            _reply(ToolUse("c1", "write", {"path": "notes.md", "content": "hi\n"})),
            reply("Created notes.md."),
            # the parent edits a file itself too
            _reply(ToolUse("p2", "write", {"path": "more.md", "content": "more\n"})),
            reply("Both files are there."),
        ]
    )
    agent = Agent(
        provider=provider,
        model="scripted",
        cwd=project,
        system="test",
        tools=builtin_tools(),
        gate=AllowAll(),
    )
    enable_subagents(agent)
    store = Checkpoints.temporary()
    agent.ctx.checkpoints = store
    try:
        store.begin_unit("make two files")
        result = await agent.run("make two files")
        assert result.stop_reason == "end_turn"
        assert (project / "notes.md").read_text(encoding="utf-8") == "hi\n"
        units = store.units()
        assert [(u.label, sorted(p.name for p in u.files)) for u in units] == [
            ("make two files", ["more.md", "notes.md"])
        ]
        summary = store.undo()
        assert sorted(p.name for p in summary.removed) == ["more.md", "notes.md"]
        assert not (project / "notes.md").exists()
        assert not (project / "more.md").exists()
    finally:
        store.close()
        await agent.aclose()
