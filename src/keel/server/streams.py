"""A session's run as the streams agent UIs read, on `keel serve`: AG-UI events
(`POST …/agui`, the translation in `keel.server.agui`) and the Vercel AI SDK's UI message stream
(`POST …/ui-stream`, in `keel.server.ui_stream`); docs/server.md, "Streams for agent UIs".

Each route starts a prompt (or answers the questions a previous stream stopped at) and follows
the session's event ring from that point, as `GET …/events` does, feeding each keel event's
JSON to the protocol's translation, so both streams carry exactly what the SSE stream carries.
A permission question ends the stream the way each protocol defines it (AG-UI: `RUN_FINISHED`
with an interrupt outcome; the AI SDK: `tool-approval-request`), and the client's next request
answers it and follows on from where the stream stopped.

Nothing here runs work or decides a permission: the prompt goes through `Host.prompt`, answers
through `agent.answer`, exactly as the `/v1/` routes do.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from keel.server import agui, ui_stream
from keel.server.agui import AguiRun, Pending, run_error, session_state
from keel.server.host import ApiError, Host, Hosted, question_json
from keel.server.ring import KEEPALIVE, EventRing, Sent, Subscriber
from keel.server.ui_stream import UiStreamRun

#: The SSE headers both streams send (no proxy buffering: a token at a time).
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}
#: The header that tells the AI SDK's transport which stream this is.
UI_STREAM_HEADER = {"x-vercel-ai-ui-message-stream": "v1"}
#: The UI message stream's last message.
DONE = b"data: [DONE]\n\n"
_COMPACT = (",", ":")


def _sse(data: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(data, ensure_ascii=False, separators=_COMPACT)}\n\n".encode()


# -- following the ring ----------------------------------------------------------------------------


async def follow(
    ring: EventRing,
    sub: Subscriber,
    missed: list[Sent],
    gap: dict[str, Any] | None,
    *,
    keepalive: float,
) -> AsyncGenerator[dict[str, Any] | None, None]:
    """The events after the subscription point as JSON (None: `keepalive` quiet seconds
    passed), then live ones; a `dropped` event when this reader fell behind; ends when the ring
    closes."""
    try:
        if gap is not None:
            yield gap
        for sent in missed:
            yield json.loads(sent.data)
        while True:
            while not sub.backlog and not sub.dropped and not sub.closed:
                sub.wake.clear()
                try:
                    await asyncio.wait_for(sub.wake.wait(), keepalive)
                except TimeoutError:
                    yield None
            if sub.dropped:
                yield {"type": "dropped", "reason": "this client fell behind the run"}
                return
            if sub.backlog:
                batch = list(sub.backlog)
                sub.backlog.clear()
                for sent in batch:
                    yield json.loads(sent.data)
                continue
            if sub.closed:
                return
    finally:
        ring.unsubscribe(sub)


# -- the routes ------------------------------------------------------------------------------------


def _any_json() -> tuple[type, ...]:
    return (dict, list, str, int, float, bool, type(None))


class Streams:
    """The two routes, over the `Host` of `keel serve`."""

    def __init__(self, host: Host, *, keepalive: float = KEEPALIVE) -> None:
        self.host = host
        self.keepalive = keepalive
        #: Where each question a stream stopped at was published: (session, request id) →
        #: seq, so that the stream that answers it follows on from exactly there.
        self.stopped_at: dict[tuple[str, str], int] = {}

    def routes(self) -> list[Route]:
        s = "/v1/sessions/{id}"
        return [
            Route(f"{s}/agui", self.agui, methods=["POST"]),
            Route(f"{s}/ui-stream", self.ui_stream, methods=["POST"]),
        ]

    # -- shared ------------------------------------------------------------------------------------

    def _pending(self, hosted: Hosted) -> Pending:
        """The session's waiting questions; forgets where streams stopped at the ones that no
        longer wait (answered another way, or the run stopped)."""

        def pending() -> list[dict[str, Any]]:
            waiting = [question_json(q) for q in hosted.agent.pending_questions()]
            ids = {q["request_id"] for q in waiting}
            for key in [k for k in self.stopped_at if k[0] == hosted.id and k[1] not in ids]:
                del self.stopped_at[key]
            return waiting

        return pending

    def _answer(self, hosted: Hosted, request_id: str, reply: Any) -> None:
        if not hosted.agent.answer(request_id, reply):
            raise ApiError(
                404,
                f"no pending question {request_id!r} in session {hosted.id}",
                "answered already, or the run stopped",
            )

    def _after(self, hosted: Hosted, request_ids: list[str]) -> int:
        """The seq to follow on from when answering `request_ids`: the earliest a stream
        stopped at (else now: a question asked before this server knew of it)."""
        stops = [self.stopped_at.pop((hosted.id, r), None) for r in request_ids]
        known = [s for s in stops if s is not None]
        return min(known) if known else hosted.ring.last_seq

    def _stream(
        self,
        hosted: Hosted,
        after: int,
        run: AguiRun | UiStreamRun,
        work: Callable[[], None],
        *,
        done: bytes = b"",
    ) -> AsyncIterator[bytes]:
        """Do `work` (start the prompt, answer the questions; an `ApiError` is raised as it
        is), then stream the run from `after`: the ring replays what the work published before
        the stream subscribed, so nothing is missed and nothing is subscribed for a stream
        that never starts."""
        work()
        return self._frames(hosted, after, run, done)

    async def _frames(
        self, hosted: Hosted, after: int, run: AguiRun | UiStreamRun, done: bytes
    ) -> AsyncIterator[bytes]:
        ring = hosted.ring
        sub, missed, gap = ring.subscribe(after)
        events = follow(ring, sub, missed, gap, keepalive=self.keepalive)
        try:
            yield b"".join(_sse(e) for e in run.start())
            async for event in events:
                if event is None:
                    yield b": keepalive\n\n"
                    continue
                out = run.feed(event)
                if run.done and event["type"] in ("permission_request", "question"):
                    for q in run.pending():
                        key = (hosted.id, q["request_id"])
                        self.stopped_at.setdefault(key, int(event["seq"]))
                if out:
                    yield b"".join(_sse(e) for e in out)
                if run.done:
                    break
            if not run.done:  # the ring closed without a word (it always says why first)
                yield _sse(run_error({"type": "server_stopping"}))
            yield done
        finally:
            await events.aclose()
            ring.unsubscribe(sub)  # `follow` does too, once it has started

    def _response(self, body: AsyncIterator[bytes], *, ui: bool = False) -> Response:
        headers = {**SSE_HEADERS, **(UI_STREAM_HEADER if ui else {})}
        return StreamingResponse(body, media_type="text/event-stream", headers=headers)

    # -- AG-UI -------------------------------------------------------------------------------------

    async def agui(self, request: Request) -> Response:
        from keel.server.http import OPT_STR, STR, read_body

        hosted = self.host.get(request.path_params["id"])
        body = await read_body(
            request,
            {
                "threadId": STR,
                "runId": STR,
                "parentRunId": OPT_STR,
                "protocolVersion": OPT_STR,
                "state": _any_json(),
                "messages": (list,),
                "tools": (list,),
                "context": (list,),
                "forwardedProps": _any_json(),
                "resume": (list, type(None)),
            },
        )
        for name in ("threadId", "runId", "messages"):
            if name not in body:
                raise ApiError(
                    400,
                    f"{name} is missing",
                    "send a RunAgentInput: {threadId, runId, messages, …}",
                )
        pending = self._pending(hosted)
        run = AguiRun(
            thread_id=body["threadId"],
            run_id=body["runId"],
            session=lambda: session_state(hosted),
            pending=pending,
        )
        resume = body.get("resume") or []
        refusal = self._agui_refusal(hosted, resume, pending())
        if refusal is not None:
            head = [
                {"type": "RUN_STARTED", "threadId": run.thread_id, "runId": run.run_id},
                {"type": "RUN_ERROR", "message": refusal, "code": "interrupt"},
            ]
            return self._response(_just(head))
        if resume:
            waiting = pending()
            replies = [(r["interruptId"], agui.resume_reply(r, waiting)) for r in resume]
            after = self._after(hosted, [rid for rid, _ in replies])
            return self._response(
                self._stream(hosted, after, run, lambda: self._answer_all(hosted, replies))
            )
        text = agui.prompt_of(body["messages"])
        after = hosted.ring.last_seq
        return self._response(self._stream(hosted, after, run, lambda: self._start(hosted, text)))

    def _start(self, hosted: Hosted, text: str) -> None:
        self.host.prompt(hosted, text)

    def _answer_all(self, hosted: Hosted, replies: list[tuple[str, Any]]) -> None:
        for request_id, reply in replies:
            self._answer(hosted, request_id, reply)

    def _agui_refusal(
        self, hosted: Hosted, resume: list[Any], waiting: list[dict[str, Any]]
    ) -> str | None:
        """Why this input breaks the interrupt contract (docs/concepts/interrupts in AG-UI),
        or None. A `RUN_ERROR` says it, as the protocol asks."""
        open_ids = {q["request_id"]: q for q in waiting}
        if not resume:
            if open_ids:
                return (
                    f"the thread has open interrupts ({', '.join(open_ids)}): send a resume "
                    "addressing every one"
                )
            return None
        given: set[str] = set()
        for entry in resume:
            if (
                not isinstance(entry, dict)
                or not isinstance(entry.get("interruptId"), str)
                or entry.get("status") not in ("resolved", "cancelled")
            ):
                return 'each resume entry is {"interruptId", "status": "resolved" | "cancelled"}'
            rid = entry["interruptId"]
            if rid not in open_ids:
                return f"interrupt {rid!r} is not open (answered already, or the run stopped)"
            if entry["status"] == "resolved":
                problem = agui.payload_problem(open_ids[rid], entry.get("payload"))
                if problem:
                    return f"interrupt {rid}: {problem}"
            given.add(rid)
        # Every interrupt a stream reported must be answered; one asked since is reported by
        # the stream this input starts.
        reported = {rid for rid in open_ids if (hosted.id, rid) in self.stopped_at}
        missing = sorted(reported - given)
        if missing:
            return f"the resume leaves interrupts open: {', '.join(missing)}; address every one"
        return None

    # -- the AI SDK --------------------------------------------------------------------------------

    async def ui_stream(self, request: Request) -> Response:
        from keel.server.http import OPT_STR, STR, read_body

        hosted = self.host.get(request.path_params["id"])
        body = await read_body(
            request,
            {"id": STR, "messages": (list,), "trigger": STR, "messageId": OPT_STR},
        )
        trigger = body.get("trigger", "submit-message")
        if trigger != "submit-message":
            raise ApiError(
                400,
                f"trigger {trigger!r} is not supported",
                "keel runs new prompts (submit-message); fork the session to try a turn again",
            )
        messages = body.get("messages") or []
        if not messages or not isinstance(messages[-1], dict):
            raise ApiError(400, "messages is empty", "send the chat's messages, the last one new")
        last = messages[-1]
        pending = self._pending(hosted)
        if last.get("role") == "assistant":
            answers = ui_stream.approval_answers(last)
            if not answers:
                raise ApiError(
                    400,
                    "the last message is the assistant's and answers no approval",
                    "add a user message, or answer the tool approval requests",
                )
            seen = {
                p["toolCallId"]
                for p in last.get("parts") or []
                if isinstance(p, dict) and isinstance(p.get("toolCallId"), str)
            }
            run = UiStreamRun(session=hosted.id, pending=pending, message_id=None, seen=seen)
            waiting = {q["request_id"] for q in pending()}
            stale = [rid for rid, _ in answers if rid not in waiting]
            if stale:
                raise ApiError(
                    404,
                    f"no pending question {stale[0]!r} in session {hosted.id}",
                    "answered already, or the run stopped",
                )
            after = self._after(hosted, [rid for rid, _ in answers])
            return self._response(
                self._stream(
                    hosted, after, run, lambda: self._answer_all(hosted, answers), done=DONE
                ),
                ui=True,
            )
        text = ui_stream.prompt_of(last)
        run = UiStreamRun(
            session=hosted.id,
            pending=pending,
            message_id=f"{hosted.id}-{hosted.ring.last_seq + 1}",
            seen=set(),
        )
        after = hosted.ring.last_seq
        return self._response(
            self._stream(hosted, after, run, lambda: self._start(hosted, text), done=DONE),
            ui=True,
        )


async def _just(events: list[dict[str, Any]]) -> AsyncIterator[bytes]:
    yield b"".join(_sse(e) for e in events)


__all__ = ["SSE_HEADERS", "UI_STREAM_HEADER", "Streams", "follow"]
