"""Tool profiles: which of an agent's tools a context offers the model, and in what words.

- `full`: every tool, each with its whole description.
- `compact`: the core built-in tools (`COMPACT`: bash, edit, glob, grep, ls, read, write, and
  exit_plan_mode when the context starts in plan mode) with a one-line description each, the
  `skill` tool, and every tool the user configured (MCP servers', remote peers', their own) as
  it is; no provider-side web search. Each offered tool keeps its schema as it is, so a call is
  checked and runs exactly as in `full`. Left out: multi_edit (edit does it), todo_write,
  web_fetch, memory, task (subagents), knowledge_search, raw_output and the background-task
  tools (bash_output, bash_kill, task_wait, task_stop).
- `auto` (the default): `compact` for a model whose window is at most `COMPACT_WINDOW` tokens,
  else `full`.

A tool a deny rule takes in whole (`PermissionGate.withheld`) is offered in no profile. The
agent asks `offered` once per context, at its first request (the tools open every request:
the set must not change within a context). This module decides what is offered; it never runs
or authorises a call (an offered tool's call still goes through the gate).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Literal, TypeAlias

from keel.llm.catalog import SMALL_WINDOW
from keel.llm.request import ToolSpec
from keel.tools.base import Tool, spec, tool_kind

ToolProfile: TypeAlias = Literal["full", "compact", "auto"]
PROFILES: tuple[ToolProfile, ...] = ("full", "compact", "auto")

#: `auto` picks `compact` up to this window (tokens). keel's system prompt and the full tools
#: of `keel -p` take about 16 kB, ~4k tokens (docs/tools.md "Tool profiles"): a quarter of a
#: 16k window and half of an 8k one before the first message; with the compact tools ~5.5 kB,
#: ~1.4k tokens. From 32k on the full set is an eighth of the window or less.
COMPACT_WINDOW = SMALL_WINDOW

#: The built-in tools of the compact profile and their one-line descriptions.
COMPACT: dict[str, str] = {
    "bash": "Run a bash command in the working directory; returns its output and exit code.",
    "edit": (
        "Replace exact text in a file: old_string must match the file exactly and once "
        "(or set replace_all). Read the file first."
    ),
    "exit_plan_mode": "Present your plan to the user and ask to leave plan mode.",
    "glob": 'Find files whose path matches a glob such as "**/*.py".',
    "grep": "Search file contents with a regular expression; returns path:line:text.",
    "ls": "List a directory.",
    "read": "Read a file as numbered lines. Read a file before changing it.",
    "write": "Create a file, or overwrite one you have read.",
}
#: Built-in tools the compact profile offers as they are (what the user installed: skills).
KEPT_AS_IS = frozenset({"skill"})
#: Kinds of tools the compact profile keeps whole: the user configured them.
USER_KINDS = frozenset({"local", "mcp", "remote"})


def chosen(profile: ToolProfile, window: int) -> Literal["full", "compact"]:
    """The profile `profile` means for a model with this window (tokens)."""
    if profile == "auto":
        return "compact" if 0 < window <= COMPACT_WINDOW else "full"
    return profile


def offered(
    tools: Iterable[Tool],
    profile: Literal["full", "compact"],
    *,
    withheld: Callable[[str], object] = lambda name: None,
    plan_mode: bool = False,
) -> tuple[ToolSpec, ...]:
    """The definitions of `tools` a context offers, in their order: those `withheld` (a deny
    rule that takes in every call) answers None for, then the profile's choice."""
    out: list[ToolSpec] = []
    for t in tools:
        if withheld(t.name) is not None:
            continue
        if profile == "full" or t.name in KEPT_AS_IS or tool_kind(t) in USER_KINDS:
            out.append(spec(t))
        elif t.name in COMPACT and (t.name != "exit_plan_mode" or plan_mode):
            out.append(ToolSpec(t.name, COMPACT[t.name], t.input_schema))
    return tuple(out)


__all__ = ["COMPACT", "COMPACT_WINDOW", "PROFILES", "ToolProfile", "chosen", "offered"]
