"""Benchmark: what reading a trace costs (`keel trace stats`, `--atif`) and what exporting it to
OpenTelemetry costs while a run goes on.

- stats and ATIF on traces of 100 and 300 prompts (the sample trace of tests/trace_records.py,
  its first prompt repeated: a read, a subagent, a denied command, 4 requests per prompt);
- the OpenTelemetry sink per record (what the tracer's write pays: span bookkeeping and metric
  recording; export happens on the SDK's worker thread), and the flush at exit against a
  loopback OTLP/HTTP receiver and against a port where nothing listens.

Run: `python bench/bench_trace_export.py [--repeats N] [--json out.json]`.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.helpers import free_port
from tests.trace_records import records

from keel.trace import otel
from keel.trace.atif import to_atif
from keel.trace.stats import compute


def long_trace(prompts: int) -> list[dict[str, Any]]:
    base = records()
    first_prompt = base[1:21]
    rows = [base[0]]
    for i in range(prompts):
        for r in first_prompt:
            r = copy.deepcopy(r)
            r["seq"] = len(rows) + 1
            r["t"] += i * 10
            if "req" in r:
                r["req"] += i * 10
            data = r["data"]
            if r["kind"] == "request" and i > 0:
                data.pop("system", None)
                data.pop("tools", None)
            rows.append(r)
    return rows


class _Ok(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", "0")))
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def median_seconds(work: Any, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def export(rows: list[dict[str, Any]], url: str) -> tuple[float, float]:
    """(seconds per record in the sink, seconds of the flush at exit)."""
    exporter = otel.OtelExporter(otel.OtelConfig(url))
    otel._ACTIVE.append(exporter)
    start = time.perf_counter()
    for row in rows:
        exporter(row)
    per_record = (time.perf_counter() - start) / len(rows)
    start = time.perf_counter()
    otel.shutdown()
    return per_record, time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json")
    args = p.parse_args()
    out: dict[str, Any] = {}
    for prompts in (100, 300):
        rows = long_trace(prompts)
        out[f"stats_{prompts}_s"] = median_seconds(lambda rows=rows: compute(rows), args.repeats)
        out[f"atif_{prompts}_s"] = median_seconds(lambda rows=rows: to_atif(rows), args.repeats)
        out[f"records_{prompts}"] = len(rows)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    rows = long_trace(100)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    runs = [export(rows, url) for _ in range(args.repeats)]
    sink, flush = [r[0] for r in runs], [r[1] for r in runs]
    out["otel_sink_us_per_record"] = statistics.median(sink) * 1e6
    out["otel_flush_s_live_collector"] = statistics.median(flush)
    server.shutdown()
    out["otel_flush_s_collector_down"] = export(long_trace(5), f"http://127.0.0.1:{free_port()}")[1]
    for key, value in out.items():
        print(f"{key:32} {value:.4f}" if isinstance(value, float) else f"{key:32} {value}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
