"""The JSON shapes of `--output-format json` and `stream-json` (documented in docs/headless.md).

One function turns each loop event into a JSON object; the same shapes serve the final `result`
object and the stream. Nothing here prints.
"""

from __future__ import annotations

from typing import Any, assert_never

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
    TurnStarted,
    UsageUpdated,
)
from keel.agent.loop import RunResult
from keel.agent.timing import journal_timing
from keel.llm.events import Notice, TextDelta, ThinkingDelta, ToolUseDelta, ToolUseStart
from keel.llm.messages import Usage, message_to_json


def cache_read_share(usage: Usage) -> float:
    """The share of input tokens served from the provider's prompt cache."""
    prompt = usage.input + usage.cache_read + usage.cache_write
    return usage.cache_read / prompt if prompt else 0.0


def timing_json(timing: RequestTiming) -> dict[str, Any]:
    """A request's timing as the JSON output and the journal carry it: milliseconds rounded to
    0.1, `sent_at` (seconds since the epoch) to 1 ms."""
    return journal_timing(timing).to_json()


def result_json(
    finished: RunResult, *, model: str, duration_ms: int, session_path: str | None
) -> dict[str, Any]:
    return {
        "type": "result",
        "result": finished.text,
        "stop_reason": finished.stop_reason,
        "is_error": finished.stop_reason == "error",
        "error": finished.error,
        "session_id": finished.session_id,
        "session_path": session_path,
        "model": model,
        "turns": finished.turns,
        "usage": finished.usage.to_json(),
        "cache_read_share": round(cache_read_share(finished.usage), 4),
        "cost_usd": round(finished.cost, 6),
        "duration_ms": duration_ms,
    }


def event_json(event: Event) -> dict[str, Any] | None:
    """The stream-json line for `event` (None for `TurnFinished`, which becomes the result)."""
    match event:
        case SubagentEvent(tool_use_id, agent, description, inner, task_id):
            line = event_json(inner)
            if line is None:
                return None
            labels = {"parent_tool_use_id": tool_use_id, "agent": agent, "description": description}
            if task_id:
                labels["task_id"] = task_id
            return {**line, "subagent": labels}
        case BackgroundFinished(task_id, kind, status, description):
            return {
                "type": "background_finished",
                "task_id": task_id,
                "kind": kind,
                "status": status,
                "description": description,
            }
        case RequestStarted() | RequestFinished() | AssistantMessage():
            return _request_json(event)
        case PermissionAsked() | PermissionAnswered() | QuestionRequest() | QuestionAnswered():
            return question_json(event)
        case _:
            return _loop_event_json(event)


def agent_spend_json(event: AgentSpend) -> dict[str, Any]:
    """One agent's row of a tree's spend (`agent_spend` lines; `keel serve`'s `spend`)."""
    return {
        "type": "agent_spend",
        "agent_id": event.agent_id,
        "agent": event.agent,
        "description": event.description,
        "status": event.status,
        "tool_use_id": event.tool_use_id,
        "usage": event.usage.to_json(),
        "cost_usd": round(event.cost, 6),
        "tree_usage": event.tree_usage.to_json(),
        "tree_cost_usd": round(event.tree_cost, 6),
    }


def question_json(
    event: PermissionAsked | PermissionAnswered | QuestionRequest | QuestionAnswered,
) -> dict[str, Any]:
    """A question for the user (answered on stdin with `--input-format stream-json`, over HTTP
    by `keel serve`), and how it was answered."""
    match event:
        case PermissionAsked(request_id, call, reason, suggestion, plan, agent, confirm):
            line: dict[str, Any] = {
                "type": "permission_request",
                "request_id": request_id,
                "tool_use_id": call.id,
                "tool": call.name,
                "input": call.input,
                "reason": reason,
                "suggestion": suggestion,
            }
            if plan:
                line["plan"] = plan
            if agent:
                line["agent"] = agent
            if confirm:  # a confirm tool's question: "always" saves nothing (docs/tools.md)
                line["confirm"] = True
            return line
        case PermissionAnswered(request_id, call_id, allow, scope, reason, by, waited_ms):
            return {
                "type": "permission_answered",
                "request_id": request_id,
                "tool_use_id": call_id,
                "allow": allow,
                "scope": scope,
                "reason": reason,
                "by": by,
                "waited_ms": waited_ms,
            }
        case QuestionRequest(source, message, schema, _reply, request_id):
            return {
                "type": "question",
                "request_id": request_id,
                "source": source,
                "message": message,
                "schema": schema,
            }
        case QuestionAnswered(request_id, action, by, waited_ms):
            return {
                "type": "question_answered",
                "request_id": request_id,
                "action": action,
                "by": by,
                "waited_ms": waited_ms,
            }
        case _:
            assert_never(event)


def _request_json(
    event: RequestStarted | RequestFinished | AssistantMessage,
) -> dict[str, Any] | None:
    """A model request's lines: `request` when sent, `assistant` (with its timing) for a turn's
    reply, `request_finished` for a request of another purpose (a compaction summary)."""
    match event:
        case RequestStarted(turn, model, _request, purpose):
            line: dict[str, Any] = {"type": "request", "turn": turn, "model": model}
            if purpose != "turn":
                line["purpose"] = purpose
            return line
        case RequestFinished(purpose, model, message, usage, stop_reason, cost, timing):
            if purpose == "turn":  # the `assistant` line that follows carries it all
                return None
            return {
                "type": "request_finished",
                "purpose": purpose,
                "model": model,
                "message": message_to_json(message),
                "usage": usage.to_json(),
                "stop_reason": stop_reason,
                "cost_usd": round(cost, 6),
                "timing": timing_json(timing),
            }
        case AssistantMessage(message, usage, stop_reason, cost, timing):
            line = {
                "type": "assistant",
                "message": message_to_json(message),
                "usage": usage.to_json(),
                "stop_reason": stop_reason,
                "cost_usd": round(cost, 6),
            }
            if timing is not None:
                line["timing"] = timing_json(timing)
            return line
        case _:
            assert_never(event)


def _loop_event_json(event: Event) -> dict[str, Any] | None:
    match event:
        case TurnStarted(prompt, session_id):
            return {"type": "turn_started", "prompt": prompt, "session_id": session_id}
        case TextDelta(text):
            return {"type": "text_delta", "text": text}
        case ThinkingDelta(text):
            return {"type": "thinking_delta", "text": text}
        case ToolUseStart(id_, name):
            return {"type": "tool_use_start", "id": id_, "name": name}
        case ToolUseDelta(id_, partial):
            return {"type": "tool_use_delta", "id": id_, "partial_json": partial}
        case Notice(text, level):
            return {"type": "notice", "level": level, "text": text}
        case ToolStarted(call, started_at, kind):
            return {
                "type": "tool_started",
                "id": call.id,
                "name": call.name,
                "kind": kind,
                "input": call.input,
                "started_at": round(started_at, 3),
            }
        case ToolFinished(call, result, seconds, _display, started_at, kind):
            return {
                "type": "tool_finished",
                "id": call.id,
                "name": call.name,
                "kind": kind,
                "is_error": result.is_error,
                "output": result.text,
                "seconds": round(seconds, 4),
                "started_at": round(started_at, 3),
            }
        case UsageUpdated(turn, total, cost, context, window):
            return {
                "type": "usage",
                "turn": turn.to_json(),
                "total": total.to_json(),
                "cost_usd": round(cost, 6),
                "context_tokens": context,
                "context_window": window,
            }
        case ContextCompacted(trigger, before, after):
            return {
                "type": "compacted",
                "trigger": trigger,
                "tokens_before": before,
                "tokens_after": after,
                **_check_json(event),
            }
        case AgentSpend():
            return agent_spend_json(event)
        case AutoDecision(call, decision, reason, model, cost):
            return {
                "type": "auto_decision",
                "tool_use_id": call.id,
                "tool": call.name,
                "input": call.input,
                "decision": decision,
                "reason": reason,
                "model": model,
                "cost_usd": round(cost, 6),
            }
        case _:  # TurnFinished, and the events `event_json` handles
            return None


def _check_json(event: ContextCompacted) -> dict[str, list[str]]:
    """A compaction's check of its summary (docs/compaction.md); nothing when nothing was
    checked."""
    if not event.kept and not event.missing_first:
        return {}
    return {
        "kept": list(event.kept),
        "missing_first": list(event.missing_first),
        "repaired": list(event.repaired),
        "lost": list(event.lost),
    }
