"""The permission gate (decision order, modes, rules, asking, records), the bubblewrap sandbox with
a real bwrap, and the adversarial cases: each ends in a clear refusal or a bounded result."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from keel.agent.loop import Agent
from keel.errors import UserError
from keel.llm.messages import Message, Text, ToolUse, tool_result
from keel.llm.providers.scripted import ScriptedProvider
from keel.llm.script import Reply
from keel.permissions.gate import (
    Allow,
    Deny,
    Mode,
    PermissionGate,
    PermissionReply,
    PermissionRequest,
    parse_mode,
)
from keel.permissions.rules import Rule, parse_rule
from keel.permissions.sandbox import Sandbox, probe
from keel.session.journal import read_records
from keel.session.records import AssistantRecord, DecisionRecord, ToolResultRecord
from keel.session.store import SessionLog
from keel.tools.base import ToolContext
from keel.tools.builtin import bash, builtin_tools
from tests.test_cli import keel, session_files, write_script

needs_bwrap = pytest.mark.needs("sandbox")


def call(name: str, **args: Any) -> ToolUse:
    return ToolUse(f"id-{name}", name, args)


READ_ONLY = {"read", "grep", "glob", "ls", "todo_write", "exit_plan_mode"}


def gate(project: Path, mode: Mode = "default", rules: list[str] = (), **kw: Any) -> PermissionGate:  # type: ignore[assignment]
    parsed = [
        parse_rule(r.removeprefix("deny:"), "deny" if r.startswith("deny:") else "allow", "test")
        for r in rules
    ]
    return PermissionGate(mode, project, project, parsed, **kw)


async def decide(g: PermissionGate, c: ToolUse) -> Allow | Deny:
    return await g.authorize(c, read_only=c.name in READ_ONLY)


HEADLESS = "permission needed, but keel is running non-interactively; allow it with --allowed-tools or --mode"


# -- the decision order ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "tool_call", "expected"),
    [
        ("default", call("read", path="app.py"), Allow("read-only")),
        (
            "default",
            call("edit", path="app.py", old_string="a", new_string="b"),
            Deny(f"{HEADLESS} (needed to change app.py)", "headless"),
        ),
        (
            "accept-edits",
            call("edit", path="app.py", old_string="a", new_string="b"),
            Allow("mode:accept-edits", notable=True),
        ),
        (
            "accept-edits",
            call("bash", command="make"),
            Deny(f"{HEADLESS} (needed to run a command)", "headless"),
        ),
        ("default", call("bash", command="git status"), Allow("safe-list")),
        ("plan", call("read", path="app.py"), Allow("read-only")),
        ("plan", call("bash", command="git status"), Allow("mode:plan safe-list")),
        (
            "plan",
            call("web_fetch", url="https://example.org"),
            Deny(f"{HEADLESS} (needed to fetch a web page in plan mode)", "headless"),
        ),
        ("bypass", call("bash", command="rm -rf build"), Allow("mode:bypass")),
        ("bypass", call("write", path="new.py", content="x"), Allow("mode:bypass")),
        (
            "plan",
            call("exit_plan_mode", plan="1. do it"),
            Deny(f"{HEADLESS} (needed to approve a plan)", "headless"),
        ),
        (
            "bypass",
            call("exit_plan_mode", plan="1. do it"),
            Deny(f"{HEADLESS} (needed to approve a plan)", "headless"),
        ),
        (
            "plan",
            call("exit_plan_mode", plan="  "),
            Deny("the plan is empty; write out the steps you will take", "validation"),
        ),
    ],
)
async def test_decision_order_without_rules(
    project: Path, mode: Mode, tool_call: ToolUse, expected: Any
) -> None:
    assert await decide(gate(project, mode), tool_call) == expected


async def test_writes_outside_the_project_or_to_protected_paths_are_refused_in_bypass(
    project: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (project / "link").symlink_to(outside)
    (project / ".git" / "hooks").mkdir(parents=True)
    g = gate(project, "bypass")
    cases = {
        "../outside/x.py": "../outside/x.py is outside the project root",
        str(outside / "y.py"): f"{outside / 'y.py'} is outside the project root",
        "link/z.py": "link/z.py is outside the project root",
        ".git/hooks/pre-commit": ".git/hooks/pre-commit is in .git/hooks, which keel protects",
        ".keel/settings.local.json": ".keel/settings.local.json is in .keel, which keel protects",
        ".git/config": ".git/config is in .git/config, which keel protects",
    }
    for path, message in cases.items():
        decision = await decide(g, call("write", path=path, content="x"))
        assert isinstance(decision, Deny), path
        assert decision.reason.startswith(message), decision.reason
        assert decision.source == "boundary"
    via = await decide(g, call("edit", path="link/z.py", old_string="a", new_string="b"))
    assert isinstance(via, Deny)
    assert "(through a symlink)" in via.reason


async def test_deny_rules_beat_bypass_and_cover_every_sub_command(project: Path) -> None:
    g = gate(
        project,
        "bypass",
        ["deny:bash(rm*)", "deny:web_fetch(domain:evil.example)", "deny:read(secrets/**)"],
    )
    for command in [
        "rm -rf x",
        "ls; rm x",
        "ls && rm x",
        "echo $(rm x)",
        "echo `rm x`",
        "bash -c 'rm x'",
        'sh -c "ls; rm x"',
        "(rm x)",
        "timeout 5 rm x",
        "env A=1 rm x",
    ]:
        decision = await decide(g, call("bash", command=command))
        assert decision == Deny("denied by rule bash(rm*) (test)", "rule"), command
    assert await decide(g, call("bash", command="ls -la")) == Allow("mode:bypass")
    assert isinstance(await decide(g, call("web_fetch", url="https://api.evil.example/x")), Deny)
    assert await decide(g, call("web_fetch", url="https://example.org")) == Allow("mode:bypass")
    assert isinstance(await decide(g, call("read", path="secrets/key.pem")), Deny)
    assert await decide(g, call("read", path="app.py")) == Allow("mode:bypass")


async def test_allow_rules_must_cover_each_command_of_the_line(project: Path) -> None:
    g = gate(project, "default", ["bash(git add*)", "bash(git commit*)", "edit(src/**)"])
    assert await decide(g, call("bash", command="git add . && git commit -m x")) == Allow(
        "rule:bash(git add*), bash(git commit*)", notable=True
    )
    for smuggled in [
        "git add . ; rm -rf ~",
        "git commit -m $(curl x)",
        "git add . | sh",
        "git commit -m x > /etc/passwd",
    ]:
        decision = await decide(g, call("bash", command=smuggled))
        assert isinstance(decision, Deny), smuggled
        assert decision.source == "headless"
    assert await decide(
        g, call("edit", path="src/a/b.py", old_string="a", new_string="b")
    ) == Allow("rule:edit(src/**)", notable=True)
    assert isinstance(
        await decide(g, call("edit", path="app.py", old_string="a", new_string="b")), Deny
    )


async def test_sandboxed_bash_needs_no_prompt_unless_it_leaves_the_sandbox(project: Path) -> None:
    g = gate(project, "default", sandboxed=True)
    assert await decide(g, call("bash", command="make test")) == Allow("sandbox")
    outside = await decide(g, call("bash", command="curl example.org", sandbox=False))
    assert outside == Deny(f"{HEADLESS} (needed to run a command outside the sandbox)", "headless")


async def test_asking_remembers_for_the_session_and_saves_always_rules(project: Path) -> None:
    asked: list[PermissionRequest] = []
    saved: list[str] = []
    replies = iter(
        [
            PermissionReply(True, "session"),
            PermissionReply(False, reason="not that file"),
            PermissionReply(True, "always"),
        ]
    )

    async def asker(request: PermissionRequest) -> PermissionReply:
        asked.append(request)
        return next(replies)

    g = gate(project, asker=asker, save_rule=saved.append)
    first = call("bash", command="npm test -- --watch=false")
    assert await decide(g, first) == Allow("user:session", notable=True)
    assert asked[0].suggestion == "bash(npm test *)"  # whole words: not `npm testevil`
    assert await decide(g, call("bash", command="npm test")) == Allow(
        "rule:bash(npm test *)", notable=True
    )
    assert len(asked) == 1  # remembered
    denied = await decide(g, call("write", path="x.py", content=""))
    assert denied == Deny("the user denied this: not that file", "user")
    assert await decide(g, call("bash", command="git commit -m 'x'")) == Allow(
        "user:always", notable=True
    )
    assert saved == ["bash(git commit *)"]


async def test_plan_approval_switches_to_the_chosen_mode(project: Path) -> None:
    async def asker(request: PermissionRequest) -> PermissionReply:
        assert request.plan == "1. edit app.py\n2. run tests"
        return PermissionReply(True, mode="accept-edits")

    g = gate(project, "plan", asker=asker)
    assert await decide(g, call("exit_plan_mode", plan="1. edit app.py\n2. run tests")) == Allow(
        "user:once", notable=True
    )
    assert g.mode == "accept-edits"
    assert await decide(g, call("edit", path="app.py", old_string="a", new_string="b")) == Allow(
        "mode:accept-edits", notable=True
    )


async def test_the_plan_approval_is_asked_in_bypass_mode_too(project: Path) -> None:
    asked: list[PermissionRequest] = []

    async def asker(request: PermissionRequest) -> PermissionReply:
        asked.append(request)
        return PermissionReply(False, reason="plan the tests first")

    g = gate(project, "bypass", asker=asker)
    plan_call = call("exit_plan_mode", plan="1. edit app.py")
    assert await decide(g, plan_call) == Deny("the user denied this: plan the tests first", "user")
    assert asked == [
        PermissionRequest(plan_call, "approve the plan", "exit_plan_mode", "1. edit app.py")
    ]
    assert g.mode == "bypass"


def test_bad_rules_and_modes_are_clear_errors() -> None:
    with pytest.raises(UserError, match=r"'bash\(' is not a permission rule"):
        parse_rule("bash(", "allow")
    with pytest.raises(UserError, match="unknown mode 'yolo'"):
        parse_mode("yolo")
    assert parse_rule("mcp__github", "allow") == Rule("mcp__github", None, "allow")


# -- decisions reach the journal; denials reach the model -------------------------------------


async def test_decisions_are_journaled_and_denials_are_results(
    project: Path, tmp_path: Path
) -> None:
    session = SessionLog.create(cwd=project, model="scripted", directory=tmp_path / "s")
    provider = ScriptedProvider(
        [
            Reply(
                Message(
                    "assistant",
                    (
                        ToolUse("t1", "read", {"path": "util.py"}),
                        ToolUse(
                            "t2", "write", {"path": ".keel/settings.local.json", "content": "{}"}
                        ),
                        ToolUse(
                            "t3",
                            "edit",
                            {"path": "util.py", "old_string": "X = 1", "new_string": "X = 2"},
                        ),
                    ),
                )
            ),
            Reply(Message("assistant", (Text("done"),))),
        ]
    )
    g = gate(project, "accept-edits")
    agent = Agent(
        provider=provider,
        model="scripted",
        tools=builtin_tools(),
        cwd=project,
        system="s",
        session=session,
        gate=g,
    )
    await agent.run("go")
    session.close()
    results = agent.messages[2].tool_results
    assert results[1] == tool_result(
        "t2",
        ".keel/settings.local.json is in .keel, which keel protects in every mode (it could run "
        "code or grant permissions later); change it yourself if you mean to",
        is_error=True,
    )
    assert results[2] == tool_result("t3", "Edited util.py: 1 replacement.")
    decisions = [
        r.payload
        for r in read_records(session.path).records
        if isinstance(r.payload, DecisionRecord)
    ]
    assert decisions == [
        DecisionRecord("t2", "write", "deny", "boundary", results[1].text),
        DecisionRecord("t3", "edit", "allow", "mode:accept-edits", ""),
    ]


# -- the sandbox (real bubblewrap) -------------------------------------------------------------


@needs_bwrap
async def test_sandbox_confines_writes_network_and_processes(project: Path, tmp_path: Path) -> None:
    (project / ".git" / "hooks").mkdir(parents=True)
    (project / ".git" / "config").write_text("[core]\n", encoding="utf-8")
    box = Sandbox(project)
    ctx = ToolContext(cwd=project, root=project, env=dict(os.environ), sandbox=box)
    script = (
        "echo ok > inside.txt && echo wrote-inside; "
        f"{{ echo x > {tmp_path}/outside.txt; }} 2>/dev/null || echo outside-refused; "
        "{ echo x > /tmp/keel-sandbox-probe; } 2>/dev/null || echo tmp-refused; "
        'echo x > "$TMPDIR/scratch" && echo tmpdir-ok; '
        "{ echo x > .git/hooks/pre-commit; } 2>/dev/null || echo hooks-refused; "
        "{ echo x >> .git/config; } 2>/dev/null || echo config-refused; "
        "{ echo x > .keel/settings.local.json; } 2>/dev/null || echo keel-refused; "
        "(exec 3<>/dev/tcp/127.0.0.1/9) 2>/dev/null || echo network-refused; "
        "echo pids=$(ls /proc | grep -c '^[0-9]')"
    )
    out = await bash.run(ctx, {"command": script})
    lines = str(out.content).splitlines()
    assert lines[:8] == [
        "wrote-inside",
        "outside-refused",
        "tmp-refused",
        "tmpdir-ok",
        "hooks-refused",
        "config-refused",
        "keel-refused",
        "network-refused",
    ]
    assert int(lines[8].removeprefix("pids=")) < 10  # its own pid namespace
    assert (project / "inside.txt").read_text(encoding="utf-8") == "ok\n"
    assert not (tmp_path / "outside.txt").exists()
    assert (project / ".git" / "config").read_text(encoding="utf-8") == "[core]\n"
    assert not (project / ".git" / "hooks" / "pre-commit").exists()
    box.cleanup()


@needs_bwrap
async def test_sandboxed_fork_bomb_is_bounded_by_the_timeout(project: Path) -> None:
    box = Sandbox(project)
    ctx = ToolContext(cwd=project, root=project, env=dict(os.environ), sandbox=box)
    start = time.monotonic()
    out = await bash.run(
        ctx, {"command": "for i in $(seq 1 400); do sleep 317 & done; wait", "timeout": 2}
    )
    assert time.monotonic() - start < 30  # not the 317 s sleeps
    assert str(out.content).endswith("[timed out after 2 s; process group killed]")
    await asyncio.sleep(0.5)
    left = await asyncio.to_thread(
        subprocess.run, ["pgrep", "-f", "sleep 317"], capture_output=True, text=True, check=False
    )
    assert left.stdout == ""
    box.cleanup()


# -- headless runs, end to end -------------------------------------------------------------------

TASK: list[dict[str, object]] = [
    {
        "text": "Looking.",
        "tool_calls": [
            {"name": "grep", "input": {"pattern": "print"}},
            {"name": "read", "input": {"path": "app.py"}},
        ],
    },
    {
        "tool_calls": [
            {
                "name": "edit",
                "input": {"path": "app.py", "old_string": "hello", "new_string": "bye"},
            }
        ]
    },
    {"tool_calls": [{"name": "bash", "input": {"command": "python3 app.py"}}]},
    {"text": "Done."},
]


def results_by_tool(home: Path) -> dict[str, str]:
    """Tool results of the most recently written session, by tool name."""
    path = max(session_files(home), key=lambda p: p.stat().st_mtime_ns)
    names: dict[str, str] = {}
    results: dict[str, str] = {}
    for record in read_records(path).records:
        payload = record.payload
        if isinstance(payload, AssistantRecord):
            names.update((c.id, c.name) for c in payload.message.tool_uses)
        elif isinstance(payload, ToolResultRecord):
            results[names[payload.result.tool_use_id]] = payload.result.text
    return results


@pytest.mark.parametrize(
    ("mode", "edit_result", "bash_result", "app"),
    [
        pytest.param(
            "default",
            f"{HEADLESS} (needed to change app.py)",
            "hello\n[exit code 0]",
            "hello",
            marks=needs_bwrap,  # bash runs unasked only in the sandbox
        ),
        pytest.param(
            "accept-edits",
            "Edited app.py: 1 replacement.",
            "bye\n[exit code 0]",
            "bye",
            marks=needs_bwrap,
        ),
        (
            "plan",
            "edit is not available in plan mode: only reading tools run until the plan is approved "
            "(call exit_plan_mode with the plan)",
            "`python3 app.py` is refused in plan mode: keel cannot tell that it only reads, so "
            "it may change something. Only commands keel knows to be read-only run until the plan "
            "is approved (ls, cat, grep, wc, git status/diff/log/show and pipes between them, "
            "without redirects to files); call exit_plan_mode with the plan",
            "hello",
        ),
        ("bypass", "Edited app.py: 1 replacement.", "bye\n[exit code 0]", "bye"),
    ],
)
def test_a_coding_task_in_each_mode(
    project: Path,
    tmp_path: Path,
    isolated_env: Path,
    mode: str,
    edit_result: str,
    bash_result: str,
    app: str,
) -> None:
    script = write_script(tmp_path / "task.json", TASK)
    out = keel(
        "-p", "change the greeting", "--model", f"scripted:{script}", "--mode", mode, cwd=project
    )
    assert out.returncode == 0, out.stderr
    results = results_by_tool(isolated_env)
    assert results["grep"] == "app.py:2:    print('hello')"
    assert results["read"].startswith("     1\tdef main():")
    assert results["edit"] == edit_result
    assert results["bash"] == bash_result
    assert f"print('{app}')" in (project / "app.py").read_text(encoding="utf-8")


def test_allowed_and_disallowed_tools_from_the_command_line(
    project: Path, tmp_path: Path, isolated_env: Path
) -> None:
    script = write_script(tmp_path / "task.json", TASK)
    out = keel(
        "-p",
        "go",
        "--model",
        f"scripted:{script}",
        "--allowed-tools",
        "edit(app.py),read",
        "--disallowed-tools",
        "bash(python3*)",
        cwd=project,
    )
    assert out.returncode == 0, out.stderr
    results = results_by_tool(isolated_env)
    assert results["edit"] == "Edited app.py: 1 replacement."
    assert results["bash"] == "denied by rule bash(python3*) (--disallowed-tools)"


def test_shared_project_settings_may_only_tighten(
    project: Path, tmp_path: Path, isolated_env: Path
) -> None:
    (project / ".keel").mkdir()
    (project / ".keel" / "settings.json").write_text(
        json.dumps(
            {
                "permissions": {
                    "allow": ["edit"],
                    "deny": ["bash(python3*)"],
                    "default_mode": "bypass",
                },
                "sandbox": {"enabled": False},
            }
        ),
        encoding="utf-8",
    )
    script = write_script(tmp_path / "task.json", TASK)
    out = keel("-p", "go", "--model", f"scripted:{script}", cwd=project)
    assert out.returncode == 0, out.stderr
    shared = project / ".keel" / "settings.json"
    assert out.stderr.splitlines()[:1] == [
        f"keel: warning: {shared}: not applied until you approve them: permissions.allow, "
        "permissions.default_mode, sandbox.enabled (this file came with the project; `keel trust "
        "list` shows why each needs approval, `keel trust approve` applies them)",
    ]
    results = results_by_tool(isolated_env)
    assert results["edit"] == f"{HEADLESS} (needed to change app.py)"
    assert results["bash"] == f"denied by rule bash(python3*) ({shared})"
    # A "personal" file the user did not get from keel came with the project too; the rule keel
    # saves there for an "always allow" answer is the user's (recorded outside the project).
    (project / ".keel" / "settings.local.json").write_text(
        json.dumps({"permissions": {"allow": ["edit"]}}), encoding="utf-8"
    )
    out = keel("-p", "go", "--model", f"scripted:{script}", cwd=project)
    assert out.returncode == 0, out.stderr
    assert results_by_tool(isolated_env)["edit"] == f"{HEADLESS} (needed to change app.py)"
    from keel.config.local_rules import save_local_rule

    save_local_rule(project, "edit")
    out = keel("-p", "go", "--model", f"scripted:{script}", cwd=project)
    assert out.returncode == 0, out.stderr
    assert results_by_tool(isolated_env)["edit"] == "Edited app.py: 1 replacement."


def test_doctor_reports_the_sandbox(project: Path) -> None:
    out = keel("doctor", cwd=project)
    lines = out.stdout.splitlines()
    assert lines[0].startswith("keel 0.1.0 on Python 3.")
    sandbox_line = next(line for line in lines if line.startswith("sandbox:"))
    if probe().ok:
        assert sandbox_line.startswith("sandbox: ok: bubblewrap works")
        assert out.returncode == 0
    else:
        assert "NOT AVAILABLE" in sandbox_line
        assert out.returncode == 1
    assert any(line.startswith("ripgrep: ") for line in lines)
    assert shutil.which("bwrap") is None or probe().ok
