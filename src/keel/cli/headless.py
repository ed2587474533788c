"""Headless runs: `keel -p PROMPT`. Builds the agent from flags and settings, runs one prompt,
prints in the chosen format and returns the documented exit code.

Printers are event consumers; they never reach into the loop.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import select
import signal
import stat
import sys
import time
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from keel.agent.events import (
    AssistantMessage,
    BackgroundFinished,
    Event,
    SubagentEvent,
    ToolFinished,
    ToolStarted,
    TurnStarted,
    TurnStop,
)
from keel.agent.limits import DEFAULT_MAX_TURNS, DEFAULT_UNATTENDED_TOKENS, Limits
from keel.agent.loop import Agent, RunResult
from keel.cli import main as cli
from keel.app.jsonout import event_json, result_json
from keel.config.settings import EFFORTS, Settings, load_settings
from keel.errors import UserError
from keel.llm.catalog import ModelRef, parse_model
from keel.llm.events import Notice
from keel.llm.messages import Citation, ToolUse
from keel.llm.provider import RetryPolicy, make_provider, model_info
from keel.permissions.gate import PermissionGate, PermissionHook, PermissionRequest
from keel.tui.format import duration, key_argument, one_line

if TYPE_CHECKING:
    from keel.hooks.runner import HookRunner
    from keel.permissions.sandbox import Sandbox
    from keel.session.fold import SessionState
    from keel.session.journal import Journal
    from keel.session.records import CompactionRecord

EXIT_CODES: dict[TurnStop, int] = {
    "end_turn": cli.EXIT_OK,
    "error": cli.EXIT_ERROR,
    "budget": cli.EXIT_LIMIT,
    "max_turns": cli.EXIT_LIMIT,
    "loop": cli.EXIT_LIMIT,
    "max_tokens": cli.EXIT_INCOMPLETE,
    "refusal": cli.EXIT_INCOMPLETE,
    "blocked": cli.EXIT_BLOCKED,
    "hook_stopped": cli.EXIT_BLOCKED,
    "suspended": cli.EXIT_SUSPENDED,
    "unknown_outcome": cli.EXIT_UNKNOWN_OUTCOME,
    "interrupted": cli.EXIT_INTERRUPTED,
}

#: Models picked when none is configured, by which key is present.
DEFAULT_MODELS = (
    ("ANTHROPIC_API_KEY", "anthropic/claude-sonnet-4-5"),
    ("ANTHROPIC_AUTH_TOKEN", "anthropic/claude-sonnet-4-5"),
    ("OPENAI_API_KEY", "openai/gpt-5"),
    ("GEMINI_API_KEY", "gemini/gemini-3-flash-preview"),
    ("GOOGLE_API_KEY", "gemini/gemini-3-flash-preview"),
)


def read_prompt(words: list[str], stdin: TextIO, *, required: bool = True) -> str:
    """The prompt from arguments and/or piped stdin (both: arguments first, then stdin)."""
    prompt = " ".join(words).strip()
    piped = ""
    if not stdin.isatty():
        # With a prompt already given, read stdin only if something is waiting on it, so a
        # caller that leaves stdin open (but silent) does not hang the run.
        ready = True
        if prompt:
            try:
                ready = bool(select.select([stdin], [], [], 0.1)[0])
            except (OSError, ValueError):
                ready = False
        if ready:
            piped = stdin.read().strip()
    if prompt and piped:
        return f"{prompt}\n\n{piped}"
    if not (prompt or piped) and required:
        raise UserError("the prompt is empty", hint='keel -p "what to do", or pipe it on stdin')
    return prompt or piped


def choose_model(flag: str | None, settings: Settings) -> ModelRef:
    if flag:
        return parse_model(flag)
    if settings.model:
        return parse_model(settings.model)
    for var, model in DEFAULT_MODELS:
        if os.environ.get(var):
            return parse_model(model)
    raise UserError(
        "no model chosen and no API key found",
        hint="set ANTHROPIC_API_KEY, OPENAI_API_KEY or GEMINI_API_KEY, pass --model "
        "provider/model, "
        "or try keel offline with --model scripted:demo",
    )


class Printer:
    """Renders events for one output format. Text mode: the answer on stdout; on stderr one line
    per tool call and one for its result (the line mode's format), notices, and why a run stopped.
    `quiet` leaves the answer, warnings and errors.

    A write that finds its reader gone (a closed pipe: `keel -p … | head`) does not raise: the
    printer goes silent, points the stream at /dev/null and calls `on_closed`, which stops the
    run (it is then marked `interrupted`, "output closed")."""

    def __init__(self, fmt: str, *, quiet: bool, out: TextIO, err: TextIO) -> None:
        self.fmt = fmt
        self.quiet = quiet
        self.out = out
        self.err = err
        #: The reader of stdout or stderr went away; nothing more is written.
        self.closed = False
        self.on_closed: Callable[[], None] | None = None
        self._last_call = ""  # the call whose line was printed last (a result follows it)
        #: What this prompt's answers cite (web search), listed under the answer.
        self._citations: list[Citation] = []

    def __call__(self, event: Event) -> None:
        if self.fmt == "stream-json":
            line = event_json(event)
            if line is not None:
                self._line(line)
            return
        match event:
            case TurnStarted():
                self._citations = []
            case AssistantMessage(message):
                self._citations += message.citations
            case Notice(text, level) if level == "warning" or not self.quiet:
                prefix = "warning: " if level == "warning" else ""
                self.say(f"keel: {prefix}{text}")
            case ToolStarted(call) if not self.quiet:
                self._call_line(call)
            case ToolFinished(call, result, seconds, _display) if not self.quiet:
                if self._last_call != call.id:  # other lines came between: name it again
                    self._call_line(call)
                mark = "✗" if result.is_error else "✓"
                self.say(f"  └ {mark} {duration(seconds)}  {_summary(result.text)}".rstrip())
                self._last_call = ""
            case SubagentEvent(_, agent, _, ToolStarted(call)) if not self.quiet:
                self.say(f"  ↳ [{agent}] {call.name} {key_argument(call, 100)}".rstrip())
            case SubagentEvent(_, agent, _, Notice(text, "warning")):
                self.say(f"keel: warning: [{agent}] {text}")
            case BackgroundFinished(task_id, kind, status, description) if not self.quiet:
                self.say(f"keel: {task_id} ({kind}) {status}: {description}")
            case _:
                pass

    def _call_line(self, call: ToolUse) -> None:
        self.say(f"⏺ {call.name} {key_argument(call, 100)}".rstrip())
        self._last_call = call.id

    def say(self, text: str) -> None:
        self._last_call = ""
        self._write(self.err, text + "\n")

    def _line(self, obj: dict[str, Any]) -> None:
        self._write(self.out, json.dumps(obj, ensure_ascii=False) + "\n")

    def _write(self, stream: TextIO, text: str) -> None:
        if self.closed:
            return
        try:
            stream.write(text)
            stream.flush()
        except BrokenPipeError:
            self.output_closed(stream)

    def reader_gone(self) -> bool:
        return self.closed

    def output_closed(self, stream: TextIO | None = None) -> None:
        """The reader of `stream` (None: unknown, as for a SIGPIPE from outside) is gone."""
        if stream is not None:
            _to_devnull(stream)
        if self.closed:
            return
        self.closed = True
        if self.on_closed is not None:
            self.on_closed()

    def finish(self, finished: RunResult, *, model: str, seconds: float, path: str | None) -> None:
        result = result_json(
            finished, model=model, duration_ms=int(seconds * 1000), session_path=path
        )
        if self.fmt in ("json", "stream-json"):
            self._line(result)
            return
        if finished.text:
            self._write(self.out, finished.text + "\n")
        from keel.tools.builtin.web_search import sources

        if cited := sources(self._citations):
            # Part of the answer (also with --quiet): a cited claim without its source misleads.
            self._write(self.out, "\n" + cited + "\n")
        if finished.stop_reason == "error":
            self.say(f"keel: error: {finished.error}")
        elif finished.stop_reason != "end_turn":
            self.say(f"keel: stopped: {finished.stop_reason}")


def _summary(output: str) -> str:
    """A tool's output in one line: its first line, and how many more there are."""
    lines = [line for line in output.strip().splitlines() if line.strip()]
    if not lines:
        return ""
    more = (
        f" (+{len(lines) - 1} more line{'s' if len(lines) > 2 else ''})" if len(lines) > 1 else ""
    )
    return one_line(lines[0], 100) + more


def _to_devnull(stream: TextIO) -> None:
    """Point a stream whose reader left at /dev/null, so that nothing written later (the
    interpreter's flush at exit included) fails on it."""
    try:
        fd = stream.fileno()
    except (OSError, ValueError):
        return  # not a real file (a test's StringIO)
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, fd)
    finally:
        os.close(null)


def watch_output(loop: asyncio.AbstractEventLoop, printer: Printer) -> Callable[[], None]:
    """Notice at once when the reader of a piped stdout or stderr goes away, though nothing is
    being written (text mode writes the answer only at the end): Linux reports an error on the
    write end of a pipe whose readers have all closed it. Returns the function that stops
    watching."""
    watched: list[int] = []
    for stream in (printer.out, printer.err):
        try:
            fd = stream.fileno()
            fifo = stat.S_ISFIFO(os.fstat(fd).st_mode)
        except (OSError, ValueError):
            continue
        if not fifo or fd in watched:
            continue

        def gone(fd: int = fd, stream: TextIO = stream) -> None:
            loop.remove_reader(fd)
            watched.remove(fd)
            printer.output_closed(stream)

        try:
            loop.add_reader(fd, gone)
        except (OSError, ValueError, NotImplementedError):
            continue
        watched.append(fd)

    def stop() -> None:
        for fd in list(watched):
            loop.remove_reader(fd)
        watched.clear()

    return stop


def _first(*values: Any) -> Any:
    """The first value that was given (0 counts as given, so it can be refused)."""
    return next((v for v in values if v is not None), None)


def token_budget(*values: int | None) -> int | None:
    """The first token budget given (flag, setting, default); 0 means none."""
    first = _first(*values)
    return None if first == 0 else first


def _cwd(args: argparse.Namespace) -> Path:
    cwd = Path(args.cwd).expanduser().resolve() if args.cwd else Path.cwd()
    if not cwd.is_dir():
        raise UserError(f"--cwd {args.cwd}: no such directory")
    return cwd


def _settings(cwd: Path) -> Settings:
    settings = load_settings(cwd)
    for warning in settings.warnings:
        print(f"keel: warning: {warning}", file=sys.stderr)
    return settings


def build_agent(
    ref: ModelRef,
    *,
    cwd: Path,
    limits: Limits,
    settings: Settings,
    args: argparse.Namespace,
    printer: Printer,
    today: date | None = None,
    session_id: str | None = None,
) -> Agent:
    if args.max_retries < 0:
        raise UserError("--max-retries must be 0 or more")
    provider = make_provider(
        ref,
        settings=settings,
        retry=RetryPolicy(attempts=args.max_retries + 1),
        # The interactive UI (no -p) has someone watching: a longer default call deadline.
        unattended=getattr(args, "headless", True),
    )
    info = model_info(ref, settings.models)
    from keel.tools.builtin import builtin_tools

    gate, sandbox = build_gate(cwd, settings, args, printer)
    agent = Agent(
        provider=provider,
        model=ref.model,
        tools=builtin_tools(),
        cwd=cwd,
        limits=limits,
        info=info,
        effort=EFFORTS[args.effort] if args.effort else settings.effort,
        today=today,
        session_id=session_id,
        gate=gate,
    )
    agent.ctx.sandbox = sandbox  # the gate's (the Agent takes it from there too)
    # Commands not safe to repeat after a crash: the defaults and what settings add.
    agent.ctx.unsafe_to_repeat = (*agent.ctx.unsafe_to_repeat, *settings.unsafe_to_repeat)
    agent.ctx.extra_roots = gate.extra_roots
    agent.auto_compact = settings.auto_compact
    from keel.tools.builtin.web_search import web_search_options

    agent.web_search, why_not = web_search_options(ref, info, settings, gate)
    if why_not:
        printer(Notice(why_not, "warning"))
    agent.hooks = build_hooks(cwd, gate, printer)
    if agent.hooks is not None:
        agent.hooks.model = settings.hooks_model  # prompt hooks that name no model
    add_extensions(agent, printer)
    add_subagents(agent, printer)
    if not info.known and ref.provider != "scripted":
        printer(
            Notice(
                f"{ref.model} is not in keel's catalog; assuming a "
                f"{info.window // 1000}k window and no prices",
                "info",
            )
        )
    if limits.max_usd is not None and not info.priced and ref.provider != "scripted":
        printer(
            Notice(
                f"{ref.model} has no prices in the catalog; --max-budget-usd cannot "
                "be enforced (add prices under `models` in settings)",
                "warning",
            )
        )
    return agent


def split_rules(values: list[str]) -> list[str]:
    """`--allowed-tools "bash(npm test*),edit"` → the rules, splitting on commas outside
    parentheses (a bash pattern may contain commas)."""
    out: list[str] = []
    for value in values:
        depth, current = 0, ""
        for ch in value:
            if ch == "," and depth == 0:
                out.append(current)
                current = ""
                continue
            depth += (ch == "(") - (ch == ")")
            current += ch
        out.append(current)
    return [r.strip() for r in out if r.strip()]


def build_gate(
    cwd: Path, settings: Settings, args: argparse.Namespace, printer: Printer
) -> tuple[PermissionGate, Sandbox | None]:
    """The permission gate for a run from the command line (headless: nobody to ask, what would
    ask is denied) and the bash sandbox, if it works here: `build_permissions` with the flags'
    mode and rules; what it has to say (the sandbox status) is printed at start."""
    from keel.permissions.rules import parse_rule
    from keel.permissions.setup import build_permissions

    flags = [
        parse_rule(t, "deny", "--disallowed-tools") for t in split_rules(args.disallowed_tools)
    ]
    flags += [parse_rule(t, "allow", "--allowed-tools") for t in split_rules(args.allowed_tools)]
    gate = build_permissions(cwd, settings, mode=args.mode, extra_rules=flags, notice=printer)
    return gate, gate.sandbox


def build_hooks(cwd: Path, gate: PermissionGate, printer: Printer) -> HookRunner | None:
    """The hooks that may run here: personal ones, and the project's shared ones once approved
    (`keel hooks approve`); says what it skipped and what awaits approval."""
    from keel.config.settings import user_config_dir
    from keel.config.trust import project_key
    from keel.hooks.config import approved_pins, load_hooks
    from keel.hooks.runner import HookRunner

    user_dir = user_config_dir()
    config = load_hooks(gate.root, keel_user_dir=user_dir)
    for warning in config.warnings:
        printer(Notice(warning, "warning"))
    pins = approved_pins(user_dir, project_key(gate.root), "hooks")
    runnable = config.runnable(pins)
    waiting = len(config.hooks) - len(runnable)
    if waiting:
        printer(
            Notice(
                f"{waiting} project hook(s) are not approved and will not run; review them "
                "with `keel hooks list`, then `keel hooks approve`",
                "warning",
            )
        )
    if not runnable:
        return None
    runner = HookRunner(runnable, cwd, gate.root, dict(os.environ), mode=lambda: gate.mode)
    if runner.has("Notification"):
        running: set[asyncio.Task[None]] = set()

        async def notify(message: str) -> None:
            fields = {"message": message, "notification_type": "permission_prompt"}
            result = await runner.run("Notification", fields, match="permission_prompt")
            for error in result.errors:
                printer(Notice(error, "warning"))

        def fire(message: str) -> None:  # fire and forget: the question does not wait
            task = asyncio.get_running_loop().create_task(notify(message))
            running.add(task)
            task.add_done_callback(running.discard)

        gate.notify = fire
    if runner.has("PermissionRequest"):
        gate.permission_hook = permission_hook(runner, cwd, printer)
    return runner


def permission_hook(runner: HookRunner, cwd: Path, printer: Printer) -> PermissionHook:
    """PermissionRequest hooks, asked whenever the user would be: their `decision.behavior`
    answers for the user. An allow that rewrites the input (`updatedInput`) is not applied:
    the question goes to the user (headless: refused), never the original call allowed."""
    from keel.hooks import claude
    from keel.permissions.gate import PermissionReply

    async def decide(request: PermissionRequest) -> PermissionReply | None:
        call = request.call
        fields = {
            "tool_name": claude.tool_name(call.name),
            "tool_input": claude.tool_input(call.name, call.input or {}, cwd),
            "permission_suggestions": [],
        }
        result = await runner.run("PermissionRequest", fields, match=call.name)
        for message in result.messages:
            printer(Notice(message, "info"))
        for error in result.errors:
            printer(Notice(error, "warning"))
        if result.request_decision == "deny":
            return PermissionReply(allow=False, reason=result.request_message)
        if result.request_decision == "allow" and result.request_updated_input is not None:
            printer(
                Notice(
                    "a PermissionRequest hook allowed with an updatedInput keel does not apply "
                    "there; asking instead",
                    "warning",
                )
            )
            return None
        if result.request_decision == "allow":
            return PermissionReply(allow=True)
        return None

    return decide


def add_extensions(agent: Agent, printer: Printer) -> None:
    """Skills (indexed in the system prompt, loaded with the `skill` tool or `/name`) and custom
    slash commands, from the project's and the user's folders."""
    from keel.config.settings import user_config_dir
    from keel.skills import load_extensions, skill_tool

    skills, commands = load_extensions(agent.cwd, user_dir=user_config_dir(), home=Path.home())
    for warning in [*skills.warnings, *commands.warnings]:
        printer(Notice(warning, "warning"))
    from keel.agent.prompt import load_instructions  # imports of instruction files not followed

    loaded = load_instructions(agent.cwd, user_dir=user_config_dir(), refuse=agent.import_refusal)
    for warning in loaded.warnings:
        printer(Notice(warning, "warning"))
    agent.skills, agent.commands = skills, commands
    if skills.model_invocable():
        agent.add_tools([skill_tool(skills)])
        agent.extra_sections.append(skills.index_section())


def add_subagents(agent: Agent, printer: Printer) -> None:
    """The `task` tool, with the built-in agent types and the definitions found here."""
    from keel.agent.subagents import enable_subagents, load_agent_types
    from keel.config.settings import user_config_dir

    types = load_agent_types(agent.cwd, user_dir=user_config_dir(), home=Path.home())
    for warning in types.warnings:
        printer(Notice(warning, "warning"))
    enable_subagents(agent, types)


#: How long a run waits for MCP servers to connect before its first prompt.
MCP_WAIT = 30.0


async def connect_mcp(
    agent: Agent, settings: Settings, printer: Printer, *, interactive: bool = False
) -> None:
    """Start the project's MCP servers (the shared ones only once approved), wait for them to
    connect, and offer their tools. The agent stops the servers when it closes. `interactive`:
    someone can sign in to a server that asks for OAuth (the URL is shown as a notice)."""
    root = agent.ctx.root
    home = Path.home()
    if not settings.mcp_servers and not any(
        p.exists() for p in (root / ".mcp.json", home / ".claude.json")
    ):
        return
    from keel.config.settings import user_config_dir
    from keel.config.trust import project_key
    from keel.hooks.config import approved_pins
    from keel.mcp.config import load_servers
    from keel.session.store import keel_home

    servers, warnings = load_servers(root, settings.mcp_servers, agent.ctx.env, home=home)
    for warning in warnings:
        printer(Notice(warning, "warning"))
    if not servers:
        return
    from keel.mcp.client import McpManager

    manager = McpManager(
        servers,
        root=root,
        env=agent.ctx.env,
        log_dir=keel_home() / "mcp-logs" / project_key(root),
        approved=approved_pins(user_config_dir(), project_key(root), "mcp"),
        auth_dir=keel_home() / "mcp-auth",
    )
    agent.on_close.append(manager.aclose)
    if interactive:
        from keel.app.mcp_wiring import sign_in_opener

        manager.open_url = sign_in_opener(printer)
    manager.start()
    await manager.wait_ready(MCP_WAIT)
    waiting = []
    for server in manager.status():
        if server.state == "failed":
            printer(Notice(f"MCP server {server.name} failed: {server.detail}", "warning"))
        elif server.state == "connecting":
            printer(
                Notice(
                    f"MCP server {server.name} did not connect within {MCP_WAIT:g} s; its tools "
                    "are not offered in this run",
                    "warning",
                )
            )
        elif server.state == "needs approval":
            waiting.append(server.name)
    if waiting:
        printer(
            Notice(
                f"project MCP server(s) {', '.join(waiting)} are not approved and were not "
                "started; review them with `keel mcp list`, then `keel mcp approve`",
                "warning",
            )
        )
    from keel.app.mcp_wiring import wire

    wire(agent, manager, sampling=settings.mcp_sampling)
    agent.add_tools(manager.tools())


def _printer(args: argparse.Namespace) -> Printer:
    return Printer(args.output_format, quiet=args.quiet, out=sys.stdout, err=sys.stderr)


def run_headless(args: argparse.Namespace) -> int:
    cwd = _cwd(args)
    if args.resume or args.continue_session:
        from keel.session.index import find_session, latest_session

        path = find_session(args.resume, cwd) if args.resume else latest_session(cwd)
        return run_resume(path, read_prompt(args.prompt_words, sys.stdin, required=False), args)
    prompt = read_prompt(args.prompt_words, sys.stdin)
    settings = _settings(cwd)
    ref = choose_model(args.model, settings)
    limits = Limits(
        max_turns=_first(args.max_turns, settings.max_turns, DEFAULT_MAX_TURNS),
        # Nobody watches a headless run: it has a token budget unless told otherwise.
        max_tokens=token_budget(
            args.max_tokens_budget, settings.budget_tokens, DEFAULT_UNATTENDED_TOKENS
        ),
        max_usd=_first(args.max_budget_usd, settings.budget_usd),
    )
    printer = _printer(args)

    async def fresh() -> int:
        agent = build_agent(
            ref, cwd=cwd, limits=limits, settings=settings, args=args, printer=printer
        )
        try:
            await connect_mcp(agent, settings, printer)
            if not args.no_session:
                from keel.session.store import SessionLog

                agent.session = SessionLog.create(
                    cwd=cwd,
                    model=str(ref),
                    fingerprint=agent.fingerprint(),
                    session_id=agent.session_id,
                )
        except BaseException:
            await agent.aclose()
            raise
        return await _run(agent, [prompt], printer, str(ref), wait=not args.no_wait)

    return asyncio.run(fresh())


async def open_session(
    path: Path, args: argparse.Namespace, printer: Printer
) -> tuple[Agent, SessionState, Journal, ModelRef]:
    """Lock the session in `path`, rebuild it, and build an agent that continues it (the resume
    gate checked). The caller closes the journal (the agent's `aclose` does)."""
    from keel.session.fold import FoldError, fold
    from keel.session.journal import Journal
    from keel.session.resume import check_resume, left_running, reap
    from keel.session.store import SessionLog

    journal, loaded = Journal.open(path)  # locks: one writer per session
    agent: Agent | None = None
    try:
        try:
            state = fold(loaded.records)
        except FoldError as exc:
            raise UserError(f"{path}: {exc}", hint="the file was left untouched") from exc
        meta = state.meta
        cwd = Path(meta.cwd)
        if not cwd.is_dir():
            raise UserError(f"session {meta.id} worked in {cwd}, which no longer exists")
        settings = _settings(cwd)
        ref = parse_model(args.model or meta.model)
        stored = meta.fingerprint
        limits = Limits(
            max_turns=_first(
                args.max_turns, stored.max_turns if stored else None, DEFAULT_MAX_TURNS
            ),
            max_tokens=token_budget(args.max_tokens_budget, stored.max_tokens if stored else None),
            max_usd=_first(args.max_budget_usd, stored.max_usd if stored else None),
        )
        agent = build_agent(
            ref,
            cwd=cwd,
            limits=limits,
            settings=settings,
            args=args,
            printer=printer,
            today=date.fromisoformat(state.created[:10]) if state.created else None,
            session_id=meta.id,
        )
        await connect_mcp(agent, settings, printer)
        for change in check_resume(state, agent.fingerprint(), force=args.force):
            printer(Notice(f"resuming despite a changed configuration: {change}", "warning"))
        agent.restore(state)
        resolve_unknown(agent, state, args)
        agent.session = SessionLog(journal, meta.id)
        # Every check passed: only now is anything written (the torn tail cut, kept beside).
        saved = journal.repair()
    except BaseException:
        journal.close()
        if agent is not None:
            await agent.aclose()
        raise
    if saved is not None:
        printer(
            Notice(
                f"cut {loaded.repaired_bytes} bytes of a torn last record (a crash mid-write); "
                f"they are kept in {saved}"
            )
        )
    for reaped in reap(left_running(path, state.processes)):  # before anything runs again
        printer(
            Notice(
                f"stopped what the killed run left running for call {reaped.tool_use_id}: "
                f"process group {reaped.pgid} (pids {', '.join(map(str, reaped.pids))})",
                "warning",
            )
        )
    return agent, state, journal, ref


def resolve_unknown(agent: Agent, state: SessionState, args: argparse.Namespace) -> None:
    """Apply `keel resume --rerun/--skip CALL_ID` to the calls of unknown outcome."""
    unknown = [r.tool_use_id for r in state.unknown_outcome]
    for flag in ("rerun", "skip"):
        for call_id in getattr(args, flag, None) or ():
            if call_id not in unknown:
                raise UserError(
                    f"--{flag} {call_id}: not a call of session {state.meta.id} whose outcome is "
                    f"unknown (those are: {', '.join(unknown) or 'none'})",
                    hint="the message of the run that stopped names the call ids",
                )
            agent.resolve_unknown(call_id, "rerun" if flag == "rerun" else "skip")


def run_resume(path: Path, prompt: str, args: argparse.Namespace) -> int:
    """Continue the session in `path`: finish what it left undone, then run `prompt` if given."""
    printer = _printer(args)

    async def resume() -> int:
        agent, state, _journal, ref = await open_session(path, args, printer)
        meta = state.meta
        for note in state.undo_notes:  # a `keel undo` the model was not told of yet
            agent.add_note(note)
        steps: list[str | None] = [None] if agent.resumable else []
        if prompt:
            steps.append(prompt)
        if not steps:
            await agent.aclose()
            raise UserError(
                f"session {meta.id} has nothing left to resume: its last turn "
                f"{'completed' if state.terminal else 'ended'}",
                hint=f'continue it with a prompt: keel -p --resume {meta.id} "…"',
            )
        return await _run(agent, steps, printer, str(ref), wait=not getattr(args, "no_wait", False))

    return asyncio.run(resume())


def run_compact(path: Path, instructions: str, args: argparse.Namespace) -> int:
    """`keel compact ID`: summarize a stopped session's conversation now."""
    printer = _printer(args)

    async def compact() -> tuple[Agent, CompactionRecord]:
        agent, _state, _journal, _ref = await open_session(path, args, printer)
        try:
            return agent, await agent.compact(instructions, printer)
        finally:
            await agent.aclose()

    agent, record = asyncio.run(compact())
    if args.output_format == "text":
        print(
            f"compacted session {agent.session_id}: ~{record.tokens_before:,} tokens → "
            f"~{record.tokens_after:,} (cost ${record.cost:.4f})"
        )
    else:
        print(
            json.dumps(
                {
                    "type": "compacted",
                    "session_id": agent.session_id,
                    "tokens_before": record.tokens_before,
                    "tokens_after": record.tokens_after,
                    "cost_usd": round(record.cost, 6),
                }
            )
        )
    return cli.EXIT_OK


def _together(before: RunResult | None, after: RunResult) -> RunResult:
    """The outcome of this invocation so far: the last run's answer, every run's spend."""
    if before is None:
        return after
    return dataclasses.replace(
        after,
        usage=before.usage + after.usage,
        cost=before.cost + after.cost,
        turns=before.turns + after.turns,
    )


class _Stopper:
    """What stops a headless run from outside: SIGINT/SIGTERM (the first suspends at the next
    safe point, or, while waiting for background tasks, stops them; a second aborts at once),
    and the reader of its output going away (a closed pipe, or SIGPIPE: interrupted at once,
    recorded as "output closed")."""

    def __init__(self, agent: Agent, printer: Printer) -> None:
        self.agent = agent
        self.printer = printer
        self.signals = 0
        #: Waiting for background tasks should end.
        self.stopping = False
        self._loop = asyncio.get_running_loop()
        self._unwatch: Callable[[], None] = lambda: None

    def __enter__(self) -> _Stopper:
        self.printer.on_closed = self.output_closed
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._loop.add_signal_handler(sig, self.on_signal)
        self._loop.add_signal_handler(signal.SIGPIPE, self.printer.output_closed)
        self._unwatch = watch_output(self._loop, self.printer)
        return self

    def __exit__(self, *_exc: object) -> None:
        self._unwatch()
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE):
            self._loop.remove_signal_handler(sig)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # Python's own: a closed pipe raises
        self.printer.on_closed = None

    def on_signal(self) -> None:
        agent, printer = self.agent, self.printer
        self.signals += 1
        if not agent.busy:  # waiting for background tasks
            self.stopping = True
            printer(Notice("stopping the background tasks", "warning"))
            agent.background.stop_all()
        elif self.signals == 1 and agent.session is not None:
            printer(
                Notice("suspending at the next safe point (signal again to abort now)", "warning")
            )
            agent.request_suspend()
        else:
            agent.interrupt()

    def output_closed(self) -> None:
        self.stopping = True
        if self.agent.busy:
            self.agent.interrupt("output closed")
        else:
            self.agent.background.stop_all()


async def _run(
    agent: Agent, steps: list[str | None], printer: Printer, model: str, *, wait: bool = True
) -> int:
    """Run each step (a prompt, or None to resume) until one does not end normally; then, with
    `wait`, wait for background tasks and let the model see their results (`_Stopper` says how
    signals and a closed output stop it)."""
    start = time.monotonic()
    if printer.reader_gone():  # it left while the run was being set up: run nothing
        await agent.aclose()
        return cli.EXIT_OUTPUT_CLOSED
    try:
        with _Stopper(agent, printer) as stopper:
            result = None
            for step in steps:
                ran = await (agent.resume(printer) if step is None else agent.run(step, printer))
                result = _together(result, ran)
                if result.stop_reason != "end_turn":
                    break
            else:
                while wait and not stopper.stopping and agent.background.pending:
                    await agent.background.wait()
                    delivered = None if stopper.stopping else await agent.run_notifications(printer)
                    if delivered is None:
                        break
                    result = _together(result, delivered)
                    if result.stop_reason != "end_turn":
                        break
            assert result is not None  # steps is never empty
            if running := agent.background.running():
                printer(Notice(f"stopping {len(running)} background task(s) still running", "info"))
    finally:
        path = str(agent.session.path) if agent.session else None
        await agent.aclose()
    if not printer.reader_gone():
        printer.finish(result, model=model, seconds=time.monotonic() - start, path=path)
    if printer.reader_gone():  # it left before or while the answer was printed
        return cli.EXIT_OUTPUT_CLOSED
    if result.stop_reason == "suspended":
        printer.say(f"keel: suspended; resume with: keel resume {result.session_id}")
    return EXIT_CODES[result.stop_reason]
