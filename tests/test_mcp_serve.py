"""`keel mcp serve`: keel as an MCP server, driven by the official MCP SDK's client
(`mcp.ClientSession`) over stdio (`python -m keel mcp serve`, spawned by `stdio_client`) and
over streamable HTTP, its model a loopback Anthropic server scripted by each test; and by
another keel (`keel -p` with `mcp_servers` pointing at `keel mcp serve`)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult, ElicitRequestParams, ElicitResult, TextContent

from keel.llm.script import reply
from keel.testing.anthropic_server import AnthropicServer

TOKEN = "test-token-0123456789abcdef"
MODEL = "anthropic/claude-sonnet-4-5"

Elicitor = Callable[[ElicitRequestParams], Awaitable[ElicitResult]]


@pytest.fixture(name="anthropic")
def anthropic_fixture() -> Iterator[AnthropicServer]:
    with AnthropicServer(api_key="sk-ant-test") as server:
        yield server


def _env(anthropic: AnthropicServer) -> dict[str, str]:
    return {
        **os.environ,
        "ANTHROPIC_API_KEY": "sk-ant-test",
        "ANTHROPIC_BASE_URL": anthropic.url,
        "KEEL_SERVER_TOKEN": TOKEN,
    }


@dataclass
class Client:
    """What a test sees of one connection: the session, and what the server asked."""

    session: ClientSession
    questions: list[ElicitRequestParams] = field(default_factory=list)


@asynccontextmanager
async def stdio(
    project: Path,
    anthropic: AnthropicServer,
    *args: str,
    answer: Elicitor | None = None,
    errlog: Path | None = None,
) -> AsyncIterator[Client]:
    """`python -m keel mcp serve ARGS` in `project`, connected with the SDK's client; `answer`
    (when given) answers elicitations, and the client then declares the capability."""
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "keel", "mcp", "serve", "--model", MODEL, *args],
        env=_env(anthropic),
        cwd=project,
    )
    log = (errlog or project.parent / "mcp-serve.log").open("a", encoding="utf-8")
    try:
        async with (
            stdio_client(params, errlog=log) as (read, write),
            _session(read, write, answer) as client,
        ):
            yield client
    finally:
        log.close()


@asynccontextmanager
async def _session(read: Any, write: Any, answer: Elicitor | None) -> AsyncIterator[Client]:
    questions: list[ElicitRequestParams] = []
    callback = None
    if answer is not None:
        given = answer

        async def callback(context: Any, params: ElicitRequestParams) -> ElicitResult:
            questions.append(params)
            return await given(params)

    async with ClientSession(read, write, elicitation_callback=callback) as session:
        await session.initialize()
        yield Client(session, questions)


def text_of(result: CallToolResult) -> str:
    assert len(result.content) == 1
    block = result.content[0]
    assert isinstance(block, TextContent)
    return block.text


def norm_result(data: dict[str, Any] | None) -> dict[str, Any]:
    """A result's structured content with what varies from run to run taken out."""
    assert data is not None
    out = dict(data)
    assert isinstance(out.pop("duration_ms"), int)
    assert re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{6}", out["session_id"])
    assert out["session_path"].endswith(f"/{out['session_id']}.jsonl")
    out["session_id"] = "<id>"
    out["session_path"] = "<path>"
    return out


def done(text: str, *, turns: int = 1, inp: int = 100, out: int = 20) -> dict[str, Any]:
    """The structured content of a run that ended normally."""
    return {
        "result": text,
        "stop_reason": "end_turn",
        "is_error": False,
        "error": None,
        "session_id": "<id>",
        "session_path": "<path>",
        "model": MODEL,
        "turns": turns,
        "usage": {"input": inp, "output": out, "cache_read": 0, "cache_write": 0},
        "cache_read_share": 0.0,
        "cost_usd": pytest.approx((inp * 3 + out * 15) / 1e6),
    }


def last_user_text(body: dict[str, Any]) -> list[Any]:
    content: list[Any] = body["messages"][-1]["content"]
    return content


# -- listing ---------------------------------------------------------------------------------------


async def test_tools_are_listed_with_their_schemas(
    project: Path, anthropic: AnthropicServer
) -> None:
    async with stdio(project, anthropic) as c:
        init_tools = (await c.session.list_tools()).tools
    tools = {t.name: t for t in init_tools}
    assert sorted(tools) == ["keel_reply", "keel_run", "keel_session", "keel_sessions"]
    run = tools["keel_run"]
    assert run.description is not None
    assert run.description.startswith("Run a task with keel")
    schema = run.input_schema
    assert schema["required"] == ["prompt"]
    props = schema["properties"]
    assert sorted(props) == ["cwd", "max_budget_usd", "max_turns", "mode", "model", "prompt"]
    assert props["prompt"]["type"] == "string"
    assert props["prompt"]["minLength"] == 1
    assert props["mode"]["anyOf"][0] == {
        "enum": ["default", "accept-edits", "plan", "bypass"],
        "type": "string",
    }
    assert props["max_turns"]["anyOf"][0] == {"minimum": 1, "type": "integer"}
    assert all(p.get("description") for p in props.values())
    assert run.output_schema is not None
    assert sorted(run.output_schema["required"]) == sorted(
        [
            "result",
            "stop_reason",
            "is_error",
            "error",
            "session_id",
            "session_path",
            "model",
            "turns",
            "usage",
            "cache_read_share",
            "cost_usd",
            "duration_ms",
        ]
    )
    assert tools["keel_reply"].input_schema["required"] == ["session_id", "prompt"]
    assert sorted(tools["keel_reply"].input_schema["properties"]) == [
        "mode",
        "prompt",
        "session_id",
    ]
    assert tools["keel_session"].input_schema["required"] == ["session_id"]
    assert tools["keel_session"].annotations is not None
    assert tools["keel_session"].annotations.read_only_hint is True
    assert "required" not in tools["keel_sessions"].input_schema


# -- a run -----------------------------------------------------------------------------------------


async def test_a_run_returns_its_answer_and_reports_progress(
    project: Path, anthropic: AnthropicServer
) -> None:
    anthropic.add(reply("Looking.", ("glob", {"pattern": "*.py"})), reply("Two files."))
    reports: list[tuple[float, float | None, str | None]] = []

    async def heard(progress: float, total: float | None, message: str | None) -> None:
        reports.append((progress, total, message))

    async with stdio(project, anthropic) as c:
        result = await c.session.call_tool(
            "keel_run", {"prompt": "which files?"}, progress_callback=heard
        )
    assert result.is_error is False
    data = norm_result(result.structured_content)
    assert data == done("Two files.", turns=2, inp=200, out=40)
    sid = result.structured_content["session_id"] if result.structured_content else ""
    assert text_of(result) == f"Two files.\n\n[session {sid}; continue it with keel_reply]"
    messages = [re.sub(r"in [\d.]+m?s$", "in T", m or "") for _, _, m in reports]
    assert messages == ["started", "turn 1", "glob *.py", "glob done in T", "turn 2"]
    assert [(p, t) for p, t, _ in reports] == [(n, None) for n in range(1, len(reports) + 1)]
    first = anthropic.model_requests[0].json
    assert first["model"] == "claude-sonnet-4-5"
    assert [m["role"] for m in first["messages"]] == ["user"]
    assert last_user_text(first)[-1]["text"] == "which files?"
    tool_result = last_user_text(anthropic.model_requests[1].json)[0]
    assert tool_result["type"] == "tool_result"
    assert tool_result["content"][0]["text"].split() == ["app.py", "util.py"]


# -- permission questions --------------------------------------------------------------------------


def deciding(decision: str, reason: str = "") -> Elicitor:
    async def answer(_params: ElicitRequestParams) -> ElicitResult:
        return ElicitResult(action="accept", content={"decision": decision, "reason": reason})

    return answer


WRITE = ("write", {"path": "notes.txt", "content": "hi\n"})


async def test_a_permission_question_allowed_through_elicitation_writes_the_file(
    project: Path, anthropic: AnthropicServer
) -> None:
    anthropic.add(reply("", WRITE), reply("Wrote it."))
    async with stdio(project, anthropic, answer=deciding("allow")) as c:
        result = await c.session.call_tool("keel_run", {"prompt": "write notes"})
    assert norm_result(result.structured_content) == done("Wrote it.", turns=2, inp=200, out=40)
    assert (project / "notes.txt").read_text(encoding="utf-8") == "hi\n"
    [asked] = c.questions
    assert asked.mode == "form"
    assert asked.message.startswith("keel needs your permission to ")
    assert asked.message.endswith('write {"path": "notes.txt", "content": "hi\\n"}')
    assert asked.requested_schema == {
        "type": "object",
        "title": "Decision",
        "description": "The answer to a permission question (the elicitation's schema).",
        "properties": {
            "decision": {
                "type": "string",
                "enum": ["allow", "deny"],
                "title": "Decision",
                "description": "allow: run this call once; deny: refuse it (keel's model is told)",
            },
            "reason": {
                "type": "string",
                "title": "Reason",
                "description": "why (a denial's reason is shown to the model)",
                "default": "",
            },
        },
        "required": ["decision"],
    }
    tool_result = last_user_text(anthropic.model_requests[1].json)[0]
    assert tool_result.get("is_error", False) is False


async def test_a_denial_with_a_reason_reaches_the_model(
    project: Path, anthropic: AnthropicServer
) -> None:
    anthropic.add(reply("", WRITE), reply("I did not write it."))
    async with stdio(project, anthropic, answer=deciding("deny", "not that file")) as c:
        result = await c.session.call_tool("keel_run", {"prompt": "write notes"})
    assert norm_result(result.structured_content) == done(
        "I did not write it.", turns=2, inp=200, out=40
    )
    assert not (project / "notes.txt").exists()
    assert len(c.questions) == 1
    tool_result = last_user_text(anthropic.model_requests[1].json)[0]
    assert tool_result["is_error"] is True
    assert tool_result["content"] == [
        {"type": "text", "text": "the user denied this: not that file"}
    ]


async def test_a_client_without_elicitation_gets_its_questions_refused(
    project: Path, anthropic: AnthropicServer
) -> None:
    anthropic.add(reply("", WRITE), reply("Refused."))
    async with stdio(project, anthropic) as c:  # declares no elicitation capability
        result = await c.session.call_tool("keel_run", {"prompt": "write notes"})
    assert norm_result(result.structured_content) == done("Refused.", turns=2, inp=200, out=40)
    assert not (project / "notes.txt").exists()
    tool_result = last_user_text(anthropic.model_requests[1].json)[0]
    assert tool_result["is_error"] is True
    [text] = [b["text"] for b in tool_result["content"]]
    assert text.startswith(
        "permission needed, but nobody can answer it: keel runs as an MCP server"
    )
    assert text == (
        "permission needed, but nobody can answer it: keel runs as an MCP server whose client "
        "cannot answer questions here (MCP elicitation); the caller may pass mode accept-edits, "
        "or the server's owner may allow it with keel mcp serve --allowed-tools (needed to "
        "change notes.txt)"
    )


async def test_permissions_refuse_never_asks_even_a_client_that_could_answer(
    project: Path, anthropic: AnthropicServer
) -> None:
    anthropic.add(reply("", WRITE), reply("Refused."))
    async with stdio(project, anthropic, "--permissions", "refuse", answer=deciding("allow")) as c:
        result = await c.session.call_tool("keel_run", {"prompt": "write notes"})
    assert c.questions == []
    assert not (project / "notes.txt").exists()
    assert norm_result(result.structured_content)["result"] == "Refused."
    tool_result = last_user_text(anthropic.model_requests[1].json)[0]
    assert tool_result["content"] == [
        {
            "type": "text",
            "text": "permission needed, but keel runs as an MCP server that asks no questions "
            "(--permissions refuse); the caller may pass mode accept-edits, or the server's owner "
            "may allow it with keel mcp serve --allowed-tools (needed to change notes.txt)",
        }
    ]


async def test_mode_accept_edits_writes_unasked_and_bypass_needs_the_server_flag(
    project: Path, anthropic: AnthropicServer
) -> None:
    anthropic.add(reply("", WRITE), reply("Wrote it."))
    async with stdio(project, anthropic, answer=deciding("deny")) as c:
        result = await c.session.call_tool(
            "keel_run", {"prompt": "write notes", "mode": "accept-edits"}
        )
        bypass = await c.session.call_tool("keel_run", {"prompt": "anything", "mode": "bypass"})
    assert c.questions == []
    assert norm_result(result.structured_content)["result"] == "Wrote it."
    assert (project / "notes.txt").exists()
    assert bypass.is_error is True
    assert text_of(bypass) == (
        "mode bypass is not allowed by this server (hint: its owner may start keel mcp serve "
        "--allow-bypass; accept-edits lets edits through)"
    )
    assert len(anthropic.model_requests) == 2  # the refused call asked no model


async def test_a_2026_client_answers_questions_in_rounds(
    project: Path, anthropic: AnthropicServer
) -> None:
    """The SDK's high-level `Client` speaks the 2026-07-28 protocol: no handshake, and no
    request from the server within a call. A question is the call's `input_required` result
    (an elicitation, and the run's state); the client's next round answers it and the call
    goes on following the run, its progress numbered on."""
    from mcp import Client as ModernClient

    anthropic.add(reply("", WRITE), reply("", ("write", {"path": "b.txt", "content": "b\n"})))
    anthropic.add(reply("One written, one refused."))
    asked: list[ElicitRequestParams] = []
    answers = iter([("allow", ""), ("deny", "not b")])

    async def answer(context: Any, params: ElicitRequestParams) -> ElicitResult:
        asked.append(params)
        decision, reason = next(answers)
        return ElicitResult(action="accept", content={"decision": decision, "reason": reason})

    reports: list[tuple[float, str | None]] = []

    async def heard(progress: float, total: float | None, message: str | None) -> None:
        reports.append((progress, message))

    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "keel", "mcp", "serve", "--model", MODEL],
        env=_env(anthropic),
        cwd=project,
    )
    async with ModernClient(params, elicitation_callback=answer) as client:
        result = await client.call_tool(
            "keel_run", {"prompt": "write notes"}, progress_callback=heard
        )
    assert norm_result(result.structured_content) == done(
        "One written, one refused.", turns=3, inp=300, out=60
    )
    assert [q.message.splitlines()[-1] for q in asked] == [
        'write {"path": "notes.txt", "content": "hi\\n"}',
        'write {"path": "b.txt", "content": "b\\n"}',
    ]
    assert (project / "notes.txt").exists()
    assert not (project / "b.txt").exists()
    refused = last_user_text(anthropic.model_requests[2].json)[0]
    assert refused["content"] == [{"type": "text", "text": "the user denied this: not b"}]
    messages = [re.sub(r"in [\d.]+m?s$", "in T", m or "") for _, m in reports]
    assert messages[:3] == ["started", "turn 1", "write notes.txt"]
    assert messages[-1] == "turn 3"
    assert "write failed in T" in messages


async def test_a_2026_client_without_elicitation_gets_its_questions_refused(
    project: Path, anthropic: AnthropicServer
) -> None:
    from mcp import Client as ModernClient

    anthropic.add(reply("", WRITE), reply("Refused."))
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "keel", "mcp", "serve", "--model", MODEL],
        env=_env(anthropic),
        cwd=project,
    )
    async with ModernClient(params) as client:
        result = await client.call_tool("keel_run", {"prompt": "write notes"})
    assert norm_result(result.structured_content) == done("Refused.", turns=2, inp=200, out=40)
    assert not (project / "notes.txt").exists()
    refused = last_user_text(anthropic.model_requests[1].json)[0]
    assert refused["content"][0]["text"].startswith("permission needed, but nobody can answer it")


async def test_a_question_nobody_comes_back_for_stops_the_run(
    project: Path, anthropic: AnthropicServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In process (the SDK's `Client` on the server object): the first round returns the
    question, and nobody answers it; after the wait the run is stopped, its session
    interrupted, and a late answer is an error."""
    from mcp import Client as ModernClient
    from mcp_types import InputRequiredResult

    import keel.mcp.serve as serve

    monkeypatch.setattr(serve, "PARK_SECONDS", 0.3)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", anthropic.url)
    anthropic.add(reply("", WRITE))
    server = serve.build_server(serve.ServeOptions(project=project, model=MODEL))

    async def never(context: Any, params: ElicitRequestParams) -> ElicitResult:
        raise AssertionError("the test answers nothing")

    async with ModernClient(server, elicitation_callback=never) as client:
        first = await client.session.call_tool(
            "keel_run", {"prompt": "write notes"}, allow_input_required=True
        )
        assert isinstance(first, InputRequiredResult)
        assert first.input_requests is not None
        assert sorted(first.input_requests) == ["permission"]
        with anyio.fail_after(10):
            while True:
                listed = await client.call_tool("keel_sessions", {})
                assert listed.structured_content is not None
                [item] = listed.structured_content["sessions"]
                if item["status"] == "interrupted":
                    break
                await anyio.sleep(0.05)
        late = await client.session.call_tool(
            "keel_run",
            {"prompt": "write notes"},
            input_responses={
                "permission": ElicitResult(action="accept", content={"decision": "allow"})
            },
            request_state=first.request_state,
        )
    assert late.is_error is True
    assert text_of(late) == (
        "no question of keel waits under this request state (hint: the run it belonged to "
        "ended or waited more than 0.3 s; call again)"
    )
    assert not (project / "notes.txt").exists()


# -- cancellation, resume, reading -----------------------------------------------------------------


async def test_cancelling_the_call_interrupts_the_run_and_the_session_goes_on(
    project: Path, anthropic: AnthropicServer
) -> None:
    slow = reply("Too slow.")
    slow.delay = 30
    anthropic.add(slow, reply("Carried on."))
    started = anyio.Event()

    async def heard(progress: float, total: float | None, message: str | None) -> None:
        if message == "turn 1":
            started.set()

    async with stdio(project, anthropic) as c:
        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:

                async def call() -> None:
                    await c.session.call_tool(
                        "keel_run", {"prompt": "take your time"}, progress_callback=heard
                    )

                tg.start_soon(call)
                await started.wait()
                tg.cancel_scope.cancel()  # the SDK sends notifications/cancelled
            listed = await _wait_for_status(c, "interrupted")
            sid = listed["id"]
            resumed = await c.session.call_tool(
                "keel_reply", {"session_id": sid, "prompt": "go on"}
            )
            transcript = await c.session.call_tool("keel_session", {"session_id": sid})
    assert listed["last_prompt"] == "take your time"
    data = norm_result(resumed.structured_content)
    assert data == done("Carried on.", turns=1)
    assert resumed.structured_content is not None
    assert resumed.structured_content["session_id"] == sid
    last = anthropic.model_requests[-1].json["messages"]
    assert [m["role"] for m in last] == ["user"]
    # The interrupted prompt had no answer: it and the new one go in one user message.
    assert [b["text"] for b in last[0]["content"]][-2:] == ["take your time", "go on"]
    text = text_of(transcript)
    assert "take your time" in text
    assert "go on" in text
    assert "Carried on." in text
    assert "interrupted" in text


async def _wait_for_status(c: Client, status: str) -> dict[str, Any]:
    while True:
        listed = await c.session.call_tool("keel_sessions", {})
        assert listed.structured_content is not None
        sessions = listed.structured_content["sessions"]
        if sessions and sessions[0]["status"] == status:
            return dict(sessions[0])
        await anyio.sleep(0.05)


async def test_a_session_is_continued_and_read(project: Path, anthropic: AnthropicServer) -> None:
    anthropic.add(reply("First answer."), reply("Second answer."))
    async with stdio(project, anthropic) as c:
        first = await c.session.call_tool("keel_run", {"prompt": "first question"})
        assert first.structured_content is not None
        sid = first.structured_content["session_id"]
        second = await c.session.call_tool(
            "keel_reply", {"session_id": sid[:15], "prompt": "second question"}
        )
        read = await c.session.call_tool("keel_session", {"session_id": sid})
        listed = await c.session.call_tool("keel_sessions", {"limit": 5})
    assert norm_result(second.structured_content) == done("Second answer.")
    assert second.structured_content is not None
    assert second.structured_content["session_id"] == sid
    messages = anthropic.model_requests[1].json["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[1]["content"] == [{"type": "text", "text": "First answer."}]
    assert messages[2]["content"][-1]["text"] == "second question"
    text = text_of(read)
    assert (
        text.index("first question")
        < text.index("First answer.")
        < text.index("second question")
        < text.index("Second answer.")
    )
    assert listed.structured_content is not None
    [item] = listed.structured_content["sessions"]
    assert item == {
        "id": sid,
        "started": item["started"],
        "status": "completed",
        "last_prompt": "second question",
        "turns": 2,
        "cost_usd": pytest.approx(2 * (100 * 3 + 20 * 15) / 1e6),
        "model": MODEL,
        "cwd": str(project),
    }


async def test_bad_arguments_are_one_line_tool_errors(
    project: Path, anthropic: AnthropicServer
) -> None:
    outside = project.parent / "elsewhere"
    outside.mkdir()
    async with stdio(project, anthropic) as c:
        calls = [
            await c.session.call_tool("keel_run", {"prompt": 3, "max_turns": 0}),
            await c.session.call_tool("keel_run", {"prompt": "x", "cwd": "../elsewhere"}),
            await c.session.call_tool("keel_run", {"prompt": "x", "model": "nope/nothing"}),
            await c.session.call_tool("keel_reply", {"session_id": "20990101", "prompt": "x"}),
            await c.session.call_tool("keel_session", {"session_id": "../x"}),
        ]
    assert all(r.is_error for r in calls)
    texts = [text_of(r) for r in calls]
    assert all("\n" not in t for t in texts), texts
    assert texts[0] == (
        "invalid arguments for keel_run: prompt: Input should be a valid string; max_turns: "
        "Input should be greater than or equal to 1 (hint: tools/list shows each tool's input "
        "schema)"
    )
    assert texts[1] == (
        f"cwd ../elsewhere is outside the server's project {project} (hint: give a directory "
        "inside it, or start keel mcp serve --cwd there)"
    )
    assert texts[2].startswith("unknown provider 'nope' in model 'nope/nothing' (hint: known ")
    assert (
        texts[3] == "no session '20990101' (hint: `keel sessions list --all` shows every session)"
    )
    assert texts[4] == "'../x' is not a session id (hint: `keel sessions list` shows them)"
    assert anthropic.model_requests == []


# -- streamable HTTP -------------------------------------------------------------------------------


@dataclass
class HttpServed:
    proc: subprocess.Popen[str]
    url: str
    port: int


@pytest.fixture(name="http_served")
def http_served_fixture(project: Path, anthropic: AnthropicServer) -> Iterator[HttpServed]:
    log = (project.parent / "mcp-http.log").open("a", encoding="utf-8")
    proc = subprocess.Popen(
        [sys.executable, "-m", "keel", "mcp", "serve", "--http", "--model", MODEL],
        cwd=project,
        env=_env(anthropic),
        stdout=log,
        stderr=subprocess.PIPE,
        text=True,
    )
    log.close()
    try:
        line = _first_line(proc)
        assert line.startswith("keel mcp serve: listening on http://127.0.0.1:"), line
        url = line.split()[5]
        assert url.endswith("/mcp")
        assert line.endswith(f" for {project}")
        yield HttpServed(proc, url, int(url.split(":")[2].split("/")[0]))
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        if proc.stderr is not None:
            proc.stderr.close()


def _first_line(proc: subprocess.Popen[str]) -> str:
    got: list[str] = []
    assert proc.stderr is not None
    stderr = proc.stderr
    reader = threading.Thread(target=lambda: got.append(stderr.readline()), daemon=True)
    reader.start()
    reader.join(30)
    assert got, f"keel mcp serve printed nothing in 30 s (exit {proc.poll()})"
    assert got[0], f"keel mcp serve exited before printing its address (exit {proc.poll()})"
    return got[0].rstrip("\n")


INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "curl", "version": "0"},
    },
}


def test_http_refuses_a_missing_or_wrong_token_and_a_foreign_host(
    http_served: HttpServed,
) -> None:
    headers = {"accept": "application/json, text/event-stream"}
    with httpx.Client(timeout=10) as c:
        missing = c.post(http_served.url, json=INITIALIZE, headers=headers)
        wrong = c.post(
            http_served.url,
            json=INITIALIZE,
            headers={**headers, "authorization": "Bearer wrong-token-0123456789"},
        )
        foreign = c.post(
            http_served.url,
            json=INITIALIZE,
            headers={
                **headers,
                "authorization": f"Bearer {TOKEN}",
                "host": f"evil.example:{http_served.port}",
            },
        )
        right = c.post(
            http_served.url,
            json=INITIALIZE,
            headers={**headers, "authorization": f"Bearer {TOKEN}"},
        )
    assert (missing.status_code, missing.headers["www-authenticate"]) == (401, "Bearer")
    assert missing.json()["error"] == "no bearer token"
    assert (wrong.status_code, wrong.json()["error"]) == (401, "wrong bearer token")
    assert foreign.status_code == 403
    assert foreign.json()["error"] == (
        f"Host header 'evil.example:{http_served.port}' does not name this server"
    )
    assert right.status_code == 200, right.text


async def test_a_run_over_streamable_http_with_elicitation_and_progress(
    http_served: HttpServed, anthropic: AnthropicServer, project: Path
) -> None:
    import httpx2

    anthropic.add(reply("", WRITE), reply("Wrote it."))
    reports: list[str | None] = []

    async def heard(progress: float, total: float | None, message: str | None) -> None:
        reports.append(message)

    http = httpx2.AsyncClient(
        headers={"authorization": f"Bearer {TOKEN}"}, timeout=httpx2.Timeout(30, read=60)
    )
    async with (
        http,
        streamable_http_client(http_served.url, http_client=http) as (read, write),
        _session(read, write, deciding("allow")) as c,
    ):
        result = await c.session.call_tool(
            "keel_run", {"prompt": "write notes"}, progress_callback=heard
        )
    assert norm_result(result.structured_content) == done("Wrote it.", turns=2, inp=200, out=40)
    assert (project / "notes.txt").read_text(encoding="utf-8") == "hi\n"
    assert len(c.questions) == 1
    assert [re.sub(r"in [\d.]+m?s$", "in T", m or "") for m in reports] == [
        "started",
        "turn 1",
        "write notes.txt",
        "write done in T",
        "turn 2",
    ]


# -- from another keel -----------------------------------------------------------------------------


def test_another_keel_calls_keel_run_through_its_mcp_servers(
    project: Path, anthropic: AnthropicServer, tmp_path: Path, isolated_env: Path
) -> None:
    """An outer `keel -p` whose project's `.mcp.json` names `keel mcp serve` (approved with
    `keel mcp approve`, as a project's server must be) hands a task to the inner keel, which
    works in `project`; one loopback model answers both, in turn."""
    outer = tmp_path / "outer"
    outer.mkdir()
    entry = {
        "command": sys.executable,
        "args": ["-m", "keel", "mcp", "serve", "--cwd", str(project), "--model", MODEL],
        "env": {
            "ANTHROPIC_API_KEY": "sk-ant-test",
            "ANTHROPIC_BASE_URL": anthropic.url,
            "KEEL_HOME": str(isolated_env),
            "KEEL_CONFIG_DIR": str(isolated_env / "config"),
        },
    }
    (outer / ".mcp.json").write_text(json.dumps({"mcpServers": {"inner": entry}}), encoding="utf-8")
    env = _env(anthropic)
    approved = subprocess.run(
        [sys.executable, "-m", "keel", "mcp", "approve", "inner"],
        cwd=outer, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert approved.returncode == 0, approved.stderr
    delegate = ("mcp__inner__keel_run", {"prompt": "which files are there?"})
    anthropic.add(
        reply("", delegate),  # the outer keel's first request
        reply("app.py and util.py."),  # the inner keel's
        reply("The other keel found app.py and util.py."),  # the outer keel's second
    )
    out = subprocess.run(
        [sys.executable, "-m", "keel", "-p", "ask the other keel", "--model", MODEL,
         "--allowed-tools", "mcp__inner__keel_run", "--output-format", "stream-json"],
        cwd=outer, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    finished = [e for e in lines if e.get("type") == "tool_finished"]
    assert [(e["name"], e["is_error"]) for e in finished] == [("mcp__inner__keel_run", False)]
    assert finished[0]["output"].startswith("app.py and util.py.\n\n[session ")
    result = lines[-1]
    assert (result["type"], result["result"]) == (
        "result",
        "The other keel found app.py and util.py.",
    )
    requests = [r.json for r in anthropic.model_requests]
    assert len(requests) == 3
    offered = [t["name"] for t in requests[0]["tools"]]
    assert "mcp__inner__keel_run" in offered
    assert last_user_text(requests[1])[-1]["text"] == "which files are there?"
    inner_env = last_user_text(requests[1])[0]["text"]
    assert f"Working directory: {project}" in inner_env
    tool_result = last_user_text(requests[2])[0]
    assert tool_result["type"] == "tool_result"
    assert tool_result["content"][0]["text"].startswith("app.py and util.py.")


def test_stdout_carries_nothing_but_mcp(project: Path, anthropic: AnthropicServer) -> None:
    """Raw JSON-RPC lines in (the server's own `--mode bypass` lets a call run bash): every
    line out is a JSON-RPC message, the answers in order, and nothing else is written there."""
    anthropic.add(reply("", ("bash", {"command": "echo printed"})), reply("Ran it."))
    calls = [
        INITIALIZE,
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {"name": "keel_run", "arguments": {"prompt": "run it", "mode": "bypass"}},
        },
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "keel", "mcp", "serve", "--model", MODEL, "--mode", "bypass"],
        cwd=project, env=_env(anthropic), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdin is not None
    assert proc.stdout is not None
    stdout = proc.stdout
    lines: list[dict[str, Any]] = []

    def read() -> None:  # until the call's answer (stdin stays open: EOF would cancel it)
        while line := stdout.readline():
            lines.append(json.loads(line))
            if lines[-1].get("id") == 2:
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    proc.stdin.write("".join(json.dumps(c) + "\n" for c in calls))
    proc.stdin.flush()
    reader.join(60)
    proc.stdin.close()
    assert proc.wait(30) == 0
    assert stdout.read() == ""
    assert proc.stderr is not None
    err = proc.stderr.read()
    stdout.close()
    proc.stderr.close()
    assert all(m["jsonrpc"] == "2.0" for m in lines)
    assert [m.get("id") for m in lines] == [1, 2]
    assert "result" in lines[1], lines[1]
    assert lines[1]["result"]["structuredContent"]["result"] == "Ran it."
    bash = last_user_text(anthropic.model_requests[1].json)[0]
    assert "printed" in json.dumps(bash)
    assert "Traceback" not in err


# -- the command line ------------------------------------------------------------------------------


def test_flags_that_need_http_are_one_line_errors(project: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "keel", "mcp", "serve", "--token-file", "t"],
        cwd=project, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert (out.returncode, out.stdout) == (2, "")
    assert out.stderr == "keel: error: --token-file needs --http\n"
    remote = subprocess.run(
        [sys.executable, "-m", "keel", "mcp", "serve", "--http", "--host", "0.0.0.0"],
        cwd=project, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert (remote.returncode, remote.stdout) == (2, "")
    assert remote.stderr == (
        "keel: error: --host 0.0.0.0 is not a loopback address (hint: keel mcp serve listens "
        "on this machine only (127.0.0.1, ::1, localhost))\n"
    )


def test_keel_version_and_keel_p_do_not_import_the_mcp_server(project: Path) -> None:
    for args in (["--version"], ["-p", "hi", "--model", "scripted:demo", "--no-session"]):
        out = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "keel", *args],
            cwd=project, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        imported = {
            line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if "|" in line
        }
        assert "keel.cli.main" in imported
        assert sorted(m for m in imported if m in ("keel.mcp.serve", "keel.cli.mcp_serve")) == []
        assert sorted(m for m in imported if m.split(".")[0] in ("mcp", "mcp_types")) == []
