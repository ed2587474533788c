"""The per-call deadline is a wall clock from the request's start, enforced whether or not bytes
arrive, against real loopback servers that accept and then stall; a timed-out call is retried at
most once (never after output was shown); a refused connection fails after one quick retry."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from keel.llm.catalog import parse_model
from keel.llm.errors import APIError, CallTimeout, ConnectionRefused, StallError
from keel.llm.events import Notice, StreamEvent, TextDelta
from keel.llm.http import HTTPProvider, HTTPSettings
from keel.llm.messages import Message, Text
from keel.llm.provider import Provider, ProviderConfig, RetryingProvider, RetryPolicy, make_provider
from keel.llm.providers.anthropic import AnthropicProvider
from keel.llm.request import Request
from keel.llm.script import Fault, Reply
from keel.testing.anthropic_server import AnthropicServer
from keel.testing.server import LoopbackServer, RecordedRequest, ResponseWriter
from tests.helpers import free_port

KEY = "sk-ant-test"
#: Retries without waiting (the policy's own waits are what some tests check).
QUICK = RetryPolicy(attempts=4, base=0.0, jitter=0.0)


def ask() -> Request:
    return Request(
        model="claude-sonnet-4-5",
        system="s",
        messages=(Message("user", (Text("hi"),)),),
        max_tokens=100,
    )


async def run_until_error(
    provider: Provider,
) -> tuple[list[StreamEvent], APIError | StallError, float]:
    events: list[StreamEvent] = []
    start = time.monotonic()
    try:
        async for event in provider.stream(ask()):
            events.append(event)
    except (APIError, StallError) as exc:
        return events, exc, time.monotonic() - start
    raise AssertionError(f"the stream ended without an error: {events}")


class Held(LoopbackServer):
    """A server whose handlers wait until the test releases them (from its own thread)."""

    def __init__(self) -> None:
        super().__init__()
        self._release: asyncio.Event | None = None

    def released(self) -> asyncio.Event:
        if self._release is None:
            self._release = asyncio.Event()  # created on the server's loop, in a handler
        return self._release

    def release(self) -> None:
        loop = self._loop
        if loop is not None and self._release is not None:
            loop.call_soon_threadsafe(self._release.set)


class Silent(Held):
    """Reads each request, then says nothing at all (not even a status line)."""

    async def handle(self, request: RecordedRequest, response: ResponseWriter) -> None:
        await self.released().wait()
        response.keep_alive = False


class Trickle(Held):
    """Sends the response head, then an SSE comment every 0.2 s, for ever: bytes keep coming, so
    the stall timeout never fires, and the reply never ends."""

    async def handle(self, request: RecordedRequest, response: ResponseWriter) -> None:
        await response.start_stream()
        released = self.released()
        while not released.is_set():
            await response.chunk(b": ping\n\n")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(released.wait(), 0.2)
        response.keep_alive = False


@pytest.fixture
def anthropic() -> Iterator[AnthropicServer]:
    with AnthropicServer(api_key=KEY) as server:
        yield server


@pytest.fixture
def silent() -> Iterator[Silent]:
    server = Silent().start()
    yield server
    server.release()
    server.stop()


@pytest.fixture
def trickle() -> Iterator[Trickle]:
    server = Trickle().start()
    yield server
    server.release()
    server.stop()


def client(url: str, *, deadline: float = 1.0, stall: float = 30.0) -> AnthropicProvider:
    settings = HTTPSettings(stall_timeout=stall, call_timeout=deadline)
    return AnthropicProvider(base_url=url, api_key=KEY, settings=settings)


@pytest.fixture
async def closing() -> AsyncIterator[list[HTTPProvider]]:
    opened: list[HTTPProvider] = []
    yield opened
    for p in opened:
        await p.aclose()


TIMED_OUT = "anthropic call did not finish within 1 s (call_timeout)"
TIMED_OUT_HINT = (
    'raise providers."anthropic".call_timeout in settings for slow servers or long replies'
)


async def test_headers_then_nothing_ends_at_the_deadline_not_at_the_stall_timeout(
    anthropic: AnthropicServer, closing: list[HTTPProvider]
) -> None:
    # The server sends its response head, then sleeps 5 s before the first event; the stall
    # timeout (30 s) is far away. The old code checked the deadline only when a byte arrived.
    anthropic.add(Fault("stall", after_events=0, seconds=5))
    closing.append(p := client(anthropic.url))
    events, error, seconds = await run_until_error(p)
    assert events == []
    assert type(error) is CallTimeout
    assert (error.message, error.hint, error.status, error.retryable) == (
        TIMED_OUT,
        TIMED_OUT_HINT,
        408,
        True,
    )
    assert 0.9 <= seconds < 2.0, seconds
    assert len(anthropic.model_requests) == 1


async def test_without_a_socket_to_reach_each_read_has_the_deadline(
    anthropic: AnthropicServer, closing: list[HTTPProvider], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A transport that does not expose its socket: the fallback, a timeout on every read.
    import keel.llm.http

    monkeypatch.setattr(keel.llm.http, "_socket_of", lambda response: None)
    anthropic.add(Fault("stall", after_events=2, seconds=5))
    closing.append(p := client(anthropic.url))
    events, error, seconds = await run_until_error(p)
    assert (events, type(error), error.message) == ([], CallTimeout, TIMED_OUT)
    assert 0.9 <= seconds < 2.0, seconds


async def test_nothing_at_all_is_retried_once_then_fails(
    silent: Silent, closing: list[HTTPProvider]
) -> None:
    # Not even a status line: the deadline covers waiting for the response head too.
    closing.append(p := client(silent.url))
    events, error, seconds = await run_until_error(RetryingProvider(p, QUICK))
    assert events == [
        Notice(f"{TIMED_OUT}; retrying in 0.0 s (attempt 2 of 2)", "warning"),
    ]
    assert type(error) is CallTimeout
    assert error.one_line() == f"{TIMED_OUT} (hint: {TIMED_OUT_HINT})"
    assert 1.9 <= seconds < 3.5, seconds
    assert len(silent.requests) == 2  # one retry, not four attempts


async def test_keepalives_do_not_extend_the_deadline(
    trickle: Trickle, closing: list[HTTPProvider]
) -> None:
    closing.append(p := client(trickle.url, stall=0.5))  # bytes every 0.2 s: never a stall
    events, error, seconds = await run_until_error(p)
    assert (events, type(error), error.message) == ([], CallTimeout, TIMED_OUT)
    assert 0.9 <= seconds < 2.0, seconds


async def test_a_deadline_after_output_was_shown_is_not_retried(
    anthropic: AnthropicServer, closing: list[HTTPProvider]
) -> None:
    anthropic.add(
        Fault(
            "stall",
            after_events=4,
            seconds=5,
            reply=Reply(Message("assistant", (Text("Hello there"),))),
        )
    )
    closing.append(p := client(anthropic.url))
    events, error, seconds = await run_until_error(RetryingProvider(p, QUICK))
    assert [type(e) for e in events] == [TextDelta]
    assert (type(error), error.message) == (CallTimeout, TIMED_OUT)
    assert 0.9 <= seconds < 2.0, seconds
    assert len(anthropic.model_requests) == 1


async def test_the_stall_timeout_stays_separate_and_is_retried_once(
    anthropic: AnthropicServer, closing: list[HTTPProvider]
) -> None:
    anthropic.add(
        Fault("stall", after_events=0, seconds=3), Fault("stall", after_events=0, seconds=3)
    )
    closing.append(p := client(anthropic.url, deadline=30, stall=0.4))
    events, error, seconds = await run_until_error(RetryingProvider(p, QUICK))
    stalled = "anthropic sent nothing for 0.4 s; request abandoned"
    assert events == [Notice(f"{stalled}; retrying in 0.0 s (attempt 2 of 2)", "warning")]
    assert (type(error), error.message) == (StallError, stalled)
    assert seconds < 2.0, seconds
    assert len(anthropic.model_requests) == 2


async def test_a_refused_local_server_fails_after_one_quick_retry() -> None:
    port = free_port()
    p = make_provider(parse_model("ollama/qwen3:8b"), env={"OLLAMA_HOST": f"127.0.0.1:{port}"})
    try:
        events, error, seconds = await run_until_error(p)
    finally:
        await p.aclose()
    assert type(error) is ConnectionRefused
    message = (
        f"cannot reach ollama at http://127.0.0.1:{port}: connection refused (nothing is "
        "listening there)"
    )
    assert events == [Notice(f"{message}; retrying in 0.5 s (attempt 2 of 2)", "warning")]
    assert error.one_line() == (
        f"{message} (hint: check the ollama server is running and "
        'providers."ollama".base_url (or OLLAMA_HOST) points at it)'
    )
    assert 0.5 <= seconds < 2.0, seconds


def adapter_of(provider: Provider) -> HTTPProvider:
    inner: Any = provider
    while not isinstance(inner, HTTPProvider):
        inner = inner.inner
    return inner


@pytest.mark.parametrize(
    ("spec", "unattended", "config", "expected"),
    [
        ("anthropic/claude-sonnet-4-5", True, None, 120.0),  # the second seed's default
        ("anthropic/claude-sonnet-4-5", False, None, 600.0),  # someone watches (Esc stops it)
        ("ollama/qwen3:8b", True, None, 600.0),  # local models are slow
        ("lmstudio/qwen3", True, None, 600.0),
        ("openai-compatible/m", True, None, 600.0),
        ("ollama/qwen3:8b", False, None, 900.0),
        ("anthropic/claude-sonnet-4-5", True, ProviderConfig(call_timeout=30.0), 30.0),
    ],
)
async def test_default_call_deadlines(
    spec: str, unattended: bool, config: ProviderConfig | None, expected: float
) -> None:
    env = {"ANTHROPIC_API_KEY": KEY, "OPENAI_COMPATIBLE_BASE_URL": "http://127.0.0.1:1/v1"}
    p = make_provider(parse_model(spec), env=env, config=config, unattended=unattended)
    assert adapter_of(p).settings.call_timeout == expected
    await p.aclose()


def test_keel_p_with_a_stalled_server_ends_at_its_call_timeout(
    anthropic: AnthropicServer, project: Path, isolated_env: Path
) -> None:
    # The finding: a 4 s limit waited out a 30 s stall. Here the limit is 1 s and the stall 20 s.
    anthropic.add(
        Fault("stall", after_events=0, seconds=20), Fault("stall", after_events=0, seconds=20)
    )
    config = isolated_env / "config"
    config.mkdir()
    (config / "settings.json").write_text(
        json.dumps({"providers": {"anthropic": {"call_timeout": 1}}}), encoding="utf-8"
    )
    start = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "keel", "-p", "hi", "--model", "anthropic/claude-sonnet-4-5"],
        cwd=project,
        input="",
        capture_output=True,
        text=True,
        env={**os.environ, "ANTHROPIC_API_KEY": KEY, "ANTHROPIC_BASE_URL": anthropic.url},
        timeout=60,
    )
    seconds = time.monotonic() - start
    assert out.returncode == 1, out.stderr
    lines = out.stderr.splitlines()
    assert lines[-1] == f"keel: error: {TIMED_OUT} (hint: {TIMED_OUT_HINT})"
    assert lines[-2].startswith(f"keel: warning: {TIMED_OUT}; retrying in ")
    assert lines[-2].endswith(" s (attempt 2 of 2)")
    assert len(anthropic.model_requests) == 2
    assert seconds < 10, seconds  # two 1 s attempts, a backoff and start-up; not 20 s
