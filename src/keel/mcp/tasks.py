"""Task-augmented tool calls: the "tasks" of MCP 2025-11-25, for tools that require them.

A server that offers tasks for `tools/call` (its `capabilities.tasks.requests.tools.call`) may
mark a tool `execution.taskSupport: "required"`; such a tool answers a plain call with -32601.
keel calls it with a `task` field in the params; the server answers at once with the task (a
`CreateTaskResult`), and keel then polls `tasks/get` at the task's `pollInterval` (a
`notifications/tasks/status` wakes it early; the spec makes the notification optional, so the
polling never stops on its account). Once the task completed or failed, keel reads the tool's
own result with `tasks/result`; when the task needs input (`input_required`) it calls
`tasks/result` at once, through which the server sends its `elicitation/create`, answered like
any other elicitation. When keel's call is cancelled (an interrupt, the per-call timeout,
shutdown) it sends `tasks/cancel`, where the server offers it (`capabilities.tasks.cancel`),
and otherwise says that the task may still run there. A progress token keel chose goes with the
`tools/call`; it stays valid for the task's whole life, so `notifications/progress` for it is
passed on until the result is in, and each new status message is passed on as progress too.

Tools whose `taskSupport` is `optional` are called as plain requests: their result then arrives
the moment it is ready rather than at the next poll, and a plain call reports progress and is
cancelled (`notifications/cancelled`) just as well. keel advertises no `tasks` capability of its
own: that capability lists the requests a server may send keel as tasks, and keel runs none.

`TaskCalls` serves one connection and runs in that server's owner task (keel.mcp.client); this
module must never import the `mcp` SDK at module level.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import anyio
    from mcp import ClientSession
    from mcp.shared.jsonrpc_dispatcher import JSONRPCDispatcher
    from mcp_types import CallToolResult, Task, TaskStatusNotificationParams

#: Seconds between polls when a task names no `pollInterval`, and the shortest keel accepts.
DEFAULT_POLL = 1.0
MIN_POLL = 0.05
#: Seconds the server is asked to keep a task beyond keel's per-call timeout (its `ttl`).
TTL_MARGIN = 60.0

#: Progress of a running call: (progress, total, message).
Progress = Callable[[float, float | None, str | None], None]


class TaskEnded(Exception):
    """The task ended without a result to pass on (cancelled on the server's side, its result
    failed or gone). The message says what happened, for the model."""


class TaskCalls:
    """Task-augmented calls over one connection, and the notifications that concern them."""

    def __init__(
        self,
        server: str,
        session: ClientSession,
        dispatcher: JSONRPCDispatcher[Any],
        *,
        can_cancel: bool,
        cancel_timeout: float,
        notice: Callable[[str], None],
    ) -> None:
        self.server = server
        self._session = session
        self._dispatcher = dispatcher
        self._can_cancel = can_cancel
        self._cancel_timeout = cancel_timeout
        self._notice = notice
        #: Wakes the poll of a task when the server says its status changed.
        self._wakes: dict[str, anyio.Event] = {}
        self._progress: dict[str, Progress] = {}
        self._tokens = itertools.count(1)
        #: Task-augmented calls waiting for the server's answer (its task).
        self._creating = 0

    async def status_changed(self, params: TaskStatusNotificationParams) -> None:
        """A `notifications/tasks/status`: poll that task now."""
        import anyio

        wake = self._wakes.get(params.task_id)
        if wake is None and self._creating:  # it may overtake the answer that creates the task
            wake = self._wakes[params.task_id] = anyio.Event()
        if wake is not None:
            wake.set()

    def progressed(
        self, token: str | int, progress: float, total: float | None, message: str | None
    ) -> None:
        """A `notifications/progress`: passed on if its token is one of a task call's."""
        sink = self._progress.get(str(token))
        if sink is not None:
            sink(progress, total, message)

    async def call(
        self, tool: str, args: dict[str, Any], *, keep: float, on_progress: Progress | None
    ) -> CallToolResult:
        """Run `tool` as a task and return its result; the server is asked to keep the task
        `keep` seconds (its `ttl`). Raises `TaskEnded` when there is no result, and the SDK's
        `MCPError` when the server refuses the call or the connection drops."""
        from mcp.shared.dispatcher import CallOptions
        from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER
        from mcp_types import CallToolResult, CreateTaskResult

        params: dict[str, Any] = {
            "name": tool,
            "arguments": args,
            "task": {"ttl": round(keep * 1000)},
        }
        token = ""
        if on_progress is not None:
            token = f"keel-task-{next(self._tokens)}"
            params["_meta"] = {"progressToken": token}
            self._progress[token] = on_progress
        opts: CallOptions = {}
        if self._session.protocol_version:
            opts["headers"] = {MCP_PROTOCOL_VERSION_HEADER: self._session.protocol_version}
        try:
            # The SDK's `call_tool` takes no `task` and reads every answer as a CallToolResult,
            # so this one request goes through the connection's dispatcher as it is.
            self._creating += 1
            try:
                raw = await self._dispatcher.send_raw_request("tools/call", params, opts)
            finally:
                self._creating -= 1
            if "task" not in raw:  # the server ran it as a plain call after all
                return CallToolResult.model_validate(raw, by_name=False)
            task = CreateTaskResult.model_validate(raw, by_name=False).task
            return await self._follow(tool, task, on_progress)
        finally:
            self._progress.pop(token, None)

    async def _follow(self, tool: str, task: Task, on_progress: Progress | None) -> CallToolResult:
        import anyio

        said = ""
        self._wakes.setdefault(task.task_id, anyio.Event())
        try:
            while True:
                said = _report(task, said, on_progress)
                if task.status != "working":
                    break
                with anyio.move_on_after(_interval(task)):
                    await self._wakes[task.task_id].wait()
                self._wakes[task.task_id] = anyio.Event()
                task = await self._get(task.task_id)
            if task.status == "cancelled":
                raise TaskEnded(
                    f'mcp server "{self.server}" cancelled the task of tool "{tool}"'
                    + (f": {task.status_message}" if task.status_message else "")
                )
            return await self._result(tool, task)
        except anyio.get_cancelled_exc_class():
            if task.status not in ("completed", "failed", "cancelled"):
                await self._cancel(tool, task.task_id)
            raise
        finally:
            del self._wakes[task.task_id]

    async def _get(self, task_id: str) -> Task:
        from mcp_types import GetTaskRequest, GetTaskRequestParams, GetTaskResult

        request = GetTaskRequest(params=GetTaskRequestParams(task_id=task_id))
        got: Task = await self._session.send_request(request, GetTaskResult)
        return got

    async def _result(self, tool: str, task: Task) -> CallToolResult:
        """`tasks/result`: the tool's own result (it waits while the task still runs, and
        carries the server's requests for input meanwhile)."""
        from mcp import MCPError
        from mcp_types import (
            CONNECTION_CLOSED,
            CallToolResult,
            GetTaskPayloadRequest,
            GetTaskPayloadRequestParams,
        )

        request = GetTaskPayloadRequest(params=GetTaskPayloadRequestParams(task_id=task.task_id))
        try:
            result: CallToolResult = await self._session.send_request(request, CallToolResult)
        except MCPError as exc:
            if exc.code == CONNECTION_CLOSED:
                raise
            why = exc.message
            if task.status_message and task.status_message not in why:
                why = f"{task.status_message}; {why}"
            raise TaskEnded(
                f'mcp server "{self.server}": tool "{tool}" failed: {why} (error {exc.code})'
            ) from None
        return result

    async def _cancel(self, tool: str, task_id: str) -> None:
        """`tasks/cancel`, shielded from the cancellation that asked for it and bounded in
        time; what keeps the task from being cancelled is said, never dropped."""
        import anyio
        from mcp import MCPError
        from mcp_types import CancelTaskRequest, CancelTaskRequestParams, CancelTaskResult

        why = ""
        if not self._can_cancel:
            why = "the server does not offer tasks/cancel"
        else:
            request = CancelTaskRequest(params=CancelTaskRequestParams(task_id=task_id))
            with anyio.CancelScope(shield=True), anyio.move_on_after(self._cancel_timeout) as scope:
                try:
                    await self._session.send_request(request, CancelTaskResult)
                except MCPError as exc:
                    why = f"{exc.message} (error {exc.code})"
                except Exception as exc:  # the connection is gone: say so, the call is over
                    why = str(exc) or type(exc).__name__
            if scope.cancelled_caught:
                why = f"no answer to tasks/cancel within {self._cancel_timeout:g} s"
        if why:
            self._notice(
                f'mcp server "{self.server}": task {task_id} of tool "{tool}" was not cancelled '
                f"({why}); it may still run there"
            )


def _interval(task: Task) -> float:
    if task.poll_interval is None:
        return DEFAULT_POLL
    return max(MIN_POLL, task.poll_interval / 1000)


def _report(task: Task, said: str, on_progress: Progress | None) -> str:
    """Pass a new status message on as progress; return what was said last."""
    message = task.status_message or (
        "waiting for input" if task.status == "input_required" else ""
    )
    if message and message != said and on_progress is not None:
        on_progress(0.0, None, message)
    return message or said
