"""The tools a request offers (issue 28, item 8): a tool a deny rule takes in whole is not offered
at all, from every source of deny rules, to the main agent and its subagents, and is still
refused when called; the compact profile (`tools.profile`) offers the core tools in a line each,
chosen automatically for a small window. Each test reads the whole `tools` array of the Chat
Completions bodies a loopback server received."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from keel.agent.events import Event
from keel.agent.loop import Agent
from keel.app import Options, open_agent
from keel.config.settings import load_settings
from keel.llm.catalog import with_window
from keel.llm.events import Notice
from keel.llm.script import reply
from keel.permissions.gate import PermissionGate
from keel.permissions.rules import parse_rule
from keel.testing.llamacpp_server import LlamaCppServer
from keel.testing.openai_server import OpenAIChatServer
from keel.tools.base import ToolContext, tool
from keel.tools.builtin import builtin_tools
from keel.tools.profile import COMPACT, COMPACT_WINDOW
from tests.helpers import unsandboxed_line_dropped, user_settings_file

MODEL = "openai-compatible/x"
#: What a run with no deny rule offers (memory and task come with every `keel -p`).
EVERY_TOOL = sorted([t.name for t in builtin_tools()] + ["memory", "task"])
CORE = ["bash", "edit", "glob", "grep", "ls", "read", "write"]
#: The tools of its parent's a general subagent is offered.
GENERAL = [*CORE, "multi_edit", "raw_output", "web_fetch"]


@pytest.fixture
def chat(monkeypatch: pytest.MonkeyPatch) -> Iterator[OpenAIChatServer]:
    with OpenAIChatServer() as server:
        monkeypatch.setenv("OPENAI_COMPATIBLE_BASE_URL", server.url + "/v1")
        yield server


def write_json(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data), encoding="utf-8")


async def started(project: Path, **options: Any) -> Agent:
    return await open_agent(Options(cwd=project, model=MODEL, no_session=True, **options))


async def offered(chat: OpenAIChatServer, project: Path, **options: Any) -> list[dict[str, Any]]:
    """The `tools` array of the one request a run of "hi" sends."""
    chat.add(reply("ok"))
    agent = await started(project, **options)
    try:
        await agent.run("hi")
    finally:
        await agent.aclose()
    tools: list[dict[str, Any]] = chat.model_requests[-1].json["tools"]
    return tools


def without(tools: list[dict[str, Any]], *names: str) -> list[dict[str, Any]]:
    return [t for t in tools if t["function"]["name"] not in names]


def names(tools: list[dict[str, Any]]) -> list[str]:
    return [t["function"]["name"] for t in tools]


def compact_array() -> list[dict[str, Any]]:
    """The compact profile's tools as Chat Completions carries them: the short description, the
    schema unchanged."""
    schemas = {t.name: t.input_schema for t in builtin_tools()}
    return [
        {
            "type": "function",
            "function": {"name": n, "description": COMPACT[n], "parameters": schemas[n]},
        }
        for n in CORE
    ]


# -- deny rules withhold whole tools ----------------------------------------------------------


async def test_deny_rules_that_take_in_a_whole_tool_withhold_it(
    chat: OpenAIChatServer, project: Path
) -> None:
    full = await offered(chat, project)
    assert names(full) == EVERY_TOOL
    assert await offered(chat, project, disallowed_tools=["Bash"]) == without(full, "bash")
    assert await offered(chat, project, disallowed_tools=["Bash(*)"]) == without(full, "bash")
    # A rule with a specifier keeps the tool: the gate decides call by call.
    assert await offered(chat, project, disallowed_tools=["Bash(rm:*)"]) == full
    # Write covers the tools that write files; Read those that read them.
    assert await offered(chat, project, disallowed_tools=["Write"]) == without(
        full, "edit", "multi_edit", "write"
    )
    assert await offered(chat, project, disallowed_tools=["Read"]) == without(
        full, "glob", "grep", "ls", "read"
    )
    # An allow or ask rule withholds nothing.
    write_json(user_settings_file(), {"permissions": {"ask": ["WebFetch"], "allow": ["Bash"]}})
    assert await offered(chat, project) == full


async def test_every_settings_scope_and_a_projects_deny_rules_withhold(
    chat: OpenAIChatServer, project: Path
) -> None:
    full = await offered(chat, project)
    write_json(user_settings_file(), {"permissions": {"deny": ["WebFetch"]}})
    assert await offered(chat, project) == without(full, "web_fetch")
    # The project's shared files, not approved: a deny rule applies all the same.
    write_json(project / ".keel" / "settings.json", {"permissions": {"deny": ["todo_write"]}})
    write_json(project / ".claude" / "settings.json", {"permissions": {"deny": ["Task"]}})
    write_json(project / ".claude" / "settings.local.json", {"permissions": {"deny": ["Edit"]}})
    assert await offered(chat, project) == without(
        full, "web_fetch", "todo_write", "task", "edit", "multi_edit", "write"
    )


async def test_a_withheld_tool_called_anyway_is_refused(
    chat: OpenAIChatServer, project: Path
) -> None:
    chat.add(reply("", ("bash", {"command": "touch ran"})), reply("could not"))
    agent = await started(project, disallowed_tools=["Bash"])
    try:
        await agent.run("make a file")
    finally:
        await agent.aclose()
    second = chat.model_requests[1].json
    assert "bash" not in names(second["tools"])
    assert [m["content"] for m in second["messages"] if m["role"] == "tool"] == [
        "Error: denied by rule bash (--disallowed-tools)"
    ]
    assert not (project / "ran").exists()
    # Written as text, a call of it is not salvaged: it names no offered tool.
    text_call = '```json\n{"name": "bash", "arguments": {"command": "touch ran"}}\n```'
    chat.add(reply(text_call), reply("ok"))
    agent = await started(project, disallowed_tools=["Bash"])
    events: list[Event] = []
    try:
        await agent.run("make a file", events.append)
    finally:
        await agent.aclose()
    assert [e for e in events if isinstance(e, Notice) and e.level == "warning"] == [
        Notice(
            "a tool call written as text was not run "
            "(JSON call: bash is not one of the offered tools)",
            "warning",
        )
    ]
    assert not (project / "ran").exists()


async def test_a_deny_rule_added_mid_context_applies_at_once_and_to_the_tools_of_the_next(
    chat: OpenAIChatServer, project: Path
) -> None:
    """The tools of a context do not change within it (the prompt prefix): a deny rule added
    to the gate later (a command's `disallowed-tools`, for one) refuses calls at once, and the
    tool leaves the tools offered with the next fresh context."""
    chat.add(reply("ok"), reply("", ("bash", {"command": "touch ran"})), reply("no"), reply("ok"))
    agent = await started(project)
    try:
        await agent.run("hi")
        assert isinstance(agent.gate, PermissionGate)
        agent.gate.rules.insert(0, parse_rule("Bash", "deny", "test"))
        await agent.run("make a file")
        fresh = Agent(
            provider=agent.provider, model="x", tools=agent.registry, cwd=project, gate=agent.gate
        )
        await fresh.run("hi")
    finally:
        await agent.aclose()
    bodies = [r.json for r in chat.model_requests]
    assert [b["tools"] for b in bodies[:3]] == [bodies[0]["tools"]] * 3
    assert "bash" in names(bodies[0]["tools"])
    assert [m["content"] for m in bodies[2]["messages"] if m["role"] == "tool"] == [
        "Error: denied by rule bash (test)"
    ]
    assert names(bodies[3]["tools"]) == [n for n in names(bodies[0]["tools"]) if n != "bash"]
    assert not (project / "ran").exists()


async def test_a_commands_disallowed_tools_never_withhold_a_tool(
    chat: OpenAIChatServer, project: Path
) -> None:
    """A custom command's `disallowed-tools` hold for its turn: even as a context's first
    prompt they leave the context's tools as they are (the gate refuses the calls)."""
    command = project / ".claude" / "commands" / "look.md"
    command.parent.mkdir(parents=True)
    command.write_text("---\ndisallowed-tools: Bash\n---\nLook around.\n", encoding="utf-8")
    full = await offered(chat, project)
    chat.add(reply("", ("bash", {"command": "touch ran"})), reply("no"), reply("ok"))
    agent = await started(project)
    try:
        await agent.run("/look")
        await agent.run("hi")
    finally:
        await agent.aclose()
    bodies = [r.json for r in chat.model_requests[1:]]
    assert [b["tools"] for b in bodies] == [full] * 3
    assert [m["content"] for m in bodies[1]["messages"] if m["role"] == "tool"] == [
        f"Error: denied by rule bash ({command} (/look))"
    ]
    assert not (project / "ran").exists()


async def test_a_subagent_is_not_offered_a_withheld_tool(
    chat: OpenAIChatServer, project: Path
) -> None:
    chat.add(
        reply("", ("task", {"description": "look", "prompt": "list the files"})),
        reply("two files"),
        reply("done"),
    )
    agent = await started(project, disallowed_tools=["Bash", "mcp__github"])
    try:
        await agent.run("delegate")
    finally:
        await agent.aclose()
    parent, child, _ = (r.json for r in chat.model_requests)
    assert names(parent["tools"]) == [n for n in EVERY_TOOL if n != "bash"]
    assert child["messages"][-1]["content"].endswith("list the files")
    # The general subagent's tools (all but the parent's own), bash not among them.
    assert child["tools"] == [t for t in parent["tools"] if t["function"]["name"] in GENERAL]


def test_disallowed_tools_flag_end_to_end(chat: OpenAIChatServer, project: Path) -> None:
    chat.add(reply("ok"))
    out = subprocess.run(
        [sys.executable, "-m", "keel", "-p", "hi", "--model", MODEL, "--disallowed-tools", "Bash"],
        cwd=project,
        input="",
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert names(chat.model_requests[0].json["tools"]) == [n for n in EVERY_TOOL if n != "bash"]
    # Withholding a tool says nothing of its own: the flag is the user's.
    assert unsandboxed_line_dropped(out.stderr) == (
        "keel: x is not in keel's catalog; the server is asked for its window (128k if it does "
        "not say)\n"
    )


# -- the compact profile ----------------------------------------------------------------------


async def test_compact_profile_offers_the_core_tools_in_a_line_each(
    chat: OpenAIChatServer, project: Path
) -> None:
    write_json(user_settings_file(), {"tools": {"profile": "compact"}})
    assert await offered(chat, project) == compact_array()
    # Withheld tools stay withheld.
    assert await offered(chat, project, disallowed_tools=["Bash"]) == without(
        compact_array(), "bash"
    )


async def test_compact_keeps_exit_plan_mode_for_a_context_started_in_plan_mode(
    chat: OpenAIChatServer, project: Path
) -> None:
    write_json(user_settings_file(), {"tools": {"profile": "compact"}})
    tools = await offered(chat, project, mode="plan")
    assert names(tools) == sorted([*CORE, "exit_plan_mode"])
    plan = tools[names(tools).index("exit_plan_mode")]["function"]
    assert plan["description"] == COMPACT["exit_plan_mode"]


async def test_a_call_in_the_compact_profile_runs_as_in_full(
    chat: OpenAIChatServer, project: Path
) -> None:
    write_json(user_settings_file(), {"tools": {"profile": "compact"}})
    chat.add(reply("", ("read", {"path": "util.py"})), reply("X is 1"))
    agent = await started(project)
    try:
        await agent.run("what is X")
    finally:
        await agent.aclose()
    second = chat.model_requests[1].json
    assert second["tools"] == compact_array()
    assert [m["content"] for m in second["messages"] if m["role"] == "tool"] == ["     1\tX = 1"]


async def test_auto_profile_follows_the_window_known_at_the_first_request(
    chat: OpenAIChatServer, project: Path
) -> None:
    full = await offered(chat, project)  # the catalog's 128k for an unknown model
    models = {"models": {MODEL: {"window": COMPACT_WINDOW, "max_output": 2048}}}
    write_json(user_settings_file(), models)
    assert await offered(chat, project) == compact_array()
    models["models"][MODEL]["window"] = COMPACT_WINDOW + 1
    write_json(user_settings_file(), models)
    assert await offered(chat, project) == full
    # `full` stands whatever the window.
    write_json(user_settings_file(), {**models, "tools": {"profile": "full"}})
    models["models"][MODEL]["window"] = 4096
    write_json(user_settings_file(), {**models, "tools": {"profile": "full"}})
    assert await offered(chat, project) == full
    # A window learnt after the agent was built, before its first request (a local server's
    # probe), still decides.
    write_json(user_settings_file(), {})
    chat.add(reply("ok"))
    agent = await started(project)
    before = agent.fingerprint().tools_hash
    agent.info = with_window(agent.info, 8192)
    try:
        await agent.run("hi")
    finally:
        await agent.aclose()
    assert chat.model_requests[-1].json["tools"] == compact_array()
    assert agent.fingerprint().tools_hash != before


async def test_auto_profile_reads_a_llamacpp_servers_n_ctx(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The window a local server publishes (`/props` n_ctx), asked before the first request,
    chooses the profile of that request."""
    for n_ctx, expected in ((8192, compact_array()), (32768, None)):
        with LlamaCppServer([reply("ok")], n_ctx=n_ctx) as server:
            monkeypatch.setenv("OPENAI_COMPATIBLE_BASE_URL", server.url + "/v1")
            agent = await started(project)
            try:
                await agent.run("hi")
            finally:
                await agent.aclose()
            tools = server.model_requests[0].json["tools"]
        if expected is not None:
            assert tools == expected
        else:
            assert names(tools) == EVERY_TOOL


async def test_a_subagent_gets_the_compact_profile_too(
    chat: OpenAIChatServer, project: Path
) -> None:
    """`task` is not in the compact profile; a subagent started anyway (a call of a tool not
    offered still runs through the gate) is offered the compact tools its type allows."""
    write_json(user_settings_file(), {"tools": {"profile": "compact"}})
    chat.add(
        reply("", ("task", {"description": "look", "prompt": "list the files"})),
        reply("two files"),
        reply("done"),
    )
    agent = await started(project, disallowed_tools=["Edit"])
    try:
        await agent.run("delegate")
    finally:
        await agent.aclose()
    parent, child, _ = (r.json for r in chat.model_requests)
    assert parent["tools"] == without(compact_array(), "edit", "write")
    assert child["tools"] == without(compact_array(), "edit", "write")


def test_the_profile_setting_is_checked(project: Path) -> None:
    write_json(user_settings_file(), {"tools": {"profile": "tiny", "only": ["bash"]}})
    settings = load_settings(project)
    assert settings.tool_profile == "auto"
    where = f"{user_settings_file()}: tools"
    assert settings.warnings == [
        f"{where}.profile must be full, compact, auto; ignored",
        f"{where}.only: unknown key skipped (known: profile)",
    ]
    write_json(user_settings_file(), {"tools": "compact"})
    assert load_settings(project).warnings == [
        f'{where} must be an object like {{"profile": "compact"}}; ignored'
    ]


@tool(name="mcp__github__create_issue", kind="mcp")
async def create_issue(ctx: ToolContext, title: str) -> str:
    """Create an issue on GitHub, with a long description the compact profile leaves as is."""
    return title


async def test_mcp_tools_stay_in_compact_unless_a_server_wide_rule_withholds_them(
    chat: OpenAIChatServer, project: Path
) -> None:
    write_json(user_settings_file(), {"tools": {"profile": "compact"}})
    mcp_entry = {
        "type": "function",
        "function": {
            "name": "mcp__github__create_issue",
            "description": create_issue.description,
            "parameters": create_issue.input_schema,
        },
    }
    with_mcp = sorted([*compact_array(), mcp_entry], key=lambda t: t["function"]["name"])
    for deny, expected in (
        ([], with_mcp),
        (["mcp__github__*"], compact_array()),
        (["mcp__github"], compact_array()),
        (["mcp__github__create_issue(*)"], compact_array()),
        (["mcp__gitlab"], with_mcp),
    ):
        chat.add(reply("ok"))
        agent = await started(project, disallowed_tools=deny)
        agent.add_tools([create_issue])
        try:
            await agent.run("hi")
        finally:
            await agent.aclose()
        assert chat.model_requests[-1].json["tools"] == expected, deny
