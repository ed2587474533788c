"""The built-in tools: files (read, write, edit, multi_edit, ls), shell (and its background
commands), background tasks, search, the todo list, web fetching, and exit_plan_mode."""

from __future__ import annotations

from keel.tools.base import Tool
from keel.tools.builtin.files import edit, multi_edit, read, write
from keel.tools.builtin.listing import ls
from keel.tools.builtin.plan import exit_plan_mode
from keel.tools.builtin.raw import raw_output
from keel.tools.builtin.search import glob, grep
from keel.tools.builtin.shell import bash
from keel.tools.builtin.tasks import bash_kill, bash_output, task_stop, task_wait
from keel.tools.builtin.todo import todo_write
from keel.tools.builtin.web import web_fetch


def builtin_tools() -> list[Tool]:
    """Every built-in tool, each of kind `builtin` with its metadata declared where it is
    defined (docs/tools.md "Tool metadata")."""
    return [
        bash,
        bash_kill,
        bash_output,
        edit,
        exit_plan_mode,
        glob,
        grep,
        ls,
        multi_edit,
        raw_output,
        read,
        task_stop,
        task_wait,
        todo_write,
        web_fetch,
        write,
    ]


__all__ = [
    "bash",
    "bash_kill",
    "bash_output",
    "builtin_tools",
    "edit",
    "exit_plan_mode",
    "glob",
    "grep",
    "ls",
    "multi_edit",
    "raw_output",
    "read",
    "task_stop",
    "task_wait",
    "todo_write",
    "web_fetch",
    "write",
]
