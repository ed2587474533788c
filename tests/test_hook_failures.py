"""What a guard hook's failure is said to mean matches what keel then does, for each event that
says it: a crashing PermissionRequest hook decides nothing (the question goes to the user, or
a headless run refuses the call), a crashing UserPromptSubmit hook lets the prompt through, a
crashing Stop hook lets the turn end. Real hook scripts that crash, run by `keel -p`."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from keel.app.assembly import permission_hook
from keel.hooks.config import HookCommand
from keel.hooks.runner import HookRunner
from keel.llm.events import Notice
from keel.llm.messages import ToolUse
from keel.permissions.gate import PermissionRequest
from tests.test_claude_hooks import entry, guard, run, settings

CRASH = f"#!{sys.executable}\nimport sys\nsys.stdin.read()\nraise SystemExit('no config here')\n"


@pytest.fixture
def home(isolated_env: Path) -> Path:
    return Path(os.environ["HOME"])


def test_a_crashing_permission_request_hook_leaves_a_headless_call_refused(
    project: Path, home: Path, tmp_path: Path
) -> None:
    crash = guard(tmp_path, "crash.py", CRASH)
    settings(home / ".claude" / "settings.json", {"PermissionRequest": entry(str(crash))})
    results, said = run(
        project, tmp_path, {"name": "write", "input": {"path": "new.txt", "content": "x"}}
    )
    assert not (project / "new.txt").exists()
    assert results == [
        "permission needed, but keel is running non-interactively; allow it with "
        "--allowed-tools or --mode (needed to change new.txt)"
    ]
    assert (
        f"PermissionRequest hook `{crash}` exited with 1: no config here (it made no decision; "
        "with nobody to answer the question, the call is refused)"
    ) in said.splitlines()
    assert "went ahead" not in said


@pytest.mark.asyncio
async def test_a_crashing_permission_request_hook_leaves_the_question_to_the_user(
    tmp_path: Path,
) -> None:
    crash = guard(tmp_path, "crash.py", CRASH)
    hook = HookCommand("PermissionRequest", "*", str(crash), 10, "personal", "settings.json")
    runner = HookRunner([hook], tmp_path, tmp_path, dict(os.environ))
    notices: list[str] = []

    def notice(event: object) -> None:
        assert isinstance(event, Notice)
        notices.append(event.text)

    decide = permission_hook(runner, tmp_path, notice, answered=lambda: True)
    call = ToolUse("t1", "write", {"path": "a.txt", "content": "x"})
    assert await decide(PermissionRequest(call, "write a.txt", "write")) is None  # no answer
    assert notices == [
        f"PermissionRequest hook `{crash}` exited with 1: no config here (it made no decision; "
        "the question goes to you)"
    ]


def test_a_crashing_prompt_hook_lets_the_prompt_through(
    project: Path, home: Path, tmp_path: Path
) -> None:
    crash = guard(tmp_path, "crash.py", CRASH)
    settings(home / ".claude" / "settings.json", {"UserPromptSubmit": entry(str(crash))})
    results, said = run(project, tmp_path)
    assert results == []
    assert (
        f"UserPromptSubmit hook `{crash}` exited with 1: no config here (it could not block; "
        "the prompt goes to the model)"
    ) in said.splitlines()


def test_a_crashing_stop_hook_lets_the_turn_end(project: Path, home: Path, tmp_path: Path) -> None:
    crash = guard(tmp_path, "crash.py", CRASH)
    settings(home / ".claude" / "settings.json", {"Stop": entry(str(crash))})
    results, said = run(project, tmp_path)
    assert (
        f"Stop hook `{crash}` exited with 1: no config here (it could not keep the turn going; "
        "the turn ends)"
    ) in said.splitlines()
    assert results == []
