"""`keel schedules list|show|rm`, and what `keel submit --at/--every` stores (docs/fleet.md,
"Scheduled and recurring runs"). The schedules live in the fleet's `keel-schedules` bucket;
workers fire them (keel/fleet/schedules.py). A SCHEDULE argument is an id or a unique prefix.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from keel.cli.main import _Parser
from keel.errors import UserError
from keel.fleet.connect import resolve_url

if TYPE_CHECKING:
    from keel.fleet.runs import Fleet, RunRequest
    from keel.fleet.schedules import Schedule, When

OVERDUE_NOTE = "overdue: no worker has fired it"


def add_schedule_options(p: argparse.ArgumentParser) -> None:
    """`keel submit`'s options for a later or recurring run."""
    p.add_argument(
        "--at",
        metavar="TIME",
        help="queue the run at TIME instead of now: ISO 8601 (2026-12-24T06:00 is local time, "
        "or --tz's; 06:00Z and 06:00+01:00 carry their zone) or from now (+30m, +2h, +1d); "
        "prints the schedule's id",
    )
    p.add_argument(
        "--every",
        metavar="CRON",
        help="queue a run at every firing of a cron expression ('0 3 * * mon-fri', "
        "'*/15 * * * *', @hourly, @daily, @weekly, @monthly, @yearly), in UTC unless --tz; "
        "prints the schedule's id. Workers fire schedules: none fires while no worker is up",
    )
    p.add_argument("--tz", metavar="ZONE", help="the time zone of --every and a bare --at time")


@dataclass(frozen=True)
class Planned:
    """A `keel submit` that stores a schedule instead of queueing a run."""

    when: When
    now: datetime

    async def store(self, fleet: Fleet, req: RunRequest, *, as_json: bool) -> int:
        from keel.fleet.schedules import Schedules, make

        w = self.when
        schedule = make(req, at=w.at, every=w.every, tz=w.tz, now=self.now)
        await Schedules(fleet).add(schedule)
        print(json.dumps(schedule.to_json()) if as_json else schedule.id)
        if not as_json:
            print(f"keel: {schedule.when()}, first at {schedule.next}", file=sys.stderr)
        return 0


def planned(args: argparse.Namespace, now: datetime | None = None) -> Planned | None:
    """What `--at`, `--every` and `--tz` ask for, checked before anything is sent (a time in
    the past, a bad cron field, an unknown zone: one line each); None without them."""
    from keel.fleet.schedules import when

    if args.at is None and args.every is None:
        if args.tz:
            raise UserError("--tz is for --at or --every", hint="drop --tz, or add --at/--every")
        return None
    if args.wait:
        raise UserError(
            "--wait cannot wait for a scheduled run",
            hint="`keel schedules show ID` says its last run; `keel runs wait RUN` waits for it",
        )
    now = now or datetime.now(UTC)
    return Planned(when(args.at, args.every, args.tz, now=now), now)


# -- keel schedules ---------------------------------------------------------------------------------


def schedules_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="keel schedules",
        description="The fleet's scheduled and recurring runs (`keel submit --at/--every`). "
        "Workers fire them: while no worker is up, nothing fires (docs/fleet.md).",
    )
    p.add_argument("--nats", metavar="URL", help="the fleet's NATS server (default: KEEL_NATS_URL)")
    p.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    ls = sub.add_parser("list", help="every schedule: when, next firing, fired, last run")
    ls.add_argument("--json", action="store_true")
    show = sub.add_parser("show", help="one schedule, with its run request")
    show.add_argument("schedule", help="a schedule id or a unique prefix")
    show.add_argument("--json", action="store_true")
    rm = sub.add_parser("rm", help="remove a schedule: it fires no more")
    rm.add_argument("schedule", help="a schedule id or a unique prefix")
    return p


def _next(schedule: Schedule, now: datetime) -> str:
    from keel.fleet.schedules import overdue

    return schedule.next + (f" ({OVERDUE_NOTE})" if overdue(schedule, now) else "")


def _table(schedules: list[Schedule], now: datetime) -> str:
    if not schedules:
        return "no schedules"
    rows = [
        (
            s.id,
            s.when(),
            _next(s, now),
            str(s.fired),
            s.last_run or "-",
            s.prompt()[:50],
        )
        for s in schedules
    ]
    head = ("SCHEDULE", "WHEN", "NEXT", "FIRED", "LAST RUN", "PROMPT")
    widths = [max(len(r[i]) for r in (head, *rows)) for i in range(5)]
    return "\n".join(
        ("  ".join(f"{r[i]:<{widths[i]}}" for i in range(5)) + f"  {r[5]}").rstrip()
        for r in (head, *rows)
    )


def _show(schedule: Schedule, now: datetime) -> str:
    lines = []
    for key, value in schedule.to_json().items():
        if key == "next":
            value = _next(schedule, now)
        if value is None:
            continue
        lines.append(f"{key}: {json.dumps(value) if isinstance(value, dict | list) else value}")
    return "\n".join(lines)


def schedules(argv: list[str]) -> int:
    from keel.fleet.runs import Fleet
    from keel.fleet.schedules import Schedules

    args = schedules_parser().parse_args(argv)

    async def go() -> int:
        fleet = await Fleet.open(resolve_url(given=args.nats or ""))
        try:
            return await _command(Schedules(fleet), args)
        finally:
            await fleet.close()

    return asyncio.run(go())


async def _command(store: Any, args: argparse.Namespace) -> int:
    now = datetime.now(UTC)
    if args.command == "list":
        found = await store.all()
        if args.json:
            print(json.dumps([s.to_json() for s in found]))
        else:
            print(_table(found, now))
        return 0
    schedule_id = await store.resolve(args.schedule)
    if args.command == "show":
        schedule = await store.get(schedule_id)
        if schedule is None:
            raise UserError(f"no schedule {schedule_id!r}", hint="`keel schedules list`")
        print(json.dumps(schedule.to_json()) if args.json else _show(schedule, now))
        return 0
    removed = await store.remove(schedule_id)
    print(f"schedule {removed.id} removed ({removed.when()}; it fired {removed.fired} time(s))")
    return 0
