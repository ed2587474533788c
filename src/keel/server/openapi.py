"""The OpenAPI 3.1 description of `keel serve`, served at `/openapi.json`.

Written by hand next to the routes (`keel.server.http.Api.routes`); tests/test_server.py checks
that every route of the app is described here and every path here is a route.
"""

from __future__ import annotations

from typing import Any

from keel import __version__


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _obj(required: tuple[str, ...] = (), **props: Any) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": props, "additionalProperties": False}
    if required:
        schema["required"] = list(required)
    return schema


STR = {"type": "string"}
OPT_STR = {"type": ["string", "null"]}
BOOL = {"type": "boolean"}
INT = {"type": "integer"}
ERRORS = {
    "400": _json(_ref("Error"), "A malformed body or a bad value (one line, with a hint)"),
    "401": _json(_ref("Error"), "No bearer token, or a wrong one"),
    "403": _json(_ref("Error"), "The Host header does not name this server"),
    "404": _json(_ref("Error"), "No such (loaded) session, question or task"),
}
SESSION = {"$ref": "#/components/parameters/SessionId"}


def _op(
    summary: str,
    ok: dict[str, Any],
    *,
    body: dict[str, Any] | None = None,
    status: str = "200",
    params: tuple[dict[str, Any], ...] = (SESSION,),
    busy: bool = False,
    open_route: bool = False,
) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "responses": {status: ok, **ERRORS}}
    if params:
        op["parameters"] = list(params)
    if body is not None:
        op["requestBody"] = {
            "required": False,
            "content": {"application/json": {"schema": body}},
        }
    if busy:
        op["responses"]["409"] = _json(_ref("Error"), "The session is busy (or nothing to do)")
    if open_route:
        op["security"] = []
    return op


def _create_op() -> dict[str, Any]:
    op = _op(
        "Create a session, or load one (resume by id, or continue the latest)",
        _json(_ref("Session"), "Created, or reopened from its journal (an unfinished run resumes)"),
        body={
            "oneOf": [
                _obj(model=OPT_STR, effort=OPT_STR, mode=OPT_STR, cwd=OPT_STR),
                _obj(("resume",), resume=STR),
                _obj(("continue",), **{"continue": BOOL}),
            ]
        },
        status="201",
        params=(),
    )
    op["responses"]["200"] = _json(_ref("Session"), "Already loaded: as it is")
    op["responses"]["409"] = _json(_ref("Error"), "The session is held by another process")
    return op


def spec() -> dict[str, Any]:
    sid = "/v1/sessions/{id}"
    session = _json(_ref("Session"), "The session")
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "keel serve",
            "version": __version__,
            "description": "keel's sessions over HTTP with Server-Sent Events (docs/server.md).",
        },
        "security": [{"bearer": []}],
        "paths": {
            "/openapi.json": {
                "get": _op(
                    "This description",
                    _json({"type": "object"}, "OpenAPI 3.1"),
                    params=(),
                    open_route=True,
                )
            },
            "/v1/health": {
                "get": _op(
                    "Liveness (no token needed)",
                    _json(_obj(("ok", "version"), ok=BOOL, version=STR), "Alive"),
                    params=(),
                    open_route=True,
                )
            },
            "/v1/info": {
                "get": _op(
                    "The server: version, project, loaded sessions",
                    _json(
                        _obj(
                            version=STR,
                            cwd=STR,
                            all_projects=BOOL,
                            sessions_dir=STR,
                            pid=INT,
                            loaded={"type": "array", "items": STR},
                            sandbox=_obj(ok=BOOL, detail=STR),
                        ),
                        "The server",
                    ),
                    params=(),
                )
            },
            "/v1/sessions": {
                "get": _op(
                    "The project's sessions on disk, with loaded/busy flags",
                    _json(
                        _obj(sessions={"type": "array", "items": _ref("SessionSummary")}),
                        "Newest first",
                    ),
                    params=(),
                ),
                "post": _create_op(),
            },
            sid: {
                "get": _op("A loaded session", session),
                "patch": _op(
                    "Change model, effort or mode (all checked before any changes; model and "
                    "effort 409 while busy)",
                    session,
                    body=_obj(model=STR, effort=OPT_STR, mode=STR),
                    busy=True,
                ),
                "delete": _op(
                    "Unload the session (its work is interrupted; the file stays)",
                    {"description": "Unloaded"},
                    status="204",
                ),
            },
            f"{sid}/messages": {
                "get": _op(
                    "The transcript, from the session file (works unloaded)",
                    _json(
                        _obj(
                            id=STR,
                            messages={"type": "array", "items": {"type": "object"}},
                            last_seq={"type": ["integer", "null"]},
                        ),
                        "The conversation",
                    ),
                )
            },
            f"{sid}/events": {
                "get": _op(
                    "The event stream (SSE): `id: seq`, `event: kind`, `data: JSON`; replay "
                    "with Last-Event-ID or ?after=; the token may be ?token= here only",
                    {
                        "description": "text/event-stream",
                        "content": {"text/event-stream": {"schema": STR}},
                    },
                    params=(
                        SESSION,
                        {"name": "after", "in": "query", "required": False, "schema": INT},
                        {"name": "token", "in": "query", "required": False, "schema": STR},
                        {"name": "Last-Event-ID", "in": "header", "required": False, "schema": INT},
                    ),
                )
            },
            f"{sid}/prompt": {
                "post": _op(
                    "Run a prompt: 202 with the seq to follow from; wait: true answers with the "
                    "result when it ends",
                    _json(_obj(session=STR, after_seq=INT), "Started"),
                    body=_obj(("text",), text=STR, wait=BOOL),
                    status="202",
                    busy=True,
                ),
            },
            f"{sid}/cancel": {
                "post": _op(
                    "Interrupt the running work",
                    _json(_obj(interrupted=BOOL), "Whether something was running"),
                    body=_obj(),
                )
            },
            f"{sid}/permissions": {
                "get": _op(
                    "The questions waiting for an answer",
                    _json(_obj(pending={"type": "array", "items": {"type": "object"}}), "Pending"),
                )
            },
            f"{sid}/permissions/{{request_id}}": {
                "post": _op(
                    "Answer a permission question ({allow, always, reason}) or an MCP server's "
                    "question ({values} or {reason})",
                    _json(_obj(request_id=STR, allow=BOOL, scope=STR, answered=BOOL), "Answered"),
                    body=_obj(
                        allow=BOOL,
                        always=BOOL,
                        reason=STR,
                        mode=STR,
                        values={"type": ["object", "null"]},
                    ),
                    params=(
                        SESSION,
                        {"name": "request_id", "in": "path", "required": True, "schema": STR},
                    ),
                )
            },
            f"{sid}/compact": {
                "post": _op(
                    "Summarize the conversation now",
                    _json(
                        _obj(
                            summary=STR,
                            tokens_before=INT,
                            tokens_after=INT,
                            cost_usd={"type": "number"},
                        ),
                        "The summary",
                    ),
                    body=_obj(instructions=STR),
                    busy=True,
                )
            },
            f"{sid}/undo": {
                "post": _op(
                    "Put back the files the last prompt that changed files changed",
                    _json(_ref("Undone"), "What was put back"),
                    body=_obj(),
                    busy=True,
                )
            },
            f"{sid}/clear": {
                "post": _op(
                    "A fresh context: a new session with the same model, effort and mode",
                    _json(_ref("Session"), "The new session (with `previous`)"),
                    body=_obj(),
                    status="201",
                    busy=True,
                )
            },
            f"{sid}/fork": {
                "post": _op(
                    "Fork the session before prompt seq `at` (null: after its end); not loaded",
                    _json(_obj(id=STR, parent=STR, prompt=STR, loaded=BOOL), "The fork"),
                    body=_obj(at={"type": ["integer", "null"]}),
                    status="201",
                )
            },
            f"{sid}/tasks": {
                "get": _op(
                    "Background tasks",
                    _json(_obj(tasks={"type": "array", "items": _ref("Task")}), "Tasks"),
                )
            },
            f"{sid}/tasks/{{task_id}}": {
                "delete": _op(
                    "Stop a background task",
                    _json(_ref("Task"), "The task, stopped"),
                    params=(
                        SESSION,
                        {"name": "task_id", "in": "path", "required": True, "schema": STR},
                    ),
                )
            },
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "parameters": {
                "SessionId": {"name": "id", "in": "path", "required": True, "schema": STR}
            },
            "schemas": {
                "Error": _obj(("error", "hint"), error=STR, hint=STR),
                "Session": {
                    "type": "object",
                    "properties": {
                        "id": STR,
                        "loaded": BOOL,
                        "path": OPT_STR,
                        "cwd": STR,
                        "model": STR,
                        "effort": OPT_STR,
                        "mode": OPT_STR,
                        "busy": BOOL,
                        "work": OPT_STR,
                        "turns": INT,
                        "usage": {"type": "object"},
                        "cost_usd": {"type": "number"},
                        "last_seq": INT,
                        "pending": {"type": "array", "items": {"type": "object"}},
                        "tasks": {"type": "array", "items": _ref("Task")},
                    },
                },
                "SessionSummary": {
                    "type": "object",
                    "properties": {
                        "id": STR,
                        "started": STR,
                        "cwd": STR,
                        "model": STR,
                        "status": STR,
                        "last_prompt": STR,
                        "turns": {"type": ["integer", "null"]},
                        "cost_usd": {"type": ["number", "null"]},
                        "parent": OPT_STR,
                        "loaded": BOOL,
                        "busy": BOOL,
                    },
                },
                "Task": _obj(
                    id=STR,
                    kind=STR,
                    status=STR,
                    description=STR,
                    agent=STR,
                    seconds={"type": "number"},
                    result=OPT_STR,
                ),
                "Undone": _obj(
                    label=STR,
                    restored={"type": "array", "items": STR},
                    removed={"type": "array", "items": STR},
                    overwritten={"type": "array", "items": {"type": "object"}},
                    failed={"type": "array", "items": {"type": "object"}},
                    notes={"type": "array", "items": STR},
                ),
            },
        },
    }


__all__ = ["spec"]
