"""The Anthropic Messages API client, spoken over httpx (no SDK).

This module owns the Anthropic wire format: encoding a neutral `Request` as a `/v1/messages` body
(prompt-cache breakpoints included), decoding the SSE stream into neutral `StreamEvent`s, and
mapping Anthropic's error bodies to `keel.llm.errors`. Wire dicts never leave it.

It must never retry (that is `RetryingProvider`'s job), never import the `anthropic` SDK, and never
re-encode the whole history per request: the transcript is append-only and messages are frozen,
so each message's wire bytes are cached by identity and a body is assembled from cached pieces.
That is also what keeps the prompt prefix byte-stable, which is what makes the prompt cache hit.

Web search is Anthropic's server tool (`web_search_20250305`): the API runs it, and the reply's
`server_tool_use` and `web_search_tool_result` blocks become one neutral `WebSearch` (results with
their `encrypted_content`), its `web_search_result_location` citations `Citation`s on the text.
Both go back in later requests exactly as they came, which the API needs to let the model cite.
"""

from __future__ import annotations

import json
import operator
import re
from collections import OrderedDict
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal, assert_never

from keel.llm.errors import APIError, ContextOverflow
from keel.llm.events import (
    Done,
    Notice,
    StreamEvent,
    TextDelta,
    ThinkingDelta,
    ToolUseDelta,
    ToolUseStart,
)
from keel.llm.http import HTTPProvider, HTTPSettings, error_message, iter_sse
from keel.llm.messages import (
    Block,
    Citation,
    Image,
    Message,
    SearchResult,
    StopReason,
    Text,
    Thinking,
    ToolResult,
    ToolUse,
    Usage,
    WebSearch,
)
from keel.llm.request import Effort, Request, ToolSpec, WebSearchOptions

API_VERSION: Final = "2023-06-01"
#: The server tool's version and name; keel asks for no other server tool.
WEB_SEARCH_TOOL: Final = "web_search_20250305"
WEB_SEARCH_NAME: Final = "web_search"

#: Thinking budget per effort level. The budget is capped so that at least
#: `_MIN_ANSWER_TOKENS` of `max_tokens` stay for the answer; below the API's minimum budget
#: thinking is left off.
THINKING_BUDGETS: Final[Mapping[Effort, int]] = {
    "low": 4_000,
    "medium": 10_000,
    "high": 24_000,
    "max": 32_000,
}
#: Models that think adaptively, told only how hard to try (`output_config.effort`); they refuse
#: fixed budgets or deprecate them. Only Opus takes `max`.
_ADAPTIVE_MODELS: Final = re.compile(r"claude-(?:opus|sonnet|haiku)-(?:4-[6-9]|[5-9])(?!\d)")
_MIN_THINKING_BUDGET: Final = 1_024
_MIN_ANSWER_TOKENS: Final = 1_024

#: Messages whose wire bytes are kept. Several transcripts (subagents) may share one client.
_MESSAGE_CACHE_SIZE: Final = 4_096
#: And at most this many wire bytes of them: the messages a compaction dropped stay cached until
#: evicted, and at 25 kB tool results 4,096 of them held ~100 MB (bench_long_session.py). The
#: request that extends the previous one never looks here (`_WireCache._last`).
_MESSAGE_CACHE_BYTES: Final = 16 * 2**20

_EPHEMERAL: Final = {"type": "ephemeral"}
#: Appended inside a message's last content block to mark a cache breakpoint. Encoded messages
#: end with `}]}` (last block, content list, message); the marker goes before the first `}`.
_BREAKPOINT_TAIL: Final = b',"cache_control":{"type":"ephemeral"}}]}'

_STOP_REASONS: Final[Mapping[str, StopReason]] = {
    "end_turn": "end_turn",
    "tool_use": "tool_use",
    "max_tokens": "max_tokens",
    "stop_sequence": "stop_sequence",
    "pause_turn": "pause_turn",
    "refusal": "refusal",
    # Output stopped because the context window filled up: to the loop that is a cut-off reply.
    "model_context_window_exceeded": "max_tokens",
}

#: HTTP status for an error that arrives as an SSE `error` event (the stream itself was a 200).
_ERROR_EVENT_STATUS: Final[Mapping[str, int]] = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}

_OVERFLOW_PHRASES: Final = ("prompt is too long", "exceed context limit")


class AnthropicProvider(HTTPProvider):
    """Streams one Messages API call. `bearer=True` sends the key as `Authorization: Bearer`
    (a key from `ANTHROPIC_AUTH_TOKEN`, as gateways and proxies expect); otherwise `x-api-key`."""

    name = "anthropic"
    key_env = "ANTHROPIC_API_KEY"
    key_envs: Final = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN")
    default_url: Final = "https://api.anthropic.com"

    def __init__(
        self, *, base_url: str, api_key: str, settings: HTTPSettings, bearer: bool = False
    ) -> None:
        super().__init__(base_url=base_url, api_key=api_key, settings=settings)
        self.bearer = bearer
        if bearer:
            self.key_env = "ANTHROPIC_AUTH_TOKEN"
        self._wire = _WireCache(_MESSAGE_CACHE_SIZE, _MESSAGE_CACHE_BYTES)
        self._head: tuple[tuple[object, ...], tuple[ToolSpec, ...], bytes] | None = None

    # -- request ------------------------------------------------------------------------------

    def endpoint(self, request: Request) -> str:
        return f"{self.base_url}/v1/messages"

    def headers(self) -> dict[str, str]:
        headers = {"anthropic-version": API_VERSION}
        if self.api_key:
            if self.bearer:
                headers["authorization"] = f"Bearer {self.api_key}"
            else:
                headers["x-api-key"] = self.api_key
        return headers

    def build_body(self, request: Request) -> bytes:
        """The body, with `messages` last so that everything before the newest messages is a
        byte prefix shared with the previous request (cache breakpoints aside)."""
        wires = self._wire.encoded(request.messages, request.model)
        # Breakpoints: the latest message, and the one that was latest for the previous request.
        latest = len(wires) - 1
        for index in (latest, latest - 2):
            if index >= 0:
                wires[index] = wires[index][:-3] + _BREAKPOINT_TAIL
        if request.effort is not None and not thinking_allowed(
            request.messages, self.name, request.model
        ):
            request = replace(request, effort=None)
        parts = [self._encoded_head(request)]
        for wire in wires:
            parts += (wire, b",")
        if wires:
            parts.pop()
        parts.append(b"]}")
        # One join, one allocation: intermediate copies of a body this size cost more than
        # everything else here together.
        return b"".join(parts)

    def _encoded_head(self, request: Request) -> bytes:
        """Everything up to and including `"messages":[`, cached while it does not change."""
        key = (
            request.model,
            request.max_tokens,
            request.effort,
            request.temperature,
            request.top_p,
            request.metadata.get("user_id", ""),
            request.system,
            request.web_search,
        )
        cached = self._head
        if cached is not None and cached[0] == key and cached[1] == request.tools:
            return cached[2]
        head = encode_head(request)
        self._head = (key, request.tools, head)
        return head

    # -- response -----------------------------------------------------------------------------

    async def decode(
        self, request: Request, chunks: AsyncGenerator[bytes, None]
    ) -> AsyncGenerator[StreamEvent, None]:
        assembly = _Assembly(self, request.model)
        async for sse in iter_sse(chunks):
            if assembly.done:
                continue  # drain to the end so the connection goes back to the pool
            try:
                data = json.loads(sse.data)
            except ValueError as exc:
                raise APIError(
                    f"anthropic sent a malformed {sse.event} event: {sse.data[:200]!r}",
                    status=502,
                    retryable=True,
                    provider=self.name,
                ) from exc
            for event in assembly.feed(data):
                yield event
        if not assembly.done:
            raise APIError(
                "anthropic stream ended early (no message_stop)",
                status=0,
                retryable=True,
                provider=self.name,
            )

    def error_from_response(self, status: int, body: bytes, headers: Mapping[str, str]) -> APIError:
        return self.classify_error(status, _error_type(body), error_message(body), headers)

    def classify_error(
        self, status: int, error_type: str, message: str, headers: Mapping[str, str]
    ) -> APIError:
        """The `APIError` for an error response or an `error` event in the stream."""
        lowered = message.lower()
        too_long = any(phrase in lowered for phrase in _OVERFLOW_PHRASES)
        if error_type == "request_too_large" or (status in (400, 413) and too_long):
            return ContextOverflow(f"anthropic: {message}", provider=self.name, status=status)
        error = self.api_error(status, message, headers)
        if status == 529 or error_type == "overloaded_error":
            error.retryable = True
            error.hint = "Anthropic is overloaded; try again shortly"
        return error


# ---------------------------------------------------------------------------------------------
# Encoding. Hand-written per block type because it must be byte-stable and it runs per message.


#: Compact and ASCII-only: stable bytes whatever the text holds (even lone surrogates).
_ENCODER: Final = json.JSONEncoder(separators=(",", ":"))


def _dumps(value: object) -> bytes:
    return _ENCODER.encode(value).encode("ascii")


def encode_message(message: Message, *, keep_thinking: bool = True) -> bytes:
    """One message as wire JSON, without cache breakpoints. Always ends with `}]}`. Without
    `keep_thinking`, its reasoning is left out (another model's signatures, which the API
    rejects)."""
    blocks = message.blocks
    if not keep_thinking:
        blocks = tuple(b for b in blocks if not isinstance(b, Thinking))
    content: list[dict[str, Any]] = []
    for block in blocks:
        if isinstance(block, WebSearch):
            content += _search_wire(block)
        elif (wire := _block_wire(block)) is not None:
            content.append(wire)
    if not content:
        # The API rejects empty content. An assistant turn made only of another provider's
        # reasoning (dropped here) still has to hold its place so roles keep alternating.
        content = [{"type": "text", "text": "(empty response)"}]
    return _dumps({"role": message.role, "content": content})


def _block_wire(block: Block) -> dict[str, Any] | None:
    """A content block's wire form, or None for what Anthropic must not see."""
    match block:
        case Text(text, citations):
            # The API rejects empty text blocks; an empty one carries nothing anyway.
            if not text:
                return None
            cited = [_citation_wire(c) for c in citations if c.source == "anthropic"]
            if cited:
                return {"type": "text", "text": text, "citations": cited}
            return {"type": "text", "text": text}
        case WebSearch():
            return None  # two wire blocks: encode_message calls _search_wire
        case Thinking(text=text, signature=signature, redacted=redacted, source=source):
            # Only Anthropic can verify its own signatures; others' reasoning is dropped.
            if source != "anthropic" or not signature:
                return None
            if redacted:
                return {"type": "redacted_thinking", "data": signature}
            return {"type": "thinking", "thinking": text, "signature": signature}
        case ToolUse(id=id_, name=name, input=input_):
            # A call whose arguments did not parse is replayed with empty ones; its tool result
            # tells the model what went wrong.
            return {
                "type": "tool_use",
                "id": id_,
                "name": name,
                "input": {} if input_ is None else input_,
            }
        case ToolResult(tool_use_id, content, is_error):
            out: dict[str, Any] = {"type": "tool_result", "tool_use_id": tool_use_id}
            parts = [wire for wire in map(_block_wire, content) if wire is not None]
            if parts:
                out["content"] = parts
            if is_error:
                out["is_error"] = True
            return out
        case Image(media_type, data):
            return {
                "type": "image",
                "source": {"type": "base64", "media_type": media_type, "data": data},
            }
        case _:
            assert_never(block)


def _citation_wire(c: Citation) -> dict[str, Any]:
    return {
        "type": "web_search_result_location",
        "url": c.url,
        "title": c.title or None,
        "encrypted_index": c.encrypted_index,
        "cited_text": c.cited_text,
    }


def _search_wire(block: WebSearch) -> list[dict[str, Any]]:
    """A search's `server_tool_use` and, unless the reply stopped before it, its
    `web_search_tool_result`, as the API sent them. Another provider's search cannot be replayed
    (its answer's text still is)."""
    if block.source != "anthropic":
        return []
    use = {
        "type": "server_tool_use",
        "id": block.id,
        "name": WEB_SEARCH_NAME,
        "input": {"query": block.query},
    }
    if block.status == "in_progress":
        return [use]
    content: object
    if block.status == "failed":
        content = {"type": "web_search_tool_result_error", "error_code": block.error}
    else:
        content = [
            {
                "type": "web_search_result",
                "url": r.url,
                "title": r.title,
                "encrypted_content": r.encrypted_content,
                "page_age": r.page_age or None,
            }
            for r in block.results
        ]
    return [use, {"type": "web_search_tool_result", "tool_use_id": block.id, "content": content}]


def web_search_tool(options: WebSearchOptions) -> dict[str, Any]:
    """The server tool's declaration. The API takes allowed or blocked domains, not both: with
    both set, allowed ones win (the narrower request)."""
    tool: dict[str, Any] = {"type": WEB_SEARCH_TOOL, "name": WEB_SEARCH_NAME}
    if options.max_uses is not None:
        tool["max_uses"] = options.max_uses
    if options.allowed_domains:
        tool["allowed_domains"] = list(options.allowed_domains)
    elif options.blocked_domains:
        tool["blocked_domains"] = list(options.blocked_domains)
    return tool


_SNAPSHOT: Final = re.compile(r"-(?:\d{8}|latest)$")


def same_model(a: str, b: str) -> bool:
    """Whether two model ids name the same model: `claude-sonnet-4-5` is answered by
    `claude-sonnet-4-5-20250929`, and `-latest` aliases resolve to a dated snapshot."""
    return _SNAPSHOT.sub("", a) == _SNAPSHOT.sub("", b)


def signed_for(message: Message, model: str) -> bool:
    """Whether `message`'s thinking signatures can go to `model`: they are bound to the model
    that wrote them, and another Claude model rejects the whole request over them."""
    return not message.model or same_model(message.model, model)


def thinking_budget(effort: Effort | None, max_tokens: int) -> int | None:
    """Tokens of extended thinking for `effort`, or None to leave thinking off."""
    if effort is None:
        return None
    budget = min(THINKING_BUDGETS[effort], max_tokens - _MIN_ANSWER_TOKENS)
    return budget if budget >= _MIN_THINKING_BUDGET else None


def thinking_allowed(messages: tuple[Message, ...], provider: str, model: str = "") -> bool:
    """Whether a request may turn thinking on. With thinking on, the API wants the assistant turn
    in progress (since the prompt, every message answered by tool results) to begin with its own
    thinking. A turn another provider or model began or continued (a fallback mid-turn) cannot,
    so its requests go without thinking until the next prompt. Messages this model wrote are
    left to the API, which lets adaptive thinking skip a step."""
    for message in reversed(messages):
        if message.role == "user":
            if not all(isinstance(b, ToolResult) for b in message.blocks):
                return True  # the prompt that began this turn
        elif (message.provider and message.provider != provider) or (
            model and not signed_for(message, model)
        ):
            return False  # another provider's or another model's
    return True


def thinking_config(model: str, effort: Effort | None, max_tokens: int) -> dict[str, Any] | None:
    """The body fields that turn thinking on for `effort`: adaptive thinking with an effort level
    for the models that take it (Claude 4.6 and later), a token budget for the older ones; None
    leaves thinking off."""
    if effort is None:
        return None
    if _ADAPTIVE_MODELS.match(model):
        level = effort if effort != "max" or model.startswith("claude-opus") else "high"
        return {"thinking": {"type": "adaptive"}, "output_config": {"effort": level}}
    budget = thinking_budget(effort, max_tokens)
    if budget is None:
        return None
    return {"thinking": {"type": "enabled", "budget_tokens": budget}}


def encode_head(request: Request) -> bytes:
    """The body up to `"messages":[`: parameters, system prompt and tools, breakpoints marked."""
    body: dict[str, Any] = {
        "model": request.model,
        "max_tokens": request.max_tokens,
        "stream": True,
    }
    thinking = thinking_config(request.model, request.effort, request.max_tokens)
    if thinking is not None:
        body.update(thinking)
    elif request.temperature is not None:
        # With thinking on, the API accepts no temperature other than its default.
        body["temperature"] = request.temperature
    if request.top_p is not None and (thinking is None or request.top_p >= 0.95):
        body["top_p"] = request.top_p  # with thinking on, the API accepts only 0.95 to 1
    user_id = request.metadata.get("user_id")
    if user_id:
        body["metadata"] = {"user_id": user_id}  # the only metadata the API accepts
    if request.system:
        body["system"] = [{"type": "text", "text": request.system, "cache_control": _EPHEMERAL}]
    tools: list[dict[str, Any]] = [
        {"name": t.name, "description": t.description, "input_schema": t.input_schema}
        for t in request.tools
    ]
    # A tool of keel's own by that name (an MCP server's) would clash with the server tool. It
    # goes where its name sorts, as keel's tools are sorted.
    if request.web_search is not None and all(t.name != WEB_SEARCH_NAME for t in request.tools):
        at = sum(1 for t in request.tools if t.name < WEB_SEARCH_NAME)
        tools.insert(at, web_search_tool(request.web_search))
    if tools:
        tools[-1]["cache_control"] = _EPHEMERAL
        body["tools"] = tools
    return _dumps(body)[:-1] + b',"messages":['


class _WireCache:
    """Encoded messages keyed by identity, least recently used dropped first. Each entry holds a
    reference to its message, so the id cannot be reused by another object while cached."""

    def __init__(self, capacity: int, max_bytes: int) -> None:
        self._capacity = capacity
        self._max_bytes = max_bytes
        self._bytes = 0  # wire bytes held in `_entries`
        #: id → (message, whether its thinking was kept, wire bytes).
        self._entries: OrderedDict[int, tuple[Message, bool, bytes]] = OrderedDict()
        # The previous request's model, messages and wires: the next request usually extends
        # them (a request to another model re-checks whose signatures may go).
        self._last: tuple[str, tuple[Message, ...], list[bytes]] = ("", (), [])

    def encoded(self, messages: tuple[Message, ...], model: str) -> list[bytes]:
        """The wire bytes of each message for `model`, encoding only those not seen before."""
        last_model, last_messages, last_wires = self._last
        n = len(last_messages)
        if (
            n
            and model == last_model
            and len(messages) >= n
            and all(map(operator.is_, messages[:n], last_messages))
        ):
            out = last_wires + self._lookup(messages[n:], model)
        else:
            out = self._lookup(messages, model)
        self._last = (model, messages, out)
        return list(out)

    def _lookup(self, messages: tuple[Message, ...], model: str) -> list[bytes]:
        entries = self._entries
        out: list[bytes] = []
        for message in messages:
            key = id(message)
            keep = signed_for(message, model)
            entry = entries.get(key)
            if entry is not None and entry[0] is message and entry[1] == keep:
                entries.move_to_end(key)
                out.append(entry[2])
                continue
            wire = encode_message(message, keep_thinking=keep)
            if entry is not None:
                self._bytes -= len(entry[2])
            entries[key] = (message, keep, wire)
            entries.move_to_end(key)
            self._bytes += len(wire)
            while entries and (len(entries) > self._capacity or self._bytes > self._max_bytes):
                self._bytes -= len(entries.popitem(last=False)[1][2])
            out.append(wire)
        return out


# ---------------------------------------------------------------------------------------------
# Decoding.


@dataclass(slots=True)
class _Part:
    """One content block being assembled from `content_block_*` events."""

    kind: Literal[
        "text", "thinking", "redacted_thinking", "tool_use", "server_tool_use", "search_result"
    ]
    chunks: list[str] = field(default_factory=list)
    signature: str = ""
    id: str = ""
    name: str = ""
    start_input: object = None
    json_deltas: bool = False
    citations: list[Citation] = field(default_factory=list)
    #: A search result block: its results, or its error code.
    results: tuple[SearchResult, ...] = ()
    error: str = ""

    def block(self) -> Block:
        match self.kind:
            case "text":
                return Text("".join(self.chunks), tuple(self.citations))
            case "server_tool_use":
                call = self._tool_use()
                query = (call.input or {}).get("query", "")
                return WebSearch(self.id, str(query), status="in_progress", source="anthropic")
            case "search_result":
                failed = bool(self.error)
                return WebSearch(
                    self.id,
                    results=self.results,
                    status="failed" if failed else "completed",
                    error=self.error,
                    source="anthropic",
                )
            case "thinking":
                return Thinking("".join(self.chunks), self.signature, source="anthropic")
            case "redacted_thinking":
                return Thinking("", self.signature, redacted=True, source="anthropic")
            case "tool_use":
                return self._tool_use()
            case _:
                assert_never(self.kind)

    def _tool_use(self) -> ToolUse:
        if not self.json_deltas:
            start = self.start_input
            return ToolUse(self.id, self.name, start if isinstance(start, dict) else {})
        raw = "".join(self.chunks)
        if not raw.strip():
            return ToolUse(self.id, self.name, {})
        try:
            parsed = json.loads(raw)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            return ToolUse(self.id, self.name, parsed)
        # Cut short (max_tokens mid-call) or not an object: keep what arrived for the loop.
        return ToolUse(self.id, self.name, None, raw_input=raw)


_NO_EVENTS: Final[tuple[StreamEvent, ...]] = ()


class _Assembly:
    """The state of one response stream: turns wire events into stream events and, at
    `message_stop`, the one `Done`."""

    def __init__(self, provider: AnthropicProvider, model: str) -> None:
        self.provider = provider
        self.model = model
        self.parts: dict[int, _Part] = {}
        self.ignored: set[str] = set()
        self.input_tokens = 0
        self.output_tokens = 0
        self.cache_read = 0
        self.cache_write = 0
        self.web_searches = 0
        self.stop_reason: str | None = None
        self.done = False

    def feed(self, data: Any) -> tuple[StreamEvent, ...]:
        kind = data.get("type") if isinstance(data, dict) else None
        if kind == "content_block_delta":
            return self._delta(data)
        if kind == "content_block_start":
            return self._start(data)
        if kind == "message_start":
            message = data.get("message") or {}
            self.model = message.get("model") or self.model
            self._usage(message.get("usage") or {})
        elif kind == "message_delta":
            self.stop_reason = (data.get("delta") or {}).get("stop_reason") or self.stop_reason
            self._usage(data.get("usage") or {})
        elif kind == "message_stop":
            self.done = True
            return self._finish()
        elif kind == "error":
            error = data.get("error") or {}
            error_type = str(error.get("type", "api_error"))
            raise self.provider.classify_error(
                _ERROR_EVENT_STATUS.get(error_type, 500),
                error_type,
                str(error.get("message", "")) or error_type,
                {},
            )
        # content_block_stop, ping and event types added after this was written carry nothing.
        return _NO_EVENTS

    def _usage(self, usage: Mapping[str, Any]) -> None:
        # message_delta counts are cumulative and overwrite; absent ones keep message_start's.
        if (value := usage.get("input_tokens")) is not None:
            self.input_tokens = value
        if (value := usage.get("output_tokens")) is not None:
            self.output_tokens = value
        if (value := usage.get("cache_read_input_tokens")) is not None:
            self.cache_read = value
        if (value := usage.get("cache_creation_input_tokens")) is not None:
            self.cache_write = value
        server = usage.get("server_tool_use")
        if isinstance(server, dict) and (value := server.get("web_search_requests")) is not None:
            self.web_searches = value

    def _start(self, data: Mapping[str, Any]) -> tuple[StreamEvent, ...]:
        block = data.get("content_block") or {}
        kind = block.get("type")
        index = data.get("index", len(self.parts))
        if kind == "text":
            text = block.get("text", "")
            self.parts[index] = part = _Part("text", [text])
            for citation in block.get("citations") or ():
                self._cite(part, citation)
            return (TextDelta(text),) if text else _NO_EVENTS
        if kind == "server_tool_use" and block.get("name") == WEB_SEARCH_NAME:
            part = _Part("server_tool_use", id=block.get("id", ""), name=WEB_SEARCH_NAME)
            part.start_input = block.get("input")
            self.parts[index] = part
            return _NO_EVENTS
        if kind == "web_search_tool_result":
            return self._search_result(index, block)
        if kind == "thinking":
            self.parts[index] = _Part(
                "thinking", [block.get("thinking", "")], signature=block.get("signature", "")
            )
            return _NO_EVENTS
        if kind == "redacted_thinking":
            self.parts[index] = _Part("redacted_thinking", signature=block.get("data", ""))
            return _NO_EVENTS
        if kind == "tool_use":
            part = _Part("tool_use", id=block.get("id", ""), name=block.get("name", ""))
            part.start_input = block.get("input")
            self.parts[index] = part
            return (ToolUseStart(part.id, part.name),)
        # Server tools, citations' documents and other blocks the neutral model cannot hold.
        if kind in self.ignored:
            return _NO_EVENTS
        self.ignored.add(str(kind))
        return (
            Notice(
                f"anthropic sent a {kind} block, which keel does not support; ignored", "warning"
            ),
        )

    def _delta(self, data: Mapping[str, Any]) -> tuple[StreamEvent, ...]:
        part = self.parts.get(data.get("index", -1))
        if part is None:
            return _NO_EVENTS  # a delta of an ignored block
        delta = data.get("delta") or {}
        kind = delta.get("type")
        if kind == "text_delta":
            text = delta.get("text", "")
            part.chunks.append(text)
            return (TextDelta(text),) if text else _NO_EVENTS
        if kind == "input_json_delta":
            fragment = delta.get("partial_json", "")
            part.json_deltas = True
            part.chunks.append(fragment)
            if part.kind == "server_tool_use":
                return _NO_EVENTS  # the provider runs it: no call for the loop to show
            return (ToolUseDelta(part.id, fragment),) if fragment else _NO_EVENTS
        if kind == "thinking_delta":
            text = delta.get("thinking", "")
            part.chunks.append(text)
            return (ThinkingDelta(text),) if text else _NO_EVENTS
        if kind == "signature_delta":
            part.signature = delta.get("signature", "")
        elif kind == "citations_delta":
            self._cite(part, delta.get("citation"))
        # Newer delta types: nothing the neutral model keeps.
        return _NO_EVENTS

    @staticmethod
    def _cite(part: _Part, citation: object) -> None:
        """Keeps a web search citation; other kinds (documents keel never sends) are dropped."""
        if isinstance(citation, dict) and citation.get("type") == "web_search_result_location":
            part.citations.append(
                Citation(
                    str(citation.get("url", "")),
                    str(citation.get("title") or ""),
                    str(citation.get("cited_text", "")),
                    str(citation.get("encrypted_index", "")),
                    source="anthropic",
                )
            )

    def _search_result(self, index: int, block: Mapping[str, Any]) -> tuple[StreamEvent, ...]:
        part = _Part("search_result", id=str(block.get("tool_use_id", "")))
        content = block.get("content")
        if isinstance(content, list):
            part.results = tuple(
                SearchResult(
                    str(r.get("url", "")),
                    str(r.get("title") or ""),
                    str(r.get("page_age") or ""),
                    str(r.get("encrypted_content", "")),
                )
                for r in content
                if isinstance(r, dict)
            )
        else:
            error = content if isinstance(content, dict) else {}
            part.error = str(error.get("error_code") or "unavailable")
        self.parts[index] = part
        query = ""
        for other in self.parts.values():
            if other.kind == "server_tool_use" and other.id == part.id:
                query = str((other._tool_use().input or {}).get("query", ""))
        return (search_notice(query, len(part.results), part.error),)

    def _finish(self) -> tuple[StreamEvent, ...]:
        message = Message(
            "assistant",
            _merge_searches([self.parts[i].block() for i in sorted(self.parts)]),
            provider=self.provider.name,
            model=self.model,
        )
        usage = Usage(
            self.input_tokens,
            self.output_tokens,
            self.cache_read,
            self.cache_write,
            self.web_searches,
        )
        stop = _STOP_REASONS.get(self.stop_reason or "")
        if stop is not None:
            return (Done(message, usage, stop),)
        notice = Notice(
            f"anthropic ended with stop reason {self.stop_reason!r}, which keel does not know; "
            "treating it as end_turn",
            "warning",
        )
        return (notice, Done(message, usage, "end_turn"))


def search_notice(query: str, results: int, error: str = "") -> Notice:
    """What the user sees when the provider has searched the web."""
    what = f"web search {query!r}" if query else "web search"
    if error:
        return Notice(f"{what} failed ({error})", "warning")
    return Notice(f"{what}: {results} result{'s' if results != 1 else ''}", "info")


def _merge_searches(blocks: list[Block]) -> tuple[Block, ...]:
    """A search result joins the call it answers into one `WebSearch`, where the call stood."""
    out: list[Block] = []
    calls: dict[str, int] = {}
    for block in blocks:
        if isinstance(block, WebSearch) and block.status == "in_progress":
            calls[block.id] = len(out)
        elif isinstance(block, WebSearch) and block.id in calls:
            at = calls.pop(block.id)
            call = out[at]
            assert isinstance(call, WebSearch)
            out[at] = replace(block, query=call.query)
            continue
        out.append(block)
    return tuple(out)


def _error_type(body: bytes) -> str:
    """`error.type` of an Anthropic error body (`{"type": "error", "error": {...}}`), or ""."""
    try:
        data = json.loads(body)
    except ValueError:
        return ""
    error = data.get("error") if isinstance(data, dict) else None
    return str(error.get("type", "")) if isinstance(error, dict) else ""
