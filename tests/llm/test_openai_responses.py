"""The Responses API client (`OpenAIResponsesProvider`) against the loopback `OpenAIResponsesServer`,
with the official `openai` SDK as an independent oracle of both."""

from __future__ import annotations

import itertools
import json
import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, TypeAlias

import openai
import pytest
import pytest_asyncio
from openai.types.responses import (
    Response,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseFunctionToolCall,
    ResponseIncompleteEvent,
    ResponseOutputItemAddedEvent,
    ResponseOutputMessage,
    ResponseOutputRefusal,
    ResponseReasoningItem,
    ResponseReasoningSummaryTextDeltaEvent,
    ResponseTextDeltaEvent,
)

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
from keel.llm.providers.openai_responses import EncodedMessages, OpenAIResponsesProvider
from keel.llm.request import Request, ToolSpec
from keel.testing.openai_server import OpenAIResponsesServer
from keel.testing.script import Fault, Reply
from keel.testing.server import RawStreamServer
from tests.helpers import Sleeps, body, collect, free_port

KEY = "sk-test-responses"
#: Encrypted reasoning as the API sends it: long, base64 with `+`, `/` and `=`.
SIG = "gAAAAABpZ3Jv+/Ux0_k-Q==" * 40
READ = ToolSpec(
    "read",
    "Read a file.",
    {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
)
FAST = RetryPolicy(attempts=3, base=0.01, jitter=0)


def make_provider(url: str, *, key: str = KEY, stall: float = 5.0) -> OpenAIResponsesProvider:
    return OpenAIResponsesProvider(
        base_url=url + "/v1", api_key=key, settings=HTTPSettings(stall_timeout=stall)
    )


# One server, one client and one event loop per module: an httpx client costs ~60 ms to build
# (its TLS context), which per test would be most of this file's run time.
pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module")
def shared_server() -> Iterator[OpenAIResponsesServer]:
    with OpenAIResponsesServer(api_key=KEY) as s:
        yield s


@pytest.fixture
def server(shared_server: OpenAIResponsesServer) -> Iterator[OpenAIResponsesServer]:
    shared_server.script.clear()
    shared_server.requests.clear()
    shared_server.errors.clear()
    yield shared_server
    # A client that hung up (a stall test) makes the server's late writes fail; that is expected.
    assert [e for e in shared_server.errors if not isinstance(e, ConnectionError)] == []
    assert not shared_server.script, "a scripted step was never requested"


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def provider(shared_server: OpenAIResponsesServer) -> AsyncIterator[OpenAIResponsesProvider]:
    p = make_provider(shared_server.url)
    yield p
    await p.aclose()


def request(*messages: Message, **options: Any) -> Request:
    return Request(model="gpt-5", system="You are keel.", messages=messages, **options)


# ---------------------------------------------------------------------------------------------
# Requests and replies


async def test_text_reply_streams_deltas_and_one_done(
    server: OpenAIResponsesServer, provider: OpenAIResponsesProvider
) -> None:
    server.add(Reply(assistant("Hello there."), usage=Usage(input=1200, output=30, cache_read=800)))
    req = request(
        user("Say hello."),
        tools=(READ,),
        max_tokens=4096,
        effort="max",
        cache_key="session-1",
        temperature=0.5,
        top_p=0.9,
    )

    events = await collect(provider, req)

    assert events == [
        TextDelta("Hell"),
        TextDelta("o th"),
        TextDelta("ere."),
        Done(
            Message("assistant", (Text("Hello there."),), provider="openai", model="gpt-5"),
            Usage(input=1200, output=30, cache_read=800),
            "end_turn",
        ),
    ]
    [sent] = server.model_requests
    assert sent.path == "/v1/responses"
    assert sent.headers["authorization"] == f"Bearer {KEY}"
    assert body(sent) == {
        "model": "gpt-5",
        "instructions": "You are keel.",
        "tools": [
            {
                "type": "function",
                "name": "read",
                "description": "Read a file.",
                "parameters": READ.input_schema,
                "strict": False,
            }
        ],
        "input": [
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "Say hello."}],
            }
        ],
        "store": False,
        "stream": True,
        "include": ["reasoning.encrypted_content"],
        "max_output_tokens": 4096,
        "prompt_cache_key": "session-1",
        "reasoning": {"effort": "high", "summary": "auto"},
        "temperature": 0.5,
        "top_p": 0.9,
    }


async def test_minimal_request_sends_only_what_is_set(
    server: OpenAIResponsesServer, provider: OpenAIResponsesProvider
) -> None:
    server.add(Reply(assistant("ok")))
    await collect(provider, Request(model="gpt-5-mini", system="", messages=(user("hi"),)))
    assert body(server.model_requests[0]) == {
        "model": "gpt-5-mini",
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
        ],
        "store": False,
        "stream": True,
        "include": ["reasoning.encrypted_content"],
        "max_output_tokens": 16_000,
    }


async def test_multi_turn_bodies_share_a_byte_identical_prefix(
    server: OpenAIResponsesServer, provider: OpenAIResponsesProvider
) -> None:
    server.add(
        Reply(
            assistant(
                Thinking("Look first.", SIG, item_id="rs_1"),
                ToolUse("call_1", "read", {"path": "a.py"}),
            )
        ),
        Reply(assistant("It prints hi.")),
        Reply(assistant("Bye.")),
    )
    messages: list[Message] = [user("What does a.py do?")]
    follow_ups = [user(tool_result("call_1", "print('hi')")), user("Thanks!")]
    for follow_up in [*follow_ups, None]:
        events = await collect(provider, request(*messages, tools=(READ,), cache_key="s"))
        messages.append(events[-1].message)
        if follow_up is not None:
            messages.append(follow_up)

    bodies = [r.body for r in server.model_requests]
    assert len(bodies) == 3
    for before, after in itertools.pairwise(bodies):
        end_of_input = before.index(b'],"store":false')
        assert after[:end_of_input] == before[:end_of_input]
        assert after[end_of_input : end_of_input + 1] == b","
    assert body(server.model_requests[2])["input"] == [
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "What does a.py do?"}],
        },
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [{"type": "summary_text", "text": "Look first."}],
            "encrypted_content": SIG,
        },
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "read",
            "arguments": '{"path":"a.py"}',
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "print('hi')"},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "It prints hi."}],
        },
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Thanks!"}]},
    ]

    # The journal's round trip (new objects, same content) encodes to the same bytes.
    resumed = [message_from_json(json.loads(json.dumps(message_to_json(m)))) for m in messages]
    fresh = make_provider(server.url)
    last = request(*messages, tools=(READ,), cache_key="s")
    assert fresh.build_body(request(*resumed, tools=(READ,), cache_key="s")) == provider.build_body(
        last
    )


async def test_tool_calls_assemble_from_argument_fragments(
    server: OpenAIResponsesServer, provider: OpenAIResponsesProvider
) -> None:
    server.add(
        Reply(
            assistant(
                ToolUse("call_a", "read", {"path": "a.py"}),
                ToolUse("call_b", "grep", {"pattern": "def main"}),
            )
        )
    )
    events = await collect(provider, request(user("Look around.")))
    assert events == [
        ToolUseStart("call_a", "read"),
        ToolUseDelta("call_a", '{"path'),
        ToolUseDelta("call_a", '": "a.'),
        ToolUseDelta("call_a", 'py"}'),
        ToolUseStart("call_b", "grep"),
        ToolUseDelta("call_b", '{"patter'),
        ToolUseDelta("call_b", 'n": "def'),
        ToolUseDelta("call_b", ' main"}'),
        Done(
            Message(
                "assistant",
                (
                    ToolUse("call_a", "read", {"path": "a.py"}),
                    ToolUse("call_b", "grep", {"pattern": "def main"}),
                ),
                provider="openai",
                model="gpt-5",
            ),
            Usage(input=100, output=20),
            "tool_use",
        ),
    ]


async def test_encrypted_reasoning_round_trips_byte_for_byte(
    server: OpenAIResponsesServer, provider: OpenAIResponsesProvider
) -> None:
    server.add(
        Reply(assistant(Thinking("Check the tests.", SIG, item_id="rs_abc"), Text("Done."))),
        Reply(assistant("Again.")),
    )
    events = await collect(provider, request(user("Go.")))
    assert events[:3] == [ThinkingDelta("Check "), ThinkingDelta("the te"), ThinkingDelta("sts.")]
    done = events[-1]
    assert done.message.blocks == (
        Thinking("Check the tests.", SIG, source="openai", item_id="rs_abc"),
        Text("Done."),
    )

    journaled = message_from_json(json.loads(json.dumps(message_to_json(done.message))))
    await collect(provider, request(user("Go."), journaled, user("Again?")))

    raw = server.model_requests[1].body
    item = (
        b'{"type":"reasoning","id":"rs_abc","summary":[{"type":"summary_text",'
        b'"text":"Check the tests."}],"encrypted_content":' + json.dumps(SIG).encode() + b"}"
    )
    assert item in raw
    assert body(server.model_requests[1])["input"][1]["encrypted_content"] == SIG


async def test_reasoning_from_elsewhere_or_without_content_is_not_replayed(
    provider: OpenAIResponsesProvider,
) -> None:
    history = assistant(
        Thinking("anthropic thoughts", "sig-a", source="anthropic"),
        Thinking("no encrypted content", "", source="openai", item_id="rs_x"),
        Thinking("", SIG, source="openai", item_id="rs_y"),
        Text("Answer."),
    )
    sent = json.loads(provider.build_body(request(user("q"), history, user("more"))))
    assert sent["input"] == [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "q"}]},
        {"type": "reasoning", "id": "rs_y", "summary": [], "encrypted_content": SIG},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Answer."}],
        },
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "more"}]},
    ]


async def test_tool_results_errors_and_images_encode_as_documented(
    provider: OpenAIResponsesProvider,
) -> None:
    png = Image("image/png", "iVBORw0KGgo=")
    turn = Message(
        "user",
        (
            ToolResult(
                "call_1", (Text("old_string not found; read the file again"),), is_error=True
            ),
            ToolResult("call_2", (Text("error: already says so"),), is_error=True),
            ToolResult("call_3", (Text("screenshot taken"), png)),
            ToolResult("call_4", (png,)),
            Text("<system-note>file changed</system-note>"),
            Image("image/jpeg", "/9j/4AAQ"),
        ),
    )
    sent = json.loads(provider.build_body(request(turn)))
    data_png = "data:image/png;base64,iVBORw0KGgo="
    assert sent["input"] == [
        {
            "type": "function_call_output",
            "call_id": "call_1",
            "output": "Error: old_string not found; read the file again",
        },
        {"type": "function_call_output", "call_id": "call_2", "output": "error: already says so"},
        {"type": "function_call_output", "call_id": "call_3", "output": "screenshot taken"},
        {
            "type": "function_call_output",
            "call_id": "call_4",
            "output": "(image output attached below)",
        },
        {
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_text", "text": "Image output of tool call call_3:"},
                {"type": "input_image", "image_url": data_png, "detail": "auto"},
                {"type": "input_text", "text": "Image output of tool call call_4:"},
                {"type": "input_image", "image_url": data_png, "detail": "auto"},
                {"type": "input_text", "text": "<system-note>file changed</system-note>"},
                {
                    "type": "input_image",
                    "image_url": "data:image/jpeg;base64,/9j/4AAQ",
                    "detail": "auto",
                },
            ],
        },
    ]


@pytest.mark.parametrize(
    ("scripted", "decoded", "input_tokens"),
    [
        (Usage(input=500, output=40), Usage(input=500, output=40), 500),
        (
            Usage(input=200, output=40, cache_read=9000),
            Usage(input=200, output=40, cache_read=9000),
            9200,
        ),
        # OpenAI bills no cache writes: the fake counts them as input, and so does keel.
        (Usage(input=200, output=40, cache_write=300), Usage(input=500, output=40), 500),
    ],
)
async def test_usage_tiers(
    server: OpenAIResponsesServer,
    provider: OpenAIResponsesProvider,
    scripted: Usage,
    decoded: Usage,
    input_tokens: int,
) -> None:
    server.add(Reply(assistant("ok"), usage=scripted))
    events = await collect(provider, request(user("hi")))
    assert events[-1].usage == decoded
    assert decoded.input + decoded.cache_read == input_tokens


async def test_truncated_tool_json_keeps_the_raw_arguments(
    server: OpenAIResponsesServer, provider: OpenAIResponsesProvider
) -> None:
    args = {"path": "notes.txt", "content": "a long line of text"}
    server.add(
        Reply(assistant("Writing.", ToolUse("call_w", "write", args)), truncate_tool_json=True)
    )
    events = await collect(provider, request(user("Write notes.")))
    cut = json.dumps(args)[: len(json.dumps(args)) // 2]
    assert events[-1] == Done(
        Message(
            "assistant",
            (Text("Writing."), ToolUse("call_w", "write", None, raw_input=cut)),
            provider="openai",
            model="gpt-5",
        ),
        Usage(input=100, output=20),
        "max_tokens",
    )
    assert "".join(e.partial_json for e in events if isinstance(e, ToolUseDelta)) == cut


# ---------------------------------------------------------------------------------------------
# Errors, through the retry wrapper


async def test_rate_limit_waits_for_retry_after_then_succeeds(
    server: OpenAIResponsesServer, provider: OpenAIResponsesProvider
) -> None:
    server.add(Fault("status", status=429, retry_after=0.05), Reply(assistant("Hi!")))
    sleeps = Sleeps()
    events = await collect(RetryingProvider(provider, FAST, sleeps), request(user("hi")))
    assert sleeps == [0.05]
    assert events == [
        Notice(
            "openai returned 429: scripted error 429; retrying in 0.1 s (attempt 2 of 3)",
            "warning",
        ),
        TextDelta("H"),
        TextDelta("i"),
        TextDelta("!"),
        Done(
            Message("assistant", (Text("Hi!"),), provider="openai", model="gpt-5"),
            Usage(input=100, output=20),
            "end_turn",
        ),
    ]


async def test_server_error_is_retried_with_backoff(
    server: OpenAIResponsesServer, provider: OpenAIResponsesProvider
) -> None:
    server.add(Fault("status", status=500), Reply(assistant("ok")))
    sleeps = Sleeps()
    events = await collect(RetryingProvider(provider, FAST, sleeps), request(user("hi")))
    assert sleeps == [0.01]
    assert isinstance(events[0], Notice)
    assert events[0].text.startswith("openai returned 500: scripted error 500; retrying")
    assert events[-1].message.text == "ok"
    assert len(server.model_requests) == 2


async def test_bad_key_is_not_retried_and_names_the_variable(server: OpenAIResponsesServer) -> None:
    bad = make_provider(server.url, key="sk-wrong")
    sleeps = Sleeps()
    with pytest.raises(APIError) as info:
        await collect(RetryingProvider(bad, FAST, sleeps), request(user("hi")))
    await bad.aclose()
    assert (info.value.status, info.value.retryable, info.value.hint) == (
        401,
        False,
        "check OPENAI_API_KEY",
    )
    assert "Incorrect API key provided" in info.value.message
    assert sleeps == []
    assert len(server.model_requests) == 1


async def test_overflow_is_context_overflow(
    server: OpenAIResponsesServer, provider: OpenAIResponsesProvider
) -> None:
    server.add(Fault("overflow"))
    sleeps = Sleeps()
    with pytest.raises(ContextOverflow) as info:
        await collect(RetryingProvider(provider, FAST, sleeps), request(user("hi")))
    assert info.value.status == 400
    assert info.value.message == (
        "openai: Your input exceeds the context window of this model. "
        "Please adjust your input and try again."
    )
    assert sleeps == []


async def test_disconnect_before_output_is_retried(
    server: OpenAIResponsesServer, provider: OpenAIResponsesProvider
) -> None:
    # Four events (created, in_progress, item and part added) put nothing on the screen.
    server.add(
        Fault("disconnect", after_events=4, reply=Reply(assistant("lost"))), Reply(assistant("ok"))
    )
    sleeps = Sleeps()
    events = await collect(RetryingProvider(provider, FAST, sleeps), request(user("hi")))
    assert sleeps == [0.01]
    assert isinstance(events[0], Notice)
    assert "connection to openai lost" in events[0].text
    assert events[1:] == [
        TextDelta("o"),
        TextDelta("k"),
        Done(
            Message("assistant", (Text("ok"),), provider="openai", model="gpt-5"),
            Usage(input=100, output=20),
            "end_turn",
        ),
    ]


async def test_disconnect_after_output_is_surfaced(
    server: OpenAIResponsesServer, provider: OpenAIResponsesProvider
) -> None:
    server.add(Fault("disconnect", after_events=5, reply=Reply(assistant("Hello there."))))
    sleeps = Sleeps()
    seen: list[StreamEvent] = []
    with pytest.raises(APIError) as info:
        await collect(RetryingProvider(provider, FAST, sleeps), request(user("hi")), seen)
    assert seen == [TextDelta("Hell")]
    assert (info.value.status, info.value.retryable) == (0, True)
    assert sleeps == []


async def test_stall_before_output_is_retried(server: OpenAIResponsesServer) -> None:
    server.add(Fault("stall", after_events=2, seconds=0.6), Reply(assistant("ok")))
    quick = make_provider(server.url, stall=0.3)
    sleeps = Sleeps()
    events = await collect(RetryingProvider(quick, FAST, sleeps), request(user("hi")))
    await quick.aclose()
    assert sleeps == [0.01]
    assert isinstance(events[0], Notice)
    assert events[0].text.startswith("openai sent nothing for 0.3 s")
    assert events[-1].message.text == "ok"


async def test_stall_after_output_is_a_stall_error(server: OpenAIResponsesServer) -> None:
    server.add(Fault("stall", after_events=5, seconds=0.6, reply=Reply(assistant("Hello there."))))
    quick = make_provider(server.url, stall=0.3)
    sleeps = Sleeps()
    seen: list[StreamEvent] = []
    with pytest.raises(StallError) as info:
        await collect(RetryingProvider(quick, FAST, sleeps), request(user("hi")), seen)
    await quick.aclose()
    assert seen == [TextDelta("Hell")]
    assert (info.value.seconds, info.value.provider) == (0.3, "openai")
    assert sleeps == []


async def test_unreachable_server_is_status_0_after_retries() -> None:
    dead = make_provider(f"http://127.0.0.1:{free_port()}")
    sleeps = Sleeps()
    with pytest.raises(APIError) as info:
        await collect(RetryingProvider(dead, FAST, sleeps), request(user("hi")))
    await dead.aclose()
    assert (info.value.status, info.value.retryable) == (0, True)
    assert info.value.message.startswith("cannot reach openai at http://127.0.0.1:")
    assert sleeps == [0.5]  # a refusal: one quick retry


# ---------------------------------------------------------------------------------------------
# Stream events the scripted server never sends


def ev(kind: str, **fields: Any) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields})}\n\n".encode()


CREATED = ev("response.created", response={"id": "resp_1", "model": "gpt-5-2025", "output": []})


def completed(*output: dict[str, Any], kind: str = "response.completed", **extra: Any) -> bytes:
    usage = {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 2}
    response = {"id": "resp_1", "model": "gpt-5-2025", "output": list(output), "usage": usage}
    return ev(kind, response={**response, **extra})


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


async def test_summary_parts_unknown_events_and_the_final_item(canned: Canned) -> None:
    reasoning = {
        "id": "rs_9",
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": "A"}, {"type": "summary_text", "text": "B"}],
        "encrypted_content": "E",
    }
    seen, error = await canned(
        CREATED,
        ev("response.queued", response={"id": "resp_1"}),
        ev("response.some_future_event", detail=1),
        ev(
            "response.output_item.added",
            output_index=0,
            item={"id": "rs_9", "type": "reasoning", "summary": []},
        ),
        ev(
            "response.reasoning_summary_text.delta",
            output_index=0,
            item_id="rs_9",
            summary_index=0,
            delta="A",
        ),
        ev(
            "response.reasoning_summary_text.delta",
            output_index=0,
            item_id="rs_9",
            summary_index=1,
            delta="B",
        ),
        ev("response.output_item.done", output_index=0, item=reasoning),
        ev(
            "response.output_item.added",
            output_index=1,
            item={"id": "fs_1", "type": "file_search_call"},
        ),
        completed(reasoning, {"id": "fs_1", "type": "file_search_call"}),
    )
    assert error is None
    assert seen == [
        ThinkingDelta("A"),
        ThinkingDelta("\n\nB"),
        Done(
            Message(
                "assistant",
                (Thinking("A\n\nB", "E", source="openai", item_id="rs_9"),),
                provider="openai",
                model="gpt-5-2025",
            ),
            Usage(input=10, output=2),
            "end_turn",
        ),
    ]


async def test_refusal_stops_with_refusal(canned: Canned) -> None:
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "content": [{"type": "refusal", "refusal": "I can't help with that."}],
    }
    where = {"output_index": 0, "item_id": "msg_1", "content_index": 0}
    seen, error = await canned(
        CREATED,
        ev("response.output_item.added", output_index=0, item={**message, "content": []}),
        ev("response.refusal.delta", **where, delta="I can't "),
        ev("response.refusal.delta", **where, delta="help with that."),
        ev("response.refusal.done", **where, refusal="I can't help with that."),
        ev("response.output_item.done", output_index=0, item=message),
        completed(message),
    )
    assert error is None
    assert seen[:2] == [TextDelta("I can't "), TextDelta("help with that.")]
    assert seen[2] == Done(
        Message(
            "assistant", (Text("I can't help with that."),), provider="openai", model="gpt-5-2025"
        ),
        Usage(input=10, output=2),
        "refusal",
    )


async def test_incomplete_for_content_filter_is_a_refusal(canned: Canned) -> None:
    seen, error = await canned(
        CREATED,
        completed(kind="response.incomplete", incomplete_details={"reason": "content_filter"}),
    )
    assert error is None
    assert [e.stop_reason for e in seen if isinstance(e, Done)] == ["refusal"]


@pytest.mark.parametrize(
    ("chunks", "kind", "status", "retryable", "retry_after"),
    [
        (
            [
                ev(
                    "error",
                    code="context_length_exceeded",
                    message="Your input exceeds the context window of this model.",
                    param="input",
                )
            ],
            ContextOverflow,
            400,
            False,
            None,
        ),
        (
            [
                completed(
                    kind="response.failed",
                    error={
                        "code": "rate_limit_exceeded",
                        "message": "Rate limit reached. Please try again in 1.5s.",
                    },
                )
            ],
            APIError,
            429,
            True,
            1.5,
        ),
        (
            [completed(kind="response.failed", error={"code": "server_error", "message": "boom"})],
            APIError,
            500,
            True,
            None,
        ),
        (
            [completed(kind="response.failed", error={"code": "invalid_prompt", "message": "no"})],
            APIError,
            400,
            False,
            None,
        ),
        # The stream ends without response.completed: the connection was cut short.
        ([ev("response.in_progress", response={"id": "resp_1"})], APIError, 0, True, None),
        ([b"event: response.in_progress\ndata: {not json\n\n"], APIError, 0, True, None),
    ],
)
async def test_stream_failures_map_to_errors(
    canned: Canned,
    chunks: list[bytes],
    kind: type[APIError],
    status: int,
    retryable: bool,
    retry_after: float | None,
) -> None:
    seen, error = await canned(CREATED, *chunks)
    assert seen == []
    assert type(error) is kind
    assert isinstance(error, APIError)
    assert (error.status, error.retryable, error.retry_after) == (status, retryable, retry_after)


# ---------------------------------------------------------------------------------------------
# The official SDK as an oracle: it must read the fake server exactly as keel does


def sdk_done(response: Response) -> Done:
    """A neutral `Done` from an SDK `Response`, written independently of keel's decoder."""
    blocks: list[Any] = []
    refused = False
    for item in response.output:
        if isinstance(item, ResponseReasoningItem):
            summary = "\n\n".join(s.text for s in item.summary)
            blocks.append(
                Thinking(summary, item.encrypted_content or "", source="openai", item_id=item.id)
            )
        elif isinstance(item, ResponseOutputMessage):
            refused = refused or any(isinstance(c, ResponseOutputRefusal) for c in item.content)
            blocks.append(
                Text(
                    "".join(
                        c.refusal if isinstance(c, ResponseOutputRefusal) else c.text
                        for c in item.content
                    )
                )
            )
        elif isinstance(item, ResponseFunctionToolCall):
            try:
                blocks.append(ToolUse(item.call_id, item.name, json.loads(item.arguments)))
            except ValueError:
                blocks.append(ToolUse(item.call_id, item.name, None, raw_input=item.arguments))
    assert response.usage is not None
    cached = response.usage.input_tokens_details.cached_tokens
    usage = Usage(response.usage.input_tokens - cached, response.usage.output_tokens, cached)
    stop: StopReason
    if response.status == "incomplete":
        stop = "max_tokens"
    elif refused:
        stop = "refusal"
    else:
        stop = "tool_use" if any(isinstance(b, ToolUse) for b in blocks) else "end_turn"
    message = Message("assistant", tuple(blocks), provider="openai", model=response.model)
    return Done(message, usage, stop)


def sdk_deltas(events: list[Any]) -> list[StreamEvent]:
    calls: dict[int, str] = {}
    out: list[StreamEvent] = []
    for event in events:
        if isinstance(event, ResponseTextDeltaEvent):
            out.append(TextDelta(event.delta))
        elif isinstance(event, ResponseReasoningSummaryTextDeltaEvent):
            out.append(ThinkingDelta(event.delta))
        elif isinstance(event, ResponseOutputItemAddedEvent) and isinstance(
            event.item, ResponseFunctionToolCall
        ):
            calls[event.output_index] = event.item.call_id
            out.append(ToolUseStart(event.item.call_id, event.item.name))
        elif isinstance(event, ResponseFunctionCallArgumentsDeltaEvent):
            out.append(ToolUseDelta(calls[event.output_index], event.delta))
    return out


RICH = Reply(
    assistant(
        Thinking("Plan the search.", SIG, item_id="rs_7"),
        Text("Looking."),
        ToolUse("call_a", "read", {"path": "x.py"}),
        ToolUse("call_b", "grep", {"pattern": "def", "glob": "*.py"}),
    ),
    usage=Usage(input=100, output=20, cache_read=300),
)


async def test_sdk_reads_the_same_stream_and_object_as_keel(
    server: OpenAIResponsesServer, provider: OpenAIResponsesProvider
) -> None:
    server.add(RICH, RICH, RICH)
    keel_events = await collect(provider, request(user("hi")))
    with openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0) as client:
        with client.responses.stream(
            model="gpt-5", input="hi", include=["reasoning.encrypted_content"]
        ) as stream:
            streamed = list(stream)
            final = stream.get_final_response()
        plain = client.responses.create(
            model="gpt-5", input="hi", include=["reasoning.encrypted_content"], stream=False
        )
    assert sdk_deltas(streamed) == keel_events[:-1]
    assert sdk_done(final) == keel_events[-1] == sdk_done(plain)
    assert [e.sequence_number for e in streamed] == list(range(len(streamed)))


async def test_sdk_sees_the_truncated_call_as_keel_does(
    server: OpenAIResponsesServer, provider: OpenAIResponsesProvider
) -> None:
    cut = Reply(
        assistant(ToolUse("call_w", "write", {"path": "a", "text": "xyz"})), truncate_tool_json=True
    )
    server.add(cut, cut)
    keel_done = (await collect(provider, request(user("hi"))))[-1]
    with (
        openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0) as client,
        client.responses.stream(model="gpt-5", input="hi") as stream,
    ):
        streamed = list(stream)
    [incomplete] = [e for e in streamed if isinstance(e, ResponseIncompleteEvent)]
    assert incomplete.response.incomplete_details is not None
    assert incomplete.response.incomplete_details.reason == "max_output_tokens"
    assert sdk_done(incomplete.response) == keel_done
    assert sdk_deltas(streamed) == [
        ToolUseStart("call_w", "write"),
        ToolUseDelta("call_w", '{"pat'),
        ToolUseDelta("call_w", 'h": "'),
        ToolUseDelta("call_w", 'a", '),
    ]


async def test_sdk_lists_models_and_is_refused_without_the_key(
    server: OpenAIResponsesServer,
) -> None:
    server.add(Fault("overflow"))
    with openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0) as client:
        assert [m.id for m in client.models.list()] == ["gpt-5", "gpt-5-mini"]
        with pytest.raises(openai.BadRequestError) as overflow:
            client.responses.create(model="gpt-5", input="hi")
    assert overflow.value.code == "context_length_exceeded"
    with (
        openai.OpenAI(base_url=server.url + "/v1", api_key="sk-wrong", max_retries=0) as client,
        pytest.raises(openai.AuthenticationError) as refused,
    ):
        client.responses.create(model="gpt-5", input="hi")
    assert refused.value.code == "invalid_api_key"


# ---------------------------------------------------------------------------------------------
# Encoding cost: the loop's budget is 2 ms of harness overhead per turn at 100 turns


def transcript(turns: int) -> list[Message]:
    messages = [user("Fix the failing test in tests/test_app.py.")]
    for i in range(turns):
        messages.append(
            assistant(
                Thinking(
                    f"Step {i}: read the module.",
                    "gAAAAB" + "x" * 600,
                    source="openai",
                    item_id=f"rs_{i}",
                ),
                Text(f"Reading module {i}."),
                ToolUse(f"call_{i}", "read", {"path": f"src/mod_{i}.py", "limit": 200}),
                provider="openai",
                model="gpt-5",
            )
        )
        messages.append(user(tool_result(f"call_{i}", "def f():\n    return 1\n" * 60)))
    return messages


async def test_history_is_encoded_once_per_message() -> None:
    calls: list[Message] = []

    def encode(message: Message) -> bytes:
        calls.append(message)
        return message.text.encode()

    cache = EncodedMessages(encode)
    history = transcript(3)
    for n in range(1, len(history) + 1):
        cache(history[:n])
    assert calls == history
    # After a compaction, a sweep keeps only the new conversation's entries.
    cache.SPARE = 0
    cache([user("summary")])
    assert len(cache) == 1


async def test_encoding_at_100_turns_fits_the_budget() -> None:
    history = transcript(100)
    tools = (READ,)
    warm = make_provider("http://127.0.0.1:9")
    for n in range(1, len(history) + 1, 2):  # the loop's requests, turn by turn
        warm.build_body(request(*history[:n], tools=tools, cache_key="s"))
    last = request(*history, tools=tools, cache_key="s")
    timings = []
    for _ in range(20):
        start = time.perf_counter()
        built = warm.build_body(last)
        timings.append(time.perf_counter() - start)
    assert built == make_provider("http://127.0.0.1:9").build_body(last)
    assert statistics.median(timings) < 0.002
