"""keel.permissions: whether a tool call may run. The full gate (modes, rules, sandbox) builds on
the `Gate` protocol here."""

from keel.permissions.gate import Allow, AllowAll, Decision, Deny, Gate

__all__ = ["Allow", "AllowAll", "Decision", "Deny", "Gate"]
