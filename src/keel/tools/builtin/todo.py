"""`todo_write`: the model's task list for the current job, and `latest_todos` to recover it.

The list lives in the transcript, nowhere else: each call replaces the whole list, the result
echoes it back in a compact form the model reads, and `ToolOutput.display` carries it as JSON
for front ends. `latest_todos` finds the last accepted list in a conversation (so compaction can
carry unfinished items over). This module keeps no state and must never touch the disk.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal, TypeAlias

from keel.frozen import frozen
from keel.llm.messages import Message
from keel.tools.base import ToolContext, ToolError, ToolOutput, tool

TodoStatus: TypeAlias = Literal["pending", "in_progress", "completed"]
STATUSES: tuple[TodoStatus, ...] = ("pending", "in_progress", "completed")
_MARKS = {"pending": "[ ]", "in_progress": "[>]", "completed": "[x]"}
_KEYS = ("content", "status", "active_form")
#: Models trained on Claude Code's TodoWrite send `activeForm`; accept it rather than fail.
_ALIASES = {"activeForm": "active_form"}


@frozen
class Todo:
    content: str
    status: TodoStatus
    #: The present-continuous form shown while it runs ("Running the tests").
    active_form: str = ""

    def to_json(self) -> dict[str, str]:
        out = {"content": self.content, "status": self.status}
        if self.active_form:
            out["active_form"] = self.active_form
        return out


def parse_todos(items: Any) -> list[Todo]:
    """`items` as todos, or a ToolError naming the first problem (items counted from 1)."""
    if not isinstance(items, list):
        raise ToolError(f"INVALID_ARGUMENTS: todos must be an array, got {type(items).__name__}")
    todos = []
    for i, raw in enumerate(items, start=1):
        where = f"INVALID_ARGUMENTS: todo {i}"
        if not isinstance(raw, dict):
            raise ToolError(f"{where} must be an object with content and status")
        item: dict[str, Any] = {_ALIASES.get(str(k), str(k)): v for k, v in raw.items()}
        unknown = sorted(set(item) - set(_KEYS))
        if unknown:
            raise ToolError(
                f"{where}: unknown key(s) {', '.join(unknown)}; accepted: {', '.join(_KEYS)}"
            )
        content = item.get("content")
        if not isinstance(content, str) or not content.strip():
            raise ToolError(f"{where}: content must be a non-empty string")
        status = item.get("status")
        if status not in STATUSES:
            raise ToolError(f"{where}: status must be one of {', '.join(STATUSES)}, got {status!r}")
        active_form = item.get("active_form", "")
        if not isinstance(active_form, str):
            raise ToolError(f"{where}: active_form must be a string")
        todos.append(Todo(content.strip(), status, active_form.strip()))
    running = [i for i, t in enumerate(todos, start=1) if t.status == "in_progress"]
    if len(running) > 1:
        raise ToolError(
            f"{len(running)} todos are in_progress (items {', '.join(map(str, running))}); "
            "keep exactly one in progress at a time: mark the others pending or completed "
            "and send the whole list again"
        )
    return todos


def render_todos(todos: Iterable[Todo]) -> str:
    """The compact text form: one numbered line per item with a status mark."""
    lines = []
    for i, todo in enumerate(todos, start=1):
        line = f"{i}. {_MARKS[todo.status]} {todo.content}"
        if todo.status == "in_progress" and todo.active_form:
            line += f" ({todo.active_form})"
        lines.append(line)
    return "\n".join(lines)


@tool(read_only=True, kind="builtin")
async def todo_write(ctx: ToolContext, todos: list[dict[str, Any]]) -> ToolOutput:
    """Create or update your task list for the current job. Each call replaces the whole list.
    Use it for work of three or more steps: add the steps, mark one `in_progress` before
    starting it (never more than one at a time), and mark it `completed` as soon as it is done.
    Skip it for single, trivial tasks.

    Args:
        todos: The complete list, in order; each is {"content": "Run the tests",
            "status": "pending" | "in_progress" | "completed",
            "active_form": "Running the tests"}.
    """
    import json  # only when called: keeps it off the startup path

    items = parse_todos(todos)
    display = json.dumps([t.to_json() for t in items], ensure_ascii=False)
    if not items:
        return ToolOutput("Todo list cleared.", display=display)
    done = sum(t.status == "completed" for t in items)
    summary = f"{done} of {len(items)} completed"
    return ToolOutput(f"Todo list updated ({summary}):\n{render_todos(items)}", display=display)


# `@tool` describes list[dict] items only as objects; spell out their keys for the model.
todo_write.input_schema["properties"]["todos"]["items"] = {
    "type": "object",
    "properties": {
        "content": {"type": "string", "description": "What to do, in the imperative."},
        "status": {"type": "string", "enum": list(STATUSES)},
        "active_form": {
            "type": "string",
            "description": "The same in the present continuous, shown while it runs.",
        },
    },
    "required": ["content", "status"],
    "additionalProperties": False,
}


def latest_todos(messages: Iterable[Message]) -> list[Todo]:
    """The list of the last `todo_write` call in `messages` that was accepted (its result is
    not an error and its input parses); empty when there is none."""
    history = list(messages)
    failed = {r.tool_use_id for m in history for r in m.tool_results if r.is_error}
    for message in reversed(history):
        for call in reversed(message.tool_uses):
            if call.name != todo_write.name or call.input is None or call.id in failed:
                continue
            try:
                return parse_todos(call.input.get("todos"))
            except ToolError:
                continue
    return []
