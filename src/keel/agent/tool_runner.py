"""Running one round of tool calls: check each call, authorise them one by one in order, run
consecutive read-only calls concurrently and everything else alone, and hand back one result per
call. Every result passes through the one truncation function and is recorded the moment it exists.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

from keel.agent.events import Event, ToolFinished, ToolStarted
from keel.frozen import frozen
from keel.llm.messages import Text, ToolResult, ToolUse, tool_result
from keel.permissions.gate import AllowAll, Deny, Gate
from keel.tools.base import Tool, ToolContext, ToolError, ToolOutput
from keel.tools.builtin.raw import save_raw
from keel.tools.registry import Registry
from keel.tools.truncate import MAX_OUTPUT_BYTES, truncate

Record = Callable[[ToolResult, float], None]


@frozen
class _Ready:
    call: ToolUse
    tool: Tool


def check_call(call: ToolUse, registry: Registry) -> Tool | ToolResult:
    """The tool to run for `call`, or the error result that tells the model what to fix."""
    tool = registry.get(call.name)
    if tool is None:
        return tool_result(
            call.id,
            f"unknown tool {call.name!r}; available tools: {', '.join(registry.names)}",
            is_error=True,
        )
    if call.input is None:
        return tool_result(
            call.id,
            f"INVALID_JSON: the arguments for {call.name} were cut off or not valid JSON "
            f"({call.raw_input[:200]!r}); retry the call with complete, valid JSON",
            is_error=True,
        )
    validate = getattr(tool, "validate", None)
    problem = validate(call.input) if validate is not None else None
    if problem:
        return tool_result(call.id, f"INVALID_ARGUMENTS: {problem}", is_error=True)
    return tool


def finish(call: ToolUse, output: ToolOutput, raw_dir: Path | None = None) -> ToolResult:
    """The result the model sees: every text block through the one truncation function. When a
    block is cut and there is a session, the whole text is kept beside it for `raw_output`."""
    blocks = output.blocks()
    note = ""
    if raw_dir is not None and any(
        isinstance(b, Text)
        and len(b.text) > MAX_OUTPUT_BYTES // 4
        and len(b.text.encode()) > MAX_OUTPUT_BYTES
        for b in blocks
    ):
        save_raw(raw_dir, call.id, "\n".join(b.text for b in blocks if isinstance(b, Text)))
        note = f'the whole output: raw_output(tool_use_id="{call.id}")'
    content = tuple(Text(truncate(b.text, note=note)) if isinstance(b, Text) else b for b in blocks)
    if not content:
        content = (Text("(no output)"),)
    return ToolResult(call.id, content, output.is_error)


class ToolRunner:
    def __init__(self, registry: Registry, ctx: ToolContext, gate: Gate | None = None) -> None:
        self.registry = registry
        self.ctx = ctx
        self.gate: Gate = gate or AllowAll()

    async def run(
        self,
        calls: tuple[ToolUse, ...],
        emit: Callable[[Event], None],
        results: dict[str, ToolResult],
        record: Record,
        barrier: Callable[[], None] = lambda: None,
        stop: Callable[[], bool] = lambda: False,
    ) -> None:
        """Fill `results` (keyed by call id). `record` journals each result as it exists;
        `barrier` makes everything journaled durable and is called before any tool starts; once
        `stop()` is true, no further tool starts. Calls that did not finish (stopped, or
        cancelled) are left out of `results` for the caller to deal with."""

        def done(call: ToolUse, result: ToolResult, seconds: float, display: str | None) -> None:
            record(result, seconds)
            results[call.id] = result
            emit(ToolFinished(call, result, seconds, display))

        ready: list[_Ready] = []
        for call in calls:  # phase 1: check and authorise, one by one, in order
            checked = check_call(call, self.registry)
            if isinstance(checked, ToolResult):
                done(call, checked, 0.0, None)
                continue
            decision = await self.gate.authorize(call, read_only=checked.read_only)
            if isinstance(decision, Deny):
                done(call, tool_result(call.id, decision.reason, is_error=True), 0.0, None)
                continue
            ready.append(_Ready(call, checked))
        for group in _groups(ready):  # phase 2: run
            if stop():
                return
            barrier()
            if len(group) == 1:
                await self._run_one(group[0], emit, done)
            else:
                await asyncio.gather(*(self._run_one(r, emit, done) for r in group))

    async def _run_one(
        self,
        item: _Ready,
        emit: Callable[[Event], None],
        done: Callable[[ToolUse, ToolResult, float, str | None], None],
    ) -> None:
        call, tool = item.call, item.tool
        emit(ToolStarted(call))
        start = time.monotonic()
        assert call.input is not None
        try:
            output = await tool.run(self.ctx, call.input)
        except ToolError as exc:
            output = ToolOutput(str(exc), is_error=True)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug in a tool must not end the run; the model sees it
            _log_tool_bug(call.name)
            output = ToolOutput(
                f"{call.name} failed unexpectedly: {type(exc).__name__}: {exc}", is_error=True
            )
        done(call, finish(call, output, self.ctx.raw_dir), time.monotonic() - start, output.display)


def _log_tool_bug(name: str) -> None:
    import logging  # only on this rare path: logging costs startup time

    logging.getLogger(__name__).debug("tool %s raised", name, exc_info=True)


def _groups(ready: list[_Ready]) -> list[list[_Ready]]:
    """Consecutive read-only calls form one concurrent group; any other call runs alone."""
    groups: list[list[_Ready]] = []
    for item in ready:
        if item.tool.read_only and groups and groups[-1][0].tool.read_only:
            groups[-1].append(item)
        else:
            groups.append([item])
    return groups


__all__ = ["ToolRunner", "check_call", "finish"]
