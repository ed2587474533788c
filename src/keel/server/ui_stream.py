"""The Vercel AI SDK's UI message stream for `keel serve`'s `POST …/ui-stream`: a keel run's
event JSON as UI message chunks (`UiStreamRun`), permission questions as the SDK's tool approval
requests, and what keel reads from the body `useChat`'s transport sends (the prompt, the
approvals answered).

Plain functions over JSON objects: nothing here knows a session, the event ring or HTTP
(`keel.server.streams` does), and the `ai` package is never imported (tests use it). The mapping
is documented in docs/server.md, "Streams for agent UIs".
"""

from __future__ import annotations

from typing import Any

from keel.server.agui import Pending, run_error, text_of
from keel.server.host import ApiError

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
            case (
                "notice"
                | "compacted"
                | "background_finished"
                | "agent_spend"
                | "question_answered"
                | "gap"
                | "auto_decision"
            ):
                # question_answered: the UI drops the question's form (by its id, the request's)
                return [self._data(event)]
            case _:
                return []


def prompt_of(message: dict[str, Any]) -> str:
    if message.get("role") != "user":
        raise ApiError(
            400,
            f"the last message is {message.get('role')!r}, not the user's",
            "send the chat's messages with the new user message last",
        )
    text = text_of(message.get("parts"))
    if not text.strip():
        raise ApiError(400, "the last user message has no text part", "give it a text part")
    return text


def approval_answers(message: dict[str, Any]) -> list[tuple[str, Any]]:
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


__all__ = ["FINISH_REASONS", "UiStreamRun", "approval_answers", "prompt_of"]
