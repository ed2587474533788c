"""Task-augmented MCP tool calls (the 2025-11-25 "tasks"), against real servers: every path of
`tests/mcp_servers/tasks_server.py` (which logs each message keel sends, so the whole request
sequence is compared; one task over streamable HTTP too), the reference `server-everything`'s
`simulate-research-query`, and one run through `keel -p`."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from keel.mcp import McpCallError, McpCallTimeout, McpManager
from keel.mcp.client import ElicitAsk
from keel.mcp.config import DEFAULT_CALL_TIMEOUT
from keel.mcp.tasks import TTL_MARGIN
from tests.test_mcp_features import EVERYTHING, configs, needs_everything, write_json

PY = sys.executable
TASKS = str(Path(__file__).parent / "mcp_servers" / "tasks_server.py")
OPENING = [
    ("initialize", None),
    ("notifications/initialized", None),
    ("tools/list", None),
]


class Server:
    """The tasks server under one manager: what keel sent it, and what keel told the user."""

    def __init__(self, manager: McpManager, log: Path, notices: list[str]) -> None:
        self.manager = manager
        self.log = log
        self.notices = notices

    def sent(self) -> list[dict[str, Any]]:
        """Every message keel sent after the opening handshake and listing."""
        lines = [json.loads(x) for x in self.log.read_text(encoding="utf-8").splitlines()]
        opening = [(m.get("method"), None) for m in lines[:3]]
        assert opening == OPENING
        return [{k: v for k, v in m.items() if k != "id"} for m in lines[3:]]

    async def text(self, tool: str, args: dict[str, Any], **kw: Any) -> str:
        result = await self.manager.call("t", tool, args, **kw)
        assert not result.is_error
        return "".join(getattr(c, "text", "") for c in result.content)


@asynccontextmanager
async def tasks_server(tmp_path: Path, *flags: str) -> AsyncIterator[Server]:
    log = tmp_path / "sent.jsonl"
    entry = {"command": PY, "args": [TASKS, *flags], "env": {"TASKS_LOG": str(log)}}
    servers = configs(tmp_path, {"t": entry}, dict(os.environ))
    notices: list[str] = []
    async with McpManager(servers, root=tmp_path, env=dict(os.environ), log_dir=tmp_path) as m:
        m.on_notice = lambda text, level: notices.append(text)
        assert await m.wait_ready(30)
        assert m.server("t").state == "connected", m.server("t").detail
        yield Server(m, log, notices)


def get(task: str) -> dict[str, Any]:
    return {"method": "tasks/get", "params": {"taskId": task}}


def result(task: str) -> dict[str, Any]:
    return {"method": "tasks/result", "params": {"taskId": task}}


def cancel(task: str) -> dict[str, Any]:
    return {"method": "tasks/cancel", "params": {"taskId": task}}


def create(tool: str, args: dict[str, Any], **meta: Any) -> dict[str, Any]:
    ttl = round((DEFAULT_CALL_TIMEOUT + TTL_MARGIN) * 1000)
    params: dict[str, Any] = {"name": tool, "arguments": args, "task": {"ttl": ttl}}
    if meta:
        params["_meta"] = meta
    return {"method": "tools/call", "params": params}


def squeezed(sent: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`sent` with runs of one repeated message kept once (polls in a timed test)."""
    return [m for i, m in enumerate(sent) if i == 0 or m != sent[i - 1]]


@pytest.mark.asyncio
async def test_a_required_tool_runs_as_a_task_with_progress(tmp_path: Path) -> None:
    heard: list[tuple[float, float | None, str | None]] = []
    async with tasks_server(tmp_path) as s:
        tools = {t.name: t.task_support for t in s.manager.server("t").tools}
        assert tools == {
            "count": "required", "fail": "required", "broken": "required",
            "stall": "required", "vanish": "required", "ask": "required",
            "nudge": "required", "quick": "optional",
        }  # fmt: skip
        said = await s.text("count", {"n": 3}, on_progress=lambda *p: heard.append(p))
        assert said == "counted to 3"
        assert s.sent() == [
            create("count", {"n": 3}, progressToken="keel-task-1"),
            get("task-1"),
            get("task-1"),
            get("task-1"),
            result("task-1"),
        ]
        assert s.notices == []
    # The status messages, and the server's progress notifications for keel's token (sent at
    # creation and at each poll: valid for the task's whole life, not only its first answer).
    assert [m for _, _, m in heard if m] == ["started", "step 1 of 3", "step 2 of 3", "done"]
    assert [(p, t) for p, t, m in heard if m is None] == [(0, 3), (1, 3), (2, 3)]


@pytest.mark.asyncio
async def test_optional_tools_are_called_plainly(tmp_path: Path) -> None:
    async with tasks_server(tmp_path) as s:
        assert await s.text("quick", {}) == "quick"
        assert s.sent() == [{"method": "tools/call", "params": {"name": "quick", "arguments": {}}}]


@pytest.mark.asyncio
async def test_a_status_notification_wakes_the_poll(tmp_path: Path) -> None:
    """`nudge` asks to be polled once a minute and says at once that it is done."""
    async with tasks_server(tmp_path) as s:
        said = await asyncio.wait_for(s.text("nudge", {}), 20)
        assert said == "nudged"
        assert s.sent() == [create("nudge", {}), get("task-1"), result("task-1")]


@pytest.mark.asyncio
async def test_a_failed_task_gives_its_error_result(tmp_path: Path) -> None:
    async with tasks_server(tmp_path) as s:
        got = await s.manager.call("t", "fail", {})
        assert got.is_error
        assert [getattr(c, "text", "") for c in got.content] == ["disk full"]
        assert s.sent() == [create("fail", {}), get("task-1"), result("task-1")]


@pytest.mark.asyncio
async def test_a_failed_task_whose_result_is_a_protocol_error(tmp_path: Path) -> None:
    async with tasks_server(tmp_path) as s:
        with pytest.raises(McpCallError) as failed:
            await s.manager.call("t", "broken", {})
        assert str(failed.value) == (
            'mcp server "t": tool "broken" failed: the backend crashed (error -32603)'
        )
        assert s.sent() == [create("broken", {}), get("task-1"), result("task-1")]


@pytest.mark.asyncio
async def test_a_task_the_server_cancelled(tmp_path: Path) -> None:
    async with tasks_server(tmp_path) as s:
        with pytest.raises(McpCallError) as failed:
            await s.manager.call("t", "vanish", {})
        assert str(failed.value) == (
            'mcp server "t" cancelled the task of tool "vanish": the operator stopped it'
        )
        assert s.sent() == [create("vanish", {}), get("task-1")]


@pytest.mark.asyncio
async def test_the_timeout_cancels_the_task(tmp_path: Path) -> None:
    async with tasks_server(tmp_path) as s:
        with pytest.raises(McpCallTimeout):
            await s.manager.call("t", "stall", {}, timeout=0.5)
        ttl = round((0.5 + TTL_MARGIN) * 1000)
        first = {"method": "tools/call", "params": {"name": "stall", "arguments": {}, "task": {"ttl": ttl}}}  # fmt: skip
        assert squeezed(s.sent()) == [first, get("task-1"), cancel("task-1")]
        assert s.notices == []
        # The connection serves the next call.
        assert await s.text("quick", {}) == "quick"


@pytest.mark.asyncio
async def test_an_interrupt_cancels_the_task(tmp_path: Path) -> None:
    async with tasks_server(tmp_path) as s:
        created = asyncio.Event()
        call = asyncio.ensure_future(
            s.manager.call("t", "stall", {}, on_progress=lambda *p: created.set())
        )
        await created.wait()
        await asyncio.sleep(0.2)  # a few polls, 20 ms apart
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        await s.text("quick", {})  # after the cancel went out
        sent = squeezed(s.sent())
        assert sent[:-1] == [
            create("stall", {}, progressToken="keel-task-1"),
            get("task-1"),
            cancel("task-1"),
        ]
        assert s.notices == []


@pytest.mark.asyncio
async def test_a_server_without_tasks_cancel_is_named(tmp_path: Path) -> None:
    async with tasks_server(tmp_path, "--no-cancel") as s:
        with pytest.raises(McpCallTimeout):
            await s.manager.call("t", "stall", {}, timeout=0.3)
        assert "tasks/cancel" not in [m["method"] for m in s.sent()]
        assert s.notices == [
            'mcp server "t": task task-1 of tool "stall" was not cancelled (the server does '
            "not offer tasks/cancel); it may still run there"
        ]


@pytest.mark.asyncio
async def test_input_required_asks_the_user_through_tasks_result(tmp_path: Path) -> None:
    asked: list[ElicitAsk] = []

    async def elicitor(ask: ElicitAsk) -> dict[str, Any]:
        asked.append(ask)
        return {"colour": "blue"}

    async with tasks_server(tmp_path) as s:
        s.manager.elicitor = elicitor
        assert await s.text("ask", {}) == 'you said: {"colour": "blue"}'
        assert s.sent() == [
            create("ask", {}),
            result("task-1"),
            {"result": {"action": "accept", "content": {"colour": "blue"}}},
        ]
    schema = {"type": "object", "properties": {"colour": {"type": "string"}}}
    assert asked == [ElicitAsk("t", "Which colour?", schema)]


@pytest.mark.asyncio
async def test_input_required_without_anyone_to_ask_is_refused_with_a_reason(
    tmp_path: Path,
) -> None:
    async with tasks_server(tmp_path) as s:
        said = await s.text("ask", {})
        assert said == "you said: refused: keel does not answer elicitations of t"


@pytest.mark.asyncio
async def test_required_tools_of_a_server_without_tasks_are_left_out_and_named(
    tmp_path: Path,
) -> None:
    async with tasks_server(tmp_path, "--no-tasks") as s:
        assert [t.name for t in s.manager.server("t").tools] == ["quick"]
        assert [t.name for t in s.manager.tools()] == ["mcp__t__quick"]
        assert s.notices == [
            'MCP server "t": count, fail, broken, stall, vanish, ask, nudge must be called as '
            "a task, but the server does not offer tasks for tools (capabilities.tasks."
            "requests.tools.call); keel leaves them out"
        ]


@pytest.fixture
def http_tasks_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """The tasks server on streamable HTTP: its URL, and the log of what keel sent it."""
    import socket
    import time

    from tests.helpers import free_port

    port, log = free_port(), tmp_path / "sent.jsonl"
    env = {**os.environ, "TASKS_LOG": str(log)}
    server = subprocess.Popen([PY, TASKS, "--http", str(port)], env=env)
    try:
        for _ in range(200):
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.1):
                    break
            except OSError:
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp", log
    finally:
        server.terminate()
        server.wait(5)


@pytest.mark.asyncio
async def test_a_task_over_streamable_http(
    tmp_path: Path, http_tasks_server: tuple[str, Path]
) -> None:
    """The `tools/call` keel sends as it is (not through the SDK's call_tool) carries the
    protocol version header every other request carries."""
    url, log = http_tasks_server
    servers = configs(tmp_path, {"web": {"type": "http", "url": url}}, {})
    async with McpManager(servers, root=tmp_path, env={}, log_dir=tmp_path) as m:
        assert await m.wait_ready(30)
        got = await m.call("web", "count", {"n": 2})
        assert [getattr(c, "text", "") for c in got.content] == ["counted to 2"]
    sent = [json.loads(x) for x in log.read_text(encoding="utf-8").splitlines()]
    tail = [(m.get("method"), m["version_header"]) for m in sent[3:]]
    assert tail == [
        ("tools/call", "2025-11-25"),
        ("tasks/get", "2025-11-25"),
        ("tasks/get", "2025-11-25"),
        ("tasks/result", "2025-11-25"),
    ]
    assert sent[3]["params"]["task"] == {"ttl": round((DEFAULT_CALL_TIMEOUT + TTL_MARGIN) * 1000)}


# -- the reference server -------------------------------------------------------------------


@needs_everything
@pytest.mark.asyncio
async def test_the_reference_servers_research_task(tmp_path: Path) -> None:
    """`simulate-research-query` (taskSupport required): four stages a second each, reported
    as status messages; `ambiguous` moves it to input_required, and the question reaches the
    user through tasks/result."""
    servers = configs(
        tmp_path, {"every": {"command": "node", "args": [str(EVERYTHING), "stdio"]}}, {}
    )
    heard: list[str | None] = []
    asked: list[str] = []

    async def elicitor(ask: ElicitAsk) -> dict[str, Any]:
        asked.append(ask.message)
        return {"interpretation": "snake"}

    notices: list[str] = []
    async with McpManager(servers, root=tmp_path, env=dict(os.environ), log_dir=tmp_path) as m:
        m.on_notice = lambda text, level: notices.append(text)
        m.elicitor = elicitor
        assert await m.wait_ready(30)
        support = {t.name: t.task_support for t in m.server("every").tools}
        assert support["simulate-research-query"] == "required"
        got = await m.call(
            "every",
            "simulate-research-query",
            {"topic": "python", "ambiguous": True},
            on_progress=lambda p, t, msg: heard.append(msg),
        )
        report = "".join(getattr(c, "text", "") for c in got.content)
        assert not got.is_error
        assert report.startswith("# Research Report: python (snake)\n")
        assert heard[:2] == ["Gathering sources...", "Analyzing content..."]
        # From input_required on, keel waits in tasks/result (the spec: no polls meanwhile).
        assert (
            heard[-1] == 'Found multiple interpretations for "python". Requesting clarification...'
        )
        assert asked == [
            'The research query "python" could have multiple interpretations. Please clarify '
            "what you're looking for:"
        ]
        # An interrupt cancels the task there (a failed tasks/cancel would be a notice).
        call = asyncio.ensure_future(m.call("every", "simulate-research-query", {"topic": "x"}))
        await asyncio.sleep(1.2)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert notices == []


# -- through keel -p ------------------------------------------------------------------------


def test_keel_p_calls_a_task_tool(tmp_path: Path, isolated_env: Callable[..., Any]) -> None:
    home = Path(os.environ["HOME"])
    project = tmp_path / "p"
    (project / ".git").mkdir(parents=True)
    log = tmp_path / "sent.jsonl"
    write_json(
        home / ".claude.json",
        {"mcpServers": {"t": {"command": PY, "args": [TASKS], "env": {"TASKS_LOG": str(log)}}}},
    )
    script = write_json(
        tmp_path / "s.json",
        {
            "model": "test",
            "turns": [
                {"tool_calls": [{"name": "mcp__t__count", "input": {"n": 2}}]},
                {"text": "counted"},
            ],
        },
    )
    out = subprocess.run(
        [PY, "-m", "keel", "-p", "count", "--model", f"scripted:{script}",
         "--output-format", "stream-json", "--allowed-tools", "mcp__t__count"],
        cwd=project, capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    finished = [e for e in lines if e.get("type") == "tool_finished"]
    assert [(e["name"], e["is_error"], e["output"]) for e in finished] == [
        ("mcp__t__count", False, "counted to 2")
    ]
    methods = [json.loads(x).get("method") for x in log.read_text(encoding="utf-8").splitlines()]
    assert methods[3:] == ["tools/call", "tasks/get", "tasks/get", "tasks/result"]
