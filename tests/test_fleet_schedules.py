"""Scheduled and recurring fleet runs: the cron parser's next firings (a table), `--at` times,
and on a real nats-server: a due schedule fires once across three workers and its run completes,
a recurring one fires again at its next time (an injected clock), missed firings fire once, and
`keel schedules rm` stops it."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from keel.errors import UserError
from keel.fleet.cron import Cron
from keel.fleet.runs import Fleet, RunRequest
from keel.fleet.schedules import (
    Schedule,
    Scheduler,
    Schedules,
    due,
    make,
    parse_at,
    parse_iso,
)
from tests.fleet_helpers import WorkerProc, keel, keel_json, script, setup_fleet, wait_for
from tests.nats_fixture import nats_server, nats_url  # noqa: F401


def t(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


# -- the cron parser --------------------------------------------------------------------------

NEXT_FIRINGS: list[tuple[str, str, str | None, list[str]]] = [
    # expression, after (UTC), zone, the next firings (UTC)
    ("* * * * *", "2026-12-03 05:07:30", None, ["05:08", "05:09", "05:10"]),
    ("*/15 * * * *", "2026-12-03 05:07", None, ["05:15", "05:30", "05:45"]),
    ("0 * * * *", "2026-12-03 05:00", None, ["06:00", "07:00", "08:00"]),
    ("5,35 1-2 * * *", "2026-12-03 00:00", None, ["01:05", "01:35", "02:05", "02:35", "+1 01:05"]),
    ("0-30/10 9 * * *", "2026-12-03 09:05", None, ["09:10", "09:20", "09:30", "+1 09:00"]),
    ("5/20 0 * * *", "2026-12-03 00:00", None, ["00:05", "00:25", "00:45", "+1 00:05"]),
    ("@hourly", "2026-12-03 05:59:59", None, ["06:00", "07:00"]),
    ("@daily", "2026-12-03 05:00", None, ["+1 00:00", "+1 00:00"]),
    ("@midnight", "2026-12-31 23:59", None, ["2027-01-01 00:00"]),
    ("@weekly", "2026-12-03 05:00", None, ["2026-12-06 00:00", "2026-12-13 00:00"]),  # Sundays
    ("@monthly", "2026-12-03 05:00", None, ["2027-01-01 00:00", "2027-02-01 00:00"]),
    ("@yearly", "2026-12-03 05:00", None, ["2027-01-01 00:00", "2028-01-01 00:00"]),
    # Names, in either case; 7 is Sunday too.
    ("0 3 * * MON-fri", "2026-12-04 04:00", None, ["2026-12-07 03:00", "2026-12-08 03:00"]),
    ("0 0 * * 7", "2026-12-03 00:00", None, ["2026-12-06 00:00", "2026-12-13 00:00"]),
    ("0 0 1 jan,jul *", "2026-12-03 00:00", None, ["2027-01-01 00:00", "2027-07-01 00:00"]),
    # Both day fields restricted: either matches (the 1st, and every Monday).
    (
        "0 0 1 * mon",
        "2026-12-26 00:00",
        None,
        ["2026-12-28 00:00", "2027-01-01 00:00", "2027-01-04 00:00"],
    ),
    # One of them `*` (a step too): both must match, i.e. the other alone decides.
    ("0 0 */1 * mon", "2026-12-26 00:00", None, ["2026-12-28 00:00", "2027-01-04 00:00"]),
    ("0 0 13 * *", "2026-12-14 00:00", None, ["2027-01-13 00:00", "2027-02-13 00:00"]),
    # Day 31 skips short months; 29 February waits for a leap year.
    ("0 0 31 * *", "2026-12-31 00:00", None, ["2027-01-31 00:00", "2027-03-31 00:00"]),
    ("0 0 29 2 *", "2026-12-03 00:00", None, ["2028-02-29 00:00", "2032-02-29 00:00"]),
    # A zone: 09:00 in Paris is 08:00 UTC in winter, 07:00 in summer.
    ("0 9 * * *", "2026-03-28 12:00", "Europe/Paris", ["2026-03-29 07:00", "2026-03-30 07:00"]),
    # A wall time the spring change skips fires an hour later; a repeated one fires once.
    ("30 2 * * *", "2026-03-07 12:00", "America/New_York", ["2026-03-08 07:30", "+1 06:30"]),
    ("30 1 * * *", "2026-10-31 12:00", "America/New_York", ["2026-11-01 05:30", "+1 06:30"]),
]


def _expected(after: datetime, texts: list[str]) -> list[datetime]:
    out: list[datetime] = []
    for text in texts:
        base = out[-1] if out else after
        if text.startswith("+"):
            days, hm = text[1:].split()
            day = base.date() + timedelta(days=int(days))
            out.append(t(f"{day} {hm}"))
        elif len(text) == 5:  # HH:MM the same day as the first
            out.append(t(f"{after.date()} {text}"))
        else:
            out.append(t(text))
    return out


@pytest.mark.parametrize(("expr", "after", "tz", "firings"), NEXT_FIRINGS)
def test_cron_next_firings(expr: str, after: str, tz: str | None, firings: list[str]) -> None:
    cron = Cron.parse(expr)
    zone = ZoneInfo(tz) if tz else UTC
    when = t(after)
    got = []
    for _ in firings:
        when = cron.next_after(when, zone)
        got.append(when)
    assert got == _expected(t(after), firings)


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("* * * *", "cron expression '* * * *' has 4 field(s), not 5"),
        ("* * * * * *", "has 6 field(s), not 5"),
        ("60 * * * *", "cron field 1 (minute) '60': 60 is outside 0-59"),
        ("0 24 * * *", "cron field 2 (hour) '24': 24 is outside 0-23"),
        ("0 0 0 * *", "cron field 3 (day-of-month) '0': 0 is outside 1-31"),
        ("0 0 * foo *", "cron field 4 (month) 'foo': 'foo' is not a number 1-12 or a name"),
        ("0 0 * * 8", "cron field 5 (day-of-week) '8': 8 is outside 0-7"),
        ("*/0 * * * *", "cron field 1 (minute) '*/0': step '0' is not a whole number above 0"),
        ("5-1 * * * *", "cron field 1 (minute) '5-1': range '5-1' runs backwards"),
        ("1,,2 * * * *", "cron field 1 (minute) '1,,2': an empty list item"),
        ("0 0 * * mon-", "cron field 5 (day-of-week) 'mon-': '' is not a number 0-7"),
        ("@often", "unknown cron macro '@often'"),
    ],
)
def test_bad_cron_refused_naming_the_field(expr: str, message: str) -> None:
    with pytest.raises(UserError) as caught:
        Cron.parse(expr)
    assert message in caught.value.message
    assert "\n" not in caught.value.one_line()
    assert "minute hour day-of-month month day-of-week" in caught.value.hint


def test_cron_that_never_fires_is_refused() -> None:
    with pytest.raises(UserError, match="'0 0 30 2 \\*' never fires"):
        Cron.parse("0 0 30 2 *").next_after(t("2026-12-03 00:00"))


def test_latest_missed_firing() -> None:
    cron = Cron.parse("*/5 * * * *")
    first = t("2026-01-01 00:00")
    assert cron.latest(first, t("2026-12-03 05:07:30")) == t("2026-12-03 05:05")
    assert cron.latest(first, first) == first
    assert Cron.parse("0 0 1 * *").latest(first, t("2026-12-03 05:00")) == t("2026-12-01 00:00")


# -- --at -----------------------------------------------------------------------------------------

NOW = t("2026-12-03 05:00")


def test_at_times() -> None:
    assert parse_at("+10m", now=NOW) == t("2026-12-03 05:10")
    assert parse_at("+2h", now=NOW) == t("2026-12-03 07:00")
    assert parse_at("+1d", now=NOW) == t("2026-12-04 05:00")
    assert parse_at("2026-12-03T06:00Z", now=NOW) == t("2026-12-03 06:00")
    assert parse_at("2026-12-03T08:00+01:00", now=NOW) == t("2026-12-03 07:00")
    paris = ZoneInfo("Europe/Paris")
    assert parse_at("2026-12-03T08:00", now=NOW, tz=paris) == t("2026-12-03 07:00")
    naive = datetime(2026, 12, 4, 8, 0).astimezone()  # a bare time is local time
    assert parse_at("2026-12-04T08:00", now=NOW) == naive.astimezone(UTC)
    for bad, message in (
        ("2026-12-03T04:59Z", "--at '2026-12-03T04:59Z' is in the past (2026-12-03T04:59:00Z"),
        ("+0m", "is in the past"),
        ("tomorrow", "--at 'tomorrow' is not a time"),
        ("+5y", "--at '+5y' is not a time"),
    ):
        with pytest.raises(UserError) as caught:
            parse_at(bad, now=NOW)
        assert message in caught.value.message


def test_submit_at_in_the_past_is_refused_in_one_line(tmp_path: Path) -> None:
    out = keel(
        "submit",
        "--nats",
        "nats://127.0.0.1:9",  # never reached: refused before anything is sent
        "--at",
        "2020-01-01T00:00Z",
        "--model",
        "scripted:demo",
        "--workspace",
        "none",
        "hello",
    )
    assert out.returncode != 0
    assert out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "--at '2020-01-01T00:00Z' is in the past" in lines[0]
    for args, message in (
        (["--every", "61 * * * *"], "cron field 1 (minute) '61'"),
        (["--every", "@daily", "--at", "+1h"], "--at and --every cannot be used together"),
        (["--every", "@daily", "--wait"], "--wait cannot wait for a scheduled run"),
        (["--every", "@daily", "--tz", "Mars/Olympus"], "unknown time zone 'Mars/Olympus'"),
        (["--tz", "UTC"], "--tz is for --at or --every"),
    ):
        out = keel("submit", "--nats", "nats://127.0.0.1:9", *args, "--workspace", "none", "x")
        assert out.returncode != 0, (args, out)
        assert message in out.stderr, (args, out.stderr)
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr


# -- on a real server ------------------------------------------------------------------------------


@pytest.fixture
def fleet(nats_url: str) -> str:  # noqa: F811
    setup_fleet(nats_url)
    return nats_url


def _done_script(tmp: Path) -> str:
    return script(tmp / "done.json", [{"text": "scheduled run done"}])


def _request(model: str, prompt: str = "nightly triage") -> RunRequest:
    return RunRequest("unused", prompt, model=model, workspace={})


async def _open(url: str, n: int) -> list[Fleet]:
    return [await Fleet.open(url) for _ in range(n)]


async def _close(fleets: list[Fleet]) -> None:
    for f in fleets:
        await f.close()


@pytest.mark.needs("nats-server")
def test_schedule_fires_once_across_three_workers_and_its_run_completes(
    fleet: str, tmp_path: Path
) -> None:
    model = _done_script(tmp_path)
    workers = [WorkerProc(fleet, tmp_path / "scratch", f"w{i}") for i in range(3)]
    try:
        for w in workers:
            wait_for(lambda w=w: "takes runs" in w.log(), 60, f"{w.name} to start")
        out = keel(
            "submit",
            "--nats",
            fleet,
            "--at",
            "+2s",
            "--model",
            model,
            "--workspace",
            "none",
            "--json",
            "nightly triage",
        )
        assert out.returncode == 0, out
        entry = json.loads(out.stdout)
        sid = entry["id"]
        assert sid.startswith("sch-")
        assert len(sid) == 16
        assert entry["every"] is None
        assert entry["fired"] == 0
        assert entry["request"]["prompt"] == "nightly triage"
        assert "run" not in entry["request"]
        at = parse_iso(entry["at"])
        run = f"{sid}-{at:%Y%m%d%H%M}"

        def fired() -> bool:
            return any(f"schedule {sid} fired" in w.log() for w in workers)

        wait_for(fired, 30, "a worker to fire the schedule")
        waited = keel_json("runs", "--nats", fleet, "wait", run, "--timeout", "60", timeout=90)
        (summary,) = waited
        assert (summary["id"], summary["status"], summary["text"]) == (
            run,
            "completed",
            "scheduled run done",
        )
        # Exactly one worker fired it, once; the one-shot schedule is gone, and no other run
        # of it exists (two more ticks of every worker later).
        time.sleep(3)
        logs = [w.log() for w in workers]
        assert sum(log.count(f"schedule {sid} fired") for log in logs) == 1, logs
        assert keel_json("schedules", "--nats", fleet, "list") == []
        runs = keel_json("runs", "--nats", fleet, "list")
        assert [r["id"] for r in runs if r["id"].startswith(sid)] == [run]
    finally:
        for w in workers:
            w.terminate()
            w.close()


@pytest.mark.needs("nats-server")
def test_due_schedule_fires_once_across_three_schedulers(fleet: str, tmp_path: Path) -> None:
    """Three schedulers with their own connections race for the same firing at the same
    moment: one wins the compare-and-swap, the run is queued once."""
    model = _done_script(tmp_path)

    async def go() -> None:
        fleets = await _open(fleet, 3)
        try:
            store = Schedules(fleets[0])
            schedule = await store.add(make(_request(model), at=NOW + timedelta(hours=1), now=NOW))
            at = NOW + timedelta(hours=1, seconds=30)
            results = await asyncio.gather(*(Schedules(f).fire_due(at) for f in fleets))
            assert sorted(map(len, results)) == [0, 0, 1], results
            (won,) = [r for r in results if r]
            assert won == [f"{schedule.id}-202612030600"]
            for _ in range(3):  # more rounds, later: nothing more fires
                later = await asyncio.gather(*(Schedules(f).fire_due(at) for f in fleets))
                assert later == [[], [], []]
            assert await store.all() == []
            summary = await fleets[0].summary(won[0])
            assert summary is not None
            assert (summary["status"], summary["request"]["prompt"]) == ("queued", "nightly triage")
            depth, _in_flight = await fleets[0].queue_depth()
            assert depth == 1
        finally:
            await _close(fleets)

    asyncio.run(go())


@pytest.mark.needs("nats-server")
def test_recurring_schedule_fires_at_each_time_and_once_for_missed_ones(
    fleet: str, tmp_path: Path
) -> None:
    model = _done_script(tmp_path)

    async def go() -> None:
        fleets = await _open(fleet, 2)
        try:
            a, b = Schedules(fleets[0]), Schedules(fleets[1])
            s = await a.add(make(_request(model), every="*/5 * * * *", now=NOW))
            assert s.next == "2026-12-03T05:05:00Z"
            assert await a.fire_due(t("2026-12-03 05:04:59")) == []
            assert await a.fire_due(t("2026-12-03 05:05:00")) == [f"{s.id}-202612030505"]
            assert await b.fire_due(t("2026-12-03 05:05:01")) == []  # not twice
            (after,) = await b.all()
            assert (after.next, after.fired, after.last_run, after.last_fired) == (
                "2026-12-03T05:10:00Z",
                1,
                f"{s.id}-202612030505",
                "2026-12-03T05:05:00Z",
            )
            assert await b.fire_due(t("2026-12-03 05:10:02")) == [f"{s.id}-202612030510"]
            # Three days with no worker: one firing, for the latest missed time, then on
            # from the next one after now (no storm of 860 runs).
            late = t("2026-12-06 07:23:10")
            assert await a.fire_due(late) == [f"{s.id}-202612060720"]
            assert await b.fire_due(late) == []
            (after,) = await a.all()
            assert (after.next, after.fired) == ("2026-12-06T07:25:00Z", 3)
            ids = sorted(r["id"] for r in await fleets[0].runs())
            assert ids == [
                f"{s.id}-202612030505",
                f"{s.id}-202612030510",
                f"{s.id}-202612060720",
            ]
        finally:
            await _close(fleets)

    asyncio.run(go())


@pytest.mark.needs("nats-server")
def test_schedules_list_show_and_rm(fleet: str, tmp_path: Path) -> None:
    model = _done_script(tmp_path)
    out = keel(
        "submit",
        "--nats",
        fleet,
        "--every",
        "0 3 * * mon-fri",
        "--tz",
        "Europe/Paris",
        "--model",
        model,
        "--workspace",
        "none",
        "update the dependencies\nand open a PR",
    )
    assert out.returncode == 0, out
    sid = out.stdout.strip()
    assert sid.startswith("sch-")
    assert "\n" not in sid
    assert "every 0 3 * * mon-fri (Europe/Paris), first at " in out.stderr

    async def overdue_one() -> Schedule:
        (f,) = await _open(fleet, 1)
        try:  # made an hour ago for ten minutes ago: no worker fired it
            past = datetime.now(UTC) - timedelta(hours=1)
            return await Schedules(f).add(
                make(_request(model, "old"), at=past + timedelta(minutes=50), now=past)
            )
        finally:
            await f.close()

    old = asyncio.run(overdue_one())
    listed = keel("schedules", "--nats", fleet, "list")
    assert listed.returncode == 0, listed
    lines = listed.stdout.splitlines()
    assert lines[0].split() == ["SCHEDULE", "WHEN", "NEXT", "FIRED", "LAST", "RUN", "PROMPT"]
    by_id = {line.split()[0]: line for line in lines[1:]}
    assert set(by_id) == {sid, old.id}
    assert "every 0 3 * * mon-fri (Europe/Paris)" in by_id[sid]
    assert "update the dependencies" in by_id[sid]
    assert "open a PR" not in by_id[sid]
    assert "overdue: no worker has fired it" in by_id[old.id]
    assert "overdue" not in by_id[sid]

    entries = {e["id"]: e for e in keel_json("schedules", "--nats", fleet, "list")}
    entry = entries[sid]
    assert (entry["every"], entry["tz"], entry["at"], entry["fired"]) == (
        "0 3 * * mon-fri",
        "Europe/Paris",
        None,
        0,
    )
    # Next: 03:00 Paris (02:00 UTC) on a weekday.
    nxt = parse_iso(entry["next"])
    assert nxt > datetime.now(UTC)
    assert nxt.astimezone(ZoneInfo("Europe/Paris")).strftime("%H:%M") == "03:00"
    assert nxt.astimezone(ZoneInfo("Europe/Paris")).isoweekday() <= 5

    shown = keel_json("schedules", "--nats", fleet, "show", sid[4:10])  # a prefix, no sch-
    assert shown == entry
    text = keel("schedules", "--nats", fleet, "show", sid)
    assert "every: 0 3 * * mon-fri" in text.stdout
    assert "request: {" in text.stdout

    removed = keel("schedules", "--nats", fleet, "rm", sid[:10])
    assert removed.returncode == 0, removed
    assert removed.stdout.strip() == (
        f"schedule {sid} removed (every 0 3 * * mon-fri (Europe/Paris); it fired 0 time(s))"
    )
    assert [e["id"] for e in keel_json("schedules", "--nats", fleet, "list")] == [old.id]
    gone = keel("schedules", "--nats", fleet, "show", sid)
    assert gone.returncode != 0
    assert f"no schedule '{sid}'" in gone.stderr

    async def fire_later() -> list[str]:  # a week later: only the other one fires
        (f,) = await _open(fleet, 1)
        try:
            return await Schedules(f).fire_due(datetime.now(UTC) + timedelta(days=7))
        finally:
            await f.close()

    assert [r.rsplit("-", 1)[0] for r in asyncio.run(fire_later())] == [old.id]


@pytest.mark.needs("nats-server")
def test_bucket_made_on_an_older_fleet(fleet: str, tmp_path: Path) -> None:
    """A fleet initialised before schedules existed gets the bucket from the first user."""

    async def go() -> dict[str, Any]:
        (f,) = await _open(fleet, 1)
        try:
            await f.js.delete_key_value("keel-schedules")
            store = Schedules(f)
            s = await store.add(
                make(_request("scripted:demo"), at=NOW + timedelta(days=1), now=NOW)
            )
            status = await (await f.js.key_value("keel-schedules")).status()
            return {"ids": [x.id for x in await store.all()], "id": s.id, "ttl": status.ttl}
        finally:
            await f.close()

    got = asyncio.run(go())
    assert got["ids"] == [got["id"]]
    assert not got["ttl"]


def test_due_is_pure() -> None:
    s = make(_request("scripted:demo"), every="@hourly", now=NOW)
    assert due(s, t("2026-12-03 05:59")) is None
    firing = due(s, t("2026-12-03 06:00"))
    assert firing is not None
    assert firing.after is not None
    assert (firing.run, firing.after.next, s.next) == (
        f"{s.id}-202612030600",
        "2026-12-03T07:00:00Z",
        "2026-12-03T06:00:00Z",
    )


@pytest.mark.needs("nats-server")
def test_schedules_over_http(fleet: str, tmp_path: Path) -> None:
    """`keel serve --fleet`'s /v1/schedules: store, list, read, remove; bad bodies are a 400."""
    from starlette.testclient import TestClient

    from keel.server.host import Host
    from keel.server.http import create_app

    token = "schedule-token-0123456789"
    app = create_app(Host(tmp_path), token=token, hosts=["testserver"], fleet_url=fleet)
    headers = {"authorization": f"Bearer {token}"}
    body = {"prompt": "nightly triage", "workspace": "none", "model": "scripted:demo"}
    with TestClient(app, headers=headers) as c:
        made = c.post("/v1/schedules", json={**body, "every": "@daily", "no_check": True})
        assert made.status_code == 201, made.text
        entry = made.json()
        sid = entry["id"]
        assert (entry["every"], entry["at"], entry["fired"], entry["overdue"]) == (
            "@daily",
            None,
            0,
            False,
        )
        assert entry["request"]["prompt"] == "nightly triage"
        assert parse_iso(entry["next"]).strftime("%H:%M:%S") == "00:00:00"
        assert c.get("/v1/schedules").json() == {"schedules": [entry]}
        assert c.get(f"/v1/schedules/{sid}").json() == entry
        for bad, error in (
            ({**body, "at": "2020-01-01T00:00Z"}, "--at '2020-01-01T00:00Z' is in the past"),
            ({**body, "every": "0 25 * * *"}, "cron field 2 (hour) '25': 25 is outside 0-23"),
            ({**body, "every": "@daily", "at": "+1h"}, "--at and --every cannot be used"),
            (body, "a schedule needs --at TIME or --every CRON"),
            ({**body, "every": "@daily", "tz": "Nowhere/Land"}, "unknown time zone"),
            ({**body, "at": "+1h", "workspace": None}, "workspace is missing"),
        ):
            r = c.post("/v1/schedules", json=bad)
            assert r.status_code == 400, (bad, r.text)
            assert error in r.json()["error"], (bad, r.json())
        assert c.get("/v1/schedules/sch-nope").status_code == 400
        assert c.get("/v1/schedules/sch-000000000000").status_code == 404
        removed = c.delete(f"/v1/schedules/{sid}")
        assert (removed.status_code, removed.json()["id"]) == (200, sid)
        assert c.get("/v1/schedules").json() == {"schedules": []}
        assert c.delete(f"/v1/schedules/{sid}").status_code == 404


@pytest.mark.needs("nats-server")
def test_scheduler_task_fires_what_is_due_and_stops(fleet: str, tmp_path: Path) -> None:
    """The task a worker runs: it fires a schedule that is due within a tick or two, says so,
    and `stop` ends it at once between passes."""

    async def go() -> tuple[list[str], list[str], float]:
        (f,) = await _open(fleet, 1)
        said: list[str] = []
        try:
            now = datetime.now(UTC)
            store = Schedules(f)
            s = await store.add(
                make(_request("scripted:demo"), at=now + timedelta(seconds=1), now=now)
            )
            ticker = Scheduler(f, say=said.append, tick=0.2).start()
            for _ in range(100):
                if await store.all() == []:
                    break
                await asyncio.sleep(0.05)
            started = time.monotonic()
            await ticker.stop()
            stopped = time.monotonic() - started
            runs = [r["id"] for r in await f.runs() if r["id"].startswith(s.id)]
            return runs, said, stopped
        finally:
            await f.close()

    runs, said, stopped = asyncio.run(go())
    assert len(runs) == 1, (runs, said)
    assert said == [f"schedule {runs[0].rsplit('-', 1)[0]} fired: run {runs[0]}"]
    assert stopped < 1.0
