"""The permission gate protocol: the loop asks it about each tool call, one by one, in order."""

from __future__ import annotations

from typing import Protocol, TypeAlias

from keel.frozen import frozen
from keel.llm.messages import ToolUse


@frozen
class Allow:
    source: str = "default"


@frozen
class Deny:
    reason: str
    source: str = "default"


Decision: TypeAlias = Allow | Deny


class Gate(Protocol):
    async def authorize(self, call: ToolUse, *, read_only: bool) -> Decision: ...


class AllowAll:
    """Every call runs (library use and trusted scripts)."""

    async def authorize(self, call: ToolUse, *, read_only: bool) -> Decision:
        return Allow("allow-all")
