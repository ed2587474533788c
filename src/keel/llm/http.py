"""The HTTP side every provider client shares: one pooled httpx client, SSE and NDJSON decoding,
stall detection, a per-call deadline, and the mapping of transport failures to `keel.llm.errors`.

A provider subclass supplies only its wire format (`build_body`, `decode`, `error_from_response`);
retries live one level up in `keel.llm.provider.RetryingProvider`, so this module makes exactly
one attempt.

The per-call deadline is a wall clock from the request's start: every wait on the network
(`prepare`, connecting, sending, the response head, each read of the body) runs under
`asyncio.timeout_at` of the same deadline, so a server that accepts and then says nothing ends the
call at the deadline (`CallTimeout`), not when a byte finally arrives. No timeout context spans a
`yield`: the consumer's own work between events is never cancelled by it. The stall timeout (no
byte for N seconds, `StallError`) is separate and is the transport's read timeout.

The transport: with no proxy configured, model calls go over keel's own HTTP/1.1 client
(`keel.llm.h1`: about half httpx's CPU per streamed request, and nothing heavy to import); with a
proxy, over httpx, which honours *_PROXY and NO_PROXY. `fetch` serves `prepare`'s small requests
(a local server's model facts) over the same transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import json
import os
import socket
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Protocol, cast

from keel.frozen import frozen
from keel.llm.errors import (
    APIError,
    CallTimeout,
    ConnectionRefused,
    LLMError,
    StallError,
    is_retryable_status,
)
from keel.llm.events import Done, StreamEvent
from keel.llm.messages import Message
from keel.llm.provider import ModelFacts
from keel.llm.request import Request, Sampling

if TYPE_CHECKING:
    import ssl

    import httpx

    from keel.llm import h1

#: No bytes for this long abandons a request (keep-alives count as bytes).
DEFAULT_STALL_TIMEOUT = 300.0
LOCAL_STALL_TIMEOUT = 900.0
#: Upper bound on one whole model call from the request's start, stream included: in a run
#: nobody watches (`keel -p`, subagents, the library) the second seed's 120 s; local servers
#: (Ollama, LM Studio, vLLM, openai-compatible) get longer, their models being slow.
DEFAULT_CALL_TIMEOUT = 120.0
LOCAL_CALL_TIMEOUT = 600.0
#: The same where a user watches (the interactive UI: Esc stops a call at once).
INTERACTIVE_CALL_TIMEOUT = 600.0
LOCAL_INTERACTIVE_CALL_TIMEOUT = 900.0
CONNECT_TIMEOUT = 15.0


def default_call_timeout(*, local: bool, unattended: bool) -> float:
    """The per-call deadline when the settings name none."""
    if unattended:
        return LOCAL_CALL_TIMEOUT if local else DEFAULT_CALL_TIMEOUT
    return LOCAL_INTERACTIVE_CALL_TIMEOUT if local else INTERACTIVE_CALL_TIMEOUT


class HTTPExchange(Protocol):
    """One request/response as an observer sees it (a tracer): told the response head, each
    body chunk as it arrives, and the end (with what went wrong, if anything)."""

    def response(
        self, status: int, headers: Mapping[str, str], sent_headers: Mapping[str, str]
    ) -> None: ...

    def received(self, chunk: bytes) -> None: ...

    def finished(self, error: str = "") -> None: ...


class HTTPObserver(Protocol):
    """Watches the model calls made in its context: `exchange` is called as each request is
    sent (None: not this one)."""

    def exchange(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes
    ) -> HTTPExchange | None: ...


#: The observer of model calls made in this context (a tracer sets it); unset costs one lookup
#: per call and nothing per chunk.
HTTP_OBSERVER: ContextVar[HTTPObserver | None] = ContextVar("keel_http_observer", default=None)


@frozen
class HTTPSettings:
    stall_timeout: float = DEFAULT_STALL_TIMEOUT
    call_timeout: float = DEFAULT_CALL_TIMEOUT
    connect_timeout: float = CONNECT_TIMEOUT


def parse_retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds from `retry-after-ms`, `retry-after` (seconds or an HTTP date), if present."""
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    import email.utils  # ~10 ms of start-up, for a header that is rarely a date

    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


@frozen
class SSEEvent:
    event: str
    data: str


async def iter_sse(chunks: AsyncIterator[bytes]) -> AsyncGenerator[SSEEvent, None]:
    """Decode a text/event-stream body. Comments (keep-alives) are skipped; multi-line data joins
    with newlines, per the SSE spec. Each chunk is split once (no re-slicing of the buffer)."""
    pending = b""
    event = ""
    data: list[str] = []
    async for chunk in chunks:
        lines = (pending + chunk).split(b"\n") if pending else chunk.split(b"\n")
        pending = lines.pop()
        for raw in lines:
            if raw.endswith(b"\r"):
                raw = raw[:-1]
            if not raw:
                if data:
                    yield SSEEvent(event or "message", "\n".join(data))
                event, data = "", []
                continue
            if raw[:1] == b":":
                continue
            name, _, value = raw.decode("utf-8").partition(":")
            if value[:1] == " ":
                value = value[1:]
            if name == "data":
                data.append(value)
            elif name == "event":
                event = value
    if pending.strip() and pending.startswith(b"data:"):
        value = pending.decode("utf-8")[5:]
        data.append(value[1:] if value[:1] == " " else value)
    if data:
        yield SSEEvent(event or "message", "\n".join(data))


async def iter_ndjson(chunks: AsyncGenerator[bytes, None]) -> AsyncIterator[dict[str, Any]]:
    """Decode newline-delimited JSON (Ollama's native stream)."""
    buffer = b""
    async for chunk in chunks:
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if line.strip():
                yield json.loads(line)
    if buffer.strip():
        yield json.loads(buffer)


@functools.cache
def shared_ssl_context() -> ssl.SSLContext:
    """One verifying TLS context per process, the one httpx builds with `trust_env`:
    `SSL_CERT_FILE`, else `SSL_CERT_DIR`, else certifi's bundle. Built here, because importing
    httpx for it would cost ~80 ms of an https run's start-up (tests/llm/test_transport.py
    compares the two)."""
    import ssl

    if cafile := os.environ.get("SSL_CERT_FILE"):
        return ssl.create_default_context(cafile=cafile)
    if capath := os.environ.get("SSL_CERT_DIR"):
        return ssl.create_default_context(capath=capath)
    import certifi

    return ssl.create_default_context(cafile=certifi.where())


_PROXY_VARS = ("https_proxy", "http_proxy", "all_proxy")


def proxies_configured() -> bool:
    return any(os.environ.get(v) or os.environ.get(v.upper()) for v in _PROXY_VARS)


def _transport_errors() -> tuple[type[BaseException], ...]:
    """The transport failures a model call maps to keel's errors: keel's client's and httpx's,
    each when it is loaded (a transport that was never imported raised nothing), importing
    neither. Neither's timeouts are TimeoutErrors, so a TimeoutError is the call's deadline."""
    direct = sys.modules.get("keel.llm.h1")
    httpx = sys.modules.get("httpx")
    errors: tuple[type[BaseException], ...] = (direct.TransportError,) if direct is not None else ()
    return (*errors, httpx.HTTPError) if httpx is not None else errors


class _SocketDeadline:
    """One timer per call that shuts the call's socket down at its deadline (loop time), so a
    read waiting past it fails at once; `expired` tells such a failure from a transport's own.
    Without a socket it only marks the time (each read then gets its own timeout)."""

    __slots__ = ("_sock", "_timer", "expired")

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: Any, deadline: float) -> None:
        self.expired = False
        self._sock = sock
        self._timer = loop.call_at(deadline, self._expire)

    def _expire(self) -> None:
        self.expired = True
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)

    def cancel(self) -> None:
        self._timer.cancel()


class _Head:
    """A response whose head has arrived, as the shared call path needs it from either
    transport: status, headers (the server's and those sent), the whole body (an error's) and
    the body's bytes under the call's deadline."""

    __slots__ = ("body", "headers", "read", "request_headers", "status")

    def __init__(
        self,
        status: int,
        headers: Mapping[str, str],
        request_headers: Mapping[str, str],
        read: Callable[[], Awaitable[bytes]],
        body: AsyncGenerator[bytes, None],
    ) -> None:
        self.status = status
        self.headers = headers
        self.request_headers = request_headers
        self.read = read
        self.body = body


#: Opens a call on one transport: (exit stack, url, body, headers, deadline) → its head.
_Opener = Callable[[contextlib.AsyncExitStack, str, bytes, dict[str, str], float], Awaitable[_Head]]


def _failure_kind(exc: BaseException) -> str:
    """Which bucket an httpx or keel's client's failure falls in (`keel.llm.h1.TransportError`
    names its own)."""
    httpx = sys.modules.get("httpx")
    if httpx is not None and isinstance(exc, httpx.HTTPError):
        if isinstance(exc, httpx.ReadTimeout):
            return "stall"
        if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
            return "connect"
        if isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError | httpx.WriteError):
            return "lost"
        if isinstance(exc, httpx.TimeoutException):
            return "timeout"
        return "failed"
    return str(getattr(exc, "kind", "failed"))


async def _release(response: h1.Response) -> None:
    """Give the connection back (to the pool if the body was read to its end, else closed)."""
    response.release()


def _describe_transport_error(exc: BaseException) -> str:
    text = str(exc).strip()
    return text or type(exc).__name__


def _socket_of(response: httpx.Response) -> Any:
    """The socket under `response` (httpcore's network stream exposes it), or None."""
    stream = response.extensions.get("network_stream")
    get = getattr(stream, "get_extra_info", None)
    if get is None:
        return None
    sock = get("socket")
    return sock if hasattr(sock, "shutdown") else None


def _refused(exc: BaseException) -> bool:
    """Whether a connect failure was a refusal (nothing listening), looking through the causes
    httpx and httpcore wrap it in."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return False
        if isinstance(seen, ConnectionRefusedError) or (
            isinstance(seen, OSError) and seen.errno == errno.ECONNREFUSED
        ):
            return True
        if (
            "connection refused" in str(seen).lower()
            or f"[errno {errno.ECONNREFUSED}]" in str(seen).lower()
        ):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


async def _observed(
    chunks: AsyncGenerator[bytes, None], exchange: HTTPExchange
) -> AsyncGenerator[bytes, None]:
    """`chunks`, each shown to `exchange` as it passes (only when someone observes)."""
    async with contextlib.aclosing(chunks):
        async for chunk in chunks:
            exchange.received(chunk)
            yield chunk


def _exchange_error(exc: BaseException | None) -> str:
    """What an observer is told went wrong ("" for a normal end or a consumer that stopped
    reading after the reply)."""
    if exc is None or isinstance(exc, GeneratorExit):
        return ""
    if isinstance(exc, asyncio.CancelledError):
        return "cancelled"
    return f"{type(exc).__name__}: {exc}"


class HTTPProvider(ABC):
    """One attempt at one streamed model call over HTTP. Subclasses speak a wire API."""

    #: Provider family name, as in `anthropic/claude-…`; stamped on assistant messages.
    name: str = ""
    #: The environment variable the key comes from, named in errors.
    key_env: str = ""
    #: What to check when the server cannot be reached.
    unreachable_hint: str = "check the server is running and the base URL is right"
    #: The server runs on the user's machine (a local preset): asking it about a model is cheap.
    local: bool = False

    def __init__(self, *, base_url: str, api_key: str, settings: HTTPSettings) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.settings = settings
        #: The user's sampling defaults for this model (`models.<id>` in settings); a request's
        #: own values win.
        self.sampling = Sampling()
        self._client: httpx.AsyncClient | None = None
        self._direct: h1.Client | None = None

    # -- what a wire API supplies -------------------------------------------------------------

    @abstractmethod
    def endpoint(self, request: Request) -> str:
        """Full URL for the request."""

    @abstractmethod
    def headers(self) -> dict[str, str]:
        """Auth and version headers."""

    @abstractmethod
    def build_body(self, request: Request) -> bytes:
        """The JSON body, encoded."""

    @abstractmethod
    def decode(
        self, request: Request, chunks: AsyncGenerator[bytes, None]
    ) -> AsyncGenerator[StreamEvent, None]:
        """Turn the response body into stream events ending in exactly one `Done`."""

    @abstractmethod
    def error_from_response(self, status: int, body: bytes, headers: Mapping[str, str]) -> APIError:
        """Map an error response to an `APIError` (or `ContextOverflow`)."""

    async def prepare(self, request: Request) -> None:
        """Anything to learn from the server before the first request (a local server's window);
        transport errors here are reported like the request's own. Most wire APIs need nothing."""
        del request  # nothing to learn

    async def model_facts(self, model: str) -> ModelFacts:
        """What the server says about `model` before its first request (`keel.llm.provider.
        model_facts`). Most wire APIs say nothing, and nothing is asked."""
        del model  # nothing to ask
        return ModelFacts()

    async def fetch(self, url: str, seconds: float) -> tuple[int, bytes] | None:
        """A small GET of `url` over the model calls' transport (so it imports nothing more):
        its status and body, or None when nothing answered within `seconds`."""
        if self._goes_direct():
            from keel.llm import h1

            try:
                return await self._client_direct().get(url, self.headers(), seconds)
            except (h1.TransportError, TimeoutError):
                return None
        import httpx

        try:
            response = await self._http().get(url, headers=self.headers(), timeout=seconds)
        except httpx.HTTPError:
            return None
        return response.status_code, response.content

    # -- shared machinery ---------------------------------------------------------------------

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            import httpx

            from keel.llm.netio import http_transport

            s = self.settings
            stall = None if s.stall_timeout < 0 else s.stall_timeout
            # A plain-HTTP server (a local model, a test) needs no TLS context; building the
            # default one loads a CA bundle (~90 ms here), so do it only for https, once.
            context = shared_ssl_context() if self.base_url.startswith("https:") else None
            timeout = httpx.Timeout(connect=s.connect_timeout, read=stall, write=60.0, pool=60.0)
            if proxies_configured():
                # httpx honours *_PROXY and NO_PROXY only with its own transports.
                self._client = httpx.AsyncClient(
                    timeout=timeout, verify=context or False, trust_env=True
                )
            else:
                self._client = httpx.AsyncClient(
                    timeout=timeout,
                    transport=http_transport(
                        ssl_context=context, max_connections=64, max_keepalive=32
                    ),
                    trust_env=True,
                )
        return self._client

    def _goes_direct(self) -> bool:
        """Whether model calls go over keel's own client: yes once it is open, else unless a
        proxy is configured (httpx honours *_PROXY and NO_PROXY; keel's client never proxies)."""
        return self._direct is not None or not proxies_configured()

    def _client_direct(self) -> h1.Client:
        """keel's own client that model calls stream over (made at the first call). Its TLS
        context is built only when an https URL is first connected to."""
        if self._direct is None:
            from keel.llm import h1

            s = self.settings
            self._direct = h1.Client(
                tls=shared_ssl_context,
                connect_timeout=s.connect_timeout,
                stall_timeout=None if s.stall_timeout < 0 else s.stall_timeout,
            )
        return self._direct

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        if self._direct is not None:
            direct, self._direct = self._direct, None
            await direct.close()

    def stream(self, request: Request) -> AsyncGenerator[StreamEvent, None]:
        # The call's generator itself (no wrapper): closing it closes the call.
        return self._stream(request, self._open_direct if self._goes_direct() else self._open_httpx)

    async def _stream(
        self, request: Request, open_head: _Opener
    ) -> AsyncGenerator[StreamEvent, None]:
        """One streamed call over the transport `open_head` stands for: the request, the
        observer's view of it, the call's deadline, the error mapping; both transports share it."""
        request = self.sampling.apply(request)
        headers = {"content-type": "application/json", "accept": "text/event-stream"}
        headers.update(self.headers())
        deadline = asyncio.get_running_loop().time() + self.settings.call_timeout
        observer = HTTP_OBSERVER.get()
        exchange: HTTPExchange | None = None
        try:
            async with contextlib.AsyncExitStack() as stack:
                try:
                    async with asyncio.timeout_at(deadline):
                        await self.prepare(request)
                        url = self.endpoint(request)
                        body = self.build_body(request)
                        if observer is not None:
                            exchange = observer.exchange("POST", url, headers, body)
                        head = await open_head(stack, url, body, headers, deadline)
                        if exchange is not None:
                            exchange.response(head.status, head.headers, head.request_headers)
                        if head.status >= 400:
                            payload = await head.read()
                            if exchange is not None:
                                exchange.received(payload)
                            raise self.error_from_response(head.status, payload, head.headers)
                except TimeoutError as exc:
                    raise CallTimeout(self.settings.call_timeout, provider=self.name) from exc
                # Close the decoder chain here, not later from the garbage collector.
                chunks = head.body
                if exchange is not None:
                    chunks = _observed(chunks, exchange)
                events = self.decode(request, chunks)
                async with contextlib.aclosing(chunks), contextlib.aclosing(events):
                    async for event in events:
                        yield self._stamped(event, request) if isinstance(event, Done) else event
        except BaseException as exc:
            # Looked up here: a `prepare` request may have loaded httpx since the call began.
            if not isinstance(exc, _transport_errors()):
                if exchange is not None:
                    exchange.finished(_exchange_error(exc))
                    exchange = None
                raise
            failure = self._transport_failure(exc)
            if exchange is not None:
                exchange.finished(_exchange_error(failure))
                exchange = None
            raise failure from exc
        finally:
            if exchange is not None:  # a normal end (failures were told above)
                exchange.finished()

    async def _open_direct(
        self,
        stack: contextlib.AsyncExitStack,
        url: str,
        body: bytes,
        headers: dict[str, str],
        deadline: float,
    ) -> _Head:
        """POST over keel's own client, up to the response head; the connection goes back
        with `stack`."""
        response = await self._client_direct().post(url, body, headers)
        stack.push_async_callback(_release, response)
        return _Head(
            response.status,
            response.headers,
            response.request_headers,
            response.read,
            self._guarded_direct(response, deadline),
        )

    async def _open_httpx(
        self,
        stack: contextlib.AsyncExitStack,
        url: str,
        body: bytes,
        headers: dict[str, str],
        deadline: float,
    ) -> _Head:
        """POST over httpx (the proxy path), up to the response head; closed with `stack`."""
        response = await stack.enter_async_context(
            self._http().stream("POST", url, content=body, headers=headers)
        )
        return _Head(
            response.status_code,
            response.headers,
            response.request.headers,
            response.aread,
            self._guarded(response, deadline),
        )

    def _transport_failure(self, exc: BaseException) -> LLMError:
        """keel's error for a transport failure of a model call (httpx's or keel's client's)."""
        kind = _failure_kind(exc)
        if kind == "stall":
            return StallError(self.settings.stall_timeout, provider=self.name)
        if kind == "connect":
            if _refused(exc):
                return ConnectionRefused(
                    f"cannot reach {self.name} at {self.base_url}: connection refused (nothing "
                    "is listening there)",
                    status=0,
                    retryable=True,
                    provider=self.name,
                    hint=self.unreachable_hint,
                )
            return APIError(
                f"cannot reach {self.name} at {self.base_url}: {_describe_transport_error(exc)}",
                status=0,
                retryable=True,
                provider=self.name,
                hint=self.unreachable_hint,
            )
        if kind == "lost":
            return APIError(
                f"connection to {self.name} lost: {_describe_transport_error(exc)}",
                status=0,
                retryable=True,
                provider=self.name,
            )
        if kind == "timeout":
            return APIError(
                f"{self.name} request timed out: {_describe_transport_error(exc)}",
                status=408,
                retryable=True,
                provider=self.name,
            )
        return APIError(
            f"{self.name} request failed: {_describe_transport_error(exc)}",
            status=0,
            retryable=False,
            provider=self.name,
        )

    async def _guarded(
        self, response: httpx.Response, deadline: float
    ) -> AsyncGenerator[bytes, None]:
        """The body's bytes, bounded by the call's deadline (`deadline` is loop time), bytes or
        no bytes. One timer per call shuts the connection's socket down at the deadline, so a
        read waiting past it fails at once (a timeout context per read would cost a few
        microseconds on every chunk); without a socket to reach, each read gets a timeout."""
        import httpx

        loop = asyncio.get_running_loop()
        timed_out = CallTimeout(self.settings.call_timeout, provider=self.name)
        # An async generator (typed as an iterator): closed here, not by the garbage collector.
        body = cast("AsyncGenerator[bytes, None]", response.aiter_bytes())
        sock = _socket_of(response)
        timer = _SocketDeadline(loop, sock, deadline)
        try:
            async with contextlib.aclosing(body):
                while True:
                    try:
                        if sock is None:
                            async with asyncio.timeout_at(deadline):
                                chunk = await anext(body)
                        else:
                            chunk = await anext(body)
                    except StopAsyncIteration:
                        if timer.expired:
                            raise timed_out from None
                        return
                    except TimeoutError as exc:
                        raise timed_out from exc
                    except httpx.TransportError as exc:
                        if timer.expired:  # the read the timer cut short
                            raise timed_out from exc
                        raise
                    if timer.expired or loop.time() > deadline:
                        raise timed_out
                    yield chunk
        finally:
            timer.cancel()

    async def _guarded_direct(
        self, response: h1.Response, deadline: float
    ) -> AsyncGenerator[bytes, None]:
        """`_guarded` for keel's own client: the same deadline timer on the socket."""
        from keel.llm import h1

        loop = asyncio.get_running_loop()
        timed_out = CallTimeout(self.settings.call_timeout, provider=self.name)
        sock = response.socket()
        timer = _SocketDeadline(loop, sock, deadline)
        try:
            while True:
                try:
                    if sock is None:
                        async with asyncio.timeout_at(deadline):
                            chunk = await response.readany()
                    else:
                        chunk = await response.readany()
                except TimeoutError as exc:
                    raise timed_out from exc
                except h1.TransportError as exc:
                    if timer.expired:  # the read the timer cut short
                        raise timed_out from exc
                    raise
                if not chunk:
                    if timer.expired:
                        raise timed_out
                    return
                if timer.expired or loop.time() > deadline:
                    raise timed_out
                yield chunk
        finally:
            timer.cancel()

    def _stamped(self, done: Done, request: Request) -> Done:
        """`done` with its message naming this provider and the model that answered. Stamped here,
        once for every adapter, because a preset or custom provider (`groq`, a gateway) shares
        its adapter with others and the transcript must say which one answered."""
        message = done.message
        window = self.reported_window(request.model)
        if message.provider == self.name and message.model and window == done.window:
            return done
        stamped = Message(message.role, message.blocks, self.name, message.model or request.model)
        return Done(stamped, done.usage, done.stop_reason, window)

    def reported_window(self, model: str) -> int:
        """The context window the server said `model` has (what `prepare` learned), or 0 when
        it says nothing and the catalog's window stands. Hosted APIs say nothing."""
        del model  # nothing learned
        return 0

    # -- helpers for subclasses ---------------------------------------------------------------

    def api_error(self, status: int, message: str, headers: Mapping[str, str]) -> APIError:
        hint = ""
        if status == 401:
            hint = f"check {self.key_env}" if self.key_env else "check the API key"
        elif status == 403:
            hint = "the key lacks permission for this model or endpoint"
        elif status == 404:
            hint = "check the model name and the base URL"
        elif status == 429:
            hint = "rate limited; wait, or lower concurrency"
        return APIError(
            f"{self.name} returned {status}: {message}",
            status=status,
            retryable=is_retryable_status(status),
            retry_after=parse_retry_after(headers),
            provider=self.name,
            hint=hint,
        )


def error_message(body: bytes) -> str:
    """The human message in a JSON error body (`{"error": {"message": …}}` and friends)."""
    try:
        data = json.loads(body)
    except ValueError:
        text = body.decode("utf-8", "replace").strip()
        return text[:300] or "(empty body)"
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict):
            msg = err.get("message") or err.get("msg")
            if msg:
                return str(msg)
        elif isinstance(err, str):
            return err
    return json.dumps(data)[:300]


__all__ = [
    "DEFAULT_STALL_TIMEOUT",
    "HTTP_OBSERVER",
    "LOCAL_STALL_TIMEOUT",
    "HTTPExchange",
    "HTTPObserver",
    "HTTPProvider",
    "HTTPSettings",
    "LLMError",
    "SSEEvent",
    "error_message",
    "iter_ndjson",
    "iter_sse",
    "parse_retry_after",
]
