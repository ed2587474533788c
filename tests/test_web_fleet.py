"""The fleet page of `keel serve --fleet` (docs/web.md) and the routes it reads: a real
nats-server (tests/nats_fixture.py), a real `keel worker` playing scripted models, a real
`keel serve --fleet`, and Debian's chromium driven by playwright.

Over HTTP: `GET /v1/workers` (the registry, as `keel workers --json`), `POST /v1/runs/{id}/retry`
(a run that ended in error queued again; every other state a 409 in one line) and
`GET /v1/runs/{id}/journal` (the run's journal records as SSE, from the start or after a seq).
In the browser: the token taken from the address and kept in session storage, asked for on a 401;
a run that parks shows its question, Allow makes it complete; Deny with a reason reaches the model;
cancel and retry from the page; the run's detail with its live journal; hostile run text rendered
as text; readable at 390 px.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from keel.tools.base import AnswerLater, ToolContext, tool
from tests.browser_helpers import browser_fixture  # noqa: F401 (fixture)
from tests.fleet_helpers import WorkerProc, edit_script, script, setup_fleet, wait_for
from tests.nats_fixture import NatsServer
from tests.server_helpers import TOKEN, Served

pytestmark = [pytest.mark.needs("nats-server")]

SCREENSHOT = Path(__file__).resolve().parent.parent / "docs" / "images" / "web-fleet.png"


# -- one fleet for the module: nats-server, a worker, keel serve --fleet ---------------------------


@dataclass
class Fleetside:
    nats: str
    served: Served
    worker: WorkerProc
    root: Path  # the worker's KEEL_WORKSPACE_ROOTS: scripts and workspaces live here
    log: Path

    def client(self, token: str | None = TOKEN) -> httpx.Client:
        return self.served.client(token)

    def errors(self) -> str:
        return self.log.read_text(encoding="utf-8") + self.worker.log()


def _serve(nats: str | None, root: Path, log: Path, port: int = 0) -> Served:
    """`keel serve` fronting the fleet at `nats` (None: no fleet)."""
    err = log.open("a", encoding="utf-8")
    fleet = ["--fleet", nats] if nats else []
    proc = subprocess.Popen(
        [sys.executable, "-m", "keel", "serve", "--port", str(port), *fleet],
        cwd=root,
        env={**os.environ, "KEEL_SERVER_TOKEN": TOKEN},
        stdout=subprocess.PIPE,
        stderr=err,
        text=True,
    )
    err.close()
    got: list[str] = []
    stdout = proc.stdout
    assert stdout is not None
    lines = 2 if nats else 1
    reader = threading.Thread(
        target=lambda: got.extend(stdout.readline().rstrip("\n") for _ in range(lines)),
        daemon=True,
    )
    reader.start()
    reader.join(30)
    assert len(got) == lines, (got, log.read_text(encoding="utf-8"))
    assert got[0].startswith("keel serve: listening on http://127.0.0.1:"), got
    url = got[0].split()[4]
    return Served(proc, url, int(url.rsplit(":", 1)[1]), got)


@pytest.fixture(scope="module")
def side(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleetside]:
    if shutil.which("nats-server") is None:
        pytest.skip("needs nats-server")
    tmp = tmp_path_factory.mktemp("fleetweb")
    nats = NatsServer(tmp / "nats-store")
    try:
        setup_fleet(nats.url)
        root = tmp / "root"
        root.mkdir()
        log = tmp / "serve.log"
        worker = WorkerProc(nats.url, root / "scratch", "w1", concurrency=2)
        served = _serve(nats.url, root, log)
        try:
            yield Fleetside(nats.url, served, worker, root, log)
        finally:
            served.stop()
            worker.terminate(10)
            worker.close()
    finally:
        nats.stop()


def _write_run(side: Fleetside, name: str, marker: str) -> tuple[str, Path]:
    """A scripted model that writes `marker` to out.txt (asking first, in the default mode),
    and the workspace it writes in."""
    ws = side.root / f"ws-{name}"
    ws.mkdir()
    model = edit_script(side.root, name, marker)
    return model, ws


def _submit(c: httpx.Client, model: str, ws: Path, prompt: str = "write the marker") -> str:
    r = c.post("/v1/runs", json={"prompt": prompt, "model": model, "workspace": f"path:{ws}"})
    assert r.status_code == 201, r.text
    run: str = r.json()["id"]
    return run


def _wait(c: httpx.Client, run: str, timeout: float = 30) -> dict[str, Any]:
    r = c.get(f"/v1/runs/{run}/wait", params={"timeout": timeout})
    assert r.status_code == 200, r.text
    summary: dict[str, Any] = r.json()
    return summary


class Journal:
    """One `GET /v1/runs/{id}/journal` stream, read record by record."""

    def __init__(self, c: httpx.Client, run: str, **params: Any) -> None:
        headers = {}
        if "last_event_id" in params:
            headers["last-event-id"] = str(params.pop("last_event_id"))
        self._cm = c.stream("GET", f"/v1/runs/{run}/journal", params=params, headers=headers)
        self.response = self._cm.__enter__()
        assert self.response.status_code == 200, self.response.read()
        assert self.response.headers["content-type"].startswith("text/event-stream")
        self._lines = self.response.iter_lines()

    def until(self, kind: str) -> list[tuple[str, str, Any]]:
        """(event, id, record) frames up to the first record of type `kind`."""
        frames: list[tuple[str, str, Any]] = []
        fields: dict[str, str] = {}
        for line in self._lines:
            if line == "":
                if "data" in fields:
                    data = json.loads(fields["data"])
                    frames.append((fields.get("event", ""), fields.get("id", ""), data))
                    if data["type"] == kind:
                        return frames
                fields = {}
            elif not line.startswith(":"):
                name, _, value = line.partition(":")
                fields[name] = value.removeprefix(" ")
        raise AssertionError(f"the stream ended: {frames}")

    def close(self) -> None:
        self._cm.__exit__(None, None, None)


def _journal(c: httpx.Client, run: str, until: str, **params: Any) -> list[tuple[str, str, Any]]:
    stream = Journal(c, run, **params)
    try:
        return stream.until(until)
    finally:
        stream.close()


# -- the routes ------------------------------------------------------------------------------------


def test_workers_route_shows_the_registry_as_keel_workers_does(side: Fleetside) -> None:
    with side.client() as c:
        got = wait_for(
            lambda: (r := c.get("/v1/workers")).status_code == 200 and r.json()["workers"] and r,
            20,
            "the worker's first heartbeat",
        )
        body = got.json()
        assert list(body) == ["workers"], body
        from jsonschema import validate

        from keel.server.openapi import spec

        answer = spec()["paths"]["/v1/workers"]["get"]["responses"]["200"]
        validate(body, answer["content"]["application/json"]["schema"])  # as described
        (w,) = body["workers"]
        beat, beat_at, age, started = (
            w.pop("beat"),
            w.pop("beat_at"),
            w.pop("age"),
            w.pop("started"),
        )
        assert beat.endswith("Z"), beat
        assert started, w
        assert beat_at > 0, beat_at
        assert 0 <= age < 7, age
        from keel import __version__

        assert w == {
            "name": "w1",
            "host": socket.gethostname(),
            "pid": side.worker.proc.pid,
            "version": __version__,
            "concurrency": 2,
            "running": [],
            "labels": [],
            "roots": [str(side.root)],
            "providers": w["providers"],
            "ack_wait": 8.0,
            "stopping": False,
            "silent": False,
        }
        assert "scripted" in w["providers"], w
    with side.client(None) as anonymous:
        refused = anonymous.get("/v1/workers")
    assert refused.status_code == 401, refused.text


def test_retry_requeues_an_errored_run_and_refuses_other_states_in_one_line(
    side: Fleetside,
) -> None:
    ws = side.root / "ws-retry"
    ws.mkdir()
    path = side.root / "flaky.json"
    # The model refuses the request outright (a 400 is not retried): the run ends in error.
    model = script(path, [{"fault": {"kind": "status", "status": 400, "message": "bad day"}}])
    with side.client() as c:
        run = _submit(c, model, ws, "say done")
        errored = _wait(c, run)
        assert errored["status"] == "error", (errored, side.errors())
        script(path, [{"text": "done"}])  # the model is well again: a retry can finish
        r = c.post(f"/v1/runs/{run}/retry", json={})
        assert r.status_code == 200, r.text
        queued = r.json()
        assert (queued["id"], queued["retries"], queued["error"], queued["lost"]) == (
            run,
            1,
            "",
            0,
        ), queued
        assert queued["note"].startswith("retried by hand ("), queued
        assert queued["status"] in ("queued", "running"), queued
        done = _wait(c, run)
        assert (done["status"], done["text"], done["retries"]) == ("completed", "done", 1), done
        again = c.post(f"/v1/runs/{run}/retry", json={})
        assert (again.status_code, again.json()) == (
            409,
            {
                "error": f"run {run} is completed: only a failed run can be retried",
                "hint": "submit it again: POST /v1/runs",
            },
        )
        nobody = c.post("/v1/runs/20260101T000000-nobody00/retry", json={})
        assert (nobody.status_code, nobody.json()) == (
            404,
            {"error": "no run '20260101T000000-nobody00'", "hint": "GET /v1/runs lists the runs"},
        )
        bad = c.post(f"/v1/runs/{run}/retry", json={"now": True})
        assert (bad.status_code, bad.json()["error"]) == (400, "unknown field 'now'")


def test_the_journal_streams_every_record_live_then_resumes_after_a_seq(
    side: Fleetside,
) -> None:
    model, ws = _write_run(side, "journal", "journaled")
    with side.client() as c:
        run = _submit(c, model, ws, "greet")
        assert _wait(c, run)["status"] == "parked", side.errors()
        stream = Journal(c, run)
        try:
            frames = stream.until("park")
            # The stream is open; the answer makes the run go on, its records come as written.
            answered = c.post(f"/v1/runs/{run}/answers/toolu_journal_1", json={"allow": True})
            assert answered.status_code == 200, answered.text
            frames += stream.until("terminal")
        finally:
            stream.close()
        assert [(kind, rid, data["seq"], data["type"]) for kind, rid, data in frames] == [
            ("record", "1", 1, "meta"),
            ("record", "2", 2, "user"),
            ("record", "3", 3, "assistant"),
            ("record", "4", 4, "park"),
            ("record", "5", 5, "claim"),
            ("record", "6", 6, "decision"),
            ("record", "7", 7, "tool_result"),
            ("record", "8", 8, "assistant"),
            ("record", "9", 9, "terminal"),
        ], frames
        records = [data for _, _, data in frames]
        assert records[0]["id"] == run
        # The prompt, after the context keel puts before it.
        assert records[1]["message"]["content"][-1] == {"type": "text", "text": "greet"}
        assert records[3]["request_id"] == "toolu_journal_1"
        assert (records[4]["worker"], records[4]["attempt"]) == ("w1", 1)
        assert records[7]["message"]["content"] == [{"type": "text", "text": "Wrote journaled."}]
        assert (records[8]["reason"], records[8]["turns"]) == ("completed", 2)
        # A reconnect names the last seq it has: only the later records come.
        later = _journal(c, run, "terminal", last_event_id=7)
        assert later == frames[7:]
        assert _journal(c, run, "terminal", after=8) == frames[8:]
        bad = c.get(f"/v1/runs/{run}/journal", params={"after": "x"})
        assert (bad.status_code, bad.json()) == (
            400,
            {"error": "Last-Event-ID / after must be a record seq, not 'x'", "hint": ""},
        )
        missing = c.get("/v1/runs/20260101T000000-nobody00/journal")
        assert (missing.status_code, missing.json()) == (
            404,
            {"error": "no run '20260101T000000-nobody00'", "hint": "GET /v1/runs lists the runs"},
        )
        dotted = c.get("/v1/runs/a.b/journal")
        assert dotted.status_code == 400, dotted.text


def test_a_keepalive_waits_for_the_step_in_flight_and_a_stop_ends_the_stream() -> None:
    """`paced`, under both fleet event streams: a keepalive between two records never cancels
    the read in flight (a record taken at that moment would be lost), and the server's stop
    ends the stream at once."""
    import asyncio

    from keel.server.fleet_routes import paced

    async def go() -> tuple[list[int | None], list[str]]:
        stop = asyncio.Event()
        log: list[str] = []
        count = 0

        async def step() -> int:
            nonlocal count
            count += 1
            log.append(f"start {count}")
            try:
                await asyncio.sleep(0.4 if count < 3 else 60)
            except asyncio.CancelledError:
                log.append(f"cancelled {count}")
                raise
            return count

        got: list[int | None] = []
        async with contextlib.aclosing(paced(step, keepalive=0.04, stop=stop)) as steps:
            async for item in steps:
                got.append(item)
                if item == 2:
                    asyncio.get_running_loop().call_later(0.05, stop.set)
        return got, log

    got, log = asyncio.run(go())
    # Each read outlives keepalives (about ten) and still yields its value; the third is
    # cancelled only by the stop.
    assert [item for item in got if item is not None] == [1, 2], got
    assert None in got[: got.index(1)], got
    assert None in got[got.index(1) : got.index(2)], got
    assert log == ["start 1", "start 2", "start 3", "cancelled 3"], log


# -- the page --------------------------------------------------------------------------------------


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1200, "height": 900})
    pg = context.new_page()
    pg.problems = []
    pg.external = []
    pg.on("pageerror", lambda e: pg.problems.append(str(e)))
    pg.on("console", lambda m: pg.problems.append(m.text) if m.type == "error" else None)
    pg.on(
        "request",
        lambda r: None if r.url.startswith("http://127.0.0.1") else pg.external.append(r.url),
    )
    pg.on(
        "response",
        lambda r: pg.problems.append(f"{r.status} {r.url}") if r.status >= 400 else None,
    )
    yield pg
    context.close()


def _run_item(page: Any, run: str) -> Any:
    return page.locator(f'li.run[data-run="{run}"]')


#: The page's order of the groups: runs waiting for a person first.
ORDER = ["parked", "running", "queued", "failed", "error", "completed", "cancelled"]


def _check_groups(page: Any, side: Fleetside) -> None:
    """The page's groups and counts are the fleet's runs by state, in the page's order."""
    with side.client() as c:
        listed = c.get("/v1/runs").json()["runs"]
    by: dict[str, list[str]] = {}
    for summary in listed:
        by.setdefault(summary["status"], []).append(summary["id"])
    want = sorted(by, key=lambda s: (ORDER.index(s) if s in ORDER else len(ORDER), s))
    shown = page.evaluate(
        """() => [...document.querySelectorAll('#groups section.group:not([hidden])')].map(g =>
             [g.dataset.status, g.querySelector('.group-title .muted').textContent,
              [...g.querySelectorAll('li.run')].map(r => r.dataset.run)])"""
    )
    # Newest first in each group, as GET /v1/runs lists them.
    assert shown == [[s, f"({len(by[s])})", by[s]] for s in want], shown
    chips = page.eval_on_selector_all("#filters button", "bs => bs.map(b => b.textContent)")
    assert chips == [f"all {len(listed)}", *(f"{s} {len(by[s])}" for s in want)], chips


def _status_of(page: Any, run: str, status: str, timeout: float = 30_000) -> None:
    page.wait_for_selector(f'li.run[data-run="{run}"][data-status="{status}"]', timeout=timeout)


@pytest.mark.needs("chromium")
def test_a_parked_question_is_answered_from_the_page_and_the_run_completes(
    side: Fleetside, page: Any, tmp_path: Path
) -> None:
    model, ws = _write_run(side, "page", "from-the-page")
    page.goto(f"{side.served.url}/fleet#token={TOKEN}")
    page.wait_for_selector("#live[data-state='live']")
    # The token left the address and lives in the tab's session storage.
    assert page.evaluate("location.href") == f"{side.served.url}/fleet"
    assert page.evaluate("sessionStorage.getItem('keel-token')") == TOKEN
    with side.client() as c:
        run = _submit(c, model, ws)
        _status_of(page, run, "parked")
        item = _run_item(page, run)
        question = item.locator(".question")
        assert question.locator(".asks code").text_content() == "write"
        assert json.loads(question.locator("pre.input").text_content()) == {
            "path": "out.txt",
            "content": "from-the-page",
        }
        assert "toolu_page_1" in question.locator(".asks").text_content()
        # The workers' table shows the worker; the parked run is nobody's now.
        page.wait_for_selector('#workers tr[data-worker="w1"] .badge.w-live')
        # The picture in docs/web.md; KEEL_UPDATE_SCREENSHOT=1 writes it there.
        shot = SCREENSHOT if os.environ.get("KEEL_UPDATE_SCREENSHOT") else tmp_path / "shot.png"
        page.screenshot(path=str(shot), full_page=True)
        assert shot.stat().st_size > 10_000
        item.get_by_role("button", name="Allow").click()
        _status_of(page, run, "completed")
        assert item.locator(".question").count() == 0
        assert "Wrote from-the-page." in item.locator(".meta").text_content()
        done = c.get(f"/v1/runs/{run}").json()
        assert (done["status"], done["text"]) == ("completed", "Wrote from-the-page.")
    assert (ws / "out.txt").read_text(encoding="utf-8") == "from-the-page"
    # The detail: the summary and the journal, record by record, opened from the keyboard.
    item.locator("button.open").focus()
    page.keyboard.press("Enter")
    page.wait_for_selector("#detail-journal li.r-terminal")
    assert page.evaluate("document.activeElement.id") == "detail-title"
    types = page.eval_on_selector_all("#detail-journal li", "ls => ls.map(l => l.className)")
    assert types == [
        f"rec r-{t}"
        for t in (
            "meta",
            "user",
            "assistant",
            "park",
            "claim",
            "decision",
            "tool_result",
            "assistant",
            "terminal",
        )
    ], types
    assert page.locator("#detail-summary dd.f-status").text_content() == "completed"
    assert page.locator("#detail-attempts li").count() >= 2
    page.keyboard.press("Escape")
    assert page.locator("#detail").is_hidden()
    assert page.evaluate("document.activeElement.closest('li.run').dataset.run") == run
    assert page.problems == []
    assert page.external == []


@pytest.mark.needs("chromium")
def test_deny_with_a_reason_cancel_and_hostile_text_from_the_page(
    side: Fleetside, page: Any
) -> None:
    hostile = '<img src=x onerror="window.pwned=1"><script>window.pwned=2</script>'
    model, ws = _write_run(side, "deny", hostile)
    model2, ws2 = _write_run(side, "stop", "never")
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(f"{side.served.url}/fleet")
    # No token yet: the page asks for one.
    page.wait_for_selector("#token-form:not([hidden])")
    page.fill("#token", "wrong-token")
    page.press("#token", "Enter")
    page.wait_for_selector("#token-form:not([hidden]) #token-error:not(:empty)")
    assert page.locator("#token-error").text_content() in (
        "wrong bearer token",
        "the token was refused",
    )
    page.fill("#token", TOKEN)
    page.press("#token", "Enter")
    page.wait_for_selector("#live[data-state='live']")
    with side.client() as c:
        run = _submit(c, model, ws, hostile)
        stopped = _submit(c, model2, ws2)
        _status_of(page, run, "parked")
        _status_of(page, stopped, "parked")
        _check_groups(page, side)
        assert page.title() == "(2 parked) keel fleet"  # a tab in the background says so
        item = _run_item(page, run)
        assert item.locator(".prompt").text_content() == hostile
        shown = json.loads(item.locator("pre.input").text_content())
        assert shown == {"path": "out.txt", "content": hostile}
        item.get_by_role("textbox", name="Reason").fill("not that file")
        item.get_by_role("textbox", name="Reason").press("Enter")  # Enter in the reason: Deny
        _status_of(page, run, "completed")
        _run_item(page, stopped).get_by_role("button", name=f"Cancel run {stopped}").click()
        try:
            _status_of(page, stopped, "cancelled")
        except Exception:
            summary = c.get(f"/v1/runs/{stopped}").json()
            shown = _run_item(page, stopped).get_attribute("data-status")
            raise AssertionError(
                f"the page shows {shown}; the server says {summary}\n{side.errors()[-4000:]}"
            ) from None
        assert c.get(f"/v1/runs/{stopped}").json()["status"] == "cancelled"
        _check_groups(page, side)
        assert page.title() == "keel fleet"
    # j and k walk the runs shown, in the page's order (the focus starts nowhere).
    order = page.eval_on_selector_all("#groups li.run", "rs => rs.map(r => r.dataset.run)")
    focused = "document.activeElement.closest('li.run')?.dataset.run ?? null"
    page.evaluate("document.activeElement.blur()")
    walked = []
    for key in ("j", "j", "k", "k"):
        page.keyboard.press(key)
        walked.append(page.evaluate(focused))
    assert walked == [order[0], order[1], order[0], order[0]], (walked, order)
    assert not (ws / "out.txt").exists()
    assert not (ws2 / "out.txt").exists()
    with side.client() as c:
        frames = _journal(c, run, "terminal")
    (denied,) = [d for _, _, d in frames if d["type"] == "decision"]
    assert (denied["outcome"], denied["reason"]) == (
        "deny",
        "the user denied this: not that file",
    ), denied
    # What the model reads next: the denial with its reason, as the tool's error result.
    (result,) = [d["result"] for _, _, d in frames if d["type"] == "tool_result"]
    assert result["is_error"] is True, result
    assert "not that file" in result["content"][0]["text"], result
    assert page.evaluate("window.pwned === undefined")
    assert page.locator("li.run img, li.run script").count() == 0
    # Readable on a phone: nothing wider than the screen.
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    # The wrong token's refusals only (the first one stops the page's other requests).
    assert page.problems
    assert set(page.problems) <= {
        "Failed to load resource: the server responded with a status of 401 (Unauthorized)",
        f"401 {side.served.url}/v1/workers",
        f"401 {side.served.url}/v1/runs/events",
    }, page.problems
    assert page.external == []


@pytest.mark.needs("chromium")
def test_a_failed_run_is_retried_from_the_page(side: Fleetside, page: Any) -> None:
    ws = side.root / "ws-page-retry"
    ws.mkdir()
    path = side.root / "page-flaky.json"
    model = script(path, [{"fault": {"kind": "status", "status": 400, "message": "no"}}])
    page.goto(f"{side.served.url}/fleet#token={TOKEN}")
    page.wait_for_selector("#live[data-state='live']")
    with side.client() as c:
        run = _submit(c, model, ws, "try")
        _status_of(page, run, "error")
        script(path, [{"text": "second time lucky"}])
        page.locator("#filters button[data-filter='error']").click()
        assert page.locator("li.run:not([hidden])").count() == 1
        _run_item(page, run).get_by_role("button", name=f"Retry run {run}").click()
        page.locator("#filters button[data-filter='all']").click()
        _status_of(page, run, "completed")
        assert c.get(f"/v1/runs/{run}").json()["retries"] == 1
    assert page.problems == []


@pytest.mark.needs("chromium")
def test_the_page_reconnects_after_the_server_restarts_and_catches_up(
    side: Fleetside, page: Any, tmp_path: Path
) -> None:
    from tests.helpers import free_port

    port = free_port()
    log = tmp_path / "serve.log"
    served = _serve(side.nats, side.root, log, port)
    try:
        page.goto(f"{served.url}/fleet#token={TOKEN}")
        page.wait_for_selector("#live[data-state='live']")
        # The page's two streams (the runs' events, a run's journal) end when the server stops:
        # they do not hold its shutdown up (uvicorn would wait 5 s for them).
        model = script(side.root / "before.json", [{"text": "done before"}])
        ws = side.root / "ws-before"
        ws.mkdir()
        with side.client() as c:
            before = _submit(c, model, ws, "before the restart")
        _status_of(page, before, "completed")
        _run_item(page, before).locator("button.open").click()
        page.wait_for_selector("#detail-journal li.r-terminal")
        assert page.locator("#journal-state").text_content() == "(live)"
        started = time.monotonic()
        served.stop()
        assert time.monotonic() - started < 4, served.proc.returncode
        assert served.proc.returncode == -signal.SIGTERM, log.read_text(encoding="utf-8")
        page.wait_for_selector("#live:text-matches('^reconnecting in [0-9]+ s…$')")  # no why
        # While this server is down a run is submitted and completes (through the module's
        # server): the page must find it when it is back.
        model = script(side.root / "while-away.json", [{"text": "done while away"}])
        ws = side.root / "ws-away"
        ws.mkdir()
        with side.client() as c:
            run = _submit(c, model, ws, "while the page was away")
            assert _wait(c, run)["status"] == "completed", side.errors()
        served = _serve(side.nats, side.root, log, port)
        _status_of(page, run, "completed", timeout=40_000)
        page.wait_for_selector("#live[data-state='live']")
        assert _run_item(page, run).locator(".prompt").text_content() == "while the page was away"
    finally:
        served.stop()
    assert page.evaluate("sessionStorage.getItem('keel-token')") == TOKEN
    # What the browser says of a server that went away (a stream cut, refused connections).
    assert {p.split("net::")[-1] for p in page.problems} <= {
        "ERR_CONNECTION_REFUSED",
        "ERR_INCOMPLETE_CHUNKED_ENCODING",
    }, page.problems


@pytest.mark.needs("chromium")
def test_a_deferred_tool_gets_its_result_from_the_page(side: Fleetside, page: Any) -> None:
    import asyncio

    from keel.fleet.worker import Worker

    calls: list[int] = []

    @tool
    async def approve_budget(ctx: ToolContext, amount: int) -> str:
        """Ask finance to approve a budget.

        Args:
            amount: Dollars.
        """
        calls.append(amount)
        raise AnswerLater(f"finance reviews {amount} dollars")

    model = script(
        side.root / "later.json",
        [
            {
                "tool_calls": [
                    {"id": "toolu_later_1", "name": "approve_budget", "input": {"amount": 500}}
                ]
            },
            {"text": "Budget settled.", "expect": {"last_user_contains": "approved by Ann"}},
        ],
    )
    # A worker of its own (in this process, with the tool), the only one with the run's label.
    worker = Worker(
        side.nats,
        scratch=side.root / "scratch-finance",
        name="finance",
        tools=[approve_budget],
        labels=["finance"],
        env={**os.environ, "KEEL_WORKSPACE_ROOTS": str(side.root)},
    )
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=lambda: loop.run_until_complete(worker.run()), daemon=True)
    thread.start()
    page.goto(f"{side.served.url}/fleet#token={TOKEN}")
    page.wait_for_selector("#live[data-state='live']")
    try:
        with side.client() as c:
            r = c.post(
                "/v1/runs",
                json={
                    "prompt": "get the budget approved",
                    "model": model,
                    "mode": "bypass",
                    "needs": ["finance"],
                    "workspace": f"path:{side.root}",
                },
            )
            assert r.status_code == 201, r.text
            run = r.json()["id"]
            _status_of(page, run, "parked")
            item = _run_item(page, run)
            assert item.locator(".asks").text_content() == (
                "Waits for a result: approve_budget toolu_later_1"
            )
            assert item.locator(".question .text").text_content() == ("finance reviews 500 dollars")
            assert item.get_by_role("button", name="Allow").count() == 0
            item.get_by_role("textbox", name="Result of approve_budget").fill("approved by Ann")
            item.get_by_role("button", name="Send result").click()
            _status_of(page, run, "completed")
            done = c.get(f"/v1/runs/{run}").json()
    finally:
        loop.call_soon_threadsafe(worker.stop)
        thread.join(30)
        loop.close()
    assert (done["status"], done["text"], done["worker"]) == (
        "completed",
        "Budget settled.",
        "finance",
    )
    assert calls == [500]
    assert page.problems == []


@pytest.mark.needs("chromium")
def test_without_a_fleet_the_page_says_so_in_one_line(page: Any, tmp_path: Path) -> None:
    served = _serve(None, tmp_path, tmp_path / "serve.log")
    try:
        page.goto(f"{served.url}/fleet#token={TOKEN}")
        page.wait_for_selector("#error:not([hidden])")
        assert page.locator("#error").text_content() == (
            "this server does not front a fleet (start keel serve with --fleet (KEEL_NATS_URL "
            "or the local fleet) or --fleet nats://HOST:PORT)"
        )
        assert page.locator("#live").text_content() == "refused"
        assert page.locator("#workers-error").text_content() == "this server does not front a fleet"
    finally:
        served.stop()
    assert {p for p in page.problems if not p.startswith("Failed to load resource")} == {
        f"404 {served.url}/v1/runs/events",
        f"404 {served.url}/v1/workers",
    }, page.problems


@pytest.mark.needs("chromium")
def test_the_page_says_why_while_the_fleets_nats_server_is_down_and_comes_back(
    page: Any, tmp_path: Path
) -> None:
    nats = NatsServer(tmp_path / "nats-store")
    served: Served | None = None
    try:
        setup_fleet(nats.url)
        served = _serve(nats.url, tmp_path, tmp_path / "serve.log")
        page.goto(f"{served.url}/fleet#token={TOKEN}")
        page.wait_for_selector("#live[data-state='live']")
        nats.stop()
        # The runs' stream ends when the fleet's connection dies (it does not go on sending
        # keepalives as if all were well); the page says why and keeps trying.
        from playwright.sync_api import expect

        down = re.escape(f"cannot connect to the fleet's NATS server at {nats.url}")
        expect(page.locator("#live")).to_have_text(
            re.compile(down + r" \(Connection refused\); reconnecting in [0-9]+ s…"),
            timeout=15_000,
        )
        expect(page.locator("#workers-error")).to_have_text(
            re.compile(down + r" \(Connection refused\)")
        )
        nats = NatsServer(tmp_path / "nats-store", port=nats.port)  # back, with its streams
        with served.client() as c:
            r = c.post(
                "/v1/runs",
                json={"prompt": "after the outage", "workspace": "none", "no_check": True},
            )
            assert r.status_code == 201, r.text
            run = r.json()["id"]
        _status_of(page, run, "queued", timeout=30_000)
        page.wait_for_selector("#live[data-state='live']")
        page.wait_for_selector("#workers-error:empty", state="attached")
    finally:
        if served is not None:
            served.stop()
        nats.stop()
    assert {p.split(" http")[0] for p in page.problems} <= {
        "503",
        "Failed to load resource: the server responded with a status of 503 (Service Unavailable)",
    }, page.problems


@pytest.mark.needs("chromium")
def test_a_late_answer_to_cancel_does_not_roll_back_what_the_stream_brought(
    side: Fleetside, page: Any
) -> None:
    """The answer to the page's cancel is the summary as the server wrote it; a worker may close
    the run, and the stream bring `cancelled`, before that answer arrives (seen under load). The
    answer is held here until the run is closed, and made the older write it can be (`parked`,
    cancel requested): the page must keep showing `cancelled`."""
    model, ws = _write_run(side, "late", "never")
    page.goto(f"{side.served.url}/fleet#token={TOKEN}")
    page.wait_for_selector("#live[data-state='live']")
    with side.client() as c:
        run = _submit(c, model, ws)
        _status_of(page, run, "parked")
        held: list[str] = []

        def late(route: Any) -> None:
            response = route.fetch()
            body = response.json()
            deadline = time.monotonic() + 20
            while c.get(f"/v1/runs/{run}").json()["status"] != "cancelled":
                assert time.monotonic() < deadline, "the worker did not close the run"
                time.sleep(0.1)
            held.append(body["status"])
            body.update(status="parked", cancel_requested=True, finished=None)
            route.fulfill(response=response, json=body)

        page.route(f"**/v1/runs/{run}/cancel", late)
        _run_item(page, run).get_by_role("button", name=f"Cancel run {run}").click()
        _status_of(page, run, "cancelled")  # from the stream, while the answer is held
        page.wait_for_function("() => !document.querySelector('#groups button[disabled]')")
        assert held, "the answer was never held"
        page.wait_for_timeout(300)  # the held answer has been handled
        assert _run_item(page, run).get_attribute("data-status") == "cancelled"
