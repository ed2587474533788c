"""Run requests and run summaries: what `keel submit` queues and `keel runs` reads.

A run request (the queue message) names a model, never a credential: a worker uses its own
environment and settings for keys and base URLs. A run's summary lives in the KV bucket
`keel-runs` under its id, written by whoever changes the run's state (submit, the worker, answer,
cancel); listing runs reads the summaries, never the journals.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, field
from typing import TYPE_CHECKING, Any

from keel.errors import UserError
from keel.fleet import streams
from keel.fleet.connect import FleetError
from keel.fleet.view import STATUSES
from keel.frozen import mutable

if TYPE_CHECKING:
    from nats.aio.client import Client
    from nats.js.kv import KeyValue

#: Statuses of a run that is not over (the first of every status a summary can hold).
ACTIVE = STATUSES[:3]
#: Terminal reasons that mean the run did its job.
DONE = ("completed",)
#: Bytes kept free beside a run request in one message: its summary carries the request with
#: the run's state around it.
SUMMARY_ROOM = 16 * 1024


#: Lost attempts (or refusing workers) after which a run ends `failed`, unless the request or
#: `KEEL_FLEET_MAX_ATTEMPTS` says otherwise.
MAX_ATTEMPTS = 3
#: Statuses `keel runs retry` queues again.
RETRYABLE = ("failed", "error")


def max_attempts(req_value: int | None, env: Mapping[str, str]) -> int:
    """The attempt limit of a run: its request's, else `KEEL_FLEET_MAX_ATTEMPTS`, else 3."""
    if req_value is not None and req_value >= 1:
        return int(req_value)
    try:
        value = int(env.get("KEEL_FLEET_MAX_ATTEMPTS", "") or MAX_ATTEMPTS)
    except ValueError:
        value = MAX_ATTEMPTS
    return value if value >= 1 else MAX_ATTEMPTS


#: Seconds a summary write keeps asking a bucket that has no leader (an election takes 4 to
#: 6.5 s after a node loss).
ELECTION_WAIT = 20.0


def stamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


#: Summary fields cut, in this order, when a summary would not fit in one message.
_CUTTABLE = ("text", "error", "last_prompt")


def fit_summary(summary: dict[str, Any], limit: int) -> bytes:
    """`summary` as JSON bytes that fit in one message of `limit` bytes: a final answer or an
    error too long for it is cut (the whole text stays in the run's journal), then the copy of
    the request's prompt. Cuts `summary` in place, so what is returned is what was stored."""
    value = json.dumps(summary, separators=(",", ":")).encode()
    room = limit - 1024  # the KV subject and headers
    for key in (*_CUTTABLE, "request"):
        if len(value) <= room:
            break
        holder, field_name = (
            (summary.get("request"), "prompt") if key == "request" else (summary, key)
        )
        if not isinstance(holder, dict) or not isinstance(holder.get(field_name), str):
            continue
        text: str = holder[field_name]
        whole = len(text)
        while len(value) > room and text:
            # JSON may spend up to 6 bytes on a character: cut by the text's own ratio.
            ratio = len(json.dumps(text)) / len(text)
            text = text[: max(0, int(len(text) - (len(value) - room + 300) / ratio))]
            holder[field_name] = (
                f"{text}\n[cut: {whole - len(text):,} more characters; the "
                "run's journal has the whole text]"
            )
            value = json.dumps(summary, separators=(",", ":")).encode()
    return value


def _electing() -> tuple[type[Exception], ...]:
    """What a replicated bucket answers while it elects a leader (a node lost): a timeout, "no
    responders" or a 503, for a few seconds."""
    import nats.errors
    import nats.js.errors

    return (
        nats.errors.TimeoutError,
        nats.errors.NoRespondersError,
        nats.js.errors.NoStreamResponseError,
        nats.js.errors.ServiceUnavailableError,
    )


async def _read(kv: KeyValue, key: str, patience: float) -> Any:
    """The bucket's entry for `key` (None when there is none), asked again until the monotonic
    time `patience` while the bucket elects a leader, so a worker does not hand its run back
    for an election."""
    import nats.js.errors

    while True:
        try:
            return await kv.get(key)
        except nats.js.errors.KeyNotFoundError:
            return None
        except _electing():
            if time.monotonic() > patience:
                raise
            await asyncio.sleep(0.25)


@mutable
class RunRequest:
    """What a worker needs to start a run (the queue message's body)."""

    run: str
    prompt: str
    model: str | None = None
    mode: str | None = None
    #: A workspace spec (keel/fleet/workspace.py): {"git": URL, "ref": REF}, {"path": DIR}, {}.
    workspace: dict[str, Any] = field(default_factory=dict)
    max_turns: int | None = None
    max_tokens_budget: int | None = None
    max_budget_usd: float | None = None
    submitted: str = ""
    #: Why this message was queued: "start", "answer" (a parked run was answered), "cancel",
    #: "retry" (`keel runs retry`).
    why: str = "start"
    #: Attempts lost (a worker died running it) or workers that refused it before the run ends
    #: `failed`; None: the worker's `KEEL_FLEET_MAX_ATTEMPTS`, else MAX_ATTEMPTS.
    max_attempts: int | None = None
    #: A URL the run's events (parked, over) are POSTed to as JSON (`keel submit --notify`).
    notify: str | None = None
    #: "high", "normal" or "low": a worker takes higher priorities first (keel/fleet/queues.py).
    priority: str = "normal"
    #: Worker labels the run needs (`keel worker --labels`): only a worker with all of them
    #: takes it.
    needs: list[str] = field(default_factory=list)

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> RunRequest:
        try:
            d = json.loads(data)
            if not isinstance(d, dict) or not isinstance(d.get("run"), str):
                raise ValueError("not a run request")
            known = {f for f in cls.__dataclass_fields__}
            req = cls(**{k: v for k, v in d.items() if k in known})
        except (ValueError, TypeError) as exc:
            raise UserError(f"a queue message is not a run request ({exc})") from None
        streams.check_run_id(req.run)
        return req


class Fleet:
    """The fleet as a client sees it: submit, read, answer, cancel (async, one connection)."""

    def __init__(self, nc: Client) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self._kv: KeyValue | None = None
        #: Where a failed event or webhook is said (a worker's log); never raised.
        self.say: Callable[[str], None] = lambda _line: None
        self._notifying: set[asyncio.Task[bool]] = set()

    @classmethod
    async def open(
        cls, url: str, env: Mapping[str, str] | None = None, *, reconnect: bool = False
    ) -> Fleet:
        """A client; `reconnect` for a long-lived one (a worker: its node may go away)."""
        from keel.fleet.connect import connect

        return cls(await connect(url, name="keel fleet client", env=env, reconnect=reconnect))

    async def close(self) -> None:
        if self._notifying:  # webhooks in flight: each bounded by its own timeouts
            await asyncio.wait(set(self._notifying))
        await self.nc.drain()

    async def kv(self) -> KeyValue:
        if self._kv is None:
            try:
                self._kv = await self.js.key_value(streams.KV_BUCKET)
            except Exception as exc:  # nats-py: BucketNotFoundError and kin
                raise FleetError(
                    f"the fleet's bucket {streams.KV_BUCKET} does not exist on this server "
                    f"({type(exc).__name__})",
                    hint="create the fleet's streams with `keel fleet init` (or `keel fleet up`)",
                ) from None
        return self._kv

    # -- summaries --------------------------------------------------------------------------

    async def summary(self, run: str) -> dict[str, Any] | None:
        return await self._get(streams.check_run_id(run))

    async def resolve(self, run: str) -> str:
        """The id of the run `run` names: that id, or the one run whose id starts with it (as a
        session id prefix does); `UserError` for none, and for several (naming them)."""
        import nats.js.errors

        streams.check_run_id(run)
        if await self._get(run) is not None:
            return run  # a whole id: one read, not a listing of every key (slower, and under
            # load the client's listing has been seen to come back short)
        kv = await self.kv()
        try:
            keys = await kv.keys()
        except nats.js.errors.NoKeysError:
            keys = []
        ids = sorted(k for k in keys if "." not in k and k.startswith(run))
        if run in ids or len(ids) == 1:
            return run if run in ids else ids[0]
        if not ids:
            raise UserError(f"no run {run!r}", hint="`keel runs list` shows the runs")
        more = f" and {len(ids) - 5} more" if len(ids) > 5 else ""
        raise UserError(
            f"run id prefix {run!r} is ambiguous: {', '.join(ids[:5])}{more}",
            hint="give more of the id",
        )

    async def _get(self, key: str) -> dict[str, Any] | None:
        # As for put_summary: asked again while a replicated bucket elects a leader.
        entry = await _read(await self.kv(), key, time.monotonic() + ELECTION_WAIT)
        if entry is None or not entry.value:
            return None
        value = json.loads(entry.value)
        return value if isinstance(value, dict) else None

    async def put_summary(
        self,
        run: str,
        *,
        update: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
        **changes: Any,
    ) -> dict[str, Any]:
        """Merge `changes` into the run's summary (compare-and-swap on the entry's revision, so
        a worker's record-driven update in between is merged, never lost). `update(current)`,
        when given, returns more changes computed from the summary as it is (it may run more
        than once: on a lost race it sees the newer summary)."""
        import nats.js.errors

        kv = await self.kv()
        # A replicated bucket electing a leader (a node lost) times out or answers "no
        # responders" / 503 for a few seconds: asked again meanwhile, so a worker does not hand
        # its run back for it.
        patience = time.monotonic() + ELECTION_WAIT
        races = 0
        while races < 10:
            entry = await _read(kv, run, patience)
            current = json.loads(entry.value) if entry is not None and entry.value else {}
            current = current if isinstance(current, dict) else {}
            before = dict(current) if entry is not None else None
            current.setdefault("id", run)
            current.update(changes)
            if update is not None:
                current.update(update(dict(current)))
            was = (before or {}).get("status")
            if was and was not in ACTIVE and current.get("status") == "running":
                # A late write of an attempt that lost the run (it waited through a leader
                # election while another worker finished the run): the end stands. Only a
                # retry (`queued`) starts an ended run again.
                current["status"] = was
                current["worker"] = (before or {}).get("worker", "")
            if current.get("status") != "parked":
                current.pop("waits_on", None)  # what it waited on is answered, or moot
            current["updated"] = stamp()
            value = fit_summary(current, int(self.nc.max_payload))
            try:
                if entry is None:
                    await kv.create(run, value)
                else:
                    await kv.update(run, value, last=entry.revision)
            except _electing():
                if time.monotonic() > patience:
                    raise
                await asyncio.sleep(0.25)
                continue  # it may have landed: read it again and merge
            except (nats.js.errors.KeyWrongLastSequenceError, nats.js.errors.APIError):
                races += 1
                continue  # changed in between: merge again
            await self._announce(before, current)
            return current
        raise FleetError(
            f"the summary of run {run} kept changing under this update",
            hint="try again; the run itself is not affected",
        )

    async def runs(self) -> list[dict[str, Any]]:
        """Every run's summary, newest first, in one pass over the bucket (a KV watch)."""
        from keel.fleet.view import read_summaries

        return await read_summaries(await self.kv())

    async def _announce(self, before: dict[str, Any] | None, after: dict[str, Any]) -> None:
        """A run parked or ended: its event on `keel.events.<run>`, and a POST to its webhook
        (`keel submit --notify`) in the background. Best effort: a failure is said, never
        raised (the summary is what counts)."""
        from keel.fleet.view import event, post_webhook

        body = event(before, after)
        if body is None:
            return
        run = str(after.get("id", ""))
        try:
            await self.nc.publish(
                f"{streams.EVENTS_PREFIX}.{run}", json.dumps(body, separators=(",", ":")).encode()
            )
        except Exception as exc:  # nats-py: the connection is closing or reconnecting
            self.say(f"run {run}: its {body['status']} event was not published ({exc!r})")
        request = after.get("request")
        url = request.get("notify") if isinstance(request, dict) else None
        if isinstance(url, str) and url:
            task = asyncio.create_task(post_webhook(url, body, self.say))
            self._notifying.add(task)
            task.add_done_callback(self._notifying.discard)

    # -- the queue ----------------------------------------------------------------------------

    async def enqueue(self, req: RunRequest, msg_id: str) -> None:
        """Queue `req` on its route (its priority and needs: keel/fleet/queues.py)."""
        from keel.fleet.queues import Route

        route = Route.of(req.priority, req.needs)
        patience = time.monotonic() + ELECTION_WAIT
        while True:
            try:
                # The message id makes a publish asked again after a lost answer land once.
                headers = {"Nats-Msg-Id": msg_id}
                await self.js.publish(route.subject, req.to_bytes(), headers=headers)
                return
            except Exception as exc:
                # No answer is either no stream (the fleet was never set up on this server:
                # say so now) or a stream electing its leader (a node lost, or streams created
                # a moment ago on a cluster): ask again until `ELECTION_WAIT`.
                if (
                    not isinstance(exc, _electing())
                    or time.monotonic() > patience
                    or not await self._has_stream(route.subject)
                ):
                    raise FleetError(
                        f"cannot queue run {req.run}: {type(exc).__name__}: {exc}",
                        hint="create the fleet's streams with `keel fleet init` "
                        "(or `keel fleet up`)",
                    ) from None
            await asyncio.sleep(0.25)

    async def _has_stream(self, subject: str) -> bool:
        """Whether a stream takes `subject`; True while the server cannot say (its meta leader
        electing), so the caller keeps waiting within its own patience."""
        import nats.js.errors

        try:
            await self.js.find_stream_name_by_subject(subject)
        except nats.js.errors.NotFoundError:
            return False
        except Exception:  # nats-py: the meta leader electing, a reconnect
            return True
        return True

    async def submit(self, req: RunRequest) -> dict[str, Any]:
        """Queue `req`; its summary first. A request too big for one message of this server is
        refused before anything is written."""
        from keel.fleet.queues import Route

        route = Route.of(req.priority, req.needs)
        req.priority, req.needs = route.priority, list(route.needs)
        self.check_fits(req)
        req.submitted = req.submitted or stamp()
        summary = await self.put_summary(
            req.run,
            status="queued",
            submitted=req.submitted,
            model=req.model or "",
            mode=req.mode or "",
            last_prompt=req.prompt.strip().splitlines()[0][:80] if req.prompt.strip() else "",
            workspace=req.workspace,
            request=asdict(req),
        )
        await self.enqueue(req, f"{req.run}-start")
        return summary

    def check_fits(self, req: RunRequest) -> None:
        """`UserError` when the request (and its summary, which carries it) cannot be one
        message: the server's max_payload, as it announced it (nats-py: 1 MiB until it has)."""
        limit = int(self.nc.max_payload)
        if len(req.to_bytes()) + SUMMARY_ROOM > limit:
            size = len(req.prompt.encode("utf-8"))
            raise UserError(
                f"the prompt is {size:,} bytes: too long for one message on the fleet's NATS "
                f"server (at most {limit:,} bytes, the run's request included)",
                hint="put the text in a file in the run's workspace (--workspace path:DIR or "
                "git:URL) and have the prompt name it",
            )

    async def queue_depth(self) -> tuple[int, int]:
        """(messages waiting or in flight on the queue, of which delivered and not acked)."""
        from keel.fleet.queues import in_flight

        info = await self.js.stream_info(streams.QUEUE_STREAM)
        # Every route's consumer (none before a worker started).
        return int(info.state.messages), await in_flight(self.js)

    # -- answers and cancels --------------------------------------------------------------------

    async def answer(
        self,
        run: str,
        request: str,
        allow: bool | None,
        reason: str = "",
        *,
        result: str | None = None,
        is_error: bool = False,
    ) -> None:
        """Answer what a parked run waits for (a question: `allow`; a tool that answers later:
        its `result`), and queue the run to go on, on any worker."""
        summary = await self.summary(run)
        if summary is None:
            raise UserError(f"no run {run!r}", hint="`keel runs list` shows the runs")
        waits = summary.get("waits_on") or {}
        parked = summary.get("status") == "parked"
        if not parked or waits.get("request") != request:
            raise UserError(
                f"run {run} does not wait for {request!r} (it is {summary.get('status')}"
                + (f", waiting for {waits.get('request')}" if parked and waits else "")
                + ")",
                hint="`keel runs show RUN` says what a run waits for",
            )
        deferred = waits.get("waits_for") == "deferred"
        limit = int(self.nc.max_payload) - SUMMARY_ROOM
        if len((result or "").encode("utf-8")) + len(reason.encode("utf-8")) > limit:
            size = len((result or reason).encode("utf-8"))
            raise UserError(
                f"the answer is {size:,} bytes: too long for one message on the fleet's NATS "
                f"server (at most {limit:,} bytes)",
                hint="put the text in a file in the run's workspace and answer with its path",
            )
        if deferred and result is None:
            raise UserError(
                f"run {run} waits for the result of {waits.get('tool')} ({request}), not a "
                "permission",
                hint=f"keel runs answer {run} {request} --result TEXT [--error]",
            )
        if not deferred and allow is None:
            raise UserError(
                f"run {run} waits for a {waits.get('waits_for')} answer on {request}",
                hint=f"keel runs answer {run} {request} allow|deny [--reason TEXT]",
            )
        kv = await self.kv()
        from keel.session.records import now

        at = now()  # to the millisecond: the journal says how long the run waited
        answer = (
            {"result": result, "is_error": is_error, "at": at}
            if deferred
            else {"allow": allow, "reason": reason, "at": at}
        )
        import nats.js.errors

        try:  # the first answer wins; a second (another client, at the same moment) is refused
            await kv.create(f"{run}.answer.{request}", json.dumps(answer).encode())
        except nats.js.errors.KeyWrongLastSequenceError:
            raise UserError(
                f"run {run}: {request} was answered already",
                hint="`keel runs show RUN` shows the run as it is now",
            ) from None
        await self.put_summary(run, status="queued")
        req = self._follow_up(run, summary, "answer")
        await self.enqueue(req, f"{run}-answer-{request}")

    @staticmethod
    def _follow_up(run: str, summary: Mapping[str, Any], why: str) -> RunRequest:
        """A message that only names the run (an answer, a cancel, a retry), on the run's own
        route: only a worker that can serve the run takes it."""
        from keel.fleet.queues import Route

        route = Route.of_request(summary.get("request"))
        return RunRequest(run, "", why=why, priority=route.priority, needs=list(route.needs))

    async def original(self, req: RunRequest) -> RunRequest:
        """The run's request as submitted, for a message that only names the run (an answer,
        a cancel): the workspace, model and limits come from there."""
        if req.why == "start":
            return req
        summary = await self.summary(req.run) or {}
        first = summary.get("request")
        if not isinstance(first, dict):
            return req
        known = set(RunRequest.__dataclass_fields__)
        return RunRequest(**{**{k: v for k, v in first.items() if k in known}, "why": req.why})

    async def get_answer(self, run: str, request: str) -> dict[str, Any] | None:
        return await self._get(f"{run}.answer.{request}")

    async def cancel(self, run: str) -> dict[str, Any]:
        summary = await self.summary(run)
        if summary is None:
            raise UserError(f"no run {run!r}", hint="`keel runs list` shows the runs")
        if summary.get("status") not in ACTIVE:
            return summary
        kv = await self.kv()
        await kv.put(f"{run}.cancel", b"1")
        await self.nc.publish(f"{streams.CONTROL_PREFIX}.{run}", b"cancel")
        if summary.get("status") == "parked":  # nobody runs it: a worker closes it
            await self.enqueue(self._follow_up(run, summary, "cancel"), f"{run}-cancel")
        return await self.put_summary(run, cancel_requested=True)

    async def retry(self, run: str) -> dict[str, Any]:
        """Queue a run that ended `failed` or `error` again: its lost and refused counts start
        over (the attempt log stays), and a worker resumes it from its journal (or starts it,
        when it has none). Refuses a run in any other state."""
        summary = await self.summary(run)
        if summary is None:
            raise UserError(f"no run {run!r}", hint="`keel runs list` shows the runs")
        status = summary.get("status")
        if status not in RETRYABLE:
            hint = (
                "it may still finish: `keel runs wait RUN`, or stop it with `keel runs cancel`"
                if status in ACTIVE
                else "submit it again with `keel submit`"
            )
            raise UserError(f"run {run} is {status}: only a failed run can be retried", hint=hint)
        retries = int(summary.get("retries") or 0) + 1
        changed = await self.put_summary(
            run,
            status="queued",
            lost=0,
            lost_in_a_row=0,
            refused=[],
            error="",
            note=f"retried by hand ({stamp()})",
            retries=retries,
        )
        # A fresh message id: the first request's id is still in the duplicate window.
        await self.enqueue(self._follow_up(run, summary, "retry"), f"{run}-retry-{retries}")
        return changed

    async def cancelled(self, run: str) -> bool:
        import nats.js.errors

        kv = await self.kv()
        try:
            entry = await kv.get(f"{run}.cancel")
        except nats.js.errors.KeyNotFoundError:
            return False
        return bool(entry.value)

    async def wait(self, runs: list[str], limit: float | None) -> list[dict[str, Any]]:
        """Return once every run in `runs` (all runs when empty, and the queue drained) is over
        or parked; `UserError` after `limit` seconds."""
        deadline = None if limit is None else time.monotonic() + limit
        while True:
            if runs:
                found = [await self.summary(r) for r in runs]
                missing = [r for r, s in zip(runs, found, strict=True) if s is None]
                if missing:
                    raise UserError(f"no run {missing[0]!r}", hint="`keel runs list` shows them")
                summaries = [s for s in found if s is not None]
                busy = [s for s in summaries if s.get("status") in ("queued", "running")]
            else:
                summaries = await self.runs()
                busy = [s for s in summaries if s.get("status") in ("queued", "running")]
                if not busy and (await self.queue_depth())[0]:
                    busy = summaries[:1] or [{}]  # messages not yet taken
            if not busy:
                return summaries
            if deadline is not None and time.monotonic() > deadline:
                raise UserError(
                    f"{len(busy)} run(s) still queued or running after {limit:g} s",
                    hint="are workers running? `keel worker` takes runs from the queue",
                )
            await asyncio.sleep(0.2)
