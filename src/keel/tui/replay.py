"""A session file as the view events a front end renders, so a resumed or rewound session shows
its transcript as it was: prompts, replies, tool cards with their results, compactions, undos and
how each prompt ended. Pure: records in, events out; nothing is run or written.

A card is rebuilt with the detail it had live: a call cut off shows how long it ran (from the
records' timestamps), an edit its diff (rebuilt from the call: the journal keeps what the model
sees, not the screen's diff), an undo the files it put back relative to the project.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from pathlib import Path

from keel.agent.events import AssistantMessage, ContextCompacted, ToolFinished, UsageUpdated
from keel.agent.timing import event_timing
from keel.llm.catalog import ModelInfo
from keel.llm.events import Notice
from keel.llm.messages import ToolResult, ToolUse, Usage
from keel.session.records import (
    AssistantRecord,
    CompactionRecord,
    DecisionRecord,
    Record,
    TerminalRecord,
    ToolResultRecord,
    ToolStartedRecord,
    UndoRecord,
    UserRecord,
)
from keel.tui.format import typed_prompt
from keel.tui.undo import Undone, relative
from keel.tui.view import Output, PromptSubmitted, ViewEvent

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
    "empty_response": "the model ended with an empty reply",
    "context_full": "the reply was cut: the context window is full",
    "unrun_tool_call": "stopped: the model wrote a tool call as text that was not run",
}
#: What the loop answers for a call it cut off (Esc, Ctrl+C): the call has no duration of its own.
_CUT_OFF = "interrupted by user"


def replay(records: Iterable[Record], info: ModelInfo, cwd: Path | None = None) -> list[ViewEvent]:
    """The events that draw `records`; paths inside `cwd` (the project) are shown relative."""
    events: list[ViewEvent] = []
    calls: dict[str, ToolUse] = {}
    total = Usage()
    cost = 0.0
    rounds = _Round()
    for record in records:
        p = record.payload
        match p:
            case UserRecord(message, "prompt"):
                events.append(PromptSubmitted(typed_prompt(message.text)))
            case AssistantRecord(message, usage, turn_cost, stop_reason, _turn, timing):
                calls.update((c.id, c) for c in message.tool_uses)
                rounds = _Round(_epoch(record.ts))
                total, cost = total + usage, cost + turn_cost
                shown = event_timing(timing) if timing is not None else None
                events.append(AssistantMessage(message, usage, stop_reason, turn_cost, shown))  # type: ignore[arg-type]
                if usage.total:
                    events.append(UsageUpdated(usage, total, cost, usage.context, info.window))
            case DecisionRecord(tool_use_id) | ToolStartedRecord(tool_use_id):
                rounds.starts[tool_use_id] = _epoch(record.ts)
            case ToolResultRecord(result, seconds, started_at, kind):
                call = calls.get(result.tool_use_id)
                if call is not None:
                    seconds = rounds.seconds(result, seconds, _epoch(record.ts))
                    display = rebuilt_diff(call, result, cwd)
                    events.append(ToolFinished(call, result, seconds, display, started_at, kind))
            case CompactionRecord(_summary, trigger, before, after, usage, summary_cost):
                total, cost = total + usage, cost + summary_cost
                check = (p.kept, p.missing_first, p.repaired, p.lost)
                events.append(ContextCompacted(trigger, before, after, *check))
                events.append(UsageUpdated(usage, total, cost, after, info.window))
            case TerminalRecord(reason, message) if reason in _ENDINGS:
                detail = f": {message}" if message and message != "cancelled" else ""
                events.append(Notice(f"{_ENDINGS[reason]}{detail}", "warning"))
            case UndoRecord():
                events.append(Output(undone(p, cwd).describe(), title="undo"))
            case _:
                pass
    return events


class _Round:
    """The calls of one assistant message, for the duration of a call the loop cut off: it ran
    from the latest of the message, its permission answer and the end of the calls before it,
    until its result was written. Only the first call cut off ran; the ones after it in the
    round never started."""

    def __init__(self, since: float = 0.0) -> None:
        self.since = since
        self.starts: dict[str, float] = {}
        self.cut = False

    def seconds(self, result: ToolResult, seconds: float, at: float) -> float:
        if seconds > 0 or not (result.is_error and result.text == _CUT_OFF):
            if seconds > 0:
                self.since = max(self.since, at)  # the next call starts after this one
            return seconds
        if self.cut:
            return seconds
        self.cut = True
        began = max(self.since, self.starts.get(result.tool_use_id, 0.0))
        return max(0.0, at - began) if began and at else seconds


def _epoch(ts: str) -> float:
    """A record's timestamp as seconds since the epoch (0.0 if it does not parse)."""
    try:
        return datetime.fromisoformat(ts).timestamp()
    except ValueError:
        return 0.0


def rebuilt_diff(call: ToolUse, result: ToolResult, cwd: Path | None) -> str | None:
    """The diff a successful edit showed live, rebuilt from the call: a file `write` created
    whole; for `edit` and `multi_edit`, each replacement as a hunk (line numbers unknown, so the
    hunks have none). None for anything else (an overwrite's earlier content is not kept)."""
    args = call.input or {}
    raw = args.get("path")
    if result.is_error or not isinstance(raw, str):
        return None
    name = relative(Path(raw), cwd) if Path(raw).is_absolute() else str(Path(raw))
    hunks: list[list[str]] = []
    if call.name == "write" and result.text.startswith("Created"):
        hunks.append(_hunk("", str(args.get("content", "")), whole=True))
    elif call.name == "edit":
        hunks.append(_hunk(str(args.get("old_string", "")), str(args.get("new_string", ""))))
    elif call.name == "multi_edit":
        for edit in args.get("edits") or []:
            if isinstance(edit, dict):
                hunks.append(
                    _hunk(str(edit.get("old_string", "")), str(edit.get("new_string", "")))
                )
    if not any(hunks):
        return None
    lines = [f"--- a/{name}", f"+++ b/{name}"]
    for hunk in hunks:
        lines += hunk
    return "\n".join(lines) + "\n"


def _hunk(old: str, new: str, *, whole: bool = False) -> list[str]:
    import difflib

    body = list(difflib.unified_diff(old.splitlines(), new.splitlines(), lineterm="", n=3))[2:]
    if whole:
        return body  # a new file: its line numbers are right
    return ["@@" if line.startswith("@@") else line for line in body]


def undone(record: UndoRecord, cwd: Path | None) -> Undone:
    """An undo as it was shown live: paths relative to the project."""
    failed = []
    for entry in record.failed:
        path, _, why = entry.partition(": ")
        failed.append(f"`{relative(Path(path), cwd)}`: {why}")
    return Undone(
        " ".join(record.label.split()),
        tuple(relative(Path(p), cwd) for p in record.restored),
        tuple(relative(Path(p), cwd) for p in record.removed),
        tuple(failed),
    )


__all__ = ["rebuilt_diff", "replay", "undone"]
