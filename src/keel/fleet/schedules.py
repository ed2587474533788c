"""Scheduled and recurring fleet runs (`keel submit --at/--every`, `keel schedules`).

A schedule is one entry in the KV bucket `keel-schedules`, key = its id (`sch-<12 hex>`): the run
request to queue (without a run id), `at` (a one-shot time) or `every` (a cron expression, in
`tz`), `next` (the UTC time of the next firing) and what has fired so far. Nothing fires a
schedule but a worker: each `keel worker` runs a `Scheduler`, which reads the bucket about once
a second and, for each schedule that is due, moves it on with a compare-and-swap on the entry's
revision; the one worker whose swap lands queues the run through `Fleet.submit`, with the run id
`<schedule>-<YYYYmmddHHMM>` of the firing time (so a retried submit is the same run, and the
queue's message id with it). A one-shot schedule's entry is deleted when it fires. A recurring
one that missed firings (no worker was up) fires once, for the latest missed time, then goes on
from the next time after now. A firing is at most once: a worker that dies between winning the
swap and queueing the run loses that one firing (it is not queued twice); a worker that stops
cleanly finishes the pass in progress first.

This module decides when; it never runs anything itself. nats-py is imported inside functions.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import re
import secrets
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta, tzinfo
from typing import TYPE_CHECKING, Any

from keel.errors import UserError
from keel.fleet import streams
from keel.fleet.cron import Cron
from keel.frozen import mutable

if TYPE_CHECKING:
    from nats.js.kv import KeyValue

    from keel.fleet.runs import Fleet, RunRequest

PREFIX = "sch-"
#: Seconds between a worker's looks at the bucket (each wait drawn from 0.5x to 1.5x of it).
TICK = 1.0
#: Seconds past `next` after which `keel schedules list` says no worker has fired a schedule.
OVERDUE = 120.0
#: Submits tried for a firing the worker won (each is the same run: the retries cannot queue
#: it twice).
SUBMIT_TRIES = 3
LIST_HINT = "`keel schedules list` shows the schedules and their ids"
_ID = re.compile(r"^sch-[0-9a-f]{1,12}$")
_RELATIVE = re.compile(r"^\+(\d+)\s*([smhdw])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
AT_HINT = (
    "an ISO 8601 time (2026-12-24T06:00, local time unless it has a zone: 06:00Z, 06:00+01:00) "
    "or a time from now: +30m, +2h, +1d"
)


def new_id() -> str:
    return PREFIX + secrets.token_hex(6)


def iso(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_iso(text: str) -> datetime:
    when = datetime.fromisoformat(text)
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def zone(name: str | None) -> tzinfo:
    """The zone `name` names (an IANA name such as Europe/Paris); UTC for None."""
    if not name or name.upper() == "UTC":
        return UTC
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        hint = "an IANA name such as Europe/Paris, America/New_York or UTC"
        if not available_timezones():
            hint = "this machine has no time zone database: install the tzdata package, or use UTC"
        raise UserError(f"unknown time zone {name!r}", hint=hint) from None


def parse_at(text: str, *, now: datetime, tz: tzinfo | None = None) -> datetime:
    """The UTC time `--at TEXT` names: ISO 8601 (naive: local time, or `tz` when given) or
    `+N` s/m/h/d/w from `now`. A time not after `now` is refused."""
    text = text.strip()
    relative = _RELATIVE.match(text)
    if relative:
        when = now + timedelta(**{_UNITS[relative.group(2)]: int(relative.group(1))})
    else:
        try:
            parsed = datetime.fromisoformat(text)
        except ValueError:
            raise UserError(f"--at {text!r} is not a time", hint=AT_HINT) from None
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=tz) if tz is not None else parsed.astimezone()
        when = parsed
    when = when.astimezone(UTC)
    if when <= now:
        raise UserError(
            f"--at {text!r} is in the past ({iso(when)}; it is now {iso(now)})",
            hint="give a later time, or +10m for ten minutes from now",
        )
    return when


@dataclass(frozen=True)
class When:
    """When a schedule fires: once `at`, or `every` firing of a cron expression (in `tz`)."""

    at: datetime | None
    every: str | None
    tz: str | None


def when(at: str | None, every: str | None, tz: str | None, *, now: datetime) -> When:
    """`--at`, `--every` and `--tz` (or a request's `at`, `every`, `tz`) checked: one of the
    first two, a time after `now`, a cron expression that parses and fires, a known zone."""
    if at is not None and every is not None:
        raise UserError(
            "--at and --every cannot be used together",
            hint="--at TIME for one run later, --every CRON for a recurring run",
        )
    if at is None and every is None:
        raise UserError(
            "a schedule needs --at TIME or --every CRON", hint="e.g. --at +30m or --every @daily"
        )
    tzinfo_ = zone(tz) if tz else None
    if every is not None:
        Cron.parse(every).next_after(now, tzinfo_ or UTC)  # a bad field, or it never fires
        return When(None, every.strip(), tz or None)
    assert at is not None
    return When(parse_at(at, now=now, tz=tzinfo_), None, tz or None)


@mutable
class Schedule:
    """One schedule (the JSON value of its entry)."""

    id: str
    #: The run request to queue (RunRequest's fields, without `run` and `submitted`).
    request: dict[str, Any]
    next: str
    at: str | None = None
    every: str | None = None
    tz: str | None = None
    created: str = ""
    fired: int = 0
    last_fired: str | None = None
    last_run: str | None = None
    last_error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        extra = d.pop("extra")
        return {**extra, **d}

    def to_bytes(self) -> bytes:
        return json.dumps(self.to_json(), separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Schedule:
        d = json.loads(data)
        if not isinstance(d, dict) or not isinstance(d.get("request"), dict):
            raise ValueError("not a schedule")
        known = set(cls.__dataclass_fields__) - {"extra"}
        extra = {k: v for k, v in d.items() if k not in known}
        return cls(**{k: v for k, v in d.items() if k in known}, extra=extra)

    def cron(self) -> Cron | None:
        return Cron.parse(self.every) if self.every else None

    def when(self) -> str:
        if self.every:
            return f"every {self.every}" + (f" ({self.tz})" if self.tz else "")
        return f"at {self.at}"

    def prompt(self) -> str:
        text = str(self.request.get("prompt", "")).strip()
        return text.splitlines()[0] if text else ""


def make(
    req: RunRequest,
    *,
    at: datetime | None = None,
    every: str | None = None,
    tz: str | None = None,
    now: datetime,
) -> Schedule:
    """A new schedule for `req` (its run id is not kept: each firing gets its own); `at` or
    `every` as `when` checked them."""
    if (at is None) == (every is None):
        raise ValueError("a schedule has either `at` or `every`")
    request = {k: v for k, v in asdict(req).items() if k not in ("run", "submitted")}
    if at is not None:
        first = at
    else:
        assert every is not None
        first = Cron.parse(every).next_after(now, zone(tz))
    return Schedule(
        new_id(),
        request,
        next=iso(first),
        at=None if at is None else iso(at),
        every=every.strip() if every else None,
        tz=tz or None,
        created=iso(now),
    )


def run_id(schedule: str, fire: datetime) -> str:
    """The run a firing queues: the same for every worker that considers that firing."""
    return f"{schedule}-{fire.astimezone(UTC):%Y%m%d%H%M}"


@dataclass(frozen=True)
class Firing:
    """What firing a due schedule does: queue `run` for `time`, then store `after` (None: the
    entry goes, a one-shot schedule that fired)."""

    time: datetime
    run: str
    after: Schedule | None


def due(schedule: Schedule, now: datetime) -> Firing | None:
    """The firing of `schedule` at `now`, or None when it is not due."""
    first = parse_iso(schedule.next)
    if first > now:
        return None
    cron = schedule.cron()
    if cron is None:
        return Firing(first, run_id(schedule.id, first), None)
    tz = zone(schedule.tz)
    fire = cron.latest(first, now, tz)  # missed ones fire once, as the latest
    run = run_id(schedule.id, fire)
    after = Schedule.from_bytes(schedule.to_bytes())
    after.next = iso(cron.next_after(now, tz))
    after.fired += 1
    after.last_fired = iso(fire)
    after.last_run = run
    after.last_error = None
    return Firing(fire, run, after)


def overdue(schedule: Schedule, now: datetime) -> bool:
    return (now - parse_iso(schedule.next)).total_seconds() > OVERDUE


def check_id(schedule: str) -> str:
    """A whole schedule id (`sch-` and 12 hex digits)."""
    if not _ID.match(schedule) or len(schedule) != len(PREFIX) + 12:
        raise UserError(f"{schedule!r} is not a schedule id", hint=LIST_HINT)
    return schedule


class Schedules:
    """The `keel-schedules` bucket, through a `Fleet`'s connection."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self._kv: KeyValue | None = None

    async def kv(self) -> KeyValue:
        """The bucket; made when missing (a fleet initialised before schedules existed), with
        as many replicas as the runs' bucket."""
        if self._kv is not None:
            return self._kv
        from nats.js.errors import BucketNotFoundError, NotFoundError

        js = self.fleet.js
        try:
            self._kv = await js.key_value(streams.SCHEDULES_BUCKET)
        except (BucketNotFoundError, NotFoundError):
            from keel.fleet.setup import ensure_bucket

            runs = await self.fleet.kv()  # a clear error when there is no fleet here at all
            replicas = (await runs.status()).stream_info.config.num_replicas or 1
            await ensure_bucket(js, streams.SCHEDULES_BUCKET, replicas=replicas)
            self._kv = await js.key_value(streams.SCHEDULES_BUCKET)
        return self._kv

    async def add(self, schedule: Schedule) -> Schedule:
        self.fleet.check_fits(_request(schedule, run_id(schedule.id, parse_iso(schedule.next))))
        kv = await self.kv()
        await kv.create(schedule.id, schedule.to_bytes())
        return schedule

    async def entries(self) -> list[tuple[Schedule, int]]:
        """Every schedule with its entry's revision, by id: one watch over the bucket."""
        kv = await self.kv()
        from keel.fleet.view import bucket_entries

        out: list[tuple[Schedule, int]] = []
        for entry in await bucket_entries(kv):
            try:
                out.append((Schedule.from_bytes(entry.value), int(entry.revision or 0)))
            except (ValueError, TypeError):
                continue  # not a schedule: someone else wrote it
        return sorted(out, key=lambda e: e[0].id)

    async def all(self) -> list[Schedule]:
        return [s for s, _ in await self.entries()]

    async def get(self, schedule: str) -> Schedule | None:
        import nats.js.errors

        kv = await self.kv()
        try:
            entry = await kv.get(schedule)
        except nats.js.errors.KeyNotFoundError:
            return None
        return Schedule.from_bytes(entry.value) if entry.value else None

    async def resolve(self, given: str) -> str:
        """The id `given` names: that id or a unique prefix of one (`sch-` may be left out)."""
        prefix = given if given.startswith(PREFIX) else PREFIX + given
        if not _ID.match(prefix):
            raise UserError(f"{given!r} is not a schedule id", hint=LIST_HINT)
        ids = [s.id for s in await self.all() if s.id.startswith(prefix)]
        if prefix in ids or len(ids) == 1:
            return prefix if prefix in ids else ids[0]
        if not ids:
            raise UserError(
                f"no schedule {given!r}",
                hint="a one-shot schedule is gone once it fired (its run is "
                "`keel runs show sch-…`); " + LIST_HINT,
            )
        raise UserError(
            f"schedule id prefix {given!r} is ambiguous: {', '.join(ids[:5])}",
            hint="give more of the id",
        )

    async def remove(self, schedule: str) -> Schedule:
        found = await self.get(schedule)
        if found is None:
            raise UserError(f"no schedule {schedule!r}", hint=LIST_HINT)
        kv = await self.kv()
        await kv.purge(schedule)
        return found

    async def fire_due(
        self, now: datetime | None = None, *, say: Callable[[str], None] | None = None
    ) -> list[str]:
        """Fire every schedule due at `now` that this caller wins; returns the runs queued."""
        import nats.js.errors

        say = say or (lambda _line: None)
        now = now or datetime.now(UTC)
        kv = await self.kv()
        fired: list[str] = []
        for schedule, revision in await self.entries():
            try:
                firing = due(schedule, now)
            except UserError as exc:  # written by hand, or by a newer keel
                say(f"schedule {schedule.id}: {exc.one_line()}")
                continue
            if firing is None:
                continue
            try:
                if firing.after is None:
                    await kv.delete(schedule.id, last=revision)
                else:
                    await kv.update(schedule.id, firing.after.to_bytes(), last=revision)
            except (nats.js.errors.KeyWrongLastSequenceError, nats.js.errors.APIError):
                continue  # another worker fired it (or it was removed) first
            if await self._queue(schedule, firing, say):
                fired.append(firing.run)
        return fired

    async def _queue(self, schedule: Schedule, firing: Firing, say: Callable[[str], None]) -> bool:
        req = _request(schedule, firing.run)
        error = ""
        for attempt in range(SUBMIT_TRIES):
            try:
                await self.fleet.submit(req)
                say(f"schedule {schedule.id} fired: run {firing.run}")
                return True
            except UserError as exc:  # the request itself: no retry mends it
                error = exc.one_line()
                break
            except Exception as exc:  # NATS trouble: the same submit again is the same run
                error = f"{type(exc).__name__}: {exc}"
                await asyncio.sleep(0.5 * (attempt + 1))
        say(f"schedule {schedule.id}: could not queue run {firing.run}: {error}")
        if firing.after is not None:
            with contextlib.suppress(Exception):  # best effort: the run is what counts
                await self._note_error(schedule.id, error)
        return False

    async def _note_error(self, schedule: str, error: str) -> None:
        import nats.js.errors

        kv = await self.kv()
        for _ in range(5):
            entry = await kv.get(schedule)
            if not entry.value:
                return
            current = Schedule.from_bytes(entry.value)
            current.last_error = error[:500]
            try:
                await kv.update(schedule, current.to_bytes(), last=entry.revision)
                return
            except nats.js.errors.KeyWrongLastSequenceError:
                continue


def _request(schedule: Schedule, run: str) -> RunRequest:
    from keel.fleet.runs import RunRequest

    known = set(RunRequest.__dataclass_fields__)
    fields = {k: v for k, v in schedule.request.items() if k in known}
    return RunRequest(**{**fields, "run": run, "submitted": "", "why": "start"})


class Scheduler:
    """A worker's scheduler: a task that fires what is due about every `tick` seconds (jittered,
    so workers do not all look at once) until `stop`. A failed look is said once per distinct
    error and tried again at the next tick."""

    def __init__(
        self, fleet: Fleet, *, say: Callable[[str], None] | None = None, tick: float = TICK
    ) -> None:
        self.schedules = Schedules(fleet)
        self.say = say or (lambda _line: None)
        self.tick = tick
        self._halt = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> Scheduler:
        self._task = asyncio.create_task(self._run())
        return self

    async def stop(self, wait: float = 10.0) -> None:
        """Stop once the pass in progress is over (a firing it won is queued, not lost);
        cancel it after `wait` seconds."""
        self._halt.set()
        if self._task is not None:
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(self._task, wait)

    async def _run(self) -> None:
        last_error = ""
        while not self._halt.is_set():
            try:
                await self.schedules.fire_due(say=self.say)
                last_error = ""
            except Exception as exc:  # the scheduler must outlive a NATS hiccup; it says why
                error = (
                    exc.one_line() if isinstance(exc, UserError) else f"{type(exc).__name__}: {exc}"
                )
                if error != last_error:
                    self.say(f"schedules: {error}; trying again")
                last_error = error
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._halt.wait(), self.tick * random.uniform(0.5, 1.5))
