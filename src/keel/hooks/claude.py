"""Claude Code's hook payloads: the one table that turns keel's tool calls, results, modes and
reasons into what Claude Code sends its hooks, and a hook's `updatedInput` back into keel's
arguments. docs/extensions.md shows the same table.

Tool names come from keel.tools.names (the one name table); this module owns the fields:
`tool_input` in Claude Code's field names (paths absolute, Bash `timeout` in milliseconds),
`tool_response` in the shape Claude Code records for each tool (with `originalFile` and
`structuredPatch` hunks, Read's line counts as Claude Code counts them), `permission_mode` in
Claude Code's values, which events carry which common fields, the UUID hooks see for a keel
session, and the list of Claude Code's hook events with the ones keel runs. Tools keel has
and Claude Code lacks keep keel's names and arguments (`raw_output`, `task_wait`…), and their
response is Claude Code's shape for an MCP tool: a list of content blocks.

Pure functions over plain data: it runs nothing and imports nothing above keel.tools.
"""

from __future__ import annotations

import itertools
import math
import re
from pathlib import Path
from typing import Any, Final

from keel.frozen import frozen
from keel.tools.names import CLAUDE_TO_KEEL, to_claude

#: Every hook event Claude Code has (its hooks reference and Claude Code 2.1.197), in its order.
CLAUDE_EVENTS: Final[tuple[str, ...]] = (
    "SessionStart",
    "Setup",
    "UserPromptSubmit",
    "UserPromptExpansion",
    "PreToolUse",
    "PermissionRequest",
    "PermissionDenied",
    "PostToolUse",
    "PostToolUseFailure",
    "PostToolBatch",
    "Notification",
    "SubagentStart",
    "SubagentStop",
    "TaskCreated",
    "TaskCompleted",
    "Stop",
    "StopFailure",
    "TeammateIdle",
    "InstructionsLoaded",
    "ConfigChange",
    "CwdChanged",
    "FileChanged",
    "WorktreeCreate",
    "WorktreeRemove",
    "PreCompact",
    "PostCompact",
    "Elicitation",
    "ElicitationResult",
    "MessageDisplay",
    "SessionEnd",
)

#: The events keel runs, with Claude Code's semantics. PermissionDenied runs when keel's
#: permission gate refuses a call (Claude Code: when its auto mode classifier does).
EVENTS: Final[tuple[str, ...]] = (
    "SessionStart",
    "UserPromptSubmit",
    "UserPromptExpansion",
    "PreToolUse",
    "PermissionRequest",
    "PermissionDenied",
    "PostToolUse",
    "PostToolUseFailure",
    "PostToolBatch",
    "Notification",
    "SubagentStart",
    "SubagentStop",
    "Stop",
    "StopFailure",
    "PreCompact",
    "PostCompact",
    "InstructionsLoaded",
    "Elicitation",
    "ElicitationResult",
    "SessionEnd",
)

#: Claude Code's events keel does not run (their hooks are named at startup, never dropped
#: silently).
UNSUPPORTED_EVENTS: Final[tuple[str, ...]] = tuple(e for e in CLAUDE_EVENTS if e not in EVENTS)

#: The events whose payload carries `permission_mode` (Claude Code leaves it out of the others).
MODE_EVENTS: Final[frozenset[str]] = frozenset(
    {
        "UserPromptSubmit",
        "UserPromptExpansion",
        "PreToolUse",
        "PermissionRequest",
        "PermissionDenied",
        "PostToolUse",
        "PostToolUseFailure",
        "PostToolBatch",
        "Stop",
        "SubagentStop",
        "Elicitation",
        "ElicitationResult",
    }
)
#: The events whose payload carries `effort` (`{"level": …}`) when the model has one.
EFFORT_EVENTS: Final[frozenset[str]] = MODE_EVENTS - {
    "UserPromptSubmit",
    "UserPromptExpansion",
    "Elicitation",
    "ElicitationResult",
} | {"StopFailure"}

#: keel session ids map one to one to the UUIDs hooks see as `session_id` (Claude Code's ids are
#: UUIDs, and hooks check that they are).
#: (A string: the uuid module is imported only when an id is made, ~4 ms of start-up.)
SESSION_NAMESPACE: Final = "6f1c2a9e-5b7d-4e0a-9c3f-8d2b1e4a7c60"


def hook_session_id(session_id: str) -> str:
    """The UUID hooks see for keel's session `session_id`: the same for the same session, on
    every resume; a keel id that is a UUID already stays as it is."""
    import uuid

    try:
        return str(uuid.UUID(session_id))
    except ValueError:
        return str(uuid.uuid5(uuid.UUID(SESSION_NAMESPACE), session_id))


#: keel's permission modes in Claude Code's spelling.
PERMISSION_MODES: Final[dict[str, str]] = {
    "default": "default",
    "accept-edits": "acceptEdits",
    "bypass": "bypassPermissions",
    "plan": "plan",
}

#: Why a session ended, in Claude Code's values (`clear`, `logout`, `prompt_input_exit`,
#: `bypass_permissions_disabled`, `other`). keel's own `exit` (a headless run or a library
#: caller closing the agent) is Claude Code's `other`.
SESSION_END_REASONS: Final[frozenset[str]] = frozenset(
    {"clear", "logout", "prompt_input_exit", "bypass_permissions_disabled", "other"}
)


@frozen
class ToolFields:
    """One tool's arguments: keel's name → Claude Code's name, and which of them are paths."""

    fields: tuple[tuple[str, str], ...]
    paths: frozenset[str] = frozenset()


#: keel's tool → its arguments in Claude Code's names. Arguments not listed keep keel's name.
#: Special cases handled in code: Bash `timeout` (keel: seconds, Claude Code: milliseconds) and
#: `sandbox` (Claude Code: `dangerouslyDisableSandbox`, the opposite); Grep `files_only`
#: (Claude Code: `output_mode`, with `-n` for line numbers in content mode); TodoWrite
#: `active_form` (Claude Code: `activeForm`).
TOOL_FIELDS: Final[dict[str, ToolFields]] = {
    "bash": ToolFields(
        (
            ("command", "command"),
            ("timeout", "timeout"),
            ("description", "description"),
            ("run_in_background", "run_in_background"),
        )
    ),
    "read": ToolFields(
        (("path", "file_path"), ("offset", "offset"), ("limit", "limit")), frozenset({"file_path"})
    ),
    "write": ToolFields((("path", "file_path"), ("content", "content")), frozenset({"file_path"})),
    "edit": ToolFields(
        (
            ("path", "file_path"),
            ("old_string", "old_string"),
            ("new_string", "new_string"),
            ("replace_all", "replace_all"),
        ),
        frozenset({"file_path"}),
    ),
    "multi_edit": ToolFields((("path", "file_path"), ("edits", "edits")), frozenset({"file_path"})),
    "glob": ToolFields((("pattern", "pattern"), ("path", "path")), frozenset({"path"})),
    "grep": ToolFields(
        (("pattern", "pattern"), ("path", "path"), ("glob", "glob"), ("ignore_case", "-i")),
        frozenset({"path"}),
    ),
    "ls": ToolFields((("path", "path"),), frozenset({"path"})),
    "web_fetch": ToolFields((("url", "url"),)),
    "web_search": ToolFields((("query", "query"),)),
    "todo_write": ToolFields((("todos", "todos"),)),
    "task": ToolFields(
        (
            ("description", "description"),
            ("prompt", "prompt"),
            ("subagent_type", "subagent_type"),
            ("run_in_background", "run_in_background"),
        )
    ),
    "bash_output": ToolFields((("id", "bash_id"),)),
    "bash_kill": ToolFields((("id", "shell_id"),)),
    "exit_plan_mode": ToolFields((("plan", "plan"),)),
    "skill": ToolFields((("name", "skill"), ("arguments", "args"))),
}


def tool_name(tool: str) -> str:
    """The name a hook sees: Claude Code's for the tools both have, keel's otherwise."""
    return to_claude(tool)


def permission_mode(mode: str) -> str:
    return PERMISSION_MODES.get(mode, mode)


def session_end_reason(reason: str) -> str:
    return reason if reason in SESSION_END_REASONS else "other"


#: StopFailure's `error` (its matcher) for a provider's HTTP status.
_FAILURE_KINDS: Final[dict[int, str]] = {
    400: "invalid_request",
    401: "authentication_failed",
    402: "billing_error",
    403: "authentication_failed",
    404: "model_not_found",
    429: "rate_limit",
    529: "overloaded",
}


def stop_failure_kind(status: int | None) -> str:
    """Claude Code's name for the error that ended a turn, from the provider's HTTP status
    (None: not a provider's answer)."""
    if status is None:
        return "unknown"
    if status in _FAILURE_KINDS:
        return _FAILURE_KINDS[status]
    return "server_error" if status >= 500 else "unknown"


_INSTRUCTIONS = re.compile(
    r'^<instructions source="([^"]*)"(?: imported-from="([^"]*)")?(?: for="([^"]*)")?',
    re.MULTILINE,
)


def instructions_loaded(text: str, reason: str, *, root: Path) -> list[dict[str, Any]]:
    """InstructionsLoaded's fields for each instruction file in `text` (keel's
    `<instructions source=…>` sections of a system prompt or a note), in Claude Code's terms:
    `memory_type` (`User` outside the project, `Local` for `CLAUDE.local.md`, else `Project`),
    `load_reason` (`reason`; a file another imports: `include`; a rule delivered for a file:
    `path_glob_match`), `parent_file_path` and `trigger_file_path` where known."""
    out: list[dict[str, Any]] = []
    for found in _INSTRUCTIONS.finditer(text):
        path, parent, trigger = Path(found.group(1)), found.group(2), found.group(3)
        if not path.is_relative_to(root):
            memory = "User"
        else:
            memory = "Local" if path.name == "CLAUDE.local.md" else "Project"
        why = reason
        if parent:
            why = "include"
        elif trigger and (".claude", "rules") in itertools.pairwise(path.parts):
            why = "path_glob_match"
        fields: dict[str, Any] = {"file_path": str(path), "memory_type": memory}
        fields["load_reason"] = why
        if trigger:
            fields["trigger_file_path"] = trigger
        if parent:
            fields["parent_file_path"] = parent
        out.append(fields)
    return out


def _absolute(value: Any, cwd: Path) -> Any:
    if not isinstance(value, str) or not value:
        return value
    path = Path(value).expanduser()
    return str(path if path.is_absolute() else cwd / path)


def tool_input(tool: str, args: dict[str, Any], cwd: Path) -> dict[str, Any]:
    """keel's arguments of `tool` as Claude Code's `tool_input` (paths absolute)."""
    spec = TOOL_FIELDS.get(tool)
    if spec is None:
        return dict(args)
    names = dict(spec.fields)
    out: dict[str, Any] = {}
    for key, value in args.items():
        claude = names.get(key, key)
        out[claude] = _absolute(value, cwd) if claude in spec.paths else value
    if tool == "bash":
        if isinstance(out.get("timeout"), int | float) and not isinstance(out["timeout"], bool):
            out["timeout"] = int(out["timeout"] * 1000)
        if "sandbox" in out:
            out["dangerouslyDisableSandbox"] = out.pop("sandbox") is False
    elif tool == "edit":
        out.setdefault("replace_all", False)
    elif tool == "grep":
        files_only = out.pop("files_only", False)
        out["output_mode"] = "files_with_matches" if files_only else "content"
        if not files_only:
            out["-n"] = True
    elif tool == "todo_write" and isinstance(out.get("todos"), list):
        out["todos"] = [_todo_to_claude(t) for t in out["todos"]]
    return out


def _todo_to_claude(todo: Any) -> Any:
    if not isinstance(todo, dict) or "active_form" not in todo:
        return todo
    return {("activeForm" if k == "active_form" else k): v for k, v in todo.items()}


def updated_input(
    tool: str, updated: dict[str, Any], *, sent: dict[str, Any], original: dict[str, Any]
) -> dict[str, Any]:
    """A hook's `updatedInput` (Claude Code's fields; it replaces the whole input, as in Claude
    Code) as keel's arguments. A path the hook left as it was sent keeps keel's original
    spelling; a Bash timeout in milliseconds becomes seconds (rounded up)."""
    spec = TOOL_FIELDS.get(tool)
    if spec is None:
        return dict(updated)
    back = {claude: keel for keel, claude in spec.fields}
    out: dict[str, Any] = {}
    for key, value in updated.items():
        name = back.get(key, key)
        if key in spec.paths and value == sent.get(key) and name in original:
            value = original[name]
        out[name] = value
    if tool == "bash":
        timeout = out.get("timeout")
        if isinstance(timeout, int | float) and not isinstance(timeout, bool):
            out["timeout"] = max(1, math.ceil(timeout / 1000))
        if "dangerouslyDisableSandbox" in out:
            out["sandbox"] = out.pop("dangerouslyDisableSandbox") is not True
    elif tool == "grep":
        mode = out.pop("output_mode", None)
        out.pop("-n", None)
        if mode is not None:
            out["files_only"] = mode == "files_with_matches"
    return out


def matcher_names(tool: str) -> tuple[str, ...]:
    """The names a matcher is tried against: keel's and Claude Code's, old spellings included
    (`Task` and `Agent`, `KillShell` and `KillBash`)."""
    aliases = [name for name, keel in CLAUDE_TO_KEEL.items() if keel == tool]
    return tuple(dict.fromkeys([tool, to_claude(tool), *aliases]))


# -- tool_response ------------------------------------------------------------------------------

#: Lines a read returns when it names no limit (Claude Code's default and keel's).
READ_LIMIT = 2000
_NUMBERED = re.compile(r"^ *(\d+)\t(.*)$")
_EXIT = re.compile(r"\n?\[exit code (-?\d+|None)\]$")
_READ_NOTE = re.compile(r"\n\n\[(?:size|line) limit: showed lines (\d+)-(\d+) of (\d+);[^\]]*\]$")


def bash_exit_code(text: str) -> int | None:
    """The exit code keel's bash result ends with (None: none shown, or timed out)."""
    found = _EXIT.search(text)
    if found is None or found.group(1) == "None":
        return None
    return int(found.group(1))


def result_text(tool: str, text: str) -> str:
    """A successful result as PostToolBatch hooks see it: the text the model got, a shell's
    output in Claude Code's words (without keel's exit code line; `(Bash completed with no
    output)` for none)."""
    if tool != "bash":
        return text
    return _EXIT.sub("", text).rstrip() or "(Bash completed with no output)"


def without_exit_code(text: str) -> str:
    """keel's bash result without the `[exit code N]` line it ends with."""
    return _EXIT.sub("", text)


def tool_response(
    tool: str,
    args: dict[str, Any],
    text: str,
    cwd: Path,
    *,
    duration_ms: int = 0,
    before: str | None = None,
    after: str | None = None,
) -> Any:
    """A successful result of `tool` in the shape Claude Code gives PostToolUse hooks, built
    from keel's result text and the call's arguments. `before` and `after` are the text of the
    file a file tool read or changed, before and after the call (None: not known, or no file
    before a write that created it)."""
    path = _absolute(args.get("path", "."), cwd)
    if tool == "bash":
        command = str(args.get("command", ""))
        quiet = no_output_expected(command)
        if args.get("run_in_background"):
            found = re.match(r"started (\S+) in the background", text)
            return {
                "stdout": "",
                "stderr": "",
                "interrupted": False,
                "isImage": False,
                "noOutputExpected": quiet,
                "backgroundTaskId": found.group(1) if found else "",
            }
        stdout = _EXIT.sub("", text).rstrip()
        return {
            "stdout": stdout,
            "stderr": "",
            "interrupted": False,
            "isImage": False,
            "noOutputExpected": quiet,
        }
    if tool == "read":
        return _read_response(path, text, args, before)
    if tool == "write":
        content = str(args.get("content", ""))
        created = text.startswith("Created ") or before is None
        return {
            "type": "create" if created else "update",
            "filePath": path,
            "content": content,
            "structuredPatch": [] if created else structured_patch(before or "", content),
            "originalFile": None if created else before,
            "userModified": False,
        }
    patch = structured_patch(before, after) if before is not None and after is not None else []
    if tool == "edit":
        return {
            "filePath": path,
            "oldString": args.get("old_string", ""),
            "newString": args.get("new_string", ""),
            "originalFile": before,
            "structuredPatch": patch,
            "userModified": False,
            "replaceAll": bool(args.get("replace_all", False)),
        }
    if tool == "multi_edit":
        return {
            "filePath": path,
            "edits": args.get("edits", []),
            "originalFileContents": before,
            "structuredPatch": patch,
            "userModified": False,
        }
    if tool in ("glob", "grep"):
        lines = [] if text.startswith("No matches") else text.splitlines()
        truncated = bool(lines) and lines[-1].startswith("[stopped at ")
        lines = lines[:-1] if truncated else lines
        if tool == "glob":
            names = [_absolute(n, cwd) for n in lines]
            return {
                "filenames": names,
                "durationMs": duration_ms,
                "numFiles": len(names),
                "truncated": truncated,
            }
        if args.get("files_only"):
            names = [_absolute(n, cwd) for n in lines]
            return {"mode": "files_with_matches", "filenames": names, "numFiles": len(names)}
        return {
            "mode": "content",
            "numFiles": len({line.split(":", 1)[0] for line in lines}),
            "filenames": [],
            "content": "\n".join(lines),
            "numLines": len(lines),
        }
    if tool == "web_fetch":
        return {
            "bytes": len(text.encode()),
            "code": 200,
            "codeText": "OK",
            "result": text,
            "durationMs": duration_ms,
            "url": args.get("url", ""),
        }
    if tool == "todo_write":
        todos = args.get("todos", [])
        new = [_todo_to_claude(t) for t in todos] if isinstance(todos, list) else []
        return {"oldTodos": [], "newTodos": new}
    if tool == "task":
        return {
            "status": "completed",
            "prompt": args.get("prompt", ""),
            "content": [{"type": "text", "text": text}],
            "totalDurationMs": duration_ms,
        }
    if tool == "exit_plan_mode":
        return {"plan": args.get("plan", ""), "isAgent": False}
    return [{"type": "text", "text": text}]


def _read_response(
    path: Any, text: str, args: dict[str, Any], before: str | None
) -> dict[str, Any]:
    """Claude Code counts a file's lines as the pieces between newlines (a file ending in a
    newline has an empty last line), and the lines it returns are those pieces joined with
    newlines: a read to the end of such a file ends with a newline, a read of a part does not."""
    if text.startswith("Image "):
        return {"type": "image", "file": {"filePath": path}}
    body, start, total = text, 1, None
    note = _READ_NOTE.search(text)
    if note is not None:
        body, total = text[: note.start()], int(note.group(3))
    lines: list[str] = []
    for i, line in enumerate(body.split("\n")):
        found = _NUMBERED.match(line)
        if found is None:  # not numbered lines (an empty file, an unchanged re-read)
            lines = []
            break
        if i == 0:
            start = int(found.group(1))
        lines.append(found.group(2))
    if before is not None:
        pieces = before.split("\n")
        end = start - 1 + len(lines)
        limit = args.get("limit", READ_LIMIT)
        if end == len(pieces) - 1 and (not isinstance(limit, int) or len(lines) < limit):
            end += 1  # the empty line after a final newline
        shown = pieces[start - 1 : end]
        content, count, total = "\n".join(shown), len(shown), len(pieces)
    else:
        content = "\n".join(lines) + ("\n" if lines else "")
        count = len(lines)
        total = total if total is not None else start - 1 + len(lines)
    return {
        "type": "text",
        "file": {
            "filePath": path,
            "content": content,
            "numLines": count,
            "startLine": start,
            "totalLines": total,
        },
    }


#: Commands Claude Code expects to print nothing when they succeed.
_QUIET = frozenset(
    {"mv", "cp", "rm", "mkdir", "rmdir", "chmod", "chown", "chgrp", "touch", "ln", "cd", "export"}
    | {"unset", "wait"}
)


def no_output_expected(command: str) -> bool:
    """Claude Code's `noOutputExpected`: every command of the line (split at `&&`, `||`, `;`,
    `|` and newlines) is one that prints nothing when it succeeds (`mkdir`, `mv`, `cd`...)."""
    parts = [p.split() for p in re.split(r"&&|\|\||[;|\n]", command)]
    words = [p[0] for p in parts if p]
    return bool(words) and all(w in _QUIET for w in words)


def _diff_lines(text: str) -> list[str]:
    """`text`'s lines, each with its newline (the last may have none)."""
    return re.findall(r"[^\n]*\n|[^\n]+$", text)


NO_NEWLINE = "\\ No newline at end of file"


def _patch_lines(mark: str, lines: list[str]) -> list[str]:
    out: list[str] = []
    for line in lines:
        out.append(mark + line.removesuffix("\n"))
        if not line.endswith("\n"):
            out.append(NO_NEWLINE)
    return out


def structured_patch(old: str, new: str, context: int = 3) -> list[dict[str, Any]]:
    """The hunks from `old` to `new` in Claude Code's `structuredPatch` shape (the npm `diff`
    package's: `oldStart`, `oldLines`, `newStart`, `newLines`, and `lines` that start with
    " ", "-" or "+", a line without a final newline followed by `\\ No newline at end of
    file`), with Claude Code's three lines of context. Lines are matched by difflib, which
    finds the same hunks as the `diff` package for edits within lines."""
    import difflib  # only when a file hook asks for a patch

    a, b = _diff_lines(old), _diff_lines(new)
    hunks: list[dict[str, Any]] = []
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    for group in matcher.get_grouped_opcodes(context):
        lines: list[str] = []
        for tag, a1, a2, b1, b2 in group:
            if tag == "equal":
                lines += _patch_lines(" ", a[a1:a2])
                continue
            lines += _patch_lines("-", a[a1:a2])
            lines += _patch_lines("+", b[b1:b2])
        first, last = group[0], group[-1]
        hunks.append(
            {
                "oldStart": first[1] + 1,
                "oldLines": last[2] - first[1],
                "newStart": first[3] + 1,
                "newLines": last[4] - first[3],
                "lines": lines,
            }
        )
    return hunks


__all__ = [
    "CLAUDE_EVENTS",
    "EFFORT_EVENTS",
    "EVENTS",
    "MODE_EVENTS",
    "PERMISSION_MODES",
    "TOOL_FIELDS",
    "UNSUPPORTED_EVENTS",
    "bash_exit_code",
    "hook_session_id",
    "instructions_loaded",
    "matcher_names",
    "no_output_expected",
    "permission_mode",
    "result_text",
    "session_end_reason",
    "stop_failure_kind",
    "structured_patch",
    "tool_input",
    "tool_name",
    "tool_response",
    "updated_input",
]
