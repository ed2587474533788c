"""Everything observable about a run, as typed events (DESIGN.md invariant 3).

Front ends (the TUI, the line printer, the JSON streamers) and tracers consume these; none of them
reaches into the loop. Interactive needs (a permission prompt) are events carrying a reply future.
Provider stream deltas pass through unchanged.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal, TypeAlias

from keel.frozen import frozen
from keel.llm.events import Notice, TextDelta, ThinkingDelta, ToolUseDelta, ToolUseStart
from keel.llm.messages import Message, StopReason, ToolResult, ToolUse, Usage

#: How a turn ended (DESIGN.md "Stop reasons").
TurnStop: TypeAlias = Literal[
    "end_turn",
    "max_tokens",
    "refusal",
    "blocked",
    "hook_stopped",
    "error",
    "interrupted",
    "max_turns",
    "budget",
    "loop",
    "suspended",
    "unknown_outcome",
]


@frozen
class TurnStarted:
    prompt: str
    session_id: str
    #: True when a run continues a suspended or crashed one (no new prompt).
    resumed: bool = False


@frozen
class RequestStarted:
    """A model request is about to be sent (turn `turn` of this prompt)."""

    turn: int
    model: str


@frozen
class AssistantMessage:
    """The assembled assistant message, after it was journaled."""

    message: Message
    usage: Usage
    stop_reason: StopReason
    cost: float


@frozen
class ToolStarted:
    call: ToolUse


@frozen
class ToolProgress:
    """A running tool reported progress (an MCP server's notification): the card shows the
    latest `message` (or `progress`/`total`). Not journaled; the model never sees it."""

    call_id: str
    progress: float
    total: float | None = None
    message: str = ""


@frozen
class QuestionRequest:
    """A question for the user that needs a reply (an MCP server's elicitation): `schema` is
    a flat JSON schema of the fields to fill in. A front end sets `reply` to the values (the
    user accepted), None (declined), or a string saying why it cannot ask (refused). A front
    end that does not show questions must reply with a string, never leave it waiting."""

    source: str
    message: str
    schema: dict[str, Any]
    reply: asyncio.Future[dict[str, Any] | str | None]


@frozen
class ToolFinished:
    call: ToolUse
    result: ToolResult
    seconds: float
    #: For the UI only (a diff, a summary); the model sees `result`.
    display: str | None = None


@frozen
class UsageUpdated:
    """Running totals after a response. `context` is what the conversation fills of `window`."""

    turn: Usage
    total: Usage
    cost: float
    context: int
    window: int


@frozen
class ContextCompacted:
    """The conversation was replaced by a summary (`trigger`: auto, overflow or manual)."""

    trigger: str
    tokens_before: int
    tokens_after: int


@frozen
class TurnFinished:
    """Exactly one per prompt, last. `text` is the final assistant text; `error` is set for
    stop reason `error`."""

    stop_reason: TurnStop
    text: str
    usage: Usage
    cost: float
    turns: int
    session_id: str
    error: str | None = None


@frozen
class SubagentEvent:
    """An event of a subagent, labelled so a front end can nest it under the `task` call
    (`tool_use_id`) that started it. `task_id` is set for a background subagent (`bg-N`)."""

    tool_use_id: str
    agent: str
    description: str
    event: Event
    task_id: str = ""


@frozen
class BackgroundFinished:
    """A background task ended; its result reaches the model with the next request."""

    task_id: str
    kind: str
    status: str
    description: str


Event: TypeAlias = (
    TurnStarted
    | RequestStarted
    | TextDelta
    | ThinkingDelta
    | ToolUseStart
    | ToolUseDelta
    | Notice
    | AssistantMessage
    | ToolStarted
    | ToolProgress
    | QuestionRequest
    | ToolFinished
    | UsageUpdated
    | ContextCompacted
    | TurnFinished
    | SubagentEvent
    | BackgroundFinished
)

__all__ = [
    "AssistantMessage",
    "BackgroundFinished",
    "ContextCompacted",
    "Event",
    "Notice",
    "QuestionRequest",
    "RequestStarted",
    "SubagentEvent",
    "TextDelta",
    "ThinkingDelta",
    "ToolFinished",
    "ToolProgress",
    "ToolStarted",
    "ToolUseDelta",
    "ToolUseStart",
    "TurnFinished",
    "TurnStarted",
    "TurnStop",
    "UsageUpdated",
]
