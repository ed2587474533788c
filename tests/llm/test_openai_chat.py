"""The Chat Completions client (`OpenAIChatProvider`) against the loopback `OpenAIChatServer`,
with the official `openai` SDK (and its own chunk accumulator) as an independent oracle."""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, TypeAlias

import openai
import pytest
import pytest_asyncio
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletion, ChatCompletionMessageFunctionToolCall

from keel.llm.errors import APIError, ContextOverflow, StallError
from keel.llm.events import (
    Done,
    Notice,
    StreamEvent,
    TextDelta,
    ThinkingDelta,
    ToolUseDelta,
    ToolUseStart,
)
from keel.llm.http import HTTPSettings
from keel.llm.messages import (
    Image,
    Message,
    StopReason,
    Text,
    Thinking,
    ToolResult,
    ToolUse,
    Usage,
    assistant,
    message_from_json,
    message_to_json,
    tool_result,
    user,
)
from keel.llm.provider import RetryingProvider, RetryPolicy
from keel.llm.providers.openai_chat import OpenAIChatProvider
from keel.llm.request import Request, ToolSpec
from keel.testing.openai_server import OpenAIChatServer
from keel.testing.script import Fault, Reply
from keel.testing.server import RawStreamServer
from tests.helpers import Sleeps, body, collect, free_port

MODEL = "qwen3-coder"
READ = ToolSpec(
    "read",
    "Read a file.",
    {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
)
FAST = RetryPolicy(attempts=3, base=0.01, jitter=0)


def make_provider(url: str, *, key: str = "", stall: float = 5.0) -> OpenAIChatProvider:
    return OpenAIChatProvider(
        base_url=url + "/v1", api_key=key, settings=HTTPSettings(stall_timeout=stall)
    )


# One server, one client and one event loop per module: an httpx client costs ~60 ms to build
# (its TLS context), which per test would be most of this file's run time.
pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module")
def shared_server() -> Iterator[OpenAIChatServer]:
    # A local server: no API key, as most compatible servers run.
    with OpenAIChatServer(models=(MODEL,)) as s:
        yield s


@pytest.fixture
def server(shared_server: OpenAIChatServer) -> Iterator[OpenAIChatServer]:
    shared_server.script.clear()
    shared_server.requests.clear()
    shared_server.errors.clear()
    shared_server.reasoning_field = "reasoning_content"
    shared_server.interleave_tool_calls = False
    yield shared_server
    # A client that hung up (a stall test) makes the server's late writes fail; that is expected.
    assert [e for e in shared_server.errors if not isinstance(e, ConnectionError)] == []
    assert not shared_server.script, "a scripted step was never requested"


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def provider(shared_server: OpenAIChatServer) -> AsyncIterator[OpenAIChatProvider]:
    p = make_provider(shared_server.url)
    yield p
    await p.aclose()


def request(*messages: Message, **options: Any) -> Request:
    return Request(model=MODEL, system="You are keel.", messages=messages, **options)


def done(*blocks: Any, usage: Usage | None = None, stop: StopReason = "end_turn") -> Done:
    message = Message("assistant", blocks, provider="openai-compatible", model=MODEL)
    return Done(message, usage or Usage(input=100, output=20), stop)


# ---------------------------------------------------------------------------------------------
# Requests and replies


async def test_text_reply_streams_deltas_and_one_done(
    server: OpenAIChatServer, provider: OpenAIChatProvider
) -> None:
    server.add(Reply(assistant("Hello there."), usage=Usage(input=1200, output=30, cache_read=800)))
    req = request(
        user("Say hello."),
        tools=(READ,),
        max_tokens=4096,
        temperature=0.2,
        top_p=0.95,
        # Neither has a Chat Completions field every compatible server accepts: not sent.
        effort="high",
        cache_key="session-1",
    )

    events = await collect(provider, req)

    assert events == [
        TextDelta("Hell"),
        TextDelta("o th"),
        TextDelta("ere."),
        done(Text("Hello there."), usage=Usage(input=1200, output=30, cache_read=800)),
    ]
    [sent] = server.model_requests
    assert sent.path == "/v1/chat/completions"
    assert "authorization" not in sent.headers
    assert body(sent) == {
        "model": MODEL,
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "read",
                    "description": "Read a file.",
                    "parameters": READ.input_schema,
                },
            }
        ],
        "messages": [
            {"role": "system", "content": "You are keel."},
            {"role": "user", "content": "Say hello."},
        ],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 4096,
        "temperature": 0.2,
        "top_p": 0.95,
    }


async def test_minimal_request_sends_only_what_is_set(
    server: OpenAIChatServer, provider: OpenAIChatProvider
) -> None:
    server.add(Reply(assistant("ok")))
    await collect(provider, Request(model=MODEL, system="", messages=(user("hi"),)))
    assert body(server.model_requests[0]) == {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 16_000,
    }


async def test_multi_turn_bodies_share_a_byte_identical_prefix(
    server: OpenAIChatServer, provider: OpenAIChatProvider
) -> None:
    server.add(
        Reply(assistant(Thinking("Look first."), ToolUse("call_1", "read", {"path": "a.py"}))),
        Reply(assistant("It prints hi.")),
        Reply(assistant("Bye.")),
    )
    messages: list[Message] = [user("What does a.py do?")]
    follow_ups = [user(tool_result("call_1", "print('hi')")), user("Thanks!")]
    for follow_up in [*follow_ups, None]:
        events = await collect(provider, request(*messages, tools=(READ,)))
        messages.append(events[-1].message)
        if follow_up is not None:
            messages.append(follow_up)

    bodies = [r.body for r in server.model_requests]
    assert len(bodies) == 3
    for before, after in itertools.pairwise(bodies):
        end_of_messages = before.index(b'],"stream":true')
        assert after[:end_of_messages] == before[:end_of_messages]
        assert after[end_of_messages : end_of_messages + 1] == b","
    # Reasoning is kept in the transcript but has no field to travel back in.
    assert messages[1].blocks[0] == Thinking("Look first.", source="openai-compatible")
    assert body(server.model_requests[2])["messages"] == [
        {"role": "system", "content": "You are keel."},
        {"role": "user", "content": "What does a.py do?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "read", "arguments": '{"path":"a.py"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "print('hi')"},
        {"role": "assistant", "content": "It prints hi."},
        {"role": "user", "content": "Thanks!"},
    ]

    resumed = [message_from_json(json.loads(json.dumps(message_to_json(m)))) for m in messages]
    fresh = make_provider(server.url)
    assert fresh.build_body(request(*resumed, tools=(READ,))) == provider.build_body(
        request(*messages, tools=(READ,))
    )


async def test_parallel_calls_assemble_from_interleaved_fragments(
    server: OpenAIChatServer, provider: OpenAIChatProvider
) -> None:
    server.interleave_tool_calls = True
    server.add(
        Reply(
            assistant(
                "Looking.",
                ToolUse("call_a", "read", {"path": "a.py"}),
                ToolUse("call_b", "grep", {"pattern": "def main"}),
            )
        )
    )
    events = await collect(provider, request(user("Look around.")))
    assert events == [
        TextDelta("Loo"),
        TextDelta("kin"),
        TextDelta("g."),
        ToolUseStart("call_a", "read"),
        ToolUseStart("call_b", "grep"),
        ToolUseDelta("call_a", '{"path'),
        ToolUseDelta("call_b", '{"patter'),
        ToolUseDelta("call_a", '": "a.'),
        ToolUseDelta("call_b", 'n": "def'),
        ToolUseDelta("call_a", 'py"}'),
        ToolUseDelta("call_b", ' main"}'),
        done(
            Text("Looking."),
            ToolUse("call_a", "read", {"path": "a.py"}),
            ToolUse("call_b", "grep", {"pattern": "def main"}),
            stop="tool_use",
        ),
    ]


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
async def test_reasoning_in_either_field_is_thinking(
    server: OpenAIChatServer, provider: OpenAIChatProvider, field: Any
) -> None:
    server.reasoning_field = field
    server.add(Reply(assistant(Thinking("Think first."), Text("Answer."))))
    events = await collect(provider, request(user("q")))
    assert events == [
        ThinkingDelta("Thin"),
        ThinkingDelta("k fi"),
        ThinkingDelta("rst."),
        TextDelta("Ans"),
        TextDelta("wer"),
        TextDelta("."),
        done(Thinking("Think first.", source="openai-compatible"), Text("Answer.")),
    ]


async def test_tool_results_errors_and_images_encode_as_documented(
    provider: OpenAIChatProvider,
) -> None:
    png = Image("image/png", "iVBORw0KGgo=")
    history = assistant(
        Thinking("hidden", "sig", source="anthropic"),
        ToolUse("call_1", "edit", {"path": "a.py"}),
        ToolUse("call_2", "shot", {}),
        ToolUse("call_3", "broken", None, raw_input='{"path": "a'),
    )
    turn = Message(
        "user",
        (
            ToolResult(
                "call_1", (Text("old_string not found; read the file again"),), is_error=True
            ),
            ToolResult("call_2", (Text("screenshot taken"), png)),
            ToolResult("call_3", (Text("invalid JSON arguments"),), is_error=True),
            Text("<system-note>file changed</system-note>"),
            Text("Now fix it."),
        ),
    )
    sent = json.loads(
        provider.build_body(Request(model=MODEL, system="", messages=(history, turn)))
    )
    assert sent["messages"] == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "edit", "arguments": '{"path":"a.py"}'},
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "shot", "arguments": "{}"},
                },
                {
                    "id": "call_3",
                    "type": "function",
                    "function": {"name": "broken", "arguments": '{"path": "a'},
                },
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "call_1",
            "content": "Error: old_string not found; read the file again",
        },
        {"role": "tool", "tool_call_id": "call_2", "content": "screenshot taken"},
        {"role": "tool", "tool_call_id": "call_3", "content": "Error: invalid JSON arguments"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Image output of tool call call_2:"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
                {"type": "text", "text": "<system-note>file changed</system-note>"},
                {"type": "text", "text": "Now fix it."},
            ],
        },
    ]
    # Text only: one plain string, the form every compatible server accepts.
    text_only = Message("user", (turn.blocks[0], Text("a note"), Text("Now fix it.")))
    plain = json.loads(provider.build_body(Request(model=MODEL, system="", messages=(text_only,))))
    assert plain["messages"] == [
        {
            "role": "tool",
            "tool_call_id": "call_1",
            "content": "Error: old_string not found; read the file again",
        },
        {"role": "user", "content": "a note\n\nNow fix it."},
    ]


@pytest.mark.parametrize(
    ("scripted", "decoded"),
    [
        (Usage(input=500, output=40), Usage(input=500, output=40)),
        (
            Usage(input=200, output=40, cache_read=9000),
            Usage(input=200, output=40, cache_read=9000),
        ),
        (Usage(input=200, output=40, cache_write=300), Usage(input=500, output=40)),
    ],
)
async def test_usage_tiers(
    server: OpenAIChatServer, provider: OpenAIChatProvider, scripted: Usage, decoded: Usage
) -> None:
    server.add(Reply(assistant("ok"), usage=scripted))
    events = await collect(provider, request(user("hi")))
    assert events[-1].usage == decoded


async def test_truncated_tool_json_finishes_with_length(
    server: OpenAIChatServer, provider: OpenAIChatProvider
) -> None:
    args = {"path": "notes.txt", "content": "a long line of text"}
    server.add(Reply(assistant(ToolUse("call_w", "write", args)), truncate_tool_json=True))
    events = await collect(provider, request(user("Write notes.")))
    cut = json.dumps(args)[: len(json.dumps(args)) // 2]
    assert events[-1] == done(ToolUse("call_w", "write", None, raw_input=cut), stop="max_tokens")


# ---------------------------------------------------------------------------------------------
# Errors, through the retry wrapper


async def test_rate_limit_waits_for_retry_after_then_succeeds(
    server: OpenAIChatServer, provider: OpenAIChatProvider
) -> None:
    server.add(Fault("status", status=429, retry_after=0.05), Reply(assistant("ok")))
    sleeps = Sleeps()
    events = await collect(RetryingProvider(provider, FAST, sleeps), request(user("hi")))
    assert sleeps == [0.05]
    assert events == [
        Notice(
            "openai-compatible returned 429: scripted error 429; retrying in 0.1 s (attempt 2 of 3)",
            "warning",
        ),
        TextDelta("o"),
        TextDelta("k"),
        done(Text("ok")),
    ]


async def test_server_error_is_retried_with_backoff(
    server: OpenAIChatServer, provider: OpenAIChatProvider
) -> None:
    server.add(Fault("status", status=503), Reply(assistant("ok")))
    sleeps = Sleeps()
    events = await collect(RetryingProvider(provider, FAST, sleeps), request(user("hi")))
    assert sleeps == [0.01]
    assert isinstance(events[0], Notice)
    assert events[0].text.startswith("openai-compatible returned 503: scripted error 503; retrying")
    assert events[-1] == done(Text("ok"))


async def test_key_is_sent_and_a_wrong_one_is_not_retried() -> None:
    with OpenAIChatServer([Reply(assistant("ok"))], api_key="sk-local") as guarded:
        good = make_provider(guarded.url, key="sk-local")
        bad = make_provider(guarded.url, key="sk-wrong")
        sleeps = Sleeps()
        try:
            assert (await collect(good, request(user("hi"))))[-1].message.text == "ok"
            with pytest.raises(APIError) as info:
                await collect(RetryingProvider(bad, FAST, sleeps), request(user("hi")))
        finally:
            await good.aclose()
            await bad.aclose()
        assert [r.headers["authorization"] for r in guarded.model_requests] == [
            "Bearer sk-local",
            "Bearer sk-wrong",
        ]
    assert (info.value.status, info.value.retryable, info.value.hint) == (
        401,
        False,
        "check OPENAI_COMPATIBLE_API_KEY",
    )
    assert sleeps == []


async def test_overflow_is_context_overflow(
    server: OpenAIChatServer, provider: OpenAIChatProvider
) -> None:
    server.add(Fault("overflow"))
    sleeps = Sleeps()
    with pytest.raises(ContextOverflow) as info:
        await collect(RetryingProvider(provider, FAST, sleeps), request(user("hi")))
    assert info.value.message.startswith(
        "openai-compatible: This model's maximum context length is 128000 tokens."
    )
    assert sleeps == []


async def test_disconnect_before_output_is_retried(
    server: OpenAIChatServer, provider: OpenAIChatProvider
) -> None:
    # The role chunk shows nothing; the connection drops before the first content.
    server.add(
        Fault("disconnect", after_events=1, reply=Reply(assistant("lost"))), Reply(assistant("ok"))
    )
    sleeps = Sleeps()
    events = await collect(RetryingProvider(provider, FAST, sleeps), request(user("hi")))
    assert sleeps == [0.01]
    assert isinstance(events[0], Notice)
    assert "connection to openai-compatible lost" in events[0].text
    assert events[1:] == [TextDelta("o"), TextDelta("k"), done(Text("ok"))]


async def test_disconnect_after_output_is_surfaced(
    server: OpenAIChatServer, provider: OpenAIChatProvider
) -> None:
    server.add(Fault("disconnect", after_events=2, reply=Reply(assistant("Hello there."))))
    sleeps = Sleeps()
    seen: list[StreamEvent] = []
    with pytest.raises(APIError) as info:
        await collect(RetryingProvider(provider, FAST, sleeps), request(user("hi")), seen)
    assert seen == [TextDelta("Hell")]
    assert (info.value.status, info.value.retryable) == (0, True)
    assert sleeps == []


async def test_stall_after_output_is_a_stall_error(server: OpenAIChatServer) -> None:
    server.add(Fault("stall", after_events=2, seconds=0.6, reply=Reply(assistant("Hello there."))))
    quick = make_provider(server.url, stall=0.3)
    sleeps = Sleeps()
    seen: list[StreamEvent] = []
    with pytest.raises(StallError) as info:
        await collect(RetryingProvider(quick, FAST, sleeps), request(user("hi")), seen)
    await quick.aclose()
    assert seen == [TextDelta("Hell")]
    assert (info.value.seconds, info.value.provider) == (0.3, "openai-compatible")
    assert sleeps == []


async def test_unreachable_server_names_the_base_url_setting() -> None:
    dead = make_provider(f"http://127.0.0.1:{free_port()}")
    sleeps = Sleeps()
    with pytest.raises(APIError) as info:
        await collect(RetryingProvider(dead, FAST, sleeps), request(user("hi")))
    await dead.aclose()
    assert (info.value.status, info.value.retryable) == (0, True)
    assert info.value.message.startswith("cannot reach openai-compatible at http://127.0.0.1:")
    assert 'providers."openai-compatible".base_url' in info.value.hint
    assert sleeps == [0.5]  # a refusal: one quick retry


# ---------------------------------------------------------------------------------------------
# What other compatible servers send


def chunk(*, finish: str | None = None, usage: dict[str, int] | None = None, **delta: Any) -> bytes:
    data: dict[str, Any] = {
        "id": "c1",
        "object": "chat.completion.chunk",
        "model": "served-model",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    if usage is not None:
        data["usage"] = usage
    return f"data: {json.dumps(data)}\n\n".encode()


DONE = b"data: [DONE]\n\n"
USAGE = {"prompt_tokens": 10, "completion_tokens": 2}


Canned: TypeAlias = Callable[..., Awaitable[tuple[list[StreamEvent], BaseException | None]]]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def canned() -> AsyncIterator[Canned]:
    """`await canned(*chunks)`: the events keel decoded from that stream, and its error if any."""
    with RawStreamServer() as server:
        client = make_provider(server.url)

        async def run(*chunks: bytes) -> tuple[list[StreamEvent], BaseException | None]:
            server.chunks = chunks
            seen: list[StreamEvent] = []
            try:
                await collect(client, request(user("hi")), seen)
            except (APIError, StallError) as exc:
                return seen, exc
            return seen, None

        yield run
        await client.aclose()


def served(*blocks: Any, stop: StopReason, usage: Usage | None = None) -> Done:
    message = Message("assistant", blocks, provider="openai-compatible", model="served-model")
    return Done(message, usage or Usage(input=10, output=2), stop)


async def test_calls_finished_with_stop_and_without_done_marker(canned: Canned) -> None:
    # Ollama-style: whole calls per chunk, each numbered 0, `stop` as the finish reason, usage on
    # the finish chunk, and (some versions) no [DONE] line.
    seen, error = await canned(
        chunk(role="assistant", content=""),
        chunk(
            tool_calls=[
                {"index": 0, "id": "c_1", "function": {"name": "read", "arguments": '{"path":"a"}'}}
            ]
        ),
        chunk(
            tool_calls=[
                {"index": 0, "id": "c_2", "function": {"name": "read", "arguments": '{"path":"b"}'}}
            ]
        ),
        chunk(finish="stop", usage=USAGE),
    )
    assert error is None
    assert seen == [
        ToolUseStart("c_1", "read"),
        ToolUseDelta("c_1", '{"path":"a"}'),
        ToolUseStart("c_2", "read"),
        ToolUseDelta("c_2", '{"path":"b"}'),
        served(
            ToolUse("c_1", "read", {"path": "a"}),
            ToolUse("c_2", "read", {"path": "b"}),
            stop="tool_use",
        ),
    ]


async def test_calls_without_ids_get_one(canned: Canned) -> None:
    seen, error = await canned(
        chunk(tool_calls=[{"index": 0, "function": {"name": "ls", "arguments": ""}}]),
        chunk(tool_calls=[{"index": 0, "function": {"arguments": "{}"}}]),
        chunk(finish="tool_calls"),
        chunk(usage=USAGE),
        DONE,
    )
    assert error is None
    assert isinstance(seen[-1], Done)
    [call] = seen[-1].message.tool_uses
    assert call.id.startswith("call_")
    assert len(call.id) == 29
    assert seen == [
        ToolUseStart(call.id, "ls"),
        ToolUseDelta(call.id, "{}"),
        served(ToolUse(call.id, "ls", {}), stop="tool_use"),
    ]


@pytest.mark.parametrize(
    ("chunks", "stop"),
    [
        ([chunk(refusal="No."), chunk(finish="stop")], "refusal"),
        ([chunk(content="Partial"), chunk(finish="content_filter")], "refusal"),
        ([chunk(content="Partial"), chunk(finish="length")], "max_tokens"),
        ([chunk(content="Partial"), DONE], "end_turn"),
    ],
)
async def test_finish_reasons(canned: Canned, chunks: list[bytes], stop: StopReason) -> None:
    seen, error = await canned(*chunks, chunk(usage=USAGE))
    assert error is None
    assert isinstance(seen[-1], Done)
    assert seen[-1].stop_reason == stop


@pytest.mark.parametrize(
    ("chunks", "status", "retryable"),
    [
        # Cut off before any finish reason or [DONE]: the connection was lost.
        ([chunk(content="Hel")], 0, True),
        ([b"data: {not json\n\n"], 0, True),
        ([b'data: {"error": {"message": "model crashed", "type": "server_error"}}\n\n'], 500, True),
        (
            [b'data: {"error": {"message": "bad grammar", "code": "invalid_request"}}\n\n'],
            400,
            False,
        ),
    ],
)
async def test_stream_failures_map_to_errors(
    canned: Canned, chunks: list[bytes], status: int, retryable: bool
) -> None:
    _, error = await canned(*chunks)
    assert isinstance(error, APIError)
    assert (error.status, error.retryable) == (status, retryable)


async def test_stream_overflow_error_is_context_overflow(canned: Canned) -> None:
    overflow = {
        "error": {
            "message": "the request exceeds the available context size",
            "type": "exceed_context_size_error",
        }
    }
    _, error = await canned(f"data: {json.dumps(overflow)}\n\n".encode())
    assert type(error) is ContextOverflow


# ---------------------------------------------------------------------------------------------
# The official SDK as an oracle: it must read the fake server exactly as keel does


_FINISH: dict[str, StopReason] = {
    "stop": "end_turn",
    "tool_calls": "tool_use",
    "length": "max_tokens",
}


def sdk_done(completion: ChatCompletion) -> Done:
    """A neutral `Done` from an SDK `ChatCompletion`, written independently of keel's decoder."""
    choice = completion.choices[0]
    message = choice.message
    blocks: list[Any] = []
    reasoning = getattr(message, "reasoning_content", None)
    if reasoning:
        blocks.append(Thinking(reasoning, source="openai-compatible"))
    if message.content or message.refusal:
        blocks.append(Text(message.content or message.refusal or ""))
    for call in message.tool_calls or []:
        assert isinstance(call, ChatCompletionMessageFunctionToolCall)
        try:
            blocks.append(ToolUse(call.id, call.function.name, json.loads(call.function.arguments)))
        except ValueError:
            blocks.append(
                ToolUse(call.id, call.function.name, None, raw_input=call.function.arguments)
            )
    assert completion.usage is not None
    details = completion.usage.prompt_tokens_details
    cached = (details.cached_tokens or 0) if details is not None else 0
    usage = Usage(
        completion.usage.prompt_tokens - cached, completion.usage.completion_tokens, cached
    )
    stop = "refusal" if message.refusal else _FINISH[choice.finish_reason]
    return Done(
        Message("assistant", tuple(blocks), provider="openai-compatible", model=completion.model),
        usage,
        stop,
    )


@pytest.mark.parametrize(
    "scripted",
    [
        Reply(
            assistant(
                Thinking("Plan the search."),
                Text("Looking."),
                ToolUse("call_a", "read", {"path": "x.py"}),
                ToolUse("call_b", "grep", {"pattern": "def", "glob": "*.py"}),
            ),
            usage=Usage(input=100, output=20, cache_read=300),
        ),
        Reply(assistant("I can't help with that."), stop_reason="refusal"),
        Reply(
            assistant("Partial", ToolUse("call_c", "write", {"path": "a", "text": "xyz"})),
            truncate_tool_json=True,
        ),
    ],
    ids=["tools", "refusal", "truncated"],
)
async def test_sdk_reads_the_same_stream_and_object_as_keel(
    server: OpenAIChatServer, provider: OpenAIChatProvider, scripted: Reply
) -> None:
    server.interleave_tool_calls = True
    server.add(scripted, scripted, scripted)
    keel_done = (await collect(provider, request(user("hi"))))[-1]
    state: ChatCompletionStreamState[None] = ChatCompletionStreamState()
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as client:
        stream = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        for sdk_chunk in stream:
            state.handle_chunk(sdk_chunk)
        plain = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=False
        )
    try:
        streamed: ChatCompletion = state.get_final_completion()
    except openai.LengthFinishReasonError as cut:  # the SDK refuses to parse a truncated reply
        streamed = cut.completion
    assert sdk_done(streamed) == keel_done == sdk_done(plain)


async def test_sdk_lists_models_and_sees_overflow(server: OpenAIChatServer) -> None:
    server.add(Fault("overflow"))
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as client:
        assert [m.id for m in client.models.list()] == [MODEL]
        with pytest.raises(openai.BadRequestError) as overflow:
            client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}]
            )
    assert overflow.value.code == "context_length_exceeded"
