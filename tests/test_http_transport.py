"""Model calls over keel's own HTTP/1.1 client (no proxy) and over httpx (a proxy configured):
which transport carries a call, that both send the same request, that both fail with the same
keel errors, that neither aiohttp nor httpx is imported on the direct path, and the client's own
framing (chunked and Content-Length bodies, gzip, the pool's reuse and keep-alive expiry).

Every test talks real HTTP on 127.0.0.1. The httpx path is reached the way a user reaches it: a
proxy variable set, here with NO_PROXY covering 127.0.0.1 so the call still goes straight to the
loopback server and the two transports can be compared on the same server.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from keel.llm.errors import LLMError
from keel.llm.events import Done, StreamEvent
from keel.llm.http import HTTP_OBSERVER, HTTPExchange, HTTPSettings
from keel.llm.messages import Message, Text
from keel.llm.providers.anthropic import AnthropicProvider
from keel.llm.request import Request
from keel.llm.script import Fault, reply
from keel.testing.anthropic_server import AnthropicServer
from tests.helpers import free_port

KEY = "sk-ant-test"


def request() -> Request:
    return Request(model="claude-haiku-4-5", system="s", messages=(Message("user", (Text("hi"),)),))


@pytest.fixture
def direct(monkeypatch: pytest.MonkeyPatch) -> None:
    """No proxy variables: the direct path (keel's own client)."""
    for name in ("https_proxy", "http_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)


def use_httpx(monkeypatch: pytest.MonkeyPatch) -> None:
    """A proxy configured (so httpx carries the call) that loopback bypasses."""
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")


class Exchange:
    def __init__(self, log: list[tuple[str, Any]]) -> None:
        self.log = log

    def response(self, status: int, headers: Any, sent_headers: Any) -> None:
        sent = {k.lower(): v for k, v in sent_headers.items()}
        self.log.append(("response", (status, headers["content-type"], sent)))

    def received(self, chunk: bytes) -> None:
        self.log.append(("received", len(chunk) > 0))

    def finished(self, error: str = "") -> None:
        self.log.append(("finished", error))


class Observer:
    def __init__(self) -> None:
        self.log: list[tuple[str, Any]] = []

    def exchange(self, method: str, url: str, headers: Any, body: bytes) -> HTTPExchange:
        self.log.append(("exchange", (method, url.rsplit(":", 1)[0], len(body))))
        return Exchange(self.log)


async def one_call(
    url: str, settings: HTTPSettings | None = None
) -> tuple[list[StreamEvent], AnthropicProvider, list[tuple[str, Any]]]:
    provider = AnthropicProvider(base_url=url, api_key=KEY, settings=settings or HTTPSettings())
    observer = Observer()
    token = HTTP_OBSERVER.set(observer)
    try:
        events = [e async for e in provider.stream(request())]
    finally:
        HTTP_OBSERVER.reset(token)
    return events, provider, observer.log


def session_of(provider: AnthropicProvider) -> object:
    return provider._direct


def collapsed(log: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """The observer's log with runs of `received` folded into one (chunking is the transport's
    business, not the observer's contract)."""
    out: list[tuple[str, Any]] = []
    for entry in log:
        if not (entry[0] == "received" and out and out[-1][0] == "received"):
            out.append(entry)
    return out


async def test_both_transports_send_the_same_request_and_tell_the_observer_the_same(
    direct: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import httpx

    from keel.llm import h1

    with AnthropicServer([reply("one"), reply("one")], api_key=KEY) as server:
        aio_events, aio_provider, aio_log = await one_call(server.url)
        try:
            assert isinstance(aio_provider._direct, h1.Client)
            assert aio_provider._client is None  # httpx was never built for this call
        finally:
            await aio_provider.aclose()
        assert session_of(aio_provider) is None  # aclose closed and dropped it

        use_httpx(monkeypatch)
        httpx_events, httpx_provider, httpx_log = await one_call(server.url)
        try:
            assert httpx_provider._direct is None
            assert isinstance(httpx_provider._client, httpx.AsyncClient)
        finally:
            await httpx_provider.aclose()

        first, second = server.model_requests
    assert aio_events == httpx_events
    done = aio_events[-1]
    assert isinstance(done, Done)
    assert done.message.text == "one"
    assert (first.method, first.path, first.body) == (second.method, second.path, second.body)
    assert first.headers == second.headers
    assert first.headers["user-agent"] == f"python-httpx/{httpx.__version__}"
    assert collapsed(aio_log) == collapsed(httpx_log)
    sent = first.headers | {}
    assert collapsed(aio_log) == [
        ("exchange", ("POST", "http://127.0.0.1", len(first.body))),
        ("response", (200, "text/event-stream", sent)),
        ("received", True),
        ("finished", ""),
    ]


class CountingServer(AnthropicServer):
    """Counts the TCP connections it accepted."""

    connections = 0

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        await super()._serve(reader, writer)


async def test_the_pool_keeps_one_connection_for_consecutive_calls(direct: None) -> None:
    with CountingServer([reply("a"), reply("b"), reply("c")], api_key=KEY) as server:
        provider = AnthropicProvider(base_url=server.url, api_key=KEY, settings=HTTPSettings())
        try:
            texts = []
            for _ in range(3):
                events = [e async for e in provider.stream(request())]
                done = events[-1]
                assert isinstance(done, Done)
                texts.append(done.message.text)
            client = provider._direct
            assert client is not None
            assert (client.max_connections, client.keepalive) == (64, 5.0)
        finally:
            await provider.aclose()
        assert texts == ["a", "b", "c"]
        assert len(server.model_requests) == 3
        assert server.connections == 1


# -- the same failures, the same errors -----------------------------------------------------------


def error_shape(exc: BaseException) -> dict[str, Any]:
    """What a caller (retries, the user's one line) reads from a keel error. The text after the
    first colon is the transport's own description and may be worded differently."""
    assert isinstance(exc, LLMError), repr(exc)
    text = str(exc)
    return {
        "type": type(exc).__name__,
        "message": text if "refused" in text else text.split(": ")[0],
        "status": getattr(exc, "status", None),
        "retryable": getattr(exc, "retryable", None),
        "retry_after": getattr(exc, "retry_after", None),
        "hint": getattr(exc, "hint", None),
        "seconds": getattr(exc, "seconds", None),
        "provider": getattr(exc, "provider", None),
    }


async def failure(url: str, settings: HTTPSettings) -> tuple[list[StreamEvent], dict[str, Any]]:
    provider = AnthropicProvider(base_url=url, api_key=KEY, settings=settings)
    events: list[StreamEvent] = []
    try:
        async for event in provider.stream(request()):
            events.append(event)
    except LLMError as exc:
        return events, error_shape(exc)
    finally:
        await provider.aclose()
    raise AssertionError(f"no error: {events}")


async def both(
    monkeypatch: pytest.MonkeyPatch, url: str, settings: HTTPSettings
) -> tuple[tuple[list[StreamEvent], dict[str, Any]], tuple[list[StreamEvent], dict[str, Any]]]:
    over_direct = await failure(url, settings)
    use_httpx(monkeypatch)
    over_httpx = await failure(url, settings)
    return over_direct, over_httpx


async def both_against(
    monkeypatch: pytest.MonkeyPatch, answer: bytes
) -> tuple[tuple[list[StreamEvent], dict[str, Any]], tuple[list[StreamEvent], dict[str, Any]]]:
    """`both` against a raw loopback server that reads each request's head, writes `answer`
    and closes the connection."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answer)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        return await both(monkeypatch, f"http://127.0.0.1:{port}", HTTPSettings())
    finally:
        server.close()
        await server.wait_closed()


async def test_connection_refused_is_the_same_error(
    direct: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    aio, hx = await both(monkeypatch, url, HTTPSettings())
    assert aio == hx
    assert aio == (
        [],
        {
            "type": "ConnectionRefused",
            "message": f"cannot reach anthropic at {url}: connection refused (nothing is "
            "listening there)",
            "status": 0,
            "retryable": True,
            "retry_after": None,
            "hint": AnthropicProvider.unreachable_hint,
            "seconds": None,
            "provider": "anthropic",
        },
    )


@pytest.fixture
def silent_listener() -> Iterator[str]:
    """A socket that accepts connections (the kernel's backlog) and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


async def test_no_response_head_is_a_stall_on_both(
    direct: None, monkeypatch: pytest.MonkeyPatch, silent_listener: str
) -> None:
    settings = HTTPSettings(stall_timeout=0.3, call_timeout=10)
    aio, hx = await both(monkeypatch, silent_listener, settings)
    assert aio == hx
    assert aio == (
        [],
        {
            "type": "StallError",
            "message": "anthropic sent nothing for 0.3 s; request abandoned",
            "status": None,
            "retryable": None,
            "retry_after": None,
            "hint": "the server may be overloaded; raise stall_timeout for slow local models",
            "seconds": 0.3,
            "provider": "anthropic",
        },
    )


async def test_the_call_deadline_ends_a_silent_server_on_both(
    direct: None, monkeypatch: pytest.MonkeyPatch, silent_listener: str
) -> None:
    settings = HTTPSettings(stall_timeout=30, call_timeout=0.4)
    loop = asyncio.get_running_loop()
    start = loop.time()
    aio, hx = await both(monkeypatch, silent_listener, settings)
    assert loop.time() - start < 5
    assert aio == hx
    assert aio[1]["type"] == "CallTimeout"
    assert aio[1]["seconds"] == 0.4


async def test_a_stall_mid_stream_and_a_dropped_connection_are_the_same_errors(
    direct: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    steps = [
        Fault("stall", after_events=2, seconds=3, reply=reply("a long answer")),
        Fault("disconnect", after_events=2, reply=reply("a long answer")),
        Fault("status", status=429, retry_after=7),
        Fault("status", status=500),
    ]
    with AnthropicServer(steps + steps, api_key=KEY) as server:
        settings = HTTPSettings(stall_timeout=0.3, call_timeout=10)
        over_aio = [await failure(server.url, settings) for _ in steps]
        use_httpx(monkeypatch)
        over_httpx = [await failure(server.url, settings) for _ in steps]
    assert over_aio == over_httpx
    assert [shape["type"] for _, shape in over_aio] == [
        "StallError",
        "APIError",
        "APIError",
        "APIError",
    ]
    stalled, dropped, limited, failed = (shape for _, shape in over_aio)
    assert (stalled["seconds"], stalled["message"]) == (
        0.3,
        "anthropic sent nothing for 0.3 s; request abandoned",
    )
    assert (dropped["message"], dropped["status"], dropped["retryable"]) == (
        "connection to anthropic lost",
        0,
        True,
    )
    assert (limited["status"], limited["retryable"], limited["retry_after"]) == (429, True, 7.0)
    assert (failed["status"], failed["retryable"]) == (500, True)


async def test_a_malformed_response_is_a_lost_connection_on_both(
    direct: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    aio, hx = await both_against(monkeypatch, b"NOT HTTP AT ALL\r\n\r\n")
    assert aio == hx
    assert (aio[1]["type"], aio[1]["message"], aio[1]["status"], aio[1]["retryable"]) == (
        "APIError",
        "connection to anthropic lost",
        0,
        True,
    )


# -- lazy import ----------------------------------------------------------------------------------

LAZY = """
import asyncio, sys
from keel.llm.http import HTTPSettings
from keel.llm.messages import Message, Text
from keel.llm.providers.anthropic import AnthropicProvider
from keel.llm.request import Request

async def main():
    p = AnthropicProvider(base_url=sys.argv[1], api_key="k", settings=HTTPSettings())
    before = "keel.llm.h1" in sys.modules
    r = Request(model="claude-haiku-4-5", system="s", messages=(Message("user", (Text("hi"),)),))
    events = [e async for e in p.stream(r)]
    await p.aclose()
    print(
        before,
        "keel.llm.h1" in sys.modules,
        "httpx" in sys.modules,
        "aiohttp" in sys.modules,
        events[-1].message.text,
    )

asyncio.run(main())
"""


def lazy_run(url: str, env: dict[str, str]) -> str:
    out = subprocess.run(
        [sys.executable, "-c", LAZY, url], capture_output=True, text=True, env=env, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_the_client_is_imported_at_the_first_model_call_and_not_with_a_proxy() -> None:
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    with AnthropicServer([reply("direct"), reply("proxied")]) as server:
        # Direct: keel's client only once a call is made; httpx and aiohttp not at all.
        assert lazy_run(server.url, env) == "False True False False direct"
        # A proxy configured: httpx carries the call and keel's client is never imported.
        proxied = env | {"HTTP_PROXY": f"http://127.0.0.1:{free_port()}", "NO_PROXY": "127.0.0.1"}
        assert lazy_run(server.url, proxied) == "False False True False proxied"


def test_keel_version_and_an_offline_run_do_not_import_aiohttp(
    isolated_env: Path, tmp_path: Path
) -> None:
    for args in (["--version"], ["-p", "hi", "--model", "scripted:demo", "-q"]):
        out = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "keel", *args],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr[-2000:]
        imported = {line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines()}
        assert "keel.cli.main" in imported
        assert sorted(m for m in imported if m.split(".")[0] == "aiohttp") == [], args


async def test_a_redirect_is_not_followed_so_the_key_stays_with_the_configured_server(
    direct: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack: the configured server answers 307 to another host. httpx follows no redirect;
    a client that followed it would re-send the body and the x-api-key header there."""
    with AnthropicServer([reply("stolen"), reply("stolen")]) as elsewhere:
        aio, hx = await both_against(
            monkeypatch,
            b"HTTP/1.1 307 Temporary Redirect\r\nlocation: "
            + f"{elsewhere.url}/v1/messages".encode()
            + b"\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
        )
        assert elsewhere.requests == []
    assert aio == hx
    # The 307's empty body is read as a stream that ended before its end: retryable, like httpx.
    assert aio[1] == {
        "type": "APIError",
        "message": "anthropic stream ended early (no message_stop)",
        "status": 0,
        "retryable": True,
        "retry_after": None,
        "hint": "",
        "seconds": None,
        "provider": "anthropic",
    }


#: What `keel -p` must not import on its way to the first request of a hosted model, with no
#: hooks configured: each was once on that path and cost start-up (docs/benchmarks.md, "Cold
#: start"). aiohttp (a third of it) and httpx are not keel's direct transport; the hooks
#: runner loads only when a hook will run; the rest are modules a later need imports.
NOT_ON_THE_COLD_PATH = (
    "aiohttp",
    "httpx",
    "httpcore",
    "keel.hooks.runner",
    "keel.permissions.guard_sandbox",
    "email.utils",
    "difflib",
    "uuid",
    "html",
    "getpass",
    # loaded at their first use: auto mode's first question, the first bash call's check
    "keel.agent.auto_mode",
    "keel.permissions.auto",
    "keel.permissions.shell",
)


def test_keel_p_to_a_hosted_model_imports_only_what_its_first_request_needs(
    isolated_env: Path, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("https_proxy", "http_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    with AnthropicServer([reply("cold")], api_key=KEY) as server:
        env = os.environ | {"ANTHROPIC_API_KEY": KEY, "ANTHROPIC_BASE_URL": server.url}
        # A sentence: a one-word prompt is also checked for a mistyped command (difflib).
        argv = ["-p", "say hi", "--model", "anthropic/claude-haiku-4-5"]
        out = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "keel", *argv],
            capture_output=True,
            text=True,
            cwd=project,
            env=env,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr[-2000:]
        assert len(server.model_requests) == 1
    assert out.stdout.strip() == "cold"
    imported = {line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if "|" in line}
    assert {"keel.cli.headless", "keel.llm.h1"} <= imported
    unwanted = sorted(
        m for m in imported if any(m == n or m.startswith(n + ".") for n in NOT_ON_THE_COLD_PATH)
    )
    assert unwanted == []


# -- keel's client: framing, decoding and the pool ------------------------------------------------


async def raw_server(answers: list[bytes]) -> tuple[asyncio.Server, str, list[bytes]]:
    """A loopback server that answers the requests on each connection with the next of
    `answers` (an answer ending in b"<close>" closes the connection after it); it records each
    request's head."""
    heads: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while answers:
                head = await reader.readuntil(b"\r\n\r\n")
                heads.append(head)
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        await reader.readexactly(int(line.split(b":")[1]))
                answer = answers.pop(0)
                close = answer.endswith(b"<close>")
                writer.write(answer.removesuffix(b"<close>"))
                await writer.drain()
                if close:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", heads


def client(**options: Any) -> Any:
    from keel.llm import h1
    from keel.llm.http import shared_ssl_context

    return h1.Client(tls=shared_ssl_context, connect_timeout=5, stall_timeout=5, **options)


async def whole(c: Any, url: str, body: bytes = b"{}") -> tuple[int, Any, bytes]:
    response = await c.post(url, body, {"content-type": "application/json"})
    try:
        return response.status, response.headers, await response.read()
    finally:
        response.release()


async def test_bodies_by_length_chunks_and_close_decoded_from_gzip_and_deflate() -> None:
    import gzip
    import zlib

    gz = gzip.compress(b"zipped body")
    raw_deflate = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    deflated = raw_deflate.compress(b"raw deflate") + raw_deflate.flush()
    answers = [
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Twice: a\r\nx-twice: b\r\n\r\nhello",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"3;ext=1\r\nabc\r\n4\r\ndefg\r\n0\r\nTrailer: x\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(gz) + gz,
        b"HTTP/1.1 200 OK\r\nContent-Encoding: deflate\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"%x\r\n" % len(deflated)
        + deflated
        + b"\r\n0\r\n\r\n",
        b"HTTP/1.0 200 OK\r\n\r\nuntil the end<close>",
    ]
    server, url, heads = await raw_server(answers)
    c = client()
    try:
        first = await whole(c, url + "/a?x=1")
        second = await whole(c, url + "/b")
        third = await whole(c, url + "/c")
        fourth = await whole(c, url + "/d")
        fifth = await whole(c, url + "/e")
    finally:
        await c.close()
        server.close()
        await server.wait_closed()
    assert (first[0], first[1]["X-TWICE"], first[2]) == (200, "a, b", b"hello")
    assert (second[0], second[2]) == (201, b"abcdefg")
    assert (third[2], fourth[2], fifth[2]) == (b"zipped body", b"raw deflate", b"until the end")
    # One connection carried all five: each body was read to its end, so it went back to the pool.
    assert len(heads) == 5
    assert heads[0].split(b"\r\n")[0] == b"POST /a?x=1 HTTP/1.1"
    sent = dict(line.split(b": ", 1) for line in heads[0].split(b"\r\n")[1:] if line)
    assert sent[b"host"] == url.removeprefix("http://").encode()
    assert (sent[b"content-length"], sent[b"content-type"]) == (b"2", b"application/json")


async def test_a_body_cut_short_is_a_lost_connection_and_not_reused() -> None:
    from keel.llm import h1

    answers = [
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort<close>",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab<close>",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n\r\n<close>",
    ]
    server, url, _ = await raw_server(answers)
    c = client()
    try:
        with pytest.raises(h1.ConnectionLost):
            await whole(c, url)
        with pytest.raises(h1.ConnectionLost):
            await whole(c, url)
        with pytest.raises(h1.ProtocolError, match="bad chunk size"):
            await whole(c, url)
        assert c._open == 0  # each broken connection was closed and uncounted
    finally:
        await c.close()
        server.close()
        await server.wait_closed()


async def test_an_idle_connection_expires_after_the_keepalive() -> None:
    answers = [b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\na"] * 3
    connections = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        try:
            while answers:
                await reader.readuntil(b"\r\n\r\n")
                await reader.readexactly(2)
                writer.write(answers.pop(0))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    c = client(keepalive=0.2)
    try:
        assert (await whole(c, url))[2] == b"a"
        assert (await whole(c, url))[2] == b"a"  # reused at once
        assert connections == 1
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5
        while c._idle.get(("http", "127.0.0.1", server.sockets[0].getsockname()[1])):
            assert loop.time() < deadline, "the idle connection never expired"
            await asyncio.sleep(0.05)
        assert c._open == 0
        assert (await whole(c, url))[2] == b"a"
        assert connections == 2
    finally:
        await c.close()
        server.close()
        await server.wait_closed()


async def test_the_pool_never_opens_more_than_its_limit() -> None:
    release = asyncio.Event()
    concurrent = peak = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal concurrent, peak
        concurrent += 1
        peak = max(peak, concurrent)
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")
                await reader.readexactly(2)
                await release.wait()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            concurrent -= 1
            writer.close()

    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    c = client(max_connections=3)
    try:
        calls = [asyncio.create_task(whole(c, url)) for _ in range(8)]
        await asyncio.sleep(0.2)
        assert c._open == 3
        release.set()
        results = await asyncio.gather(*calls)
    finally:
        await c.close()
        server.close()
        await server.wait_closed()
    assert [body for _, _, body in results] == [b"ok"] * 8
    assert peak == 3
