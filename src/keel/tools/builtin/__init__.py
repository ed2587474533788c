"""The built-in tools: file reading and editing, shell, and search."""

from __future__ import annotations

from keel.tools.base import Tool
from keel.tools.builtin.files import edit, read, write
from keel.tools.builtin.search import glob, grep
from keel.tools.builtin.shell import bash


def builtin_tools() -> list[Tool]:
    return [bash, edit, glob, grep, read, write]


__all__ = ["bash", "builtin_tools", "edit", "glob", "grep", "read", "write"]
