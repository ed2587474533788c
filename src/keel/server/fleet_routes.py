"""The `/v1/runs` routes of `keel serve --fleet`: the fleet's work queue over HTTP (docs/server.md,
"Fronting a fleet").

A thin front over one `keel.fleet.runs.Fleet` client, opened on first use in the server's event
loop and opened again after its NATS connection died: submit a run (checked as `keel submit`
checks it, before anything is queued), read summaries, cancel, retry, answer what a parked run
waits for, long-poll until a run is over or parked, list the workers, and stream status changes
and a run's journal as Server-Sent Events (both end when the server stops or the fleet's
connection dies, so the client reconnects and learns why). Answers through this server are taken one at a
time (two clients answering one question at once: one 200, one 409). The guard in front (Host check, bearer token) is
`keel.server.http`'s, so are the body reader and the error shape. Without `--fleet` every route
answers 404 with a hint; a NATS server that cannot be reached, or refuses, is a 503 with the
fleet's one-line message (a password in the fleet's URL never appears in one).

It never runs a model or a tool itself (workers do) and never imports nats-py at import time.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from keel.errors import UserError
from keel.server.host import ApiError
from keel.server.ring import KEEPALIVE

if TYPE_CHECKING:
    from keel.fleet.runs import Fleet

#: The longest `?timeout=` a wait may ask for (seconds) and the default.
MAX_WAIT = 300.0
DEFAULT_WAIT = 30.0
#: How often a wait reads the run's summary.
POLL = 0.2
#: How often an event stream looks whether the fleet's connection is still up (seconds).
ALIVE_EVERY = 1.0

#: A run request's limits, as `keel submit` takes them: (smallest, largest).
TURNS = (1, 100_000)
TOKENS = (0, 10**12)
ATTEMPTS = (1, 100)

NONE = type(None)
SUBMIT_FIELDS: dict[str, tuple[type, ...]] = {
    "prompt": (str,),
    "model": (str, NONE),
    "mode": (str, NONE),
    "workspace": (str, dict, NONE),
    "max_turns": (int, NONE),
    "max_tokens_budget": (int, NONE),
    "no_check": (bool, NONE),
    "max_budget_usd": (int, float, NONE),
    "priority": (str, NONE),
    "needs": (list, str, NONE),
    "notify": (str, NONE),
    "max_attempts": (int, NONE),
}
ANSWER_FIELDS: dict[str, tuple[type, ...]] = {
    "allow": (bool,),
    "reason": (str,),
    "result": (str,),
    "is_error": (bool,),
}

T = TypeVar("T")

HINT_LIST = "GET /v1/runs lists the runs"
HINT_SCHEDULES = "GET /v1/schedules lists the schedules"
#: `POST /v1/schedules`: a run request's fields, and when (keel.fleet.schedules.when).
SCHEDULE_FIELDS: dict[str, tuple[type, ...]] = {
    **SUBMIT_FIELDS,
    "at": (str, NONE),
    "every": (str, NONE),
    "tz": (str, NONE),
}
#: The content type of `GET /metrics` (Prometheus text format 0.0.4).
PROMETHEUS_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def redact(url: str) -> str:
    """`url` (a comma list) without the password of any server in it."""
    out = []
    for one in url.split(","):
        one = one.strip()
        try:
            parts = urlsplit(one)
            secret = parts.password is not None
        except ValueError:
            out.append("(unparsable URL)")
            continue
        if secret or (parts.username and "@" in parts.netloc):
            host = parts.hostname or ""
            host = f"[{host}]" if ":" in host else host
            netloc = f"{parts.username}:***@{host}" if secret else f"***@{host}"
            if parts.port is not None:
                netloc += f":{parts.port}"
            one = urlunsplit(parts._replace(netloc=netloc))
        out.append(one)
    return ",".join(out)


class FleetRoutes:
    """The `/v1/runs` routes over the fleet at `url` (None: this server fronts no fleet)."""

    def __init__(self, url: str | None, *, keepalive: float = KEEPALIVE) -> None:
        self.url = url
        #: Seconds of quiet after which the run events' stream sends a keepalive comment.
        self.keepalive = keepalive
        self.shown = redact(url) if url else ""
        self._fleet: Fleet | None = None
        self._lock = asyncio.Lock()
        # One answer at a time through this server: the check that the run waits for the
        # request and the answer that queues it go together, so of two clients answering the
        # same question at once one gets its 200 and the other a 409 (not both a 200, with the
        # run doing what the last write said).
        self._answering = asyncio.Lock()
        # Set when the server stops: the event streams end, so no open connection holds the
        # shutdown up (`end_streams`).
        self._stopping = asyncio.Event()

    # -- the client ------------------------------------------------------------------------------

    def require(self) -> str:
        """The fleet's URL; a 404 with a hint when this server fronts none."""
        if self.url is None:
            raise ApiError(
                404,
                "this server does not front a fleet",
                "start keel serve with --fleet (KEEL_NATS_URL or the local fleet) or "
                "--fleet nats://HOST:PORT",
            )
        return self.url

    async def fleet(self) -> Fleet:
        """The client, connected on first use and again after its connection died; a 503 when
        the NATS server cannot be reached."""
        from keel.fleet.connect import FleetError

        url = self.require()
        async with self._lock:
            if self._fleet is not None and self._fleet.nc.is_closed:
                self._fleet = None  # its server went away: connect again
            if self._fleet is None:
                from keel.fleet.runs import Fleet

                try:
                    self._fleet = await Fleet.open(url)
                except FleetError as exc:
                    raise self._unavailable(exc.message, exc.hint) from None
            return self._fleet

    async def aclose(self) -> None:
        fleet, self._fleet = self._fleet, None
        if fleet is None or fleet.nc.is_closed:
            return
        try:
            await asyncio.wait_for(fleet.close(), 5)
        except (TimeoutError, OSError):
            await fleet.nc.close()
        except Exception as exc:
            if not _nats_error(exc):
                raise
            await fleet.nc.close()

    def end_streams(self) -> None:
        """The server is stopping: the run events' and journals' streams end."""
        self._stopping.set()

    async def _call(self, fn: Callable[[Fleet], Awaitable[T]]) -> T:
        """`fn(fleet)`, with the fleet's failures as answers: a `FleetError` or a NATS failure
        is a 503 (the next request connects again if the connection died); another `UserError`
        a 400."""
        from keel.fleet.connect import FleetError

        fleet = await self.fleet()
        try:
            return await fn(fleet)
        except ApiError:
            raise
        except FleetError as exc:
            raise self._unavailable(exc.message, exc.hint) from None
        except UserError as exc:
            raise ApiError.of(exc) from exc
        except (TimeoutError, OSError) as exc:
            await self._drop(fleet)
            raise self._unavailable(
                f"the fleet's NATS server did not answer ({_what(exc)})"
            ) from None
        except Exception as exc:
            if not _nats_error(exc):
                raise
            await self._drop(fleet)
            raise self._unavailable(f"the fleet's NATS server failed: {_what(exc)}") from None

    async def _drop(self, fleet: Fleet) -> None:
        async with self._lock:
            if self._fleet is fleet and not fleet.nc.is_connected:
                self._fleet = None
                try:
                    await fleet.nc.close()
                except Exception as exc:
                    if not _nats_error(exc):
                        raise

    def _unavailable(self, message: str, hint: str = "") -> ApiError:
        if self.url:
            message = message.replace(self.url, self.shown)
        return ApiError(
            503,
            message.replace("\n", " "),
            hint
            or f"is the fleet's NATS server at {self.shown} up? keel serve connects again on "
            "the next request",
        )

    # -- routes -----------------------------------------------------------------------------------

    async def submit(self, request: Request) -> Response:
        from keel.fleet.checks import check_request
        from keel.server.http import read_body

        self.require()  # a 404 before the body is read when there is no fleet
        body = await read_body(request, SUBMIT_FIELDS)
        req = run_request(body)
        no_check = bool(body.get("no_check"))

        async def go(fleet: Fleet) -> dict[str, Any]:
            # As `keel submit`: what no live worker can serve is a 400 (keel.fleet.checks).
            warnings = [] if no_check else await check_request(fleet, req)
            summary: dict[str, Any] = await fleet.submit(req)
            return {**summary, "warnings": warnings} if warnings else summary

        return JSONResponse(await self._call(go), 201)

    async def list_runs(self, request: Request) -> Response:
        """The runs, newest first: all of them, or `?status=` (a comma list; `active`), a page
        of `?limit=` from `?page=` or `?after=RUN`, with how many more there are."""
        from keel.fleet.view import select

        self.require()
        statuses = _statuses(request)
        limit = _query_whole(request, "limit", 1, 1_000_000)
        page = _query_whole(request, "page", 1, 10**9) or 1
        after = request.query_params.get("after") or None
        summaries = await self._call(lambda fleet: fleet.runs())
        try:
            shown = select(summaries, statuses=statuses, limit=limit, page=page, after=after)
        except UserError as exc:
            raise ApiError(400, exc.message, HINT_LIST) from exc
        return JSONResponse({"runs": shown.runs, "total": shown.total, "more": shown.more})

    async def run_events(self, request: Request) -> Response:
        """Server-Sent Events: one `change` event per run status change (a KV watch on the
        summaries, as `keel runs list --watch --json`), `?status=` to keep some."""
        from starlette.responses import StreamingResponse

        from keel.fleet.view import SummaryWatch, change
        from keel.server.ring import message

        self.require()
        statuses = _statuses(request)

        async def start(fleet: Fleet) -> tuple[Fleet, SummaryWatch]:
            watch = SummaryWatch(await fleet.kv())
            await watch.start()
            return fleet, watch

        fleet, watch = await self._call(start)

        async def body() -> AsyncIterator[bytes]:
            try:
                yield b"retry: 1000\n\n"
                changes = paced(
                    watch.next,
                    keepalive=self.keepalive,
                    stop=self._stopping,
                    alive=lambda: not fleet.nc.is_closed,
                )
                async with contextlib.aclosing(changes):
                    async for got in changes:
                        if got is None:
                            yield b": keepalive\n\n"
                            continue
                        before, after = got
                        item = change(before, after)
                        if item is None or (
                            statuses is not None and item["status"] not in statuses
                        ):
                            continue
                        yield message("change", {**item, "summary": after})
            except EOFError:
                return  # the watch was stopped
            finally:
                await _quietly(watch.stop())

        return StreamingResponse(
            body(),
            media_type="text/event-stream",
            headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
        )

    async def metrics(self, request: Request) -> Response:
        """The fleet in Prometheus text format 0.0.4 (keel.fleet.view.metrics)."""
        from keel.fleet.registry import live_workers
        from keel.fleet.view import metrics

        self.require()

        async def go(fleet: Fleet) -> str:
            queue = await fleet.queue_depth()
            summaries = await fleet.runs()
            workers = len(await live_workers(fleet))  # silent and stopping ones left out
            return metrics(queue=queue, summaries=summaries, workers=workers)

        text = await self._call(go)
        return Response(text, headers={"content-type": PROMETHEUS_TYPE})

    async def get_run(self, request: Request) -> Response:
        self.require()
        run = _run_id(request)
        return JSONResponse(await self._call(lambda fleet: _found(fleet, run)))

    async def cancel(self, request: Request) -> Response:
        from keel.server.http import read_body

        self.require()
        await read_body(request, {})
        run = _run_id(request)

        async def go(fleet: Fleet) -> dict[str, Any]:
            await _found(fleet, run)
            return await fleet.cancel(run)

        return JSONResponse(await self._call(go))

    async def answer(self, request: Request) -> Response:
        from keel.server.http import read_body

        self.require()
        body = await read_body(request, ANSWER_FIELDS)
        run = _run_id(request)
        request_id = request.path_params["request_id"]
        permission = {"allow", "reason"} & set(body)
        deferred = {"result", "is_error"} & set(body)
        if permission and deferred:
            raise ApiError(
                400,
                f"{', '.join(sorted(permission))} cannot be combined with "
                f"{', '.join(sorted(deferred))}",
                'a question takes {"allow": true|false, "reason": "…"}; a tool that answers '
                'later {"result": "…", "is_error": false}',
            )

        async def go(fleet: Fleet) -> dict[str, Any]:
            async with self._answering:
                return await answer(fleet)

        async def answer(fleet: Fleet) -> dict[str, Any]:
            summary = await _found(fleet, run)
            waits = summary.get("waits_on") or {}
            parked = summary.get("status") == "parked"
            if not parked or waits.get("request") != request_id:
                # A summary keeps its last waits_on after the run went on: named only if parked.
                raise ApiError(
                    409,
                    f"run {run} does not wait for {request_id!r} (it is {summary.get('status')}"
                    + (f", waiting for {waits.get('request')}" if parked and waits else "")
                    + ")",
                    f"GET /v1/runs/{run} says what a run waits for",
                )
            if waits.get("waits_for") == "deferred":
                if "result" not in body:
                    raise ApiError(
                        400,
                        f"run {run} waits for the result of {waits.get('tool')} ({request_id}), "
                        "not a permission",
                        'send {"result": "…", "is_error": false}',
                    )
                allow: bool | None = None
            else:
                if "allow" not in body:
                    raise ApiError(
                        400,
                        f"run {run} waits for a {waits.get('waits_for')} answer on {request_id}",
                        'send {"allow": true} or {"allow": false, "reason": "…"}',
                    )
                allow = bool(body["allow"])
            try:
                await fleet.answer(
                    run,
                    request_id,
                    allow,
                    body.get("reason", ""),
                    result=body.get("result"),
                    is_error=bool(body.get("is_error", False)),
                )
            except UserError as exc:
                from keel.fleet.connect import FleetError

                if isinstance(exc, FleetError):
                    raise
                # Answered in between (by another client): the run no longer waits for it.
                raise ApiError(
                    409, exc.message.replace("\n", " "), f"GET /v1/runs/{run} shows the run"
                ) from exc
            answered: dict[str, Any] = {"run": run, "request": request_id, "queued": True}
            if allow is None:
                answered["is_error"] = bool(body.get("is_error", False))
            else:
                answered["allow"] = allow
            return answered

        return JSONResponse(await self._call(go))

    async def wait(self, request: Request) -> Response:
        self.require()
        run = _run_id(request)
        limit = _timeout(request.query_params.get("timeout"))

        async def go(fleet: Fleet) -> dict[str, Any]:
            deadline = time.monotonic() + limit
            while True:
                summary = await _found(fleet, run)
                if summary.get("status") not in ("queued", "running"):
                    return summary
                if time.monotonic() >= deadline or await request.is_disconnected():
                    return summary  # still going: the client asks again
                await asyncio.sleep(min(POLL, max(0.0, deadline - time.monotonic())))

        return JSONResponse(await self._call(go))

    async def retry(self, request: Request) -> Response:
        """As `keel runs retry`: a `failed` or `error` run queued again on its route (a worker
        resumes it from its journal); any other state is a 409."""
        from keel.fleet.runs import ACTIVE, RETRYABLE
        from keel.server.http import read_body

        self.require()
        await read_body(request, {})
        run = _run_id(request)

        async def go(fleet: Fleet) -> dict[str, Any]:
            summary = await _found(fleet, run)
            status = summary.get("status")
            if status not in RETRYABLE:
                raise ApiError(
                    409,
                    f"run {run} is {status}: only a failed run can be retried",
                    f"it may still finish: GET /v1/runs/{run}/wait, or POST /v1/runs/{run}/cancel"
                    if status in ACTIVE
                    else "submit it again: POST /v1/runs",
                )
            return await fleet.retry(run)

        return JSONResponse(await self._call(go))

    async def workers(self, request: Request) -> Response:
        """The workers' registry entries (`keel workers --json`): silent ones flagged."""
        from keel.fleet.registry import read_workers

        self.require()
        found = await self._call(read_workers)
        return JSONResponse({"workers": found})

    async def journal(self, request: Request) -> Response:
        """Server-Sent Events: the run's journal records, each as its session file line
        (`event: record`, `id:` its seq), from the first (or after `Last-Event-ID` / `?after=`)
        and then live as the run's workers append them. A run not started yet has none: the
        stream waits for them."""
        from starlette.responses import StreamingResponse

        from keel.fleet import streams

        self.require()
        run = _run_id(request)
        raw = request.headers.get("last-event-id") or request.query_params.get("after") or "0"
        if not raw.strip().isdigit():
            raise ApiError(400, f"Last-Event-ID / after must be a record seq, not {raw!r}", "")
        after = int(raw)

        async def start(fleet: Fleet) -> tuple[Fleet, Any]:
            await _found(fleet, run)
            subscription = await fleet.js.subscribe(
                streams.run_filter(run), ordered_consumer=True, pending_msgs_limit=-1
            )
            return fleet, subscription

        fleet, subscription = await self._call(start)

        async def body() -> AsyncIterator[bytes]:
            import nats.errors

            try:
                yield b"retry: 1000\n\n"
                messages = paced(
                    lambda: subscription.next_msg(timeout=None),
                    keepalive=self.keepalive,
                    stop=self._stopping,
                    alive=lambda: not fleet.nc.is_closed,
                )
                async with contextlib.aclosing(messages):
                    async for msg in messages:
                        if msg is None:
                            yield b": keepalive\n\n"
                            continue
                        line = msg.data.decode("utf-8", "replace").strip()
                        seq = _record_seq(line)
                        if seq is None or seq <= after:
                            continue
                        yield f"event: record\nid: {seq}\ndata: {line}\n\n".encode()
            except nats.errors.Error:
                return  # the connection closed: the client reconnects with its Last-Event-ID
            finally:
                await _quietly(subscription.unsubscribe())

        return StreamingResponse(
            body(),
            media_type="text/event-stream",
            headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
        )

    def routes(self) -> list[Route]:
        r = "/v1/runs/{id}"
        return [
            Route("/v1/runs", self.list_runs, methods=["GET"]),
            Route("/v1/runs", self.submit, methods=["POST"]),
            Route("/v1/runs/events", self.run_events, methods=["GET"]),  # before /v1/runs/{id}
            Route("/metrics", self.metrics, methods=["GET"]),
            Route(r, self.get_run, methods=["GET"]),
            Route(f"{r}/cancel", self.cancel, methods=["POST"]),
            Route(f"{r}/answers/{{request_id}}", self.answer, methods=["POST"]),
            Route(f"{r}/wait", self.wait, methods=["GET"]),
            Route(f"{r}/retry", self.retry, methods=["POST"]),
            Route(f"{r}/journal", self.journal, methods=["GET"]),
            Route("/v1/workers", self.workers, methods=["GET"]),
            *self.schedule_routes(),
        ]

    # -- schedules (keel.fleet.schedules) ----------------------------------------------------------

    def schedule_routes(self) -> list[Route]:
        return [
            Route("/v1/schedules", self.list_schedules, methods=["GET"]),
            Route("/v1/schedules", self.add_schedule, methods=["POST"]),
            Route("/v1/schedules/{id}", self.get_schedule, methods=["GET"]),
            Route("/v1/schedules/{id}", self.remove_schedule, methods=["DELETE"]),
        ]

    async def list_schedules(self, request: Request) -> Response:
        from keel.fleet.schedules import Schedules

        found = await self._call(lambda fleet: Schedules(fleet).all())
        now = datetime.now(UTC)
        return JSONResponse({"schedules": [_schedule_json(s, now) for s in found]})

    async def add_schedule(self, request: Request) -> Response:
        """`POST /v1/runs`'s body with `at` or `every` (and `tz`): stored, fired by a worker."""
        from keel.fleet.checks import check_request
        from keel.fleet.schedules import Schedules, make, when
        from keel.server.http import read_body

        self.require()
        body = await read_body(request, SCHEDULE_FIELDS)
        now = datetime.now(UTC)
        try:
            w = when(body.get("at"), body.get("every"), body.get("tz"), now=now)
        except UserError as exc:
            raise ApiError.of(exc) from exc
        req = run_request(body)
        no_check = bool(body.get("no_check"))

        async def go(fleet: Fleet) -> dict[str, Any]:
            warnings = [] if no_check else await check_request(fleet, req)
            schedule = make(req, at=w.at, every=w.every, tz=w.tz, now=now)
            await Schedules(fleet).add(schedule)
            entry = _schedule_json(schedule, now)
            return {**entry, "warnings": warnings} if warnings else entry

        return JSONResponse(await self._call(go), 201)

    async def get_schedule(self, request: Request) -> Response:
        from keel.fleet.schedules import Schedules

        self.require()
        schedule_id = _schedule_id(request)

        async def go(fleet: Fleet) -> dict[str, Any]:
            found = await Schedules(fleet).get(schedule_id)
            if found is None:
                raise ApiError(404, f"no schedule {schedule_id!r}", HINT_SCHEDULES)
            return _schedule_json(found, datetime.now(UTC))

        return JSONResponse(await self._call(go))

    async def remove_schedule(self, request: Request) -> Response:
        from keel.fleet.schedules import Schedules

        self.require()
        schedule_id = _schedule_id(request)

        async def go(fleet: Fleet) -> dict[str, Any]:
            store = Schedules(fleet)
            if await store.get(schedule_id) is None:
                raise ApiError(404, f"no schedule {schedule_id!r}", HINT_SCHEDULES)
            return _schedule_json(await store.remove(schedule_id), datetime.now(UTC))

        return JSONResponse(await self._call(go))


async def paced(
    step: Callable[[], Awaitable[T]],
    *,
    keepalive: float,
    stop: asyncio.Event,
    alive: Callable[[], bool] = lambda: True,
) -> AsyncGenerator[T | None, None]:
    """Each result of `step()` in turn, and None after each `keepalive` seconds without one (an
    event stream's keepalive); ends once `stop` is set (the server is stopping) or, looked at
    every `ALIVE_EVERY` seconds, `alive()` is false (the fleet's connection died: the client
    reconnects and is told why). A `step()` in flight at a keepalive is waited for again, never
    cancelled: cancelled, the record or change it was taking could be lost."""
    loop = asyncio.get_running_loop()
    stopped: asyncio.Future[Any] = asyncio.ensure_future(stop.wait())
    pending: asyncio.Future[Any] | None = None
    quiet_since = loop.time()
    try:
        while alive():
            if pending is None:
                pending = asyncio.ensure_future(step())
            left = quiet_since + keepalive - loop.time()
            done, _ = await asyncio.wait(
                {pending, stopped},
                timeout=max(0.0, min(ALIVE_EVERY, left)),
                return_when=asyncio.FIRST_COMPLETED,
            )
            if pending in done:
                finished, pending = pending, None
                quiet_since = loop.time()
                result: T = finished.result()
                yield result
            elif stopped in done:
                return
            elif loop.time() - quiet_since >= keepalive:
                quiet_since = loop.time()
                yield None
    finally:
        stopped.cancel()
        if pending is not None:
            pending.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pending


def _schedule_id(request: Request) -> str:
    from keel.fleet.schedules import check_id

    try:
        return check_id(request.path_params["id"])
    except UserError as exc:
        raise ApiError(400, exc.message, HINT_SCHEDULES) from exc


def _schedule_json(schedule: Any, now: datetime) -> dict[str, Any]:
    from keel.fleet.schedules import overdue

    return {**schedule.to_json(), "overdue": overdue(schedule, now)}


# -- checks -----------------------------------------------------------------------------------------


def run_request(body: dict[str, Any]) -> Any:
    """The `RunRequest` for a `POST /v1/runs` body, checked as `keel submit` checks its flags
    (a 400 with one line otherwise; nothing is queued)."""
    from keel.fleet.queues import Route as QueueRoute
    from keel.fleet.runs import RunRequest
    from keel.fleet.workspace import parse_workspace
    from keel.session.store import new_session_id

    prompt = body.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise ApiError(400, "prompt is missing or empty", 'send {"prompt": "…"}')
    try:
        if body.get("mode") is not None:
            from keel.permissions.gate import parse_mode

            parse_mode(body["mode"])
        if body.get("model") is not None:
            from keel.llm.catalog import parse_model

            parse_model(body["model"])
        if body.get("workspace") is None:
            # As `keel submit --workspace`: a run in an empty directory is asked for, never a
            # silent default.
            raise ApiError(
                400,
                "workspace is missing",
                'send "workspace": "git:URL#REF", "path:/shared/dir", an object '
                '({"git": URL, "ref": REF} or {"path": DIR}), or "none" for an empty directory',
            )
        spec = parse_workspace(body["workspace"])
        needs = body.get("needs") or []
        if isinstance(needs, str):
            needs = [needs]  # "gpu,python" as keel submit --needs takes it
        if not isinstance(needs, list) or not all(isinstance(n, str) for n in needs):
            raise UserError(
                f"needs must be a list of labels, not {needs!r}", hint='send "needs": ["gpu"]'
            )
        priority = body.get("priority")
        if priority is not None and not isinstance(priority, str):
            raise UserError(
                f"priority must be a string, not {priority!r}", hint='send "priority": "high"'
            )
        route = QueueRoute.of(priority, needs)
        notify = body.get("notify") or None
        if notify is not None:
            from keel.fleet.view import check_notify_url

            check_notify_url(notify)
    except UserError as exc:
        raise ApiError.of(exc) from exc
    turns = _whole(body, "max_turns", *TURNS, "turns")
    tokens = _whole(body, "max_tokens_budget", *TOKENS, "tokens")
    attempts = _whole(body, "max_attempts", *ATTEMPTS, "attempts")
    usd = body.get("max_budget_usd")
    if usd is not None and (not math.isfinite(usd) or usd <= 0):
        raise ApiError(400, f"max_budget_usd must be a positive amount of dollars, not {usd!r}", "")
    return RunRequest(
        run=new_session_id(),
        prompt=prompt,
        model=body.get("model"),
        mode=body.get("mode"),
        workspace=spec.to_dict(),
        max_turns=turns,
        max_tokens_budget=tokens,
        max_budget_usd=None if usd is None else float(usd),
        notify=notify,
        max_attempts=attempts,
        priority=route.priority,
        needs=list(route.needs),
    )


def _statuses(request: Request) -> frozenset[str] | None:
    from keel.fleet.view import parse_statuses

    try:
        return parse_statuses(request.query_params.getlist("status"))
    except UserError as exc:
        raise ApiError.of(exc) from exc


def _query_whole(request: Request, name: str, low: int, high: int) -> int | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    if not raw.isdigit() or not low <= int(raw) <= high:
        raise ApiError(400, f"{name} must be a whole number from {low} to {high}, not {raw!r}", "")
    return int(raw)


def _whole(body: dict[str, Any], name: str, low: int, high: int, unit: str) -> int | None:
    value = body.get(name)
    if value is not None and not low <= value <= high:
        raise ApiError(400, f"{name} must be from {low} to {high} {unit}, not {value}", "")
    return value if value is None else int(value)


def _timeout(raw: str | None) -> float:
    if raw is None:
        return DEFAULT_WAIT
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not 0 <= value <= MAX_WAIT:
        raise ApiError(
            400,
            f"timeout must be from 0 to {MAX_WAIT:g} seconds, not {raw!r}",
            "e.g. ?timeout=30 (the wait answers with the run as it is then; ask again)",
        )
    return value


def _run_id(request: Request) -> str:
    from keel.fleet.streams import check_run_id

    run: str = request.path_params["id"]
    try:
        return check_run_id(run)
    except UserError as exc:
        raise ApiError(400, exc.message, HINT_LIST) from exc


def _record_seq(line: str) -> int | None:
    """A journal line's `seq`; None for a line that is not one record of JSON on one line."""
    import json

    try:
        value = json.loads(line)
    except ValueError:
        return None
    seq = value.get("seq") if isinstance(value, dict) else None
    return seq if isinstance(seq, int) and not isinstance(seq, bool) and "\n" not in line else None


async def _found(fleet: Fleet, run: str) -> dict[str, Any]:
    summary = await fleet.summary(run)
    if summary is None:
        raise ApiError(404, f"no run {run!r}", HINT_LIST)
    return summary


async def _quietly(closing: Awaitable[Any]) -> None:
    """Await `closing` (a stream's watch or subscription ending); a NATS error, as when the
    connection is gone, is nothing more to tell."""
    try:
        await closing
    except Exception as exc:
        if not _nats_error(exc):
            raise


def _nats_error(exc: BaseException) -> bool:
    import sys

    errors = sys.modules.get("nats.errors")  # loaded whenever a Fleet was opened
    return errors is not None and isinstance(exc, errors.Error)


def _what(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text and text[0] else type(exc).__name__


__all__ = ["FleetRoutes", "paced", "redact", "run_request"]
