"""A loopback fake of Ollama's native API: `POST /api/chat` (NDJSON stream, or one object),
`POST /api/show` and `GET /api/tags`.

This module owns rendering a script's `Reply` and `Fault` steps as Ollama sends them: one JSON
line per fragment (`message.thinking`, `message.content`, whole `tool_calls` with object
arguments), then a `done` line with `done_reason` and the prompt and output token counts; errors as
`{"error": "…"}`. It answers `/api/show` with each model's `model_info` (`<arch>.context_length`)
and capabilities, and rejects what Ollama rejects: an unknown model (404), `think` for a model
that cannot think, tools for one that cannot call them.

It must never bind anything but 127.0.0.1 and never import keel's Ollama client: it is an
independent implementation of the wire format, cross-checked against the `ollama` package.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Final

from keel.frozen import frozen
from keel.llm.messages import Text, Thinking, ToolUse
from keel.testing.script import Reply, Step
from keel.testing.server import RecordedRequest, Responder, ResponseWriter, ScriptedHTTPServer

CREATED_AT: Final = "2026-01-01T00:00:00.000000Z"
_DONE_REASONS: Final = {"max_tokens": "length"}
_ROLES: Final = frozenset({"system", "user", "assistant", "tool"})


@frozen
class FakeModel:
    """A model the fake server has: its architecture, trained window and capabilities."""

    name: str
    family: str = "qwen3"
    context_length: int = 40_960
    capabilities: tuple[str, ...] = ("completion", "tools", "thinking")
    parameter_size: str = "8.2B"
    size: int = 5_225_387_923


DEFAULT_MODELS: Final = (
    FakeModel("qwen3:8b"),
    FakeModel("llama3:8b", "llama", 8_192, ("completion",), "8.0B", 4_661_224_676),
)


def pieces(text: str, count: int = 3) -> list[str]:
    if not text:
        return []
    size = max(1, -(-len(text) // count))
    return [text[i : i + size] for i in range(0, len(text), size)]


class OllamaServer(ScriptedHTTPServer):
    """Answers `/api/chat` from a script. `call_ids` adds an `id` to each tool call, as newer
    Ollama versions do."""

    model_paths = ("/api/chat",)

    def __init__(
        self,
        script: Iterable[Step] = (),
        *,
        responder: Responder | None = None,
        models: tuple[FakeModel, ...] = DEFAULT_MODELS,
        call_ids: bool = False,
    ) -> None:
        super().__init__(script, responder=responder)
        self.models: dict[str, FakeModel] = {m.name: m for m in models}
        self.call_ids = call_ids

    async def handle(self, request: RecordedRequest, response: ResponseWriter) -> None:
        if request.path in self.model_paths:
            body = request.json if request.body else {}
            problem, status = self.request_problem(body)
            if problem:
                await response.send_json(status, {"error": problem})
                return
        await super().handle(request, response)

    async def handle_other(self, request: RecordedRequest, response: ResponseWriter) -> None:
        path = request.path.split("?")[0]
        if request.method == "POST" and path == "/api/show":
            name = str((request.json or {}).get("model") or (request.json or {}).get("name"))
            model = self._model(name)
            if model is None:
                await response.send_json(404, {"error": f"model '{name}' not found"})
                return
            await response.send_json(200, _show(model))
        elif request.method == "GET" and path == "/api/tags":
            await response.send_json(200, {"models": [_tag(m) for m in self.models.values()]})
        elif request.method == "GET" and path == "/api/version":
            await response.send_json(200, {"version": "0.12.6"})
        else:
            await response.send_json(404, {"error": "404 page not found"})

    def _model(self, name: str) -> FakeModel | None:
        # `qwen3` means `qwen3:latest`; the fake's names carry their tags.
        return self.models.get(name) or self.models.get(f"{name}:latest")

    # -- rendering ----------------------------------------------------------------------------

    def is_streaming(self, request: RecordedRequest, body: Any) -> bool:
        return not (isinstance(body, dict) and body.get("stream") is False)

    def stream_headers(self) -> dict[str, str]:
        return {"content-type": "application/x-ndjson"}

    def _lines(self, step: Reply, request: RecordedRequest) -> Iterator[dict[str, Any]]:
        model = str((request.json or {}).get("model", ""))

        def line(**message: Any) -> dict[str, Any]:
            message = {"role": "assistant", "content": "", **message}
            return {"model": model, "created_at": CREATED_AT, "message": message, "done": False}

        for block in step.message.blocks:
            if isinstance(block, Thinking):
                yield from (line(thinking=p) for p in pieces(block.text))
            elif isinstance(block, Text):
                yield from (line(content=p) for p in pieces(block.text))
            elif isinstance(block, ToolUse):
                call: dict[str, Any] = {
                    "function": {"name": block.name, "arguments": block.input or {}}
                }
                if self.call_ids:
                    call["id"] = block.id
                yield line(tool_calls=[call])
        yield {
            "model": model,
            "created_at": CREATED_AT,
            "message": {"role": "assistant", "content": ""},
            "done": True,
            "done_reason": _DONE_REASONS.get(step.final_stop_reason, "stop"),
            "total_duration": 1_000_000,
            "load_duration": 100_000,
            "prompt_eval_count": step.usage.input,
            "prompt_eval_duration": 200_000,
            "eval_count": step.usage.output,
            "eval_duration": 700_000,
        }

    def render_stream(self, step: Reply, request: RecordedRequest) -> Iterable[bytes]:
        for line in self._lines(step, request):
            yield json.dumps(line).encode() + b"\n"

    def render_json(self, step: Reply, request: RecordedRequest) -> Any:
        lines = list(self._lines(step, request))
        final = dict(lines[-1])
        message: dict[str, Any] = {"role": "assistant", "content": ""}
        for line in lines[:-1]:
            part = line["message"]
            message["content"] += part.get("content", "")
            if "thinking" in part:
                message["thinking"] = message.get("thinking", "") + part["thinking"]
            if "tool_calls" in part:
                message.setdefault("tool_calls", []).extend(part["tool_calls"])
        final["message"] = message
        return final

    def render_error(self, status: int, message: str) -> Any:
        return {"error": message}

    def render_overflow(self, message: str) -> Any:
        return {"error": message or "the input length exceeds the context length"}

    # -- request validation -------------------------------------------------------------------

    def request_problem(self, body: Any) -> tuple[str, int]:
        """Why Ollama would reject this chat request, with its status, or ("", 0)."""
        if not isinstance(body, dict):
            return "invalid request body", 400
        name = str(body.get("model") or "")
        model = self._model(name)
        if model is None:
            return f"model '{name}' not found", 404
        if body.get("think") and "thinking" not in model.capabilities:
            return f'"{name}" does not support thinking', 400
        if body.get("tools") and "tools" not in model.capabilities:
            return f"registry.ollama.ai/library/{name} does not support tools", 400
        for message in body.get("messages") or ():
            problem = _message_problem(message)
            if problem:
                return problem, 400
        options = body.get("options") or {}
        if "num_ctx" in options and not isinstance(options["num_ctx"], int):
            return "json: cannot unmarshal number into Go value of type int", 400
        return "", 0


def _message_problem(message: Any) -> str:
    if not isinstance(message, Mapping) or message.get("role") not in _ROLES:
        return "invalid message role"
    for call in message.get("tool_calls") or ():
        if not isinstance(call.get("function", {}).get("arguments"), dict):
            return "json: cannot unmarshal string into Go struct field of type api.ToolCallFunctionArguments"
    return ""


def _show(model: FakeModel) -> dict[str, Any]:
    return {
        "modelfile": f"FROM {model.name}",
        "parameters": "temperature 0.6",
        "template": "{{ .Prompt }}",
        "details": _details(model),
        "model_info": {
            "general.architecture": model.family,
            "general.parameter_count": 8_190_735_360,
            f"{model.family}.context_length": model.context_length,
            f"{model.family}.embedding_length": 4096,
        },
        "capabilities": list(model.capabilities),
        "modified_at": CREATED_AT,
    }


def _details(model: FakeModel) -> dict[str, Any]:
    return {
        "parent_model": "",
        "format": "gguf",
        "family": model.family,
        "families": [model.family],
        "parameter_size": model.parameter_size,
        "quantization_level": "Q4_K_M",
    }


def _tag(model: FakeModel) -> dict[str, Any]:
    return {
        "name": model.name,
        "model": model.name,
        "modified_at": CREATED_AT,
        "size": model.size,
        "digest": "0" * 64,
        "details": _details(model),
    }


__all__ = ["DEFAULT_MODELS", "FakeModel", "OllamaServer", "pieces"]
