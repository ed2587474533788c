"""Benchmark: keel's loop against the loopback Anthropic server (in its own process).

Prints, and with --json writes, these measurements:

- `keel --version` wall time (median of runs)
- process start → first model request reaching the server (median of runs)
- harness overhead per turn for N = 10 and 100 turns (one `read` call per turn, then an answer):
  loop wall time minus the time the server spent on the requests, divided by requests
- the same for a hand-written loop on the official anthropic SDK, for comparison (if installed)
- turns per second for 20 concurrent runs of 20 turns
- peak RSS of this process and of a `keel -p` run of 100 turns

Nothing here asserts a target; docs/benchmarks.md records what was measured and why.
Run: `python bench/bench_loop.py [--quick] [--only parts] [--json out.json]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MODEL = "claude-sonnet-4-5"


@contextmanager
def bench_server(*, coalesce: bool = False) -> Iterator[str]:
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "bench_server.py"), *(["--coalesce"] if coalesce else [])],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdin is not None
    line = proc.stdout.readline().split()
    if line[:1] != ["PORT"]:
        proc.kill()
        raise RuntimeError(f"bench server did not start: {line}")
    try:
        yield f"http://127.0.0.1:{line[1]}"
    finally:
        proc.stdin.close()
        proc.wait(10)
        proc.stdout.close()


def server_call(url: str, path: str) -> dict[str, Any]:
    method = "POST" if path == "/_reset" else "GET"
    req = urllib.request.Request(
        url + path, method=method, data=b"{}" if method == "POST" else None
    )
    with urllib.request.urlopen(req, timeout=10) as resp:  # loopback only
        return json.loads(resp.read())  # type: ignore[no-any-return]


def make_project(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for i in range(10):
        (root / f"file{i}.txt").write_text(
            "".join(f"line {n} of file {i}\n" for n in range(40)), encoding="utf-8"
        )
    return root


def keel_command() -> list[str]:
    script = Path(sys.executable).parent / "keel"
    return [str(script)] if script.exists() else [sys.executable, "-m", "keel"]


def time_version(runs: int) -> float:
    cmd = [*keel_command(), "--version"]
    subprocess.run(cmd, check=True, capture_output=True)  # warm the page cache
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def time_first_request(url: str, project: Path, home: Path, runs: int) -> float:
    env = {
        **os.environ,
        "ANTHROPIC_API_KEY": "bench",
        "ANTHROPIC_BASE_URL": url,
        "KEEL_HOME": str(home),
    }
    cmd = [*keel_command(), "-p", "turns=0 hello", "--model", f"anthropic/{MODEL}", "-q"]
    subprocess.run(cmd, check=True, capture_output=True, env=env, cwd=project)
    times = []
    for _ in range(runs):
        server_call(url, "/_reset")
        start = time.time()
        subprocess.run(cmd, check=True, capture_output=True, env=env, cwd=project)
        first = server_call(url, "/_stats")["first_request_at"]
        times.append(first - start)
    return float(statistics.median(times) * 1000)


def peak_rss_of_run(url: str, project: Path, home: Path, turns: int) -> float:
    """Peak RSS (MB) of a whole `keel -p` process running `turns` turns. Read from VmHWM: the
    rusage figure would include the forking parent's memory."""
    env = {
        **os.environ,
        "ANTHROPIC_API_KEY": "bench",
        "ANTHROPIC_BASE_URL": url,
        "KEEL_HOME": str(home),
    }
    code = (
        "import sys; from keel.cli.main import main; rc = main(sys.argv[1:]); "
        "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM')][0]; "
        "print(hwm.split()[1], file=sys.stderr); sys.exit(rc)"
    )
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            "-p",
            f"turns={turns} go",
            "--model",
            f"anthropic/{MODEL}",
            "-q",
            # 100 turns of a growing conversation pass keel -p's default 200,000-token budget.
            "--max-tokens-budget",
            "0",
        ],
        check=True,
        capture_output=True,
        text=True,
        env=env,
        cwd=project,
    )
    return int(out.stderr.strip().splitlines()[-1]) / 1024


async def keel_run(
    url: str, project: Path, home: Path, turns: int, *, journal: bool
) -> tuple[float, int]:
    from keel.agent.loop import Agent
    from keel.llm.catalog import parse_model
    from keel.llm.provider import make_provider
    from keel.session.store import SessionLog
    from keel.tools.builtin import read

    env = {"ANTHROPIC_API_KEY": "bench", "ANTHROPIC_BASE_URL": url, "KEEL_HOME": str(home)}
    provider = make_provider(parse_model(f"anthropic/{MODEL}"), env=env)
    agent = Agent(provider=provider, model=MODEL, tools=[read], cwd=project, env=env)
    if journal:
        agent.session = SessionLog.create(
            cwd=project, model=f"anthropic/{MODEL}", session_id=agent.session_id, env=env
        )
    start = time.perf_counter()
    result = await agent.run(f"turns={turns} read the files")
    wall = time.perf_counter() - start
    await agent.aclose()
    assert result.stop_reason == "end_turn", result
    return wall, result.turns


def overhead(
    url: str, project: Path, home: Path, turns: int, repeats: int, *, journal: bool
) -> dict[str, float]:
    """Per-turn harness overhead: (loop wall time - server busy time) / requests, and the keel
    process's CPU time per request; median and best of `repeats` runs."""
    walls, cpus = [], []
    for _ in range(repeats):
        server_call(url, "/_reset")
        cpu0 = time.process_time()
        wall, requests = asyncio.run(keel_run(url, project, home, turns, journal=journal))
        cpu = time.process_time() - cpu0
        busy = server_call(url, "/_stats")["busy_seconds"]
        walls.append((wall - busy) / requests * 1000)
        cpus.append(cpu / requests * 1000)
    return {
        "median": statistics.median(walls),
        "best": min(walls),
        "cpu_median": statistics.median(cpus),
    }


async def sdk_run(url: str, project: Path, turns: int) -> tuple[float, int]:
    """A hand-written loop on the official SDK: the comparison the issue names."""
    import anthropic

    client = anthropic.AsyncAnthropic(api_key="bench", base_url=url, max_retries=0)
    tools: list[Any] = [
        {
            "name": "read",
            "description": "Read a file.",
            "input_schema": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        }
    ]
    messages: list[Any] = [{"role": "user", "content": f"turns={turns} read the files"}]
    requests = 0
    start = time.perf_counter()
    while True:
        async with client.messages.stream(
            model=MODEL, max_tokens=64000, system="bench", tools=tools, messages=messages
        ) as stream:
            message = await stream.get_final_message()
        requests += 1
        messages.append({"role": "assistant", "content": [b.model_dump() for b in message.content]})
        uses = [b for b in message.content if b.type == "tool_use"]
        if not uses:
            break
        results = []
        for use in uses:
            path = use.input["path"] if isinstance(use.input, dict) else ""
            text = (project / str(path)).read_text(encoding="utf-8")
            numbered = "\n".join(f"{i:6d}\t{line}" for i, line in enumerate(text.splitlines(), 1))
            results.append({"type": "tool_result", "tool_use_id": use.id, "content": numbered})
        messages.append({"role": "user", "content": results})
    wall = time.perf_counter() - start
    await client.close()
    return wall, requests


def sdk_overhead(url: str, project: Path, turns: int, repeats: int) -> dict[str, float] | None:
    try:
        import anthropic  # noqa: F401
    except ImportError:
        return None
    walls = []
    for _ in range(repeats):
        server_call(url, "/_reset")
        wall, requests = asyncio.run(sdk_run(url, project, turns))
        busy = server_call(url, "/_stats")["busy_seconds"]
        walls.append((wall - busy) / requests * 1000)
    return {"median": statistics.median(walls), "best": min(walls)}


def concurrent(
    url: str, project: Path, home: Path, runs: int, turns: int, repeats: int
) -> dict[str, float]:
    async def all_runs() -> tuple[float, int]:
        start = time.perf_counter()
        results = await asyncio.gather(
            *(keel_run(url, project, home, turns, journal=True) for _ in range(runs))
        )
        return time.perf_counter() - start, sum(r[1] for r in results)

    rates, busy_share, cpus = [], [], []
    for _ in range(repeats):
        server_call(url, "/_reset")
        cpu0 = time.process_time()
        wall, requests = asyncio.run(all_runs())
        cpus.append((time.process_time() - cpu0) / requests * 1000)
        rates.append(requests / wall)
        busy_share.append(server_call(url, "/_stats")["busy_seconds"] / wall)
    return {
        "median": statistics.median(rates),
        "best": max(rates),
        "server_busy_share": statistics.median(busy_share),
        # CPU time of this process per turn (ms): steadier than the rate on a shared machine.
        "cpu_ms_per_turn": statistics.median(cpus),
    }


PARTS = ("startup", "overhead", "sdk", "rss", "coalesced", "concurrent")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument(
        "--only",
        help=f"comma-separated parts to run (default all): {', '.join(PARTS)}",
    )
    parser.add_argument("--concurrent-repeats", type=int, default=3)
    args = parser.parse_args()
    parts = set(args.only.split(",")) if args.only else set(PARTS)
    repeats = 3 if args.quick else 7
    work = Path(tempfile.mkdtemp(prefix="keel-bench-"))
    project = make_project(work / "project")
    home = work / "home"
    results: dict[str, Any] = {}
    try:
        # The server streams each SSE event as its own write, as the real API does.
        with bench_server() as url:
            if "startup" in parts:
                results["version_ms"] = time_version(10 if args.quick else 30)
                results["start_to_first_request_ms"] = time_first_request(
                    url, project, home, 5 if args.quick else 15
                )
            if "overhead" in parts:
                for turns in (10, 100):
                    results[f"overhead_per_turn_{turns}"] = overhead(
                        url, project, home, turns, repeats, journal=True
                    )
                results["overhead_per_turn_100_no_journal"] = overhead(
                    url, project, home, 100, repeats, journal=False
                )
            sdk = sdk_overhead(url, project, 100, repeats) if "sdk" in parts else None
            if sdk is not None:
                results["sdk_loop_overhead_per_turn_100"] = sdk
                if "overhead_per_turn_100" in results:
                    # The second bar: keel's overhead as a share of the SDK loop's.
                    results["keel_over_sdk_100"] = (
                        results["overhead_per_turn_100"]["median"] / sdk["median"]
                    )
            if "rss" in parts:
                results["peak_rss_mb_keel_p_100_turns"] = peak_rss_of_run(url, project, home, 100)
        # Throughput: the server sends each reply in one write, so it is not the bottleneck.
        with bench_server(coalesce=True) as url:
            if "coalesced" in parts:
                results["overhead_per_turn_100_coalesced"] = overhead(
                    url, project, home, 100, repeats, journal=True
                )
                results["overhead_per_turn_100_coalesced_no_journal"] = overhead(
                    url, project, home, 100, repeats, journal=False
                )
            if "concurrent" in parts:
                results["concurrent_turns_per_s_20x20"] = concurrent(
                    url, project, home, 20, 20, args.concurrent_repeats
                )
        results["peak_rss_mb_bench_process"] = (
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for key, value in results.items():
        if isinstance(value, dict):
            shown = "  ".join(f"{k} {v:.2f}" for k, v in value.items())
        else:
            shown = f"{value:.2f}"
        print(f"{key:<45} {shown}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
