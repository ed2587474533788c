"""Request timing: the clock the loop runs for every model request, and its journal copy.

`RequestClock` measures one request from the moment it is sent: time to the first streamed output
of any kind (TTFT), to the first text or tool call (thinking), the rest of the stream (generating),
output tokens per second, and the attempts and notices (retries, fallbacks, salvage) it took. It
sits on the per-delta path, so it must stay cheap there: once the first text or tool call arrived,
the loop only compares `clock.output` with None (and notes a `Notice`); nothing is allocated.
Wall-clock `sent_at` comes from `time.time()`, every interval from `time.monotonic()`.
"""

from __future__ import annotations

import time

from keel.agent.events import RequestTiming
from keel.llm.events import Done, Notice, StreamEvent, TextDelta, ToolUseDelta, ToolUseStart
from keel.llm.provider import Provider, final_reply
from keel.llm.request import Request
from keel.session.records import ReplyTiming

#: Below this much streaming time a tokens-per-second figure says nothing.
MIN_RATE_SECONDS = 0.05
#: What ends the thinking phase: the first text or tool call.
_OUTPUT = (TextDelta, ToolUseStart, ToolUseDelta)


class RequestClock:
    """One request's clock, started when it is created (just before the request is sent)."""

    __slots__ = ("_sent", "attempts", "first", "notices", "output", "sent_at")

    def __init__(self) -> None:
        self.sent_at = time.time()
        self._sent = time.monotonic()
        #: Monotonic times of the first streamed output of any kind, and of the first text or
        #: tool call (None until they happen).
        self.first: float | None = None
        self.output: float | None = None
        self.attempts = 1
        self.notices: list[str] = []

    def see(self, event: StreamEvent) -> None:
        """Note `event`. The loop calls it for every event until the first text or tool call,
        and for every `Notice` after that.

        A warning before any output means that attempt failed and another was made (the retry
        and fallback wrappers say so before they try again; nothing is retried once output was
        shown), so it counts an attempt."""
        if isinstance(event, Notice):
            self.notices.append(event.text)
            if self.first is None and event.level == "warning":
                self.attempts += 1
        elif isinstance(event, _OUTPUT):
            self.output = time.monotonic()
            if self.first is None:
                self.first = self.output
        elif self.first is None and not isinstance(event, Done):
            self.first = time.monotonic()  # thinking streamed first

    def timing(self, output_tokens: int) -> RequestTiming:
        """The request's timing, with the stream ending now. Tokens per second count the output
        tokens (thinking included) over the time they streamed in: first output to the end."""
        end = time.monotonic()
        sent, first, output = self._sent, self.first, self.output
        streaming = end - first if first is not None else 0.0
        rate = (
            output_tokens / streaming
            if output_tokens > 0 and streaming >= MIN_RATE_SECONDS
            else None
        )
        return RequestTiming(
            sent_at=self.sent_at,
            ttft_ms=None if first is None else (first - sent) * 1000,
            thinking_ms=None if output is None else (output - sent) * 1000,
            generating_ms=None if output is None else (end - output) * 1000,
            duration_ms=(end - sent) * 1000,
            output_tokens_per_s=rate,
            attempts=self.attempts,
            notices=tuple(self.notices),
        )


async def timed_reply(
    provider: Provider, request: Request, clock: RequestClock
) -> tuple[Done | None, RequestTiming]:
    """Stream `request` to its end, timed, keeping only its `Done` (for a request nobody watches
    live, such as a compaction summary)."""

    def see(event: StreamEvent) -> None:
        if clock.output is None or isinstance(event, Notice):
            clock.see(event)

    done = await final_reply(provider, request, see)
    return done, clock.timing(done.usage.output if done is not None else 0)


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def journal_timing(t: RequestTiming) -> ReplyTiming:
    """The journal's copy (and the JSON output's): milliseconds to 0.1, `sent_at` to 1 ms."""
    return ReplyTiming(
        round(t.sent_at, 3),
        _ms(t.ttft_ms),
        _ms(t.thinking_ms),
        _ms(t.generating_ms),
        round(t.duration_ms, 1),
        _ms(t.output_tokens_per_s),
        t.attempts,
        t.notices,
    )


def event_timing(t: ReplyTiming) -> RequestTiming:
    """A journaled timing as the loop's event carries it (a replayed transcript)."""
    return RequestTiming(
        t.sent_at,
        t.ttft_ms,
        t.thinking_ms,
        t.generating_ms,
        t.duration_ms,
        t.output_tokens_per_s,
        t.attempts,
        t.notices,
    )


def thought_seconds(t: RequestTiming | None) -> int | None:
    """Whole seconds to show as "thought for Ns" under a reply (None below one second)."""
    if t is None or t.thinking_ms is None or t.thinking_ms < 1000:
        return None
    return round(t.thinking_ms / 1000)


__all__ = [
    "RequestClock",
    "event_timing",
    "journal_timing",
    "thought_seconds",
    "timed_reply",
]
