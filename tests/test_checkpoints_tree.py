"""/undo of bash changes in a project without git: the tree scanned before and after each command,
copies of what changed, the restored tree checked against the checkpoint's digest, files over the
bound and changes outside the project reported; with the sandbox on and off, across a restart
(`keel undo` in a new process) and bounded by settings."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from keel.checkpoints import (
    Checkpoints,
    NothingToUndo,
    Problem,
    TreeCheck,
    TreeLimits,
    UndoSummary,
    check_line,
    undo_note,
)
from keel.checkpoints.tree import ContentStore, outside_paths, scan
from keel.config.settings import CHECKPOINT_KEYS, Settings, _Merge
from keel.permissions.sandbox import Sandbox
from keel.testing.anthropic_server import AnthropicServer
from keel.tools.base import ToolContext, ToolOutput
from keel.tools.builtin import bash, edit, read
from keel.tui.view import Output
from tests.server_helpers import Served, anthropic_fixture, served_fixture, servers_fixture
from tests.test_cli import keel, session_files, write_script
from tests.test_server import create
from tests.test_server import run as serve_prompt

__all__ = ["anthropic_fixture", "served_fixture", "servers_fixture"]  # the server's fixtures

OUTSIDE = (
    "its earlier content was not kept (outside the project; /undo keeps only the project's files)"
)


def tree(root: Path) -> dict[str, tuple[Any, ...]]:
    """Everything under `root`: files with bytes and mode, links, directories with mode."""
    out: dict[str, tuple[Any, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath, name)
            st = p.lstat()
            rel = str(p.relative_to(root))
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", stat.S_IMODE(st.st_mode))
            else:
                out[rel] = ("file", p.read_bytes(), stat.S_IMODE(st.st_mode))
    return out


def tree_digest(root: Path) -> str:
    """The checkpoint digest computed independently: sorted `path\\0description` lines."""
    lines = []
    for rel, value in sorted(tree(root).items()):
        match value:
            case ("file", data, mode):
                desc = f"file {mode:o} {hashlib.sha256(data).hexdigest()}"
            case ("link", target):
                desc = f"link {target}"
            case ("dir", mode):
                desc = f"dir {mode:o}"
        lines.append(os.fsencode(rel) + b"\0" + desc.encode() + b"\n")
    return hashlib.sha256(b"".join(lines)).hexdigest()


@pytest.fixture(autouse=True)
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    yield
    os.umask(old)


@pytest.fixture
def plain(tmp_path: Path) -> Path:
    """A project without git: text, an executable, a subdirectory, a symlink, binary data."""
    root = (tmp_path / "plain").resolve()
    root.mkdir()
    (root / "app.py").write_text("def main():\n    return 1\n", encoding="utf-8")
    os.chmod(root / "app.py", 0o640)
    (root / "run.sh").write_text("#!/bin/sh\necho one\n", encoding="utf-8")
    os.chmod(root / "run.sh", 0o755)
    (root / "lib").mkdir()
    (root / "lib" / "util.py").write_text("X = 1\n", encoding="utf-8")
    (root / "lib" / "old.py").write_text("OLD = True\n", encoding="utf-8")
    (root / "data.bin").write_bytes(bytes(range(256)) * 8)
    os.symlink("app.py", root / "current")
    return root


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Checkpoints]:
    s = Checkpoints(tmp_path / "session" / "s1.checkpoints")
    yield s
    s.close()


def context(
    root: Path,
    store: Checkpoints,
    *,
    sandbox: Sandbox | None = None,
    limits: TreeLimits | None = None,
) -> ToolContext:
    return ToolContext(
        cwd=root,
        root=root,
        env=dict(os.environ),
        checkpoints=store,
        sandbox=sandbox,
        checkpoint_limits=limits,
    )


async def run(t: object, ctx: ToolContext, **args: object) -> ToolOutput:
    assert hasattr(t, "run")
    return await t.run(ctx, args)  # type: ignore[no-any-return]


#: Edits, creates, deletes, chmods and renames (a file and a directory), and retargets a link.
EVERYTHING = (
    "echo two >> app.py && printf new > made.txt && mkdir -p gen/deep && echo g > gen/deep/g.txt"
    " && rm data.bin && chmod 600 run.sh && mv lib/old.py lib/renamed.py && mv lib library"
    " && chmod 700 library && ln -sfn run.sh current"
)


@pytest.mark.parametrize(
    "sandboxed",
    [False, pytest.param(True, marks=pytest.mark.needs("sandbox"))],
    ids=["no-sandbox", "sandbox"],
)
async def test_a_command_that_changes_everything_is_undone_and_the_tree_hash_matches(
    plain: Path, store: Checkpoints, sandboxed: bool
) -> None:
    box = Sandbox(plain) if sandboxed else None
    before, digest = tree(plain), tree_digest(plain)
    ctx = context(plain, store, sandbox=box)
    unit = store.begin_unit("change everything")
    out = await run(bash, ctx, command=EVERYTHING)
    assert out.content == "[exit code 0]"
    assert (plain / "library" / "renamed.py").exists()
    assert not (plain / "lib").exists()
    assert set(store.last_changed) == {
        str(plain / p)
        for p in (
            "app.py",
            "made.txt",
            "gen",
            "gen/deep",
            "gen/deep/g.txt",
            "data.bin",
            "run.sh",
            "lib",
            "lib/old.py",
            "lib/util.py",
            "library",
            "library/renamed.py",
            "library/util.py",
            "current",
        )
    }

    (info,) = store.units()
    summary = store.undo()
    assert summary == UndoSummary(
        unit,
        "change everything",
        info.time,
        restored=tuple(
            plain / p
            for p in ("app.py", "current", "data.bin", "lib", "lib/old.py", "lib/util.py", "run.sh")
        ),
        removed=tuple(
            plain / p
            for p in (
                "gen",
                "gen/deep",
                "gen/deep/g.txt",
                "library",
                "library/renamed.py",
                "library/util.py",
                "made.txt",
            )
        ),
        checks=(TreeCheck(plain, True, digest, digest, count=len(before)),),
    )
    assert tree(plain) == before
    if box is not None:
        box.cleanup()


async def test_the_note_and_the_check_line_say_the_tree_matches(
    plain: Path, store: Checkpoints
) -> None:
    ctx = context(plain, store)
    store.begin_unit("tidy up")
    await run(bash, ctx, command="rm lib/old.py && echo y > y.txt")
    summary = store.undo()
    digest = tree_digest(plain)
    assert check_line(summary.checks[0], cwd=plain) == (
        f"Tree check: the project matches the checkpoint taken before the request "
        f"(sha256 {digest[:12]}, 7 entries)."
    )
    assert undo_note(summary, cwd=plain) == (
        'The user ran /undo: the file changes made for the request "tidy up" were reverted.\n'
        "Restored to their earlier content: lib/old.py.\n"
        "Deleted (they did not exist before): y.txt.\n"
        f"Tree check: the project matches the checkpoint taken before the request (sha256 "
        f"{digest[:12]}, 7 entries).\n"
        "What you read of these files before is out of date: read a file again before relying "
        "on it or changing it."
    )


async def test_a_file_over_the_bound_is_reported_not_restored_and_the_check_names_it(
    plain: Path, store: Checkpoints
) -> None:
    (plain / "big.bin").write_bytes(b"b" * 5000)
    ctx = context(plain, store, limits=TreeLimits(file_bytes=4096))
    store.begin_unit("grow it")
    await run(bash, ctx, command="echo more >> big.bin && echo 2 > lib/util.py")
    summary = store.undo()
    assert summary.restored == (plain / "lib" / "util.py",)
    assert summary.failed == (
        Problem(plain / "big.bin", "its earlier content was not kept (larger than 4,096 bytes)"),
    )
    (check,) = summary.checks
    assert (check.matches, check.differing, check.count) == (False, (plain / "big.bin",), 1)
    assert check_line(check, cwd=plain) == (
        "Tree check: the project differs from the checkpoint taken before the request at 1 "
        "path(s): big.bin."
    )
    assert (plain / "lib" / "util.py").read_text(encoding="utf-8") == "X = 1\n"


async def test_an_unreadable_file_is_reported_with_why(
    plain: Path, store: Checkpoints, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = plain / "secret.txt"
    secret.write_text("s\n", encoding="utf-8")
    real_open = os.open

    def refusing(path: str, flags: int, *args: Any) -> int:
        if path == str(secret):  # what a file of mode 000 does to anyone but root
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", refusing)
    ctx = context(plain, store)
    store.begin_unit("remove it")
    await run(bash, ctx, command="rm -f secret.txt")
    monkeypatch.undo()
    summary = store.undo()
    assert summary.failed == (
        Problem(secret, "its earlier content was not kept (cannot read it: Permission denied)"),
    )


async def test_the_total_bound_keeps_the_smallest_files(plain: Path, store: Checkpoints) -> None:
    (plain / "a.txt").write_bytes(b"a" * 3000)
    ctx = context(plain, store, limits=TreeLimits(total_bytes=200))
    store.begin_unit("both")
    await run(bash, ctx, command="rm a.txt lib/util.py")
    summary = store.undo()
    assert summary.restored == (plain / "lib" / "util.py",)
    assert summary.failed == (
        Problem(
            plain / "a.txt",
            "its earlier content was not kept (the project's files hold more than 200 bytes)",
        ),
    )


async def test_a_change_outside_the_project_is_reported(
    plain: Path, store: Checkpoints, tmp_path: Path
) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "kept.txt").write_text("mine\n", encoding="utf-8")
    ctx = context(plain, store)
    store.begin_unit("spill")
    await run(
        bash,
        ctx,
        command=f"echo x >> {outside}/kept.txt && touch {outside}/new.txt && echo 3 > lib/util.py",
    )
    summary = store.undo()
    assert summary.restored == (plain / "lib" / "util.py",)
    assert summary.failed == (
        Problem(outside / "kept.txt", OUTSIDE),
        Problem(outside / "new.txt", OUTSIDE),
    )
    assert summary.checks[0].matches
    assert (outside / "kept.txt").read_text(encoding="utf-8") == "mine\nx\n"  # left as it is


async def test_a_command_that_plants_configuration_is_named_without_git(
    plain: Path, store: Checkpoints
) -> None:
    ctx = context(plain, store)
    store.begin_unit("plant")
    out = await run(bash, ctx, command="mkdir -p sub/.keel && echo '{}' > sub/.keel/settings.json")
    assert out.notice == (
        "a command created or changed project configuration: sub/.keel/settings.json; nothing "
        "in it applies until you approve it (`keel trust list` shows it)"
    )


@pytest.fixture
def repo(plain: Path) -> Path:
    subprocess.run(["git", "init", "-q"], cwd=plain, check=True)
    return plain


@pytest.mark.needs("git")
async def test_in_a_git_repo_a_change_outside_it_is_reported_too(
    repo: Path, store: Checkpoints, tmp_path: Path
) -> None:
    plain = repo
    outside = tmp_path / "out.txt"
    ctx = context(plain, store)
    store.begin_unit("spill")
    await run(bash, ctx, command=f"echo x > {outside} && echo y > y.txt")
    summary = store.undo()
    assert (summary.removed, summary.failed, summary.checks) == (
        (plain / "y.txt",),
        (Problem(outside, OUTSIDE),),
        (),  # a repository is captured by git status, without a tree check
    )


async def test_keels_own_session_files_inside_the_project_are_left_out(plain: Path) -> None:
    sessions = plain / "home" / "sessions" / "plain-1234"
    sessions.mkdir(parents=True)
    journal = sessions / "s1.jsonl"
    journal.write_text("{}\n", encoding="utf-8")
    store = Checkpoints(sessions / "s1.checkpoints")
    ctx = context(plain, store)
    store.begin_unit("grow")
    await run(bash, ctx, command=f"echo '{{}}' >> {journal} && echo 9 > lib/util.py")
    assert store.last_changed == (str(plain / "lib" / "util.py"),)
    assert store.undo().checks[0].matches
    store.close()


def test_outside_paths_names_what_a_command_line_points_at(tmp_path: Path) -> None:
    root = Path("/work/p")
    command = (
        "cp a.txt /tmp/a.txt; echo x >~/notes.txt && rm -f /var/log/app/*.log; "
        "cat /work/p/x > $HOME/y; ls /dev/null /proc/self; cd /work/p/sub; echo a/b"
    )
    assert outside_paths(command, root, home="/home/u") == [
        "/tmp/a.txt",
        "/home/u/notes.txt",
        "/var/log/app",
        "/home/u/y",
    ]


async def test_a_file_edit_before_the_command_counts_in_the_checkpoint(
    plain: Path, store: Checkpoints
) -> None:
    before, digest = tree(plain), tree_digest(plain)
    ctx = context(plain, store)
    store.begin_unit("edit then run")
    await run(read, ctx, path="app.py")
    await run(edit, ctx, path="app.py", old_string="return 1", new_string="return 2")
    await run(bash, ctx, command="echo z >> app.py && rm run.sh")
    summary = store.undo()
    assert summary.checks == (TreeCheck(plain, True, digest, digest, count=len(before)),)
    assert tree(plain) == before


async def test_commands_side_by_side_and_a_second_prompt(plain: Path, store: Checkpoints) -> None:
    ctx = context(plain, store)
    before = tree(plain)
    store.begin_unit("first")
    outs = await asyncio.gather(
        run(bash, ctx, command="sleep 0.2; echo slow >> lib/util.py"),
        run(bash, ctx, command="echo fast > fast.txt; rm data.bin"),
    )
    assert [o.content for o in outs] == ["[exit code 0]", "[exit code 0]"]
    after_first = tree(plain)
    store.begin_unit("second")
    await run(bash, ctx, command="echo again >> lib/util.py && rm fast.txt")
    second = store.undo()
    assert (second.label, second.checks[0].matches) == ("second", True)
    assert tree(plain) == after_first
    first = store.undo()
    assert (first.label, first.checks[0].matches) == ("first", True)
    assert tree(plain) == before
    with pytest.raises(NothingToUndo):
        store.undo()


async def test_only_changed_files_are_copied_again(plain: Path, tmp_path: Path) -> None:
    limits = TreeLimits()
    contents = ContentStore(tmp_path / "cache", "1")
    contents.refresh(scan(plain, limits), limits)
    first = contents.pack.stat().st_size
    assert first == sum(len(v[1]) for v in tree(plain).values() if v[0] == "file")
    contents.refresh(scan(plain, limits), limits)
    assert contents.pack.stat().st_size == first  # nothing changed: nothing read
    (plain / "lib" / "util.py").write_text("X = 22\n", encoding="utf-8")
    contents.refresh(scan(plain, limits), limits)
    assert contents.pack.stat().st_size == first + len("X = 22\n")


def test_the_pack_is_rewritten_when_it_is_mostly_old_copies(
    plain: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from keel.checkpoints import tree as tree_module

    monkeypatch.setattr(tree_module, "_PACK_SLACK", 0)
    limits = TreeLimits()
    contents = ContentStore(tmp_path / "cache", "1")
    util = plain / "lib" / "util.py"
    sizes = []
    for n in range(8):
        util.write_text("X = 1\n" * (n + 1) * 100, encoding="utf-8")
        contents.refresh(scan(plain, limits), limits)
        sizes.append(contents.pack.stat().st_size)
    live = sum(k.size for k in contents.index.values())
    assert any(b < a for a, b in itertools.pairwise(sizes))  # rewritten along the way
    assert max(sizes) <= 4 * live
    for path, kept in contents.index.items():
        assert contents.read(kept) == Path(path).read_bytes()


async def test_a_tree_over_max_files_is_not_captured_with_a_note(
    plain: Path, store: Checkpoints
) -> None:
    ctx = context(plain, store, limits=TreeLimits(max_files=3))
    store.begin_unit("too many")
    await run(bash, ctx, command="echo 4 > lib/util.py")
    summary = store.undo()
    assert summary.notes == (
        "Changes made by shell commands were not captured: the project holds more than 3 files.",
    )
    assert (summary.files, summary.checks) == ((), ())
    store.begin_unit("again")
    await run(bash, ctx, command="echo 5 > lib/util.py")
    assert store.undo().notes == (
        "Changes made by shell commands were not captured: the project holds more than 3 files "
        "(not scanned again in this session).",
    )


def test_settings_bound_the_capture_and_a_project_may_only_lower_them(tmp_path: Path) -> None:
    default = TreeLimits()
    assert {k: v[2] for k, v in CHECKPOINT_KEYS.items()} == {
        "file_bytes": default.file_bytes,
        "total_bytes": default.total_bytes,
        "max_files": default.max_files,
        "scan_seconds": default.scan_seconds,
    }
    s = Settings()
    _Merge(s, tmp_path / "user.json", untrusted=False).file(
        {"checkpoints": {"file_bytes": 10 * 2**20, "max_files": 100_000, "nope": 1}}
    )
    _Merge(s, tmp_path / "project.json", untrusted=True).file(
        {"checkpoints": {"total_bytes": 2**30, "max_files": 1000, "scan_seconds": -1}}
    )
    assert s.checkpoints == {"file_bytes": 10 * 2**20, "max_files": 1000}
    p = tmp_path
    assert s.warnings == [
        f"{p}/user.json: checkpoints.nope: unknown key skipped (known: file_bytes, max_files, "
        "scan_seconds, total_bytes)",
        f"{p}/project.json: checkpoints.total_bytes ignored: a project file may lower this "
        "limit, not raise it",
        f"{p}/project.json: checkpoints.scan_seconds must be at least 0 and at most 1e+12 "
        "(got -1); ignored",
    ]
    from keel.app.assembly import checkpoint_limits

    assert checkpoint_limits(s) == TreeLimits(file_bytes=10 * 2**20, max_files=1000)


def test_keel_undo_after_a_restart_restores_a_keel_p_bash_run(
    tmp_path: Path, isolated_env: Path
) -> None:
    project = (tmp_path / "proj").resolve()
    project.mkdir()
    (project / "notes.md").write_text("# notes\n", encoding="utf-8")
    (project / "src").mkdir()
    (project / "src" / "main.py").write_text("print('hi')\n", encoding="utf-8")
    before, digest = tree(project), tree_digest(project)
    script = write_script(
        tmp_path / "s.json",
        [
            {
                "tool_calls": [
                    {
                        "name": "bash",
                        "input": {
                            "command": "rm -r src && echo more >> notes.md && echo n > new.txt"
                        },
                    }
                ]
            },
            {"text": "done"},
            {
                "tool_calls": [{"name": "bash", "input": {"command": "echo again > notes.md"}}],
                "expect": {"last_user_contains": "Tree check: the project matches"},
            },
            {"text": "again"},
        ],
    )
    out = keel("-p", "reshape", "--model", f"scripted:{script}", "--mode", "bypass", cwd=project)
    assert out.returncode == 0, out.stderr
    assert not (project / "src").exists()
    (path,) = session_files(isolated_env)
    sid = path.stem
    out = keel("undo", sid, cwd=project)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "undone: “reshape”",
        "  restored notes.md",
        "  restored src",
        "  restored src/main.py",
        "  removed new.txt (the prompt created it)",
        f"  Tree check: the project matches the checkpoint taken before the request (sha256 "
        f"{digest[:12]}, 3 entries).",
        f'keel: the model is told with the next prompt: keel -p --resume {sid} "…"',
    ]
    assert tree(project) == before
    # The copies of the tree went with the session; the unit's own did the restore.
    assert list(isolated_env.glob("sessions/*/*.checkpoints/cache")) == []

    # Resumed: the next prompt's command is captured afresh and undone the same.
    out = keel("-p", "--resume", sid, "once more", "--mode", "bypass", cwd=project)
    assert (out.returncode, out.stdout) == (0, "again\n"), out.stderr
    assert (project / "notes.md").read_text(encoding="utf-8") == "again\n"
    out = keel("undo", sid, cwd=project)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[:2] == ["undone: “once more”", "  restored notes.md"]
    assert "Tree check: the project matches" in out.stdout
    assert tree(project) == before


async def test_rewind_puts_back_the_files_of_the_prompts_it_goes_back_over(
    tmp_path: Path, isolated_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from keel.testing import ScriptedProvider, reply
    from tests.tui_helpers import MODEL, Recorder, make_controller

    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    project = (tmp_path / "proj").resolve()
    project.mkdir()
    (project / "a.txt").write_text("one\n", encoding="utf-8")
    start = tree(project)
    provider = ScriptedProvider(
        [
            reply("", ("bash", {"command": "echo two >> a.txt"})),
            reply("First."),
            reply("", ("bash", {"command": "rm a.txt && echo b > b.txt"})),
            reply("Second."),
        ],
        model=MODEL.model,
    )
    recorder = Recorder(picks=[])
    controller = await make_controller(project, provider, "--mode", "bypass")
    controller.attach(recorder)
    for prompt in ("first", "second"):
        controller.submit(prompt)
        await controller.wait()
    after_first = {"a.txt": ("file", b"one\ntwo\n", 0o644)}
    assert tree(project) == {"b.txt": ("file", b"b\n", 0o644)}
    # Back to before "second", conversation only: the files stay.
    recorder.picks += [None]
    controller.submit("/rewind")
    await controller.wait()
    _, prompts = recorder.offered[-1]
    recorder.picks += [prompts[0].value, "conversation"]
    controller.submit("/rewind")
    await controller.wait()
    title, choices = recorder.offered[-1]
    assert (title, [c.value for c in choices]) == (
        "Those prompts changed files (1 with changes)",
        ["files", "conversation"],
    )
    assert tree(project) == {"b.txt": ("file", b"b\n", 0o644)}
    await controller.close()

    # A fresh session: back to before its first prompt, with the files.
    provider = ScriptedProvider(
        [
            reply("", ("bash", {"command": "echo two >> a.txt"})),
            reply("First."),
            reply("", ("bash", {"command": "rm a.txt && echo b > b.txt"})),
            reply("Second."),
        ],
        model=MODEL.model,
    )
    (project / "b.txt").unlink()
    (project / "a.txt").write_text("one\n", encoding="utf-8")
    recorder = Recorder(picks=[])
    controller = await make_controller(project, provider, "--mode", "bypass")
    controller.attach(recorder)
    for prompt in ("first", "second"):
        controller.submit(prompt)
        await controller.wait()
    recorder.picks += [None]
    controller.submit("/rewind")
    await controller.wait()
    _, prompts = recorder.offered[-1]
    recorder.picks += [prompts[0].value, "files"]  # before "second"
    controller.submit("/rewind")
    await controller.wait()
    assert tree(project) == after_first
    undos = [e.text for e in recorder.events if isinstance(e, Output) and e.title == "undo"]
    assert len(undos) == 1
    assert "Tree check: the project matches the checkpoint" in undos[0]
    assert recorder.inputs == ["second"]
    await controller.close()
    assert tree(project) != start  # "first" stays done


def test_keel_serve_undo_answers_with_the_tree_check(
    served: Served, anthropic: AnthropicServer, project: Path, isolated_env: Path
) -> None:
    from keel.testing import reply

    project = project.resolve()
    before, digest = tree(project), tree_digest(project)
    anthropic.add(
        reply("", ("bash", {"command": "rm app.py && echo more >> README.md && mkdir out"})),
        reply("Done."),
    )
    with served.client() as c:
        sid = create(c, mode="bypass")["id"]
        assert serve_prompt(c, sid, "reshape")["result"] == "Done."
        undo = c.post(f"/v1/sessions/{sid}/undo")
    assert (undo.status_code, undo.json()) == (
        200,
        {
            "label": "reshape",
            "restored": ["README.md", "app.py"],
            "removed": ["out"],
            "overwritten": [],
            "failed": [],
            "notes": [],
            "checks": [
                {
                    "root": ".",
                    "matches": True,
                    "checkpoint": digest,
                    "now": digest,
                    "differing": [],
                    "count": 3,
                    "why": "",
                }
            ],
        },
    )
    assert tree(project) == before
