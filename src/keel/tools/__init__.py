"""keel.tools: the Tool protocol, the `@tool` decorator, tool kinds and metadata, the registry,
built-in tools and the one truncation function every result passes through."""

from keel.tools.base import (
    KINDS,
    FunctionTool,
    Tool,
    ToolContext,
    ToolError,
    ToolKind,
    ToolMeta,
    ToolOutput,
    tool,
    tool_kind,
    tool_meta,
)
from keel.tools.registry import Registry
from keel.tools.truncate import MAX_OUTPUT_BYTES, truncate

__all__ = [
    "KINDS",
    "MAX_OUTPUT_BYTES",
    "FunctionTool",
    "Registry",
    "Tool",
    "ToolContext",
    "ToolError",
    "ToolKind",
    "ToolMeta",
    "ToolOutput",
    "tool",
    "tool_kind",
    "tool_meta",
    "truncate",
]
