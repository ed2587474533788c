"""The cache-stable prefix, proven on the wire: a long session against the loopback Anthropic
server (tool calls, notes, a mode change, a background-result note, automatic and manual
compactions) where every request's system prompt, tool definitions and earlier messages are
byte-identical to the previous request's, except exactly at the compaction cuts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from keel.agent.compaction import COMPACT_PROMPT
from keel.agent.loop import Agent
from keel.llm.catalog import ModelInfo
from keel.llm.http import HTTPSettings
from keel.llm.messages import Message, Text, ToolUse, Usage
from keel.llm.providers.anthropic import AnthropicProvider
from keel.llm.script import Reply, Step
from keel.permissions.gate import PermissionGate
from keel.testing.anthropic_server import AnthropicServer
from keel.testing.server import RecordedRequest
from keel.tools.builtin import builtin_tools

MARKER = COMPACT_PROMPT.splitlines()[0]


def strip_cache(value: Any) -> Any:
    """The body without cache_control markers (breakpoints move by design)."""
    if isinstance(value, dict):
        return {k: strip_cache(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [strip_cache(v) for v in value]
    return value


def canonical(value: Any) -> str:
    return json.dumps(strip_cache(value), sort_keys=True)


class Model:
    """A stand-in model on the server side: reports realistic input sizes, summarizes when asked,
    and otherwise works through `steps` tool calls per prompt."""

    def __init__(self, steps_per_prompt: int) -> None:
        self.steps_per_prompt = steps_per_prompt
        self.summaries = 0

    def __call__(self, request: RecordedRequest) -> Step:
        body = request.json
        tokens = len(request.body) // 4
        last = body["messages"][-1]["content"]
        texts = [b.get("text", "") for b in last if isinstance(b, dict)]
        if any(MARKER in t for t in texts):
            self.summaries += 1
            return Reply(
                Message("assistant", (Text(f"<summary>summary {self.summaries}</summary>"),)),
                Usage(tokens, 30),
            )
        done_here = sum(1 for m in body["messages"] if m["role"] == "assistant")
        if done_here % (self.steps_per_prompt + 1) == self.steps_per_prompt:
            return Reply(Message("assistant", (Text("Done with that."),)), Usage(tokens, 10))
        call = ToolUse(
            f"toolu_{len(request.body):08d}_{done_here}",
            "glob",
            {"pattern": f"*{done_here % 7}.py"},
        )
        return Reply(Message("assistant", (Text("Next step."), call)), Usage(tokens, 40))


def check_prefix(bodies: list[dict[str, Any]]) -> list[int]:
    """Indexes of requests whose prefix differs from the request before (the cuts)."""
    cuts = []
    for i in range(1, len(bodies)):
        before, after = bodies[i - 1], bodies[i]
        assert canonical(after["system"]) == canonical(before["system"]), i
        assert canonical(after["tools"]) == canonical(before["tools"]), i
        old, new = before["messages"], after["messages"]
        stable = len(new) >= len(old) and all(
            canonical(new[j]) == canonical(old[j]) for j in range(len(old) - 1)
        )
        if stable:
            # The previous last message may only have grown (a merged prompt or the summary ask).
            grown = strip_cache(new[len(old) - 1]["content"])
            assert grown[: len(old[-1]["content"])] == strip_cache(old[-1]["content"]), i
        else:
            cuts.append(i)
    return cuts


async def test_every_request_keeps_the_prefix_but_the_compaction_cuts(project: Path) -> None:
    model = Model(steps_per_prompt=8)
    with AnthropicServer(responder=model) as server:
        provider = AnthropicProvider(base_url=server.url, api_key="k", settings=HTTPSettings())
        gate = PermissionGate("default", project, project, sandboxed=False)
        agent = Agent(
            provider=provider,
            model="claude-sonnet-4-5",
            tools=builtin_tools(),
            cwd=project,
            info=ModelInfo(window=5_000, max_output=4_000),
            gate=gate,
        )
        try:
            await agent.run("step through the files")
            agent.add_note("The user undid your last change.")
            await agent.run("again")
            agent.set_mode("accept-edits")
            await agent.run("and again")
            agent.add_note("<task-notification>background build finished: ok</task-notification>")
            for i in range(3):
                await agent.run(f"once more ({i})")
            await agent.compact("keep the file names")
            await agent.run("after the manual compaction")
        finally:
            await agent.aclose()
        bodies = [r.json for r in server.model_requests]
    summary_requests = [
        i
        for i, b in enumerate(bodies)
        if any(MARKER in (c.get("text") or "") for c in b["messages"][-1]["content"])
    ]
    assert len(summary_requests) == model.summaries
    assert model.summaries >= 3  # at least two automatic compactions, and the manual one
    cuts = check_prefix(bodies)
    assert cuts == [i + 1 for i in summary_requests]  # exactly the request after each summary
    # Every request marks the stable prefix for the provider's cache.
    for body in bodies:
        assert body["system"][-1]["cache_control"] == {"type": "ephemeral"}
        assert body["tools"][-1]["cache_control"] == {"type": "ephemeral"}
        assert body["messages"][-1]["content"][-1]["cache_control"] == {"type": "ephemeral"}
    notes = [
        b for b in bodies if "The user undid your last change." in json.dumps(b["messages"][-1])
    ]
    assert notes, "the note rode along with the next prompt"
    assert any("The permission mode is now accept-edits." in json.dumps(b) for b in bodies)
