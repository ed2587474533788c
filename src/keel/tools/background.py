"""Background tasks: shell commands and subagents that run while the agent keeps working.

One `BackgroundTasks` belongs to one agent (its subagents share it). A task gets an id (`bg-1`,
`bg-2`, …), runs as an asyncio task, and ends `completed`, `failed` or `stopped`. Finished tasks
wait to be delivered: the loop sends their results to the model as `<task-notification>` blocks
with its next request (or, when nothing is running, in a turn keel starts itself). `task_wait`
delivers a result directly, so the model never gets it twice.

Background tasks do not survive the process: they are stopped when the agent closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import field
from typing import Literal, TypeAlias

from keel.frozen import mutable
from keel.tools.base import ToolError

#: At most this many background tasks run at once.
MAX_RUNNING = 8
#: `task_stop` waits this long for a task to wind down.
STOP_WAIT = 10.0
#: When the agent closes, running tasks get this long after being cancelled.
CLOSE_WAIT = 3.0
#: The result of a task stopped before it produced one.
STOPPED = "stopped before it finished"
#: Bytes of a shell's output held for `bash_output`; older output is dropped (and counted).
OUTPUT_KEEP = 1024 * 1024
#: Characters of a result carried in a notification or a `task_wait` answer.
RESULT_CHARS = 30_000

Kind: TypeAlias = Literal["shell", "agent"]
Status: TypeAlias = Literal["running", "completed", "failed", "stopped"]


class OutputBuffer:
    """A shell's live output: appended by the process, read in pieces by `bash_output`."""

    def __init__(self, keep: int = OUTPUT_KEEP) -> None:
        self.keep = keep
        self._data = bytearray()
        self._start = 0  # absolute offset of _data[0]
        self._read = 0  # absolute offset of what bash_output has returned
        self.total = 0

    def feed(self, data: bytes) -> None:
        self._data += data
        self.total += len(data)
        if len(self._data) > self.keep:
            drop = len(self._data) - self.keep
            del self._data[:drop]
            self._start += drop

    def read_new(self) -> tuple[str, int]:
        """(output not returned before, bytes of it dropped unread because it was too much)."""
        skipped = max(0, self._start - self._read)
        begin = max(self._read, self._start) - self._start
        self._read = self.total
        return self._data[begin:].decode("utf-8", "replace"), skipped

    def tail(self, chars: int) -> str:
        text = self._data[-chars * 4 :].decode("utf-8", "replace")
        return text[-chars:]


@mutable(eq=False)
class BackgroundTask:
    id: str
    kind: Kind
    description: str
    status: Status = "running"
    #: The final result: a shell's output tail and exit code, a subagent's final message.
    result: str = ""
    started: float = field(default_factory=time.monotonic)
    finished: float | None = None
    #: Whether the model has been given the result.
    delivered: bool = False
    #: A shell's live output.
    output: OutputBuffer | None = None
    #: The subagent type, for notifications.
    agent: str = ""
    task: asyncio.Task[None] | None = None

    @property
    def done(self) -> bool:
        return self.status != "running"

    def seconds(self) -> float:
        return (self.finished or time.monotonic()) - self.started

    def notification(self) -> str:
        """The `<task-notification>` block that tells the model how the task ended."""
        from html import escape  # here: html's entity table is ~3 ms of start-up

        attrs = f'id="{self.id}" kind="{self.kind}" status="{self.status}"'
        if self.agent:
            attrs += f' agent="{escape(self.agent)}"'
        attrs += f' description="{escape(self.description)}"'
        result = _cut(self.result, keep_end=self.kind == "shell")
        return f"<task-notification {attrs}>\n{result}\n</task-notification>"

    def summary(self) -> str:
        """One line: id, kind, status, age, description."""
        return (
            f"{self.id} {self.kind} {self.status} after {self.seconds():.0f} s: {self.description}"
        )


#: Runs a task's work; returns (status, result). Cancellation means `stopped`.
Work: TypeAlias = Callable[[BackgroundTask], Awaitable[tuple[Status, str]]]


class BackgroundTasks:
    """The background tasks of one agent and its subagents."""

    def __init__(self, max_running: int = MAX_RUNNING) -> None:
        self.max_running = max_running
        self.tasks: dict[str, BackgroundTask] = {}
        self._next = 1
        self._changed = asyncio.Condition()
        #: Called when a task ends (front ends use it to wake an idle session).
        self.on_finish: list[Callable[[BackgroundTask], None]] = []

    def running(self) -> list[BackgroundTask]:
        return [t for t in self.tasks.values() if not t.done]

    def undelivered(self) -> list[BackgroundTask]:
        return [t for t in self.tasks.values() if t.done and not t.delivered]

    @property
    def pending(self) -> bool:
        """Something is still running or has a result the model has not seen."""
        return any(not t.done or not t.delivered for t in self.tasks.values())

    def start(self, kind: Kind, description: str, work: Work, *, agent: str = "") -> BackgroundTask:
        """Start `work` in the background. Raises `ToolError` when `max_running` are running."""
        running = self.running()
        if len(running) >= self.max_running:
            listing = ", ".join(t.id for t in running)
            raise ToolError(
                f"{self.max_running} background tasks are already running ({listing}); wait for "
                "one with task_wait or stop one with task_stop first"
            )
        task = BackgroundTask(f"bg-{self._next}", kind, description, agent=agent)
        self._next += 1
        if kind == "shell":
            task.output = OutputBuffer()
        self.tasks[task.id] = task
        task.task = asyncio.get_running_loop().create_task(
            self._run(task, work), name=f"keel {task.id}"
        )
        task.task.add_done_callback(lambda _: self._cancelled_unstarted(task))
        return task

    async def _run(self, task: BackgroundTask, work: Work) -> None:
        try:
            status, result = await work(task)
        except asyncio.CancelledError:
            status, result = "stopped", task.result or STOPPED
        except Exception as exc:  # a task's own failure is its result, not ours
            status, result = "failed", f"{type(exc).__name__}: {exc}"
        self._settle(task, status, result)
        await self._notify()

    def _settle(self, task: BackgroundTask, status: Status, result: str) -> None:
        task.status, task.result, task.finished = status, result, time.monotonic()
        for callback in self.on_finish:
            callback(task)

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    def _cancelled_unstarted(self, task: BackgroundTask) -> None:
        """A task cancelled before its first step never enters `_run`: settle it here."""
        if not task.done:
            self._settle(task, "stopped", STOPPED)
            asyncio.get_running_loop().create_task(self._notify(), name=f"keel {task.id} end")

    def get(self, task_id: str, kind: Kind | None = None) -> BackgroundTask:
        task = self.tasks.get(task_id)
        if task is None or (kind is not None and task.kind != kind):
            what = f"{kind} " if kind else ""
            known = [t.id for t in self.tasks.values() if kind is None or t.kind == kind]
            listing = ", ".join(known) if known else "none started"
            raise ToolError(f"no background {what}task {task_id!r} (known: {listing})")
        return task

    async def wait(
        self,
        ids: Iterable[str] = (),
        timeout: float | None = None,  # noqa: ASYNC109 - the model picks it
    ) -> list[BackgroundTask]:
        """Wait until the tasks `ids` (all running ones if empty) are done or `timeout` passes;
        returns those tasks."""
        chosen = [self.get(i) for i in ids] or self.running()

        async def all_done() -> None:
            async with self._changed:
                await self._changed.wait_for(lambda: all(t.done for t in chosen))

        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(all_done(), timeout)
        return chosen

    async def stop(self, task_id: str, kind: Kind | None = None) -> BackgroundTask:
        """Cancel a task and wait (at most `STOP_WAIT` s) for it to wind down."""
        task = self.get(task_id, kind)
        if task.task is not None and not task.done:
            task.task.cancel()
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(task.task), STOP_WAIT)
        return task

    def take_notifications(self) -> str:
        """The `<task-notification>` blocks of finished tasks the model has not seen ("" if
        none), marking them delivered."""
        ready = self.undelivered()
        for task in ready:
            task.delivered = True
        return "\n".join(t.notification() for t in ready)

    def stop_all(self) -> None:
        """Cancel every running task (without waiting)."""
        for task in self.running():
            if task.task is not None:
                task.task.cancel()

    async def aclose(self) -> None:
        """Stop every running task, giving them `CLOSE_WAIT` seconds in all."""
        running = [t.task for t in self.running() if t.task is not None]
        self.stop_all()
        if running:
            await asyncio.wait(running, timeout=CLOSE_WAIT)


def _cut(text: str, *, keep_end: bool, limit: int = RESULT_CHARS) -> str:
    """A result within `limit` characters: a shell's last output, a subagent's first."""
    if len(text) <= limit:
        return text
    cut = len(text) - limit
    if keep_end:
        return f"[… {cut} earlier characters cut]\n{text[-limit:]}"
    return f"{text[:limit]}\n[… {cut} more characters cut]"
