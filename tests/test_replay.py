"""`keel replay`: a session recorded from a scripted run (a read, an edit, a bash command that
writes a file) replays identical with tools run for real in a scratch copy and with recorded
results; a changed AGENTS.md, a new skill (a new tool and a new system section), a changed
setting and a changed workspace are each reported at the request they change, with the diff;
the original workspace is never touched; exit codes and the `--json` shape."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from keel.llm.script import reply
from keel.testing.anthropic_server import AnthropicServer

SCRIPT = """\
model: demo
turns:
  - text: Reading it.
    tool_calls:
      - name: read
        input: {path: calc.py}
  - text: Fixing it.
    tool_calls:
      - name: edit
        input: {path: calc.py, old_string: "a - b", new_string: "a + b"}
  - text: Checking.
    tool_calls:
      - name: bash
        input: {command: "cat calc.py && echo made > out.txt && ls", description: check}
  - text: Fixed the sign in add.
"""

GIT = ["git", "-c", "user.email=t@example.com", "-c", "user.name=t"]


def keel(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "keel", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def make_project(root: Path, *, git: bool = True) -> Path:
    root.mkdir()
    (root / "calc.py").write_text("def add(a, b):\n    return a - b\n", encoding="utf-8")
    (root / "AGENTS.md").write_text("# Rules\nBe brief.\n", encoding="utf-8")
    if git:
        subprocess.run(["git", "init", "-q"], cwd=root, check=True)
        subprocess.run([*GIT, "add", "-A"], cwd=root, check=True)
        subprocess.run([*GIT, "commit", "-qm", "start"], cwd=root, check=True)
    return root


def record(project: Path, tmp_path: Path, script: str = SCRIPT, mode: str = "accept-edits") -> str:
    path = tmp_path / "script.yaml"
    path.write_text(script, encoding="utf-8")
    run = keel(
        "-p", "fix add", "--model", f"scripted:{path}", "--mode", mode,
        "--output-format", "json", cwd=project,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout.splitlines()[-1])
    assert result["stop_reason"] == "end_turn"
    session: str = result["session_id"]
    return session


def replay(session: str, project: Path, *flags: str) -> tuple[int, dict[str, Any], str]:
    run = keel("replay", session, "--json", *flags, cwd=project)
    assert run.returncode in (0, 1), run.stderr
    return run.returncode, json.loads(run.stdout), run.stderr


def snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under root (.git left out) with its bytes and mtime."""
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and ".git" not in path.relative_to(root).parts:
            out[str(path.relative_to(root))] = (path.read_bytes(), path.stat().st_mtime_ns)
    return out


@pytest.fixture
def recorded(tmp_path: Path) -> tuple[Path, str]:
    project = make_project(tmp_path / "project")
    session = record(project, tmp_path)
    assert (project / "calc.py").read_text(encoding="utf-8").endswith("a + b\n")
    assert (project / "out.txt").read_text(encoding="utf-8") == "made\n"
    return project, session


def identical_report(session: str, tools: str, why: str, digest: str) -> dict[str, Any]:
    return {
        "session": session,
        "path": "",
        "result": "identical",
        "requests_recorded": 4,
        "requests_replayed": 4,
        "until": None,
        "tools": tools,
        "tools_why": why,
        "settings": [],
        "journal_hash": digest,
        "replay_journal_hash": digest,
        "divergence": None,
        "notes": [],
    }


@pytest.mark.needs("git", "sandbox")
def test_a_session_with_edits_and_bash_replays_identical_running_its_tools(
    recorded: tuple[Path, str],
) -> None:
    project, session = recorded
    before = snapshot(project)
    code, report, _ = replay(session, project)
    assert code == 0
    report["path"] = ""
    assert report == identical_report(
        session,
        "run-tools",
        "starting state rebuilt from the checkpoints (2 file(s) put back)",
        report["journal_hash"],
    )
    assert len(report["journal_hash"]) == 64
    # The edit and the bash command ran in the scratch copy: the project is as it was.
    assert snapshot(project) == before


@pytest.mark.needs("git", "sandbox")
def test_recorded_results_replay_identical_without_running_anything(
    recorded: tuple[Path, str],
) -> None:
    project, session = recorded
    (project / "out.txt").unlink()  # a tool that ran would write it again (in the copy)
    code, report, _ = replay(
        session, project, "--recorded-results", "--keep", str(project.parent / "kept")
    )
    assert code == 0
    report["path"] = ""
    assert report == identical_report(
        session, "recorded-results", "asked for (--recorded-results)", report["journal_hash"]
    )
    kept = project.parent / "kept" / "workspace"
    assert not (kept / "out.txt").exists()  # bash did not run
    assert (kept / "calc.py").read_text(encoding="utf-8").endswith("a - b\n")  # nor the edit


@pytest.mark.needs("sandbox")
def test_without_git_a_session_that_ran_bash_falls_back_to_recorded_results(
    tmp_path: Path,
) -> None:
    project = make_project(tmp_path / "project", git=False)
    session = record(project, tmp_path)
    code, report, _ = replay(session, project)
    assert code == 0
    assert report["tools"] == "recorded-results"
    assert report["tools_why"] == (
        "the starting state cannot be rebuilt (bash changes are not checkpointed outside a "
        "git repository)"
    )


@pytest.mark.needs("git", "sandbox")
def test_a_changed_agents_md_is_reported_at_the_first_request_with_its_diff(
    recorded: tuple[Path, str],
) -> None:
    project, session = recorded
    (project / "AGENTS.md").write_text("# Rules\nBe thorough.\n", encoding="utf-8")
    code, report, _ = replay(session, project)
    assert code == 1
    d = report["divergence"]
    source = f'instructions source="{project / "AGENTS.md"}"'
    assert (d["request"], d["what"], d["parts"], d["changed"]) == (
        1,
        "context",
        ["context"],
        [source],
    )
    assert d["summary"] == f"request 1: the context differs in {source}"
    assert [line for line in d["diff"].splitlines() if line[:1] in "+-"] == [
        f"--- recorded context: {source}",
        f"+++ now: {source}",
        "-Be brief.",
        "+Be thorough.",
    ]


@pytest.mark.needs("git", "sandbox")
def test_a_new_skill_is_reported_as_a_new_tool_and_a_new_system_section(
    recorded: tuple[Path, str],
) -> None:
    project, session = recorded
    skill = project / ".keel" / "skills" / "release"
    skill.mkdir(parents=True)
    (skill / "SKILL.md").write_text(
        "---\nname: release\ndescription: Cut a release.\n---\nTag it.\n", encoding="utf-8"
    )
    code, report, _ = replay(session, project)
    assert code == 1
    d = report["divergence"]
    assert (d["request"], d["what"], d["parts"]) == (1, "tools", ["tools", "context"])
    assert "+skill" in d["changed"]
    assert '+  "name": "skill"' in d["diff"].splitlines()
    assert any(line.startswith("+") and "release" in line for line in d["diff"].splitlines())


@pytest.mark.needs("git", "sandbox")
def test_a_changed_tool_description_is_reported_with_the_tool_s_diff(
    recorded: tuple[Path, str],
) -> None:
    project, session = recorded
    # A new agent definition changes the `task` tool's description (its agent types) in place.
    agents = project / ".keel" / "agents"
    agents.mkdir(parents=True)
    (agents / "tester.md").write_text(
        "---\nname: tester\ndescription: Runs the tests.\n---\nRun them.\n", encoding="utf-8"
    )
    code, report, _ = replay(session, project)
    assert code == 1
    d = report["divergence"]
    assert (d["request"], d["parts"]) == (1, ["tools"]), d
    assert d["changed"] == ["task"], d  # changed in place: neither added nor removed
    lines = d["diff"].splitlines()
    assert any(line.startswith("-") and "Agent types:" in line for line in lines), d["diff"]
    assert any(line.startswith("+") and "tester" in line for line in lines), d["diff"]


@pytest.mark.needs("git", "sandbox")
def test_a_changed_setting_is_reported_where_the_run_stops_differently(
    recorded: tuple[Path, str],
) -> None:
    project, session = recorded
    (project / ".keel").mkdir()
    (project / ".keel" / "settings.json").write_text('{"max_turns": 2}', encoding="utf-8")
    code, report, _ = replay(session, project)
    assert code == 1
    assert report["settings"] == ["max_turns: 200 -> 2"]
    assert report["requests_replayed"] == 2
    assert report["divergence"] == {
        "request": 3,
        "what": "missing_request",
        "summary": "the replay stopped after 2 request(s); the recorded session made 4 "
        "(settings now: max_turns: 200 -> 2)",
        "changed": ["max_turns: 200 -> 2"],
        "diff": "",
        "parts": ["missing_request"],
    }


@pytest.mark.needs("git", "sandbox")
def test_a_changed_workspace_shows_in_the_tool_result_of_the_request_it_reaches(
    recorded: tuple[Path, str],
) -> None:
    project, session = recorded
    (project / "notes.txt").write_text("new\n", encoding="utf-8")  # `ls` now lists it
    code, report, _ = replay(session, project)
    assert code == 1
    d = report["divergence"]
    assert (d["request"], d["what"], d["changed"]) == (4, "messages", ["message 7"])
    assert d["summary"] == "request 4: message 7 of 7 differs"
    changed = [line for line in d["diff"].splitlines() if line[:2] in ("- ", "+ ")]
    assert len(changed) == 2
    assert "notes.txt" not in changed[0]
    assert "notes.txt" in changed[1]
    # --until 3 compares only the requests before the change: identical.
    code, report, _ = replay(session, project, "--until", "3")
    assert (code, report["result"], report["requests_replayed"]) == (0, "identical", 3)


def test_an_unknown_session_is_an_error_of_one_line(tmp_path: Path) -> None:
    run = keel("replay", "nosuchsession", cwd=tmp_path)
    assert run.returncode == 2
    assert run.stderr.splitlines() == [
        "keel: error: no session 'nosuchsession' (hint: `keel sessions list --all` shows every "
        "session)"
    ]
    assert run.stdout == ""
    assert os.environ["KEEL_HOME"]  # isolated


VICTIM_SCRIPT = """\
model: demo
turns:
  - text: Writing.
    tool_calls:
      - name: bash
        input: {command: "D=HEAD; echo pwned > \\"${D}TAIL/victim.txt\\"; echo done", description: w}
  - text: Done.
"""


@pytest.mark.needs("git", "sandbox")
def test_a_replay_never_writes_to_the_original_workspace(tmp_path: Path) -> None:
    # Attack: a recorded command names the project by a path the replay cannot map to its
    # scratch copy (built at run time); run again, it would write to the user's real files.
    project = make_project(tmp_path / "project")
    head, tail = str(project)[:-3], str(project)[-3:]
    script = VICTIM_SCRIPT.replace("HEAD", head).replace("TAIL", tail)
    session = record(project, tmp_path, script)
    victim = project / "victim.txt"
    assert victim.read_text(encoding="utf-8") == "pwned\n"
    victim.unlink()
    code, report, _ = replay(session, project, "--run-tools")
    assert code == 1
    assert report["divergence"]["request"] == 2  # the command's result differs
    assert not victim.exists()
    # bypass would run it unconfined: refused, in one line.
    run = keel("replay", session, "--mode", "bypass", cwd=project)
    assert (run.returncode, run.stdout) == (2, "")
    assert run.stderr.splitlines() == [
        "keel: error: --mode bypass would run every recorded call again without asking (a "
        "push, a deploy, a web request) (hint: replay with --recorded-results, or in a mode "
        "that checks (accept-edits, the default))"
    ]
    # With recorded results nothing runs, so bypass is allowed there.
    code, report, _ = replay(session, project, "--recorded-results", "--mode", "bypass")
    assert (code, report["result"]) == (0, "identical")
    assert not victim.exists()


def anthropic_env(url: str) -> dict[str, str]:
    return {**os.environ, "ANTHROPIC_API_KEY": "sk-ant-test", "ANTHROPIC_BASE_URL": url}


def anthropic_fix_script() -> list[Any]:
    return [
        reply("Reading.", ("read", {"path": "calc.py"})),
        reply(
            "Fixing.", ("edit", {"path": "calc.py", "old_string": "a - b", "new_string": "b + a"})
        ),
        reply("Fixed it."),
    ]


@pytest.mark.needs("git")
def test_a_session_with_a_real_provider_replays_offline_with_no_key(tmp_path: Path) -> None:
    project = make_project(tmp_path / "project")
    with AnthropicServer(anthropic_fix_script(), api_key="sk-ant-test") as server:
        run = subprocess.run(
            [sys.executable, "-m", "keel", "-p", "fix add", "--model", "anthropic/claude-sonnet-4-5",
             "--mode", "accept-edits", "--output-format", "json"],
            cwd=project, capture_output=True, text=True, timeout=60, check=False,
            env=anthropic_env(server.url),
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
        assert len(server.model_requests) == 3
    session = json.loads(run.stdout.splitlines()[-1])["session_id"]
    # The server is gone and there is no key: the journal answers.
    assert "ANTHROPIC_API_KEY" not in os.environ
    code, report, _ = replay(session, project)
    assert (code, report["result"], report["requests_replayed"]) == (0, "identical", 3)
    assert report["tools"] == "run-tools"


@pytest.mark.needs("git", "sandbox")
def test_live_replays_the_prompts_against_another_model_side_by_side(
    recorded: tuple[Path, str],
) -> None:
    project, session = recorded
    before = snapshot(project)
    with AnthropicServer(anthropic_fix_script(), api_key="sk-ant-test") as server:
        run = subprocess.run(
            [sys.executable, "-m", "keel", "replay", session, "--live", "--model",
             "anthropic/claude-sonnet-4-5", "--json"],
            cwd=project, capture_output=True, text=True, timeout=60, check=False,
            env=anthropic_env(server.url),
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
        bodies = [r.json for r in server.model_requests]
    assert len(bodies) == 3
    assert bodies[0]["messages"][0]["content"][1]["text"] == "fix add"  # the recorded prompt
    report = json.loads(run.stdout)
    seconds = {side: report[side].pop("seconds") for side in ("recorded", "live")}
    assert all(s >= 0 for s in seconds.values())
    live_usage = report["live"]["tokens"]
    assert report == {
        "session": session,
        "recorded": {
            "model": report["recorded"]["model"],
            "turns": 4,
            "tokens": {"input": 1600, "output": 240, "cache_read": 0, "cache_write": 0},
            "cost_usd": 0.0,
            "stop": "completed",
            "files_changed": ["calc.py", "out.txt"],
        },
        "live": {
            "model": "anthropic/claude-sonnet-4-5",
            "turns": 3,
            "tokens": live_usage,
            "cost_usd": report["live"]["cost_usd"],
            "stop": "completed",
            "files_changed": ["calc.py"],
        },
        "same_final_workspace": False,
        "final_diff": "--- recorded/calc.py\n+++ live/calc.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n"
        "-    return a + b\n+    return b + a\n--- recorded/out.txt\n+++ live/out.txt\n@@ -1 +0,0 @@\n"
        "-made",
        "start": "starting state rebuilt from the checkpoints (2 file(s) put back)",
        "notes": [],
    }
    assert report["recorded"]["model"].startswith("scripted:")
    assert live_usage["input"] > 0
    assert snapshot(project) == before  # the live run worked in the copy


@pytest.mark.needs("git", "sandbox")
def test_a_change_outside_the_project_is_found_by_hash_at_the_right_request(
    recorded: tuple[Path, str], isolated_env: Path
) -> None:
    project, session = recorded
    code, report, _ = replay(session, project)
    assert code == 0
    user_agents = isolated_env / "config" / "AGENTS.md"  # KEEL_CONFIG_DIR: the user's own
    user_agents.parent.mkdir(parents=True, exist_ok=True)
    user_agents.write_text("Always answer in French.\n", encoding="utf-8")
    code, report, _ = replay(session, project)
    assert code == 1
    d = report["divergence"]
    # The user's own file is in the context, which the journal holds: named, with its diff.
    source = f'instructions source="{user_agents}"'
    assert (d["request"], d["what"], d["changed"]) == (1, "context", [f"+{source}"])
    assert d["summary"] == f"request 1: the context differs in +{source}"
    assert "+Always answer in French." in d["diff"].splitlines()


@pytest.mark.needs("git", "sandbox")
def test_the_packaged_demo_session_replays_identical(tmp_path: Path) -> None:
    project = make_project(tmp_path / "project")
    run = keel(
        "-p", "list the Python files", "--model", "scripted:demo", "--output-format", "json",
        cwd=project,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    session = json.loads(run.stdout.splitlines()[-1])["session_id"]
    for flags in ((), ("--recorded-results",)):
        code, report, _ = replay(session, project, *flags)
        assert (code, report["result"], report["requests_replayed"]) == (0, "identical", 3)
