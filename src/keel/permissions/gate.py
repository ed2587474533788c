"""The permission gate protocol: the loop asks it about each tool call, one by one, in order."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, TypeAlias

from keel.llm.messages import ToolUse


@dataclass(frozen=True, slots=True)
class Allow:
    source: str = "default"


@dataclass(frozen=True, slots=True)
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
