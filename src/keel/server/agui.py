"""AG-UI (the Agent User Interaction Protocol) for `keel serve`'s `POST …/agui`: a keel run's
event JSON as AG-UI events (`AguiRun`), a session's waiting questions as AG-UI interrupts, and
what keel reads from a `RunAgentInput` (the prompt, the resume entries' answers).

Plain functions over JSON objects (`session_state` only reads a session): nothing here changes
a session or knows the event ring or HTTP (`keel.server.streams` does), and the protocol's
packages are never imported (tests use them).
The mapping is documented in docs/server.md, "Streams for agent UIs".
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from keel.server.host import ApiError

if TYPE_CHECKING:
    from keel.server.host import Hosted

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

#: The session's waiting questions, as their events' JSON (`GET …/permissions`).
Pending = Callable[[], list[dict[str, Any]]]


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
            case (
                "notice"
                | "compacted"
                | "background_finished"
                | "agent_spend"
                | "permission_answered"
                | "question_answered"
                | "gap"
                | "auto_decision"
            ):
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


def text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            p["text"]
            for p in content
            if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        )
    return ""


def prompt_of(messages: list[Any]) -> str:
    last = messages[-1] if messages else None
    if not isinstance(last, dict) or last.get("role") != "user":
        raise ApiError(
            400,
            "the last message is not the user's",
            "add the prompt as the last message: {id, role: user, content}",
        )
    text = text_of(last.get("content"))
    if not text.strip():
        raise ApiError(400, "the last user message has no text", "give it text content")
    return text


def payload_problem(question: dict[str, Any], payload: Any) -> str:
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


def resume_reply(entry: dict[str, Any], waiting: list[dict[str, Any]]) -> Any:
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


__all__ = [
    "PERMISSION_SCHEMA",
    "AguiRun",
    "Pending",
    "interrupt",
    "payload_problem",
    "prompt_of",
    "resume_reply",
    "run_error",
    "session_state",
    "text_of",
]
