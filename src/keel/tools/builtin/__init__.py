"""The built-in tools: files (read, write, edit, multi_edit, ls), shell, search, the todo list,
web fetching, and exit_plan_mode."""

from __future__ import annotations

from keel.tools.base import Tool
from keel.tools.builtin.files import edit, multi_edit, read, write
from keel.tools.builtin.listing import ls
from keel.tools.builtin.plan import exit_plan_mode
from keel.tools.builtin.raw import raw_output
from keel.tools.builtin.search import glob, grep
from keel.tools.builtin.shell import bash
from keel.tools.builtin.todo import todo_write
from keel.tools.builtin.web import web_fetch


def builtin_tools() -> list[Tool]:
    return [
        bash,
        edit,
        exit_plan_mode,
        glob,
        grep,
        ls,
        multi_edit,
        raw_output,
        read,
        todo_write,
        web_fetch,
        write,
    ]


__all__ = [
    "bash",
    "builtin_tools",
    "edit",
    "exit_plan_mode",
    "glob",
    "grep",
    "ls",
    "multi_edit",
    "raw_output",
    "read",
    "todo_write",
    "web_fetch",
    "write",
]
