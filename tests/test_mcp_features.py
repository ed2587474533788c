"""MCP beyond tools, against real servers: the environment a stdio server gets, sandboxed
servers, `tools/list_changed`, restarts of a dropped server, progress, prompts as slash
commands, resources (tools and `@server:uri` mentions), roots, sampling, elicitation and
`~/.claude.json`. The servers are `tests/mcp_servers/features_server.py` (the official Python
SDK) and, where node and the package are installed, the reference `server-everything`."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from keel.agent.events import (
    Event,
    QuestionAnswered,
    QuestionRequest,
    ToolFinished,
    ToolProgress,
    ToolStarted,
)
from keel.agent.loop import Agent
from keel.app.mcp_wiring import wire
from keel.llm.messages import Text
from keel.mcp import McpManager, load_servers
from keel.mcp import client as mcp_client
from keel.mcp.client import SAFE_ENV, McpServerLost, server_env
from keel.mcp.config import ServerConfig
from keel.mcp.tools import build_resource_tools
from keel.permissions import AllowAll
from keel.permissions.gate import PermissionGate, PermissionReply, PermissionRequest
from keel.testing import ScriptedProvider, reply
from keel.tools.base import ToolContext, ToolOutput, current_call_id

module_loop = pytest.mark.asyncio(loop_scope="module")

PY = sys.executable
FEATURES = str(Path(__file__).parent / "mcp_servers" / "features_server.py")
EVERYTHING = (
    Path(__file__).parent
    / "mcp_servers"
    / "node"
    / "node_modules"
    / "@modelcontextprotocol"
    / "server-everything"
    / "dist"
    / "index.js"
)
SECRETS = {
    "ANTHROPIC_API_KEY": "sk-ant-secret",
    "GITHUB_TOKEN": "ghp_secret",
    "OPENAI_API_KEY": "sk-openai-secret",
    "HTTPS_PROXY": "http://me:hunter2@proxy.invalid:3128",
}


def write_json(path: Path, data: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def configs(root: Path, entries: dict[str, Any], env: dict[str, str]) -> list[ServerConfig]:
    servers, warnings = load_servers(
        root, [(root.parent / f"{root.name}-user-settings.json", entries)], env
    )
    assert warnings == []
    return servers


def ctx(root: Path) -> ToolContext:
    return ToolContext(cwd=root, root=root)


def text_of(out: ToolOutput) -> str:
    return "".join(b.text for b in out.blocks() if isinstance(b, Text))


async def call_text(manager: McpManager, server: str, tool: str, **args: Any) -> str:
    result = await manager.call(server, tool, args)
    return "".join(getattr(c, "text", "") for c in result.content)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("features-project")
    (root / ".git").mkdir()
    return root


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def manager(project: Path) -> AsyncIterator[McpManager]:
    env = {**os.environ, **SECRETS}
    servers = configs(
        project,
        {
            "feat": {"command": PY, "args": [FEATURES], "env": {"DECLARED": "by-the-entry"}},
            "trusting": {"command": PY, "args": [FEATURES], "inherit_env": True},
        },
        env,
    )
    async with McpManager(servers, root=project, env=env, log_dir=project / "logs") as m:
        assert await m.wait_ready(30)
        assert {s.name: s.state for s in m.status()} == {
            "feat": "connected",
            "trusting": "connected",
        }
        yield m


# -- 1. the environment ---------------------------------------------------------------------


@module_loop
async def test_a_stdio_server_sees_only_what_it_declares_and_the_safe_base(
    manager: McpManager,
) -> None:
    """The attack: a server (any npm package) reads keel's API keys from its environment."""
    seen = json.loads(await call_text(manager, "feat", "environment"))
    assert not set(SECRETS) & set(seen)
    assert seen["DECLARED"] == "by-the-entry"
    assert seen["PATH"] == os.environ["PATH"]
    from fnmatch import fnmatchcase

    # Everything else it sees is in the safe base (Python adds nothing it was not given, apart
    # from the variables the interpreter sets for itself).
    own = {"DECLARED", "LC_CTYPE", "PYTHONIOENCODING"}
    assert all(k in own or any(fnmatchcase(k.upper(), p) for p in SAFE_ENV) for k in seen)


@module_loop
async def test_inherit_env_passes_everything(manager: McpManager) -> None:
    seen = json.loads(await call_text(manager, "trusting", "environment"))
    assert {k: seen.get(k) for k in SECRETS} == SECRETS


def test_server_env_filters_by_name_and_by_url_password(tmp_path: Path) -> None:
    config = ServerConfig("s", "stdio", "user", "x", command="srv", env=(("OWN_TOKEN", "t"),))
    env = {"PATH": "/bin", "LC_ALL": "C", "GITHUB_TOKEN": "g", "HTTP_PROXY": "http://u:p@h:1"}
    assert server_env(config, env) == {"PATH": "/bin", "LC_ALL": "C", "OWN_TOKEN": "t"}


# -- 2. the sandbox -------------------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.needs("sandbox")
async def test_a_sandboxed_server_writes_only_in_the_project(tmp_path: Path) -> None:
    """The attack: a server writes outside the project (or into .mcp.json to widen its own
    entry). Unsandboxed it can; with `sandbox: true` it cannot."""
    root = tmp_path / "proj"
    (root / ".git").mkdir(parents=True)
    write_json(root / ".mcp.json", {"mcpServers": {}})
    outside = tmp_path / "outside.txt"
    env = {**os.environ, **SECRETS}
    # The server's script sits in the project, as a project's own server would: the checkout
    # holding keel's tests may be anywhere (a private /tmp hides it inside the sandbox).
    boxed_script = root / "features_server.py"
    shutil.copy(FEATURES, boxed_script)
    servers = configs(
        root,
        {
            "boxed": {"command": PY, "args": [str(boxed_script)], "sandbox": True},
            "free": {"command": PY, "args": [FEATURES]},
        },
        env,
    )
    async with McpManager(servers, root=root, env=env, log_dir=tmp_path / "logs") as m:
        assert await m.wait_ready(30)
        assert m.server("boxed").state == "connected", m.server("boxed").detail
        in_project = str(root / "ok.txt")
        assert await call_text(m, "boxed", "write", path=in_project, text="x") == "written"
        assert await call_text(m, "boxed", "write", path=str(outside), text="x") == (
            "refused: Read-only file system"
        )
        mcp_json = str(root / ".mcp.json")
        assert await call_text(m, "boxed", "write", path=mcp_json, text="{}") == (
            "refused: Read-only file system"
        )
        seen = json.loads(await call_text(m, "boxed", "environment"))
        assert not set(SECRETS) & set(seen)
        assert not outside.exists()
        # The same server unsandboxed does write there: the test can fail.
        assert await call_text(m, "free", "write", path=str(outside), text="x") == "written"
        inner = int(await call_text(m, "boxed", "pid"))
        boxed_pid = m.server("boxed").pid
    # The server runs in its own pid namespace (it does not see its host pid), and nothing of
    # it outlives the manager: bwrap is gone, and with it (--die-with-parent) the server.
    assert boxed_pid is not None
    assert inner != boxed_pid
    with pytest.raises(ProcessLookupError):
        os.kill(boxed_pid, 0)


@pytest.mark.asyncio
async def test_sandbox_true_fails_closed_when_the_sandbox_cannot_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from keel.permissions import sandbox

    monkeypatch.setattr(sandbox, "probe", lambda: sandbox.Probe(False, "no bubblewrap here"))
    servers = configs(tmp_path, {"boxed": {"command": PY, "args": [FEATURES], "sandbox": True}}, {})
    async with McpManager(servers, root=tmp_path, env=os.environ, log_dir=tmp_path / "l") as m:
        assert await m.wait_ready(10)
        status = m.server("boxed")
    assert (status.state, status.detail, status.pid) == (
        "failed",
        "sandbox: true, but the sandbox cannot run here: no bubblewrap here",
        None,
    )


# -- 3. list_changed and restarts -----------------------------------------------------------


@pytest.mark.asyncio
async def test_a_changed_tool_list_is_noticed_and_joins_at_the_next_context(
    tmp_path: Path,
) -> None:
    servers = configs(tmp_path, {"feat": {"command": PY, "args": [FEATURES]}}, {})
    async with McpManager(servers, root=tmp_path, env=os.environ, log_dir=tmp_path / "l") as m:
        assert await m.wait_ready(30)
        notices: list[tuple[str, str]] = []
        m.on_notice = lambda text, level: notices.append((text, level))
        agent = Agent(provider=ScriptedProvider([]), model="scripted", cwd=tmp_path)
        agent.add_tools(m.tools())
        before = list(agent.registry.names)
        assert "mcp__feat__extra" not in before
        assert await call_text(m, "feat", "grow") == "grown"
        for _ in range(100):
            if notices:
                break
            await asyncio.sleep(0.05)
        assert notices == [
            (
                'MCP server "feat" changed its tools (added extra); the new list is offered '
                "from the next fresh context (/clear)",
                "info",
            )
        ]
        # This context keeps its tools (the prompt prefix stays byte-stable) ...
        assert list(agent.registry.names) == before
        # ... the next one (a fresh agent built from the manager) has the new tool.
        assert "mcp__feat__extra" in [t.name for t in m.tools()]


@pytest.mark.asyncio
async def test_a_crashed_stdio_server_is_restarted_a_bounded_number_of_times(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mcp_client, "RESTART_DELAY", 0.05)
    servers = configs(tmp_path, {"phoenix": {"command": PY, "args": [FEATURES]}}, {})
    async with McpManager(
        servers, root=tmp_path, env=os.environ, log_dir=tmp_path / "l", max_restarts=2
    ) as m:
        assert await m.wait_ready(30)
        notices: list[str] = []
        m.on_notice = lambda text, level: notices.append(text)
        tools = {t.name: t for t in m.tools()}
        pid_tool = tools["mcp__phoenix__pid"]
        first = m.server("phoenix").pid
        for attempt in (1, 2):
            with pytest.raises(McpServerLost) as lost:
                await m.call("phoenix", "die", {})
            assert str(lost.value) == (
                'mcp server "phoenix" crashed during the call (exit code 3; last stderr line: '
                f"dying on request); keel is restarting it (attempt {attempt} of 2): try again "
                "in a moment"
            )
            for _ in range(200):
                if m.server("phoenix").state == "connected":
                    break
                await asyncio.sleep(0.05)
            status = m.server("phoenix")
            assert (status.state, status.restarts) == ("connected", attempt)
            # The tool keeps its name and the object built before the crash still works.
            assert text_of(await pid_tool.run(ctx(tmp_path), {})) == str(status.pid)
            assert status.pid != first
        assert notices == [
            'MCP server "phoenix" dropped (exited with code 3: dying on request); restarting '
            "it (attempt 1 of 2)",
            'MCP server "phoenix" is connected again',
            'MCP server "phoenix" dropped (exited with code 3: dying on request); restarting '
            "it (attempt 2 of 2)",
            'MCP server "phoenix" is connected again',
        ]
        with pytest.raises(McpServerLost) as final:
            await m.call("phoenix", "die", {})
        assert str(final.value).endswith("its tools are unavailable until keel restarts")
        await m.wait_ready(5)
        assert m.server("phoenix").state == "failed"


# -- 4. progress ----------------------------------------------------------------------------


@module_loop
async def test_progress_reaches_the_tool_card_as_events(manager: McpManager, project: Path) -> None:
    agent = Agent(
        provider=ScriptedProvider([reply("", ("mcp__feat__slow", {"steps": 3})), reply("done")]),
        model="scripted",
        tools=manager.tools(),
        cwd=project,
        gate=AllowAll(),  # about progress events, not permissions
    )
    wire(agent, manager)
    events: list[Event] = []
    await agent.run("go", events.append)
    seen = [e for e in events if isinstance(e, ToolStarted | ToolProgress | ToolFinished)]
    call_id = seen[0].call.id if isinstance(seen[0], ToolStarted) else ""
    assert [type(e).__name__ for e in seen] == [
        "ToolStarted",
        "ToolProgress",
        "ToolProgress",
        "ToolProgress",
        "ToolFinished",
    ]
    assert [e for e in seen if isinstance(e, ToolProgress)] == [
        ToolProgress(call_id, float(i), 3.0, f"step {i} of 3") for i in (1, 2, 3)
    ]


@module_loop
async def test_no_progress_token_without_a_card(manager: McpManager, project: Path) -> None:
    tool = {t.name: t for t in manager.tools()}["mcp__feat__slow"]
    heard: list[Any] = []
    manager.on_tool_progress = lambda *a: heard.append(a)
    token = current_call_id.set("call-7")
    try:
        assert text_of(await tool.run(ctx(project), {"steps": 2})) == "done"
    finally:
        current_call_id.reset(token)
        manager.on_tool_progress = None
    assert heard == [("call-7", 1.0, 2.0, "step 1 of 2"), ("call-7", 2.0, 2.0, "step 2 of 2")]


# -- 5. prompts as slash commands -----------------------------------------------------------


def sent_prompt(provider: ScriptedProvider) -> str:
    """The first request's prompt: the text block after the context that opens the message."""
    opening, prompt = provider.requests[0].messages[-1].blocks
    assert isinstance(opening, Text)
    assert opening.text.startswith("<context>\n<env>\n")
    assert opening.text.endswith("\n</context>")
    assert isinstance(prompt, Text)
    return prompt.text


@module_loop
async def test_a_prompt_runs_as_a_slash_command(manager: McpManager, project: Path) -> None:
    for typed, expected in [
        ("/mcp__feat__review src/a.py", "Review src/a.py looking for bugs."),
        ("/mcp__feat__review src/a.py style", "Review src/a.py looking for style."),
        ('/mcp__feat__review focus="dead code" b.py', "Review b.py looking for dead code."),
    ]:
        provider = ScriptedProvider([reply("ok")])
        agent = Agent(provider=provider, model="scripted", cwd=project)
        wire(agent, manager)
        result = await agent.run(typed)
        assert result.stop_reason == "end_turn"
        assert sent_prompt(provider) == expected


@module_loop
async def test_a_prompt_command_with_a_missing_argument_is_one_clear_error(
    manager: McpManager, project: Path
) -> None:
    agent = Agent(provider=ScriptedProvider([]), model="scripted", cwd=project)
    wire(agent, manager)
    result = await agent.run("/mcp__feat__review")
    assert (result.stop_reason, result.error) == (
        "error",
        "/mcp__feat__review: missing required argument(s) file "
        "(hint: usage: /mcp__feat__review <file> <focus> (or name=value))",
    )


# -- 6. resources ---------------------------------------------------------------------------


@module_loop
async def test_resource_tools_list_and_read(manager: McpManager, project: Path) -> None:
    tools = {t.name: t for t in build_resource_tools(manager)}
    assert sorted(tools) == ["list_mcp_resources", "read_mcp_resource"]
    assert all(t.read_only for t in tools.values())
    listing = await tools["list_mcp_resources"].run(ctx(project), {"server": "feat"})
    assert listing == ToolOutput(
        "feat notes://readme (readme, text/plain): The project notes.\n"
        "feat notes://logo (logo, image/png): A binary resource."
    )
    read = await tools["read_mcp_resource"].run(
        ctx(project), {"server": "feat", "uri": "notes://readme"}
    )
    assert read == ToolOutput("the notes say hello")
    binary = await tools["read_mcp_resource"].run(
        ctx(project), {"server": "feat", "uri": "notes://logo"}
    )
    assert binary == ToolOutput("[image/png resource notes://logo (108 bytes) omitted: binary]")


@module_loop
async def test_a_resource_mention_attaches_the_resource(manager: McpManager, project: Path) -> None:
    provider = ScriptedProvider([reply("ok")])
    agent = Agent(provider=provider, model="scripted", cwd=project)
    wire(agent, manager)
    await agent.run("summarise @feat:notes://readme, and mail me@example.com")
    assert sent_prompt(provider) == (
        "summarise @feat:notes://readme, and mail me@example.com\n\n"
        '<mcp-resource server="feat" uri="notes://readme">\n'
        "the notes say hello\n"
        "</mcp-resource>"
    )


# -- 7. roots -------------------------------------------------------------------------------


@module_loop
async def test_the_project_is_the_clients_root(manager: McpManager, project: Path) -> None:
    assert json.loads(await call_text(manager, "feat", "roots")) == [
        {"uri": project.resolve().as_uri(), "name": project.name}
    ]


# -- 8. sampling and elicitation ------------------------------------------------------------


def interactive_agent(
    project: Path, manager: McpManager, provider: ScriptedProvider, allow: bool
) -> tuple[Agent, list[PermissionRequest]]:
    asked: list[PermissionRequest] = []

    async def asker(request: PermissionRequest) -> PermissionReply:
        asked.append(request)
        return PermissionReply(allow, reason="" if allow else "not now")

    gate = PermissionGate(mode="default", root=project, cwd=project, asker=asker)
    agent = Agent(provider=provider, model="scripted", cwd=project, gate=gate)
    agent.interactive = agent.takes_questions = True
    wire(agent, manager)
    return agent, asked


@module_loop
async def test_sampling_is_refused_in_a_headless_run(manager: McpManager, project: Path) -> None:
    provider = ScriptedProvider([])
    agent = Agent(provider=provider, model="scripted", cwd=project)
    wire(agent, manager)
    said = await call_text(manager, "feat", "summarise", text="a long story")
    assert said == (
        'sampling refused: MCP server "feat" asked for a model completion (sampling); '
        'refused: nobody can approve it in a headless run (set "mcp_sampling": "allow" in '
        "your keel settings to allow it)"
    )
    assert provider.requests == []


@module_loop
async def test_sampling_asks_the_user_then_uses_the_sessions_model(
    manager: McpManager, project: Path
) -> None:
    provider = ScriptedProvider([reply("A story, briefly.")])
    _agent, asked = interactive_agent(project, manager, provider, allow=True)
    said = await call_text(manager, "feat", "summarise", text="a long story")
    assert said == "scripted said: A story, briefly."
    assert [(r.call.name, r.call.input, r.reason) for r in asked] == [
        (
            "mcp__feat__sampling",
            {"system": "Be brief.", "prompt": "Summarise: a long story", "max_tokens": 50},
            'MCP server "feat" asks to use your model (scripted) for a completion of up to '
            "50 tokens",
        )
    ]
    request = provider.requests[0]
    assert (request.system, [m.text for m in request.messages], request.tools) == (
        "Be brief.",
        ["Summarise: a long story"],
        (),
    )


@module_loop
async def test_sampling_declined_by_the_user(manager: McpManager, project: Path) -> None:
    provider = ScriptedProvider([])
    interactive_agent(project, manager, provider, allow=False)
    said = await call_text(manager, "feat", "summarise", text="x")
    assert said == "sampling refused: the user declined the sampling request: not now"
    assert provider.requests == []


@module_loop
async def test_sampling_allowed_by_setting_in_headless(manager: McpManager, project: Path) -> None:
    provider = ScriptedProvider([reply("short")])
    agent = Agent(provider=provider, model="scripted", cwd=project)
    wire(agent, manager, sampling="allow")
    assert await call_text(manager, "feat", "summarise", text="x") == "scripted said: short"


@module_loop
async def test_elicitation_is_refused_headless_and_asked_interactively(
    manager: McpManager, project: Path
) -> None:
    agent = Agent(provider=ScriptedProvider([]), model="scripted", cwd=project)
    wire(agent, manager)
    assert await call_text(manager, "feat", "favourite") == (
        'elicitation refused: MCP server "feat" asked the user a question (elicitation); '
        "refused: nobody can answer in a headless run"
    )
    questions: list[QuestionRequest] = []

    def answer(event: Event) -> None:
        if isinstance(event, QuestionRequest):
            questions.append(event)
            event.reply.set_result({"colour": "blue", "shade": 2})

    agent.interactive = agent.takes_questions = True
    agent.on_background_event = answer
    assert await call_text(manager, "feat", "favourite") == "accepted blue 2"
    assert [(q.source, q.message, sorted(q.schema["properties"])) for q in questions] == [
        ("feat", "Which colour?", ["colour", "shade"])
    ]


@module_loop
async def test_every_client_hears_how_a_question_ended(
    manager: McpManager, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`QuestionAnswered` follows each question (the other clients close its form): declined
    by the user, then left unanswered until the time ran out."""
    from keel.app import mcp_wiring

    agent = Agent(provider=ScriptedProvider([]), model="scripted", cwd=project)
    wire(agent, manager)
    seen: list[Event] = []
    declining = [True]

    def client(event: Event) -> None:
        seen.append(event)
        if isinstance(event, QuestionRequest) and declining[0]:
            event.reply.set_result(None)

    agent.interactive = agent.takes_questions = True
    agent.on_background_event = client
    assert await call_text(manager, "feat", "favourite") == "decline"
    declining[0] = False
    monkeypatch.setattr(mcp_wiring, "QUESTION_TIMEOUT", 0.2)
    late = await call_text(manager, "feat", "favourite")
    assert late == "elicitation refused: nobody answered within 0.2 s"
    asked = [e.request_id for e in seen if isinstance(e, QuestionRequest)]
    ended = [e for e in seen if isinstance(e, QuestionAnswered)]
    assert [(e.request_id, e.action, e.by) for e in ended] == [
        (asked[0], "decline", "user"),
        (asked[1], "refused", "no-answer"),
    ]
    assert [type(e).__name__ for e in seen] == ["QuestionRequest", "QuestionAnswered"] * 2
    assert ended[1].waited_ms >= 200
    assert agent.pending_questions() == []


@module_loop
async def test_elicitation_hooks_answer_for_the_user_and_change_the_answer(
    manager: McpManager, project: Path, tmp_path: Path
) -> None:
    from keel.hooks.config import HookCommand
    from keel.hooks.runner import HookRunner

    log = tmp_path / "elicitation.jsonl"
    answer = tmp_path / "answer.py"
    answer.write_text(
        f"#!{sys.executable}\nimport json, sys\n"
        "event = json.load(sys.stdin)\n"
        f"open({str(log)!r}, 'a').write(json.dumps(event) + '\\n')\n"
        "if event['hook_event_name'] == 'Elicitation':\n"
        "    content = {'colour': 'green', 'shade': 3}\n"
        "else:\n"
        "    content = {**event['content'], 'shade': 9}\n"
        "print(json.dumps({'hookSpecificOutput': {'hookEventName': event['hook_event_name'],"
        " 'action': 'accept', 'content': content}}))\n",
        encoding="utf-8",
    )
    answer.chmod(0o755)
    agent = Agent(provider=ScriptedProvider([]), model="scripted", cwd=project)
    agent.hooks = HookRunner(
        [HookCommand("Elicitation", "feat", str(answer), 10, "personal", "t")],
        project,
        project,
        {},
    )
    wire(agent, manager)
    # Headless, nobody could answer: the hook does.
    assert await call_text(manager, "feat", "favourite") == "accepted green 3"
    (asked,) = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
    assert {k: v for k, v in asked.items() if k not in ("session_id", "transcript_path")} == {
        "cwd": str(project),
        "permission_mode": "default",
        "hook_event_name": "Elicitation",
        "mcp_server_name": "feat",
        "message": "Which colour?",
        "mode": "form",
        "requested_schema": asked["requested_schema"],
    }
    assert sorted(asked["requested_schema"]["properties"]) == ["colour", "shade"]
    # The user answers; an ElicitationResult hook changes the answer before it goes back.
    notified = tmp_path / "notified.json"
    agent.hooks.hooks = [
        HookCommand("ElicitationResult", "", str(answer), 10, "personal", "t"),
        HookCommand("Notification", "elicitation_dialog", f"cat > {notified}", 10, "personal", "t"),
    ]

    def user(event: Event) -> None:
        if isinstance(event, QuestionRequest):
            event.reply.set_result({"colour": "blue", "shade": 2})

    agent.interactive = agent.takes_questions = True
    agent.on_background_event = user
    assert await call_text(manager, "feat", "favourite") == "accepted blue 9"
    told = json.loads(notified.read_text(encoding="utf-8"))
    assert (told["notification_type"], told["message"]) == (
        "elicitation_dialog",
        "MCP server feat asks: Which colour?",
    )
    result = json.loads(log.read_text(encoding="utf-8").splitlines()[-1])
    assert (result["hook_event_name"], result["action"], result["content"]) == (
        "ElicitationResult",
        "accept",
        {"colour": "blue", "shade": 2},
    )


# -- 9. ~/.claude.json ----------------------------------------------------------------------


def test_claude_json_user_and_local_servers(tmp_path: Path) -> None:
    home, root = tmp_path / "home", tmp_path / "proj"
    root.mkdir()
    claude = write_json(
        home / ".claude.json",
        {
            "mcpServers": {"mine": {"command": "a"}, "both": {"command": "user-level"}},
            "projects": {
                str(root): {"mcpServers": {"both": {"command": "local-level"}}},
                "/elsewhere": {"mcpServers": {"other": {"command": "x"}}},
            },
            "numStartups": 4,
        },
    )
    write_json(root / ".mcp.json", {"mcpServers": {"both": {"command": "project-level"}}})
    servers, warnings = load_servers(root, [], {}, home=home)
    assert warnings == []
    assert [(s.name, s.command, s.source, s.origin, s.needs_approval) for s in servers] == [
        ("both", "local-level", "project-local", str(claude), False),
        ("mine", "a", "user", str(claude), False),
    ]
    # Without `home` (tests, `keel mcp` on a bare project) it is not read.
    assert [s.name for s in load_servers(root, [], {})[0]] == ["both"]


def test_a_broken_claude_json_is_named(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / ".claude.json").write_text("{oops", encoding="utf-8")
    servers, warnings = load_servers(tmp_path, [], {}, home=home)
    assert servers == []
    assert warnings == [
        f"{home / '.claude.json'}:1:2: invalid JSON (Expecting property name enclosed in double "
        "quotes); no MCP servers loaded from it"
    ]


# -- the reference server (npm) -------------------------------------------------------------

needs_everything = pytest.mark.skipif(
    not (shutil.which("node") and EVERYTHING.is_file()),
    reason="node or @modelcontextprotocol/server-everything is missing "
    "(npm ci --prefix tests/mcp_servers/node)",
)


@needs_everything
@pytest.mark.asyncio
async def test_the_reference_server_everything(tmp_path: Path) -> None:
    env = {**os.environ, **SECRETS}
    servers = configs(
        tmp_path, {"every": {"command": "node", "args": [str(EVERYTHING), "stdio"]}}, env
    )
    async with McpManager(servers, root=tmp_path, env=env, log_dir=tmp_path / "l") as m:
        assert await m.wait_ready(30)
        status = m.server("every")
        assert status.state == "connected", status.detail
        # 1. its environment has none of keel's keys
        seen = json.loads(await call_text(m, "every", "get-env"))
        assert not set(SECRETS) & set(seen)
        # 4. progress
        heard: list[tuple[float, float | None, str | None]] = []
        await m.call(
            "every",
            "trigger-long-running-operation",
            {"duration": 0.3, "steps": 3},
            on_progress=lambda p, t, msg: heard.append((p, t, msg)),
        )
        assert [(p, t) for p, t, _ in heard] == [(1, 3), (2, 3), (3, 3)]
        # 5. prompts, arguments in order or by name
        provider = ScriptedProvider([reply("ok"), reply("ok")])
        agent = Agent(provider=provider, model="scripted", cwd=tmp_path)
        wire(agent, m)
        assert "mcp__every__args-prompt" in agent.mcp_prompts.commands()  # type: ignore[union-attr]
        await agent.run("/mcp__every__args-prompt Paris")
        await agent.run("/mcp__every__args-prompt state=Texas Austin")
        sent = [r.messages[-1].text for r in provider.requests]
        assert "Paris" in sent[0]
        assert "Austin" in sent[1]
        assert "Texas" in sent[1]
        # 6. resources
        listed = await m.list_resources("every")
        assert listed
        first = listed[0]
        assert (await m.read_resource("every", first.uri))[0].uri == first.uri
        # 7. roots: the server asks for them after it connected
        roots = await call_text(m, "every", "get-roots-list")
        assert tmp_path.resolve().as_uri() in roots


# -- end to end: keel -p with a user server from ~/.claude.json -------------------------------


def test_keel_p_runs_a_claude_json_server_without_keys_and_expands_its_prompt(
    project: Path, tmp_path: Path
) -> None:
    """Through `keel -p` as a user runs it: the server comes from Claude Code's ~/.claude.json
    (user scope: no approval), sees none of the keys in keel's environment, and its prompt
    expands as a slash command."""
    import subprocess

    home = Path(os.environ["HOME"])
    write_json(
        home / ".claude.json",
        {"mcpServers": {"feat": {"command": PY, "args": [FEATURES], "env": {"DECLARED": "1"}}}},
    )
    script = write_json(
        tmp_path / "s.json",
        {
            "model": "test",
            "turns": [
                {"tool_calls": [{"name": "mcp__feat__environment", "input": {}}]},
                {"text": "checked"},
            ],
        },
    )
    out = subprocess.run(
        [sys.executable, "-m", "keel", "-p", "/mcp__feat__review main.py",
         "--model", f"scripted:{script}", "--output-format", "stream-json"],
        cwd=project, capture_output=True, text=True, timeout=90,
        env={**os.environ, **SECRETS},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    finished = [e for e in lines if e.get("type") == "tool_finished"]
    assert [(e["name"], e["is_error"]) for e in finished] == [("mcp__feat__environment", False)]
    seen = json.loads(finished[0]["output"])
    assert not set(SECRETS) & set(seen)
    assert seen["DECLARED"] == "1"
    result = lines[-1]
    assert (result["type"], result["result"]) == ("result", "checked")
    session = Path(result["session_path"]).read_text(encoding="utf-8")
    records = [json.loads(x) for x in session.splitlines()]
    users = [r for r in records if r["type"] == "user"]
    assert json.dumps(users[0]).count("Review main.py looking for bugs.") == 1


@pytest.mark.asyncio
async def test_an_http_server_that_went_away_is_reconnected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket
    import subprocess
    from time import sleep as time_sleep

    from tests.helpers import free_port

    monkeypatch.setattr(mcp_client, "RESTART_DELAY", 0.2)
    port = free_port()

    def serve() -> subprocess.Popen[bytes]:
        with (tmp_path / "http.log").open("ab") as log:
            process = subprocess.Popen([PY, FEATURES, "http", str(port)], stdout=log, stderr=log)
        for _ in range(200):
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.1):
                    return process
            except OSError:
                time_sleep(0.05)
        process.kill()
        raise AssertionError("the http test server did not start")

    first = serve()
    servers = configs(
        tmp_path, {"web": {"type": "http", "url": f"http://127.0.0.1:{port}/mcp"}}, {}
    )
    second: subprocess.Popen[bytes] | None = None
    try:
        async with McpManager(servers, root=tmp_path, env={}, log_dir=tmp_path / "l") as m:
            assert await m.wait_ready(30)
            assert await call_text(m, "web", "pid") == str(first.pid)
            first.kill()
            first.wait()
            second = serve()
            # The first call after the drop fails (the session is gone) and starts the
            # reconnect; the tool's name keeps working once it is back.
            with pytest.raises(McpServerLost):
                await m.call("web", "pid", {})
            for _ in range(200):
                if m.server("web").state == "connected":
                    break
                await asyncio.sleep(0.05)
            assert (m.server("web").state, m.server("web").restarts) == ("connected", 1)
            assert await call_text(m, "web", "pid") == str(second.pid)
    finally:
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()


def test_mcp_sampling_allow_only_from_the_users_own_settings(tmp_path: Path) -> None:
    """The attack: a repository's settings turn on unattended sampling, so any server it
    brings can spend the user's model in headless runs."""
    from keel.config.settings import load_settings, user_config_dir

    project = tmp_path / "repo"
    write_json(project / ".keel" / "settings.json", {"mcp_sampling": "allow"})
    shared = load_settings(project)
    assert shared.mcp_sampling == "ask"
    assert [w for w in shared.warnings if "mcp_sampling" in w] == [
        f"{project / '.keel' / 'settings.json'}: mcp_sampling ignored: only your own settings "
        "may allow sampling"
    ]
    write_json(user_config_dir() / "settings.json", {"mcp_sampling": "allow"})
    assert load_settings(project).mcp_sampling == "allow"
    write_json(project / ".keel" / "settings.json", {"mcp_sampling": "deny"})
    assert load_settings(project).mcp_sampling == "deny"  # a project may tighten it
