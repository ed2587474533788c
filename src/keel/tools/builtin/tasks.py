"""Tools over background tasks: `bash_output` and `bash_kill` for background commands,
`task_wait` and `task_stop` for any background task (commands and subagents).

All four only look at or stop work the agent itself started, so they are read-only: they never
ask for permission.
"""

from __future__ import annotations

from keel.tools.background import MAX_RUNNING, BackgroundTask, BackgroundTasks
from keel.tools.base import ToolContext, ToolError, ToolOutput, tool

#: The longest `task_wait` may block.
MAX_WAIT = 600


def _tasks(ctx: ToolContext) -> BackgroundTasks:
    if ctx.background is None:
        raise ToolError("there are no background tasks in this context")
    return ctx.background


@tool(read_only=True, kind="builtin")
async def bash_output(ctx: ToolContext, id: str) -> ToolOutput:
    """Read what a background command (started with run_in_background) printed since the last
    bash_output call, and whether it is still running.

    Args:
        id: The command's id, e.g. bg-1.
    """
    task = _tasks(ctx).get(id, "shell")
    assert task.output is not None
    from keel.tools.builtin.shell import clean_output

    new, skipped = task.output.read_new()
    lines = [f"{task.id}: {task.status} after {task.seconds():.0f} s"]
    if skipped:
        lines.append(f"[{skipped} bytes of output dropped unread: only the last 1 MB is kept]")
    text = clean_output(new).rstrip("\n")
    lines.append(text if text else "(no new output)")
    if task.done:
        lines.append(task.result.rsplit("\n", 1)[-1])  # the [exit code N] line
        task.delivered = True  # the model has seen how it ended
    return ToolOutput("\n".join(lines))


@tool(read_only=True, kind="builtin")
async def bash_kill(ctx: ToolContext, id: str) -> ToolOutput:
    """Stop a background command (and every process it started).

    Args:
        id: The command's id, e.g. bg-1.
    """
    task = await _tasks(ctx).stop(id, "shell")
    task.delivered = True
    return ToolOutput(f"{task.id}: {task.status}")


@tool(read_only=True, kind="builtin")
async def task_wait(ctx: ToolContext, ids: list[str] | None = None, timeout: int = 60) -> str:  # noqa: ASYNC109 - the model picks it
    """Wait for background tasks (commands or subagents) to finish and get their results.
    Returning at the timeout only means they are not done yet; they keep running.

    Args:
        ids: The task ids to wait for (all running tasks when omitted).
        timeout: Seconds to wait at most (default 60, at most 600).
    """
    if timeout < 0 or timeout > MAX_WAIT:
        raise ToolError(f"timeout must be between 0 and {MAX_WAIT} seconds")
    tasks = _tasks(ctx)
    chosen = await tasks.wait(ids or (), timeout)
    if not chosen:
        return "no background tasks are running"
    return "\n\n".join(_report(t) for t in chosen)


def _report(task: BackgroundTask) -> str:
    if not task.done:
        return f"{task.summary()} (still running)"
    task.delivered = True
    return task.notification()


@tool(read_only=True, kind="builtin")
async def task_stop(ctx: ToolContext, id: str) -> ToolOutput:
    """Stop a background task (a command or a subagent); waits up to 10 s for it to end.

    Args:
        id: The task's id, e.g. bg-2.
    """
    task = await _tasks(ctx).stop(id)
    task.delivered = True
    partial = f"\n{task.result}" if task.kind == "agent" and task.result else ""
    return ToolOutput(f"{task.id}: {task.status}{partial}")


__all__ = ["MAX_RUNNING", "bash_kill", "bash_output", "task_stop", "task_wait"]
