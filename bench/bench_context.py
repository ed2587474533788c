"""Benchmark: context management over a 300-turn session against the loopback Anthropic server.

- the share of requests whose prefix (system, tools, earlier messages) is byte-identical to the
  previous request's: every request but the compaction cuts is the target;
- the input tokens the session sends in all (request bodies / 4), with automatic compaction and
  without it (a window large enough never to compact);
- how many compactions happened.

Run: `python bench/bench_context.py [--json out.json]`.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from keel.agent.compaction import COMPACT_PROMPT
from keel.agent.limits import Limits
from keel.agent.loop import Agent
from keel.llm.catalog import ModelInfo
from keel.llm.http import HTTPSettings
from keel.llm.messages import Message, Text, ToolUse, Usage
from keel.llm.providers.anthropic import AnthropicProvider
from keel.llm.script import Reply, Step
from keel.testing.anthropic_server import AnthropicServer
from keel.testing.server import RecordedRequest
from keel.tools.builtin import builtin_tools

TURNS = 300
MARKER = COMPACT_PROMPT.splitlines()[0]


def strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: strip(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [strip(v) for v in value]
    return value


class Steps:
    def __init__(self) -> None:
        self.answered: set[str] = set()

    def __call__(self, request: RecordedRequest) -> Step:
        body = request.json
        tokens = len(request.body) // 4
        last = body["messages"][-1]["content"]
        for block in last:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                self.answered.add(block["tool_use_id"])
        if any(MARKER in (b.get("text") or "") for b in last if isinstance(b, dict)):
            return Reply(
                Message("assistant", (Text("<summary>progress so far</summary>"),)),
                Usage(tokens, 20),
            )
        if len(self.answered) >= TURNS:
            return Reply(Message("assistant", (Text("done"),)), Usage(tokens, 5))
        n = len(self.answered)
        call = ToolUse(f"toolu_{n:04d}", "read", {"path": f"file{n % 10}.txt"})
        return Reply(
            Message("assistant", (Text(f"Reading file {n % 10}."), call)), Usage(tokens, 30)
        )


async def session(project: Path, window: int) -> tuple[list[dict[str, Any]], int]:
    steps = Steps()
    with AnthropicServer(responder=steps) as server:
        provider = AnthropicProvider(base_url=server.url, api_key="k", settings=HTTPSettings())
        agent = Agent(
            provider=provider,
            model="claude-bench",
            tools=builtin_tools(),
            cwd=project,
            info=ModelInfo(window=window, max_output=8_000),
            limits=Limits(max_turns=1000),
        )
        compactions = 0

        def count(event: Any) -> None:
            nonlocal compactions
            compactions += type(event).__name__ == "ContextCompacted"

        result = await agent.run("read the files, one per turn", count)
        await agent.aclose()
        assert result.stop_reason == "end_turn", result
        return [r.json for r in server.model_requests], compactions


def stable_share(bodies: list[dict[str, Any]]) -> tuple[int, int]:
    stable = 0
    for before, after in itertools.pairwise(bodies):
        old, new = before["messages"], after["messages"]
        same = (
            strip(before["system"]) == strip(after["system"])
            and strip(before["tools"]) == strip(after["tools"])
            and len(new) >= len(old)
            and all(strip(new[j]) == strip(old[j]) for j in range(len(old) - 1))
        )
        stable += same
    return stable, len(bodies) - 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp)
        for i in range(10):
            (project / f"file{i}.txt").write_text(
                "".join(f"line {n}\n" for n in range(40)), encoding="utf-8"
            )
        # A window that 300 turns overfill about twice: two compactions.
        compacted, compactions = asyncio.run(session(project, window=18_000))
        plain, none = asyncio.run(session(project, window=10_000_000))
    stable, pairs = stable_share(compacted)
    results = {
        "requests": len(compacted),
        "compactions": compactions,
        "prefix_stable_requests": stable,
        "request_pairs": pairs,
        "unstable_pairs": pairs - stable,
        "input_tokens_with_compaction": sum(len(json.dumps(b)) // 4 for b in compacted),
        "input_tokens_without_compaction": sum(len(json.dumps(b)) // 4 for b in plain),
        "compactions_without": none,
    }
    for key, value in results.items():
        print(f"{key:<36} {value:>12,}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
