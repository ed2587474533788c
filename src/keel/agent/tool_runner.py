"""Running one round of tool calls: check each call, authorise them one by one in order, run
consecutive read-only calls concurrently and everything else alone, and hand back one result per
call. Every result passes through the one truncation function and is recorded the moment it exists.

With a session, the runner also journals what a resume needs to be safe: each process group a
tool starts (`process` records, so a resume can kill what a killed run left running), and, for a
call that is not safe to repeat (keel.tools.effects), a durable `tool_started` record before it
runs. On resume such a call, started but never answered, is not run again blindly: the user is
asked (through the gate's asker), or, with nobody to ask, the round stops with
`unknown_outcome` until the call is resolved (`rerun` or `skip`).

Each call's tool kind (keel.tools.base `tool_kind`) goes on its `ToolStarted`/`ToolFinished`
events and its journal records; its metadata (`tool_meta`) tells the gate whether it is
read-only and whether it needs the user's confirmation. A declined confirmation is the user's
decision, not a failure: its result is not an error (the gate's `Deny.is_error`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypeAlias

from keel.agent.events import Event, ToolFinished, ToolStarted
from keel.errors import UserError
from keel.frozen import frozen
from keel.hooks import claude
from keel.llm.events import Notice
from keel.llm.messages import Text, ToolResult, ToolUse, tool_result
from keel.permissions.gate import AllowAll, Deny, Gate, PermissionRequest
from keel.tools.base import (
    AnswerLater,
    Tool,
    ToolContext,
    ToolError,
    ToolOutput,
    current_call_id,
    tool_kind,
    tool_meta,
)
from keel.tools.builtin.raw import save_raw
from keel.tools.effects import call_summary, repeat_risk
from keel.tools.registry import Registry
from keel.tools.truncate import MAX_OUTPUT_BYTES, truncate

if TYPE_CHECKING:
    from keel.hooks.runner import HookResult, HookRunner
    from keel.session.fold import SessionState
    from keel.session.records import ToolStartedRecord
    from keel.session.store import SessionLog

#: Journals a result: (result, seconds it ran, wall-clock start or 0.0 for a call never run,
#: the tool's kind or "" for an unknown tool).
Record = Callable[[ToolResult, float, float, str], None]
OnDone = Callable[[ToolUse, ToolResult, float, str | None, float], None]
Choice: TypeAlias = Literal["rerun", "skip"]

#: The tools whose file text hooks see (Claude Code's `originalFile`, `structuredPatch` and
#: Read's line counts), and the largest file read for them.
FILE_TOOLS = frozenset({"read", "write", "edit", "multi_edit"})
HOOK_FILE_LIMIT = 8 * 1024 * 1024

#: The result a skipped call of unknown outcome gets (the model must not assume either way).
SKIPPED_UNKNOWN = (
    "OUTCOME UNKNOWN: keel stopped while this call was running, so it is not known whether it "
    "took effect; the user chose not to run it again. Check its effect (for example the remote "
    "state) before relying on it or repeating it."
)


@frozen
class _Ready:
    call: ToolUse
    tool: Tool


def check_call(call: ToolUse, registry: Registry) -> Tool | ToolResult:
    """The tool to run for `call`, or the error result that tells the model what to fix."""
    tool = registry.get(call.name)
    if tool is None:
        return tool_result(
            call.id,
            f"unknown tool {call.name!r}; available tools: {', '.join(registry.names)}",
            is_error=True,
        )
    if call.input is None:
        return tool_result(
            call.id,
            f"INVALID_JSON: the arguments for {call.name} were cut off or not valid JSON "
            f"({call.raw_input[:200]!r}); retry the call with complete, valid JSON",
            is_error=True,
        )
    validate = getattr(tool, "validate", None)
    problem = validate(call.input) if validate is not None else None
    if problem:
        return tool_result(call.id, f"INVALID_ARGUMENTS: {problem}", is_error=True)
    return tool


def finish(call: ToolUse, output: ToolOutput, raw_dir: Path | None = None) -> ToolResult:
    """The result the model sees: every text block through the one truncation function. When a
    block is cut and there is a session, the whole text is kept beside it for `raw_output`."""
    blocks = output.blocks()
    note = ""
    if raw_dir is not None and any(
        isinstance(b, Text)
        and len(b.text) > MAX_OUTPUT_BYTES // 4
        and len(b.text.encode()) > MAX_OUTPUT_BYTES
        for b in blocks
    ):
        save_raw(raw_dir, call.id, "\n".join(b.text for b in blocks if isinstance(b, Text)))
        note = f'the whole output: raw_output(tool_use_id="{call.id}")'
    content = tuple(Text(truncate(b.text, note=note)) if isinstance(b, Text) else b for b in blocks)
    if not content:
        content = (Text("(no output)"),)
    return ToolResult(call.id, content, output.is_error)


class ToolRunner:
    def __init__(self, registry: Registry, ctx: ToolContext, gate: Gate | None = None) -> None:
        self.registry = registry
        self.ctx = ctx
        self.gate: Gate = gate or AllowAll()
        self.hooks: HookRunner | None = None
        #: Set when a hook asked to stop (`continue: false`): the turn ends after this round.
        self.halt_reason: str | None = None
        #: Where process groups and starts of unrepeatable calls are journaled (None: nowhere).
        self.session: SessionLog | None = None
        #: Calls of a restored batch that started, were not safe to repeat, and never reported
        #: back; and what the user chose for them (`resolve`).
        self.unknown: dict[str, ToolStartedRecord] = {}
        self.choices: dict[str, Choice] = {}
        #: Set when a round stopped on a call of unknown outcome nobody could decide about.
        self.stopped_unknown: list[ToolStartedRecord] = []
        #: Who takes a call whose tool raised `AnswerLater` (a fleet worker parks the run; it
        #: does not return). None: the model is told the run cannot wait.
        self.on_answer_later: Callable[[ToolUse, str], Awaitable[None]] | None = None
        #: This round's calls as PostToolBatch hooks see them (`tool_name`, `tool_input`,
        #: `tool_use_id`, `tool_response`), kept only while such hooks exist.
        self.batch: list[dict[str, object]] = []
        #: Told each call's `tool_response` (Claude Code's shape; a failure's error text) before
        #: its result is journaled: the transcript for hooks records it (None: nobody).
        self.on_response: Callable[[str, object], None] | None = None
        ctx.on_process = self._process_started

    def kind_of(self, name: str) -> str:
        """The kind of the tool called `name` ("" when there is none)."""
        tool = self.registry.get(name)
        return tool_kind(tool) if tool is not None else ""

    def restore(self, state: SessionState) -> None:
        """Take over a folded session's calls of unknown outcome."""
        self.unknown = {r.tool_use_id: r for r in state.unknown_outcome}

    def resolve(self, call_id: str, choice: Choice) -> None:
        """Decide for a call of unknown outcome: run it again, or answer it as not re-run."""
        if call_id not in self.unknown:
            known = ", ".join(self.unknown) or "none"
            raise UserError(
                f"{call_id} is not a call whose outcome is unknown (those are: {known})",
                hint="the stop message of the run names the call ids",
            )
        self.choices[call_id] = choice

    def _process_started(self, pgid: int) -> None:
        if self.session is None:
            return
        from keel.session.resume import boot_id, start_time

        started = start_time(pgid)
        if started is not None:  # gone already: nothing is left to stop
            self.session.process(current_call_id.get(), pgid, started, boot_id())

    async def run(
        self,
        calls: tuple[ToolUse, ...],
        emit: Callable[[Event], None],
        results: dict[str, ToolResult],
        record: Record,
        barrier: Callable[[], None] = lambda: None,
        stop: Callable[[], bool] = lambda: False,
    ) -> None:
        """Fill `results` (keyed by call id). `record` journals each result as it exists;
        `barrier` makes everything journaled durable and is called before any tool starts; once
        `stop()` is true, no further tool starts. Calls that did not finish (stopped, or
        cancelled) are left out of `results` for the caller to deal with."""

        def done(
            call: ToolUse,
            result: ToolResult,
            seconds: float,
            display: str | None,
            started_at: float = 0.0,
        ) -> None:
            kind = self.kind_of(call.name)
            record(result, seconds, started_at, kind)
            results[call.id] = result
            emit(ToolFinished(call, result, seconds, display, started_at, kind))

        self.batch = []  # this round's calls only, even after a round that did not finish
        if (choices := await self._decide_unknown(calls)) is None:
            for started in self.stopped_unknown:  # the round stops here, and says how to go on
                emit(Notice(self._unknown_message(started), "warning"))
            return
        ready: list[_Ready] = []
        for original in calls:  # phase 1: check and authorise, one by one, in order
            if choices.get(original.id) == "skip":
                done(original, tool_result(original.id, SKIPPED_UNKNOWN, is_error=True), 0.0, None)
                continue
            checked = check_call(original, self.registry)
            if isinstance(checked, ToolResult):
                done(original, checked, 0.0, None)
                continue
            call, hook = await self._pre_tool_hook(original, emit)
            if hook is not None and (hook.permission == "deny" or hook.block or hook.halt):
                why = hook.permission_reason or hook.reason or hook.stop_reason or "no reason given"
                done(
                    call,
                    tool_result(call.id, f"denied by a PreToolUse hook: {why}", is_error=True),
                    0.0,
                    None,
                )
                continue
            if call is not original and isinstance(
                checked := check_call(call, self.registry), ToolResult
            ):
                done(call, checked, 0.0, None)  # the hook's rewrite does not fit the schema
                continue
            opinion = hook.permission if hook is not None and hook.permission != "deny" else None
            meta = tool_meta(checked)
            decision = await self.gate.authorize(
                call,
                read_only=meta.read_only,
                hook=opinion,
                confirm=meta.confirm,
                hook_reason=hook.permission_reason if hook is not None else "",
            )
            if isinstance(decision, Deny):
                reason = decision.reason + await self._denied_hook(call, decision.reason, emit)
                done(call, tool_result(call.id, reason, is_error=decision.is_error), 0.0, None)
                continue
            ready.append(_Ready(call, checked))
        for group in _groups(ready):  # phase 2: run
            if stop():
                return
            barrier()
            if len(group) == 1:
                await self._run_one(group[0], emit, done)
            else:
                await asyncio.gather(*(self._run_one(r, emit, done) for r in group))

    async def _run_one(
        self,
        item: _Ready,
        emit: Callable[[Event], None],
        done: OnDone,
    ) -> None:
        call, tool = item.call, item.tool
        assert call.input is not None
        if self.session is not None and (risk := repeat_risk(tool, self.ctx, call.input)):
            # Durable before the call starts: a crash from here on leaves its outcome unknown.
            self.session.tool_started(
                call.id, call.name, risk, call_summary(call.name, call.input), tool_kind(tool)
            )
        started_at = time.time()
        emit(ToolStarted(call, started_at, tool_kind(tool)))
        before = self._hook_file_text(call)
        start = time.monotonic()
        token = current_call_id.set(call.id)
        try:
            output = await tool.run(self.ctx, call.input)
        except ToolError as exc:
            output = ToolOutput(str(exc), is_error=True)
        except AnswerLater as exc:
            if self.on_answer_later is not None:
                await self.on_answer_later(call, exc.note)
                raise asyncio.CancelledError from None  # parked: nothing more of this round
            output = ToolOutput(
                f"{call.name} answers later ({exc.note or 'no note'}), but this run cannot wait "
                "for it: only fleet runs park until an answer comes",
                is_error=True,
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug in a tool must not end the run; the model sees it
            _log_tool_bug(call.name)
            output = ToolOutput(
                f"{call.name} failed unexpectedly: {type(exc).__name__}: {exc}", is_error=True
            )
        finally:
            current_call_id.reset(token)
        output = _with_late_diagnostics(self.ctx, output)
        result = await self._post_tool_hook(
            call, finish(call, output, self.ctx.raw_dir), emit, time.monotonic() - start, before
        )
        done(call, result, time.monotonic() - start, output.display, started_at)
        if output.notice:
            emit(Notice(output.notice, "warning"))

    # -- calls of unknown outcome ----------------------------------------------------------------

    async def _decide_unknown(self, calls: tuple[ToolUse, ...]) -> dict[str, Choice] | None:
        """What to do with each call of `calls` whose outcome is unknown: the user's choice
        (`resolve`), else asked through the gate's asker (allow: run it again; deny: skip).
        None when one is undecided and there is nobody to ask (`stopped_unknown` says which)."""
        pending = [self.unknown[c.id] for c in calls if c.id in self.unknown]
        if not pending:
            return {}
        asker = getattr(self.gate, "asker", None)
        by_id = {c.id: c for c in calls}
        choices: dict[str, Choice] = {}
        undecided = []
        for record in pending:
            choice = self.choices.get(record.tool_use_id)
            if choice is None and asker is not None:
                reply = await asker(
                    PermissionRequest(
                        by_id[record.tool_use_id],
                        f"run again a call whose outcome is unknown (keel stopped while it ran; "
                        f"{record.reason}): {record.summary}",
                        "",
                    )
                )
                choice = "rerun" if reply.allow else "skip"
            if choice is None:
                undecided.append(record)
            else:
                choices[record.tool_use_id] = choice
        if undecided:
            self.stopped_unknown = undecided
            return None
        for call_id in choices:
            self.unknown.pop(call_id, None)
        return choices

    def _unknown_message(self, record: ToolStartedRecord) -> str:
        sid = self.ctx.session_id
        return (
            f"outcome unknown: call {record.tool_use_id} ({record.tool}: {record.summary}) was "
            f"running when keel stopped and is not safe to repeat ({record.reason}). Run it "
            f"again: keel resume {sid} --rerun {record.tool_use_id}; or go on without it: "
            f"keel resume {sid} --skip {record.tool_use_id}"
        )

    # -- hooks ---------------------------------------------------------------------------------

    def _report(self, result: HookResult, emit: Callable[[Event], None]) -> None:
        for message in result.messages:
            emit(Notice(message, "info"))
        for error in result.errors:
            emit(Notice(error, "warning"))
        if result.halt and self.halt_reason is None:
            self.halt_reason = result.stop_reason

    async def _pre_tool_hook(
        self, call: ToolUse, emit: Callable[[Event], None]
    ) -> tuple[ToolUse, HookResult | None]:
        """PreToolUse with Claude Code's payload (keel.hooks.claude); its `updatedInput` comes
        back in keel's argument names."""
        if self.hooks is None or not self.hooks.has("PreToolUse"):
            return call, None
        original = call.input or {}
        sent = claude.tool_input(call.name, original, self.ctx.cwd)
        result = await self.hooks.run(
            "PreToolUse",
            {"tool_name": claude.tool_name(call.name), "tool_input": sent, "tool_use_id": call.id},
            match=call.name,
        )
        self._report(result, emit)
        if result.updated_input is not None:
            updated = claude.updated_input(
                call.name, result.updated_input, sent=sent, original=original
            )
            call = ToolUse(call.id, call.name, updated, "", call.signature)
        return call, result

    async def _denied_hook(self, call: ToolUse, reason: str, emit: Callable[[Event], None]) -> str:
        """PermissionDenied: the gate refused the call. A hook's `retry: true` tells the model it
        may try again; returns what to add to the refusal."""
        if self.hooks is None or not self.hooks.has("PermissionDenied"):
            return ""
        fields = {
            "tool_name": claude.tool_name(call.name),
            "tool_input": claude.tool_input(call.name, call.input or {}, self.ctx.cwd),
            "tool_use_id": call.id,
            "reason": reason,
        }
        result = await self.hooks.run("PermissionDenied", fields, match=call.name)
        self._report(result, emit)
        return "\n(a PermissionDenied hook says you may retry this call)" if result.retry else ""

    def _wants_response(self) -> bool:
        hooks = self.hooks
        wanted = hooks is not None and (hooks.has("PostToolUse") or hooks.has("PostToolBatch"))
        return wanted or self.on_response is not None

    def _hook_file_text(self, call: ToolUse) -> str | None:
        """The text of the file a file tool is about to read or change, for the hooks that see
        it (None: no such hook, not a file tool, no such file, or too large)."""
        if call.name not in FILE_TOOLS or not self._wants_response():
            return None
        raw = (call.input or {}).get("path")
        if not isinstance(raw, str) or not raw:
            return None
        path = Path(raw).expanduser()
        path = path if path.is_absolute() else self.ctx.cwd / path
        try:
            if not path.is_file() or path.stat().st_size > HOOK_FILE_LIMIT:
                return None
            with path.open(encoding="utf-8", errors="replace", newline="") as f:
                return f.read()
        except OSError:
            return None

    async def _post_tool_hook(
        self,
        call: ToolUse,
        result: ToolResult,
        emit: Callable[[Event], None],
        seconds: float,
        before: str | None,
    ) -> ToolResult:
        """PostToolUse with Claude Code's `tool_response`, or PostToolUseFailure (`error`,
        `is_interrupt`) for a failed call; bash that exits non-zero fails, as in Claude Code.
        The call also joins the round's batch for PostToolBatch."""
        args = call.input or {}
        code = claude.bash_exit_code(result.text) if call.name == "bash" else None
        failed = result.is_error or (code is not None and code != 0)
        event = "PostToolUseFailure" if failed else "PostToolUse"
        if not self._wants_response():
            return result
        tool_input = claude.tool_input(call.name, args, self.ctx.cwd)
        fields: dict[str, object] = {
            "tool_name": claude.tool_name(call.name),
            "tool_input": tool_input,
        }
        if failed:
            # Claude Code's shape: "Exit code N" then the output, without keel's own marker.
            output = claude.without_exit_code(result.text) if code is not None else result.text
            error = f"Exit code {code}\n{output}".rstrip("\n") if code else result.text
            fields.update(tool_use_id=call.id, error=error, is_interrupt=False)
            response: object = error
        else:
            after = self._hook_file_text(call) if call.name in ("edit", "multi_edit") else None
            response = claude.tool_response(
                call.name,
                args,
                result.text,
                self.ctx.cwd,
                duration_ms=int(seconds * 1000),
                before=before,
                after=after,
            )
            fields.update(tool_response=response, tool_use_id=call.id)
        fields["duration_ms"] = int(seconds * 1000)
        if self.on_response is not None:
            self.on_response(call.id, f"Error: {response}" if failed else response)
        if self.hooks is None:
            return result
        if self.hooks.has("PostToolBatch"):
            # Claude Code gives PostToolBatch what the model got: the result's text.
            text = response if failed else claude.result_text(call.name, result.text)
            self.batch.append(
                {
                    "tool_name": fields["tool_name"],
                    "tool_input": tool_input,
                    "tool_use_id": call.id,
                    "tool_response": text,
                }
            )
        if not self.hooks.has(event):
            return result
        hook = await self.hooks.run(event, fields, match=call.name)
        self._report(hook, emit)
        extra: list[Text] = []
        if hook.block and hook.reason:
            extra.append(Text(f'<hook-feedback source="{event}">\n{hook.reason}\n</hook-feedback>'))
        extra += [
            Text(f'<hook-context source="{event}">\n{c}\n</hook-context>') for c in hook.context
        ]
        if not extra:
            return result
        return ToolResult(result.tool_use_id, (*result.content, *extra), result.is_error)


def _with_late_diagnostics(ctx: ToolContext, output: ToolOutput) -> ToolOutput:
    """`output` with the language servers' diagnostics that came after their edit's result
    went back (keel.lsp), as a note at its end."""
    late = ctx.lsp.take_late() if ctx.lsp is not None else ""
    if not late:
        return output
    if isinstance(output.content, str):
        return dataclasses.replace(output, content=f"{output.content}\n\n{late}")
    return dataclasses.replace(output, content=(*output.content, Text(late)))


def _log_tool_bug(name: str) -> None:
    import logging  # only on this rare path: logging costs startup time

    logging.getLogger(__name__).debug("tool %s raised", name, exc_info=True)


def _groups(ready: list[_Ready]) -> list[list[_Ready]]:
    """Consecutive read-only calls form one concurrent group; any other call runs alone."""
    groups: list[list[_Ready]] = []
    for item in ready:
        if tool_meta(item.tool).read_only and groups and tool_meta(groups[-1][0].tool).read_only:
            groups[-1].append(item)
        else:
            groups.append([item])
    return groups


__all__ = ["ToolRunner", "check_call", "finish"]
