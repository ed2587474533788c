"""Running hooks: every matching command for an event, in parallel, each with `bash -c` under
`keel.proc`'s supervisor, the event as JSON on stdin, and a wall-clock timeout from its start
after which its whole tree (detached children included) is killed and its pipes let go.
The outcomes combine into one `HookResult`: deny > ask > allow; any block blocks (reasons joined);
any halt halts; contexts and messages concatenate; the last `updatedInput` wins.

Exit 0 may print JSON (`continue`, `stopReason`, `systemMessage`, `decision`/`reason`,
`hookSpecificOutput.{permissionDecision, permissionDecisionReason, updatedInput,
additionalContext}`) or plain text (context for SessionStart and UserPromptSubmit). Exit 2 blocks
with stderr as the reason. Any other exit is a non-blocking error the user sees. This module runs
commands and interprets their answers; the loop decides what an answer does.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from keel.frozen import frozen
from keel.hooks.config import HookCommand
from keel.proc import run_tree

#: Hook output beyond this is cut (a hook that floods must not flood the model).
MAX_OUTPUT = 64 * 1024
#: A process a hook leaves behind may run (and hold its output open) this long after the hook
#: exits; then it is killed. Never past the hook's timeout.
DRAIN_GRACE = 2.0

Permission = Literal["allow", "deny", "ask"]
_RANK = {"allow": 1, "ask": 2, "deny": 3}


@frozen
class HookRun:
    """What one command did."""

    hook: HookCommand
    exit_code: int | None  # None: timed out, or could not start
    stdout: str
    stderr: str
    timed_out: bool = False


#: Claude Code's names for keel's tools where they differ by more than case, so that matchers
#: written for Claude Code (`Edit|MultiEdit|Write`, `WebFetch`) match keel's tools too.
CLAUDE_TOOL_NAMES = {
    "multi_edit": "MultiEdit",
    "web_fetch": "WebFetch",
    "todo_write": "TodoWrite",
    "exit_plan_mode": "ExitPlanMode",
}
#: keel's file tools take `path`; Claude Code's take `file_path`. Hooks see both.
FILE_TOOLS = frozenset({"read", "write", "edit", "multi_edit"})


def hook_input(tool: str, args: dict[str, Any]) -> dict[str, Any]:
    """A tool's input as hooks see it: a file tool's `path` also as Claude Code's `file_path`."""
    if tool in FILE_TOOLS and "path" in args and "file_path" not in args:
        return {**args, "file_path": args["path"]}
    return args


def tool_input(tool: str, sent: dict[str, Any], updated: dict[str, Any]) -> dict[str, Any]:
    """A hook's `updatedInput` as the tool's input: `file_path` back to `path` (whichever of the
    two the hook changed wins)."""
    if tool not in FILE_TOOLS or "file_path" not in updated:
        return updated
    args = dict(updated)
    file_path = args.pop("file_path")
    if file_path != sent.get("file_path") or "path" not in args:
        args["path"] = file_path
    return args


@dataclass
class HookResult:
    """The combined answer of all hooks that ran for an event."""

    block: bool = False
    reasons: list[str] = field(default_factory=list)
    halt: bool = False
    stop_reason: str = ""
    permission: Permission | None = None
    permission_reason: str = ""
    updated_input: dict[str, Any] | None = None
    context: list[str] = field(default_factory=list)
    #: Shown to the user: what hooks said (systemMessage) and what went wrong with them.
    messages: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    runs: list[HookRun] = field(default_factory=list)

    @property
    def reason(self) -> str:
        return "\n".join(r for r in self.reasons if r)


def _short(text: str, limit: int = 300) -> str:
    text = text.strip().replace("\n", " ")
    return text if len(text) <= limit else text[:limit] + "…"


class _Bounded:
    """Keeps the first `MAX_OUTPUT` bytes of a stream."""

    def __init__(self) -> None:
        self.data = bytearray()

    def feed(self, data: bytes) -> None:
        if len(self.data) < MAX_OUTPUT:
            self.data += data[: MAX_OUTPUT - len(self.data)]


async def _run_one(hook: HookCommand, payload: bytes, cwd: Path, env: Mapping[str, str]) -> HookRun:
    """Run one hook command. Its deadline is `hook.timeout` of wall clock from the spawn: then
    its whole tree is killed (detached children included) and its pipes are let go, whoever
    still holds them; children it leaves behind when it exits get `DRAIN_GRACE` seconds."""
    out, err = _Bounded(), _Bounded()
    try:
        finished = await run_tree(
            ["bash", "-c", hook.command],
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=err,
            stdin=payload,
            time_limit=hook.timeout,
            term_grace=0.0,
            drain_grace=DRAIN_GRACE,
        )
    except OSError as exc:
        return HookRun(hook, None, "", f"could not start: {exc}")
    return HookRun(
        hook,
        None if finished.timed_out else finished.returncode,
        out.data.decode("utf-8", "replace"),
        err.data.decode("utf-8", "replace"),
        finished.timed_out,
    )


def _apply(result: HookResult, run: HookRun, event: str) -> None:
    hook = run.hook
    label = f"{event} hook `{_short(hook.command, 200)}`"
    if run.timed_out:
        result.errors.append(f"{label} timed out after {hook.timeout:g} s and was killed")
        return
    if run.exit_code is None:
        result.errors.append(f"{label} failed: {_short(run.stderr)}")
        return
    if run.exit_code == 2:
        result.block = True
        result.reasons.append(run.stderr.strip() or f"blocked by {label}")
        if event == "PreToolUse":
            _permission(result, "deny", run.stderr.strip())
        return
    if run.exit_code != 0:
        detail = _short(run.stderr or run.stdout) or "no output"
        result.errors.append(f"{label} exited with {run.exit_code}: {detail}")
        return
    text = run.stdout.strip()
    if not text:
        return
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        if event in ("SessionStart", "UserPromptSubmit"):
            result.context.append(text)
        return
    _apply_json(result, data, event)


def _permission(result: HookResult, decision: Permission, reason: str) -> None:
    if result.permission is None or _RANK[decision] > _RANK[result.permission]:
        result.permission = decision
        result.permission_reason = reason
    elif decision == result.permission and reason:
        result.permission_reason = "\n".join(r for r in (result.permission_reason, reason) if r)


def _apply_json(result: HookResult, data: dict[str, Any], event: str) -> None:
    if data.get("continue") is False:
        result.halt = True
        result.stop_reason = str(
            data.get("stopReason") or result.stop_reason or "stopped by a hook"
        )
    if isinstance(data.get("systemMessage"), str):
        result.messages.append(data["systemMessage"])
    decision = data.get("decision")
    if decision == "block":
        result.block = True
        result.reasons.append(str(data.get("reason") or ""))
        if event == "PreToolUse":
            _permission(result, "deny", str(data.get("reason") or ""))
    elif decision == "approve" and event == "PreToolUse":  # Claude Code's legacy spelling
        _permission(result, "allow", str(data.get("reason") or ""))
    specific = data.get("hookSpecificOutput")
    if isinstance(specific, dict):
        choice = specific.get("permissionDecision")
        if choice in _RANK and event == "PreToolUse":
            _permission(result, choice, str(specific.get("permissionDecisionReason") or ""))
        if isinstance(specific.get("updatedInput"), dict):
            result.updated_input = specific["updatedInput"]
        if isinstance(specific.get("additionalContext"), str) and specific["additionalContext"]:
            result.context.append(specific["additionalContext"])


@dataclass
class HookRunner:
    """Runs the hooks of one session. `base` is the part of every payload that does not change
    (session id, transcript path, cwd); `mode` is read at each run."""

    hooks: list[HookCommand]
    cwd: Path
    project_dir: Path
    env: Mapping[str, str]
    base: dict[str, Any] = field(default_factory=dict)
    mode: Any = None  # a callable returning the permission mode, set by the agent

    def has(self, event: str) -> bool:
        return any(h.event == event for h in self.hooks)

    async def run(self, event: str, fields: dict[str, Any], *, match: str = "") -> HookResult:
        """Run the hooks of `event` whose matcher matches `match` (for tool events, keel's tool
        name or Claude Code's name for the same tool)."""
        names = (match, CLAUDE_TOOL_NAMES.get(match, match))
        matching = [h for h in self.hooks if h.event == event and any(h.matches(n) for n in names)]
        result = HookResult()
        if not matching:
            return result
        payload = {
            **self.base,
            "cwd": str(self.cwd),
            "hook_event_name": event,
            "permission_mode": self.mode() if callable(self.mode) else "default",
            **fields,
        }
        data = json.dumps(payload, default=str).encode()
        env = {
            **self.env,
            "CLAUDE_PROJECT_DIR": str(self.project_dir),
            "KEEL_PROJECT_DIR": str(self.project_dir),
        }
        runs = await asyncio.gather(*(_run_one(h, data, self.cwd, env) for h in matching))
        for run in runs:
            result.runs.append(run)
            _apply(result, run, event)
        return result
