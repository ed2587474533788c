"""keel.llm: the neutral message model, requests, stream events, errors, the model catalog and one
client per provider wire API. Imports nothing from the rest of keel except `keel.errors`."""

from keel.llm.errors import APIError, ContextOverflow, LLMError, StallError
from keel.llm.events import (
    Done,
    Notice,
    StreamEvent,
    TextDelta,
    ThinkingDelta,
    ToolUseDelta,
    ToolUseStart,
)
from keel.llm.messages import (
    Block,
    Image,
    Message,
    Text,
    Thinking,
    ToolResult,
    ToolUse,
    Usage,
    assistant,
    message_from_json,
    message_to_json,
    tool_result,
    user,
)
from keel.llm.request import Request, ToolSpec

__all__ = [
    "APIError",
    "Block",
    "ContextOverflow",
    "Done",
    "Image",
    "LLMError",
    "Message",
    "Notice",
    "Request",
    "StallError",
    "StreamEvent",
    "Text",
    "TextDelta",
    "Thinking",
    "ThinkingDelta",
    "ToolResult",
    "ToolSpec",
    "ToolUse",
    "ToolUseDelta",
    "ToolUseStart",
    "Usage",
    "assistant",
    "message_from_json",
    "message_to_json",
    "tool_result",
    "user",
]
