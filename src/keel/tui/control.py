"""The interactive session a person drives, whatever draws it: prompts (with `@path` files),
`!cmd` lines, slash commands, the model and mode, sessions (clear, resume, rewind) and undo.

`Controller` talks to its front end only through `FrontEnd` (show view events, ask a permission
question, pick from a list) and to the agent only through its public API, so the Textual app and
the line mode share every behaviour. Agents are built exactly as `keel -p` builds them
(`keel.cli.headless`), then made interactive: the gate asks the front end, and "always allow"
answers are saved to the project's `.keel/settings.local.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from keel.agent.events import (
    AgentSpend,
    BackgroundFinished,
    Event,
    PermissionAnswered,
    PermissionAsked,
    TurnFinished,
    UsageUpdated,
)
from keel.agent.limits import Limits
from keel.app import Options, fresh_limits, open_agent, resume_agent
from keel.config.local_rules import LOCAL_SETTINGS, save_local_rule, save_local_setting
from keel.errors import KeelError, UserError
from keel.frozen import mutable
from keel.llm.catalog import ModelRef, parse_model
from keel.llm.events import Notice
from keel.llm.provider import model_info
from keel.permissions.gate import MODES, Mode, PermissionGate, PermissionReply, PermissionRequest
from keel.tui import commands as cmds
from keel.tui.format import cost as fmt_cost
from keel.tui.format import one_line, typed_prompt
from keel.tui.mentions import attach
from keel.tui.undo import SessionUndo
from keel.tui.view import Choice, Output, PromptSubmitted, ShellRan, ViewEvent

if TYPE_CHECKING:
    from keel.agent.loop import Agent
    from keel.app.init import Approval, Proposal
    from keel.config.settings import Settings
    from keel.hooks.runner import HookRunner
    from keel.llm.provider import Provider
    from keel.session.records import Record
    from keel.session.resume import ConfigurationChanged
    from keel.tui.statusline import StatusLine

#: Seconds a `!cmd` line may run.
SHELL_TIMEOUT = 600.0
#: Shift+Tab cycles through these; `bypass` is only ever chosen by name, and `auto` joins the
#: cycle (after plan) only when the user opted in (`auto_mode_opted_in`).
MODE_CYCLE: tuple[Mode, ...] = ("default", "accept-edits", "plan")


class FrontEnd(Protocol):
    """What the controller needs from whatever draws the session."""

    def show(self, event: ViewEvent) -> None:
        """Render one event (called in order, synchronously; must not block)."""

    def reset(self, events: Sequence[ViewEvent]) -> None:
        """Replace the whole transcript (a fresh context, or another session)."""

    def refresh_status(self) -> None:
        """The model, mode or session changed: redraw whatever shows them."""

    def set_input(self, text: str) -> None:
        """Put text in the prompt for the user to edit (a rewound prompt)."""

    def exit(self) -> None:
        """The user asked to quit."""

    async def ask(self, request: PermissionRequest) -> PermissionReply: ...

    async def pick(self, title: str, choices: Sequence[Choice]) -> str | None:
        """One of `choices` by value, or None if the user backed out."""


class Driver(Protocol):
    """What a front end drives: the session behind the screen. `Controller` runs the agent in
    this process; `keel.tui.remote.RemoteController` drives one that `keel serve` hosts."""

    @property
    def busy(self) -> bool: ...

    @property
    def cwd(self) -> Path:
        """The project, as the welcome line names it."""

    @property
    def ctrl_c_stops(self) -> bool:
        """Ctrl+C stops what runs (here), or only ever quits (an attached session's work)."""

    def attach(self, ui: FrontEnd) -> None: ...

    def begin(self, prompt: str = "") -> None: ...

    def status(self) -> Status: ...

    def submit(self, text: str) -> None: ...

    def interrupt(self) -> bool: ...

    def cycle_mode(self) -> Mode: ...

    async def wait(self) -> None: ...

    def leave(self) -> None:
        """The front end is closing (what runs here stops; a remote session goes on)."""

    @property
    def exited(self) -> bool:
        """The user asked to quit (`/exit`)."""

    async def close(self) -> None:
        """Stop what runs here and let go of the session (the line mode closes it)."""

    def history_file(self) -> Path | None:
        """Where the prompt history is kept (None: in memory only)."""

    def local_files(self) -> Path | None:
        """The folder `@path` completion lists (None: no files on this machine)."""

    def command_names(self) -> dict[str, str]:
        """`/name` → description of the skills and custom commands besides the built-ins."""

    def status_line(self, show: Callable[[str, int], None]) -> StatusLine | None:
        """The settings' `statusLine` command, calling `show(line, padding)` (None: none)."""


class _Backlog:
    """Stands in for the front end until one is attached: keeps what was shown."""

    def __init__(self) -> None:
        self.events: list[ViewEvent] = []

    def show(self, event: ViewEvent) -> None:
        self.events.append(event)

    def reset(self, events: Sequence[ViewEvent]) -> None:
        self.events = list(events)

    def refresh_status(self) -> None:
        return None

    def set_input(self, text: str) -> None:
        return None

    def exit(self) -> None:
        return None

    async def ask(self, request: PermissionRequest) -> PermissionReply:
        return PermissionReply(False, reason="no front end to ask")

    async def pick(self, title: str, choices: Sequence[Choice]) -> str | None:
        return None


# -- building agents ---------------------------------------------------------------------------


class AgentFactory:
    """Builds agents from the command line's options and the project's settings, the way a
    headless run does. `provider_for`, when given, replaces every provider (tests)."""

    def __init__(
        self,
        args: argparse.Namespace,
        *,
        cwd: Path,
        settings: Settings,
        provider_for: Callable[[ModelRef], Provider] | None = None,
    ) -> None:
        self.args = args
        self.cwd = cwd
        self.settings = settings
        self.provider_for = provider_for
        self.options = Options.from_args(args, cwd=cwd)
        #: Where build notices go (the controller points it at the front end).
        self.notice: Callable[[Event], None] = lambda _e: None

    @property
    def keep_sessions(self) -> bool:
        return not self.options.no_session

    def _notify(self, event: Event) -> None:
        self.notice(event)

    def limits(self) -> Limits:
        return fresh_limits(self.options, self.settings)

    async def fresh(self, ref: ModelRef) -> Agent:
        """A new agent; its session file is created at the first prompt (`_ensure_session`)."""
        return await open_agent(
            self.options,
            self._notify,
            settings=self.settings,
            ref=ref,
            provider=self.provider_for(ref) if self.provider_for is not None else None,
            session=False,
        )

    async def open(
        self, path: Path, *, force: bool = False
    ) -> tuple[Agent, ModelRef, list[Record], bool]:
        """The session in `path`, locked and rebuilt: (agent, model, its records, whether its
        last turn left tool calls unanswered). Notes of undos the model was not told of yet are
        queued again. `force`: despite a changed configuration (`keel resume --force`)."""
        from dataclasses import replace

        options = replace(self.options, force=True) if force else self.options
        opened = await resume_agent(path, options, self._notify, provider_for=self.provider_for)
        return (
            opened.agent,
            opened.ref,
            list(opened.records),  # as opened: the file is not parsed a second time
            opened.state.pending is not None,
        )

    def provider(self, ref: ModelRef) -> Provider:
        if self.provider_for is not None:
            return self.provider_for(ref)
        from keel.llm.provider import RetryPolicy, make_provider

        return make_provider(
            ref,
            settings=self.settings,
            retry=RetryPolicy(attempts=self.args.max_retries + 1),
            unattended=False,
        )


# -- the controller ----------------------------------------------------------------------------


@mutable
class Status:
    """What a status line shows."""

    model: str
    mode: str
    context: int
    window: int
    cost: float
    tokens: int
    busy: bool
    session_id: str
    #: monotonic time the running prompt started (None: idle)
    since: float | None
    #: Where the session runs, when not here ("attached to URL · session ID").
    remote: str = ""
    #: Subagents running now (`AgentSpend` rows still running).
    agents_running: int = 0


#: Claude Code's default wait before its `idle_prompt` notification.
IDLE_NOTIFY_AFTER = 60.0


class Controller:
    """One interactive session: an agent (replaced by /clear, /resume, /rewind), what runs now,
    and what is queued behind it."""

    def __init__(self, factory: AgentFactory) -> None:
        self.factory = factory
        self._ui: FrontEnd = _Backlog()
        factory.notice = self.show
        self._agent: Agent | None = None
        self.ref = ModelRef("scripted", "")
        self.undo: SessionUndo | None = None
        self.context = 0
        #: Each agent's row of the tree's spend, by agent id (`AgentSpend`), as last reported.
        self.spend_rows: dict[str, AgentSpend] = {}
        self.queue: list[str] = []
        self.exited = False
        self._task: asyncio.Task[None] | None = None
        self._shell: asyncio.Task[tuple[str, int | None, bool]] | None = None
        self._since: float | None = None
        #: The prompt to finish first: a resumed session whose last turn left calls unanswered.
        self._unfinished = False
        self._tasks: set[asyncio.Task[None]] = set()
        #: Permission questions being asked, by request id.
        self._asking: dict[str, asyncio.Task[None]] = {}
        #: How the last prompt ended.
        self._last_stop = ""
        #: The session file the last prompt (or /compact) was written to: the exit's resume hint.
        self.worked_in: Path | None = None
        #: An agent of its own that runs for a command (/init), to interrupt with the prompt.
        self._side: Agent | None = None
        #: Seconds of waiting for the user before `Notification` hooks hear `idle_prompt`.
        self.idle_after = IDLE_NOTIFY_AFTER
        self._idle: asyncio.TimerHandle | None = None

    # -- wiring ------------------------------------------------------------------------------

    @property
    def agent(self) -> Agent:
        assert self._agent is not None, "the controller has no agent yet (call start_*)"
        return self._agent

    @property
    def ui(self) -> FrontEnd:
        return self._ui

    def attach(self, ui: FrontEnd) -> None:
        """Use `ui` from now on; it first gets everything shown so far."""
        backlog = self._ui.events if isinstance(self._ui, _Backlog) else []
        self._ui = ui
        ui.reset(backlog)
        ui.refresh_status()

    # -- what a front end asks of its driver (`Driver`) ----------------------------------

    @property
    def cwd(self) -> Path:
        return self.agent.cwd

    ctrl_c_stops = True

    def leave(self) -> None:
        self.interrupt()

    def history_file(self) -> Path | None:
        from keel.tui.history import history_path

        return history_path(self.agent.ctx.root) if self.factory.keep_sessions else None

    def local_files(self) -> Path | None:
        return self.agent.cwd

    def command_names(self) -> dict[str, str]:
        return cmds.extension_names(self.agent)

    def status_line(self, show: Callable[[str, int], None]) -> StatusLine | None:
        config = self.factory.settings.status_line
        if config is None:
            return None
        from keel.tui.statusline import StatusLine, payload

        started = time.monotonic()
        return StatusLine(
            config,
            lambda: payload(self.agent, context=self.context, started=started),
            lambda line: show(line, config.padding),
            cwd=str(self.agent.cwd),
            env=dict(os.environ),
        )

    def show(self, event: ViewEvent) -> None:
        if isinstance(event, UsageUpdated):
            self.context = event.context
        elif isinstance(event, AgentSpend):
            self.spend_rows[event.agent_id] = event
        elif isinstance(event, PermissionAsked):
            self._asked(event)
            return
        elif isinstance(event, PermissionAnswered):
            self._answered(event)
            return
        self._ui.show(event)

    async def start_fresh(self, ref: ModelRef) -> None:
        self.ref = ref
        self._use(await self.factory.fresh(ref))

    async def start_session(self, path: Path) -> None:
        agent, ref, records, unfinished = await self.factory.open(path)
        self.ref = ref
        self._use(agent)
        self._load_transcript(records)
        self._unfinished = unfinished

    def _load_transcript(self, records: list[Record]) -> None:
        from keel.tui.replay import replay

        events = replay(records, self.agent.info, self.agent.cwd)
        self.context = next((e.context for e in reversed(events) if isinstance(e, UsageUpdated)), 0)
        self._ui.reset(events)

    def _use(self, agent: Agent) -> None:
        if self.undo is not None:
            self.undo.close()
        if self._agent is not None and agent.tracer is None:
            import keel.trace

            keel.trace.follow(self._agent, agent)  # `/debug on` outlives /clear and /resume
        self._agent = agent
        agent.interactive = True
        agent.takes_questions = True
        agent.on_background_event = self._background_event
        gate = agent.gate
        agent.ask_through_events()  # questions reach `show` as PermissionAsked
        if isinstance(gate, PermissionGate):
            gate.save_rule = self._save_rule
        self.undo = SessionUndo(agent)
        self._ui.refresh_status()

    def _background_event(self, event: Event) -> None:
        """An event of background work while no prompt runs (a subagent's, or a task that
        finished). A finished task's result goes to the model in a turn keel starts itself."""
        self.show(event)
        if isinstance(event, BackgroundFinished):
            # Called from inside the task's bookkeeping: start the turn once that is done.
            asyncio.get_running_loop().call_soon(self._deliver_background)

    def _deliver_background(self) -> None:
        if self.busy or self.exited or self._agent is None:
            return
        if self.agent.undelivered:
            self.submit_work(self._run_notifications())

    async def _run_notifications(self) -> None:
        agent = self.agent
        self._ensure_session()
        self._since = time.monotonic()
        self._ui.refresh_status()
        try:
            result = await agent.run_notifications(self.show)
            if result is not None:
                self._last_stop = result.stop_reason
        finally:
            self._since = None
            self._ui.refresh_status()

    def _asked(self, event: PermissionAsked) -> None:
        """A permission question: the front end asks the user, the answer goes back through
        the agent. A question the run stops waiting for (Esc) closes with it."""
        agent = self.agent
        task = asyncio.create_task(self._ask(agent, event))
        self._asking[event.request_id] = task
        task.add_done_callback(lambda _t: self._asking.pop(event.request_id, None))

    async def _ask(self, agent: Agent, event: PermissionAsked) -> None:
        request = PermissionRequest(
            event.call, event.reason, event.suggestion, event.plan, event.confirm
        )
        try:
            reply = await self._ui.ask(request)
        except (KeelError, OSError, RuntimeError) as exc:  # the front end could not ask: deny
            reply = PermissionReply(False, reason=f"keel could not ask the user ({exc})")
        agent.answer(event.request_id, reply)
        if event.call.name == "exit_plan_mode" and reply.allow:
            # The gate switches to the mode the user picked once it has the answer.
            asyncio.get_running_loop().call_soon(self._ui.refresh_status)

    def _answered(self, event: PermissionAnswered) -> None:
        task = self._asking.get(event.request_id)
        if task is not None and event.by != "user":
            task.cancel()

    def _save_rule(self, rule: str) -> None:
        try:
            path = save_local_rule(self.agent.cwd, rule)
        except (UserError, OSError) as exc:
            message = exc.one_line() if isinstance(exc, UserError) else str(exc)
            self.show(Notice(f"could not save the rule {rule}: {message}", "warning"))
            return
        self.show(Notice(f"always allowed {rule} (saved to {_rel(path, self.agent.cwd)})"))

    def status(self) -> Status:
        agent = self.agent
        mode = agent.gate.mode if isinstance(agent.gate, PermissionGate) else "allow-all"
        return Status(
            model=str(self.ref) if self.ref.provider != "scripted" else _script_name(agent.model),
            mode=mode,
            context=self.context,
            window=agent.info.window,
            cost=agent.spend.cost,
            tokens=agent.spend.usage.total,
            busy=self.busy,
            session_id=agent.session_id,
            since=self._since,
            agents_running=sum(
                1
                for r in self.spend_rows.values()
                if r.agent_id != agent.session_id and r.status == "running"
            ),
        )

    # -- running things ----------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        return self._task is not None and not self._task.done()

    def submit_work(self, work: Coroutine[object, object, object]) -> None:
        """Run `work` as the running prompt (queued lines wait for it)."""
        if self.busy:
            work.close()
            raise UserError("a prompt is running", hint="press Esc first")
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        self._task = asyncio.create_task(self._drain_after(work))

    async def _drain_after(self, work: Coroutine[object, object, object]) -> None:
        await self._guarded(work)
        while self.queue and not self.exited:
            await self.handle(self.queue.pop(0))
        # Background results that finished after the prompt's last request: keel goes on by
        # itself (an interrupted prompt leaves them for the next one).
        interrupted = self._last_stop == "interrupted"
        if not self.exited and not interrupted and self.agent.undelivered:
            await self._guarded(self._run_notifications())
        hooks = self._agent.hooks if self._agent is not None else None
        if not self.exited and hooks is not None and hooks.has("Notification"):
            self._idle = asyncio.get_running_loop().call_later(self.idle_after, self._waiting)

    def _waiting(self) -> None:
        """The user has not answered for `idle_after` seconds: `Notification` hooks hear
        `idle_prompt`, as in Claude Code (once per wait)."""
        self._idle = None
        hooks = self._agent.hooks if self._agent is not None else None
        if self.busy or self.exited or hooks is None:
            return
        task = asyncio.create_task(self._guarded(self._idle_hooks(hooks)))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _idle_hooks(self, hooks: HookRunner) -> None:
        fields = {"message": "keel is waiting for your input", "notification_type": "idle_prompt"}
        result = await hooks.run("Notification", fields, match="idle_prompt")
        for problem in result.errors:
            self.show(Notice(problem, "warning"))

    def submit(self, text: str) -> None:
        """Run `text` now, or queue it behind the running prompt (read-only commands run at
        once; others wait for the prompt to finish or be interrupted)."""
        if not text.strip():
            return
        if not self.busy:
            self.submit_work(self._dispatch(text))
            return
        parsed = cmds.parse_command(text)
        if parsed is not None and parsed[0] in cmds.BUILTINS:
            if cmds.BUILTINS[parsed[0]].while_busy:
                task = asyncio.create_task(self._guarded(self._command(*parsed)))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            else:
                self.show(
                    Output(
                        f"/{parsed[0]} waits for the running prompt: press Esc to stop it", "error"
                    )
                )
            return
        self.queue.append(text)
        self.show(Notice(f"queued: {one_line(text, 60)}"))

    async def wait(self) -> None:
        """Until nothing runs (tests, the line mode)."""
        while self.busy or self._tasks:
            if self._task is not None and not self._task.done():
                await asyncio.wait({self._task})
            if self._tasks:
                await asyncio.wait(set(self._tasks))

    def interrupt(self) -> bool:
        """Stop what runs now (Esc). Queued prompts go back to the input. False if idle."""
        if not self.busy:
            return False
        if self.queue:
            self._ui.set_input("\n\n".join(self.queue))
            self.queue.clear()
        if self._shell is not None and not self._shell.done():
            self._shell.cancel()
        if self._side is not None:
            self._side.interrupt()
        self.agent.interrupt()
        return True

    async def handle(self, text: str) -> None:
        """Run one line the user sent: a `!cmd`, a slash command, or a prompt."""
        await self._guarded(self._dispatch(text))

    async def _guarded(self, work: Coroutine[object, object, object]) -> None:
        """Run `work`, showing its failure as an error line: a front end outlives its
        commands' errors (a keel error is one line; anything else names its type)."""
        try:
            await work
        except KeelError as exc:
            self.show(Output(exc.one_line(), "error"))
        except Exception as exc:
            detail = ""
            if getattr(self.factory.args, "debug", False):
                import traceback

                detail = "\n" + traceback.format_exc()
            self.show(Output(f"internal error: {type(exc).__name__}: {exc}{detail}", "error"))

    async def _dispatch(self, text: str) -> None:
        stripped = text.strip()
        if not stripped:
            return
        if stripped.startswith("!"):
            await self.run_shell(stripped[1:].strip())
            return
        parsed = cmds.parse_command(stripped)
        if parsed is not None:
            name, args = parsed
            if name in cmds.BUILTINS:
                await self._command(name, args)
                return
            extensions = cmds.extension_names(self.agent)
            if name not in extensions:
                close = cmds.closest(name, [*cmds.BUILTINS, *extensions])
                guess = f": did you mean /{close}?" if close else ""
                raise UserError(
                    f"unknown command /{name}{guess}",
                    hint="/help lists commands; to send a line starting with /, start it with a space",
                )
        await self.run_prompt(text.strip("\n").rstrip())

    async def run_prompt(self, text: str) -> None:
        agent = self.agent
        self._ensure_session()
        if self._unfinished and not await self.resume_unfinished():
            return
        sent, attachments = attach(text, agent.cwd, refuse=agent.import_refusal)
        from keel.tools.builtin.files import stamp

        for a in attachments:
            if a.complete and a.resolved.is_file():
                agent.ctx.read_files[a.resolved] = stamp(a.resolved)
        self.show(PromptSubmitted(text, tuple(a.path for a in attachments)))
        if self.undo is not None:
            self.undo.begin(text)
        self._since = time.monotonic()
        self._ui.refresh_status()
        self._last_stop = ""
        try:
            self._last_stop = (await agent.run(sent, self.show, label=text)).stop_reason
        finally:
            self._since = None
            self._ui.refresh_status()

    def begin(self, prompt: str = "") -> None:
        """Once the front end is up: continue a resumed session's unfinished turn, then run the
        prompt given on the command line, if any."""
        if self._unfinished:
            self.submit_work(self.resume_unfinished())
        if prompt.strip():
            self.submit(prompt)

    async def resume_unfinished(self) -> bool:
        """Continue a resumed session whose last turn left tool calls unanswered (each goes
        through the permission gate again). True if that turn then ended normally."""
        if not self._unfinished:
            return True
        self._unfinished = False
        self._ensure_session()
        self.show(Notice("continuing the turn this session stopped in"))
        self._since = time.monotonic()
        self._ui.refresh_status()
        try:
            result = await self.agent.resume(self.show)
        finally:
            self._since = None
            self._ui.refresh_status()
        return result.stop_reason == "end_turn"

    def _ensure_session(self) -> None:
        """Sessions are written from the first prompt on (opening keel and quitting leaves no
        empty session behind)."""
        agent = self.agent
        if agent.session is None and self.factory.keep_sessions:
            from keel.session.store import SessionLog

            agent.session = SessionLog.create(
                cwd=agent.cwd,
                model=str(self.ref),
                fingerprint=agent.fingerprint(),
                session_id=agent.session_id,
            )
            self._ui.refresh_status()
        if agent.session is not None:
            self.worked_in = agent.session.path  # something is written to it now

    def resume_hint(self) -> str | None:
        """The line printed after keel exits: how to go on with the session worked in last (None
        when nothing was written to a session file)."""
        path = self.worked_in
        if path is None or not path.is_file():
            return None
        from keel.session.index import latest_session

        again = f"keel --resume {path.stem}"
        try:
            latest = latest_session(self.factory.cwd) == path
        except (UserError, OSError):
            latest = False
        if not latest:
            return f"To resume this session: {again}"
        where = ""
        if self.factory.cwd != Path.cwd():
            import shlex

            where = f" --cwd {shlex.quote(str(self.factory.cwd))}"
        return f"To resume this session: keel --continue{where} (or {again})"

    async def run_shell(self, command: str) -> None:
        """`!cmd`: the user's own command, run directly (not through the permission gate: the
        user typed it); the model sees the output with the next prompt."""
        if not command:
            raise UserError("nothing to run", hint="type !command, e.g. !git status")
        from keel.tools.builtin.shell import run_command
        from keel.tools.truncate import truncate

        agent = self.agent
        start = self._since = time.monotonic()
        self._ui.refresh_status()
        self._shell = asyncio.create_task(
            run_command(command, cwd=str(agent.cwd), env=agent.ctx.env, time_limit=SHELL_TIMEOUT)
        )
        try:
            output, code, timed_out = await self._shell
        except asyncio.CancelledError:
            output, code, timed_out = "[interrupted]", None, False
            if not self._shell.cancelled():
                raise
        finally:
            self._shell = None
            self._since = None
            self._ui.refresh_status()
        output = output.rstrip("\n")
        if timed_out:
            output += f"\n[timed out after {SHELL_TIMEOUT:g} s]"
        self.show(ShellRan(command, output, code, time.monotonic() - start))
        agent.add_note(
            f"The user ran this shell command themselves (exit code {code}):\n$ {command}\n"
            f"<output>\n{truncate(output)}\n</output>"
        )

    # -- slash commands ----------------------------------------------------------------------

    async def _command(self, name: str, args: str) -> None:
        handler = getattr(self, f"_cmd_{name.replace('-', '_')}")
        await handler(args)

    async def _cmd_help(self, args: str) -> None:
        self.show(Output(cmds.help_text(self.agent), title="help"))

    async def _cmd_exit(self, args: str) -> None:
        self.exited = True
        self._ui.exit()

    _cmd_quit = _cmd_exit

    async def _cmd_debug(self, args: str) -> None:
        days = self.factory.settings.trace_retention_days
        self.show(Output(cmds.debug_command(self.agent, args, retention_days=days), title="debug"))

    async def _cmd_output_style(self, args: str) -> None:
        """`/output-style`: the styles there are; `/output-style NAME`: that style from the next
        fresh context (the system prompt of this one stays: the cached prefix holds), kept in
        the project's personal settings."""
        from keel.agent.output_styles import DEFAULT, find_style
        from keel.app.assembly import available_styles

        warnings: list[str] = []
        styles = available_styles(self.agent.cwd, warnings)
        for warning in warnings:
            self.show(Notice(warning, "warning"))
        settings = self.factory.settings
        if not args.strip():
            self.show(Output(cmds.output_styles_text(self.agent, styles, settings.output_style)))
            return
        style = find_style(args, styles)
        if style is None:
            names = ", ".join(s.name for s in styles)
            raise UserError(f"no output style {args.strip()!r}", hint=f"one of: {names}")
        path = save_local_setting(self.agent.cwd, "outputStyle", style.name)
        settings.output_style, settings.output_style_file = style.name, path
        now = self.agent.output_style.name if self.agent.output_style else DEFAULT
        self.show(
            Notice(
                f"output style: {style.name} from the next fresh context (/clear); this "
                f"conversation keeps {now} (saved in {path})"
            )
        )

    async def _cmd_pin(self, args: str) -> None:
        """`/pin TEXT`: every summary must keep TEXT (journaled: a resume keeps it); `/pin`:
        the pins."""
        if args.strip():
            self.agent.pin(args)
            self.show(Notice(f"pinned: {' '.join(args.split())}"))
        else:
            self.show(
                Output(cmds.pins_text(self.agent.pins, self.agent.compaction.keep), title="pins")
            )

    async def _cmd_unpin(self, args: str) -> None:
        if not args.strip().isdigit():
            raise UserError(f"/unpin {args}: not a pin number", hint="/pin lists them; /unpin N")
        self.show(Notice(f"unpinned: {self.agent.unpin(int(args))}"))

    async def _cmd_cost(self, args: str) -> None:
        rows = list(self.spend_rows.values())
        self.show(Output(cmds.cost_text(self.agent, self.context, rows), title="cost"))

    async def _cmd_context(self, args: str) -> None:
        self.show(Output(cmds.context_text(self.agent, self.context), title="context"))

    async def _cmd_permissions(self, args: str) -> None:
        text = cmds.permissions_text(self.agent, str(LOCAL_SETTINGS))
        self.show(Output(text, title="permissions"))

    async def _cmd_skills(self, args: str) -> None:
        self.show(Output(cmds.skills_text(self.agent), title="skills"))

    async def _cmd_memory(self, args: str) -> None:
        """`/memory [list]`, `/memory show NAME`, `/memory add NAME: description` (the body
        on the lines below; none: the description), `/memory delete NAME`; `--user` for the
        user's notes. An added note is told to the model with the next prompt."""
        from keel.memory import MemoryError_, Note, Scope, open_store
        from keel.memory.text import list_text, show_text

        config = self.factory.settings.memory
        if not config.enabled:
            raise UserError("memory is off", hint="remove `memory: false` from your settings")
        first, _, rest = args.partition("\n")
        words = first.split()
        scope: Scope = "user" if "--user" in words else "project"
        words = [w for w in words if w != "--user"]
        action = words[0] if words else "list"
        usage = "/memory, /memory show NAME, /memory add NAME: description, /memory delete NAME"
        store = open_store(config, self.agent.ctx.root, self.agent.ctx.env)
        try:
            if action == "list" and len(words) <= 1:
                self.show(Output(await list_text(store), "text", title="memory"))
            elif action == "show" and len(words) == 2:
                entry = await store.read(scope, words[1])
                self.show(Output(show_text(entry), "text", title="memory"))
            elif action in ("delete", "rm") and len(words) == 2:
                await store.delete(scope, words[1], revision=None)
                self.agent.add_note(f"The user deleted the {scope} memory note {words[1]!r}.")
                self.show(Notice(f"deleted the {scope} note {words[1]}"))
            elif action == "add" and ":" in first:
                name, _, description = first.split(None, 1)[1].replace("--user", "").partition(":")
                body = rest.strip() or description.strip()
                entry = await store.save(
                    scope,
                    Note(name.strip(), description.strip(), body, scope),  # type follows scope
                    revision=None,
                )
                self.agent.add_note(
                    f"The user saved a {scope} memory note {entry.note.name!r} "
                    f"({entry.note.description}); read it with the memory tool if it matters."
                )
                self.show(Notice(f"saved the {scope} note {entry.note.name}"))
            else:
                raise UserError(f"/memory {first}: not understood", hint=usage)
        except MemoryError_ as exc:
            raise UserError(str(exc), hint=usage) from exc
        finally:
            await store.aclose()

    async def _cmd_doctor(self, args: str) -> None:
        self.show(Output(await self._keel("doctor"), "text", title="doctor"))

    async def _cmd_hooks(self, args: str) -> None:
        if args not in ("", "list", "approve"):
            raise UserError(f"/hooks {args}: unknown", hint="/hooks or /hooks approve")
        out = await self._keel("hooks", args or "list")
        if args == "approve":
            out += "\nApproved hooks run from the next fresh context (/clear)."
        self.show(Output(out, "text", title="hooks"))

    async def _cmd_mcp(self, args: str) -> None:
        words = args.split()
        if words and words[0] == "approve":
            out = await self._keel("mcp", *words)
            self.show(
                Output(
                    out + "\nApproved servers start with the next fresh context (/clear).",
                    "text",
                    title="mcp",
                )
            )
            return
        if words:
            raise UserError(f"/mcp {args}: unknown", hint="/mcp or /mcp approve [NAME]")
        self.show(Output(_mcp_text(self.agent), title="mcp"))

    async def _cmd_plugin(self, args: str) -> None:
        """`keel plugin …` in this project; a change applies from the next fresh context (the
        tools and the system prompt stay as they are within one)."""
        words = args.split()
        out = await self._keel("plugin", *(words or ["list"]))
        if words and words[0] not in ("list", "marketplace"):
            out += "\nPlugin changes apply from the next fresh context (/clear)."
        self.show(Output(out, "text", title="plugin"))

    async def _cmd_trust(self, args: str) -> None:
        words = args.split()
        if words and words[0] not in ("list", "approve", "revoke"):
            raise UserError(f"/trust {args}: unknown", hint="/trust, /trust approve, /trust revoke")
        out = await self._keel("trust", *(words or ["list"]))
        if words and words[0] != "list":
            out += "\nThe change applies from the next fresh context (/clear)."
        self.show(Output(out, "text", title="trust"))

    async def _keel(self, *argv: str) -> str:
        """The output of a `keel` subcommand run in this project (doctor, hooks, mcp approve)."""
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "keel",
            *argv,
            cwd=self.agent.cwd,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await proc.communicate()
        return out.decode("utf-8", errors="replace").rstrip()

    async def _cmd_compact(self, args: str) -> None:
        self._ensure_session()
        self._since = time.monotonic()
        self._ui.refresh_status()
        try:
            await self.agent.compact(args, self.show)
        finally:
            self._since = None
            self._ui.refresh_status()

    async def _cmd_mode(self, args: str) -> None:
        gate = self.agent.gate
        if not isinstance(gate, PermissionGate):
            raise UserError("this agent has no permission gate")
        choice = args or await self._ui.pick(
            "Permission mode",
            [Choice(m, m, "(now)" if m == gate.mode else _MODE_HELP[m]) for m in MODES],
        )
        if choice:
            self.set_mode(_parse_mode(choice))

    def set_mode(self, mode: Mode) -> None:
        self.agent.set_mode(mode)
        self.show(Notice(f"mode: {mode}"))
        self._ui.refresh_status()

    def cycle_mode(self) -> Mode:
        """Shift+Tab: the next mode of default → accept-edits → plan → default."""
        gate = self.agent.gate
        if not isinstance(gate, PermissionGate):
            raise UserError("this agent has no permission gate")
        cycle = MODE_CYCLE
        if gate.mode == "auto" or auto_mode_opted_in(self.factory.settings):
            cycle = (*MODE_CYCLE, "auto")
        i = cycle.index(gate.mode) if gate.mode in cycle else -1
        mode = cycle[(i + 1) % len(cycle)]
        self.agent.set_mode(mode)
        self._ui.refresh_status()
        return mode

    async def _cmd_model(self, args: str) -> None:
        spec = args or await self._ui.pick("Model", await _model_choices(self))
        if not spec:
            return
        ref = parse_model(spec)
        if ref != self.ref and (var := missing_key(ref.provider, self.factory.settings)):
            raise UserError(
                f"{ref} needs an API key: {var} is not set (still on {self.ref})",
                hint=f"export {var}=… before starting keel, or pick a model whose key is set",
            )
        agent = self.agent
        provider = self.factory.provider(ref)  # raises for a missing key: the old one stays
        old = agent.provider
        agent.provider = provider
        agent.model = ref.model
        agent.info = model_info(ref, self.factory.settings.models)  # local models cost 0
        self.ref = ref
        if old is not provider:
            await old.aclose()
        self.show(Notice(f"model: {ref} (from the next request on)"))
        self._ui.refresh_status()

    async def _cmd_clear(self, args: str) -> None:
        old = self.agent
        new = await self.factory.fresh(self.ref)
        if isinstance(old.gate, PermissionGate) and isinstance(new.gate, PermissionGate):
            new.gate.mode = old.gate.mode
            new.gate.session_rules = list(old.gate.session_rules)
        new.session_start_source = "clear"
        await old.aclose("clear")
        self.context = 0
        self._unfinished = False
        self._use(new)
        self._ui.reset([Notice("a fresh context: the conversation so far is in the last session")])

    async def _switch_to(self, path: Path, reason: str, *, force: bool = False) -> None:
        old = self.agent
        agent, ref, records, unfinished = await self.factory.open(path, force=force)
        await old.aclose(reason)
        self.ref = ref
        self._use(agent)
        self._load_transcript(records)
        self._unfinished = unfinished

    async def _cmd_resume(self, args: str) -> None:
        from keel.session.index import find_session, session_files, summarize

        if args:
            path = find_session(args, self.agent.cwd)
        else:
            choices = []
            for p in session_files(self.agent.cwd):
                if p.stem == self.agent.session_id:
                    continue
                try:
                    s = summarize(p)
                except (UserError, OSError):
                    continue
                detail = f"{s.status}, {s.turns if s.turns is not None else '?'} turns, {fmt_cost(s.cost or 0)}"
                choices.append(Choice(str(p), f"{s.id}  {one_line(s.last_prompt, 60)}", detail))
            if not choices:
                raise UserError("no other sessions in this project")
            picked = await self._ui.pick("Resume a session", choices[:50])
            if picked is None:
                return
            path = Path(picked)
        if path.stem == self.agent.session_id:
            raise UserError("that is the session open now")
        await self._switch_to(path, "resume")
        self.show(Notice(f"resumed session {path.stem}"))
        await self.resume_unfinished()

    async def _cmd_rewind(self, args: str) -> None:
        from keel.session.fork import fork_session
        from keel.session.journal import read_records
        from keel.session.records import UserRecord
        from keel.session.resume import ConfigurationChanged

        session = self.agent.session
        if session is None:
            raise UserError("nothing to rewind yet", hint="rewind goes back to an earlier prompt")
        prompts = [
            (r.seq, typed_prompt(r.payload.message.text))
            for r in read_records(session.path).records
            if isinstance(r.payload, UserRecord) and r.payload.source == "prompt"
        ]
        if not prompts:
            raise UserError("nothing to rewind yet", hint="rewind goes back to an earlier prompt")
        choices = [
            Choice(str(seq), one_line(text, 70), f"prompt {i}")
            for i, (seq, text) in reversed(list(enumerate(prompts, start=1)))
        ]
        picked = args or await self._ui.pick("Rewind to just before…", choices)
        if picked is None:
            return
        if not picked.isdigit():
            raise UserError(f"/rewind {picked}: not a prompt number", hint="/rewind opens a list")
        undone = await self._rewind_files(session.path, int(picked))
        if undone is None:
            return
        new_path, prompt = fork_session(session.path, int(picked))
        try:
            await self._switch_to(new_path, "other")
        except ConfigurationChanged as exc:
            # The way through: an explicit yes goes on as `keel resume --force` would.
            if not await self._go_on_despite(exc):
                self.show(
                    Notice(
                        f"not rewound; the fork {new_path.stem} is kept (keel -p --resume "
                        f'{new_path.stem} --force "…" continues it)'
                    )
                )
                return
            await self._switch_to(new_path, "other", force=True)
            for change in exc.changes:  # shown after the fork's transcript replaced the view
                self.show(Notice(f"rewound despite a changed configuration: {change}", "warning"))
        self._ui.set_input(typed_prompt(prompt))
        self.show(Notice(f"rewound into a new session {new_path.stem}"))
        for text in undone:  # after the fork's transcript replaced the view
            self.show(Output(text, title="undo"))

    async def _rewind_files(self, session: Path, seq: int) -> list[str] | None:
        """Before `/rewind` to the prompt at `seq`: when prompts from there on changed files,
        ask whether to put those back too (each one an /undo, recorded in this session, which
        the fork leaves behind). What each undo did, to show; None when the user cancels."""
        from datetime import datetime, timedelta

        from keel.session.journal import read_records
        from keel.session.records import UserRecord

        store = self.undo.store if self.undo is not None else None
        if store is None or not store.units():
            return []
        # A prompt's unit begins after the previous prompt's record was written (and before its
        # own): the units of the picked prompt and later ones began after that record.
        earlier = [
            r.ts
            for r in read_records(session).records
            if r.seq < seq and isinstance(r.payload, UserRecord) and r.payload.source == "prompt"
        ]
        since = (
            datetime.fromisoformat(earlier[-1].replace("Z", "+00:00")) + timedelta(milliseconds=1)
            if earlier
            else None
        )
        later = [u for u in store.units() if since is None or u.time >= since]
        if not later:
            return []
        picked = await self._ui.pick(
            f"Those prompts changed files ({len(later)} with changes)",
            [
                Choice("files", "Conversation and files", "put back what those prompts changed"),
                Choice("conversation", "Conversation only", "files stay as they are"),
            ],
        )
        if picked is None:
            return None
        if picked != "files":
            return []
        assert self.undo is not None
        return [self.undo.undo().describe() for _ in later]

    async def _go_on_despite(self, exc: ConfigurationChanged) -> bool:
        """Ask whether to go on with a session made under another configuration (each change
        named); True only for an explicit yes."""
        picked = await self._ui.pick(
            f"The configuration changed since this session began: {'; '.join(exc.changes)}",
            [
                Choice("force", "Go on anyway", "with the configuration as it is now"),
                Choice("cancel", "Cancel", "keep the session open now"),
            ],
        )
        return picked == "force"

    async def _cmd_init(self, args: str) -> None:
        """`/init [AGENTS.md|CLAUDE.md]`: a read-only agent of its own (keel.cli.init) studies
        the project and proposes the file; the diff is shown and written only on a yes. The write
        is a unit of this session's /undo; the model hears of it with the next prompt."""
        from keel.app.init import init_project, summary

        assert self.undo is not None
        self._ensure_session()
        self.undo.begin("/init")  # opens the store beside this session's file
        self.show(Notice("/init: the model studies the project with reading tools only"))
        self._since = time.monotonic()
        self._ui.refresh_status()
        try:
            outcome = await init_project(
                self.ref,
                cwd=self.agent.cwd,
                settings=self.factory.settings,
                args=self.factory.args,
                printer=self._init_event,
                approve=self._approve_init,
                file=args or None,
                provider=self.factory.provider(self.ref),
                keep_session=self.factory.keep_sessions,
                checkpoints=self.undo.store,
                on_agent=self._set_side,
            )
        finally:
            self._since = None
            self._ui.refresh_status()
        line = summary(outcome)
        if outcome.written:
            self.agent.add_note(
                f"/init {line} at the project root (the user approved the diff); it is part of "
                "the system prompt from the next fresh context"
            )
            line += " (it is read from the next fresh context: /clear; /undo puts it back)"
        text = f"{line} · {fmt_cost(outcome.result.cost)}"
        self.show(Output(text, "error" if outcome.failed else "text", title="init"))

    def _set_side(self, agent: Agent | None) -> None:
        self._side = agent

    def _init_event(self, event: Event) -> None:
        # The init agent's own context is not this session's: its usage must not move the meter.
        if not isinstance(event, UsageUpdated):
            self.show(event)

    async def _approve_init(self, proposal: Proposal) -> Approval:
        from keel.app.init import Approval

        fence = "`" * max(3, 1 + max((len(r) for r in re.findall("`+", proposal.diff)), default=0))
        shown = f"The proposed {proposal.name}, as a diff:\n\n{fence}diff\n{proposal.diff}{fence}"
        self.show(Output(shown, title="init"))
        picked = await self._ui.pick(
            f"Write {proposal.name}?",
            [
                Choice("yes", f"Yes, write {proposal.name}"),
                Choice("no", "No, leave it as it is"),
            ],
        )
        return Approval(picked == "yes", "" if picked else "no answer")

    async def _cmd_undo(self, args: str) -> None:
        assert self.undo is not None
        undone = self.undo.undo()
        self.show(Output(undone.describe(), title="undo"))

    async def close(self) -> None:
        """Stop what runs and close the agent (SessionEnd hooks, MCP servers, the journal)."""
        if self._idle is not None:
            self._idle.cancel()
        self.interrupt()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
        if self._agent is not None:
            await self._agent.aclose("prompt_input_exit")
            self._agent = None
        if self.undo is not None:
            self.undo.close()
            self.undo = None


_MODE_HELP: dict[str, str] = {
    "default": "asks before edits and unsandboxed commands",
    "accept-edits": "edits in the project run without asking",
    "plan": "read-only research, then a plan to approve",
    "bypass": "everything runs (deny rules still apply)",
    "auto": "a model classifier decides what would ask (ask and deny rules still apply)",
}


def auto_mode_opted_in(settings: Settings) -> bool:
    """Whether Shift+Tab offers `auto`: the user's own settings make it the default mode or
    configure its classifier (a project's cannot: the settings ignore them)."""
    from keel.config.settings import AutoModeSettings

    return settings.default_mode == "auto" or settings.auto_mode != AutoModeSettings()


def _parse_mode(value: str) -> Mode:
    from keel.permissions.gate import parse_mode

    return parse_mode(value.strip())


def _script_name(model: str) -> str:
    """`scripted:demo.yaml` for a scripted model (its "model" is the script's path)."""
    return f"scripted:{Path(model).name}" if model else "scripted"


def _rel(path: Path, cwd: Path) -> str:
    try:
        return str(path.relative_to(cwd))
    except ValueError:
        return str(path)


def missing_key(provider: str, settings: Settings, env: Mapping[str, str] | None = None) -> str:
    """The environment variable to set for `provider`'s models when it needs a key and none is
    set ("" when it has one, needs none, or is not a provider keel knows)."""
    from keel.llm.provider import env_key, preset_for

    try:
        preset = preset_for(provider, settings)
    except UserError:
        return ""
    conf = settings.providers.get(provider)
    names = (conf.api_key_env,) if conf is not None and conf.api_key_env else preset.key_envs
    if not preset.key_required or not names or env_key(names, os.environ if env is None else env):
        return ""
    return names[0]


async def _model_choices(controller: Controller) -> list[Choice]:
    """The model now, the settings' default, the models of a local Ollama server (if one
    answers at once), then the catalog (window and prices). A model whose provider has no key
    is greyed out and says which variable to set."""
    from keel.llm.catalog import BY_PROVIDER
    from keel.llm.providers.ollama import fetch_local_models, server_url

    current = str(controller.ref)
    choices = [Choice(current, current, "(now)")]
    settings = controller.factory.settings
    default = settings.model
    keyless: dict[str, str] = {}

    def no_key(spec: str) -> str:
        provider = spec.partition("/")[0]
        if provider not in keyless:
            keyless[provider] = missing_key(provider, settings)
        return keyless[provider]

    if default and default != current:
        var = no_key(default)
        note = f"  (no key: set {var})" if var else ""
        choices.append(Choice(default, default, "the default in settings" + note, bool(var)))
    base = server_url(settings.provider("ollama").base_url, os.environ)
    for local in await fetch_local_models(base):
        spec = f"ollama/{local.name}"
        if spec not in (current, default):
            about = " ".join(filter(None, (local.parameter_size, local.quantization)))
            choices.append(
                Choice(spec, spec, f"on this machine{', ' + about if about else ''}, free")
            )
    for spec, info in (
        (f"{provider}/{model}", info)
        for provider, models in BY_PROVIDER.items()
        for model, info in models.items()
    ):
        if spec in (current, default):
            continue
        detail = f"{info.window // 1000}k window"
        if info.priced:
            detail += f", ${info.input_price:g} / ${info.output_price:g} per M tokens"
        if var := no_key(spec):
            detail += f"  (no key: set {var})"
        choices.append(Choice(spec, spec, detail, bool(var)))
    return choices


def _mcp_text(agent: Agent) -> str:
    none = "No MCP servers in this session (add them to `.mcp.json` or the `mcp_servers` setting)."
    if "keel.mcp.client" not in sys.modules:  # no server was configured: it was never loaded
        return none
    from keel.mcp.client import McpManager, describe

    # The session's manager is the one whose shutdown the agent runs on close.
    owners = (getattr(close, "__self__", None) for close in agent.on_close)
    manager = next((o for o in owners if isinstance(o, McpManager)), None)
    if manager is None:
        return none

    lines = ["```", *describe(manager), "```"]
    tools = [s.name for s in agent.tool_specs if s.name.startswith("mcp__")]  # not withheld
    lines.append(
        f"{len(tools)} MCP tools offered: " + (", ".join(f"`{t}`" for t in tools) or "none")
    )
    return "\n".join(lines)


def finished_text(event: TurnFinished) -> str | None:
    """A line for a prompt that did not end normally (None when it did)."""
    match event.stop_reason:
        case "end_turn":
            return None
        case "interrupted":
            return "interrupted"
        case "error":
            return f"error: {event.error}"
        case reason:
            return f"stopped: {reason.replace('_', ' ')}"


__all__ = [
    "LOCAL_SETTINGS",
    "MODE_CYCLE",
    "AgentFactory",
    "Controller",
    "Driver",
    "FrontEnd",
    "Status",
    "finished_text",
    "missing_key",
    "save_local_rule",
]
