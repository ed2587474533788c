"""Benchmark: `keel bench --models scripted:oracle` over the built-in suite.

Runs the whole suite N times (default 3) with each task's oracle, through the real runner (one
`keel -p` process per task, real tools, real graders), in an isolated keel home, and reports:
- the wall time of one run of the suite (median, min, max) and the pass rate;
- per task: the median wall time of the `keel -p` process and of its grader-included run,
  which for a scripted model is almost all harness overhead (process start, keel, the tools).

Run: `python bench/bench_bench.py [--runs N] [--json out.json]`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from keel.bench import ORACLE, BenchOptions, discover, run_one


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "KEEL_HOME": home, "KEEL_CONFIG_DIR": f"{home}/config"}
        options = BenchOptions(env=env)
        tasks = discover(Path(home))
        suite: list[float] = []
        per_task: dict[str, list[float]] = {t.name: [] for t in tasks}
        per_run: dict[str, list[float]] = {t.name: [] for t in tasks}
        passed = graded = 0
        for _ in range(args.runs):
            started = time.monotonic()
            for task in tasks:
                t0 = time.monotonic()
                result = run_one(task, ORACLE, 1, options)
                per_run[task.name].append(time.monotonic() - t0)
                per_task[task.name].append(result.overhead_s)
                graded += result.status != "skipped"
                passed += result.passed
            suite.append(time.monotonic() - started)
    out = {
        "runs": args.runs,
        "tasks": len(tasks),
        "pass_rate": passed / graded if graded else 0.0,
        "suite_s": {
            "median": round(statistics.median(suite), 2),
            "min": round(min(suite), 2),
            "max": round(max(suite), 2),
        },
        "per_task": {
            name: {
                "keel_p_overhead_s": round(statistics.median(per_task[name]), 3),
                "with_setup_and_grading_s": round(statistics.median(per_run[name]), 3),
            }
            for name in per_task
        },
    }
    print(json.dumps(out, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
