"""Web search through each provider's own server-side search, against the loopback servers and
the official SDKs as oracles.

For each wire API: the whole request body with the search tool declared, the reply's search and
citations read into neutral `WebSearch` blocks and `Citation`s (with the notice the user sees and
the searches counted in the usage), the SDK reading the same server output the same way, and the
round trip: the next request sends the search back as the API requires (Anthropic's
`encrypted_content` and `encrypted_index` unchanged, OpenAI's `web_search_call` item and
`url_citation` annotations) or not at all (Gemini grounding, another provider's search).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pydantic
import pytest
from google import genai
from google.genai import types as gtypes

from keel.llm.events import Done, Notice, StreamEvent, TextDelta
from keel.llm.http import HTTPSettings
from keel.llm.messages import (
    Citation,
    Message,
    SearchResult,
    Text,
    ToolUse,
    Usage,
    WebSearch,
    message_from_json,
    message_to_json,
    user,
)
from keel.llm.providers import anthropic as anthropic_adapter
from keel.llm.providers import openai_responses as openai_adapter
from keel.llm.providers.anthropic import AnthropicProvider
from keel.llm.providers.gemini import GeminiProvider
from keel.llm.providers.openai_responses import OpenAIResponsesProvider
from keel.llm.request import Request, ToolSpec, WebSearchOptions
from keel.testing.anthropic_server import AnthropicServer
from keel.testing.gemini_server import GeminiServer
from keel.testing.openai_server import OpenAIResponsesServer
from keel.testing.script import Reply
from tests.helpers import body

KEY = "sk-test-key"
SYSTEM = "You are keel."
READ_SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
READ = ToolSpec("read", "Read a file.", READ_SCHEMA)

#: Opaque provider data with everything that could be mangled on the way: JSON escapes, non-ASCII,
#: base64 padding, a lone surrogate would not survive a UTF-8 file, so not that.
ENCRYPTED = 'EqMDCioIAhgB"\\/+=é\u2028\nZ' * 40
INDEX = "Eo8BCioIAhgBIiQ5ZTQ2+/=="


async def collect(provider: Any, request: Request) -> list[StreamEvent]:
    return [event async for event in provider.stream(request)]


# -- the neutral form ----------------------------------------------------------------------------


def test_search_blocks_round_trip_through_the_journal_form_as_format_2() -> None:
    message = Message(
        "assistant",
        (
            WebSearch(
                "srvtoolu_1",
                "keel agent",
                (SearchResult("https://a.example/", "A", "2 days ago", ENCRYPTED),),
                source="anthropic",
            ),
            WebSearch("ws_2", action="open_page", url="https://b.example/", source="openai"),
            WebSearch("srvtoolu_3", "x", status="failed", error="max_uses_exceeded"),
            Text("Cited.", (Citation("https://a.example/", "A", "cited", INDEX, source="x"),)),
            Text("Spanned.", (Citation("https://b.example/", start=0, end=7),)),
        ),
        "anthropic",
        "claude-sonnet-4-5",
    )
    data = json.loads(json.dumps(message_to_json(message)))
    assert data["v"] == 2
    assert data["content"][0] == {
        "type": "web_search",
        "id": "srvtoolu_1",
        "query": "keel agent",
        "results": [
            {
                "url": "https://a.example/",
                "title": "A",
                "page_age": "2 days ago",
                "encrypted_content": ENCRYPTED,
            }
        ],
        "status": "completed",
        "source": "anthropic",
    }
    assert message_from_json(data) == message
    # Without searches a message stays format 1, which a keel before web search reads.
    plain = Message("assistant", (Text("hi"),))
    assert message_to_json(plain)["v"] == 1
    assert message_from_json(message_to_json(plain)) == plain
    assert Usage.from_json(Usage(1, 2, 3, 4, 5).to_json()) == Usage(1, 2, 3, 4, 5)
    assert Usage(1, 2, 3, 4).to_json() == {
        "input": 1,
        "output": 2,
        "cache_read": 3,
        "cache_write": 4,
    }


# -- Anthropic -----------------------------------------------------------------------------------

A_MODEL = "claude-haiku-4-5"
A_SEARCH = WebSearch(
    "srvtoolu_01WYG3ziw53XMcoyKL4XcZmE",
    "keel coding agent",
    (
        SearchResult("https://keel.example/docs", "keel docs", "April 30, 2025", ENCRYPTED),
        SearchResult("https://blog.example/keel", "A post", "", ENCRYPTED[::-1]),
    ),
    source="anthropic",
)
A_CITE = Citation(
    "https://keel.example/docs", "keel docs", "keel is a coding agent", INDEX, source="anthropic"
)
A_REPLY = Message(
    "assistant",
    (
        Text("Let me search."),
        A_SEARCH,
        Text("keel is a coding agent", (A_CITE,)),
        Text(" written in Python."),
    ),
    provider="anthropic",
    model=A_MODEL,
)
A_TOOL = {
    "type": "web_search_20250305",
    "name": "web_search",
    "max_uses": 3,
    "cache_control": {"type": "ephemeral"},
}
A_WIRE_CONTENT: list[dict[str, Any]] = [
    {"type": "text", "text": "Let me search."},
    {
        "type": "server_tool_use",
        "id": A_SEARCH.id,
        "name": "web_search",
        "input": {"query": "keel coding agent"},
    },
    {
        "type": "web_search_tool_result",
        "tool_use_id": A_SEARCH.id,
        "content": [
            {
                "type": "web_search_result",
                "url": "https://keel.example/docs",
                "title": "keel docs",
                "encrypted_content": ENCRYPTED,
                "page_age": "April 30, 2025",
            },
            {
                "type": "web_search_result",
                "url": "https://blog.example/keel",
                "title": "A post",
                "encrypted_content": ENCRYPTED[::-1],
                "page_age": None,
            },
        ],
    },
    {
        "type": "text",
        "text": "keel is a coding agent",
        "citations": [
            {
                "type": "web_search_result_location",
                "url": "https://keel.example/docs",
                "title": "keel docs",
                "encrypted_index": INDEX,
                "cited_text": "keel is a coding agent",
            }
        ],
    },
    {"type": "text", "text": " written in Python."},
]


@pytest.fixture
def a_server() -> Iterator[AnthropicServer]:
    with AnthropicServer(api_key=KEY) as srv:
        yield srv
    assert srv.errors == []


@pytest.fixture
async def a_provider(a_server: AnthropicServer) -> AsyncIterator[AnthropicProvider]:
    client = AnthropicProvider(
        base_url=a_server.url, api_key=KEY, settings=HTTPSettings(stall_timeout=10)
    )
    yield client
    await client.aclose()


def a_request(*messages: Message, search: WebSearchOptions | None) -> Request:
    return Request(
        model=A_MODEL,
        system=SYSTEM,
        messages=messages,
        tools=(READ,),
        web_search=search,
        max_tokens=2048,
    )


async def test_anthropic_search_is_declared_read_and_sent_back_unchanged(
    a_server: AnthropicServer, a_provider: AnthropicProvider
) -> None:
    usage = Usage(input=50, output=30, web_searches=1)
    a_server.add(Reply(A_REPLY, usage=usage), Reply(Message("assistant", (Text("Welcome."),))))
    search = WebSearchOptions(max_uses=3)
    first = user("What is keel?")
    events = await collect(a_provider, a_request(first, search=search))

    assert events == [
        TextDelta("Let m"),
        TextDelta("e sea"),
        TextDelta("rch."),
        Notice("web search 'keel coding agent': 2 results", "info"),
        TextDelta("keel is "),
        TextDelta("a coding"),
        TextDelta(" agent"),
        TextDelta(" writte"),
        TextDelta("n in Py"),
        TextDelta("thon."),
        Done(A_REPLY, usage, "end_turn"),
    ]
    sent = a_server.model_requests[0].json
    assert sent == {
        "model": A_MODEL,
        "max_tokens": 2048,
        "stream": True,
        "system": [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}],
        "tools": [
            {"name": "read", "description": "Read a file.", "input_schema": READ_SCHEMA},
            A_TOOL,
        ],
        "messages": [
            {
                "role": "user",
                "content": [
                    {
                        "type": "text",
                        "text": "What is keel?",
                        "cache_control": {"type": "ephemeral"},
                    }
                ],
            }
        ],
    }

    # The next request carries the search and the citations back exactly as they came.
    done = events[-1]
    assert isinstance(done, Done)
    await collect(a_provider, a_request(first, done.message, user("Thanks."), search=search))
    replayed = a_server.model_requests[1].json["messages"][1]
    assert replayed["role"] == "assistant"
    assert replayed["content"] == A_WIRE_CONTENT
    # The same bytes whatever the journal did in between.
    again = message_from_json(json.loads(json.dumps(message_to_json(done.message))))
    assert again == A_REPLY
    assert anthropic_adapter.encode_message(again) == anthropic_adapter.encode_message(A_REPLY)


def test_anthropic_wire_blocks_are_the_sdk_types() -> None:
    import anthropic.types as sdk

    # keel's declaration and replayed blocks validate as the SDK's request parameter types.
    tool = anthropic_adapter.web_search_tool(
        WebSearchOptions(max_uses=2, blocked_domains=("spam.example",))
    )
    assert tool == {
        "type": "web_search_20250305",
        "name": "web_search",
        "max_uses": 2,
        "blocked_domains": ["spam.example"],
    }
    pydantic.TypeAdapter(sdk.WebSearchTool20250305Param).validate_python(tool)
    wire = json.loads(anthropic_adapter.encode_message(A_REPLY))
    assert wire == {"role": "assistant", "content": A_WIRE_CONTENT}
    # The SDK's block models read every replayed block (requests and responses share the shape).
    assert sdk.ServerToolUseBlock.model_validate(A_WIRE_CONTENT[1]).input == {
        "query": "keel coding agent"
    }
    result = sdk.WebSearchToolResultBlock.model_validate(A_WIRE_CONTENT[2])
    assert isinstance(result.content, list)
    assert [r.encrypted_content for r in result.content] == [ENCRYPTED, ENCRYPTED[::-1]]
    cited = sdk.TextBlock.model_validate(A_WIRE_CONTENT[3])
    assert [c.model_dump() for c in cited.citations or ()] == A_WIRE_CONTENT[3]["citations"]


async def test_anthropic_sdk_reads_the_fake_as_keel_does(
    a_server: AnthropicServer, a_provider: AnthropicProvider
) -> None:
    import anthropic
    import anthropic.types as sdk

    usage = Usage(input=50, output=30, web_searches=1)
    step = Reply(A_REPLY, usage=usage)
    a_server.add(step, step, step)
    request = a_request(user("What is keel?"), search=WebSearchOptions(max_uses=3))
    events = await collect(a_provider, request)
    keel_body = json.loads(a_provider.build_body(request))
    params = {k: v for k, v in keel_body.items() if k != "stream"}
    with anthropic.Anthropic(base_url=a_server.url, api_key=KEY, max_retries=0) as client:
        with client.messages.stream(**params) as stream:
            streamed = stream.get_final_message()
        created = client.messages.create(**params)
    for message in (streamed, created):
        blocks = message.content
        kinds = [sdk.TextBlock, sdk.ServerToolUseBlock, sdk.WebSearchToolResultBlock]
        kinds += [sdk.TextBlock, sdk.TextBlock]
        assert len(blocks) == len(kinds)
        assert all(isinstance(b, kind) for b, kind in zip(blocks, kinds, strict=True))
        use, result, cited = blocks[1], blocks[2], blocks[3]
        assert isinstance(use, sdk.ServerToolUseBlock)
        assert isinstance(result, sdk.WebSearchToolResultBlock)
        assert isinstance(cited, sdk.TextBlock)
        assert isinstance(result.content, list)
        sdk_search = WebSearch(
            use.id,
            str(use.input["query"]),
            tuple(
                SearchResult(r.url, r.title, r.page_age or "", r.encrypted_content)
                for r in result.content
            ),
            source="anthropic",
        )
        citations = tuple(
            Citation(c.url, c.title or "", c.cited_text, c.encrypted_index, source="anthropic")
            for c in cited.citations or ()
            if isinstance(c, sdk.CitationsWebSearchResultLocation)
        )
        assert message.usage.server_tool_use is not None
        assert message.usage.server_tool_use.web_search_requests == 1
        assert (sdk_search, citations) == (A_SEARCH, (A_CITE,))
    done = events[-1]
    assert isinstance(done, Done)
    assert done.message == A_REPLY
    assert done.usage.web_searches == 1


async def test_anthropic_failed_search_and_a_reply_cut_before_the_results(
    a_server: AnthropicServer, a_provider: AnthropicProvider
) -> None:
    failed = WebSearch(
        "srvtoolu_2", "too much", status="failed", error="max_uses_exceeded", source="anthropic"
    )
    pending = WebSearch("srvtoolu_3", "later", status="in_progress", source="anthropic")
    reply = Message("assistant", (failed, pending), provider="anthropic", model=A_MODEL)
    a_server.add(Reply(reply, stop_reason="pause_turn"), Reply(Message("assistant", (Text("ok"),))))
    search = WebSearchOptions()
    events = await collect(a_provider, a_request(user("q"), search=search))
    assert events == [
        Notice("web search 'too much' failed (max_uses_exceeded)", "warning"),
        Done(reply, Usage(input=100, output=20), "pause_turn"),
    ]
    # A paused turn goes back as it is: the error result, and the call still waiting for its.
    await collect(a_provider, a_request(user("q"), reply, search=search))
    content = a_server.model_requests[1].json["messages"][1]["content"]
    content[-1].pop("cache_control")
    assert content == [
        {
            "type": "server_tool_use",
            "id": "srvtoolu_2",
            "name": "web_search",
            "input": {"query": "too much"},
        },
        {
            "type": "web_search_tool_result",
            "tool_use_id": "srvtoolu_2",
            "content": {"type": "web_search_tool_result_error", "error_code": "max_uses_exceeded"},
        },
        {
            "type": "server_tool_use",
            "id": "srvtoolu_3",
            "name": "web_search",
            "input": {"query": "later"},
        },
    ]
    assert a_server.model_requests[0].json["tools"][-1] == {
        "type": "web_search_20250305",
        "name": "web_search",
        "cache_control": {"type": "ephemeral"},
    }


def test_no_search_tool_without_the_option_or_beside_a_tool_of_that_name() -> None:
    plain = json.loads(anthropic_adapter.encode_head(a_request(search=None)) + b"]}")
    assert [t["name"] for t in plain["tools"]] == ["read"]
    clash = Request(
        model=A_MODEL,
        system="",
        messages=(),
        tools=(ToolSpec("web_search", "An MCP server's search.", READ_SCHEMA),),
        web_search=WebSearchOptions(),
    )
    head = json.loads(anthropic_adapter.encode_head(clash) + b"]}")
    assert [t.get("type") for t in head["tools"]] == [None]


def test_another_providers_search_is_not_replayed_but_its_answer_is() -> None:
    openai_search = WebSearch("ws_1", "q", (SearchResult("https://x.example/"),), source="openai")
    cite = Citation("https://x.example/", "X", start=0, end=3, source="openai")
    message = Message("assistant", (openai_search, Text("Yes.", (cite,))), provider="openai")
    assert json.loads(anthropic_adapter.encode_message(message)) == {
        "role": "assistant",
        "content": [{"type": "text", "text": "Yes."}],
    }
    a_message = Message("assistant", (A_SEARCH, Text("keel", (A_CITE,))), provider="anthropic")
    assert json.loads(openai_adapter.encode_items(a_message)) == {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "keel"}],
    }


# -- OpenAI Responses ----------------------------------------------------------------------------

O_SEARCH = WebSearch(
    "ws_67c9fa0502748190b7dd390736892e100be649c1a5ff9609",
    "keel coding agent",
    (SearchResult("https://keel.example/docs"), SearchResult("https://blog.example/keel")),
    source="openai",
)
O_CITE = Citation("https://keel.example/docs", "keel docs", start=0, end=22, source="openai")
O_OPEN = WebSearch("ws_2", action="open_page", url="https://keel.example/docs", source="openai")


@pytest.fixture
def o_server() -> Iterator[OpenAIResponsesServer]:
    with OpenAIResponsesServer(api_key=KEY) as srv:
        yield srv
    assert srv.errors == []


@pytest.fixture
async def o_provider(o_server: OpenAIResponsesServer) -> AsyncIterator[OpenAIResponsesProvider]:
    client = OpenAIResponsesProvider(
        base_url=o_server.url + "/v1", api_key=KEY, settings=HTTPSettings(stall_timeout=10)
    )
    yield client
    await client.aclose()


def o_reply(model: str) -> Message:
    return Message(
        "assistant",
        (O_SEARCH, O_OPEN, Text("keel is a coding agent in Python.", (O_CITE,))),
        provider="openai",
        model=model,
    )


async def test_openai_search_is_declared_read_and_replayed(
    o_server: OpenAIResponsesServer, o_provider: OpenAIResponsesProvider
) -> None:
    reply = o_reply("gpt-5")
    o_server.add(
        Reply(reply, usage=Usage(input=10, output=5)), Reply(Message("assistant", (Text("ok"),)))
    )
    search = WebSearchOptions(allowed_domains=("keel.example",), max_uses=4)
    request = Request(
        model="gpt-5",
        system=SYSTEM,
        messages=(user("What is keel?"),),
        tools=(READ,),
        web_search=search,
    )
    events = await collect(o_provider, request)
    assert events == [
        Notice("web search 'keel coding agent': 2 sources"),
        Notice("web search: open page https://keel.example/docs"),
        TextDelta("keel is a c"),
        TextDelta("oding agent"),
        TextDelta(" in Python."),
        Done(reply, Usage(input=10, output=5, web_searches=1), "end_turn"),
    ]
    assert body(o_server.model_requests[0]) == {
        "model": "gpt-5",
        "instructions": SYSTEM,
        "tools": [
            {
                "type": "function",
                "name": "read",
                "description": "Read a file.",
                "parameters": READ_SCHEMA,
                "strict": False,
            },
            {"type": "web_search", "filters": {"allowed_domains": ["keel.example"]}},
        ],
        "input": [
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "What is keel?"}],
            }
        ],
        "store": False,
        "stream": True,
        "include": ["reasoning.encrypted_content", "web_search_call.action.sources"],
        "max_output_tokens": 16000,
    }
    done = events[-1]
    assert isinstance(done, Done)
    follow = Request(
        model="gpt-5",
        system=SYSTEM,
        tools=(READ,),
        web_search=search,
        messages=(user("What is keel?"), done.message, user("Thanks.")),
    )
    await collect(o_provider, follow)
    replayed = body(o_server.model_requests[1])["input"][1:4]
    assert replayed == [
        {
            "type": "web_search_call",
            "id": O_SEARCH.id,
            "status": "completed",
            "action": {
                "type": "search",
                "query": "keel coding agent",
                "sources": [
                    {"type": "url", "url": "https://keel.example/docs"},
                    {"type": "url", "url": "https://blog.example/keel"},
                ],
            },
        },
        {
            "type": "web_search_call",
            "id": "ws_2",
            "status": "completed",
            "action": {"type": "open_page", "url": "https://keel.example/docs"},
        },
        {
            "type": "message",
            "role": "assistant",
            "content": [
                {
                    "type": "output_text",
                    "text": "keel is a coding agent in Python.",
                    "annotations": [
                        {
                            "type": "url_citation",
                            "start_index": 0,
                            "end_index": 22,
                            "url": "https://keel.example/docs",
                            "title": "keel docs",
                        }
                    ],
                }
            ],
        },
    ]
    from openai.types.responses import ResponseFunctionWebSearch, ResponseOutputText

    # The SDK's models read the replayed items (the input and output shapes are the same).
    for item in replayed[:2]:
        assert ResponseFunctionWebSearch.model_validate(item).model_dump(exclude_none=True) == item
    part = replayed[2]["content"][0]
    assert ResponseOutputText.model_validate(part).model_dump(exclude_none=True) == part


async def test_openai_sdk_reads_the_fake_as_keel_does(
    o_server: OpenAIResponsesServer, o_provider: OpenAIResponsesProvider
) -> None:
    import openai
    from openai.types.responses import ResponseFunctionWebSearch, ResponseOutputMessage

    reply = o_reply("gpt-5")
    o_server.add(Reply(reply), Reply(reply), Reply(reply))
    request = Request(
        model="gpt-5", system="", messages=(user("hi"),), web_search=WebSearchOptions()
    )
    events = await collect(o_provider, request)
    include: Any = ["web_search_call.action.sources"]
    with openai.OpenAI(base_url=o_server.url + "/v1", api_key=KEY, max_retries=0) as client:
        with client.responses.stream(
            model="gpt-5", input="hi", tools=[{"type": "web_search"}], include=include
        ) as stream:
            list(stream)
            final = stream.get_final_response()
        plain = client.responses.create(
            model="gpt-5", input="hi", tools=[{"type": "web_search"}], include=include
        )
    done = events[-1]
    assert isinstance(done, Done)
    for response in (final, plain):
        blocks: list[Any] = []
        for item in response.output:
            if isinstance(item, ResponseFunctionWebSearch):
                action = item.action
                if action.type == "search":
                    results = tuple(SearchResult(s.url) for s in action.sources or ())
                    blocks.append(
                        WebSearch(
                            item.id, action.query or "", results, item.status, source="openai"
                        )
                    )
                else:
                    assert action.type == "open_page"
                    blocks.append(
                        WebSearch(
                            item.id, action="open_page", url=action.url or "", source="openai"
                        )
                    )
            else:
                assert isinstance(item, ResponseOutputMessage)
                part = item.content[0]
                assert part.type == "output_text"
                cites = tuple(
                    Citation(a.url, a.title, start=a.start_index, end=a.end_index, source="openai")
                    for a in part.annotations
                    if a.type == "url_citation"
                )
                blocks.append(Text(part.text, cites))
        assert tuple(blocks) == done.message.blocks


def test_openai_web_search_tool_is_the_sdk_type() -> None:
    from openai.types.responses import WebSearchTool

    plain = openai_adapter.web_search_tool(WebSearchOptions())
    narrowed = openai_adapter.web_search_tool(WebSearchOptions(allowed_domains=("a.example",)))
    assert plain == {"type": "web_search"}
    assert WebSearchTool.model_validate(narrowed).model_dump(exclude_none=True) == narrowed


# -- Gemini --------------------------------------------------------------------------------------

G_MODEL = "gemini-3-pro-preview"


@pytest.fixture
def g_server() -> Iterator[GeminiServer]:
    with GeminiServer(api_key=KEY) as srv:
        yield srv
    assert srv.errors == []


@pytest.fixture
async def g_provider(g_server: GeminiServer) -> AsyncIterator[GeminiProvider]:
    client = GeminiProvider(
        base_url=g_server.url, api_key=KEY, settings=HTTPSettings(stall_timeout=10)
    )
    yield client
    await client.aclose()


def g_reply(response_id: str) -> Message:
    search = WebSearch(
        response_id,
        "keel coding agent",
        (
            SearchResult(
                "https://vertexaisearch.example/grounding-api-redirect/AbC", "keel.example"
            ),
            SearchResult(
                "https://vertexaisearch.example/grounding-api-redirect/DeF", "blog.example"
            ),
        ),
        source="gemini",
    )
    cites = (
        Citation(
            search.results[0].url,
            "keel.example",
            "keel is a coding agent",
            start=0,
            end=22,
            source="gemini",
        ),
        Citation(
            search.results[1].url,
            "blog.example",
            "in Python",
            start=23,
            end=32,
            source="gemini",
        ),
    )
    return Message(
        "assistant",
        (search, Text("keel is a coding agent in Python.", cites)),
        provider="gemini",
        model=G_MODEL,
    )


async def test_gemini_grounding_is_declared_read_and_not_replayed(
    g_server: GeminiServer, g_provider: GeminiProvider
) -> None:
    reply = g_reply("resp-000001")
    g_server.add(Reply(reply), Reply(Message("assistant", (Text("ok"),))))
    search = WebSearchOptions()
    first = user("What is keel?")
    request = Request(
        model=G_MODEL,
        system=SYSTEM,
        messages=(first,),
        tools=(READ,),
        web_search=search,
        max_tokens=4096,
    )
    events = await collect(g_provider, request)
    assert events == [
        TextDelta("keel is a c"),
        TextDelta("oding agent"),
        TextDelta(" in Python."),
        Notice("web search 'keel coding agent': 2 sources"),
        Done(reply, Usage(input=100, output=20, web_searches=1), "end_turn"),
    ]
    assert body(g_server.model_requests[0]) == {
        "systemInstruction": {"parts": [{"text": SYSTEM}]},
        "tools": [
            {
                "functionDeclarations": [
                    {
                        "name": "read",
                        "description": "Read a file.",
                        "parametersJsonSchema": READ_SCHEMA,
                    }
                ]
            },
            {"google_search": {}},
        ],
        "contents": [{"role": "user", "parts": [{"text": "What is keel?"}]}],
        "generationConfig": {"maxOutputTokens": 4096},
    }
    done = events[-1]
    assert isinstance(done, Done)
    follow = Request(
        model=G_MODEL,
        system=SYSTEM,
        tools=(READ,),
        web_search=search,
        max_tokens=4096,
        messages=(first, done.message, user("Thanks.")),
    )
    await collect(g_provider, follow)
    assert body(g_server.model_requests[1])["contents"][1] == {
        "role": "model",
        "parts": [{"text": "keel is a coding agent in Python."}],
    }


async def test_gemini_sdk_declares_and_reads_grounding_as_keel_does(
    g_server: GeminiServer, g_provider: GeminiProvider
) -> None:
    g_server.add(Reply(g_reply("x")), Reply(g_reply("x")))
    request = Request(
        model=G_MODEL,
        system="",
        messages=(user("hi"),),
        web_search=WebSearchOptions(),
        max_tokens=4096,
    )
    [*_, done] = await collect(g_provider, request)
    assert isinstance(done, Done)
    ours = body(g_server.model_requests[0])
    options = gtypes.HttpOptions(
        base_url=g_server.url,
        api_version="v1beta",
        retry_options=gtypes.HttpRetryOptions(attempts=1),
    )
    client = genai.Client(api_key=KEY, http_options=options)
    config = gtypes.GenerateContentConfig(
        tools=[gtypes.Tool(google_search=gtypes.GoogleSearch())], max_output_tokens=4096
    )
    chunks = list(
        client.models.generate_content_stream(model=G_MODEL, contents="hi", config=config)
    )
    sent = body(g_server.model_requests[1])
    # The SDK spells the tool in camelCase; the API takes both spellings.
    assert sent["tools"] == [{"googleSearch": {}}]
    assert ours["tools"] == [{"google_search": {}}]
    assert {k: v for k, v in sent.items() if k != "tools"} == {
        k: v for k, v in ours.items() if k != "tools"
    }
    grounded = [
        c.candidates[0].grounding_metadata
        for c in chunks
        if c.candidates and c.candidates[0].grounding_metadata
    ]
    assert len(grounded) == 1
    meta = grounded[0]
    assert meta is not None
    assert meta.grounding_chunks is not None
    search, text = done.message.blocks
    assert isinstance(search, WebSearch)
    assert isinstance(text, Text)
    assert meta.web_search_queries == [search.query]
    assert [(c.web.uri, c.web.title) for c in meta.grounding_chunks if c.web] == [
        (r.url, r.title) for r in search.results
    ]
    supports = [
        (
            meta.grounding_chunks[i].web.uri if meta.grounding_chunks[i].web else None,  # type: ignore[union-attr]
            s.segment.text,  # type: ignore[union-attr]
            s.segment.start_index,  # type: ignore[union-attr]
            s.segment.end_index,  # type: ignore[union-attr]
        )
        for s in meta.grounding_supports or ()
        for i in s.grounding_chunk_indices or ()
    ]
    assert supports == [(c.url, c.cited_text, c.start, c.end) for c in text.citations]


# -- end to end: keel -p ---------------------------------------------------------------------------


def run_keel(
    args: list[str], project: Path, server: AnthropicServer
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ANTHROPIC_API_KEY": KEY, "ANTHROPIC_BASE_URL": server.url}
    return subprocess.run(
        [sys.executable, "-m", "keel", "-p", "What is keel?", *args],
        cwd=project,
        input="",
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def search_then_glob() -> list[Reply]:
    """A search, a cited sentence and a tool call; then the answer."""
    first = Message(
        "assistant",
        (
            A_SEARCH,
            Text("keel is a coding agent", (A_CITE,)),
            ToolUse("toolu_1", "glob", {"pattern": "*.py"}),
        ),
    )
    return [
        Reply(first, usage=Usage(input=50, output=30, web_searches=1)),
        Reply(
            Message(
                "assistant",
                (Text("keel is a coding agent; this project has two files.", (A_CITE,)),),
            )
        ),
    ]


def test_keel_p_offers_search_shows_it_and_sends_it_back(project: Path, isolated_env: Path) -> None:
    with AnthropicServer(api_key=KEY) as server:
        server.add(*search_then_glob())
        out = run_keel(
            ["--model", "anthropic/claude-sonnet-4-5", "--output-format", "text"], project, server
        )
        bodies = [r.json for r in server.model_requests]
        assert server.errors == []
    assert out.returncode == 0, out.stderr
    assert out.stdout == (
        "keel is a coding agent; this project has two files.\n"
        "\n"
        "Sources:\n"
        "  [1] keel docs — https://keel.example/docs\n"
    )
    assert "keel: web search 'keel coding agent': 2 results" in out.stderr.splitlines()
    first, second = bodies
    # Among keel's tools where its name sorts; the cache breakpoint stays on the last one.
    names = [t["name"] for t in first["tools"]]
    assert names == sorted(names)
    assert names[-2:] == ["web_search", "write"]
    assert first["tools"][-2] == {"type": "web_search_20250305", "name": "web_search"}
    assert second["tools"] == first["tools"]  # fixed for the context: the prefix stays stable
    sent_back = second["messages"][1]
    assert sent_back["role"] == "assistant"
    assert sent_back["content"] == [
        A_WIRE_CONTENT[1],
        A_WIRE_CONTENT[2],
        A_WIRE_CONTENT[3],
        {"type": "tool_use", "id": "toolu_1", "name": "glob", "input": {"pattern": "*.py"}},
    ]
    # The journal keeps the search whole (format 2), so a resume sends the same bytes again.
    [session] = list((isolated_env).rglob("*.jsonl"))
    # Split on newlines only: the search's opaque content holds a U+2028, which is no line end
    # to the journal (str.splitlines would cut there).
    lines = session.read_bytes().split(b"\n")
    records = [json.loads(line) for line in lines if line]
    assistants = [r for r in records if r["type"] == "assistant"]
    stored = message_from_json(assistants[0]["message"])
    assert assistants[0]["message"]["v"] == 2
    assert stored.blocks[0] == A_SEARCH
    assert assistants[0]["usage"]["web_searches"] == 1
    # $10 per 1,000 searches on top of the tokens.
    assert assistants[0]["cost"] == pytest.approx((50 * 3.0 + 30 * 15.0) / 1e6 + 0.01)
    shown = subprocess.run(
        [sys.executable, "-m", "keel", "sessions", "show", session.stem],
        cwd=project,
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=60,
        check=True,
    )
    assert "    (web search) keel coding agent: 2 results" in shown.stdout.splitlines()


def test_a_project_file_may_turn_search_off_but_never_back_on(
    project: Path, isolated_env: Path
) -> None:
    from keel.config.settings import load_settings

    user_dir = isolated_env / "config"
    user_dir.mkdir(parents=True, exist_ok=True)
    (user_dir / "settings.json").write_text(
        json.dumps({"web_search": {"enabled": False, "max_uses": 3}}), encoding="utf-8"
    )
    shared = project / ".keel"
    shared.mkdir()
    attack = {"web_search": {"enabled": True, "max_uses": 50, "allowed_domains": ["evil.example"]}}
    (shared / "settings.json").write_text(json.dumps(attack), encoding="utf-8")
    settings = load_settings(project)
    assert (settings.web_search, settings.web_search_max_uses) == (False, 3)
    assert any("only your own settings may turn web search on" in w for w in settings.warnings)
    # With the user's settings silent, the project may narrow what is on by default.
    (user_dir / "settings.json").write_text("{}", encoding="utf-8")
    (shared / "settings.json").write_text(
        json.dumps({"web_search": {"max_uses": 2, "blocked_domains": ["ads.example"]}}),
        encoding="utf-8",
    )
    settings = load_settings(project)
    assert settings.web_search is True
    assert settings.web_search_max_uses == 2
    assert settings.web_search_blocked_domains == ("ads.example",)
    (shared / "settings.json").write_text(json.dumps({"web_search": False}), encoding="utf-8")
    assert load_settings(project).web_search is False


@pytest.mark.parametrize(
    ("args", "settings", "notice"),
    [
        (["--disallowed-tools", "WebSearch"], None, None),
        (["--disallowed-tools", "web_search"], None, None),
        ([], {"web_search": False}, None),
        (
            [],
            {"permissions": {"ask": ["WebSearch"]}},
            "keel: warning: web search is off: the ask rule web_search (",
        ),
    ],
)
def test_a_deny_rule_an_ask_rule_or_the_setting_takes_search_away(
    project: Path,
    isolated_env: Path,
    args: list[str],
    settings: dict[str, Any] | None,
    notice: str | None,
) -> None:
    if settings is not None:
        config = isolated_env / "config"
        config.mkdir(parents=True, exist_ok=True)
        (config / "settings.json").write_text(json.dumps(settings), encoding="utf-8")
    with AnthropicServer(api_key=KEY) as server:
        server.add(Reply(Message("assistant", (Text("No search."),))))
        out = run_keel(["--model", "anthropic/claude-sonnet-4-5", *args], project, server)
        [sent] = [r.json for r in server.model_requests]
    assert out.returncode == 0, out.stderr
    assert [t.get("type") for t in sent["tools"] if "type" in t] == []
    warned = [line for line in out.stderr.splitlines() if "web search is off" in line]
    if notice is None:
        assert warned == []
    else:
        assert len(warned) == 1
        assert warned[0].startswith(notice)


def test_domain_rules_become_blocked_domains(project: Path, isolated_env: Path) -> None:
    config = isolated_env / "config"
    config.mkdir(parents=True, exist_ok=True)
    settings = {
        "permissions": {"deny": ["WebSearch(domain:spam.example)"]},
        "web_search": {"max_uses": 4, "blocked_domains": ["ads.example"]},
    }
    (config / "settings.json").write_text(json.dumps(settings), encoding="utf-8")
    with AnthropicServer(api_key=KEY) as server:
        server.add(Reply(Message("assistant", (Text("ok"),))))
        out = run_keel(["--model", "anthropic/claude-sonnet-4-5"], project, server)
        [sent] = [r.json for r in server.model_requests]
    assert out.returncode == 0, out.stderr
    assert sent["tools"][-2] == {
        "type": "web_search_20250305",
        "name": "web_search",
        "max_uses": 4,
        "blocked_domains": ["ads.example", "spam.example"],
    }


# -- the terminal UI -------------------------------------------------------------------------------


async def test_tui_shows_the_search_and_the_sources_under_the_answer(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from keel.testing import ScriptedProvider
    from keel.tui.app import KeelApp
    from keel.tui.widgets import NoticeLine
    from tests.tui_helpers import MODEL, make_controller

    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    answer = Message("assistant", (A_SEARCH, Text("keel is a coding agent", (A_CITE,))))
    provider = ScriptedProvider([Reply(answer)], model=MODEL.model)
    controller = await make_controller(project, provider)
    app = KeelApp(controller)
    async with app.run_test(size=(100, 36)) as pilot:
        app.prompt.load_text("What is keel?")
        await pilot.press("enter")
        await app.idle()
        await pilot.pause()
        notices = [str(n.render()) for n in app.query(NoticeLine)]
    assert "· Sources:\n  [1] keel docs — https://keel.example/docs" in notices


# -- subagents ---------------------------------------------------------------------------------


async def test_a_subagent_on_the_parents_model_searches_as_the_parent_does(project: Path) -> None:
    from keel.agent.loop import Agent
    from keel.agent.subagents import enable_subagents, load_agent_types
    from keel.llm.script import reply
    from keel.permissions import AllowAll
    from keel.testing.routing import RoutedProvider
    from keel.tools.builtin import builtin_tools

    def task(prompt: str, kind: str) -> tuple[str, dict[str, Any]]:
        return ("task", {"description": "job", "prompt": prompt, "subagent_type": kind})

    parent_prompt = "PARENT: what is keel?"
    provider = RoutedProvider(
        {
            parent_prompt: [
                reply("", task("EXPLORE: look it up", "explore"), task("READER: read", "reader")),
                reply("Done."),
            ],
            "EXPLORE": [reply("keel is a coding agent.")],
            "READER": [reply("Read.")],
        }
    )
    agent = Agent(
        provider=provider,
        model="scripted",
        tools=builtin_tools(),
        cwd=project,
        system="parent",
        gate=AllowAll(),
    )
    agent.web_search = WebSearchOptions(max_uses=2)
    agents = project / ".claude" / "agents"
    agents.mkdir(parents=True)
    (agents / "reader.md").write_text(
        "---\nname: reader\ndescription: Reads files.\ntools: Read, Grep\n---\nRead.\n",
        encoding="utf-8",
    )
    enable_subagents(agent, load_agent_types(project, user_dir=None, home=project / "no-home"))
    try:
        result = await agent.run(parent_prompt)
    finally:
        await agent.aclose()
    assert result.text == "Done."
    assert [r.web_search for r in provider.of(parent_prompt)] == [WebSearchOptions(max_uses=2)] * 2
    # explore lists web_search among its tools; reader's `tools:` does not name it.
    assert [r.web_search for r in provider.of("EXPLORE")] == [WebSearchOptions(max_uses=2)]
    assert [r.web_search for r in provider.of("READER")] == [None]
