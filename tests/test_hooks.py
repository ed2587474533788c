"""Claude Code–format hooks as real scripts (bash and python): every event and outcome, plus the
ones that hang, print garbage and exit 2. The loop stays usable and the user sees why."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from keel.agent.events import Event
from keel.agent.loop import Agent
from keel.hooks import claude
from keel.hooks.config import HookConfig, load_hooks
from keel.hooks.runner import HookRunner
from keel.llm.events import Notice
from keel.llm.messages import Message, Text, ToolUse, Usage, tool_result
from keel.llm.providers.scripted import ScriptedProvider
from keel.llm.script import Reply
from keel.permissions.gate import PermissionGate
from keel.session.store import SessionLog
from keel.tools.builtin import builtin_tools
from tests.test_cli import keel, write_script


def say(text: str) -> Reply:
    return Reply(Message("assistant", (Text(text),)), Usage(10, 5))


def calls(*uses: ToolUse) -> Reply:
    return Reply(Message("assistant", uses), Usage(10, 5))


def write_hooks(
    project: Path, hooks: dict[str, Any], name: str = ".keel/settings.local.json"
) -> None:
    path = project / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"hooks": hooks}), encoding="utf-8")


def hook(command: str, matcher: str = "", timeout: float | None = None) -> list[dict[str, Any]]:
    entry: dict[str, Any] = {"type": "command", "command": command}
    if timeout is not None:
        entry["timeout"] = timeout
    return [{"matcher": matcher, "hooks": [entry]}]


def script(project: Path, name: str, body: str) -> str:
    path = project / "hooks" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(body, encoding="utf-8")
    path.chmod(0o755)
    return str(path)


def agent_with(
    project: Path, steps: list[Any], *, mode: str = "default", session: SessionLog | None = None
) -> tuple[Agent, ScriptedProvider]:
    config = load_hooks(project, keel_user_dir=project / "no-user-config", home=project / "no-home")
    assert config.warnings == []
    gate = PermissionGate(mode, project, project)  # type: ignore[arg-type]
    provider = ScriptedProvider(steps)
    agent = Agent(
        provider=provider,
        model="scripted",
        tools=builtin_tools(),
        cwd=project,
        system="s",
        gate=gate,
        session=session,
    )
    agent.hooks = HookRunner(
        config.hooks, project, project, dict(os.environ), mode=lambda: gate.mode
    )
    return agent, provider


def notices(events: list[Event]) -> list[str]:
    return [e.text for e in events if isinstance(e, Notice)]


# -- configuration -----------------------------------------------------------------------------


def test_matchers_are_case_insensitive_and_anchored(project: Path) -> None:
    write_hooks(
        project,
        {
            "PreToolUse": hook("true", "Bash")
            + hook("true", "ba")
            + hook("true", "edit|write")
            + hook("true", "*")
            + hook("true", "[unclosed")
        },
    )
    config = load_hooks(project, keel_user_dir=project / "u", home=project / "h")
    matches = [[h.matches(tool) for h in config.hooks] for tool in ("bash", "write", "[unclosed")]
    assert matches == [
        [True, False, False, True, False],
        [False, False, True, True, False],
        [False, False, False, True, True],  # an invalid regex falls back to an exact compare
    ]


def test_bad_entries_are_skipped_with_the_file_named(project: Path) -> None:
    path = project / ".claude" / "settings.json"
    path.parent.mkdir()
    path.write_text(
        json.dumps(
            {
                "hooks": {
                    "BeforeEverything": hook("true"),
                    "PreToolUse": [
                        {
                            "matcher": "bash",
                            "hooks": [
                                {"type": "agent", "prompt": "x"},
                                {"type": "command"},
                                {"type": "command", "command": "true", "timeout": -1},
                            ],
                        }
                    ],
                }
            }
        ),
        encoding="utf-8",
    )
    config = load_hooks(project, keel_user_dir=project / "u", home=project / "h")
    assert config.warnings == [
        f"{path}: unknown hook event 'BeforeEverything' skipped: not a Claude Code event (keel "
        "runs: SessionStart, UserPromptSubmit, UserPromptExpansion, PreToolUse, "
        "PermissionRequest, PermissionDenied, "
        "PostToolUse, PostToolUseFailure, PostToolBatch, Notification, SubagentStart, "
        "SubagentStop, Stop, StopFailure, PreCompact, PostCompact, InstructionsLoaded, Elicitation, "
        "ElicitationResult, SessionEnd)",
        f"{path}: hooks.PreToolUse[0].hooks[0]: hook type 'agent' is a Claude Code hook type keel "
        "does not run (keel runs: command, http, prompt); skipped",
        f"{path}: hooks.PreToolUse[0].hooks[1] needs a command; skipped",
        f"{path}: hooks.PreToolUse[0].hooks[2]: timeout must be 1-86400 seconds; using 60",
    ]
    assert [(h.command, h.timeout, h.source) for h in config.hooks] == [("true", 60.0, "shared")]
    (project / ".keel").mkdir()
    (project / ".keel" / "settings.local.json").write_text("{ oops", encoding="utf-8")
    broken = load_hooks(project, keel_user_dir=project / "u", home=project / "h")
    assert broken.warnings[-1].startswith(
        f"{project / '.keel' / 'settings.local.json'}:1:3: invalid JSON"
    )


def test_shared_hooks_need_an_approval_pinned_to_their_config(project: Path) -> None:
    user, home = project.parent / "u", project.parent / "h"
    write_hooks(project, {"Stop": hook("echo shared")}, ".claude/settings.json")
    write_hooks(home, {"Stop": hook("echo mine")}, ".claude/settings.json")
    config = load_hooks(project, keel_user_dir=user, home=home)
    pin = config.shared_hash()
    assert [h.command for h in config.runnable(set())] == ["echo mine"]
    assert [h.command for h in config.runnable({pin})] == ["echo mine", "echo shared"]
    write_hooks(project, {"Stop": hook("echo shared, changed")}, ".claude/settings.json")
    changed = load_hooks(project, keel_user_dir=user, home=home)
    assert changed.shared_hash() != pin
    assert [h.command for h in changed.runnable({pin})] == ["echo mine"]
    assert HookConfig().shared_hash() == ""


@pytest.mark.parametrize(
    "name",
    [
        ".keel/settings.local.json",
        ".claude/settings.local.json",
        "sub/.keel/settings.json",
        "sub/.claude/settings.local.json",
        "sub/deeper/.keel/settings.local.json",
    ],
)
def test_every_project_file_holds_shared_hooks_at_any_depth(project: Path, name: str) -> None:
    """A "personal" name or a subdirectory does not make a project file the user's: its hooks
    are shared (they wait for approval) when keel starts at or below its directory."""
    user, home = project.parent / "u", project.parent / "h"
    write_hooks(project, {"Stop": hook("echo planted")}, name)
    cwd = project / name.rpartition("/.")[0] if name.count("/") > 1 else project
    cwd.mkdir(parents=True, exist_ok=True)
    config = load_hooks(cwd, keel_user_dir=user, home=home)
    assert [(h.command, h.source) for h in config.hooks] == [("echo planted", "shared")]
    assert config.runnable(set()) == []


# -- tool hooks ------------------------------------------------------------------------------------


async def test_pre_tool_use_payload_environment_and_deny_by_exit_2(
    project: Path, tmp_path: Path
) -> None:
    seen = tmp_path / "payload.json"
    deny = script(
        project,
        "deny.sh",
        f'#!/bin/bash\ncat > {seen}\necho "$CLAUDE_PROJECT_DIR|$KEEL_PROJECT_DIR" > {seen}.env\n'
        "echo 'no rm in this repo' >&2\nexit 2\n",
    )
    write_hooks(project, {"PreToolUse": hook(deny, "bash")})
    session = SessionLog.create(cwd=project, model="scripted", directory=tmp_path / "s")
    agent, _ = agent_with(
        project,
        [calls(ToolUse("t1", "bash", {"command": "rm -rf build"})), say("ok")],
        session=session,
    )
    await agent.run("clean up")
    session.close()
    assert agent.messages[2].tool_results[0] == tool_result(
        "t1", "denied by a PreToolUse hook: no rm in this repo", is_error=True
    )
    payload = json.loads(seen.read_text(encoding="utf-8"))
    session_uuid = claude.hook_session_id(agent.session_id)
    assert payload == {
        "session_id": session_uuid,
        "transcript_path": str(session.path.with_suffix(".transcript") / f"{session_uuid}.jsonl"),
        "cwd": str(project),
        "prompt_id": payload["prompt_id"],
        "hook_event_name": "PreToolUse",
        "permission_mode": "default",
        "tool_name": "Bash",
        "tool_input": {"command": "rm -rf build"},
        "tool_use_id": "t1",
    }
    assert (tmp_path / "payload.json.env").read_text(encoding="utf-8") == f"{project}|{project}\n"


async def test_pre_tool_use_json_allow_ask_and_rewrite(project: Path) -> None:
    allow = script(
        project,
        "allow.py",
        "#!" + sys.executable + "\nimport json, sys\n"
        "p = json.load(sys.stdin)\n"
        "out = {'hookSpecificOutput': {'permissionDecision': 'allow', 'permissionDecisionReason': 'trusted'}}\n"
        "if p['tool_name'] == 'Bash':\n"
        "    out['hookSpecificOutput']['updatedInput'] = {'command': 'echo rewritten'}\n"
        "print(json.dumps(out))\n",
    )
    ask = script(
        project,
        "ask.sh",
        '#!/bin/bash\necho \'{"hookSpecificOutput": {"permissionDecision": "ask"}}\'\n',
    )
    write_hooks(project, {"PreToolUse": hook(allow, "edit|bash") + hook(ask, "write")})
    agent, _ = agent_with(
        project,
        [
            calls(ToolUse("t1", "read", {"path": "util.py"})),
            calls(
                ToolUse(
                    "t2", "edit", {"path": "util.py", "old_string": "X = 1", "new_string": "X = 2"}
                ),
                ToolUse("t3", "bash", {"command": "echo original"}),
                ToolUse("t4", "write", {"path": "new.py", "content": "x"}),
            ),
            say("ok"),
        ],
    )
    await agent.run("go")
    results = agent.messages[4].tool_results
    assert results[0] == tool_result(
        "t2", "Edited util.py: 1 replacement."
    )  # a hook allow skips the prompt
    assert results[1].text == "rewritten\n[exit code 0]"
    assert results[2].is_error
    assert results[2].text.startswith("permission needed, but keel is running non-interactively")


async def test_hooks_written_for_claude_code_see_its_tool_names_and_fields(
    project: Path, tmp_path: Path
) -> None:
    """`Edit|MultiEdit|Write` matches keel's multi_edit; `tool_input.file_path` is there; a
    rewritten `file_path` moves the edit."""
    log = tmp_path / "seen.log"
    redirect = script(
        project,
        "redirect.py",
        "#!" + sys.executable + "\nimport json, sys\n"
        "p = json.load(sys.stdin)\n"
        f"open({str(log)!r}, 'a').write(p['tool_name'] + ' ' + p['tool_input']['file_path'] + '\\n')\n"
        "inp = dict(p['tool_input'], file_path='other.py')\n"
        "print(json.dumps({'hookSpecificOutput': {'permissionDecision': 'allow', 'updatedInput': inp}}))\n",
    )
    write_hooks(project, {"PreToolUse": hook(redirect, "Edit|MultiEdit|Write")})
    (project / "other.py").write_text("Y = 1\n", encoding="utf-8")
    edits = [{"old_string": "Y = 1", "new_string": "Y = 2"}]
    agent, _ = agent_with(
        project,
        [
            calls(ToolUse("t0", "read", {"path": "other.py"})),
            calls(ToolUse("t1", "multi_edit", {"path": "util.py", "edits": edits})),
            say("ok"),
        ],
    )
    await agent.run("go")
    assert log.read_text(encoding="utf-8") == f"MultiEdit {project / 'util.py'}\n"
    assert agent.messages[4].tool_results[0] == tool_result(
        "t1", "Edited other.py: 1 edit, 1 replacement."
    )
    assert (project / "other.py").read_text(encoding="utf-8") == "Y = 2\n"
    assert (project / "util.py").read_text(encoding="utf-8") == "X = 1\n"


async def test_hook_deny_beats_bypass_but_a_rule_deny_beats_a_hook_allow(project: Path) -> None:
    allow = script(project, "allow.sh", '#!/bin/bash\necho \'{"decision": "approve"}\'\n')
    write_hooks(project, {"PreToolUse": hook(allow)})
    agent, _ = agent_with(
        project, [calls(ToolUse("t1", "bash", {"command": "git push"})), say("ok")]
    )
    from keel.permissions.rules import parse_rule

    assert isinstance(agent.gate, PermissionGate)
    agent.gate.rules.append(parse_rule("bash(git push *)", "deny", "test"))
    await agent.run("go")
    assert agent.messages[2].tool_results[0].text == "denied by rule bash(git push *) (test)"


async def test_post_tool_use_feedback_context_and_halt(project: Path) -> None:
    post = script(
        project,
        "post.py",
        "#!" + sys.executable + "\nimport json, sys\n"
        "p = json.load(sys.stdin)\n"
        "assert p['tool_response'] == {'type': 'text', 'file': {'filePath': "
        + repr(str(project / "util.py"))
        + ", 'content': 'X = 1\\n', 'numLines': 2, 'startLine': 1, 'totalLines': 2}}, p\n"
        "print(json.dumps({'decision': 'block', 'reason': 'lint failed: E501',"
        " 'continue': False, 'stopReason': 'fix lint first',"
        " 'hookSpecificOutput': {'additionalContext': 'ruff is the linter'}}))\n",
    )
    write_hooks(project, {"PostToolUse": hook(post, "read")})
    agent, provider = agent_with(
        project, [calls(ToolUse("t1", "read", {"path": "util.py"})), say("never")]
    )
    events: list[Event] = []
    result = await agent.run("go", events.append)
    assert result.stop_reason == "hook_stopped"
    assert agent.messages[2].tool_results[0].content == (
        Text("     1\tX = 1"),
        Text('<hook-feedback source="PostToolUse">\nlint failed: E501\n</hook-feedback>'),
        Text('<hook-context source="PostToolUse">\nruff is the linter\n</hook-context>'),
    )
    assert "stopped by a hook: fix lint first" in notices(events)
    assert len(provider.requests) == 1


# -- prompt hooks ------------------------------------------------------------------------------


async def test_session_start_and_prompt_context(project: Path) -> None:
    start = script(
        project,
        "start.sh",
        '#!/bin/bash\nread -r line\necho "branch: main ($(echo "$line" | python3 -c \'import json,sys; print(json.load(sys.stdin)["source"])\'))"\n',
    )
    prompt = script(
        project,
        "prompt.sh",
        '#!/bin/bash\necho \'{"hookSpecificOutput": {"additionalContext": "today is a holiday"}}\'\n',
    )
    write_hooks(project, {"SessionStart": hook(start, "startup"), "UserPromptSubmit": hook(prompt)})
    agent, provider = agent_with(project, [say("one"), say("two")])
    await agent.run("hello")
    await agent.run("again")
    first = provider.requests[0].messages[0].text
    assert first == (
        '<system-note>\n<hook-context source="SessionStart">\nbranch: main (startup)\n</hook-context>\n'
        '<hook-context source="UserPromptSubmit">\ntoday is a holiday\n</hook-context>\n</system-note>\n\nhello'
    )
    second = provider.requests[1].messages[-1].text
    assert "SessionStart" not in second  # once per fresh context
    assert "today is a holiday" in second


async def test_user_prompt_submit_block_and_halt(project: Path, tmp_path: Path) -> None:
    block = script(project, "block.sh", "#!/bin/bash\necho 'no secrets in prompts' >&2\nexit 2\n")
    write_hooks(project, {"UserPromptSubmit": hook(block)})
    session = SessionLog.create(cwd=project, model="scripted", directory=tmp_path / "s")
    agent, provider = agent_with(project, [say("never")], session=session)
    events: list[Event] = []
    result = await agent.run("my password is hunter2", events.append)
    session.close()
    assert result.stop_reason == "blocked"
    assert provider.requests == []
    assert agent.messages == []  # the prompt never entered the transcript
    assert "prompt blocked by a UserPromptSubmit hook: no secrets in prompts" in notices(events)
    halt = script(
        project,
        "halt.sh",
        '#!/bin/bash\necho \'{"continue": false, "stopReason": "maintenance"}\'\n',
    )
    write_hooks(project, {"UserPromptSubmit": hook(halt)})
    agent, _ = agent_with(project, [say("never")])
    assert (await agent.run("hi")).stop_reason == "hook_stopped"


async def test_stop_hook_sends_the_model_back_at_most_five_times(
    project: Path, tmp_path: Path
) -> None:
    log = tmp_path / "stop.log"
    stop = script(
        project,
        "stop.py",
        "#!" + sys.executable + "\nimport json, sys\n"
        f"p = json.load(sys.stdin)\nopen({str(log)!r}, 'a').write(str(p['stop_hook_active']) + '\\n')\n"
        "print(json.dumps({'decision': 'block', 'reason': 'run the tests first'}))\n",
    )
    write_hooks(project, {"Stop": hook(stop)})
    agent, provider = agent_with(project, [say(f"done {i}") for i in range(6)])
    result = await agent.run("go")
    assert result.stop_reason == "end_turn"
    assert result.text == "done 5"
    assert len(provider.requests) == 6
    assert log.read_text(encoding="utf-8").split() == [
        "False",
        "True",
        "True",
        "True",
        "True",
        "True",
    ]
    assert provider.requests[1].messages[-1] == Message(
        "user", (Text('<hook-feedback source="Stop">\nrun the tests first\n</hook-feedback>'),)
    )


async def test_pre_compact_and_session_end(project: Path, tmp_path: Path) -> None:
    log = tmp_path / "events.log"
    record = script(
        project,
        "record.sh",
        f"#!/bin/bash\npython3 -c 'import json,sys; p=json.load(sys.stdin); "
        f'print(p["hook_event_name"], p.get("trigger", p.get("reason")))\' >> {log}\n',
    )
    write_hooks(project, {"PreCompact": hook(record), "SessionEnd": hook(record)})
    agent, _ = agent_with(project, [say("a"), say("<summary>s</summary>")])
    await agent.run("go")
    await agent.compact()
    await agent.aclose()
    assert log.read_text(encoding="utf-8").splitlines() == ["PreCompact manual", "SessionEnd other"]


async def test_notification_fires_before_the_user_is_asked(project: Path, tmp_path: Path) -> None:
    import io

    from keel.app.assembly import build_hooks
    from keel.cli.headless import Printer
    from keel.permissions.gate import PermissionReply, PermissionRequest

    log = tmp_path / "notify.json"
    user_config = Path(os.environ["KEEL_CONFIG_DIR"])  # the user's own hooks run unapproved
    write_hooks(
        user_config,
        {"Notification": hook(f"cat > {log}", matcher="permission_prompt")},
        "settings.json",
    )
    gate = PermissionGate("default", project, project)
    asked: list[str] = []

    async def asker(request: PermissionRequest) -> PermissionReply:
        asked.append(request.reason)
        for _ in range(500):  # the hook is not awaited: the question goes out at once
            if log.exists() and log.read_text(encoding="utf-8").endswith("}"):
                break
            await asyncio.sleep(0.01)
        return PermissionReply(allow=True)

    gate.asker = asker
    runner = build_hooks(
        project, gate, Printer("text", quiet=True, out=io.StringIO(), err=io.StringIO())
    )
    assert runner is not None
    decision = await gate.authorize(
        ToolUse("t1", "bash", {"command": "rm -rf build"}), read_only=False
    )
    assert decision.source == "user:once"
    payload = json.loads(log.read_text(encoding="utf-8"))
    assert payload["hook_event_name"] == "Notification"
    assert payload["notification_type"] == "permission_prompt"
    assert payload["message"] == f"keel needs your permission to {asked[0]}"
    assert asked[0].startswith("run a command")


# -- hooks that misbehave ------------------------------------------------------------------------


async def test_a_hanging_hook_is_killed_garbage_is_ignored_and_failures_are_shown(
    project: Path,
) -> None:
    hang = script(project, "hang.sh", "#!/bin/bash\nsleep 60 &\nsleep 60\n")
    garbage = script(
        project,
        "garbage.sh",
        "#!/bin/bash\necho '{not json at all'\nhead -c 200000 /dev/zero | tr '\\0' x\n",
    )
    broken = script(project, "broken.sh", "#!/bin/bash\necho 'config missing' >&2\nexit 1\n")
    write_hooks(project, {"PreToolUse": hook(hang, timeout=1) + hook(garbage) + hook(broken)})
    agent, _ = agent_with(project, [calls(ToolUse("t1", "glob", {"pattern": "*.md"})), say("ok")])
    events: list[Event] = []
    start = time.monotonic()
    result = await agent.run("go", events.append)
    assert time.monotonic() - start < 30  # not the hook's 60 s
    assert result.stop_reason == "end_turn"
    assert agent.messages[2].tool_results[0] == tool_result("t1", "README.md")  # the call still ran
    went_ahead = " (it could not block; the call goes on to the permission check)"
    assert notices(events) == [
        f"PreToolUse hook `{hang}` timed out after 1 s and was killed{went_ahead}",
        f"PreToolUse hook `{garbage}` printed output that is not valid JSON ({{not json at all "
        + "x" * 63
        + f"…); a decision in it was not applied{went_ahead}",
        f"PreToolUse hook `{broken}` exited with 1: config missing{went_ahead}",
    ]


async def test_matching_hooks_run_in_parallel(project: Path) -> None:
    log = project / "hooks.log"
    slow = script(
        project, "slow.sh", f"#!/bin/bash\necho start >> {log}\nsleep 1\necho end >> {log}\n"
    )
    write_hooks(project, {"PreToolUse": hook(slow) + hook(slow) + hook(slow)})
    agent, _ = agent_with(project, [calls(ToolUse("t1", "glob", {"pattern": "*.md"})), say("ok")])
    await agent.run("go")
    # All three started before any finished (one after another would interleave).
    assert log.read_text(encoding="utf-8").split() == ["start"] * 3 + ["end"] * 3


# -- trust, through the CLI ----------------------------------------------------------------------


def test_project_hooks_run_only_after_approval(project: Path, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    write_hooks(project, {"UserPromptSubmit": hook(f"touch {marker}")}, ".claude/settings.json")
    model = write_script(tmp_path / "s.json", [{"text": "ok"}])
    out = keel("-p", "hi", "--model", f"scripted:{model}", cwd=project)
    assert out.returncode == 0, out.stderr
    assert (
        "keel: warning: 1 project hook(s) are not approved and will not run; review them with "
        "`keel hooks list`, then `keel hooks approve`" in out.stderr
    )
    assert not marker.exists()
    listing = keel("hooks", "list", cwd=project)
    assert listing.stdout.splitlines()[0] == (
        f"UserPromptSubmit: touch {marker}  ({project / '.claude' / 'settings.json'}, needs approval, timeout 60 s)"
    )
    approved = keel("hooks", "approve", cwd=project)
    assert approved.stdout.startswith("approved the project's hooks (pin ")
    out = keel("-p", "hi", "--model", f"scripted:{model}", cwd=project)
    assert "not approved" not in out.stderr
    assert marker.exists()
    # Editing the shared hook takes it back out until it is approved again.
    marker.unlink()
    write_hooks(project, {"UserPromptSubmit": hook(f"touch {marker} ")}, ".claude/settings.json")
    out = keel("-p", "hi", "--model", f"scripted:{model}", cwd=project)
    assert "are not approved" in out.stderr
    assert not marker.exists()


@pytest.mark.parametrize("event", ["SessionStart", "UserPromptSubmit"])
async def test_prompt_hooks_skip_subagents_and_self_started_turns(
    project: Path, tmp_path: Path, event: str
) -> None:
    marker = tmp_path / "ran"
    write_hooks(project, {event: hook(f"touch {marker}")})
    agent, _ = agent_with(project, [say("a"), say("b")])
    agent.is_subagent = True
    await agent.run("go")
    agent.is_subagent, agent.self_started = False, True
    await agent.run("background result arrived")
    assert not marker.exists()
