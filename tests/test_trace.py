"""Debug traces (keel.trace): a real Agent against real loopback servers, the trace read back.

- no tracer: the caller's own sink object reaches the loop (nothing wraps it);
- delta round trip: every request rebuilt from the trace re-encodes to the exact bytes the
  server received, over turns, a tool round, a subagent and a compaction;
- redaction: for every provider keel has (and the azure `api-key` / `?key=` styles), a real
  key is sent and its bytes appear nowhere under the trace folder;
- 0700 / 0600, numbering continued on reopen, retention, a retried request, hooks, permissions.
"""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path
from typing import Any

import pytest

import keel.trace as trace
from keel.agent.events import Event
from keel.agent.loop import Agent
from keel.agent.subagents import enable_subagents, load_agent_types
from keel.hooks.config import HookCommand
from keel.hooks.runner import HookRunner
from keel.llm.catalog import parse_model
from keel.llm.http import HTTPProvider, HTTPSettings
from keel.llm.messages import Message, Text
from keel.llm.provider import Provider, RetryingProvider, RetryPolicy, make_provider
from keel.llm.providers.anthropic import AnthropicProvider
from keel.llm.providers.openai_chat import OpenAIChatProvider
from keel.llm.providers.scripted import ScriptedProvider
from keel.llm.request import Request
from keel.permissions import AllowAll
from keel.permissions.gate import PermissionGate
from keel.permissions.rules import parse_rule
from keel.session.store import SessionLog
from keel.testing.anthropic_server import AnthropicServer
from keel.testing.gemini_server import GeminiServer
from keel.testing.ollama_server import OllamaServer
from keel.testing.openai_server import OpenAIChatServer, OpenAIResponsesServer
from keel.testing.script import Fault, Reply, reply
from keel.testing.server import ScriptedHTTPServer
from keel.tools.builtin import builtin_tools
from keel.trace.redact import REDACTED, redact_headers, redact_url
from keel.trace.retention import prune
from keel.trace.tracer import Tracer

KEY = "sk-test-Zq8VwX3kLmN0pRt5"
FAST = RetryPolicy(attempts=3, base=0.01, jitter=0.0)


def agent_for(
    provider: Provider, project: Path, *, model: str = "claude-sonnet-4-5", **kw: Any
) -> Agent:
    kw.setdefault("gate", AllowAll())
    return Agent(
        provider=provider,
        model=model,
        tools=kw.pop("tools", builtin_tools()),
        cwd=project,
        system="the system prompt",
        **kw,
    )


def anthropic_agent(server: AnthropicServer, project: Path, **kw: Any) -> Agent:
    env = {"ANTHROPIC_API_KEY": KEY, "ANTHROPIC_BASE_URL": server.url}
    provider = make_provider(parse_model("anthropic/claude-sonnet-4-5"), env=env, retry=FAST)
    return agent_for(provider, project, env=env, **kw)


def files_under(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def tracer_of(agent: Agent) -> object:
    return agent.tracer


def kinds(records: list[dict[str, Any]]) -> list[str]:
    return [r["kind"] for r in records]


# -- no tracer: nothing wraps the caller's sink ----------------------------------------------------


async def test_without_a_tracer_the_loop_gets_the_callers_own_sink(project: Path) -> None:
    seen: list[object] = []
    agent: Agent

    def check(_request: Request) -> None:
        seen.append(agent._emit)

    provider = ScriptedProvider([Reply(Message("assistant", (Text("hi"),)), expect=check)])
    agent = agent_for(provider, project, model="scripted")
    events: list[Event] = []
    sink = events.append
    await agent.run("hello", sink)
    assert agent.tracer is None
    assert len(seen) == 1
    assert seen[0] is sink

    # And with a tracer, the loop's sink is the tracer's wrapper (the test above can fail).
    provider.steps.append(Reply(Message("assistant", (Text("again"),)), expect=check))
    tracer = trace.attach(agent, directory=project / "t.trace")
    await agent.run("again", sink)
    assert seen[1] is not sink
    tracer.close()


# -- the delta round trip -----------------------------------------------------------------------


def test_delta_round_trip_rebuilds_every_request_byte_for_byte(project: Path) -> None:
    import asyncio

    script = [
        # prompt 1: a tool round
        reply("", ("read", {"path": "util.py"})),
        reply("X is 1."),
        # prompt 2: a subagent (explore) with a tool round of its own
        reply(
            "",
            (
                "task",
                {"description": "find main", "prompt": "find main", "subagent_type": "explore"},
            ),
        ),
        reply("", ("grep", {"pattern": "def main"})),
        reply("main is in app.py."),
        reply("The subagent found it."),
        # /compact
        reply("<summary>We read util.py and found main.</summary>"),
        # prompt 3, after the compaction (a reset)
        reply("Still here."),
    ]

    async def run(server: AnthropicServer) -> Path:
        agent = anthropic_agent(server, project)
        agent.session = SessionLog.create(
            cwd=project, model="anthropic/claude-sonnet-4-5", directory=project.parent / "s"
        )
        enable_subagents(agent, load_agent_types(project, user_dir=None, home=project / "nh"))
        tracer = trace.attach(agent)
        assert tracer.directory == agent.session.path.with_name(f"{agent.session.id}.trace")
        await agent.run("what is X?")
        await agent.run("where is main?")
        await agent.compact()
        await agent.run("still there?")
        await agent.aclose()
        tracer.close()
        return tracer.directory

    with AnthropicServer(script, api_key=KEY) as server:
        directory = asyncio.run(run(server))
        received = [r.body for r in server.model_requests]

    records = trace.read(directory)
    requests = [r for r in records if r["kind"] == "request"]
    assert [(r.get("agent", ""), r["data"]["purpose"], r["data"]["reset"]) for r in requests] == [
        ("", "turn", True),
        ("", "turn", False),
        ("", "turn", False),
        ("explore", "turn", True),
        ("explore", "turn", False),
        ("", "turn", False),
        ("", "compaction", False),
        ("", "turn", True),
    ]
    # Only what is new travels: the second request of a context carries two messages.
    assert [r["data"]["messages_total"] for r in requests] == [1, 3, 5, 1, 3, 7, 9, 1]
    assert [len(r["data"]["messages"]) for r in requests] == [1, 2, 2, 1, 2, 2, 2, 1]
    # The subagent's records name the `task` call that started it.
    task_id = next(
        r["data"]["id"]
        for r in records
        if r["kind"] == "tool_start" and r["data"]["name"] == "task"
    )
    assert {r.get("parent") for r in records if r.get("agent") == "explore"} == {task_id}
    # System prompts and tool lists in full once per hash.
    assert sum("system" in r["data"] for r in requests) == 2  # parent's, explore's
    assert sum("tools" in r["data"] for r in requests) == 2

    rebuilt = trace.rebuild_requests(records)
    assert [agent for agent, _ in rebuilt] == [r.get("agent", "") for r in requests]
    adapter = AnthropicProvider(base_url="http://unused", api_key="", settings=HTTPSettings())
    encoded = [adapter.build_body(request) for _, request in rebuilt]
    assert len(encoded) == len(received) == 8
    for index, (mine, theirs) in enumerate(zip(encoded, received, strict=True)):
        assert mine == theirs, f"request {index + 1} differs"
    # The http bodies are the bytes sent, one per request here (no retries).
    http = [r for r in records if r["kind"] == "http"]
    assert [r["req"] for r in http] == [r["req"] for r in requests]
    bodies = trace.http_bodies(directory, records)
    assert [bodies[r["data"]["n"]] for r in http] == received
    # A body that repeats the one before it as a prefix is written as what it adds: the first
    # of each context in full, the rest as tails (the trace stays linear in the session).
    assert ["request_file" in r["data"] for r in http] == [
        True,
        False,
        False,
        True,  # the subagent's first
        False,
        False,
        True,  # the compaction request: another max_tokens near the start of the body
        True,  # after the compaction
    ]
    tails = [r["data"]["request_delta"] for r in http if "request_delta" in r["data"]]
    assert all((directory / d["file"]).stat().st_size < 4096 for d in tails)


# -- redaction, for every provider ----------------------------------------------------------------


class _AzureStyle(OpenAIChatProvider):
    """Azure OpenAI's way of sending a key: an `api-key` header; and the `?key=` URL style."""

    name = "azure"

    def headers(self) -> dict[str, str]:
        return {"api-key": self.api_key}

    def endpoint(self, request: Request) -> str:
        return f"{self.base_url}/chat/completions?api-version=2024-10-21&key={self.api_key}"


def _provider_case(name: str, server: ScriptedHTTPServer) -> tuple[Provider, str]:
    url = server.url
    if name == "azure":
        settings = HTTPSettings()
        inner = _AzureStyle(base_url=url, api_key=KEY, settings=settings)
        return RetryingProvider(inner, FAST), "gpt-4.1"
    model, env = {
        "anthropic": ("anthropic/claude-sonnet-4-5", {"ANTHROPIC_API_KEY": KEY}),
        "anthropic-bearer": ("anthropic/claude-sonnet-4-5", {"ANTHROPIC_AUTH_TOKEN": KEY}),
        "openai": ("openai/gpt-5", {"OPENAI_API_KEY": KEY}),
        "openai-chat": ("openai-compatible/some-model", {"OPENAI_COMPATIBLE_API_KEY": KEY}),
        "openrouter": ("openrouter/some/model", {"OPENROUTER_API_KEY": KEY}),
        "gemini": ("gemini/gemini-2.5-flash", {"GEMINI_API_KEY": KEY}),
        "ollama": ("ollama/qwen3:8b", {"OLLAMA_API_KEY": KEY}),
    }[name]
    url_env = {
        "anthropic": "ANTHROPIC_BASE_URL",
        "anthropic-bearer": "ANTHROPIC_BASE_URL",
        "openai": "OPENAI_BASE_URL",
        "openai-chat": "OPENAI_COMPATIBLE_BASE_URL",
        "openrouter": "OPENROUTER_BASE_URL",
        "gemini": "GEMINI_BASE_URL",
        "ollama": "OLLAMA_HOST",
    }[name]
    ref = parse_model(model)
    return make_provider(ref, env={**env, url_env: url}, retry=FAST), ref.model


def _http_client(provider: object) -> HTTPProvider:
    """The wire client under the retry (and salvage) wrappers."""
    while not isinstance(provider, HTTPProvider):
        provider = getattr(provider, "inner")  # noqa: B009
    return provider


SERVERS: dict[str, type[ScriptedHTTPServer]] = {
    "anthropic": AnthropicServer,
    "anthropic-bearer": AnthropicServer,
    "openai": OpenAIResponsesServer,
    "openai-chat": OpenAIChatServer,
    "openrouter": OpenAIChatServer,
    "gemini": GeminiServer,
    "ollama": OllamaServer,
    "azure": OpenAIChatServer,
}
#: Where each provider puts the key (what the trace must show redacted).
KEY_AT = {
    "anthropic": ("x-api-key", REDACTED),
    "anthropic-bearer": ("authorization", f"Bearer {REDACTED}"),
    "openai": ("authorization", f"Bearer {REDACTED}"),
    "openai-chat": ("authorization", f"Bearer {REDACTED}"),
    "openrouter": ("authorization", f"Bearer {REDACTED}"),
    "gemini": ("x-goog-api-key", REDACTED),
    "ollama": ("authorization", f"Bearer {REDACTED}"),
    "azure": ("api-key", REDACTED),
}


@pytest.mark.parametrize("name", list(SERVERS))
def test_a_real_key_appears_nowhere_in_the_trace(name: str, project: Path) -> None:
    import asyncio

    script = [reply("", ("read", {"path": "util.py"})), reply("done")]
    directory = project / "t.trace"

    adapters: list[HTTPProvider] = []

    async def run(server: ScriptedHTTPServer) -> None:
        provider, model = _provider_case(name, server)
        adapters.append(_http_client(provider))
        agent = agent_for(provider, project, model=model)
        tracer = trace.attach(agent, directory=directory)
        result = await agent.run("read util.py")
        assert result.stop_reason == "end_turn", result.error
        await agent.aclose()
        tracer.close()

    with SERVERS[name](script) as server:
        asyncio.run(run(server))
        sent = server.model_requests
    # Every wire API: the requests rebuilt from the trace encode to the bytes the server got.
    records = trace.read(directory)
    rebuilt = [adapters[0].build_body(r) for _, r in trace.rebuild_requests(records)]
    assert rebuilt == [r.body for r in sent]
    # The attack is real: the key went over the wire, in a header (and the URL for azure).
    assert len(sent) == 2
    header, shown = KEY_AT[name]
    assert KEY in sent[0].headers[header]
    if name == "azure":
        assert f"key={KEY}" in sent[0].path
    for path, data in files_under(directory).items():
        assert KEY.encode() not in data, f"the key leaked into {path}"
    http = [r["data"] for r in trace.read(directory) if r["kind"] == "http"]
    assert len(http) == 2
    assert http[0]["request_headers"][header] == shown
    assert http[0]["status"] == 200
    if name == "azure":
        assert http[0]["url"].endswith(f"?api-version=2024-10-21&key={REDACTED}")


def test_redaction_rules() -> None:
    assert redact_headers(
        {
            "Authorization": "Bearer abc",
            "X-Api-Key": "k1",
            "api-key": "k2",
            "x-goog-api-key": "k3",
            "Proxy-Authorization": "Basic dXNlcjpwYXNz",
            "Cookie": "session=s1",
            "set-cookie": "a=b",
            "x-portkey-api-key": "k4",
            "anthropic-version": "2023-06-01",
        }
    ) == {
        "authorization": "Bearer [redacted]",
        "x-api-key": "[redacted]",
        "api-key": "[redacted]",
        "x-goog-api-key": "[redacted]",
        "proxy-authorization": "Basic [redacted]",
        "cookie": "[redacted]",
        "set-cookie": "[redacted]",
        "x-portkey-api-key": "[redacted]",
        "anthropic-version": "2023-06-01",
    }
    assert redact_headers([("set-cookie", "a=1"), ("set-cookie", "b=2")]) == {
        "set-cookie": "[redacted], [redacted]"
    }
    assert (
        redact_url("https://h/v1/x?alt=sse&key=K&api_key=A&apikey=B&token=T&access_token=C&sig=S")
        == "https://h/v1/x?alt=sse&key=[redacted]&api_key=[redacted]&apikey=[redacted]"
        "&token=[redacted]&access_token=[redacted]&sig=[redacted]"
    )
    assert redact_url("https://user:pw@h/p?alt=sse") == "https://[redacted]@h/p?alt=sse"
    assert redact_url("http://127.0.0.1:1/api/chat") == "http://127.0.0.1:1/api/chat"


# -- the folder: permissions, numbering, retention -------------------------------------------------


def _two_prompts(server: AnthropicServer, project: Path, directory: Path | None) -> Tracer:
    import asyncio

    async def run() -> Tracer:
        agent = anthropic_agent(server, project)
        tracer = trace.attach(agent, directory=directory)
        await agent.run("one")
        await agent.aclose()
        tracer.close()
        return tracer

    return asyncio.run(run())


def test_folder_0700_files_0600_and_reopening_continues_numbering(project: Path) -> None:
    directory = project / "deep" / "t.trace"
    with AnthropicServer([reply("first"), reply("second")], api_key=KEY) as server:
        old_umask = os.umask(0o022)
        try:
            _two_prompts(server, project, directory)
            first = trace.read(directory)
            # A torn last line (a crash mid-write) is cut off before the next opening appends.
            with (directory / "events.jsonl").open("ab") as f:
                f.write(b'{"seq": 99, "kind": "no')
            _two_prompts(server, project, directory)
        finally:
            os.umask(old_umask)
    records = trace.read(directory)
    assert [r["seq"] for r in records] == list(range(1, len(records) + 1))
    assert records[: len(first)] == first
    second = records[len(first) :]
    assert kinds(second) == ["session", "turn_start", "request", "http", "response", "turn_end"]
    assert second[0]["data"]["reopened"] is True
    assert [r["req"] for r in records if r["kind"] == "request"] == [1, 2]
    assert [r["data"]["n"] for r in records if r["kind"] == "http"] == [1, 2]
    # After reopening, the first request of an agent carries everything again; the system
    # prompt and tools, already in the trace, only by hash.
    reopened_request = second[2]["data"]
    assert reopened_request["reset"] is True
    assert "system" not in reopened_request
    assert "tools" not in reopened_request
    assert len(trace.rebuild_requests(records)) == 2
    for path in [directory, *directory.rglob("*")]:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o700 if path.is_dir() else 0o600), f"{path}: {oct(mode)}"
    assert stat.S_IMODE((project / "deep").stat().st_mode) == 0o700


def test_retention_prunes_old_traces_across_projects(isolated_env: Path, tmp_path: Path) -> None:
    home = isolated_env
    old, fresh = time.time() - 20 * 86_400, time.time() - 2 * 86_400

    def make(folder: Path, when: float) -> Path:
        folder.mkdir(parents=True)
        (folder / "events.jsonl").write_text("{}\n", encoding="utf-8")
        os.utime(folder / "events.jsonl", (when, when))
        return folder

    a_old = make(home / "sessions" / "proj-a" / "s1.trace", old)
    a_new = make(home / "sessions" / "proj-a" / "s2.trace", fresh)
    b_old = make(home / "sessions" / "proj-b" / "s3.trace", old)
    lone_old = make(home / "traces" / "s4.trace", old)
    session = home / "sessions" / "proj-a" / "s1.jsonl"
    session.write_text("{}\n", encoding="utf-8")
    os.utime(session, (old, old))
    # A link named like a trace, pointing at something the user keeps: never followed.
    precious = make(tmp_path / "precious", old)
    (home / "sessions" / "proj-b" / "link.trace").symlink_to(precious)

    removed = prune(14)
    assert sorted(removed) == sorted([a_old, b_old, lone_old])
    assert a_new.is_dir()
    assert session.is_file()
    assert (precious / "events.jsonl").is_file()
    assert prune(1, keep=a_new) == []  # the trace being opened is never pruned
    assert prune(1) == [a_new]

    # attach() prunes with the retention it is given.
    again = make(home / "traces" / "s5.trace", old)
    agent = agent_for(ScriptedProvider([]), tmp_path, model="scripted")
    tracer = trace.attach(agent, retention_days=30)
    assert again.is_dir()
    trace.attach(agent, retention_days=14)
    assert not again.exists()
    assert tracer.closed  # attaching again replaced the first tracer
    trace.detach(agent)
    assert agent.tracer is None


# -- a retried request ------------------------------------------------------------------------


def test_a_retried_request_is_one_req_with_two_http_records(project: Path) -> None:
    directory = project / "t.trace"
    with AnthropicServer([Fault("status", status=529), reply("ok")], api_key=KEY) as server:
        _two_prompts(server, project, directory)
        bodies = [r.body for r in server.model_requests]
    records = trace.read(directory)
    assert kinds(records) == [
        "session",
        "turn_start",
        "request",
        "http",
        "notice",
        "http",
        "response",
        "turn_end",
    ]
    first, second = (r for r in records if r["kind"] == "http")
    assert (first["req"], second["req"]) == (1, 1)
    assert (first["data"]["status"], second["data"]["status"]) == (529, 200)
    assert (first["data"]["attempt"], second["data"]["attempt"]) == (1, 2)
    assert (directory / first["data"]["request_file"]).read_bytes() == bodies[0]
    # The retry sent the same bytes: all of them kept from the first attempt, no tail.
    assert second["data"]["request_delta"] == {
        "base": 1,
        "keep": len(bodies[1]),
        "file": "http/0002-request.tail",
    }
    assert (directory / "http/0002-request.tail").read_bytes() == b""
    assert trace.http_bodies(directory, records) == {1: bodies[0], 2: bodies[1]}
    error_body = json.loads((directory / first["data"]["response_file"]).read_bytes())
    assert error_body["type"] == "error"
    sse = (directory / second["data"]["response_file"]).read_text(encoding="utf-8")
    assert sse.startswith("event: message_start")
    assert "message_stop" in sse
    assert second["data"]["bytes_received"] == len(sse.encode())
    assert second["data"]["bytes_sent"] == len(bodies[1])
    response = next(r for r in records if r["kind"] == "response")
    assert response["req"] == 1
    assert response["data"]["attempts"] == 2
    assert response["data"]["message"]["content"] == [{"type": "text", "text": "ok"}]


# -- hooks and permissions ----------------------------------------------------------------------


def test_hooks_and_permission_decisions_are_recorded(project: Path) -> None:
    import asyncio

    directory = project / "t.trace"
    script = [
        reply("", ("bash", {"command": "echo hi"}), ("write", {"path": "x.txt", "content": "x"})),
        reply("done"),
    ]

    def hook(event: str, command: str, matcher: str = "") -> HookCommand:
        return HookCommand(event, matcher, command, 10.0, "personal", "settings.json")

    async def run(server: AnthropicServer) -> None:
        gate = PermissionGate(
            mode="default",
            root=project,
            cwd=project,
            rules=[parse_rule("write", "deny", "test")],
        )
        agent = anthropic_agent(server, project, gate=gate)
        agent.hooks = HookRunner(
            [
                hook("UserPromptSubmit", "echo context"),
                hook("PreToolUse", "echo no >&2; exit 2", "bash"),
            ],
            cwd=project,
            project_dir=project,
            env=dict(os.environ),
        )
        tracer = trace.attach(agent, directory=directory)
        await agent.run("go")
        await agent.aclose()
        tracer.close()

    with AnthropicServer(script, api_key=KEY) as server:
        asyncio.run(run(server))
    records = trace.read(directory)
    hooks = [(r.get("req"), r["data"]) for r in records if r["kind"] == "hook"]
    for _, data in hooks:
        assert data.pop("duration_ms") >= 0
        assert data.pop("started_at") > 0
    assert hooks == [
        (
            None,
            {
                "event": "UserPromptSubmit",
                "target": "",
                "command": "echo context",
                "hook_kind": "command",
                "exit_code": 0,
                "blocked": False,
                "halted": False,
            },
        ),
        (
            1,
            {
                "event": "PreToolUse",
                "target": "bash",
                "command": "echo no >&2; exit 2",
                "hook_kind": "command",
                "exit_code": 2,
                "blocked": True,
                "halted": False,
            },
        ),
    ]
    permissions = [r["data"] for r in records if r["kind"] == "permission"]
    calls = next(r["data"]["message"]["content"] for r in records if r["kind"] == "response")
    write_id = next(c["id"] for c in calls if c["type"] == "tool_use" and c["name"] == "write")
    # Neither call ran: the hook blocked bash, the rule denied write.
    assert [r["data"]["name"] for r in records if r["kind"] == "tool_start"] == []
    assert permissions == [
        {
            "request_id": "",
            "tool_use_id": write_id,
            "tool": "write",
            "reason": "denied by rule write (test)",
            "suggestion": "",
            "allow": False,
            "scope": "once",
            "by": "rule",
            "source": "rule",
            "waited_ms": 0.0,
        }
    ]


def test_enabled_by_flag_env_or_setting() -> None:
    from keel.config.settings import Settings

    off, on = Settings(), Settings(debug=True)
    assert trace.enabled(off, {}, False) is False
    assert trace.enabled(off, {}, True) is True
    assert trace.enabled(off, {"KEEL_DEBUG": "1"}, False) is True
    assert trace.enabled(off, {"KEEL_DEBUG": "0"}, False) is False
    assert trace.enabled(on, {}, False) is True
    assert trace.enabled(None, {}, False) is False


def test_settings_debug_and_retention_are_yours_only(project: Path, isolated_env: Path) -> None:
    from keel.config.settings import load_settings

    user = isolated_env / "config" / "settings.json"
    user.parent.mkdir(parents=True, exist_ok=True)
    user.write_text(json.dumps({"debug": True, "trace_retention_days": 3}), encoding="utf-8")
    shared = project / ".keel" / "settings.json"
    shared.parent.mkdir()
    shared.write_text(json.dumps({"debug": False, "trace_retention_days": 1}), encoding="utf-8")
    settings = load_settings(project)
    assert (settings.debug, settings.trace_retention_days) == (True, 3)
    assert [w for w in settings.warnings if "only your own settings" in w] == [
        f"{shared}: debug ignored: only your own settings may set it",
        f"{shared}: trace_retention_days ignored: only your own settings may set it",
    ]
    user.write_text(json.dumps({"debug": "yes", "trace_retention_days": 0}), encoding="utf-8")
    shared.unlink()
    settings = load_settings(project)
    assert (settings.debug, settings.trace_retention_days) == (False, 14)
    assert settings.warnings == [
        f"{user}: debug must be true or false; ignored",
        f"{user}: trace_retention_days must be at least 1 and at most 36500 (got 0); ignored",
    ]


async def test_debug_command_turns_tracing_on_and_off_and_follow_keeps_it(
    project: Path, isolated_env: Path
) -> None:
    from keel.errors import UserError
    from keel.tui.commands import debug_command

    provider = ScriptedProvider([reply("one"), reply("two")])
    agent = agent_for(provider, project, model="scripted")
    assert debug_command(agent, "") == "Debug trace is **off** (`/debug on` starts one)."
    on = debug_command(agent, "on")
    folder = isolated_env / "traces" / f"{agent.session_id}.trace"
    assert on == f"Debug trace **on**: writing to `{folder}` (view it with `keel trace`)."
    await agent.run("hello")
    assert debug_command(agent, "") == f"Debug trace is **on**: `{folder}` (`/debug off` stops it)."
    assert kinds(trace.read(folder)) == ["session", "turn_start", "request", "response", "turn_end"]

    # The front end replaces the agent (/clear): the new one is traced into its own folder.
    new = agent_for(provider, project, model="scripted")
    follower = trace.follow(agent, new)
    assert follower is not None
    assert agent.tracer is None
    assert new.tracer is follower
    assert follower.directory == isolated_env / "traces" / f"{new.session_id}.trace"
    await new.run("again")
    assert kinds(trace.read(follower.directory))[-1] == "turn_end"
    assert trace.follow(agent, new) is None  # the old one is no longer traced

    off = debug_command(new, "off")
    assert off == f"Debug trace **off**; what was written stays in `{follower.directory}`."
    assert tracer_of(new) is None
    assert debug_command(new, "off") == "Debug trace is already off."
    with pytest.raises(UserError, match="/debug loud: unknown"):
        debug_command(new, "loud")


def test_keel_p_debug_writes_a_trace_beside_the_session_that_resume_continues(
    project: Path, isolated_env: Path
) -> None:
    import subprocess
    import sys

    MODEL = "anthropic/claude-sonnet-4-5"

    def keel(*args: str, url: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "ANTHROPIC_API_KEY": KEY, "ANTHROPIC_BASE_URL": url}
        return subprocess.run(
            [sys.executable, "-m", "keel", "-p", "--debug", "-m", MODEL, *args],
            cwd=project,
            input="",
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )

    script = [reply("", ("read", {"path": "util.py"})), reply("X is 1."), reply("Yes.")]
    with AnthropicServer(script, api_key=KEY) as server:
        first = keel("what is X?", url=server.url)
        assert first.returncode == 0, first.stderr
        assert first.stdout == "X is 1.\n"
        (folder,) = (isolated_env / "sessions").glob("*/*.trace")
        session_id = folder.name.removesuffix(".trace")
        assert (folder.parent / f"{session_id}.jsonl").is_file()
        again = keel("--resume", session_id, "sure?", url=server.url)
        assert again.returncode == 0, again.stderr
        received = [r.body for r in server.model_requests]
    records = trace.read(folder)
    assert kinds(records) == [
        "session",
        "turn_start",
        "request",
        "http",
        "response",
        "tool_start",
        "tool_end",
        "request",
        "http",
        "response",
        "turn_end",
        "session",
        "turn_start",
        "request",
        "http",
        "response",
        "turn_end",
    ]
    assert [r["seq"] for r in records] == list(range(1, 18))
    assert [r["req"] for r in records if r["kind"] == "request"] == [1, 2, 3]
    assert records[11]["data"]["reopened"] is True
    assert records[1]["data"]["prompt"] == "what is X?"
    adapter = AnthropicProvider(base_url="http://unused", api_key="", settings=HTTPSettings())
    rebuilt = [adapter.build_body(r) for _, r in trace.rebuild_requests(records)]
    assert rebuilt == received
    assert list(trace.http_bodies(folder, records).values()) == received
    for path, data in files_under(folder).items():
        assert KEY.encode() not in data, f"the key leaked into {path}"


def test_background_events_between_prompts_are_traced_with_their_agent(project: Path) -> None:
    from keel.agent.events import SubagentEvent, ToolStarted
    from keel.llm.events import Notice
    from keel.llm.messages import ToolUse

    agent = agent_for(ScriptedProvider([]), project, model="scripted")
    seen: list[Event] = []
    agent.on_background_event = seen.append
    tracer = trace.attach(agent, directory=project / "t.trace")
    call = ToolUse("toolu_9", "grep", {"pattern": "x"})
    agent.forward(SubagentEvent("toolu_task", "explore", "look", ToolStarted(call, 5.0), "bg-1"))
    agent.forward(Notice("between prompts", "info"))
    tracer.close()
    assert [type(e).__name__ for e in seen] == ["SubagentEvent", "Notice"]
    records = trace.read(project / "t.trace")
    assert [(r["kind"], r.get("agent"), r.get("parent"), r["t"]) for r in records[1:]] == [
        ("tool_start", "explore", "toolu_task", 5.0),
        ("notice", None, None, records[2]["t"]),
    ]
    assert records[1]["data"] == {"id": "toolu_9", "name": "grep", "input": {"pattern": "x"}}


def test_an_untraced_agent_run_after_a_traced_one_is_not_recorded(project: Path) -> None:
    import asyncio

    directory = project / "t.trace"

    async def run(server: AnthropicServer) -> None:
        traced, untraced = anthropic_agent(server, project), anthropic_agent(server, project)
        tracer = trace.attach(traced, directory=directory)
        await traced.run("one")
        await untraced.run("two")  # the same task, so the same context
        await traced.run("three")
        for agent in (traced, untraced):
            await agent.aclose()
        tracer.close()

    with AnthropicServer([reply("1"), reply("2"), reply("3")], api_key=KEY) as server:
        asyncio.run(run(server))
    records = trace.read(directory)
    assert [r["data"]["n"] for r in records if r["kind"] == "http"] == [1, 2]
    assert [r["data"]["prompt"] for r in records if r["kind"] == "turn_start"] == ["one", "three"]


def test_a_question_answered_by_the_user_is_one_permission_record(project: Path) -> None:
    import asyncio

    from keel.agent.events import PermissionAsked
    from keel.permissions.gate import PermissionReply

    directory = project / "t.trace"
    script = [reply("", ("bash", {"command": "touch made.txt"})), reply("done")]

    async def run(server: AnthropicServer) -> None:
        gate = PermissionGate(mode="default", root=project, cwd=project)
        agent = anthropic_agent(server, project, gate=gate)
        agent.ask_through_events()

        def answer(event: Event) -> None:
            if isinstance(event, PermissionAsked):
                agent.answer(event.request_id, PermissionReply(False, reason="not now"))

        tracer = trace.attach(agent, directory=directory)
        await agent.run("make a file", answer)
        await agent.aclose()
        tracer.close()

    with AnthropicServer(script, api_key=KEY) as server:
        asyncio.run(run(server))
    records = trace.read(directory)
    (permission,) = (r for r in records if r["kind"] == "permission")
    data = permission["data"]
    assert data.pop("waited_ms") >= 0
    assert permission["req"] == 1
    assert data == {
        "request_id": "perm-1",
        "tool_use_id": script[0].message.tool_uses[0].id,
        "tool": "bash",
        "reason": "run a command",
        "suggestion": "bash(touch *)",
        "allow": False,
        "scope": "once",
        "by": "user",
        "answer": "not now",
    }
    assert not (project / "made.txt").exists()


def test_importing_keel_trace_loads_nothing_more() -> None:
    import subprocess
    import sys

    code = (
        "import sys, keel; before = set(sys.modules); import keel.trace; "
        "print(sorted(set(sys.modules) - before))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout == "['keel.trace']\n"


async def test_a_symlink_in_the_trace_folder_is_not_written_through(
    project: Path, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "precious.txt"
    elsewhere.write_text("keep me\nno newline at the end", encoding="utf-8")
    directory = project / "t.trace"
    directory.mkdir(mode=0o700)
    (directory / "events.jsonl").symlink_to(elsewhere)
    agent = agent_for(ScriptedProvider([reply("hi")]), project, model="scripted")
    tracer = trace.attach(agent, directory=directory)
    events: list[Event] = []
    result = await agent.run("hello", events.append)
    assert result.stop_reason == "end_turn"  # the run goes on without its trace
    assert elsewhere.read_text(encoding="utf-8") == "keep me\nno newline at the end"
    assert tracer.closed
    assert tracer.error.startswith("debug trace stopped: cannot write")
    from keel.llm.events import Notice

    warnings = [e.text for e in events if isinstance(e, Notice)]
    assert warnings == [tracer.error]


async def test_a_damaged_trace_is_left_alone_and_the_run_goes_on(project: Path) -> None:
    directory = project / "t.trace"
    directory.mkdir(mode=0o700)
    (directory / "events.jsonl").write_bytes(b"not json\n{}\n")
    agent = agent_for(ScriptedProvider([reply("hi")]), project, model="scripted")
    tracer = trace.attach(agent, directory=directory)
    result = await agent.run("hello")
    assert result.stop_reason == "end_turn"
    assert (directory / "events.jsonl").read_bytes() == b"not json\n{}\n"
    assert tracer.closed
    assert "is not a trace file" in tracer.error


def test_a_background_subagent_outliving_its_turn_is_traced_in_its_lane(project: Path) -> None:
    import asyncio

    from keel.testing.routing import routed_responder

    directory = project / "t.trace"
    start = (
        "task",
        {
            "description": "look around",
            "prompt": "CHILD: list the files",
            "subagent_type": "explore",
            "run_in_background": True,
        },
    )
    scripts = {
        "PARENT": [reply("", start), reply("It runs in the background."), reply("It finished.")],
        # Slow enough that the parent's turn is over before the child's model answers.
        "CHILD": [Reply(reply("", ("ls", {})).message, delay=0.6), reply("Three files.")],
    }

    async def run(server: AnthropicServer) -> None:
        agent = anthropic_agent(server, project)
        enable_subagents(agent, load_agent_types(project, user_dir=None, home=project / "nh"))
        between: list[Event] = []
        agent.on_background_event = between.append
        tracer = trace.attach(agent, directory=directory)
        result = await agent.run("PARENT: start it")
        assert result.text == "It runs in the background."
        await agent.background.wait()
        assert between  # the child's events arrived while no prompt ran
        delivered = await agent.run_notifications()
        assert delivered is not None
        await agent.aclose()
        tracer.close()

    with AnthropicServer(responder=routed_responder(scripts), api_key=KEY) as server:
        asyncio.run(run(server))
        received = [r.body for r in server.model_requests]
    records = trace.read(directory)
    task_id = next(
        r["data"]["id"]
        for r in records
        if r["kind"] == "tool_start" and r["data"]["name"] == "task"
    )
    child = [r for r in records if r.get("agent") == "explore"]
    assert {r["parent"] for r in child} == {task_id}
    assert [r["kind"] for r in child] == [
        "turn_start",
        "request",
        "http",
        "response",
        "tool_start",
        "tool_end",
        "request",
        "http",
        "response",
        "turn_end",
    ]
    # The child's second request was sent after the parent's turn had ended.
    parent_end = next(r["seq"] for r in records if r["kind"] == "turn_end" and "agent" not in r)
    assert [r["seq"] > parent_end for r in child if r["kind"] == "request"] == [False, True]
    assert any(r["kind"] == "notice" and r["data"].get("task_id") == "bg-1" for r in records)
    adapter = AnthropicProvider(base_url="http://unused", api_key="", settings=HTTPSettings())
    rebuilt = [adapter.build_body(r) for _, r in trace.rebuild_requests(records)]
    assert sorted(rebuilt) == sorted(received)
    bodies = trace.http_bodies(directory, records)
    assert sorted(bodies.values()) == sorted(received)


async def test_a_failing_tracer_stops_with_one_warning_and_the_run_goes_on(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from keel.llm.events import Notice
    from keel.trace.delta import DeltaEncoder

    def broken(*_args: object) -> dict[str, Any]:
        raise TypeError("a bug in the tracer")

    monkeypatch.setattr(DeltaEncoder, "encode", broken)
    agent = agent_for(ScriptedProvider([reply("hi")]), project, model="scripted")
    tracer = trace.attach(agent, directory=project / "t.trace")
    events: list[Event] = []
    result = await agent.run("hello", events.append)
    assert result.stop_reason == "end_turn"
    assert result.text == "hi"
    assert (
        tracer.error == "debug trace stopped by an internal error: TypeError: a bug in the tracer"
    )
    assert [e.text for e in events if isinstance(e, Notice)] == [tracer.error]
    assert kinds(trace.read(project / "t.trace")) == ["session", "turn_start"]
