"""Readable diffs for replay: a system prompt cut into its named sections (`keel.agent.prompt.
sections`), tool definitions by name, messages as canonical JSON. Pure: strings in, strings out."""

from __future__ import annotations

import difflib
import hashlib
import json
from collections.abc import Iterable, Sequence
from typing import Any

from keel.agent.prompt import sections
from keel.llm.messages import Message, message_to_json
from keel.llm.request import ToolSpec


def system_hash(text: str) -> str:
    """The fingerprint's hash of a system prompt (`Agent.fingerprint`)."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def tools_json(specs: Iterable[ToolSpec]) -> str:
    return json.dumps([[s.name, s.description, s.input_schema] for s in specs], sort_keys=True)


def tools_hash(specs: Iterable[ToolSpec]) -> str:
    """The fingerprint's hash of the tool definitions (`Agent.fingerprint`)."""
    return hashlib.sha256(tools_json(specs).encode()).hexdigest()[:16]


def canonical_message(message: Message) -> str:
    """One neutral message as canonical JSON (the form requests are compared in)."""
    return json.dumps(message_to_json(message), sort_keys=True, ensure_ascii=False)


def _pretty(value: Any) -> list[str]:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False).splitlines()


def unified(old: Sequence[str], new: Sequence[str], old_name: str, new_name: str) -> str:
    return "\n".join(
        difflib.unified_diff(list(old), list(new), old_name, new_name, n=2, lineterm="")
    )


def system_diff(old: str, new: str, what: str = "system prompt") -> tuple[list[str], str]:
    """Which sections of a system prompt or a context (`what`) changed (names, in order; `+name`
    added, `-name` removed) and the unified diff of each."""
    before, after = dict(sections(old)), dict(sections(new))
    names: list[str] = []
    parts: list[str] = []
    for name in [*before, *(n for n in after if n not in before)]:
        a, b = before.get(name), after.get(name)
        if a == b:
            continue
        label = name if a is not None and b is not None else ("+" if a is None else "-") + name
        names.append(label)
        parts.append(
            unified(
                (a or "").splitlines(),
                (b or "").splitlines(),
                f"recorded {what}: {name}",
                f"now: {name}",
            )
        )
    return names, "\n".join(parts)


def tools_diff(old: Sequence[ToolSpec], new: Sequence[ToolSpec]) -> tuple[list[str], str]:
    """Which tools changed (`name`, `+name` added, `-name` removed) and a unified diff of each
    changed definition (name, description, input schema)."""
    before = {s.name: s for s in old}
    after = {s.name: s for s in new}
    names: list[str] = []
    parts: list[str] = []
    for name in sorted(before.keys() | after.keys()):
        a, b = before.get(name), after.get(name)
        if a == b:
            continue
        label = name if a is not None and b is not None else ("+" if a is None else "-") + name
        names.append(label)
        parts.append(
            unified(
                _pretty(_spec_json(a)) if a else [],
                _pretty(_spec_json(b)) if b else [],
                f"recorded tool: {name}",
                f"now: {name}",
            )
        )
    return names, "\n".join(parts)


def _spec_json(spec: ToolSpec) -> dict[str, Any]:
    return {"name": spec.name, "description": spec.description, "input_schema": spec.input_schema}


def messages_diff(old: Sequence[str], new: Sequence[str]) -> tuple[int, str]:
    """The index of the first message that differs (canonical JSON strings), and the unified
    diff of that message (pretty-printed); a missing message diffs against nothing."""
    for i in range(max(len(old), len(new))):
        a = old[i] if i < len(old) else None
        b = new[i] if i < len(new) else None
        if a != b:
            return i, unified(
                _pretty(json.loads(a)) if a is not None else [],
                _pretty(json.loads(b)) if b is not None else [],
                f"recorded message {i + 1}",
                f"now: message {i + 1}",
            )
    return -1, ""
