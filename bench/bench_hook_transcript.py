"""Benchmark: the Claude Code–format transcript keel keeps for hooks (keel.hooks.transcript).

- per turn, in process: writing the transcript lines of one assistant message and its tool
  result, beside appending the same two records to the journal (no fsync)
- a scripted 50-turn `keel -p` run (50 reads, then an answer) with a hook configured, with the
  transcript written and with it switched off (the same run otherwise)

Run: `python bench/bench_hook_transcript.py [--runs 3]`. Nothing here is asserted.
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

from keel.hooks.transcript import ClaudeTranscript
from keel.llm.messages import Message, Text, ToolUse, Usage, tool_result
from keel.session.journal import Journal
from keel.session.records import AssistantRecord, Meta, ToolResultRecord

TURNS = 50
OFF = (
    "import sys, keel.agent.loop as loop\n"
    "loop.Agent.hook_transcript_path = lambda self: ''\n"
    "from keel.cli.main import main\n"
    "sys.exit(main())\n"
)


def records(i: int) -> tuple[AssistantRecord, ToolResultRecord]:
    call = ToolUse(f"toolu_{i:08d}", "read", {"path": f"src/module_{i % 50}.py"})
    message = Message("assistant", (Text("Let me look at the next module."), call), "", "m")
    result = tool_result(call.id, "\n".join(f"{n:6d}\tline {n}" for n in range(1, 200)))
    return (
        AssistantRecord(message, Usage(1200 + i, 40, 30_000, 200), 0.01, "tool_use", i),
        ToolResultRecord(result, 0.01),
    )


def in_process(turns: int = 2000) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        writer = ClaudeTranscript(root / "t" / "x.jsonl", session_uuid="u", cwd=root, version="0")
        writer.open([])
        journal = Journal.create(root / "s.jsonl", Meta("s", str(root), "m"))
        pairs = [records(i) for i in range(turns)]
        start = time.perf_counter()
        for pair in pairs:
            for record in pair:
                writer.record(record)
        transcript = (time.perf_counter() - start) / turns
        start = time.perf_counter()
        for pair in pairs:
            for record in pair:
                journal.append(record, durable=False)
        appended = (time.perf_counter() - start) / turns
        journal.close()
    return {"transcript_us_per_turn": transcript * 1e6, "journal_us_per_turn": appended * 1e6}


def run(project: Path, home: Path, script: Path, *, transcript: bool) -> float:
    env = {
        **os.environ,
        "KEEL_HOME": str(home),
        "KEEL_CONFIG_DIR": str(home / "config"),
        "HOME": str(home / "user-home"),
    }
    head = ["-m", "keel"] if transcript else ["-c", OFF]
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, *head, "-p", "go", "--model", f"scripted:{script}"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    took = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(done.stderr)
    return took


def end_to_end(runs: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        project, home = root / "project", root / "home"
        project.mkdir()
        for i in range(TURNS):
            (project / f"notes_{i}.txt").write_text(f"alpha {i}\nbeta\n", encoding="utf-8")
        settings = home / "user-home" / ".claude" / "settings.json"
        settings.parent.mkdir(parents=True)
        hook = {"hooks": [{"type": "command", "command": "true"}]}
        settings.write_text(json.dumps({"hooks": {"SessionEnd": [hook]}}), encoding="utf-8")
        turns: list[dict[str, object]] = [
            {"tool_calls": [{"name": "read", "input": {"path": f"notes_{i}.txt"}}]}
            for i in range(TURNS)
        ]
        script = root / "script.json"
        script.write_text(
            json.dumps({"model": "test", "turns": [*turns, {"text": "done"}]}), encoding="utf-8"
        )
        out: dict[str, list[float]] = {"on": [], "off": []}
        for _ in range(runs):
            out["off"].append(run(project, home, script, transcript=False))
            out["on"].append(run(project, home, script, transcript=True))
    on, off = statistics.median(out["on"]), statistics.median(out["off"])
    return {
        "run_s_transcript_on": on,
        "run_s_transcript_off": off,
        "ms_per_turn_difference": (on - off) / TURNS * 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    result = {**in_process(), **end_to_end(args.runs)}
    print(json.dumps({k: round(v, 3) for k, v in result.items()}, indent=1))


if __name__ == "__main__":
    main()
