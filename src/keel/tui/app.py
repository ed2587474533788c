"""The Textual front end: a scrolling transcript, the todo panel, the prompt and a status bar,
with modal cards for permission questions, plan approval and pickers.

`KeelApp` is a `FrontEnd` of `keel.tui.control.Controller`: events arrive through `show` (in
order, from the loop's task) and are rendered one at a time by a single worker, which coalesces
stream deltas so a fast model never outruns the screen. Keys: Enter sends, Esc interrupts (twice
within a second: quit?), Ctrl+C interrupts what runs, else clears the prompt (on an empty prompt,
a second Ctrl+C within `QUIT_WINDOW` quits), Shift+Tab cycles the permission mode, Ctrl+O folds
or unfolds thinking and tool output. Keys typed before the prompt is on screen wait for it.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from textual import events, on
from textual.app import App
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.message import Message
from textual.screen import ModalScreen
from textual.widget import Widget
from textual.widgets import Collapsible, TextArea

from keel import __version__
from keel.agent.events import (
    AgentSpend,
    AssistantMessage,
    AutoDecision,
    BackgroundFinished,
    ContextCompacted,
    QuestionRequest,
    RequestStarted,
    RequestTiming,
    SubagentEvent,
    ToolFinished,
    ToolProgress,
    ToolStarted,
    TurnFinished,
    TurnStarted,
    UsageUpdated,
)
from keel.agent.timing import thought_seconds
from keel.frozen import frozen
from keel.llm.events import Notice, TextDelta, ThinkingDelta, ToolUseDelta, ToolUseStart
from keel.llm.messages import Text, Thinking, ToolUse
from keel.permissions.gate import PermissionReply, PermissionRequest
from keel.safetext import terminal_safe_copy
from keel.tui import commands as cmds
from keel.tui.control import LOCAL_SETTINGS, Driver, finished_text
from keel.tui.format import (
    auto_decision_text,
    duration,
    key_argument,
    progress_text,
    spend_text,
)
from keel.tui.history import History
from keel.tui.mentions import complete, mention_at, mention_text, project_files, with_folders
from keel.tui.screens import (
    PermissionScreen,
    PickerScreen,
    PlanScreen,
    QuestionScreen,
    QuitScreen,
    _Question,
)
from keel.tui.view import Choice, Output, PromptSubmitted, ShellRan, ViewEvent
from keel.tui.widgets import (
    Activity,
    CommandOutput,
    Completions,
    Fold,
    KeyHint,
    NoticeLine,
    PromptInput,
    ShellOutput,
    StatusBar,
    StatusLineBar,
    ThinkingBlock,
    TodoPanel,
    ToolCard,
    UserPrompt,
    Welcome,
)

if TYPE_CHECKING:
    from keel.tui.reply import Reply
    from keel.tui.statusline import StatusLine

#: Esc twice within this many seconds offers to quit.
DOUBLE_ESCAPE = 1.0
#: Ctrl+C on an empty prompt quits when pressed again within this many seconds.
QUIT_WINDOW = 2.0
QUIT_HINT = "press Ctrl+C again to quit"
#: Seconds a listing of the project's files is reused for `@` completion.
FILES_TTL = 10.0


@frozen
class _Reset:
    events: tuple[ViewEvent, ...]


@frozen
class _Banner:
    """The welcome box at the top of the transcript (the first segment's first entry)."""


@frozen
class _Titled:
    """A thinking block that streamed was closed with this title ("Thought for 3s"): kept in its
    segment so that drawing the segment again shows the time it took live."""

    title: str


@frozen
class _LoadOlder:
    """Draw `count` more of the segments above the transcript's first drawn one (then, with
    `home`, go to the top)."""

    count: int
    home: bool = False


#: What the transcript holds: a view event, or one of the front end's own entries.
_Entry = ViewEvent | _Banner | _Titled

#: The transcript is drawn as segments (a prompt; a model request with what it streamed, its
#: message and its calls' results; a stored message and its results). Only the last `WINDOW`
#: segments are widgets while the transcript follows; the ones above are kept as the events
#: that draw them, and drawn again, `CHUNK` at a time, when the user scrolls up to them (or
#: presses Home: the top of what is drawn, `CHUNK` more drawn above it).
WINDOW = 12
CHUNK = 6


CSS = """
Screen { layout: vertical; }
#transcript { height: 1fr; padding: 0 1; scrollbar-size-vertical: 1; }
.welcome { border: round $accent; padding: 0 1; margin: 0 0 1 0; height: auto; }
.user-prompt {
    margin: 1 0 0 0; padding: 0 1; border-left: thick $accent; background: $boost; height: auto;
}
.reply { margin: 1 0 0 0; padding: 0 0 0 2; height: auto; }
.reply > MarkdownBlock:last-child { margin-bottom: 0; }
.reply MarkdownHeader { content-align: left top; text-align: left; margin: 1 0 0 0; }
.reply > MarkdownHeader:first-child { margin-top: 0; }
.command-output MarkdownHeader { content-align: left top; text-align: left; }
.thinking { margin: 1 0 0 0; padding: 0; border: none; background: transparent; height: auto; }
.thinking CollapsibleTitle { color: $text-muted; padding: 0 1; }
.thinking Contents { padding: 0 0 0 3; }
.tool-card { height: auto; margin: 1 0 0 0; }
.tool-card Collapsible { margin: 0 0 0 3; padding: 0; border: none; background: transparent; }
.tool-card CollapsibleTitle { color: $text-muted; padding: 0; }
.tool-card Contents { padding: 0 0 0 2; }
.notice { margin: 1 0 0 0; height: auto; }
.command-output {
    border: round $primary; border-title-color: $primary; height: auto; padding: 0 1;
    margin: 1 0 0 0;
}
.command-output.error { border: round $error; border-title-color: $error; }
.command-output Markdown { margin: 0; padding: 0; }
.shell-output { margin: 1 0 0 0; padding: 0 1; border-left: thick $warning; height: auto; }
#todos { height: auto; border: round $secondary; padding: 0 1; margin: 0 1; display: none; }
#activity { height: 1; padding: 0 2; display: none; }
#completions {
    height: auto; max-height: 8; margin: 0 1; border: round $panel; display: none;
}
#prompt { height: auto; min-height: 3; max-height: 12; margin: 0 1; border: round $accent; }
#prompt:focus { border: round $accent-lighten-1; }
#status { height: 1; padding: 0 2; color: $text-muted; }
#key-hint { height: 1; padding: 0 2; }
.tool-card .notice { margin: 0 0 0 3; }
#statusline { height: 1; padding: 0 2; display: none; }
"""


def _load_markdown() -> None:
    """Import the Markdown widget (keel.tui.reply) on a thread once the prompt is drawn: the
    first reply then finds it loaded, and the prompt did not wait for it."""
    if "keel.tui.reply" not in sys.modules:
        threading.Thread(
            target=importlib.import_module, args=("keel.tui.reply",), daemon=True
        ).start()


class Transcript(VerticalScroll):
    """The conversation. It follows new output (and output that grows, such as Markdown still
    laying out) until the user scrolls up, and again once they are back at the end.

    Only the user's own scrolling (wheel, scrollbar, keys) stops it following. Whether it
    follows used to be read off every change of the scroll position, and Textual moves that by
    itself too (it scrolls a fold it toggles, a region or a focused widget into view, animated):
    one such move that left the view above the end stopped it following for good, the
    transcript that stood still after /help and Ctrl+O. Now `follow` undoes such a move."""

    def __init__(self, *, id: str) -> None:
        super().__init__(id=id)
        self.following = True
        #: Called when the view reaches the top (to draw what is above); `home`: on Home.
        self.at_top: Callable[[bool], None] | None = None

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        if new_value >= self.max_scroll_y - 1:
            self.following = True  # at the end, however it got there
        elif new_value < 1 and not self.following and self.at_top is not None:
            self.at_top(False)

    def follow(self) -> None:
        """Scroll to the end if following and not there (called after each render and on the
        app's tick, which catches content that finished laying out later). A scroll of
        Textual's own that moved the view away is undone here."""
        if self.following and self.scroll_y < self.max_scroll_y:
            self.scroll_end(animate=False, immediate=True)

    def _user_scrolled(self) -> None:
        """After the user scrolled: follow if they went to the end, else stay where they are.
        (The target, not the position: a wheel or page scroll may still be under way.)"""
        self.following = self.scroll_target_y >= self.max_scroll_y - 1
        if self.scroll_target_y < 1 and not self.following and self.at_top is not None:
            self.at_top(False)

    def _after_user_scroll(self) -> None:
        # Textual starts some of these scrolls after the next refresh: decide after that.
        self.call_after_refresh(self._user_scrolled)

    # The ways a user scrolls. Textual's own handlers (`_on_…`) run after these ones, so the
    # decision waits for the scroll they start.
    def on_mouse_scroll_up(self, _event: events.MouseScrollUp) -> None:
        self.call_next(self._after_user_scroll)

    def on_mouse_scroll_down(self, _event: events.MouseScrollDown) -> None:
        self.call_next(self._after_user_scroll)

    def on_scroll_to(self, _message: Message) -> None:
        self.call_next(self._after_user_scroll)  # the scrollbar dragged

    def on_scroll_up(self, _message: Message) -> None:
        self.call_next(self._after_user_scroll)  # a click on the scrollbar above its handle

    def on_scroll_down(self, _message: Message) -> None:
        self.call_next(self._after_user_scroll)

    def action_scroll_up(self) -> None:
        super().action_scroll_up()
        self._after_user_scroll()

    def action_scroll_down(self) -> None:
        super().action_scroll_down()
        self._after_user_scroll()

    def action_page_up(self) -> None:
        super().action_page_up()
        self._after_user_scroll()

    def action_page_down(self) -> None:
        super().action_page_down()
        self._after_user_scroll()

    def action_scroll_home(self) -> None:
        super().action_scroll_home()
        self._after_user_scroll()
        if self.at_top is not None:
            self.at_top(True)

    def action_scroll_end(self) -> None:
        super().action_scroll_end()
        self._after_user_scroll()


class KeelApp(App[int]):
    TITLE = "keel"
    CSS = CSS
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("ctrl+c", "ctrl_c", "clear / quit", priority=True, show=False),
        Binding("shift+tab", "cycle_mode", "mode", priority=True, show=False),
        Binding("escape", "escape", "interrupt", show=False),
        # Priority: the prompt (a TextArea) would take Ctrl+D as "delete right" and never quit.
        Binding("ctrl+d", "ctrl_d", "quit", show=False, priority=True),
        Binding("ctrl+o", "toggle_details", "details", show=False),
        Binding("pageup", "scroll_transcript(-1)", show=False, priority=True),
        Binding("pagedown", "scroll_transcript(1)", show=False, priority=True),
    ]

    def __init__(self, controller: Driver, *, prompt: str = "") -> None:
        super().__init__()
        self.controller = controller
        self.initial_prompt = prompt
        self.history = History(controller.history_file())
        self._queue: deque[ViewEvent | _Reset | _LoadOlder] = deque()
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._attached = False
        self._cards: dict[str, ToolCard] = {}
        #: The first widget of the reply being streamed (a "thought for" line goes above it).
        self._message_start: Widget | None = None
        self._in_request = False
        #: Keys (and pastes) that came before the prompt was on screen, in order; None once
        #: they went to it.
        self._typeahead: list[events.Event] | None = []
        #: Questions of MCP servers being shown (each waits for its form).
        self._questions: set[asyncio.Future[None]] = set()
        self._reply: Reply | None = None
        self._thinking: ThinkingBlock | None = None
        self._last_escape = 0.0
        #: When Ctrl+C last armed the quit (monotonic; 0: not armed).
        self._quit_armed = 0.0
        self._expanded = False
        #: Whether Ctrl+O was used: segments drawn again then open or fold as it says.
        self._toggled = False
        #: Every segment of the transcript (see `WINDOW`); those from `_first` on are drawn.
        self._segments: list[list[_Entry]] = [[_Banner()]]
        self._first = 0
        self.window, self.chunk = WINDOW, CHUNK
        #: The segment the widgets being added belong to, and the widget they go above (when a
        #: segment above the drawn ones is drawn), else they go at the end.
        self._segment_at = 0
        self._anchor: Widget | None = None
        self._drawing_older = False
        #: Whether the last segment has a model's message (the next one starts a segment).
        self._has_message = False
        self._loading = False
        #: Home was pressed while segments above were being drawn: go to the top after.
        self._go_home = False
        #: The thinking block closed last (a `_Titled` entry titles it again when redrawn).
        self._closed_thinking: ThinkingBlock | None = None
        self._files: list[str] = []
        self._files_at = 0.0
        self._listing: asyncio.Task[list[str]] | None = None
        #: Claude Code's `statusLine` command, when settings configure one (started on mount).
        self.status_line: StatusLine | None = None

    # -- layout --------------------------------------------------------------------------------

    def compose(self) -> Any:
        # Kept as attributes: a modal card may be the current screen while they update.
        self.transcript = Transcript(id="transcript")
        self.todos = TodoPanel()
        self.activity = Activity()
        self.completions = Completions()
        self.prompt = PromptInput(self.history.entries)
        self.status_bar = StatusBar()
        self.status_line_bar = StatusLineBar()
        self.key_hint = KeyHint()
        yield self.transcript
        yield self.todos
        yield self.activity
        yield self.completions
        yield self.prompt
        yield self.key_hint
        yield self.status_line_bar
        yield self.status_bar

    async def on_mount(self) -> None:
        if self.is_headless:
            self.prompt.cursor_blink = False
        self.transcript.at_top = self._reached_top
        self.run_worker(self._render_loop(), name="render", group="render")
        self.set_interval(0.1, self._tick)
        self._attached = True
        self._start_status_line()
        self.controller.attach(self)
        self.set_focus(self.prompt)
        await self._release_typeahead()
        self.controller.begin(self.initial_prompt)
        self.call_after_refresh(_load_markdown)

    # -- keys typed early ------------------------------------------------------------------------

    async def on_event(self, event: events.Event) -> None:
        # Keys typed while keel starts reach the app before the prompt has the focus (the first
        # focusable widget, the transcript, had it, and dropped them): they wait for the prompt.
        typeahead = self._typeahead
        if (
            typeahead is not None
            and isinstance(event, events.Key | events.Paste)
            and not event.is_forwarded
        ):
            typeahead.append(event)
            return
        await super().on_event(event)

    async def _release_typeahead(self) -> None:
        """The prompt has the focus: the keys typed so far go to it, in order, as if typed now
        (a priority binding such as Ctrl+C still acts on its key)."""
        pending, self._typeahead = self._typeahead or [], None
        for event in pending:
            await super().on_event(event)

    # -- FrontEnd ------------------------------------------------------------------------------

    def show(self, event: ViewEvent) -> None:
        # A model's, a tool's or a server's words: textual would draw their escapes as they are.
        self._queue.append(terminal_safe_copy(event))
        self._idle.clear()
        self._wake.set()

    def reset(self, events: Sequence[ViewEvent]) -> None:
        # Made safe when drawn: most of a long session's events never are.
        self._queue.append(_Reset(tuple(events)))
        self._idle.clear()
        self._wake.set()

    def refresh_status(self) -> None:
        if not self._attached:
            return
        status = self.controller.status()
        self.status_bar.show_status(
            model=status.model,
            mode=status.mode,
            context=status.context,
            window=status.window,
            usd=status.cost,
            total=status.tokens,
            agents=status.agents_running,
        )
        self.activity.set_running(status.since)
        if status.remote:
            self.status_line_bar.set_line(status.remote)
        if self.status_line is not None:
            self.status_line.request()

    def _start_status_line(self) -> None:
        self.status_line = self.controller.status_line(self.status_line_bar.set_line)

    async def on_unmount(self) -> None:
        if self.status_line is not None:
            await self.status_line.aclose()

    def set_input(self, text: str) -> None:
        self.prompt.load_text(text)
        self.prompt.move_cursor(self.prompt.document.end)

    async def ask(self, request: PermissionRequest) -> PermissionReply:
        shown = terminal_safe_copy(request)  # the model's call, as `show` draws events
        if request.plan:
            screen: _Question = PlanScreen(shown)
        else:
            screen = PermissionScreen(shown, str(LOCAL_SETTINGS))
        reply: PermissionReply = await self._modal(screen)
        if screen.interrupted:
            # Esc on a card stops the turn: the cancellation lands at the next await (this
            # one, in the prompt's own task), so the call ends "interrupted", not denied.
            self.controller.interrupt()
            await asyncio.sleep(0)
        return reply

    async def _answer(self, question: QuestionRequest) -> None:
        """A server's question (MCP elicitation) as a form; Esc declines. A reply that comes
        from elsewhere first (another client of an attached session) closes the form."""
        modal = asyncio.ensure_future(self._modal(QuestionScreen(question)))

        def closed(_reply: object) -> None:
            modal.cancel()

        question.reply.add_done_callback(closed)
        try:
            answer = await modal
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # this task was cancelled, not only the form
            return  # the form closed: answered elsewhere
        finally:
            question.reply.remove_done_callback(closed)
            self._questions = {t for t in self._questions if not t.done()}
        if not question.reply.done():
            question.reply.set_result(answer)

    async def pick(self, title: str, choices: Sequence[Choice]) -> str | None:
        picked: str | None = await self._modal(PickerScreen(title, choices))
        return picked

    async def _modal(self, screen: Any) -> Any:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

        def done(result: Any) -> None:
            if not future.done():
                future.set_result(result)

        await self._settle_render()
        self.push_screen(screen, callback=done)
        try:
            return await future
        except asyncio.CancelledError:
            if screen in self.screen_stack:
                screen.dismiss(None)
            raise

    # -- rendering -----------------------------------------------------------------------------

    async def _settle_render(self) -> None:
        """Wait until everything shown so far is on screen (a question comes after the call it
        is about)."""
        await self._idle.wait()

    async def idle(self) -> None:
        """Until nothing runs and everything shown is rendered (tests)."""
        while True:
            await self.controller.wait()
            await self._idle.wait()
            await asyncio.sleep(0)
            if not self.controller.busy and not self._queue and self._idle.is_set():
                return

    async def _render_loop(self) -> None:
        while True:
            if not self._queue:
                self._idle.set()
                await self._wake.wait()
                self._wake.clear()
                continue
            item = self._queue.popleft()
            if isinstance(item, _LoadOlder):
                await self._draw_older(item)
                continue
            if isinstance(item, TextDelta | ThinkingDelta):
                kind, text = type(item), item.text
                while self._queue and type(self._queue[0]) is kind:
                    nxt = self._queue.popleft()
                    assert isinstance(nxt, TextDelta | ThinkingDelta)
                    text += nxt.text
                item = kind(text)
            if not isinstance(item, _Reset):
                self._keep(item)
            await self._render(item)
            if self.transcript.following:
                await self._trim()
            self.transcript.call_after_refresh(self.transcript.follow)

    # -- the segments (only the last ones are widgets) ------------------------------------------

    def _keep(self, entry: _Entry) -> None:
        """Add `entry` to the transcript's segments: a prompt, a model request, or a stored
        message after another one starts a segment. Streamed text is kept as one delta."""
        if isinstance(entry, QuestionRequest):
            return  # a live form, answered or not by now; nothing to draw again
        segment = self._segments[-1]
        starts = isinstance(entry, PromptSubmitted | RequestStarted) or (
            isinstance(entry, AssistantMessage) and self._has_message
        )
        if starts and segment:
            segment = []
            self._segments.append(segment)
            self._has_message = False
        if isinstance(entry, AssistantMessage):
            self._has_message = True
        last = segment[-1] if segment else None
        if isinstance(entry, TextDelta | ThinkingDelta) and type(last) is type(entry):
            assert isinstance(last, TextDelta | ThinkingDelta)
            segment[-1] = type(entry)(last.text + entry.text)
        else:
            segment.append(entry)
        self._segment_at = len(self._segments) - 1

    async def _trim(self) -> None:
        """Keep the last `WINDOW` segments as widgets (once `CHUNK` more piled up): the widgets
        above go, their events stay. A segment with a call still running stays."""
        if len(self._segments) - self._first <= self.window + self.chunk:
            return
        first = len(self._segments) - self.window
        gone = [w for w in self.transcript.children if _segment_of(w) < first]
        if any(isinstance(w, ToolCard) and w.state in ("pending", "running") for w in gone):
            return
        for card in [w for w in gone if isinstance(w, ToolCard)]:
            self._cards.pop(card.call_id, None)
        self._first = first
        await self.transcript.remove_children(gone)

    def _reached_top(self, home: bool) -> None:
        self._go_home = self._go_home or (home and self._loading)
        if self._first > 0 and not self._loading:
            self._loading = True
            self._queue.append(_LoadOlder(self.chunk, home))
            self._idle.clear()
            self._wake.set()

    async def _draw_older(self, load: _LoadOlder) -> None:
        """Draw `load.count` segments above the first drawn one, the view kept on what it
        showed (or at the top, on Home). Nothing else changes: the todo panel, the status and
        what streams now stay as they are."""
        transcript = self.transcript
        first = max(0, self._first - load.count)
        if first == self._first:
            self._loading = False
            return
        saved = (self._reply, self._thinking, self._in_request, self._message_start)
        anchor = next(iter(transcript.children), None)
        height_before = transcript.virtual_size.height
        self._reply = self._thinking = self._message_start = None
        self._in_request, self._anchor, self._drawing_older = False, anchor, True
        added: list[Widget] = []
        try:
            with self.batch_update():
                for index in range(first, self._first):
                    self._segment_at = index
                    for entry in self._segments[index]:
                        await self._render(terminal_safe_copy(entry))
                    self._close_segments()
            added = [w for w in transcript.children if _segment_of(w) < self._first]
        finally:
            self._reply, self._thinking, self._in_request, self._message_start = saved
            self._anchor, self._drawing_older = None, False
            self._segment_at = len(self._segments) - 1
            self._first = first
        if self._toggled:
            for widget in added:
                self._show_details(widget)
        transcript.refresh(layout=True)

        def keep_view() -> None:
            self._loading = False
            if load.home or self._go_home:
                self._go_home = False
                transcript.scroll_home(animate=False, immediate=True)
                return
            grown = transcript.virtual_size.height - height_before
            transcript.scroll_to(y=transcript.scroll_y + grown, animate=False, immediate=True)

        transcript.call_after_refresh(keep_view)

    async def _add(self, widget: Widget) -> None:
        _tag(widget, self._segment_at)
        await self.transcript.mount(widget, before=self._anchor)
        if self._in_request and self._message_start is None:
            self._message_start = widget

    def _close_segments(self) -> None:
        if self._thinking is not None:
            self._thinking.finish()
            if not self._drawing_older:
                self._keep_title(self._thinking.title)
            self._closed_thinking = self._thinking
            self._thinking = None
        self._reply = None

    def _keep_title(self, title: str) -> None:
        """The title a streamed thinking block closed with, after the entries that closed it
        (its segment may be a former one: the title goes where the block is)."""
        for segment in reversed(self._segments):
            if any(isinstance(e, ThinkingDelta) for e in segment):
                segment.append(_Titled(title))
                return

    async def _reset(self, replayed: Sequence[ViewEvent]) -> None:
        """The whole transcript drawn anew: only its last `WINDOW` segments as widgets."""
        await self.transcript.remove_children()
        self._cards.clear()
        self._in_request, self._message_start = False, None
        self._close_segments()
        self.todos.todos = []
        self.todos.refresh_list()
        self._segments, self._has_message = [[_Banner()]], False
        for e in replayed:
            self._keep(e)
        self._first = max(0, len(self._segments) - self.window)
        for segment in self._segments[: self._first]:  # the todo list of a call not drawn
            for entry in segment:
                if isinstance(entry, ToolFinished) and entry.call.name == "todo_write":
                    self._todos(terminal_safe_copy(entry))
        with self.batch_update():
            for index in range(self._first, len(self._segments)):
                self._segment_at = index
                for entry in self._segments[index]:
                    await self._render(terminal_safe_copy(entry))
        self._segment_at = len(self._segments) - 1
        self.transcript.refresh(layout=True)
        self.refresh_status()

    def _todos(self, finished: ToolFinished) -> None:
        if not finished.result.is_error:
            call = finished.call
            self.todos.set_todos(
                finished.display or json.dumps((call.input or {}).get("todos", []))
            )

    async def _render(self, event: _Entry | _Reset) -> None:  # noqa: C901 - one case per event
        match event:
            case _Reset(replayed):
                await self._reset(replayed)
            case _Banner():
                status = self.controller.status()
                await self._add(Welcome(status.model, self.controller.cwd, __version__))
            case _Titled(title):
                if self._thinking is not None:  # it closed when the next segment began
                    self._thinking.finish()
                    self._closed_thinking, self._thinking = self._thinking, None
                if self._closed_thinking is not None:
                    self._closed_thinking.title = title
            case PromptSubmitted(text, attachments):
                self._close_segments()
                await self._add(UserPrompt(text, attachments))
            case TurnStarted(_prompt, _sid, resumed) if resumed:
                await self._add(NoticeLine("continuing the interrupted turn"))
            case RequestStarted():
                self._close_segments()
                self._in_request, self._message_start = True, None
                self.refresh_status()
            case ThinkingDelta(text) if text:  # (thinking it does not show streams nothing)
                if self._thinking is None:
                    self._reply = None
                    self._thinking = ThinkingBlock()
                    await self._add(self._thinking)
                self._thinking.add(text)
            case TextDelta(text):
                if self._reply is None:
                    self._close_segments()
                    from keel.tui.reply import Reply

                    self._reply = Reply()
                    await self._add(self._reply)
                await self._reply.add(text)
            case ToolUseStart(call_id, name):
                self._close_segments()
                await self._card(call_id, name)
            case ToolUseDelta():
                pass
            case AssistantMessage(message, _usage, _stop, _cost, timing):
                await self._assistant(message.blocks, timing)
                self._in_request, self._message_start = False, None
            case ToolStarted(call, _started_at, kind):
                card = await self._card(call.id, call.name)
                card.set_call(call, kind)
                card.start()
            case ToolProgress(call_id, progress, total, message):
                if (shown := self._cards.get(call_id)) is not None:
                    shown.set_progress(progress_text(progress, total, message))
            case QuestionRequest() as question:
                self._questions.add(asyncio.ensure_future(self._answer(question)))
            case ToolFinished(call, result, seconds, display, _started_at, kind):
                card = await self._card(call.id, call.name)
                card.set_call(call, kind)
                card.finish(result.text, result.is_error, seconds, display)
                if call.name == "todo_write" and not self._drawing_older:
                    self._todos(event)
            case Notice(text, level):
                self._close_segments()
                await self._add(NoticeLine(text, level))
            case UsageUpdated() | ContextCompacted():
                self.refresh_status()
            case AgentSpend(tool_use_id=call_id) as row:
                # A subagent's spend, live on its task's card; the tree's in the status bar.
                if call_id and (shown := self._cards.get(call_id)) is not None:
                    shown.set_progress(spend_text(row))
                self.refresh_status()
            case TurnFinished() as finished:
                self._close_segments()
                line = finished_text(finished)
                if line:
                    await self._add(NoticeLine(line, "warning"))
                self.refresh_status()
            case SubagentEvent(call_id, agent, _description, ToolStarted(call)):
                argument = key_argument(call)
                nested = NoticeLine(f"↳ [{agent}] {call.name} {argument}".rstrip())
                task = self._cards.get(call_id)
                if task is not None:
                    await task.add_line(nested)  # under its own task's card
                else:
                    await self._add(nested)
            case SubagentEvent(_call_id, agent, _description, Notice(text, "warning")):
                await self._add(NoticeLine(f"[{agent}] {text}", "warning"))
            case AutoDecision(call, decision, reason):
                self._close_segments()
                text, warns = auto_decision_text(call, decision, reason)
                await self._add(NoticeLine(text, "warning" if warns else "info"))
            case BackgroundFinished(task_id, kind, status, description):
                self._close_segments()
                await self._add(NoticeLine(f"{task_id} ({kind}) {status}: {description}"))
            case ShellRan(command, output, code, seconds):
                await self._add(ShellOutput(command, output, code, seconds))
            case Output(text, kind, title):
                await self._add(CommandOutput(text, kind, title))
            case _:
                pass  # an event this front end does not show

    async def _card(self, call_id: str, name: str) -> ToolCard:
        card = self._cards.get(call_id)
        if card is None:
            card = self._cards[call_id] = ToolCard(call_id, name)
            await self._add(card)
        return card

    async def _assistant(self, blocks: Sequence[object], timing: RequestTiming | None) -> None:
        """The stored message: what streamed is already on screen; a replayed one is drawn
        whole (thinking folded, the text as Markdown, a card per call). How long the model
        thought (the loop's timing, or the journal's) titles a thinking block, and is a line of
        its own above the reply when the model thought without showing it (encrypted or
        redacted reasoning). A model that did not think gets no such line: the time to its
        first word is the prompt being read, not thinking."""
        calls = [b for b in blocks if isinstance(b, ToolUse)]
        streamed = self._reply is not None or self._thinking is not None
        streamed = streamed or any(c.id in self._cards for c in calls)
        thought = thought_seconds(timing)
        hidden = any(isinstance(b, Thinking) for b in blocks) and not any(
            isinstance(b, Thinking) and b.text for b in blocks
        )
        if hidden and thought is not None:
            line = NoticeLine(f"thought for {thought}s")
            start = self._message_start if streamed else None
            if start is not None and start.parent is self.transcript:
                _tag(line, self._segment_at)
                await self.transcript.mount(line, before=start)
            else:
                await self._add(line)
        if not streamed:
            for block in blocks:
                if isinstance(block, Thinking) and block.text:
                    folded = ThinkingBlock(block.text, streaming=False)
                    if timing is not None and timing.thinking_ms is not None:
                        folded.title = f"Thought for {duration(timing.thinking_ms / 1000)}"
                    await self._add(folded)
                elif isinstance(block, Text) and block.text:
                    from keel.tui.reply import Reply

                    reply = Reply()
                    await self._add(reply)
                    await reply.add(block.text)
        for call in calls:
            (await self._card(call.id, call.name)).set_call(call)
        self._close_segments()
        from keel.tools.builtin.web_search import sources

        # The provider's web search: the pages the answer cites, under it.
        cited = sources([c for b in blocks if isinstance(b, Text) for c in b.citations])
        if cited:
            await self._add(NoticeLine(cited, "info"))

    def _tick(self) -> None:
        self.transcript.follow()
        self.activity.tick()
        for card in self._cards.values():
            card.tick()

    # -- input ---------------------------------------------------------------------------------

    @on(PromptInput.Submitted)
    def _submitted(self, message: PromptInput.Submitted) -> None:
        text = message.text
        self.history.add(text)
        self.prompt.clear_prompt()
        self._offer([])
        self.controller.submit(text)

    def exit(self, result: int | None = 0, return_code: int = 0, message: Any = None) -> None:
        self.controller.leave()
        super().exit(result, return_code, message)

    @on(TextArea.Changed, "#prompt")
    async def _prompt_changed(self, _message: TextArea.Changed) -> None:
        prompt = self.prompt
        if prompt.recalled is not None and prompt.text == prompt.recalled:
            self._offer([])
            return
        prompt.recalled = None
        before = prompt.get_text_range((0, 0), prompt.cursor_location)
        if before.startswith("/") and not any(c.isspace() for c in before):
            names = {n: b.summary for n, b in cmds.BUILTINS.items()}
            names.update(self.controller.command_names())
            typed = before[1:]
            self._offer(
                [(f"/{n}", f"/{n}  {d}") for n, d in sorted(names.items()) if n.startswith(typed)][
                    :8
                ]
            )
            return
        found = mention_at(before, len(before))
        if found is None:
            self._offer([])
            return
        files = await self._project_files()
        self._offer([(path, path) for path in complete(found[1], files)])

    async def _project_files(self) -> list[str]:
        root = self.controller.local_files()
        if root is None:
            return []
        if time.monotonic() - self._files_at > FILES_TTL:
            self._files = with_folders(await asyncio.to_thread(project_files, root))
            self._files_at = time.monotonic()
        return self._files

    def _offer(self, items: list[tuple[str, str]]) -> None:
        self.completions.offer(items)
        self.prompt.completing = bool(items)

    @on(PromptInput.Navigate)
    def _navigate(self, message: PromptInput.Navigate) -> None:
        completions = self.completions
        if message.key == "up":
            completions.action_cursor_up()
        elif message.key == "down":
            completions.action_cursor_down()
        elif message.key == "escape":
            self._offer([])
        else:
            value = completions.selected()
            if value is None:
                return
            if message.key == "enter" and value.startswith("/"):
                # Enter on a command runs it (Tab only completes, to add arguments).
                self._offer([])
                self.prompt.post_message(PromptInput.Submitted(value))
                return
            self._accept(value)

    def _accept(self, value: str) -> None:
        prompt = self.prompt
        cursor = prompt.cursor_location
        before = prompt.get_text_range((0, 0), cursor)
        if value.startswith("/") and before.startswith("/"):
            prompt.replace(value + " ", (0, 0), cursor)
        else:
            found = mention_at(before, len(before))
            if found is None:
                return
            start = found[0]
            row = before.count("\n", 0, start)
            col = start - (before.rfind("\n", 0, start) + 1)
            tail = "" if value.endswith("/") else " "
            prompt.replace(mention_text(value) + tail, (row, col), cursor)
        if not value.endswith("/"):
            self._offer([])

    # -- keys ----------------------------------------------------------------------------------

    def action_escape(self) -> None:
        now = time.monotonic()
        if self.controller.interrupt():
            self._last_escape = now
            return
        if now - self._last_escape < DOUBLE_ESCAPE:
            self._offer_quit()
        self._last_escape = now

    def action_ctrl_c(self) -> None:
        """As in Claude Code and Codex: the first Ctrl+C stops what runs (a model's stream, a
        tool, a `!cmd`); on an idle, empty prompt a second one within `QUIT_WINDOW` quits (the
        first says so under the prompt). With text in the prompt, it clears the prompt. In an
        attached session (`keel attach`) Ctrl+C never stops the server's work: it only detaches
        (Esc interrupts)."""
        screen = self.screen
        now = time.monotonic()
        stops = self.controller.ctrl_c_stops
        if isinstance(screen, QuitScreen):
            screen.dismiss(True)
        elif isinstance(screen, _Question) and stops:
            screen.action_interrupt()  # stops the turn the question belongs to
            self._arm_quit(now)
        elif isinstance(screen, PickerScreen):
            screen.action_cancel()
        elif stops and self.controller.interrupt():
            self._arm_quit(now)
        elif self.prompt.text and not isinstance(screen, _Question):
            self.prompt.clear_prompt()
            self._offer([])
        elif self._quit_armed and now - self._quit_armed < QUIT_WINDOW:
            self.exit(0)
        else:
            self._arm_quit(now)

    def _arm_quit(self, now: float) -> None:
        self._quit_armed = now
        self.key_hint.say(QUIT_HINT)
        self.set_timer(QUIT_WINDOW, lambda: self._disarm_quit(now))

    def _disarm_quit(self, armed: float) -> None:
        if self._quit_armed == armed:  # not re-armed since
            self._quit_armed = 0.0
            self.key_hint.say("")

    def action_ctrl_d(self) -> None:
        """Quit on an empty prompt; else what Ctrl+D does in a text field (delete right)."""
        if isinstance(self.screen, ModalScreen) or self.prompt.text:
            delete_right = getattr(self.focused, "action_delete_right", None)
            if delete_right is not None:
                delete_right()
            return
        self.exit(0)

    def _offer_quit(self) -> None:
        if any(isinstance(s, QuitScreen) for s in self.screen_stack):
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self.exit(0)

        self.push_screen(QuitScreen(), callback=answered)

    def action_cycle_mode(self) -> None:
        if isinstance(self.screen, _Question | PickerScreen | QuitScreen):
            return
        self.controller.cycle_mode()

    def action_toggle_details(self) -> None:
        self._expanded, self._toggled = not self._expanded, True
        self._show_details(self.transcript)

    def _show_details(self, widget: Widget) -> None:
        """Open or fold (as Ctrl+O last said) every fold in `widget`."""
        folds = list(widget.query(Collapsible))
        if isinstance(widget, Collapsible):
            folds.append(widget)
        for collapsible in folds:
            if isinstance(collapsible, Fold):
                collapsible.fold(not self._expanded)  # a transcript that follows goes on
            else:
                collapsible.collapsed = not self._expanded

    def action_scroll_transcript(self, direction: int) -> None:
        if direction < 0:
            self.transcript.action_page_up()
        else:
            self.transcript.action_page_down()


_SEGMENT = "_keel_segment"


def _tag(widget: Widget, segment: int) -> None:
    setattr(widget, _SEGMENT, segment)


def _segment_of(widget: Widget) -> int:
    segment: int = getattr(widget, _SEGMENT, 0)
    return segment


__all__ = ["KeelApp"]
