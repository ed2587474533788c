"""Dead workers noticed in seconds, attempt limits, refusals and `keel workers`, on a real
nats-server with real `keel worker` processes and scripted runs (issue 29, items 1, 2 and 4).

- A worker SIGKILLed mid-run at the default ack wait: another worker takes the run again within
  10 s and finishes it; the summary's attempt log says the first attempt was lost.
- A poison run (its bash step kills the worker that runs it) ends `failed` after its attempt
  limit, naming the workers it took down; `keel runs retry` queues it again and it completes.
- A worker that cannot serve a run (no workspace roots) hands it back; a worker that can takes
  it. With only workers that cannot, the run fails with their reason.
- `keel workers` shows live workers and what each runs; a killed one goes silent.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from keel.fleet import streams
from keel.fleet.registry import Registration, read_workers, stamp_beat, workers_bucket
from keel.fleet.runs import Fleet
from tests.fleet_helpers import WorkerProc, keel, keel_json, script, setup_fleet, wait_for
from tests.nats_fixture import nats_server, nats_url  # noqa: F401

pytestmark = [pytest.mark.needs("nats-server")]


def _env(**extra: str) -> dict[str, str]:
    """The test's environment without a fleet setting of the caller's, plus `extra`."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("KEEL_FLEET_ACK_WAIT", "KEEL_FLEET_MAX_ATTEMPTS")
    }
    return {**env, **extra}


async def _get(url: str, run: str) -> dict[str, Any]:
    fleet = await Fleet.open(url)
    try:
        return await fleet.summary(run) or {}
    finally:
        await fleet.close()


def summary(url: str, run: str) -> dict[str, Any]:
    return asyncio.run(_get(url, run))


async def _depth(url: str) -> int:
    fleet = await Fleet.open(url)
    try:
        return (await fleet.queue_depth())[0]
    finally:
        await fleet.close()


def _steps(tmp: Path, name: str, commands: list[str]) -> str:
    turns: list[dict[str, Any]] = [
        {
            "tool_calls": [
                {
                    "id": f"toolu_{name}_{i}",
                    "name": "bash",
                    "input": {"command": command, "description": "step"},
                }
            ]
        }
        for i, command in enumerate(commands, 1)
    ]
    turns.append({"text": f"{name} finished"})
    return script(tmp / f"{name}.json", turns)


def _submit(url: str, model: str, workspace: Path, *more: str) -> str:
    workspace.mkdir(parents=True, exist_ok=True)
    out = keel(
        "submit", "--nats", url, "go", "--model", model, "--mode", "bypass",
        "--workspace", f"path:{workspace}", *more,
    )  # fmt: skip
    assert out.returncode == 0, out
    return out.stdout.strip()


def _up(worker: WorkerProc) -> None:
    wait_for(lambda: "takes runs from" in worker.log(), 60, f"worker {worker.name} to start")


def test_a_killed_worker_s_run_is_taken_again_within_10_s_at_the_default_ack_wait(
    nats_url: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    setup_fleet(nats_url)
    side = tmp_path / "ws" / "side.txt"
    model = _steps(tmp_path, "k", [f"echo {i} >> {side} && sleep 1" for i in range(1, 7)])
    run = _submit(nats_url, model, tmp_path / "ws")
    env = _env()
    first = WorkerProc(nats_url, tmp_path / "scratch", "first", env=env)
    second: WorkerProc | None = None
    try:
        wait_for(lambda: side.exists() and "2" in side.read_text(), 60, "step 2 on the first")
        second = WorkerProc(nats_url, tmp_path / "scratch", "second", env=env)
        _up(second)
        workers = {w["name"]: w for w in asyncio.run(_workers(nats_url))}
        assert workers["first"]["running"] == [run], workers
        assert workers["first"]["ack_wait"] == streams.ACK_WAIT == 8.0, workers
        first.kill()
        killed = time.monotonic()
        taken = wait_for(
            lambda: (s := summary(nats_url, run)).get("worker") == "second" and s,
            30,
            "the second worker to take the run",
        )
        pickup = time.monotonic() - killed
        done = wait_for(
            lambda: (s := summary(nats_url, run)).get("status") == "completed" and s,
            60,
            "the run to complete",
        )
    finally:
        first.close()
        if second is not None:
            second.terminate(10)
            second.close()
    print(f"pickup after a SIGKILL at the default ack wait: {pickup:.2f} s")
    assert pickup <= 10.0, (pickup, taken)
    assert (done["text"], done["attempts"], done["lost"]) == ("k finished", 2, 1), done
    log = done["attempt_log"]
    assert [(e["worker"], e["ended"]) for e in log] == [("first", "lost"), ("second", "completed")]
    assert log[0]["reason"] == "worker first stopped while running it (killed or crashed)"
    assert 0 < done["pickup_s"] <= 12.0, done  # from its last registry beat (every 2 s)
    steps = [int(x) for x in side.read_text().split()]
    assert (steps[0], steps[-1]) == (1, 6), steps
    assert len(steps) <= 7, steps  # the step in flight may repeat


async def _workers(url: str) -> list[dict[str, Any]]:
    fleet = await Fleet.open(url)
    try:
        return await read_workers(fleet)
    finally:
        await fleet.close()


#: Bash that SIGKILLs the `keel worker` process it runs under (the ancestor whose command line
#: says so; the words are put together at run time, or the bash itself and its reaper, whose
#: command lines hold this text, would match).
KILL_MY_WORKER = (
    'w=work; p=$$; while [ "$p" -gt 1 ]; do '
    "if tr '\\0' ' ' < /proc/$p/cmdline | grep -q \" keel ${w}er --nats \"; then kill -9 $p; fi; "
    "p=$(cut -d' ' -f4 /proc/$p/stat); done; sleep 5"
)


def test_a_poison_run_fails_after_its_attempt_limit_and_runs_retry_queues_it_again(
    nats_url: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    setup_fleet(nats_url)
    ws = tmp_path / "ws"
    mark = tmp_path / "cured"
    model = _steps(
        tmp_path,
        "poison",
        [f"if [ -e {mark} ]; then echo ran >> {ws}/side; else {KILL_MY_WORKER}; fi"],
    )
    run = _submit(nats_url, model, ws, "--max-attempts", "2")
    env = _env(KEEL_FLEET_ACK_WAIT="2", KEEL_NO_SANDBOX="1")
    # The first attempt gets the model's reply journaled before its bash kills the worker:
    # progress, so its loss is not counted; the next two make none and fail the run.
    pool = [WorkerProc(nats_url, tmp_path / "scratch", f"p{i}", env=env) for i in range(4)]
    try:
        failed = wait_for(
            lambda: (s := summary(nats_url, run)).get("status") == "failed" and s,
            90,
            "the poison run to fail",
        )
        dead = sorted(w.name for w in pool if w.proc.poll() is not None)
        (alive,) = [w for w in pool if w.proc.poll() is None]
        assert len(dead) == 3, [w.log() for w in pool]
        log = failed["attempt_log"]
        assert [(e["ended"], e.get("progress", False)) for e in log] == [
            ("lost", True),
            ("lost", False),
            ("lost", False),
        ], log
        took = [e["worker"] for e in log]
        assert sorted(took) == dead, (took, dead)
        assert failed["error"] == (
            f"the run was lost 2 times in a row without progress: workers {took[1]}, {took[2]} "
            "stopped while running it (killed or crashed)"
        )
        assert (failed["attempts"], failed["lost"], failed["lost_in_a_row"]) == (3, 3, 2), failed
        assert asyncio.run(_depth(nats_url)) == 0  # no more deliveries
        shown = keel("runs", "--nats", nats_url, "show", run)
        assert shown.returncode == 0, shown
        assert "attempts: 3 (3 lost)" in shown.stdout, shown.stdout
        assert f"  attempt 1: {took[0]} from " in shown.stdout, shown.stdout
        assert ", lost after some progress: " in shown.stdout, shown.stdout
        listed = keel_json("runs", "--nats", nats_url, "list")
        assert [s["status"] for s in listed if s["id"] == run] == ["failed"], listed

        refused = keel("runs", "--nats", nats_url, "retry", "nosuchrun")
        assert refused.returncode != 0, refused
        assert "no run" in refused.stderr, refused
        mark.touch()  # the poison is gone: the retried run can finish
        out = keel("runs", "--nats", nats_url, "retry", run)
        assert out.returncode == 0, out
        assert (
            out.stdout.strip() == f"run {run}: queued again; a worker resumes it from its journal"
        )
        done = wait_for(
            lambda: (s := summary(nats_url, run)).get("status") == "completed" and s,
            60,
            "the retried run to complete",
        )
        again = keel("runs", "--nats", nats_url, "retry", run)
        assert again.returncode != 0, again
        assert f"run {run} is completed: only a failed run can be retried" in again.stderr
    finally:
        for w in pool:
            w.terminate(10)
            w.close()
    assert (done["worker"], done["text"], done["lost"], done["retries"]) == (
        alive.name,
        "poison finished",
        0,
        1,
    ), done
    assert [e["ended"] for e in done["attempt_log"]] == ["lost"] * 3 + ["completed"], done
    assert (ws / "side").read_text() == "ran\n"  # resumed from the journal: the call ran once


async def _pretend_live(url: str, name: str) -> None:
    """A registry entry for a worker that is about to start (so the refusing worker is not the
    only live one), as that worker would write it."""
    fleet = await Fleet.open(url)
    try:
        kv = await workers_bucket(fleet.js, create=True)
        assert kv is not None
        await Registration(kv, name).put(stamp_beat({"name": name, "running": []}))
    finally:
        await fleet.close()


def test_a_worker_without_roots_hands_a_run_back_and_one_with_them_runs_it(
    nats_url: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    setup_fleet(nats_url)
    model = _steps(tmp_path, "m", [f"echo hi > {tmp_path / 'ws1' / 'out'}"])
    asyncio.run(_pretend_live(nats_url, "good"))
    bad = WorkerProc(nats_url, tmp_path / "scratch", "bad", env=_env(KEEL_WORKSPACE_ROOTS=""))
    good: WorkerProc | None = None
    try:
        run = _submit(nats_url, model, tmp_path / "ws1", "--no-check")  # the workers decide
        queued = wait_for(
            lambda: (s := summary(nats_url, run)).get("refused") and s, 60, "the refusal"
        )
        assert queued["status"] == "queued", queued
        ((who, reason),) = [(r["worker"], r["reason"]) for r in queued["refused"]]
        assert who == "bad", queued
        assert "KEEL_WORKSPACE_ROOTS" in reason, queued
        assert queued["note"].startswith("worker bad cannot serve it ("), queued
        good = WorkerProc(nats_url, tmp_path / "scratch", "good", env=_env())
        done = wait_for(
            lambda: (s := summary(nats_url, run)).get("status") == "completed" and s,
            60,
            "the good worker to run it",
        )
        assert done["worker"] == "good", done
        assert [(e["worker"], e["ended"]) for e in done["attempt_log"]] == [
            ("bad", "refused"),
            ("good", "completed"),
        ], done
        assert (tmp_path / "ws1" / "out").read_text() == "hi\n"
        good.terminate(10)  # a clean stop takes its registry entry with it
        names = [w["name"] for w in asyncio.run(_workers(nats_url))]
        assert names == ["bad"], names

        lone = _submit(nats_url, model, tmp_path / "ws2", "--no-check")
        failed = wait_for(
            lambda: (s := summary(nats_url, lone)).get("status") == "failed" and s,
            30,
            "the run no live worker can serve to fail",
        )
        assert failed["error"].startswith("no worker can serve this run: bad: "), failed
        assert "KEEL_WORKSPACE_ROOTS" in failed["error"], failed
        assert asyncio.run(_depth(nats_url)) == 0

        # Another live worker could serve it, but the run's limit is one refusing worker.
        asyncio.run(_pretend_live(nats_url, "other"))
        once = _submit(nats_url, model, tmp_path / "ws3", "--no-check", "--max-attempts", "1")
        limited = wait_for(
            lambda: (s := summary(nats_url, once)).get("status") == "failed" and s,
            30,
            "the run to fail at its limit of refusals",
        )
        assert limited["error"].startswith("no worker can serve this run: bad: "), limited
        assert [r["worker"] for r in limited["refused"]] == ["bad"], limited
    finally:
        bad.terminate(10)
        bad.close()
        if good is not None:
            good.close()


def test_keel_workers_shows_live_workers_and_what_they_run_and_a_killed_one_goes_silent(
    nats_url: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    setup_fleet(nats_url)

    async def drop_bucket() -> None:  # a fleet made before the bucket existed
        fleet = await Fleet.open(nats_url)
        try:
            await fleet.js.delete_key_value(streams.WORKERS_BUCKET)
        finally:
            await fleet.close()

    asyncio.run(drop_bucket())
    assert keel("workers", "--nats", nats_url).stdout.startswith("no workers")
    env = _env(KEEL_FLEET_ACK_WAIT="2")
    runs = [
        _submit(nats_url, _steps(tmp_path, f"s{i}", ["sleep 6"]), tmp_path / f"ws{i}")
        for i in range(2)
    ]
    pool = [WorkerProc(nats_url, tmp_path / "scratch", f"w{i}", env=env) for i in range(2)]
    try:
        seen = wait_for(
            lambda: (
                len(found := keel_json("workers", "--nats", nats_url)) == 2
                and all(w["running"] for w in found)
                and found
            ),
            60,
            "two workers running a run each",
        )
        assert [w["name"] for w in seen] == ["w0", "w1"], seen
        assert sorted(r for w in seen for r in w["running"]) == sorted(runs), seen
        for w in seen:
            assert (w["silent"], w["stopping"], w["labels"], w["concurrency"]) == (
                False,
                False,
                [],
                1,
            ), w
            assert w["pid"] in (p.proc.pid for p in pool), w
            assert "scripted" in w["providers"], w
            assert w["roots"] == [str(tmp_path)], w
        table = keel("workers", "--nats", nats_url).stdout.splitlines()
        assert table[0].split() == ["WORKER", "STATE", "HEARTBEAT", "BUSY", "LABELS", "RUNS"]
        row = next(line for line in table if line.startswith("w0")).split()
        assert (row[1], row[3:5], row[5:]) == (
            "live",
            ["s", "ago"],
            ["1/1", "-", *seen[0]["running"]],
        )
        os.killpg(pool[0].proc.pid, signal.SIGKILL)
        silent = wait_for(
            lambda: next(
                (w for w in keel_json("workers", "--nats", nats_url) if w["silent"]), None
            ),
            20,
            "the killed worker to go silent",
        )
        assert silent["name"] == "w0", silent
        assert silent["age"] > streams.WORKER_SILENT, silent
        assert "silent" in next(
            line
            for line in keel("workers", "--nats", nats_url).stdout.splitlines()
            if line.startswith("w0")
        )
    finally:
        for w in pool:
            w.terminate(10)
            w.close()


def test_a_worker_entry_carries_its_labels(tmp_path: Path) -> None:
    from keel.fleet.worker import Worker

    worker = Worker(
        "nats://127.0.0.1:1",
        labels=("python", "gpu"),
        name="a.b c",
        env={"KEEL_WORKSPACE_ROOTS": str(tmp_path), "KEEL_HOME": str(tmp_path)},
    )
    entry = worker.entry()
    assert (entry["name"], entry["labels"], entry["roots"], entry["running"]) == (
        "a.b c",
        ["python", "gpu"],
        [str(tmp_path)],
        [],
    )
    # No key in this environment: the local servers with a default URL, and scripted models.
    assert entry["providers"] == ["lmstudio", "ollama", "scripted", "vllm"], entry
    assert streams.worker_key("a.b c") == "a_b_c"
    assert json.loads(json.dumps(entry)) == entry
