"""The events of one hosted session as numbered SSE messages: a replay ring and its subscribers.

Every event the session publishes gets the next `seq` and is serialised once. The ring keeps the
last `size` of them (fewer when they hold more than `max_bytes` of JSON), so a client that
reconnects with `Last-Event-ID` (or `?after=`) is sent exactly the ones it missed; when the ring no longer holds them it is sent a `gap` message first
(the session file is the source of truth: `GET …/messages`). Each subscriber has a bounded
buffer: one that falls `limit` messages behind is dropped (its stream ends with a `dropped`
message; it reconnects and replays), never the agent, which never waits on a subscriber.

Nothing here knows about HTTP beyond the SSE wire format; everything runs on one event loop.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

from keel.frozen import mutable

#: Events kept for replay, per session (Larik keeps 4096).
RING_SIZE = 4096
#: ... and at most this many bytes of their JSON: a session's tool outputs (a `read` of a large
#: file is tens of KB) would otherwise keep up to 4096 of them, for as long as it stays loaded.
RING_BYTES = 1 << 20
#: Messages a subscriber may fall behind before it is dropped.
SUBSCRIBER_LIMIT = 1024
#: Seconds between keepalive comments on an idle stream.
KEEPALIVE = 15.0
_COMPACT = (",", ":")


@dataclass(frozen=True, slots=True)
class Sent:
    """One published event: its number, kind (the JSON's `type`) and JSON text."""

    seq: int
    kind: str
    data: str

    def frame(self) -> bytes:
        return f"id: {self.seq}\nevent: {self.kind}\ndata: {self.data}\n\n".encode()


def message(kind: str, data: dict[str, Any]) -> bytes:
    """An SSE message without an id (it does not move the client's Last-Event-ID)."""
    return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False, separators=_COMPACT)}\n\n".encode()


@mutable(eq=False)
class Subscriber:
    limit: int
    backlog: deque[Sent] = field(default_factory=deque)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    dropped: bool = False
    closed: bool = False

    def offer(self, sent: Sent) -> None:
        if self.dropped or self.closed:
            return
        if len(self.backlog) >= self.limit:
            self.dropped = True
            self.backlog.clear()
        else:
            self.backlog.append(sent)
        self.wake.set()

    def close(self) -> None:
        self.closed = True
        self.wake.set()


class EventRing:
    """The numbered events of one session. `publish` never blocks and never raises for a
    subscriber's sake."""

    def __init__(
        self,
        session: str,
        *,
        size: int = RING_SIZE,
        max_bytes: int = RING_BYTES,
        limit: int = SUBSCRIBER_LIMIT,
    ) -> None:
        self.session = session
        self._ring: deque[Sent] = deque(maxlen=size)
        self._max_bytes = max_bytes
        #: The JSON held, in characters (what bounds the ring's memory along with its length).
        self.held_bytes = 0
        self._seq = 0
        self._limit = limit
        self._subscribers: set[Subscriber] = set()
        self.closed = False

    @property
    def last_seq(self) -> int:
        return self._seq

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)

    def publish(self, data: dict[str, Any]) -> int:
        """Number `data` (an event's JSON, `type` its kind), keep it and send it to every
        subscriber; returns its seq."""
        self._seq += 1
        body = {**data, "seq": self._seq, "session": self.session}
        sent = Sent(
            self._seq, str(data["type"]), json.dumps(body, ensure_ascii=False, separators=_COMPACT)
        )
        ring = self._ring
        if len(ring) == ring.maxlen:
            self.held_bytes -= len(ring[0].data)  # the append drops it
        ring.append(sent)
        self.held_bytes += len(sent.data)
        while self.held_bytes > self._max_bytes and len(ring) > 1:
            self.held_bytes -= len(ring.popleft().data)
        for sub in self._subscribers:
            sub.offer(sent)
        return self._seq

    def close(self) -> None:
        """No more events: every stream ends after what it has been sent."""
        self.closed = True
        for sub in self._subscribers:
            sub.close()

    def subscribe(self, after: int | None) -> tuple[Subscriber, list[Sent], dict[str, Any] | None]:
        """A new subscriber, the events after `after` it missed (None: none, it follows from
        now), and the gap it cannot be sent (None: nothing lost)."""
        sub = Subscriber(self._limit)
        if self.closed:
            sub.close()
        self._subscribers.add(sub)
        if after is None or after >= self._seq:
            gap = None
            if after is not None and after > self._seq:
                # A number from before a restart of the server (or made up): nothing to replay
                # can be trusted to follow on from it.
                gap = self._gap(after, "the server does not know that seq (it restarted?)")
            return sub, [], gap
        oldest = self._ring[0].seq if self._ring else self._seq + 1
        missed = [s for s in self._ring if s.seq > after]
        gap = None
        if after + 1 < oldest:
            gap = self._gap(after, f"events {after + 1} to {oldest - 1} are no longer held")
        return sub, missed, gap

    def _gap(self, after: int, why: str) -> dict[str, Any]:
        return {
            "type": "gap",
            "session": self.session,
            "after": after,
            "first": self._ring[0].seq if self._ring else self._seq + 1,
            "last_seq": self._seq,
            "reason": why,
            "hint": f"reload the transcript: GET /v1/sessions/{self.session}/messages",
        }

    def unsubscribe(self, sub: Subscriber) -> None:
        self._subscribers.discard(sub)

    async def stream(
        self, after: int | None, *, keepalive: float = KEEPALIVE
    ) -> AsyncGenerator[bytes, None]:
        """The SSE body for one client: the gap, the replay, then live events, with a keepalive
        comment after `keepalive` idle seconds. Ends when the ring closes or the client is
        dropped."""
        sub, missed, gap = self.subscribe(after)
        try:
            yield b"retry: 1000\n\n"
            if gap is not None:
                yield message("gap", gap)
            for sent in missed:
                yield sent.frame()
            while True:
                while not sub.backlog and not sub.dropped and not sub.closed:
                    sub.wake.clear()
                    try:
                        await asyncio.wait_for(sub.wake.wait(), keepalive)
                    except TimeoutError:
                        yield b": keepalive\n\n"
                if sub.dropped:
                    yield message(
                        "dropped",
                        {
                            "type": "dropped",
                            "session": self.session,
                            "reason": f"this client fell {self._limit} events behind",
                            "hint": "reconnect with Last-Event-ID to replay what was missed",
                        },
                    )
                    return
                if sub.backlog:
                    batch = b"".join(s.frame() for s in sub.backlog)
                    sub.backlog.clear()
                    yield batch
                    continue
                if sub.closed:
                    return
        finally:
            self.unsubscribe(sub)


__all__ = [
    "KEEPALIVE",
    "RING_BYTES",
    "RING_SIZE",
    "SUBSCRIBER_LIMIT",
    "EventRing",
    "Sent",
    "Subscriber",
    "message",
]
