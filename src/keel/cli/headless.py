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
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from keel.agent.events import (
    AssistantMessage,
    AutoDecision,
    BackgroundFinished,
    Event,
    SubagentEvent,
    ToolFinished,
    ToolStarted,
    TurnStarted,
    TurnStop,
)
from keel.agent.loop import Agent, RunResult
from keel.app import (
    Options,
    choose_model,
    open_agent,
    open_session,
    resume_agent,
    resume_from_store,
)
from keel.app.jsonout import event_json, result_json
from keel.cli import main as cli
from keel.config.settings import Settings, load_settings
from keel.errors import UserError
from keel.llm.events import Notice
from keel.llm.messages import Citation, ToolUse
from keel.tui.format import auto_decision_text, duration, key_argument, one_line

if TYPE_CHECKING:
    from keel.session.records import CompactionRecord

EXIT_CODES: dict[TurnStop, int] = {
    "end_turn": cli.EXIT_OK,
    "error": cli.EXIT_ERROR,
    "budget": cli.EXIT_LIMIT,
    "max_turns": cli.EXIT_LIMIT,
    "loop": cli.EXIT_LIMIT,
    "max_tokens": cli.EXIT_INCOMPLETE,
    "refusal": cli.EXIT_INCOMPLETE,
    "empty_response": cli.EXIT_INCOMPLETE,
    "context_full": cli.EXIT_INCOMPLETE,
    "unrun_tool_call": cli.EXIT_INCOMPLETE,
    "blocked": cli.EXIT_BLOCKED,
    "hook_stopped": cli.EXIT_BLOCKED,
    "suspended": cli.EXIT_SUSPENDED,
    "unknown_outcome": cli.EXIT_UNKNOWN_OUTCOME,
    "interrupted": cli.EXIT_INTERRUPTED,
}


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
            case AutoDecision(call, decision, reason):
                text, warns = auto_decision_text(call, decision, reason)
                if warns or not self.quiet:
                    self.say(f"keel: {text}")
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

    def line(self, obj: dict[str, Any]) -> None:
        """One JSON object on stdout (stream-json lines of keel's own)."""
        self._line(obj)

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


def _printer(args: argparse.Namespace) -> Printer:
    return Printer(args.output_format, quiet=args.quiet, out=sys.stdout, err=sys.stderr)


def run_headless(args: argparse.Namespace) -> int:
    cwd = _cwd(args)
    _check_data_folder(args)
    if args.resume or args.continue_session:
        prompt_text = read_prompt(args.prompt_words, sys.stdin, required=False)
        return run_resume(resume_target(args.resume, cwd), prompt_text, args)
    streaming = getattr(args, "input_format", "text") == "stream-json"
    if streaming:
        from keel.cli.streaminput import check_formats

        check_formats(args)
    # With stream-json input, stdin carries the prompts: the words are only the first one.
    prompt = (
        " ".join(args.prompt_words).strip()
        if streaming
        else read_prompt(args.prompt_words, sys.stdin)
    )
    settings = _settings(cwd)
    options = Options.from_args(args, cwd=cwd)
    ref = choose_model(args.model, settings)
    printer = _printer(args)

    async def fresh() -> int:
        agent = await open_agent(options, printer, settings=settings, ref=ref)
        if streaming:
            return await _drive(agent, printer, str(ref), prompt)
        return await _run(agent, [prompt], printer, str(ref), wait=not args.no_wait)

    return asyncio.run(fresh())


def _check_data_folder(args: argparse.Namespace) -> None:
    """A data folder keel cannot use is one line now, before any model request (sessions in
    JetStream, `KEEL_STORE=nats://…`, write no session file)."""
    from keel.app.stores import jetstream_url
    from keel.cli.datafolder import check_data_folder

    check_data_folder(writing=not args.no_session and not jetstream_url())


def _options(args: argparse.Namespace) -> Options:
    """A resumed session's options: the flags given (its cwd comes from the session)."""
    return Options.from_args(args, cwd=Path.cwd())


def resume_target(session: str | None, cwd: Path) -> Path | str:
    """What `--resume ID` / `--continue` names: a session file, or (with `KEEL_STORE=nats://…`)
    the id of a session in JetStream."""
    from keel.app.stores import jetstream_url

    if url := jetstream_url():
        if session:
            return session
        from keel.app.stores import open_jetstream

        store = open_jetstream(url)
        try:
            mine = store.summaries(cwd)
        finally:
            store.close()
        if not mine:
            raise UserError(
                f"no sessions for {cwd} in {url}",
                hint='start one with keel -p "…" in this directory',
            )
        return mine[0].id
    from keel.session.index import find_session, latest_session

    return find_session(session, cwd) if session else latest_session(cwd)


def run_resume(path: Path | str, prompt: str, args: argparse.Namespace) -> int:
    """Continue the session in `path` (a session id: in the JetStream store): finish what it left
    undone, then run `prompt` if given."""
    printer = _printer(args)

    async def resume() -> int:
        if isinstance(path, str):
            opened = await resume_from_store(path, _options(args), printer)
        else:
            opened = await resume_agent(path, _options(args), printer)  # with `keel undo` notes
        agent, state, ref = opened.agent, opened.state, opened.ref
        meta = state.meta
        # With a new prompt, an unfinished turn is not asked of the model again on its own: its
        # unanswered calls are settled (a resume step), and the new prompt joins what the model
        # has not seen yet, in one request.
        steps: list[str | None] = [None] if agent.resumable and not prompt else []
        if prompt:
            steps += [None, prompt] if agent.unanswered_calls else [prompt]
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
        agent, _state, _journal, _ref = await open_session(path, _options(args), printer)
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


async def _drive(agent: Agent, printer: Printer, model: str, first: str) -> int:
    """`--input-format stream-json`: prompts and answers from stdin until it ends."""
    from keel.cli.streaminput import drive

    try:
        with _Stopper(agent, printer):
            result = await drive(agent, printer, model, first)
    finally:
        await agent.aclose()
    if printer.reader_gone():
        return cli.EXIT_OUTPUT_CLOSED
    return cli.EXIT_OK if result is None else EXIT_CODES[result.stop_reason]


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
            for i, step in enumerate(steps):
                ran = await (agent.resume(printer) if step is None else agent.run(step, printer))
                result = _together(result, ran)
                if step is None and ran.stop_reason == "error" and i + 1 < len(steps):
                    # The new prompt is still sent (and journaled): never dropped unsaid.
                    printer(Notice("the unfinished turn failed; sending the new prompt", "warning"))
                    continue
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
    elif result.stop_reason == "budget":
        printer.say(budget_hint(agent, result.session_id if path else None))
    return EXIT_CODES[result.stop_reason]


def budget_hint(agent: Agent, session_id: str | None) -> str:
    """What to do after a `budget` stop: the flag that raises the budget that was reached, and the
    command that continues this session with a higher one (`session_id`: None without a session
    file)."""
    limits, spend, refused = agent.limits, agent.spend, agent.over_budget
    tokens = refused.cap == "tokens" if refused is not None else None
    if limits.max_tokens is not None and (tokens or spend.usage.total >= limits.max_tokens):
        flag, value = "--max-tokens-budget", str(max(2 * limits.max_tokens, spend.usage.total))
        raised = f"{flag} N (or budget.tokens in settings; 0 for none)"
    else:
        cap = limits.max_usd or 0.0
        flag, value = "--max-budget-usd", f"{max(2 * cap, spend.cost):g}"
        raised = f"{flag} X (or budget.usd in settings)"
    if session_id is None:
        return f"keel: the run stopped at its budget; raise it with {raised}"
    return (
        f"keel: the session stopped at its budget; raise it with {raised}, and continue this "
        f"session with: keel resume {session_id} {flag} {value}"
    )
