"""A minimal HTTP/1.1 server on 127.0.0.1 for tests and benchmarks: real sockets, real keep-alive,
chunked streaming, and the ability to misbehave (drop a connection, go silent).

It runs its own event loop in a daemon thread, so synchronous SDK clients and async keel clients
can both talk to it. Wire-API servers (`keel.testing.anthropic_server`, …) subclass
`ScriptedHTTPServer` and supply only rendering.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import threading
import time
from abc import abstractmethod
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import field
from typing import Any, Self

from keel.frozen import mutable
from keel.testing.script import Fault, Reply, ScriptDivergence, Step

_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    408: "Request Timeout",
    409: "Conflict",
    413: "Payload Too Large",
    429: "Too Many Requests",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
    529: "Overloaded",
}


@mutable
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    received_at: float = field(default_factory=time.monotonic)
    #: For a request sent to this server as a forward proxy: the origin it was meant for.
    proxied_to: str = ""

    @property
    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


class Disconnect(Exception):
    """Raised by a handler to drop the connection without a proper end."""


class ResponseWriter:
    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        self._streaming = False
        self.keep_alive = True

    def _head(self, status: int, headers: dict[str, str]) -> bytes:
        lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        return ("\r\n".join(lines) + "\r\n\r\n").encode()

    async def send(
        self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None
    ) -> None:
        h = {"content-type": content_type, "content-length": str(len(body))}
        h.update(headers or {})
        self._writer.write(self._head(status, h) + body)
        await self._writer.drain()

    async def send_json(self, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
        await self.send(status, json.dumps(obj).encode(), "application/json", headers)

    async def start_stream(
        self,
        status: int = 200,
        content_type: str = "text/event-stream",
        headers: dict[str, str] | None = None,
    ) -> None:
        h = {
            "content-type": content_type,
            "transfer-encoding": "chunked",
            "cache-control": "no-cache",
        }
        h.update(headers or {})
        self._writer.write(self._head(status, h))
        self._streaming = True
        await self._writer.drain()

    async def chunk(self, data: bytes) -> None:
        if data:
            self._writer.write(b"%x\r\n%s\r\n" % (len(data), data))
            await self._writer.drain()

    async def end_stream(self) -> None:
        self._writer.write(b"0\r\n\r\n")
        await self._writer.drain()
        self._streaming = False

    def abort(self) -> None:
        """Drop the connection mid-response."""
        self.keep_alive = False
        transport = self._writer.transport
        transport.abort()


class LoopbackServer:
    """Base server: subclasses implement `handle`. Use as a context manager or call start/stop."""

    def __init__(self) -> None:
        self.requests: list[RecordedRequest] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.base_events.Server | None = None
        self._ready = threading.Event()
        self.port = 0
        self.errors: list[BaseException] = []
        self._writers: set[asyncio.StreamWriter] = set()
        #: Serve HTTPS with this context when set before `start()`.
        self.tls: ssl.SSLContext | None = None

    @property
    def url(self) -> str:
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    def start(self) -> Self:
        self._thread = threading.Thread(target=self._run, name=type(self).__name__, daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("loopback server did not start")
        return self

    def stop(self) -> None:
        """Close every connection, finish the handlers, and stop the thread."""
        loop = self._loop
        if loop is None:
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(10)
        self._loop = None

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        current = asyncio.current_task()
        tasks = [t for t in asyncio.all_tasks() if t is not current]
        # Aborted connections end their handlers normally; cancel only what is still running
        # after a moment (a cancelled handler makes asyncio log a spurious error).
        _, pending = await asyncio.wait(tasks, timeout=2) if tasks else (set(), set())
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)

        async def boot() -> None:
            self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.tls)
            self.port = self._server.sockets[0].getsockname()[1]

        loop.run_until_complete(boot())
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:
                request = await self._read_request(reader)
                if request is None:
                    break
                self.requests.append(request)
                response = ResponseWriter(writer)
                try:
                    await self.handle(request, response)
                except Disconnect:
                    response.abort()
                    break
                except ConnectionError:
                    break  # the client went away mid-response (a stall it gave up on)
                except Exception as exc:  # a bug in a test handler: report it, answer 500
                    self.errors.append(exc)
                    await response.send_json(500, {"error": {"message": f"test server: {exc!r}"}})
                if not response.keep_alive or request.headers.get("connection") == "close":
                    break
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._writers.discard(writer)
            try:
                writer.close()
            except RuntimeError:
                pass

    async def _read_request(self, reader: asyncio.StreamReader) -> RecordedRequest | None:
        line = await reader.readline()
        if not line:
            return None
        method, path, _ = line.decode("latin-1").split(" ", 2)
        target = ""
        if path.startswith(("http://", "https://")):
            # Absolute form: the client took this server for its forward proxy.
            scheme, _, rest = path.partition("://")
            host, _, tail = rest.partition("/")
            target, path = f"{scheme}://{host}", "/" + tail
        headers: dict[str, str] = {}
        while True:
            raw = await reader.readline()
            if raw in (b"\r\n", b"\n", b""):
                break
            name, _, value = raw.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        body = b""
        if "content-length" in headers:
            body = await reader.readexactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            parts = []
            while True:
                size = int((await reader.readline()).strip().split(b";")[0], 16)
                if size == 0:
                    await reader.readline()
                    break
                parts.append(await reader.readexactly(size))
                await reader.readline()
            body = b"".join(parts)
        return RecordedRequest(method, path, headers, body, proxied_to=target)

    @abstractmethod
    async def handle(self, request: RecordedRequest, response: ResponseWriter) -> None: ...


class RawStreamServer(LoopbackServer):
    """Streams `chunks` (raw body bytes, set by the test) to every request, for testing a
    decoder against exactly the bytes a server might send."""

    def __init__(self) -> None:
        super().__init__()
        self.chunks: tuple[bytes, ...] = ()

    async def handle(self, request: RecordedRequest, response: ResponseWriter) -> None:
        await response.start_stream()
        for part in self.chunks:
            await response.chunk(part)
        await response.end_stream()


Responder = Callable[[RecordedRequest], Step]


class ScriptedHTTPServer(LoopbackServer):
    """A server that answers model requests from a script of `Reply`/`Fault` steps (or from a
    `responder` function for open-ended runs such as benchmarks).

    Subclasses render a `Reply` to their wire API, streaming and not, and an error body."""

    #: Paths this server answers model requests on.
    model_paths: tuple[str, ...] = ()

    def __init__(self, script: Iterable[Step] = (), *, responder: Responder | None = None) -> None:
        super().__init__()
        self.script: deque[Step] = deque(script)
        self.responder = responder

    def add(self, *steps: Step) -> None:
        self.script.extend(steps)

    @property
    def model_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.path.split("?")[0] in self.model_paths]

    def next_step(self, request: RecordedRequest) -> Step:
        if self.responder is not None:
            return self.responder(request)
        if not self.script:
            raise ScriptDivergence(
                f"{type(self).__name__} got model request #{len(self.model_requests)} "
                "but its script is used up"
            )
        return self.script.popleft()

    async def handle(self, request: RecordedRequest, response: ResponseWriter) -> None:
        if request.path.split("?")[0] not in self.model_paths:
            await self.handle_other(request, response)
            return
        step = self.next_step(request)
        body = request.json or {}
        streaming = self.is_streaming(request, body)
        if isinstance(step, Fault):
            await self._fault(step, request, response, streaming)
            return
        await self._reply(step, request, response, streaming)

    async def _reply(
        self, step: Reply, request: RecordedRequest, response: ResponseWriter, streaming: bool
    ) -> None:
        if step.delay:
            await asyncio.sleep(step.delay)
        if not streaming:
            await response.send_json(200, self.render_json(step, request))
            return
        await response.start_stream(headers=self.stream_headers())
        for event in self.render_stream(step, request):
            await response.chunk(event)
        await response.end_stream()

    async def _fault(
        self, fault: Fault, request: RecordedRequest, response: ResponseWriter, streaming: bool
    ) -> None:
        if fault.kind in ("status", "overflow"):
            status = 400 if fault.kind == "overflow" else fault.status
            headers = {}
            if fault.retry_after is not None:
                headers["retry-after"] = f"{fault.retry_after:g}"
            body = (
                self.render_overflow(fault.message)
                if fault.kind == "overflow"
                else self.render_error(status, fault.message or f"scripted error {status}")
            )
            await response.send_json(status, body, headers)
            return
        reply = fault.reply or Reply(_empty_message())
        events = list(self.render_stream(reply, request))
        if reply.delay:  # think time before the first byte, as for a reply of its own
            await asyncio.sleep(reply.delay)
        await response.start_stream(headers=self.stream_headers())
        for i, event in enumerate(events):
            if i == fault.after_events:
                if fault.kind == "disconnect":
                    raise Disconnect
                await asyncio.sleep(fault.seconds)
            await response.chunk(event)
        await response.end_stream()

    async def handle_other(self, request: RecordedRequest, response: ResponseWriter) -> None:
        await response.send_json(404, self.render_error(404, f"no route for {request.path}"))

    def stream_headers(self) -> dict[str, str]:
        return {}

    @staticmethod
    def sse(event: str | None, data: Any) -> bytes:
        """One SSE event; `event` None omits the event line (Chat Completions style)."""
        payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
        head = f"event: {event}\n" if event else ""
        return f"{head}data: {payload}\n\n".encode()

    @abstractmethod
    def is_streaming(self, request: RecordedRequest, body: Any) -> bool: ...

    @abstractmethod
    def render_stream(self, step: Reply, request: RecordedRequest) -> Iterable[bytes]: ...

    @abstractmethod
    def render_json(self, step: Reply, request: RecordedRequest) -> Any: ...

    @abstractmethod
    def render_error(self, status: int, message: str) -> Any: ...

    @abstractmethod
    def render_overflow(self, message: str) -> Any: ...


def _empty_message() -> Any:
    from keel.llm.messages import Message, Text

    return Message("assistant", (Text("partial reply that will be cut off"),))
