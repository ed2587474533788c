"""keel's Anthropic client against the loopback fake, and both against the official SDK.

Every test talks real HTTP on 127.0.0.1. Expected request bodies, messages and event sequences are
written out whole; the fake splits text into three deltas (`DELTA_PIECES`), so the expected
deltas below are those thirds, spelled out.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from dataclasses import replace
from typing import Any

import httpx
import pytest

from keel.llm.catalog import ModelRef
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
from keel.llm.provider import Provider, RetryingProvider, RetryPolicy, make_provider
from keel.llm.providers import anthropic as adapter
from keel.llm.providers.anthropic import AnthropicProvider
from keel.llm.request import Effort, Request, ToolSpec
from keel.testing.anthropic_server import AnthropicServer
from keel.testing.script import Fault, Reply
from tests.helpers import Sleeps, free_port

MODEL = "claude-haiku-4-5"
KEY = "sk-ant-test-key"
SYSTEM = "You are keel."
EPHEMERAL = {"type": "ephemeral"}
BREAKPOINT = b',"cache_control":{"type":"ephemeral"}'
READ_SCHEMA = {
    "type": "object",
    "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}},
    "required": ["path"],
}
WRITE_SCHEMA = {
    "type": "object",
    "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
    "required": ["path", "content"],
}
TOOLS = (
    ToolSpec("read", "Read a file.", READ_SCHEMA),
    ToolSpec("write", "Write a file.", WRITE_SCHEMA),
)
WIRE_TOOLS = [
    {"name": "read", "description": "Read a file.", "input_schema": READ_SCHEMA},
    {
        "name": "write",
        "description": "Write a file.",
        "input_schema": WRITE_SCHEMA,
        "cache_control": EPHEMERAL,
    },
]
WIRE_SYSTEM = [{"type": "text", "text": SYSTEM, "cache_control": EPHEMERAL}]
FAST = RetryPolicy(attempts=3, base=0.01, jitter=0)
#: What a `Reply` reports when the script gives no usage.
SCRIPT_USAGE = Usage(input=100, output=20)


def ask(*messages: Message, effort: Effort | None = None, max_tokens: int = 2048) -> Request:
    return Request(
        model=MODEL,
        system=SYSTEM,
        messages=messages,
        tools=TOOLS,
        max_tokens=max_tokens,
        effort=effort,
    )


def answer(*blocks: Text | Thinking | ToolUse, model: str = MODEL) -> Message:
    """An assistant message as keel's client assembles it."""
    return Message("assistant", blocks, provider="anthropic", model=model)


def text_reply(text: str = "Hello there, how can I help?") -> Reply:
    return Reply(assistant(text))


def hello_events(usage: Usage = SCRIPT_USAGE) -> list[StreamEvent]:
    text = "Hello there, how can I help?"
    return [
        TextDelta("Hello ther"),
        TextDelta("e, how can"),
        TextDelta(" I help?"),
        Done(answer(Text(text)), usage, "end_turn"),
    ]


async def collect(provider: Provider, request: Request) -> list[StreamEvent]:
    return [event async for event in provider.stream(request)]


async def collect_until_error(
    provider: Provider, request: Request
) -> tuple[list[StreamEvent], BaseException]:
    events: list[StreamEvent] = []
    try:
        async for event in provider.stream(request):
            events.append(event)
    except (APIError, StallError) as exc:
        return events, exc
    raise AssertionError(f"the stream ended without an error: {events}")


async def final(provider: Provider, request: Request) -> Done:
    events = await collect(provider, request)
    done = events[-1]
    assert isinstance(done, Done)
    return done


def without_breakpoints(body: bytes) -> bytes:
    return body.replace(BREAKPOINT, b"")


def breakpoints(body: Any) -> list[str]:
    """Where `cache_control` sits in a request body, as dotted paths."""
    found: list[str] = []

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            if "cache_control" in node:
                found.append(path)
            for key, value in node.items():
                walk(value, f"{path}.{key}" if path else key)
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{path}.{i}")

    walk(body, "")
    return found


@pytest.fixture
def server() -> Iterator[AnthropicServer]:
    with AnthropicServer(api_key=KEY) as srv:
        yield srv
    assert srv.errors == []


@pytest.fixture
async def provider(server: AnthropicServer) -> AsyncIterator[AnthropicProvider]:
    client = AnthropicProvider(
        base_url=server.url, api_key=KEY, settings=HTTPSettings(stall_timeout=10)
    )
    yield client
    await client.aclose()


@pytest.fixture
async def stalling(server: AnthropicServer) -> AsyncIterator[AnthropicProvider]:
    client = AnthropicProvider(
        base_url=server.url, api_key=KEY, settings=HTTPSettings(stall_timeout=0.3)
    )
    yield client
    await client.aclose()


# -- 1. text, request body, byte-stable prefix ----------------------------------------------------


async def test_text_reply_events_and_whole_request(
    server: AnthropicServer, provider: AnthropicProvider
) -> None:
    usage = Usage(input=12, output=7, cache_read=300, cache_write=40)
    server.add(Reply(assistant("Hello there, how can I help?"), usage=usage))

    events = await collect(provider, ask(user("hi")))

    assert events == hello_events(usage)
    [sent] = server.model_requests
    assert (sent.method, sent.path) == ("POST", "/v1/messages")
    assert {k: v for k, v in sent.headers.items() if k not in ("host", "content-length")} == {
        "accept": "text/event-stream",
        "accept-encoding": "gzip, deflate",
        "anthropic-version": "2023-06-01",
        "connection": "keep-alive",
        "content-type": "application/json",
        "user-agent": f"python-httpx/{httpx.__version__}",
        "x-api-key": KEY,
    }
    assert sent.json == {
        "model": MODEL,
        "max_tokens": 2048,
        "stream": True,
        "system": WIRE_SYSTEM,
        "tools": WIRE_TOOLS,
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": "hi", "cache_control": EPHEMERAL}],
            }
        ],
    }


async def test_three_turns_share_a_byte_stable_prefix(
    server: AnthropicServer, provider: AnthropicProvider
) -> None:
    server.add(
        Reply(answer(Text("Reading."), ToolUse("toolu_01", "read", {"path": "a.py"}))),
        Reply(assistant("It prints hi.")),
        Reply(assistant("You're welcome.")),
    )
    messages = [user("What does a.py do?")]
    follow_ups = [user(tool_result("toolu_01", "print('hi')")), user("Thanks!")]
    for follow_up in [*follow_ups, None]:
        done = await final(provider, ask(*messages))
        if follow_up is not None:
            messages += [done.message, follow_up]
    bodies = [r.body for r in server.model_requests]

    for previous, following in itertools.pairwise(bodies):
        # Up to the first breakpoint among the messages, nothing differs at all ...
        first_mark = previous.index(BREAKPOINT, previous.index(b'"messages":['))
        assert following[:first_mark] == previous[:first_mark]
        # ... and apart from breakpoints that moved on, the whole previous request is a prefix.
        assert without_breakpoints(following).startswith(without_breakpoints(previous)[:-2])
    assert [breakpoints(json.loads(b)) for b in bodies] == [
        ["system.0", "tools.1", "messages.0.content.0"],
        ["system.0", "tools.1", "messages.0.content.0", "messages.2.content.0"],
        ["system.0", "tools.1", "messages.2.content.0", "messages.4.content.0"],
    ]
    assert json.loads(bodies[2]) == {
        "model": MODEL,
        "max_tokens": 2048,
        "stream": True,
        "system": WIRE_SYSTEM,
        "tools": WIRE_TOOLS,
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "What does a.py do?"}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Reading."},
                    {
                        "type": "tool_use",
                        "id": "toolu_01",
                        "name": "read",
                        "input": {"path": "a.py"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_01",
                        "content": [{"type": "text", "text": "print('hi')"}],
                        "cache_control": EPHEMERAL,
                    }
                ],
            },
            {"role": "assistant", "content": [{"type": "text", "text": "It prints hi."}]},
            {
                "role": "user",
                "content": [{"type": "text", "text": "Thanks!", "cache_control": EPHEMERAL}],
            },
        ],
    }
    # A client with nothing cached encodes the same conversation to the same bytes.
    fresh = AnthropicProvider(base_url=server.url, api_key=KEY, settings=HTTPSettings())
    assert fresh.build_body(ask(*messages)) == bodies[2]


def test_each_message_is_encoded_once(monkeypatch: pytest.MonkeyPatch) -> None:
    encoded: list[Message] = []
    real_encode = adapter.encode_message

    def counting(message: Message, *, keep_thinking: bool = True) -> bytes:
        encoded.append(message)
        return real_encode(message, keep_thinking=keep_thinking)

    monkeypatch.setattr(adapter, "encode_message", counting)
    client = AnthropicProvider(base_url="http://127.0.0.1:1", api_key=KEY, settings=HTTPSettings())
    first, reply, second = user("one"), assistant("two"), user("three")

    client.build_body(ask(first))
    body = client.build_body(ask(first, reply, second))
    again = client.build_body(ask(first, reply, second))

    assert [id(m) for m in encoded] == [id(first), id(reply), id(second)]
    assert again == body


def test_replay_encoding_of_every_block_kind() -> None:
    client = AnthropicProvider(base_url="http://127.0.0.1:1", api_key=KEY, settings=HTTPSettings())
    png = "iVBORw0KGgo="
    history = (
        user("Look:", Image("image/png", png)),
        Message(
            "assistant",
            (
                Thinking("theirs", "enc-openai", source="openai", item_id="rs_1"),
                Thinking("mine", "sig-1", source="anthropic"),
                Thinking("", "", source="anthropic"),  # no signature: the API would reject it
                Text(""),
                ToolUse("toolu_07", "write", None, raw_input='{"path": "a.'),
            ),
            provider="anthropic",
            model=MODEL,
        ),
        user(
            ToolResult(
                "toolu_07",
                (Text("bad arguments"), Image("image/png", png), Text("")),
                is_error=True,
            )
        ),
        Message("assistant", (Thinking("only reasoning", "enc", source="openai"),)),
        user("go on"),
    )

    body = json.loads(client.build_body(ask(*history)))

    assert body["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Look:"},
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": png},
                },
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "mine", "signature": "sig-1"},
                {"type": "tool_use", "id": "toolu_07", "name": "write", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_07",
                    "content": [
                        {"type": "text", "text": "bad arguments"},
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": png},
                        },
                    ],
                    "is_error": True,
                    "cache_control": EPHEMERAL,
                }
            ],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "(empty response)"}]},
        {
            "role": "user",
            "content": [{"type": "text", "text": "go on", "cache_control": EPHEMERAL}],
        },
    ]


@pytest.mark.parametrize(
    ("effort", "max_tokens", "expected"),
    [
        (None, 64_000, {"temperature": 0.2, "top_p": 0.5}),
        ("low", 64_000, {"thinking": {"type": "enabled", "budget_tokens": 4_000}}),
        ("medium", 64_000, {"thinking": {"type": "enabled", "budget_tokens": 10_000}}),
        ("high", 64_000, {"thinking": {"type": "enabled", "budget_tokens": 24_000}}),
        ("max", 64_000, {"thinking": {"type": "enabled", "budget_tokens": 32_000}}),
        # The budget always leaves room for an answer; too little room leaves thinking off.
        ("max", 16_000, {"thinking": {"type": "enabled", "budget_tokens": 14_976}}),
        ("low", 2_000, {"temperature": 0.2, "top_p": 0.5}),
    ],
)
def test_effort_sets_a_thinking_budget_below_max_tokens(
    effort: Effort | None, max_tokens: int, expected: dict[str, Any]
) -> None:
    client = AnthropicProvider(base_url="http://127.0.0.1:1", api_key=KEY, settings=HTTPSettings())
    request = Request(
        model=MODEL,
        system="",
        messages=(user("hi"),),
        max_tokens=max_tokens,
        effort=effort,
        temperature=0.2,
        top_p=0.5,
        metadata={"user_id": "u-1", "session": "dropped: the API accepts only user_id"},
    )

    body = json.loads(client.build_body(request))

    assert body == {
        "model": MODEL,
        "max_tokens": max_tokens,
        "stream": True,
        **expected,
        "metadata": {"user_id": "u-1"},
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": "hi", "cache_control": EPHEMERAL}],
            }
        ],
    }


# -- 2. thinking and signatures round trip -------------------------------------------------------

SIGNATURE = 'EqQBCkYIBRgCKkBc+/9xYz==\\u00e9"quoted"'
REDACTED = "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpP=="


async def test_thinking_and_signatures_round_trip_byte_for_byte(
    server: AnthropicServer, provider: AnthropicProvider
) -> None:
    server.add(
        Reply(
            Message(
                "assistant",
                (
                    Thinking("Six × seven?", SIGNATURE),
                    Thinking("", REDACTED, redacted=True),
                    Text("42"),
                ),
            ),
            usage=Usage(input=50, output=30),
        ),
        text_reply("ok"),
    )
    question = user("What is six times seven?")

    events = await collect(provider, ask(question, effort="medium"))

    thought = answer(
        Thinking("Six × seven?", SIGNATURE, source="anthropic"),
        Thinking("", REDACTED, redacted=True, source="anthropic"),
        Text("42"),
    )
    assert events == [
        ThinkingDelta("Six "),
        ThinkingDelta("× se"),
        ThinkingDelta("ven?"),
        TextDelta("4"),
        TextDelta("2"),
        Done(thought, Usage(input=50, output=30), "end_turn"),
    ]
    done = events[-1]
    assert isinstance(done, Done)
    # Through the journal's JSON form and back.
    restored = message_from_json(json.loads(json.dumps(message_to_json(done.message))))
    assert restored == thought

    await collect(provider, ask(question, restored, user("Why?"), effort="medium"))

    sent = server.model_requests[1]
    assert json.dumps(SIGNATURE).encode() in sent.body
    assert json.dumps(REDACTED).encode() in sent.body
    assert sent.json == {
        "model": MODEL,
        "max_tokens": 2048,
        "stream": True,
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "system": WIRE_SYSTEM,
        "tools": WIRE_TOOLS,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is six times seven?", "cache_control": EPHEMERAL}
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "Six × seven?", "signature": SIGNATURE},
                    {"type": "redacted_thinking", "data": REDACTED},
                    {"type": "text", "text": "42"},
                ],
            },
            {
                "role": "user",
                "content": [{"type": "text", "text": "Why?", "cache_control": EPHEMERAL}],
            },
        ],
    }


# -- 3. tool calls ------------------------------------------------------------------------------


async def test_tool_call_streams_json_fragments(
    server: AnthropicServer, provider: AnthropicProvider
) -> None:
    call = ToolUse("toolu_01", "read", {"path": "src/keel/app.py", "limit": 20})
    server.add(Reply(Message("assistant", (Text("Reading."), call))))

    events = await collect(provider, ask(user("Read app.py")))

    assert events == [
        TextDelta("Rea"),
        TextDelta("din"),
        TextDelta("g."),
        ToolUseStart("toolu_01", "read"),
        ToolUseDelta("toolu_01", '{"path": "src/'),
        ToolUseDelta("toolu_01", 'keel/app.py", '),
        ToolUseDelta("toolu_01", '"limit": 20}'),
        Done(answer(Text("Reading."), call), SCRIPT_USAGE, "tool_use"),
    ]


async def test_truncated_tool_json_keeps_what_arrived(
    server: AnthropicServer, provider: AnthropicProvider
) -> None:
    read = ToolUse("toolu_01", "read", {"path": "x.py"})
    write = ToolUse("toolu_02", "write", {"path": "x.py", "content": "print(1)\n"})
    server.add(
        Reply(
            Message("assistant", (Text("Writing."), read, write, Text("never sent"))),
            truncate_tool_json=True,
        )
    )

    events = await collect(provider, ask(user("Write x.py")))

    assert events == [
        TextDelta("Wri"),
        TextDelta("tin"),
        TextDelta("g."),
        ToolUseStart("toolu_01", "read"),
        ToolUseDelta("toolu_01", '{"path'),
        ToolUseDelta("toolu_01", '": "x.'),
        ToolUseDelta("toolu_01", 'py"}'),
        ToolUseStart("toolu_02", "write"),
        ToolUseDelta("toolu_02", '{"path"'),
        ToolUseDelta("toolu_02", ': "x.py'),
        ToolUseDelta("toolu_02", '", "co'),
        Done(
            answer(
                Text("Writing."),
                read,
                ToolUse("toolu_02", "write", None, raw_input='{"path": "x.py", "co'),
            ),
            SCRIPT_USAGE,
            "max_tokens",
        ),
    ]


# -- 4. stop reasons and usage --------------------------------------------------------------------


@pytest.mark.parametrize("stop_reason", ["max_tokens", "refusal", "pause_turn", "stop_sequence"])
async def test_stop_reasons_and_all_usage_tiers(
    server: AnthropicServer, provider: AnthropicProvider, stop_reason: StopReason
) -> None:
    usage = Usage(input=5, output=6, cache_read=7, cache_write=8)
    server.add(Reply(assistant("partial"), usage=usage, stop_reason=stop_reason))

    events = await collect(provider, ask(user("go")))

    assert events == [
        TextDelta("par"),
        TextDelta("tia"),
        TextDelta("l"),
        Done(answer(Text("partial")), usage, stop_reason),
    ]


# -- decoding edge cases, from hand-written streams ----------------------------------------------


def sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


async def decode(*events: bytes, chunk: int = 7) -> list[StreamEvent]:
    """Decode a stream delivered in awkward `chunk`-byte pieces."""
    raw = b"".join(events)

    async def chunks() -> AsyncGenerator[bytes, None]:
        for i in range(0, len(raw), chunk):
            yield raw[i : i + chunk]

    client = AnthropicProvider(base_url="http://127.0.0.1:1", api_key=KEY, settings=HTTPSettings())
    return [event async for event in client.decode(ask(user("hi")), chunks())]


START = sse(
    "message_start",
    {
        "type": "message_start",
        "message": {
            "id": "msg_01",
            "type": "message",
            "role": "assistant",
            "model": "claude-haiku-4-5-20251001",
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": 10,
                "cache_creation_input_tokens": None,
                "cache_read_input_tokens": 5,
                "output_tokens": 1,
            },
        },
    },
)
STOP = sse("message_stop", {"type": "message_stop"})


def block_start(index: int, block: dict[str, Any]) -> bytes:
    return sse(
        "content_block_start",
        {"type": "content_block_start", "index": index, "content_block": block},
    )


def block_delta(index: int, delta: dict[str, Any]) -> bytes:
    return sse(
        "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
    )


def message_delta(stop_reason: str, usage: dict[str, Any]) -> bytes:
    return sse(
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": usage,
        },
    )


async def test_decode_ignores_what_the_neutral_model_cannot_hold() -> None:
    events = await decode(
        START,
        sse("ping", {"type": "ping"}),
        block_start(
            0,
            {"type": "server_tool_use", "id": "srvtoolu_1", "name": "code_execution", "input": {}},
        ),
        block_delta(0, {"type": "input_json_delta", "partial_json": '{"query": "x"}'}),
        sse("content_block_stop", {"type": "content_block_stop", "index": 0}),
        block_start(1, {"type": "text", "text": ""}),
        block_delta(1, {"type": "text_delta", "text": "Per the docs"}),
        block_delta(
            1, {"type": "citations_delta", "citation": {"type": "char_location", "cited_text": "x"}}
        ),
        block_delta(1, {"type": "text_delta", "text": ", yes."}),
        sse("content_block_stop", {"type": "content_block_stop", "index": 1}),
        block_start(
            2, {"type": "tool_use", "id": "toolu_9", "name": "read", "input": {"path": "eager.py"}}
        ),
        block_start(3, {"type": "tool_use", "id": "toolu_10", "name": "read", "input": {}}),
        block_delta(3, {"type": "input_json_delta", "partial_json": ""}),
        block_start(4, {"type": "tool_use", "id": "toolu_11", "name": "read", "input": {}}),
        block_delta(4, {"type": "input_json_delta", "partial_json": "[1, 2]"}),
        sse("brand_new_event", {"type": "brand_new_event"}),
        message_delta(
            "some_future_reason",
            {"input_tokens": 11, "cache_creation_input_tokens": 3, "output_tokens": 9},
        ),
        STOP,
    )

    assert events == [
        Notice(
            "anthropic sent a server_tool_use block, which keel does not support; ignored",
            "warning",
        ),
        TextDelta("Per the docs"),
        TextDelta(", yes."),
        ToolUseStart("toolu_9", "read"),
        ToolUseStart("toolu_10", "read"),
        ToolUseStart("toolu_11", "read"),
        ToolUseDelta("toolu_11", "[1, 2]"),
        Notice(
            "anthropic ended with stop reason 'some_future_reason', which keel does not know; "
            "treating it as end_turn",
            "warning",
        ),
        Done(
            answer(
                Text("Per the docs, yes."),
                ToolUse("toolu_9", "read", {"path": "eager.py"}),
                ToolUse("toolu_10", "read", {}),
                ToolUse("toolu_11", "read", None, raw_input="[1, 2]"),
                model="claude-haiku-4-5-20251001",
            ),
            Usage(input=11, output=9, cache_read=5, cache_write=3),
            "end_turn",
        ),
    ]


async def test_decode_context_window_stop_is_a_cut_off_reply() -> None:
    events = await decode(
        START, message_delta("model_context_window_exceeded", {"output_tokens": 4}), STOP
    )

    assert events == [
        Done(answer(model="claude-haiku-4-5-20251001"), Usage(10, 4, 5, 0), "max_tokens")
    ]


async def test_decode_stream_without_message_stop_is_retryable() -> None:
    with pytest.raises(APIError) as caught:
        await decode(START, block_start(0, {"type": "text", "text": ""}))

    error = caught.value
    assert (error.message, error.status, error.retryable) == (
        "anthropic stream ended early (no message_stop)",
        0,
        True,
    )


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (
            {"type": "overloaded_error", "message": "Overloaded"},
            (
                APIError,
                529,
                True,
                "anthropic returned 529: Overloaded",
                "Anthropic is overloaded; try again shortly",
            ),
        ),
        (
            {"type": "api_error", "message": "Internal server error"},
            (APIError, 500, True, "anthropic returned 500: Internal server error", ""),
        ),
        (
            {
                "type": "invalid_request_error",
                "message": "prompt is too long: 201000 tokens > 200000 maximum",
            },
            (
                ContextOverflow,
                400,
                False,
                "anthropic: prompt is too long: 201000 tokens > 200000 maximum",
                "compact the conversation or start a fresh one",
            ),
        ),
    ],
)
async def test_decode_error_event(error: dict[str, Any], expected: tuple[Any, ...]) -> None:
    with pytest.raises(APIError) as caught:
        await decode(
            START,
            block_start(0, {"type": "text", "text": ""}),
            sse("error", {"type": "error", "error": error}),
            STOP,
        )

    got = caught.value
    assert (type(got), got.status, got.retryable, got.message, got.hint) == expected


@pytest.mark.parametrize(
    ("status", "body", "headers", "expected"),
    [
        (
            400,
            {
                "type": "invalid_request_error",
                "message": "prompt is too long: 210000 tokens > 200000 maximum",
            },
            {},
            (
                ContextOverflow,
                400,
                False,
                None,
                "anthropic: prompt is too long: 210000 tokens > 200000 maximum",
            ),
        ),
        (
            413,
            {
                "type": "request_too_large",
                "message": "Request exceeds the maximum allowed number of bytes.",
            },
            {},
            (
                ContextOverflow,
                413,
                False,
                None,
                "anthropic: Request exceeds the maximum allowed number of bytes.",
            ),
        ),
        (
            400,
            {
                "type": "invalid_request_error",
                "message": "input length and `max_tokens` exceed context limit: 198000 + 20000 > 200000",
            },
            {},
            (
                ContextOverflow,
                400,
                False,
                None,
                "anthropic: input length and `max_tokens` exceed context limit: 198000 + 20000 > 200000",
            ),
        ),
        (
            400,
            {
                "type": "invalid_request_error",
                "message": "messages.1.content.0.thinking.signature: Field required",
            },
            {},
            (
                APIError,
                400,
                False,
                None,
                "anthropic returned 400: messages.1.content.0.thinking.signature: Field required",
            ),
        ),
        (
            529,
            {"type": "overloaded_error", "message": "Overloaded"},
            {"retry-after-ms": "1500"},
            (APIError, 529, True, 1.5, "anthropic returned 529: Overloaded"),
        ),
        (
            429,
            {
                "type": "rate_limit_error",
                "message": "Number of request tokens has exceeded your rate limit",
            },
            {"retry-after": "7"},
            (
                APIError,
                429,
                True,
                7.0,
                "anthropic returned 429: Number of request tokens has exceeded your rate limit",
            ),
        ),
    ],
)
def test_error_responses(
    status: int, body: dict[str, str], headers: dict[str, str], expected: tuple[Any, ...]
) -> None:
    client = AnthropicProvider(base_url="http://127.0.0.1:1", api_key=KEY, settings=HTTPSettings())
    payload = json.dumps({"type": "error", "error": body, "request_id": "req_1"}).encode()

    error = client.error_from_response(status, payload, headers)

    assert (
        type(error),
        error.status,
        error.retryable,
        error.retry_after,
        error.message,
    ) == expected


def test_error_response_that_is_not_json() -> None:
    client = AnthropicProvider(base_url="http://127.0.0.1:1", api_key=KEY, settings=HTTPSettings())

    error = client.error_from_response(502, b"<html>Bad Gateway</html>", {})

    assert (type(error), error.status, error.retryable, error.message) == (
        APIError,
        502,
        True,
        "anthropic returned 502: <html>Bad Gateway</html>",
    )


# -- 5. errors through RetryingProvider ----------------------------------------------------------


async def test_rate_limit_waits_as_long_as_retry_after_says(
    server: AnthropicServer, provider: AnthropicProvider
) -> None:
    server.add(Fault("status", status=429, retry_after=2), text_reply())
    sleeps = Sleeps()

    events = await collect(RetryingProvider(provider, FAST, sleeps), ask(user("hi")))

    assert sleeps.waits == [2.0]
    assert events == [
        Notice(
            "anthropic returned 429: scripted error 429; retrying in 2.0 s (attempt 2 of 3)",
            "warning",
        ),
        *hello_events(),
    ]


@pytest.mark.parametrize("status", [500, 529])
async def test_server_error_then_success(
    server: AnthropicServer, provider: AnthropicProvider, status: int
) -> None:
    server.add(Fault("status", status=status), text_reply())
    sleeps = Sleeps()

    events = await collect(RetryingProvider(provider, FAST, sleeps), ask(user("hi")))

    assert sleeps.waits == [0.01]
    assert events == [
        Notice(
            f"anthropic returned {status}: scripted error {status}; "
            "retrying in 0.0 s (attempt 2 of 3)",
            "warning",
        ),
        *hello_events(),
    ]


async def test_wrong_key_is_401_with_a_hint_and_not_retried(server: AnthropicServer) -> None:
    server.add(text_reply())
    sleeps = Sleeps()
    wrong = AnthropicProvider(base_url=server.url, api_key="sk-wrong", settings=HTTPSettings())
    try:
        events, error = await collect_until_error(
            RetryingProvider(wrong, FAST, sleeps), ask(user("hi"))
        )
    finally:
        await wrong.aclose()

    assert events == []
    assert sleeps.waits == []
    assert isinstance(error, APIError)
    assert (error.status, error.retryable, error.message, error.hint) == (
        401,
        False,
        "anthropic returned 401: invalid x-api-key",
        "check ANTHROPIC_API_KEY",
    )
    assert len(server.model_requests) == 1
    assert len(server.script) == 1  # rejected before the script was consulted


async def test_auth_token_is_sent_as_bearer(server: AnthropicServer) -> None:
    server.add(text_reply())
    bearer = AnthropicProvider(
        base_url=server.url, api_key=KEY, settings=HTTPSettings(), bearer=True
    )
    wrong = AnthropicProvider(
        base_url=server.url, api_key="nope", settings=HTTPSettings(), bearer=True
    )
    try:
        events = await collect(bearer, ask(user("hi")))
        _, error = await collect_until_error(wrong, ask(user("hi")))
    finally:
        await bearer.aclose()
        await wrong.aclose()

    assert events == hello_events()
    sent = server.model_requests[0].headers
    assert (sent.get("authorization"), sent.get("x-api-key")) == (f"Bearer {KEY}", None)
    assert isinstance(error, APIError)
    assert (error.status, error.hint) == (401, "check ANTHROPIC_AUTH_TOKEN")


async def test_overflow_is_context_overflow_and_not_retried(
    server: AnthropicServer, provider: AnthropicProvider
) -> None:
    server.add(Fault("overflow"), text_reply())
    sleeps = Sleeps()

    events, error = await collect_until_error(
        RetryingProvider(provider, FAST, sleeps), ask(user("hi"))
    )

    assert (events, sleeps.waits) == ([], [])
    assert isinstance(error, ContextOverflow)
    assert (error.status, error.message) == (
        400,
        "anthropic: prompt is too long: 210000 tokens > 200000 maximum",
    )


async def test_disconnect_before_any_delta_is_retried(
    server: AnthropicServer, provider: AnthropicProvider
) -> None:
    # message_start and ping arrive, then the connection drops.
    server.add(Fault("disconnect", after_events=2, reply=text_reply()), text_reply())
    sleeps = Sleeps()

    events = await collect(RetryingProvider(provider, FAST, sleeps), ask(user("hi")))

    notice = events[0]
    assert isinstance(notice, Notice)
    assert notice.level == "warning"
    assert notice.text.startswith("connection to anthropic lost: ")
    assert notice.text.endswith("; retrying in 0.0 s (attempt 2 of 3)")
    assert events[1:] == hello_events()
    assert sleeps.waits == [0.01]


async def test_disconnect_after_deltas_is_surfaced(
    server: AnthropicServer, provider: AnthropicProvider
) -> None:
    # message_start, ping, content_block_start and one text delta arrive, then the drop.
    server.add(Fault("disconnect", after_events=4, reply=text_reply()), text_reply())
    sleeps = Sleeps()

    events, error = await collect_until_error(
        RetryingProvider(provider, FAST, sleeps), ask(user("hi"))
    )

    assert events == [TextDelta("Hello ther")]
    assert isinstance(error, APIError)
    assert (error.status, error.retryable) == (0, True)
    assert error.message.startswith("connection to anthropic lost: ")
    assert (sleeps.waits, len(server.script)) == ([], 1)


async def test_overload_mid_stream_is_retried_until_something_was_shown(
    server: AnthropicServer, provider: AnthropicProvider
) -> None:
    server.add(
        Fault("status", status=529, after_events=2, message="Overloaded"),
        text_reply(),
        Fault("status", status=529, after_events=4, reply=text_reply(), message="Overloaded"),
    )
    sleeps = Sleeps()
    retrying = RetryingProvider(provider, FAST, sleeps)

    recovered = await collect(retrying, ask(user("hi")))
    events, error = await collect_until_error(retrying, ask(user("hi")))

    assert recovered == [
        Notice("anthropic returned 529: Overloaded; retrying in 0.0 s (attempt 2 of 3)", "warning"),
        *hello_events(),
    ]
    assert events == [TextDelta("Hello ther")]
    assert isinstance(error, APIError)
    assert (error.status, error.retryable, error.message) == (
        529,
        True,
        "anthropic returned 529: Overloaded",
    )
    assert sleeps.waits == [0.01]


async def test_stall_before_output_is_retried(
    server: AnthropicServer, stalling: AnthropicProvider
) -> None:
    server.add(Fault("stall", after_events=0, seconds=2), text_reply())
    sleeps = Sleeps()

    events = await collect(RetryingProvider(stalling, FAST, sleeps), ask(user("hi")))

    assert events == [
        Notice(
            # A stall is retried at most once, whatever the policy's attempts.
            "anthropic sent nothing for 0.3 s; request abandoned; retrying in 0.0 s (attempt 2 of 2)",
            "warning",
        ),
        *hello_events(),
    ]


async def test_stall_after_output_is_a_stall_error(
    server: AnthropicServer, stalling: AnthropicProvider
) -> None:
    server.add(Fault("stall", after_events=4, seconds=2, reply=text_reply()))
    sleeps = Sleeps()

    events, error = await collect_until_error(
        RetryingProvider(stalling, FAST, sleeps), ask(user("hi"))
    )

    assert events == [TextDelta("Hello ther")]
    assert isinstance(error, StallError)
    assert (error.seconds, error.provider, sleeps.waits) == (0.3, "anthropic", [])


async def test_unreachable_port_after_all_attempts() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    client = AnthropicProvider(base_url=url, api_key=KEY, settings=HTTPSettings())
    sleeps = Sleeps()
    try:
        events, error = await collect_until_error(
            RetryingProvider(client, FAST, sleeps), ask(user("hi"))
        )
    finally:
        await client.aclose()

    # Nothing listens there (a refusal): one quick retry, not the policy's three.
    assert [type(e) for e in events] == [Notice]
    assert sleeps.waits == [0.5]
    assert isinstance(error, APIError)
    assert (error.status, error.retryable) == (0, True)
    assert error.message.startswith(f"cannot reach anthropic at {url}: ")


async def test_retries_exhausted_raise_the_last_error(
    server: AnthropicServer, provider: AnthropicProvider
) -> None:
    server.add(
        Fault("status", status=500, message="first"),
        Fault("status", status=503, message="second"),
        Fault("status", status=529, message="third"),
    )
    sleeps = Sleeps()

    events, error = await collect_until_error(
        RetryingProvider(provider, FAST, sleeps), ask(user("hi"))
    )

    assert [e.text for e in events if isinstance(e, Notice)] == [
        "anthropic returned 500: first; retrying in 0.0 s (attempt 2 of 3)",
        "anthropic returned 503: second; retrying in 0.0 s (attempt 3 of 3)",
    ]
    assert sleeps.waits == [0.01, 0.02]
    assert isinstance(error, APIError)
    assert (error.status, error.message) == (529, "anthropic returned 529: third")


async def test_make_provider_builds_this_client(server: AnthropicServer) -> None:
    server.add(text_reply())
    built = make_provider(
        ModelRef("anthropic", MODEL),
        env={"ANTHROPIC_API_KEY": KEY, "ANTHROPIC_BASE_URL": server.url},
        retry=FAST,
    )
    try:
        events = await collect(built, ask(user("hi")))
    finally:
        await built.aclose()

    assert isinstance(built, RetryingProvider)
    assert isinstance(built.inner, AnthropicProvider)
    assert events == hello_events()


# -- the fake server rejects what the API would reject -------------------------------------------


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": ""}]}]},
            "messages.0.content.0: text content blocks must be non-empty",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": str(i), "cache_control": EPHEMERAL}
                            for i in range(5)
                        ],
                    }
                ]
            },
            "A maximum of 4 blocks with cache_control may be provided. Found 5.",
        ),
        (
            {"thinking": {"type": "enabled", "budget_tokens": 1024}, "temperature": 0.5},
            "`temperature` may only be set to 1 when thinking is enabled",
        ),
        (
            {"thinking": {"type": "enabled", "budget_tokens": 4096}},
            "`max_tokens` must be greater than `thinking.budget_tokens`",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "x"}]}
                ]
            },
            "messages.0.content.0.input: Field required",
        ),
        ({"prompt_cache_key": "s-1"}, "prompt_cache_key: Extra inputs are not permitted"),
    ],
)
def test_fake_server_rejects_malformed_requests(
    server: AnthropicServer, change: dict[str, Any], message: str
) -> None:
    body = {"model": MODEL, "max_tokens": 2048, "messages": [{"role": "user", "content": "hi"}]}
    headers = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}

    response = httpx.post(f"{server.url}/v1/messages", json=body | change, headers=headers)

    assert (response.status_code, response.json()) == (
        400,
        {"type": "error", "error": {"type": "invalid_request_error", "message": message}},
    )


# -- 6. the official SDK agrees with keel and with the fake --------------------------------------

SDK_SCRIPTS = {
    "text": Reply(
        assistant("Hello there, how can I help?"),
        usage=Usage(input=12, output=7, cache_read=300, cache_write=40),
    ),
    "thinking": Reply(
        Message(
            "assistant",
            (
                Thinking("Six × seven?", SIGNATURE),
                Thinking("", REDACTED, redacted=True),
                Text("42"),
            ),
        ),
        usage=Usage(input=50, output=30, cache_read=1, cache_write=2),
    ),
    "tools": Reply(
        Message(
            "assistant",
            (
                Text("Reading both."),
                ToolUse("toolu_01", "read", {"path": "a.py"}),
                ToolUse(
                    "toolu_02", "read", {"path": "b.py", "limit": 5, "nested": {"k": [1, None]}}
                ),
            ),
        )
    ),
    "refusal": Reply(assistant("I can't help with that."), stop_reason="refusal"),
}


def from_sdk(message: Any) -> tuple[Message, Usage, str]:
    """An SDK `Message` in keel's neutral form, for comparison."""
    import anthropic.types as sdk

    blocks: list[Text | Thinking | ToolUse] = []
    for block in message.content:
        if isinstance(block, sdk.TextBlock):
            blocks.append(Text(block.text))
        elif isinstance(block, sdk.ThinkingBlock):
            blocks.append(Thinking(block.thinking, block.signature, source="anthropic"))
        elif isinstance(block, sdk.RedactedThinkingBlock):
            blocks.append(Thinking("", block.data, redacted=True, source="anthropic"))
        elif isinstance(block, sdk.ToolUseBlock):
            blocks.append(ToolUse(block.id, block.name, dict(block.input)))
        else:
            raise AssertionError(f"unexpected SDK block {block!r}")
    usage = message.usage
    return (
        answer(*blocks, model=message.model),
        Usage(
            usage.input_tokens,
            usage.output_tokens,
            usage.cache_read_input_tokens or 0,
            usage.cache_creation_input_tokens or 0,
        ),
        message.stop_reason,
    )


@pytest.mark.parametrize("case", list(SDK_SCRIPTS))
async def test_sdk_reads_the_fake_as_keel_does(
    server: AnthropicServer, provider: AnthropicProvider, case: str
) -> None:
    import anthropic

    step = SDK_SCRIPTS[case]
    server.add(step, step, step)
    history = (user("What is in a.py?"), assistant("Let me look."), user("Go on."))
    request = ask(*history, effort="low", max_tokens=8192)

    done = await final(provider, request)
    keel_body = json.loads(provider.build_body(request))
    # keel's own body, sent through the SDK's typed parameters, must reach the wire unchanged.
    params = {k: v for k, v in keel_body.items() if k != "stream"}
    with anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0) as client:
        with client.messages.stream(**params) as stream:
            streamed = stream.get_final_message()
        created = client.messages.create(**params)

    keel_view = (done.message, done.usage, done.stop_reason)
    assert from_sdk(streamed) == keel_view
    assert from_sdk(created) == keel_view
    keel_sent, sdk_streamed, sdk_created = (r.json for r in server.model_requests)
    assert sdk_streamed == keel_sent
    assert {k: v for k, v in sdk_created.items() if k != "stream"} == params


async def test_sdk_reads_the_fakes_errors_and_models(server: AnthropicServer) -> None:
    import anthropic

    server.add(
        Fault("status", status=429, retry_after=3, message="slow down"),
        Fault("status", status=529, message="Overloaded"),
        Fault("overflow"),
        Fault("status", status=529, after_events=4, reply=text_reply(), message="Overloaded"),
    )
    params: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 100,
        "messages": [{"role": "user", "content": "hi"}],
    }
    with anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0) as client:
        with pytest.raises(anthropic.RateLimitError) as rate_limited:
            client.messages.create(**params)
        with pytest.raises(anthropic.OverloadedError) as overloaded:
            client.messages.create(**params)
        with pytest.raises(anthropic.BadRequestError) as overflow:
            client.messages.create(**params)
        stream = client.messages.stream(**params)
        with pytest.raises(anthropic.APIStatusError) as mid_stream, stream as events:
            events.get_final_message()
        models = [m.id for m in client.models.list()]
        bad = anthropic.Anthropic(base_url=server.url, api_key="sk-wrong", max_retries=0)
        with bad, pytest.raises(anthropic.AuthenticationError) as unauthorized:
            bad.models.list()

    assert rate_limited.value.response.headers["retry-after"] == "3"
    assert rate_limited.value.body == {
        "type": "error",
        "error": {"type": "rate_limit_error", "message": "slow down"},
    }
    assert overloaded.value.status_code == 529
    assert overflow.value.body == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "prompt is too long: 210000 tokens > 200000 maximum",
        },
    }
    assert mid_stream.value.body == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "Overloaded"},
    }
    assert models == ["claude-opus-5", "claude-sonnet-5", "claude-haiku-4-5"]
    assert unauthorized.value.status_code == 401


def test_thinking_signatures_go_only_to_the_model_that_wrote_them() -> None:
    """Signatures are bound to the model: after `/model` from one Claude to another, the other
    model's reasoning is left out (the API would reject the whole request); the same model
    under its dated id keeps it."""
    client = AnthropicProvider(base_url="http://127.0.0.1:1", api_key=KEY, settings=HTTPSettings())
    sonnet = answer(
        Thinking("sonnet thinks", "sig-sonnet", source="anthropic"),
        Text("From sonnet."),
        model="claude-sonnet-4-5-20250929",
    )
    haiku = answer(
        Thinking("haiku thinks", "sig-haiku", source="anthropic"),
        Text("From haiku."),
        model="claude-haiku-4-5-20251001",
    )
    conversation = (user("one"), sonnet, user("two"), haiku, user("three"))

    def assistants(body: bytes) -> list[list[dict[str, Any]]]:
        sent = json.loads(body)["messages"]
        return [m["content"] for m in sent if m["role"] == "assistant"]

    to_haiku = client.build_body(ask(*conversation, effort="low"))  # MODEL is claude-haiku-4-5
    assert assistants(to_haiku) == [
        [{"type": "text", "text": "From sonnet."}],
        [
            {"type": "thinking", "thinking": "haiku thinks", "signature": "sig-haiku"},
            {"type": "text", "text": "From haiku."},
        ],
    ]
    assert json.loads(to_haiku)["thinking"] == {"type": "enabled", "budget_tokens": 1024}
    # The same client, the same messages, now to sonnet: the cached encodings are not reused.
    to_sonnet = client.build_body(
        replace(ask(*conversation, effort="low"), model="claude-sonnet-4-5")
    )
    assert assistants(to_sonnet) == [
        [
            {"type": "thinking", "thinking": "sonnet thinks", "signature": "sig-sonnet"},
            {"type": "text", "text": "From sonnet."},
        ],
        [{"type": "text", "text": "From haiku."}],
    ]


def test_a_turn_another_claude_model_began_goes_on_without_thinking() -> None:
    call = ToolUse("toolu_1", "read", {"path": "a.py"})
    began = answer(
        Thinking("plan", "sig-sonnet", source="anthropic"), call, model="claude-sonnet-4-5"
    )
    results = Message("user", (tool_result("toolu_1", "x = 1"),))
    mid_turn = (user("fix a.py"), began, results)
    assert not adapter.thinking_allowed(mid_turn, "anthropic", MODEL)
    assert adapter.thinking_allowed(mid_turn, "anthropic", "claude-sonnet-4-5-20250929")
    after = (*mid_turn, answer(Text("done")), user("next"))
    assert adapter.thinking_allowed(after, "anthropic", MODEL)  # a new prompt, a new turn
    client = AnthropicProvider(base_url="http://127.0.0.1:1", api_key=KEY, settings=HTTPSettings())
    body = json.loads(client.build_body(ask(*mid_turn, effort="low")))
    assert "thinking" not in body
    assert body["messages"][1]["content"] == [
        {"type": "tool_use", "id": "toolu_1", "name": "read", "input": {"path": "a.py"}}
    ]


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ("claude-sonnet-4-5", "claude-sonnet-4-5-20250929", True),
        ("claude-3-7-sonnet-latest", "claude-3-7-sonnet-20250219", True),
        ("claude-sonnet-4", "claude-sonnet-4-5", False),
        ("claude-sonnet-4-20250514", "claude-sonnet-4-5-20250929", False),
        ("claude-opus-4-1", "claude-sonnet-4-5", False),
    ],
)
def test_same_model_ignores_only_snapshot_dates(a: str, b: str, same: bool) -> None:
    assert adapter.same_model(a, b) is same
    assert adapter.same_model(b, a) is same
