"""`keel serve --fleet`: the fleet's work queue over HTTP, end to end. A real `keel serve` process
fronts a real nats-server (tests/nats_fixture.py); real `keel worker` processes run the scripted
runs it queues. What is asserted is what an HTTP client sees (whole bodies, status codes) and what
the run's journal in JetStream holds.

The attacks: a wrong or missing token and a rebinding Host header on the fleet routes; bodies the
submit route must refuse before anything is queued (an `ext::` git workspace that would run a
program on the worker, an unknown field, a bad mode, a NaN budget, a bool for a number); a run id
with a dot (it would name a KV key of another kind); an answer of the wrong kind or for a request
the run does not wait for; a password in the fleet's URL, which must not reach stdout or an HTTP
error.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from keel.tools.base import AnswerLater, ToolContext, tool
from tests.fleet_helpers import WorkerProc, edit_script, keel_json, read_run, script, setup_fleet
from tests.helpers import free_port
from tests.nats_fixture import NatsServer, nats_server, nats_url  # noqa: F401

pytestmark = [pytest.mark.needs("nats-server")]

TOKEN = "fleet-token-0123456789abcdef"


# -- a server process ------------------------------------------------------------------------------


@dataclass
class Served:
    proc: subprocess.Popen[str]
    url: str
    lines: list[str]

    def client(self, token: str | None = TOKEN, **headers: str) -> httpx.Client:
        if token is not None:
            headers["authorization"] = f"Bearer {token}"
        return httpx.Client(base_url=self.url, headers=headers, timeout=httpx.Timeout(90.0))


@dataclass
class Servers:
    project: Path
    log: Path
    started: list[Served] = field(default_factory=list)

    def start(self, *args: str, lines: int = 1, env: dict[str, str] | None = None) -> Served:
        err = self.log.open("a", encoding="utf-8")
        proc = subprocess.Popen(
            [sys.executable, "-m", "keel", "serve", "--port", "0", *args],
            cwd=self.project,
            env={**os.environ, "KEEL_SERVER_TOKEN": TOKEN, **(env or {})},
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
        err.close()
        got = _read_lines(proc, lines)
        assert got[0].startswith("keel serve: listening on http://127.0.0.1:"), (got, self.errors())
        served = Served(proc, got[0].split()[4], got)
        self.started.append(served)
        return served

    def errors(self) -> str:
        return self.log.read_text(encoding="utf-8") if self.log.exists() else ""

    def stop_all(self) -> None:
        for served in self.started:
            if served.proc.poll() is None:
                served.proc.send_signal(signal.SIGTERM)
                try:
                    served.proc.wait(10)
                except subprocess.TimeoutExpired:
                    served.proc.kill()
                    served.proc.wait(5)
            if served.proc.stdout is not None:
                served.proc.stdout.close()


def _read_lines(proc: subprocess.Popen[str], count: int) -> list[str]:
    got: list[str] = []
    assert proc.stdout is not None
    stdout = proc.stdout

    def read() -> None:
        for _ in range(count):
            got.append(stdout.readline().rstrip("\n"))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(30)
    assert len(got) == count, f"keel serve printed {got} (exit {proc.poll()})"
    assert all(got), f"keel serve printed {got} (exit {proc.poll()})"
    return got


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[Servers]:
    project = tmp_path / "project"
    project.mkdir()
    s = Servers(project, tmp_path / "serve.log")
    try:
        yield s
    finally:
        s.stop_all()


@pytest.fixture
def fleet(nats_url: str) -> str:  # noqa: F811
    setup_fleet(nats_url)
    return nats_url


@pytest.fixture
def served(servers: Servers, fleet: str) -> Served:
    return servers.start("--fleet", fleet, lines=2)


def _worker(url: str, tmp: Path, name: str = "w1") -> WorkerProc:
    return WorkerProc(url, tmp / "scratch", name)


def _stop(worker: WorkerProc) -> None:
    worker.terminate()
    worker.close()


def _wait(c: httpx.Client, run: str, timeout: float = 60) -> dict[str, Any]:
    r = c.get(f"/v1/runs/{run}/wait", params={"timeout": timeout})
    assert r.status_code == 200, r.text
    summary: dict[str, Any] = r.json()
    return summary


def _queue_depth(url: str) -> tuple[int, int]:
    from keel.fleet.runs import Fleet

    async def go() -> tuple[int, int]:
        fleet = await Fleet.open(url)
        try:
            return await fleet.queue_depth()
        finally:
            await fleet.close()

    return asyncio.run(go())


# -- submit, watch, answer -------------------------------------------------------------------------


def test_a_run_posted_over_http_completes_on_a_worker(
    served: Served, fleet: str, tmp_path: Path
) -> None:
    assert served.lines[1] == f"keel serve: fronting the fleet at {fleet} (/v1/runs)"
    shared = tmp_path / "shared"
    shared.mkdir()
    model = edit_script(tmp_path, "http", "from-http")
    body = {
        "prompt": "write the marker",
        "model": model,
        "mode": "accept-edits",
        "workspace": {"path": str(shared)},
        "max_turns": 5,
        "max_attempts": 4,
    }
    with served.client() as c:
        posted = c.post("/v1/runs", json=body)
        assert posted.status_code == 201, posted.text
        queued = posted.json()
        run = queued["id"]
        request = {
            "run": run,
            "prompt": "write the marker",
            "model": model,
            "mode": "accept-edits",
            "workspace": {"path": str(shared)},
            "max_turns": 5,
            "max_tokens_budget": None,
            "max_budget_usd": None,
            "submitted": queued["submitted"],
            "why": "start",
            "priority": "normal",
            "needs": [],
            "notify": None,
            "max_attempts": 4,
        }
        assert queued == {
            "id": run,
            "status": "queued",
            "submitted": queued["submitted"],
            "model": model,
            "mode": "accept-edits",
            "last_prompt": "write the marker",
            "workspace": {"path": str(shared)},
            "request": request,
            "updated": queued["updated"],
            # Submitted before any worker is up: what only a worker can check is a warning.
            "warnings": [
                "no worker is up: what the workers need (a key for the model, the workspace "
                "under their roots, labels) is checked when one takes the run"
            ],
        }
        # The CLI sees the same run (the warnings are the submit's answer, not the summary's).
        assert keel_json("runs", "--nats", fleet, "show", run)["request"] == request
        worker = _worker(fleet, tmp_path)
        try:
            done = _wait(c, run)
        finally:
            _stop(worker)
        assert (done["status"], done["text"], done["turns"], done["worker"]) == (
            "completed",
            "Wrote from-http.",
            2,
            "w1",
        ), (done, worker.log())
        assert done["request"] == request
        got = c.get(f"/v1/runs/{run}")
        assert (got.status_code, got.json()) == (200, done)
        listed = c.get("/v1/runs")
        assert (listed.status_code, listed.json()) == (200, {"runs": [done], "total": 1, "more": 0})
        assert keel_json("runs", "--nats", fleet, "show", run) == done
    assert (shared / "out.txt").read_text(encoding="utf-8") == "from-http"
    assert [r.payload.type for r in read_run(fleet, run, tmp_path / "reader")] == [
        "meta",
        "user",
        "assistant",
        "decision",
        "tool_result",
        "assistant",
        "terminal",
    ]


def test_a_parked_question_is_answered_over_http_and_the_run_completes(
    served: Served, fleet: str, tmp_path: Path
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    # The default mode: the write asks, nobody is there, the run parks.
    model = edit_script(tmp_path, "ask", "answered")
    worker = _worker(fleet, tmp_path)
    try:
        with served.client() as c:
            posted = c.post(
                "/v1/runs",
                json={"prompt": "write it", "model": model, "workspace": f"path:{shared}"},
            )
            assert posted.status_code == 201, posted.text
            run = posted.json()["id"]
            parked = _wait(c, run)
            assert parked["status"] == "parked", (parked, worker.log())
            assert (parked["waits_on"]["request"], parked["waits_on"]["tool"]) == (
                "toolu_ask_1",
                "write",
            ), parked
            assert not (shared / "out.txt").exists()
            answers = f"/v1/runs/{run}/answers"
            wrong = c.post(f"{answers}/toolu_nope", json={"allow": True})
            assert (wrong.status_code, wrong.json()) == (
                409,
                {
                    "error": f"run {run} does not wait for 'toolu_nope' (it is parked, waiting "
                    "for toolu_ask_1)",
                    "hint": f"GET /v1/runs/{run} says what a run waits for",
                },
            )
            kind = c.post(f"{answers}/toolu_ask_1", json={"result": "done"})
            assert (kind.status_code, kind.json()) == (
                400,
                {
                    "error": f"run {run} waits for a permission answer on toolu_ask_1",
                    "hint": 'send {"allow": true} or {"allow": false, "reason": "…"}',
                },
            )
            both = c.post(f"{answers}/toolu_ask_1", json={"allow": True, "result": "x"})
            assert both.status_code == 400, both.text
            assert both.json()["error"] == "allow cannot be combined with result"
            extra = c.post(f"{answers}/toolu_ask_1", json={"allow": True, "always": True})
            assert (extra.status_code, extra.json()["error"]) == (400, "unknown field 'always'")
            nobody = c.post("/v1/runs/20260101T000000-nobody00/answers/x", json={"allow": True})
            assert (nobody.status_code, nobody.json()) == (
                404,
                {
                    "error": "no run '20260101T000000-nobody00'",
                    "hint": "GET /v1/runs lists the runs",
                },
            )
            # Still parked, untouched by the refusals.
            assert c.get(f"/v1/runs/{run}").json()["status"] == "parked"
            ok = c.post(f"{answers}/toolu_ask_1", json={"allow": True})
            assert (ok.status_code, ok.json()) == (
                200,
                {"run": run, "request": "toolu_ask_1", "queued": True, "allow": True},
            )
            done = _wait(c, run)
            assert (done["status"], done["text"]) == ("completed", "Wrote answered."), done
            again = c.post(f"{answers}/toolu_ask_1", json={"allow": False})
            assert (again.status_code, again.json()["error"]) == (
                409,
                f"run {run} does not wait for 'toolu_ask_1' (it is completed)",
            )
    finally:
        _stop(worker)
    assert (shared / "out.txt").read_text(encoding="utf-8") == "answered"
    # The answer did not call the model again for the first turn, and the tool ran once.
    assert [r.payload.type for r in read_run(fleet, run, tmp_path / "reader")] == [
        "meta",
        "user",
        "assistant",
        "park",
        "claim",
        "decision",
        "tool_result",
        "assistant",
        "terminal",
    ]


def test_a_denial_over_http_reaches_the_model_with_its_reason(
    served: Served, fleet: str, tmp_path: Path
) -> None:
    model = edit_script(tmp_path, "deny", "never")
    worker = _worker(fleet, tmp_path)
    try:
        with served.client() as c:
            run = c.post(
                "/v1/runs",
                json={"prompt": "w", "model": model, "workspace": {"path": str(tmp_path)}},
            ).json()["id"]
            assert _wait(c, run)["status"] == "parked", worker.log()
            no = c.post(
                f"/v1/runs/{run}/answers/toolu_deny_1",
                json={"allow": False, "reason": "not today"},
            )
            assert (no.status_code, no.json()) == (
                200,
                {"run": run, "request": "toolu_deny_1", "queued": True, "allow": False},
            )
            assert _wait(c, run)["status"] == "completed"
    finally:
        _stop(worker)
    assert not (tmp_path / "out.txt").exists()
    results = [
        r.payload
        for r in read_run(fleet, run, tmp_path / "reader")
        if r.payload.type == "tool_result"
    ]
    assert len(results) == 1, results
    assert results[0].result.is_error, results
    assert "not today" in results[0].result.text, results


def test_concurrent_answers_to_one_question_one_wins_the_others_are_409(
    served: Served, fleet: str, tmp_path: Path
) -> None:
    """Two clients answer the same question at once (one allows, the others deny): exactly one
    gets its 200, and the run does what that answer said, not what a 409'd answer said."""
    from concurrent.futures import ThreadPoolExecutor

    model = edit_script(tmp_path, "race", "raced")
    worker = _worker(fleet, tmp_path)
    try:
        with served.client() as c:
            run = c.post(
                "/v1/runs",
                json={"prompt": "w", "model": model, "workspace": {"path": str(tmp_path)}},
            ).json()["id"]
            assert _wait(c, run)["status"] == "parked", worker.log()
        url = f"/v1/runs/{run}/answers/toolu_race_1"
        barrier = threading.Barrier(6)

        def answer(allow: bool) -> tuple[int, dict[str, Any]]:
            with served.client() as client:
                barrier.wait()
                r = client.post(url, json={"allow": allow, "reason": "raced"})
                return r.status_code, r.json()

        with ThreadPoolExecutor(6) as pool:
            got = list(pool.map(answer, [True, False, False, True, False, False]))
        won = [body for status, body in got if status == 200]
        assert len(won) == 1, got
        assert sorted(status for status, _ in got) == [200, 409, 409, 409, 409, 409], got
        with served.client() as c:
            done = _wait(c, run)
    finally:
        _stop(worker)
    assert done["status"] == "completed", done
    assert (tmp_path / "out.txt").exists() == won[0]["allow"], (won, done)


def test_a_deferred_tool_gets_its_result_over_http(
    served: Served, fleet: str, tmp_path: Path
) -> None:
    from keel.fleet.worker import Worker

    calls: list[str] = []

    @tool
    async def approve_budget(ctx: ToolContext, amount: int) -> str:
        """Ask finance to approve a budget.

        Args:
            amount: Dollars.
        """
        calls.append(str(amount))
        raise AnswerLater(f"finance reviews {amount} dollars")

    model = script(
        tmp_path / "later.json",
        [
            {
                "tool_calls": [
                    {"id": "toolu_later_1", "name": "approve_budget", "input": {"amount": 500}}
                ]
            },
            {"text": "Budget settled.", "expect": {"last_user_contains": "approved by Ann"}},
        ],
    )
    worker = Worker(
        fleet,
        scratch=tmp_path / "scratch",
        name="lib",
        tools=[approve_budget],
        env={**os.environ, "KEEL_WORKSPACE_ROOTS": str(tmp_path)},
    )
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=lambda: loop.run_until_complete(worker.run()), daemon=True)
    thread.start()
    try:
        with served.client() as c:
            run = c.post(
                "/v1/runs",
                json={
                    "prompt": "get the budget approved",
                    "model": model,
                    "mode": "bypass",
                    "workspace": {"path": str(tmp_path)},
                },
            ).json()["id"]
            parked = _wait(c, run)
            assert parked["status"] == "parked", parked
            assert parked["waits_on"]["waits_for"] == "deferred", parked
            url = f"/v1/runs/{run}/answers/toolu_later_1"
            wrong = c.post(url, json={"allow": True})
            assert (wrong.status_code, wrong.json()) == (
                400,
                {
                    "error": f"run {run} waits for the result of approve_budget "
                    "(toolu_later_1), not a permission",
                    "hint": 'send {"result": "…", "is_error": false}',
                },
            )
            ok = c.post(url, json={"result": "approved by Ann"})
            assert (ok.status_code, ok.json()) == (
                200,
                {"run": run, "request": "toolu_later_1", "queued": True, "is_error": False},
            )
            done = _wait(c, run)
    finally:
        loop.call_soon_threadsafe(worker.stop)
        thread.join(30)
        loop.close()
    assert (done["status"], done["text"]) == ("completed", "Budget settled."), done
    assert calls == ["500"]  # never called again
    results = [
        r.payload
        for r in read_run(fleet, run, tmp_path / "reader")
        if r.payload.type == "tool_result"
    ]
    assert [r.result.text for r in results] == ["approved by Ann"]


def test_cancel_and_wait_over_http(served: Served, fleet: str, tmp_path: Path) -> None:
    model = edit_script(tmp_path, "never", "never")
    with served.client() as c:
        run = c.post(
            "/v1/runs",
            json={"prompt": "x", "model": model, "mode": "accept-edits", "workspace": "none"},
        ).json()["id"]
        # No worker: the wait answers after its timeout with the run as it is.
        started = time.monotonic()
        queued = c.get(f"/v1/runs/{run}/wait", params={"timeout": "0.5"})
        took = time.monotonic() - started
        assert (queued.status_code, queued.json()["status"]) == (200, "queued"), queued.text
        assert 0.5 <= took < 10, took
        for bad in ("-1", "301", "nan", "soon"):
            r = c.get(f"/v1/runs/{run}/wait", params={"timeout": bad})
            assert (r.status_code, r.json()) == (
                400,
                {
                    "error": f"timeout must be from 0 to 300 seconds, not {bad!r}",
                    "hint": "e.g. ?timeout=30 (the wait answers with the run as it is then; ask "
                    "again)",
                },
            )
        cancelled = c.post(f"/v1/runs/{run}/cancel")
        assert cancelled.status_code == 200, cancelled.text
        assert (cancelled.json()["status"], cancelled.json()["cancel_requested"]) == (
            "queued",
            True,
        )
        missing = c.post("/v1/runs/20260101T000000-nobody00/cancel")
        assert (missing.status_code, missing.json()) == (
            404,
            {"error": "no run '20260101T000000-nobody00'", "hint": "GET /v1/runs lists the runs"},
        )
        worker = _worker(fleet, tmp_path)
        try:
            done = _wait(c, run)
        finally:
            _stop(worker)
        assert done["status"] == "cancelled", (done, worker.log())
        # Cancelling a run that is over answers with it as it is.
        again = c.post(f"/v1/runs/{run}/cancel")
        assert (again.status_code, again.json()) == (200, done)
    assert not (tmp_path / "out.txt").exists()


# -- refusals --------------------------------------------------------------------------------------


def test_bad_run_requests_are_400_in_one_line_and_nothing_is_queued(
    served: Served, fleet: str, tmp_path: Path
) -> None:
    cases: list[tuple[Any, str]] = [
        ({"model": "scripted:hello"}, "prompt is missing or empty"),
        ({"prompt": "  "}, "prompt is missing or empty"),
        ({"prompt": "p"}, "workspace is missing"),
        ({"prompt": "p", "mode": "yolo"}, "unknown mode 'yolo'"),
        ({"prompt": "p", "stream": True}, "unknown field 'stream'"),
        ({"prompt": "p", "workspace": "ext::sh -c 'touch /tmp/pwned'"}, "ext"),
        ({"prompt": "p", "workspace": {"git": "ext::sh -c id"}}, "ext"),
        ({"prompt": "p", "workspace": {"path": "relative/dir"}}, "not an absolute path"),
        (
            {"prompt": "p", "workspace": {"path": "/x", "git": "https://h/r"}},
            "unknown or conflicting",
        ),
        (
            {"prompt": "p", "workspace": "none", "max_turns": 0},
            "max_turns must be from 1 to 100000 turns, not 0",
        ),
        (
            {"prompt": "p", "workspace": "none", "max_turns": True},
            "max_turns must be a whole number or null",
        ),
        (
            {"prompt": "p", "workspace": "none", "max_turns": 2.5},
            "max_turns must be a whole number or null",
        ),
        (
            {"prompt": "p", "workspace": "none", "max_tokens_budget": -1},
            "max_tokens_budget must be from 0",
        ),
        (
            {"prompt": "p", "workspace": "none", "max_budget_usd": 0},
            "max_budget_usd must be a positive amount",
        ),
        (
            {"prompt": "p", "workspace": "none", "max_attempts": 0},
            "max_attempts must be from 1 to 100 attempts, not 0",
        ),
        ({"prompt": 7}, "prompt must be a string, not a number"),
        (["p"], "the body must be a JSON object"),
    ]
    with served.client() as c:
        for body, needle in cases:
            r = c.post("/v1/runs", json=body)
            assert r.status_code == 400, (body, r.text)
            error = r.json()
            assert set(error) == {"error", "hint"}, error
            assert needle in error["error"], (body, error)
            assert "\n" not in error["error"] + error["hint"], error
        # Python's json reads NaN and Infinity: they are not amounts.
        for raw in (
            b'{"prompt": "p", "workspace": "none", "max_budget_usd": NaN}',
            b'{"prompt": "p", "workspace": "none", "max_budget_usd": Infinity}',
        ):
            r = c.post("/v1/runs", content=raw, headers={"content-type": "application/json"})
            assert r.status_code == 400, r.text
            assert r.json()["error"].startswith("max_budget_usd must be a positive amount"), r.text
        # A dot in a run id would name another kind of KV key (an answer, a cancel flag).
        for path in ("/v1/runs/x.answer.y", "/v1/runs/x.cancel/wait"):
            r = c.get(path)
            assert r.status_code == 400, (path, r.text)
            assert r.json()["error"].endswith("is not a run id"), r.text
        missing = c.get("/v1/runs/20260101T000000-nobody00")
        assert (missing.status_code, missing.json()) == (
            404,
            {"error": "no run '20260101T000000-nobody00'", "hint": "GET /v1/runs lists the runs"},
        )
        assert c.get("/v1/runs").json() == {"runs": [], "total": 0, "more": 0}
    assert _queue_depth(fleet) == (0, 0)


def test_without_fleet_the_run_routes_are_404_with_a_hint(servers: Servers) -> None:
    served = servers.start()
    no_fleet = {
        "error": "this server does not front a fleet",
        "hint": "start keel serve with --fleet (KEEL_NATS_URL or the local fleet) or "
        "--fleet nats://HOST:PORT",
    }
    with served.client() as c:
        for method, path in (
            ("GET", "/v1/runs"),
            ("POST", "/v1/runs"),
            ("GET", "/v1/runs/20260101T000000-abcdefgh"),
            ("POST", "/v1/runs/20260101T000000-abcdefgh/cancel"),
            ("POST", "/v1/runs/20260101T000000-abcdefgh/answers/toolu_1"),
            ("GET", "/v1/runs/20260101T000000-abcdefgh/wait"),
            ("GET", "/v1/runs/not.a.run/wait"),
            ("GET", "/v1/runs/events"),
            ("GET", "/metrics"),
            ("GET", "/v1/workers"),
            ("POST", "/v1/runs/20260101T000000-abcdefgh/retry"),
            ("GET", "/v1/runs/20260101T000000-abcdefgh/journal"),
        ):
            r = c.request(
                method,
                path,
                json={"prompt": "p", "workspace": "none"} if method == "POST" else None,
            )
            assert (r.status_code, r.json()) == (404, no_fleet), (method, path)


def test_the_fleet_routes_need_the_token_and_the_host(served: Served) -> None:
    for token in (None, "wrong-token-0123456789abcdef"):
        with served.client(token) as c:
            for method, path in (("GET", "/v1/runs"), ("POST", "/v1/runs")):
                r = c.request(
                    method,
                    path,
                    json={"prompt": "p", "workspace": "none"} if method == "POST" else None,
                )
                assert r.status_code == 401, (token, path, r.text)
                assert r.json()["error"] == (
                    "no bearer token" if token is None else "wrong bearer token"
                )
                assert r.headers["www-authenticate"] == "Bearer"
    with served.client(host="evil.example") as c:
        r = c.post("/v1/runs", json={"prompt": "p", "workspace": "none"})
        assert r.status_code == 403, r.text
    with served.client(None) as c:
        r = c.get("/v1/runs", params={"token": TOKEN})
        assert (r.status_code, r.json()["error"]) == (
            401,
            "a token in the query string is accepted only on the event streams (…/events, …/journal)",
        )
    with served.client() as c:
        assert c.get("/v1/runs").json() == {"runs": [], "total": 0, "more": 0}  # nothing queued


def test_nats_down_is_503_in_one_line_without_the_password_and_the_server_reconnects(
    servers: Servers,
    nats_server: NatsServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    setup_fleet(nats_server.url)
    secret = "hunter2-secret-pass"
    url = f"nats://keel:{secret}@127.0.0.1:{nats_server.port}"
    served = servers.start("--fleet", url, lines=2)
    assert served.lines[1] == (
        f"keel serve: fronting the fleet at nats://keel:***@127.0.0.1:{nats_server.port} (/v1/runs)"
    )
    with served.client() as c:
        assert c.get("/v1/runs").json() == {"runs": [], "total": 0, "more": 0}
        nats_server.stop()
        for method, path in (
            ("GET", "/v1/runs"),
            ("POST", "/v1/runs"),
            ("GET", "/v1/runs/20260101T000000-abcdefgh/wait"),
        ):
            r = c.request(
                method,
                path,
                json={"prompt": "p", "workspace": "none"} if method == "POST" else None,
            )
            assert r.status_code == 503, (path, r.text)
            body = r.json()
            assert set(body) == {"error", "hint"}, body
            assert "\n" not in body["error"] + body["hint"], body
            assert secret not in r.text, r.text
            assert "NATS server" in body["error"], body
        # The same server again (same port, same store): the next request connects again.
        again = NatsServer(nats_server.store, port=nats_server.port)
        try:
            r = c.get("/v1/runs")
            assert (r.status_code, r.json()) == (200, {"runs": [], "total": 0, "more": 0}), r.text
        finally:
            again.stop()
    assert secret not in servers.errors()
    assert "Traceback" not in servers.errors()


def test_a_nats_server_without_the_fleets_streams_is_503_with_the_setup_hint(
    servers: Servers,
    nats_url: str,  # noqa: F811
) -> None:
    served = servers.start("--fleet", nats_url, lines=2)
    with served.client() as c:
        for method, path in (("GET", "/v1/runs"), ("POST", "/v1/runs")):
            r = c.request(
                method,
                path,
                json={"prompt": "p", "workspace": "none"} if method == "POST" else None,
            )
            assert (r.status_code, r.json()) == (
                503,
                {
                    "error": "the fleet's bucket keel-runs does not exist on this server "
                    "(BucketNotFoundError)",
                    "hint": "create the fleet's streams with `keel fleet init` (or `keel fleet "
                    "up`)",
                },
            ), (method, r.text)
    assert "Traceback" not in servers.errors()


def test_serve_refuses_a_fleet_it_cannot_find_or_reach(servers: Servers) -> None:
    env = {**os.environ, "KEEL_SERVER_TOKEN": TOKEN, "KEEL_NATS_URL": ""}
    nowhere = subprocess.run(
        [sys.executable, "-m", "keel", "serve", "--port", "0", "--fleet"],
        cwd=servers.project,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (nowhere.returncode, nowhere.stdout) == (2, ""), nowhere
    assert nowhere.stderr.startswith(
        "keel: error: no fleet server: KEEL_NATS_URL is not set and no local fleet is up"
    ), nowhere
    assert len(nowhere.stderr.splitlines()) == 1, nowhere
    assert "(hint: start one with `keel fleet up`" in nowhere.stderr, nowhere
    assert "Traceback" not in nowhere.stderr, nowhere
    port = free_port()
    closed = subprocess.run(
        [
            sys.executable,
            "-m",
            "keel",
            "serve",
            "--port",
            "0",
            "--fleet",
            f"nats://127.0.0.1:{port}",
        ],
        cwd=servers.project,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (closed.returncode, closed.stdout) == (2, ""), closed
    assert closed.stderr.startswith(
        f"keel: error: cannot connect to the fleet's NATS server at nats://127.0.0.1:{port}"
    ), closed
    assert len(closed.stderr.splitlines()) == 1, closed  # one line, with its hint


def test_openapi_lists_the_fleet_routes(served: Served) -> None:
    from keel.server.openapi import spec

    document = spec()
    runs = {
        (method, path)
        for path, operations in document["paths"].items()
        if path.startswith("/v1/runs")
        for method in operations
    }
    assert runs == {
        ("get", "/v1/runs"),
        ("post", "/v1/runs"),
        ("get", "/v1/runs/{id}"),
        ("post", "/v1/runs/{id}/cancel"),
        ("post", "/v1/runs/{id}/answers/{request_id}"),
        ("get", "/v1/runs/{id}/wait"),
        ("post", "/v1/runs/{id}/retry"),
        ("get", "/v1/runs/{id}/journal"),
        ("get", "/v1/runs/events"),
    }
    assert list(document["paths"]["/metrics"]) == ["get"]
    assert list(document["paths"]["/v1/workers"]) == ["get"]
    submit = document["paths"]["/v1/runs"]["post"]
    schema = submit["requestBody"]["content"]["application/json"]["schema"]
    assert schema["required"] == ["prompt", "workspace"]
    assert sorted(schema["properties"]) == sorted(
        [
            "prompt",
            "model",
            "mode",
            "workspace",
            "max_turns",
            "max_tokens_budget",
            "max_budget_usd",
            "no_check",
            "max_attempts",
            "priority",
            "needs",
            "notify",
        ]
    )
    from keel.server.fleet_routes import SUBMIT_FIELDS

    assert sorted(schema["properties"]) == sorted(SUBMIT_FIELDS)  # the body the route reads
    assert set(submit["responses"]) == {"201", "400", "401", "403", "404", "503"}
    with served.client(None) as c:
        served_doc = c.get("/openapi.json")
    assert (served_doc.status_code, served_doc.json()) == (200, document)


def test_redact_hides_passwords_only() -> None:
    from keel.server.fleet_routes import redact

    assert redact("nats://127.0.0.1:4222") == "nats://127.0.0.1:4222"
    assert redact("nats://u:p@h:1,tls://v:q@[::1]:2") == "nats://u:***@h:1,tls://v:***@[::1]:2"
    assert redact("nats://tok@h:4222") == "nats://***@h:4222"


# -- a view of the fleet: paging, run events, metrics ---------------------------------------------


def _put(url: str, *changes: tuple[str, dict[str, Any]]) -> None:
    from keel.fleet.runs import Fleet

    async def go() -> None:
        fleet = await Fleet.open(url)
        try:
            for run, fields in changes:
                await fleet.put_summary(run, **fields)
        finally:
            await fleet.close()

    asyncio.run(go())


def _kv_consumers(url: str) -> int:
    from keel.fleet.runs import Fleet

    async def go() -> int:
        fleet = await Fleet.open(url)
        try:
            info = await fleet.js.stream_info("KV_keel-runs")
            return int(info.state.consumer_count or 0)
        finally:
            await fleet.close()

    return asyncio.run(go())


def test_runs_are_listed_by_status_a_page_at_a_time_over_http(served: Served, fleet: str) -> None:
    _put(
        fleet,
        *(
            (f"r{i}", {"status": s, "submitted": f"2026-01-01T00:00:0{i}Z"})
            for i, s in enumerate(["completed", "queued", "parked", "error", "running"])
        ),
    )
    with served.client() as c:
        r = c.get("/v1/runs", params=[("status", "active"), ("limit", "2")])
        assert r.status_code == 200, r.text
        body = r.json()
        assert ([s["id"] for s in body["runs"]], body["total"], body["more"]) == (
            ["r4", "r2"],
            3,
            1,
        )
        r = c.get("/v1/runs", params={"status": "active", "limit": "2", "after": "r2"})
        assert ([s["id"] for s in r.json()["runs"]], r.json()["more"]) == (["r1"], 0)
        r = c.get("/v1/runs")
        assert [s["id"] for s in r.json()["runs"]] == ["r4", "r3", "r2", "r1", "r0"]
        r = c.get("/v1/runs", params={"status": "runing"})
        assert r.status_code == 400
        assert r.json()["error"] == "'runing' is not a run status", r.json()
        r = c.get("/v1/runs", params={"limit": "0"})
        assert r.json() == {
            "error": "limit must be a whole number from 1 to 1000000, not '0'",
            "hint": "",
        }
        r = c.post(
            "/v1/runs",
            json={"prompt": "p", "workspace": "none", "notify": "ftp://h/x", "no_check": True},
        )
        assert (r.status_code, r.json()["error"]) == (
            400,
            "--notify 'ftp://h/x' is not an http or https URL",
        )


def test_run_events_stream_each_status_change_as_server_sent_events(
    served: Served, fleet: str
) -> None:
    import json

    got: list[dict[str, Any]] = []
    lines: list[str] = []

    def listen() -> None:
        # EventSource cannot send headers: the token goes in the query string.
        with (
            served.client(None) as c,
            c.stream(
                "GET", "/v1/runs/events", params={"token": TOKEN, "status": "parked,completed"}
            ) as r,
        ):
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            for line in r.iter_lines():
                lines.append(line)
                if line.startswith("data: "):
                    got.append(json.loads(line[6:]))
                    if len(got) == 2:
                        return

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while _kv_consumers(fleet) == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    waits = {"request": "toolu_1", "tool": "write", "waits_for": "permission"}
    _put(
        fleet,
        ("s1", {"status": "queued", "submitted": "2026"}),
        ("s1", {"status": "running"}),
        ("s1", {"status": "parked", "waits_on": waits}),
        ("s1", {"status": "queued"}),
        ("s1", {"status": "completed", "text": "done"}),
    )
    thread.join(30)
    assert not thread.is_alive(), lines
    assert lines[:2] == ["retry: 1000", ""], lines
    assert [line for line in lines if line.startswith("event:")] == ["event: change"] * 2
    for item in got:
        assert item.pop("at").startswith("20"), item
        assert item.pop("summary")["id"] == "s1"
    assert got == [
        {"run": "s1", "status": "parked", "previous": "running", "waits_on": waits},
        {"run": "s1", "status": "completed", "previous": "queued"},
    ]


def _parse_prometheus(text: str) -> dict[str, float]:
    """Text format 0.0.4, strictly: HELP then TYPE then the family's samples, each sample a
    name of its family (with a _count/_sum/_total suffix where the type has them), optional
    labels, a float; the text ends with a newline. Returns {sample with labels: value}."""
    import re

    assert text.endswith("\n"), text
    samples: dict[str, float] = {}
    family, kind = "", ""
    helped: set[str] = set()
    sample = re.compile(
        r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[a-zA-Z_][a-zA-Z0-9_]*="[^"\\]*"\})? (\S+)$'
    )
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, help_text = line[7:].partition(" ")
            assert help_text, line
            assert name not in helped, line
            helped.add(name)
        elif line.startswith("# TYPE "):
            family, _, kind = line[7:].partition(" ")
            assert family in helped, line
            assert kind in ("counter", "gauge", "summary", "histogram"), line
        else:
            m = sample.match(line)
            assert m is not None, line
            name = m.group(1)
            allowed = {family} | (
                {f"{family}_count", f"{family}_sum"} if kind == "summary" else set()
            )
            assert name in allowed, (line, family, kind)
            if kind == "counter":
                assert name.endswith("_total"), line
            key = name + (m.group(2) or "")
            assert key not in samples, line
            samples[key] = float(m.group(3))
    return samples


def test_metrics_are_prometheus_text_with_queue_runs_workers_pickup_and_attempts(
    served: Served, fleet: str
) -> None:
    from keel.fleet.runs import Fleet, RunRequest

    _put(
        fleet,
        ("m1", {"status": "completed", "attempts": 2, "pickup_s": 4.5}),
        ("m2", {"status": "completed", "attempts": 1}),
        ("m3", {"status": "failed", "attempts": 3, "pickup_s": [2.0, 3.5]}),
        ("m4", {"status": "parked", "attempts": 1}),
    )

    async def seed() -> None:
        f = await Fleet.open(fleet)
        try:
            await f.submit(RunRequest("m5", "p", workspace={}))  # queued, no worker: waits
            workers = await f.js.key_value("keel-workers")
            now = time.time()
            for name, beat in (("a", now), ("b", now), ("silent", now - 60)):
                entry = {"name": name, "beat_at": beat}
                await workers.put(f"w-{name}", json.dumps(entry).encode())
            await workers.put(
                "w-leaving",
                json.dumps({"name": "leaving", "beat_at": now, "stopping": True}).encode(),
            )
        finally:
            await f.close()

    asyncio.run(seed())
    with served.client() as c:
        r = c.get("/metrics")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert _parse_prometheus(r.text) == {
        "keel_fleet_queue_messages": 1.0,
        "keel_fleet_queue_in_flight": 0.0,
        'keel_fleet_runs{status="completed"}': 2.0,
        'keel_fleet_runs{status="failed"}': 1.0,
        'keel_fleet_runs{status="parked"}': 1.0,
        'keel_fleet_runs{status="queued"}': 1.0,
        'keel_fleet_runs{status="running"}': 0.0,
        "keel_fleet_workers": 2.0,
        "keel_fleet_pickup_seconds_count": 3.0,
        "keel_fleet_pickup_seconds_sum": 10.0,
        "keel_fleet_attempts_total": 7.0,
    }
    with served.client(None) as c:
        assert c.get("/metrics").status_code == 401  # behind the token like every route
