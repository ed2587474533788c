"""Google's Gemini API (`gemini/…` models): `streamGenerateContent?alt=sse`, spoken over httpx.

This module owns the translation between keel's neutral messages and Gemini's `contents`: model
turns with their thought signatures put back on the part they came with, function calls and
responses (Gemini pairs them by function name and order: keel makes up the ids the neutral model
needs and never sends them, since the API refuses an `id` in a request),
images as inline data, and the decoding of the streamed `GenerateContentResponse` chunks into
display deltas and one `Done` (usage with cached tokens, finish reasons including the safety and
recitation stops).

Thought signatures are opaque and only Gemini can read them. A signature on a thought or text part
is kept as a `Thinking` block (`source="gemini"`; one with empty text means "the signature of the
text before it"), a signature on a function call in `ToolUse.signature`; both go back byte for
byte. Thought text without a signature is a summary for display and is not replayed. A call
another provider made carries no signature, which Gemini 3 refuses in the current turn, so the
first call of such a turn gets the validator-skip value Google documents for foreign history.

Web search is Google Search grounding (`{"google_search": {}}` beside the function declarations;
Gemini 3 takes both together): the candidate's `groundingMetadata` becomes one neutral `WebSearch`
(the queries, the web chunks as results) ahead of the text, and its `groundingSupports`
`Citation`s on the text. Gemini wants none of it back: grounding is not replayed.

It must never import the `google-genai` SDK, retry (`RetryingProvider` does) or let a wire dict
leave this module.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncGenerator, Mapping
from dataclasses import replace
from typing import Any, Final

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
    new_call_id,
)
from keel.llm.providers.openai_responses import (
    EncodedMessages,
    JSONObject,
    assemble,
    dumps,
    image_label,
    load_event,
    stream_cut,
)
from keel.llm.providers.wire import CallNames, call_json
from keel.llm.request import Effort, Request, ToolSpec, WebSearchOptions

#: `Thinking.source` of what this adapter decoded; only that is replayed.
SOURCE: Final = "gemini"
API_VERSION: Final = "v1beta"

#: Google's documented stand-in for a function call Gemini did not produce (another provider's
#: turn after a model switch): Gemini 3 requires a signature on the first call of each step.
FOREIGN_SIGNATURE: Final = "skip_thought_signature_validator"

#: Gemini 2.x takes a thinking budget in tokens (2.5 Flash accepts at most 24576).
THINKING_BUDGETS: Final[Mapping[Effort, int]] = {
    "low": 2_048,
    "medium": 8_192,
    "high": 16_384,
    "max": 24_576,
}
#: Gemini 3 and later take a thinking level; `HIGH` is their most.
THINKING_LEVELS: Final[Mapping[Effort, str]] = {
    "low": "LOW",
    "medium": "MEDIUM",
    "high": "HIGH",
    "max": "HIGH",
}
_BUDGET_MODELS: Final = re.compile(r"gemini-[12]\.")
#: Gemini 3 Pro takes only LOW and HIGH; its medium is its default, HIGH.
_TWO_LEVEL_MODELS: Final = re.compile(r"gemini-3-pro")

#: Finish reasons that mean the output was withheld by a filter: to the loop, a refusal.
_REFUSALS: Final = frozenset(
    {
        "SAFETY",
        "RECITATION",
        "LANGUAGE",
        "BLOCKLIST",
        "PROHIBITED_CONTENT",
        "SPII",
        "IMAGE_SAFETY",
        "IMAGE_PROHIBITED_CONTENT",
        "IMAGE_RECITATION",
        "MODEL_ARMOR",
    }
)
_NATURAL: Final = frozenset({"STOP", "FINISH_REASON_UNSPECIFIED"})

_OVERFLOW_PHRASES: Final = ("exceeds the maximum number of tokens", "input token count")
#: `error.status` of Google's errors when the HTTP status is not at hand (an error in the stream).
_STATUS_CODES: Final[Mapping[str, int]] = {
    "INVALID_ARGUMENT": 400,
    "FAILED_PRECONDITION": 400,
    "UNAUTHENTICATED": 401,
    "PERMISSION_DENIED": 403,
    "NOT_FOUND": 404,
    "RESOURCE_EXHAUSTED": 429,
    "INTERNAL": 500,
    "UNAVAILABLE": 503,
    "DEADLINE_EXCEEDED": 504,
}
_EMPTY_TURN: Final = "(empty response)"


# ---------------------------------------------------------------------------------------------
# Request encoding


def _signed(part: JSONObject, signature: str) -> JSONObject:
    if signature:
        part["thoughtSignature"] = signature
    return part


def _model_parts(message: Message) -> list[JSONObject]:
    parts: list[JSONObject] = []
    foreign_call_signed = False
    for block in message.blocks:
        if isinstance(block, Text):
            if block.text:
                parts.append({"text": block.text})
        elif isinstance(block, Thinking):
            if block.source != SOURCE or not block.signature:
                continue  # another provider's reasoning, or a summary for display only
            if block.text:
                parts.append(
                    {"text": block.text, "thought": True, "thoughtSignature": block.signature}
                )
            elif parts and "text" in parts[-1] and "thoughtSignature" not in parts[-1]:
                parts[-1]["thoughtSignature"] = block.signature
            else:
                parts.append({"text": "", "thoughtSignature": block.signature})
        elif isinstance(block, ToolUse):
            signature = block.signature
            if not signature and not foreign_call_signed:
                signature = FOREIGN_SIGNATURE
            foreign_call_signed = True
            # No `id`: the API sends one at times but refuses it in a request (it pairs calls and
            # responses by name and order).
            call = {"name": block.name, "args": block.input or {}}
            parts.append(_signed({"functionCall": call}, signature))
    return parts or [{"text": _EMPTY_TURN}]


def _inline(image: Image) -> JSONObject:
    return {"inlineData": {"mimeType": image.media_type, "data": image.data}}


def _user_parts(message: Message, names: CallNames) -> list[JSONObject]:
    # Function responses first (they answer the previous turn's calls), then the tools' images
    # and the user's own text and images.
    responses: list[JSONObject] = []
    attachments: list[JSONObject] = []
    content: list[JSONObject] = []
    for block in message.blocks:
        if isinstance(block, ToolResult):
            key = "error" if block.is_error else "output"
            response = {"name": names[block.tool_use_id], "response": {key: block.text}}
            responses.append({"functionResponse": response})
            images = [b for b in block.content if isinstance(b, Image)]
            if images:
                attachments.append({"text": image_label(block.tool_use_id)})
                attachments.extend(_inline(image) for image in images)
        elif isinstance(block, Text):
            if block.text:
                content.append({"text": block.text})
        elif isinstance(block, Image):
            content.append(_inline(block))
    return responses + attachments + content


def _tool(spec: ToolSpec) -> JSONObject:
    return {
        "name": spec.name,
        "description": spec.description,
        "parametersJsonSchema": spec.input_schema,
    }


def thinking_config(model: str, effort: Effort | None) -> JSONObject | None:
    """`generationConfig.thinkingConfig` for `effort`, or None to leave the model's default."""
    if effort is None:
        return None
    config: JSONObject = {"includeThoughts": True}
    if _BUDGET_MODELS.match(model):
        config["thinkingBudget"] = THINKING_BUDGETS[effort]
    else:
        level = THINKING_LEVELS[effort]
        if level == "MEDIUM" and _TWO_LEVEL_MODELS.match(model):
            level = "HIGH"
        config["thinkingLevel"] = level
    return config


def _generation_config(request: Request) -> JSONObject:
    config: JSONObject = {"maxOutputTokens": request.max_tokens}
    if request.temperature is not None:
        config["temperature"] = request.temperature
    if request.top_p is not None:
        config["topP"] = request.top_p
    thinking = thinking_config(request.model, request.effort)
    if thinking is not None:
        config["thinkingConfig"] = thinking
    return config


# ---------------------------------------------------------------------------------------------
# Stream decoding


class _Run:
    """Consecutive text (or thought) parts, joined into one block; a signature ends the run."""

    def __init__(self, thought: bool) -> None:
        self.thought = thought
        self.chunks: list[str] = []
        self.signature = ""

    def blocks(self) -> list[Block]:
        text = "".join(self.chunks)
        if self.thought:
            return [Thinking(text, self.signature, source=SOURCE)]
        out: list[Block] = [Text(text)] if text else []
        if self.signature:
            out.append(Thinking("", self.signature, source=SOURCE))
        return out


def _usage(raw: object) -> Usage:
    if not isinstance(raw, dict):
        return Usage()
    prompt = int(raw.get("promptTokenCount") or 0) + int(raw.get("toolUsePromptTokenCount") or 0)
    cached = int(raw.get("cachedContentTokenCount") or 0)
    output = int(raw.get("candidatesTokenCount") or 0) + int(raw.get("thoughtsTokenCount") or 0)
    return Usage(input=max(0, prompt - cached), output=output, cache_read=cached)


class _GeminiAssembly:
    """Folds `GenerateContentResponse` chunks into deltas and, at the end, one `Done`."""

    def __init__(self, provider: GeminiProvider, model: str) -> None:
        self.provider = provider
        self.model = model
        self.blocks: list[Block] = []
        self.run: _Run | None = None
        self.finish = ""
        self.blocked = ""
        self.usage = Usage()
        self.ignored: set[str] = set()
        self.grounding: JSONObject = {}
        self.response_id = ""

    def feed(self, chunk: JSONObject) -> list[StreamEvent]:
        error = chunk.get("error")
        if isinstance(error, dict):
            raise self.provider.classify(0, error, {})
        self.model = str(chunk.get("modelVersion") or self.model)
        if "usageMetadata" in chunk:
            self.usage = _usage(chunk["usageMetadata"])
        feedback = chunk.get("promptFeedback") or {}
        if feedback.get("blockReason"):
            self.blocked = str(feedback["blockReason"])
        events: list[StreamEvent] = []
        candidates = chunk.get("candidates") or []
        self.response_id = str(chunk.get("responseId") or self.response_id)
        if candidates:
            candidate = candidates[0]
            grounding = candidate.get("groundingMetadata")
            if isinstance(grounding, dict) and grounding:
                self.grounding = grounding
            for part in (candidate.get("content") or {}).get("parts") or []:
                events.extend(self._part(part))
            if candidate.get("finishReason"):
                self.finish = str(candidate["finishReason"])
        return events

    def _part(self, part: JSONObject) -> list[StreamEvent]:
        signature = str(part.get("thoughtSignature") or "")
        call = part.get("functionCall")
        if isinstance(call, dict):
            return self._call(call, signature)
        text = part.get("text")
        if not isinstance(text, str):
            return self._unsupported(part)
        thought = bool(part.get("thought"))
        if self.run is None or self.run.thought != thought:
            self._close_run()
            self.run = _Run(thought)
        self.run.chunks.append(text)
        if signature:
            self.run.signature = signature
            self._close_run()
        if not text:
            return []
        return [ThinkingDelta(text) if thought else TextDelta(text)]

    def _call(self, call: JSONObject, signature: str) -> list[StreamEvent]:
        self._close_run()
        args = call.get("args")
        block = ToolUse(
            str(call.get("id") or new_call_id()),
            str(call.get("name") or ""),
            args if isinstance(args, dict) else {},
            signature=signature,
        )
        self.blocks.append(block)
        return [ToolUseStart(block.id, block.name), ToolUseDelta(block.id, call_json(block.input))]

    def _unsupported(self, part: JSONObject) -> list[StreamEvent]:
        kind = next(iter(part), "empty")
        if kind in self.ignored:
            return []
        self.ignored.add(kind)
        return [
            Notice(f"gemini sent a {kind} part, which keel does not support; ignored", "warning")
        ]

    def _close_run(self) -> None:
        if self.run is not None:
            self.blocks.extend(self.run.blocks())
            self.run = None

    @property
    def finished(self) -> bool:
        return bool(self.finish or self.blocked)

    def done(self) -> list[StreamEvent]:
        self._close_run()
        events: list[StreamEvent] = []
        blocks = self.blocks
        usage = self.usage
        if self.grounding:
            search, blocks = _grounded(self.grounding, blocks, self.response_id)
            usage = replace(usage, web_searches=len(self.grounding.get("webSearchQueries") or ()))
            what = f"web search {search.query!r}" if search.query else "web search"
            count = len(search.results)
            events.append(Notice(f"{what}: {count} source{'s' if count != 1 else ''}"))
        message = Message("assistant", tuple(blocks), provider=SOURCE, model=self.model)
        stop, notice = self._stop_reason()
        if notice is not None:
            events.append(notice)
        events.append(Done(message, usage, stop))
        return events

    def _stop_reason(self) -> tuple[StopReason, Notice | None]:
        if self.blocked:
            why = f"gemini blocked the prompt ({self.blocked})"
            return "refusal", Notice(why, "warning")
        if self.finish in _REFUSALS:
            why = f"gemini withheld the reply ({self.finish})"
            return "refusal", Notice(why, "warning")
        if self.finish == "MAX_TOKENS":
            return "max_tokens", None
        calls = any(isinstance(b, ToolUse) for b in self.blocks)
        if self.finish in _NATURAL:
            return ("tool_use" if calls else "end_turn"), None
        notice = Notice(f"gemini ended with finish reason {self.finish}", "warning")
        return ("tool_use" if calls else "end_turn"), notice


def _grounded(
    grounding: JSONObject, blocks: list[Block], response_id: str
) -> tuple[WebSearch, list[Block]]:
    """A reply's grounding as a `WebSearch` put first, and its supports as citations on the last
    text block (keel joins a reply's text parts into one)."""
    queries = [str(q) for q in grounding.get("webSearchQueries") or ()]
    chunks: list[SearchResult] = []
    for chunk in grounding.get("groundingChunks") or ():
        web = chunk.get("web") if isinstance(chunk, dict) else None
        if isinstance(web, dict):
            chunks.append(SearchResult(str(web.get("uri") or ""), str(web.get("title") or "")))
        else:
            chunks.append(SearchResult(""))  # a map or retrieval chunk: holds the index
    citations: list[Citation] = []
    for support in grounding.get("groundingSupports") or ():
        segment = support.get("segment") or {}
        for index in support.get("groundingChunkIndices") or ():
            if not (0 <= index < len(chunks)) or not chunks[index].url:
                continue
            citations.append(
                Citation(
                    chunks[index].url,
                    chunks[index].title,
                    str(segment.get("text") or ""),
                    start=int(segment.get("startIndex", 0)),
                    end=int(segment.get("endIndex", -1)),
                    source=SOURCE,
                )
            )
    search = WebSearch(
        response_id,
        "; ".join(queries),
        tuple(c for c in chunks if c.url),
        source=SOURCE,
    )
    out: list[Block] = [search, *blocks]
    if citations:
        last = max((i for i, b in enumerate(out) if isinstance(b, Text)), default=None)
        if last is not None:
            text = out[last]
            assert isinstance(text, Text)
            out[last] = Text(text.text, (*text.citations, *citations))
    return search, out


def web_search_tool(options: WebSearchOptions) -> JSONObject:
    """The grounding tool's declaration (the Gemini API takes no domain filters for it)."""
    return {"google_search": {}}


# ---------------------------------------------------------------------------------------------


class GeminiProvider(HTTPProvider):
    """POST `{base}/v1beta/models/{model}:streamGenerateContent?alt=sse` with `x-goog-api-key`."""

    name = SOURCE
    key_env = "GEMINI_API_KEY"

    def __init__(self, *, base_url: str, api_key: str, settings: HTTPSettings) -> None:
        super().__init__(base_url=base_url, api_key=api_key, settings=settings)
        self._names = CallNames()
        self._encoded = EncodedMessages(self._encode)
        # (system, tools, search) -> the body's bytes up to and including `"contents":[`.
        self._prefix_key: tuple[str, tuple[ToolSpec, ...], WebSearchOptions | None] | None = None
        self._prefix = b""

    def endpoint(self, request: Request) -> str:
        model = request.model.removeprefix("models/")
        return f"{self.base_url}/{API_VERSION}/models/{model}:streamGenerateContent?alt=sse"

    def headers(self) -> dict[str, str]:
        return {"x-goog-api-key": self.api_key} if self.api_key else {}

    def build_body(self, request: Request) -> bytes:
        """`systemInstruction, tools, contents, generationConfig`: the stable parts first, so
        consecutive bodies share their bytes up to the newest message (Gemini's implicit cache
        matches on the prefix)."""
        tail = b"]," + dumps({"generationConfig": _generation_config(request)})[1:]
        return assemble(self._body_prefix(request), self._encoded(request.messages), tail)

    def _body_prefix(self, request: Request) -> bytes:
        key = (request.system, request.tools, request.web_search)
        if key != self._prefix_key:
            head: JSONObject = {}
            if request.system:
                head["systemInstruction"] = {"parts": [{"text": request.system}]}
            tools: list[JSONObject] = []
            if request.tools:
                tools.append({"functionDeclarations": [_tool(t) for t in request.tools]})
            if request.web_search is not None:
                tools.append(web_search_tool(request.web_search))
            if tools:
                head["tools"] = tools
            self._prefix = (dumps(head)[:-1] + b"," if head else b"{") + b'"contents":['
            self._prefix_key = key
        return self._prefix

    def _encode(self, message: Message) -> bytes:
        if message.role == "assistant":
            self._names.learn(message)
            return dumps({"role": "model", "parts": _model_parts(message)})
        parts = _user_parts(message, self._names)
        return dumps({"role": "user", "parts": parts}) if parts else b""

    async def decode(
        self, request: Request, chunks: AsyncGenerator[bytes, None]
    ) -> AsyncGenerator[StreamEvent, None]:
        assembly = _GeminiAssembly(self, request.model)
        async for sse in iter_sse(chunks):
            for event in assembly.feed(load_event(sse, self.name)):
                yield event
        if not assembly.finished:
            raise stream_cut(self.name)
        for event in assembly.done():
            yield event

    def error_from_response(self, status: int, body: bytes, headers: Mapping[str, str]) -> APIError:
        error = _error_object(body)
        if error is None:
            return self.api_error(status, error_message(body), headers)
        return self.classify(status, error, headers)

    def classify(
        self, status: int, error: Mapping[str, Any], headers: Mapping[str, str]
    ) -> APIError:
        """The `APIError` for a Google error object, from a response or inside the stream."""
        message = str(error.get("message") or error.get("status") or "unknown error")
        status = (
            status
            or int(error.get("code") or 0)
            or _STATUS_CODES.get(str(error.get("status")), 500)
        )
        if status == 400 and any(p in message.lower() for p in _OVERFLOW_PHRASES):
            return ContextOverflow(f"gemini: {message}", provider=self.name, status=status)
        details = [d for d in error.get("details") or () if isinstance(d, dict)]
        if any(d.get("reason") == "API_KEY_INVALID" for d in details):
            status = 401  # Google answers a bad key with 400; it is an authentication failure
        result = self.api_error(status, message, headers)
        delay = _retry_delay(details)
        if delay is not None:
            result.retry_after = delay
        return result


def _error_object(body: bytes) -> Mapping[str, Any] | None:
    """`error` of a Google error body (sometimes wrapped in a one-element list), or None."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if isinstance(data, list) and data:
        data = data[0]
    error = data.get("error") if isinstance(data, dict) else None
    return error if isinstance(error, dict) else None


def _retry_delay(details: list[dict[str, Any]]) -> float | None:
    """Seconds from a `google.rpc.RetryInfo` detail (`"retryDelay": "7s"`), if there is one."""
    for detail in details:
        if str(detail.get("@type", "")).endswith("RetryInfo"):
            match = re.fullmatch(r"(\d+(?:\.\d+)?)s", str(detail.get("retryDelay", "")))
            if match:
                return float(match.group(1))
    return None
