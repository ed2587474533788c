"""Durable sessions from the shell: resume, --continue, suspend, fork/rewind, `keel sessions`,
and the fold that rebuilds a conversation from records."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from keel.errors import UserError
from keel.llm.messages import Message, Text, Thinking, ToolUse, Usage, tool_result, user
from keel.session.fold import MISSING_RESULT, fold
from keel.session.journal import read_records
from keel.session.records import (
    AssistantRecord,
    Fingerprint,
    Meta,
    Record,
    TerminalRecord,
    ToolResultRecord,
    UserRecord,
)
from keel.session.resume import check_resume, fingerprint_diff
from tests.test_cli import keel, session_files, start_keel, wait_for, write_script

# -- fold ----------------------------------------------------------------------------------------

A = Message(
    "assistant",
    (Text("two calls"), ToolUse("a", "read", {"path": "x"}), ToolUse("b", "read", {"path": "y"})),
)


def records(*payloads: Any) -> list[Record]:
    meta = Meta("s", "/p", "anthropic/claude-sonnet-4-5")
    return [
        Record(i, "2026-11-30T00:00:00.000Z", p) for i, p in enumerate((meta, *payloads), start=1)
    ]


def test_fold_rebuilds_the_conversation_and_counters() -> None:
    state = fold(
        records(
            UserRecord(user("go")),
            AssistantRecord(A, Usage(100, 10), 0.01, "tool_use", 1),
            ToolResultRecord(tool_result("b", "y!")),  # finished first
            ToolResultRecord(tool_result("a", "x!")),
            AssistantRecord(
                Message("assistant", (Text("done"),)), Usage(200, 5, 90), 0.02, "end_turn", 2
            ),
            TerminalRecord("completed"),
        )
    )
    assert state.messages == [
        user("go"),
        A,
        Message("user", (tool_result("a", "x!"), tool_result("b", "y!"))),  # call order
        Message("assistant", (Text("done"),)),
    ]
    assert state.pending is None
    assert (state.turns, state.usage) == (2, Usage(300, 15, 90))
    assert state.cost == pytest.approx(0.03)
    assert state.status == "completed"
    assert state.last_prompt == "go"


def test_fold_leaves_a_half_answered_batch_pending() -> None:
    state = fold(
        records(
            UserRecord(user("go")),
            AssistantRecord(A, Usage(1, 1), 0.0, "tool_use", 1),
            ToolResultRecord(tool_result("a", "x!")),
        )
    )
    assert state.pending is not None
    assert [c.id for c in state.pending.unanswered] == ["b"]
    assert state.messages == [user("go"), A]
    assert state.status == "open"
    assert state.turns_since_prompt == 1


def test_fold_stands_in_for_results_a_later_record_skipped() -> None:
    state = fold(
        records(
            UserRecord(user("go")),
            AssistantRecord(A, Usage(1, 1), 0.0, "tool_use", 1),
            ToolResultRecord(tool_result("a", "x!")),
            UserRecord(user("next")),
        )
    )
    assert state.messages[2] == Message(
        "user",
        (tool_result("a", "x!"), tool_result("b", MISSING_RESULT, is_error=True), Text("next")),
    )


def test_fold_sees_activity_after_a_terminal_as_open() -> None:
    state = fold(
        records(
            UserRecord(user("go")),
            AssistantRecord(A, Usage(1, 1), 0.0, "tool_use", 1),
            TerminalRecord("suspended"),
            ToolResultRecord(tool_result("a", "x!")),
        )
    )
    assert state.status == "open"


def test_fingerprint_diff_and_the_provider_rule() -> None:
    old = Fingerprint("anthropic", "claude-sonnet-4-5", "s1", "t1", 200, None, 5.0)
    new = Fingerprint("openai", "gpt-5", "s2", "t1", 100, None, 5.0)
    assert fingerprint_diff(old, new) == [
        "provider: anthropic -> openai",
        "model: claude-sonnet-4-5 -> gpt-5",
        "system prompt: changed (the session's file does not record which part)",
        "max_turns: 200 -> 100",
    ]
    thinking = Message(
        "assistant", (Thinking("plan", "sig", source="anthropic"), ToolUse("a", "read", {}))
    )
    meta = Meta("s", "/p", "anthropic/claude-sonnet-4-5", old)
    state = fold(
        [
            Record(1, "t", meta),
            Record(2, "t", UserRecord(user("go"))),
            Record(3, "t", AssistantRecord(thinking, Usage(), 0.0, "tool_use", 1)),
        ]
    )
    with pytest.raises(UserError, match="reasoning came from anthropic; openai cannot continue"):
        check_resume(state, new, force=True)
    calm = fold([Record(1, "t", meta), Record(2, "t", UserRecord(user("go")))])
    with pytest.raises(UserError, match="different configuration: provider: anthropic -> openai"):
        check_resume(calm, new, force=False)
    assert check_resume(calm, new, force=True)[0] == "provider: anthropic -> openai"


# -- the shell -----------------------------------------------------------------------------------


def two_step_script(tmp_path: Path) -> Path:
    return write_script(
        tmp_path / "s.json",
        [
            {
                "text": "Two steps.",
                "tool_calls": [
                    {
                        "name": "bash",
                        "input": {"command": "touch started; sleep 1; echo one >> log"},
                    },
                    {"name": "bash", "input": {"command": "echo two >> log"}},
                ],
            },
            {"text": "Both steps done."},
            {"text": "And the follow-up."},
        ],
    )


def run_until_suspended(project: Path, script: Path) -> str:
    proc = start_keel(project, script, prompt="do two steps")
    wait_for(project / "started")
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=20)
    assert proc.returncode == 6, stderr
    return str(json.loads(stdout)["session_id"])


@pytest.mark.needs("sandbox")  # bash runs unasked only in the sandbox
def test_suspend_then_resume_runs_each_tool_exactly_once(
    project: Path, tmp_path: Path, isolated_env: Path
) -> None:
    script = two_step_script(tmp_path)
    sid = run_until_suspended(project, script)
    # A suspend waits for the whole tool batch (the loop boundary): both calls ran.
    assert (project / "log").read_text(encoding="utf-8") == "one\ntwo\n"
    out = keel(
        "resume", sid[:15], "--output-format", "json", cwd=tmp_path
    )  # from elsewhere, by prefix
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["result"] == "Both steps done."
    assert result["session_id"] == sid
    assert (project / "log").read_text(encoding="utf-8") == "one\ntwo\n"  # nothing re-ran
    assert "unanswered tool call" not in out.stderr
    (path,) = session_files(isolated_env)
    recs = read_records(path, allow_torn_tail=False).records
    assert [r.payload.type for r in recs if r.payload.type != "process"] == [
        "meta",
        "user",
        "assistant",
        "tool_result",
        "tool_result",
        "terminal",  # the suspended run
        "assistant",  # the resumed one goes on with the next model call
        "terminal",
    ]
    assert [r.seq for r in recs] == list(range(1, len(recs) + 1))
    terminal = recs[-1].payload
    assert isinstance(terminal, TerminalRecord)
    assert (terminal.reason, terminal.turns, terminal.prompt) == ("completed", 2, "do two steps")
    # Nothing left: a bare resume says so; a prompt continues the conversation.
    out = keel("resume", sid, cwd=project)
    assert out.returncode == 2
    assert out.stderr == (
        f"keel: error: session {sid} has nothing left to resume: its last turn completed "
        f'(hint: continue it with a prompt: keel -p --resume {sid} "…")\n'
    )
    out = keel("-p", "--continue", "one more thing", cwd=project)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "And the follow-up.\n"
    assert len(session_files(isolated_env)) == 1


@pytest.mark.needs("sandbox")  # bash runs unasked only in the sandbox
def test_resume_refuses_a_changed_model_unless_forced(project: Path, tmp_path: Path) -> None:
    script = two_step_script(tmp_path)
    sid = run_until_suspended(project, script)
    other = write_script(tmp_path / "other.json", [{"text": "other model"}] * 3)
    out = keel("resume", sid, "--model", f"scripted:{other}", cwd=project)
    assert out.returncode == 2
    assert out.stderr.startswith(
        f"keel: error: session {sid} was made with a different configuration: model: "
    )
    assert out.stderr.endswith(
        "(hint: resume with the same model and settings, or pass --force to accept the change)\n"
    )
    assert (project / "log").read_text(encoding="utf-8") == "one\ntwo\n"  # nothing more ran
    out = keel("resume", sid, "--model", f"scripted:{other}", "--force", cwd=project)
    assert out.returncode == 0, out.stderr
    assert "keel: warning: resuming despite a changed configuration: model: " in out.stderr
    assert out.stdout == "other model\n"


@pytest.mark.needs("sandbox")  # bash runs unasked only in the sandbox
def test_resume_of_a_running_session_is_refused(project: Path, tmp_path: Path) -> None:
    script = write_script(
        tmp_path / "s.json",
        [
            {"tool_calls": [{"name": "bash", "input": {"command": "touch started; sleep 30"}}]},
        ],
    )
    proc = start_keel(project, script, prompt="wait")
    try:
        wait_for(project / "started")
        listing = keel("sessions", "list", "--json", cwd=project)
        (entry,) = [json.loads(line) for line in listing.stdout.splitlines()]
        assert entry["status"] == "running"
        out = keel("resume", entry["id"], cwd=project)
        assert out.returncode == 2
        assert out.stderr == (
            f"keel: error: session {entry['id']} is already open for writing by pid {proc.pid} "
            "(hint: wait for that run to finish, or suspend it with `keel suspend`)\n"
        )
        out = keel("suspend", entry["id"], cwd=project)
        assert out.returncode == 0
        assert out.stdout == (
            f"asked pid {proc.pid} to suspend session {entry['id']}; resume with: keel resume {entry['id']}\n"
        )
    finally:
        proc.send_signal(signal.SIGTERM)  # a second signal aborts the sleeping tool
        proc.communicate(timeout=20)
    assert proc.returncode == 130


def test_sessions_list_show_path_rm(project: Path, tmp_path: Path) -> None:
    script = write_script(
        tmp_path / "s.json",
        [
            {
                "tool_calls": [{"name": "glob", "input": {"pattern": "*.md"}}],
                "usage": {"input": 1000, "output": 10},
            },
            {"text": "One README.", "usage": {"input": 1100, "output": 5}},
        ],
    )
    first = json.loads(
        keel(
            "-p",
            "find docs",
            "--model",
            f"scripted:{script}",
            "--output-format",
            "json",
            cwd=project,
        ).stdout
    )
    sid = first["session_id"]
    listing = keel("sessions", "list", cwd=project)
    assert listing.returncode == 0
    header, row = listing.stdout.splitlines()
    assert header.split() == ["ID", "STARTED", "STATUS", "TURNS", "COST", "LAST", "PROMPT"]
    assert row.split()[0] == sid
    assert row.split()[3:] == ["completed", "2", "$0.0000", "find", "docs"]
    (entry,) = [
        json.loads(line)
        for line in keel("sessions", "list", "--json", cwd=project).stdout.splitlines()
    ]
    assert {k: entry[k] for k in ("id", "status", "turns", "last_prompt", "parent")} == {
        "id": sid,
        "status": "completed",
        "turns": 2,
        "last_prompt": "find docs",
        "parent": None,
    }
    assert keel("sessions", "list", cwd=tmp_path).stderr.startswith("no sessions for")
    assert sid in keel("sessions", "list", "--all", cwd=tmp_path).stdout
    show = keel("sessions", "show", sid, cwd=project).stdout.splitlines()
    assert show[1] == "[2] user: find docs"
    assert show[2].startswith("[3] assistant (test, 1010 tokens, $0.0000, tool_use):")
    assert show[3].startswith('    → glob {"pattern": "*.md"}')
    assert show[4].startswith("[4] ← toolu_scripted_")
    assert show[4].endswith(": README.md")
    assert show[-1] == "[6] ── completed (2 turns, $0.0000 in all)"
    raw = keel("sessions", "show", sid, "--json", cwd=project).stdout
    assert [json.loads(line)["type"] for line in raw.splitlines()] == [
        "meta",
        "user",
        "assistant",
        "tool_result",
        "assistant",
        "terminal",
    ]
    path = keel("sessions", "path", sid, cwd=project).stdout.strip()
    assert Path(path).name == f"{sid}.jsonl"
    out = keel("sessions", "rm", sid, cwd=project)
    assert out.stdout == f"removed {path}\n"
    assert not Path(path).exists()
    out = keel("sessions", "show", sid, cwd=project)
    assert out.returncode == 2
    assert (
        out.stderr
        == f"keel: error: no session '{sid}' (hint: `keel sessions list --all` shows every session)\n"
    )


def test_fork_and_rewind(project: Path, tmp_path: Path, isolated_env: Path) -> None:
    script = write_script(
        tmp_path / "s.json",
        [
            {"text": "First answer."},
            {"text": "Second answer."},
            {"text": "Third answer."},
        ],
    )
    sid = json.loads(
        keel(
            "-p", "first", "--model", f"scripted:{script}", "--output-format", "json", cwd=project
        ).stdout
    )["session_id"]
    assert keel("-p", "--resume", sid, "second", cwd=project).stdout == "Second answer.\n"
    [parent] = [p for p in session_files(isolated_env) if p.stem == sid]
    recs = read_records(parent).records
    prompts = [r.seq for r in recs if isinstance(r.payload, UserRecord)]
    assert prompts == [2, 5]
    out = keel("fork", sid, "--at", "3", cwd=project)
    assert out.returncode == 2
    assert out.stderr == (
        f"keel: error: seq 3 of session {sid} is not a prompt; forks start at a prompt boundary "
        "(hint: prompts are at seq 2, 5)\n"
    )
    out = keel("fork", sid, "--at", "5", cwd=project)
    assert out.returncode == 0, out.stderr
    fork_id = out.stdout.strip()
    assert (
        out.stderr
        == f'continue it: keel -p --resume {fork_id} "…"\nthe prompt you rewound past: second\n'
    )
    fork_path = Path(keel("sessions", "path", fork_id, cwd=project).stdout.strip())
    fork_recs = read_records(fork_path).records
    meta = fork_recs[0].payload
    assert isinstance(meta, Meta)
    assert (meta.parent, meta.parent_seq) == (sid, 4)
    assert [r.payload.type for r in fork_recs] == ["meta", "user", "assistant", "terminal"]
    # The fork continues on its own (the script picks up after the fork's one answer).
    assert (
        keel("-p", "--resume", fork_id, "a different second", cwd=project).stdout
        == "Second answer.\n"
    )
    assert len(read_records(parent).records) == 7  # the parent is untouched
    whole = keel("fork", sid, cwd=project)
    assert whole.returncode == 0, whole.stderr


@pytest.mark.needs("sandbox")  # bash runs unasked only in the sandbox
def test_resume_after_a_torn_write(project: Path, tmp_path: Path, isolated_env: Path) -> None:
    script = write_script(
        tmp_path / "s.json",
        [
            {"tool_calls": [{"name": "bash", "input": {"command": "echo ran >> log"}}]},
            {"text": "Finished."},
        ],
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "keel",
            "-p",
            "go",
            "--model",
            f"scripted:{script}",
            "--max-turns",
            "1",
        ],
        cwd=project,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 3  # max_turns: stopped after the tool ran
    (path,) = session_files(isolated_env)
    with path.open("ab") as f:
        f.write(b'{"v":1,"seq":7,"type":"assista')  # a crash mid-write
    out = keel("resume", path.stem, "--max-turns", "5", "--force", cwd=project)
    assert out.returncode == 0, out.stderr
    assert "keel: cut 30 bytes of a torn last record (a crash mid-write)" in out.stderr
    assert out.stdout == "Finished.\n"
    assert (project / "log").read_text(encoding="utf-8") == "ran\n"
    recs = read_records(path, allow_torn_tail=False).records
    assert [r.seq for r in recs] == list(range(1, len(recs) + 1))
