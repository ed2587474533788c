"""Running hooks: every matching hook for an event, in parallel, the event as Claude Code's JSON
(keel.hooks.claude), each with a wall-clock deadline from its start. A `command` hook runs with
`bash -c` under `keel.proc`'s supervisor, the payload on stdin; at its deadline its whole tree
(detached children included) is killed and its pipes let go. An `http` hook POSTs the payload
and reads the response body as the hook's output (non-2xx: a non-blocking error). A `prompt`
hook asks a model, which answers `{"ok": …, "reason": …}` (ok false acts like exit 2).
The outcomes combine into one `HookResult`: deny > ask > allow; any block blocks (reasons joined);
any halt halts; contexts and messages concatenate; the last `updatedInput` wins. A background
(`async`) hook is not waited for and blocks nothing: what it leaves for the model when it ends
is kept as an `AsyncOutcome` (`take_async`) and `on_async` is told.

Exit 0 may print JSON (`continue`, `stopReason`, `systemMessage`, `decision`/`reason`,
`hookSpecificOutput.{permissionDecision, permissionDecisionReason, updatedInput,
additionalContext}`) or plain text (context for SessionStart and UserPromptSubmit). Exit 2 blocks
with stderr as the reason. Any other exit is a non-blocking error the user sees, and so is a
timeout, as in Claude Code; for the events that can block (PreToolUse, PermissionRequest) such a
failure, and output that looks like JSON but does not parse, is a warning naming the hook: a
guard that failed never passes silently. This module runs hooks and interprets their answers;
the loop decides what an answer does.

A `guard_only` hook (a project's guard the user has not approved yet) runs through `guard_box`
(a read-only sandbox without network or secrets, given by the assembly) and only its blocking
answers count: exit 2, `decision: block`, a PreToolUse `deny` or `ask`, a PermissionRequest
`deny`. Its allow, `updatedInput`, context, `continue: false` and messages are dropped. Where no
such sandbox runs, a PreToolUse guard cannot judge, so the call asks (headless: is refused).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import field
from pathlib import Path
from typing import Any, Literal

from keel.frozen import frozen, mutable
from keel.hooks.claude import EFFORT_EVENTS, MODE_EVENTS, matcher_names, permission_mode
from keel.hooks.config import HookCommand
from keel.proc import Head, run_tree

#: Events whose matcher is a tool name (either spelling matches).
TOOL_EVENTS = frozenset(
    {"PreToolUse", "PostToolUse", "PostToolUseFailure", "PermissionRequest", "PermissionDenied"}
)
#: Events without a matcher in Claude Code: every hook of the event runs, whatever its matcher.
UNMATCHED_EVENTS = frozenset({"UserPromptSubmit", "Stop", "PostToolBatch"})
#: Events whose hooks can stop something from happening: their failures are warnings.
GUARD_EVENTS = frozenset({"PreToolUse", "PermissionRequest", "UserPromptSubmit", "Stop"})
#: What follows when a guard hook fails, said after its failure. A PermissionRequest hook's
#: failure leaves the question to the gate; who answers it is said where that is known
#: (keel.app.assembly.permission_hook).
_UNGUARDED = {
    "PreToolUse": " (it could not block; the call goes on to the permission check)",
    "UserPromptSubmit": " (it could not block; the prompt goes to the model)",
    "Stop": " (it could not keep the turn going; the turn ends)",
}

#: Asks a model one question: (prompt, model or "") → its answer text.
ModelCall = Callable[[str, str], Awaitable[str]]
#: Wraps a command in a read-only sandbox: (argv, cwd, env) → a block yielding the wrapped
#: (argv, env), or None where no sandbox runs (`keel.permissions.guard_sandbox.running`).
GuardBox = Callable[
    [list[str], Path, Mapping[str, str]],
    AbstractContextManager[tuple[list[str], dict[str, str]] | None],
]
#: The error of a guard-only hook that could not run because no sandbox runs here.
NO_GUARD_BOX = "no sandbox runs here, so this unapproved project guard could not run"

PROMPT_SYSTEM = (
    "You are a hook that checks one event of a coding agent. Read the event (JSON) and the "
    'instructions, then answer with only a JSON object: {"ok": true} to let it proceed, or '
    '{"ok": false, "reason": "why"} to block it.'
)

#: Hook output beyond this is cut (a hook that floods must not flood the model).
MAX_OUTPUT = 64 * 1024
#: When the session closes, background (`async`) hooks still running get this long, then their
#: processes are killed.
ASYNC_CLOSE_WAIT = 5.0
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
    #: Set when the hook could not give an answer (an http error, a model that failed).
    error: str = ""


@frozen
class HookObservation:
    """One hook run as an observer (a tracer) sees it. `target` is what the matcher was
    matched against (a tool name, a source); `blocked` / `halted` are this run's own answer."""

    event: str
    target: str
    hook: HookCommand
    started_at: float
    duration_ms: float
    exit_code: int | None
    blocked: bool
    halted: bool
    error: str = ""


@mutable
class HookResult:
    """The combined answer of all hooks that ran for an event."""

    block: bool = False
    reasons: list[str] = field(default_factory=list)
    halt: bool = False
    stop_reason: str = ""
    permission: Permission | None = None
    permission_reason: str = ""
    updated_input: dict[str, Any] | None = None
    #: PermissionRequest: the hook answered for the user (`hookSpecificOutput.decision`).
    request_decision: Literal["allow", "deny"] | None = None
    request_message: str = ""
    request_updated_input: dict[str, Any] | None = None
    context: list[str] = field(default_factory=list)
    #: PermissionDenied: a hook said the model may retry (`hookSpecificOutput.retry`).
    retry: bool = False
    #: Elicitation / ElicitationResult: a hook's answer (`hookSpecificOutput.action`:
    #: `accept`, `decline` or `cancel`, and `content`).
    elicitation_action: str | None = None
    elicitation_content: dict[str, Any] | None = None
    #: Shown to the user: what hooks said (systemMessage) and what went wrong with them.
    messages: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    runs: list[HookRun] = field(default_factory=list)

    @property
    def reason(self) -> str:
        return "\n".join(r for r in self.reasons if r)


@frozen
class AsyncOutcome:
    """What a background (`async`) hook left when it ended: context for the model's next
    request, errors for the user, and whether it wakes an idle session (an `asyncRewake` hook
    that exited 2)."""

    event: str
    #: The hook (its command line).
    label: str
    context: tuple[str, ...]
    errors: tuple[str, ...]
    wake: bool


def _async_outcome(run: HookRun, event: str) -> AsyncOutcome | None:
    """As Claude Code: an `asyncRewake` hook that exits 2 sends its stderr (else its stdout) to
    the model as feedback; otherwise the first JSON line of its output that is not an `async`
    marker may carry `systemMessage` and `hookSpecificOutput.additionalContext`, both for the
    model. It can block nothing: the action went ahead long ago."""
    hook = run.hook
    label = f"{event} hook `{_short(hook.label, 200)}` (async)"
    if run.exit_code == 2 and hook.background == "rewake":
        feedback = (run.stderr or run.stdout).strip() or f"{label} exited with 2"
        text = f'<hook-feedback source="{event}">\n{feedback}\n</hook-feedback>'
        return AsyncOutcome(event, hook.label, (text,), (), wake=True)
    errors: list[str] = []
    if run.timed_out:
        errors.append(f"{label} timed out after {hook.timeout:g} s and was killed")
    elif run.error or run.exit_code is None:
        errors.append(f"{label} failed: {run.error or _short(run.stderr)}")
    elif run.exit_code != 0:
        detail = _short(run.stderr or run.stdout) or "no output"
        errors.append(f"{label} exited with {run.exit_code}: {detail}")
    context: list[str] = []
    for line in run.stdout.splitlines():
        if not line.strip().startswith("{"):
            continue
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if not isinstance(data, dict) or "async" in data:
            continue
        specific = data.get("hookSpecificOutput")
        extra = specific.get("additionalContext") if isinstance(specific, dict) else None
        for said in (data.get("systemMessage"), extra):
            if isinstance(said, str) and said:
                context.append(f'<hook-context source="{event}">\n{said}\n</hook-context>')
        break
    if not context and not errors:
        return None
    return AsyncOutcome(event, hook.label, tuple(context), tuple(errors), wake=False)


def _short(text: str, limit: int = 300) -> str:
    text = text.strip().replace("\n", " ")
    return text if len(text) <= limit else text[:limit] + "…"


async def _run_command(
    hook: HookCommand, payload: bytes, cwd: Path, env: Mapping[str, str]
) -> HookRun:
    """Run one hook command. Its deadline is `hook.timeout` of wall clock from the spawn: then
    its whole tree is killed (detached children included) and its pipes are let go, whoever
    still holds them; children it leaves behind when it exits get `DRAIN_GRACE` seconds."""
    return await _spawn(hook, ["bash", "-c", hook.command], payload, cwd, env)


async def _run_guard(
    hook: HookCommand, payload: bytes, cwd: Path, env: Mapping[str, str], box: GuardBox | None
) -> HookRun:
    """Run an unapproved project guard inside the read-only sandbox, or not at all."""
    if box is None:
        return HookRun(hook, None, "", "", error=NO_GUARD_BOX)
    with box(["bash", "-c", hook.command], cwd, env) as wrapped:
        if wrapped is None:
            return HookRun(hook, None, "", "", error=NO_GUARD_BOX)
        argv, inner_env = wrapped
        return await _spawn(hook, argv, payload, cwd, inner_env)


async def _spawn(
    hook: HookCommand, argv: list[str], payload: bytes, cwd: Path, env: Mapping[str, str]
) -> HookRun:
    out, err = Head(MAX_OUTPUT), Head(MAX_OUTPUT)
    try:
        finished = await run_tree(
            argv,
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


def _interpolate(value: str, allowed: tuple[str, ...], env: Mapping[str, str]) -> str:
    """Claude Code's header interpolation: `$VAR` / `${VAR}` from the environment, only for the
    names in `allowedEnvVars` (others become empty)."""

    def fill(found: re.Match[str]) -> str:
        name = found.group(1) or found.group(2)
        return env.get(name, "") if name in allowed else ""

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", fill, value)


async def _run_http(hook: HookCommand, payload: bytes, env: Mapping[str, str]) -> HookRun:
    """POST the payload to the hook's URL within its deadline; a 2xx body is its output."""
    import httpx

    headers = {k: _interpolate(v, hook.allowed_env, env) for k, v in hook.headers}
    headers.setdefault("Content-Type", "application/json")
    try:
        async with asyncio.timeout(hook.timeout):
            async with (
                httpx.AsyncClient(timeout=hook.timeout) as client,
                client.stream("POST", hook.command, content=payload, headers=headers) as response,
            ):
                kept = Head(MAX_OUTPUT)  # a flood is cut, not held in memory
                async for chunk in response.aiter_bytes():
                    kept.feed(chunk)
                    if kept.full:
                        break
                body = kept.data.decode("utf-8", "replace")
    except TimeoutError:
        return HookRun(hook, None, "", "", timed_out=True)
    except httpx.HTTPError as exc:
        return HookRun(hook, None, "", "", error=f"request failed: {type(exc).__name__}: {exc}")
    if not 200 <= response.status_code < 300:
        return HookRun(hook, None, "", "", error=f"HTTP {response.status_code}: {_short(body)}")
    return HookRun(hook, 0, body, "")


def _verdict(text: str) -> dict[str, Any] | None:
    """The first JSON object in a model's answer (it may wrap it in prose or a code fence)."""
    start = text.find("{")
    while start != -1:
        try:
            data, _ = json.JSONDecoder().raw_decode(text[start:])
        except ValueError:
            start = text.find("{", start + 1)
            continue
        return data if isinstance(data, dict) else None
    return None


async def _run_prompt(hook: HookCommand, payload: bytes, ask: ModelCall | None) -> HookRun:
    """Ask a model; `{"ok": false, "reason": …}` acts like exit 2 with the reason."""
    if ask is None:
        return HookRun(hook, None, "", "", error="no model is available for prompt hooks")
    arguments = payload.decode()
    if "$ARGUMENTS" in hook.command:
        question = hook.command.replace("$ARGUMENTS", arguments)
    else:
        question = f"{hook.command}\n\nThe event:\n{arguments}"
    try:
        async with asyncio.timeout(hook.timeout):
            answer = await ask(question, hook.model)
    except TimeoutError:
        return HookRun(hook, None, "", "", timed_out=True)
    except Exception as exc:  # a provider failure is this hook's failure, shown to the user
        return HookRun(hook, None, "", "", error=f"the model failed: {type(exc).__name__}: {exc}")
    verdict = _verdict(answer)
    if verdict is None or not isinstance(verdict.get("ok"), bool):
        return HookRun(
            hook, None, "", "", error=f'the model did not answer {{"ok": …}}: {_short(answer)}'
        )
    reason = str(verdict.get("reason") or "")
    if verdict["ok"]:
        return HookRun(hook, 0, "", "")
    return HookRun(hook, 2, "", reason or "blocked by a prompt hook")


def _apply(result: HookResult, run: HookRun, event: str) -> None:
    if run.hook.guard_only:
        _apply_guard(result, run, event)
        return
    _apply_one(result, run, event)


def _apply_guard(result: HookResult, run: HookRun, event: str) -> None:
    """An unapproved project guard's answer: only what blocks is taken."""
    alone = HookResult()
    _apply_one(alone, run, event)
    if run.error == NO_GUARD_BOX:
        if event == "PreToolUse":
            why = (
                f"the project's guard hook `{_short(run.hook.label, 120)}` is not approved and "
                "no sandbox runs here to run it safely; approve the project's hooks with "
                "`keel trust approve hooks` to run it"
            )
            _permission(result, "ask", why)
        result.errors.append(f"{event} hook `{_short(run.hook.label, 120)}`: {NO_GUARD_BOX}")
        return
    result.errors += alone.errors
    if alone.block:
        result.block = True
        result.reasons += alone.reasons
    if alone.permission in ("deny", "ask"):
        _permission(result, alone.permission, alone.permission_reason)
    if alone.request_decision == "deny":
        _request(result, "deny", alone.request_message)


def _apply_one(result: HookResult, run: HookRun, event: str) -> None:
    hook = run.hook
    label = f"{event} hook `{_short(hook.label, 200)}`"
    unguarded = _UNGUARDED.get(event, "")
    if run.timed_out:
        result.errors.append(
            f"{label} timed out after {hook.timeout:g} s and was killed{unguarded}"
        )
        return
    if run.error:
        result.errors.append(f"{label} failed: {run.error}{unguarded}")
        return
    if run.exit_code is None:
        result.errors.append(f"{label} failed: {_short(run.stderr)}{unguarded}")
        return
    if run.exit_code == 2:
        reason = run.stderr.strip()
        result.block = True
        result.reasons.append(reason or f"blocked by {label}")
        if event == "PreToolUse":
            _permission(result, "deny", reason)
        elif event == "PermissionRequest":
            _request(result, "deny", reason or f"denied by {label}")
        return
    if run.exit_code != 0:
        detail = _short(run.stderr or run.stdout) or "no output"
        result.errors.append(f"{label} exited with {run.exit_code}: {detail}{unguarded}")
        return
    text = run.stdout.strip()
    if not text:
        return
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        if event in ("SessionStart", "UserPromptSubmit", "UserPromptExpansion"):
            result.context.append(text)
        elif event in GUARD_EVENTS and text.startswith("{"):
            result.errors.append(
                f"{label} printed output that is not valid JSON ({_short(text, 80)}); a "
                f"decision in it was not applied{unguarded}"
            )
        return
    _apply_json(result, data, event)


def _request(result: HookResult, behavior: Literal["allow", "deny"], message: str) -> None:
    """A PermissionRequest answer: deny wins over allow."""
    if result.request_decision != "deny":
        result.request_decision = behavior
        result.request_message = message


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
        _apply_specific(result, specific, event)


def _apply_specific(result: HookResult, specific: dict[str, Any], event: str) -> None:
    """`hookSpecificOutput`: what each event's hooks may answer."""
    if event == "PermissionRequest":
        answer = specific.get("decision")
        if isinstance(answer, dict) and answer.get("behavior") in ("allow", "deny"):
            _request(result, answer["behavior"], str(answer.get("message") or ""))
            if answer["behavior"] == "allow" and isinstance(answer.get("updatedInput"), dict):
                result.request_updated_input = answer["updatedInput"]
    elif event == "PermissionDenied":
        result.retry = result.retry or specific.get("retry") is True
    elif event in ("Elicitation", "ElicitationResult"):
        action = specific.get("action")
        if action in ("accept", "decline", "cancel") and result.elicitation_action != "decline":
            result.elicitation_action = action
            content = specific.get("content")
            result.elicitation_content = content if isinstance(content, dict) else None
    choice = specific.get("permissionDecision")
    if choice in _RANK and event == "PreToolUse":
        _permission(result, choice, str(specific.get("permissionDecisionReason") or ""))
    if isinstance(specific.get("updatedInput"), dict):
        result.updated_input = specific["updatedInput"]
    if isinstance(specific.get("additionalContext"), str) and specific["additionalContext"]:
        result.context.append(specific["additionalContext"])


@mutable
class HookRunner:
    """Runs the hooks of one session. `base` is the part of every payload that does not change
    (session id, transcript path); `mode` is read at each run; `ask_model` answers prompt
    hooks."""

    hooks: list[HookCommand]
    cwd: Path
    project_dir: Path
    env: Mapping[str, str]
    base: dict[str, Any] = field(default_factory=dict)
    mode: Any = None  # a callable returning keel's permission mode, set by the agent
    ask_model: ModelCall | None = None
    #: The model prompt hooks use when they name none (the `hooks_model` setting; "" = the
    #: session's model).
    model: str = ""
    #: Told about every hook run (a tracer); None costs nothing.
    observer: Callable[[HookObservation], None] | None = None
    #: Where `guard_only` hooks run (a read-only sandbox); None: they cannot run.
    guard_box: GuardBox | None = None
    #: The running prompt's id (`prompt_id`, a UUID; "" before the first prompt).
    prompt_id: str = ""
    #: The model's reasoning effort (`effort.level`; None: the model has none).
    effort: str | None = None
    #: What background hooks left, for the model's next request (`take_async`).
    async_outcomes: list[AsyncOutcome] = field(default_factory=list)
    #: Called with each outcome as a background hook ends (the agent wakes an idle session).
    on_async: Callable[[AsyncOutcome], None] | None = None
    _background: set[asyncio.Task[None]] = field(default_factory=set)

    def has(self, event: str) -> bool:
        return any(h.event == event for h in self.hooks)

    def take_async(self) -> list[AsyncOutcome]:
        """The outcomes of background hooks that ended since the last call."""
        taken, self.async_outcomes = self.async_outcomes, []
        return taken

    @property
    def background_running(self) -> int:
        return len(self._background)

    async def aclose(self) -> None:
        """Give background hooks still running `ASYNC_CLOSE_WAIT` seconds, then kill them."""
        if not self._background:
            return
        _done, pending = await asyncio.wait(set(self._background), timeout=ASYNC_CLOSE_WAIT)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)

    def payload(self, event: str, fields: dict[str, Any]) -> dict[str, Any]:
        """The JSON object a hook of `event` reads: the fields Claude Code sends every hook (it
        leaves `prompt_id` out of SessionStart, `permission_mode` out of events that are not
        about the prompt or a tool, and `effort` where the model has none), then `fields`."""
        payload: dict[str, Any] = {
            "session_id": "",
            "transcript_path": "",
            **self.base,
            "cwd": str(self.cwd),
        }
        if self.prompt_id and event != "SessionStart":
            payload["prompt_id"] = self.prompt_id
        if event in MODE_EVENTS:
            mode = self.mode() if callable(self.mode) else "default"
            payload["permission_mode"] = permission_mode(str(mode))
        if event in EFFORT_EVENTS and self.effort:
            payload["effort"] = {"level": self.effort}
        payload["hook_event_name"] = event
        payload.update(fields)
        return payload

    async def run(self, event: str, fields: dict[str, Any], *, match: str = "") -> HookResult:
        """Run the hooks of `event` whose matcher matches `match` (for tool events, keel's tool
        name: matchers match it or Claude Code's name for it). `fields` are the event's own
        fields, already in Claude Code's shape."""
        names = matcher_names(match) if event in TOOL_EVENTS else (match,)
        matching = [
            h
            for h in self.hooks
            if h.event == event and (event in UNMATCHED_EVENTS or any(h.matches(n) for n in names))
        ]
        result = HookResult()
        if not matching:
            return result
        data = json.dumps(self.payload(event, fields), default=str).encode()
        env = {
            **self.env,
            "CLAUDE_PROJECT_DIR": str(self.project_dir),
            "KEEL_PROJECT_DIR": str(self.project_dir),
        }
        for hook in [h for h in matching if h.background]:
            task = asyncio.get_running_loop().create_task(
                self._in_background(hook, data, env, event, match), name=f"keel {event} hook"
            )
            self._background.add(task)
            task.add_done_callback(self._background.discard)
        matching = [h for h in matching if not h.background]
        if self.observer is None:
            runs = await asyncio.gather(*(self._one(h, data, env) for h in matching))
        else:
            runs = await asyncio.gather(
                *(self._observed(h, data, env, event, match) for h in matching)
            )
        for run in runs:
            result.runs.append(run)
            _apply(result, run, event)
        return result

    async def _in_background(
        self, hook: HookCommand, data: bytes, env: Mapping[str, str], event: str, target: str
    ) -> None:
        """Run an `async` hook to its end, nobody waiting; keep what it left."""
        if self.observer is None:
            run = await self._one(hook, data, env)
        else:
            run = await self._observed(hook, data, env, event, target)
        outcome = _async_outcome(run, event)
        if outcome is None:
            return
        self.async_outcomes.append(outcome)
        if self.on_async is not None:
            self.on_async(outcome)

    async def _observed(
        self, hook: HookCommand, data: bytes, env: Mapping[str, str], event: str, target: str
    ) -> HookRun:
        """`_one`, timed, with what it answered told to the observer."""
        started_at, start = time.time(), time.monotonic()
        run = await self._one(hook, data, env)
        duration = (time.monotonic() - start) * 1000
        alone = HookResult()
        _apply(alone, run, event)
        blocked = alone.block or alone.permission == "deny" or alone.request_decision == "deny"
        error = "timed out" if run.timed_out else run.error or "; ".join(alone.errors)
        if self.observer is not None:
            self.observer(
                HookObservation(
                    event,
                    target,
                    hook,
                    started_at,
                    round(duration, 3),
                    run.exit_code,
                    blocked,
                    alone.halt,
                    error,
                )
            )
        return run

    async def _one(self, hook: HookCommand, data: bytes, env: Mapping[str, str]) -> HookRun:
        if hook.env:  # a plugin's hook: CLAUDE_PLUGIN_ROOT, CLAUDE_PLUGIN_DATA
            env = {**env, **dict(hook.env)}
        if hook.guard_only:
            return await _run_guard(hook, data, self.cwd, env, self.guard_box)
        if hook.kind == "http":
            return await _run_http(hook, data, {**os.environ, **env})
        if hook.kind == "prompt":
            return await _run_prompt(hook, data, self.ask_model)
        return await _run_command(hook, data, self.cwd, env)
