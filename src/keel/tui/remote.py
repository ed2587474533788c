"""The terminal UI's session when the agent runs in a `keel serve` elsewhere (`keel attach`).

`RemoteController` is a `Driver` of the Textual app, as `Controller` is, but it holds no agent:
it renders the session's transcript (`GET …/messages`), then follows the session's event stream
(`GET …/events`, reconnecting with `Last-Event-ID`; a `gap` reloads the transcript) and turns
each line back into the loop's events (`keel.app.jsonin`), so the screen draws exactly what a
local session draws. What the user does goes back over HTTP: a prompt, Esc (cancel), the
answer to a permission card or a plan, Shift+Tab and `/mode` (PATCH), `/model`, `/undo`,
`/compact`, `/clear`, `/fork`. Leaving (Ctrl+C, Ctrl+D, /quit) closes the connection only: the
session and its work go on on the server.

`Connection` is the HTTP client: every refusal is a `ServerRefused` (a `UserError` with the
server's one-line error and hint). Nothing here touches the session's files.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from collections.abc import AsyncIterator, Coroutine, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from keel.agent.events import (
    PermissionAnswered,
    PermissionAsked,
    QuestionAnswered,
    QuestionRequest,
    ToolFinished,
    UsageUpdated,
)
from keel.app.jsonin import EventDecoder
from keel.errors import KeelError, UserError
from keel.llm.events import Notice
from keel.llm.messages import Message, ToolUse, message_from_json
from keel.permissions.gate import MODES, Mode, PermissionRequest, parse_mode
from keel.tui import commands as cmds
from keel.tui.control import MODE_CYCLE, FrontEnd, Status
from keel.tui.format import cost as fmt_cost
from keel.tui.format import one_line, tokens, typed_prompt
from keel.tui.replay import rebuilt_diff
from keel.tui.view import Choice, Output, PromptSubmitted, ViewEvent

if TYPE_CHECKING:
    import httpx

    from keel.tui.statusline import StatusLine

#: Seconds between reconnection attempts (doubling up to the last).
RECONNECT = (0.2, 0.5, 1.0, 2.0, 5.0)
#: How many frames `RemoteController.seen` keeps.
SEEN = 10_000
#: The slash commands an attached session runs on the server.
REMOTE_COMMANDS: dict[str, str] = {
    "help": "this list",
    "model": "switch the model (`/model PROVIDER/MODEL`)",
    "mode": "the permission mode (`/mode NAME`; Shift+Tab cycles)",
    "undo": "put back the files the last prompt changed",
    "compact": "summarize the conversation now",
    "pin": "pin a fact every summary must keep (`/pin TEXT`; bare: the pins)",
    "unpin": "unpin the fact `/pin` lists as N (`/unpin N`)",
    "clear": "a fresh context (a new session on the server)",
    "fork": "copy this session and continue in the copy",
    "cost": "what this session has cost",
    "exit": "detach (the session goes on on the server)",
    "quit": "detach (the session goes on on the server)",
}


class ServerRefused(UserError):
    """The server answered with an error (`status`), or could not be reached (status 0)."""

    def __init__(self, message: str, *, hint: str = "", status: int = 0) -> None:
        super().__init__(message, hint=hint)
        self.status = status


@dataclass(frozen=True)
class Frame:
    """One SSE message: its id (None: not numbered), event name and JSON data."""

    id: int | None
    event: str
    data: dict[str, Any]


class Connection:
    """HTTP to one `keel serve`: JSON requests with the bearer token, the SSE stream."""

    def __init__(self, url: str, token: str, *, timeout: float = 30.0) -> None:
        import httpx

        self.url = url.rstrip("/")
        self.client = httpx.AsyncClient(
            base_url=self.url,
            headers={"authorization": f"Bearer {token}"},
            timeout=httpx.Timeout(timeout),
        )

    async def aclose(self) -> None:
        await self.client.aclose()

    def _unreachable(self, exc: Exception) -> ServerRefused:
        return ServerRefused(
            f"cannot reach keel serve at {self.url} ({type(exc).__name__}: {exc})".replace(
                "\n", " "
            ),
            hint="is `keel serve` running there? check the address and port it printed",
        )

    async def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """The JSON answer of `method path` (None for an empty one)."""
        import httpx

        try:
            response = await self.client.request(method, path, json=body)
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from exc
        return self._answer(response, f"{method} {path}")

    def _answer(self, response: httpx.Response, what: str) -> Any:
        if 300 <= response.status_code < 400:
            # Never followed: the token is for this address only.
            raise ServerRefused(
                f"{self.url} is not a keel serve ({what} answered {response.status_code}, "
                f"a redirect to {response.headers.get('location', 'nowhere')})",
                hint="give the address keel serve printed, e.g. http://127.0.0.1:4096 "
                "(keel attach follows no redirect)",
                status=response.status_code,
            )
        if response.status_code < 400:
            return response.json() if response.content else None
        try:
            data = response.json()
        except ValueError:
            data = None
        if not isinstance(data, dict) or not isinstance(data.get("error"), str):
            raise ServerRefused(
                f"{self.url} is not a keel serve ({what} answered {response.status_code})",
                hint="give the address keel serve printed, e.g. http://127.0.0.1:4096",
                status=response.status_code,
            )
        if response.status_code == 401:
            raise ServerRefused(
                f"the server refused the token: {data['error']}",
                hint="give the token keel serve printed: --token-file F, KEEL_SERVER_TOKEN, or "
                "the URL it printed (…/#token=…)",
                status=401,
            )
        raise ServerRefused(
            str(data["error"]), hint=str(data.get("hint") or ""), status=response.status_code
        )

    async def events(self, session: str, after: int) -> AsyncIterator[Frame]:
        """The session's event stream after seq `after`, frame by frame, until it ends."""
        import httpx

        timeout = httpx.Timeout(10.0, read=None)
        headers = {"last-event-id": str(after)}
        try:
            async with self.client.stream(
                "GET", f"/v1/sessions/{session}/events", headers=headers, timeout=timeout
            ) as response:
                if response.status_code >= 300:
                    await response.aread()
                    self._answer(response, "GET …/events")
                fields: dict[str, str] = {}
                async for line in response.aiter_lines():
                    if line == "":
                        if "data" in fields:
                            raw = fields.get("id")
                            yield Frame(
                                int(raw) if raw and raw.isdigit() else None,
                                fields.get("event", "message"),
                                json.loads(fields["data"]),
                            )
                        fields = {}
                    elif not line.startswith(":"):
                        name, _, value = line.partition(":")
                        fields[name] = value.removeprefix(" ")
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from exc


async def open_session(
    connection: Connection,
    session: str | None,
    *,
    new: bool = False,
    model: str | None = None,
    mode: str | None = None,
    force: bool = False,
) -> dict[str, Any]:
    """The session to attach to, loaded on the server: `session` (an id or a unique prefix of
    one), a new one, or the server's latest. Returns the server's description of it."""
    health = await connection.request("GET", "/v1/health")
    if not isinstance(health, dict) or health.get("ok") is not True:
        raise ServerRefused(
            f"{connection.url} is not a keel serve (GET /v1/health answered {health!r})",
            hint="give the address keel serve printed",
        )
    if new:
        body = {k: v for k, v in (("model", model), ("mode", mode)) if v is not None}
        described: dict[str, Any] = await connection.request("POST", "/v1/sessions", body)
        return described
    if model is not None or mode is not None:
        raise UserError(
            "--model and --mode apply to a new session", hint="add --new, or /model and /mode"
        )
    opening: dict[str, Any] = {"continue": True}
    if session is not None:
        listed = await connection.request("GET", "/v1/sessions")
        ids = [s["id"] for s in listed["sessions"]]
        found = [i for i in ids if i == session] or [i for i in ids if i.startswith(session)]
        if not found:
            raise UserError(
                f"no session {session!r} on {connection.url}",
                hint="leave SESSION out for the latest, or add --new to start one",
            )
        if len(found) > 1:
            raise UserError(
                f"{session!r} names {len(found)} sessions ({', '.join(found[:4])}…)",
                hint="give more of the id",
            )
        opening = {"resume": found[0]}
    if force:
        opening["force"] = True
    try:
        described = await connection.request("POST", "/v1/sessions", opening)
    except ServerRefused as exc:
        if exc.status == 409 and not force and "force" in exc.hint:
            raise UserError(
                exc.message, hint="add --force to go on with the configuration as it is now"
            ) from exc
        if exc.status == 404 and session is None:
            raise UserError(
                f"no sessions on {connection.url} yet", hint="add --new to start one"
            ) from exc
        raise
    return described


def conversation_view(messages: Sequence[Message], cwd: Path | None) -> list[ViewEvent]:
    """The view events that draw a conversation (the server's `…/messages`): each prompt as
    typed, each reply with its tool cards and their results. Like `keel.tui.replay.replay`,
    from the conversation rather than the session file's records."""
    from keel.agent.events import AssistantMessage
    from keel.llm.messages import Usage

    events: list[ViewEvent] = []
    calls: dict[str, ToolUse] = {}
    for message in messages:
        if message.role == "assistant":
            calls.update((c.id, c) for c in message.tool_uses)
            events.append(AssistantMessage(message, Usage(), "end_turn", 0.0))
            continue
        for result in message.tool_results:
            call = calls.get(result.tool_use_id)
            if call is not None:
                events.append(ToolFinished(call, result, 0.0, rebuilt_diff(call, result, cwd)))
        text = typed_prompt(message.text).strip()
        if text:
            events.append(PromptSubmitted(text))
    return events


class RemoteController:
    """One attached session: what the screen shows of it, and what the user sends to it."""

    def __init__(self, connection: Connection, described: dict[str, Any]) -> None:
        self.connection = connection
        self._ui: FrontEnd | None = None
        self.decoder = EventDecoder()
        self.transcript: list[ViewEvent] = []
        self.last_seq = 0
        self.context = 0
        self.window = 0
        self.cost = 0.0
        self.tokens = 0
        #: The server's `status`: a piece of work runs (or a prompt was just sent).
        self.running = False
        self._since: float | None = None
        self._describe(described)
        self._sent = False
        self.queue: list[str] = []
        self.exited = False
        self._follow: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        #: Permission questions on screen, by request id, and the ones this client answered.
        self._asking: dict[str, asyncio.Task[None]] = {}
        self._answered: set[str] = set()
        #: MCP questions on screen, by request id (their form closes on `question_answered`).
        self._questions: dict[str, QuestionRequest] = {}
        self._idle = asyncio.Event()
        self._patching = asyncio.Lock()
        self._settle()
        #: The (seq, kind) of the frames handled lately, in order (what a test checks).
        self.seen: deque[tuple[int | None, str]] = deque(maxlen=SEEN)

    def _describe(self, described: dict[str, Any]) -> None:
        self.session_id: str = described["id"]
        self.model: str = described.get("model") or ""
        self.mode: str = described.get("mode") or "allow-all"
        self.project = Path(described.get("cwd") or ".")
        self.pending: list[dict[str, Any]] = list(described.get("pending") or [])
        self.running = bool(described.get("busy"))
        self._since = (self._since or time.monotonic()) if self.running else None
        if "cost_usd" in described:
            self.cost = float(described["cost_usd"])
            self.tokens = sum(int(v) for v in (described.get("usage") or {}).values())

    @property
    def ui(self) -> FrontEnd:
        assert self._ui is not None, "no front end attached"
        return self._ui

    async def load(self) -> None:
        """The transcript as the session file has it, and the seq to follow the stream from."""
        data = await self.connection.request("GET", f"/v1/sessions/{self.session_id}/messages")
        messages = [message_from_json(m) for m in data["messages"]]
        self.transcript = conversation_view(messages, self.project)
        self.decoder.calls.update(
            (c.id, c) for m in messages if m.role == "assistant" for c in m.tool_uses
        )
        if data.get("last_seq") is not None:
            self.last_seq = int(data["last_seq"])
        # Asked so far and not answered, read after the seq to follow from: one answered since
        # is a `permission_answered` on the stream (its card closes), one asked since is on
        # both (asked once).
        waiting = await self.connection.request(
            "GET", f"/v1/sessions/{self.session_id}/permissions"
        )
        self.pending = list(waiting.get("pending") or []) if isinstance(waiting, dict) else []
        if self.window == 0:
            self.window = _window(self.model)

    # -- Driver ------------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        return self.running or self._sent

    @property
    def cwd(self) -> Path:
        return self.project

    #: Ctrl+C detaches; only Esc stops the server's work.
    ctrl_c_stops = False

    def attach(self, ui: FrontEnd) -> None:
        self._ui = ui
        ui.reset(self.transcript)
        ui.refresh_status()
        self._follow = asyncio.create_task(self._follow_stream())

    def begin(self, prompt: str = "") -> None:
        for question in self.pending:  # asked before this client came: answer them here too
            self._frame(Frame(None, str(question.get("type")), question))
        if self.running:
            self.show(Notice("attached while the session works: following it from here"))
        if prompt.strip():
            self.submit(prompt)

    def status(self) -> Status:
        return Status(
            model=self.model,
            mode=self.mode,
            context=self.context,
            window=self.window,
            cost=self.cost,
            tokens=self.tokens,
            busy=self.busy,
            session_id=self.session_id,
            since=self._since,
            remote=f"attached to {self.connection.url} · session {self.session_id}",
        )

    def submit(self, text: str) -> None:
        if not text.strip():
            return
        stripped = text.strip()
        parsed = cmds.parse_command(stripped)
        if parsed is not None and parsed[0] in REMOTE_COMMANDS:
            self._spawn(self._command(*parsed))
            return
        if parsed is not None and parsed[0] in cmds.BUILTINS:
            self.show(
                Output(
                    f"/{parsed[0]} works in a local session only (keel in the project), not in "
                    "an attached one: /help lists what does",
                    "error",
                )
            )
            return
        if stripped.startswith("!"):
            self.show(
                Output(
                    "!commands run on this machine, not the server's: not in an attached session",
                    "error",
                )
            )
            return
        if self.busy:
            self.queue.append(text)
            self.show(Notice(f"queued: {one_line(text, 60)}"))
            return
        self._send(text)

    def _send(self, text: str) -> None:
        self._sent = True
        self._idle.clear()
        self._since = time.monotonic()
        self.refresh()
        self._spawn(self._prompt(text))

    async def _prompt(self, text: str) -> None:
        try:
            await self.connection.request(
                "POST", f"/v1/sessions/{self.session_id}/prompt", {"text": text.rstrip()}
            )
        except ServerRefused as exc:
            self._sent = False
            if exc.status == 409:  # another client's work runs: this prompt waits for it
                self.queue.insert(0, text)
                self.show(Notice(f"queued behind the running work: {one_line(text, 60)}"))
                self.running = True
                self._idle.clear()
                return
            self._settle()
            raise

    def interrupt(self) -> bool:
        if not self.busy:
            return False
        if self.queue:
            self.ui.set_input("\n\n".join(self.queue))
            self.queue.clear()
        self._spawn(self.connection.request("POST", f"/v1/sessions/{self.session_id}/cancel"))
        return True

    def cycle_mode(self) -> Mode:
        i = MODE_CYCLE.index(self.mode) if self.mode in MODE_CYCLE else -1
        mode = MODE_CYCLE[(i + 1) % len(MODE_CYCLE)]
        self.mode = mode  # the next Shift+Tab cycles on from here, before the server answers
        self.refresh()
        self._spawn(self._set_mode(mode))
        return mode

    async def wait(self) -> None:
        """Until the server's work is done and nothing this client sent is under way."""
        while self.busy or self._tasks:
            if self.busy:
                await self._idle.wait()
            if self._tasks:
                await asyncio.wait(set(self._tasks))

    def leave(self) -> None:
        """Detach: the connection closes, the session's work goes on on the server."""
        self.exited = True

    def history_file(self) -> Path | None:
        return None

    def local_files(self) -> Path | None:
        return None

    def command_names(self) -> dict[str, str]:
        return {}

    def status_line(self, show: Any) -> StatusLine | None:
        return None

    # -- the stream --------------------------------------------------------------------------

    def show(self, event: ViewEvent) -> None:
        self.ui.show(event)

    def refresh(self) -> None:
        if self._ui is not None:
            self._ui.refresh_status()

    async def _follow_stream(self) -> None:
        """Follow the stream for as long as the app runs: reconnect after a drop (with the last
        seq seen), reload the transcript after a gap, say so once when the server is away."""
        failures = 0
        while not self.exited:
            try:
                async for frame in self.connection.events(self.session_id, self.last_seq):
                    failures = 0
                    if frame.event == "gap":
                        await self._reload()
                        break
                    self._frame(frame)
                    if frame.event in ("session_closed", "cleared"):
                        return  # unloaded on purpose; or `_switch` follows the new session
                else:
                    if failures == 0 and not self.exited:
                        await asyncio.sleep(RECONNECT[0])  # the stream ended: reconnect
                    failures += 1
                    continue
            except ServerRefused as exc:
                if exc.status == 404:  # the server restarted, or unloaded the session: load it
                    if await self._reopen():
                        continue
                    return
                if failures == 0:
                    self.show(Notice(f"{exc.message}: reconnecting", "warning"))
                failures += 1
                await asyncio.sleep(RECONNECT[min(failures, len(RECONNECT) - 1)])
            except (ValueError, KeyError) as exc:  # a line that is not an event: say, go on
                self.show(Notice(f"a malformed event from the server: {exc}", "warning"))

    async def _reopen(self) -> bool:
        try:
            described = await self.connection.request(
                "POST", "/v1/sessions", {"resume": self.session_id}
            )
        except KeelError as exc:
            self.show(Output(f"the session is gone from the server: {exc.one_line()}", "error"))
            return False
        self._describe(described)
        self.last_seq = 0
        await self._reload(notice="reloaded the session on the server")
        return True

    async def _reload(self, notice: str = "") -> None:
        await self.load()
        self.ui.reset([*self.transcript, *([Notice(notice)] if notice else [])])

    def _frame(self, frame: Frame) -> None:  # noqa: C901 - one case per kind of line
        self.seen.append((frame.id, frame.event))
        if frame.id is not None:
            self.last_seq = frame.id
        data = frame.data
        match frame.event:
            case "status":
                self._status(bool(data.get("busy")))
                return
            case "user_message":
                self.show(PromptSubmitted(str(data.get("text", ""))))
                return
            case "error":
                hint = f" (hint: {data['hint']})" if data.get("hint") else ""
                self.show(Output(f"{data.get('error', '')}{hint}", "error"))
                return
            case "cleared":
                self._spawn(self._switch(str(data["new_session"]), "a fresh context (/clear)"))
                return
            case "session_closed":
                self.show(Notice(f"the server unloaded this session ({data.get('reason')})"))
                return
            case "server_stopping":
                self.show(Notice("the server is stopping: reconnecting when it is back", "warning"))
                return
        event = self.decoder.decode(data)
        match event:
            case None:
                return
            case PermissionAsked():
                self._ask(event)
            case PermissionAnswered(request_id) if request_id not in self._answered:
                task = self._asking.get(request_id)
                if task is not None:
                    task.cancel()  # answered by another client: the card closes
            case QuestionRequest() if event.request_id not in self._questions:
                self._questions[event.request_id] = event
                event.reply.add_done_callback(lambda f: self._spawn(self._reply(event, f)))
                self.show(event)
            case QuestionRequest():
                return  # on screen already (pending when this client came, and on the stream)
            case QuestionAnswered(request_id, action, by):
                question = self._questions.pop(request_id, None)
                if question is not None and not question.reply.done():
                    question.reply.cancel()  # answered by another client: the form closes
                    how = {"accept": "answered", "decline": "declined"}.get(action, action)
                    whom = "in another client" if by == "user" else f"({by})"
                    self.show(Notice(f"{question.source}'s question was {how} {whom}"))
            case ToolFinished(call, result):
                self.show(replace(event, display=rebuilt_diff(call, result, self.project)))
            case UsageUpdated(_turn, total, cost, context, window):
                self.context, self.cost, self.tokens = context, cost, total.total
                self.window = window or self.window
                self.show(event)
            case _:
                self.show(event)

    def _status(self, busy: bool) -> None:
        self.running = busy
        if busy:
            self._sent = False
            self._since = self._since or time.monotonic()
            self._idle.clear()
        else:
            self._settle()
            self._spawn(self._refresh_description())
            if self.queue and not self.exited:
                self._send(self.queue.pop(0))
        self.refresh()

    def _settle(self) -> None:
        if not self.busy:
            self._since = None
            self._idle.set()
            self.refresh()

    async def _refresh_description(self) -> None:
        """The model, mode and cost as the server has them (another client may have changed
        them); a server away now is said by the stream, not here."""
        try:
            described = await self.connection.request("GET", f"/v1/sessions/{self.session_id}")
        except ServerRefused:
            return
        self.model = described.get("model") or self.model
        self.mode = described.get("mode") or self.mode
        self.cost = float(described.get("cost_usd", self.cost))
        self.refresh()

    def _ask(self, event: PermissionAsked) -> None:
        if event.request_id in self._asking:
            return
        task = asyncio.create_task(self._answer(event))
        self._asking[event.request_id] = task
        task.add_done_callback(lambda _t: self._asking.pop(event.request_id, None))

    async def _answer(self, event: PermissionAsked) -> None:
        request = PermissionRequest(
            event.call, event.reason, event.suggestion, event.plan, event.confirm
        )
        from keel.tui.screens import INTERRUPT

        reply = await self.ui.ask(request)
        if self.exited or reply is INTERRUPT:
            return  # Esc stops the run (the app cancelled it); a closing app leaves it to others
        body: dict[str, Any] = {"allow": reply.allow}
        if reply.scope == "always":
            body["always"] = True
        elif reply.scope == "session":
            body["session"] = True
        if reply.reason:
            body["reason"] = reply.reason
        if reply.mode is not None:
            body["mode"] = reply.mode
        self._answered.add(event.request_id)
        path = f"/v1/sessions/{self.session_id}/permissions/{event.request_id}"
        try:
            await self.connection.request("POST", path, body)
        except ServerRefused as exc:
            if exc.status != 404:  # 404: answered elsewhere, or the run stopped (Esc)
                raise
        if reply.mode is not None:
            self.mode = reply.mode
            self.refresh()

    async def _reply(
        self, event: QuestionRequest, future: asyncio.Future[dict[str, Any] | str | None]
    ) -> None:
        if future.cancelled() or self.exited:
            return
        answer = future.result()
        if isinstance(answer, str):
            # This front end cannot show the form (line mode): refusing would refuse it for
            # every client of the session, so it waits for one that can.
            self.show(
                Notice(
                    f"{event.source}'s question waits for a client that shows forms "
                    "(the web page, or keel attach without --no-tui)",
                    "warning",
                )
            )
            return
        body = {"values": answer}
        path = f"/v1/sessions/{self.session_id}/permissions/{event.request_id}"
        try:
            await self.connection.request("POST", path, body)
        except ServerRefused as exc:
            if exc.status != 404:  # 404: another client answered first (its question_answered)
                raise

    async def _switch(self, session_id: str, why: str) -> None:
        """Follow another session of the server from now on (after /clear, /fork)."""
        described = await self.connection.request("GET", f"/v1/sessions/{session_id}")
        self._describe(described)
        if self.busy:
            self._idle.clear()
        else:
            self._settle()
        self.last_seq = 0
        self.decoder = EventDecoder()
        await self.load()
        self.ui.reset([*self.transcript, Notice(f"{why}: now session {session_id}")])
        self.refresh()
        if self._follow is not None and asyncio.current_task() is not self._follow:
            self._follow.cancel()
        self._follow = asyncio.create_task(self._follow_stream())

    # -- commands ----------------------------------------------------------------------------

    def _spawn(self, work: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.create_task(self._guarded(work))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _guarded(self, work: Coroutine[Any, Any, Any]) -> None:
        try:
            await work
        except KeelError as exc:
            if self._ui is not None:
                self.show(Output(exc.one_line(), "error"))

    async def _pins(self, name: str, args: str) -> None:
        """`/pin TEXT`, `/pin` (the list) and `/unpin N` on the server's session."""
        s = f"/v1/sessions/{self.session_id}/pins"
        if name == "unpin":
            if not args.isdigit():
                raise UserError(f"/unpin {args}: not a pin number", hint="/pin lists them")
            done = await self.connection.request("DELETE", f"{s}/{args}")
            self.show(Notice(f"unpinned: {done['unpinned']}"))
        elif args:
            await self.connection.request("POST", s, {"text": args})
            self.show(Notice(f"pinned: {' '.join(args.split())}"))
        else:
            listed = await self.connection.request("GET", s)
            self.show(Output(cmds.pins_text(listed["pins"], listed["keep"]), title="pins"))

    async def _command(self, name: str, args: str) -> None:
        s = f"/v1/sessions/{self.session_id}"
        match name:
            case "help":
                lines = ["**Commands of an attached session**", ""]
                lines += [f"- `/{n}`: {what}" for n, what in REMOTE_COMMANDS.items()]
                lines += [
                    "",
                    "Skills and custom commands of the project run on the server as prompts.",
                ]
                self.show(Output("\n".join(lines), title="help"))
            case "exit" | "quit":
                self.leave()
                self.ui.exit()
            case "mode":
                choice = args or await self.ui.pick(
                    "Permission mode",
                    [Choice(m, m, "(now)" if m == self.mode else "") for m in MODES],
                )
                if choice:
                    await self._set_mode(parse_mode(choice.strip()))
            case "model":
                if not args:
                    raise UserError(
                        f"the model is {self.model}", hint="/model PROVIDER/MODEL switches it"
                    )
                described = await self.connection.request("PATCH", s, {"model": args})
                self.model = described.get("model") or args
                self.window = _window(self.model)
                self.show(Notice(f"model: {self.model} (from the next request on)"))
                self.refresh()
            case "undo":
                undone = await self.connection.request("POST", f"{s}/undo")
                self.show(Output(_undo_text(undone), title="undo"))
            case "compact":
                body = {"instructions": args} if args else {}
                self._sent = True
                self._idle.clear()
                try:
                    done = await self.connection.request("POST", f"{s}/compact", body)
                finally:
                    self._sent = False
                    self._settle()
                self.show(
                    Notice(
                        f"compacted: {tokens(done['tokens_before'])} → "
                        f"{tokens(done['tokens_after'])} tokens"
                    )
                )
            case "pin" | "unpin":
                await self._pins(name, args.strip())
            case "clear":
                await self.connection.request("POST", f"{s}/clear")  # `cleared` switches
            case "fork":
                fork = await self.connection.request("POST", f"{s}/fork", {"load": True})
                await self._switch(fork["id"], f"forked from {self.session_id}")
            case "cost":
                described = await self.connection.request("GET", s)
                usage = described.get("usage") or {}
                self.show(
                    Output(
                        f"**Session cost:** {fmt_cost(float(described['cost_usd']))} over "
                        f"{described['turns']} model turns\n\n- input: "
                        f"{tokens(int(usage.get('input', 0)))}, output: "
                        f"{tokens(int(usage.get('output', 0)))}",
                        title="cost",
                    )
                )

    async def _set_mode(self, mode: Mode) -> None:
        async with self._patching:  # in the order they were asked for (a lock is first come)
            try:
                described = await self.connection.request(
                    "PATCH", f"/v1/sessions/{self.session_id}", {"mode": mode}
                )
            finally:
                self._spawn(self._refresh_description())
        self.mode = described.get("mode") or mode
        self.show(Notice(f"mode: {self.mode}"))
        self.refresh()

    async def close(self) -> None:
        """Stop following (the session goes on on the server) and close the connection."""
        self.exited = True
        for task in [*self._tasks, *self._asking.values()]:
            task.cancel()
        if self._follow is not None:
            self._follow.cancel()
            await asyncio.gather(self._follow, return_exceptions=True)
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.connection.aclose()


def _window(model: str) -> int:
    """The model's context window from the catalog (0: unknown here)."""
    from keel.llm.catalog import parse_model
    from keel.llm.provider import model_info

    try:
        return model_info(parse_model(model)).window
    except (KeelError, ValueError):
        return 0


def _undo_text(undone: dict[str, Any]) -> str:
    lines = [f"Undid **{undone.get('label') or 'the last prompt'}**"]
    lines += [f"- restored `{p}`" for p in undone.get("restored", [])]
    lines += [f"- removed `{p}`" for p in undone.get("removed", [])]
    lines += [f"- could not put back `{f['path']}`: {f['why']}" for f in undone.get("failed", [])]
    return "\n".join(lines)


__all__ = [
    "REMOTE_COMMANDS",
    "Connection",
    "Frame",
    "RemoteController",
    "ServerRefused",
    "conversation_view",
    "open_session",
]
