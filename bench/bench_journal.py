"""Benchmark: the session journal.

- append rate (records/s) of realistic assistant and tool_result records, with and without fsync
- resume time for a 10,000-record session: read, parse and fold it (target ≤ 200 ms)
- `keel sessions list` for 1,000 sessions, as a whole process (target ≤ 300 ms)

Run: `python bench/bench_journal.py [--json out.json]`. Nothing here is asserted; results go to
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from keel.llm.messages import Message, Text, ToolUse, Usage, tool_result, user
from keel.session.fold import fold
from keel.session.journal import Journal, read_records
from keel.session.records import AssistantRecord, Meta, TerminalRecord, ToolResultRecord, UserRecord
from keel.session.store import project_key


def assistant(i: int) -> AssistantRecord:
    call = ToolUse(f"toolu_{i:08d}", "read", {"path": f"src/module_{i % 50}.py"})
    msg = Message(
        "assistant",
        (Text("Let me look at the next module."), call),
        "anthropic",
        "claude-sonnet-4-5",
    )
    return AssistantRecord(msg, Usage(1200 + i, 40, 30_000, 200), 0.0123, "tool_use", i)


def result(i: int) -> ToolResultRecord:
    body = "\n".join(f"{n:6d}\tdef function_{n}(x):  # line {n}" for n in range(1, 30))
    return ToolResultRecord(tool_result(f"toolu_{i:08d}", body), 0.002)


def append_rate(directory: Path, count: int, *, durable: bool) -> float:
    path = directory / f"rate-{durable}.jsonl"
    journal = Journal.create(path, Meta("bench", "/p", "anthropic/claude-sonnet-4-5"))
    start = time.perf_counter()
    for i in range(count // 2):
        journal.append(assistant(i), durable=durable)
        journal.append(result(i), durable=durable)
    journal.sync()
    elapsed = time.perf_counter() - start
    journal.close()
    return count / elapsed


def write_session(path: Path, records: int, session_id: str = "bench") -> None:
    journal = Journal.create(path, Meta(session_id, "/p", "anthropic/claude-sonnet-4-5"))
    journal.append(UserRecord(user("refactor every module")), durable=False)
    for i in range((records - 3) // 2):
        journal.append(assistant(i), durable=False)
        journal.append(result(i), durable=False)
    journal.append(
        TerminalRecord("completed", "", (records - 3) // 2, 12.3, "refactor every module")
    )
    journal.close()


def resume_time(directory: Path, records: int, repeats: int) -> tuple[float, int]:
    path = directory / "big.jsonl"
    write_session(path, records)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        state = fold(read_records(path).records)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000, len(state.messages)


def list_time(home: Path, sessions: int, repeats: int) -> float:
    cwd = home / "project"
    cwd.mkdir(parents=True)
    directory = home / "sessions" / project_key(cwd)
    for i in range(sessions):
        sid = f"20261130-{i // 3600:02d}{i // 60 % 60:02d}{i % 60:02d}-{i:06x}"
        write_session(directory / f"{sid}.jsonl", 41, sid)
    env = {**os.environ, "KEEL_HOME": str(home)}
    cmd = [sys.executable, "-m", "keel", "sessions", "list"]
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=True)
    assert len(out.stdout.splitlines()) == sessions + 1, out.stdout[:500]
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="keel-bench-journal-") as tmp:
        work = Path(tmp)
        results["append_records_per_s_fsync"] = append_rate(work, 2000, durable=True)
        results["append_records_per_s_no_fsync"] = append_rate(work, 20000, durable=False)
        ms, messages = resume_time(work, 10_000, 7)
        results["resume_10k_records_ms"] = ms
        results["resume_10k_messages"] = messages
        results["sessions_list_1000_ms"] = list_time(work / "home", 1000, 7)
    for key, value in results.items():
        print(f"{key:<32} {value:12.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
