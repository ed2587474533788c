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
