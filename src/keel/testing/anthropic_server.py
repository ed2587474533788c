"""A loopback fake of Anthropic's Messages API (`POST /v1/messages`, `GET /v1/models`).

This module owns rendering a script's `Reply` and `Fault` steps exactly as the real API sends
them: the SSE event sequence of a streamed message, the Message JSON of a non-streamed one, and
Anthropic's error bodies (a `status` fault after some events becomes an `error` event mid-stream,
as the API reports overload). It also rejects malformed requests with the 400 the API would give,
so a client that builds a bad body fails loudly.

It must never bind anything but 127.0.0.1 and never import keel's Anthropic client: it is an
independent implementation of the wire format, cross-checked against the official SDK in tests.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Final

from keel.llm.messages import Citation, Message, Text, Thinking, ToolUse, Usage, WebSearch
from keel.testing.script import Fault, Reply, Step
from keel.testing.server import (
    RecordedRequest,
    Responder,
    ResponseWriter,
    ScriptedHTTPServer,
)

#: Deltas a text, thinking or tool-input string is split into.
DELTA_PIECES: Final = 3

_ERROR_TYPES: Final[Mapping[int, str]] = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}

#: `GET /v1/models`: (id, display name, context window, max output). Release dates are the epoch,
#: as the API reports an unknown one.
MODELS: Final = (
    ("claude-opus-5", "Claude Opus 5", 1_000_000, 128_000),
    ("claude-sonnet-5", "Claude Sonnet 5", 1_000_000, 128_000),
    ("claude-haiku-4-5", "Claude Haiku 4.5", 200_000, 64_000),
)

_TOP_LEVEL_KEYS: Final = frozenset(
    {
        "model",
        "max_tokens",
        "messages",
        "system",
        "tools",
        "tool_choice",
        "stream",
        "temperature",
        "top_p",
        "top_k",
        "stop_sequences",
        "metadata",
        "thinking",
        "output_config",
        "service_tier",
    }
)
_MAX_BREAKPOINTS: Final = 4


def pieces(text: str, count: int = DELTA_PIECES) -> list[str]:
    """`text` in at most `count` consecutive non-empty pieces."""
    if not text:
        return []
    size = -(-len(text) // count)
    return [text[i : i + size] for i in range(0, len(text), size)]


class AnthropicServer(ScriptedHTTPServer):
    """Answers `/v1/messages` from a script. With `api_key`, a request must carry it as
    `x-api-key` or `Authorization: Bearer`, or it gets a 401 `authentication_error`.

    `Fault("status", after_events=n)` on a streamed request sends the first `n` events of
    `fault.reply` and then an `error` event, as the API does when it is overloaded mid-stream.
    """

    model_paths = ("/v1/messages",)

    def __init__(
        self,
        script: Iterable[Step] = (),
        *,
        responder: Responder | None = None,
        api_key: str | None = None,
    ) -> None:
        super().__init__(script, responder=responder)
        self.api_key = api_key
        self._ids = itertools.count(1)

    # -- dispatch -----------------------------------------------------------------------------

    async def handle(self, request: RecordedRequest, response: ResponseWriter) -> None:
        if self.api_key is not None and not self._authorized(request):
            await response.send_json(401, self.render_error(401, "invalid x-api-key"))
            return
        if request.path.split("?")[0] in self.model_paths:
            problem = request_problem(request)
            if problem:
                await response.send_json(400, self.render_error(400, problem))
                return
        await super().handle(request, response)

    def _authorized(self, request: RecordedRequest) -> bool:
        headers = request.headers
        return self.api_key in (
            headers.get("x-api-key"),
            headers.get("authorization", "").removeprefix("Bearer "),
        )

    async def handle_other(self, request: RecordedRequest, response: ResponseWriter) -> None:
        path = request.path.split("?")[0]
        models = {info["id"]: info for info in map(_model_info, MODELS)}
        if request.method == "GET" and path == "/v1/models":
            data = list(models.values())
            await response.send_json(
                200,
                {
                    "data": data,
                    "has_more": False,
                    "first_id": data[0]["id"],
                    "last_id": data[-1]["id"],
                },
            )
        elif request.method == "GET" and path.removeprefix("/v1/models/") in models:
            await response.send_json(200, models[path.removeprefix("/v1/models/")])
        else:
            await response.send_json(404, self.render_error(404, f"no route for {request.path}"))

    async def _fault(
        self, fault: Fault, request: RecordedRequest, response: ResponseWriter, streaming: bool
    ) -> None:
        if fault.kind != "status" or not fault.after_events or not streaming:
            await super()._fault(fault, request, response, streaming)
            return
        # Once the stream has started the API can only report an error as an `error` event.
        reply = fault.reply or Reply(Message("assistant", (Text("partial reply, then an error"),)))
        await response.start_stream(headers=self.stream_headers())
        events = self.render_stream(reply, request)
        for event in itertools.islice(events, fault.after_events):
            await response.chunk(event)
        message = fault.message or f"scripted error {fault.status}"
        await response.chunk(self.sse("error", self.render_error(fault.status, message)))
        await response.end_stream()

    # -- rendering ----------------------------------------------------------------------------

    def is_streaming(self, request: RecordedRequest, body: Any) -> bool:
        return isinstance(body, dict) and body.get("stream") is True

    def render_stream(self, step: Reply, request: RecordedRequest) -> Iterator[bytes]:
        sse = self.sse
        skeleton = self._message(step, request, content=[], stop_reason=None)
        skeleton["usage"]["output_tokens"] = 1
        yield sse("message_start", {"type": "message_start", "message": skeleton})
        yield sse("ping", {"type": "ping"})
        blocks = _blocks(step)
        wire = _wire_blocks(blocks)
        for index, block in enumerate(wire):
            cut = step.truncate_tool_json and index == len(wire) - 1
            start, deltas = _streamed_block(block, truncated=cut)
            yield sse(
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": start},
            )
            for delta in deltas:
                yield sse(
                    "content_block_delta",
                    {"type": "content_block_delta", "index": index, "delta": delta},
                )
            yield sse("content_block_stop", {"type": "content_block_stop", "index": index})
        yield sse(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": step.final_stop_reason, "stop_sequence": None},
                "usage": {"output_tokens": step.usage.output},
            },
        )
        yield sse("message_stop", {"type": "message_stop"})

    def render_json(self, step: Reply, request: RecordedRequest) -> Any:
        blocks = _blocks(step)
        content = [_whole_block(block) for block in _wire_blocks(blocks)]
        if step.truncate_tool_json and blocks and isinstance(blocks[-1], ToolUse):
            content[-1]["input"] = {}  # the API sends a cut-off call's input as far as it parsed
        return self._message(step, request, content=content, stop_reason=step.final_stop_reason)

    def render_error(self, status: int, message: str) -> Any:
        error_type = _ERROR_TYPES.get(
            status, "api_error" if status >= 500 else "invalid_request_error"
        )
        return {"type": "error", "error": {"type": error_type, "message": message}}

    def render_overflow(self, message: str) -> Any:
        text = message or "prompt is too long: 210000 tokens > 200000 maximum"
        return {"type": "error", "error": {"type": "invalid_request_error", "message": text}}

    def _message(
        self,
        step: Reply,
        request: RecordedRequest,
        *,
        content: list[dict[str, Any]],
        stop_reason: str | None,
    ) -> dict[str, Any]:
        body = request.json
        return {
            "id": f"msg_fake{next(self._ids):08d}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model", "") if isinstance(body, dict) else "",
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": _usage(step.usage),
        }


def _usage(usage: Usage) -> dict[str, Any]:
    out: dict[str, Any] = {
        "input_tokens": usage.input,
        "cache_creation_input_tokens": usage.cache_write,
        "cache_read_input_tokens": usage.cache_read,
        "output_tokens": usage.output,
    }
    if usage.web_searches:
        out["server_tool_use"] = {
            "web_search_requests": usage.web_searches,
            "web_fetch_requests": 0,
        }
    return out


def _model_info(model: tuple[str, str, int, int]) -> dict[str, Any]:
    model_id, display_name, window, max_output = model
    return {
        "type": "model",
        "id": model_id,
        "display_name": display_name,
        "created_at": "1970-01-01T00:00:00Z",
        "lifecycle": "active",
        "max_input_tokens": window,
        "max_tokens": max_output,
    }


_Blk = Text | Thinking | ToolUse | WebSearch
#: A web search as the API sends it: the call, then (unless cut short) its result block.
_WireBlock = Text | Thinking | ToolUse | tuple[str, WebSearch]


def _wire_blocks(blocks: list[_Blk]) -> list[_WireBlock]:
    out: list[_WireBlock] = []
    for block in blocks:
        if isinstance(block, WebSearch):
            out.append(("server_tool_use", block))
            if block.status != "in_progress":
                out.append(("web_search_tool_result", block))
        else:
            out.append(block)
    return out


def _search_content(block: WebSearch) -> Any:
    if block.status == "failed":
        return {"type": "web_search_tool_result_error", "error_code": block.error}
    return [
        {
            "type": "web_search_result",
            "title": r.title,
            "url": r.url,
            "encrypted_content": r.encrypted_content,
            "page_age": r.page_age or None,
        }
        for r in block.results
    ]


def _citation(c: Citation) -> dict[str, Any]:
    return {
        "type": "web_search_result_location",
        "cited_text": c.cited_text,
        "url": c.url,
        "title": c.title,
        "encrypted_index": c.encrypted_index,
    }


def _blocks(step: Reply) -> list[_Blk]:
    """The reply's blocks as the API would send them: a reply cut off mid tool call (the last
    one, which `truncate_tool_json` cuts) ends with it."""
    blocks: list[_Blk] = []
    for block in step.message.blocks:
        if not isinstance(block, Text | Thinking | ToolUse | WebSearch):
            raise ValueError(f"an assistant reply cannot hold {type(block).__name__} blocks")
        blocks.append(block)
    if step.truncate_tool_json:
        last_tool = max((i for i, b in enumerate(blocks) if isinstance(b, ToolUse)), default=None)
        if last_tool is not None:
            del blocks[last_tool + 1 :]
    return blocks


def _tool_json(block: ToolUse) -> str:
    # The API's own spacing; any valid JSON would do.
    return block.raw_input if block.input is None else json.dumps(block.input)


def _streamed_block(
    block: _WireBlock, *, truncated: bool
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """`content_block_start`'s block and the deltas that fill it in."""
    match block:
        case ("server_tool_use", WebSearch() as search):
            raw = json.dumps({"query": search.query})
            deltas = [{"type": "input_json_delta", "partial_json": f} for f in ["", *pieces(raw)]]
            start: dict[str, Any] = {
                "type": "server_tool_use",
                "id": search.id,
                "name": "web_search",
                "input": {},
            }
            return start, deltas
        case (_, WebSearch() as search):
            # The result arrives whole in its start event, with no deltas.
            return _whole_block(block), []
        case Text(text, citations) if citations:
            # A cited passage: its citations first, then its text.
            cites = [{"type": "citations_delta", "citation": _citation(c)} for c in citations]
            texts = [{"type": "text_delta", "text": p} for p in pieces(text)]
            return {"type": "text", "text": "", "citations": []}, [*cites, *texts]
        case Text(text):
            deltas = [{"type": "text_delta", "text": p} for p in pieces(text)]
            return {"type": "text", "text": ""}, deltas
        case Thinking(signature=signature, redacted=True):
            return {"type": "redacted_thinking", "data": signature}, []
        case Thinking(text=text, signature=signature):
            deltas = [{"type": "thinking_delta", "thinking": p} for p in pieces(text)]
            deltas.append({"type": "signature_delta", "signature": signature})
            return {"type": "thinking", "thinking": "", "signature": ""}, deltas
        case ToolUse(id=id_, name=name):
            raw = _tool_json(block)
            if truncated:
                raw = raw[: len(raw) // 2]
            # The API opens every tool call with an empty fragment.
            fragments = ["", *pieces(raw)]
            deltas = [{"type": "input_json_delta", "partial_json": f} for f in fragments]
            return {"type": "tool_use", "id": id_, "name": name, "input": {}}, deltas


def _whole_block(block: _WireBlock) -> dict[str, Any]:
    match block:
        case ("server_tool_use", WebSearch() as search):
            return {
                "type": "server_tool_use",
                "id": search.id,
                "name": "web_search",
                "input": {"query": search.query},
            }
        case (_, WebSearch() as search):
            return {
                "type": "web_search_tool_result",
                "tool_use_id": search.id,
                "content": _search_content(search),
            }
        case Text(text, citations) if citations:
            return {"type": "text", "text": text, "citations": [_citation(c) for c in citations]}
        case Text(text):
            return {"type": "text", "text": text}
        case Thinking(signature=signature, redacted=True):
            return {"type": "redacted_thinking", "data": signature}
        case Thinking(text=text, signature=signature):
            return {"type": "thinking", "thinking": text, "signature": signature}
        case ToolUse(id=id_, name=name, input=input_):
            return {"type": "tool_use", "id": id_, "name": name, "input": input_ or {}}


# ---------------------------------------------------------------------------------------------
# Request validation: the checks the real API makes that a client is most likely to get wrong.

_BLOCK_FIELDS: Final[Mapping[str, tuple[str, ...]]] = {
    "text": ("text",),
    "image": ("source",),
    "thinking": ("thinking", "signature"),
    "redacted_thinking": ("data",),
    "tool_use": ("id", "name", "input"),
    "tool_result": ("tool_use_id",),
    "server_tool_use": ("id", "name", "input"),
    "web_search_tool_result": ("tool_use_id", "content"),
    "web_search_result": ("url", "title", "encrypted_content"),
}
#: Server tools a request may declare (they have a type and a name, no input_schema).
_SERVER_TOOLS: Final = frozenset({"web_search_20250305"})


def request_problem(request: RecordedRequest) -> str:
    """Why the API would reject this `/v1/messages` request, or "" if it would not."""
    if "anthropic-version" not in request.headers:
        return "anthropic-version: header is required"
    try:
        body = request.json
    except ValueError:
        return "request body is not valid JSON"
    if not isinstance(body, dict):
        return "request body must be a JSON object"
    extra = sorted(set(body) - _TOP_LEVEL_KEYS)
    if extra:
        return f"{extra[0]}: Extra inputs are not permitted"
    if not isinstance(body.get("model"), str) or not body["model"]:
        return "model: Field required"
    max_tokens = body.get("max_tokens")
    if not isinstance(max_tokens, int) or max_tokens < 1:
        return "max_tokens: Field required"
    return _thinking_problem(body, max_tokens) or _content_problem(body)


def _thinking_problem(body: Mapping[str, Any], max_tokens: int) -> str:
    thinking = body.get("thinking")
    if not isinstance(thinking, dict) or thinking.get("type") != "enabled":
        return ""
    budget = thinking.get("budget_tokens")
    if not isinstance(budget, int) or budget < 1024:
        return "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024"
    if budget >= max_tokens:
        return "`max_tokens` must be greater than `thinking.budget_tokens`"
    if body.get("temperature") not in (None, 1):
        return "`temperature` may only be set to 1 when thinking is enabled"
    return ""


def _content_problem(body: Mapping[str, Any]) -> str:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages: Field required"
    blocks: list[tuple[str, Any]] = []
    system = body.get("system")
    if isinstance(system, list):
        blocks += [("system", b) for b in system]
    for i, tool in enumerate(body.get("tools") or []):
        if isinstance(tool, dict) and tool.get("type") in _SERVER_TOOLS:
            if tool.get("name") != "web_search":
                return f"tools.{i}.name: Input should be 'web_search'"
            if "allowed_domains" in tool and "blocked_domains" in tool:
                return f"tools.{i}: cannot use both allowed_domains and blocked_domains"
            continue
        if not isinstance(tool, dict) or "name" not in tool or "input_schema" not in tool:
            return f"tools.{i}: name and input_schema are required"
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            return f"messages.{i}.role: Input should be 'user' or 'assistant'"
        content = message.get("content")
        if isinstance(content, list):
            if not content:
                return f"messages.{i}: all messages must have non-empty content"
            blocks += [(f"messages.{i}.content.{j}", b) for j, b in enumerate(content)]
        elif not isinstance(content, str):
            return f"messages.{i}.content: Field required"
    return _blocks_problem(blocks, body.get("tools") or [])


def _blocks_problem(blocks: list[tuple[str, Any]], tools: list[Any]) -> str:
    breakpoints = sum(1 for t in tools if isinstance(t, dict) and "cache_control" in t)
    for where, block in _with_nested(blocks):
        if not isinstance(block, dict):
            return f"{where}: Input should be an object"
        required = _BLOCK_FIELDS.get(block.get("type", ""))
        if required is None:
            return f"{where}.type: unknown content block type {block.get('type')!r}"
        missing = [name for name in required if name not in block]
        if missing:
            return f"{where}.{missing[0]}: Field required"
        if block["type"] == "text" and not block["text"]:
            return f"{where}: text content blocks must be non-empty"
        breakpoints += "cache_control" in block
    if breakpoints > _MAX_BREAKPOINTS:
        return (
            f"A maximum of {_MAX_BREAKPOINTS} blocks with cache_control may be provided. "
            f"Found {breakpoints}."
        )
    return ""


def _with_nested(blocks: list[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
    """The blocks, each followed by the blocks inside it (a tool result's content)."""
    for where, block in blocks:
        yield where, block
        inner = block.get("content") if isinstance(block, dict) else None
        if isinstance(inner, list):
            yield from ((f"{where}.content.{k}", b) for k, b in enumerate(inner))
