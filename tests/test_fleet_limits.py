"""Bounded fleet workspaces (issue 29, item 3): what a run saves to its git workspace keeps to a
per-file, a per-round and a per-run limit. Real git: the "remote" is a bare repository in
tmp_path, and each test looks in it for what must never reach it. The last test runs a real
worker on a real nats-server with a scripted model and reads the request the model got."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from keel.fleet.workspace import (
    LeftOut,
    Workspace,
    WorkspaceError,
    WorkspaceLimits,
    parse_size,
    parse_workspace,
)
from keel.llm.messages import Message, Text, ToolResult
from keel.llm.providers.scripted import ScriptedProvider
from keel.llm.script import reply
from keel.tools.base import ToolContext, ToolError
from keel.tools.builtin import edit, read, write
from tests.fleet_helpers import keel, setup_fleet, wait_for
from tests.nats_fixture import nats_server, nats_url  # noqa: F401

RUN = "20261203-060000-abc123"
BRANCH = f"keel/run-{RUN}"
MB = 1024 * 1024
IDENTITY = {
    "GIT_AUTHOR_NAME": "Test",
    "GIT_AUTHOR_EMAIL": "test@example.invalid",
    "GIT_COMMITTER_NAME": "Test",
    "GIT_COMMITTER_EMAIL": "test@example.invalid",
}


def sh(*args: str, cwd: Path) -> str:
    result = subprocess.run(
        ["git", *args], cwd=cwd, env={**os.environ, **IDENTITY}, capture_output=True, check=False
    )
    assert result.returncode == 0, f"git {args}: {result.stderr.decode()}"
    return result.stdout.decode().strip()


def make_remote(tmp_path: Path, files: dict[str, bytes]) -> Path:
    """A bare repository whose `main` holds `files`."""
    remote = tmp_path / "remote.git"
    sh("init", "--quiet", "--bare", "--initial-branch=main", str(remote), cwd=tmp_path)
    seed = tmp_path / "seed"
    sh("init", "--quiet", "--initial-branch=main", str(seed), cwd=tmp_path)
    for name, data in files.items():
        (seed / name).write_bytes(data)
    sh("add", "-A", cwd=seed)
    sh("commit", "--quiet", "-m", "start", cwd=seed)
    sh("push", "--quiet", str(remote), "main", cwd=seed)
    return remote


def branch_files(remote: Path, branch: str = BRANCH) -> dict[str, int]:
    """Each file the run branch holds and its size."""
    out = sh("ls-tree", "-r", "-l", f"refs/heads/{branch}", cwd=remote)
    found = {}
    for line in out.splitlines():
        meta, name = line.split("\t", 1)
        found[name] = int(meta.split()[3])
    return found


def stored_blob_sizes(remote: Path) -> list[int]:
    """The size of every blob the remote stores, reachable or not."""
    out = sh(
        "cat-file", "--batch-all-objects", "--batch-check=%(objecttype) %(objectsize)", cwd=remote
    )
    return sorted(
        int(size) for kind, size in (ln.split() for ln in out.splitlines()) if kind == "blob"
    )


def prepare(remote: Path, scratch: Path, limits: WorkspaceLimits) -> Workspace:
    spec = parse_workspace({"git": str(remote), "ref": "main"})
    return Workspace.prepare(spec, RUN, scratch, roots=(remote.parent,), limits=limits)


def left(ws: Workspace) -> list[LeftOut]:
    """What the last save left out (a fresh list each time, so mypy does not narrow it)."""
    return list(ws.left_out)


def sparse(path: Path, size: int) -> None:
    with path.open("wb") as f:
        f.truncate(size)


# --- limits from the environment ----------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("10M", 10_000_000),
        ("10MB", 10_000_000),
        ("1G", 1_000_000_000),
        ("512k", 512_000),
        ("2Mi", 2 * MB),
        ("2MiB", 2 * MB),
        ("1.5G", 1_500_000_000),
        ("4096", 4096),
        ("off", None),
    ],
)
def test_sizes_read_as_an_operator_writes_them(text: str, size: int | None) -> None:
    assert parse_size(text, "KEEL_FLEET_MAX_FILE") == size


def test_limits_come_from_the_environment_with_defaults() -> None:
    assert WorkspaceLimits.from_env({}) == WorkspaceLimits(10_000_000, 50_000_000, 200_000_000)
    env = {"KEEL_FLEET_MAX_FILE": "1M", "KEEL_FLEET_MAX_ROUND": "off", "KEEL_FLEET_MAX_RUN": "1G"}
    assert WorkspaceLimits.from_env(env) == WorkspaceLimits(1_000_000, None, 1_000_000_000)


@pytest.mark.parametrize("bad", ["10X", "ten", "-5", "0", "1.5.2M", "M"])
def test_a_bad_limit_is_one_line_with_a_hint(bad: str) -> None:
    with pytest.raises(WorkspaceError) as caught:
        WorkspaceLimits.from_env({"KEEL_FLEET_MAX_ROUND": bad})
    line = caught.value.one_line()
    assert line.startswith(f"KEEL_FLEET_MAX_ROUND={bad!r} is ")
    assert "hint: write a size such as 10M, 1G or 500000 (bytes), or off" in line
    assert "\n" not in line


def test_a_worker_with_a_bad_limit_stops_at_once_with_one_line() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "keel", "worker", "--nats", "nats://127.0.0.1:9"],
        env={**os.environ, "KEEL_FLEET_MAX_FILE": "10 parsecs"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2, out
    assert out.stderr.strip().splitlines() == [
        "keel: error: KEEL_FLEET_MAX_FILE='10 parsecs' is not a size (hint: write a size such as "
        "10M, 1G or 500000 (bytes), or off for no limit)"
    ]


# --- the per-file limit -------------------------------------------------------------------


@pytest.mark.needs("git")
def test_a_100_mb_file_is_left_out_of_the_commit_and_the_push_and_the_model_is_told_once(
    tmp_path: Path,
) -> None:
    remote = make_remote(tmp_path, {"README.md": b"# project\n"})
    ws = prepare(remote, tmp_path / "w", WorkspaceLimits())
    big = ws.path / "data" / "big.bin"
    big.parent.mkdir()
    sparse(big, 100 * MB)
    # Sparse: its blocks on disk are far under the limit; only its apparent size is over.
    assert big.stat().st_blocks * 512 < 10_000_000
    (ws.path / "notes.txt").write_text("small\n", encoding="utf-8")
    first = ws.save("round 1")
    assert first is not None
    assert branch_files(remote) == {"README.md": 10, "notes.txt": 6}
    assert max(stored_blob_sizes(remote)) < 1000  # no such blob went over, reachable or not
    assert left(ws) == [LeftOut("data/big.bin", 100 * MB, "file")]
    assert ws.take_notes() == [
        "data/big.bin (104.9 MB) was not saved to the run's workspace: files over 10 MB are "
        "not kept (KEEL_FLEET_MAX_FILE); delete it or make it smaller. It will be lost if the "
        "run moves to another worker."
    ]
    # The next round: still left out, not told again; what else changed is saved.
    (ws.path / "more.txt").write_text("more\n", encoding="utf-8")
    second = ws.save("round 2")
    assert second is not None
    assert second != first
    assert branch_files(remote) == {"README.md": 10, "notes.txt": 6, "more.txt": 5}
    assert left(ws) == [LeftOut("data/big.bin", 100 * MB, "file")]
    assert ws.take_notes() == []
    # Made small, it is saved; made big again later, the model is told again.
    big.write_bytes(b"x" * 100)
    assert ws.save("round 3") is not None
    assert branch_files(remote)["data/big.bin"] == 100
    assert left(ws) == []
    sparse(big, 20 * MB)
    assert ws.save("round 4") is None  # nothing else changed: no commit, no push
    assert branch_files(remote)["data/big.bin"] == 100  # the saved version stays
    assert [n.split(" was ")[0] for n in ws.take_notes()] == ["data/big.bin (21.0 MB)"]
    assert max(stored_blob_sizes(remote)) < 1000


@pytest.mark.needs("git")
def test_a_large_file_of_the_start_commit_is_not_the_runs_doing(tmp_path: Path) -> None:
    remote = make_remote(tmp_path, {"model.bin": b"m" * 3000, "small.txt": b"s\n"})
    ws = prepare(remote, tmp_path / "w", WorkspaceLimits(per_file=1000))
    with (ws.path / "model.bin").open("ab") as f:
        f.write(b"more")
    assert ws.save("round 1") is not None
    assert branch_files(remote)["model.bin"] == 3004
    assert left(ws) == []
    assert ws.take_notes() == []
    # A small file the run makes large is the run's doing: the branch keeps the small one.
    (ws.path / "small.txt").write_bytes(b"s" * 2000)
    assert ws.save("round 2") is None
    assert branch_files(remote)["small.txt"] == 2
    assert left(ws) == [LeftOut("small.txt", 2000, "file")]


# --- the per-round and per-run limits -----------------------------------------------------


@pytest.mark.needs("git")
def test_a_round_over_its_limit_leaves_out_the_largest_files_until_it_fits(
    tmp_path: Path,
) -> None:
    remote = make_remote(tmp_path, {"README.md": b"# project\n"})
    ws = prepare(remote, tmp_path / "w", WorkspaceLimits(per_file=None, per_round=1000))
    (ws.path / "a.bin").write_bytes(b"a" * 600)
    (ws.path / "b.bin").write_bytes(b"b" * 500)
    (ws.path / "c.bin").write_bytes(b"c" * 300)
    assert ws.save("round 1") is not None
    # 1400 bytes: leaving out a (the largest) leaves 800, which fits.
    assert branch_files(remote) == {"README.md": 10, "b.bin": 500, "c.bin": 300}
    assert left(ws) == [LeftOut("a.bin", 600, "round")]
    assert ws.take_notes() == [
        "a.bin (600 B) was not saved with this tool round: one round may add at most 1 kB "
        "(KEEL_FLEET_MAX_ROUND) and this one added more. It is saved with a later round that "
        "has room for it; until then it will be lost if the run moves to another worker."
    ]
    # The next round has room for it.
    assert ws.save("round 2") is not None
    assert branch_files(remote) == {"README.md": 10, "a.bin": 600, "b.bin": 500, "c.bin": 300}
    assert left(ws) == []
    assert ws.run_added == 1400


@pytest.mark.needs("git")
def test_a_run_over_its_limit_saves_nothing_more_and_a_resumed_run_counts_what_it_saved(
    tmp_path: Path,
) -> None:
    remote = make_remote(tmp_path, {"README.md": b"# project\n", "seed.bin": b"s" * 5000})
    limits = WorkspaceLimits(per_file=None, per_round=None, per_run=1000)
    ws = prepare(remote, tmp_path / "w", limits)
    assert ws.run_added == 0  # the start commit's files are not the run's
    (ws.path / "a.bin").write_bytes(b"a" * 600)
    assert ws.save("round 1") is not None
    (ws.path / "b.bin").write_bytes(b"b" * 500)
    assert ws.save("round 2") is None
    assert branch_files(remote) == {"README.md": 10, "seed.bin": 5000, "a.bin": 600}
    assert ws.take_notes() == [
        "b.bin (500 B) was not saved to the run's workspace: a run may add at most 1 kB to it "
        "(KEEL_FLEET_MAX_RUN) and this run had added 600 B before this round; delete it or make "
        "it smaller. It will be lost if the run moves to another worker."
    ]
    # Another worker resumes the run: it counts what the branch holds beyond main.
    other = prepare(remote, tmp_path / "w2", limits)
    assert other.resumed_from is not None
    assert other.run_added == 600
    (other.path / "b.bin").write_bytes(b"b" * 500)
    (other.path / "c.bin").write_bytes(b"c" * 300)
    assert other.save("round 3") is not None
    assert branch_files(remote) == {"README.md": 10, "seed.bin": 5000, "a.bin": 600, "c.bin": 300}
    assert left(other) == [LeftOut("b.bin", 500, "run")]


@pytest.mark.needs("git")
def test_a_commit_the_agent_made_with_a_file_over_the_limit_is_never_pushed(
    tmp_path: Path,
) -> None:
    remote = make_remote(tmp_path, {"README.md": b"# project\n"})
    ws = prepare(remote, tmp_path / "w", WorkspaceLimits(per_file=1000))
    start = sh("rev-parse", "HEAD", cwd=ws.path)
    (ws.path / "big.bin").write_bytes(b"B" * 5000)
    (ws.path / "ok.txt").write_text("ok\n", encoding="utf-8")
    sh("add", "-A", cwd=ws.path)
    sh("commit", "--quiet", "-m", "the agent's own commit", cwd=ws.path)
    (ws.path / "gone.bin").write_bytes(b"G" * 4000)  # committed, then deleted: never pushed
    sh("add", "-A", cwd=ws.path)
    sh("commit", "--quiet", "-m", "another", cwd=ws.path)
    (ws.path / "gone.bin").unlink()
    saved = ws.save("round 1")
    assert saved is not None
    assert branch_files(remote) == {"README.md": 10, "ok.txt": 3}
    # One keel commit on the start: the agent's commits were undone into it.
    assert sh("rev-list", f"refs/heads/{BRANCH}", cwd=remote).splitlines() == [saved, start]
    assert max(stored_blob_sizes(remote)) < 1000
    assert ws.take_notes() == [
        "Commits made in the workspace since the last save were not pushed: they held more than "
        "the run's workspace may keep. Their changes were saved as keel's own commit, without "
        "the files over the limits.",
        "big.bin (5 kB) was not saved to the run's workspace: files over 1 kB are not kept "
        "(KEEL_FLEET_MAX_FILE); delete it or make it smaller. It will be lost if the run moves "
        "to another worker.",
    ]
    assert (ws.path / "big.bin").stat().st_size == 5000  # still in the clone


# --- the file tools -----------------------------------------------------------------------


async def test_write_and_edit_refuse_a_file_over_the_limit_before_writing(tmp_path: Path) -> None:
    ctx = ToolContext(
        cwd=tmp_path,
        root=tmp_path,
        max_file_size=1000,
        max_file_reason="files over 1 kB are not kept in this fleet run's workspace "
        "(KEEL_FLEET_MAX_FILE)",
    )
    with pytest.raises(ToolError) as caught:
        await write.run(ctx, {"path": "big.txt", "content": "x" * 1500})
    assert str(caught.value) == (
        "big.txt would be 1.5 kB: files over 1 kB are not kept in this fleet run's workspace "
        "(KEEL_FLEET_MAX_FILE); nothing was written. Write a smaller file, or keep large data "
        "out of the workspace"
    )
    assert not (tmp_path / "big.txt").exists()
    await write.run(ctx, {"path": "small.txt", "content": "x" * 900})
    with pytest.raises(ToolError, match=r"^small.txt would be 1.0 kB: files over 1 kB"):
        await edit.run(
            ctx, {"path": "small.txt", "old_string": "x" * 900, "new_string": "y" * 1001}
        )
    assert (tmp_path / "small.txt").read_text(encoding="utf-8") == "x" * 900
    # A file that was over the limit already may still be edited.
    (tmp_path / "large.txt").write_text("z" * 2000, encoding="utf-8")
    await read.run(ctx, {"path": "large.txt"})
    await edit.run(ctx, {"path": "large.txt", "old_string": "z" * 2000, "new_string": "z" * 2001})
    assert (tmp_path / "large.txt").stat().st_size == 2001


# --- the agent's hook -----------------------------------------------------------------------


async def test_a_note_queued_before_a_request_goes_with_that_request(project: Path) -> None:
    from keel.agent.loop import Agent
    from keel.permissions import AllowAll
    from keel.tools.builtin import builtin_tools

    first = reply("", ("read", {"path": "README.md"}))
    (call_id,) = (call.id for call in first.message.tool_uses)
    provider = ScriptedProvider([first, reply("Done.")])
    agent = Agent(
        provider=provider, model="scripted", cwd=project, system="s", tools=builtin_tools(),
        gate=AllowAll(),
    )  # fmt: skip
    hooked: list[int] = []

    def before() -> None:
        hooked.append(len(provider.requests))
        if len(provider.requests) == 1:  # the tool round is over, the second request is next
            agent.add_request_note("big.bin was not saved")

    agent.before_request.append(before)
    result = await agent.run("look")
    assert result.text == "Done."
    assert hooked == [0, 1]
    assert [m.role for m in provider.requests[0].messages] == ["user"]
    last = provider.requests[1].messages[-1]
    assert last.role == "user"
    assert isinstance(last.blocks[0], ToolResult)
    assert last.blocks[0].tool_use_id == call_id
    assert last.blocks[1:] == (Text("big.bin was not saved"),)


# --- a real worker ------------------------------------------------------------------------


@pytest.mark.needs("git", "nats-server")
def test_a_worker_leaves_a_100_mb_file_out_of_the_push_and_tells_the_model_in_its_next_request(
    nats_url: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    from keel.fleet.worker import Worker

    setup_fleet(nats_url)
    remote = make_remote(tmp_path, {"README.md": b"# project\n"})
    round_one = reply(
        "",
        ("bash", {"command": "truncate -s 100M big.bin && echo hi > small.txt",
                  "description": "make data"}),
        ("write", {"path": "notes.txt", "content": "n" * 6000}),
    )  # fmt: skip
    bash_id, write_id = (call.id for call in round_one.message.tool_uses)
    provider = ScriptedProvider([round_one, reply("Done.")])
    out = keel(
        "submit", "--nats", nats_url, "make some data", "--model", "scripted:demo",
        "--mode", "bypass", "--workspace", f"git:{remote}#main",
    )  # fmt: skip
    assert out.returncode == 0, out
    run = out.stdout.strip()
    said: list[str] = []
    worker = Worker(
        nats_url,
        scratch=tmp_path / "scratch",
        name="wl",
        env={**os.environ, "KEEL_WORKSPACE_ROOTS": str(tmp_path), "KEEL_FLEET_MAX_FILE": "5k"},
        provider_for=lambda _ref: provider,
        say=said.append,
    )
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=lambda: loop.run_until_complete(worker.run()), daemon=True)
    thread.start()

    def finished() -> dict[str, object] | None:
        shown = keel("runs", "--nats", nats_url, "show", run, "--json")
        summary: dict[str, object] = json.loads(shown.stdout) if shown.stdout else {}
        return summary if summary.get("status") in ("completed", "error", "failed") else None

    try:
        done = wait_for(finished, 60, f"the run to finish ({said})")
    finally:
        loop.call_soon_threadsafe(worker.stop)
        thread.join(30)
        loop.close()
    assert (done["status"], done["text"]) == ("completed", "Done."), (done, said)
    assert branch_files(remote, f"keel/run-{run}") == {"README.md": 10, "small.txt": 3}
    assert max(stored_blob_sizes(remote)) < 1000
    # The model's second request: the round's results, then the note, in the same request.
    assert len(provider.requests) == 2
    note = (
        "big.bin (104.9 MB) was not saved to the run's workspace: files over 5 kB are not kept "
        "(KEEL_FLEET_MAX_FILE); delete it or make it smaller. It will be lost if the run moves "
        "to another worker."
    )
    refused = (
        "notes.txt would be 6.0 kB: files over 5 kB are not kept in this fleet run's workspace "
        "(KEEL_FLEET_MAX_FILE); nothing was written. Write a smaller file, or keep large data "
        "out of the workspace"
    )
    assert provider.requests[1].messages[-1] == Message(
        "user",
        (
            ToolResult(bash_id, (Text("[exit code 0]"),)),
            ToolResult(write_id, (Text(refused),), is_error=True),
            Text(note),
        ),
    )
    assert f"run {run}: {note}" in said  # and the worker's log names it


@pytest.mark.needs("git")
def test_an_empty_remote_keeps_to_the_limits_from_its_first_commit(tmp_path: Path) -> None:
    remote = tmp_path / "empty.git"
    sh("init", "--quiet", "--bare", str(remote), cwd=tmp_path)
    spec = parse_workspace({"git": str(remote)})
    limits = WorkspaceLimits(per_file=1000, per_round=1000)
    ws = Workspace.prepare(spec, RUN, tmp_path / "w", roots=(tmp_path,), limits=limits)
    (ws.path / "big.bin").write_bytes(b"B" * 2000)
    (ws.path / "a.txt").write_bytes(b"a" * 700)
    (ws.path / "b.txt").write_bytes(b"b" * 600)
    assert ws.save("round 1") is not None
    assert branch_files(remote) == {"b.txt": 600}
    assert left(ws) == [LeftOut("big.bin", 2000, "file"), LeftOut("a.txt", 700, "round")]
