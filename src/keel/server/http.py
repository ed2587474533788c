"""The HTTP surface of `keel serve`: a Starlette app with the `/v1/` routes (docs/server.md), the
guard in front of them (Host header, bearer token), request bodies read strictly, and every
error as `{"error": "...", "hint": "..."}` with one line each.

The routes parse and answer; the sessions and their work live in `keel.server.host`.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import re
import time
from collections.abc import Callable, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qs

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.types import Message as AsgiMessage

from keel import __version__
from keel.errors import KeelError, UserError
from keel.llm.messages import Message, message_to_json, without_context
from keel.server.fleet_routes import FleetRoutes
from keel.server.host import ApiError, Host, Hosted, question_json, task_json
from keel.server.ring import KEEPALIVE
from keel.server.streams import Streams
from keel.server.webpage import CSP, TRACES, TraceViews, is_open
from keel.server.webpage import routes as web_routes

#: The largest request body read (a prompt with a pasted file fits).
MAX_BODY = 4 * 1024 * 1024
#: Paths that need no token (the Host check still applies).
OPEN_PATHS = frozenset({"/v1/health", "/openapi.json"})
#: The routes that also take the token as `?token=` (EventSource cannot send headers).
EVENTS_PATH = re.compile(r"^/v1/(sessions/[^/]+/events|runs/events|runs/[^/]+/journal)$")


def error(
    status: int, message: str, hint: str = "", headers: dict[str, str] | None = None
) -> Response:
    return JSONResponse({"error": message, "hint": hint}, status, headers=headers)


# -- the guard -------------------------------------------------------------------------------------


class Guard:
    """ASGI middleware in front of every route: the Host header must name this server (DNS
    rebinding: a page on evil.example resolving to 127.0.0.1 sends `Host: evil.example`), then
    the bearer token, compared in constant time. `hosts` None: any Host (`--allow-remote` on a
    wildcard address)."""

    def __init__(
        self, app: ASGIApp, *, token: str, hosts: frozenset[str] | None, debug: bool = False
    ) -> None:
        self.app = app
        self.token = token.encode()
        self.hosts = hosts
        self.debug = debug

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        send = _secured(send)
        refusal = self._refusal(scope)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        except Exception as exc:  # a defect: the client had its 500 (`_internal_error`)
            self._report(scope, exc)

    def _report(self, scope: Scope, exc: Exception) -> None:
        """One line on the server's stderr (the traceback with --debug), not uvicorn's."""
        import sys

        where = f"{scope.get('method', '')} {scope.get('path', '')}"
        if self.debug:
            import traceback

            traceback.print_exception(exc, file=sys.stderr)
        what = f"{type(exc).__name__}: {exc}".replace("\n", " ")
        print(
            f"keel serve: error: internal error in {where}: {what} "
            "(hint: run keel serve with --debug for the traceback)",
            file=sys.stderr,
        )

    def _refusal(self, scope: Scope) -> Response | None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        host = headers.get("host", "").strip().lower()
        if self.hosts is not None and host not in self.hosts:
            return error(
                403,
                f"Host header {host!r} does not name this server" if host else "no Host header",
                "connect to the address keel serve printed (a page on another name reaching "
                "this port is refused: DNS rebinding)",
            )
        path = scope["path"]
        if path in OPEN_PATHS or is_open(path):
            return None
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        auth = headers.get("authorization", "")
        if auth:
            scheme, _, given = auth.partition(" ")
            if scheme.lower() != "bearer":
                return _unauthorized("the Authorization header is not `Bearer <token>`")
        elif "token" in query:
            if not EVENTS_PATH.match(path):
                return _unauthorized(
                    "a token in the query string is accepted only on the event streams (…/events, …/journal)",
                    "send it as `Authorization: Bearer <token>`",
                )
            given = query["token"][-1]
        else:
            return _unauthorized("no bearer token")
        if not hmac.compare_digest(given.strip().encode(), self.token):
            return _unauthorized("wrong bearer token")
        return None


#: What every answer carries unless it says otherwise (the pages and the trace viewer set their
#: own): an error body echoes what the request said (a Host, a field, a session id), so no
#: answer may be sniffed as HTML, framed, or sent a Referer.
SECURE_HEADERS = (
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
)


def _secured(send: Send) -> Send:
    """`send`, with `SECURE_HEADERS` added to the start of every response that lacks them."""

    async def secured(message: AsgiMessage) -> None:
        if message["type"] == "http.response.start":
            given = {name.lower() for name, _ in message.get("headers", [])}
            extra = [(name, value) for name, value in SECURE_HEADERS if name not in given]
            message = {**message, "headers": [*message.get("headers", []), *extra]}
        await send(message)

    return secured


def _unauthorized(message: str, hint: str = "") -> Response:
    return error(
        401,
        message,
        hint
        or "send `Authorization: Bearer <token>` with the token keel serve printed "
        "(or KEEL_SERVER_TOKEN, or --token-file)",
        {"www-authenticate": "Bearer"},
    )


# -- bodies ----------------------------------------------------------------------------------------


async def read_body(request: Request, fields: dict[str, tuple[type, ...]]) -> dict[str, Any]:
    """The request's JSON object (empty body: `{}`), its fields checked against `fields`
    (name → accepted types); anything else is a 400 with one line."""
    raw = b""
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_BODY:
            raise ApiError(413, f"the body is over {MAX_BODY // (1024 * 1024)} MiB", "send less")
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw.decode("utf-8"))  # bytes would let json guess UTF-16 or -32
    except UnicodeDecodeError:
        raise ApiError(400, "malformed JSON body: not UTF-8", "send one JSON object") from None
    except json.JSONDecodeError as exc:
        raise ApiError(400, f"malformed JSON body: {exc}", "send one JSON object") from None
    except RecursionError:  # `[[[[…` thousands deep: the parser runs out of stack
        raise ApiError(
            400, "malformed JSON body: nested too deep", "send one JSON object"
        ) from None
    if not isinstance(body, dict):
        raise ApiError(
            400,
            f"the body must be a JSON object, not {_json_type(body)}",
            "send one JSON object, e.g. {}",
        )
    for name, value in body.items():
        if name not in fields:
            known = ", ".join(fields) or "none"
            raise ApiError(400, f"unknown field {name!r}", f"this route takes: {known}")
        types = fields[name]
        # JSON has no separate int and bool: a bool is not a number here.
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            want = " or ".join(_type_name(t) for t in types)
            raise ApiError(400, f"{name} must be {want}, not {_json_type(value)}", "")
    return body


def _type_name(t: type) -> str:
    names = {str: "a string", bool: "true or false", int: "a whole number", dict: "an object"}
    return "null" if t is type(None) else names.get(t, t.__name__)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "a list" if isinstance(value, list) else "an object"


NONE = type(None)
STR = (str,)
OPT_STR = (str, NONE)


# -- the app ---------------------------------------------------------------------------------------


class Api:
    """The routes, over one `Host` (and the fleet's `/v1/runs`, `keel.server.fleet_routes`)."""

    def __init__(
        self, host: Host, *, keepalive: float = KEEPALIVE, fleet: FleetRoutes | None = None
    ) -> None:
        self.host = host
        self.keepalive = keepalive
        self.fleet = fleet or FleetRoutes(None)
        self.traces = TraceViews()

    def hosted(self, request: Request) -> Hosted:
        return self.host.get(request.path_params["id"])

    # -- server ------------------------------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        return JSONResponse({"ok": True, "version": __version__})

    async def info(self, request: Request) -> Response:
        import os

        from keel.permissions.sandbox import probe
        from keel.session.store import sessions_dir

        sandbox = probe()
        return JSONResponse(
            {
                "version": __version__,
                "cwd": str(self.host.cwd),
                "all_projects": self.host.all_projects,
                "sessions_dir": str(sessions_dir(self.host.cwd)),
                "pid": os.getpid(),
                "loaded": sorted(self.host.sessions),
                "sandbox": {"ok": sandbox.ok, "detail": sandbox.detail},
                "fleet": self.fleet.url is not None,
            }
        )

    async def openapi(self, request: Request) -> Response:
        from keel.server.openapi import spec

        return JSONResponse(spec())

    # -- sessions ----------------------------------------------------------------------------------

    async def list_sessions(self, request: Request) -> Response:
        from keel.session.index import session_files

        listed: list[dict[str, Any]] = []
        seen: set[str] = set()
        files = session_files(None if self.host.all_projects else self.host.cwd)
        for summary in self.host.summaries.of(files, self.host.sessions):
            seen.add(summary.id)
            hosted = self.host.sessions.get(summary.id)
            listed.append(
                {
                    "id": summary.id,
                    "started": summary.started,
                    "cwd": summary.cwd,
                    "model": summary.model,
                    "status": summary.status,
                    "last_prompt": summary.last_prompt,
                    "turns": summary.turns,
                    "cost_usd": summary.cost,
                    "parent": summary.parent,
                    "loaded": hosted is not None,
                    "busy": hosted is not None and hosted.busy,
                }
            )
        return JSONResponse({"sessions": listed})

    async def create_session(self, request: Request) -> Response:
        body = await read_body(
            request,
            {
                "model": OPT_STR,
                "effort": OPT_STR,
                "mode": OPT_STR,
                "resume": STR,
                "continue": (bool,),
                "force": (bool,),
                "cwd": OPT_STR,
            },
        )
        opening = [k for k in ("resume", "continue") if body.get(k)]
        if opening:
            others = sorted(set(body) - {"resume", "continue", "force"})
            if len(opening) > 1 or others:
                raise ApiError(
                    400,
                    f"{opening[0]} cannot be combined with {', '.join(sorted(set(opening[1:]) | set(others)))}",
                    "a reopened session keeps its model, effort and mode; PATCH it afterwards",
                )
            hosted, opened = await self.host.resume(
                body.get("resume"), latest="continue" in opening, force=bool(body.get("force"))
            )
            return JSONResponse(hosted.describe(), 201 if opened else 200)
        if body.get("force"):
            raise ApiError(
                400, "force applies to loading a session", 'give it with "resume" or "continue"'
            )
        mode = body.get("mode")
        effort = body.get("effort")
        _check_mode_effort(mode, effort)
        cwd = body.get("cwd")
        where: Path | None = None
        if cwd is not None:
            where = Path(cwd).resolve()
            if not self.host.all_projects and where != self.host.cwd:
                raise ApiError(
                    400,
                    f"this server hosts {self.host.cwd}, not {where}",
                    "start `keel serve --all-projects` to host sessions of other projects",
                )
            if not where.is_dir():
                raise ApiError(400, f"{where} is not a directory", "give a project directory")
        hosted = await self.host.create(
            model=body.get("model"), effort=effort, mode=mode, cwd=where
        )
        return JSONResponse(hosted.describe(), 201)

    async def get_session(self, request: Request) -> Response:
        return JSONResponse(self.hosted(request).describe())

    async def patch_session(self, request: Request) -> Response:
        hosted = self.hosted(request)
        body = await read_body(request, {"model": STR, "effort": OPT_STR, "mode": STR})
        mode, effort = body.get("mode"), body.get("effort")
        # Everything is checked before anything changes.
        _check_mode_effort(mode, effort)
        if ("model" in body or "effort" in body) and hosted.busy:
            hosted.ensure_idle()
        swap = _provider_for(hosted, body["model"]) if "model" in body else None
        agent = hosted.agent
        if mode is not None and mode != hosted.mode:
            from keel.permissions.gate import parse_mode

            agent.set_mode(parse_mode(mode))
        if "effort" in body:
            from keel.config.settings import EFFORTS

            agent.effort = EFFORTS[effort] if effort else None
        if swap is not None:
            old, (provider, model, info) = agent.provider, swap
            agent.provider, agent.model, agent.info = provider, model, info
            if old is not provider:
                await old.aclose()
        return JSONResponse(hosted.describe())

    async def delete_session(self, request: Request) -> Response:
        await self.host.close(self.hosted(request), "other")
        return Response(status_code=204)

    async def messages(self, request: Request) -> Response:
        from keel.session.fold import FoldError, fold
        from keel.session.journal import read_records

        session_id = request.path_params["id"]
        hosted = self.host.sessions.get(session_id)
        path = hosted.path if hosted is not None else None
        if path is None:
            path = self.host._session_path(session_id, False)
        try:
            state = fold(read_records(path).records)
        except (FoldError, KeelError) as exc:
            raise ApiError(500, f"{path}: {exc}", "the file was left untouched") from exc
        return JSONResponse(
            {
                "id": state.meta.id,
                "messages": [_message_json(m) for m in state.conversation.messages],
                "last_seq": hosted.ring.last_seq if hosted is not None else None,
            }
        )

    async def events(self, request: Request) -> Response:
        hosted = self.hosted(request)
        raw = request.headers.get("last-event-id") or request.query_params.get("after")
        after: int | None = None
        if raw is not None:
            if not raw.strip().isdigit():
                raise ApiError(400, f"Last-Event-ID / after must be a seq, not {raw!r}", "")
            after = int(raw)
        return StreamingResponse(
            hosted.ring.stream(after, keepalive=self.keepalive),
            media_type="text/event-stream",
            headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
        )

    # -- work --------------------------------------------------------------------------------------

    async def prompt(self, request: Request) -> Response:
        hosted = self.hosted(request)
        body = await read_body(request, {"text": STR, "wait": (bool,)})
        text = body.get("text", "")
        if not text.strip():
            raise ApiError(400, "text is missing or empty", 'send {"text": "…"}')
        after = hosted.ring.last_seq
        started = time.monotonic()
        task = self.host.prompt(hosted, text)
        if not body.get("wait"):
            return JSONResponse({"session": hosted.id, "after_seq": after}, 202)
        result = await _finished(task)
        from keel.app.jsonout import result_json

        return JSONResponse(
            {
                **result_json(
                    result,
                    model=hosted.model,
                    duration_ms=int((time.monotonic() - started) * 1000),
                    session_path=str(hosted.path) if hosted.path else None,
                ),
                "after_seq": after,
            }
        )

    async def cancel(self, request: Request) -> Response:
        hosted = self.hosted(request)
        await read_body(request, {})
        running = hosted.busy
        hosted.agent.interrupt("cancelled over HTTP")
        return JSONResponse({"interrupted": running})

    async def permissions(self, request: Request) -> Response:
        hosted = self.hosted(request)
        return JSONResponse(
            {"pending": [question_json(q) for q in hosted.agent.pending_questions()]}
        )

    async def answer(self, request: Request) -> Response:
        from keel.agent.events import PermissionAsked
        from keel.permissions.gate import PermissionReply

        hosted = self.hosted(request)
        request_id = request.path_params["request_id"]
        body = await read_body(
            request,
            {
                "allow": (bool,),
                "always": (bool,),
                "session": (bool,),
                "reason": STR,
                "mode": STR,
                "values": (dict, NONE),
            },
        )
        waiting = {q.request_id: q for q in hosted.agent.pending_questions()}
        question = waiting.get(request_id)
        if question is None:
            raise ApiError(
                404,
                f"no pending question {request_id!r} in session {hosted.id}",
                f"GET /v1/sessions/{hosted.id}/permissions lists them (answered already, or the "
                "run stopped)",
            )
        if isinstance(question, PermissionAsked):
            if "allow" not in body or "values" in body:
                raise ApiError(
                    400,
                    "a permission question takes {allow, always, session, reason, mode}",
                    'e.g. {"allow": true}',
                )
            # "session": allowed for the rest of this session, saved nowhere (the TUI's `s`).
            scope: Literal["once", "session", "always"] = (
                "always" if body.get("always") else "session" if body.get("session") else "once"
            )
            mode = None
            if "mode" in body:  # a plan approval: the mode to go on in
                from keel.permissions.gate import parse_mode

                try:
                    mode = parse_mode(body["mode"])
                except UserError as exc:
                    raise ApiError.of(exc) from exc
            reply: Any = PermissionReply(body["allow"], scope, body.get("reason", ""), mode)
            answer: dict[str, Any] = {
                "request_id": request_id,
                "allow": body["allow"],
                "scope": scope,
            }
        else:
            if set(body) - {"values", "reason"} or not body:
                raise ApiError(
                    400,
                    "a question takes {values} (null declines) or {reason} (cannot answer)",
                    'e.g. {"values": {"name": "x"}}',
                )
            reply = body["values"] if "values" in body else body["reason"]
            answer = {"request_id": request_id, "answered": True}
        if not hosted.agent.answer(request_id, reply):
            raise ApiError(404, f"question {request_id!r} was answered already", "")
        return JSONResponse(answer)

    async def compact(self, request: Request) -> Response:
        hosted = self.hosted(request)
        body = await read_body(request, {"instructions": STR})
        instructions = body.get("instructions", "")
        record = await _finished(
            hosted.start("compact", lambda: hosted.agent.compact(instructions, hosted.sink)), 409
        )
        return JSONResponse(
            {
                # The summary as the user reads it: the context that opens the replacing message
                # is the model's, not part of the summary.
                "summary": without_context(record.summary),
                "tokens_before": record.tokens_before,
                "tokens_after": record.tokens_after,
                "cost_usd": round(record.cost, 6),
            }
        )

    async def undo(self, request: Request) -> Response:
        hosted = self.hosted(request)
        await read_body(request, {})
        agent = hosted.agent

        async def undo() -> Any:
            if agent.ctx.checkpoints is None and agent.session is not None:
                from keel.checkpoints import Checkpoints

                agent.ctx.checkpoints = Checkpoints.for_session(agent.session.path)
            return agent.undo()

        summary = await _finished(hosted.start("undo", undo), 409)
        rel = _relative(agent.cwd)
        return JSONResponse(
            {
                "label": summary.label,
                "restored": [rel(p) for p in summary.restored],
                "removed": [rel(p) for p in summary.removed],
                "overwritten": [{"path": rel(f.path), "why": f.why} for f in summary.overwritten],
                "failed": [{"path": rel(f.path), "why": f.why} for f in summary.failed],
                "notes": list(summary.notes),
                # The restored tree against the checkpoint's digest (projects without git).
                "checks": [
                    {
                        "root": rel(c.root),
                        "matches": c.matches,
                        "checkpoint": c.checkpoint,
                        "now": c.now,
                        "differing": [rel(p) for p in c.differing],
                        "count": c.count,
                        "why": c.why,
                    }
                    for c in summary.checks
                ],
            }
        )

    async def clear(self, request: Request) -> Response:
        hosted = self.hosted(request)
        await read_body(request, {})
        hosted.ensure_idle()
        fresh = await self.host.clear(hosted)
        return JSONResponse({**fresh.describe(), "previous": hosted.id}, 201)

    async def fork(self, request: Request) -> Response:
        session_id = request.path_params["id"]
        body = await read_body(request, {"at": (int, NONE), "load": (bool,), "force": (bool,)})
        if body.get("force") and not body.get("load"):
            raise ApiError(400, "force applies to loading the fork", 'give it with "load": true')
        hosted = self.host.sessions.get(session_id)
        path = hosted.path if hosted is not None else None
        if path is None:
            path = self.host._session_path(session_id, False)
        from keel.session.fork import fork_session

        try:
            new_path, prompt = fork_session(path, body.get("at"))
        except UserError as exc:
            raise ApiError.of(exc) from exc
        fork = {"id": new_path.stem, "parent": path.stem, "prompt": prompt, "loaded": False}
        if body.get("load"):
            # A fork that cannot be loaded (a changed configuration: 409) stays on disk; load
            # it later with POST /v1/sessions {"resume": ID, "force": true}.
            loaded, _ = await self.host.resume(new_path.stem, force=bool(body.get("force")))
            fork = {**fork, "loaded": True, "session": loaded.describe()}
        return JSONResponse(fork, 201)

    async def trace(self, request: Request) -> Response:
        """The address of the trace viewer over the session's debug trace (docs/web.md)."""
        session_id = request.path_params["id"]
        hosted = self.host.sessions.get(session_id)
        path = hosted.path if hosted is not None else None
        if path is None:
            path = self.host._session_path(session_id, False)
        # Where the tracer writes (keel.trace.tracer.default_directory): beside the session file.
        directory = path.with_name(path.name.removesuffix(".jsonl") + ".trace")
        if not (directory / "events.jsonl").is_file():
            raise ApiError(
                404,
                f"session {path.stem} has no trace",
                "traces are recorded with debug mode on: start keel serve with KEEL_DEBUG=1 "
                'or set "debug": true in the settings',
            )
        return JSONResponse({"url": self.traces.capability(directory, request.url.port or 80)})

    async def tasks(self, request: Request) -> Response:
        hosted = self.hosted(request)
        return JSONResponse(
            {"tasks": [task_json(t) for t in hosted.agent.background.tasks.values()]}
        )

    async def stop_task(self, request: Request) -> Response:
        from keel.tools.base import ToolError

        hosted = self.hosted(request)
        try:
            task = await hosted.agent.background.stop(request.path_params["task_id"])
        except ToolError as exc:
            raise ApiError(404, str(exc), f"GET /v1/sessions/{hosted.id}/tasks lists them") from exc
        return JSONResponse(task_json(task))

    async def pins(self, request: Request) -> Response:
        """GET: the facts every summary must keep (the session's pins, the settings' facts);
        POST {"text"}: pin one (`/pin`, journaled like the terminal UI's)."""
        hosted = self.hosted(request)
        if request.method == "POST":
            body = await read_body(request, {"text": STR})
            try:
                hosted.agent.pin(body.get("text", ""))
            except UserError as exc:
                raise ApiError.of(exc) from exc
        status = 201 if request.method == "POST" else 200
        return JSONResponse(_pins_json(hosted), status_code=status)

    async def unpin(self, request: Request) -> Response:
        hosted = self.hosted(request)
        number = request.path_params["number"]
        try:
            text = hosted.agent.unpin(int(number) if number.isdigit() else 0)
        except UserError as exc:
            raise ApiError.of(exc, 404) from exc
        return JSONResponse({"unpinned": text, **_pins_json(hosted)})

    def routes(self) -> list[Route]:
        s = "/v1/sessions/{id}"
        return [
            Route("/openapi.json", self.openapi, methods=["GET"]),
            Route("/v1/health", self.health, methods=["GET"]),
            Route("/v1/info", self.info, methods=["GET"]),
            Route("/v1/sessions", self.list_sessions, methods=["GET"]),
            Route("/v1/sessions", self.create_session, methods=["POST"]),
            Route(s, self.get_session, methods=["GET"]),
            Route(s, self.patch_session, methods=["PATCH"]),
            Route(s, self.delete_session, methods=["DELETE"]),
            Route(f"{s}/messages", self.messages, methods=["GET"]),
            Route(f"{s}/events", self.events, methods=["GET"]),
            Route(f"{s}/prompt", self.prompt, methods=["POST"]),
            Route(f"{s}/cancel", self.cancel, methods=["POST"]),
            Route(f"{s}/permissions", self.permissions, methods=["GET"]),
            Route(f"{s}/permissions/{{request_id}}", self.answer, methods=["POST"]),
            Route(f"{s}/compact", self.compact, methods=["POST"]),
            Route(f"{s}/pins", self.pins, methods=["GET", "POST"]),
            Route(f"{s}/pins/{{number}}", self.unpin, methods=["DELETE"]),
            Route(f"{s}/undo", self.undo, methods=["POST"]),
            Route(f"{s}/clear", self.clear, methods=["POST"]),
            Route(f"{s}/fork", self.fork, methods=["POST"]),
            Route(f"{s}/tasks", self.tasks, methods=["GET"]),
            Route(f"{s}/tasks/{{task_id}}", self.stop_task, methods=["DELETE"]),
            Route(f"{s}/trace", self.trace, methods=["GET"]),
            Route(TRACES + "{capability}/{rest:path}", self.traces),
            *self.fleet.routes(),
            *Streams(self.host, keepalive=self.keepalive).routes(),
            *web_routes(),
        ]


def _pins_json(hosted: Hosted) -> dict[str, list[str]]:
    """A session's pins (numbered from 1 for `DELETE …/pins/N`) and its settings' facts."""
    return {"pins": list(hosted.agent.pins), "keep": list(hosted.agent.compaction.keep)}


def _check_mode_effort(mode: str | None, effort: str | None) -> None:
    from keel.config.settings import EFFORTS
    from keel.permissions.gate import parse_mode

    if mode is not None:
        try:
            parse_mode(mode)
        except UserError as exc:
            raise ApiError.of(exc) from exc
    if effort is not None and effort not in EFFORTS:
        raise ApiError(400, f"unknown effort {effort!r}", f"efforts: {', '.join(EFFORTS)} or null")


def _provider_for(hosted: Hosted, spec: str) -> tuple[Any, str, Any]:
    """The provider, model name and catalog entry for `spec`, built before anything changes
    (a missing key is a 400 and the session keeps its model)."""
    from keel.config.settings import load_settings
    from keel.llm.catalog import parse_model
    from keel.llm.provider import RetryPolicy, make_provider, model_info

    try:
        ref = parse_model(spec)
        settings = load_settings(hosted.agent.cwd)
        provider = make_provider(
            ref,
            settings=settings,
            retry=RetryPolicy(attempts=hosted.options.max_retries + 1),
            unattended=False,
        )
    except KeelError as exc:
        raise ApiError(400, f"{exc.message} (still on {hosted.model})", exc.hint) from exc
    return provider, ref.model, model_info(ref, settings.models)


def _message_json(message: Message) -> dict[str, Any]:
    """A message of the transcript; a user's text also as the user typed it (`typed`: without
    the context and notes keel put around it), which is what a transcript shows."""
    from keel.agent.mentions import typed_prompt

    out = message_to_json(message)
    if message.role == "user" and message.text:
        out["typed"] = typed_prompt(message.text)
    return out


def _relative(cwd: Path) -> Callable[[Path], str]:
    return lambda p: str(p.relative_to(cwd)) if p.is_relative_to(cwd) else str(p)


async def _finished(task: asyncio.Task[Any], user_status: int = 400) -> Any:
    """The result of a session's work, for a caller that waits (the work goes on if the
    client goes away: shielded)."""
    try:
        return await asyncio.shield(task)
    except UserError as exc:
        raise ApiError.of(exc, user_status) from exc
    except KeelError as exc:
        raise ApiError.of(exc, 500) from exc


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return JSONResponse(exc.body(), exc.status)


async def _internal_error(request: Request, exc: Exception) -> Response:
    return error(
        500,
        f"internal error: {type(exc).__name__}: {exc}".replace("\n", " "),
        "the server's stderr has the details (the traceback with keel serve --debug)",
    )


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    hints = {404: "GET /openapi.json lists the routes", 405: "GET /openapi.json lists the methods"}
    return error(exc.status_code, str(exc.detail).lower(), hints.get(exc.status_code, ""))


def create_app(
    host: Host,
    *,
    token: str,
    hosts: Iterable[str] | None,
    keepalive: float = KEEPALIVE,
    debug: bool = False,
    fleet_url: str | None = None,
) -> ASGIApp:
    """The ASGI app: `Guard` over the routes of `Api(host)`; `fleet_url`: the fleet the
    `/v1/runs` routes front (None: they answer 404)."""

    fleet = FleetRoutes(fleet_url, keepalive=keepalive)
    host.stream_enders.append(fleet.end_streams)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> Any:
        yield
        await host.aclose()
        await fleet.aclose()

    api = Api(host, keepalive=keepalive, fleet=fleet)
    app = Starlette(
        routes=api.routes(),
        exception_handlers={
            ApiError: _api_error,
            HTTPException: _http_error,
            Exception: _internal_error,
        },
        lifespan=lifespan,
    )
    return Guard(app, token=token, hosts=None if hosts is None else frozenset(hosts), debug=debug)


__all__ = ["MAX_BODY", "Api", "Guard", "create_app", "read_body"]
