"""Stream events a provider yields for one request.

Deltas are for display only; the single `Done` at the end carries the assembled message, its usage
and stop reason, and that is what the loop stores.
"""

from __future__ import annotations

from typing import Literal, TypeAlias

from keel.frozen import frozen
from keel.llm.messages import Message, StopReason, Usage


@frozen
class TextDelta:
    text: str


@frozen
class ThinkingDelta:
    text: str


@frozen
class ToolUseStart:
    id: str
    name: str


@frozen
class ToolUseDelta:
    id: str
    partial_json: str


@frozen
class Notice:
    """Something the user should know that is not model output (a retry, a salvaged call)."""

    text: str
    level: Literal["info", "warning"] = "info"


@frozen
class Done:
    """The end of a response. `window` is the context window the server reported for the model
    (a local server knows the window it loaded; 0 means the catalog's stands). `unrun_calls`
    says why each piece of the text that looks like a tool call was not run (`keel.llm.salvage`:
    an unknown tool, arguments that do not parse); the loop answers them (`tool_call_text`)."""

    message: Message
    usage: Usage
    stop_reason: StopReason
    window: int = 0
    unrun_calls: tuple[str, ...] = ()


StreamEvent: TypeAlias = TextDelta | ThinkingDelta | ToolUseStart | ToolUseDelta | Notice | Done

#: Events that put model output on the user's screen; after one of these a retry is no longer safe.
SHOWN = (TextDelta, ThinkingDelta, ToolUseStart, ToolUseDelta)
