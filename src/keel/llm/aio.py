"""keel's direct streaming transport for model calls: one pooled aiohttp session per provider.

`keel.llm.http.HTTPProvider` sends a model call here when no proxy is configured (with a proxy
the httpx client stays, so proxy and NO_PROXY behaviour is httpx's by construction). aiohttp's
C-accelerated HTTP parser costs about half of httpx's CPU per streamed request (bench/
bench_http_clients.py). This module owns only the transport's shape: the session (pool size,
keep-alive, TLS context, connect and stall timeouts, no redirects, the same default headers the
httpx path sends) and the mapping of aiohttp's exceptions to keel's errors. It must never be
imported before the first model call (aiohttp's import costs ~90 ms).

It retries one thing only, below keel's retry policy: a request sent on a kept-alive connection
that the server had already closed (`post`). That request never reached the server, so sending
it again on another connection is safe for a POST too, and it is not a failed attempt.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import aiohttp

if TYPE_CHECKING:
    import ssl

#: The pool: as many connections as the httpx path allows (64), kept alive as long (5 s).
MAX_CONNECTIONS = 64
KEEPALIVE_SECONDS = 5.0

#: aiohttp's exceptions that are failures of the transport (what httpx.HTTPError is there).
TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (aiohttp.ClientError,)
#: Kept-alive connections a request may find closed, one after another, before it gives up: a
#: pool holds few idle connections to one server, and each failure discards one.
STALE_ATTEMPTS = 4


@functools.cache
def default_headers() -> dict[str, str]:
    """The headers the httpx path sends on every request, so a server (and the tests that pin
    the whole request) sees the same request whichever transport sent it."""
    return {
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


def open_session(
    *, ssl_context: ssl.SSLContext | None, connect_timeout: float, stall_timeout: float | None
) -> aiohttp.ClientSession:
    """A session bound to the running loop. `ssl_context` None (a plain-HTTP base URL) still
    verifies should an https URL ever be asked for (aiohttp's default verifying context)."""
    connector = aiohttp.TCPConnector(
        limit=MAX_CONNECTIONS,
        limit_per_host=0,
        keepalive_timeout=KEEPALIVE_SECONDS,
        ssl=ssl_context if ssl_context is not None else True,
    )
    timeout = aiohttp.ClientTimeout(
        total=None, connect=None, sock_connect=connect_timeout, sock_read=stall_timeout
    )
    return aiohttp.ClientSession(
        connector=connector,
        timeout=timeout,
        headers=default_headers(),
        trust_env=False,  # proxies never reach here; certificates come from ssl_context
        auto_decompress=True,
        trace_configs=[_reuse_tracing()],
    )


class _Attempt:
    """One send of a request: whether it went out on a connection taken from the pool."""

    __slots__ = ("reused",)

    def __init__(self) -> None:
        self.reused = False


@functools.cache
def _reuse_tracing() -> aiohttp.TraceConfig:
    """Tells each request's `_Attempt` when aiohttp hands it a kept-alive connection."""

    async def reused(_session: object, context: SimpleNamespace, _params: object) -> None:
        attempt = context.trace_request_ctx
        if isinstance(attempt, _Attempt):
            attempt.reused = True

    config = aiohttp.TraceConfig()
    config.on_connection_reuseconn.append(reused)
    return config


async def post(
    session: aiohttp.ClientSession, url: str, body: bytes, headers: Mapping[str, str]
) -> aiohttp.ClientResponse:
    """Send one POST and return the response once its head has arrived (no redirects: httpx
    follows none either).

    A send that fails on a kept-alive connection before any response (the write fails, or the
    connection ends before a status line) found a connection the server had closed while it
    sat in the pool: llama.cpp's server closes every connection after a streamed response
    without saying so, and a request sent before the client noticed goes nowhere. It is sent
    again on another connection; a failure on a new connection is the caller's."""
    for _ in range(STALE_ATTEMPTS):
        attempt = _Attempt()
        try:
            return await session.post(
                url,
                data=body,
                headers=dict(headers),
                allow_redirects=False,
                trace_request_ctx=attempt,
            )
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
            if not attempt.reused:
                raise
    return await session.post(url, data=body, headers=dict(headers), allow_redirects=False)


async def get(
    session: aiohttp.ClientSession, url: str, headers: Mapping[str, str], seconds: float
) -> tuple[int, bytes]:
    """One small GET, read whole within `seconds` (a local server's facts about a model):
    status and body."""
    limit = aiohttp.ClientTimeout(total=seconds)
    async with session.get(
        url, headers=dict(headers), allow_redirects=False, timeout=limit
    ) as response:
        return response.status, await response.read()


def socket_of(response: aiohttp.ClientResponse) -> Any:
    """The socket under `response`, or None."""
    connection = response.connection
    transport = connection.transport if connection is not None else None
    sock = transport.get_extra_info("socket") if transport is not None else None
    return sock if hasattr(sock, "shutdown") else None


def is_transport_timeout(exc: BaseException) -> bool:
    """Whether a TimeoutError is aiohttp's own (a connect or stall timeout, which subclass
    TimeoutError) rather than the call's deadline."""
    return isinstance(exc, aiohttp.ClientError)


def classify(exc: BaseException) -> str:
    """Which of keel's transport failures `exc` is: "stall", "connect", "lost", "timeout" or
    "failed" (the same buckets httpx's exceptions fall into)."""
    if isinstance(exc, aiohttp.SocketTimeoutError):
        return "stall"
    if isinstance(exc, aiohttp.ConnectionTimeoutError | aiohttp.ClientConnectorError):
        return "connect"
    if isinstance(exc, aiohttp.ServerTimeoutError):
        return "timeout"
    if isinstance(
        exc,
        aiohttp.ServerDisconnectedError
        | aiohttp.ClientPayloadError
        | aiohttp.ClientOSError
        | aiohttp.ClientResponseError,
    ):
        return "lost"
    return "failed"


async def close(session: aiohttp.ClientSession) -> None:
    await session.close()
