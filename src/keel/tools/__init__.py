"""keel.tools: the Tool protocol, the `@tool` decorator, the registry, built-in tools and the one
truncation function every result passes through."""

from keel.tools.base import FunctionTool, Tool, ToolContext, ToolError, ToolOutput, tool
from keel.tools.registry import Registry
from keel.tools.truncate import MAX_OUTPUT_BYTES, truncate

__all__ = [
    "MAX_OUTPUT_BYTES",
    "FunctionTool",
    "Registry",
    "Tool",
    "ToolContext",
    "ToolError",
    "ToolOutput",
    "tool",
    "truncate",
]
