"""An MCP server (stdio, protocol 2025-11-25) whose tools must be called as tasks, for keel's
tests of task-augmented calls. Usage: `tasks_server.py [--no-tasks] [--no-cancel] [--http PORT]`.

The official Python SDK has the task types but no task machinery, so this speaks the JSON-RPC
by hand, one message a line. Each task moves on only when it is polled, so the sequence of
requests a test sees is the same on a fast or a loaded machine. Every message keel sends is
appended to the file `$TASKS_LOG` names (one JSON object a line), for tests to compare whole.

Tools (all `taskSupport: required` but `quick`):
  count n   working for n polls (a status message and a progress notification each), then
            completed with the text "counted to n" and a `notifications/tasks/status`
  fail      failed: its result is an error result ("disk full")
  broken    failed: tasks/result answers with a JSON-RPC error ("the backend crashed")
  stall     working until cancelled
  vanish    cancelled by the server itself
  nudge     completed at once, with a `notifications/tasks/status`; its poll interval is a
            minute, so only the notification makes keel look before then
  ask       input_required: tasks/result carries an `elicitation/create` (related-task), and
            the task completes with what the user answered
  quick     `taskSupport: optional`, answers a plain call at once
With `--no-tasks` the server offers no tasks at all (its required tools cannot be called); with
`--no-cancel` it offers no `tasks/cancel`.
"""

from __future__ import annotations

import json
import os
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

OFFERS_TASKS = "--no-tasks" not in sys.argv
OFFERS_CANCEL = "--no-cancel" not in sys.argv
POLL_MS = 20
RELATED = "io.modelcontextprotocol/related-task"
NOW = "2026-01-01T00:00:00Z"

TOOLS: list[dict[str, Any]] = [
    {
        "name": "count",
        "description": "Count to n, one step a poll.",
        "inputSchema": {"type": "object", "properties": {"n": {"type": "integer"}}},
        "execution": {"taskSupport": "required"},
    },
    *(
        {
            "name": name,
            "description": description,
            "inputSchema": {"type": "object"},
            "execution": {"taskSupport": "required"},
        }
        for name, description in [
            ("fail", "Fail with an error result."),
            ("broken", "Fail with a protocol error."),
            ("stall", "Never finish."),
            ("vanish", "Be cancelled by the server."),
            ("ask", "Ask the user something."),
            ("nudge", "Finish at once and say so; its poll interval is a minute."),
        ]
    ),
    {
        "name": "quick",
        "description": "Answer at once.",
        "inputSchema": {"type": "object"},
        "execution": {"taskSupport": "optional"},
    },
]


class Task:
    def __init__(self, number: int, tool: str, args: dict[str, Any], params: dict[str, Any]):
        self.id = f"task-{number}"
        self.tool = tool
        self.args = args
        self.ttl = params["task"].get("ttl")
        self.token = (params.get("_meta") or {}).get("progressToken")
        self.status = "working"
        self.message = "started"
        self.polls = 0
        self.poll_ms = 60_000 if tool == "nudge" else POLL_MS
        self.result: dict[str, Any] | None = None
        self.error: dict[str, Any] | None = None
        if tool == "ask":
            self.status, self.message = "input_required", "needs an answer"

    def wire(self) -> dict[str, Any]:
        return {
            "taskId": self.id,
            "status": self.status,
            "statusMessage": self.message,
            "createdAt": NOW,
            "lastUpdatedAt": NOW,
            "ttl": self.ttl,
            "pollInterval": self.poll_ms,
        }

    def poll(self) -> None:
        """One `tasks/get`: the task moves on one step."""
        self.polls += 1
        if self.status != "working":
            return
        if self.tool == "count":
            n = int(self.args.get("n", 1))
            if self.polls < n:
                self.message = f"step {self.polls} of {n}"
                progress(self, self.polls, n)
            else:
                self.finish("completed", "done", {"content": text(f"counted to {n}")})
                notify("notifications/tasks/status", self.wire())
        elif self.tool == "fail":
            error = {"content": text("disk full"), "isError": True}
            self.finish("failed", "disk full", error)
        elif self.tool == "broken":
            self.status, self.message = "failed", "the backend crashed"
            self.error = {"code": -32603, "message": "the backend crashed"}
        elif self.tool == "vanish":
            self.status, self.message = "cancelled", "the operator stopped it"

    def finish(self, status: str, message: str, result: dict[str, Any]) -> None:
        self.status, self.message = status, message
        self.result = {**result, "_meta": {RELATED: {"taskId": self.id}}}


tasks: dict[str, Task] = {}
#: The `tasks/result` request waiting for the user's answer: (its id, the task).
waiting: list[tuple[Any, Task]] = []


#: What the server sent while it handled one HTTP request (None: stdio, written at once).
outbox: list[dict[str, Any]] | None = None


def send(message: dict[str, Any]) -> None:
    if outbox is not None:
        outbox.append({"jsonrpc": "2.0", **message})
        return
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", **message}) + "\n")
    sys.stdout.flush()


def answer(request_id: Any, result: dict[str, Any]) -> None:
    send({"id": request_id, "result": result})


def refuse(request_id: Any, code: int, message: str) -> None:
    send({"id": request_id, "error": {"code": code, "message": message}})


def notify(method: str, params: dict[str, Any]) -> None:
    send({"method": method, "params": params})


def progress(task: Task, done: int, total: int) -> None:
    if task.token is not None:
        notify(
            "notifications/progress",
            {"progressToken": task.token, "progress": done, "total": total},
        )


def text(value: str) -> list[dict[str, Any]]:
    return [{"type": "text", "text": value}]


def log(message: dict[str, Any]) -> None:
    path = os.environ.get("TASKS_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(message) + "\n")


def capabilities() -> dict[str, Any]:
    caps: dict[str, Any] = {"tools": {}}
    if OFFERS_TASKS:
        caps["tasks"] = {"list": {}, "requests": {"tools": {"call": {}}}}
        if OFFERS_CANCEL:
            caps["tasks"]["cancel"] = {}
    return caps


def call_tool(request_id: Any, params: dict[str, Any]) -> None:
    name, args = params["name"], params.get("arguments") or {}
    if name == "quick":
        answer(request_id, {"content": text("quick")})
        return
    if "task" not in params:
        refuse(request_id, -32601, f"{name} requires task augmentation")
        return
    if not OFFERS_TASKS:
        refuse(request_id, -32601, "this server offers no tasks")
        return
    task = Task(len(tasks) + 1, name, args, params)
    tasks[task.id] = task
    answer(request_id, {"task": task.wire()})
    if name == "count":
        progress(task, 0, int(args.get("n", 1)))
    elif name == "nudge":  # done at once, and said so: no need to wait for the next poll
        task.finish("completed", "done", {"content": text("nudged")})
        notify("notifications/tasks/status", task.wire())


def task_request(request_id: Any, method: str, params: dict[str, Any]) -> None:
    task = tasks.get(params.get("taskId", ""))
    if task is None:
        refuse(request_id, -32602, "Failed to retrieve task: Task not found")
    elif method == "tasks/get":
        task.poll()
        answer(request_id, task.wire())
    elif method == "tasks/cancel":
        if task.status in ("completed", "failed", "cancelled"):
            refuse(
                request_id,
                -32602,
                f"Cannot cancel task: already in terminal status '{task.status}'",
            )
            return
        task.status, task.message = "cancelled", "The task was cancelled by request."
        answer(request_id, task.wire())
    elif task.status == "input_required":
        waiting.append((request_id, task))
        ask = {
            "message": "Which colour?",
            "requestedSchema": {"type": "object", "properties": {"colour": {"type": "string"}}},
            "_meta": {RELATED: {"taskId": task.id}},
        }
        send({"id": "elicit-1", "method": "elicitation/create", "params": ask})
    elif task.error is not None:
        send({"id": request_id, "error": task.error})
    elif task.result is not None:
        answer(request_id, task.result)
    else:
        refuse(request_id, -32603, f"task {task.id} has no result ({task.status})")


def answered(reply: dict[str, Any]) -> None:
    """The client's answer to the elicitation: the waiting task completes with it."""
    request_id, task = waiting.pop()
    if "error" in reply:
        said = f"refused: {reply['error']['message']}"
    else:
        result = reply["result"]
        said = (
            json.dumps(result.get("content")) if result["action"] == "accept" else result["action"]
        )
    task.finish("completed", "answered", {"content": text(f"you said: {said}")})
    answer(request_id, task.result or {})


def handle(message: dict[str, Any]) -> None:
    method, request_id = message.get("method"), message.get("id")
    params = message.get("params") or {}
    if method is None:
        answered(message)
    elif method == "initialize":
        answer(
            request_id,
            {
                "protocolVersion": "2025-11-25",
                "capabilities": capabilities(),
                "serverInfo": {"name": "keel-tasks", "version": "1"},
            },
        )
    elif method == "tools/list":
        answer(request_id, {"tools": TOOLS})
    elif method == "tools/call":
        call_tool(request_id, params)
    elif method in ("tasks/get", "tasks/result", "tasks/cancel"):
        task_request(request_id, method, params)
    elif request_id is not None:
        refuse(request_id, -32601, f"Method not found: {method}")


class Http(BaseHTTPRequestHandler):
    """Streamable HTTP, as far as these tools need it: each POST is answered with JSON (a
    notification with 202); what the server would send on its own (progress, status
    notifications, the elicitation of `ask`) needs an event stream and is left out."""

    def do_POST(self) -> None:
        message = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        log(
            {k: v for k, v in message.items() if k != "jsonrpc"}
            | {"version_header": self.headers.get("mcp-protocol-version")}
        )
        assert outbox is not None
        outbox.clear()
        handle(message)
        replies = [m for m in outbox if "method" not in m]
        body = json.dumps(replies[0]).encode() if replies else b""
        self.send_response(200 if replies else 202)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # no event stream
        self.send_response(405)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_DELETE = do_GET

    def log_message(self, *args: Any) -> None:
        return None


def main() -> None:
    if "--http" in sys.argv:
        port = int(sys.argv[sys.argv.index("--http") + 1])
        global outbox
        outbox = []
        HTTPServer(("127.0.0.1", port), Http).serve_forever()
    for line in sys.stdin:
        message = json.loads(line)
        log({k: v for k, v in message.items() if k != "jsonrpc"})
        handle(message)


if __name__ == "__main__":
    main()
