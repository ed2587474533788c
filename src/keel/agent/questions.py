"""Questions for the user, as events with a reply (DESIGN.md invariant 3): a permission
question becomes a `PermissionAsked` event and waits until a front end calls
`Agent.answer(request_id, reply)`; an MCP server's question (`QuestionRequest`) is answered the
same way. Every front end (the TUI, line mode, stream-json input, the server, ACP) uses this one
path; none of them is called back by the gate.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from typing import Any

from keel.agent.events import (
    Event,
    PermissionAnswered,
    PermissionAsked,
    QuestionAnswered,
    QuestionRequest,
)
from keel.frozen import mutable
from keel.permissions.gate import PermissionReply, PermissionRequest

#: What answers a `QuestionRequest`: the values (accepted), None (declined), or why not.
QuestionReply = dict[str, Any] | str | None


@mutable
class _Waiting:
    event: PermissionAsked | QuestionRequest
    reply: asyncio.Future[Any]
    since: float
    #: How long it really waited, when the answer says so (a fleet run's park, then its answer).
    waited_ms: float | None = None


class Questions:
    """The questions waiting for an answer. `emit` sends an event to whoever watches the agent
    (the running prompt's sink, else the background sink)."""

    def __init__(self, emit: Callable[[Event], None]) -> None:
        self.emit = emit
        self._waiting: dict[str, _Waiting] = {}
        self._ids = itertools.count(1)
        #: How long the user took to answer, by tool-use id (the journal's decision record).
        self.waited_ms: dict[str, float] = {}

    def pending(self) -> list[PermissionAsked | QuestionRequest]:
        return [w.event for w in self._waiting.values()]

    async def ask_permission(self, request: PermissionRequest) -> PermissionReply:
        """The gate's asker: emit the question, wait for `answer`."""
        request_id = f"perm-{next(self._ids)}"
        event = PermissionAsked(
            request_id,
            request.call,
            request.reason,
            request.suggestion,
            request.plan,
            confirm=request.confirm,
        )
        reply: asyncio.Future[PermissionReply] = asyncio.get_running_loop().create_future()
        since = time.monotonic()
        waiting = self._waiting[request_id] = _Waiting(event, reply, since)
        by = "user"
        answer = PermissionReply(False, reason="the run stopped before an answer")
        try:
            self.emit(event)
            answer = await reply
        except asyncio.CancelledError:
            by = "cancelled"
            raise
        finally:
            self._waiting.pop(request_id, None)
            waited = waiting.waited_ms
            if waited is None:
                waited = (time.monotonic() - since) * 1000
            self.waited_ms[request.call.id] = waited
            self.emit(
                PermissionAnswered(
                    request_id,
                    request.call.id,
                    answer.allow if by == "user" else False,
                    answer.scope if by == "user" else "once",
                    answer.reason if by == "user" else "cancelled",
                    by,
                    round(waited, 1),
                )
            )
        return answer

    def question(
        self, source: str, message: str, schema: dict[str, Any]
    ) -> tuple[QuestionRequest, asyncio.Future[QuestionReply]]:
        """A `QuestionRequest` to emit, registered so that `answer` reaches it; the caller
        emits it and awaits the future (then calls `done`, which emits `QuestionAnswered`)."""
        request_id = f"question-{next(self._ids)}"
        reply: asyncio.Future[QuestionReply] = asyncio.get_running_loop().create_future()
        event = QuestionRequest(source, message, schema, reply, request_id)
        self._waiting[request_id] = _Waiting(event, reply, time.monotonic())
        return event, reply

    def done(self, request_id: str, *, by: str = "user") -> None:
        """The question is over (`by`: user, no-answer, cancelled): every front end hears
        `QuestionAnswered` and closes its card, whichever of them answered."""
        waiting = self._waiting.pop(request_id, None)
        if waiting is None:
            return
        reply = waiting.reply
        answer = reply.result() if reply.done() and not reply.cancelled() else by
        action = (
            "accept" if isinstance(answer, dict) else "decline" if answer is None else "refused"
        )
        waited = waiting.waited_ms
        if waited is None:
            waited = (time.monotonic() - waiting.since) * 1000
        self.emit(QuestionAnswered(request_id, action, by, round(waited, 1)))

    def answer(
        self,
        request_id: str,
        reply: PermissionReply | QuestionReply,
        *,
        waited_ms: float | None = None,
    ) -> bool:
        """Answer a waiting question. False: no such question waits (answered already, or the
        id is unknown); a reply of the wrong kind raises `TypeError`."""
        waiting = self._waiting.get(request_id)
        if waiting is None or waiting.reply.done():
            return False
        if isinstance(waiting.event, PermissionAsked) != isinstance(reply, PermissionReply):
            kind = "a PermissionReply" if isinstance(waiting.event, PermissionAsked) else "values"
            raise TypeError(f"{request_id} is answered with {kind}")
        waiting.waited_ms = waited_ms
        waiting.reply.set_result(reply)
        return True

    def cancel_all(self, reason: str) -> None:
        """Refuse what still waits (the agent is closing)."""
        for waiting in list(self._waiting.values()):
            if waiting.reply.done():
                continue
            if isinstance(waiting.event, PermissionAsked):
                waiting.reply.set_result(PermissionReply(False, reason=reason))
            else:
                waiting.reply.set_result(reason)
