"""A session's run as the streams agent UIs read: AG-UI events (`POST …/agui`) and the Vercel
AI SDK's UI message stream (`POST …/ui-stream`), both on `keel serve` (docs/server.md, "Streams
for agent UIs").

Each route starts a prompt (or answers the questions a previous stream stopped at) and follows
the session's event ring from that point, as `GET …/events` does, translating each keel event
JSON into the protocol's events; the translators are plain classes over those JSON objects, so
both streams carry exactly what the SSE stream carries. A permission question ends the stream
the way each protocol defines it (AG-UI: `RUN_FINISHED` with an interrupt outcome; the AI SDK:
`tool-approval-request`), and the client's next request answers it and follows on.

Nothing here runs work or decides a permission: the prompt goes through `Host.prompt`, answers
through `agent.answer`, exactly as the `/v1/` routes do. Protocol packages are never imported
(they are used in tests only).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any, Literal

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from keel.server.host import ApiError, Host, Hosted, question_json
from keel.server.ring import KEEPALIVE, EventRing, Sent, Subscriber

#: The SSE headers both streams send (no proxy buffering: a token at a time).
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}
#: The header that tells the AI SDK's transport which stream this is.
UI_STREAM_HEADER = {"x-vercel-ai-ui-message-stream": "v1"}
#: The UI message stream's last message.
DONE = b"data: [DONE]\n\n"
_COMPACT = (",", ":")

#: The JSON schema of an AG-UI resume payload for a keel permission question.
PERMISSION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "approved": {"type": "boolean"},
        "always": {
            "type": "boolean",
            "description": "allow this and later calls like it (saves the suggested rule)",
        },
        "reason": {"type": "string", "description": "why not: the model reads it"},
        "mode": {
            "type": "string",
            "description": "a plan approval: the mode to go on in",
        },
    },
    "required": ["approved"],
}

Pending = Callable[[], list[dict[str, Any]]]


def _sse(data: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(data, ensure_ascii=False, separators=_COMPACT)}\n\n".encode()


# -- following the ring ----------------------------------------------------------------------------


async def follow(
    ring: EventRing,
    sub: Subscriber,
    missed: list[Sent],
    gap: dict[str, Any] | None,
    *,
    keepalive: float,
) -> AsyncGenerator[dict[str, Any] | None, None]:
    """The events after the subscription point as JSON (None: `keepalive` quiet seconds
    passed), then live ones; a `dropped` event when this reader fell behind; ends when the ring
    closes."""
    try:
        if gap is not None:
            yield gap
        for sent in missed:
            yield json.loads(sent.data)
        while True:
            while not sub.backlog and not sub.dropped and not sub.closed:
                sub.wake.clear()
                try:
                    await asyncio.wait_for(sub.wake.wait(), keepalive)
                except TimeoutError:
                    yield None
            if sub.dropped:
                yield {"type": "dropped", "reason": "this client fell behind the run"}
                return
            if sub.backlog:
                batch = list(sub.backlog)
                sub.backlog.clear()
                for sent in batch:
                    yield json.loads(sent.data)
                continue
            if sub.closed:
                return
    finally:
        ring.unsubscribe(sub)


# -- AG-UI -----------------------------------------------------------------------------------------


def session_state(hosted: Hosted) -> dict[str, Any]:
    """The session as AG-UI's shared state carries it: what `GET /v1/sessions/{id}` says of its
    model, mode and spending."""
    return {
        "session": hosted.id,
        "model": hosted.model,
        "mode": hosted.mode,
        "usage": hosted.agent.spend.usage.to_json(),
        "cost_usd": round(hosted.agent.spend.cost, 6),
    }


def _token_usage(usage: dict[str, Any], model: str) -> dict[str, Any]:
    """keel's usage (input excludes the cache) in AG-UI's accounting (totals and their parts)."""
    provider, _, name = model.partition("/")
    total_in = usage["input"] + usage["cache_read"] + usage["cache_write"]
    return {
        "provider": provider,
        "model": name or model,
        "inputTokens": total_in,
        "outputTokens": usage["output"],
        "totalTokens": total_in + usage["output"],
        "cachedInputTokens": usage["cache_read"],
        "cacheWriteInputTokens": usage["cache_write"],
    }


def interrupt(question: dict[str, Any]) -> dict[str, Any]:
    """A pending keel question (`permission_request` or `question` JSON) as an AG-UI
    `Interrupt`: its id is keel's request id."""
    if question["type"] == "permission_request":
        what = "approve the plan" if question.get("plan") else f"allow {question['tool']}"
        keel: dict[str, Any] = {
            "tool": question["tool"],
            "input": question["input"],
            "suggestion": question["suggestion"],
        }
        for key in ("plan", "agent", "confirm"):
            if key in question:
                keel[key] = question[key]
        return {
            "id": question["request_id"],
            "reason": "tool_call",
            "message": f"{what}? {question['reason']}".strip(),
            "toolCallId": question["tool_use_id"],
            "responseSchema": PERMISSION_SCHEMA,
            "metadata": {"keel": keel},
        }
    return {
        "id": question["request_id"],
        "reason": "input_required",
        "message": question["message"],
        "responseSchema": question["schema"],
        "metadata": {"keel": {"source": question["source"]}},
    }


class AguiRun:
    """One AG-UI run's translation: keel event JSON in (`feed`), AG-UI events out, until
    `done`. `pending` lists the session's waiting questions (their event JSON)."""

    def __init__(
        self,
        *,
        thread_id: str,
        run_id: str,
        session: Callable[[], dict[str, Any]],
        pending: Pending,
    ) -> None:
        self.thread_id = thread_id
        self.run_id = run_id
        self.session = session
        self.pending = pending
        self.done = False
        self._turn = 0
        self._messages = 0
        #: The id of the model's reply now streaming: its first text message's and the parent
        #: of its tool calls, so that a client folds them into one assistant message.
        self._reply = f"{run_id}-0"
        self._reply_has_text = False
        self._text: str | None = None
        self._reasoning: str | None = None
        self._args: list[str] = []
        self._step: str | None = None

    def state(self, *, busy: bool) -> dict[str, Any]:
        """keel's side of the shared state: the session (`session_state`), busy or not, and its
        waiting questions."""
        return {**self.session(), "busy": busy, "pending": self.pending()}

    def start(self) -> list[dict[str, Any]]:
        return [
            {"type": "RUN_STARTED", "threadId": self.thread_id, "runId": self.run_id},
            {"type": "STATE_SNAPSHOT", "snapshot": self.state(busy=True)},
        ]

    def _new_id(self, kind: str) -> str:
        self._messages += 1
        return f"{self._reply}-{kind}{self._messages}"

    def _close_text(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if self._text is not None:
            out.append({"type": "TEXT_MESSAGE_END", "messageId": self._text})
            self._text = None
        if self._reasoning is not None:
            out += [
                {"type": "REASONING_MESSAGE_END", "messageId": self._reasoning},
                {"type": "REASONING_END", "messageId": self._reasoning},
            ]
            self._reasoning = None
        return out

    def _close_args(self) -> list[dict[str, Any]]:
        out = [{"type": "TOOL_CALL_END", "toolCallId": i} for i in self._args]
        self._args = []
        return out

    def _close_step(self) -> list[dict[str, Any]]:
        out = self._close_text() + self._close_args()
        if self._step is not None:
            out.append({"type": "STEP_FINISHED", "stepName": self._step})
            self._step = None
        return out

    def _custom(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        value = {k: v for k, v in event.items() if k not in ("seq", "session")}
        return [{"type": "CUSTOM", "name": f"keel.{event['type']}", "value": value}]

    def feed(self, event: dict[str, Any]) -> list[dict[str, Any]]:  # noqa: C901 - one case per event
        kind = event["type"]
        if "subagent" in event and kind not in ("permission_request", "question"):
            return []  # a subagent's work: its answer is the result of the call that ran it
        match kind:
            case "request" if event.get("purpose", "turn") == "turn":
                out = self._close_step()
                self._turn = event["turn"]
                self._reply = f"{self.run_id}-{self._turn}"
                self._reply_has_text = False
                self._step = f"turn {self._turn}"
                return [*out, {"type": "STEP_STARTED", "stepName": self._step}]
            case "text_delta":
                out = []
                if self._reasoning is not None:
                    out = self._close_text()
                if self._text is None:
                    self._text = self._new_id("text") if self._reply_has_text else self._reply
                    self._reply_has_text = True
                    out.append(
                        {"type": "TEXT_MESSAGE_START", "messageId": self._text, "role": "assistant"}
                    )
                return [
                    *out,
                    {
                        "type": "TEXT_MESSAGE_CONTENT",
                        "messageId": self._text,
                        "delta": event["text"],
                    },
                ]
            case "thinking_delta":
                out = []
                if self._text is not None:
                    out = self._close_text()
                if self._reasoning is None:
                    self._reasoning = self._new_id("reasoning")
                    out += [
                        {"type": "REASONING_START", "messageId": self._reasoning},
                        {
                            "type": "REASONING_MESSAGE_START",
                            "messageId": self._reasoning,
                            "role": "reasoning",
                        },
                    ]
                return [
                    *out,
                    {
                        "type": "REASONING_MESSAGE_CONTENT",
                        "messageId": self._reasoning,
                        "delta": event["text"],
                    },
                ]
            case "tool_use_start":
                self._args.append(event["id"])
                return [
                    *self._close_text(),
                    {
                        "type": "TOOL_CALL_START",
                        "toolCallId": event["id"],
                        "toolCallName": event["name"],
                        "parentMessageId": self._reply,
                    },
                ]
            case "tool_use_delta":
                return [
                    {
                        "type": "TOOL_CALL_ARGS",
                        "toolCallId": event["id"],
                        "delta": event["partial_json"],
                    }
                ]
            case "assistant":
                out = self._close_text()
                streamed = set(self._args)
                for block in event["message"]["content"]:
                    if block["type"] == "tool_use" and block["id"] not in streamed:
                        # A reply that came whole (not streamed): its calls in one go.
                        out += [
                            {
                                "type": "TOOL_CALL_START",
                                "toolCallId": block["id"],
                                "toolCallName": block["name"],
                                "parentMessageId": self._reply,
                            },
                            {
                                "type": "TOOL_CALL_ARGS",
                                "toolCallId": block["id"],
                                "delta": json.dumps(block["input"]),
                            },
                            {"type": "TOOL_CALL_END", "toolCallId": block["id"]},
                        ]
                return out + self._close_args()
            case "tool_finished":
                return [
                    {
                        "type": "TOOL_CALL_RESULT",
                        "messageId": f"{self.run_id}-result-{event['id']}",
                        "toolCallId": event["id"],
                        "content": event["output"],
                        "role": "tool",
                    }
                ]
            case "usage":
                return [
                    {
                        "type": "STATE_DELTA",
                        "delta": [
                            {"op": "replace", "path": "/usage", "value": event["total"]},
                            {"op": "replace", "path": "/cost_usd", "value": event["cost_usd"]},
                        ],
                    }
                ]
            case "permission_request" | "question":
                waiting = self.pending()
                if event["request_id"] not in {q["request_id"] for q in waiting}:
                    return []  # answered already (by another client): the answer follows
                self.done = True
                return [
                    *self._close_step(),
                    {"type": "STATE_SNAPSHOT", "snapshot": self.state(busy=True)},
                    {
                        "type": "RUN_FINISHED",
                        "threadId": self.thread_id,
                        "runId": self.run_id,
                        "outcome": {
                            "type": "interrupt",
                            "interrupts": [interrupt(q) for q in waiting],
                        },
                    },
                ]
            case "result":
                self.done = True
                out = [
                    *self._close_step(),
                    {
                        "type": "STATE_DELTA",
                        "delta": [{"op": "replace", "path": "/busy", "value": False}],
                    },
                ]
                usage = [_token_usage(event["usage"], event["model"])]
                if event["is_error"]:
                    return [
                        *out,
                        {
                            "type": "RUN_ERROR",
                            "message": event["error"] or "the run failed",
                            "code": event["stop_reason"],
                            "usage": usage,
                        },
                    ]
                cancelled = event["stop_reason"] == "interrupted"
                return [
                    *out,
                    {
                        "type": "RUN_FINISHED",
                        "threadId": self.thread_id,
                        "runId": self.run_id,
                        "result": {
                            k: event[k] for k in ("result", "stop_reason", "turns", "cost_usd")
                        },
                        "outcome": {"type": "cancelled" if cancelled else "success"},
                        "usage": usage,
                    },
                ]
            case "error" | "session_closed" | "server_stopping" | "cleared" | "dropped":
                self.done = True
                return [*self._close_step(), run_error(event)]
            case "notice" | "compacted" | "background_finished" | "permission_answered" | "gap":
                return self._custom(event)
            case _:
                # user_message, status, turn_started, tool_started, request (not a turn's),
                # request_finished: the client has them already or they have no AG-UI event.
                return []


def run_error(event: dict[str, Any]) -> dict[str, Any]:
    """The AG-UI `RUN_ERROR` for a keel event that ends a run without its result."""
    match event["type"]:
        case "error":
            hint = f" (hint: {event['hint']})" if event.get("hint") else ""
            return {"type": "RUN_ERROR", "message": event["error"] + hint, "code": "error"}
        case "session_closed":
            why = f"the session was closed ({event['reason']})"
            return {"type": "RUN_ERROR", "message": why, "code": "session_closed"}
        case "cleared":
            return {
                "type": "RUN_ERROR",
                "message": f"the session was cleared; it goes on as {event['new_session']}",
                "code": "cleared",
            }
        case "dropped":
            return {"type": "RUN_ERROR", "message": event["reason"], "code": "dropped"}
        case _:
            return {"type": "RUN_ERROR", "message": "the server is stopping", "code": event["type"]}


# -- the AI SDK's UI message stream ----------------------------------------------------------------

#: keel's stop reasons as the AI SDK's finish reasons.
FINISH_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "refusal": "content-filter",
    "error": "error",
}


class UiStreamRun:
    """One UI message stream's translation: keel event JSON in (`feed`), UI message chunks out,
    until `done`. `seen`: the tool calls the client's message has already (a stream that
    follows on from an approval)."""

    def __init__(
        self, *, session: str, pending: Pending, message_id: str | None, seen: set[str]
    ) -> None:
        self.session = session
        self.pending = pending
        self.message_id = message_id
        self.done = False
        self._parts = 0
        self._text: str | None = None
        self._reasoning: str | None = None
        self._step = False
        self._seen = set(seen)
        self._denied: set[str] = set()
        self._asked: set[str] = set()

    def start(self) -> list[dict[str, Any]]:
        start: dict[str, Any] = {"type": "start", "messageMetadata": {"session": self.session}}
        if self.message_id is not None:
            start["messageId"] = self.message_id
        return [start]

    def _new_id(self, kind: str) -> str:
        self._parts += 1
        return f"{kind}-{self._parts}"

    def _close_text(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if self._text is not None:
            out.append({"type": "text-end", "id": self._text})
            self._text = None
        if self._reasoning is not None:
            out.append({"type": "reasoning-end", "id": self._reasoning})
            self._reasoning = None
        return out

    def _close_step(self) -> list[dict[str, Any]]:
        out = self._close_text()
        if self._step:
            out.append({"type": "finish-step"})
            self._step = False
        return out

    def _data(self, event: dict[str, Any], *, transient: bool = True) -> dict[str, Any]:
        value = {k: v for k, v in event.items() if k not in ("seq", "session", "type")}
        part: dict[str, Any] = {"type": f"data-keel-{event['type']}", "data": value}
        if "request_id" in event:
            part["id"] = event["request_id"]
        if transient:
            part["transient"] = True
        return part

    def _tool_input(self, call_id: str, name: str, value: Any) -> dict[str, Any]:
        self._seen.add(call_id)
        return {
            "type": "tool-input-available",
            "toolCallId": call_id,
            "toolName": name,
            "input": value,
            "dynamic": True,
        }

    def _approvals(self) -> list[dict[str, Any]]:
        """Every waiting permission question as an approval request (their calls first, where
        this message has not got them: a subagent's); ends the stream."""
        out = self._close_text()
        for q in self.pending():
            if q["type"] != "permission_request":
                continue
            if q["tool_use_id"] not in self._seen:
                out.append(self._tool_input(q["tool_use_id"], q["tool"], q["input"]))
            request = {
                "type": "tool-approval-request",
                "approvalId": q["request_id"],
                "toolCallId": q["tool_use_id"],
            }
            if q["reason"]:
                request["reason"] = q["reason"]
            out.append(request)
        self.done = True
        return [*out, *self._close_step(), {"type": "finish", "finishReason": "tool-calls"}]

    def feed(self, event: dict[str, Any]) -> list[dict[str, Any]]:  # noqa: C901 - one case per event
        kind = event["type"]
        if "subagent" in event and kind not in ("permission_request", "question"):
            return []
        match kind:
            case "request" if event.get("purpose", "turn") == "turn":
                out = self._close_step()
                self._step = True
                return [*out, {"type": "start-step"}]
            case "text_delta":
                out = self._close_text() if self._reasoning is not None else []
                if self._text is None:
                    self._text = self._new_id("text")
                    out.append({"type": "text-start", "id": self._text})
                return [*out, {"type": "text-delta", "id": self._text, "delta": event["text"]}]
            case "thinking_delta":
                out = self._close_text() if self._text is not None else []
                if self._reasoning is None:
                    self._reasoning = self._new_id("reasoning")
                    out.append({"type": "reasoning-start", "id": self._reasoning})
                return [
                    *out,
                    {"type": "reasoning-delta", "id": self._reasoning, "delta": event["text"]},
                ]
            case "tool_use_start":
                return [
                    *self._close_text(),
                    {
                        "type": "tool-input-start",
                        "toolCallId": event["id"],
                        "toolName": event["name"],
                        "dynamic": True,
                    },
                ]
            case "tool_use_delta":
                return [
                    {
                        "type": "tool-input-delta",
                        "toolCallId": event["id"],
                        "inputTextDelta": event["partial_json"],
                    }
                ]
            case "assistant":
                out = self._close_text()
                for block in event["message"]["content"]:
                    if block["type"] == "tool_use":
                        out.append(self._tool_input(block["id"], block["name"], block["input"]))
                return out
            case "permission_answered":
                if event["allow"]:
                    return []
                self._denied.add(event["tool_use_id"])
                return [{"type": "tool-output-denied", "toolCallId": event["tool_use_id"]}]
            case "tool_finished":
                if event["id"] in self._denied:
                    return []  # the denial said it (the model reads why in the result)
                if event["is_error"]:
                    return [
                        {
                            "type": "tool-output-error",
                            "toolCallId": event["id"],
                            "errorText": event["output"],
                            "dynamic": True,
                        }
                    ]
                return [
                    {
                        "type": "tool-output-available",
                        "toolCallId": event["id"],
                        "output": event["output"],
                        "dynamic": True,
                    }
                ]
            case "usage":
                return [
                    {
                        "type": "message-metadata",
                        "messageMetadata": {
                            "usage": event["total"],
                            "cost_usd": event["cost_usd"],
                            "context_tokens": event["context_tokens"],
                            "context_window": event["context_window"],
                        },
                    }
                ]
            case "permission_request":
                if event["request_id"] not in {q["request_id"] for q in self.pending()}:
                    return []
                return self._approvals()
            case "question":
                if event["request_id"] in self._asked:
                    return []
                self._asked.add(event["request_id"])
                # No chunk of the protocol asks for input: a data part, answered over keel's
                # permission route; the stream goes on.
                return [*self._close_text(), self._data(event, transient=False)]
            case "result":
                self.done = True
                out = self._close_step()
                if event["is_error"]:
                    out.append({"type": "error", "errorText": event["error"] or "the run failed"})
                return [
                    *out,
                    {
                        "type": "finish",
                        "finishReason": FINISH_REASONS.get(event["stop_reason"], "other"),
                        "messageMetadata": {
                            k: event[k] for k in ("stop_reason", "turns", "usage", "cost_usd")
                        },
                    },
                ]
            case "error" | "session_closed" | "server_stopping" | "cleared" | "dropped":
                self.done = True
                return [
                    *self._close_step(),
                    {"type": "error", "errorText": run_error(event)["message"]},
                ]
            case "notice" | "compacted" | "background_finished" | "gap":
                return [self._data(event)]
            case _:
                return []


# -- the routes ------------------------------------------------------------------------------------


def _any_json() -> tuple[type, ...]:
    return (dict, list, str, int, float, bool, type(None))


class Streams:
    """The two routes, over the `Host` of `keel serve`."""

    def __init__(self, host: Host, *, keepalive: float = KEEPALIVE) -> None:
        self.host = host
        self.keepalive = keepalive
        #: Where each question a stream stopped at was published: (session, request id) →
        #: seq, so that the stream that answers it follows on from exactly there.
        self.stopped_at: dict[tuple[str, str], int] = {}

    def routes(self) -> list[Route]:
        s = "/v1/sessions/{id}"
        return [
            Route(f"{s}/agui", self.agui, methods=["POST"]),
            Route(f"{s}/ui-stream", self.ui_stream, methods=["POST"]),
        ]

    # -- shared ------------------------------------------------------------------------------------

    def _pending(self, hosted: Hosted) -> Pending:
        """The session's waiting questions; forgets where streams stopped at the ones that no
        longer wait (answered another way, or the run stopped)."""

        def pending() -> list[dict[str, Any]]:
            waiting = [question_json(q) for q in hosted.agent.pending_questions()]
            ids = {q["request_id"] for q in waiting}
            for key in [k for k in self.stopped_at if k[0] == hosted.id and k[1] not in ids]:
                del self.stopped_at[key]
            return waiting

        return pending

    def _answer(self, hosted: Hosted, request_id: str, reply: Any) -> None:
        if not hosted.agent.answer(request_id, reply):
            raise ApiError(
                404,
                f"no pending question {request_id!r} in session {hosted.id}",
                "answered already, or the run stopped",
            )

    def _after(self, hosted: Hosted, request_ids: list[str]) -> int:
        """The seq to follow on from when answering `request_ids`: the earliest a stream
        stopped at (else now: a question asked before this server knew of it)."""
        stops = [self.stopped_at.pop((hosted.id, r), None) for r in request_ids]
        known = [s for s in stops if s is not None]
        return min(known) if known else hosted.ring.last_seq

    def _stream(
        self,
        hosted: Hosted,
        after: int,
        run: AguiRun | UiStreamRun,
        work: Callable[[], None],
        *,
        done: bytes = b"",
    ) -> AsyncIterator[bytes]:
        """Do `work` (start the prompt, answer the questions; an `ApiError` is raised as it
        is), then stream the run from `after`: the ring replays what the work published before
        the stream subscribed, so nothing is missed and nothing is subscribed for a stream
        that never starts."""
        work()
        return self._frames(hosted, after, run, done)

    async def _frames(
        self, hosted: Hosted, after: int, run: AguiRun | UiStreamRun, done: bytes
    ) -> AsyncIterator[bytes]:
        ring = hosted.ring
        sub, missed, gap = ring.subscribe(after)
        events = follow(ring, sub, missed, gap, keepalive=self.keepalive)
        try:
            yield b"".join(_sse(e) for e in run.start())
            async for event in events:
                if event is None:
                    yield b": keepalive\n\n"
                    continue
                out = run.feed(event)
                if run.done and event["type"] in ("permission_request", "question"):
                    for q in run.pending():
                        key = (hosted.id, q["request_id"])
                        self.stopped_at.setdefault(key, int(event["seq"]))
                if out:
                    yield b"".join(_sse(e) for e in out)
                if run.done:
                    break
            if not run.done:  # the ring closed without a word (it always says why first)
                yield _sse(run_error({"type": "server_stopping"}))
            yield done
        finally:
            await events.aclose()
            ring.unsubscribe(sub)  # `follow` does too, once it has started

    def _response(self, body: AsyncIterator[bytes], *, ui: bool = False) -> Response:
        headers = {**SSE_HEADERS, **(UI_STREAM_HEADER if ui else {})}
        return StreamingResponse(body, media_type="text/event-stream", headers=headers)

    # -- AG-UI -------------------------------------------------------------------------------------

    async def agui(self, request: Request) -> Response:
        from keel.server.http import OPT_STR, STR, read_body

        hosted = self.host.get(request.path_params["id"])
        body = await read_body(
            request,
            {
                "threadId": STR,
                "runId": STR,
                "parentRunId": OPT_STR,
                "protocolVersion": OPT_STR,
                "state": _any_json(),
                "messages": (list,),
                "tools": (list,),
                "context": (list,),
                "forwardedProps": _any_json(),
                "resume": (list, type(None)),
            },
        )
        for name in ("threadId", "runId", "messages"):
            if name not in body:
                raise ApiError(
                    400,
                    f"{name} is missing",
                    "send a RunAgentInput: {threadId, runId, messages, …}",
                )
        pending = self._pending(hosted)
        run = AguiRun(
            thread_id=body["threadId"],
            run_id=body["runId"],
            session=lambda: session_state(hosted),
            pending=pending,
        )
        resume = body.get("resume") or []
        refusal = self._agui_refusal(hosted, resume, pending())
        if refusal is not None:
            head = [
                {"type": "RUN_STARTED", "threadId": run.thread_id, "runId": run.run_id},
                {"type": "RUN_ERROR", "message": refusal, "code": "interrupt"},
            ]
            return self._response(_just(head))
        if resume:
            waiting = pending()
            replies = [(r["interruptId"], _agui_reply(r, waiting)) for r in resume]
            after = self._after(hosted, [rid for rid, _ in replies])
            return self._response(
                self._stream(hosted, after, run, lambda: self._answer_all(hosted, replies))
            )
        text = _agui_prompt(body["messages"])
        after = hosted.ring.last_seq
        return self._response(self._stream(hosted, after, run, lambda: self._start(hosted, text)))

    def _start(self, hosted: Hosted, text: str) -> None:
        self.host.prompt(hosted, text)

    def _answer_all(self, hosted: Hosted, replies: list[tuple[str, Any]]) -> None:
        for request_id, reply in replies:
            self._answer(hosted, request_id, reply)

    def _agui_refusal(
        self, hosted: Hosted, resume: list[Any], waiting: list[dict[str, Any]]
    ) -> str | None:
        """Why this input breaks the interrupt contract (docs/concepts/interrupts in AG-UI),
        or None. A `RUN_ERROR` says it, as the protocol asks."""
        open_ids = {q["request_id"]: q for q in waiting}
        if not resume:
            if open_ids:
                return (
                    f"the thread has open interrupts ({', '.join(open_ids)}): send a resume "
                    "addressing every one"
                )
            return None
        given: set[str] = set()
        for entry in resume:
            if (
                not isinstance(entry, dict)
                or not isinstance(entry.get("interruptId"), str)
                or entry.get("status") not in ("resolved", "cancelled")
            ):
                return 'each resume entry is {"interruptId", "status": "resolved" | "cancelled"}'
            rid = entry["interruptId"]
            if rid not in open_ids:
                return f"interrupt {rid!r} is not open (answered already, or the run stopped)"
            if entry["status"] == "resolved":
                problem = _payload_problem(open_ids[rid], entry.get("payload"))
                if problem:
                    return f"interrupt {rid}: {problem}"
            given.add(rid)
        # Every interrupt a stream reported must be answered; one asked since is reported by
        # the stream this input starts.
        reported = {rid for rid in open_ids if (hosted.id, rid) in self.stopped_at}
        missing = sorted(reported - given)
        if missing:
            return f"the resume leaves interrupts open: {', '.join(missing)}; address every one"
        return None

    # -- the AI SDK --------------------------------------------------------------------------------

    async def ui_stream(self, request: Request) -> Response:
        from keel.server.http import OPT_STR, STR, read_body

        hosted = self.host.get(request.path_params["id"])
        body = await read_body(
            request,
            {"id": STR, "messages": (list,), "trigger": STR, "messageId": OPT_STR},
        )
        trigger = body.get("trigger", "submit-message")
        if trigger != "submit-message":
            raise ApiError(
                400,
                f"trigger {trigger!r} is not supported",
                "keel runs new prompts (submit-message); fork the session to try a turn again",
            )
        messages = body.get("messages") or []
        if not messages or not isinstance(messages[-1], dict):
            raise ApiError(400, "messages is empty", "send the chat's messages, the last one new")
        last = messages[-1]
        pending = self._pending(hosted)
        if last.get("role") == "assistant":
            answers = _approval_answers(last)
            if not answers:
                raise ApiError(
                    400,
                    "the last message is the assistant's and answers no approval",
                    "add a user message, or answer the tool approval requests",
                )
            seen = {
                p["toolCallId"]
                for p in last.get("parts") or []
                if isinstance(p, dict) and isinstance(p.get("toolCallId"), str)
            }
            run = UiStreamRun(session=hosted.id, pending=pending, message_id=None, seen=seen)
            waiting = {q["request_id"] for q in pending()}
            stale = [rid for rid, _ in answers if rid not in waiting]
            if stale:
                raise ApiError(
                    404,
                    f"no pending question {stale[0]!r} in session {hosted.id}",
                    "answered already, or the run stopped",
                )
            after = self._after(hosted, [rid for rid, _ in answers])
            return self._response(
                self._stream(
                    hosted, after, run, lambda: self._answer_all(hosted, answers), done=DONE
                ),
                ui=True,
            )
        text = _ui_prompt(last)
        run = UiStreamRun(
            session=hosted.id,
            pending=pending,
            message_id=f"{hosted.id}-{hosted.ring.last_seq + 1}",
            seen=set(),
        )
        after = hosted.ring.last_seq
        return self._response(
            self._stream(hosted, after, run, lambda: self._start(hosted, text), done=DONE),
            ui=True,
        )


async def _just(events: list[dict[str, Any]]) -> AsyncIterator[bytes]:
    yield b"".join(_sse(e) for e in events)


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            p["text"]
            for p in content
            if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        )
    return ""


def _agui_prompt(messages: list[Any]) -> str:
    last = messages[-1] if messages else None
    if not isinstance(last, dict) or last.get("role") != "user":
        raise ApiError(
            400,
            "the last message is not the user's",
            "add the prompt as the last message: {id, role: user, content}",
        )
    text = _text_of(last.get("content"))
    if not text.strip():
        raise ApiError(400, "the last user message has no text", "give it text content")
    return text


def _ui_prompt(message: dict[str, Any]) -> str:
    if message.get("role") != "user":
        raise ApiError(
            400,
            f"the last message is {message.get('role')!r}, not the user's",
            "send the chat's messages with the new user message last",
        )
    text = _text_of(message.get("parts"))
    if not text.strip():
        raise ApiError(400, "the last user message has no text part", "give it a text part")
    return text


def _payload_problem(question: dict[str, Any], payload: Any) -> str:
    if question["type"] != "permission_request":
        return "" if isinstance(payload, dict) else "the payload must be an object of the fields"
    if not isinstance(payload, dict) or not isinstance(payload.get("approved"), bool):
        return 'the payload must be {"approved": true | false, …}'
    unknown = sorted(set(payload) - set(PERMISSION_SCHEMA["properties"]))
    if unknown:
        return f"unknown payload field {unknown[0]!r} (takes approved, always, reason, mode)"
    if "mode" in payload:
        from keel.errors import UserError
        from keel.permissions.gate import parse_mode

        try:
            parse_mode(str(payload["mode"]))
        except UserError as exc:
            return exc.one_line()
    return ""


def _agui_reply(entry: dict[str, Any], waiting: list[dict[str, Any]]) -> Any:
    """The `agent.answer` reply for one checked resume entry."""
    from keel.permissions.gate import PermissionReply, parse_mode

    question = next(q for q in waiting if q["request_id"] == entry["interruptId"])
    payload: dict[str, Any] = entry.get("payload") or {}
    if question["type"] != "permission_request":
        return payload if entry["status"] == "resolved" else None
    if entry["status"] == "cancelled":
        return PermissionReply(False, "once", "the user cancelled the question")
    scope: Literal["once", "always"] = "always" if payload.get("always") else "once"
    mode = parse_mode(payload["mode"]) if "mode" in payload else None
    return PermissionReply(payload["approved"], scope, payload.get("reason", ""), mode)


def _approval_answers(message: dict[str, Any]) -> list[tuple[str, Any]]:
    """The approvals a UI message answers: (request id, reply) for each tool part in state
    `approval-responded`."""
    from keel.permissions.gate import PermissionReply

    answers: list[tuple[str, Any]] = []
    for part in message.get("parts") or []:
        if not isinstance(part, dict) or part.get("state") != "approval-responded":
            continue
        approval = part.get("approval")
        if not isinstance(approval, dict) or not isinstance(approval.get("id"), str):
            continue
        reason = approval.get("reason")
        reply = PermissionReply(
            approval.get("approved") is True, "once", reason if isinstance(reason, str) else ""
        )
        answers.append((approval["id"], reply))
    return answers


__all__ = [
    "PERMISSION_SCHEMA",
    "AguiRun",
    "Streams",
    "UiStreamRun",
    "follow",
    "interrupt",
    "run_error",
]
