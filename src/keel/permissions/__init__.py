"""keel.permissions: whether a tool call may run. The full gate (modes, rules, sandbox) builds on
the `Gate` protocol here; `Permissions` names the ways to give an `Agent` its gate (from the
settings, with an asker, or allow-all as an explicit decision)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from keel.permissions.gate import Allow, AllowAll, Decision, Deny, Gate

if TYPE_CHECKING:
    from keel.permissions.setup import Permissions

__all__ = ["Allow", "AllowAll", "Decision", "Deny", "Gate", "Permissions"]


def __getattr__(name: str) -> Any:
    # Lazily: `keel.permissions.setup` loads settings code that `keel --version` never needs.
    if name == "Permissions":
        from keel.permissions.setup import Permissions

        return Permissions
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
