"""A session file as the view events a front end renders, so a resumed or rewound session shows
its transcript as it was: prompts, replies, tool cards with their results, compactions, undos and
how each prompt ended. Pure: records in, events out; nothing is run or written.
"""

from __future__ import annotations

from collections.abc import Iterable

from keel.agent.events import AssistantMessage, ContextCompacted, ToolFinished, UsageUpdated
from keel.agent.timing import event_timing
from keel.llm.catalog import ModelInfo
from keel.llm.events import Notice
from keel.llm.messages import ToolUse, Usage
from keel.session.records import (
    AssistantRecord,
    CompactionRecord,
    Record,
    TerminalRecord,
    ToolResultRecord,
    UserRecord,
)
from keel.tui.format import typed_prompt
from keel.tui.view import PromptSubmitted, ViewEvent

#: How a prompt ended, for the ones worth a line in the transcript.
_ENDINGS = {
    "interrupted": "interrupted",
    "error": "stopped by an error",
    "budget": "stopped: budget reached",
    "max_turns": "stopped: max_turns reached",
    "loop": "stopped by the loop guard",
    "suspended": "suspended",
    "blocked": "blocked by a hook",
    "hook_stopped": "stopped by a hook",
    "max_tokens": "the reply hit the output token limit",
    "refusal": "the model declined",
    "unknown_outcome": "stopped: a call that is not safe to repeat has an unknown outcome",
}


def replay(records: Iterable[Record], info: ModelInfo) -> list[ViewEvent]:
    events: list[ViewEvent] = []
    calls: dict[str, ToolUse] = {}
    total = Usage()
    cost = 0.0
    for record in records:
        p = record.payload
        match p:
            case UserRecord(message, "prompt"):
                events.append(PromptSubmitted(typed_prompt(message.text)))
            case AssistantRecord(message, usage, turn_cost, stop_reason, _turn, timing):
                calls.update((c.id, c) for c in message.tool_uses)
                total, cost = total + usage, cost + turn_cost
                shown = event_timing(timing) if timing is not None else None
                events.append(AssistantMessage(message, usage, stop_reason, turn_cost, shown))  # type: ignore[arg-type]
                if usage.total:
                    events.append(UsageUpdated(usage, total, cost, usage.context, info.window))
            case ToolResultRecord(result, seconds, started_at, kind):
                call = calls.get(result.tool_use_id)
                if call is not None:
                    events.append(ToolFinished(call, result, seconds, None, started_at, kind))
            case CompactionRecord(_summary, trigger, before, after, usage, summary_cost):
                total, cost = total + usage, cost + summary_cost
                events.append(ContextCompacted(trigger, before, after))
                events.append(UsageUpdated(usage, total, cost, after, info.window))
            case TerminalRecord(reason, message) if reason in _ENDINGS:
                detail = f": {message}" if message and message != "cancelled" else ""
                events.append(Notice(f"{_ENDINGS[reason]}{detail}", "warning"))
            case _ if getattr(p, "type", "") == "undo":
                restored = [*getattr(p, "restored", ()), *getattr(p, "removed", ())]
                events.append(Notice(f"undone: {', '.join(restored) or 'no files'}", "info"))
            case _:
                pass
    return events


__all__ = ["replay"]
