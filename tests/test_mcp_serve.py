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
        async with stdio_client(params, errlog=log) as (read, write):
            async with _session(read, write, answer) as client:
                yield client
    finally:
        log.close()


@asynccontextmanager
async def _session(read: Any, write: Any, answer: Elicitor | None) -> AsyncIterator[Client]:
    questions: list[ElicitRequestParams] = []
    callback = None
    if answer is not None:
        given = answer

        async def callback(_ctx: Any, params: ElicitRequestParams) -> ElicitResult:
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
    return body["messages"][-1]["content"]


# -- listing ---------------------------------------------------------------------------------------


async def test_tools_are_listed_with_their_schemas(project: Path, anthropic: AnthropicServer) -> None:
    async with stdio(project, anthropic) as c:
        init_tools = (await c.session.list_tools()).tools
    tools = {t.name: t for t in init_tools}
    assert sorted(tools) == ["keel_reply", "keel_run", "keel_session", "keel_sessions"]
    run = tools["keel_run"]
    assert run.description is not None and run.description.startswith("Run a task with keel")
    schema = run.input_schema
    assert schema["required"] == ["prompt"]
    props = schema["properties"]
    assert sorted(props) == ["cwd", "max_budget_usd", "max_turns", "mode", "model", "prompt"]
    assert props["prompt"]["type"] == "string" and props["prompt"]["minLength"] == 1
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
    assert tools["keel_session"].input_schema["required"] == ["session_id"]
    assert tools["keel_session"].annotations is not None
    assert tools["keel_session"].annotations.read_only_hint is True
    assert "required" not in tools["keel_sessions"].input_schema


# -- a run -----------------------------------------------------------------------------------------


async def test_a_run_returns_its_answer_and_reports_progress(
    project: Path, anthropic: AnthropicServer
) -> None:
    anthropic.add(reply("Looking.", ("glob", {"pattern": "*.py"})), reply("Two files."))
    progress: list[tuple[float, float | None, str | None]] = []

    async def heard(p: float, total: float | None, message: str | None) -> None:
        progress.append((p, total, message))

    async with stdio(project, anthropic) as c:
        result = await c.session.call_tool(
            "keel_run", {"prompt": "which files?"}, progress_callback=heard
        )
    assert result.is_error is False
    data = norm_result(result.structured_content)
    assert data == done("Two files.", turns=2, inp=200, out=40)
    sid = result.structured_content["session_id"] if result.structured_content else ""
    assert text_of(result) == f"Two files.\n\n[session {sid}; continue it with keel_reply]"
    messages = [re.sub(r"in [\d.]+m?s$", "in T", m or "") for _, _, m in progress]
    assert messages == ["started", "turn 1", "glob *.py", "glob done in T", "turn 2"]
    assert [p for p, _, _ in progress] == list(range(1, len(progress) + 1))
    first = anthropic.model_requests()[0].json()
    assert first["model"] == "claude-sonnet-4-5"
    assert first["messages"][0]["role"] == "user"
    assert any(
        b.get("type") == "text" and b["text"] == "which files?"
        for b in first["messages"][0]["content"]
    )
    second = anthropic.model_requests()[1].json()
    tool_result = last_user_text(second)[0]
    assert tool_result["type"] == "tool_result"
    assert "app.py" in json.dumps(tool_result) and "util.py" in json.dumps(tool_result)
