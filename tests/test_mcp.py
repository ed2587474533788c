"""MCP servers as keel tools: configuration, real servers over stdio, streamable HTTP and SSE
(started from `tests/mcp_servers/`, on 127.0.0.1 only), tool naming and validation, result
mapping, failures (crash mid-call, timeouts, hung start, missing command) and clean shutdown."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import socket
import stat
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import pytest_asyncio

from keel.agent.tool_runner import check_call
from keel.llm.messages import Image, Text, ToolResult, ToolUse
from keel.mcp import (
    McpCallTimeout,
    McpManager,
    McpTool,
    RemoteTool,
    ServerConfig,
    ServerStatus,
    build_tools,
    describe,
    load_servers,
    tool_name,
)
from keel.mcp import client as mcp_client
from keel.mcp.tools import to_output
from keel.tools.base import Tool, ToolContext, ToolError, ToolOutput
from keel.tools.registry import Registry
from tests.helpers import free_port, user_settings_file

#: Async tests share one event loop per module, so they can share the servers below.
module_loop = pytest.mark.asyncio(loop_scope="module")

SERVER = str(Path(__file__).parent / "mcp_servers" / "tools_server.py")
PY = sys.executable
PIXEL_B64 = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
LONG_TOOL = "a_tool_with_a_very_long_name_that_will_not_fit_in_sixty_four_characters_at_all"
SERVER_TOOLS = [
    "big_picture",
    "crash",
    "document",
    "echo",
    "fails",
    "hang",
    "header",
    "picture",
    "search_web",
]


def long_name(server: str) -> str:
    digest = hashlib.sha256(f"{server}\0{LONG_TOOL}".encode()).hexdigest()[:8]
    prefix = f"mcp__{server}__"
    return prefix + LONG_TOOL[: 64 - 9 - len(prefix)] + "_" + digest


def expected_names(server: str) -> list[str]:
    return sorted([long_name(server), *(f"mcp__{server}__{t}" for t in SERVER_TOOLS)])


def write_json(path: Path, data: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def alive(pid: int) -> bool:
    """Whether the process or anything left in its process group still exists."""
    for probe in (os.kill, os.killpg):
        try:
            probe(pid, 0)
        except ProcessLookupError:
            continue
        return True
    return False


# -- configuration --------------------------------------------------------------------------


def test_mcp_json_broken_entries_are_reported_and_the_rest_load(tmp_path: Path) -> None:
    mcp_json = write_json(
        tmp_path / ".mcp.json",
        {
            "mcpServers": {
                "good": {"command": "srv", "args": ["--flag"], "env": {"A": "1"}},
                "badargs": {"command": "srv", "args": "--flag"},
                "nothing": {"env": {}},
                "badtype": {"type": "websocket", "url": "ws://x"},
                "remote": {"type": "streamable-http", "url": "https://example.test/mcp"},
                "extra": {"command": "srv", "oauth": {"client_id": "x"}},
            }
        },
    )
    servers, warnings = load_servers(tmp_path, [], {})
    assert [s.name for s in servers] == ["extra", "good", "remote"]
    assert warnings == [
        f"{mcp_json}: mcp server 'badargs': \"args\" must be a list of strings; skipped",
        f'{mcp_json}: mcp server \'nothing\': needs "command" (a local server) or "url" '
        "(a remote one); skipped",
        f'{mcp_json}: mcp server \'badtype\': "type" must be "stdio", "http" (or '
        '"streamable-http") or "sse", got \'websocket\'; skipped',
        f"{mcp_json}: mcp server 'extra': key(s) oauth ignored for a stdio server (keel signs "
        "in with OAuth by itself; a pre-registered client is not supported) (known: args, "
        "command, cwd, disabled, env, inherit_env, sandbox, timeout, type)",
    ]
    good = servers[1]
    assert good == ServerConfig(
        name="good",
        transport="stdio",
        source="project-shared",
        origin=str(mcp_json),
        command="srv",
        args=("--flag",),
        env=(("A", "1"),),
        canonical='{"args":["--flag"],"command":"srv","env":{"A":"1"},"name":"good"}',
    )
    assert servers[2].transport == "http"
    assert servers[2].url == "https://example.test/mcp"


def test_invalid_mcp_json_names_the_file_line_and_column(tmp_path: Path) -> None:
    (tmp_path / ".mcp.json").write_text('{"mcpServers": {,}}', encoding="utf-8")
    servers, warnings = load_servers(tmp_path, [], {})
    assert servers == []
    assert warnings == [
        f"{tmp_path / '.mcp.json'}:1:17: invalid JSON (Expecting property name enclosed in "
        "double quotes); no project MCP servers loaded"
    ]


def test_variables_are_expanded_and_a_missing_one_fails_only_its_server(tmp_path: Path) -> None:
    user_file = tmp_path / "user" / "settings.json"
    env = {"TOKEN": "s3cret", "BIN": "/opt/bin", "EMPTY": ""}
    servers, warnings = load_servers(
        tmp_path / "project",
        [
            (
                user_file,
                {
                    "local": {
                        "command": "${BIN}/server",
                        "args": ["--mode=${MODE:-fast}", "${EMPTY:-x}", "${EMPTY}"],
                        "env": {"API_TOKEN": "${TOKEN}"},
                    },
                    "remote": {
                        "type": "http",
                        "url": "https://${HOST:-api.example.test}/mcp",
                        "headers": {"Authorization": "Bearer ${TOKEN}"},
                    },
                    "broken": {"command": "server", "args": ["--key", "${NOT_SET}"]},
                },
            )
        ],
        env,
    )
    assert warnings == []
    by_name = {s.name: s for s in servers}
    assert by_name["local"].command == "/opt/bin/server"
    assert by_name["local"].args == ("--mode=fast", "x", "")
    assert by_name["local"].env == (("API_TOKEN", "s3cret"),)
    assert by_name["local"].error == ""
    assert by_name["remote"].url == "https://api.example.test/mcp"
    assert by_name["remote"].headers == (("Authorization", "Bearer s3cret"),)
    assert by_name["broken"].error == (
        "undefined variable ${NOT_SET} in args[1] (set it, or write ${NOT_SET:-default})"
    )
    assert {s.source for s in servers} == {"user"}
    # The broken server is listed as failed and never started; the others would start.
    manager = McpManager(servers, root=tmp_path, env=env, log_dir=tmp_path / "logs")
    states = {s.name: (s.state, s.detail) for s in manager.status()}
    assert states["broken"] == ("failed", by_name["broken"].error)
    assert states["local"] == ("connecting", "starting")


def test_sources_precedence_and_the_approval_hash(tmp_path: Path) -> None:
    root = tmp_path / "project"
    entry = {"command": "srv", "args": ["${ARG:-a}"]}
    write_json(root / ".mcp.json", {"mcpServers": {"shared": entry, "both": entry}})
    user = tmp_path / "home" / "settings.json"
    shared = root / ".keel" / "settings.json"
    local = root / ".keel" / "settings.local.json"
    deep = root / "sub" / ".keel" / "settings.json"
    servers, warnings = load_servers(
        root,
        [
            (user, {"both": {"command": "user-srv"}, "mine": {"command": "m"}}),
            (shared, {"team": {"command": "t"}}),
            (local, {"both": {"command": "local-srv"}}),
            (deep, {"deep": {"command": "d"}}),
        ],
        {},
    )
    assert warnings == []
    # Every file inside the project tree came with it, whatever its name or depth: only the
    # user's own files (outside the project) start servers without an approval.
    assert [(s.name, s.source, s.command) for s in servers] == [
        ("both", "project-shared", "local-srv"),
        ("deep", "project-shared", "d"),
        ("mine", "user", "m"),
        ("shared", "project-shared", "srv"),
        ("team", "project-shared", "t"),
    ]
    by_name = {s.name: s for s in servers}
    assert not by_name["mine"].needs_approval
    assert by_name["mine"].approved(set())
    assert by_name["both"].needs_approval
    assert by_name["deep"].needs_approval
    pinned = by_name["shared"]
    assert pinned.needs_approval
    assert not pinned.approved(set())
    assert pinned.approved({pinned.config_hash()})
    assert pinned.config_hash() == hashlib.sha256(pinned.canonical.encode()).hexdigest()

    def shared_hash(entry: dict[str, Any], env: dict[str, str]) -> str:
        write_json(root / ".mcp.json", {"mcpServers": {"shared": entry}})
        (server,), _ = load_servers(root, [], env)
        return server.config_hash()

    # Hashes pin the entry as written: a different environment or `disabled` keep the approval,
    # any other change needs a new one.
    assert shared_hash(entry, {"ARG": "other"}) == pinned.config_hash()
    assert shared_hash({**entry, "disabled": True}, {}) == pinned.config_hash()
    assert shared_hash({**entry, "args": ["b"]}, {}) != pinned.config_hash()


def test_tool_names_are_sanitised_bounded_and_unique() -> None:
    assert tool_name("git hub", "search.code") == "mcp__git_hub__search_code"
    assert tool_name("srv", "ünïcode tool") == "mcp__srv___n_code_tool"
    name = tool_name("srv", "x" * 100)
    assert len(name) == 64
    assert name.startswith("mcp__srv__xxxx")
    assert name != tool_name("srv", "x" * 101)  # the hash keeps truncated names apart
    assert len(tool_name("s" * 80, "t")) == 64


def test_importing_keel_mcp_loads_no_sdk() -> None:
    code = (
        "import sys, keel.mcp; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'mcp', 'mcp_types', 'anyio', 'httpx2', 'jsonschema', 'pydantic'}))"
    )
    out = subprocess.run([PY, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_tool_definitions_from_listings() -> None:
    class Listing:
        def status(self) -> list[ServerStatus]:
            config = ServerConfig("a.b", "stdio", "user", "x", command="srv")
            twin = ServerConfig("a_b", "stdio", "user", "x", command="srv")
            tool = RemoteTool("x", "d" * 5000, {}, read_only_hint=True)
            safe = RemoteTool("y", "", {"type": "object"}, "Why", True, False)
            return [
                ServerStatus(config, "connected", "", (tool, safe)),
                ServerStatus(twin, "connected", "", (tool,)),
                ServerStatus(twin, "failed", "", (tool,)),
            ]

    tools = build_tools(cast(McpManager, Listing()))
    assert [(t.name, t.server, t.remote_name, t.read_only) for t in tools] == [
        ("mcp__a_b__x", "a.b", "x", False),
        ("mcp__a_b__x_2", "a_b", "x", False),
        ("mcp__a_b__y", "a.b", "y", True),
    ]
    assert all(isinstance(t, Tool) for t in tools)
    assert tools[0].description == "d" * 2047 + "…"
    assert tools[0].input_schema == {"type": "object"}
    assert tools[2].description == "Why"


def test_results_map_to_keel_blocks() -> None:
    from mcp_types import (
        AudioContent,
        CallToolResult,
        ImageContent,
        ResourceLink,
        TextContent,
    )

    result = CallToolResult(
        content=[
            TextContent(text="hello"),
            *[ImageContent(data=PIXEL_B64, mime_type="image/png") for _ in range(5)],
            ImageContent(data=PIXEL_B64, mime_type="image/bmp"),
            AudioContent(data="AAAA", mime_type="audio/wav"),
            ResourceLink(name="spec", uri="file:///spec.md"),
        ]
    )
    image = Image("image/png", PIXEL_B64)
    assert to_output(result) == ToolOutput(
        (
            Text("hello"),
            image,
            image,
            image,
            image,
            Text("[image/png image omitted: at most 4 images per call]"),
            Text("[image/bmp image of 70 bytes omitted: only PNG, JPEG, GIF, WebP]"),
            Text("[audio/wav audio of 3 bytes omitted: audio is not supported]"),
            Text("[resource spec: file:///spec.md]"),
        )
    )
    structured = CallToolResult(content=[], structured_content={"n": 1}, is_error=True)
    assert to_output(structured) == ToolOutput((Text('{"n": 1}'),), is_error=True)


# -- real servers ---------------------------------------------------------------------------


def _wait_for_port(port: int, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"test MCP server exited: {log.read_text(encoding='utf-8')}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"test MCP server did not listen on {port}")


@pytest.fixture(scope="module")
def remote_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, int]]:
    """The test server over streamable HTTP and over SSE, as subprocesses on 127.0.0.1."""
    logs = tmp_path_factory.mktemp("remote-logs")
    ports = {"http": free_port(), "sse": free_port()}
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for mode, port in ports.items():
            with (logs / f"{mode}.log").open("wb") as log:
                processes.append(
                    subprocess.Popen(
                        [PY, SERVER, mode, str(port)], stdout=log, stderr=subprocess.STDOUT
                    )
                )
        for (mode, port), process in zip(ports.items(), processes, strict=True):
            _wait_for_port(port, process, logs / f"{mode}.log")
        yield ports
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mcp-project")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def manager(remote_servers: dict[str, int], project: Path) -> AsyncIterator[McpManager]:
    """One manager over every kind of server; tests that break a server use their own."""
    write_json(project / ".mcp.json", {"mcpServers": {"team": {"command": PY, "args": [SERVER]}}})
    env = {**os.environ, "KEEL_TEST_TOKEN": "tok-123"}
    http, sse = remote_servers["http"], remote_servers["sse"]
    servers, warnings = load_servers(
        project,
        [
            (
                project.parent / "user-settings.json",  # the user's own: outside the project
                {
                    "main": {"command": PY, "args": [SERVER]},
                    "crashy": {"command": PY, "args": [SERVER]},
                    "web": {
                        "type": "http",
                        "url": f"http://127.0.0.1:{http}/mcp",
                        "headers": {"X-Token": "${KEEL_TEST_TOKEN}"},
                        "timeout": 1,
                    },
                    "events": {"type": "sse", "url": f"http://127.0.0.1:{sse}/sse"},
                    "off": {"command": PY, "args": [SERVER], "disabled": True},
                    "unset": {"command": PY, "args": ["${KEEL_TEST_UNSET}"]},
                },
            )
        ],
        env,
    )
    assert warnings == []
    # No restarts here: the crash test below checks what a server that stays down does.
    async with McpManager(
        servers, root=project, env=env, log_dir=project / "logs", connect_timeout=20, max_restarts=0
    ) as m:
        assert await m.wait_ready(30)
        yield m


def ctx(root: Path) -> ToolContext:
    return ToolContext(cwd=root, root=root)


def tools_by_name(manager: McpManager) -> dict[str, McpTool]:
    return {t.name: t for t in manager.tools()}


@module_loop
async def test_states_and_the_list_command(manager: McpManager) -> None:
    team = manager.server("team").config
    assert {s.name: (s.state, s.detail) for s in manager.status()} == {
        "crashy": ("connected", "10 tools"),
        "events": ("connected", "10 tools"),
        "main": ("connected", "10 tools"),
        "off": ("disabled", "disabled in its config"),
        "team": (
            "needs approval",
            "not started: a project server runs only once approved "
            f"(config hash {team.config_hash()[:12]})",
        ),
        "unset": (
            "failed",
            "undefined variable ${KEEL_TEST_UNSET} in args[0] "
            "(set it, or write ${KEEL_TEST_UNSET:-default})",
        ),
        "web": ("connected", "10 tools"),
    }
    assert manager.server("team").pid is None
    assert describe(manager) == [
        "crashy  connected       (stdio, user)            10 tools",
        "events  connected       (sse, user)              10 tools",
        "main    connected       (stdio, user)            10 tools",
        "off     disabled        (stdio, user)            disabled in its config",
        "team    needs approval  (stdio, project-shared)  " + manager.server("team").detail,
        "unset   failed          (stdio, user)            " + manager.server("unset").detail,
        "web     connected       (http, user)             10 tools",
    ]


@module_loop
async def test_tools_are_named_sorted_and_described(manager: McpManager) -> None:
    tools = manager.tools()
    assert [t.name for t in tools] == sorted(
        n for server in ("crashy", "events", "main", "web") for n in expected_names(server)
    )
    assert all(len(t.name) <= 64 for t in tools)
    by_name = tools_by_name(manager)
    echo = by_name["mcp__main__echo"]
    assert (echo.server, echo.remote_name, echo.description) == (
        "main",
        "echo",
        "Return the text, repeated.",
    )
    assert echo.input_schema == {
        "properties": {
            "text": {"title": "Text", "type": "string"},
            "times": {"default": 1, "title": "Times", "type": "integer"},
        },
        "required": ["text"],
        "title": "echoArguments",
        "type": "object",
    }
    # Read-only needs readOnlyHint true AND openWorldHint false; the spec defaults open-world.
    read_only = sorted(t.name for t in tools if t.read_only)
    assert read_only == [f"mcp__{s}__echo" for s in ("crashy", "events", "main", "web")]
    assert by_name["mcp__main__search_web"].remote_name == "search.web"
    assert by_name[long_name("main")].remote_name == LONG_TOOL


@module_loop
async def test_calls_return_text_over_every_transport(manager: McpManager, project: Path) -> None:
    by_name = tools_by_name(manager)
    for server in ("main", "web", "events"):
        out = await by_name[f"mcp__{server}__echo"].run(ctx(project), {"text": "hi", "times": 2})
        assert out == ToolOutput((Text("hi hi"),))
    # The header's value came from ${KEEL_TEST_TOKEN}.
    header = await by_name["mcp__web__header"].run(ctx(project), {"name": "x-token"})
    assert header == ToolOutput((Text("tok-123"),))


@module_loop
async def test_invalid_arguments_are_refused_before_any_call(manager: McpManager) -> None:
    echo = tools_by_name(manager)["mcp__main__echo"]
    assert echo.validate({"text": "ok"}) is None
    assert echo.validate({"times": "2"}) == (
        "'text' is a required property\ntimes: '2' is not of type 'integer'"
    )
    assert echo.validate(["text"]) == "arguments must be a JSON object, got list"
    registry = Registry([echo])
    checked = check_call(ToolUse("t1", "mcp__main__echo", {"text": 5}), registry)
    assert checked == ToolResult(
        "t1", (Text("INVALID_ARGUMENTS: text: 5 is not of type 'string'"),), is_error=True
    )


@module_loop
async def test_images_errors_and_resources(manager: McpManager, project: Path) -> None:
    by_name = tools_by_name(manager)
    picture = await by_name["mcp__main__picture"].run(ctx(project), {})
    assert picture == ToolOutput((Image("image/png", PIXEL_B64),))
    big = await by_name["mcp__main__big_picture"].run(ctx(project), {})
    assert big == ToolOutput(
        (Text("[image/png image of 5.0 MB omitted: images over 5 MB are not sent to the model]"),)
    )
    fails = await by_name["mcp__events__fails"].run(ctx(project), {})
    assert fails == ToolOutput((Text("the widget is jammed"),), is_error=True)
    document = await by_name["mcp__main__document"].run(ctx(project), {})
    assert document == ToolOutput(
        (
            Text("see attached"),
            Text("note body"),
            Text("[application/octet-stream resource file:///data.bin (3 bytes) omitted: binary]"),
        )
    )


@module_loop
async def test_a_call_that_never_answers_times_out_and_the_server_stays(
    manager: McpManager, project: Path
) -> None:
    by_name = tools_by_name(manager)
    start = time.monotonic()
    with pytest.raises(ToolError) as caught:
        await by_name["mcp__web__hang"].run(ctx(project), {})
    assert 0.9 < time.monotonic() - start < 15  # the 1 s timeout, not a hang
    assert str(caught.value) == (
        'mcp server "web": tool "hang" did not answer within 1 s and was cancelled; the server '
        'is still connected (its "timeout" setting raises the limit)'
    )
    assert manager.server("web").state == "connected"
    echo = await by_name["mcp__web__echo"].run(ctx(project), {"text": "still here"})
    assert echo == ToolOutput((Text("still here"),))


@module_loop
async def test_a_cancelled_caller_cancels_the_call(manager: McpManager, project: Path) -> None:
    call = asyncio.ensure_future(manager.call("main", "hang", {}, timeout=60))
    await asyncio.sleep(0.3)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    with pytest.raises(McpCallTimeout):
        await manager.call("main", "hang", {}, timeout=0.2)
    assert to_output(await manager.call("main", "echo", {"text": "x"})) == ToolOutput((Text("x"),))


@module_loop
async def test_a_server_crash_mid_call_fails_only_that_server(
    manager: McpManager, project: Path
) -> None:
    by_name = tools_by_name(manager)
    pid = manager.server("crashy").pid
    assert pid is not None
    with pytest.raises(ToolError) as caught:
        await by_name["mcp__crashy__crash"].run(ctx(project), {})
    assert str(caught.value) == (
        'mcp server "crashy" crashed during the call (exit code 1; last stderr line: boom: the '
        "server is going down); its tools are unavailable until keel restarts"
    )
    status = manager.server("crashy")
    assert (status.state, status.detail) == (
        "failed",
        "exited with code 1: boom: the server is going down",
    )
    assert not alive(pid)
    assert not any(t.name.startswith("mcp__crashy__") for t in manager.tools())
    with pytest.raises(ToolError) as again:
        await by_name["mcp__crashy__echo"].run(ctx(project), {"text": "x"})
    assert str(again.value) == (
        'mcp server "crashy" is not available (exited with code 1: boom: the server is going '
        "down); its tools are unavailable until keel restarts"
    )
    # The others are untouched.
    echo = await by_name["mcp__main__echo"].run(ctx(project), {"text": "fine"})
    assert echo == ToolOutput((Text("fine"),))
    assert {s.name for s in manager.status() if s.state == "connected"} == {"main", "web", "events"}


@module_loop
async def test_startup_failures_have_one_line_reasons(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mcp_client, "STOP_GRACE", 0.3)
    unused = free_port()
    sleepy = (
        "import sys, time; print('loading the index', file=sys.stderr, flush=True); time.sleep(60)"
    )
    dies = "import sys; print('starting', file=sys.stderr); sys.exit('fatal: no config file')"
    servers, _ = load_servers(
        tmp_path,
        [
            (
                user_settings_file(),
                {
                    "ghost": {"command": "no-such-mcp-server-xyz"},
                    "dies": {"command": PY, "args": ["-c", dies]},
                    "sleepy": {"command": PY, "args": ["-c", sleepy]},
                    "nowhere": {"command": PY, "cwd": "missing-dir"},
                    "refused": {"type": "http", "url": f"http://127.0.0.1:{unused}/mcp"},
                    "gone": {"type": "sse", "url": f"http://127.0.0.1:{unused}/sse"},
                },
            )
        ],
        dict(os.environ),
    )
    logs = tmp_path / "logs"
    async with McpManager(
        servers, root=tmp_path, env=os.environ, log_dir=logs, connect_timeout=1
    ) as m:
        assert await m.wait_ready(15)
        states = {s.name: (s.state, s.detail) for s in m.status()}
        pids = [s.pid for s in m.status() if s.pid is not None]
    refused = f"cannot connect to http://127.0.0.1:{unused}/mcp (All connection attempts failed)"
    assert states == {
        "dies": ("failed", "exited with code 1: fatal: no config file"),
        "ghost": ("failed", "command not found: no-such-mcp-server-xyz"),
        "gone": ("failed", refused.replace("/mcp", "/sse")),
        "nowhere": ("failed", f"working directory not found: {tmp_path / 'missing-dir'}"),
        "refused": ("failed", refused),
        "sleepy": (
            "failed",
            "timed out connecting after 1 s (last stderr line: loading the index)",
        ),
    }
    log = logs / "mcp-dies.log"
    assert "starting\nfatal: no config file\n" in log.read_text(encoding="utf-8")
    assert stat.S_IMODE(log.stat().st_mode) == 0o600
    assert len(pids) == 2
    assert not any(alive(pid) for pid in pids)


@module_loop
async def test_project_servers_start_only_once_approved_and_close_cleanly(
    tmp_path: Path,
) -> None:
    write_json(tmp_path / ".mcp.json", {"mcpServers": {"team": {"command": PY, "args": [SERVER]}}})
    (server,), _ = load_servers(tmp_path, [], os.environ)
    async with McpManager(
        [server], root=tmp_path, env=os.environ, log_dir=tmp_path / "logs"
    ) as unapproved:
        assert await unapproved.wait_ready(0)
        assert unapproved.server("team").state == "needs approval"
        assert unapproved.tools() == []
    approved = McpManager(
        [server],
        root=tmp_path,
        env=os.environ,
        log_dir=tmp_path / "logs",
        approved={server.config_hash()},
    )
    approved.start()
    try:
        assert await approved.wait_ready(30)
        status = approved.server("team")
        assert (status.state, status.detail) == ("connected", "10 tools")
        assert [t.name for t in approved.tools()] == expected_names("team")
        assert status.pid is not None
        assert alive(status.pid)
        echo = approved.tools()[0]
    finally:
        start = time.monotonic()
        await approved.aclose()
    assert time.monotonic() - start < 15  # stopped, not waited for
    assert not alive(status.pid)
    assert approved.server("team").detail == "10 tools; stopped"
    assert approved.tools() == []
    with pytest.raises(ToolError, match='mcp server "team" was shut down'):
        await echo.run(ctx(tmp_path), {})
