"""Chat Completions (`openai-compatible/…`): any server that speaks OpenAI's `/chat/completions`
(vLLM, llama.cpp, Ollama, LM Studio, hosted gateways), spoken over httpx.

This module owns the translation between keel's neutral messages and Chat Completions: a leading
system message, assistant `tool_calls`, one `tool` message per result, images as data URLs, and the
decoding of streamed chunks (content, reasoning, tool-call fragments by index, finish reason, the
usage chunk) into display deltas and one `Done`. Reasoning is kept for display and the journal but
never replayed: these servers have no field to receive it.

For a server on the user's machine (`local`) it also asks, once per model before the first
request, what the server serves the model with: llama.cpp's `GET /props` (the window of one slot,
whether the chat template takes tools), else the model list (llama.cpp's `meta.n_ctx`, vLLM's
`max_model_len`). A server that answers neither leaves the catalog's window standing; asking
never fails a request.

It must never import the `openai` SDK, assume a particular server beyond the documented wire
format, retry (the `RetryingProvider` above it does) or let a wire dict leave this module.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Mapping
from dataclasses import field

from keel.frozen import mutable
from keel.llm.errors import APIError, ContextOverflow
from keel.llm.events import (
    Done,
    StreamEvent,
    TextDelta,
    ThinkingDelta,
    ToolUseDelta,
    ToolUseStart,
)
from keel.llm.http import HTTPProvider, HTTPSettings, error_message, iter_sse
from keel.llm.messages import (
    Block,
    Image,
    Message,
    StopReason,
    Text,
    Thinking,
    ToolResult,
    ToolUse,
    Usage,
    new_call_id,
)
from keel.llm.provider import ModelFacts
from keel.llm.providers.openai_responses import (
    EncodedMessages,
    JSONObject,
    arguments_json,
    assemble,
    data_url,
    dumps,
    error_code,
    image_label,
    is_overflow,
    load_event,
    parse_arguments,
    result_text,
    stream_cut,
    stream_error,
)
from keel.llm.request import Request, ToolSpec

#: `Thinking.source` of reasoning this adapter decoded (never replayed).
SOURCE = "openai-compatible"
#: Seconds a local server gets to say what it serves (it answers from a thread of its own
#: even while a slot is busy).
PROBE_TIMEOUT = 5.0

_FINISH: dict[str, StopReason] = {
    "stop": "end_turn",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "length": "max_tokens",
    "content_filter": "refusal",
}


# ---------------------------------------------------------------------------------------------
# Request encoding


def _join_text(blocks: list[str]) -> str:
    # Separate text blocks (a note and a prompt, merged user turns) read as paragraphs.
    return "\n\n".join(blocks)


def _assistant_message(message: Message) -> list[JSONObject]:
    texts = [b.text for b in message.blocks if isinstance(b, Text) and b.text]
    calls = [
        {
            "id": b.id,
            "type": "function",
            "function": {"name": b.name, "arguments": arguments_json(b)},
        }
        for b in message.blocks
        if isinstance(b, ToolUse)
    ]
    out: JSONObject = {"role": "assistant"}
    # OpenAI wants null content beside tool calls; a bare assistant turn still needs a string.
    out["content"] = _join_text(texts) if texts else (None if calls else "")
    if calls:
        out["tool_calls"] = calls
    return [out]


def _image_part(image: Image) -> JSONObject:
    return {"type": "image_url", "image_url": {"url": data_url(image)}}


def _user_messages(message: Message) -> list[JSONObject]:
    # Tool messages must directly follow the assistant's tool_calls, so they come first; the
    # tools' images and the user's own content follow as a single user message (many chat
    # templates reject two user messages in a row).
    out: list[JSONObject] = []
    attachments: list[JSONObject] = []
    content: list[JSONObject] = []
    for block in message.blocks:
        if isinstance(block, ToolResult):
            out.append(
                {"role": "tool", "tool_call_id": block.tool_use_id, "content": result_text(block)}
            )
            images = [b for b in block.content if isinstance(b, Image)]
            if images:
                attachments.append({"type": "text", "text": image_label(block.tool_use_id)})
                attachments.extend(_image_part(image) for image in images)
        elif isinstance(block, Text):
            content.append({"type": "text", "text": block.text})
        elif isinstance(block, Image):
            content.append(_image_part(block))
    parts = attachments + content
    if parts and all(p["type"] == "text" for p in parts):
        # Plain string content is what every compatible server accepts.
        out.append({"role": "user", "content": _join_text([p["text"] for p in parts])})
    elif parts:
        out.append({"role": "user", "content": parts})
    return out


def encode_messages(message: Message) -> bytes:
    """A message's chat messages, comma-joined (b"" when it has none)."""
    items = _assistant_message(message) if message.role == "assistant" else _user_messages(message)
    return b",".join(dumps(item) for item in items)


def _tool(spec: ToolSpec) -> JSONObject:
    return {
        "type": "function",
        "function": {
            "name": spec.name,
            "description": spec.description,
            "parameters": spec.input_schema,
        },
    }


def _options(request: Request) -> JSONObject:
    options: JSONObject = {
        "stream": True,
        "stream_options": {"include_usage": True},
        # OpenAI itself prefers `max_completion_tokens` (required for its reasoning models), but
        # `max_tokens` is the field every compatible server understands.
        "max_tokens": request.max_tokens,
    }
    if request.temperature is not None:
        options["temperature"] = request.temperature
    if request.top_p is not None:
        options["top_p"] = request.top_p
    return options


# ---------------------------------------------------------------------------------------------
# Stream decoding


@mutable
class _Call:
    id: str
    name: str
    #: Whether `id` came from the server (else keel made it up; see `_ChatAssembly._call`).
    server_id: bool
    fragments: list[str] = field(default_factory=list)

    def block(self) -> ToolUse:
        input_, raw_input = parse_arguments("".join(self.fragments))
        return ToolUse(self.id, self.name, input_, raw_input)


def _usage(raw: object) -> Usage:
    if not isinstance(raw, dict):
        return Usage()
    details = raw.get("prompt_tokens_details") or {}
    cached = int(details.get("cached_tokens") or 0)
    return Usage(
        input=max(0, int(raw.get("prompt_tokens") or 0) - cached),
        output=int(raw.get("completion_tokens") or 0),
        cache_read=cached,
    )


class _ChatAssembly:
    """Folds `chat.completion.chunk`s into deltas and, at the end, one `Done`."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.text: list[str] = []
        self.thinking: list[str] = []
        self.calls: list[_Call] = []
        self.by_index: dict[int, _Call] = {}
        self.refused = False
        self.finish: str | None = None
        self.usage = Usage()

    def feed(self, chunk: JSONObject) -> list[StreamEvent]:
        # Servers report mid-stream failures as a data line, as an object or a bare string.
        error = chunk.get("error")
        if isinstance(error, dict):
            raise stream_error(error, SOURCE)
        if isinstance(error, str):
            raise stream_error({"message": error}, SOURCE)
        self.model = str(chunk.get("model") or self.model)
        if isinstance(chunk.get("usage"), dict):
            self.usage = _usage(chunk["usage"])
        events: list[StreamEvent] = []
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue  # keel asks for one choice
            events.extend(self._delta(choice.get("delta") or {}))
            if choice.get("finish_reason"):
                self.finish = str(choice["finish_reason"])
        return events

    def _delta(self, delta: JSONObject) -> list[StreamEvent]:
        events: list[StreamEvent] = []
        # DeepSeek and older vLLM say `reasoning_content`, Ollama, LM Studio and newer vLLM say
        # `reasoning`; a server that sends both sends the same text twice.
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            self.thinking.append(reasoning)
            events.append(ThinkingDelta(reasoning))
        for key in ("content", "refusal"):
            text = delta.get(key)
            if isinstance(text, str) and text:
                self.refused = self.refused or key == "refusal"
                self.text.append(text)
                events.append(TextDelta(text))
        for fragment in delta.get("tool_calls") or []:
            events.extend(self._tool_fragment(fragment))
        return events

    def _tool_fragment(self, fragment: JSONObject) -> list[StreamEvent]:
        function = fragment.get("function") or {}
        call, events = self._call(fragment, str(function.get("name") or ""))
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            call.fragments.append(arguments)
            events.append(ToolUseDelta(call.id, arguments))
        return events

    def _call(self, fragment: JSONObject, name: str) -> tuple[_Call, list[StreamEvent]]:
        """The call a fragment belongs to: by `index`, which every fragment carries; a new call
        when the index is new, or when a server that numbers every call 0 sends another id."""
        index = fragment.get("index")
        fragment_id = str(fragment.get("id") or "")
        if isinstance(index, int):
            call = self.by_index.get(index)
        else:
            call = self.calls[-1] if self.calls and not fragment_id else None
        if call is not None and not (call.server_id and fragment_id and fragment_id != call.id):
            if name and not call.name:
                call.name = name
            return call, []
        # A few servers omit ids; the loop and the journal need one per call.
        call = _Call(fragment_id or new_call_id(), name, bool(fragment_id))
        self.calls.append(call)
        if isinstance(index, int):
            self.by_index[index] = call
        return call, [ToolUseStart(call.id, call.name)]

    def stop_reason(self) -> StopReason:
        if self.refused:
            return "refusal"
        if self.finish in ("length", "content_filter"):
            return _FINISH[self.finish]
        # Some servers (Ollama among them) finish a tool-calling turn with `stop`.
        if self.calls:
            return "tool_use"
        return _FINISH.get(self.finish or "stop", "end_turn")

    def done(self) -> Done:
        blocks: list[Block] = []
        if self.thinking:
            blocks.append(Thinking("".join(self.thinking), source=SOURCE))
        if self.text:
            blocks.append(Text("".join(self.text)))
        blocks.extend(call.block() for call in self.calls)
        message = Message("assistant", tuple(blocks), provider=SOURCE, model=self.model)
        return Done(message, self.usage, self.stop_reason())


# ---------------------------------------------------------------------------------------------
# What a local server says about a model


def _positive(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def props_facts(props: object, model: str) -> ModelFacts:
    """Facts from llama.cpp's `/props`: `default_generation_settings.n_ctx` is the context of
    one slot (what one request gets when `total_slots` share the server's), and
    `chat_template_caps.supports_tools` whether the template renders tools at all."""
    if not isinstance(props, dict):
        return ModelFacts()
    settings = props.get("default_generation_settings")
    window = _positive(settings.get("n_ctx")) if isinstance(settings, dict) else 0
    caps = props.get("chat_template_caps")
    tools = caps.get("supports_tools") if isinstance(caps, dict) else None
    if not isinstance(tools, bool):
        return ModelFacts(window)
    warning = (
        ""
        if tools
        else f"the server's chat template for {model} has no tool support: llama.cpp drops the "
        "tools and the model cannot call any (start llama-server with --jinja, or give it a "
        "chat template that has tools)"
    )
    return ModelFacts(window, tools, warning)


def listed_window(listed: object, model: str) -> int:
    """`model`'s window in a `/models` list: llama.cpp's `meta.n_ctx` (newer servers), vLLM's
    `max_model_len`, else llama.cpp's trained `meta.n_ctx_train`; 0 when it is not listed."""
    entries = listed.get("data") if isinstance(listed, dict) else None
    if not isinstance(entries, list):
        return 0
    entries = [e for e in entries if isinstance(e, dict)]
    named = [e for e in entries if e.get("id") == model or model in (e.get("aliases") or ())]
    entry = named[0] if named else entries[0] if len(entries) == 1 else None
    if entry is None:
        return 0
    meta = entry.get("meta") if isinstance(entry.get("meta"), dict) else {}
    return (
        _positive(meta.get("n_ctx"))
        or _positive(entry.get("max_model_len"))
        or _positive(meta.get("n_ctx_train"))
    )


# ---------------------------------------------------------------------------------------------


class OpenAIChatProvider(HTTPProvider):
    """POST `{base}/chat/completions`, streamed. An empty key sends no Authorization header."""

    name = "openai-compatible"
    key_env = "OPENAI_COMPATIBLE_API_KEY"
    unreachable_hint = (
        'check the server is running and providers."openai-compatible".base_url '
        "(or OPENAI_COMPATIBLE_BASE_URL) points at it, e.g. http://localhost:8000/v1"
    )

    def __init__(self, *, base_url: str, api_key: str, settings: HTTPSettings) -> None:
        super().__init__(base_url=base_url, api_key=api_key, settings=settings)
        self._encoded = EncodedMessages(encode_messages)
        # (model, system, tools) -> the body's bytes up to `"messages":[`, and the system message.
        self._prefix_key: tuple[str, str, tuple[ToolSpec, ...]] | None = None
        self._prefix = b""
        self._system = b""
        #: What the server said about each model asked about (a local one only).
        self.facts: dict[str, ModelFacts] = {}

    def endpoint(self, request: Request) -> str:
        return f"{self.base_url}/chat/completions"

    async def model_facts(self, model: str) -> ModelFacts:
        if not self.local:
            return ModelFacts()
        facts = self.facts.get(model)
        if facts is None:
            facts, answered = await self._ask_server(model)
            if answered:  # else asked again before the next request (a server still loading)
                self.facts[model] = facts
        return facts

    async def prepare(self, request: Request) -> None:
        await self.model_facts(request.model)

    def reported_window(self, model: str) -> int:
        facts = self.facts.get(model)
        return facts.window if facts is not None else 0

    async def listed_models(self) -> list[str] | None:
        """The ids the server lists at `/models` (None: it did not answer with a list)."""
        listed, _ = await self._get_json(f"{self.base_url}/models")
        entries = listed.get("data") if isinstance(listed, dict) else None
        if not isinstance(entries, list):
            return None
        return [str(e["id"]) for e in entries if isinstance(e, dict) and e.get("id")]

    async def _ask_server(self, model: str) -> tuple[ModelFacts, bool]:
        """The facts, and whether the server answered at all."""
        root = self.base_url.removesuffix("/v1")
        props, answered = await self._get_json(f"{root}/props")
        facts = props_facts(props, model)
        if facts.window:
            return facts, True
        listed, listed_answered = await self._get_json(f"{self.base_url}/models")
        window = listed_window(listed, model)
        return ModelFacts(window, facts.tools, facts.warning), answered or listed_answered

    async def _get_json(self, url: str) -> tuple[object, bool]:
        """The JSON a GET of `url` answers (None: an error status, or not JSON), and whether
        the server answered: no answer, or 503 (llama.cpp while it loads the model), is not
        one."""
        answer = await self.fetch(url, PROBE_TIMEOUT)
        if answer is None:
            return None, False
        status, body = answer
        if status != 200:
            return None, status != 503
        try:
            return json.loads(body), True
        except ValueError:
            return None, True

    def headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def build_body(self, request: Request) -> bytes:
        """`model, tools, messages, …options`, stable parts first (see the Responses adapter)."""
        head = self._body_prefix(request)
        items = self._encoded(request.messages)
        if self._system:
            items.insert(0, self._system)
        return assemble(head, items, b"]," + dumps(_options(request))[1:])

    def _body_prefix(self, request: Request) -> bytes:
        key = (request.model, request.system, request.tools)
        if key != self._prefix_key:
            head: JSONObject = {"model": request.model}
            if request.tools:
                head["tools"] = [_tool(t) for t in request.tools]
            self._prefix = dumps(head)[:-1] + b',"messages":['
            self._system = (
                dumps({"role": "system", "content": request.system}) if request.system else b""
            )
            self._prefix_key = key
        return self._prefix

    async def decode(
        self, request: Request, chunks: AsyncGenerator[bytes, None]
    ) -> AsyncGenerator[StreamEvent, None]:
        assembly = _ChatAssembly(request.model)
        ended = False
        async for sse in iter_sse(chunks):
            if sse.data == "[DONE]":
                ended = True
                continue
            if ended:
                continue
            for event in assembly.feed(load_event(sse, self.name)):
                yield event
        # A server that forgets `[DONE]` after the finish chunk has still said everything.
        if not ended and assembly.finish is None:
            raise stream_cut(self.name)
        yield assembly.done()

    def error_from_response(self, status: int, body: bytes, headers: Mapping[str, str]) -> APIError:
        message = error_message(body)
        if is_overflow(error_code(body), message):
            return ContextOverflow(f"{self.name}: {message}", provider=self.name, status=status)
        return self.api_error(status, message, headers)
