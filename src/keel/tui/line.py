"""The line mode (`keel --no-tui`, or when stdout is not a terminal): the same session as the
terminal UI, printed line by line with rich, with prompts, permission questions and picks read
from stdin. A line ending in `\\` continues on the next one. Ctrl+C interrupts a running prompt;
at the prompt, Ctrl+D (end of input) or `/exit` quits. Lines are as wide as the terminal
(`COLUMNS`, else the terminal on stdout, stderr or stdin) and never padded to it. A `statusLine`
command runs before each prompt is read, and its line is printed when it changed.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from rich.console import Console, RenderableType
from rich.markdown import Markdown
from rich.text import Text

from keel.agent.events import (
    AssistantMessage,
    AutoDecision,
    BackgroundFinished,
    QuestionRequest,
    RequestStarted,
    SubagentEvent,
    ToolFinished,
    ToolStarted,
    TurnFinished,
)
from keel.agent.timing import thought_seconds
from keel.llm.events import Notice, TextDelta, ThinkingDelta
from keel.llm.messages import Text as TextBlock
from keel.llm.messages import Thinking, ToolUse
from keel.permissions.gate import PermissionReply, PermissionRequest
from keel.safetext import terminal_safe
from keel.tui.control import Controller, Driver, finished_text
from keel.tui.format import (
    auto_decision_text,
    call_preview,
    context_meter,
    cost,
    diff_line_kind,
    duration,
    key_argument,
    kind_label,
    one_line,
)
from keel.tui.view import Choice, Output, PromptSubmitted, ShellRan, ViewEvent

DIFF_STYLES = {"add": "green", "remove": "red", "hunk": "cyan", "header": "bold", "context": ""}
#: Lines of a diff or an output shown in line mode.
MAX_SHOWN = 40


def terminal_width() -> int:
    """The width to print at: `COLUMNS`, else the terminal's (whichever of stdout, stderr and
    stdin is one: stdout may be a pipe), else `shutil`'s fallback of 80."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    for stream in (sys.stdout, sys.stderr, sys.stdin):
        try:
            width = os.get_terminal_size(stream.fileno()).columns
        except (AttributeError, ValueError, OSError):  # not a terminal (or no file at all)
            continue
        if width > 0:
            return width
    return shutil.get_terminal_size().columns


class LineReader:
    """Lines from a text stream, read on a daemon thread (so a blocked read never keeps the
    process from exiting) and handed to the event loop. None means end of input."""

    def __init__(self, stream: TextIO, loop: asyncio.AbstractEventLoop) -> None:
        self._queue: asyncio.Queue[str | None] = asyncio.Queue()
        self._loop = loop
        self._stream = stream
        self._closed = False
        threading.Thread(target=self._pump, daemon=True, name="keel-stdin").start()

    def _pump(self) -> None:
        while True:
            line = self._stream.readline()
            if not line:
                self._loop.call_soon_threadsafe(self._queue.put_nowait, None)
                return
            self._loop.call_soon_threadsafe(self._queue.put_nowait, line.rstrip("\n"))

    def close(self) -> None:
        """Wake a waiting `readline` with end of input."""
        self._closed = True
        self._queue.put_nowait(None)

    async def readline(self) -> str | None:
        if self._closed:
            return None
        line = await self._queue.get()
        if line is None:
            self._closed = True
        return line


def parse_answer(line: str, *, plan: bool) -> PermissionReply | None:
    """A typed answer to a permission question (None: not an answer, ask again).

    Permission: `y` once, `s` this session, `a` always, `n [reason]`. Plan: `a` yes and accept
    edits, `y` yes and ask before edits, `n [feedback]` keep planning."""
    word, _, rest = line.strip().partition(" ")
    word = word.lower().rstrip(":,")
    reason = rest.strip()
    if word in ("n", "no", "d", "deny"):
        return PermissionReply(False, reason=reason)
    if plan:
        if word in ("a", "accept"):
            return PermissionReply(True, mode="accept-edits")
        if word in ("y", "yes"):
            return PermissionReply(True, mode="default")
        return None
    scopes = {"y": "once", "yes": "once", "s": "session", "a": "always", "always": "always"}
    scope = scopes.get(word)
    if scope == "once":
        return PermissionReply(True, "once")
    if scope == "session":
        return PermissionReply(True, "session")
    if scope == "always":
        return PermissionReply(True, "always")
    return None


class LineFrontEnd:
    """Renders view events as lines; asks questions on stdin."""

    def __init__(
        self,
        controller: Driver,
        console: Console,
        reader: LineReader,
        *,
        echo: bool,
        width: Callable[[], int] | None = None,
    ) -> None:
        self.controller = controller
        self.console = console
        self.reader = reader
        #: Where the width to print at comes from (None: the console's own).
        self._width = width
        #: Print prompts as they are sent (stdin is not a terminal that already shows them).
        self.echo = echo
        self.exited = False
        self._mid_line = False  # streamed text left the cursor inside a line
        self._streaming: str = ""  # "text" or "thinking" while deltas arrive
        #: When each running call started (monotonic): a cut-off call reports no duration.
        self._started: dict[str, float] = {}
        #: When the model request now streaming was sent (monotonic), and whether the time it
        #: thought was printed already (before its reply).
        self._request_at: float | None = None
        self._thought_shown = False

    # -- FrontEnd ------------------------------------------------------------------------------

    def show(self, event: ViewEvent) -> None:
        if isinstance(event, TextDelta):
            self._delta(event.text, "text", "")
            return
        if isinstance(event, ThinkingDelta):
            if event.text:  # (thinking it does not show streams nothing)
                self._delta(event.text, "thinking", "dim italic")
            return
        if isinstance(event, RequestStarted):
            self._request_at, self._thought_shown = time.monotonic(), False
            return
        self._end_line()
        if self._width is not None:
            self.console.width = self._width()  # the terminal may have been resized
        handler = self._handlers.get(type(event))
        if handler is not None:
            handler(event)

    @property
    def _handlers(self) -> dict[type, Callable[[Any], None]]:
        return {
            AssistantMessage: self._assistant,
            ToolStarted: self._tool_started,
            ToolFinished: self._tool_finished,
            Notice: self._notice,
            TurnFinished: self._turn_finished,
            PromptSubmitted: self._prompt,
            ShellRan: self._shell,
            Output: self._output,
            SubagentEvent: self._subagent,
            BackgroundFinished: self._background,
            QuestionRequest: self._question,
            AutoDecision: self._auto_decision,
        }

    def _question(self, event: QuestionRequest) -> None:
        # The line UI shows no forms: the server hears why, nothing waits.
        self.console.print(Text(f"⚠ MCP server {event.source} asked: {event.message}", "yellow"))
        if not event.reply.done():
            event.reply.set_result("keel's line UI cannot show a form; use the full UI to answer")

    def _subagent(self, event: SubagentEvent) -> None:
        inner = event.event
        if isinstance(inner, ToolStarted):
            prefix = f"  ↳ [{event.agent}] {inner.call.name} "
            argument = key_argument(inner.call, self._room(prefix))
            line = f"{prefix}{argument}".rstrip()
            self.console.print(Text(line, style="dim"))
        elif isinstance(inner, Notice) and inner.level == "warning":
            self.console.print(Text(f"⚠ [{event.agent}] {inner.text}", style="yellow"))

    def _background(self, event: BackgroundFinished) -> None:
        line = f"· {event.task_id} ({event.kind}) {event.status}: {event.description}"
        self.console.print(Text(line, style="dim"))

    def _assistant(self, event: AssistantMessage) -> None:
        """The stored message (replayed from a session file: nothing streamed, so it is printed
        whole). How long the model thought goes before its reply, and only when it thought:
        for a model that did not, that time is its reading of the prompt."""
        shown = bool(self._streaming)
        self._streaming = ""
        blocks = event.message.blocks
        thinks = any(isinstance(b, Thinking) for b in blocks)
        thought = thought_seconds(event.timing) if thinks and not self._thought_shown else None
        self._request_at, self._thought_shown = None, False
        if not shown:
            for block in blocks:
                if isinstance(block, Thinking) and block.text:
                    self.console.print(Text(f"✻ {block.text}", style="dim italic"))
                elif isinstance(block, TextBlock) and block.text:
                    if thought is not None:
                        self._thought(thought)
                        thought = None
                    self._markdown(Markdown(block.text))
        from keel.tools.builtin.web_search import sources

        if cited := sources(event.message.citations):  # the provider's web search
            self.console.print(Text(cited, style="dim"))
        if thought is not None:
            # Thinking the model did not show (no deltas came) is known only now, after the
            # text; or the message has no text (its tool calls come next).
            self._thought(thought)

    def _thought(self, seconds: int) -> None:
        self.console.print(Text(f"✻ thought for {seconds}s", style="dim"))

    def _tool_started(self, event: ToolStarted) -> None:
        self._started[event.call.id] = time.monotonic()
        self._tool_line(event.call.name, event.call, event.kind)

    def _tool_finished(self, event: ToolFinished) -> None:
        call, result = event.call, event.result
        started = self._started.pop(call.id, None)
        if started is None:
            self._tool_line(call.name, call, event.kind)
        seconds = event.seconds
        if seconds <= 0 and started is not None:
            seconds = time.monotonic() - started  # interrupted: it ran until now
        self._tool_result(call.name, result.text, result.is_error, seconds, event.display)

    def _auto_decision(self, event: AutoDecision) -> None:
        text, warns = auto_decision_text(event.call, event.decision, event.reason)
        self._notice(Notice(text, "warning" if warns else "info"))

    def _notice(self, event: Notice) -> None:
        warning = event.level == "warning"
        text = f"{'⚠' if warning else '·'} {event.text}"
        self.console.print(Text(text, style="yellow" if warning else "dim"))

    def _turn_finished(self, event: TurnFinished) -> None:
        line = finished_text(event)
        if line:
            self.console.print(Text(f"⏹ {line}", style="yellow"))
        self._footer()

    def _prompt(self, event: PromptSubmitted) -> None:
        if self.echo:
            self.console.print(Text(f"› {event.text}", style="bold"))
        if event.attachments:
            self.console.print(Text(f"  attached: {', '.join(event.attachments)}", style="dim"))

    def _shell(self, event: ShellRan) -> None:
        self.console.print(Text(f"$ {event.command}", style="bold"))
        self._lines(event.output.splitlines(), "")
        self.console.print(
            Text(f"[exit {event.exit_code}, {duration(event.seconds)}]", style="dim")
        )

    def _output(self, event: Output) -> None:
        if event.kind == "error":
            self.console.print(Text(f"error: {event.text}", style="red"))
        elif event.kind == "text":
            self.console.print(Text(event.text))
        else:
            self._markdown(Markdown(event.text))

    def reset(self, events: Sequence[ViewEvent]) -> None:
        self._end_line()
        if not events:
            return
        echo, self.echo = self.echo, True
        try:
            for event in events:
                self.show(event)
        finally:
            self.echo = echo

    def refresh_status(self) -> None:
        return None

    def set_input(self, text: str) -> None:
        self.console.print(
            Text(f"the prompt you rewound past (send it again to rerun it):\n{text}", style="dim")
        )

    def exit(self) -> None:
        self.exited = True
        self.reader.close()

    async def ask(self, request: PermissionRequest) -> PermissionReply:
        self._end_line()
        plan = bool(request.plan)
        call = request.call
        if plan:
            self.console.print(Text("? The plan (approve it to leave plan mode):", style="bold"))
            self._markdown(Markdown(request.plan))
            options = "[a] yes, and accept edits  [y] yes, ask before each edit  [n] no, keep planning (n FEEDBACK)"
        else:
            start = f"? Allow {call.name} "
            argument = key_argument(call, self._room(start, len(request.reason) + 4))
            head = f"{start}{argument}".rstrip()
            self.console.print(Text(f"{head}  ({request.reason})", style="bold"))
            self._preview(call_preview(call, MAX_SHOWN))
            always = "" if request.confirm else f"[a] always allow {request.suggestion}  "
            options = (
                f"[y] yes  [s] yes, for this session  {always}[n] no (n REASON: tell the model why)"
            )
        self.console.print(Text(f"  {options}", style="cyan"))
        while True:
            line = await self.reader.readline()
            if line is None:
                return PermissionReply(False, reason="no answer: the input ended")
            reply = parse_answer(line, plan=plan)
            if reply is not None:
                return reply
            self.console.print(
                Text(
                    "  answer y, s, a or n (n REASON)"
                    if not plan
                    else "  answer a, y or n (n FEEDBACK)",
                    style="yellow",
                )
            )

    async def pick(self, title: str, choices: Sequence[Choice]) -> str | None:
        self._end_line()
        self.console.print(Text(title, style="bold"))
        for i, choice in enumerate(choices, start=1):
            detail = f"  {choice.detail}" if choice.detail else ""
            self.console.print(Text(f"  {i:>2}. {choice.label}") + Text(detail, style="dim"))
        self.console.print(Text("  number, or Enter to cancel", style="cyan"))
        line = await self.reader.readline()
        if line is None or not line.strip():
            return None
        if line.strip().isdigit() and 1 <= int(line) <= len(choices):
            return choices[int(line) - 1].value
        self.console.print(
            Text(f"  {line.strip()!r} is not one of the numbers; cancelled", style="yellow")
        )
        return None

    # -- printing ------------------------------------------------------------------------------

    def _delta(self, text: str, kind: str, style: str) -> None:
        if self._streaming != kind:
            self._end_line()
            if kind == "text" and self._streaming == "thinking" and self._request_at is not None:
                # The reply begins: how long the model thought goes above it.
                seconds = time.monotonic() - self._request_at
                if seconds >= 1:
                    self._thought(round(seconds))
                self._thought_shown = True
            self._streaming = kind
            if kind == "thinking":
                self.console.print(Text("✻ ", style=style), end="")
                self._mid_line = True
        self.console.print(Text(text, style=style), end="")
        if text:
            self._mid_line = not text.endswith("\n")

    def _end_line(self) -> None:
        if self._mid_line:
            self.console.print()
            self._mid_line = False

    def _room(self, prefix: str, reserved: int = 0) -> int:
        """Characters left on a line after `prefix` (and `reserved` more), never below 20."""
        return max(20, self.console.width - len(prefix) - reserved)

    def _markdown(self, markdown: RenderableType) -> None:
        """Markdown as wide as the terminal, each line without the blanks rich pads it with."""
        console = self.console
        for line in console.render_lines(markdown, console.options, pad=False):
            text = Text()
            for segment in line:
                if not segment.control:
                    text.append(segment.text, segment.style)
            text.rstrip()
            console.print(text, soft_wrap=True)

    def _tool_line(self, name: str, call: ToolUse, kind: str = "") -> None:
        label, shown = kind_label(kind, name)
        argument = key_argument(call, self._room(f"⏺ {label + ' · ' if label else ''}{shown} "))
        self.console.print(
            Text("⏺ ", style="cyan")
            + Text(f"{label} · " if label else "", style="dim")
            + Text(shown, style="bold")
            + Text(f" {argument}" if argument else "")
        )

    def _tool_result(
        self, name: str, text: str, is_error: bool, seconds: float, display: str | None
    ) -> None:
        mark = Text("  └ ✗ " if is_error else "  └ ✓ ", style="red" if is_error else "green")
        took = f"{duration(seconds)}  "
        first = text.strip().splitlines()[0] if text.strip() else ""
        first = one_line(first, self._room(mark.plain + took))
        self.console.print(mark + Text(took, style="dim") + Text(first))
        if display and name == "todo_write":
            self._todos(display)
        elif display:
            self._preview(display)

    def _preview(self, diff: str) -> None:
        self._lines(diff.splitlines(), "diff")

    def _lines(self, lines: list[str], kind: str) -> None:
        shown = lines[:MAX_SHOWN]
        for line in shown:
            style = DIFF_STYLES[diff_line_kind(line)] if kind == "diff" else ""
            self.console.print(Text(f"    {line}", style=style))
        if len(lines) > MAX_SHOWN:
            self.console.print(Text(f"    … {len(lines) - MAX_SHOWN} more lines", style="dim"))

    def _todos(self, display: str) -> None:
        try:
            todos = json.loads(display)
        except ValueError:
            return
        marks = {"completed": "☒", "in_progress": "◐", "pending": "☐"}
        for todo in todos:
            status = todo.get("status", "pending")
            style = (
                "dim strike" if status == "completed" else "bold" if status == "in_progress" else ""
            )
            self.console.print(
                Text(f"    {marks.get(status, '☐')} {todo.get('content', '')}", style=style)
            )

    def _footer(self) -> None:
        status = self.controller.status()
        meter, level = context_meter(status.context, status.window)
        style = {"ok": "dim", "warn": "yellow", "high": "red"}[level]
        self.console.print(
            Text(f"  {status.model} · {status.mode} · ", style="dim")
            + Text(meter, style=style)
            + Text(f" · {cost(status.cost)}", style="dim")
        )


class StatusLinePrinter:
    """Claude Code's `statusLine` in line mode: the command runs before each prompt is read,
    fed what the terminal UI feeds it (keel.tui.statusline), and its line is printed when it
    differs from the one printed last (a failed run prints nothing)."""

    def __init__(self, controller: Driver, console: Console) -> None:
        self.controller = controller
        self.console = console
        # An attached session (`keel attach`) runs no statusLine command of this machine's.
        self.config = (
            controller.factory.settings.status_line if isinstance(controller, Controller) else None
        )
        self._started = time.monotonic()
        self._shown = ""

    async def print(self) -> None:
        if self.config is None:
            return
        from keel.tui.statusline import payload, run_once

        assert isinstance(self.controller, Controller)
        agent = self.controller.agent
        data = payload(agent, context=self.controller.context, started=self._started)
        line = await run_once(self.config, data, cwd=str(agent.cwd), env=dict(os.environ))
        if line is None:  # it ran out of time: the line printed last still stands
            return
        if line and line != self._shown:
            self.console.print(Text(" " * self.config.padding) + Text.from_ansi(line))
        self._shown = line


class SafeConsole(Console):
    """A Console that shows the control characters in what it is given as visible stand-ins
    (`keel.safetext`): the text is a model's, a tool's, a file name or a server's, and an escape
    sequence in it would otherwise reach the terminal as it is (rich drops only a few). Its own
    styles are added after, so they still colour the line."""

    def print(self, *objects: Any, **options: Any) -> None:
        super().print(*map(_terminal_safe, objects), **options)


def _terminal_safe(shown: Any) -> Any:
    if isinstance(shown, Text):
        safe = shown.copy()
        safe.plain = terminal_safe(shown.plain)  # the same length: the styles' spans still fit
        return safe
    return terminal_safe(shown) if isinstance(shown, str) else shown


async def run_line(controller: Driver, *, prompt: str = "", stdin: TextIO | None = None) -> int:
    """Drive `controller` from stdin until it ends or the user quits; returns the exit code."""
    stdin = stdin or sys.stdin
    loop = asyncio.get_running_loop()
    reader = LineReader(stdin, loop)
    console = SafeConsole(highlight=False, soft_wrap=True, width=terminal_width())
    ui = LineFrontEnd(controller, console, reader, echo=not stdin.isatty(), width=terminal_width)
    controller.attach(ui)
    last_sigint = 0.0

    def on_sigint() -> None:
        nonlocal last_sigint
        if controller.ctrl_c_stops and controller.interrupt():
            return
        now = time.monotonic()
        if now - last_sigint < 2.0:
            ui.exit()
        else:
            ui._end_line()
            console.print(Text("(Ctrl+C again, Ctrl+D or /exit quits)", style="dim"))
        last_sigint = now

    loop.add_signal_handler(signal.SIGINT, on_sigint)
    status_line = StatusLinePrinter(controller, console)
    try:
        controller.begin(prompt)
        await controller.wait()
        while not (ui.exited or controller.exited):
            await status_line.print()
            if stdin.isatty():
                console.print(Text("› ", style="bold cyan"), end="")
            line = await reader.readline()
            while line is not None and line.endswith("\\"):
                more = await reader.readline()
                line = line[:-1] + "\n" + (more or "")
            if line is None:
                break
            controller.submit(line)
            await controller.wait()
    finally:
        loop.remove_signal_handler(signal.SIGINT)
        await controller.close()
    return 0


__all__ = ["LineFrontEnd", "LineReader", "StatusLinePrinter", "parse_answer", "run_line"]
