"""Benchmark: `keel sessions list` over 1,000 sessions, as a whole process (target ≤ 150 ms).

The sessions are bench_journal.py's (41 records each, one project); the command runs from the
project with an isolated `KEEL_HOME`, once to warm the page cache, then `--repeats` times. The
same process is also timed for `keel --version`, the floor of any `keel` command on this machine.

Run: `python bench/bench_sessions_list.py [--repeats 9] [--json out.json]`. Nothing is asserted.
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

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_journal import write_session  # noqa: E402
from keel.session.store import project_key  # noqa: E402


def timed(cmd: list[str], cwd: Path, env: dict[str, str], repeats: int) -> list[float]:
    subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, check=True)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, check=True)
        times.append((time.perf_counter() - start) * 1000)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="keel-bench-list-") as tmp:
        home = Path(tmp) / "home"
        cwd = home / "project"
        cwd.mkdir(parents=True)
        directory = home / "sessions" / project_key(cwd)
        for i in range(args.sessions):
            sid = f"20261130-{i // 3600:02d}{i // 60 % 60:02d}{i % 60:02d}-{i:06x}"
            write_session(directory / f"{sid}.jsonl", 41, sid)
        env = {**os.environ, "KEEL_HOME": str(home)}
        keel = [sys.executable, "-m", "keel"]
        out = subprocess.run(
            [*keel, "sessions", "list"], cwd=cwd, env=env, capture_output=True, text=True
        )
        assert len(out.stdout.splitlines()) == args.sessions + 1, out.stdout[:500] + out.stderr
        listing = timed([*keel, "sessions", "list"], cwd, env, args.repeats)
        version = timed([*keel, "--version"], cwd, env, args.repeats)
    results = {
        "sessions_list_ms": {"median": statistics.median(listing), "best": min(listing)},
        "version_ms": {"median": statistics.median(version), "best": min(version)},
    }
    for key, value in results.items():
        print(f"{key:<20} median {value['median']:7.1f}  best {value['best']:7.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
