"""Connections to MCP servers: starting them, their state, tool calls, and shutting them down.

`McpManager` owns one long-lived asyncio task per enabled, approved server. That task enters the
transport and the `mcp.ClientSession` context managers, serves every tool call for that server
(calls arrive through an `asyncio.Queue`; each runs as a child of the session's task group), and
exits the context managers again, all in the same task. The `mcp` SDK is built on anyio task
groups and cancel scopes, which must be exited by the task that entered them ("attempted to exit
cancel scope in a different task"), so nothing else ever touches a session directly: callers
only put a `_Call` on the queue and await its future. One anyio cancel scope spans the task's
life: its deadline bounds the connect (30 s by default); cancelling it (from `aclose()`, or when
the server is lost) unwinds everything in order.

stdio servers run through keel's own small transport (`_stdio_transport`) rather than
`mcp.client.stdio.stdio_client`, because keel must know the child's pid and exit code (for
`failed: exited with code 1: <last stderr line>` and for making sure `aclose()` leaves no
process behind) and the SDK's transport keeps the process to itself. It speaks the same
newline-delimited JSON-RPC with the SDK's message types, starts the server in its own process
group with the project root as cwd (or the entry's `cwd` below it), the environment the caller
gives plus the entry's `env`, and stderr appended to `<log_dir>/mcp-<name>.log` (0600), and
stops it the way the spec says (close stdin, wait, SIGTERM the group, SIGKILL).

A stdio server gets the variables its entry declares plus a safe base (`SAFE_ENV`: PATH, HOME,
locale…; never keel's API keys) unless its entry says `inherit_env: true`; with `sandbox: true`
it runs under keel's bubblewrap sandbox (keel.permissions.sandbox), and refuses to start when
the sandbox cannot run. A server that drops after it connected is restarted (stdio) or
reconnected (http, sse) `max_restarts` times with a doubling delay; its tools keep their names.
The manager also answers the server's own requests: `roots/list` (the project root),
`sampling/createMessage` (through `sampler`) and `elicitation/create` (through `elicitor`),
refusing each one that has no handler; it reads prompts and resources for the front ends,
forwards progress of tool calls, and notices `list_changed` notifications (`on_notice`).

This module must never import `mcp`, `anyio` or `httpx2` at module level (keel's startup stays
cheap: importing the SDK costs over a second, and it happens in a worker thread, only once a
server is started), and never touch a session outside its owner task.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import re
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal, TypeAlias

from keel.frozen import frozen, mutable
from keel.mcp.config import ServerConfig
from keel.mcp.tasks import TTL_MARGIN, TaskCalls, TaskEnded

if TYPE_CHECKING:
    import anyio
    import httpx2
    from anyio.abc import Process
    from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
    from mcp import ClientSession, MCPError
    from mcp.client._transport import TransportStreams
    from mcp.client.session import ClientRequestContext, IncomingMessage
    from mcp.shared.jsonrpc_dispatcher import JSONRPCDispatcher
    from mcp.shared.message import SessionMessage
    from mcp_types import (
        CallToolResult,
        CreateMessageRequestParams,
        CreateMessageResult,
        ElicitRequestParams,
        ElicitResult,
        ErrorData,
        ListRootsResult,
        ServerCapabilities,
        TaskStatusNotificationParams,
    )
    from mcp_types import Tool as ToolDefinition

    from keel.mcp.tools import McpTool
    from keel.permissions.sandbox import Sandbox

State: TypeAlias = Literal["connecting", "connected", "failed", "needs approval", "disabled"]

#: Seconds a server may take to start, initialise and list its tools.
CONNECT_TIMEOUT = 30.0
#: Seconds `aclose()` waits for servers to stop before it kills what is left.
CLOSE_TIMEOUT = 8.0
#: Seconds a stdio server gets to exit after its stdin closes, and again after SIGTERM.
STOP_GRACE = 2.0
#: Pages of `tools/list` read at most (a server that paginates forever cannot hang a connect).
MAX_TOOL_PAGES = 100
#: Times a server that dropped after connecting is restarted (stdio) or reconnected (http).
MAX_RESTARTS = 3
#: Seconds before the first restart; each next one waits twice as long.
RESTART_DELAY = 0.5

#: What a stdio server gets of keel's environment unless its entry says `inherit_env: true`
#: (fnmatch patterns, case-insensitive): what a program needs to run, never a credential.
SAFE_ENV: tuple[str, ...] = (
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM", "TZ", "LANG", "LANGUAGE", "LC_*",
    "TMPDIR", "TMP", "TEMP", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME",
    "XDG_STATE_HOME", "XDG_RUNTIME_DIR", "NO_COLOR", "SSL_CERT_FILE", "SSL_CERT_DIR",
    "NODE_EXTRA_CA_CERTS", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY",
    # Windows: what a process needs to start at all.
    "SYSTEMROOT", "SYSTEMDRIVE", "COMSPEC", "PATHEXT", "WINDIR", "APPDATA", "LOCALAPPDATA",
    "USERPROFILE", "PROGRAMFILES", "PROGRAMDATA",
)  # fmt: skip
#: A value that carries a password in a URL (a proxy's `http://user:secret@host`) is left out.
_URL_WITH_PASSWORD = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/\s@:]*:[^/\s@]+@")


def server_env(config: ServerConfig, env: Mapping[str, str]) -> dict[str, str]:
    """The environment a stdio server starts with: the safe base of `env` (all of it with
    `inherit_env`), then the variables its entry declares (those win)."""
    if config.inherit_env:
        base = dict(env)
    else:
        base = {
            k: v
            for k, v in env.items()
            if any(fnmatchcase(k.upper(), p) for p in SAFE_ENV) and not _URL_WITH_PASSWORD.search(v)
        }
    return {**base, **dict(config.env)}


class McpCallError(Exception):
    """A tool call that produced no result. The message says what happened, for the model."""

    def __init__(self, server: str, message: str) -> None:
        super().__init__(message)
        self.server = server


class McpServerUnavailable(McpCallError):
    """The server was not connected when the call was made (still connecting, failed, closed)."""


class McpServerLost(McpCallError):
    """The server crashed or disconnected during the call; it is now marked failed."""


class McpCallTimeout(McpCallError):
    """The tool did not answer within the per-call timeout; the call was cancelled."""


class McpRemoteError(McpCallError):
    """The server answered the call with a protocol error (unknown tool, invalid params…)."""


@frozen
class RemoteTool:
    """A tool as a server listed it, without SDK types."""

    name: str
    description: str
    input_schema: dict[str, Any]
    title: str = ""
    read_only_hint: bool | None = None
    open_world_hint: bool | None = None
    destructive_hint: bool | None = None
    idempotent_hint: bool | None = None
    #: `execution.taskSupport`: "required" tools are called as tasks (keel.mcp.tasks).
    task_support: Literal["forbidden", "optional", "required"] = "forbidden"


@frozen
class PromptArgument:
    name: str
    description: str = ""
    required: bool = False


@frozen
class RemotePrompt:
    """A prompt as a server listed it."""

    name: str
    description: str = ""
    arguments: tuple[PromptArgument, ...] = ()


@frozen
class RemoteResource:
    """A resource as a server listed it."""

    server: str
    uri: str
    name: str = ""
    description: str = ""
    mime_type: str = ""


@frozen
class ResourceContent:
    """One part of a read resource: its text, or (binary) its size only."""

    uri: str
    mime_type: str = ""
    text: str | None = None
    #: Bytes of a binary part (its data is not passed on).
    size: int = 0


@frozen
class SamplingAsk:
    """A server's `sampling/createMessage`, without SDK types: text messages only."""

    server: str
    messages: tuple[tuple[str, str], ...]
    system: str
    max_tokens: int


@frozen
class SamplingAnswer:
    text: str
    model: str
    stop_reason: str = "endTurn"


@frozen
class ElicitAsk:
    """A server's `elicitation/create` (form mode): a message and the fields' JSON schema."""

    server: str
    message: str
    schema: dict[str, Any]


#: Answers a sampling request, or returns why it was refused.
Sampler: TypeAlias = Callable[[SamplingAsk], Awaitable[SamplingAnswer | str]]
#: The user's answer to an elicitation: the values (accept), None (decline), or why it was
#: refused (no one to ask).
Elicitor: TypeAlias = Callable[[ElicitAsk], Awaitable[dict[str, Any] | str | None]]
#: Progress of a running tool call: (progress, total, message).
ProgressSink: TypeAlias = Callable[[float, float | None, str | None], None]


@frozen
class ServerStatus:
    """A snapshot of one server, for `keel mcp list`, notices and tests."""

    config: ServerConfig
    state: State
    #: Why it failed, how many tools it has, or what it is waiting for.
    detail: str
    tools: tuple[RemoteTool, ...] = ()
    #: The stdio server's process id while it runs (and after, for diagnostics).
    pid: int | None = None
    log_file: Path | None = None
    prompts: tuple[RemotePrompt, ...] = ()
    #: Whether the server offers resources.
    resources: bool = False
    #: Times it was restarted (or reconnected) after it dropped.
    restarts: int = 0

    @property
    def name(self) -> str:
        return self.config.name


@mutable(eq=False)
class _Call:
    tool: str
    args: dict[str, Any]
    timeout: float
    future: asyncio.Future[Any]
    #: The anyio scope the call runs in, once it started (the caller cancels it on interrupt).
    scope: anyio.CancelScope | None = None
    #: Anything but a tool call: run with the session (prompts, resources, a tools refresh).
    op: Callable[[ClientSession], Awaitable[Any]] | None = None
    on_progress: ProgressSink | None = None


@mutable(eq=False)
class _Server:
    """One server's mutable state; written only by its owner task (and `McpManager.aclose`)."""

    config: ServerConfig
    state: State
    detail: str = ""
    tools: tuple[RemoteTool, ...] = ()
    pid: int | None = None
    log_file: Path | None = None
    settled: asyncio.Event = field(default_factory=asyncio.Event)
    queue: asyncio.Queue[_Call] = field(default_factory=asyncio.Queue)
    pending: set[_Call] = field(default_factory=set)
    task: asyncio.Task[None] | None = None
    life: anyio.CancelScope | None = None
    stopping: bool = False
    #: Set once the transport began shutting down (EOF on stdout is then expected).
    closing: bool = False
    #: Why the connection ended while serving (set before the life scope is cancelled).
    lost: str = ""
    returncode: int | None = None
    #: Whether keel had to signal the process (it did not exit by itself).
    killed: bool = False
    log_offset: int = 0
    #: The last HTTP error status an http/sse server answered with.
    http_error: str = ""
    prompts: tuple[RemotePrompt, ...] = ()
    resources: bool = False
    #: Connected at least once (only such a server is restarted when it drops).
    was_connected: bool = False
    restarts: int = 0
    #: Task-augmented calls of this connection (None: the server offers no tasks for tools).
    tasks: TaskCalls | None = None
    #: Tools left out because they must be called as tasks and the server offers none.
    left_out: tuple[str, ...] = ()

    def snapshot(self) -> ServerStatus:
        return ServerStatus(
            self.config,
            self.state,
            self.detail,
            self.tools,
            self.pid,
            self.log_file,
            self.prompts,
            self.resources,
            self.restarts,
        )

    def last_stderr_line(self) -> str:
        if self.log_file is None:
            return ""
        try:
            with self.log_file.open("rb") as f:
                end = f.seek(0, os.SEEK_END)
                f.seek(max(self.log_offset, end - 4096))
                tail = f.read()
        except OSError:
            return ""
        lines = [ln.strip() for ln in tail.decode("utf-8", "replace").splitlines() if ln.strip()]
        return lines[-1][:200] if lines else ""

    def exit_description(self) -> str:
        """`exit code 1`, `killed by signal 9`, or '' if the process is unknown or still ran."""
        code = self.returncode
        if code is None or self.killed:
            return ""
        if code < 0:
            try:
                return f"killed by signal {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exit code {code}"

    def exit_reason(self) -> str:
        """`exited with code 3: <last stderr line>` (or `killed by signal …`)."""
        code = self.returncode
        reason = (
            f"exited with code {code}"
            if code is not None and code >= 0
            else self.exit_description()
        )
        line = self.last_stderr_line()
        return f"{reason}: {line}" if line else reason


class McpManager:
    """Starts the configured MCP servers in the background and serves their tool calls.

    `start()` (or `async with`) schedules one connect per enabled and approved server;
    `wait_ready()` waits for them to settle; `tools()` are the tools of the servers connected
    at that moment; `call()` runs one tool; `aclose()` stops everything, bounded in time."""

    def __init__(
        self,
        servers: Sequence[ServerConfig],
        *,
        root: Path,
        env: Mapping[str, str],
        log_dir: Path,
        approved: Collection[str] = (),
        connect_timeout: float = CONNECT_TIMEOUT,
        max_restarts: int = MAX_RESTARTS,
        auth_dir: Path | None = None,
    ) -> None:
        self.root = root
        self.env = dict(env)
        self.log_dir = log_dir
        self.connect_timeout = connect_timeout
        self.max_restarts = max_restarts
        #: Where OAuth tokens of http servers are kept (None: no OAuth sign-in).
        self.auth_dir = auth_dir
        #: Shows the user an OAuth sign-in URL (server, url); None refuses sign-ins (headless).
        self.open_url: Callable[[str, str], Awaitable[None]] | None = None
        #: Told what the user should know (a changed tool list, a restart): (text, level).
        self.on_notice: Callable[[str, str], None] | None = None
        #: Answers servers' sampling requests (None: refused).
        self.sampler: Sampler | None = None
        #: Asks the user a server's elicitation (None: refused).
        self.elicitor: Elicitor | None = None
        #: Told the progress of tool calls: (keel call id, progress, total, message).
        self.on_tool_progress: Callable[[str, float, float | None, str | None], None] | None = None
        self._approved = frozenset(approved)
        self._servers: dict[str, _Server] = {}
        self._sdk: asyncio.Future[None] | None = None
        self._closed = False
        for config in servers:
            self._servers[config.name] = self._initial(config)

    def _initial(self, config: ServerConfig) -> _Server:
        if config.error:
            server = _Server(config, "failed", config.error)
        elif config.disabled:
            server = _Server(config, "disabled", "disabled in its config")
        elif not config.approved(self._approved):
            server = _Server(
                config,
                "needs approval",
                f"not started: a project server runs only once approved "
                f"(config hash {config.config_hash()[:12]})",
            )
        else:
            return _Server(config, "connecting", "starting")
        server.settled.set()
        return server

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Begin connecting every enabled, approved server. Needs a running event loop."""
        if self._closed:
            raise RuntimeError("McpManager.start() after aclose()")
        for server in self._servers.values():
            if server.state == "connecting" and server.task is None:
                server.task = asyncio.get_running_loop().create_task(
                    self._own(server), name=f"mcp server {server.config.name}"
                )

    async def __aenter__(self) -> McpManager:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # A timeout parameter (ASYNC109) on purpose: a caller's cancel scope would raise, while
    # this answers whether everything settled, for the notice at the first prompt.
    async def wait_ready(self, timeout: float) -> bool:  # noqa: ASYNC109
        """Wait up to `timeout` seconds for every connect to settle (connected or failed).
        True if none is still connecting."""
        waiting = [s.settled.wait() for s in self._servers.values() if not s.settled.is_set()]
        if not waiting:
            return True
        try:
            await asyncio.wait_for(asyncio.gather(*waiting), timeout)
        except TimeoutError:
            return False
        return True

    async def aclose(self) -> None:
        """Stop every server (stdio processes terminated, HTTP sessions closed). Bounded: after
        `CLOSE_TIMEOUT` seconds the owner tasks are cancelled and leftover process groups
        killed."""
        self._closed = True
        tasks = []
        for server in self._servers.values():
            server.stopping = True
            if server.life is not None:
                server.life.cancel()
            if server.task is not None and not server.task.done():
                tasks.append(server.task)
        if not tasks:
            return
        _, late = await asyncio.wait(tasks, timeout=CLOSE_TIMEOUT)
        for task in late:
            task.cancel()
        if late:
            await asyncio.wait(late, timeout=STOP_GRACE)
        for server in self._servers.values():
            if server.task in late:  # its own shutdown did not finish: make sure nothing lives
                _kill_group(server.pid)

    # -- state -------------------------------------------------------------------------------

    def status(self) -> list[ServerStatus]:
        """Every configured server, sorted by name."""
        return [self._servers[name].snapshot() for name in sorted(self._servers)]

    def server(self, name: str) -> ServerStatus:
        return self._servers[name].snapshot()

    def tools(self) -> list[McpTool]:
        """Keel tools for every tool of the servers connected now, sorted by name (none once
        the manager is closed)."""
        if self._closed:
            return []
        from keel.mcp.tools import build_tools  # tools imports this module; no cycle at load

        return build_tools(self)

    # -- calls -------------------------------------------------------------------------------

    # A timeout parameter (ASYNC109) on purpose: the owner task enforces it around the request
    # so that the server is told to cancel; a caller's cancel scope could not do that.
    async def call(
        self,
        server: str,
        tool: str,
        args: dict[str, Any],
        timeout: float | None = None,  # noqa: ASYNC109
        *,
        on_progress: ProgressSink | None = None,
    ) -> CallToolResult:
        """Run `tool` on `server` and return the SDK's raw result. `timeout` defaults to the
        server's configured per-call timeout; `on_progress` hears the server's progress
        notifications. Raises a `McpCallError` subclass when there is no result (its message
        is meant for the model)."""
        result: CallToolResult = await self._submit(
            server, tool, args, timeout, on_progress=on_progress
        )
        return result

    async def get_prompt(self, server: str, name: str, args: dict[str, str]) -> list[str]:
        """The text of each message of prompt `name` with `args` (images and other content
        as a one-line note)."""

        async def op(session: ClientSession) -> list[str]:
            got = await session.get_prompt(name, args)
            return [_content_text(m.content) for m in got.messages]

        texts: list[str] = await self._submit(server, f"prompt {name}", {}, None, op=op)
        return texts

    async def list_resources(self, server: str) -> list[RemoteResource]:
        """Every resource `server` lists (up to `MAX_TOOL_PAGES` pages)."""

        async def op(session: ClientSession) -> list[RemoteResource]:
            from mcp_types import PaginatedRequestParams

            found: list[RemoteResource] = []
            cursor: str | None = None
            for _ in range(MAX_TOOL_PAGES):
                params = PaginatedRequestParams(cursor=cursor) if cursor else None
                page = await session.list_resources(params=params)
                found += [
                    RemoteResource(
                        server, str(r.uri), r.name, r.description or "", r.mime_type or ""
                    )
                    for r in page.resources
                ]
                cursor = page.next_cursor
                if not cursor:
                    break
            return found

        resources: list[RemoteResource] = await self._submit(
            server, "resources/list", {}, None, op=op
        )
        return resources

    async def read_resource(self, server: str, uri: str) -> list[ResourceContent]:
        async def op(session: ClientSession) -> list[ResourceContent]:
            from mcp_types import TextResourceContents

            got = await session.read_resource(uri)
            return [
                ResourceContent(str(c.uri), c.mime_type or "", c.text)
                if isinstance(c, TextResourceContents)
                else ResourceContent(str(c.uri), c.mime_type or "", None, _b64_size(c.blob))
                for c in got.contents
            ]

        contents: list[ResourceContent] = await self._submit(
            server, f"resource {uri}", {}, None, op=op
        )
        return contents

    async def _submit(
        self,
        server: str,
        tool: str,
        args: dict[str, Any],
        timeout: float | None,  # noqa: ASYNC109
        *,
        op: Callable[[ClientSession], Awaitable[Any]] | None = None,
        on_progress: ProgressSink | None = None,
    ) -> Any:
        s = self._servers.get(server)
        if s is None:
            raise McpServerUnavailable(server, f'there is no mcp server named "{server}"')
        if self._closed:
            raise McpServerUnavailable(server, f'mcp server "{server}" was shut down')
        if s.state != "connected":
            raise McpServerUnavailable(server, _unavailable(s))
        limit = s.config.timeout if timeout is None else timeout
        call = _Call(
            tool, args, limit, asyncio.get_running_loop().create_future(), op=op,
            on_progress=on_progress,
        )  # fmt: skip
        s.pending.add(call)
        s.queue.put_nowait(call)
        try:
            # The owner task enforces `limit` (and cancels the request on the server); this
            # outer bound only guards against an owner that stopped serving.
            async with asyncio.timeout(limit + STOP_GRACE * 3):
                return await call.future
        except TimeoutError:
            raise McpCallTimeout(server, _timeout_message(server, tool, limit)) from None
        except asyncio.CancelledError:
            if call.scope is not None:
                call.scope.cancel()  # tells the server (notifications/cancelled)
            raise
        finally:
            s.pending.discard(call)

    # -- the owner task ----------------------------------------------------------------------

    async def _own(self, s: _Server) -> None:
        """The one task that connects to server `s`, serves its calls and disconnects."""
        try:
            await self._load_sdk()
        except ImportError as exc:
            s.state, s.detail = (
                "failed",
                f"the mcp package is not installed ({exc}); pip install mcp",
            )
            self._finish(s)
            return
        try:
            while True:
                try:
                    await self._connect_and_serve(s)
                except Exception as exc:  # the server failed; the reason becomes its state
                    s.state, s.detail = "failed", self._reason(s, exc)
                if not await self._restart(s):
                    break
        finally:
            self._finish(s)

    async def _restart(self, s: _Server) -> bool:
        """After a server dropped: fail its calls in flight, wait (doubling each time) and say
        whether to connect again. Only a server that once connected is restarted, at most
        `max_restarts` times; one that fails at startup is not."""
        if self._closed or s.stopping or not s.was_connected or s.restarts >= self.max_restarts:
            return False
        s.restarts += 1
        why = s.detail
        attempt = f"attempt {s.restarts} of {self.max_restarts}"
        for call in list(s.pending):
            _fail(call, McpServerLost(s.config.name, _lost_message(s, restarting=attempt)))
        s.state = "connecting"
        s.detail = f"restarting ({attempt}) after: {why}"
        self._notice(f'MCP server "{s.config.name}" dropped ({why}); restarting it ({attempt})')
        await asyncio.sleep(RESTART_DELAY * 2 ** (s.restarts - 1))
        if self._stopped(s):
            return False
        s.lost, s.http_error, s.returncode, s.killed, s.closing = "", "", None, False, False
        return True

    def _stopped(self, s: _Server) -> bool:
        return self._closed or s.stopping

    def _notice(self, text: str, level: str = "warning") -> None:
        if self.on_notice is not None:
            self.on_notice(text, level)

    async def _load_sdk(self) -> None:
        # The SDK takes over a second to import; a worker thread keeps the event loop (and the
        # UI) responsive meanwhile. One import serves every server.
        if self._sdk is None:
            self._sdk = asyncio.ensure_future(asyncio.to_thread(_import_sdk))
        await asyncio.shield(self._sdk)

    async def _connect_and_serve(self, s: _Server) -> None:
        import anyio
        from mcp import ClientSession
        from mcp.client.extension import NotificationBinding
        from mcp.shared.jsonrpc_dispatcher import JSONRPCDispatcher
        from mcp_types import Implementation, TaskStatusNotificationParams

        from keel import __version__

        if self._closed:
            return
        with anyio.CancelScope() as life:
            s.life = life
            life.deadline = anyio.current_time() + self.connect_timeout
            async with contextlib.AsyncExitStack() as stack:
                streams = await stack.enter_async_context(self._transport(s))
                # keel's own dispatcher: task-augmented calls send one request through it as is
                dispatcher: JSONRPCDispatcher[Any] = JSONRPCDispatcher(*streams)

                async def task_status(params: TaskStatusNotificationParams) -> None:
                    if s.tasks is not None:
                        await s.tasks.status_changed(params)

                session = await stack.enter_async_context(
                    ClientSession(
                        client_info=Implementation(name="keel", version=__version__),
                        notification_bindings=[
                            NotificationBinding(
                                method="notifications/tasks/status",
                                params_type=TaskStatusNotificationParams,
                                handler=task_status,
                            )
                        ],
                        dispatcher=dispatcher,
                        **self._callbacks(s),
                    )
                )
                init = await session.initialize()
                caps = init.capabilities
                s.tasks = self._task_calls(s, session, dispatcher, caps)
                before = s.tools if s.was_connected else None
                s.tools = self._callable(s, await _list_tools(session))
                s.prompts = await _list_prompts(session) if caps.prompts else ()
                s.resources = caps.resources is not None and await _has_resources(session)
                life.deadline = math.inf
                s.state, s.detail = "connected", _count(len(s.tools))
                if s.restarts:
                    s.detail += f" (restarted {s.restarts}x)"
                    self._notice(f'MCP server "{s.config.name}" is connected again', "info")
                if before is not None:
                    self._tools_changed(s, before)
                s.was_connected = True
                s.settled.set()
                await self._serve(s, session)
        if s.stopping:
            return
        connecting = s.state == "connecting"
        s.state = "failed"
        if s.config.transport == "stdio" and s.exit_description():
            s.detail = s.exit_reason()
        elif s.lost:
            s.detail = f"disconnected: {s.lost}"
        elif life.cancelled_caught and connecting:
            s.detail = f"timed out connecting after {self.connect_timeout:g} s"
            line = s.last_stderr_line()
            if line:
                s.detail += f" (last stderr line: {line})"
        else:
            s.detail = "the session ended"

    def _task_calls(
        self,
        s: _Server,
        session: ClientSession,
        dispatcher: JSONRPCDispatcher[Any],
        caps: ServerCapabilities,
    ) -> TaskCalls | None:
        """Task-augmented calls for this connection, if the server offers tasks for tools."""
        tasks = caps.tasks
        if tasks is None or tasks.requests is None or tasks.requests.tools is None:
            return None
        if tasks.requests.tools.call is None:
            return None
        return TaskCalls(
            s.config.name,
            session,
            dispatcher,
            can_cancel=tasks.cancel is not None,
            cancel_timeout=STOP_GRACE,
            notice=self._notice,
        )

    def _callable(self, s: _Server, tools: tuple[RemoteTool, ...]) -> tuple[RemoteTool, ...]:
        """The tools keel can call: one that requires tasks of a server that offers none for
        tools (the spec forbids calling it as a task there, and it refuses plain calls) is
        left out, and named."""
        refused = (
            ()
            if s.tasks is not None
            else tuple(t.name for t in tools if t.task_support == "required")
        )
        if refused and refused != s.left_out:  # said once, not again at a restart
            self._notice(
                f'MCP server "{s.config.name}": {", ".join(refused)} must be called as a task, '
                "but the server does not offer tasks for tools (capabilities.tasks.requests."
                "tools.call); keel leaves them out"
            )
        s.left_out = refused
        return tuple(t for t in tools if t.name not in refused)

    async def _serve(self, s: _Server, session: ClientSession) -> None:
        import anyio

        async with anyio.create_task_group() as tg:
            while True:
                call = await s.queue.get()
                tg.start_soon(self._handle, s, session, call)

    # -- what the server asks of keel, and what it tells --------------------------------------

    def _callbacks(self, s: _Server) -> dict[str, Any]:
        """The ClientSession callbacks for server `s`: roots, sampling, elicitation (each
        capability is advertised only when keel can answer it) and notifications."""

        async def roots(context: ClientRequestContext) -> ListRootsResult:
            from mcp_types import ListRootsResult, Root

            root = Root.model_validate(
                {"uri": self.root.resolve().as_uri(), "name": self.root.name}
            )
            return ListRootsResult(roots=[root])

        async def sample(
            context: ClientRequestContext, params: CreateMessageRequestParams
        ) -> CreateMessageResult | ErrorData:
            return await self._sample(s, params)

        async def elicit(
            context: ClientRequestContext, params: ElicitRequestParams
        ) -> ElicitResult | ErrorData:
            return await self._elicit(s, params)

        async def notified(message: IncomingMessage) -> None:
            self._notified(s, message)

        return {
            "list_roots_callback": roots,
            "sampling_callback": sample,
            "elicitation_callback": elicit,
            "message_handler": notified,
        }

    async def _sample(
        self, s: _Server, params: CreateMessageRequestParams
    ) -> CreateMessageResult | ErrorData:
        from mcp_types import INVALID_REQUEST, CreateMessageResult, ErrorData, TextContent

        name = s.config.name
        if self.sampler is None:
            return ErrorData(
                code=INVALID_REQUEST, message=f"keel does not answer sampling requests of {name}"
            )
        messages = tuple((m.role, _content_text(m.content_as_list)) for m in params.messages)
        ask = SamplingAsk(name, messages, params.system_prompt or "", params.max_tokens)
        answer = await self.sampler(ask)
        if isinstance(answer, str):
            return ErrorData(code=INVALID_REQUEST, message=answer)
        return CreateMessageResult(
            role="assistant",
            content=TextContent(text=answer.text),
            model=answer.model,
            stop_reason=answer.stop_reason,
        )

    async def _elicit(self, s: _Server, params: ElicitRequestParams) -> ElicitResult | ErrorData:
        from mcp_types import INVALID_REQUEST, ElicitRequestFormParams, ElicitResult, ErrorData

        name = s.config.name
        if not isinstance(params, ElicitRequestFormParams):
            return ErrorData(
                code=INVALID_REQUEST, message="keel answers form elicitations only (not url)"
            )
        if self.elicitor is None:
            return ErrorData(
                code=INVALID_REQUEST, message=f"keel does not answer elicitations of {name}"
            )
        schema = params.requested_schema
        answer = await self.elicitor(
            ElicitAsk(name, params.message, schema if isinstance(schema, dict) else dict(schema))
        )
        if isinstance(answer, str):
            return ErrorData(code=INVALID_REQUEST, message=answer)
        if answer is None:
            return ElicitResult(action="decline")
        return ElicitResult(action="accept", content=answer)

    def _notified(self, s: _Server, message: IncomingMessage) -> None:
        from mcp_types import (
            ProgressNotification,
            PromptListChangedNotification,
            ToolListChangedNotification,
        )

        if isinstance(message, ProgressNotification) and s.tasks is not None:
            p = message.params
            s.tasks.progressed(p.progress_token, p.progress, p.total, p.message)
        if isinstance(message, ToolListChangedNotification | PromptListChangedNotification):
            # Listing needs a request, which must not wait inside the session's receive loop.
            refresh = _Call("tools/list", {}, self.connect_timeout, _detached_future())
            refresh.op = lambda session: self._refresh_lists(s, session)
            s.queue.put_nowait(refresh)

    async def _refresh_lists(self, s: _Server, session: ClientSession) -> None:
        before = s.tools
        s.tools = self._callable(s, await _list_tools(session))
        caps = session.server_capabilities
        if caps is not None and caps.prompts:
            s.prompts = await _list_prompts(session)
        s.detail = _count(len(s.tools))
        self._tools_changed(s, before)

    def _tools_changed(self, s: _Server, before: tuple[RemoteTool, ...]) -> None:
        """Tell the user when a server's tool list changed. The tools a context offers stay
        as they were (the prompt prefix is byte-stable): the new list joins at the next
        fresh context."""
        old, new = {t.name: t for t in before}, {t.name: t for t in s.tools}
        if old == new:
            return
        parts = []
        if added := sorted(set(new) - set(old)):
            parts.append("added " + ", ".join(added))
        if removed := sorted(set(old) - set(new)):
            parts.append("removed " + ", ".join(removed))
        if changed := sorted(n for n in set(old) & set(new) if old[n] != new[n]):
            parts.append("changed " + ", ".join(changed))
        self._notice(
            f'MCP server "{s.config.name}" changed its tools ({"; ".join(parts)}); the new list '
            "is offered from the next fresh context (/clear)",
            "info",
        )

    async def _handle(self, s: _Server, session: ClientSession, call: _Call) -> None:
        import anyio
        from mcp import MCPError
        from mcp_types import CONNECTION_CLOSED

        if call.future.done():  # the caller gave up before the call started
            return
        with anyio.CancelScope() as scope:
            call.scope = scope
            scope.deadline = anyio.current_time() + call.timeout
            try:
                if call.op is not None:
                    result = await call.op(session)
                elif s.tasks is not None and _task_support(s, call.tool) == "required":
                    result = await s.tasks.call(
                        call.tool,
                        call.args,
                        keep=call.timeout + TTL_MARGIN,
                        on_progress=call.on_progress,
                    )
                else:
                    result = await session.call_tool(
                        call.tool, call.args, progress_callback=_progress(call.on_progress)
                    )
            except TaskEnded as exc:
                _fail(call, McpCallError(s.config.name, str(exc)))
                return
            except MCPError as exc:
                if exc.code == CONNECTION_CLOSED:
                    self._lose(s, "the connection closed")  # the owner fails the call
                    return
                if s.config.transport == "http" and s.http_error.startswith("HTTP 404"):
                    # The spec: a 404 to a request with a session id means the session is gone
                    # (the server restarted); the client starts a new one.
                    self._lose(s, "the server no longer knows the session (HTTP 404)")
                    return
                _fail(call, McpRemoteError(s.config.name, _remote_message(s, call, exc)))
                return
            except Exception as exc:
                if _is_transport_error(exc):
                    self._lose(s, _describe_exception(exc, s.config))
                    return
                _fail(
                    call,
                    McpCallError(
                        s.config.name,
                        f'mcp server "{s.config.name}": tool "{call.tool}" failed: '
                        f"{_describe_exception(exc, s.config)}",
                    ),
                )
                return
            if not call.future.done():
                call.future.set_result(result)
        if scope.cancelled_caught:
            _fail(
                call,
                McpCallTimeout(
                    s.config.name, _timeout_message(s.config.name, call.tool, call.timeout)
                ),
            )

    def _lose(self, s: _Server, why: str) -> None:
        """The connection is gone: end the owner task's life scope (it unwinds in order)."""
        if not s.lost and not s.stopping:
            s.lost = why
            if s.life is not None:
                s.life.cancel()

    def _finish(self, s: _Server) -> None:
        if s.state == "connecting":  # stopped before it connected
            s.state, s.detail = "failed", "stopped before it connected"
        if self._closed and s.state == "connected":
            s.detail = f"{s.detail}; stopped"
        s.settled.set()
        for call in list(s.pending):
            if self._closed:
                _fail(
                    call,
                    McpServerUnavailable(
                        s.config.name, f'mcp server "{s.config.name}" was shut down'
                    ),
                )
            else:
                _fail(call, McpServerLost(s.config.name, _lost_message(s)))
        s.life = None

    # -- transports --------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _transport(self, s: _Server) -> AsyncIterator[TransportStreams]:
        config = s.config
        if config.transport == "stdio":
            cwd = self._cwd(config)
            argv = [config.command, *config.args]
            env = server_env(config, self.env)
            sandbox = await self._sandbox(config) if config.sandbox else None
            try:
                if sandbox is not None:
                    from keel.permissions.sandbox import SandboxError

                    try:
                        argv = sandbox.argv(argv, cwd)
                    except SandboxError as exc:
                        raise _SpawnError(f"cannot sandbox it: {exc}") from None
                    # The sandbox filters the base; what the entry declares is passed as is.
                    env = {**sandbox.env(env), **dict(config.env)}
                async with _stdio_transport(s, cwd, env, self.log_dir, argv) as streams:
                    yield streams
            finally:
                if sandbox is not None:
                    sandbox.release()
                    sandbox.cleanup()
        elif config.transport == "http":
            from mcp.client.streamable_http import streamable_http_client

            client = _http_client(s, dict(config.headers), auth=self._oauth(s))
            async with client, streamable_http_client(config.url, http_client=client) as streams:
                yield streams
        else:
            from mcp.client.sse import sse_client

            def factory(
                headers: dict[str, str] | None = None,
                timeout: httpx2.Timeout | None = None,
                auth: httpx2.Auth | None = None,
            ) -> httpx2.AsyncClient:
                return _http_client(s, headers or {}, timeout, auth)

            async with sse_client(
                config.url, headers=dict(config.headers), timeout=30.0, httpx_client_factory=factory
            ) as streams:
                yield streams

    async def _sandbox(self, config: ServerConfig) -> Sandbox:
        """The sandbox a `sandbox: true` server runs in; the server does not start (fail
        closed) when bubblewrap cannot run here."""
        from keel.permissions.sandbox import Sandbox, probe

        works = await asyncio.to_thread(probe)
        if not works.ok:
            raise _SpawnError(f"sandbox: true, but the sandbox cannot run here: {works.detail}")
        return Sandbox(self.root, network=config.sandbox_network)

    def _oauth(self, s: _Server) -> httpx2.Auth | None:
        """OAuth for an http server, unless OAuth is off or its entry sends its own
        Authorization header."""
        config = s.config
        if self.auth_dir is None or any(k.lower() == "authorization" for k, _ in config.headers):
            return None
        from keel.mcp.oauth import SIGN_IN_TIMEOUT, oauth_provider

        def lift_deadline() -> None:  # the user signs in at their own pace
            import anyio

            if s.life is not None:
                s.life.deadline = anyio.current_time() + SIGN_IN_TIMEOUT + self.connect_timeout

        return oauth_provider(
            config.name, config.url, self.auth_dir, open_url=self.open_url, on_wait=lift_deadline
        )

    def _cwd(self, config: ServerConfig) -> Path:
        if not config.cwd:
            return self.root
        path = Path(config.cwd).expanduser()
        return path if path.is_absolute() else self.root / path

    # -- failure reasons ---------------------------------------------------------------------

    def _reason(self, s: _Server, exc: BaseException) -> str:
        """One line: why the server failed while connecting or serving."""
        from keel.mcp.oauth import SignInRefused

        leaves = _leaves(exc)
        for leaf in leaves:
            if isinstance(leaf, _SpawnError | SignInRefused):
                return str(leaf)
            if type(leaf).__name__.startswith("OAuth"):  # the SDK's OAuthFlowError family
                return f"OAuth sign-in failed: {leaf}"
        if s.config.transport == "stdio" and s.exit_description():
            return s.exit_reason()
        telling = _most_telling(leaves)
        if s.http_error and not _is_transport_error(telling):
            # The SDK turned the HTTP error into a JSON-RPC one; the status says more.
            return f"{s.http_error} from {s.config.url}"
        return _describe_exception(telling, s.config)


def _http_client(
    s: _Server,
    headers: dict[str, str],
    timeout: httpx2.Timeout | None = None,
    auth: httpx2.Auth | None = None,
) -> httpx2.AsyncClient:
    """An httpx2 client that remembers the last HTTP error status: the SDK turns a 4xx/5xx
    answer into a JSON-RPC error and the status would otherwise be lost to the user."""
    import httpx2

    async def remember(response: httpx2.Response) -> None:
        if response.status_code >= 400:
            s.http_error = f"HTTP {response.status_code} {response.reason_phrase}".rstrip()

    return httpx2.AsyncClient(
        headers=headers,
        timeout=timeout or httpx2.Timeout(30.0, read=300.0),
        auth=auth,
        event_hooks={"response": [remember]},
    )


def _unavailable(s: _Server) -> str:
    name = s.config.name
    if s.state == "connecting":
        return f'mcp server "{name}" is still connecting; try again in a moment'
    if s.state == "failed":
        return (
            f'mcp server "{name}" is not available ({s.detail}); '
            "its tools are unavailable until keel restarts"
        )
    return f'mcp server "{name}" is not running ({s.state})'


def _lost_message(s: _Server, *, restarting: str = "") -> str:
    name = s.config.name
    after = (
        f"keel is restarting it ({restarting}): try again in a moment"
        if restarting
        else "its tools are unavailable until keel restarts"
    )
    if s.config.transport == "stdio" and s.exit_description():
        how = "exited" if s.returncode == 0 else "crashed"
        what = s.exit_description()
        line = s.last_stderr_line()
        detail = f"{what}; last stderr line: {line}" if line else what
        return f'mcp server "{name}" {how} during the call ({detail}); {after}'
    return f'mcp server "{name}" disconnected during the call ({s.lost or s.detail}); {after}'


def _timeout_message(server: str, tool: str, limit: float) -> str:
    return (
        f'mcp server "{server}": tool "{tool}" did not answer within {limit:g} s and was '
        'cancelled; the server is still connected (its "timeout" setting raises the limit)'
    )


def _remote_message(s: _Server, call: _Call, exc: MCPError) -> str:
    return f'mcp server "{s.config.name}" rejected the call to "{call.tool}": {exc.message} (error {exc.code})'


def _fail(call: _Call, exc: McpCallError) -> None:
    if not call.future.done():
        call.future.set_exception(exc)


def _count(n: int) -> str:
    return f"{n} tool" if n == 1 else f"{n} tools"


def _import_sdk() -> None:
    import logging

    # The SDK logs what it then raises (an OAuth sign-in keel refused, with its traceback), and
    # without a handler Python prints that on stderr. keel reports those failures in one line of
    # its own, so the SDK's records go to the handlers an application set up and nowhere else
    # (`keel --debug` sets one up: keel.cli.main).
    sdk_log = logging.getLogger("mcp")
    if not any(isinstance(h, logging.NullHandler) for h in sdk_log.handlers):
        sdk_log.addHandler(logging.NullHandler())
    import anyio  # noqa: F401
    import httpx2  # noqa: F401
    import mcp.client.extension  # noqa: F401
    import mcp.client.session  # noqa: F401
    import mcp.client.sse  # noqa: F401
    import mcp.client.streamable_http  # noqa: F401
    import mcp.shared.jsonrpc_dispatcher  # noqa: F401
    import mcp.shared.message  # noqa: F401
    import mcp_types  # noqa: F401


async def _list_tools(session: ClientSession) -> tuple[RemoteTool, ...]:
    from mcp_types import PaginatedRequestParams

    tools: list[ToolDefinition] = []
    cursor: str | None = None
    for _ in range(MAX_TOOL_PAGES):
        params = PaginatedRequestParams(cursor=cursor) if cursor else None
        page = await session.list_tools(params=params)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            break
    return tuple(_remote(t) for t in tools)


async def _list_prompts(session: ClientSession) -> tuple[RemotePrompt, ...]:
    from mcp_types import PaginatedRequestParams

    prompts: list[RemotePrompt] = []
    cursor: str | None = None
    for _ in range(MAX_TOOL_PAGES):
        params = PaginatedRequestParams(cursor=cursor) if cursor else None
        page = await session.list_prompts(params=params)
        prompts += [
            RemotePrompt(
                p.name,
                p.description or "",
                tuple(
                    PromptArgument(a.name, a.description or "", bool(a.required))
                    for a in p.arguments or ()
                ),
            )
            for p in page.prompts
        ]
        cursor = page.next_cursor
        if not cursor:
            break
    return tuple(prompts)


async def _has_resources(session: ClientSession) -> bool:
    from mcp import MCPError

    try:
        return bool((await session.list_resources()).resources)
    except MCPError:
        return False


def _content_text(content: Any) -> str:
    """Text of one content block or a list of them; anything else as a one-line note."""
    from mcp_types import EmbeddedResource, TextContent, TextResourceContents

    items = content if isinstance(content, list) else [content]
    parts: list[str] = []
    for item in items:
        if isinstance(item, TextContent):
            parts.append(item.text)
        elif isinstance(item, EmbeddedResource) and isinstance(item.resource, TextResourceContents):
            parts.append(item.resource.text)
        else:
            parts.append(f"[{getattr(item, 'type', type(item).__name__)} content omitted]")
    return "\n".join(parts)


def _b64_size(data: str) -> int:
    return len(data) * 3 // 4 - data[-2:].count("=")


def _progress(sink: ProgressSink | None) -> Any:
    """The SDK's progress callback for `sink` (None: no progress token is sent)."""
    if sink is None:
        return None

    async def callback(progress: float, total: float | None, message: str | None) -> None:
        sink(progress, total, message)

    return callback


def _detached_future() -> asyncio.Future[Any]:
    """A future nobody awaits (an internal refresh): its failure is retrieved, not warned of."""
    future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    future.add_done_callback(lambda f: f.cancelled() or f.exception())
    return future


def _task_support(s: _Server, tool: str) -> str:
    return next((t.task_support for t in s.tools if t.name == tool), "forbidden")


def _remote(tool: ToolDefinition) -> RemoteTool:
    annotations = tool.annotations
    execution = tool.execution
    return RemoteTool(
        name=tool.name,
        description=tool.description or "",
        input_schema=dict(tool.input_schema or {}),
        title=tool.title or (annotations.title if annotations and annotations.title else "") or "",
        read_only_hint=annotations.read_only_hint if annotations else None,
        open_world_hint=annotations.open_world_hint if annotations else None,
        destructive_hint=annotations.destructive_hint if annotations else None,
        idempotent_hint=annotations.idempotent_hint if annotations else None,
        task_support=(execution.task_support if execution else None) or "forbidden",
    )


# -- stdio transport -------------------------------------------------------------------------


class _SpawnError(Exception):
    """The server process could not be started; the message is the whole reason."""


@contextlib.asynccontextmanager
async def _stdio_transport(
    s: _Server, cwd: Path, env: Mapping[str, str], log_dir: Path, argv: list[str]
) -> AsyncIterator[TransportStreams]:
    import anyio
    from mcp.shared.message import SessionMessage

    config = s.config
    if not cwd.is_dir():
        raise _SpawnError(f"working directory not found: {cwd}")
    log = _open_log(s, log_dir)
    try:
        try:
            process = await anyio.open_process(
                argv,
                env=dict(env),
                cwd=cwd,
                stderr=log,
                start_new_session=True,
            )
        except FileNotFoundError:
            raise _SpawnError(f"command not found: {config.command}") from None
        except PermissionError:
            raise _SpawnError(f"permission denied running {config.command}") from None
        except OSError as exc:
            raise _SpawnError(f"cannot start {config.command}: {exc.strerror or exc}") from None
        s.pid, s.returncode, s.killed, s.closing = process.pid, None, False, False
        read_in, read_out = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        write_in, write_out = anyio.create_memory_object_stream[SessionMessage](0)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_read_stdout, s, process, read_in)
                tg.start_soon(_write_stdin, process, write_out, read_in)
                try:
                    yield read_out, write_in
                finally:
                    s.closing = True
                    with anyio.CancelScope(shield=True):
                        await _stop_process(s, process)
                    tg.cancel_scope.cancel()
        finally:
            for stream in (read_in, read_out, write_in, write_out):
                stream.close()
    finally:
        log.close()


def _open_log(s: _Server, log_dir: Path) -> IO[str]:
    log_dir.mkdir(parents=True, exist_ok=True)
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in s.config.name)
    s.log_file = log_dir / f"mcp-{safe}.log"
    fd = os.open(s.log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    log = os.fdopen(fd, "a", encoding="utf-8")
    command = " ".join([s.config.command, *s.config.args])
    log.write(f"\n--- keel {time.strftime('%Y-%m-%d %H:%M:%S')}: starting {command}\n")
    log.flush()
    s.log_offset = log.tell()
    return log


#: Largest JSON-RPC message read from a stdio server: a longer line is dropped as it arrives and
#: its request answered with an error, so one huge result cannot take keel's memory.
MAX_MESSAGE_BYTES = 32 * 1024 * 1024


class _MessageSplitter:
    """A stdio server's output as lines, none held past `MAX_MESSAGE_BYTES`: a longer one is
    dropped while it arrives (its first 4 kB kept, to find its id) and stands in as the error
    response to that request (the SDK writes `id` before `result`)."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.pending = 0
        self.dropped = 0
        self.head = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        lines = []
        while (end := chunk.find(b"\n")) >= 0:
            if self.dropped:
                lines.append(_too_large(self.head, self.dropped + end))
            else:
                self.parts.append(chunk[:end])
                lines.append(b"".join(self.parts))
            self.parts, self.pending, self.dropped, self.head = [], 0, 0, b""
            chunk = chunk[end + 1 :]
        if self.dropped:
            self.dropped += len(chunk)
            return lines
        self.parts.append(chunk)
        self.pending += len(chunk)
        if self.pending > MAX_MESSAGE_BYTES:
            self.head = b"".join(self.parts[:64])[:4096]
            self.dropped, self.parts, self.pending = self.pending, [], 0
        return lines


def _too_large(head: bytes, size: int) -> bytes:
    """The error response that replaces a message of `size` bytes starting with `head` (empty
    when no request id can be found in it: the session then never sees it)."""
    import json

    found = re.search(rb'"id"\s*:\s*(-?\d+|"(?:[^"\\]|\\.)*")', head)
    if found is None:
        return b""
    message = (
        f"the server's answer was {size} bytes, over keel's limit of {MAX_MESSAGE_BYTES} "
        "bytes, and was dropped; ask the tool for less (a narrower query, a page)"
    )
    error = {"code": -32603, "message": message}
    return json.dumps({"jsonrpc": "2.0", "id": json.loads(found.group(1)), "error": error}).encode()


async def _read_stdout(
    s: _Server, process: Process, sink: MemoryObjectSendStream[SessionMessage | Exception]
) -> None:
    """Split the server's stdout into JSON-RPC messages. A line that is not one is handed to
    the session as an exception (logged there); EOF means the server is gone."""
    import anyio
    import mcp_types
    from mcp.shared.message import SessionMessage

    assert process.stdout is not None
    splitter = _MessageSplitter()
    try:
        async with sink:
            async for chunk in process.stdout:
                for line in splitter.feed(chunk):
                    if not line.strip():
                        continue
                    item: SessionMessage | Exception
                    try:
                        item = SessionMessage(
                            mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False)
                        )
                    except ValueError as exc:
                        item = exc
                    await sink.send(item)
    except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream, OSError):
        pass  # our own shutdown closed a stream under the read
    if not s.stopping and not s.closing and not s.lost:
        s.lost = "the server closed its output"
        if s.life is not None:
            s.life.cancel()


async def _write_stdin(
    process: Process,
    source: MemoryObjectReceiveStream[SessionMessage],
    reader_sink: MemoryObjectSendStream[SessionMessage | Exception],
) -> None:
    import anyio

    assert process.stdin is not None
    try:
        async with source:
            async for message in source:
                data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                await process.stdin.send((data + "\n").encode())
    except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
        # The server stopped reading: end the session's read side so no request waits forever.
        await reader_sink.aclose()


async def _stop_process(s: _Server, process: Process) -> None:
    """Close stdin, give the server `STOP_GRACE` seconds, then SIGTERM and SIGKILL its group.
    Every wait is bounded; the caller shields this from cancellation."""
    import anyio

    assert process.stdin is not None
    assert process.stdout is not None
    with contextlib.suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        await process.stdin.aclose()
    with anyio.move_on_after(STOP_GRACE):
        await _exit_of(process)
    if process.returncode is None:
        s.killed = True
        _signal_group(process, signal.SIGTERM)
        with anyio.move_on_after(STOP_GRACE):
            await _exit_of(process)
    if process.returncode is None:
        _signal_group(process, signal.SIGKILL)
        with anyio.move_on_after(STOP_GRACE):
            await _exit_of(process)
    s.returncode = process.returncode
    if sys.platform != "win32":
        _kill_group(process.pid)  # descendants that outlived the leader
    with contextlib.suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        await process.stdout.aclose()
    with anyio.move_on_after(STOP_GRACE):
        await process.aclose()


async def _exit_of(process: Process) -> None:
    """Return once the process exited. Polls: `wait()` would also wait for EOF on its pipes,
    which a grandchild holding them can delay forever."""
    import anyio

    while process.returncode is None:  # noqa: ASYNC110 (no exit event without the pipes)
        await anyio.sleep(0.02)


def _signal_group(process: Process, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if sys.platform == "win32":
            process.kill() if sig == signal.SIGKILL else process.terminate()
        else:
            os.killpg(process.pid, sig)


def _kill_group(pid: int | None) -> None:
    """SIGKILL whatever is left of the process group `pid` led (it is gone when this fails)."""
    if pid is None or sys.platform == "win32":
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


# -- exceptions to one line ------------------------------------------------------------------


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in _leaves(sub)]
    return [exc]


def _most_telling(leaves: list[BaseException]) -> BaseException:
    """Prefer an HTTP or OS error over the protocol's "connection closed" that follows it."""
    ranked = sorted(leaves, key=lambda e: 0 if _is_transport_error(e) else 1)
    return ranked[0] if ranked else RuntimeError("unknown failure")


def _is_transport_error(exc: BaseException) -> bool:
    if isinstance(exc, OSError):
        return True
    module = type(exc).__module__
    return module.startswith(("httpx2", "httpcore"))


def _describe_exception(exc: BaseException, config: ServerConfig) -> str:
    import httpx2
    from mcp import MCPError

    if isinstance(exc, httpx2.HTTPStatusError):
        return f"HTTP {exc.response.status_code} {exc.response.reason_phrase} from {config.url}"
    if isinstance(exc, httpx2.ConnectError):
        return f"cannot connect to {config.url} ({exc or 'connection failed'})"
    if isinstance(exc, httpx2.TimeoutException):
        return f"HTTP request to {config.url} timed out"
    if isinstance(exc, httpx2.HTTPError):
        return f"HTTP error talking to {config.url}: {type(exc).__name__}: {exc}"
    if isinstance(exc, MCPError):
        return f"{exc.message} (MCP error {exc.code})"
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def describe(manager: McpManager) -> list[str]:
    """`keel mcp list`: one line per server, `name  state  (transport, source)  detail`."""
    rows = [
        (s.name, s.state, f"({s.config.transport}, {s.config.source})", s.detail)
        for s in manager.status()
    ]
    if not rows:
        return []
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return [
        f"{name:<{widths[0]}}  {state:<{widths[1]}}  {where:<{widths[2]}}  {detail}".rstrip()
        for name, state, where, detail in rows
    ]


__all__ = [
    "CONNECT_TIMEOUT",
    "MAX_RESTARTS",
    "SAFE_ENV",
    "ElicitAsk",
    "Elicitor",
    "McpCallError",
    "McpCallTimeout",
    "McpManager",
    "McpRemoteError",
    "McpServerLost",
    "McpServerUnavailable",
    "ProgressSink",
    "PromptArgument",
    "RemotePrompt",
    "RemoteResource",
    "RemoteTool",
    "ResourceContent",
    "Sampler",
    "SamplingAnswer",
    "SamplingAsk",
    "ServerStatus",
    "State",
    "describe",
    "server_env",
]
