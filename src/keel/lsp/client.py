"""One language server process and the JSON-RPC conversation with it (LSP 3.17, over stdio).

Owns the wire: `Content-Length` framed JSON-RPC 2.0 messages, requests with ids and their
answers, notifications, and the few requests a server sends to its client (answered so that no
server waits on keel: `workspace/configuration`, `client/registerCapability`,
`window/workDoneProgress/create`, ...). It keeps what the server pushes
(`textDocument/publishDiagnostics`) and can pull (`textDocument/diagnostic`) where the server
offers it.

The process runs in a process group of its own, so `close` (shutdown, exit, then SIGTERM and
SIGKILL to the whole group) leaves nothing behind: a server's own children (tsserver, pyright's
workers) go with it. It must never import the loop, a tool or a front end.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from keel.frozen import frozen

#: Seconds `close` waits for the answer to `shutdown`, then for the process to exit on `exit`.
SHUTDOWN_GRACE = 1.0
#: The largest message keel reads from a server (a bigger one means a broken server).
MAX_MESSAGE = 64 * 1024 * 1024
#: Lines of the server's stderr kept, for the message when it dies.
STDERR_LINES = 20


class LspError(Exception):
    """The server failed: it could not start, died, or answered a request with an error. The
    message is the whole reason, in one line."""


@frozen
class Diagnostic:
    """One diagnostic as the server gave it: 0-based line and character (LSP's), severity 1
    (error) to 4 (hint)."""

    line: int
    character: int
    severity: int
    message: str
    source: str = ""
    code: str = ""

    def key(self) -> tuple[int, int, str]:
        return (self.line, self.character, self.message)


def path_to_uri(path: Path) -> str:
    return path.absolute().as_uri()


def uri_to_path(uri: str) -> Path | None:
    from urllib.parse import unquote, urlsplit

    parts = urlsplit(uri)
    if parts.scheme != "file":
        return None
    return Path(unquote(parts.path))


def parse_diagnostics(items: object) -> list[Diagnostic]:
    """LSP `Diagnostic[]` as `Diagnostic`s; malformed entries are left out."""
    out: list[Diagnostic] = []
    if not isinstance(items, list):
        return out
    for item in items:
        if not isinstance(item, dict):
            continue
        start = (item.get("range") or {}).get("start") or {}
        line, character = start.get("line"), start.get("character")
        message = item.get("message")
        if not isinstance(line, int) or not isinstance(character, int):
            continue
        if not isinstance(message, str):
            continue
        severity = item.get("severity")
        code = item.get("code")
        out.append(
            Diagnostic(
                line,
                character,
                severity if isinstance(severity, int) and 1 <= severity <= 4 else 1,
                message,
                str(item.get("source") or ""),
                "" if code is None or isinstance(code, dict | list) else str(code),
            )
        )
    return out


class LspClient:
    """A started language server: `start` (spawn + initialize), document notifications,
    diagnostics (pushed or pulled), `close`."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        root: Path,
        env: Mapping[str, str],
        init_options: object = None,
        settings: object = None,
        name: str = "",
    ) -> None:
        self.argv = list(argv)
        self.root = root
        self.env = dict(env)
        self.init_options = init_options
        self.settings = settings
        self.name = name or Path(self.argv[0]).name
        self.process: asyncio.subprocess.Process | None = None
        self.capabilities: dict[str, Any] = {}
        #: The latest diagnostics the server pushed (or keel pulled), per URI, and a counter of
        #: pushes.
        self.pushed: dict[str, list[Diagnostic]] = {}
        #: The version of each document keel sent last: a push for an older one is stale.
        self.sent: dict[str, int] = {}
        self.push_seq: dict[str, int] = {}
        self.pushes = 0
        self._changed = asyncio.Event()
        self._next_id = 0
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._reader: asyncio.Task[None] | None = None
        self._stderr_task: asyncio.Task[None] | None = None
        self.stderr: deque[str] = deque(maxlen=STDERR_LINES)
        self._write_lock = asyncio.Lock()
        self.closed = False
        #: Why the server stopped answering ("" while it runs).
        self.failure = ""

    # -- life ----------------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def alive(self) -> bool:
        return (
            self.process is not None
            and self.process.returncode is None
            and not self.failure
            and not self.closed
        )

    async def start(self, startup: float) -> None:
        """Spawn the server and complete `initialize` / `initialized` within `startup` s."""
        try:
            self.process = await asyncio.create_subprocess_exec(
                *self.argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                cwd=self.root,
                env=self.env,
                start_new_session=True,
                limit=MAX_MESSAGE,
            )
        except FileNotFoundError:
            raise LspError(f"command not found: {self.argv[0]}") from None
        except PermissionError:
            raise LspError(f"permission denied running {self.argv[0]}") from None
        except OSError as exc:
            raise LspError(f"cannot start {self.argv[0]}: {exc.strerror or exc}") from None
        self._reader = asyncio.create_task(self._read_loop(), name=f"keel lsp {self.name}")
        self._stderr_task = asyncio.create_task(self._drain_stderr(), name="keel lsp stderr")
        params: dict[str, Any] = {
            "processId": os.getpid(),
            "clientInfo": {"name": "keel"},
            "rootUri": path_to_uri(self.root),
            "rootPath": str(self.root),
            "workspaceFolders": [{"uri": path_to_uri(self.root), "name": self.root.name}],
            "capabilities": CLIENT_CAPABILITIES,
        }
        if self.init_options is not None:
            params["initializationOptions"] = self.init_options
        try:
            result = await asyncio.wait_for(self.request("initialize", params), startup)
        except TimeoutError:
            await self.close()
            raise LspError(f"{self.name} did not answer initialize within {startup:g} s") from None
        except LspError:
            await self.close()
            raise
        caps = result.get("capabilities") if isinstance(result, dict) else None
        self.capabilities = caps if isinstance(caps, dict) else {}
        await self.notify("initialized", {})
        if self.settings is not None:
            await self.notify("workspace/didChangeConfiguration", {"settings": self.settings})

    async def close(self) -> None:
        """`shutdown` and `exit`, then the whole process group ended (SIGTERM, then SIGKILL)."""
        if self.closed:
            return
        self.closed = True
        process = self.process
        if process is not None and process.returncode is None and not self.failure:
            with contextlib.suppress(LspError, TimeoutError, OSError):
                await asyncio.wait_for(self.request("shutdown", None), SHUTDOWN_GRACE)
                await self.notify("exit", None)
                await asyncio.wait_for(process.wait(), SHUTDOWN_GRACE)
        if process is not None:
            _signal_group(process.pid, signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(process.wait(), SHUTDOWN_GRACE)
            _signal_group(process.pid, signal.SIGKILL)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(process.wait(), SHUTDOWN_GRACE)
        if process is not None and process.stdin is not None:
            process.stdin.close()
        for task in (self._reader, self._stderr_task):
            if task is None:
                continue
            # The group is gone, so its pipes end: reading to their end lets the transport
            # close itself. A pipe something outside the group still holds is cut short.
            with contextlib.suppress(TimeoutError, asyncio.CancelledError, LspError):
                await asyncio.wait_for(asyncio.shield(task), SHUTDOWN_GRACE)
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        transport = getattr(process, "_transport", None)  # asyncio has no public close for it
        if transport is not None:
            transport.close()
        self._fail_pending("the server was shut down")

    # -- the wire ------------------------------------------------------------------------------

    async def _send(self, message: dict[str, Any]) -> None:
        process = self.process
        if process is None or process.stdin is None or (not self.alive and not self._closing_ok):
            raise LspError(self.failure or f"{self.name} is not running")
        body = json.dumps({"jsonrpc": "2.0", **message}, separators=(",", ":")).encode()
        async with self._write_lock:
            try:
                process.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
                await process.stdin.drain()
            except (OSError, RuntimeError) as exc:  # a closed pipe: the server is gone
                raise LspError(f"{self.name} stopped reading its input ({exc})") from None

    @property
    def _closing_ok(self) -> bool:
        """`shutdown` and `exit` are sent while closing."""
        return self.closed and self.process is not None and self.process.returncode is None

    async def request(self, method: str, params: object) -> Any:
        self._next_id += 1
        rid = self._next_id
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[rid] = future
        try:
            await self._send({"id": rid, "method": method, "params": params})
            return await future
        finally:
            self._pending.pop(rid, None)

    async def notify(self, method: str, params: object) -> None:
        await self._send({"method": method, "params": params})

    async def _read_loop(self) -> None:
        process = self.process
        assert process is not None
        assert process.stdout is not None
        stdout = process.stdout
        try:
            while True:
                length = None
                while True:
                    line = await stdout.readline()
                    if not line:
                        raise EOFError
                    text = line.decode("ascii", "replace").strip()
                    if not text:
                        break
                    name, _, value = text.partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value.strip())
                if length is None or not 0 <= length <= MAX_MESSAGE:
                    raise ValueError(f"a message without a valid Content-Length ({length})")
                body = await stdout.readexactly(length)
                message = json.loads(body)
                if isinstance(message, dict):
                    await self._dispatch(message)
        except (EOFError, asyncio.IncompleteReadError, ConnectionError):
            with contextlib.suppress(TimeoutError):  # for its exit code in the message
                await asyncio.wait_for(process.wait(), SHUTDOWN_GRACE)
            self._died("exited")
        except (ValueError, UnicodeDecodeError) as exc:
            self._died(f"sent something that is not LSP ({exc})")

    def _died(self, what: str) -> None:
        if self.closed:
            return
        code = self.process.returncode if self.process is not None else None
        tail = " | ".join(list(self.stderr)[-3:])
        self.failure = f"{self.name} {what}" + (f" (exit code {code})" if code is not None else "")
        if tail:
            self.failure += f": {tail}"
        self._fail_pending(self.failure)
        self._changed.set()

    def _fail_pending(self, why: str) -> None:
        for future in self._pending.values():
            if not future.done():
                future.set_exception(LspError(why))

    async def _drain_stderr(self) -> None:
        process = self.process
        assert process is not None
        assert process.stderr is not None
        while line := await process.stderr.readline():
            self.stderr.append(line.decode("utf-8", "replace").rstrip()[:300])

    async def _dispatch(self, message: dict[str, Any]) -> None:
        method = message.get("method")
        if "id" in message and method is None:  # an answer to one of ours
            future = self._pending.get(message["id"])
            if future is None or future.done():
                return
            error = message.get("error")
            if isinstance(error, dict):
                future.set_exception(
                    LspError(f"{self.name}: {error.get('message', 'error')} ({error.get('code')})")
                )
            else:
                future.set_result(message.get("result"))
            return
        params = message.get("params")
        if "id" in message:  # a request from the server: always answered
            result = self._answer(str(method), params)
            with contextlib.suppress(LspError):
                await self._send({"id": message["id"], "result": result})
            return
        if method == "textDocument/publishDiagnostics" and isinstance(params, dict):
            uri, version = params.get("uri"), params.get("version")
            stale = isinstance(version, int) and version < self.sent.get(str(uri), 0)
            if isinstance(uri, str) and not stale:
                self.pushed[uri] = parse_diagnostics(params.get("diagnostics"))
                self.pushes += 1
                self.push_seq[uri] = self.pushes
                self._changed.set()

    def _answer(self, method: str, params: object) -> object:
        """The result for a request the server sends: configuration from the entry's
        `settings` (by section), else null; everything else is acknowledged with null."""
        if method == "workspace/configuration" and isinstance(params, dict):
            items = params.get("items")
            return [self._section(i) for i in items] if isinstance(items, list) else []
        if method == "workspace/workspaceFolders":
            return [{"uri": path_to_uri(self.root), "name": self.root.name}]
        return None

    def _section(self, item: object) -> object:
        section = item.get("section") if isinstance(item, dict) else None
        value: object = self.settings
        if isinstance(section, str) and section:
            for part in section.split("."):
                value = value.get(part) if isinstance(value, dict) else None
        return value

    # -- documents and diagnostics -------------------------------------------------------------

    async def did_open(self, uri: str, language: str, version: int, text: str) -> None:
        self.sent[uri] = version
        doc = {"uri": uri, "languageId": language, "version": version, "text": text}
        await self.notify("textDocument/didOpen", {"textDocument": doc})

    async def did_change(self, uri: str, version: int, text: str) -> None:
        """The whole new text (full sync: every server accepts it)."""
        self.sent[uri] = version
        await self.notify(
            "textDocument/didChange",
            {"textDocument": {"uri": uri, "version": version}, "contentChanges": [{"text": text}]},
        )

    async def did_save(self, uri: str, text: str) -> None:
        sync = self.capabilities.get("textDocumentSync")
        save = sync.get("save") if isinstance(sync, dict) else None
        if not save:
            return
        params: dict[str, Any] = {"textDocument": {"uri": uri}}
        if isinstance(save, dict) and save.get("includeText"):
            params["text"] = text
        await self.notify("textDocument/didSave", params)

    @property
    def pulls(self) -> bool:
        """Whether the server offers pull diagnostics (`diagnosticProvider`)."""
        return bool(self.capabilities.get("diagnosticProvider"))

    async def pull(self, uri: str) -> list[Diagnostic] | None:
        """`textDocument/diagnostic` for `uri` (None: the server answered `unchanged`, or in a
        shape keel does not read)."""
        provider = self.capabilities.get("diagnosticProvider")
        params: dict[str, Any] = {"textDocument": {"uri": uri}}
        if isinstance(provider, dict) and isinstance(provider.get("identifier"), str):
            params["identifier"] = provider["identifier"]
        report = await self.request("textDocument/diagnostic", params)
        if isinstance(report, dict) and report.get("kind") == "full":
            self.pushed[uri] = parse_diagnostics(report.get("items"))
            return self.pushed[uri]
        return None

    async def wait_pushed(
        self, uris: Sequence[str], since: int, deadline: float, settle: float
    ) -> bool:
        """Wait until each of `uris` got a push after push number `since`, then until no push
        came for `settle` s (a server may publish a file twice: syntax, then types), or until
        `deadline` (monotonic). True when every URI was heard from."""
        while True:
            heard = all(self.push_seq.get(u, 0) > since for u in uris)
            if heard or self.failure:
                break
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), left)
        if self.failure:
            return False
        while True:  # settle: until the server is quiet for a moment
            left = min(settle, deadline - time.monotonic())
            if left <= 0:
                return True
            before = self.pushes
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), left)
            if self.pushes == before:
                return True


#: What keel tells a server it can do: documents synced in full, diagnostics pushed or pulled.
CLIENT_CAPABILITIES: dict[str, Any] = {
    "workspace": {
        "configuration": True,
        "workspaceFolders": True,
        "didChangeConfiguration": {"dynamicRegistration": False},
    },
    "textDocument": {
        "synchronization": {"dynamicRegistration": False, "didSave": True},
        "publishDiagnostics": {"relatedInformation": False, "versionSupport": True},
        "diagnostic": {"dynamicRegistration": False, "relatedDocumentSupport": False},
    },
    "window": {"workDoneProgress": False},
    "general": {"positionEncodings": ["utf-16"]},
}


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


__all__ = [
    "CLIENT_CAPABILITIES",
    "Diagnostic",
    "LspClient",
    "LspError",
    "parse_diagnostics",
    "path_to_uri",
    "uri_to_path",
]
