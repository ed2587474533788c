"""A project set up for Claude Code (hooks in `.claude/settings.json`, `.claude/skills`,
`.claude/commands`, `.mcp.json`) works with `keel -p` unchanged, once its shared parts are
approved. Checked on the wire: the loopback Anthropic server records every request."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from keel.llm.script import reply
from keel.testing.anthropic_server import AnthropicServer
from tests.helpers import context_of, user_settings_file, without_context
from tests.test_cli import keel

SERVER = str(Path(__file__).parent / "mcp_servers" / "tools_server.py")
MODEL = "anthropic/claude-sonnet-4-5"

SKILL = """\
---
name: release-notes
description: Write release notes from the changes since the last tag.
---

Read CHANGES.md, then write the notes in three bullet points.
"""

COMMAND = """\
---
description: Prepare a release
argument-hint: VERSION
allowed-tools: Bash(echo:*)
---

Prepare release $ARGUMENTS. The branch: !`echo main-branch`. Then !`touch made-by-command`.
"""


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


@pytest.fixture
def claude_project(project: Path) -> Path:
    """A project laid out for Claude Code, in a git repository."""
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    write(project / ".claude/skills/release-notes/SKILL.md", SKILL)
    write(project / ".claude/commands/release.md", COMMAND)
    hooks = {
        "UserPromptSubmit": [
            {"hooks": [{"type": "command", "command": "echo 'Releases are cut from main.'"}]}
        ],
        "PostToolUse": [
            {
                "matcher": "mcp__tools__.*",
                "hooks": [
                    {"type": "command", "command": 'cat >> "$CLAUDE_PROJECT_DIR/post-tool.log"'}
                ],
            }
        ],
    }
    write(project / ".claude/settings.json", json.dumps({"hooks": hooks}))
    servers = {"tools": {"command": sys.executable, "args": [SERVER, "stdio"]}}
    write(project / ".mcp.json", json.dumps({"mcpServers": servers}))
    return project


@pytest.fixture
def anthropic() -> Iterator[AnthropicServer]:
    with AnthropicServer(api_key="sk-ant-test") as server:
        yield server


def run(project: Path, server: AnthropicServer, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"ANTHROPIC_API_KEY": "sk-ant-test", "ANTHROPIC_BASE_URL": server.url}
    return keel(*args, "--model", MODEL, cwd=project, env=env, timeout=90)


def user_texts(message: dict[str, Any]) -> list[str]:
    return [b["text"] for b in message["content"] if b["type"] == "text"]


@pytest.mark.needs("sandbox")  # bash runs unasked only in the sandbox
@pytest.mark.needs("git")
def test_claude_code_project_runs_unchanged_once_approved(
    claude_project: Path, anthropic: AnthropicServer
) -> None:
    # Nothing shared runs before approval; the run still works and says why.
    anthropic.add(reply("Nothing to do yet."))
    before = run(claude_project, anthropic, "-p", "hello")
    assert before.returncode == 0, before.stderr
    assert "project hook(s) are not approved" in before.stderr
    assert "project MCP server(s) tools are not approved" in before.stderr
    first = anthropic.model_requests[0].json
    assert "mcp__tools__echo" not in [t["name"] for t in first["tools"]]
    assert "skill" in [t["name"] for t in first["tools"]]  # skills are text, not code: no gate

    listing = keel("mcp", "list", cwd=claude_project)
    assert listing.returncode == 0
    assert listing.stdout.splitlines()[0].split()[:4] == [
        "tools",
        "needs",
        "approval",
        "(stdio,",
    ]
    assert keel("hooks", "approve", cwd=claude_project).returncode == 0
    approved = keel("mcp", "approve", cwd=claude_project)
    assert approved.stdout == (
        "approved MCP server tools; it starts from now on, until its entry changes\n"
    )
    listing = keel("mcp", "list", cwd=claude_project)
    assert listing.stdout.splitlines()[0].split()[:3] == ["tools", "connected", "(stdio,"]
    skills = keel("skills", cwd=claude_project)
    release = claude_project / ".claude/commands/release.md"
    assert skills.stdout.splitlines() == [
        # A project's command may not pre-approve tools; keel says so (its echo is safe anyway).
        f"warning: {release}:4: `allowed-tools` of a project's command is not honoured (a file "
        "that came with the repository may not widen permissions); /release asks as usual. Put "
        "it in ~/.claude/commands to pre-approve",
        f"skill release-notes  (/release-notes, model)  "
        f"{claude_project / '.claude/skills/release-notes/SKILL.md'}",
        f"command /release VERSION  {claude_project / '.claude/commands/release.md'}",
    ]

    anthropic.add(
        reply("", ("skill", {"name": "release-notes"})),
        reply("", ("mcp__tools__echo", {"text": "v2", "times": 2})),
        reply("Release v2 is ready."),
    )
    out = run(
        claude_project,
        anthropic,
        "-p",
        "/release v2",
        "--allowed-tools",
        "mcp__tools",
        "--disallowed-tools",
        "bash(touch*)",
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == "Release v2 is ready.\n"
    assert "not approved" not in out.stderr
    # The command's `!` lines run only as bash would run unasked: a deny rule stops this one.
    assert "/release: !`touch made-by-command` was not run: it needs permission" in out.stderr
    assert not (claude_project / "made-by-command").exists()

    bodies = [r.json for r in anthropic.model_requests[1:]]
    assert len(bodies) == 3
    names = [t["name"] for t in bodies[0]["tools"]]
    assert {"skill", "mcp__tools__echo", "mcp__tools__fails"} <= set(names)
    assert names == sorted(names)
    # The skills index is in the context that opens the first user message, not the system.
    system = "".join(block["text"] for block in bodies[0]["system"])
    context = context_of(bodies[0])
    assert "<skills>" not in system
    assert "<skills>" in context
    assert "- release-notes: Write release notes from the changes since the last tag." in context
    texts = user_texts(bodies[0]["messages"][0])
    assert texts[0] == context
    prompt = without_context("\n\n".join(texts))
    assert prompt == (
        "<system-note>\n"
        '<hook-context source="UserPromptSubmit">\nReleases are cut from main.\n</hook-context>\n'
        "</system-note>\n\n"
        "Prepare release v2. The branch: main-branch. "
        "Then [not run: !`touch made-by-command` needs permission]."
    )
    skill_result = bodies[1]["messages"][2]["content"][0]
    assert skill_result["type"] == "tool_result"
    assert skill_result["content"][0]["text"] == (
        f"Base directory for this skill: {claude_project / '.claude/skills/release-notes'}\n\n"
        "Read CHANGES.md, then write the notes in three bullet points."
    )
    echo_result = bodies[2]["messages"][4]["content"][0]
    assert echo_result["content"][0]["text"] == "v2 v2"
    assert not echo_result.get("is_error")
    # The PostToolUse hook (matcher on the MCP tool's name) got Claude Code's payload.
    logged = json.loads((claude_project / "post-tool.log").read_text(encoding="utf-8"))
    assert logged["hook_event_name"] == "PostToolUse"
    assert logged["tool_name"] == "mcp__tools__echo"
    assert logged["tool_input"] == {"text": "v2", "times": 2}

    # Continuing the session starts the same servers: same tools, so no configuration change.
    anthropic.add(reply("Still ready."))
    again = run(claude_project, anthropic, "-p", "-c", "and now?", "--allowed-tools", "mcp__tools")
    assert again.returncode == 0, again.stderr
    assert again.stdout == "Still ready.\n"
    assert "changed configuration" not in again.stderr
    assert [t["name"] for t in anthropic.model_requests[-1].json["tools"]] == names


@pytest.mark.needs("git")
def test_a_broken_mcp_server_costs_only_its_tools(
    claude_project: Path, anthropic: AnthropicServer
) -> None:
    servers = {
        "tools": {"command": sys.executable, "args": [SERVER, "stdio"]},
        "broken": {"command": sys.executable, "args": ["-c", "import sys; sys.exit('no config')"]},
    }
    write(user_settings_file(), json.dumps({"mcp_servers": servers}))  # the user's own servers
    (claude_project / ".mcp.json").unlink()
    anthropic.add(reply("Done."))
    out = run(claude_project, anthropic, "-p", "hello")
    assert out.returncode == 0, out.stderr
    lines = out.stderr.splitlines()
    broken = [line for line in lines if line.startswith("keel: warning: MCP server broken failed")]
    assert len(broken) == 1, out.stderr
    assert broken[0].endswith("failed: exited with code 1: no config")
    names = [t["name"] for t in anthropic.model_requests[0].json["tools"]]
    assert "mcp__tools__echo" in names
    assert not any(n.startswith("mcp__broken") for n in names)


@pytest.mark.needs("git")
async def test_command_shell_lines_follow_the_gate(claude_project: Path) -> None:
    from keel.agent.loop import Agent
    from keel.llm.events import Notice
    from keel.llm.providers.scripted import ScriptedProvider
    from keel.permissions.gate import PermissionGate
    from keel.skills import load_extensions

    home = claude_project / "no-home"
    _, commands = load_extensions(claude_project, user_dir=None, home=home)
    texts = {}
    for mode, sandboxed in (("default", False), ("plan", False), ("default", True)):
        gate = PermissionGate(mode, claude_project, claude_project, sandboxed=sandboxed)  # type: ignore[arg-type]
        agent = Agent(
            provider=ScriptedProvider([reply("ok")]),
            model="scripted",
            tools=[],
            cwd=claude_project,
            system="s",
            gate=gate,
        )
        agent.commands = commands
        events: list[Any] = []
        await agent.run("/release 3.0", events.append)
        notices = [e.text for e in events if isinstance(e, Notice)]
        texts[mode, sandboxed] = (user_text_of(agent), notices)
    refused = "[not run: !`touch made-by-command` needs permission]"
    # `echo` is on the read-only list: it runs without asking in every mode, plan included.
    assert texts["default", False] == (
        f"Prepare release 3.0. The branch: main-branch. Then {refused}.",
        ["/release: !`touch made-by-command` was not run: it needs permission (allow it with "
         "a bash rule in settings or --allowed-tools)"],
    )  # fmt: skip
    assert texts["plan", False][0].endswith(f"Then {refused}.")
    # A sandbox that works lets any command run unasked (this one has no sandbox attached, so
    # it runs as is: the gate's answer is what is under test).
    assert texts["default", True][0] == "Prepare release 3.0. The branch: main-branch. Then ."
    assert (claude_project / "made-by-command").exists()


def user_text_of(agent: Any) -> str:
    first = agent.messages[0]
    return "".join(b.text for b in first.blocks if hasattr(b, "text"))
