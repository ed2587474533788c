"""The pieces of the terminal UI: transcript entries (prompt, streamed Markdown reply, collapsible
thinking, tool cards, notices, command output), the todo panel, the status bar and the prompt
editor. Each widget renders what it is given; none of them talks to the agent.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar

from rich.text import Text
from textual import events
from textual.containers import Vertical
from textual.message import Message
from textual.widget import Widget
from textual.widgets import Collapsible, OptionList, Static, TextArea
from textual.widgets.option_list import Option

from keel.llm.messages import ToolUse
from keel.tui.format import (
    context_meter,
    cost,
    diff_line_kind,
    duration,
    key_argument,
    kind_label,
    one_line,
    tokens,
)

#: How each mode is shown in the status bar: (label, style).
MODE_STYLES = {
    "default": ("default", "bold"),
    "accept-edits": ("⏵⏵ accept edits", "bold magenta"),
    "plan": ("⏸ plan mode", "bold dark_cyan"),
    "bypass": ("⚠ bypass", "bold red"),
    "auto": ("⏵ auto mode", "bold green"),
}
LEVEL_STYLES = {"ok": "", "warn": "bold dark_orange", "high": "bold red"}
DIFF_STYLES = {
    "add": "green",
    "remove": "red",
    "hunk": "cyan",
    "header": "bold",
    "context": "",
}
#: Output lines a tool card shows when expanded.
MAX_OUTPUT_LINES = 60
SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"


def diff_text(diff: str, max_lines: int = MAX_OUTPUT_LINES) -> Text:
    out = Text()
    lines = diff.splitlines()
    for line in lines[:max_lines]:
        out.append(line + "\n", style=DIFF_STYLES[diff_line_kind(line)])
    if len(lines) > max_lines:
        out.append(f"… {len(lines) - max_lines} more lines\n", style="dim")
    out.rstrip()
    return out


def clipped(text: str, max_lines: int = MAX_OUTPUT_LINES) -> Text:
    lines = text.splitlines()
    out = Text("\n".join(lines[:max_lines]))
    if len(lines) > max_lines:
        out.append(f"\n… {len(lines) - max_lines} more lines", style="dim")
    return out


# -- transcript entries ------------------------------------------------------------------------


class UserPrompt(Static):
    """A prompt the user sent."""

    def __init__(self, text: str, attachments: Iterable[str] = ()) -> None:
        body = Text(text)
        files = list(attachments)
        if files:
            body.append(f"\n attached: {', '.join(files)}", style="dim")
        super().__init__(body, classes="user-prompt")


class Fold(Collapsible):
    """A fold that keel itself opens or closes (Ctrl+O, a thinking block that finished) without
    scrolling to it. Textual scrolls a toggled `Collapsible` into view; toggled by keel, that
    moved the transcript off its end (to the last fold above a long `/help`), and a transcript
    off its end stops following new output. A click on the title still scrolls, as usual."""

    def __init__(self, *children: Any, **kwargs: Any) -> None:
        super().__init__(*children, **kwargs)
        self._quiet = 0

    def fold(self, collapsed: bool) -> None:
        """Open (False) or close (True) without scrolling the transcript."""
        if self.collapsed == collapsed:
            return
        if self.is_mounted:  # only a mounted fold schedules the scroll to skip
            self._quiet += 1
        self.collapsed = collapsed

    def scroll_visible(self, *args: Any, **kwargs: Any) -> None:
        if self._quiet:
            self._quiet -= 1
            return
        super().scroll_visible(*args, **kwargs)


class ThinkingBlock(Fold):
    """The model's thinking: dimmed, open while it streams, folded once the reply goes on."""

    def __init__(self, text: str = "", *, streaming: bool = True) -> None:
        self.body = Static(Text(text, style="dim italic"), classes="thinking-text")
        self.text = text
        self.started = time.monotonic()
        title = "Thinking…" if streaming else "Thinking"
        super().__init__(self.body, title=title, collapsed=not streaming, classes="thinking")

    def add(self, text: str) -> None:
        self.text += text
        self.body.update(Text(self.text, style="dim italic"))

    def finish(self) -> None:
        seconds = time.monotonic() - self.started
        self.title = f"Thought for {duration(seconds)}"
        self.fold(True)


class ToolCard(Vertical):
    """One tool call: name, key argument, status and duration on one line; the output (a
    coloured diff for edits) folds below it."""

    def __init__(self, call_id: str, name: str) -> None:
        super().__init__(classes="tool-card")
        self.call_id = call_id
        self.tool_name = name
        #: The tool's kind (shown before the name unless it is a built-in's).
        self.kind = ""
        self.argument = ""
        self.state = "pending"  # pending | running | done | error
        self.seconds: float | None = None
        self.summary = ""
        #: The latest progress a running tool reported (an MCP server's notification).
        self.progress = ""
        self.header = Static(classes="tool-header")
        self.output: Fold | None = None
        self.started: float | None = None
        self._render_header()

    def compose(self) -> Any:
        yield self.header

    def set_call(self, call: ToolUse, kind: str = "") -> None:
        self.argument = key_argument(call)
        self.kind = kind or self.kind
        self._render_header()

    def start(self) -> None:
        self.state = "running"
        self.started = time.monotonic()
        self._render_header()

    def tick(self) -> None:
        if self.state == "running":
            self._render_header()

    def set_progress(self, text: str) -> None:
        self.progress = one_line(text, 100)
        self._render_header()

    def finish(self, text: str, is_error: bool, seconds: float, display: str | None) -> None:
        if seconds <= 0 and self.started is not None:
            # A call cut off (Esc) is reported without a duration: it ran from its start to now.
            seconds = time.monotonic() - self.started
        self.state = "error" if is_error else "done"
        self.seconds = seconds
        first = text.strip().splitlines()[0] if text.strip() else ""
        self.summary = one_line(first, 100)
        self._render_header()
        if self.tool_name == "todo_write":
            return  # the todo panel shows the list
        lines = len(text.splitlines())
        if display:
            body: Text = diff_text(display)
            title, collapsed = "diff", False
        else:
            body = clipped(text)
            title, collapsed = f"output ({lines} line{'s' if lines != 1 else ''})", True
        if lines <= 1 and not display:
            return  # the summary already shows it all
        self.output = Fold(Static(body, classes="tool-output"), title=title, collapsed=collapsed)
        self.mount(self.output)

    async def add_line(self, line: Widget) -> None:
        """A line that belongs to this call (a subagent's tool call, under its `task`): below
        the header and the lines before it, above the output."""
        if self.output is not None and self.output.parent is self:
            await self.mount(line, before=self.output)
        else:
            await self.mount(line)

    def _render_header(self) -> None:
        marks = {
            "pending": ("○", "dim"),
            "running": (SPINNER[int(time.monotonic() * 10) % len(SPINNER)], "cyan"),
            "done": ("✓", "green"),
            "error": ("✗", "red"),
        }
        mark, style = marks[self.state]
        line = Text()
        line.append(f"{mark} ", style=style)
        label, shown = kind_label(self.kind, self.tool_name)
        if label:
            line.append(f"{label} · ", style="dim")
        line.append(shown, style="bold")
        if self.argument:
            line.append(f"  {self.argument}")
        if self.state == "running" and self.started is not None:
            line.append(f"  {duration(time.monotonic() - self.started)}", style="dim")
        elif self.seconds is not None:
            line.append(f"  {duration(self.seconds)}", style="dim")
        if self.summary:
            line.append("\n  └ ", style="dim")
            line.append(self.summary, style="red" if self.state == "error" else "dim")
        elif self.state == "running" and self.progress:
            line.append("\n  └ ", style="dim")
            line.append(self.progress, style="cyan")
        self.header.update(line)


class NoticeLine(Static):
    def __init__(self, text: str, level: str = "info") -> None:
        mark, style = ("⚠ ", "dark_orange") if level == "warning" else ("· ", "dim")
        super().__init__(Text(mark + text, style=style), classes=f"notice {level}")


class CommandOutput(Vertical):
    """What a slash command shows, in a titled box."""

    def __init__(self, text: str, kind: str, title: str) -> None:
        classes = "command-output error" if kind == "error" else "command-output"
        super().__init__(classes=classes)
        self.border_title = f"/{title}" if title else ("error" if kind == "error" else "")
        self.kind = kind
        self.text = text

    def compose(self) -> Any:
        if self.kind == "markdown":
            from textual.widgets import Markdown  # (markdown-it: loaded when first needed)

            yield Markdown(self.text)
        elif self.kind == "error":
            yield Static(Text(self.text, style="red"))
        else:
            yield Static(Text(self.text))


class ShellOutput(Static):
    def __init__(self, command: str, output: str, code: int | None, seconds: float) -> None:
        body = Text()
        body.append(f"! {command}\n", style="bold")
        body.append_text(clipped(output))
        style = "green" if code == 0 else "red"
        body.append(f"\n[exit {code}, {duration(seconds)}]", style=style)
        super().__init__(body, classes="shell-output")


class Welcome(Static):
    def __init__(self, model: str, cwd: Path, version: str) -> None:
        text = Text()
        text.append("✻ keel", style="bold dark_cyan")
        text.append(f" {version}  ·  {model}  ·  {cwd.name}/\n", style="")
        text.append(
            "/help for commands · Esc interrupts · Shift+Tab changes the mode · "
            "@path attaches a file · !cmd runs a command",
            style="dim",
        )
        super().__init__(text, classes="welcome")


# -- around the prompt ---------------------------------------------------------------------------


class TodoPanel(Static):
    """The model's task list (the last `todo_write`)."""

    MARKS: ClassVar[dict[str, tuple[str, str]]] = {
        "completed": ("☒", "dim strike"),
        "in_progress": ("◐", "bold"),
        "pending": ("☐", ""),
    }

    def __init__(self) -> None:
        super().__init__(id="todos")
        self.todos: list[dict[str, str]] = []

    def set_todos(self, display: str) -> None:
        try:
            todos = json.loads(display)
        except ValueError:
            return
        self.todos = [t for t in todos if isinstance(t, dict)]
        self.refresh_list()

    def refresh_list(self) -> None:
        text = Text()
        done = sum(t.get("status") == "completed" for t in self.todos)
        text.append(f"Todos ({done}/{len(self.todos)})\n", style="bold")
        for todo in self.todos:
            status = str(todo.get("status", "pending"))
            mark, style = self.MARKS.get(status, ("☐", ""))
            label = todo.get("content", "")
            if status == "in_progress" and todo.get("active_form"):
                label = todo["active_form"]
            text.append(f"{mark} {label}\n", style=style)
        text.rstrip()
        self.update(text)
        self.display = bool(self.todos) and done < len(self.todos)


class Activity(Static):
    """`⠋ Working… 12s · Esc to interrupt` while something runs."""

    def __init__(self) -> None:
        super().__init__(id="activity")
        self.since: float | None = None
        self.label = "Working…"

    def set_running(self, since: float | None, label: str = "Working…") -> None:
        self.since, self.label = since, label
        self.display = since is not None
        self.tick()

    def tick(self) -> None:
        if self.since is None:
            return
        elapsed = time.monotonic() - self.since
        spin = SPINNER[int(elapsed * 10) % len(SPINNER)]
        text = Text()
        text.append(f"{spin} {self.label} ", style="dark_cyan")
        text.append(f"{duration(elapsed)} · Esc to interrupt", style="dim")
        self.update(text)


class KeyHint(Static):
    """A hint about the key just pressed (`press Ctrl+C again to quit`), under the prompt while
    the key's second press would act."""

    def __init__(self) -> None:
        super().__init__(id="key-hint")
        self.display = False
        self.text = ""

    def say(self, text: str) -> None:
        self.text = text
        self.update(Text(text, style="dim"))
        self.display = bool(text)


class StatusBar(Static):
    """Model · mode · context meter · cost · tokens."""

    def __init__(self) -> None:
        super().__init__(id="status")

    def show_status(
        self,
        *,
        model: str,
        mode: str,
        context: int,
        window: int,
        usd: float,
        total: int,
        agents: int = 0,
    ) -> None:
        """`usd` and `total`: the tree's (the session and its subagents); `agents`: subagents
        running now."""
        label, mode_style = MODE_STYLES.get(mode, (mode, "bold"))
        meter, level = context_meter(context, window)
        text = Text()
        text.append(model, style="bold")
        text.append(" · ", style="dim")
        text.append(label, style=mode_style)
        text.append(" · ", style="dim")
        text.append(meter, style=LEVEL_STYLES[level] or "")
        text.append(" · ", style="dim")
        text.append(f"{cost(usd)} · {tokens(total)} tokens", style="")
        if agents:
            text.append(f" · {agents} subagent{'s' if agents > 1 else ''} running", style="dim")
        self.update(text)


class StatusLineBar(Static):
    """The first line a `statusLine` command printed (ANSI colours kept), above the status bar;
    hidden unless one is configured."""

    def __init__(self) -> None:
        super().__init__(id="statusline")
        self.line = ""

    def set_line(self, line: str, padding: int = 0) -> None:
        self.line = line
        self.display = True
        self.update(Text(" " * padding) + Text.from_ansi(line))


class Completions(OptionList):
    """Suggestions for the `@path` or `/command` being typed."""

    def __init__(self) -> None:
        super().__init__(id="completions")
        self.display = False
        self.can_focus = False

    def offer(self, items: list[tuple[str, str]]) -> None:
        """(value, label) pairs; empty hides the list."""
        self.clear_options()
        if not items:
            self.display = False
            return
        self.add_options([Option(label, id=value) for value, label in items])
        self.highlighted = 0
        self.display = True

    def selected(self) -> str | None:
        if not self.display or self.highlighted is None:
            return None
        return self.get_option_at_index(self.highlighted).id


class PromptInput(TextArea):
    """The multi-line prompt: Enter sends, Ctrl+J (or Shift/Alt+Enter) breaks the line, ↑/↓ on
    the first/last line walk the history, a long paste shows as one placeholder line."""

    PASTE_LINES = 12
    PASTE_CHARS = 1200

    class Submitted(Message):
        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    class Navigate(Message):
        """A key the completion list wants: up, down, accept or dismiss."""

        def __init__(self, key: str) -> None:
            super().__init__()
            self.key = key

    def __init__(self, history: list[str]) -> None:
        super().__init__(id="prompt", soft_wrap=True, show_line_numbers=False, tab_behavior="focus")
        self.prompt_history = history
        self._position: int | None = None
        self._draft = ""
        self.pastes: dict[str, str] = {}
        self.completing = False
        #: The history entry on show: no completions for it until it is edited (↑/↓ go on
        #: walking the history).
        self.recalled: str | None = None

    def expanded(self) -> str:
        """The prompt with pasted text put back in place of its placeholders."""
        text = self.text
        for placeholder, pasted in self.pastes.items():
            text = text.replace(placeholder, pasted)
        return text

    def clear_prompt(self) -> None:
        self.load_text("")
        self.pastes.clear()
        self._position = None

    async def _on_key(self, event: events.Key) -> None:
        key = event.key
        if self.completing and key in ("tab", "enter", "escape"):
            event.stop()
            event.prevent_default()
            self.post_message(self.Navigate(key))
            return
        if key == "enter":
            event.stop()
            event.prevent_default()
            text = self.expanded()
            if text.strip():
                self.post_message(self.Submitted(text))
            return
        if key in ("ctrl+j", "shift+enter", "alt+enter"):
            event.stop()
            event.prevent_default()
            self.insert("\n")
            return
        if key == "tab":
            event.stop()
            event.prevent_default()
            return
        await super()._on_key(event)

    async def _on_paste(self, event: events.Paste) -> None:
        text = event.text
        lines = text.count("\n") + 1
        if lines < self.PASTE_LINES and len(text) < self.PASTE_CHARS:
            await super()._on_paste(event)
            return
        event.stop()
        event.prevent_default()
        placeholder = f"[pasted text #{len(self.pastes) + 1}: {lines} lines]"
        self.pastes[placeholder] = text
        self.insert(placeholder)

    def action_cursor_up(self, select: bool = False) -> None:
        if self.completing and not select:
            self.post_message(self.Navigate("up"))
            return
        if select or self.cursor_location[0] > 0 or not self.prompt_history:
            super().action_cursor_up(select)
            return
        if self._position is None:
            self._draft = self.text
            self._position = len(self.prompt_history)
        if self._position > 0:
            self._position -= 1
            self._show_history()

    def action_cursor_down(self, select: bool = False) -> None:
        if self.completing and not select:
            self.post_message(self.Navigate("down"))
            return
        last = self.document.line_count - 1
        if select or self.cursor_location[0] < last or self._position is None:
            super().action_cursor_down(select)
            return
        self._position += 1
        if self._position >= len(self.prompt_history):
            self._position = None
            self.load_text(self._draft)
            self.move_cursor(self.document.end)
            return
        self._show_history()

    def _show_history(self) -> None:
        assert self._position is not None
        self.recalled = self.prompt_history[self._position]
        self.load_text(self.recalled)
        self.move_cursor(self.document.end)


__all__ = [
    "Activity",
    "CommandOutput",
    "Completions",
    "Fold",
    "KeyHint",
    "NoticeLine",
    "PromptInput",
    "ShellOutput",
    "StatusBar",
    "ThinkingBlock",
    "TodoPanel",
    "ToolCard",
    "UserPrompt",
    "Welcome",
]


def __getattr__(name: str) -> Any:
    """`Reply`, from its own module (keel.tui.reply), imported when first asked for."""
    if name == "Reply":
        from keel.tui.reply import Reply

        return Reply
    raise AttributeError(name)
