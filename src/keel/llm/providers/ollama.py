"""Ollama's native API (`ollama/…` models): `/api/chat` streamed as NDJSON, spoken over httpx.

This module owns the translation between keel's neutral messages and Ollama's chat messages
(assistant `tool_calls` with object arguments, `tool` messages named by `tool_name`, images as
base64 lists, the model's own `thinking` replayed), the decoding of the NDJSON stream, and what
keel asks of the server: a context window (`options.num_ctx`, 32768 unless settings say
otherwise, never more than the model supports, which `/api/show` reports before the first
request) and `think` when an effort is set and the model can think. It also lists the models a
server has (`/api/tags`), for a model picker.

It must never import the `ollama` package, retry (`RetryingProvider` does) or let a wire dict
leave this module.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Mapping
from typing import Any, Final
from urllib.parse import urlsplit

from keel.frozen import frozen
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
from keel.llm.http import HTTPProvider, HTTPSettings, error_message, iter_ndjson
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
from keel.llm.provider import ModelFacts as ProviderFacts
from keel.llm.providers.openai_responses import (
    EncodedMessages,
    JSONObject,
    assemble,
    dumps,
    image_label,
    is_overflow,
    result_text,
    stream_cut,
)
from keel.llm.providers.wire import CallNames, call_json
from keel.llm.request import Effort, Request, ToolSpec

SOURCE: Final = "ollama"
DEFAULT_PORT: Final = 11434
#: The window keel asks for when settings do not say (`providers.ollama.num_ctx`). Ollama's own
#: default (2048 to 4096 tokens) cannot hold a coding agent's system prompt and tools.
DEFAULT_NUM_CTX: Final = 32_768

#: A prompt this share of the window or more has (or soon will have) been cut by the server.
FULL_WINDOW: Final = 0.95

_DONE_REASONS: Final[Mapping[str, StopReason]] = {"stop": "end_turn", "length": "max_tokens"}


def ollama_url(host: str) -> str:
    """A base URL from `OLLAMA_HOST` as Ollama reads it: `host`, `host:port` or a URL; no scheme
    means http, no port means 11434, and the listen-everywhere address means this machine."""
    if "://" not in host:
        host = f"http://{host}"
    parts = urlsplit(host)
    hostname = parts.hostname or "localhost"
    if hostname in ("0.0.0.0", "::"):
        hostname = "127.0.0.1"
    if ":" in hostname:
        hostname = f"[{hostname}]"
    port = parts.port or (443 if parts.scheme == "https" else DEFAULT_PORT)
    return f"{parts.scheme}://{hostname}:{port}{parts.path.rstrip('/')}"


@frozen
class ModelFacts:
    """What `/api/show` says about a model: its trained window (0 when not reported) and
    capabilities (`tools`, `thinking`, `vision`…; empty when the server predates the field)."""

    context_length: int = 0
    capabilities: tuple[str, ...] = ()

    def can(self, capability: str) -> bool:
        return not self.capabilities or capability in self.capabilities


def model_facts(show: Mapping[str, Any]) -> ModelFacts:
    """Facts from an `/api/show` reply: `model_info` holds `<architecture>.context_length`."""
    info = show.get("model_info") or {}
    arch = info.get("general.architecture", "")
    length = info.get(f"{arch}.context_length")
    if not isinstance(length, int):
        length = next((v for k, v in info.items() if k.endswith(".context_length")), 0)
    capabilities = show.get("capabilities") or ()
    return ModelFacts(int(length or 0), tuple(str(c) for c in capabilities))


@frozen
class LocalModel:
    """One model a local server has, for a picker."""

    name: str
    size: int = 0
    parameter_size: str = ""
    quantization: str = ""
    family: str = ""


def server_url(configured: str | None, env: Mapping[str, str]) -> str:
    """Where the user's Ollama server is: the settings' `base_url`, else `OLLAMA_HOST`, else
    the default local address."""
    return ollama_url(
        configured or env.get("OLLAMA_HOST", "") or f"http://localhost:{DEFAULT_PORT}"
    )


async def fetch_local_models(base: str, timeout: float = 1.0) -> list[LocalModel]:  # noqa: ASYNC109
    """The models the Ollama server at `base` has; none when nothing there answers in time."""
    import httpx

    try:
        async with httpx.AsyncClient(timeout=timeout) as client:
            reply = await client.get(f"{base}/api/tags")
        tags = reply.json() if reply.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return []
    return local_models(tags) if isinstance(tags, dict) else []


def local_models(tags: Mapping[str, Any]) -> list[LocalModel]:
    """The models in an `/api/tags` reply, sorted by name."""
    out = []
    for entry in tags.get("models") or ():
        details = entry.get("details") or {}
        out.append(
            LocalModel(
                str(entry.get("name") or entry.get("model") or ""),
                int(entry.get("size") or 0),
                str(details.get("parameter_size") or ""),
                str(details.get("quantization_level") or ""),
                str(details.get("family") or ""),
            )
        )
    return sorted(out, key=lambda m: m.name)


# ---------------------------------------------------------------------------------------------
# Request encoding


def _assistant(message: Message) -> list[JSONObject]:
    out: JSONObject = {
        "role": "assistant",
        "content": "".join(b.text for b in message.blocks if isinstance(b, Text)),
    }
    # Ollama's own reasoning goes back (gpt-oss and qwen3 use it between tool calls); another
    # provider's is not for this model.
    thinking = "".join(
        b.text for b in message.blocks if isinstance(b, Thinking) and b.source == SOURCE
    )
    if thinking:
        out["thinking"] = thinking
    calls = [
        {"function": {"name": b.name, "arguments": b.input or {}}}
        for b in message.blocks
        if isinstance(b, ToolUse)
    ]
    if calls:
        out["tool_calls"] = calls
    return [out]


def _user(message: Message, names: CallNames) -> list[JSONObject]:
    # Tool messages first, then one user message with the tools' images and the user's content.
    out: list[JSONObject] = []
    texts: list[str] = []
    images: list[str] = []
    for block in message.blocks:
        if isinstance(block, ToolResult):
            out.append(
                {
                    "role": "tool",
                    "content": result_text(block),
                    "tool_name": names[block.tool_use_id],
                }
            )
            attached = [b.data for b in block.content if isinstance(b, Image)]
            if attached:
                texts.append(image_label(block.tool_use_id))
                images.extend(attached)
        elif isinstance(block, Text):
            texts.append(block.text)
        elif isinstance(block, Image):
            images.append(block.data)
    if texts or images:
        user: JSONObject = {"role": "user", "content": "\n\n".join(texts)}
        if images:
            user["images"] = images
        out.append(user)
    return out


def _tool(spec: ToolSpec) -> JSONObject:
    return {
        "type": "function",
        "function": {
            "name": spec.name,
            "description": spec.description,
            "parameters": spec.input_schema,
        },
    }


def think_value(model: str, effort: Effort | None) -> bool | str | None:
    """`think` for `effort`: gpt-oss takes a level, other thinking models a switch."""
    if effort is None:
        return None
    if model.startswith("gpt-oss"):
        return "high" if effort == "max" else effort
    return True


# ---------------------------------------------------------------------------------------------
# Stream decoding


class _OllamaAssembly:
    def __init__(self, provider: OllamaProvider, model: str) -> None:
        self.provider = provider
        self.model = model
        self.text: list[str] = []
        self.thinking: list[str] = []
        self.calls: list[ToolUse] = []
        self.done_reason = ""
        self.finished = False
        self.usage = Usage()

    def feed(self, chunk: JSONObject) -> list[StreamEvent]:
        error = chunk.get("error")
        if error:
            raise self.provider.classify(500, str(error), {})
        self.model = str(chunk.get("model") or self.model)
        message = chunk.get("message") or {}
        events: list[StreamEvent] = []
        thinking = message.get("thinking")
        if isinstance(thinking, str) and thinking:
            self.thinking.append(thinking)
            events.append(ThinkingDelta(thinking))
        content = message.get("content")
        if isinstance(content, str) and content:
            self.text.append(content)
            events.append(TextDelta(content))
        for call in message.get("tool_calls") or ():
            events.extend(self._call(call))
        if chunk.get("done"):
            self.finished = True
            self.done_reason = str(chunk.get("done_reason") or "stop")
            self.usage = Usage(
                input=int(chunk.get("prompt_eval_count") or 0),
                output=int(chunk.get("eval_count") or 0),
            )
        return events

    def _call(self, call: JSONObject) -> list[StreamEvent]:
        function = call.get("function") or {}
        arguments = function.get("arguments")
        if isinstance(arguments, str):  # a few models' templates hand back JSON text
            try:
                arguments = json.loads(arguments)
            except ValueError:
                arguments = None
        block = ToolUse(
            str(call.get("id") or new_call_id()),
            str(function.get("name") or ""),
            arguments if isinstance(arguments, dict) else None,
            raw_input="" if isinstance(arguments, dict) else str(function.get("arguments")),
        )
        self.calls.append(block)
        return [ToolUseStart(block.id, block.name), ToolUseDelta(block.id, call_json(arguments))]

    def done(self) -> Done:
        blocks: list[Block] = []
        if self.thinking:
            blocks.append(Thinking("".join(self.thinking), source=SOURCE))
        if self.text:
            blocks.append(Text("".join(self.text)))
        blocks.extend(self.calls)
        stop = _DONE_REASONS.get(self.done_reason, "end_turn")
        if self.calls and stop == "end_turn":
            stop = "tool_use"
        message = Message("assistant", tuple(blocks), provider=SOURCE, model=self.model)
        return Done(message, self.usage, stop)


# ---------------------------------------------------------------------------------------------


class OllamaProvider(HTTPProvider):
    """POST `{base}/api/chat`, streamed as NDJSON. Before a model's first request it asks
    `/api/show` for the model's window and capabilities (once per model)."""

    name = SOURCE
    key_env = "OLLAMA_API_KEY"

    def __init__(
        self, *, base_url: str, api_key: str, settings: HTTPSettings, num_ctx: int = DEFAULT_NUM_CTX
    ) -> None:
        super().__init__(base_url=base_url, api_key=api_key, settings=settings)
        self.num_ctx = num_ctx
        self.facts: dict[str, ModelFacts] = {}
        self._names = CallNames()
        self._encoded = EncodedMessages(self._encode)
        self._prefix_key: tuple[str, str, tuple[ToolSpec, ...]] | None = None
        self._prefix = b""
        self._system = b""

    def endpoint(self, request: Request) -> str:
        return f"{self.base_url}/api/chat"

    def headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def window(self, model: str) -> int:
        """The window requested for `model`: the configured one, capped at what it supports."""
        trained = self.facts[model].context_length if model in self.facts else 0
        return min(self.num_ctx, trained) if trained else self.num_ctx

    def reported_window(self, model: str) -> int:
        return self.window(model)

    async def model_facts(self, model: str) -> ProviderFacts:
        """The window keel asks for `model` and whether it can call tools, from `/api/show`
        (asked once, as before a request). A server that cannot say leaves nothing known: the
        request itself then says what is wrong."""
        import httpx

        try:
            await self.prepare(Request(model=model, system="", messages=()))
        except (APIError, httpx.HTTPError):
            return ProviderFacts()
        facts = self.facts[model]
        return ProviderFacts(self.window(model), facts.can("tools") if facts.capabilities else None)

    async def prepare(self, request: Request) -> None:
        if request.model in self.facts:
            return
        response = await self._http().post(
            f"{self.base_url}/api/show", json={"model": request.model}, headers=self.headers()
        )
        if response.status_code >= 400:
            raise self.error_from_response(response.status_code, response.content, response.headers)
        try:
            show = response.json()
        except ValueError as exc:
            raise APIError(
                f"{self.base_url} did not answer /api/show as Ollama does",
                status=response.status_code,
                retryable=False,
                provider=self.name,
                hint=self.unreachable_hint,
            ) from exc
        self.facts[request.model] = model_facts(show if isinstance(show, dict) else {})

    def build_body(self, request: Request) -> bytes:
        """`model, tools, messages, …options`, stable parts first."""
        head = self._body_prefix(request)
        items = self._encoded(request.messages)
        if self._system:
            items.insert(0, self._system)
        return assemble(head, items, b"]," + dumps(self._options(request))[1:])

    def _options(self, request: Request) -> JSONObject:
        options: JSONObject = {
            "num_ctx": self.window(request.model),
            "num_predict": request.max_tokens,
        }
        if request.temperature is not None:
            options["temperature"] = request.temperature
        if request.top_p is not None:
            options["top_p"] = request.top_p
        out: JSONObject = {"stream": True}
        facts = self.facts.get(request.model, ModelFacts())
        think = think_value(request.model, request.effort) if facts.can("thinking") else None
        if think is not None:
            out["think"] = think
        out["options"] = options
        return out

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

    def _encode(self, message: Message) -> bytes:
        if message.role == "assistant":
            self._names.learn(message)
            items = _assistant(message)
        else:
            items = _user(message, self._names)
        return b",".join(dumps(item) for item in items)

    async def decode(
        self, request: Request, chunks: AsyncGenerator[bytes, None]
    ) -> AsyncGenerator[StreamEvent, None]:
        assembly = _OllamaAssembly(self, request.model)
        try:
            async for chunk in iter_ndjson(chunks):
                if assembly.finished:
                    continue
                for event in assembly.feed(chunk):
                    yield event
        except ValueError as exc:
            raise APIError(
                f"{self.name} sent a malformed stream line: {exc}",
                status=0,
                retryable=True,
                provider=self.name,
            ) from exc
        if not assembly.finished:
            raise stream_cut(self.name)
        window = self.window(request.model)
        if assembly.usage.input >= FULL_WINDOW * window:
            # Ollama cuts a prompt that does not fit from the front, silently.
            yield Notice(
                f"the conversation filled ollama's {window:,}-token window for {request.model}; "
                "its start may have been cut (raise providers.ollama.num_ctx, or /compact)",
                "warning",
            )
        yield assembly.done()

    def error_from_response(self, status: int, body: bytes, headers: Mapping[str, str]) -> APIError:
        return self.classify(status, error_message(body), headers)

    def classify(self, status: int, message: str, headers: Mapping[str, str]) -> APIError:
        """The `APIError` for an error response or an `error` line in the stream."""
        lowered = message.lower()
        if is_overflow("", message) or "context length" in lowered:
            return ContextOverflow(f"{self.name}: {message}", provider=self.name, status=status)
        error = self.api_error(status, message, headers)
        if status == 404 or "not found" in lowered:
            error.hint = "pull the model first (ollama pull MODEL), or pick one from `keel models`"
        elif "does not support tools" in lowered:
            error.hint = "this model cannot call tools; pick one that can (ollama show MODEL)"
        return error
