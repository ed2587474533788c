"""Benchmark: resuming a session of 1,500 and of 10,000 records (target ≤ 50 ms / ≤ 200 ms).

What `keel -p --resume` does before it can send the next request, in-process: open the journal
for appending (`Journal.open`: lock, read, parse every record, check the torn tail), then fold the
records into the conversation (`fold`). Each size is measured twice: a session that never
compacted (every record is in the rebuilt conversation) and one that compacted every 100 records
(the shape of a long session). The parse and fold steps are also timed alone.

Run: `python bench/bench_resume.py [--repeats 7] [--json out.json]`. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_journal import assistant, result  # noqa: E402
from keel.llm.messages import Usage, user  # noqa: E402
from keel.session.fold import fold  # noqa: E402
from keel.session.journal import Journal, _parse  # noqa: E402
from keel.session.records import CompactionRecord, Meta, TerminalRecord, UserRecord  # noqa: E402


def write_session(path: Path, records: int, *, compact_every: int = 0) -> None:
    journal = Journal.create(path, Meta("bench", "/p", "anthropic/claude-sonnet-4-5"))
    journal.append(UserRecord(user("refactor every module")), durable=False)
    written, i, since = 2, 0, 0
    while written < records - 1:
        if compact_every and since >= compact_every:
            since = 0
            summary = f"<summary>Refactored modules up to {i}.</summary>"
            journal.append(
                CompactionRecord(summary, "auto", 160_000, 900, Usage(1000, 300), 0.01),
                durable=False,
            )
            written += 1
            continue
        journal.append(assistant(i), durable=False)
        journal.append(result(i), durable=False)
        written += 2
        since += 2
        i += 1
    journal.append(TerminalRecord("completed", "", i, 12.3, "refactor every module"))
    journal.close()


def timed(fn: Callable[[], object], repeats: int) -> dict[str, float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return {"median": statistics.median(times), "best": min(times)}


def measure(path: Path, repeats: int) -> dict[str, Any]:
    def resume() -> None:
        journal, loaded = Journal.open(path)
        fold(loaded.records)
        journal.close()

    data = path.read_bytes()
    records = _parse(path, data, True).records
    state = fold(records)
    return {
        "records": len(records),
        "bytes": len(data),
        "messages": len(state.messages),
        "resume_ms": timed(resume, repeats),
        "read_ms": timed(path.read_bytes, repeats),
        "parse_ms": timed(lambda: _parse(path, data, True), repeats),
        "fold_ms": timed(lambda: fold(records), repeats),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="keel-bench-resume-") as tmp:
        for records in (1_500, 10_000):
            for compact_every in (0, 100):
                path = Path(tmp) / f"s-{records}-{compact_every}.jsonl"
                write_session(path, records, compact_every=compact_every)
                name = f"{records}_{'compacting' if compact_every else 'no_compaction'}"
                results[name] = measure(path, args.repeats)
    for name, r in results.items():
        parts = "  ".join(
            f"{k[:-3]} {r[k]['median']:.1f} ({r[k]['best']:.1f})"
            for k in ("resume_ms", "read_ms", "parse_ms", "fold_ms")
        )
        print(
            f"{name:<24} {r['records']:>6} records {r['bytes'] / 1e6:5.2f} MB "
            f"{r['messages']:>5} messages  ms median (best): {parts}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
