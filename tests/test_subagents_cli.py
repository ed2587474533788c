"""Subagents and background tasks through the real `keel` binary against the loopback Anthropic
server: concurrent subagents with their own session files, a SIGKILL in the middle of a subagent
then resume, background shells with and without --no-wait, and `keel worktrees`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from keel.agent.loop import NOTIFICATIONS_PROMPT
from keel.llm.script import Reply, reply
from keel.session.journal import read_records
from keel.session.records import Meta, TerminalRecord, ToolResultRecord, UserRecord
from keel.testing.anthropic_server import AnthropicServer
from keel.testing.routing import routed_responder
from tests.helpers import context_of, without_context
from tests.test_cli import keel, session_files, write_script

PARENT = "PARENT: survey the project"
MODEL = "anthropic/claude-sonnet-4-5"


@pytest.fixture
def server() -> Iterator[AnthropicServer]:
    with AnthropicServer(api_key="sk-ant-test") as s:
        yield s


def env(server: AnthropicServer) -> dict[str, str]:
    return {"ANTHROPIC_API_KEY": "sk-ant-test", "ANTHROPIC_BASE_URL": server.url}


def task(prompt: str, kind: str = "general", **extra: Any) -> tuple[str, dict[str, Any]]:
    return (
        "task",
        {"description": f"{kind} job", "prompt": prompt, "subagent_type": kind, **extra},
    )


def first_user_text(body: dict[str, Any]) -> str:
    """The first user message's prompt, after the context block that opens it (its own block)."""
    content = body["messages"][0]["content"]
    if isinstance(content, str):
        return without_context(content)
    assert content[0]["text"] == context_of(body)
    return str(content[1]["text"])


def conversations(server: AnthropicServer) -> list[str]:
    """Which conversation each model request belonged to, in arrival order."""
    keys = []
    for r in server.model_requests:
        text = first_user_text(r.json or {})
        keys.append(next(k for k in ("CHILD-A", "CHILD-B", "CHILD", "PARENT") if k in text))
    return keys


def test_concurrent_subagents_from_the_shell(
    server: AnthropicServer, project: Path, isolated_env: Path
) -> None:
    server.responder = routed_responder(
        {
            PARENT: [
                reply("Two helpers.", task("CHILD-A: find main", "explore"), task("CHILD-B: X?")),
                reply("main is in app.py; X is 1."),
            ],
            "CHILD-A": [
                Reply(reply("", ("grep", {"pattern": "def main"})).message, delay=0.3),
                reply("main() is in app.py."),
            ],
            "CHILD-B": [
                Reply(reply("", ("read", {"path": "util.py"})).message, delay=0.3),
                reply("X = 1."),
            ],
        }
    )
    out = keel("-p", PARENT, "--model", MODEL, cwd=project, env=env(server))
    assert out.returncode == 0, out.stderr
    assert out.stdout == "main is in app.py; X is 1.\n"
    assert not server.errors
    keys = conversations(server)
    assert keys[0] == "PARENT"
    assert sorted(keys[1:3]) == ["CHILD-A", "CHILD-B"]  # both asked before either finished
    assert keys[-1] == "PARENT"
    # The parent's second request carries both reports as the task results.
    last = server.model_requests[-1].json or {}
    results = last["messages"][-1]["content"]
    assert [(r["type"], r["content"][0]["text"]) for r in results] == [
        ("tool_result", "main() is in app.py."),
        ("tool_result", "X = 1."),
    ]
    # The explore child was offered read-only tools only.
    explore = next(
        r.json or {} for r in server.model_requests if "CHILD-A" in first_user_text(r.json or {})
    )
    assert [t["name"] for t in explore["tools"]] == [
        "glob",
        "grep",
        "ls",
        "raw_output",
        "read",
        "web_fetch",
        "web_search",  # the provider's own search, declared as its server tool
    ]
    # Progress on stderr names the subagents' own tool calls.
    assert "grep def main" in out.stderr
    assert "read util.py" in out.stderr

    (parent,) = session_files(isolated_env)
    children = sorted(parent.with_name(f"{parent.stem}.agents").glob("*.jsonl"))
    assert len(children) == 2
    agents = []
    for child in children:
        records = read_records(child).records
        meta = records[0].payload
        assert isinstance(meta, Meta)
        assert meta.parent == parent.stem
        agents.append(meta.agent)
        end = records[-1].payload
        assert isinstance(end, TerminalRecord)
        assert end.reason == "completed"
    assert sorted(agents) == ["explore", "general"]

    # `keel sessions show` draws the tree; a child's id opens the child's own transcript.
    shown = keel("sessions", "show", parent.stem, cwd=project)
    assert shown.returncode == 0, shown.stderr
    tree = shown.stdout.split("subagents:\n", 1)[1].splitlines()
    assert len(tree) == 2
    for line, child in zip(tree, children, strict=True):
        assert line.startswith(f"  └ {child.stem}  ")
        assert "  completed, 2 turns, $" in line
    one = keel("sessions", "show", children[0].stem, cwd=project)
    assert one.returncode == 0, one.stderr
    first = one.stdout.splitlines()[0]
    assert first.startswith(f"[1] session {children[0].stem} in {project}, model ")
    assert first.endswith(f", {agents[0]} subagent of {parent.stem}")

    # Removing the session removes its subagents' sessions with it.
    removed = keel("sessions", "rm", parent.stem, cwd=project)
    assert removed.returncode == 0, removed.stderr
    agents_dir = parent.with_name(f"{parent.stem}.agents")
    assert removed.stdout == f"removed {parent}\nremoved {agents_dir}\n"
    assert not agents_dir.exists()


def wait_until(check: Any, what: str, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def test_sigkill_during_a_subagent_then_resume_reruns_it(
    server: AnthropicServer, project: Path, isolated_env: Path
) -> None:
    parent_script = [
        reply("", task("CHILD: count the lines of app.py")),
        reply("app.py has 5 lines."),
    ]
    server.responder = routed_responder(
        {
            PARENT: parent_script,
            # The child thinks for a long time: the run is killed meanwhile.
            "CHILD": [Reply(reply("never delivered").message, delay=30)],
        }
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "keel", "-p", PARENT, "--model", MODEL],
        cwd=project,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, **env(server)},
    )
    try:
        wait_until(lambda: "CHILD" in conversations(server), "the child's request")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        proc.kill()
        proc.communicate()
    (parent,) = session_files(isolated_env)
    sid = parent.stem
    before = read_records(parent).records
    assert [r.payload.type for r in before] == ["meta", "user", "assistant"]

    server.responder = routed_responder(
        {
            PARENT: parent_script,
            "CHILD": [
                reply("", ("bash", {"command": "wc -l < app.py"})),
                reply("5 lines."),
            ],
        }
    )
    out = keel("resume", sid, cwd=project, env=env(server))
    assert out.returncode == 0, out.stderr
    assert out.stdout == "app.py has 5 lines.\n"
    assert "keel: resuming: 1 unanswered tool call(s) to run" in out.stderr
    after = read_records(parent).records
    assert [r.payload.type for r in after] == [
        "meta",
        "user",
        "assistant",
        "tool_result",
        "assistant",
        "terminal",
    ]
    result = after[3].payload
    assert isinstance(result, ToolResultRecord)
    assert result.result.text == "5 lines."
    # The killed child's session stays as it was left; the re-run wrote a new one.
    children = sorted(parent.with_name(f"{sid}.agents").glob("*.jsonl"))
    assert len(children) == 2
    ends = [read_records(c).records[-1].payload for c in children]
    finished = [e for e in ends if isinstance(e, TerminalRecord)]
    assert [e.reason for e in finished] == ["completed"]
    shown = keel("sessions", "show", sid, cwd=project).stdout
    assert "  crashed, " in shown
    assert "  completed, 2 turns, " in shown


@pytest.mark.needs("sandbox")  # bash runs unasked only in the sandbox
def test_headless_waits_for_background_work_unless_no_wait(
    project: Path, tmp_path: Path, isolated_env: Path
) -> None:
    command = "sleep 0.5; echo built > artifact"
    turns: list[dict[str, object]] = [
        {
            "tool_calls": [
                {"name": "bash", "input": {"command": command, "run_in_background": True}}
            ]
        },
        {"text": "The build is running."},
        {"text": "The build finished: artifact written."},
    ]
    script = write_script(tmp_path / "s.json", turns)
    out = keel(
        "-p", "build it", "--model", f"scripted:{script}", "--output-format", "json", cwd=project
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["result"] == "The build finished: artifact written."
    assert result["turns"] == 3
    assert (project / "artifact").read_text() == "built\n"
    (path,) = session_files(isolated_env)
    records = read_records(path).records
    users = [r.payload for r in records if isinstance(r.payload, UserRecord)]
    # The result was journaled as it was sent, then keel's own prompt for the turn it started.
    assert [(u.source, u.message.text) for u in users[1:]] == [
        (
            "task_notification",
            # The description is an XML attribute: its > is escaped.
            '<task-notification id="bg-1" kind="shell" status="completed" '
            'description="sleep 0.5; echo built &gt; artifact">\n[exit code 0]\n'
            "</task-notification>",
        ),
        ("prompt", NOTIFICATIONS_PROMPT),
    ]

    (project / "artifact").unlink()
    quick = write_script(tmp_path / "q.json", turns[:2])
    out = keel("-p", "build it", "--model", f"scripted:{quick}", "--no-wait", cwd=project)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "The build is running.\n"
    assert "stopping 1 background task(s) still running" in out.stderr
    time.sleep(0.8)
    assert not (project / "artifact").exists()  # stopped with the run


def git(project: Path, *args: str) -> str:
    command = ["git", "-C", str(project), "-c", "user.name=t", "-c", "user.email=t@t", *args]
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout


@pytest.mark.needs("git")
def test_worktrees_are_listed_and_removed(
    server: AnthropicServer, project: Path, isolated_env: Path
) -> None:
    git(project, "init", "-q")
    git(project, "add", "-A")
    git(project, "commit", "-qm", "init")
    server.responder = routed_responder(
        {
            PARENT: [reply("", task("CHILD: add notes", isolation="worktree")), reply("ok")],
            "CHILD": [
                reply("", ("write", {"path": "NOTES.md", "content": "n\n"})),
                reply("Wrote it."),
            ],
        }
    )
    out = keel(
        "-p", PARENT, "--model", MODEL, "--mode", "accept-edits", cwd=project, env=env(server)
    )
    assert out.returncode == 0, out.stderr
    report = (server.model_requests[-1].json or {})["messages"][-1]["content"][0]
    branch = report["content"][0]["text"].split("on branch ", 1)[1].split(" ", 1)[0]
    assert branch.startswith("keel/task-")

    listed = keel("worktrees", cwd=project)
    assert listed.returncode == 0, listed.stderr
    head, last = listed.stdout.splitlines()
    assert head.startswith(f"{branch}  {isolated_env}/worktrees/")
    assert last.strip().endswith(" keel task: general job")

    missing = keel("worktrees", "rm", "keel/task-nope", cwd=project)
    assert missing.returncode == 2
    assert missing.stderr == (
        "keel: error: no subagent worktree on branch keel/task-nope "
        f"(hint: kept here: {branch} (keel worktrees list))\n"
    )
    removed = keel("worktrees", "rm", "--all", cwd=project)
    assert removed.returncode == 0, removed.stderr
    assert removed.stdout.startswith(f"removed {branch} (")
    assert git(project, "branch", "--list", "keel/*") == ""
    assert keel("worktrees", "list", cwd=project).stdout == (
        "no subagent worktrees in this repository\n"
    )
    outside = keel("worktrees", cwd=isolated_env)
    assert outside.returncode == 2
    assert outside.stderr.startswith("keel: error: not in a git repository")
