"""The loop's events back from their JSON (`keel.app.jsonout.event_json`), for a front end whose
agent runs elsewhere (`keel attach` reads them off `keel serve`'s event stream).

`EventDecoder` is the inverse of `event_json` for every event kind it writes, plus the server's
`result` line (a `TurnFinished`). It keeps the calls it has seen, because a `tool_finished` line
names its call without the input. What the JSON does not carry comes back empty: a request's
body, a tool's display (a front end rebuilds an edit's diff from the call, as a resumed
transcript does), and a question's reply is a fresh future (decoding runs on an event loop).
Nothing here does I/O.
"""

from __future__ import annotations

import asyncio
from typing import Any

from keel.agent.events import (
    AgentSpend,
    AssistantMessage,
    AutoDecision,
    BackgroundFinished,
    ContextCompacted,
    Event,
    PermissionAnswered,
    PermissionAsked,
    QuestionAnswered,
    QuestionRequest,
    RequestFinished,
    RequestStarted,
    RequestTiming,
    SubagentEvent,
    ToolFinished,
    ToolStarted,
    TurnFinished,
    TurnStarted,
    UsageUpdated,
)
from keel.agent.timing import event_timing
from keel.llm.events import Notice, TextDelta, ThinkingDelta, ToolUseDelta, ToolUseStart
from keel.llm.messages import Text, ToolResult, ToolUse, Usage, message_from_json
from keel.session.records import ReplyTiming


def timing_from_json(data: dict[str, Any]) -> RequestTiming:
    return event_timing(ReplyTiming.from_json(data))


class EventDecoder:
    """Turns one session's event lines back into events, in order."""

    def __init__(self) -> None:
        #: The calls seen so far, by id (a `tool_finished` line carries only the id and name).
        self.calls: dict[str, ToolUse] = {}

    def decode(self, data: dict[str, Any]) -> Event | None:  # noqa: C901 - one case per kind
        """The event of one line (None for a line that is not a loop event: `status`, `gap`,
        `user_message` and the server's other lines)."""
        sub = data.get("subagent")
        if isinstance(sub, dict):
            inner = self.decode({k: v for k, v in data.items() if k != "subagent"})
            if inner is None:
                return None
            return SubagentEvent(
                str(sub.get("parent_tool_use_id", "")),
                str(sub.get("agent", "")),
                str(sub.get("description", "")),
                inner,
                str(sub.get("task_id", "")),
            )
        kind = data.get("type")
        match kind:
            case "turn_started":
                return TurnStarted(data["prompt"], data["session_id"])
            case "request":
                return RequestStarted(
                    data["turn"], data["model"], None, data.get("purpose", "turn")
                )
            case "request_finished":
                return RequestFinished(
                    data["purpose"],
                    data["model"],
                    message_from_json(data["message"]),
                    Usage.from_json(data["usage"]),
                    data["stop_reason"],
                    data["cost_usd"],
                    timing_from_json(data["timing"]),
                )
            case "assistant":
                message = message_from_json(data["message"])
                self.calls.update((c.id, c) for c in message.tool_uses)
                timing = data.get("timing")
                return AssistantMessage(
                    message,
                    Usage.from_json(data["usage"]),
                    data["stop_reason"],
                    data["cost_usd"],
                    timing_from_json(timing) if isinstance(timing, dict) else None,
                )
            case "text_delta":
                return TextDelta(data["text"])
            case "thinking_delta":
                return ThinkingDelta(data["text"])
            case "tool_use_start":
                return ToolUseStart(data["id"], data["name"])
            case "tool_use_delta":
                return ToolUseDelta(data["id"], data["partial_json"])
            case "notice":
                return Notice(data["text"], "warning" if data.get("level") == "warning" else "info")
            case "tool_started":
                call = self._call(data["id"], data["name"], data.get("input"))
                return ToolStarted(call, data.get("started_at", 0.0), data.get("kind", ""))
            case "tool_finished":
                return self._finished(data)
            case "usage":
                return UsageUpdated(
                    Usage.from_json(data["turn"]),
                    Usage.from_json(data["total"]),
                    data["cost_usd"],
                    data["context_tokens"],
                    data["context_window"],
                )
            case "agent_spend":
                return AgentSpend(
                    data["agent_id"],
                    data["agent"],
                    data["description"],
                    data["status"],
                    Usage.from_json(data["usage"]),
                    data["cost_usd"],
                    Usage.from_json(data["tree_usage"]),
                    data["tree_cost_usd"],
                    data["tool_use_id"],
                )
            case "compacted":
                return ContextCompacted(
                    data["trigger"],
                    data["tokens_before"],
                    data["tokens_after"],
                    *(
                        tuple(data.get(k, ()))
                        for k in ("kept", "missing_first", "repaired", "lost")
                    ),
                )
            case "auto_decision":
                call = self._call(data["tool_use_id"], data["tool"], data.get("input"))
                return AutoDecision(
                    call, data["decision"], data["reason"], data["model"], data["cost_usd"]
                )
            case "background_finished":
                return BackgroundFinished(
                    data["task_id"], data["kind"], data["status"], data["description"]
                )
            case "permission_request":
                call = self._call(data["tool_use_id"], data["tool"], data.get("input"))
                return PermissionAsked(
                    data["request_id"],
                    call,
                    data.get("reason", ""),
                    data.get("suggestion", ""),
                    data.get("plan", ""),
                    data.get("agent", ""),
                    bool(data.get("confirm", False)),
                )
            case "permission_answered":
                return PermissionAnswered(
                    data["request_id"],
                    data["tool_use_id"],
                    data["allow"],
                    data["scope"],
                    data["reason"],
                    data["by"],
                    data["waited_ms"],
                )
            case "question":
                reply: asyncio.Future[dict[str, Any] | str | None] = _future()
                return QuestionRequest(
                    data["source"], data["message"], data["schema"], reply, data["request_id"]
                )
            case "question_answered":
                return QuestionAnswered(
                    data["request_id"], data["action"], data["by"], data["waited_ms"]
                )
            case "result":
                return TurnFinished(
                    data["stop_reason"],
                    data.get("result") or "",
                    Usage.from_json(data["usage"]),
                    data["cost_usd"],
                    data["turns"],
                    data["session_id"],
                    data.get("error"),
                )
            case _:
                return None

    def _call(self, call_id: str, name: str, given: Any) -> ToolUse:
        known = self.calls.get(call_id)
        if known is not None and (given is None or known.input == given):
            return known
        call = ToolUse(call_id, name, given if isinstance(given, dict) else None)
        self.calls[call_id] = call
        return call

    def _finished(self, data: dict[str, Any]) -> ToolFinished:
        call = self.calls.get(data["id"]) or ToolUse(data["id"], data["name"], None)
        result = ToolResult(call.id, (Text(data["output"]),), bool(data["is_error"]))
        return ToolFinished(
            call,
            result,
            data["seconds"],
            None,
            data.get("started_at", 0.0),
            data.get("kind", ""),
        )


def _future() -> asyncio.Future[dict[str, Any] | str | None]:
    """A question's reply, for whoever answers it (`keel attach` answers over HTTP instead):
    decoding runs on an event loop."""
    return asyncio.get_running_loop().create_future()


__all__ = ["EventDecoder", "timing_from_json"]
