"""The resume gate: whether a session may continue under the current configuration.

A resumed run must replay faithfully, so the fingerprint stored in `meta` (provider, model,
hashes of the system prompt and the tool definitions, limits, thinking mode and effort) is compared
with the current one.
Any difference is refused with a per-field diff unless forced. A provider change is refused even
when forced where the stored blocks cannot be replayed to the new provider.
"""

from __future__ import annotations

from keel.errors import UserError
from keel.llm.messages import Thinking
from keel.session.fold import SessionState
from keel.session.records import Fingerprint


def fingerprint_diff(stored: Fingerprint, current: Fingerprint) -> list[str]:
    """One line per field that differs, in the order a user reads them."""
    out = []
    if stored.provider != current.provider:
        out.append(f"provider: {stored.provider} -> {current.provider}")
    if stored.model != current.model:
        out.append(f"model: {stored.model} -> {current.model}")
    if stored.system_hash != current.system_hash:
        out.append("system prompt: changed (instruction files, working directory or keel version)")
    if stored.tools_hash != current.tools_hash:
        out.append("tool definitions: changed")
    for name in ("max_turns", "max_tokens", "max_usd"):
        old, new = getattr(stored, name), getattr(current, name)
        if old != new:
            out.append(f"{name}: {old} -> {new}")
    if stored.thinking:  # recorded (files from before it was are not compared)
        if stored.thinking != current.thinking:
            out.append(f"thinking: {stored.thinking} -> {current.thinking}")
        if stored.effort != current.effort:
            out.append(f"effort: {stored.effort or 'none'} -> {current.effort or 'none'}")
    return out


def check_resume(state: SessionState, current: Fingerprint, *, force: bool) -> list[str]:
    """Raise `UserError` if the session may not resume under `current`; otherwise return the
    differences that `force` accepted (empty when none)."""
    stored = state.meta.fingerprint
    if stored is None:
        return []
    diff = fingerprint_diff(stored, current)
    if not diff:
        return []
    pending = state.pending
    if (
        stored.provider != current.provider
        and pending is not None
        and any(isinstance(b, Thinking) for b in pending.message.blocks)
    ):
        raise UserError(
            f"session {state.meta.id} stopped inside a tool round whose reasoning came from "
            f"{stored.provider}; {current.provider} cannot continue that round (the reasoning "
            "is bound to the provider that made it)",
            hint=f"resume with the original model ({state.meta.model}) to finish the round, "
            "then switch",
        )
    if not force:
        raise UserError(
            f"session {state.meta.id} was made with a different configuration: " + "; ".join(diff),
            hint="resume with the same model and settings, or pass --force to accept the change",
        )
    return diff
