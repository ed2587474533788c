"""`keel`, with a SIGKILL planted at one chosen point: the crash tests run this instead of the CLI.

KEEL_CRASH names the point (counters are per process, from 1):
- `append-before:N` / `append-after:N`: the Nth journal append, before its write / after its
  fsync returns;
- `tool-after:N`: the Nth tool has done its work (its side effect happened) but its result is not
  journaled yet;
- `stream:N:K`: the Nth model stream, after K events reached the loop;
- `spawn:N:SECONDS`: SECONDS after the Nth process group a tool started was journaled, while
  the command still runs (keel dies; the command is left to whatever stops it).
KEEL_CRASH_COUNT=FILE writes the counters reached to FILE at exit (for planning kill points).
Everything else is keel's real CLI.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncGenerator
from typing import Any

from keel.agent import tool_runner
from keel.cli.main import main
from keel.llm.providers.scripted import ScriptedProvider
from keel.session.journal import Journal

PLAN = os.environ.get("KEEL_CRASH", "")
COUNTS = {"append": 0, "tool": 0, "stream": 0, "spawn": 0}


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


_append = Journal.append


def append(self: Journal, payload: Any, *, durable: bool = True) -> Any:
    COUNTS["append"] += 1
    n = COUNTS["append"]
    if f"append-before:{n}" == PLAN:
        die()
    record = _append(self, payload, durable=durable)
    if f"append-after:{n}" == PLAN:
        die()
    return record


_finish = tool_runner.finish


def finish(call: Any, output: Any, raw_dir: Any = None) -> Any:
    COUNTS["tool"] += 1
    if f"tool-after:{COUNTS['tool']}" == PLAN:
        die()
    return _finish(call, output, raw_dir)


_stream = ScriptedProvider.stream


async def stream(self: ScriptedProvider, request: Any) -> AsyncGenerator[Any, None]:
    COUNTS["stream"] += 1
    n = COUNTS["stream"]
    events = 0
    async for event in _stream(self, request):
        if f"stream:{n}:{events}" == PLAN:
            die()
        events += 1
        yield event


_process_started = tool_runner.ToolRunner._process_started


def process_started(self: tool_runner.ToolRunner, pgid: int) -> None:
    COUNTS["spawn"] += 1
    _process_started(self, pgid)
    prefix = f"spawn:{COUNTS['spawn']}:"
    if PLAN.startswith(prefix):
        asyncio.get_running_loop().call_later(float(PLAN[len(prefix) :]), die)


Journal.append = append  # type: ignore[method-assign]
tool_runner.ToolRunner._process_started = process_started  # type: ignore[method-assign]
tool_runner.finish = finish
ScriptedProvider.stream = stream  # type: ignore[method-assign]

if __name__ == "__main__":
    code = main(sys.argv[1:])
    if os.environ.get("KEEL_CRASH_COUNT"):
        with open(os.environ["KEEL_CRASH_COUNT"], "w", encoding="utf-8") as f:
            json.dump(COUNTS, f)
    sys.exit(code)
