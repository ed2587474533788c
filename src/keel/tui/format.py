"""How the front ends word and number things: token counts, the context meter, durations, costs,
a tool call's key argument, a preview of what a call would change, and what a stored prompt
looked like when it was typed. Pure functions over plain values: no textual, no rich, no I/O.
"""

from __future__ import annotations

import json
from typing import Any, Literal, TypeAlias

from keel.agent.events import AgentSpend
from keel.agent.mentions import typed_prompt
from keel.llm.messages import ToolUse

#: The context meter turns amber, then red, at these shares of the window.
CONTEXT_WARN = 0.70
CONTEXT_HIGH = 0.90

Level: TypeAlias = Literal["ok", "warn", "high"]


def tokens(n: int) -> str:
    """`950`, `12.3k`, `62k`, `1.2M`."""
    if n < 1000:
        return str(n)
    if n < 10_000:
        return f"{n / 1000:.1f}k"
    if n < 1_000_000:
        return f"{round(n / 1000)}k"
    return f"{n / 1_000_000:.1f}M"


def context_meter(context: int, window: int) -> tuple[str, Level]:
    """`31% · 62k/200k` and how alarming it is."""
    if window <= 0:
        return f"{tokens(context)}", "ok"
    share = context / window
    level: Level = "high" if share >= CONTEXT_HIGH else "warn" if share >= CONTEXT_WARN else "ok"
    return f"{round(share * 100)}% · {tokens(context)}/{tokens(window)}", level


def duration(seconds: float) -> str:
    """`0.4s`, `12s`, `3m 05s`."""
    if seconds < 10:
        return f"{seconds:.1f}s"
    if seconds < 60:
        return f"{round(seconds)}s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes}m {rest:02d}s"


def spend_text(row: AgentSpend) -> str:
    """One agent's row of a tree's spend: `general · $0.0123 · 12.3k tokens` (and its stop
    reason once it ended other than done)."""
    text = f"{row.agent} · {cost(row.cost)} · {tokens(row.usage.total)} tokens"
    return text if row.status in ("running", "end_turn") else f"{text} · {row.status}"


def cost(usd: float) -> str:
    if usd == 0:
        return "$0.00"
    return f"${usd:.4f}" if usd < 1 else f"${usd:.2f}"


def one_line(text: str, width: int = 80) -> str:
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 1] + "…"


def kind_label(kind: str, name: str) -> tuple[str, str]:
    """The kind shown before a tool's name on its card, and the name shown: nothing for a
    built-in (or an unknown kind), `mcp` without the `mcp__` prefix the kind already says
    (`("mcp", "github__create_issue")`), else the kind and the whole name."""
    if kind in ("", "builtin"):
        return "", name
    if kind == "mcp" and name.startswith("mcp__"):
        return kind, name[len("mcp__") :]
    return kind, name


#: The argument that says most about a call, per argument name, in order of preference.
_KEY_ARGS = ("command", "path", "file_path", "pattern", "url", "query", "name", "skill", "id")


def key_argument(call: ToolUse, width: int = 80) -> str:
    """What to show beside a tool's name: its command, path, pattern or URL."""
    args: dict[str, Any] = call.input or {}
    if call.name == "todo_write" and isinstance(args.get("todos"), list):
        return f"{len(args['todos'])} items"
    if call.name == "exit_plan_mode":
        return "the plan"
    for key in _KEY_ARGS:
        value = args.get(key)
        if isinstance(value, str) and value:
            return one_line(value, width)
    for value in args.values():
        if isinstance(value, str) and value:
            return one_line(value, width)
    return ""


def call_preview(call: ToolUse, max_lines: int = 40) -> str:
    """What a call would change, for a permission prompt: a `-`/`+` diff for edits, the start of
    a file to be written, the command line for bash, the arguments otherwise."""
    args: dict[str, Any] = call.input or {}
    lines: list[str]
    if call.name == "bash":
        lines = [f"$ {args.get('command', '')}"]
        if args.get("description"):
            lines.append(f"# {args['description']}")
    elif call.name == "edit":
        lines = _edit_lines(args)
    elif call.name == "multi_edit":
        lines = []
        for edit in args.get("edits") or []:
            if isinstance(edit, dict):
                if lines:
                    lines.append("…")
                lines += _edit_lines(edit)
    elif call.name == "write":
        lines = [f"+{line}" for line in str(args.get("content", "")).splitlines()]
    else:
        lines = json.dumps(args, indent=2, ensure_ascii=False).splitlines()
    if len(lines) > max_lines:
        lines = [*lines[:max_lines], f"… {len(lines) - max_lines} more lines"]
    return "\n".join(lines)


def _edit_lines(args: dict[str, Any]) -> list[str]:
    old = str(args.get("old_string", "")).splitlines()
    new = str(args.get("new_string", "")).splitlines()
    return [*(f"-{line}" for line in old), *(f"+{line}" for line in new)]


def progress_text(progress: float, total: float | None, message: str) -> str:
    """A tool's progress for its card: the message, else `3/10` (or `3`)."""
    if message:
        return message
    count = f"{progress:g}/{total:g}" if total else f"{progress:g}"
    return count


def diff_line_kind(line: str) -> Literal["add", "remove", "hunk", "header", "context"]:
    """How a unified diff line should be coloured."""
    if line.startswith(("+++", "---")):
        return "header"
    if line.startswith("@@"):
        return "hunk"
    if line.startswith("+"):
        return "add"
    if line.startswith("-"):
        return "remove"
    return "context"


def auto_decision_text(call: ToolUse, decision: str, reason: str) -> tuple[str, bool]:
    """Auto mode's decision as one line for every front end, and whether it warns (a refusal,
    or a classifier that could not decide)."""
    what = f"{call.name} {key_argument(call, 60)}".rstrip()
    verb = {"allow": "allowed", "deny": "refused"}.get(decision)
    if verb is None:
        return f"auto mode could not decide {what}: {reason}", True
    return f"auto mode {verb} {what}: {reason}", decision != "allow"


__all__ = [
    "CONTEXT_HIGH",
    "CONTEXT_WARN",
    "auto_decision_text",
    "call_preview",
    "context_meter",
    "cost",
    "diff_line_kind",
    "duration",
    "key_argument",
    "one_line",
    "progress_text",
    "tokens",
    "typed_prompt",
]
