"""Profile: where one turn's time goes. cProfile over bench_loop's 100-turn run (journal on, the
loopback Anthropic server in its own process, one `read` per turn), summarised into a table.

Each row is the cumulative time of the functions that do that work, divided by the number of
requests. cProfile charges a coroutine only while it runs (not while it waits), so the rows are
CPU time of this process; "waiting" is the event loop's `select` (the server's time, loopback
transfer, the fsync thread). Under the profiler every Python call costs more, so the rows are
inflated against an unprofiled run (printed beside them for scale): read them as shares.

Run: `python bench/bench_profile.py [--turns 100] [--top 25] [--json out.json]`.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import pstats
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_loop import bench_server, keel_run, make_project, server_call  # noqa: E402

Key = tuple[str, int, str]


def cumulative(stats: dict[Key, Any], where: str, name: str) -> float:
    """Cumulative seconds of every function `name` in a file whose path ends with `where`
    (recursive calls are counted once by cProfile's own cumulative figure)."""
    return float(sum(v[3] for k, v in stats.items() if k[0].endswith(where) and k[2] == name))


def own(stats: dict[Key, Any], where: str, name: str) -> float:
    return float(sum(v[2] for k, v in stats.items() if k[0].endswith(where) and k[2] == name))


def rows(stats: dict[Key, Any]) -> list[tuple[str, float]]:
    def c(where: str, *names: str) -> float:
        return sum(cumulative(stats, where, n) for n in names)

    loop, store, anth, http = "agent/loop.py", "session/store.py", "anthropic.py", "llm/http.py"
    encoding = c(anth, "encode_message", "encode_head")
    build = c(anth, "build_body")
    # Whichever transport carried the calls: keel's own client (no proxy set) or httpx's.
    send = c("llm/h1.py", "post") + c("httpx/_client.py", "send")
    receive = c(http, "_guarded", "_guarded_direct")
    decode = c(anth, "decode") - receive
    provider_outer = c("llm/provider.py", "stream") or c(http, "stream")
    journal = c(store, "assistant", "tool_result", "user", "barrier", "terminal", "decision")
    record_journal = c(store, "assistant")
    query = c(loop, "_query")
    tools = c("agent/tool_runner.py", "run") - c(store, "tool_result", "barrier", "decision")
    tool_itself = c("tools/base.py", "run")
    events = query - provider_outer - record_journal
    provider_rest = provider_outer - build - send - receive - decode
    return [
        ("request building (body assembly, cached parts joined)", build - encoding),
        ("JSON encoding of new messages and the head", encoding),
        ("HTTP send (keel's client, or httpx with a proxy, until the response head)", send),
        ("HTTP receive of the SSE body (the transport's reads)", receive),
        ("SSE parse + JSON decode + message assembly", decode),
        ("provider wrappers (retry, timeouts, stamping, setup)", provider_rest),
        ("events: building and dispatching (the loop's own work in _query)", events),
        ("journal (records encoded and written; fsync waits)", journal),
        ("tool: the `read` tool itself", tool_itself),
        ("tool runner (permission gate, hooks, scheduling)", tools - tool_itself),
        ("loop guard", c(loop, "_loop_guard")),
        ("compaction check", c(loop, "_maybe_compact")),
        ("limits, budgets, next step", c(loop, "_check_limits", "_next_step")),
        (
            "event loop waiting (select: server, loopback, fsync thread)",
            c("selectors.py", "select"),
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--top", type=int, default=25, help="also list the N costliest functions")
    parser.add_argument("--json", help="also write the table to this file")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="keel-bench-profile-"))
    project = make_project(work / "project")
    home = work / "home"
    out: dict[str, Any] = {}
    try:
        with bench_server() as url:
            asyncio.run(keel_run(url, project, home, args.turns, journal=True))  # warm up
            server_call(url, "/_reset")
            plain_wall, requests = asyncio.run(
                keel_run(url, project, home, args.turns, journal=True)
            )
            plain_busy = server_call(url, "/_stats")["busy_seconds"]
            server_call(url, "/_reset")
            profiler = cProfile.Profile()
            start = time.perf_counter()
            profiler.enable()
            _, requests = asyncio.run(keel_run(url, project, home, args.turns, journal=True))
            profiler.disable()
            elapsed = time.perf_counter() - start
            busy = server_call(url, "/_stats")["busy_seconds"]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    stats = pstats.Stats(profiler)
    table = rows(stats.stats)  # type: ignore[attr-defined]
    accounted = sum(v for _, v in table)
    print(f"{requests} requests; unprofiled: {plain_wall / requests * 1000:.2f} ms per request, ")
    print(f"  of which harness {(plain_wall - plain_busy) / requests * 1000:.2f} ms")
    print(f"profiled: {elapsed / requests * 1000:.2f} ms per request, server busy ", end="")
    print(f"{busy / requests * 1000:.2f} ms\n")
    print(f"{'where a turn goes (profiled)':<68} {'µs/turn':>8} {'share':>6}")
    for label, seconds in table:
        micros = seconds / requests * 1e6
        print(f"{label:<68} {micros:8.0f} {seconds / accounted * 100:5.1f}%")
        out[label] = micros
    print(f"{'sum of the rows':<68} {accounted / requests * 1e6:8.0f}")
    print(f"{'profiled wall time':<68} {elapsed / requests * 1e6:8.0f}")
    if args.top:
        print()
        stats.sort_stats("tottime").print_stats(args.top)
    if args.json:
        out["requests"] = requests
        out["unprofiled_ms_per_request"] = plain_wall / requests * 1000
        out["unprofiled_harness_ms"] = (plain_wall - plain_busy) / requests * 1000
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
