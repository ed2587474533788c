"""Everything observable about a run, as typed events (DESIGN.md invariant 3).

Front ends (the TUI, the line printer, the JSON streamers) and tracers consume these; none of them
reaches into the loop. Interactive needs (a permission question, an MCP server's question) are events with a request id,
answered through `Agent.answer`.
Provider stream deltas pass through unchanged.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal, TypeAlias

from keel.frozen import frozen
from keel.llm.events import Notice, TextDelta, ThinkingDelta, ToolUseDelta, ToolUseStart
from keel.llm.messages import Message, StopReason, ToolResult, ToolUse, Usage
from keel.llm.request import Request

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
    "empty_response",
    "context_full",
    "unrun_tool_call",
]
#: The stop reasons where the model ended the turn itself (Stop hooks may send it back to work;
#: a replay goes on to the next prompt).
MODEL_ENDED: frozenset[TurnStop] = frozenset(
    {"end_turn", "max_tokens", "refusal", "empty_response", "context_full", "unrun_tool_call"}
)
#: What a tool call the model wrote as text and keel did not run leads to (`tool_call_text`
#: setting, docs/settings.md): one nudge back to the model per prompt, the end of the turn
#: (`unrun_tool_call`), or nothing but the notice.
ToolCallText: TypeAlias = Literal["nudge", "stop", "ignore"]


@frozen
class TurnStarted:
    prompt: str
    session_id: str
    #: True when a run continues a suspended or crashed one (no new prompt).
    resumed: bool = False


@frozen
class RequestStarted:
    """A model request is about to be sent (turn `turn` of this prompt). `request` is the
    request as built (tracers record it; front ends need not look); `purpose` says what it is
    for: `turn` (the conversation), `compaction` (a summary)."""

    turn: int
    model: str
    request: Request | None = None
    purpose: str = "turn"


@frozen
class RequestTiming:
    """How one model request went, measured by the loop (DESIGN.md: traces). Times are
    milliseconds from `sent_at` (wall clock, seconds since the epoch); a phase that did not
    happen (no thinking, nothing streamed) is None."""

    sent_at: float
    #: Sent → the first streamed output of any kind (text, thinking, a tool call).
    ttft_ms: float | None
    #: Sent → the first text or tool call (what the user waits through while the model thinks).
    thinking_ms: float | None
    #: The first text or tool call → the end of the stream.
    generating_ms: float | None
    duration_ms: float
    #: Output tokens over the streaming time (None when too short to say).
    output_tokens_per_s: float | None
    #: Attempts it took (1: no retry) and what the retries, fallbacks or salvage said.
    attempts: int = 1
    notices: tuple[str, ...] = ()


@frozen
class RequestFinished:
    """A model request of any purpose ended with a reply (for a turn, `AssistantMessage`
    follows with the same message once it is journaled)."""

    purpose: str
    model: str
    message: Message
    usage: Usage
    stop_reason: StopReason
    cost: float
    timing: RequestTiming


@frozen
class AssistantMessage:
    """The assembled assistant message, after it was journaled."""

    message: Message
    usage: Usage
    stop_reason: StopReason
    cost: float
    timing: RequestTiming | None = None


@frozen
class ToolStarted:
    call: ToolUse
    #: Wall clock (seconds since the epoch) the tool started; 0.0 when unknown.
    started_at: float = 0.0
    #: What kind of tool it is: builtin, local, mcp, memory, remote, subagent ("" unknown).
    kind: str = ""


@frozen
class ToolProgress:
    """A running tool reported progress (an MCP server's notification): the card shows the
    latest `message` (or `progress`/`total`). Not journaled; the model never sees it."""

    call_id: str
    progress: float
    total: float | None = None
    message: str = ""


@frozen
class PermissionAsked:
    """The gate needs the user's answer about one call (or, for `exit_plan_mode`, a plan to
    approve). A front end shows it and answers with `agent.answer(request_id, PermissionReply)`;
    until then the call waits. `suggestion` is the rule an "always" answer saves."""

    request_id: str
    call: ToolUse
    reason: str
    suggestion: str
    plan: str = ""
    #: The subagent asking ("" for the main agent).
    agent: str = ""
    #: The tool needs the user's confirmation (docs/tools.md "The confirm gate"): "always"
    #: saves nothing and lasts as long as "session".
    confirm: bool = False


@frozen
class PermissionAnswered:
    """A permission question was answered (`by`: user, hook, cancelled, or no-answer when the
    run stopped first); `waited_ms` is how long it waited."""

    request_id: str
    call_id: str
    allow: bool
    scope: str
    reason: str
    by: str
    waited_ms: float


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
    #: Answer through `agent.answer(request_id, values | None | reason)` (or set `reply`).
    request_id: str = ""


@frozen
class QuestionAnswered:
    """A `QuestionRequest` was answered, so every front end that shows it closes it: `action`
    is accept, decline or refused (a reason instead of values); `by` is user, no-answer (it
    timed out) or cancelled. The values themselves stay with the asker."""

    request_id: str
    action: str
    by: str
    waited_ms: float


@frozen
class ToolFinished:
    call: ToolUse
    result: ToolResult
    seconds: float
    #: For the UI only (a diff, a summary); the model sees `result`.
    display: str | None = None
    #: Wall clock (seconds since the epoch) the tool started; 0.0 when unknown.
    started_at: float = 0.0
    #: What kind of tool it is (as on `ToolStarted`).
    kind: str = ""


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
    """The conversation was replaced by a summary (`trigger`: auto, overflow or manual). The
    lists are the summary's check, as in the journal's `CompactionRecord` (empty: nothing to
    check)."""

    trigger: str
    tokens_before: int
    tokens_after: int
    kept: tuple[str, ...] = ()
    missing_first: tuple[str, ...] = ()
    repaired: tuple[str, ...] = ()
    lost: tuple[str, ...] = ()


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


@frozen
class AgentSpend:
    """What one agent of a tree has spent, live: a subagent's row when it starts, after each of
    its responses and when it ends (`status`: running, then its stop reason); the main agent's
    (`agent` "main") after its own responses once it has started a subagent. `usage` and `cost`
    are the agent's own; `tree_usage` and `tree_cost` the whole tree's (the main agent's spend
    with every subagent's)."""

    agent_id: str
    agent: str
    description: str
    status: str
    usage: Usage
    cost: float
    tree_usage: Usage
    tree_cost: float
    #: The `task` call that started it ("" for the main agent).
    tool_use_id: str = ""


@frozen
class AutoDecision:
    """Auto mode's classifier decided a question the gate would have asked the user
    (`decision`: allow or deny), or could not (`unsure`: the question then goes to the user, or
    is refused headless); `reason` is the classifier's, or what went wrong."""

    call: ToolUse
    decision: str
    reason: str
    model: str
    cost: float = 0.0


Event: TypeAlias = (
    TurnStarted
    | RequestStarted
    | RequestFinished
    | TextDelta
    | ThinkingDelta
    | ToolUseStart
    | ToolUseDelta
    | Notice
    | AssistantMessage
    | ToolStarted
    | ToolProgress
    | PermissionAsked
    | PermissionAnswered
    | QuestionRequest
    | QuestionAnswered
    | ToolFinished
    | UsageUpdated
    | ContextCompacted
    | TurnFinished
    | SubagentEvent
    | BackgroundFinished
    | AgentSpend
    | AutoDecision
)

__all__ = [
    "MODEL_ENDED",
    "AgentSpend",
    "AssistantMessage",
    "AutoDecision",
    "BackgroundFinished",
    "ContextCompacted",
    "Event",
    "Notice",
    "PermissionAnswered",
    "PermissionAsked",
    "QuestionAnswered",
    "QuestionRequest",
    "RequestFinished",
    "RequestStarted",
    "RequestTiming",
    "SubagentEvent",
    "TextDelta",
    "ThinkingDelta",
    "ToolCallText",
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
