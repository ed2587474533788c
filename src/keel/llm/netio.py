"""A plain-asyncio network backend for httpcore (the engine under httpx).

httpcore's default backend goes through anyio, whose cancel scopes and attribute lookups cost tens
of microseconds per socket read; a streamed model reply is dozens of reads. This backend reads and
writes asyncio streams directly, with `asyncio.timeout` for deadlines, and raises httpcore's own
exceptions so httpx maps them as usual (a read timeout stays a `ReadTimeout`, hence a stall).

It owns nothing else: no retries, no HTTP. `http_transport` plugs it into an httpx transport.
"""

from __future__ import annotations

import asyncio
import select
import ssl
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import httpcore

if TYPE_CHECKING:
    import httpx

#: Bytes a StreamReader buffers before it pauses the socket.
READ_LIMIT = 1 << 20


class AsyncioStream(httpcore.AsyncNetworkStream):
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        try:
            if timeout is None:
                return await self._reader.read(max_bytes)
            async with asyncio.timeout(timeout):
                return await self._reader.read(max_bytes)
        except TimeoutError as exc:
            raise httpcore.ReadTimeout(str(exc) or "read timed out") from exc
        except OSError as exc:
            raise httpcore.ReadError(str(exc)) from exc

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        try:
            self._writer.write(buffer)
            async with asyncio.timeout(timeout):
                await self._writer.drain()
        except TimeoutError as exc:
            raise httpcore.WriteTimeout(str(exc) or "write timed out") from exc
        except OSError as exc:
            raise httpcore.WriteError(str(exc)) from exc

    async def aclose(self) -> None:
        # No graceful wait: a connection is closed when it is done with or broken.
        self._writer.transport.abort()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.AsyncNetworkStream:
        try:
            async with asyncio.timeout(timeout):
                await self._writer.start_tls(ssl_context, server_hostname=server_hostname)
        except TimeoutError as exc:
            await self.aclose()
            raise httpcore.ConnectTimeout(str(exc) or "TLS handshake timed out") from exc
        except (OSError, ssl.SSLError) as exc:
            await self.aclose()
            raise httpcore.ConnectError(str(exc)) from exc
        return self

    def get_extra_info(self, info: str) -> Any:
        transport = self._writer.transport
        if info == "ssl_object":
            return transport.get_extra_info("ssl_object")
        if info == "client_addr":
            return transport.get_extra_info("sockname")
        if info == "server_addr":
            return transport.get_extra_info("peername")
        if info == "socket":
            return transport.get_extra_info("socket")
        if info == "is_readable":
            # An idle keep-alive connection that is readable was closed (or spoke out of turn)
            # by the server, so the pool must not reuse it.
            if self._reader.at_eof() or transport.is_closing():
                return True
            sock = transport.get_extra_info("socket")
            if sock is None:
                return True
            poller = select.poll()
            poller.register(sock.fileno(), select.POLLIN)
            return bool(poller.poll(0))
        return None


class AsyncioBackend(httpcore.AsyncNetworkBackend):
    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_connection(
                    host,
                    port,
                    local_addr=(local_address, 0) if local_address else None,
                    limit=READ_LIMIT,
                )
        except TimeoutError as exc:
            raise httpcore.ConnectTimeout(
                str(exc) or f"connecting to {host}:{port} timed out"
            ) from exc
        except OSError as exc:
            raise httpcore.ConnectError(str(exc)) from exc
        sock = writer.get_extra_info("socket")
        for option in socket_options or ():
            sock.setsockopt(*option)
        return AsyncioStream(reader, writer)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_unix_connection(path, limit=READ_LIMIT)
        except TimeoutError as exc:
            raise httpcore.ConnectTimeout(str(exc) or f"connecting to {path} timed out") from exc
        except OSError as exc:
            raise httpcore.ConnectError(str(exc)) from exc
        return AsyncioStream(reader, writer)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


def http_transport(
    *, ssl_context: ssl.SSLContext | None, max_connections: int, max_keepalive: int
) -> httpx.AsyncHTTPTransport:
    """An httpx transport whose connections use `AsyncioBackend`. (httpx builds its pool without
    a way to pass a backend, so the pool is replaced after construction.)"""
    import httpx

    transport = httpx.AsyncHTTPTransport(
        verify=ssl_context if ssl_context is not None else False,
        limits=httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=max_keepalive
        ),
    )
    transport._pool = httpcore.AsyncConnectionPool(
        ssl_context=ssl_context,
        max_connections=max_connections,
        max_keepalive_connections=max_keepalive,
        keepalive_expiry=5.0,
        network_backend=AsyncioBackend(),
    )
    return transport
