"""The Gemini client (`GeminiProvider`) against the loopback `GeminiServer`, with the official
`google-genai` SDK as an independent oracle: for the same conversation both must send the same
request body, and both must read the server's stream the same way."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import pytest_asyncio
from google import genai
from google.genai import types

from keel.errors import UserError
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
from keel.llm.provider import RetryingProvider, RetryPolicy, make_provider
from keel.llm.providers.gemini import FOREIGN_SIGNATURE, GeminiProvider, thinking_config
from keel.llm.request import Request, ToolSpec
from keel.testing.gemini_server import SKIP_SIGNATURE, GeminiServer
from keel.testing.script import Fault, Reply
from keel.testing.server import RawStreamServer
from tests.helpers import Sleeps, body, collect

MODEL = "gemini-3-pro-preview"
KEY = "gemini-test-key"
READ = ToolSpec(
    "read",
    "Read a file.",
    {"type": "object", "properties": {"file_path": {"type": "string"}}, "required": ["file_path"]},
)
#: Signatures as Google sends them: opaque base64.
THOUGHT_SIG = base64.b64encode(b"thought-signature-1").decode()
CALL_SIG = base64.b64encode(b"call-signature-1").decode()
FOUR = RetryPolicy(attempts=4, base=0.01, jitter=0)

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module")
def shared_server() -> Iterator[GeminiServer]:
    with GeminiServer(api_key=KEY) as s:
        yield s


@pytest.fixture
def server(shared_server: GeminiServer) -> Iterator[GeminiServer]:
    shared_server.script.clear()
    shared_server.requests.clear()
    shared_server.errors.clear()
    shared_server.finish_reason = ""
    yield shared_server
    assert [e for e in shared_server.errors if not isinstance(e, ConnectionError)] == []
    assert not shared_server.script, "a scripted step was never requested"


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def provider(shared_server: GeminiServer) -> AsyncIterator[GeminiProvider]:
    p = GeminiProvider(
        base_url=shared_server.url, api_key=KEY, settings=HTTPSettings(stall_timeout=5)
    )
    yield p
    await p.aclose()


def sdk(server: GeminiServer) -> genai.Client:
    options = types.HttpOptions(
        base_url=server.url, api_version="v1beta", retry_options=types.HttpRetryOptions(attempts=1)
    )
    return genai.Client(api_key=KEY, http_options=options)


def sdk_config(**thinking: Any) -> types.GenerateContentConfig:
    declaration = types.FunctionDeclaration(
        name=READ.name, description=READ.description, parameters_json_schema=READ.input_schema
    )
    return types.GenerateContentConfig(
        system_instruction="You are keel.",
        tools=[types.Tool(function_declarations=[declaration])],
        max_output_tokens=4096,
        thinking_config=types.ThinkingConfig(**thinking) if thinking else None,
    )


def request(*messages: Message, **options: Any) -> Request:
    options.setdefault("tools", (READ,))
    options.setdefault("max_tokens", 4096)
    return Request(model=MODEL, system="You are keel.", messages=messages, **options)


def done(*blocks: Any, usage: Usage | None = None, stop: StopReason = "end_turn") -> Done:
    message = Message("assistant", blocks, provider="gemini", model=MODEL)
    return Done(message, usage or Usage(input=100, output=20), stop)


_OPAQUE = frozenset({"parametersJsonSchema", "args", "response"})


def camel(value: Any) -> Any:
    """A body with snake_case keys spelled in camelCase (the API takes both; the SDK sends some
    snake_case keys), leaving user data (schemas, arguments, results) as it is."""
    if isinstance(value, list):
        return [camel(v) for v in value]
    if not isinstance(value, dict):
        return value
    out = {}
    for key, inner in value.items():
        head, *rest = key.split("_")
        name = head + "".join(word.title() for word in rest)
        out[name] = inner if name in _OPAQUE else camel(inner)
    return out


def sdk_body(server: GeminiServer) -> dict[str, Any]:
    sent: dict[str, Any] = camel(body(server.model_requests[-1]))
    # The SDK labels the system instruction with a role, which the API ignores.
    assert sent["systemInstruction"].pop("role") == "user"
    return sent


def thinking_reply() -> Reply:
    """A Gemini 3 turn: a signed thought summary, text, and a signed function call."""
    message = assistant(
        Thinking("Read the file first.", THOUGHT_SIG, source="gemini"),
        "Reading it.",
        ToolUse("ignored", "read", {"file_path": "a.py"}, signature=CALL_SIG),
    )
    return Reply(message, usage=Usage(input=1000, output=50, cache_read=4000))


# ---------------------------------------------------------------------------------------------
# Requests and replies


async def test_turn_with_thought_text_and_call(
    server: GeminiServer, provider: GeminiProvider
) -> None:
    server.add(thinking_reply())
    events = await collect(provider, request(user("What is in a.py?"), effort="low"))

    call = events[-1].message.blocks[2]
    assert call.id.startswith("call_")  # Gemini sent no id; keel made one up
    assert events == [
        ThinkingDelta("Read th"),
        ThinkingDelta("e file "),
        ThinkingDelta("first."),
        TextDelta("Read"),
        TextDelta("ing "),
        TextDelta("it."),
        ToolUseStart(call.id, "read"),
        ToolUseDelta(call.id, '{"file_path":"a.py"}'),
        done(
            Thinking("Read the file first.", THOUGHT_SIG, source="gemini"),
            Text("Reading it."),
            ToolUse(call.id, "read", {"file_path": "a.py"}, signature=CALL_SIG),
            usage=Usage(input=1000, output=50, cache_read=4000),
            stop="tool_use",
        ),
    ]
    [sent] = server.model_requests
    assert sent.path == f"/v1beta/models/{MODEL}:streamGenerateContent?alt=sse"
    assert sent.headers["x-goog-api-key"] == KEY
    assert body(sent) == {
        "systemInstruction": {"parts": [{"text": "You are keel."}]},
        "tools": [
            {
                "functionDeclarations": [
                    {
                        "name": "read",
                        "description": "Read a file.",
                        "parametersJsonSchema": READ.input_schema,
                    }
                ]
            }
        ],
        "contents": [{"role": "user", "parts": [{"text": "What is in a.py?"}]}],
        "generationConfig": {
            "maxOutputTokens": 4096,
            "thinkingConfig": {"includeThoughts": True, "thinkingLevel": "LOW"},
        },
    }


async def test_sdk_sends_the_same_first_request(
    server: GeminiServer, provider: GeminiProvider
) -> None:
    server.add(Reply(assistant("Hi.")), Reply(assistant("Hi.")))
    await collect(provider, request(user("Say hi."), effort="low", temperature=0.3, top_p=0.9))
    ours = body(server.model_requests[-1])

    config = sdk_config(include_thoughts=True, thinking_level="LOW")
    config.temperature, config.top_p = 0.3, 0.9
    client = sdk(server)
    list(client.models.generate_content_stream(model=MODEL, contents="Say hi.", config=config))

    assert sdk_body(server) == ours


async def test_sdk_reads_the_stream_as_keel_does(
    server: GeminiServer, provider: GeminiProvider
) -> None:
    server.add(thinking_reply(), thinking_reply())
    [*_, ours] = await collect(provider, request(user("What is in a.py?")))
    client = sdk(server)
    chunks = list(
        client.models.generate_content_stream(
            model=MODEL, contents="What is in a.py?", config=sdk_config()
        )
    )

    parts = [
        p
        for c in chunks
        if c.candidates and c.candidates[0].content
        for p in c.candidates[0].content.parts or ()
    ]
    thought = "".join(p.text or "" for p in parts if p.thought)
    text = "".join(p.text or "" for p in parts if p.text and not p.thought)
    signatures = [
        base64.b64encode(p.thought_signature).decode() for p in parts if p.thought_signature
    ]
    calls = [(p.function_call.name, p.function_call.args) for p in parts if p.function_call]
    final = chunks[-1]
    assert final.candidates is not None
    assert final.candidates[0].finish_reason == types.FinishReason.STOP
    usage = final.usage_metadata
    assert usage is not None

    blocks = ours.message.blocks
    assert thought == blocks[0].text
    assert text == ours.message.text
    assert signatures == [blocks[0].signature, blocks[2].signature]
    assert calls == [(blocks[2].name, blocks[2].input)]
    # Gemini's prompt count includes the cached tokens; keel's `input` excludes them.
    assert (usage.prompt_token_count, usage.cached_content_token_count) == (5000, 4000)
    assert ours.usage == Usage(input=1000, output=50, cache_read=4000)


async def test_signatures_round_trip_as_the_sdk_replays_them(
    server: GeminiServer, provider: GeminiProvider
) -> None:
    """Turn two of a tool call: keel sends back the model turn with both signatures byte for
    byte, on the parts they came with, exactly as the SDK replays the content it received."""
    server.add(thinking_reply(), Reply(assistant("It prints hi.")))
    first = user("What is in a.py?")
    [*_, turn] = await collect(provider, request(first))
    call = turn.message.tool_uses[0]
    history = (first, turn.message, user(tool_result(call.id, "print('hi')")))
    await collect(provider, request(*history))
    ours = body(server.model_requests[-1])

    server.add(thinking_reply(), Reply(assistant("It prints hi.")))
    client = sdk(server)
    whole = client.models.generate_content(
        model=MODEL, contents="What is in a.py?", config=sdk_config()
    )
    assert whole.candidates is not None
    assert whole.candidates[0].content is not None
    response = types.Part.from_function_response(name="read", response={"output": "print('hi')"})
    contents = [
        types.Content(role="user", parts=[types.Part(text="What is in a.py?")]),
        whole.candidates[0].content,
        types.Content(role="user", parts=[response]),
    ]
    list(client.models.generate_content_stream(model=MODEL, contents=contents, config=sdk_config()))
    theirs = sdk_body(server)

    assert ours == theirs
    model_turn = ours["contents"][1]
    assert model_turn == {
        "role": "model",
        "parts": [
            {"text": "Read the file first.", "thought": True, "thoughtSignature": THOUGHT_SIG},
            {"text": "Reading it."},
            {
                "functionCall": {"name": "read", "args": {"file_path": "a.py"}},
                "thoughtSignature": CALL_SIG,
            },
        ],
    }


async def test_another_providers_turn_is_replayed_without_its_reasoning(
    server: GeminiServer, provider: GeminiProvider
) -> None:
    """After a model switch: Anthropic's signed thinking is dropped, and the first call of each
    foreign turn carries Google's documented skip signature (Gemini 3 refuses it otherwise)."""
    server.add(Reply(assistant("Both read.")))
    first = assistant(
        Thinking("Two files.", "anthropic-sig", source="anthropic"),
        ToolUse("toolu_1", "read", {"file_path": "a.py"}),
        ToolUse("toolu_2", "read", {"file_path": "b.py"}),
        provider="anthropic",
        model="claude-sonnet-4-5",
    )
    results = user(tool_result("toolu_1", "A"), tool_result("toolu_2", "B", is_error=True))
    await collect(provider, request(user("Read a.py and b.py."), first, results))

    assert body(server.model_requests[0])["contents"][1:] == [
        {
            "role": "model",
            "parts": [
                {
                    "functionCall": {"name": "read", "args": {"file_path": "a.py"}},
                    "thoughtSignature": FOREIGN_SIGNATURE,
                },
                {"functionCall": {"name": "read", "args": {"file_path": "b.py"}}},
            ],
        },
        {
            "role": "user",
            "parts": [
                {"functionResponse": {"name": "read", "response": {"output": "A"}}},
                {"functionResponse": {"name": "read", "response": {"error": "B"}}},
            ],
        },
    ]
    assert FOREIGN_SIGNATURE == SKIP_SIGNATURE


@pytest.mark.parametrize(
    ("finish", "notice"),
    [
        ("SAFETY", "gemini withheld the reply (SAFETY)"),
        ("RECITATION", "gemini withheld the reply (RECITATION)"),
        ("PROHIBITED_CONTENT", "gemini withheld the reply (PROHIBITED_CONTENT)"),
    ],
)
async def test_safety_stops_are_refusals(
    server: GeminiServer, provider: GeminiProvider, finish: str, notice: str
) -> None:
    server.finish_reason = finish
    server.add(Reply(assistant("I can")))
    events = await collect(provider, request(user("hi")))
    assert events[-2:] == [
        Notice(notice, "warning"),
        done(Text("I can"), stop="refusal"),
    ]


async def test_max_tokens_finish(server: GeminiServer, provider: GeminiProvider) -> None:
    server.add(Reply(assistant("Cut"), stop_reason="max_tokens"))
    assert (await collect(provider, request(user("hi"))))[-1] == done(
        Text("Cut"), stop="max_tokens"
    )


async def test_blocked_prompt_and_thought_token_usage() -> None:
    """A prompt the filter blocks has no candidates at all, only `promptFeedback`; thought
    tokens count as output."""
    chunk = {
        "promptFeedback": {"blockReason": "PROHIBITED_CONTENT"},
        "usageMetadata": {
            "promptTokenCount": 120,
            "cachedContentTokenCount": 20,
            "thoughtsTokenCount": 7,
            "candidatesTokenCount": 3,
            "toolUsePromptTokenCount": 5,
        },
        "modelVersion": "gemini-3-pro-preview-11-2025",
    }
    with RawStreamServer() as raw:
        raw.chunks = (f"data: {json.dumps(chunk)}\r\n\r\n".encode(),)
        p = GeminiProvider(base_url=raw.url, api_key=KEY, settings=HTTPSettings())
        try:
            events = await collect(p, request(user("hi")))
        finally:
            await p.aclose()
    message = Message("assistant", (), provider="gemini", model="gemini-3-pro-preview-11-2025")
    assert events == [
        Notice("gemini blocked the prompt (PROHIBITED_CONTENT)", "warning"),
        Done(message, Usage(input=105, output=10, cache_read=20), "refusal"),
    ]


# ---------------------------------------------------------------------------------------------
# Errors and retries


async def test_four_attempts_then_the_error(server: GeminiServer, provider: GeminiProvider) -> None:
    server.add(*[Fault("status", status=503)] * 4)
    sleeps = Sleeps()
    events: list[Any] = []
    with pytest.raises(APIError) as info:
        await collect(RetryingProvider(provider, FOUR, sleeps), request(user("hi")), events)
    assert len(server.model_requests) == 4
    assert sleeps == [0.01, 0.02, 0.04]
    assert [e.text for e in events] == [
        f"gemini returned 503: scripted error 503; retrying in {s:.1f} s (attempt {n} of 4)"
        for s, n in ((0.01, 2), (0.02, 3), (0.04, 4))
    ]
    assert (info.value.status, info.value.retryable) == (503, True)


async def test_rate_limit_waits_for_google_retry_info(
    server: GeminiServer, provider: GeminiProvider
) -> None:
    server.add(Fault("status", status=429, retry_after=7), Reply(assistant("ok")))
    sleeps = Sleeps()
    events = await collect(RetryingProvider(provider, FOUR, sleeps), request(user("hi")))
    assert sleeps == [7.0]
    assert events[0] == Notice(
        "gemini returned 429: Resource exhausted; retrying in 7.0 s (attempt 2 of 4)", "warning"
    )
    assert events[-1] == done(Text("ok"))


async def test_no_retry_once_output_was_shown(
    server: GeminiServer, provider: GeminiProvider
) -> None:
    server.add(Fault("disconnect", after_events=2, reply=Reply(assistant("Hello there, friend"))))
    sleeps = Sleeps()
    events: list[Any] = []
    with pytest.raises(APIError) as info:
        await collect(RetryingProvider(provider, FOUR, sleeps), request(user("hi")), events)
    assert events == [TextDelta("Hello t"), TextDelta("here, f")]
    assert (sleeps, len(server.model_requests)) == ([], 1)
    assert info.value.retryable


async def test_stream_without_finish_is_cut_and_retried(
    server: GeminiServer, provider: GeminiProvider
) -> None:
    server.add(Fault("disconnect", after_events=0, reply=Reply(assistant("x"))))
    server.add(Reply(assistant("ok")))
    sleeps = Sleeps()
    events = await collect(RetryingProvider(provider, FOUR, sleeps), request(user("hi")))
    assert len(sleeps) == 1
    assert events[-1] == done(Text("ok"))


async def test_wrong_key_is_an_authentication_error(server: GeminiServer) -> None:
    bad = GeminiProvider(base_url=server.url, api_key="wrong", settings=HTTPSettings())
    sleeps = Sleeps()
    try:
        with pytest.raises(APIError) as info:
            await collect(RetryingProvider(bad, FOUR, sleeps), request(user("hi")))
    finally:
        await bad.aclose()
    assert info.value.one_line() == (
        "gemini returned 401: API key not valid. Please pass a valid API key. "
        "(hint: check GEMINI_API_KEY)"
    )
    assert (info.value.retryable, sleeps) == (False, [])


async def test_overflow_is_context_overflow(server: GeminiServer, provider: GeminiProvider) -> None:
    server.add(Fault("overflow"))
    with pytest.raises(ContextOverflow) as info:
        await collect(RetryingProvider(provider, FOUR, Sleeps()), request(user("hi")))
    assert "exceeds the maximum number of tokens" in info.value.message
    assert len(server.model_requests) == 1


async def test_sdk_sees_the_same_errors(server: GeminiServer) -> None:
    server.add(Fault("status", status=429, retry_after=7))
    client = sdk(server)
    with pytest.raises(genai.errors.ClientError) as info:
        list(client.models.generate_content_stream(model=MODEL, contents="hi"))
    assert (info.value.code, info.value.status) == (429, "RESOURCE_EXHAUSTED")
    assert info.value.details["error"]["details"][0]["retryDelay"] == "7s"


# ---------------------------------------------------------------------------------------------
# Configuration


async def test_key_from_gemini_or_google_variable(server: GeminiServer) -> None:
    server.add(Reply(assistant("one")), Reply(assistant("two")))
    ref = parse_model(f"gemini/{MODEL}")
    for env in (
        {"GEMINI_API_KEY": KEY, "GEMINI_BASE_URL": server.url},
        {"GOOGLE_API_KEY": KEY, "GEMINI_BASE_URL": server.url},
    ):
        p = make_provider(ref, env=env)
        try:
            [*_, last] = await collect(p, request(user("hi")))
        finally:
            await p.aclose()
        assert last.message.provider == "gemini"
    assert [r.headers["x-goog-api-key"] for r in server.model_requests] == [KEY, KEY]


async def test_missing_key_is_one_line_with_a_hint() -> None:
    with pytest.raises(UserError) as info:
        make_provider(parse_model("gemini/gemini-2.5-flash"), env={})
    assert info.value.one_line() == (
        "GEMINI_API_KEY is not set; gemini needs an API key (hint: export GEMINI_API_KEY=… , "
        "or try keel offline with --model scripted:demo)"
    )


@pytest.mark.parametrize(
    ("model", "effort", "config"),
    [
        ("gemini-3-pro-preview", None, None),
        ("gemini-3-pro-preview", "low", {"includeThoughts": True, "thinkingLevel": "LOW"}),
        ("gemini-3-pro-preview", "medium", {"includeThoughts": True, "thinkingLevel": "HIGH"}),
        ("gemini-3-flash-preview", "medium", {"includeThoughts": True, "thinkingLevel": "MEDIUM"}),
        ("gemini-3-flash-preview", "max", {"includeThoughts": True, "thinkingLevel": "HIGH"}),
        ("gemini-2.5-flash", "low", {"includeThoughts": True, "thinkingBudget": 2048}),
        ("gemini-2.5-pro", "max", {"includeThoughts": True, "thinkingBudget": 24576}),
    ],
)
async def test_effort_is_a_thinking_level_or_budget(
    model: str, effort: Any, config: dict[str, Any] | None
) -> None:
    assert thinking_config(model, effort) == config
