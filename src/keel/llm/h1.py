"""keel's direct transport for model calls: a small HTTP/1.1 client on asyncio, one connection
pool per provider.

`keel.llm.http.HTTPProvider` sends a model call here when no proxy is configured (with a proxy
the httpx client stays, so proxy and NO_PROXY behaviour is httpx's by construction). It replaces
aiohttp, whose import alone cost a third of `keel -p`'s start-up (it builds two TLS contexts at
import); this module imports only the standard library and costs about a millisecond.

It owns the transport's shape and nothing above it: a pool (64 connections, kept alive 5 s,
reused per scheme, host and port), TLS through the context the caller supplies (asked for only
for an https URL), a connect timeout, a stall timeout (no byte for N seconds while a response
is awaited), no redirects, the headers the httpx path sends, and bodies framed by
Content-Length, chunked encoding or the connection's end, gzip or deflate decoded. Its errors
are `TransportError`s that say which kind of failure they are (`kind`), so the caller maps them
to keel's errors without knowing this module's classes.

It retries one thing only, below keel's retry policy: a request sent on a kept-alive connection
that the server had already closed (`Client.post`). That request never reached the server, so
sending it again on another connection is safe for a POST too, and it is not a failed attempt.
"""

from __future__ import annotations

import asyncio
import functools
import re
import zlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:
    import ssl

#: The pool: as many connections as the httpx path allows (64), kept alive as long (5 s).
MAX_CONNECTIONS = 64
KEEPALIVE_SECONDS = 5.0
#: Kept-alive connections a request may find closed, one after another, before it gives up: a
#: pool holds few idle connections to one server, and each failure discards one.
STALE_ATTEMPTS = 4
#: A response head longer than this is refused (httpx's h11 allows 64 kB as well).
MAX_HEAD_BYTES = 64 * 1024
#: Buffered request bytes above which a send waits for the socket to drain.
WRITE_HIGH_WATER = 1 << 20


class TransportError(Exception):
    """A model call's transport failed. `kind` is the bucket the caller maps to keel's errors:
    "connect" (never connected), "stall" (no byte for the stall timeout), "lost" (the connection
    ended or the server spoke something that is not HTTP/1.1) or "failed" (anything else)."""

    kind = "failed"


class ConnectError(TransportError):
    kind = "connect"


class ConnectTimeout(ConnectError):
    pass


class StallTimeout(TransportError):
    kind = "stall"


class ConnectionLost(TransportError):
    kind = "lost"


class ProtocolError(ConnectionLost):
    """The server's bytes are not a valid HTTP/1.1 response."""


class _Stale(ConnectionLost):
    """A reused connection ended before any byte of the response: the server had closed it."""


@functools.cache
def default_headers() -> dict[str, str]:
    """The headers the httpx path sends on every request, so a server (and the tests that pin
    the whole request) sees the same request whichever transport sent it."""
    return {
        "accept": "*/*",
        "accept-encoding": "gzip, deflate",
        "connection": "keep-alive",
        "user-agent": f"python-httpx/{_httpx_version()}",
    }


def _httpx_version() -> str:
    """httpx's version without importing httpx (~80 ms) or importlib.metadata (~6 ms): its
    `__version__.py`, found by the import system; the metadata lookup if that cannot be read."""
    import importlib.util

    spec = importlib.util.find_spec("httpx")
    if spec is not None and spec.submodule_search_locations:
        for folder in spec.submodule_search_locations:
            try:
                with open(f"{folder}/__version__.py", encoding="utf-8") as f:
                    found = re.search(r'^__version__ = "([^"]+)"', f.read(), re.MULTILINE)
            except OSError:
                continue
            if found:
                return found.group(1)
    import importlib.metadata

    return importlib.metadata.version("httpx")


class Headers(dict[str, str]):
    """Response headers, names lowercased; lookups ignore case. A repeated header's values are
    joined with ", " (RFC 9110's list form)."""

    def __getitem__(self, key: str) -> str:
        return super().__getitem__(key.lower())

    def get(self, key: str, default: Any = None) -> Any:
        return super().get(key.lower(), default)

    def __contains__(self, key: object) -> bool:
        return super().__contains__(key.lower() if isinstance(key, str) else key)


_Key = tuple[str, str, int]


class _Connection(asyncio.Protocol):
    """One TCP (or TLS) connection: received bytes wait in `data` for the response reader; one
    stall timer per connection fails a waiting read when no byte came for `stall` seconds (it
    is rescheduled only when it fires, so reads cost no timer of their own)."""

    def __init__(self, key: _Key, stall: float | None) -> None:
        self.key = key
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.data = b""
        self.eof = False
        self.error: BaseException | None = None
        self.received_any = False  # a byte of the current response has arrived
        self.reused = False
        self.counted = False  # counted among the pool's open connections
        self.idle_timer: asyncio.TimerHandle | None = None
        self._stall = stall
        self._last = 0.0
        self._stall_timer: asyncio.TimerHandle | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._drained: asyncio.Future[None] | None = None
        self._paused = False

    # -- asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.data = self.data + data if self.data else data
        self.received_any = True
        self._last = self.loop.time()
        self._wake()

    def eof_received(self) -> bool:
        self.eof = True
        self._wake()
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = True
        if exc is not None and self.error is None:
            self.error = exc
        self._wake()
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        if self.idle_timer is not None:
            self.idle_timer.cancel()

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    # -- the reader's side -----------------------------------------------------------------------

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def wait(self) -> None:
        """Until more bytes, the end of the connection, or the stall timeout (StallTimeout)."""
        if self.eof:
            raise self._lost()
        waiter = self.loop.create_future()
        self._waiter = waiter
        if self._stall is not None:
            now = self.loop.time()
            self._last = max(self._last, now)
            if self._stall_timer is None:
                self._stall_timer = self.loop.call_at(now + self._stall, self._check_stall)
        try:
            await waiter
        finally:
            self._waiter = None

    def _check_stall(self) -> None:
        self._stall_timer = None
        waiter, stall = self._waiter, self._stall
        if waiter is None or waiter.done() or stall is None:
            return
        due = self._last + stall
        if self.loop.time() >= due:
            waiter.set_exception(StallTimeout(f"no data for {stall:g} s"))
        else:
            self._stall_timer = self.loop.call_at(due, self._check_stall)

    def _lost(self) -> ConnectionLost:
        if self.reused and not self.received_any:
            return _Stale("the kept-alive connection was closed by the server")
        if self.error is not None:
            return ConnectionLost(f"connection lost: {self.error}")
        return ConnectionLost("server closed the connection before the response ended")

    def take(self) -> bytes:
        data, self.data = self.data, b""
        return data

    # -- the writer's side -----------------------------------------------------------------------

    async def send(self, data: bytes) -> None:
        transport = self.transport
        if transport is None or transport.is_closing() or self.eof:
            raise self._lost()
        transport.write(data)
        while self._paused and not self.eof:
            self._drained = self.loop.create_future()
            await self._drained
        if self.failed():  # the connection broke while the request was being written
            raise self._lost()

    def failed(self) -> bool:
        return self.eof and self.error is not None

    @property
    def usable(self) -> bool:
        """Whether an idle connection can carry another request."""
        transport = self.transport
        return transport is not None and not transport.is_closing() and not self.eof

    def close(self) -> None:
        if self.idle_timer is not None:
            self.idle_timer.cancel()
            self.idle_timer = None
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None
        if self.transport is not None:
            self.transport.close()


_STATUS_LINE = re.compile(rb"HTTP/1\.([01]) (\d{3})(?: [^\r\n]*)?")


class Response:
    """A response whose head has arrived. Read its body with `readany` (each call: the bytes
    that are there, b"" at the end) or `read` (all of it); `release` gives the connection back
    to the pool when the body was read to its end, else closes it."""

    __slots__ = (
        "_chunk_left",
        "_client",
        "_conn",
        "_decoder",
        "_done",
        "_left",
        "_mode",
        "_reusable",
        "headers",
        "request_headers",
        "status",
    )

    def __init__(
        self,
        client: Client,
        conn: _Connection,
        status: int,
        headers: Headers,
        request_headers: dict[str, str],
        *,
        version: int,
        head_only: bool,
    ) -> None:
        self._client = client
        self._conn: _Connection | None = conn
        self.status = status
        self.headers = headers
        self.request_headers = request_headers
        self._decoder: Any = None
        self._chunk_left = -1  # chunked: bytes left in the current chunk; -1 a size line is next
        self._left = 0
        self._done = False
        keep = headers.get("connection", "").lower()
        self._reusable = (version == 1 and "close" not in keep) or "keep-alive" in keep
        encoding = headers.get("transfer-encoding", "").lower()
        length = headers.get("content-length")
        if head_only or status in (204, 304) or 100 <= status < 200:
            self._mode = "length"
        elif "chunked" in encoding:
            self._mode = "chunked"
        elif length is not None:
            try:
                self._left = int(length)
            except ValueError:
                raise ProtocolError(f"bad content-length {length!r}") from None
            if self._left < 0:
                raise ProtocolError(f"bad content-length {length!r}")
            self._mode = "length"
        else:
            self._mode = "eof"
            self._reusable = False
        coding = headers.get("content-encoding", "").lower().strip()
        if coding == "gzip" or coding == "x-gzip":
            self._decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif coding == "deflate":
            self._decoder = _Deflate()
        if self._mode == "length" and self._left == 0:
            self._finish()

    @property
    def connection(self) -> _Connection | None:
        return self._conn

    def socket(self) -> Any:
        """The socket under the response (its deadline timer shuts it down), or None."""
        conn = self._conn
        transport = conn.transport if conn is not None else None
        sock = transport.get_extra_info("socket") if transport is not None else None
        return sock if hasattr(sock, "shutdown") else None

    async def readany(self) -> bytes:
        while not self._done:
            raw = self._step()
            if raw:
                return self._decode(raw)
            if self.finished():
                break
            conn = self._conn
            assert conn is not None
            if conn.eof and not conn.data:
                if self._mode == "eof":
                    self._finish()
                    break
                raise conn._lost()
            await conn.wait()
        return self._flush()

    async def read(self) -> bytes:
        parts = []
        while chunk := await self.readany():
            parts.append(chunk)
        return b"".join(parts)

    def _step(self) -> bytes:
        """The body bytes now buffered, framing removed (b"" when none yet)."""
        conn = self._conn
        assert conn is not None
        if not conn.data:
            return b""
        if self._mode == "length":
            data = conn.take()
            if len(data) >= self._left:
                data, conn.data = data[: self._left], data[self._left :]
                self._left = 0
                self._finish()
            else:
                self._left -= len(data)
            return data
        if self._mode == "eof":
            return conn.take()
        return self._dechunk(conn)

    def _dechunk(self, conn: _Connection) -> bytes:
        data = conn.take()
        parts: list[bytes] = []
        at = 0
        end = len(data)
        while at < end:
            left = self._chunk_left
            if left > 0:
                take = min(left, end - at)
                parts.append(data[at : at + take])
                at += take
                self._chunk_left = left - take
                if self._chunk_left == 0:
                    self._chunk_left = -2  # the CRLF after the chunk is next
                continue
            line_end = data.find(b"\r\n", at)
            if line_end < 0:
                if end - at > 4096:
                    raise ProtocolError("chunk size line too long")
                break
            line = data[at:line_end]
            at = line_end + 2
            if left == -2:  # the CRLF after a chunk's data
                if line:
                    raise ProtocolError("chunk data longer than its size")
                self._chunk_left = -1
                continue
            if left == -3:  # trailers, up to an empty line
                if not line:
                    conn.data = data[at:]
                    self._finish()
                    return b"".join(parts)
                continue
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise ProtocolError(f"bad chunk size line {line[:40]!r}") from None
            self._chunk_left = size if size > 0 else -3
        conn.data = data[at:]
        return b"".join(parts) if len(parts) != 1 else parts[0]

    def _decode(self, raw: bytes) -> bytes:
        if self._decoder is None:
            return raw
        try:
            return bytes(self._decoder.decompress(raw))
        except zlib.error as exc:
            raise ProtocolError(f"the body cannot be decoded: {exc}") from exc

    def _flush(self) -> bytes:
        decoder, self._decoder = self._decoder, None
        if decoder is None:
            return b""
        return bytes(decoder.flush())

    def _finish(self) -> None:
        self._done = True

    def finished(self) -> bool:
        """Whether the body has been read to its end."""
        return self._done

    def release(self) -> None:
        """Back to the pool if the body was read to its end, else close the connection."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._done and self._reusable and not conn.data:
            self._client._put_back(conn)
        else:
            self._client._discard(conn)


class _Deflate:
    """`deflate` as servers send it: zlib-wrapped, or raw (httpx accepts both)."""

    def __init__(self) -> None:
        self._first = True
        self._obj = zlib.decompressobj()

    def decompress(self, data: bytes) -> bytes:
        if self._first:
            self._first = False
            try:
                return self._obj.decompress(data)
            except zlib.error:
                self._obj = zlib.decompressobj(-zlib.MAX_WBITS)
        return self._obj.decompress(data)

    def flush(self) -> bytes:
        return self._obj.flush()


class Client:
    """The pool and the requests: `post` (up to the response head), `get` (a small whole
    response), `close`. Bound to the running loop it was first used on."""

    def __init__(
        self,
        *,
        tls: Callable[[], ssl.SSLContext],
        connect_timeout: float,
        stall_timeout: float | None,
        max_connections: int = MAX_CONNECTIONS,
        keepalive: float = KEEPALIVE_SECONDS,
    ) -> None:
        self.max_connections = max_connections
        self.keepalive = keepalive
        self._tls = tls
        self._connect_timeout = connect_timeout
        self._stall = stall_timeout
        self._idle: dict[_Key, list[_Connection]] = {}
        self._open = 0
        self._waiting: list[asyncio.Future[None]] = []
        self._closed = False

    async def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> Response:
        """Send one POST and return the response once its head has arrived (no redirects:
        httpx follows none either).

        A send that fails on a kept-alive connection before any response byte (the write
        fails, or the connection ends before a status line) found a connection the server had
        closed while it sat in the pool: llama.cpp's server closes every connection after a
        streamed response without saying so, and a request sent before the client noticed
        goes nowhere. It is sent again on another connection; a failure on a new connection is
        the caller's."""
        for _ in range(STALE_ATTEMPTS):
            try:
                return await self._send("POST", url, body, headers)
            except _Stale:
                continue
        return await self._send("POST", url, body, headers)

    async def get(self, url: str, headers: Mapping[str, str], seconds: float) -> tuple[int, bytes]:
        """One small GET, read whole within `seconds`: status and body."""
        async with asyncio.timeout(seconds):
            for _ in range(STALE_ATTEMPTS):
                try:
                    response = await self._send("GET", url, b"", headers)
                    break
                except _Stale:
                    continue
            else:
                response = await self._send("GET", url, b"", headers)
            try:
                return response.status, await response.read()
            finally:
                response.release()

    async def close(self) -> None:
        self._closed = True
        for conns in self._idle.values():
            for conn in conns:
                conn.close()
        self._idle.clear()

    # -- one request -----------------------------------------------------------------------------

    async def _send(
        self,
        method: str,
        url: str,
        body: bytes,
        headers: Mapping[str, str],
    ) -> Response:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https"):
            raise TransportError(f"unsupported URL scheme {parts.scheme!r}")
        host = parts.hostname or ""
        port = parts.port or (443 if scheme == "https" else 80)
        target = parts.path or "/"
        if parts.query:
            target += "?" + parts.query
        shown = f"[{host}]" if ":" in host else host
        sent = {"host": shown if parts.port is None else f"{shown}:{port}"}
        sent.update(default_headers())
        for name, value in headers.items():
            sent[name.lower()] = value
        if body or method == "POST":
            sent["content-length"] = str(len(body))
        head = f"{method} {target} HTTP/1.1\r\n" + "".join(
            f"{name}: {value}\r\n" for name, value in sent.items()
        )
        conn = await self._acquire((scheme, host, port))
        try:
            conn.received_any = False
            await conn.send(head.encode("latin-1") + b"\r\n" + body)
            status, version, response_headers = await self._head(conn)
            return Response(
                self,
                conn,
                status,
                response_headers,
                sent,
                version=version,
                head_only=method == "HEAD",
            )
        except BaseException:
            self._discard(conn)
            raise

    async def _head(self, conn: _Connection) -> tuple[int, int, Headers]:
        """The status line and headers (1xx interim responses skipped)."""
        while True:
            end = conn.data.find(b"\r\n\r\n")
            if end < 0:
                if len(conn.data) > MAX_HEAD_BYTES:
                    raise ProtocolError("response head too long")
                if conn.eof:
                    raise conn._lost()
                await conn.wait()
                continue
            raw, conn.data = conn.data[:end], conn.data[end + 4 :]
            lines = raw.split(b"\r\n")
            matched = _STATUS_LINE.fullmatch(lines[0])
            if matched is None:
                raise ProtocolError(f"not an HTTP/1.1 status line: {lines[0][:60]!r}")
            status = int(matched.group(2))
            if 100 <= status < 200 and status != 101:
                continue
            headers = Headers()
            for line in lines[1:]:
                name, colon, value = line.partition(b":")
                if not colon or not name or name != name.strip():
                    raise ProtocolError(f"bad header line {line[:60]!r}")
                key = name.decode("latin-1").lower()
                text = value.strip().decode("latin-1")
                previous = dict.get(headers, key)
                dict.__setitem__(headers, key, text if previous is None else f"{previous}, {text}")
            return status, int(matched.group(1)), headers

    # -- the pool --------------------------------------------------------------------------------

    async def _acquire(self, key: _Key) -> _Connection:
        if self._closed:
            raise TransportError("the client is closed")
        while True:
            idle = self._idle.get(key)
            while idle:
                conn = idle.pop()
                if conn.idle_timer is not None:
                    conn.idle_timer.cancel()
                    conn.idle_timer = None
                if conn.usable and not conn.data:  # bytes while idle: not an HTTP server's
                    conn.reused = True
                    return conn
                self._discard(conn)
            if self._open >= self.max_connections:
                self._close_one_idle()
            if self._open < self.max_connections:
                return await self._connect(key)
            waiter = asyncio.get_running_loop().create_future()
            self._waiting.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._wake_one()  # woken, then cancelled: the turn passes to the next
                raise
            finally:
                if waiter in self._waiting:
                    self._waiting.remove(waiter)

    def _close_one_idle(self) -> None:
        for conns in self._idle.values():
            if conns:
                self._discard(conns.pop(0))
                return

    async def _connect(self, key: _Key) -> _Connection:
        scheme, host, port = key
        loop = asyncio.get_running_loop()
        context = self._tls() if scheme == "https" else None
        self._open += 1
        try:
            async with asyncio.timeout(self._connect_timeout):
                _, conn = await loop.create_connection(
                    lambda: _Connection(key, self._stall),
                    host,
                    port,
                    ssl=context,
                    server_hostname=host if context is not None else None,
                )
        except TimeoutError as exc:
            self._released()
            raise ConnectTimeout(
                f"connecting to {host}:{port} took over {self._connect_timeout:g} s"
            ) from exc
        except OSError as exc:
            self._released()
            raise ConnectError(f"cannot connect to {host}:{port}: {exc}") from exc
        except BaseException:
            self._released()
            raise
        conn.counted = True
        return conn

    def _put_back(self, conn: _Connection) -> None:
        if self._closed or not conn.usable:
            self._discard(conn)
            return
        conn.idle_timer = conn.loop.call_later(self.keepalive, self._expire, conn)
        self._idle.setdefault(conn.key, []).append(conn)
        self._wake_one()

    def _expire(self, conn: _Connection) -> None:
        conn.idle_timer = None
        idle = self._idle.get(conn.key)
        if idle and conn in idle:
            idle.remove(conn)
            self._discard(conn)

    def _discard(self, conn: _Connection) -> None:
        conn.close()
        if conn.counted:
            conn.counted = False
            self._released()

    def _released(self) -> None:
        self._open -= 1
        self._wake_one()

    def _wake_one(self) -> None:
        while self._waiting:
            waiter = self._waiting.pop(0)
            if not waiter.done():
                waiter.set_result(None)
                return


__all__ = [
    "KEEPALIVE_SECONDS",
    "MAX_CONNECTIONS",
    "STALE_ATTEMPTS",
    "Client",
    "ConnectError",
    "ConnectTimeout",
    "ConnectionLost",
    "Headers",
    "ProtocolError",
    "Response",
    "StallTimeout",
    "TransportError",
    "default_headers",
]
