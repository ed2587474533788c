"""A loopback fake of Google's Gemini API: `POST /v1beta/models/{model}:streamGenerateContent?alt=sse`
and `:generateContent`, and `GET /v1beta/models`.

This module owns rendering a script's `Reply` and `Fault` steps as the API sends them: streamed
`GenerateContentResponse` chunks (thought parts, text split in pieces, whole function calls with
their thought signatures, a final chunk with the finish reason and `usageMetadata`), Google's error
bodies (`RetryInfo` on a rate limit, `API_KEY_INVALID` for a wrong key) and the overflow message.
It checks what the API checks that a client is most likely to get wrong: the key, the shape of
`contents` (no `id` on a function call or response: the API sends one at times but refuses it
back), and, as Gemini 3 does, that every thought signature sent back is one this server
issued (byte for byte) or Google's documented skip value, and that the first function call of each
model turn carries one.

It must never bind anything but 127.0.0.1 and never import keel's Gemini client: it is an
independent implementation of the wire format, cross-checked against the `google-genai` SDK.
"""

from __future__ import annotations

import base64
import itertools
import json
import re
from collections.abc import Iterable, Iterator
from typing import Any, Final

from keel.llm.messages import Message, Text, Thinking, ToolUse, Usage, WebSearch
from keel.testing.script import Fault, Reply, Step
from keel.testing.server import (
    RecordedRequest,
    Responder,
    ResponseWriter,
    ScriptedHTTPServer,
)

#: Google's documented signature for function calls another model made.
SKIP_SIGNATURE: Final = "skip_thought_signature_validator"

_STATUS_NAMES: Final = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
_MODEL_PATH: Final = re.compile(
    r"/v1beta/models/(?P<model>[^/:?]+):(?P<method>streamGenerateContent|generateContent)"
)
_FINISH: Final = {
    "end_turn": "STOP",
    "tool_use": "STOP",
    "stop_sequence": "STOP",
    "max_tokens": "MAX_TOKENS",
    "refusal": "SAFETY",
    "pause_turn": "STOP",
}
_PART_FIELDS: Final = frozenset(
    {"text", "inlineData", "functionCall", "functionResponse", "fileData", "executableCode"}
)


def pieces(text: str, count: int = 3) -> list[str]:
    if not text:
        return []
    size = max(1, -(-len(text) // count))
    return [text[i : i + size] for i in range(0, len(text), size)]


def usage_metadata(usage: Usage, *, final: bool) -> dict[str, Any]:
    """Gemini's usage: the prompt count includes cached tokens; output is candidates + thoughts
    (the script's output tokens are all candidates)."""
    prompt = usage.input + usage.cache_read + usage.cache_write
    out: dict[str, Any] = {"promptTokenCount": prompt}
    if usage.cache_read:
        out["cachedContentTokenCount"] = usage.cache_read
    if final:
        out["candidatesTokenCount"] = usage.output
        out["totalTokenCount"] = prompt + usage.output
    return out


class GeminiServer(ScriptedHTTPServer):
    """Answers Gemini generate requests from a script. With `api_key`, requests must carry it in
    `x-goog-api-key`. `require_signatures` enforces Gemini 3's rule on function calls.
    `finish_reason` overrides the rendered finish reason of every reply (e.g. `RECITATION`)."""

    model_paths = ()

    def __init__(
        self,
        script: Iterable[Step] = (),
        *,
        responder: Responder | None = None,
        api_key: str = "",
        models: tuple[str, ...] = ("gemini-3-pro-preview", "gemini-2.5-flash"),
        require_signatures: bool = True,
    ) -> None:
        super().__init__(script, responder=responder)
        self.api_key = api_key
        self.models = models
        self.require_signatures = require_signatures
        self.finish_reason = ""
        #: Every signature this server handed out; only these (and the skip value) come back.
        self.issued: set[str] = {SKIP_SIGNATURE}
        self._serial = itertools.count(1)

    @property
    def model_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if _MODEL_PATH.match(r.path.split("?")[0])]

    async def handle(self, request: RecordedRequest, response: ResponseWriter) -> None:
        path = request.path.split("?")[0]
        if self.api_key and request.headers.get("x-goog-api-key") != self.api_key:
            await response.send_json(400, _bad_key())
            return
        if _MODEL_PATH.match(path) is None:
            await self.handle_other(request, response)
            return
        problem = self.request_problem(request)
        if problem:
            await response.send_json(400, self.render_error(400, problem))
            return
        step = self.next_step(request)
        streaming = self.is_streaming(request, request.json)
        if isinstance(step, Fault):
            await self._fault(step, request, response, streaming)
        else:
            await self._reply(step, request, response, streaming)

    async def handle_other(self, request: RecordedRequest, response: ResponseWriter) -> None:
        if request.method == "GET" and request.path.split("?")[0] == "/v1beta/models":
            models = [
                {
                    "name": f"models/{m}",
                    "displayName": m,
                    "inputTokenLimit": 1_048_576,
                    "outputTokenLimit": 65_536,
                    "supportedGenerationMethods": ["generateContent", "countTokens"],
                    "thinking": True,
                }
                for m in self.models
            ]
            await response.send_json(200, {"models": models})
            return
        message = f"Method not found: {request.method} {request.path}"
        await response.send_json(404, self.render_error(404, message))

    async def _fault(
        self, fault: Fault, request: RecordedRequest, response: ResponseWriter, streaming: bool
    ) -> None:
        if fault.kind == "status" and fault.retry_after is not None:
            # Google says how long to wait in the body (RetryInfo), not in a header.
            body = self.render_error(fault.status, fault.message or "Resource exhausted")
            delay = f"{fault.retry_after:g}s"
            body["error"]["details"] = [
                {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": delay}
            ]
            await response.send_json(fault.status, body)
            return
        await super()._fault(fault, request, response, streaming)

    # -- rendering ----------------------------------------------------------------------------

    def is_streaming(self, request: RecordedRequest, body: Any) -> bool:
        return ":streamGenerateContent" in request.path

    def stream_headers(self) -> dict[str, str]:
        return {"content-type": "text/event-stream"}

    def _chunks(self, step: Reply, request: RecordedRequest) -> list[dict[str, Any]]:
        """The reply as streamed chunks: each holds one candidate with some parts."""
        model = _MODEL_PATH.match(request.path.split("?")[0])
        version = model.group("model") if model else ""
        response_id = f"resp-{next(self._serial):06d}"
        chunks: list[dict[str, Any]] = []
        for parts in self._part_groups(step.message):
            chunks.append(
                {
                    "candidates": [{"content": {"role": "model", "parts": parts}, "index": 0}],
                    "usageMetadata": usage_metadata(step.usage, final=False),
                    "modelVersion": version,
                    "responseId": response_id,
                }
            )
        finish = self.finish_reason or _FINISH[step.final_stop_reason]
        final: dict[str, Any] = {"content": {"role": "model", "parts": []}, "index": 0}
        final["finishReason"] = finish
        grounding = grounding_metadata(step.message)
        if grounding:
            final["groundingMetadata"] = grounding
        chunks.append(
            {
                "candidates": [final],
                "usageMetadata": usage_metadata(step.usage, final=True),
                "modelVersion": version,
                "responseId": response_id,
            }
        )
        return chunks

    def _part_groups(self, message: Message) -> Iterator[list[dict[str, Any]]]:
        """Parts, one chunk's worth at a time. A thought or text block's signature rides on its
        last piece; a function call comes whole. With `require_signatures`, a reply's first call
        gets a fresh signature when the script gave none, as Gemini 3 does."""
        first_call = True
        for block in message.blocks:
            if isinstance(block, Thinking):
                texts = pieces(block.text) or [""]
                for i, text in enumerate(texts):
                    part: dict[str, Any] = {"text": text}
                    if block.text:
                        part["thought"] = True
                    if i == len(texts) - 1 and block.signature:
                        part["thoughtSignature"] = self._issue(block.signature)
                    yield [part]
            elif isinstance(block, Text):
                for text in pieces(block.text):
                    yield [{"text": text}]
            elif isinstance(block, ToolUse):
                call = {"name": block.name, "args": block.input or {}}
                part = {"functionCall": call}
                signature = block.signature
                if not signature and first_call and self.require_signatures:
                    signature = self.new_signature()
                if signature:
                    part["thoughtSignature"] = self._issue(signature)
                first_call = False
                yield [part]

    def new_signature(self) -> str:
        """A fresh signature: opaque base64, as Google's are (the SDK decodes them as bytes)."""
        return base64.b64encode(b"keel-fake-signature-%06d" % next(self._serial)).decode()

    def _issue(self, signature: str) -> str:
        self.issued.add(signature)
        return signature

    def render_stream(self, step: Reply, request: RecordedRequest) -> Iterable[bytes]:
        for chunk in self._chunks(step, request):
            # Google ends each event with CRLF pairs.
            yield f"data: {json.dumps(chunk, separators=(',', ':'))}\r\n\r\n".encode()

    def render_json(self, step: Reply, request: RecordedRequest) -> Any:
        chunks = self._chunks(step, request)
        parts = [p for c in chunks for p in c["candidates"][0]["content"]["parts"]]
        whole = dict(chunks[-1])
        candidate = dict(whole["candidates"][0])
        candidate["content"] = {"role": "model", "parts": _merged(parts)}
        whole["candidates"] = [candidate]
        return whole

    def render_error(self, status: int, message: str) -> Any:
        name = _STATUS_NAMES.get(status, "INTERNAL" if status >= 500 else "INVALID_ARGUMENT")
        return {"error": {"code": status, "message": message, "status": name}}

    def render_overflow(self, message: str) -> Any:
        text = message or (
            "The input token count (1200000) exceeds the maximum number of tokens allowed "
            "(1048576)."
        )
        return self.render_error(400, text)

    # -- request validation -------------------------------------------------------------------

    def request_problem(self, request: RecordedRequest) -> str:
        """Why the API would reject this generate request, or "" if it would not."""
        try:
            body = request.json
        except ValueError:
            return "Invalid JSON payload received."
        if not isinstance(body, dict):
            return "Invalid JSON payload received. Unknown name: request must be an object"
        contents = body.get("contents")
        if not isinstance(contents, list) or not contents:
            return "* GenerateContentRequest.contents: contents is not specified"
        for i, content in enumerate(contents):
            problem = self._content_problem(i, content)
            if problem:
                return problem
        return self._signature_problem(contents)

    def _content_problem(self, i: int, content: Any) -> str:
        if not isinstance(content, dict) or content.get("role") not in ("user", "model"):
            return f"* GenerateContentRequest.contents[{i}].role: must be user or model"
        parts = content.get("parts")
        if not isinstance(parts, list) or not parts:
            return (
                f"* GenerateContentRequest.contents[{i}].parts: contents.parts must not be empty."
            )
        for j, part in enumerate(parts):
            data = set(part) & _PART_FIELDS if isinstance(part, dict) else set()
            if len(data) != 1:
                return f"* GenerateContentRequest.contents[{i}].parts[{j}].data: required oneof field 'data' must have one initialized field"
            for field, name in (
                ("functionCall", "function_call"),
                ("functionResponse", "function_response"),
            ):
                if isinstance(part.get(field), dict) and "id" in part[field]:
                    return f"Invalid JSON payload received. Unknown name \"id\" at 'contents[{i}].parts[{j}].{name}': Cannot find field."
            response = part.get("functionResponse")
            if response is not None and not response.get("name"):
                return f"* GenerateContentRequest.contents[{i}].parts[{j}].function_response.name: Name cannot be empty."
            signature = part.get("thoughtSignature")
            if signature is not None and signature not in self.issued:
                return "Corrupted thought signature."
        return ""

    def _signature_problem(self, contents: list[dict[str, Any]]) -> str:
        """Gemini 3: in the current turn (since the last user text), each model step's first
        function call must carry a thought signature."""
        if not self.require_signatures:
            return ""
        start = 0
        for i, content in enumerate(contents):
            if content["role"] == "user" and any("text" in p for p in content["parts"]):
                start = i
        for i in range(start, len(contents)):
            calls = [p for p in contents[i]["parts"] if "functionCall" in p]
            if contents[i]["role"] == "model" and calls and "thoughtSignature" not in calls[0]:
                name = calls[0]["functionCall"].get("name", "")
                return (
                    f"Function call `{name}` in the {i + 1}. content block is missing a "
                    "`thought_signature`."
                )
        return ""


def grounding_metadata(message: Message) -> dict[str, Any]:
    """A scripted reply's `WebSearch` blocks and citations as Search grounding reports them:
    the queries, one web chunk per result, and one support per citation pointing at its chunk."""
    searches = [b for b in message.blocks if isinstance(b, WebSearch)]
    if not searches:
        return {}
    results = [r for search in searches for r in search.results]
    chunks = [{"web": {"uri": r.url, "title": r.title, "domain": r.title.lower()}} for r in results]
    urls = [r.url for r in results]
    supports = []
    for block in message.blocks:
        if isinstance(block, Text):
            for c in block.citations:
                segment = {"startIndex": c.start, "endIndex": c.end, "text": c.cited_text}
                supports.append({"segment": segment, "groundingChunkIndices": [urls.index(c.url)]})
    queries = [q for search in searches for q in search.query.split("; ") if q]
    html = '<style>.container{}</style><div class="container">search</div>'
    return {
        "searchEntryPoint": {"renderedContent": html},
        "groundingChunks": chunks,
        "groundingSupports": supports,
        "webSearchQueries": queries,
    }


def _merged(parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Streamed pieces joined as a non-streamed response holds them."""
    out: list[dict[str, Any]] = []
    for part in parts:
        last = out[-1] if out else None
        mergeable = (
            last is not None
            and "text" in part
            and "text" in last
            and bool(part.get("thought")) == bool(last.get("thought"))
            and "thoughtSignature" not in last
        )
        if mergeable and last is not None:
            last["text"] += part["text"]
            if "thoughtSignature" in part:
                last["thoughtSignature"] = part["thoughtSignature"]
        else:
            out.append(dict(part))
    return out


def _bad_key() -> dict[str, Any]:
    return {
        "error": {
            "code": 400,
            "message": "API key not valid. Please pass a valid API key.",
            "status": "INVALID_ARGUMENT",
            "details": [
                {
                    "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                    "reason": "API_KEY_INVALID",
                    "domain": "googleapis.com",
                }
            ],
        }
    }


__all__ = ["SKIP_SIGNATURE", "GeminiServer", "pieces", "usage_metadata"]
