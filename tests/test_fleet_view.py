"""A view of the fleet on a real nats-server: every summary read in one pass, `keel runs list`'s
filters, pages and columns, `--watch`, the events on `keel.events.<run>` and the webhook of
`keel submit --notify`, and the two summary/journal fixes (an answer's real wait, `waits_on`
cleared once a run is no longer parked)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from keel.cli.runs import runs as runs_command
from keel.errors import UserError
from keel.fleet import streams
from keel.fleet.runs import Fleet
from keel.fleet.view import Page, check_notify_url, parse_statuses, select, table
from keel.session.records import DecisionRecord
from tests.fleet_helpers import (
    WorkerProc,
    keel,
    read_run,
    script,
    setup_fleet,
    wait_for,
    with_fleet,
)
from tests.nats_fixture import nats_server, nats_url  # noqa: F401

pytestmark = [pytest.mark.needs("nats-server")]


@pytest.fixture
def fleet(nats_url: str) -> str:  # noqa: F811
    setup_fleet(nats_url)
    return nats_url


async def _seed(fleet: Fleet, statuses: list[str]) -> list[str]:
    """One summary per status, submitted a second apart (the first is the oldest); returns the
    ids, oldest first."""
    ids = []
    for i, status in enumerate(statuses):
        run = f"run{i:03d}"
        await fleet.put_summary(
            run, status=status, submitted=f"2026-01-01T00:{i // 60:02d}:{i % 60:02d}Z"
        )
        ids.append(run)
    return ids


def _list(url: str, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = runs_command(["--nats", url, "list", *args])
    return code, capsys.readouterr().out


# -- reading every summary in one pass ----------------------------------------------------------


def test_runs_reads_every_summary_in_one_pass_newest_first_without_answers_or_flags(
    fleet: str,
) -> None:
    async def go(f: Fleet) -> list[dict[str, Any]]:
        ids = await _seed(f, ["completed"] * 300)
        kv = await f.kv()
        await kv.put(f"{ids[0]}.answer.toolu_1", b'{"allow":true}')
        await kv.put(f"{ids[1]}.cancel", b"1")
        await kv.delete(ids[2])  # a deleted run is not listed
        return await f.runs()

    found = with_fleet(fleet, go)
    assert [s["id"] for s in found] == [f"run{i:03d}" for i in range(299, 2, -1)] + [
        "run001",
        "run000",
    ]
    assert all(s["status"] == "completed" for s in found)


def test_runs_of_an_empty_fleet_is_empty(fleet: str) -> None:
    assert with_fleet(fleet, lambda f: f.runs()) == []


# -- filters, pages, columns -----------------------------------------------------------------------


def test_list_filters_by_status_and_pages_newest_first(
    fleet: str, capsys: pytest.CaptureFixture[str]
) -> None:
    statuses = ["completed", "queued", "running", "parked", "error", "completed", "queued"]
    ids = with_fleet(fleet, lambda f: _seed(f, statuses))

    code, out = _list(fleet, capsys, "--json", "--status", "active")
    assert code == 0
    assert [s["id"] for s in json.loads(out)] == [ids[6], ids[3], ids[2], ids[1]]
    code, out = _list(fleet, capsys, "--json", "--status", "completed,error", "--status", "parked")
    assert [s["id"] for s in json.loads(out)] == [ids[5], ids[4], ids[3], ids[0]]

    code, out = _list(fleet, capsys, "--limit", "3")
    lines = out.splitlines()
    assert [line.split()[0] for line in lines[1:4]] == [ids[6], ids[5], ids[4]], out
    assert lines[-1] == f"runs 1–3 of 7; 4 more (--after {ids[4]}, or --all)", out
    code, out = _list(fleet, capsys, "--limit", "3", "--page", "2", "--json")
    assert [s["id"] for s in json.loads(out)] == [ids[3], ids[2], ids[1]]
    code, out = _list(fleet, capsys, "--limit", "3", "--after", ids[1])
    lines = out.splitlines()
    assert [line.split()[0] for line in lines[1:-1]] == [ids[0]], out
    assert lines[-1] == "runs 7–7 of 7", out
    code, out = _list(fleet, capsys, "--limit", "2", "--all", "--json")
    assert len(json.loads(out)) == 7
    code, out = _list(fleet, capsys, "--limit", "2", "--status", "active", "--after", ids[6])
    assert out.splitlines()[-1] == f"runs 2–3 of 4; 1 more (--after {ids[2]}, or --all)", out


def test_list_refuses_an_unknown_status_and_a_lone_timeout_in_one_line(fleet: str) -> None:
    out = keel("runs", "--nats", fleet, "list", "--status", "runing")
    assert out.returncode == 2, out
    assert out.stderr.startswith("keel: error: 'runing' is not a run status"), out.stderr
    assert "active (queued, running, parked)" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
    out = keel("runs", "--nats", fleet, "list", "--timeout", "3")
    assert out.returncode == 2, out
    assert "--timeout goes with --watch" in out.stderr, out.stderr


def test_the_status_column_is_the_word_and_the_reason_is_cut_to_the_width() -> None:
    error = "the model said no: " + "x" * 300 + "\nsecond line"
    rows: list[dict[str, Any]] = [
        {"id": "r1", "status": "error", "error": error, "turns": 3, "cost": 0.5},
        {
            "id": "r2",
            "status": "parked",
            "waits_on": {
                "request": "toolu_9",
                "tool": "write",
                "waits_for": "permission",
                "question": "write out.txt?",
            },
            "last_prompt": "fix the bug",
        },
        {"id": "r3", "status": "completed", "text": "done", "turns": 1},
    ]
    assert table(rows, 80).splitlines() == [
        "RUN  STATUS                                 TURNS     COST  REASON",
        "r1   error                                      3  $0.5000  the model said no: …",
        "r2   parked: waits for permission on write                  toolu_9: write out.…",
        "r3   completed                                  1",
    ]
    assert table(rows, 120).splitlines() == [
        "RUN  STATUS                                 TURNS     COST  PROMPT       REASON",
        "r1   error                                      3  $0.5000               the model said "
        "no: " + "x" * 27 + "…",
        "r2   parked: waits for permission on write                  fix the bug  toolu_9: write "
        "out.txt?",
        "r3   completed                                  1",
    ]
    assert table(rows, 400).splitlines()[1].endswith("x" * 300)  # the error's first line
    # Too narrow for the reason: a parked run's request id still shows whole (it is what
    # `keel runs answer` takes); an error is cut to almost nothing.
    (parked,) = [r for r in rows if r["id"] == "r2"]
    long = {**parked, "id": "20261203-054635-f86cab"}
    narrow = table([long, {**rows[0], "id": "20261203-054635-f86cac"}], 80).splitlines()
    assert narrow[1].endswith("  toolu_9:…"), narrow
    assert narrow[2].endswith("$0.5000  t…"), narrow


def test_select_and_parse_statuses() -> None:
    assert parse_statuses([]) is None
    assert parse_statuses(["active"]) == frozenset({"queued", "running", "parked"})
    assert parse_statuses(["failed, Completed"]) == frozenset({"failed", "completed"})
    runs = [{"id": f"r{i}", "submitted": f"t{i}", "status": "completed"} for i in range(5)]
    page = select(runs, limit=2, page=3)
    assert ([s["id"] for s in page.runs], page.total, page.skipped, page.more) == (
        ["r0"],
        5,
        4,
        0,
    )
    assert select(runs, limit=2, page=9) == Page([], 5, 5)
    with pytest.raises(UserError, match="--after 'zz' names no run"):
        select(runs, after="zz")
    with pytest.raises(UserError, match="names several runs"):
        select(runs, after="r")
    assert [s["id"] for s in select([*runs, {"id": "r10"}], after="r1").runs] == ["r0", "r10"]


# -- --watch -----------------------------------------------------------------------------------------


def _kv_consumers(url: str) -> int:
    async def go(f: Fleet) -> int:
        info = await f.js.stream_info(f"KV_{streams.KV_BUCKET}")
        return int(info.state.consumer_count or 0)

    return int(with_fleet(url, go))


def _changes(url: str) -> None:
    async def go(f: Fleet) -> None:
        await f.put_summary("w1", status="queued", submitted="2026-01-02T00:00:00Z")
        await f.put_summary("w1", worker="a")  # no status change: no line
        await f.put_summary(
            "w1",
            status="parked",
            waits_on={"request": "toolu_1", "tool": "bash", "waits_for": "permission"},
        )
        await f.put_summary("w1", status="queued")
        await f.put_summary("w1", status="error", error="boom\nmore")

    with_fleet(url, go)


def test_watch_prints_the_table_then_one_line_per_status_change(fleet: str) -> None:
    with_fleet(fleet, lambda f: f.put_summary("old", status="completed", submitted="2026"))
    with subprocess.Popen(
        # --timeout only so that a broken watch cannot hang the test: Ctrl-C ends it first.
        [
            sys.executable,
            "-m",
            "keel",
            "runs",
            "--nats",
            fleet,
            "list",
            "--watch",
            "--timeout",
            "60",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().split()[:2] == ["RUN", "STATUS"]
            assert proc.stdout.readline().split()[:2] == ["old", "completed"]
            wait_for(lambda: _kv_consumers(fleet) > 0, 20, "the watch")
            _changes(fleet)
            lines = [proc.stdout.readline().rstrip("\n") for _ in range(4)]
        finally:
            proc.send_signal(2)  # Ctrl-C ends a watch, and it is not an error
            code = proc.wait(20)
        errors = proc.stderr.read() if proc.stderr else ""
    assert code == 0, errors
    assert [line[8:] for line in lines] == [
        "  w1  (new) → queued",
        "  w1  queued → parked: waits for permission on bash (toolu_1)",
        "  w1  parked → queued",
        "  w1  queued → error: boom",
    ], lines
    assert all(line[2] == ":" and line[5] == ":" for line in lines), lines


def test_watch_json_prints_one_object_per_change_and_ends_at_its_timeout(fleet: str) -> None:
    out: dict[str, Any] = {}

    def watch() -> None:
        out["proc"] = keel(
            "runs", "--nats", fleet, "list", "--watch", "--json", "--status", "parked,error",
            "--timeout", "8",
        )  # fmt: skip

    thread = threading.Thread(target=watch)
    started = time.monotonic()
    thread.start()
    wait_for(lambda: _kv_consumers(fleet) > 0, 20, "the watch")
    _changes(fleet)
    thread.join(60)
    proc = out["proc"]
    assert proc.returncode == 0, proc
    assert time.monotonic() - started < 40
    items = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [(i["run"], i["previous"], i["status"]) for i in items] == [
        ("w1", "queued", "parked"),
        ("w1", "queued", "error"),
    ], items
    assert items[0]["waits_on"] == {
        "request": "toolu_1",
        "tool": "bash",
        "waits_for": "permission",
    }
    assert items[1]["error"] == "boom\nmore"
    assert items[1]["summary"]["status"] == "error"
    assert "waits_on" not in items[1]["summary"]


# -- events and webhooks --------------------------------------------------------------------------


class _Hook:
    """A loopback HTTP server that records each POST's JSON body (and answers `status`)."""

    def __init__(self, status: int = 204) -> None:
        self.bodies: list[dict[str, Any]] = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", "0"))
                assert self.headers.get("content-type") == "application/json"
                hook.bodies.append(json.loads(self.rfile.read(length)))
                self.send_response(status)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook?secret=s3"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hook() -> Iterator[_Hook]:
    h = _Hook()
    try:
        yield h
    finally:
        h.close()


def test_a_run_that_parks_or_ends_publishes_one_event_and_posts_its_webhook(
    fleet: str, hook: _Hook
) -> None:
    said: list[str] = []

    async def go(f: Fleet) -> list[dict[str, Any]]:
        f.say = said.append
        events: list[dict[str, Any]] = []

        async def got(msg: Any) -> None:
            events.append({"subject": msg.subject, **json.loads(msg.data)})

        sub = await f.nc.subscribe(f"{streams.EVENTS_PREFIX}.>", cb=got)
        request = {"run": "e1", "prompt": "p", "notify": hook.url}
        await f.put_summary("e1", status="queued", request=request)
        await f.put_summary("e1", status="running")
        waits = {"request": "toolu_1", "tool": "write", "waits_for": "permission"}
        parked = await f.put_summary("e1", status="parked", waits_on=waits)
        await f.put_summary("e1", status="parked")  # still parked: no second event
        queued = await f.put_summary("e1", status="queued")
        await f.put_summary("e1", status="running", cost=0.1)
        await f.put_summary("e1", status="completed", text="a" * 2500, error="")
        await f.nc.flush()
        for _ in range(50):
            if len(events) >= 2:
                break
            await asyncio.sleep(0.05)
        await sub.unsubscribe()
        assert parked["waits_on"] == waits
        assert "waits_on" not in queued  # no longer parked: what it waited on is gone
        return events

    events = with_fleet(fleet, go)  # close() waits for the webhooks in flight
    assert [e.pop("subject") for e in events] == ["keel.events.e1", "keel.events.e1"]
    for e in events:
        assert e.pop("at").startswith("20")
    assert events == [
        {
            "run": "e1",
            "status": "parked",
            "previous": "running",
            "waits_on": {"request": "toolu_1", "tool": "write", "waits_for": "permission"},
        },
        {"run": "e1", "status": "completed", "previous": "running", "text": "a" * 2000},
    ]
    assert [{k: v for k, v in b.items() if k != "at"} for b in hook.bodies] == events
    assert said == []


def test_a_webhook_that_fails_is_tried_twice_and_said_never_raised(fleet: str) -> None:
    failing = _Hook(status=500)
    said: list[str] = []
    try:

        async def go(f: Fleet) -> dict[str, Any]:
            f.say = said.append
            await f.put_summary(
                "e2", status="running", request={"run": "e2", "notify": failing.url}
            )
            return await f.put_summary("e2", status="failed", error="worker died 3 times")

        summary = with_fleet(fleet, go)
    finally:
        failing.close()
    assert summary["status"] == "failed"
    assert len(failing.bodies) == 2
    assert said == [
        f"run e2: the webhook http://127.0.0.1:{failing.server.server_address[1]}/hook failed "
        "(HTTP 500) for failed; the run goes on"
    ]


def test_notify_takes_only_http_and_https_urls() -> None:
    assert check_notify_url("https://hooks.example.com/x") == "https://hooks.example.com/x"
    for bad in ("ftp://x/y", "hooks.example.com", "http://", "http://h:port/"):
        with pytest.raises(UserError, match="is not an http or https URL"):
            check_notify_url(bad)


def test_submit_refuses_a_bad_notify_url_in_one_line_before_queueing(fleet: str) -> None:
    out = keel(
        "submit", "--nats", fleet, "x", "--workspace", "none", "--model", "scripted:demo",
        "--notify", "file:///etc/passwd",
    )  # fmt: skip
    assert out.returncode == 2, out
    assert out.stderr.splitlines() == [
        "keel: error: --notify 'file:///etc/passwd' is not an http or https URL (hint: "
        "--notify https://HOST/PATH (the run's events are POSTed there as JSON))"
    ], out.stderr
    assert with_fleet(fleet, lambda f: f.runs()) == []


# -- end to end on a worker: the webhook, the real wait, waits_on ---------------------------------


def test_a_parked_run_notifies_its_webhook_and_its_journal_says_how_long_the_answer_took(
    fleet: str, tmp_path: Path, hook: _Hook
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    model = script(
        tmp_path / "ask.json",
        [
            {
                "text": "I'll write.",
                "tool_calls": [
                    {
                        "id": "toolu_ask_1",
                        "name": "write",
                        "input": {"path": "out.txt", "content": "hi"},
                    }
                ],
            },
            {"text": "Wrote it."},
        ],
    )
    out = keel(
        "submit", "--nats", fleet, "write it", "--model", model, "--workspace", f"path:{shared}",
        "--notify", hook.url,
    )  # fmt: skip
    assert out.returncode == 0, out
    run = out.stdout.strip()
    worker = WorkerProc(fleet, tmp_path / "scratch", "w1")
    try:
        wait_for(lambda: len(hook.bodies) >= 1, 60, "the parked event")
        time.sleep(2.5)  # a person takes a while to answer
        answered = keel("runs", "--nats", fleet, "answer", run, "toolu_ask_1", "allow")
        assert answered.returncode == 0, answered
        wait_for(lambda: len(hook.bodies) >= 2, 60, "the completed event")
    finally:
        worker.terminate()
        worker.close()
    assert [(b["run"], b["previous"], b["status"]) for b in hook.bodies] == [
        (run, "running", "parked"),
        (run, "running", "completed"),
    ], (hook.bodies, worker.log())
    assert hook.bodies[0]["waits_on"]["request"] == "toolu_ask_1"
    assert hook.bodies[1]["text"] == "Wrote it."
    summary = with_fleet(fleet, lambda f: f.summary(run))
    assert summary["status"] == "completed"
    assert "waits_on" not in summary
    (decision,) = [
        r.payload
        for r in read_run(fleet, run, tmp_path / "reader")
        if isinstance(r.payload, DecisionRecord)
    ]
    assert 2500 <= decision.waited_ms < 30_000, decision
    shown = keel("sessions", "show", run, env={**__import__("os").environ, "KEEL_STORE": fleet})
    assert shown.returncode == 0, shown
    assert f"(answered in {decision.waited_ms / 1000:.1f}s)" in shown.stdout, shown.stdout
