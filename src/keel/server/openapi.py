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
                _obj(("resume",), resume=STR, force=BOOL),
                _obj(("continue",), force=BOOL, **{"continue": BOOL}),
            ]
        },
        status="201",
        params=(),
    )
    op["responses"]["200"] = _json(_ref("Session"), "Already loaded: as it is")
    op["responses"]["409"] = _json(
        _ref("Error"),
        "The session is held by another process, or was made with a different configuration "
        '(the error names each change; "force": true loads it anyway)',
    )
    return op


def _fork_op() -> dict[str, Any]:
    op = _op(
        "Fork the session before prompt seq `at` (null: after its end); loaded with `load` "
        "(`force`: despite a changed configuration)",
        _json(
            _obj(id=STR, parent=STR, prompt=STR, loaded=BOOL, session=_ref("Session")),
            "The fork (`session`: as loaded, with `load`)",
        ),
        body=_obj(at={"type": ["integer", "null"]}, load=BOOL, force=BOOL),
        status="201",
    )
    op["responses"]["409"] = _json(
        _ref("Error"),
        "The fork was made but not loaded: its configuration changed (the error names each "
        'change; "force": true loads it anyway) or another process holds it',
    )
    return op


RUN = {"name": "id", "in": "path", "required": True, "schema": STR}


def _run_op(
    summary: str,
    ok: dict[str, Any],
    *,
    body: dict[str, Any] | None = None,
    status: str = "200",
    params: tuple[dict[str, Any], ...] = (RUN,),
    conflict: str = "",
) -> dict[str, Any]:
    """An operation of the fleet's `/v1/runs` routes (`keel serve --fleet`)."""
    op = _op(summary, ok, body=body, status=status, params=params)
    op["responses"]["404"] = _json(
        _ref("Error"), "No such run, or this server does not front a fleet (no --fleet)"
    )
    op["responses"]["503"] = _json(
        _ref("Error"), "The fleet's NATS server cannot be reached or refused (one line)"
    )
    if conflict:
        op["responses"]["409"] = _json(_ref("Error"), conflict)
    return op


def _run_paths() -> dict[str, Any]:
    run = "/v1/runs/{id}"
    summary = _json(_ref("RunSummary"), "The run's summary")
    number = {"type": ["number", "null"]}
    whole = {"type": ["integer", "null"]}
    return {
        "/v1/runs": {
            "get": _run_op(
                "The fleet's runs (their summaries, never their journals), newest first: all, "
                "or those with a `status` (repeat it or a comma list; `active` = queued, "
                "running, parked), `limit` of them from `page` (1: the newest) or after run "
                "`after`; `total` matching runs, `more` after this page",
                _json(
                    _obj(
                        runs={"type": "array", "items": _ref("RunSummary")},
                        total={"type": "integer"},
                        more={"type": "integer"},
                    ),
                    "The runs",
                ),
                params=(
                    {"name": "status", "in": "query", "required": False, "schema": STR},
                    {
                        "name": "limit",
                        "in": "query",
                        "required": False,
                        "schema": {"type": "integer", "minimum": 1},
                    },
                    {
                        "name": "page",
                        "in": "query",
                        "required": False,
                        "schema": {"type": "integer", "minimum": 1},
                    },
                    {"name": "after", "in": "query", "required": False, "schema": STR},
                ),
            ),
            "post": _run_op(
                "Queue a run for the fleet's workers (checked as `keel submit` checks it; the "
                "request names a model, never a key)",
                _json(_ref("RunSummary"), "Queued: the summary, with the run's `id`"),
                body=_obj(
                    ("prompt", "workspace"),
                    prompt=STR,
                    model=OPT_STR,
                    mode=OPT_STR,
                    workspace={
                        "oneOf": [
                            {"type": "string"},
                            _obj(("git",), git=STR, ref=STR),
                            _obj(("path",), path=STR),
                            _obj(),
                        ]
                    },
                    max_turns=whole,
                    max_tokens_budget=whole,
                    max_budget_usd=number,
                    no_check={"type": "boolean"},
                    max_attempts=whole,
                    priority={"type": "string", "enum": ["high", "normal", "low"]},
                    needs={"type": "array", "items": STR},
                    notify=OPT_STR,
                ),
                status="201",
                params=(),
            ),
        },
        "/v1/runs/events": {
            "get": _run_op(
                "Run status changes as Server-Sent Events (a KV watch, as `keel runs list "
                "--watch --json`): `event: change`, `data: {run, status, previous, at, "
                "waits_on?, error?, summary}`; `status` keeps some; the token may be ?token= here",
                {
                    "description": "text/event-stream",
                    "content": {"text/event-stream": {"schema": STR}},
                },
                params=(
                    {"name": "status", "in": "query", "required": False, "schema": STR},
                    {"name": "token", "in": "query", "required": False, "schema": STR},
                ),
            )
        },
        "/metrics": {
            "get": _run_op(
                "The fleet in Prometheus text format 0.0.4: keel_fleet_queue_messages, "
                "keel_fleet_queue_in_flight, keel_fleet_runs{status}, keel_fleet_workers, "
                "keel_fleet_pickup_seconds (summary), keel_fleet_attempts_total",
                {
                    "description": "Prometheus text format 0.0.4",
                    "content": {"text/plain": {"schema": STR}},
                },
                params=(),
            )
        },
        run: {"get": _run_op("One run's summary", summary)},
        f"{run}/cancel": {
            "post": _run_op(
                "Stop the run at its next loop boundary (a run that is over: as it is)",
                summary,
                body=_obj(),
            )
        },
        f"{run}/answers/{{request_id}}": {
            "post": _run_op(
                "Answer what a parked run waits for: a question ({allow, reason}) or a tool "
                "that answers later ({result, is_error}); the run is queued to go on",
                _json(
                    _obj(run=STR, request=STR, queued=BOOL, allow=BOOL, is_error=BOOL),
                    "Answered",
                ),
                body=_obj(allow=BOOL, reason=STR, result=STR, is_error=BOOL),
                params=(
                    RUN,
                    {"name": "request_id", "in": "path", "required": True, "schema": STR},
                ),
                conflict="The run does not wait for this request (answered already, or not parked)",
            )
        },
        f"{run}/wait": {
            "get": _run_op(
                "Long-poll: the summary once the run is over or parked, or when `timeout` "
                "seconds (default 30, at most 300) have passed (then it is still queued or "
                "running: ask again)",
                summary,
                params=(
                    RUN,
                    {
                        "name": "timeout",
                        "in": "query",
                        "required": False,
                        "schema": {"type": "number", "minimum": 0, "maximum": 300},
                    },
                ),
            )
        },
        f"{run}/retry": {
            "post": _run_op(
                "Queue a run that ended failed or error again (as `keel runs retry`): its lost "
                "and refused counts start over, its attempt log stays; a worker resumes it "
                "from its journal",
                _json(_ref("RunSummary"), "Queued again: the summary"),
                body=_obj(),
                conflict="The run is not failed or error (one line; the hint says what to do)",
            )
        },
        f"{run}/journal": {
            "get": _run_op(
                "The run's journal as Server-Sent Events: `event: record`, `id:` the record's "
                "seq, `data:` its session file line (meta, user, assistant, decision, "
                "tool_result, park, claim, terminal, ...); every record so far, then live as "
                "workers append them; `Last-Event-ID` or `after` skips those up to a seq",
                {
                    "description": "text/event-stream",
                    "content": {"text/event-stream": {"schema": STR}},
                },
                params=(
                    RUN,
                    {
                        "name": "after",
                        "in": "query",
                        "required": False,
                        "schema": {"type": "integer", "minimum": 0},
                    },
                ),
            )
        },
        "/v1/workers": {
            "get": _run_op(
                "The fleet's workers from their heartbeats (as `keel workers --json`): name, "
                "host, pid, version, concurrency, running runs, labels, roots, providers, last "
                "beat (`beat`, `beat_at`, `age` seconds), `stopping`, and `silent` (no beat for "
                "7 s: dead, stopped or cut off; the entry goes after a minute)",
                _json(
                    _obj(workers={"type": "array", "items": _worker_schema()}),
                    "The workers, by name",
                ),
                params=(),
            )
        },
    }


def _worker_schema() -> dict[str, Any]:
    """One worker's registry entry (keel.fleet.worker's `entry`, with the reader's `age` and
    `silent`); open to fields a newer worker adds."""
    strings = {"type": "array", "items": STR}
    number = {"type": "number"}
    return {
        "type": "object",
        "properties": {
            "name": STR,
            "host": STR,
            "pid": INT,
            "version": STR,
            "started": STR,
            "concurrency": INT,
            "running": strings,
            "labels": strings,
            "roots": strings,
            "providers": strings,
            "ack_wait": number,
            "stopping": BOOL,
            "beat": STR,
            "beat_at": number,
            "age": number,
            "silent": BOOL,
        },
    }


def _schedule_paths() -> dict[str, Any]:
    """`/v1/schedules` (keel.fleet.schedules): a run request stored to be queued later."""
    schedule = {
        "type": "object",
        "description": "A scheduled or recurring run (docs/fleet.md, Scheduled and recurring "
        "runs): `at` or `every` (cron, in `tz`), `next` firing (UTC), fired count, last run; "
        "`overdue`: more than 2 minutes past `next` (no worker has fired it)",
        "properties": {
            "id": STR,
            "request": {"type": "object"},
            "at": OPT_STR,
            "every": OPT_STR,
            "tz": OPT_STR,
            "next": STR,
            "created": STR,
            "fired": INT,
            "last_fired": OPT_STR,
            "last_run": OPT_STR,
            "last_error": OPT_STR,
            "overdue": BOOL,
        },
    }
    run_body = _run_paths()["/v1/runs"]["post"]["requestBody"]["content"]["application/json"]
    body = dict(run_body["schema"])
    body["properties"] = {**body["properties"], "at": OPT_STR, "every": OPT_STR, "tz": OPT_STR}
    one = _json(schedule, "The schedule")
    params = ({"name": "id", "in": "path", "required": True, "schema": STR},)

    def op(summary: str, ok: dict[str, Any], **kw: Any) -> dict[str, Any]:
        operation = _run_op(summary, ok, **kw)
        operation["responses"]["404"] = _json(
            _ref("Error"), "No such schedule, or this server does not front a fleet (no --fleet)"
        )
        return operation

    return {
        "/v1/schedules": {
            "get": op(
                "The fleet's schedules, by id",
                _json(_obj(schedules={"type": "array", "items": schedule}), "The schedules"),
                params=(),
            ),
            "post": op(
                "Store a scheduled (`at`: ISO 8601 or +30m) or recurring (`every`: a cron "
                "expression, in `tz`) run: the body of POST /v1/runs with when; workers fire it",
                _json(schedule, "Stored: the schedule, with its `id`"),
                body=body,
                status="201",
                params=(),
            ),
        },
        "/v1/schedules/{id}": {
            "get": op("One schedule", one, params=params),
            "delete": op("Remove a schedule: it fires no more", one, params=params),
        },
    }


def _ui_stream_paths(sid: str) -> dict[str, Any]:
    """The streams for agent UIs (`keel.server.streams`; docs/server.md)."""
    events = {"description": "text/event-stream", "content": {"text/event-stream": {"schema": STR}}}
    array = {"type": "array", "items": {"type": "object"}}
    any_json: dict[str, Any] = {}
    return {
        f"{sid}/agui": {
            "post": _op(
                "Run a prompt (the last user message), or answer the interrupts a run stopped at "
                "(resume), as AG-UI events over SSE: RUN_STARTED … RUN_FINISHED or RUN_ERROR",
                events,
                body={
                    "type": "object",
                    "description": "AG-UI's RunAgentInput",
                    "properties": {
                        "threadId": STR,
                        "runId": STR,
                        "parentRunId": OPT_STR,
                        "protocolVersion": OPT_STR,
                        "state": any_json,
                        "messages": array,
                        "tools": array,
                        "context": array,
                        "forwardedProps": any_json,
                        "resume": {"type": ["array", "null"], "items": {"type": "object"}},
                    },
                    "required": ["threadId", "runId", "messages"],
                    "additionalProperties": False,
                },
                busy=True,
            )
        },
        f"{sid}/ui-stream": {
            "post": _op(
                "Run a prompt (the last user message), or answer tool approvals, as the Vercel AI "
                "SDK's UI message stream (SSE, x-vercel-ai-ui-message-stream: v1, data: [DONE])",
                events,
                body=_obj(
                    ("messages",),
                    id=STR,
                    messages=array,
                    trigger={"enum": ["submit-message"]},
                    messageId=OPT_STR,
                ),
                busy=True,
            )
        },
    }


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
                            fleet=BOOL,
                        ),
                        "The server (fleet: it fronts a fleet, `--fleet`)",
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
                    "Answer a permission question ({allow, always, session, reason, mode}) or "
                    "an MCP server's question ({values} or {reason})",
                    _json(_obj(request_id=STR, allow=BOOL, scope=STR, answered=BOOL), "Answered"),
                    body=_obj(
                        allow=BOOL,
                        always=BOOL,
                        session=BOOL,
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
            f"{sid}/trace": {
                "get": _op(
                    "The address of the trace viewer over the session's debug trace "
                    "(a capability URL, /trace/…/, that needs no token; 404 without a trace)",
                    _json(_obj(url=STR), "The viewer's path on this server"),
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
            f"{sid}/pins": {
                "get": _op(
                    "The facts every summary must keep: the session's pins and the settings'",
                    _json(_ref("Pins"), "The pins (numbered from 1) and compaction.keep"),
                ),
                "post": _op(
                    "Pin a fact for this session (/pin): every later summary must keep it",
                    _json(_ref("Pins"), "Pinned"),
                    body=_obj(("text",), text=STR),
                    status="201",
                ),
            },
            f"{sid}/pins/{{number}}": {
                "delete": _op(
                    "Unpin the session's pin number N (/unpin N)",
                    _json(
                        _obj(
                            ("unpinned", "pins", "keep"),
                            unpinned=STR,
                            pins={"type": "array", "items": STR},
                            keep={"type": "array", "items": STR},
                        ),
                        "The fact unpinned, and the pins left",
                    ),
                    params=(
                        SESSION,
                        {"name": "number", "in": "path", "required": True, "schema": INT},
                    ),
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
                "post": _fork_op(),
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
            **_run_paths(),
            **_schedule_paths(),
            **_ui_stream_paths(sid),
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "parameters": {
                "SessionId": {"name": "id", "in": "path", "required": True, "schema": STR}
            },
            "schemas": {
                "Error": _obj(("error", "hint"), error=STR, hint=STR),
                "Pins": _obj(
                    ("pins", "keep"),
                    pins={"type": "array", "items": STR},
                    keep={"type": "array", "items": STR},
                ),
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
                        # The budget and what is left; each agent's own spend (agent_spend rows).
                        "spend": {"type": "object"},
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
                "RunSummary": {
                    "type": "object",
                    "description": "A fleet run's summary (docs/fleet.md): status queued, "
                    "running, parked (waits_on says on what), completed, cancelled, error...",
                    "properties": {
                        "id": STR,
                        "status": STR,
                        "submitted": STR,
                        "updated": STR,
                        "model": STR,
                        "mode": STR,
                        "last_prompt": STR,
                        "workspace": {"type": "object"},
                        "waits_on": {"type": ["object", "null"]},
                        "text": STR,
                        "turns": INT,
                        "cost": {"type": ["number", "null"]},
                        "worker": STR,
                        "error": OPT_STR,
                        "cancel_requested": BOOL,
                        "request": {"type": "object"},
                    },
                },
                "Undone": _obj(
                    label=STR,
                    restored={"type": "array", "items": STR},
                    removed={"type": "array", "items": STR},
                    overwritten={"type": "array", "items": {"type": "object"}},
                    failed={"type": "array", "items": {"type": "object"}},
                    notes={"type": "array", "items": STR},
                    checks={
                        "type": "array",
                        "items": _obj(
                            root=STR,
                            matches=BOOL,
                            checkpoint=STR,
                            now=STR,
                            differing={"type": "array", "items": STR},
                            count=INT,
                            why=STR,
                        ),
                    },
                ),
            },
        },
    }


__all__ = ["spec"]
