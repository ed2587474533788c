"""A loopback server that behaves as llama.cpp's `llama-server` does for a coding agent: Chat
Completions with a fixed context (`n_ctx`), the model facts it publishes (`GET /props`,
`GET /v1/models` with `meta`, `GET /health`), its 400 for a prompt that does not fit, a reply cut
with `length` when prompt and output fill the context (context shift off, llama.cpp's default), a
prefix cache per slot reported as `cached_tokens`, `tools` dropped when the chat template has no
tool support, and the connection closed after every streamed response without a
`Connection: close` header (what llama-server does; a client that reuses that connection fails).

Tokens are counted deterministically, not by a tokenizer: the request is rendered to a ChatML
prompt (`render_prompt`: the system message, the tools when the template supports them, each
message, the assistant header) and every 4 bytes of it, rounded up, are one token
(`count_tokens`). A reply's output counts the same way (its text and its tool calls' JSON).

Replies come from a script as with every keel.testing server: text (what small models write,
tool calls included) or real `tool_calls`. It must never reach the network (127.0.0.1 only) nor
import keel's provider adapters.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Sequence
from typing import Any

from keel.llm.messages import Message, Text, ToolUse, Usage
from keel.testing.openai_server import CREATED, OpenAIChatServer
from keel.testing.script import Reply, Step
from keel.testing.server import RecordedRequest, Responder, ResponseWriter

#: Bytes of rendered prompt per token.
BYTES_PER_TOKEN = 4
#: What llama-server says in each response head.
KEEP_ALIVE = "timeout=5, max=100"

_CHATML_TOOLS = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)


def count_tokens(text: str) -> int:
    """The tokens `text` counts for: one per 4 bytes, rounded up."""
    return -(-len(text.encode()) // BYTES_PER_TOKEN)


def _pieces(text: str) -> list[bytes]:
    data = text.encode()
    return [data[i : i + BYTES_PER_TOKEN] for i in range(0, len(data), BYTES_PER_TOKEN)]


def _content(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


def render_prompt(body: dict[str, Any], *, tools: bool = True) -> str:
    """The ChatML prompt a Qwen-style template makes of a Chat Completions body; `tools` False
    leaves the request's tools out, as a template without tool support does."""
    messages = [m for m in body.get("messages") or () if isinstance(m, dict)]
    system = _content(messages[0]) if messages and messages[0].get("role") == "system" else ""
    if system:
        messages = messages[1:]
    specs = body.get("tools") or () if tools else ()
    out = []
    if specs:
        listed = "".join("\n" + json.dumps(t, separators=(",", ":")) for t in specs)
        out.append(f"<|im_start|>system\n{system}{_CHATML_TOOLS}{listed}\n</tools><|im_end|>\n")
    elif system:
        out.append(f"<|im_start|>system\n{system}<|im_end|>\n")
    for message in messages:
        text = _content(message)
        for call in message.get("tool_calls") or ():
            function = call.get("function") or {}
            text += (
                "\n<tool_call>\n" + json.dumps(function, separators=(",", ":")) + "\n</tool_call>"
            )
        out.append(f"<|im_start|>{message.get('role', 'user')}\n{text}<|im_end|>\n")
    out.append("<|im_start|>assistant\n")
    return "".join(out)


def _output_text(message: Message) -> str:
    calls = [
        json.dumps({"name": b.name, "arguments": b.input}, separators=(",", ":"))
        for b in message.blocks
        if isinstance(b, ToolUse)
    ]
    return message.text + "".join(calls)


class LlamaCppServer(OpenAIChatServer):
    """llama-server on 127.0.0.1, serving one model as `alias` with a context of `n_ctx` tokens
    per slot (llama-server's `-c` divided among its `total_slots`: `-c 4096 -np 2` reports 2048 in
    `/props` and in `/v1/models` `meta.n_ctx`, and one request gets that). `supports_tools` False is a chat template without tools (started without
    `--jinja`): `tools` are dropped from the prompt and `/props` says so. `close_delay` holds a
    connection that long after a streamed response before closing it (llama-server closes at
    once; a delay makes a client's reuse of it certain in a test)."""

    def __init__(
        self,
        script: Iterable[Step] = (),
        *,
        responder: Responder | None = None,
        api_key: str = "",
        alias: str = "local-model",
        n_ctx: int = 4096,
        n_ctx_train: int = 32768,
        total_slots: int = 1,
        supports_tools: bool = True,
        model_path: str = "/models/local-model-q4_k_m.gguf",
        close_delay: float = 0.0,
    ) -> None:
        super().__init__(script, responder=responder, api_key=api_key, models=(alias,))
        self.alias = alias
        self.n_ctx = n_ctx
        self.n_ctx_train = n_ctx_train
        self.total_slots = total_slots
        self.supports_tools = supports_tools
        self.model_path = model_path
        self.close_delay = close_delay
        #: While True every request gets llama-server's 503 for a model still loading.
        self.loading = False
        #: The tokens of the last prompt the slot processed (its prefix cache).
        self.slot_cache: list[bytes] = []
        #: Per model request, in order: (prompt tokens, cached tokens), overflows included.
        self.prompts: list[tuple[int, int]] = []
        self._streamed: set[int] = set()

    # -- what llama-server publishes ---------------------------------------------------------------

    def props(self) -> dict[str, Any]:
        """`GET /props`, as llama-server answers it (the fields a client reads)."""
        return {
            "default_generation_settings": {
                "params": {"n_predict": -1, "max_tokens": -1, "stream": False},
                "n_ctx": self.n_ctx,
            },
            "total_slots": self.total_slots,
            "model_alias": self.alias,
            "model_path": self.model_path,
            "modalities": {"vision": False, "video": False, "audio": False},
            "chat_template": "{# a ChatML template #}",
            "chat_template_caps": {
                "supports_object_arguments": self.supports_tools,
                "supports_parallel_tool_calls": self.supports_tools,
                "supports_string_content": True,
                "supports_system_role": True,
                "supports_tool_calls": self.supports_tools,
                "supports_tools": self.supports_tools,
                "supports_typed_content": False,
            },
            "bos_token": "<|endoftext|>",
            "eos_token": "<|im_end|>",
            "build_info": "b0-keel-testing",
        }

    def models_list(self) -> dict[str, Any]:
        """`GET /v1/models`: OpenAI's list with llama.cpp's `meta` (newer servers report the
        context they run with, `n_ctx`, beside the trained one)."""
        meta = {
            "vocab_type": 2,
            "n_vocab": 151936,
            "n_ctx": self.n_ctx,
            "n_ctx_train": self.n_ctx_train,
            "n_embd": 896,
            "n_params": 630167424,
            "size": 485452288,
            "ftype": "Q4_K - Medium",
        }
        entry = {
            "id": self.alias,
            "aliases": [self.alias],
            "tags": [],
            "object": "model",
            "created": CREATED,
            "owned_by": "llamacpp",
            "meta": meta,
        }
        return {"object": "list", "data": [entry]}

    async def handle_other(self, request: RecordedRequest, response: ResponseWriter) -> None:
        path = request.path.split("?")[0]
        if request.method == "GET" and path in ("/health", "/v1/health"):
            await response.send_json(200, {"status": "ok"})
        elif request.method == "GET" and path == "/props":
            await response.send_json(200, self.props())
        elif request.method == "GET" and path in ("/v1/models", "/models"):
            await response.send_json(200, self.models_list())
        else:
            error = {"code": 404, "message": "File Not Found", "type": "not_found_error"}
            await response.send_json(404, {"error": error})

    # -- a model request --------------------------------------------------------------------------

    async def handle(self, request: RecordedRequest, response: ResponseWriter) -> None:
        if self.loading:
            error = {"code": 503, "message": "Loading model", "type": "unavailable_error"}
            await response.send_json(503, {"error": error})
            return
        authorized = not self.api_key or (
            request.headers.get("authorization") == f"Bearer {self.api_key}"
        )
        is_model = request.path.split("?")[0] in self.model_paths and request.method == "POST"
        if authorized and is_model:
            prompt = count_tokens(self.prompt_of(request))
            if prompt > self.n_ctx:
                self.prompts.append((prompt, 0))
                await response.send_json(400, self.exceeded(prompt))
                return
        await super().handle(request, response)
        if id(request) in self._streamed:
            self._streamed.discard(id(request))
            # llama-server ends the connection after a streamed response, unannounced.
            if self.close_delay:
                await asyncio.sleep(self.close_delay)
            response.keep_alive = False

    def prompt_of(self, request: RecordedRequest) -> str:
        return render_prompt(self.body_of(request), tools=self.supports_tools)

    def exceeded(self, prompt: int) -> dict[str, Any]:
        """llama-server's 400 for a prompt longer than the context."""
        message = (
            f"request ({prompt} tokens) exceeds the available context size "
            f"({self.n_ctx} tokens), try increasing it"
        )
        error = {
            "code": 400,
            "message": message,
            "type": "exceed_context_size_error",
            "n_prompt_tokens": prompt,
            "n_ctx": self.n_ctx,
        }
        return {"error": error}

    def render_overflow(self, message: str) -> Any:
        # A scripted `Fault("overflow")`: the same 400 for a prompt one token too long.
        return self.exceeded(self.n_ctx + 1)

    def render_error(self, status: int, message: str) -> Any:
        return {"error": {"code": status, "message": message, "type": "server_error"}}

    def next_step(self, request: RecordedRequest) -> Step:
        step = super().next_step(request)
        return self.served(step, request) if isinstance(step, Reply) else step

    def served(self, step: Reply, request: RecordedRequest) -> Reply:
        """`step` as this server would produce it for `request`: usage counted from the prompt
        (with the slot's cache) and the output, and the output cut at `max_tokens` or where
        the context is full."""
        tokens = _pieces(self.prompt_of(request))
        prompt = len(tokens)
        cached = _common_prefix(self.slot_cache, tokens)
        # The last prompt token is always evaluated again, even on a full match.
        cached = min(cached, max(0, prompt - 1))
        self.slot_cache = tokens
        self.prompts.append((prompt, cached))
        body = self.body_of(request)
        asked = body.get("max_tokens", body.get("max_completion_tokens"))
        room = self.n_ctx - prompt
        limit = room if not isinstance(asked, int) or asked < 0 else min(asked, room)
        message, stop = step.message, step.stop_reason
        output = count_tokens(_output_text(message))
        if output > limit:
            kept = _output_text(message).encode()[: limit * BYTES_PER_TOKEN]
            text = kept.decode("utf-8", "ignore")
            message = Message("assistant", (Text(text),) if text else ())
            output, stop = limit, "max_tokens"
        usage = Usage(input=prompt - cached, output=output, cache_read=cached)
        return Reply(message, usage, stop, step.truncate_tool_json, step.delay, step.expect)

    def render_stream(self, step: Reply, request: RecordedRequest) -> Iterable[bytes]:
        self._streamed.add(id(request))
        return super().render_stream(step, request)

    def stream_headers(self) -> dict[str, str]:
        return {"keep-alive": KEEP_ALIVE}


def _common_prefix(a: Sequence[bytes], b: Sequence[bytes]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


__all__ = ["BYTES_PER_TOKEN", "LlamaCppServer", "count_tokens", "render_prompt"]
