"""Helpers shared by the provider tests."""

from __future__ import annotations

import json
import os
import re
import socket
from pathlib import Path
from typing import Any

from keel.llm.events import StreamEvent
from keel.llm.request import Request
from keel.testing.server import RecordedRequest


class Sleeps(list[float]):
    """Stands in for `asyncio.sleep` in `RetryingProvider`: records the waits, waits for nothing."""

    async def __call__(self, seconds: float) -> None:
        self.append(seconds)

    @property
    def waits(self) -> list[float]:
        return list(self)


async def collect(provider: Any, req: Request, into: list[StreamEvent] | None = None) -> list[Any]:
    """Every event of one streamed call (appended to `into` as they come, when given)."""
    events: list[StreamEvent] = [] if into is None else into
    async for event in provider.stream(req):
        events.append(event)
    return events


def body(recorded: RecordedRequest) -> dict[str, Any]:
    data = json.loads(recorded.body)
    assert isinstance(data, dict)
    return data


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (for unreachable-server tests)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


#: The line keel prints at start when bash has no sandbox here (headless `keel: warning: …`, line
#: mode `⚠ …`); see keel.permissions.setup.unsandboxed_line.
_UNSANDBOXED = re.compile(r"^(keel: warning: |⚠ )no sandbox: ")


def unsandboxed_line_dropped(text: str) -> str:
    """`text` without keel's "no sandbox" line, for a test about other output that must read the
    same on a machine with bubblewrap and on one without (the line itself is tested in
    test_library_safety)."""
    return "".join(line for line in text.splitlines(keepends=True) if not _UNSANDBOXED.match(line))


def user_settings_file() -> Path:
    """The user's own settings file (the test's isolated `KEEL_CONFIG_DIR`): what it configures
    is the user's, unlike any file inside a project tree (`keel.config.intake`)."""
    return Path(os.environ["KEEL_CONFIG_DIR"]) / "settings.json"


#: The context that opens a fresh context's first user message (`keel.agent.prompt.context_text`),
#: with the blank line that joins it to the prompt in a plain-string message.
_CONTEXT = re.compile(r"\A<context>\n.*?\n</context>(?:\n\n|\Z)", re.DOTALL)


def without_context(text: str) -> str:
    """A user message's text without the `<context>` block that opens it (if it does)."""
    return _CONTEXT.sub("", text, count=1)


def context_of(request_body: dict[str, Any]) -> str:
    """The `<context>` block of a model request's first user message (Anthropic, Chat
    Completions or Responses body), or ""."""
    for message in request_body.get("messages") or request_body.get("input") or []:
        if not isinstance(message, dict) or message.get("role") != "user":
            continue
        content = message.get("content")
        texts = (
            [content]
            if isinstance(content, str)
            else [str(block.get("text", "")) for block in content or [] if isinstance(block, dict)]
        )
        for text in texts:
            found = _CONTEXT.match(text)
            if found:
                return found.group(0).strip("\n")
        return ""
    return ""


def system_and_context(request_body: dict[str, Any]) -> str:
    """What the model is told before the conversation: the system prompt's text (a string or
    Anthropic's blocks), then the context that opens the first user message."""
    system = request_body.get("system") or request_body.get("instructions") or ""
    if not isinstance(system, str):
        system = "".join(str(block["text"]) for block in system)
    if not system:  # Chat Completions: the leading system message
        messages = request_body.get("messages") or []
        if messages and messages[0].get("role") == "system":
            system = str(messages[0]["content"])
    context = context_of(request_body)
    return f"{system}\n\n{context}" if context else system
