"""keel: a coding agent and durable agent runtime.

Importing `keel` is cheap and has no side effects: the public API below loads on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from keel.agent.loop import Agent, RunResult

__all__ = ["Agent", "RunResult", "__version__"]


def __getattr__(name: str) -> Any:
    if name in ("Agent", "RunResult"):
        from keel.agent import loop

        return getattr(loop, name)
    raise AttributeError(f"module 'keel' has no attribute {name!r}")
