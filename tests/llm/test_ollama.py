"""The Ollama client (`OllamaProvider`) against the loopback `OllamaServer`, with the official
`ollama` package as an independent oracle: for the same conversation both must send the same
`/api/chat` body and read the NDJSON stream the same way."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import ollama
import pytest
import pytest_asyncio

from keel.llm.catalog import parse_model
from keel.llm.errors import APIError, ContextOverflow
from keel.llm.events import Done, Notice, TextDelta, ThinkingDelta, ToolUseDelta, ToolUseStart
from keel.llm.http import HTTPSettings
from keel.llm.messages import (
    Message,
    StopReason,
    Text,
    Thinking,
    ToolUse,
    Usage,
    assistant,
    tool_result,
    user,
)
from keel.llm.provider import ProviderConfig, RetryingProvider, RetryPolicy, make_provider
from keel.llm.providers.ollama import (
    DEFAULT_NUM_CTX,
    LocalModel,
    OllamaProvider,
    local_models,
    ollama_url,
)
from keel.llm.request import Request, ToolSpec
from keel.testing.ollama_server import DEFAULT_MODELS, FakeModel, OllamaServer
from keel.testing.script import Fault, Reply
from keel.testing.server import RawStreamServer
from tests.helpers import Sleeps, body, collect, free_port

MODEL = "qwen3:8b"
READ = ToolSpec(
    "read",
    "Read a file.",
    {"type": "object", "properties": {"file_path": {"type": "string"}}, "required": ["file_path"]},
)
WIRE_READ = {
    "type": "function",
    "function": {"name": "read", "description": "Read a file.", "parameters": READ.input_schema},
}
MODELS = (*DEFAULT_MODELS, FakeModel("gpt-oss:20b", "gptoss", 131_072))
FOUR = RetryPolicy(attempts=4, base=0.01, jitter=0)

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module")
def shared_server() -> Iterator[OllamaServer]:
    with OllamaServer(models=MODELS) as s:
        yield s


@pytest.fixture
def server(shared_server: OllamaServer) -> Iterator[OllamaServer]:
    shared_server.script.clear()
    shared_server.requests.clear()
    shared_server.errors.clear()
    yield shared_server
    assert [e for e in shared_server.errors if not isinstance(e, ConnectionError)] == []
    assert not shared_server.script, "a scripted step was never requested"


@pytest_asyncio.fixture(loop_scope="module")
async def provider(shared_server: OllamaServer) -> AsyncIterator[OllamaProvider]:
    # One per test: the client remembers what /api/show said about each model.
    p = OllamaProvider(base_url=shared_server.url, api_key="", settings=HTTPSettings())
    yield p
    await p.aclose()


def request(*messages: Message, model: str = MODEL, **options: Any) -> Request:
    options.setdefault("tools", (READ,))
    options.setdefault("max_tokens", 4096)
    return Request(model=model, system="You are keel.", messages=messages, **options)


def done(
    *blocks: Any, usage: Usage | None = None, stop: StopReason = "end_turn", window: int = 32_768
) -> Done:
    message = Message("assistant", blocks, provider="ollama", model=MODEL)
    return Done(message, usage or Usage(input=100, output=20), stop, window)


def chat_body(server: OllamaServer) -> dict[str, Any]:
    return body([r for r in server.requests if r.path == "/api/chat"][-1])


def turn_reply() -> Reply:
    message = assistant(
        Thinking("Read it first.", source="ollama"),
        "Reading.",
        ToolUse("ignored", "read", {"file_path": "a.py"}),
    )
    return Reply(message, usage=Usage(input=900, output=40))


# ---------------------------------------------------------------------------------------------


async def test_turn_with_thinking_text_and_call(
    server: OllamaServer, provider: OllamaProvider
) -> None:
    server.add(turn_reply())
    events = await collect(provider, request(user("What is in a.py?"), effort="high"))

    call = events[-1].message.blocks[2]
    assert events == [
        ThinkingDelta("Read "),
        ThinkingDelta("it fi"),
        ThinkingDelta("rst."),
        TextDelta("Rea"),
        TextDelta("din"),
        TextDelta("g."),
        ToolUseStart(call.id, "read"),
        ToolUseDelta(call.id, '{"file_path":"a.py"}'),
        done(
            Thinking("Read it first.", source="ollama"),
            Text("Reading."),
            ToolUse(call.id, "read", {"file_path": "a.py"}),
            usage=Usage(input=900, output=40),
            stop="tool_use",
        ),
    ]
    assert [(r.method, r.path) for r in server.requests] == [
        ("POST", "/api/show"),
        ("POST", "/api/chat"),
    ]
    assert body(server.requests[0]) == {"model": MODEL}
    assert chat_body(server) == {
        "model": MODEL,
        "tools": [WIRE_READ],
        "messages": [
            {"role": "system", "content": "You are keel."},
            {"role": "user", "content": "What is in a.py?"},
        ],
        "stream": True,
        "think": True,
        # qwen3:8b was trained on 40,960 tokens: the default 32,768 fits.
        "options": {"num_ctx": 32_768, "num_predict": 4096},
    }


async def test_sdk_sends_the_same_conversation(
    server: OllamaServer, provider: OllamaProvider
) -> None:
    """A second turn (the model's own thinking, a call, its result) as keel and the SDK send it."""
    server.add(Reply(assistant("It prints hi.")), Reply(assistant("It prints hi.")))
    history = (
        user("What is in a.py?"),
        assistant(
            Thinking("Read it first.", source="ollama"),
            Thinking("Another model's reasoning.", "sig", source="anthropic"),
            "Reading.",
            ToolUse("call_1", "read", {"file_path": "a.py"}),
            provider="ollama",
            model=MODEL,
        ),
        user(tool_result("call_1", "print('hi')"), "Be brief."),
    )
    await collect(provider, request(*history, temperature=0.2, top_p=0.9))
    ours = chat_body(server)

    with ollama.Client(host=server.url) as client:
        sdk_stream = client.chat(
            model=MODEL,
            messages=[
                {"role": "system", "content": "You are keel."},
                {"role": "user", "content": "What is in a.py?"},
                {
                    "role": "assistant",
                    "content": "Reading.",
                    "thinking": "Read it first.",
                    "tool_calls": [
                        {"function": {"name": "read", "arguments": {"file_path": "a.py"}}}
                    ],
                },
                {"role": "tool", "content": "print('hi')", "tool_name": "read"},
                {"role": "user", "content": "Be brief."},
            ],
            tools=[WIRE_READ],
            options={"num_ctx": 32_768, "num_predict": 4096, "temperature": 0.2, "top_p": 0.9},
            stream=True,
        )
        list(sdk_stream)
    assert chat_body(server) == ours


async def test_sdk_reads_the_stream_as_keel_does(
    server: OllamaServer, provider: OllamaProvider
) -> None:
    server.add(turn_reply(), turn_reply())
    [*_, ours] = await collect(provider, request(user("What is in a.py?")))
    with ollama.Client(host=server.url) as client:
        chunks = list(
            client.chat(model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True)
        )
    thinking = "".join(c.message.thinking or "" for c in chunks)
    text = "".join(c.message.content or "" for c in chunks)
    calls = [
        (call.function.name, dict(call.function.arguments))
        for c in chunks
        for call in c.message.tool_calls or ()
    ]
    final = chunks[-1]
    blocks = ours.message.blocks
    assert (thinking, text) == (blocks[0].text, blocks[1].text)
    assert calls == [(blocks[2].name, blocks[2].input)]
    assert (final.done_reason, final.prompt_eval_count, final.eval_count) == ("stop", 900, 40)
    assert ours.usage == Usage(input=900, output=40)


async def test_models_are_listed_as_the_sdk_lists_them(server: OllamaServer) -> None:
    async with httpx.AsyncClient() as client:
        tags = (await client.get(f"{server.url}/api/tags")).json()
    ours = local_models(tags)
    with ollama.Client(host=server.url) as sdk:
        theirs = sdk.list().models
    assert [m.name for m in ours] == sorted(str(m.model) for m in theirs)
    assert ours[-1] == LocalModel("qwen3:8b", 5_225_387_923, "8.2B", "Q4_K_M", "qwen3")


# ---------------------------------------------------------------------------------------------
# The context window


@pytest.mark.parametrize(
    ("model", "num_ctx", "sent"),
    [
        ("qwen3:8b", None, DEFAULT_NUM_CTX),  # 32,768 of its 40,960
        ("llama3:8b", None, 8_192),  # trained on 8,192: never more
        ("qwen3:8b", 16_384, 16_384),  # configured smaller
        ("qwen3:8b", 65_536, 40_960),  # configured larger: capped at what the model has
        ("gpt-oss:20b", 65_536, 65_536),
    ],
)
async def test_window_asked_for_and_reported(
    server: OllamaServer, model: str, num_ctx: int | None, sent: int
) -> None:
    server.add(Reply(assistant("ok")))
    p = make_provider(
        parse_model(f"ollama/{model}"),
        env={"OLLAMA_HOST": server.url},
        config=ProviderConfig(num_ctx=num_ctx),
    )
    try:
        [*_, last] = await collect(p, request(user("hi"), model=model, tools=()))
    finally:
        await p.aclose()
    assert chat_body(server)["options"] == {"num_ctx": sent, "num_predict": 4096}
    assert last.window == sent  # the loop's context meter and compaction use this


@pytest.mark.parametrize(
    ("model", "effort", "think"),
    [
        ("qwen3:8b", None, None),
        ("qwen3:8b", "low", True),
        ("gpt-oss:20b", "low", "low"),
        ("gpt-oss:20b", "max", "high"),
        ("llama3:8b", "high", None),  # cannot think: Ollama would refuse `think`
    ],
)
async def test_effort_is_think(
    server: OllamaServer, provider: OllamaProvider, model: str, effort: Any, think: Any
) -> None:
    server.add(Reply(assistant("ok")))
    await collect(provider, request(user("hi"), model=model, tools=(), effort=effort))
    assert chat_body(server).get("think") == think


# ---------------------------------------------------------------------------------------------
# Where the server is, and what goes wrong


@pytest.mark.parametrize(
    ("host", "url"),
    [
        ("127.0.0.1", "http://127.0.0.1:11434"),
        ("0.0.0.0:9000", "http://127.0.0.1:9000"),
        ("gpu-box", "http://gpu-box:11434"),
        ("https://ollama.example.org", "https://ollama.example.org:443"),
        ("http://[::1]:8080/", "http://[::1]:8080"),
    ],
)
async def test_ollama_host_as_ollama_reads_it(host: str, url: str) -> None:
    assert ollama_url(host) == url


async def test_unreachable_server_is_one_line_with_a_hint() -> None:
    port = free_port()
    p = make_provider(parse_model("ollama/qwen3:8b"), env={"OLLAMA_HOST": f"127.0.0.1:{port}"})
    try:
        with pytest.raises(APIError) as info:
            await collect(p, request(user("hi")))
    finally:
        await p.aclose()
    line = info.value.one_line()
    assert line.startswith(f"cannot reach ollama at http://127.0.0.1:{port}: ")
    assert line.endswith(
        '(hint: check the ollama server is running and providers."ollama".base_url '
        "(or OLLAMA_HOST) points at it)"
    )
    assert "\n" not in line


async def test_unknown_model_says_to_pull_it(
    server: OllamaServer, provider: OllamaProvider
) -> None:
    with pytest.raises(APIError) as info:
        await collect(provider, request(user("hi"), model="mistral:7b"))
    assert info.value.one_line() == (
        "ollama returned 404: model 'mistral:7b' not found (hint: pull the model first "
        "(ollama pull MODEL), or pick one from `keel models`)"
    )


async def test_retried_before_output_not_after(
    server: OllamaServer, provider: OllamaProvider
) -> None:
    server.add(Fault("status", status=500), Reply(assistant("ok")))
    sleeps = Sleeps()
    events = await collect(RetryingProvider(provider, FOUR, sleeps), request(user("hi")))
    assert sleeps == [0.01]
    assert events[-1] == done(Text("ok"))

    server.add(Fault("disconnect", after_events=1, reply=Reply(assistant("Hello there"))))
    shown: list[Any] = []
    with pytest.raises(APIError):
        await collect(RetryingProvider(provider, FOUR, sleeps), request(user("hi")), shown)
    assert (shown, sleeps) == ([TextDelta("Hell")], [0.01])


async def test_overflow_is_context_overflow(server: OllamaServer, provider: OllamaProvider) -> None:
    server.add(Fault("overflow"))
    with pytest.raises(ContextOverflow):
        await collect(RetryingProvider(provider, FOUR, Sleeps()), request(user("hi")))
    assert len([r for r in server.requests if r.path == "/api/chat"]) == 1


async def test_something_else_at_ollama_host_is_one_line() -> None:
    with RawStreamServer() as other:
        other.chunks = (b"<html>not ollama</html>",)
        p = make_provider(parse_model("ollama/qwen3:8b"), env={"OLLAMA_HOST": other.url})
        try:
            with pytest.raises(APIError) as info:
                await collect(p, request(user("hi")))
        finally:
            await p.aclose()
    assert info.value.one_line() == (
        f"{other.url} did not answer /api/show as Ollama does (hint: check the ollama server is "
        'running and providers."ollama".base_url (or OLLAMA_HOST) points at it)'
    )


async def test_a_full_window_is_a_warning(server: OllamaServer, provider: OllamaProvider) -> None:
    server.add(Reply(assistant("ok"), usage=Usage(input=31_200, output=10)))
    server.add(Reply(assistant("ok"), usage=Usage(input=31_100, output=10)))
    full = await collect(provider, request(user("hi")))
    below = await collect(provider, request(user("hi")))
    assert full[-2:] == [
        Notice(
            "the conversation filled ollama's 32,768-token window for qwen3:8b; its start may "
            "have been cut (raise providers.ollama.num_ctx, or /compact)",
            "warning",
        ),
        done(Text("ok"), usage=Usage(input=31_200, output=10)),
    ]
    assert not any(isinstance(e, Notice) for e in below)


async def test_a_model_that_cannot_call_tools(
    server: OllamaServer, provider: OllamaProvider
) -> None:
    with pytest.raises(APIError) as info:
        await collect(provider, request(user("hi"), model="llama3:8b"))
    assert info.value.one_line() == (
        "ollama returned 400: registry.ollama.ai/library/llama3:8b does not support tools "
        "(hint: this model cannot call tools; pick one that can (ollama show MODEL))"
    )
