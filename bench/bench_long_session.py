"""Benchmark: one 10,000-turn session, journal and compaction on, 5 kB tool results. Does the
harness cost per turn stay flat as the session grows, and what is the process's peak RSS?

The model server (this file with `--serve`, in its own process: the loopback Anthropic server)
answers each request with one `read` of a different 5 kB file until the session has made
`--turns` model turns, then a short answer; a compaction request gets a summary. It reports
`input = 1000 + 1300 × tool results in the request` tokens, and the window is set so that the
loop compacts about every 50 turns: every 100-turn window holds the same two compaction cycles,
so the windows compare like with like.

Every 100 turns the benchmark samples its own wall clock, the server's cumulative busy time
(`GET /_stats`, the time of that call itself subtracted) and the process's RSS. Harness overhead
of a window = (wall time - server busy time) / requests (compaction requests included).

Run: `python bench/bench_long_session.py [--turns 10000] [--json out.json]`.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_loop import MODEL, server_call  # noqa: E402

FILES = 200
RESULT_BYTES = 5_000
WINDOW = 82_500  # compaction above 80%: after about 50 results of 1,300 tokens each
SAMPLE_EVERY = 100


# -- the server (its own process) ---------------------------------------------------------------


def serve() -> None:
    from bench_server import BenchServer
    from keel.agent.compaction import COMPACT_PROMPT
    from keel.llm.messages import Message, Text, ToolUse, Usage
    from keel.llm.script import Reply, Step, next_tool_id
    from keel.testing.server import RecordedRequest

    marker = COMPACT_PROMPT[:60]
    wanted = int(sys.argv[sys.argv.index("--serve") + 1])
    turns = 0

    def respond(request: RecordedRequest) -> Step:
        nonlocal turns
        messages = request.json.get("messages", [])
        last = messages[-1]["content"] if messages else ""
        texts = [last] if isinstance(last, str) else [b.get("text", "") for b in last]
        if any(marker in t for t in texts):
            summary = f"<summary>The session read files; {turns} turns so far.</summary>"
            return Reply(Message("assistant", (Text(summary),)), Usage(input=1000, output=40))
        results = sum(
            sum(1 for b in m["content"] if b.get("type") == "tool_result")
            for m in messages
            if isinstance(m.get("content"), list)
        )
        turns += 1
        usage = Usage(input=1000 + 1300 * results, output=30)
        if turns < wanted:
            call = ToolUse(next_tool_id(), "read", {"path": f"f{turns % FILES:03d}.txt"})
            return Reply(Message("assistant", (Text("Reading the next file."), call)), usage)
        return Reply(Message("assistant", (Text(f"Done after {turns} turns."),)), usage)

    server = BenchServer()
    server.responder = respond
    server.start()
    print(f"PORT {server.port}", flush=True)
    sys.stdin.read()
    server.stop()


@contextmanager
def long_server(turns: int) -> Iterator[str]:
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(turns)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdin is not None
    line = proc.stdout.readline().split()
    if line[:1] != ["PORT"]:
        proc.kill()
        raise RuntimeError(f"server did not start: {line}")
    try:
        yield f"http://127.0.0.1:{line[1]}"
    finally:
        proc.stdin.close()
        proc.wait(10)
        proc.stdout.close()


# -- the client ---------------------------------------------------------------------------------


def make_files(root: Path, result_bytes: int = RESULT_BYTES) -> None:
    root.mkdir(parents=True, exist_ok=True)
    # `read` numbers the lines (about 7 more bytes each): the result is about `result_bytes`.
    line = "x" * 57 + "\n"
    lines = (result_bytes // (len(line) + 7)) + 1
    for i in range(FILES):
        (root / f"f{i:03d}.txt").write_text(f"file {i}\n" + line * lines, encoding="utf-8")


def rss_mb() -> float:
    with open("/proc/self/statm", encoding="ascii") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


async def run_session(url: str, project: Path, home: Path, turns: int) -> dict[str, Any]:
    from keel.agent.events import ContextCompacted, Event, RequestStarted
    from keel.agent.limits import Limits
    from keel.agent.loop import Agent
    from keel.llm.catalog import ModelInfo, parse_model
    from keel.llm.provider import make_provider
    from keel.session.store import SessionLog
    from keel.tools.builtin import read

    env = {"ANTHROPIC_API_KEY": "bench", "ANTHROPIC_BASE_URL": url, "KEEL_HOME": str(home)}
    provider = make_provider(parse_model(f"anthropic/{MODEL}"), env=env)
    agent = Agent(
        provider=provider,
        model=MODEL,
        tools=[read],
        cwd=project,
        env=env,
        info=ModelInfo(window=WINDOW, max_output=8192),
        limits=Limits(max_turns=turns + 10),
    )
    agent.session = SessionLog.create(
        cwd=project, model=f"anthropic/{MODEL}", session_id=agent.session_id, env=env
    )
    samples: list[dict[str, float]] = []
    requests = 0
    turns_seen = 0
    compactions = 0
    stats_time = 0.0

    def sample() -> None:
        nonlocal stats_time
        t0 = time.perf_counter()
        busy = server_call(url, "/_stats")["busy_seconds"]
        t1 = time.perf_counter()
        samples.append(
            {
                "turn": turns_seen,
                "requests": requests,
                "at": t0 - stats_time,
                "busy": busy,
                "rss_mb": rss_mb(),
                "compactions": compactions,
            }
        )
        stats_time += t1 - t0

    def on_event(event: Event) -> None:
        nonlocal requests, turns_seen, compactions
        if isinstance(event, RequestStarted):
            if event.purpose == "turn":
                if turns_seen % SAMPLE_EVERY == 0:
                    sample()
                turns_seen += 1
            requests += 1
        elif isinstance(event, ContextCompacted):
            compactions += 1

    server_call(url, "/_reset")
    result = await agent.run("go", on_event)
    sample()
    await agent.aclose()
    assert result.stop_reason == "end_turn", result
    size = agent.session.path.stat().st_size
    windows = []
    for a, b in itertools.pairwise(samples):
        n = b["requests"] - a["requests"]
        if n <= 0:
            continue
        windows.append(
            {
                "turn": b["turn"],
                "overhead_ms": ((b["at"] - a["at"]) - (b["busy"] - a["busy"])) / n * 1000,
                "rss_mb": b["rss_mb"],
                "compactions": b["compactions"] - a["compactions"],
            }
        )
    return {"windows": windows, "requests": requests, "compactions": compactions, "bytes": size}


def main() -> None:
    if "--serve" in sys.argv:
        serve()
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=10_000)
    parser.add_argument("--result-bytes", type=int, default=RESULT_BYTES)
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="keel-bench-long-"))
    project = work / "project"
    make_files(project, args.result_bytes)
    try:
        with long_server(args.turns) as url:
            start = time.perf_counter()
            out = asyncio.run(run_session(url, project, work / "home", args.turns))
            out["seconds"] = time.perf_counter() - start
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    windows = out["windows"]
    # Early: turns 101-300 (the first window holds the cold start); late: the last 200 turns.
    early = [w["overhead_ms"] for w in windows[1:3]]
    late = [w["overhead_ms"] for w in windows[-2:]]
    out["early_ms"] = statistics.mean(early) if early else float("nan")
    out["late_ms"] = statistics.mean(late) if late else float("nan")
    out["ratio"] = out["late_ms"] / out["early_ms"]
    mid = [w["overhead_ms"] for w in windows[1:]]
    for w in windows[:: max(1, len(windows) // 20)] + windows[-1:]:
        print(
            f"turn {w['turn']:>6}  overhead {w['overhead_ms']:6.2f} ms/request  "
            f"rss {w['rss_mb']:6.1f} MB  compactions {w['compactions']}"
        )
    print(
        f"{out['requests']} requests, {out['compactions']} compactions, "
        f"journal {out['bytes'] / 1e6:.1f} MB, {out['seconds']:.0f} s"
    )
    print(
        f"overhead turns 101-300: {out['early_ms']:.2f} ms; last 200 turns: {out['late_ms']:.2f} ms;"
        f" ratio {out['ratio']:.2f}; all windows median {statistics.median(mid):.2f} ms"
    )
    print(f"peak RSS {out['peak_rss_mb']:.1f} MB")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
