"""The benchmark's model server: the loopback Anthropic server in its own process, answering every
request with a `read` tool call until the conversation holds `turns=N` tool results, then a short
answer. It accounts the time it spends per request so the benchmark can subtract it.

Run: `python bench/bench_server.py` prints `PORT <n>` and serves until stdin closes.
`GET /_stats` returns {"requests", "busy_seconds", "first_request_at"}; `POST /_reset` clears them.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Iterator
from typing import Any

from keel.llm.messages import Message, Text, ToolUse, Usage
from keel.llm.script import Reply, Step, next_tool_id
from keel.testing.anthropic_server import AnthropicServer
from keel.testing.server import RecordedRequest, ResponseWriter

_TURNS = re.compile(r"turns=(\d+)")


def _count_results(body: dict[str, Any]) -> tuple[int, int]:
    """(tool results so far, turns wanted) from a Messages API request body."""
    messages = body.get("messages", [])
    wanted = 1
    first = messages[0]["content"] if messages else ""
    text = first if isinstance(first, str) else " ".join(b.get("text", "") for b in first)
    m = _TURNS.search(text)
    if m:
        wanted = int(m.group(1))
    results = 0
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            results += sum(1 for b in content if b.get("type") == "tool_result")
    return results, wanted


def respond(request: RecordedRequest) -> Step:
    results, wanted = _count_results(request.json)
    usage = Usage(input=1200 + 40 * results, output=30, cache_read=0, cache_write=0)
    if results < wanted:
        call = ToolUse(next_tool_id(), "read", {"path": f"file{results % 10}.txt"})
        return Reply(Message("assistant", (Text("Reading the next file."), call)), usage)
    return Reply(Message("assistant", (Text(f"Read {results} files."),)), usage)


class BenchServer(AnthropicServer):
    """With `coalesce`, each streamed reply goes out in one write instead of one per event (so the
    fake server is not the bottleneck when measuring throughput)."""

    def __init__(self, *, coalesce: bool = False) -> None:
        super().__init__(responder=respond)
        self.coalesce = coalesce
        self.busy = 0.0
        self.count = 0
        self.first_at: float | None = None

    async def handle(self, request: RecordedRequest, response: ResponseWriter) -> None:
        path = request.path.split("?")[0]
        if path == "/_stats":
            await response.send_json(
                200,
                {
                    "requests": self.count,
                    "busy_seconds": self.busy,
                    "first_request_at": self.first_at,
                },
            )
            return
        if path == "/_reset":
            self.busy, self.count, self.first_at = 0.0, 0, None
            self.requests.clear()
            await response.send_json(200, {})
            return
        if self.first_at is None:
            self.first_at = time.time()
        start = time.perf_counter()
        await super().handle(request, response)
        self.busy += time.perf_counter() - start
        self.count += 1
        # Recorded requests would grow without bound over thousands of turns.
        self.requests.clear()

    def render_stream(self, step: Reply, request: RecordedRequest) -> Iterator[bytes]:
        events = super().render_stream(step, request)
        return iter([b"".join(events)]) if self.coalesce else events


def main() -> None:
    server = BenchServer(coalesce="--coalesce" in sys.argv).start()
    print(f"PORT {server.port}", flush=True)
    sys.stdin.read()  # serve until the parent closes our stdin
    server.stop()


if __name__ == "__main__":
    main()
