"""Benchmark: what a debug trace costs, against the loopback Anthropic server.

- overhead per model turn with tracing off and on (one prompt whose model reads a file per turn,
  the same session run alternately without and with a tracer, the median of the repeats);
- trace bytes per turn at 100 and 300 turns: `events.jsonl` (the delta-encoded records) and
  `http/` (the raw request and response bodies) apart, so the growth of each shows.

Run: `python bench/bench_trace.py [--repeats N] [--json out.json]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import keel.trace as trace
from keel.agent.limits import Limits
from keel.agent.loop import Agent
from keel.llm.catalog import ModelInfo
from keel.llm.http import HTTPSettings
from keel.llm.messages import Message, Text, ToolUse, Usage
from keel.llm.providers.anthropic import AnthropicProvider
from keel.llm.script import Reply, Step
from keel.permissions import AllowAll
from keel.testing.anthropic_server import AnthropicServer
from keel.testing.server import RecordedRequest
from keel.tools.builtin import builtin_tools


class Steps:
    """A model that reads one file per turn for `turns` turns, then answers."""

    def __init__(self, turns: int) -> None:
        self.turns = turns
        self.seen = 0

    def __call__(self, request: RecordedRequest) -> Step:
        self.seen += 1
        tokens = len(request.body) // 4
        if self.seen >= self.turns:
            return Reply(Message("assistant", (Text("done"),)), Usage(tokens, 5))
        n = self.seen
        call = ToolUse(f"toolu_{n:04d}", "read", {"path": f"file{n % 10}.txt"})
        return Reply(
            Message("assistant", (Text(f"Reading file {n % 10}."), call)), Usage(tokens, 30)
        )


async def session(project: Path, turns: int, traced: Path | None) -> float:
    """Seconds per model turn of one prompt of `turns` turns (traced into `traced` if set)."""
    with AnthropicServer(responder=Steps(turns)) as server:
        provider = AnthropicProvider(base_url=server.url, api_key="k", settings=HTTPSettings())
        agent = Agent(
            provider=provider,
            model="claude-bench",
            tools=builtin_tools(),
            cwd=project,
            info=ModelInfo(window=10_000_000, max_output=8_000),
            limits=Limits(max_turns=turns + 10),
            gate=AllowAll(),
        )
        agent.auto_compact = False
        if traced is not None:
            trace.attach(agent, directory=traced)
        start = time.perf_counter()
        result = await agent.run("read the files, one per turn", lambda _e: None)
        elapsed = time.perf_counter() - start
        trace.detach(agent)
        await agent.aclose()
        assert result.stop_reason == "end_turn", result
        assert result.turns == turns, result.turns
        return elapsed / turns


def size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--turns", type=int, default=100, help="turns of the overhead session")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp) / "project"
        project.mkdir()
        for i in range(10):
            (project / f"file{i}.txt").write_text(
                "".join(f"line {n} of file {i}\n" for n in range(40)), encoding="utf-8"
            )
        off: list[float] = []
        on: list[float] = []
        asyncio.run(session(project, 10, None))  # warm up imports and caches
        for r in range(args.repeats):  # interleaved, so drift hits both alike
            off.append(asyncio.run(session(project, args.turns, None)))
            on.append(asyncio.run(session(project, args.turns, Path(tmp) / f"o{r}.trace")))
        results["turns_per_session"] = args.turns
        results["ms_per_turn_off"] = round(statistics.median(off) * 1000, 3)
        results["ms_per_turn_on"] = round(statistics.median(on) * 1000, 3)
        results["overhead_ms_per_turn"] = round(
            results["ms_per_turn_on"] - results["ms_per_turn_off"], 3
        )
        for turns in (100, 300):
            folder = Path(tmp) / f"s{turns}.trace"
            asyncio.run(session(project, turns, folder))
            events = (folder / "events.jsonl").stat().st_size
            http = size(folder / "http")
            results[f"events_bytes_per_turn_{turns}"] = round(events / turns)
            results[f"http_bytes_per_turn_{turns}"] = round(http / turns)
            results[f"trace_bytes_{turns}"] = events + http
    for key, value in results.items():
        print(f"{key:<32} {value:>12,}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
