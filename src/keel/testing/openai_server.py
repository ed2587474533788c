"""Loopback servers that speak OpenAI's two wire APIs: the Responses API (`/v1/responses`) and
Chat Completions (`/v1/chat/completions`), plus `GET /v1/models`.

They render a script's neutral `Reply` exactly as the real API would (streamed events with their
sequence numbers and indexes, or one JSON object), errors in OpenAI's shape, and a context
overflow as the 400 `context_length_exceeded` the API sends. The official `openai` SDK reads them
in keel's tests, so both keel's clients and these servers are checked against it.

They must never reach the network (127.0.0.1 only) nor import keel's provider adapters: they are
an independent implementation of the wire format, which is what makes them worth testing against.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Iterator
from typing import Any, Literal

from keel.llm.messages import Citation, Message, Text, Thinking, ToolUse, Usage, WebSearch
from keel.testing.script import Reply, Step
from keel.testing.server import RecordedRequest, Responder, ResponseWriter, ScriptedHTTPServer

#: A fixed creation time keeps rendered responses deterministic.
CREATED = 1_767_225_600

_ERROR_TYPES = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("invalid_request_error", "unsupported_country_region_territory"),
    404: ("invalid_request_error", "model_not_found"),
    429: ("requests", "rate_limit_exceeded"),
}


def pieces(text: str, count: int = 3) -> list[str]:
    """`text` cut into up to `count` deltas, as a streaming model sends it."""
    if not text:
        return []
    size = max(1, -(-len(text) // count))
    return [text[i : i + size] for i in range(0, len(text), size)]


def _arguments(call: ToolUse) -> str:
    return call.raw_input if call.input is None else json.dumps(call.input)


def _final_arguments(message: Message, truncate: bool) -> dict[int, str]:
    """Arguments per block index; with `truncate`, the last call's are cut in half."""
    out = {i: _arguments(b) for i, b in enumerate(message.blocks) if isinstance(b, ToolUse)}
    if truncate and out:
        last = max(out)
        out[last] = out[last][: len(out[last]) // 2]
    return out


class _OpenAIServer(ScriptedHTTPServer):
    """What both OpenAI servers share: API-key checks, `/v1/models`, OpenAI's error shape."""

    def __init__(
        self,
        script: Iterable[Step] = (),
        *,
        responder: Responder | None = None,
        api_key: str = "",
        models: tuple[str, ...] = ("gpt-5", "gpt-5-mini"),
    ) -> None:
        super().__init__(script, responder=responder)
        self.api_key = api_key
        self.models = models
        self._serial = itertools.count(1)

    def next_id(self, prefix: str) -> str:
        return f"{prefix}{next(self._serial):08x}"

    async def handle(self, request: RecordedRequest, response: ResponseWriter) -> None:
        if self.api_key and request.headers.get("authorization") != f"Bearer {self.api_key}":
            # Rejected before the script is consulted, as the real API rejects before any work.
            message = "Incorrect API key provided. You can find your API key in your dashboard."
            await response.send_json(401, self.render_error(401, message))
            return
        await super().handle(request, response)

    async def handle_other(self, request: RecordedRequest, response: ResponseWriter) -> None:
        path = request.path.split("?")[0]
        if request.method == "GET" and path in ("/v1/models", "/models"):
            data = [
                {"id": m, "object": "model", "created": CREATED, "owned_by": "keel-testing"}
                for m in self.models
            ]
            await response.send_json(200, {"object": "list", "data": data})
            return
        message = f"Invalid URL ({request.method} {path})"
        await response.send_json(404, {"error": _error(message, "invalid_request_error", None)})

    def is_streaming(self, request: RecordedRequest, body: Any) -> bool:
        return isinstance(body, dict) and body.get("stream") is True

    def render_error(self, status: int, message: str) -> Any:
        kind, code = _ERROR_TYPES.get(status, ("server_error", None))
        return {"error": _error(message, kind, code)}

    @staticmethod
    def body_of(request: RecordedRequest) -> dict[str, Any]:
        body = request.json
        return body if isinstance(body, dict) else {}


def _error(message: str, kind: str, code: str | None, param: str | None = None) -> dict[str, Any]:
    return {"message": message, "type": kind, "param": param, "code": code}


# ---------------------------------------------------------------------------------------------
# Responses API


def _responses_usage(usage: Usage) -> dict[str, Any]:
    # OpenAI bills no cache writes, so a script's cache_write tokens count as plain input.
    prompt = usage.input + usage.cache_read + usage.cache_write
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": usage.cache_read},
        "output_tokens": usage.output,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + usage.output,
    }


class _ResponseRender:
    """One response rendered from a `Reply`: its output items (final form) and its events."""

    def __init__(self, server: OpenAIResponsesServer, step: Reply, body: dict[str, Any]) -> None:
        self.step = step
        self.body = body
        self.id = server.next_id("resp_")
        self.encrypted = "reasoning.encrypted_content" in (body.get("include") or [])
        self.truncated = step.final_stop_reason == "max_tokens"
        self.refusal = step.final_stop_reason == "refusal"
        arguments = _final_arguments(step.message, step.truncate_tool_json)
        self.cut_index = max(arguments) if step.truncate_tool_json and arguments else -1
        self.items: list[dict[str, Any]] = []
        for index, block in enumerate(step.message.blocks):
            if isinstance(block, Thinking):
                self.items.append(self._reasoning(server, block))
            elif isinstance(block, Text):
                self.items.append(self._message(server, block.text, block.citations))
            elif isinstance(block, ToolUse):
                self.items.append(self._call(server, block, arguments[index], index))
            elif isinstance(block, WebSearch):
                self.items.append(self._search(block))

    def _search(self, block: WebSearch) -> dict[str, Any]:
        """A `web_search_call` item; its sources only when the request asked for them."""
        action: dict[str, Any]
        if block.action == "search":
            action = {"type": "search", "query": block.query}
            if "web_search_call.action.sources" in (self.body.get("include") or []):
                action["sources"] = [{"type": "url", "url": r.url} for r in block.results]
        elif block.action == "find_in_page":
            action = {"type": "find_in_page", "url": block.url, "pattern": block.pattern}
        else:
            action = {"type": block.action, "url": block.url}
        return {"id": block.id, "type": "web_search_call", "status": block.status, "action": action}

    def _reasoning(self, server: OpenAIResponsesServer, block: Thinking) -> dict[str, Any]:
        item: dict[str, Any] = {
            "id": block.item_id or server.next_id("rs_"),
            "type": "reasoning",
            "summary": [{"type": "summary_text", "text": block.text}] if block.text else [],
        }
        if self.encrypted:
            item["encrypted_content"] = block.signature
        return item

    def _message(
        self, server: OpenAIResponsesServer, text: str, citations: tuple[Citation, ...] = ()
    ) -> dict[str, Any]:
        annotations = [
            {
                "type": "url_citation",
                "start_index": c.start,
                "end_index": c.end,
                "title": c.title,
                "url": c.url,
            }
            for c in citations
        ]
        part: dict[str, Any] = (
            {"type": "refusal", "refusal": text}
            if self.refusal
            else {"type": "output_text", "annotations": annotations, "logprobs": [], "text": text}
        )
        return {
            "id": server.next_id("msg_"),
            "type": "message",
            "status": "completed",
            "content": [part],
            "role": "assistant",
        }

    def _call(
        self, server: OpenAIResponsesServer, block: ToolUse, arguments: str, index: int
    ) -> dict[str, Any]:
        return {
            "id": server.next_id("fc_"),
            "type": "function_call",
            "status": "incomplete" if index == self.cut_index else "completed",
            "arguments": arguments,
            "call_id": block.id,
            "name": block.name,
        }

    def response(self, *, final: bool) -> dict[str, Any]:
        body = self.body
        status = ("incomplete" if self.truncated else "completed") if final else "in_progress"
        reasoning = body.get("reasoning") or {}
        return {
            "id": self.id,
            "object": "response",
            "created_at": CREATED,
            "status": status,
            "background": False,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"}
            if final and self.truncated
            else None,
            "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"),
            "model": body.get("model", ""),
            "output": self.items if final else [],
            "parallel_tool_calls": True,
            "previous_response_id": None,
            "prompt_cache_key": body.get("prompt_cache_key"),
            "reasoning": {
                "effort": reasoning.get("effort"),
                "summary": reasoning.get("summary"),
            },
            "store": body.get("store", True),
            "temperature": body.get("temperature", 1.0),
            "text": {"format": {"type": "text"}, "verbosity": "medium"},
            "tool_choice": "auto",
            "tools": body.get("tools") or [],
            "top_p": body.get("top_p", 1.0),
            "truncation": "disabled",
            "usage": _responses_usage(self.step.usage) if final else None,
            "metadata": {},
        }

    # -- the event stream -----------------------------------------------------------------------

    def events(self) -> Iterator[dict[str, Any]]:
        """Events without `sequence_number`, which `OpenAIResponsesServer` numbers."""
        yield {"type": "response.created", "response": self.response(final=False)}
        yield {"type": "response.in_progress", "response": self.response(final=False)}
        for index, item in enumerate(self.items):
            if item["type"] == "reasoning":
                yield from self._reasoning_events(index, item)
            elif item["type"] == "message":
                yield from self._message_events(index, item)
            elif item["type"] == "web_search_call":
                yield from self._search_events(index, item)
            else:
                yield from self._call_events(index, item)
        kind = "response.incomplete" if self.truncated else "response.completed"
        yield {"type": kind, "response": self.response(final=True)}

    @staticmethod
    def _reasoning_events(index: int, item: dict[str, Any]) -> Iterator[dict[str, Any]]:
        where = {"item_id": item["id"], "output_index": index}
        yield {
            "type": "response.output_item.added",
            "output_index": index,
            "item": {"id": item["id"], "type": "reasoning", "summary": []},
        }
        for summary_index, part in enumerate(item["summary"]):
            at = {**where, "summary_index": summary_index}
            empty = {"type": "summary_text", "text": ""}
            yield {"type": "response.reasoning_summary_part.added", **at, "part": empty}
            for delta in pieces(part["text"]):
                yield {
                    "type": "response.reasoning_summary_text.delta",
                    **at,
                    "delta": delta,
                    "obfuscation": "",
                }
            yield {"type": "response.reasoning_summary_text.done", **at, "text": part["text"]}
            yield {"type": "response.reasoning_summary_part.done", **at, "part": part}
        yield {"type": "response.output_item.done", "output_index": index, "item": item}

    @staticmethod
    def _message_events(index: int, item: dict[str, Any]) -> Iterator[dict[str, Any]]:
        at = {"item_id": item["id"], "output_index": index, "content_index": 0}
        part = item["content"][0]
        yield {
            "type": "response.output_item.added",
            "output_index": index,
            "item": {**item, "status": "in_progress", "content": []},
        }
        if part["type"] == "refusal":
            empty: dict[str, Any] = {"type": "refusal", "refusal": ""}
            yield {"type": "response.content_part.added", **at, "part": empty}
            for delta in pieces(part["refusal"]):
                yield {"type": "response.refusal.delta", **at, "delta": delta}
            yield {"type": "response.refusal.done", **at, "refusal": part["refusal"]}
        else:
            empty = {"type": "output_text", "annotations": [], "logprobs": [], "text": ""}
            yield {"type": "response.content_part.added", **at, "part": empty}
            for delta in pieces(part["text"]):
                yield {
                    "type": "response.output_text.delta",
                    **at,
                    "delta": delta,
                    "logprobs": [],
                    "obfuscation": "",
                }
            for number, annotation in enumerate(part["annotations"]):
                yield {
                    "type": "response.output_text.annotation.added",
                    **at,
                    "annotation_index": number,
                    "annotation": annotation,
                }
            yield {
                "type": "response.output_text.done",
                **at,
                "text": part["text"],
                "logprobs": [],
            }
        yield {"type": "response.content_part.done", **at, "part": part}
        yield {"type": "response.output_item.done", "output_index": index, "item": item}

    @staticmethod
    def _search_events(index: int, item: dict[str, Any]) -> Iterator[dict[str, Any]]:
        at = {"item_id": item["id"], "output_index": index}
        yield {
            "type": "response.output_item.added",
            "output_index": index,
            "item": {
                "id": item["id"],
                "type": "web_search_call",
                "status": "in_progress",
                "action": {"type": "search"},
            },
        }
        yield {"type": "response.web_search_call.in_progress", **at}
        yield {"type": "response.web_search_call.searching", **at}
        if item["status"] != "completed":
            return  # cut short: the item never finishes
        yield {"type": "response.web_search_call.completed", **at}
        yield {"type": "response.output_item.done", "output_index": index, "item": item}

    @staticmethod
    def _call_events(index: int, item: dict[str, Any]) -> Iterator[dict[str, Any]]:
        at = {"item_id": item["id"], "output_index": index}
        yield {
            "type": "response.output_item.added",
            "output_index": index,
            "item": {**item, "status": "in_progress", "arguments": ""},
        }
        for delta in pieces(item["arguments"]):
            yield {
                "type": "response.function_call_arguments.delta",
                **at,
                "delta": delta,
                "obfuscation": "",
            }
        if item["status"] == "incomplete":
            return  # cut off by max_output_tokens: the item never finishes
        yield {
            "type": "response.function_call_arguments.done",
            **at,
            "arguments": item["arguments"],
        }
        yield {"type": "response.output_item.done", "output_index": index, "item": item}


class OpenAIResponsesServer(_OpenAIServer):
    """`POST /v1/responses`, streamed (`stream: true`) or not."""

    model_paths = ("/v1/responses", "/responses")

    def render_stream(self, step: Reply, request: RecordedRequest) -> Iterable[bytes]:
        render = _ResponseRender(self, step, self.body_of(request))
        for number, event in enumerate(render.events()):
            # The real API puts `type` first and `sequence_number` right after it.
            kind = event.pop("type")
            yield self.sse(kind, {"type": kind, "sequence_number": number, **event})

    def render_json(self, step: Reply, request: RecordedRequest) -> Any:
        return _ResponseRender(self, step, self.body_of(request)).response(final=True)

    def render_overflow(self, message: str) -> Any:
        message = message or (
            "Your input exceeds the context window of this model. "
            "Please adjust your input and try again."
        )
        return {
            "error": _error(message, "invalid_request_error", "context_length_exceeded", "input")
        }


# ---------------------------------------------------------------------------------------------
# Chat Completions


def _chat_usage(usage: Usage) -> dict[str, Any]:
    prompt = usage.input + usage.cache_read + usage.cache_write
    return {
        "prompt_tokens": prompt,
        "completion_tokens": usage.output,
        "total_tokens": prompt + usage.output,
        "prompt_tokens_details": {"cached_tokens": usage.cache_read, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


def _finish_reason(step: Reply) -> str:
    match step.final_stop_reason:
        case "max_tokens":
            return "length"
        case "tool_use" if step.message.tool_uses:
            return "tool_calls"
        case _:
            # A refusal finishes with `stop`; the `refusal` field says what happened.
            return "stop"


class OpenAIChatServer(_OpenAIServer):
    """`POST /v1/chat/completions`, streamed or not, as OpenAI and compatible servers answer.

    `reasoning_field` names the delta field that carries reasoning (`reasoning_content` as
    DeepSeek and vLLM send it, or `reasoning` as Ollama and LM Studio do). With
    `interleave_tool_calls`, parallel calls' fragments arrive round-robin instead of one call
    after another, as some servers stream them.
    """

    model_paths = ("/v1/chat/completions", "/chat/completions")

    def __init__(
        self,
        script: Iterable[Step] = (),
        *,
        responder: Responder | None = None,
        api_key: str = "",
        models: tuple[str, ...] = ("local-model",),
        reasoning_field: Literal["reasoning_content", "reasoning"] = "reasoning_content",
        interleave_tool_calls: bool = False,
    ) -> None:
        super().__init__(script, responder=responder, api_key=api_key, models=models)
        self.reasoning_field = reasoning_field
        self.interleave_tool_calls = interleave_tool_calls

    def _chunk(self, completion_id: str, model: str, choices: list[Any], **extra: Any) -> bytes:
        chunk = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": CREATED,
            "model": model,
            "service_tier": "default",
            "system_fingerprint": "fp_keel",
            "choices": choices,
            **extra,
        }
        return self.sse(None, chunk)

    def render_stream(self, step: Reply, request: RecordedRequest) -> Iterable[bytes]:
        body = self.body_of(request)
        model = str(body.get("model", ""))
        completion_id = self.next_id("chatcmpl-")
        usage_requested = bool((body.get("stream_options") or {}).get("include_usage"))
        # With include_usage every chunk carries `usage: null` until the last one.
        extra: dict[str, Any] = {"usage": None} if usage_requested else {}

        def delta_chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            return self._chunk(completion_id, model, [choice], **extra)

        refusal = step.final_stop_reason == "refusal"
        first: dict[str, Any] = {"role": "assistant", "content": "", "refusal": None}
        yield delta_chunk(first)
        for block in step.message.blocks:
            if isinstance(block, Thinking):
                for piece in pieces(block.text):
                    yield delta_chunk({self.reasoning_field: piece})
            elif isinstance(block, Text):
                for piece in pieces(block.text):
                    yield delta_chunk({"refusal" if refusal else "content": piece})
        for fragment in self._tool_fragments(step):
            yield delta_chunk({"tool_calls": [fragment]})
        yield delta_chunk({}, _finish_reason(step))
        if usage_requested:
            yield self._chunk(completion_id, model, [], usage=_chat_usage(step.usage))
        yield self.sse(None, "[DONE]")

    def _tool_fragments(self, step: Reply) -> list[dict[str, Any]]:
        arguments = _final_arguments(step.message, step.truncate_tool_json)
        calls: list[list[dict[str, Any]]] = []
        for index, (block_index, args) in enumerate(sorted(arguments.items())):
            block = step.message.blocks[block_index]
            assert isinstance(block, ToolUse)
            head = {
                "index": index,
                "id": block.id,
                "type": "function",
                "function": {"name": block.name, "arguments": ""},
            }
            tail = [{"index": index, "function": {"arguments": p}} for p in pieces(args)]
            calls.append([head, *tail])
        if not self.interleave_tool_calls:
            return [fragment for call in calls for fragment in call]
        rounds = itertools.zip_longest(*calls)
        return [fragment for group in rounds for fragment in group if fragment is not None]

    def render_json(self, step: Reply, request: RecordedRequest) -> Any:
        body = self.body_of(request)
        refusal = step.final_stop_reason == "refusal"
        text = "".join(b.text for b in step.message.blocks if isinstance(b, Text))
        message: dict[str, Any] = {
            "role": "assistant",
            "content": None if refusal or not text else text,
            "refusal": text if refusal else None,
            "annotations": [],
        }
        thinking = "".join(b.text for b in step.message.blocks if isinstance(b, Thinking))
        if thinking:
            message[self.reasoning_field] = thinking
        arguments = _final_arguments(step.message, step.truncate_tool_json)
        if arguments:
            message["tool_calls"] = [
                {
                    "id": block.id,
                    "type": "function",
                    "function": {"name": block.name, "arguments": arguments[i]},
                }
                for i, block in enumerate(step.message.blocks)
                if isinstance(block, ToolUse)
            ]
        choice = {
            "index": 0,
            "message": message,
            "logprobs": None,
            "finish_reason": _finish_reason(step),
        }
        return {
            "id": self.next_id("chatcmpl-"),
            "object": "chat.completion",
            "created": CREATED,
            "model": body.get("model", ""),
            "choices": [choice],
            "usage": _chat_usage(step.usage),
            "service_tier": "default",
            "system_fingerprint": "fp_keel",
        }

    def render_overflow(self, message: str) -> Any:
        message = message or (
            "This model's maximum context length is 128000 tokens. However, your messages "
            "resulted in 131072 tokens. Please reduce the length of the messages."
        )
        return {
            "error": _error(message, "invalid_request_error", "context_length_exceeded", "messages")
        }


__all__ = ["CREATED", "OpenAIChatServer", "OpenAIResponsesServer", "pieces"]
