"""bench/bench_cold_start.py keeps working: keel alone against its loopback Responses API server,
and the stage table (`--stages`, bench/cold_stages.py) with every stage of the way to the first
model request, in order. Codex is not run here (it is not a dependency)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench" / "bench_cold_start.py"


def run_bench(tmp_path: Path, *args: str) -> object:
    out = tmp_path / "out.json"
    done = subprocess.run(
        [sys.executable, str(BENCH), *args, "--runs", "1", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(out.read_text(encoding="utf-8"))


def test_keel_alone_reaches_its_first_request(tmp_path: Path) -> None:
    result = run_bench(tmp_path, "--keel-only")
    assert isinstance(result, dict)
    assert set(result) == {"keel"}
    keel = result["keel"]
    assert 0 < keel["min_ms"] <= keel["median_ms"] <= keel["max_ms"] < 60_000


def test_stages_cover_the_way_to_the_first_request_in_order(tmp_path: Path) -> None:
    rows = run_bench(tmp_path, "--stages")
    assert isinstance(rows, list)
    names = [r["stage"] for r in rows]
    for stage in (
        "interpreter start-up",
        "import keel.cli.main",
        "build_parser",
        "import keel.cli.headless",
        "import keel.agent.loop",
        "run_headless",
        "open_agent",
        "build_agent",
        "build_gate",
        "add_extensions",
        "session file",
        "undo unit",
    ):
        assert stage in names, names
    assert names[0] == "interpreter start-up"
    assert names[-1] == "first request"
    starts = [r["start_ms"] for r in rows]
    assert starts == sorted(starts)
    request = rows[-1]["start_ms"]
    by_name = {r["stage"]: r for r in rows}
    # what comes before the request ends before it; run_headless goes on after it
    for name in ("import keel.cli.headless", "build_agent", "session file", "undo unit"):
        assert by_name[name]["start_ms"] <= by_name[name]["end_ms"] <= request
    assert by_name["run_headless"]["end_ms"] > request
