"""Plan mode runs the bash lines keel can prove read-only (its safe list) and refuses the rest with
the reason: through the gate, and end to end with `keel -p --mode plan` and a scripted model."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from keel.llm.messages import ToolUse
from keel.permissions.gate import Allow, Deny, PermissionGate
from keel.permissions.rules import parse_rule
from keel.session.journal import read_records
from keel.session.records import AssistantRecord, ToolResultRecord
from tests.test_cli import keel, session_files, write_script


def refusal(command: str) -> str:
    return (
        f"`{command}` is refused in plan mode: keel cannot tell that it only reads, so it may "
        "change something. Only commands keel knows to be read-only run until the plan is "
        "approved (ls, cat, grep, wc, git status/diff/log/show and pipes between them, without "
        "redirects to files); call exit_plan_mode with the plan"
    )


def bash(command: str) -> ToolUse:
    return ToolUse("b1", "bash", {"command": command})


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("git log", Allow("mode:plan safe-list")),
        ("ls", Allow("mode:plan safe-list")),
        ("git log --oneline | head -5", Allow("mode:plan safe-list")),
        ("rm x", Deny(refusal("rm x"), "mode:plan")),
        ("echo x > f", Deny(refusal("echo x > f"), "mode:plan")),
    ],
)
async def test_plan_mode_runs_read_only_bash_and_refuses_the_rest(
    project: Path, command: str, expected: Allow | Deny
) -> None:
    gate = PermissionGate("plan", project, project)
    assert await gate.authorize(bash(command), read_only=False) == expected


async def test_in_plan_mode_deny_rules_come_first_and_allow_rules_or_the_sandbox_do_not_widen(
    project: Path,
) -> None:
    rules = [parse_rule("bash(git log*)", "deny", "test"), parse_rule("bash(rm *)", "allow", "t")]
    gate = PermissionGate("plan", project, project, rules, sandboxed=True)
    assert await gate.authorize(bash("git log -3"), read_only=False) == Deny(
        "denied by rule bash(git log*) (test)", "rule"
    )
    assert await gate.authorize(bash("rm x"), read_only=False) == Deny(refusal("rm x"), "mode:plan")
    assert await gate.authorize(bash("ls"), read_only=False) == Allow("mode:plan safe-list")


def test_keel_p_in_plan_mode_runs_git_log_and_ls_and_refuses_writes(
    project: Path, tmp_path: Path, isolated_env: Path
) -> None:
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.org"]
    subprocess.run([*git, "init", "-q"], cwd=project, check=True)
    subprocess.run([*git, "add", "app.py"], cwd=project, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "first commit"], cwd=project, check=True)
    (project / "x").write_text("keep me\n", encoding="utf-8")
    commands = ["git log --format=%s", "ls", "rm x", "echo x > f"]
    turns: list[dict[str, object]] = [
        {"tool_calls": [{"name": "bash", "input": {"command": c}}]} for c in commands
    ]
    script = write_script(tmp_path / "plan.json", [*turns, {"text": "Planned."}])
    out = keel("-p", "look around", "--model", f"scripted:{script}", "--mode", "plan", cwd=project)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "Planned.\n"
    assert results_by_command(isolated_env) == {
        "git log --format=%s": ("first commit\n[exit code 0]", False),
        "ls": ("README.md\napp.py\nutil.py\nx\n[exit code 0]", False),
        "rm x": (refusal("rm x"), True),
        "echo x > f": (refusal("echo x > f"), True),
    }
    assert (project / "x").read_text(encoding="utf-8") == "keep me\n"
    assert not (project / "f").exists()


def results_by_command(home: Path) -> dict[str, tuple[str, bool]]:
    """(text, is_error) of each bash call of the only session, by its command."""
    [path] = session_files(home)
    commands: dict[str, str] = {}
    results: dict[str, tuple[str, bool]] = {}
    for record in read_records(path).records:
        payload = record.payload
        if isinstance(payload, AssistantRecord):
            commands.update(
                (c.id, str((c.input or {})["command"])) for c in payload.message.tool_uses
            )
        elif isinstance(payload, ToolResultRecord):
            result = payload.result
            results[commands[result.tool_use_id]] = (result.text, result.is_error)
    return results
