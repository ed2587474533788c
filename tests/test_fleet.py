"""Fleet mode end to end: `keel submit`, `keel worker` processes and `keel runs` on a real
nats-server, scripted models, real tools. What is asserted is what a user sees (summaries, exit
codes) and what the journal holds (the record sequence in JetStream)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from keel.session.fold import fold
from keel.tools.base import AnswerLater, ToolContext, tool
from tests.fleet_helpers import (
    WorkerProc,
    edit_script,
    keel,
    keel_json,
    read_run,
    script,
    setup_fleet,
    wait_for,
)
from tests.nats_fixture import nats_server, nats_url  # noqa: F401

pytestmark = [pytest.mark.needs("nats-server")]


@pytest.fixture
def fleet(nats_url: str, tmp_path: Path) -> str:  # noqa: F811
    setup_fleet(nats_url)
    return nats_url


def _types(url: str, run: str, tmp: Path) -> list[str]:
    return [r.payload.type for r in read_run(url, run, tmp / "reader")]


def _submit(url: str, *args: str) -> str:
    out = keel("submit", "--nats", url, *args)
    assert out.returncode == 0, out
    run = out.stdout.strip()
    assert run, out
    assert "\n" not in run, out
    return run


def _wait(url: str, *runs: str, timeout: float = 90) -> list[dict[str, Any]]:
    out = keel(
        "runs",
        "--nats",
        url,
        "wait",
        *runs,
        "--timeout",
        str(timeout),
        "--json",
        timeout=timeout + 30,
    )
    assert out.returncode in (0, 1), out
    summaries: list[dict[str, Any]] = json.loads(out.stdout)
    return summaries


def test_submitted_runs_complete_on_a_worker_and_their_journals_are_in_jetstream(
    fleet: str, tmp_path: Path
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    runs = []
    for i in range(3):
        model = edit_script(tmp_path, f"r{i}", f"marker-{i}")
        (shared / f"d{i}").mkdir()
        runs.append(
            _submit(
                fleet,
                f"write marker {i}",
                "--model",
                model,
                "--mode",
                "accept-edits",
                "--workspace",
                f"path:{shared / f'd{i}'}",
            )
        )
    worker = WorkerProc(fleet, tmp_path / "scratch", "w1", concurrency=2)
    try:
        done = _wait(fleet, *runs)
    finally:
        assert worker.terminate() == 0, worker.log()
        worker.close()
    by_id = {s["id"]: s for s in done}
    for i, run in enumerate(runs):
        s = by_id[run]
        assert (s["status"], s["text"], s["turns"], s["worker"]) == (
            "completed",
            f"Wrote marker-{i}.",
            2,
            "w1",
        ), s
        assert (shared / f"d{i}" / "out.txt").read_text() == f"marker-{i}"
        assert _types(fleet, run, tmp_path) == [
            "meta",
            "user",
            "assistant",
            "decision",
            "tool_result",
            "assistant",
            "terminal",
        ]
    listed = keel_json("runs", "--nats", fleet, "list")
    assert sorted(s["id"] for s in listed) == sorted(runs)
    shown = keel("runs", "--nats", fleet, "show", runs[0])
    assert shown.returncode == 0, shown
    assert "status: completed" in shown.stdout, shown


def test_a_question_parks_the_run_and_an_answer_resumes_it_without_a_model_call(
    fleet: str, tmp_path: Path
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    # default mode: the edit asks; nobody is there, so the run parks.
    model = edit_script(tmp_path, "ask", "answered")
    run = _submit(fleet, "write it", "--model", model, "--workspace", f"path:{shared}")
    worker = WorkerProc(fleet, tmp_path / "scratch", "w1")
    try:
        (parked,) = _wait(fleet, run)
        assert parked["status"] == "parked", (parked, worker.log())
        assert parked["waits_on"]["request"] == "toolu_ask_1"
        assert parked["waits_on"]["tool"] == "write"
        assert not (shared / "out.txt").exists()
        listed = keel("runs", "--nats", fleet, "list")
        assert "parked: waits for permission on write" in listed.stdout, listed
        assert "toolu_ask_1" in listed.stdout, listed  # the REASON column: what to answer
        # The worker is free: a second run completes meanwhile.
        other = _submit(
            fleet,
            "x",
            "--model",
            edit_script(tmp_path, "b", "b"),
            "--mode",
            "accept-edits",
            "--workspace",
            f"path:{tmp_path}",
        )
        (second,) = _wait(fleet, other)
        assert second["status"] == "completed", second
        wrong = keel("runs", "--nats", fleet, "answer", run, "toolu_nope", "allow")
        assert wrong.returncode != 0, wrong
        assert "does not wait for 'toolu_nope'" in wrong.stderr, wrong
        answered = keel("runs", "--nats", fleet, "answer", run, "toolu_ask_1", "allow")
        assert answered.returncode == 0, answered
        (done,) = _wait(fleet, run)
    finally:
        worker.terminate()
        worker.close()
    assert (done["status"], done["text"]) == ("completed", "Wrote answered."), done
    assert (shared / "out.txt").read_text() == "answered"
    records = read_run(fleet, run, tmp_path / "reader")
    types = [r.payload.type for r in records]
    # One assistant record per model call: the answer did not call the model for the first
    # turn again; the park, the claim of the second attempt, then the tool ran once.
    assert types == [
        "meta",
        "user",
        "assistant",
        "park",
        "claim",
        "decision",
        "tool_result",
        "assistant",
        "terminal",
    ], types
    assert fold(records).terminal is not None


def test_a_denied_answer_reaches_the_model_with_its_reason(fleet: str, tmp_path: Path) -> None:
    model = edit_script(tmp_path, "deny", "never")
    run = _submit(fleet, "write it", "--model", model, "--workspace", f"path:{tmp_path}")
    worker = WorkerProc(fleet, tmp_path / "scratch", "w1")
    try:
        (parked,) = _wait(fleet, run)
        assert parked["status"] == "parked", (parked, worker.log())
        out = keel(
            "runs", "--nats", fleet, "answer", run, "toolu_deny_1", "deny", "--reason", "not today"
        )
        assert out.returncode == 0, out
        (done,) = _wait(fleet, run)
    finally:
        worker.terminate()
        worker.close()
    assert done["status"] == "completed", done
    assert not (tmp_path / "out.txt").exists()
    records = read_run(fleet, run, tmp_path / "reader")
    results = [r.payload for r in records if r.payload.type == "tool_result"]
    assert len(results) == 1, results
    assert results[0].result.is_error, results
    assert "not today" in results[0].result.text, results


def test_submit_refuses_bad_input_in_one_line(fleet: str, tmp_path: Path) -> None:
    for args, needle in (
        (["--mode", "yolo"], "yolo"),
        (["--workspace", "ext::sh -c touch /tmp/x"], "ext"),
        (["--max-turns", "0"], "max-turns"),
    ):
        out = keel("submit", "--nats", fleet, "p", *args)
        assert out.returncode != 0, out
        assert out.stdout == "", out
        assert out.stderr.startswith("keel: error:"), out
        assert needle in out.stderr, out
        assert "Traceback" not in out.stderr
    nowhere = keel("runs", "list", env={**os.environ, "KEEL_NATS_URL": ""})
    assert nowhere.returncode != 0, nowhere
    assert "keel fleet up" in nowhere.stderr, nowhere


def _bash_script(tmp: Path, name: str, steps: int, side: Path, *, pause: float = 0.0) -> str:
    """A run of `steps` bash calls, each appending `<name> <step>` to `side`, then an answer."""
    turns: list[dict[str, Any]] = [
        {
            "tool_calls": [
                {
                    "id": f"toolu_{name}_{i}",
                    "name": "bash",
                    "input": {
                        "command": f"echo '{name} {i}' >> {side}"
                        + (f" && sleep {pause}" if pause else ""),
                        "description": f"step {i}",
                    },
                }
            ]
        }
        for i in range(1, steps + 1)
    ]
    turns.append({"text": f"{name} done"})
    return script(tmp / f"{name}.json", turns)


def _fast_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "KEEL_FLEET_ACK_WAIT": "2", **extra}


def test_sigterm_hands_a_run_back_at_its_loop_boundary_and_another_worker_finishes_it(
    fleet: str, tmp_path: Path
) -> None:
    side = tmp_path / "side.txt"
    model = _bash_script(tmp_path, "slow", 4, side, pause=0.7)
    run = _submit(
        fleet, "go", "--model", model, "--mode", "bypass", "--workspace", f"path:{tmp_path}"
    )
    first = WorkerProc(fleet, tmp_path / "scratch", "w1", env=_fast_env())
    try:
        wait_for(lambda: side.exists() and side.read_text().count("\n") >= 1, 60, "the first step")
        assert first.terminate() == 0, first.log()
        assert "suspended and handed back" in first.log(), first.log()
        queued = keel_json("runs", "--nats", fleet, "show", run)
        assert queued["status"] == "queued", queued
        second = WorkerProc(fleet, tmp_path / "scratch", "w2", env=_fast_env())
        try:
            (done,) = _wait(fleet, run)
        finally:
            second.terminate()
            second.close()
    finally:
        first.close()
    assert (done["status"], done["text"], done["worker"]) == ("completed", "slow done", "w2"), done
    # Each step ran exactly once: the suspend let the step in flight finish and be journaled.
    assert side.read_text().splitlines() == [f"slow {i}" for i in range(1, 5)]
    types = _types(fleet, run, tmp_path)
    assert types.count("terminal") == 2, types
    cut = types.index("terminal")
    assert types[cut + 1] == "claim", types
    records = read_run(fleet, run, tmp_path / "reader")
    assert records[cut].payload.reason == "suspended"  # type: ignore[union-attr]


def test_a_cancelled_run_stops_at_its_next_loop_boundary(fleet: str, tmp_path: Path) -> None:
    side = tmp_path / "side.txt"
    model = _bash_script(tmp_path, "long", 20, side, pause=0.3)
    run = _submit(
        fleet, "go", "--model", model, "--mode", "bypass", "--workspace", f"path:{tmp_path}"
    )
    worker = WorkerProc(fleet, tmp_path / "scratch", "w1", env=_fast_env())
    try:
        wait_for(lambda: side.exists() and side.read_text().count("\n") >= 2, 60, "two steps")
        out = keel("runs", "--nats", fleet, "cancel", run)
        assert out.returncode == 0, out
        assert out.stdout == f"run {run}: cancel requested\n", out
        (done,) = _wait(fleet, run)
    finally:
        worker.terminate()
        worker.close()
    assert done["status"] == "cancelled", done
    steps = side.read_text().splitlines()
    assert 2 <= len(steps) < 20, steps
    assert steps == [f"long {i}" for i in range(1, len(steps) + 1)]
    records = read_run(fleet, run, tmp_path / "reader")
    assert [r.payload.type for r in records][-2:] == ["terminal", "terminal"]
    assert [r.payload.reason for r in records[-2:]] == ["suspended", "cancelled"]  # type: ignore[union-attr]
    again = keel("runs", "--nats", fleet, "cancel", run)
    assert again.stdout == f"run {run}: cancelled\n", again


def test_a_redelivered_run_whose_journal_is_complete_is_answered_from_it(
    fleet: str, tmp_path: Path
) -> None:
    import asyncio

    from keel.fleet.runs import Fleet, RunRequest

    model = edit_script(tmp_path, "once", "once")
    run = _submit(
        fleet, "w", "--model", model, "--mode", "accept-edits", "--workspace", f"path:{tmp_path}"
    )
    worker = WorkerProc(fleet, tmp_path / "scratch", "w1")
    try:
        (done,) = _wait(fleet, run)
        assert done["status"] == "completed", done
        before = _types(fleet, run, tmp_path)

        async def redeliver() -> (
            None
        ):  # what a worker killed between its terminal and its ack leaves
            client = await Fleet.open(fleet)
            try:
                summary = await client.summary(run)
                assert summary is not None
                req = RunRequest(**summary["request"])
                await client.put_summary(run, status="queued")
                await client.enqueue(req, f"{run}-again")
            finally:
                await client.close()

        asyncio.run(redeliver())
        (again,) = _wait(fleet, run)
    finally:
        worker.terminate()
        worker.close()
    assert (again["status"], again["text"], again["answered_from_journal"]) == (
        "completed",
        "Wrote once.",
        True,
    ), again
    assert _types(fleet, run, tmp_path) == [*before, "claim"]  # no model call, no tool again


def test_keel_p_keeps_its_session_in_jetstream_with_keel_store(fleet: str, tmp_path: Path) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    model = script(
        tmp_path / "two.json",
        [{"text": "first answer"}, {"text": "second answer"}],
    )
    env = {**os.environ, "KEEL_STORE": fleet}
    out = subprocess.run(
        [sys.executable, "-m", "keel", "-p", "hello", "--model", model, "--output-format", "json"],
        cwd=project, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out
    result = json.loads(out.stdout)
    session = result["session_id"]
    assert result["result"] == "first answer"
    listed = subprocess.run(
        [sys.executable, "-m", "keel", "sessions", "list", "--json"],
        cwd=project, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    assert [(r["id"], r["status"]) for r in rows] == [(session, "completed")], listed
    again = subprocess.run(
        [sys.executable, "-m", "keel", "-p", "--resume", session, "more", "--model", model],
        cwd=project, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert again.returncode == 0, again
    assert again.stdout == "second answer\n", again
    types = _types(fleet, session, tmp_path)
    assert types == [
        "meta",
        "user",
        "assistant",
        "terminal",
        "claim",
        "user",
        "assistant",
        "terminal",
    ]
    shown = subprocess.run(
        [sys.executable, "-m", "keel", "sessions", "show", session],
        cwd=project, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert shown.returncode == 0, shown
    assert "[5] claimed by worker keel pid " in shown.stdout, shown.stdout
    # Nothing went to the session files.
    home = Path(os.environ["KEEL_HOME"])
    assert list(home.glob("sessions/*/*.jsonl")) == []
    bad = subprocess.run(
        [sys.executable, "-m", "keel", "sessions", "list"],
        cwd=project, env={**os.environ, "KEEL_STORE": "redis://x"},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert bad.returncode != 0, bad
    assert bad.stderr.startswith("keel: error: KEEL_STORE='redis://x' is not a store keel knows"), (
        bad
    )


def test_a_tool_that_answers_later_parks_the_run_and_is_never_called_again(
    fleet: str, tmp_path: Path
) -> None:
    """A Python program runs a worker with its own tool; the tool says its answer comes later.
    The run parks (the worker is free), `keel runs answer … --result` supplies the answer, and
    the run goes on with it: the tool ran once, the model read the supplied result."""
    import asyncio
    import threading

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
    run = _submit(fleet, "get the budget approved", "--model", model, "--mode", "bypass",
                  "--workspace", f"path:{tmp_path}")  # fmt: skip
    worker = Worker(fleet, scratch=tmp_path / "scratch", name="lib", tools=[approve_budget],
                    env={**os.environ, "KEEL_WORKSPACE_ROOTS": str(tmp_path)})  # fmt: skip
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=lambda: loop.run_until_complete(worker.run()), daemon=True)
    thread.start()
    try:
        (parked,) = _wait(fleet, run)
        assert parked["status"] == "parked", json.dumps(parked)
        assert parked["waits_on"]["waits_for"] == "deferred", parked
        assert parked["waits_on"]["question"] == "finance reviews 500 dollars", parked
        wrong = keel("runs", "--nats", fleet, "answer", run, "toolu_later_1", "allow")
        assert wrong.returncode != 0, wrong
        assert "--result TEXT" in wrong.stderr, wrong
        out = keel("runs", "--nats", fleet, "answer", run, "toolu_later_1", "--result",
                   "approved by Ann")  # fmt: skip
        assert out.returncode == 0, out
        (done,) = _wait(fleet, run)
    finally:
        loop.call_soon_threadsafe(worker.stop)
        thread.join(30)
        loop.close()
    assert (done["status"], done["text"]) == ("completed", "Budget settled."), done
    assert calls == ["500"]  # never called again
    records = read_run(fleet, run, tmp_path / "reader")
    assert [r.payload.type for r in records] == [
        "meta",
        "user",
        "assistant",
        "park",
        "claim",
        "tool_result",
        "assistant",
        "terminal",
    ]
    result = records[5].payload
    assert result.result.text == "approved by Ann"  # type: ignore[union-attr]
