"""Git workspaces across a worker kill (issue 20): a fleet run on `git:<bare repo>#main` edits
files round by round; its worker is SIGKILLed during a slow step; a second worker (its own
scratch directory, as on another machine) resumes it from the run branch `keel/run-<id>`.

The bare repository is the ground truth: its run branch must hold every edit of the rounds that
completed before the kill, the tree the whole script writes once the run is over, and each
round's edit exactly once (an append to `log.txt` per round, so a round applied twice on top of
the saved state would show twice). Real `keel worker` processes, real git, a real nats-server.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from keel.llm.messages import ToolUse
from keel.session.records import AssistantRecord, ClaimRecord, TerminalRecord, ToolResultRecord
from tests.fleet_helpers import WorkerProc, keel, keel_json, read_run, script, setup_fleet, wait_for
from tests.nats_fixture import nats_server, nats_url  # noqa: F401

pytestmark = [pytest.mark.needs("git", "nats-server")]

IDENTITY = {
    "GIT_AUTHOR_NAME": "Test",
    "GIT_AUTHOR_EMAIL": "test@example.invalid",
    "GIT_COMMITTER_NAME": "Test",
    "GIT_COMMITTER_EMAIL": "test@example.invalid",
}


def sh(*args: str, cwd: Path, check: bool = True) -> str:
    """The test's own git (not the workspace's)."""
    result = subprocess.run(
        ["git", *args], cwd=cwd, env={**os.environ, **IDENTITY}, capture_output=True, check=False
    )
    if check and result.returncode != 0:
        raise AssertionError(f"git {args} failed: {result.stderr.decode()}")
    return result.stdout.decode().strip()


def make_remote(tmp: Path) -> tuple[Path, str]:
    """A bare repository whose `main` holds README.md; returns it and main's commit."""
    remote = tmp / "remote.git"
    sh("init", "--quiet", "--bare", "--initial-branch=main", str(remote), cwd=tmp)
    seed = tmp / "seed"
    sh("init", "--quiet", "--initial-branch=main", str(seed), cwd=tmp)
    (seed / "README.md").write_text("# project\n", encoding="utf-8")
    sh("add", "-A", cwd=seed)
    sh("commit", "--quiet", "-m", "start", cwd=seed)
    sh("push", "--quiet", str(remote), "main", cwd=seed)
    return remote, sh("rev-parse", "HEAD", cwd=seed)


def branch_head(remote: Path, run: str) -> str | None:
    out = sh("rev-parse", "--verify", "-q", f"refs/heads/keel/run-{run}", cwd=remote, check=False)
    return out or None


def tree(remote: Path, commit: str) -> dict[str, str]:
    """Every file of `commit` and its content."""
    found = {}
    for line in sh("ls-tree", "-r", "--name-only", commit, cwd=remote).splitlines():
        found[line] = sh("show", f"{commit}:{line}", cwd=remote) + "\n"
    return found


def history(remote: Path, run: str) -> list[str]:
    """The run branch's commits, oldest first."""
    out = sh("rev-list", "--reverse", f"refs/heads/keel/run-{run}", cwd=remote)
    return out.splitlines()


def write(name: str, i: int, path: str, content: str) -> dict[str, Any]:
    return {
        "id": f"toolu_{name}_w{i}",
        "name": "write",
        "input": {"path": path, "content": content},
    }


def bash(name: str, i: int, command: str) -> dict[str, Any]:
    return {
        "id": f"toolu_{name}_b{i}",
        "name": "bash",
        "input": {"command": command, "description": f"round {i}"},
    }


def _submit(url: str, remote: Path, model: str) -> str:
    out = keel(
        "submit", "--nats", url, "edit the project", "--model", model,
        "--mode", "bypass", "--workspace", f"git:{remote}#main",
    )  # fmt: skip
    assert out.returncode == 0, out
    return out.stdout.strip()


def _summary(url: str, run: str) -> dict[str, Any]:
    shown: dict[str, Any] = keel_json("runs", "--nats", url, "show", run)
    return shown


def _env() -> dict[str, str]:
    return {**os.environ, "KEEL_FLEET_ACK_WAIT": "2"}


#: What the whole kill script writes: four rounds, each a new file and one line of log.txt.
FINAL = {
    "README.md": "# project\n",
    "one.txt": "1\n",
    "two.txt": "2\n",
    "four.txt": "4\n",
    "log.txt": "round 1\nround 2\nround 3\nround 4\n",
}


def kill_script(tmp: Path, name: str) -> str:
    """Rounds 1, 2 and 4 write a file and append their line to log.txt; round 3 (its own round)
    only appends its line and then sleeps: the worker is killed there."""
    turns: list[dict[str, Any]] = []
    for i, (path, content) in ((1, ("one.txt", "1\n")), (2, ("two.txt", "2\n"))):
        turns.append(
            {
                "text": f"Round {i}.",
                "tool_calls": [
                    write(name, i, path, content),
                    bash(name, i, f"echo 'round {i}' >> log.txt"),
                ],
            }
        )
    turns.append(
        {
            "text": "Round 3 (slow).",
            "tool_calls": [bash(name, 3, "echo 'round 3' >> log.txt && sleep 4")],
        }
    )
    turns.append(
        {
            "text": "Round 4.",
            "tool_calls": [
                write(name, 4, "four.txt", "4\n"),
                bash(name, 4, "echo 'round 4' >> log.txt"),
            ],
        }
    )
    turns.append({"text": f"{name}: all four rounds done."})
    return script(tmp / f"{name}.json", turns)


def _clone_log(scratch: Path, run: str) -> str:
    log = scratch / "runs" / run / "work" / "log.txt"
    try:
        return log.read_text(encoding="utf-8")
    except OSError:
        return ""


def test_a_git_run_killed_in_its_slow_step_finishes_on_another_worker_with_every_saved_edit(
    nats_url: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    setup_fleet(nats_url)
    remote, main = make_remote(tmp_path)
    run = _submit(nats_url, remote, kill_script(tmp_path, "gk"))
    first = WorkerProc(nats_url, tmp_path / "scratch-a", "wa", env=_env())
    second: WorkerProc | None = None
    try:
        # Round 3 has appended its line in the first worker's clone and sleeps: kill it there.
        wait_for(
            lambda: "round 3" in _clone_log(tmp_path / "scratch-a", run),
            60,
            f"round 3 in the first worker's clone ({first.log()[-500:]})",
        )
        first.kill()
        # What the bare repository holds at the kill: rounds 1 and 2, saved before round 3's
        # model request; round 3's append lived only in the dead worker's clone.
        saved = branch_head(remote, run)
        assert saved is not None
        assert tree(remote, saved) == {
            "README.md": "# project\n",
            "one.txt": "1\n",
            "two.txt": "2\n",
            "log.txt": "round 1\nround 2\n",
        }
        second = WorkerProc(nats_url, tmp_path / "scratch-b", "wb", env=_env())
        done = wait_for(
            lambda: (s := _summary(nats_url, run)).get("status") in ("completed", "error") and s,
            90,
            "the run to finish on the second worker",
        )
    finally:
        logs = first.log() + (second.log() if second is not None else "")
        first.close()
        if second is not None:
            second.terminate(20)
            second.close()
    assert (done["status"], done["text"], done["turns"], done["worker"]) == (
        "completed",
        "gk: all four rounds done.",
        5,
        "wb",
    ), (done, logs)
    head = branch_head(remote, run)
    assert head is not None
    # The final tree is exactly what the whole script writes; each round's line once.
    assert tree(remote, head) == FINAL, logs
    # The branch starts at main and only grows: the first worker's saves are its ancestors.
    commits = history(remote, run)
    assert sh("rev-list", "--max-parents=0", head, cwd=remote) == main
    assert saved in commits, (saved, commits)
    assert commits.index(saved) < commits.index(head)
    # main itself is untouched.
    assert sh("rev-parse", "refs/heads/main", cwd=remote) == main
    # The journal: a claim by the second worker, round 3's bash answered once (the first
    # worker died before its result was durable), every call answered once.
    records = read_run(nats_url, run, tmp_path / "reader")
    claims = [r.payload for r in records if isinstance(r.payload, ClaimRecord)]
    assert [c.worker for c in claims] == ["wb"], claims
    calls = [
        b.id
        for r in records
        if isinstance(r.payload, AssistantRecord)
        for b in r.payload.message.blocks
        if isinstance(b, ToolUse)
    ]
    assert calls == [
        "toolu_gk_w1", "toolu_gk_b1", "toolu_gk_w2", "toolu_gk_b2",
        "toolu_gk_b3", "toolu_gk_w4", "toolu_gk_b4",
    ]  # fmt: skip
    answered = [
        r.payload.result.tool_use_id for r in records if isinstance(r.payload, ToolResultRecord)
    ]
    assert answered == calls
    assert all(
        not r.payload.result.is_error for r in records if isinstance(r.payload, ToolResultRecord)
    )
    last = records[-1].payload
    assert isinstance(last, TerminalRecord)
    assert last.reason == "completed"


def test_a_completed_git_run_pushes_its_final_state_and_runs_show_names_the_workspace(
    nats_url: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    setup_fleet(nats_url)
    remote, main = make_remote(tmp_path)
    model = script(
        tmp_path / "gc.json",
        [
            {"tool_calls": [write("gc", 1, "a.txt", "a\n")]},
            {"tool_calls": [write("gc", 2, "src/b.txt", "b\n")]},
            {"text": "gc done."},
        ],
    )
    run = _submit(nats_url, remote, model)
    worker = WorkerProc(nats_url, tmp_path / "scratch", "w1", env=_env())
    try:
        done = wait_for(
            lambda: (s := _summary(nats_url, run)).get("status") in ("completed", "error") and s,
            60,
            "the run to finish",
        )
    finally:
        worker.terminate(20)
        logs = worker.log()
        worker.close()
    assert (done["status"], done["text"], done["turns"]) == ("completed", "gc done.", 3), (
        done,
        logs,
    )
    head = branch_head(remote, run)
    assert head is not None
    assert tree(remote, head) == {"README.md": "# project\n", "a.txt": "a\n", "src/b.txt": "b\n"}
    # One commit per round that changed files, on top of main.
    assert len(history(remote, run)) == 3, history(remote, run)
    assert sh("rev-parse", "refs/heads/main", cwd=remote) == main
    # The clone is gone once the run is over.
    assert not (tmp_path / "scratch" / "runs" / run).exists()
    shown = keel("runs", "--nats", nats_url, "show", run)
    assert shown.returncode == 0, shown
    lines = shown.stdout.splitlines()
    assert f'workspace: {{"git": "{remote}", "ref": "main"}}' in lines, shown.stdout
    assert f"cwd: {tmp_path / 'scratch' / 'runs' / run / 'work'}" in lines, shown.stdout


def mixed_script(tmp: Path, name: str) -> str:
    """Round 2 writes two.txt AND then sleeps (one round, two calls): the kill comes after the
    write's result is durable and before the round is saved."""
    return script(
        tmp / f"{name}.json",
        [
            {"tool_calls": [write(name, 1, "one.txt", "1\n")]},
            {
                "tool_calls": [
                    write(name, 2, "two.txt", "2\n"),
                    bash(name, 2, "echo 'round 2' >> log.txt && sleep 4"),
                ]
            },
            {"text": f"{name} done."},
        ],
    )


@pytest.mark.slow  # long: it runs in `pytest -m slow` (.ci/run)
def test_an_edit_finished_in_the_round_in_flight_is_on_the_branch_or_the_model_is_told(
    nats_url: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    setup_fleet(nats_url)
    remote, _main = make_remote(tmp_path)
    run = _submit(nats_url, remote, mixed_script(tmp_path, "gm"))
    first = WorkerProc(nats_url, tmp_path / "scratch-a", "wa", env=_env())
    second: WorkerProc | None = None
    try:
        wait_for(
            lambda: "round 2" in _clone_log(tmp_path / "scratch-a", run),
            60,
            "round 2 in the first worker's clone",
        )
        first.kill()
        second = WorkerProc(nats_url, tmp_path / "scratch-b", "wb", env=_env())
        done = wait_for(
            lambda: (s := _summary(nats_url, run)).get("status") in ("completed", "error") and s,
            90,
            "the run to finish on the second worker",
        )
    finally:
        logs = first.log() + (second.log() if second is not None else "")
        first.close()
        if second is not None:
            second.terminate(20)
            second.close()
    assert done["status"] == "completed", (done, logs)
    head = branch_head(remote, run)
    assert head is not None
    files = tree(remote, head)
    records = read_run(nats_url, run, tmp_path / "reader")
    # A note telling the model (Workspace.resume_note's words), in whatever record carries it.
    told = any("file changes made by the last" in repr(r.payload) for r in records)
    # The journal says two.txt was written: it is on the branch, or the model was told it is not.
    assert files.get("two.txt") == "2\n" or told, (files, logs)
