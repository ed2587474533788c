"""The tool registry: the tools offered in one context, sorted by name so the tool definitions
(near the start of every request) are byte-stable."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from keel.errors import UserError
from keel.llm.request import ToolSpec
from keel.tools.base import Tool, spec


class Registry:
    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for t in tools:
            self.add(t)

    def add(self, tool: Tool) -> None:
        if tool.name in self._tools:
            raise UserError(f"two tools are named {tool.name!r}", hint="tool names must be unique")
        self._tools[tool.name] = tool
        self._tools = dict(sorted(self._tools.items()))

    def remove(self, name: str) -> None:
        """Withdraw a tool (before the first request only: the definitions are the prefix)."""
        del self._tools[name]

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    @property
    def names(self) -> list[str]:
        return list(self._tools)

    def specs(self) -> tuple[ToolSpec, ...]:
        return tuple(spec(t) for t in self._tools.values())

    def only(self, names: Iterable[str]) -> Registry:
        wanted = set(names)
        unknown = wanted - set(self._tools)
        if unknown:
            raise UserError(
                f"unknown tool(s): {', '.join(sorted(unknown))}",
                hint=f"available: {', '.join(self._tools)}",
            )
        return Registry(t for t in self._tools.values() if t.name in wanted)
