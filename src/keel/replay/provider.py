"""`ReplayProvider`: serves a recorded session's assistant messages in order (with their usage)
and checks each request keel builds now against the recorded one: the system prompt and the tool
definitions by the fingerprint's hashes, the messages exactly (canonical JSON of the neutral
messages). The first request that differs stops the replay (`ReplayStopped`) with a
`Divergence` that says what differs and shows the diff.

The replay runs in a scratch copy of the workspace, so paths are mapped: what keel sends is
compared with the scratch directory written back as the recorded one (`Paths.to_recorded`), and
the recorded tool calls are served with the recorded directory written as the scratch one
(`Paths.to_scratch`), so a replayed call never touches the original workspace."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Sequence
from dataclasses import field
from typing import Any, Literal

from keel.frozen import frozen, mutable
from keel.llm.errors import LLMError
from keel.llm.events import Done, StreamEvent, TextDelta
from keel.llm.messages import (
    CONTEXT_CLOSE,
    CONTEXT_OPEN,
    Message,
    Usage,
    message_from_json,
    message_to_json,
    without_context,
)
from keel.llm.request import Request, ToolSpec
from keel.replay.diff import (
    canonical_message,
    messages_diff,
    system_diff,
    system_hash,
    tools_diff,
    tools_hash,
)

What = Literal["system", "tools", "context", "messages", "extra_request", "missing_request"]


@frozen
class Paths:
    """The recorded workspace root and its scratch copy; `dates`: today's date as the system
    prompt says it, and the recorded day it stands for."""

    recorded: str
    scratch: str
    dates: tuple[tuple[str, str], ...] = ()

    def to_recorded(self, text: str) -> str:
        return text.replace(self.scratch, self.recorded) if self.scratch else text

    def to_scratch(self, text: str) -> str:
        return text.replace(self.recorded, self.scratch) if self.scratch else text

    def system_candidates(self, system: str) -> list[str]:
        """The system prompt as it read on the recorded day (each candidate day)."""
        base = self.to_recorded(system)
        out = [base]
        for today, then in self.dates:
            swapped = base.replace(f"\nDate: {today}\n", f"\nDate: {then}\n")
            if swapped not in out:
                out.append(swapped)
        return out

    def dated(self, messages: tuple[str, ...]) -> list[tuple[str, ...]]:
        """Canonical messages as they read on each candidate recorded day: the context that
        opens the first user message says the date (JSON-escaped there)."""
        out = []
        for today, then in self.dates:
            old, new = f"\\nDate: {today}\\n", f"\\nDate: {then}\\n"
            out.append(tuple(m.replace(old, new) for m in messages))
        return out


@frozen
class Expected:
    """One recorded request (rebuilt from the journal) and the reply it got."""

    messages: tuple[str, ...]  # canonical JSON, recorded paths
    reply: Message
    usage: Usage
    stop_reason: str


@frozen
class Divergence:
    request: int
    what: What
    summary: str
    #: Sections / tools / the message index that differ.
    changed: tuple[str, ...] = ()
    diff: str = ""
    #: Every part of the request that differs (`what` is the first of them).
    parts: tuple[What, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "request": self.request,
            "what": self.what,
            "summary": self.summary,
            "changed": list(self.changed),
            "diff": self.diff,
            "parts": list(self.parts or (self.what,)),
        }


class ReplayStopped(LLMError):
    """The replay stops here: a request diverged, or `--until` was reached."""


@mutable
class Recorded:
    """What the recorded session's requests held beyond the journal's messages: the hashes of
    its fingerprint and, when they could be rebuilt, the full system prompt and tool list."""

    system_hash: str
    tools_hash: str
    system: str | None = None
    tools: tuple[ToolSpec, ...] | None = None
    #: Why the full texts are unknown (for the report when a hash differs).
    unknown_why: str = ""


@mutable
class ReplayProvider:
    name: str
    expected: Sequence[Expected]
    recorded: Recorded
    paths: Paths
    until: int | None = None
    requests: int = 0
    served: int = 0
    divergence: Divergence | None = None
    reached_until: bool = False
    #: The system prompt and tools of the first request (normalised), for the report.
    first_system: str | None = None
    first_tools: tuple[ToolSpec, ...] = field(default_factory=tuple)

    async def aclose(self) -> None:
        return None

    async def stream(self, request: Request) -> AsyncGenerator[StreamEvent, None]:
        self.requests += 1
        n = self.requests
        if self.until is not None and n > self.until:
            self.reached_until = True
            raise ReplayStopped(f"replay stopped after request {self.until} (--until)")
        if self.divergence is None:
            self.divergence = self._compare(n, request)
        if self.divergence is not None:
            raise ReplayStopped(
                f"request {n} diverged from the recorded session ({self.divergence.what})"
            )
        step = self.expected[n - 1]
        self.served += 1
        reply = _map_message(step.reply, self.paths.to_scratch)
        if text := reply.text:
            yield TextDelta(text)
        yield Done(reply, step.usage, step.stop_reason)  # type: ignore[arg-type]

    def _compare(self, n: int, request: Request) -> Divergence | None:
        if n > len(self.expected):
            return Divergence(
                n,
                "extra_request",
                f"keel now makes request {n}; the recorded session made {len(self.expected)}",
                diff=_last_message(request, self.paths),
            )
        if n == 1:
            self.first_tools = tuple(request.tools)
        found: list[Divergence] = []
        if (system := self._system(n, request.system)) is not None:
            found.append(system)
        if tools_hash(request.tools) != self.recorded.tools_hash:
            found.append(self._tools_divergence(n, request.tools))
        now = tuple(self.paths.to_recorded(canonical_message(m)) for m in request.messages)
        was = self.expected[n - 1].messages
        if now != was and was in self.paths.dated(now):
            now = was
        if now != was and (context := _context_divergence(n, was, now)) is not None:
            found.append(context)
            was, now = _without_context(was), _without_context(now)
        if now != was:
            index, diff = messages_diff(was, now)
            found.append(
                Divergence(
                    n,
                    "messages",
                    f"request {n}: message {index + 1} of {max(len(was), len(now))} differs",
                    (f"message {index + 1}",),
                    diff,
                )
            )
        if not found:
            return None
        # Everything that differs in this request, the system prompt first.
        return Divergence(
            n,
            found[0].what,
            "; ".join(d.summary for d in found),
            tuple(c for d in found for c in d.changed),
            "\n".join(d.diff for d in found if d.diff),
            tuple(d.what for d in found),
        )

    def _system(self, n: int, system: str) -> Divergence | None:
        candidates = self.paths.system_candidates(system)
        if n == 1:
            self.first_system = candidates[-1]
        if any(system_hash(c) == self.recorded.system_hash for c in candidates):
            return None
        new = candidates[-1]
        old = self.recorded.system
        if old is None:
            return Divergence(
                n,
                "system",
                f"request {n}: the system prompt differs (hash {self.recorded.system_hash} "
                f"recorded, {system_hash(new)} now); {self.recorded.unknown_why}",
            )
        changed, diff = system_diff(old, new)
        return Divergence(
            n,
            "system",
            f"request {n}: the system prompt differs in {', '.join(changed) or 'whitespace'}",
            tuple(changed),
            diff,
        )

    def _tools_divergence(self, n: int, tools: Sequence[ToolSpec]) -> Divergence:
        old = self.recorded.tools
        if old is None:
            return Divergence(
                n,
                "tools",
                f"request {n}: the tool definitions differ (hash {self.recorded.tools_hash} "
                f"recorded, {tools_hash(tools)} now); {self.recorded.unknown_why}",
            )
        changed, diff = tools_diff(old, tools)
        return Divergence(
            n,
            "tools",
            f"request {n}: the tool definitions differ in {', '.join(changed)}",
            tuple(changed),
            diff,
        )


def _map_message(message: Message, mapping: Any) -> Message:
    data = json.dumps(message_to_json(message), ensure_ascii=False)
    return message_from_json(json.loads(mapping(data)))


def _last_message(request: Request, paths: Paths) -> str:
    if not request.messages:
        return ""
    last = request.messages[-1]
    return paths.to_recorded(
        json.dumps(message_to_json(last), indent=2, sort_keys=True, ensure_ascii=False)
    )


def _context_text(canonical: str) -> str:
    """The context block that opens a canonical first user message, or ""."""
    data = json.loads(canonical)
    for block in data.get("content") or []:
        text = block.get("text") if isinstance(block, dict) else None
        if isinstance(text, str) and text.startswith(CONTEXT_OPEN + "\n"):
            return text[: len(text) - len(without_context(text))]
        break
    return ""


def _context_divergence(n: int, was: tuple[str, ...], now: tuple[str, ...]) -> Divergence | None:
    """The first user message's context, where it differs, named part by part."""
    old, new = (_context_text(m[0]) if m else "" for m in (was, now))
    if old == new or not (old and new):
        return None
    inner = [
        t.removeprefix(CONTEXT_OPEN + "\n").rstrip("\n").removesuffix(CONTEXT_CLOSE)
        for t in (old, new)
    ]
    changed, diff = system_diff(inner[0], inner[1], "context")
    return Divergence(
        n,
        "context",
        f"request {n}: the context differs in {', '.join(changed) or 'whitespace'}",
        tuple(changed),
        diff,
    )


def _without_context(messages: tuple[str, ...]) -> tuple[str, ...]:
    """Canonical messages with the first one's context taken out (compared apart)."""
    if not messages:
        return messages
    data = json.loads(messages[0])
    blocks = data.get("content") or []
    if blocks and isinstance(blocks[0], dict) and isinstance(blocks[0].get("text"), str):
        blocks[0] = {**blocks[0], "text": without_context(blocks[0]["text"])}
    return (json.dumps(data, sort_keys=True, ensure_ascii=False), *messages[1:])
