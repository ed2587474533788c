"""A 300-turn session through the real CLI against the loopback Anthropic server: automatic
compactions, an overflow the provider reports, two SIGKILLs with `keel resume`, and a manual
`keel compact` in between. It finishes, the journal holds together, and every request keeps the
previous request's prefix except at the compaction cuts (including across the restarts: a resumed
run rebuilds the very same bytes)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from keel.llm.messages import Message, Text, ToolUse, Usage
from keel.llm.script import Fault, Reply, Step
from keel.session.fold import fold
from keel.session.journal import read_records
from keel.session.records import CompactionRecord, ToolResultRecord
from keel.testing.anthropic_server import AnthropicServer
from keel.testing.server import RecordedRequest
from tests.test_cli import session_files
from tests.test_prefix import MARKER, check_prefix

TURNS = 300
WINDOW = 6_000  # compacts above 4,800 tokens
OVERFLOW_AT = 4_300  # …but the provider refuses a little earlier, now and then


class Work:
    """Server-side stand-in model: one glob per turn until 300 have been answered."""

    def __init__(self) -> None:
        self.answered: set[str] = set()
        self.overflows = 0

    def __call__(self, request: RecordedRequest) -> Step:
        body = request.json
        tokens = len(request.body) // 4
        last = body["messages"][-1]["content"]
        for block in last:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                self.answered.add(block["tool_use_id"])
        if any(MARKER in (b.get("text") or "") for b in last if isinstance(b, dict)):
            return Reply(
                Message(
                    "assistant", (Text(f"<summary>{len(self.answered)} steps done</summary>"),)
                ),
                Usage(tokens, 20),
            )
        if tokens > OVERFLOW_AT and self.overflows < 3 and len(self.answered) % 97 > 60:
            self.overflows += 1
            return Fault(
                "overflow", message=f"prompt is too long: {tokens} tokens > {OVERFLOW_AT} maximum"
            )
        if len(self.answered) >= TURNS:
            return Reply(
                Message("assistant", (Text(f"All {TURNS} steps done."),)), Usage(tokens, 8)
            )
        n = len(self.answered)
        call = ToolUse(f"toolu_step_{n:04d}", "glob", {"pattern": f"*{n % 10}.md"})
        return Reply(Message("assistant", (Text(f"Step {n}."), call)), Usage(tokens, 30))


def test_a_300_turn_session_survives_kills_overflows_and_compactions(
    project: Path, isolated_env: Path
) -> None:
    config = isolated_env / "config"
    config.mkdir(exist_ok=True)
    (config / "settings.json").write_text(
        json.dumps({"models": {"claude-test": {"window": WINDOW, "max_output": 4_000}}}),
        encoding="utf-8",
    )
    work = Work()
    with AnthropicServer(responder=work) as server:
        env = {**os.environ, "ANTHROPIC_API_KEY": "k", "ANTHROPIC_BASE_URL": server.url}
        common = [
            "--model",
            "anthropic/claude-test",
            "--max-turns",
            "1000",
            # 300 turns of a full window pass keel -p's default 200,000-token budget.
            "--max-tokens-budget",
            "0",
            "--max-retries",
            "0",
            "-q",
        ]

        def start(*args: str) -> subprocess.Popen[str]:
            return subprocess.Popen(
                [sys.executable, "-m", "keel", *args, *common],
                cwd=project,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )

        def kill_after(proc: subprocess.Popen[str], answered: int) -> None:
            while len(work.answered) < answered:
                assert proc.poll() is None, proc.communicate()[1]
                time.sleep(0.01)
            proc.send_signal(signal.SIGKILL)
            proc.communicate()

        kill_after(start("-p", "work through the steps"), 100)
        (path,) = session_files(isolated_env)
        kill_after(start("resume", path.stem), 200)
        compact = subprocess.run(
            [sys.executable, "-m", "keel", "compact", path.stem, "keep the step count", *common],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert compact.returncode == 0, compact.stderr
        assert compact.stdout.startswith(f"compacted session {path.stem}: ~")
        final = start("resume", path.stem)
        stdout, stderr = final.communicate(timeout=300)
        assert final.returncode == 0, stderr
        assert stdout == f"All {TURNS} steps done.\n"
        bodies = [r.json for r in server.model_requests]
        assert not server.errors

    records = read_records(path, allow_torn_tail=False).records
    assert [r.seq for r in records] == list(range(1, len(records) + 1))
    compactions = [r.payload for r in records if isinstance(r.payload, CompactionRecord)]
    triggers = {c.trigger for c in compactions}
    assert {"auto", "overflow", "manual"} <= triggers, triggers
    results = [
        r.payload.result.tool_use_id for r in records if isinstance(r.payload, ToolResultRecord)
    ]
    assert len(set(results)) >= TURNS
    assert len(results) - len(set(results)) <= 2  # at most the calls in flight at the two kills
    state = fold(records)
    assert state.messages[-1].text == f"All {TURNS} steps done."
    # The prefix holds on every request except right after a summary.
    summaries = [
        i
        for i, b in enumerate(bodies)
        if any(MARKER in (c.get("text") or "") for c in b["messages"][-1]["content"])
    ]
    overflowed = {i for i, b in enumerate(bodies) if i + 1 < len(bodies) and i + 1 in summaries}
    cuts = check_prefix(bodies)
    assert set(cuts) <= {i + 1 for i in summaries}, (cuts, summaries)
    assert len(bodies) >= TURNS
    assert overflowed  # an overflow was answered with a compaction
