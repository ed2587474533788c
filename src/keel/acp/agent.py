"""`KeelAcpAgent`: keel's sessions served to an Agent Client Protocol client (an editor) on one
connection. A front end: it opens agents through `keel.app`, turns their events into
`session/update` notifications (keel.acp.updates), routes permission questions to the client
(`session/request_permission`) and the answers back (`Agent.answer`), and offers the permission
mode and the model as session config options (`session/set_config_option`), and nothing else.

A loaded session goes on with the model it was made with (its `meta` record names it), whatever
`keel acp --model` says: that flag chooses the model of new sessions. The editor switches a
session's model through the config option, between prompts, as `/model` does in the TUI.

Each session has one outbox and one pump task that sends what the agent's events became, in
order; a permission question is sent from the pump in its place in that order, and answered in a
task of its own (the agent waits for that call only). A prompt's response is sent after every
update it caused. It never writes to stdout itself (the connection owns it) and never decides
what may run: the gate does, exactly as in the TUI.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import field, replace
from pathlib import Path
from typing import Any

from acp import PROTOCOL_VERSION, RequestError
from acp.helpers import text_block, tool_content
from acp.interfaces import Client
from acp.schema import (
    AgentCapabilities,
    AllowedOutcome,
    AuthenticateResponse,
    ClientCapabilities,
    DeniedOutcome,
    HttpMcpServer,
    Implementation,
    InitializeResponse,
    ListSessionsResponse,
    LoadSessionResponse,
    McpServerStdio,
    NewSessionResponse,
    PermissionOption,
    PromptCapabilities,
    PromptResponse,
    SessionCapabilities,
    SessionInfo,
    SessionListCapabilities,
    SetSessionConfigOptionResponse,
    SetSessionModeResponse,
    SseMcpServer,
    ToolCallStart,
    ToolCallUpdate,
)

from keel import __version__
from keel.acp import updates as up
from keel.agent.events import (
    AssistantMessage,
    Event,
    PermissionAnswered,
    PermissionAsked,
    QuestionRequest,
    SubagentEvent,
    ToolFinished,
    ToolStarted,
)
from keel.agent.loop import Agent, RunResult
from keel.errors import KeelError, UserError
from keel.frozen import mutable
from keel.llm.catalog import BY_PROVIDER, ModelRef, parse_model
from keel.llm.events import Notice, TextDelta, ThinkingDelta
from keel.llm.messages import ToolUse
from keel.permissions.gate import Mode, PermissionGate, PermissionReply, parse_mode

log = logging.getLogger("keel.acp")

#: What keel answers an MCP server's question (elicitation): ACP has no stable way to ask it.
NO_QUESTIONS = "the editor cannot answer this question: keel's ACP agent does not relay questions"


@mutable
class Defaults:
    """What `keel acp`'s command line sets for every session it opens."""

    model: str | None = None
    mode: str | None = None
    effort: str | None = None
    allowed_tools: list[str] = field(default_factory=list)
    disallowed_tools: list[str] = field(default_factory=list)
    debug: bool = False
    #: `session/load` goes on when the configuration changed since the session ran (`--force`).
    force: bool = False


@mutable
class _Ask:
    """A permission question to send to the client, in its place among the updates."""

    event: PermissionAsked


@mutable
class _Flush:
    """Resolved once everything queued before it was sent."""

    done: asyncio.Future[None]


_Item = up.Update | _Ask | _Flush


@mutable
class _Session:
    id: str
    agent: Agent
    cwd: Path
    outbox: asyncio.Queue[_Item] = field(default_factory=asyncio.Queue)
    pump: asyncio.Task[None] | None = None
    #: Tool calls the client has been told of.
    announced: set[str] = field(default_factory=set)
    #: The mode the client was last told.
    mode: str = "default"
    #: The model (`provider/model`) the next request goes to.
    model: str = ""
    #: The model the session was opened with (always offered, so the editor can go back).
    opened_with: str = ""
    #: Permission questions out with the client, by request id.
    asks: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    running: asyncio.Task[RunResult] | None = None
    #: The session was loaded with a turn left unfinished: it goes on before the next prompt.
    unfinished: bool = False
    cancelled: bool = False

    def put(self, item: _Item) -> None:
        self.outbox.put_nowait(item)


def _gate_mode(agent: Agent) -> str:
    mode = getattr(agent.gate, "mode", "default")
    return mode if isinstance(mode, str) else "default"


def _user_error(exc: KeelError) -> RequestError:
    """keel's one-line message (with its hint) as the error an editor shows."""
    return RequestError(-32602, exc.one_line())


class KeelAcpAgent:
    """The ACP agent (the `acp.Agent` protocol): one per connection, many sessions."""

    def __init__(self, defaults: Defaults | None = None) -> None:
        self.defaults = defaults or Defaults()
        self._conn: Client | None = None
        self._sessions: dict[str, _Session] = {}
        self.client_capabilities: ClientCapabilities | None = None
        #: Notices of opening each session, shown with its first prompt.
        self._pending_notices: dict[str, list[Notice]] = {}

    def on_connect(self, conn: Client) -> None:
        self._conn = conn

    @property
    def conn(self) -> Client:
        if self._conn is None:
            raise RuntimeError("the ACP agent is not connected")
        return self._conn

    # -- initialisation ----------------------------------------------------------------------------

    async def initialize(
        self,
        protocol_version: int,
        client_capabilities: ClientCapabilities | None = None,
        client_info: Implementation | None = None,
        **kwargs: Any,
    ) -> InitializeResponse:
        self.client_capabilities = client_capabilities
        return InitializeResponse(
            # The client's version if keel speaks it, else the latest keel speaks.
            protocol_version=min(protocol_version, PROTOCOL_VERSION),
            agent_capabilities=AgentCapabilities(
                load_session=True,
                session_capabilities=SessionCapabilities(list=SessionListCapabilities()),
                prompt_capabilities=PromptCapabilities(
                    image=False, audio=False, embedded_context=True
                ),
            ),
            agent_info=Implementation(name="keel", title="keel", version=__version__),
            auth_methods=[],
        )

    async def authenticate(self, method_id: str, **kwargs: Any) -> AuthenticateResponse | None:
        raise RequestError.invalid_params(
            {"details": "keel needs no authentication over ACP: it reads the provider's API key"}
        )

    # -- sessions ----------------------------------------------------------------------------------

    def _options(self, cwd: str) -> Any:
        from keel.app import Options

        path = Path(cwd)
        if not path.is_absolute():
            raise RequestError.invalid_params({"details": f"cwd must be absolute, not {cwd!r}"})
        if not path.is_dir():
            raise RequestError.invalid_params({"details": f"cwd {cwd} is not a directory"})
        d = self.defaults
        return Options(
            cwd=path,
            model=d.model,
            effort=d.effort,
            mode=d.mode,
            allowed_tools=list(d.allowed_tools),
            disallowed_tools=list(d.disallowed_tools),
            interactive=True,
            debug=d.debug,
            force=d.force,
        )

    def _mcp_note(self, servers: list[Any] | None) -> None:
        if servers:
            names = ", ".join(getattr(s, "name", "?") for s in servers)
            log.warning(
                "keel acp: the editor's MCP servers are not connected (%s); configure them in "
                ".mcp.json or keel's settings",
                names,
            )

    def _register(self, agent: Agent, cwd: Path, model: str) -> _Session:
        session = _Session(
            agent.session_id, agent, cwd, mode=_gate_mode(agent), model=model, opened_with=model
        )
        session.pump = asyncio.create_task(self._pump(session), name=f"acp-pump-{session.id}")
        agent.on_background_event = lambda e: self._on_event(session, e)
        if isinstance(agent.gate, PermissionGate):
            agent.gate.save_rule = lambda rule: self._save_rule(session, rule)
        self._sessions[session.id] = session
        return session

    def _save_rule(self, session: _Session, rule: str) -> None:
        """An "always" answer: the rule goes to the project's `.keel/settings.local.json`, as
        in the TUI; the editor is told where (or why not)."""
        # Borrowed from the TUI, whose rule file this is too, until it moves below the front
        # ends (keel.config).
        from keel.config.local_rules import save_local_rule

        try:
            path = save_local_rule(session.cwd, rule)
        except (UserError, OSError) as exc:
            why = exc.one_line() if isinstance(exc, UserError) else str(exc)
            self._on_event(session, Notice(f"could not save the rule {rule}: {why}", "warning"))
            return
        shown = path.relative_to(session.cwd) if path.is_relative_to(session.cwd) else path
        self._on_event(session, Notice(f"always allowed {rule} (saved to {shown})"))

    async def new_session(
        self,
        cwd: str,
        additional_directories: list[str] | None = None,
        mcp_servers: list[HttpMcpServer | SseMcpServer | McpServerStdio] | None = None,
        **kwargs: Any,
    ) -> NewSessionResponse:
        from keel.app import choose_model, open_agent, read_settings

        options = self._options(cwd)
        self._mcp_note(mcp_servers)
        notices: list[Event] = []
        try:
            settings = read_settings(options.cwd, notices.append)
            ref = choose_model(options.model, settings)
            agent = await open_agent(options, notices.append, settings=settings, ref=ref)
        except KeelError as exc:
            raise _user_error(exc) from None
        session = self._register(agent, options.cwd, str(ref))
        self._held_notices(session, notices)
        return NewSessionResponse(
            session_id=session.id,
            modes=up.mode_state(_mode(session.mode)),
            config_options=self._config_options(session),
        )

    async def load_session(
        self,
        cwd: str,
        session_id: str,
        mcp_servers: list[HttpMcpServer | SseMcpServer | McpServerStdio] | None = None,
        additional_directories: list[str] | None = None,
        **kwargs: Any,
    ) -> LoadSessionResponse | None:
        from keel.app import resume_agent
        from keel.session.index import find_session
        from keel.session.journal import read_records
        from keel.session.records import Meta

        options = self._options(cwd)
        self._mcp_note(mcp_servers)
        session = self._sessions.get(session_id)
        try:
            path = find_session(session_id, options.cwd)
            records = read_records(path).records
        except (KeelError, OSError) as exc:
            if isinstance(exc, KeelError):
                raise _user_error(exc) from None
            raise RequestError.invalid_params({"details": f"cannot read session: {exc}"}) from None
        meta = records[0].payload if records else None
        if not isinstance(meta, Meta) or meta.id != session_id:
            raise RequestError.invalid_params({"details": f"no session {session_id}"})
        if Path(meta.cwd) != options.cwd:
            raise _user_error(
                UserError(
                    f"session {session_id} belongs to {meta.cwd}, not {cwd}",
                    hint="open it from its own project",
                )
            )
        if session is None:
            notices: list[Event] = []
            try:
                # With the model the session was made with, not `--model` (the editor may
                # switch it afterwards through the config option).
                opened = await resume_agent(path, replace(options, model=None), notices.append)
            except KeelError as exc:
                raise _user_error(exc) from None
            session = self._register(opened.agent, options.cwd, str(opened.ref))
            session.unfinished = opened.agent.resumable
            self._held_notices(session, notices)
        for update in up.replay(records, options.cwd):
            if isinstance(update, ToolCallStart):
                session.announced.add(update.tool_call_id)
            session.put(update)
        await self._flush(session)
        return LoadSessionResponse(
            modes=up.mode_state(_mode(session.mode)), config_options=self._config_options(session)
        )

    def _held_notices(self, session: _Session, notices: list[Event]) -> None:
        """What opening the agent had to say: logged now, and shown with the first prompt (the
        client cannot place updates of a session it does not know yet)."""
        held = [n for n in notices if isinstance(n, Notice)]
        for notice in held:
            log.warning("keel: %s", notice.text)
        self._pending_notices[session.id] = held

    async def list_sessions(
        self, cwd: str | None = None, cursor: str | None = None, **kwargs: Any
    ) -> ListSessionsResponse:
        """keel's sessions (of the project at `cwd`, else of every project), the latest active first, each
        titled by its first prompt; sessions never prompted are left out."""
        from keel.session.index import session_files

        if cwd is not None and not Path(cwd).is_absolute():
            raise RequestError.invalid_params({"details": f"cwd must be absolute, not {cwd!r}"})
        start = 0
        if cursor is not None:
            if not cursor.isdigit():
                raise RequestError.invalid_params(
                    {"details": f"not a cursor keel gave: {cursor!r}"}
                )
            start = int(cursor)
        files = session_files(Path(cwd) if cwd is not None else None)
        found = [info for path in _by_activity(files) if (info := _session_info(path)) is not None]
        page = found[start : start + LIST_PAGE]
        more = start + LIST_PAGE < len(found)
        return ListSessionsResponse(
            sessions=page, next_cursor=str(start + LIST_PAGE) if more else None
        )

    async def set_session_mode(
        self, mode_id: str, session_id: str, **kwargs: Any
    ) -> SetSessionModeResponse | None:
        session = self._session(session_id)
        self._set_mode(session, mode_id)
        # The mode is a config option too: the editor's view of it follows.
        session.put(up.config_update(self._config_options(session)))
        await self._flush(session)
        return SetSessionModeResponse()

    def _set_mode(self, session: _Session, value: str) -> None:
        try:
            mode = parse_mode(value)
            session.agent.set_mode(mode)
        except KeelError as exc:
            raise _user_error(exc) from None
        session.mode = mode

    async def set_config_option(
        self, config_id: str, session_id: str, value: str | bool, **kwargs: Any
    ) -> SetSessionConfigOptionResponse | None:
        """`mode` (keel's permission modes) or `model` (`provider/model`); the answer holds
        every option with its value now."""
        session = self._session(session_id)
        if config_id not in (up.MODE_OPTION, up.MODEL_OPTION):
            raise RequestError.invalid_params(
                {"details": f"unknown config option {config_id!r}: keel has mode and model"}
            )
        if not isinstance(value, str):
            raise RequestError.invalid_params({"details": f"{config_id} takes a value id"})
        if config_id == up.MODE_OPTION:
            self._set_mode(session, value)
            # For an editor that shows the session's modes rather than its config options.
            session.put(up.mode_update(_mode(session.mode)))
            await self._flush(session)
        else:
            await self._switch_model(session, value)
        return SetSessionConfigOptionResponse(config_options=self._config_options(session))

    async def _switch_model(self, session: _Session, spec: str) -> None:
        """The session's next request goes to `spec`, as the TUI's `/model` does it; refused
        while a prompt runs, and when the model cannot be used (the old one stays)."""
        from keel.app import read_settings
        from keel.llm.provider import RetryPolicy, make_provider, model_info

        agent = session.agent
        if session.running is not None or agent.busy:
            raise RequestError.invalid_request(
                {"details": "a prompt is running in this session; switch the model after it"}
            )
        try:
            ref = parse_model(spec)
            if str(ref) == session.model:
                return
            settings = read_settings(session.cwd, lambda _notice: None)
            retries = self._options(str(session.cwd)).max_retries
            provider = make_provider(
                ref, settings=settings, retry=RetryPolicy(attempts=retries + 1), unattended=False
            )
        except KeelError as exc:
            raise _user_error(exc) from None
        old, agent.provider = agent.provider, provider
        agent.model = ref.model
        agent.info = model_info(ref, settings.models)
        session.model = str(ref)
        if old is not provider:
            await old.aclose()
        log.info("keel acp: session %s now uses %s", session.id, ref)

    def _config_options(self, session: _Session) -> list[up.ConfigOption]:
        return up.config_options(_mode(session.mode), session.model, self._models(session))

    def _models(self, session: _Session) -> list[up.ModelChoice]:
        """The models an editor is offered, in an order that stays put: the one the session was
        opened with, `--model`'s, the one it uses now, then the catalog's models of their
        providers (the ones keel is set up for here)."""
        named: list[ModelRef] = []
        for spec in (session.opened_with, self.defaults.model, session.model):
            try:
                named.append(parse_model(spec or ""))
            except KeelError:
                continue
        catalog = [
            ModelRef(provider, model)
            for provider in dict.fromkeys(r.provider for r in named)
            for model in BY_PROVIDER.get(provider, {})
        ]
        return [_model_choice(ref) for ref in dict.fromkeys([*named, *catalog])]

    def _session(self, session_id: str) -> _Session:
        session = self._sessions.get(session_id)
        if session is None:
            raise RequestError.invalid_params(
                {"details": f"unknown session {session_id}: create it with session/new or load it"}
            )
        return session

    # -- prompts -----------------------------------------------------------------------------------

    async def prompt(
        self, prompt: list[up.PromptBlock], session_id: str, **kwargs: Any
    ) -> PromptResponse:
        from keel.agent.mentions import attach
        from keel.tools.builtin.files import stamp

        session = self._session(session_id)
        agent = session.agent
        if session.running is not None or agent.busy:
            raise RequestError.invalid_request(
                {"details": "a prompt is already running in this session; cancel it first"}
            )
        try:
            given = up.prompt_text(prompt, session.cwd)
        except up.UnsupportedContent as exc:
            raise RequestError.invalid_params({"details": str(exc)}) from None
        text = given.text
        # Mentions are looked for in what was typed only, never in an attached buffer.
        sent, attachments = attach(text, session.cwd, refuse=agent.import_refusal)
        sent = "\n\n".join([sent, *given.attached])
        for a in attachments:  # as the TUI does: a file attached whole counts as read
            if a.complete and a.resolved.is_file():
                agent.ctx.read_files[a.resolved] = stamp(a.resolved)
        for notice in self._pending_notices.pop(session.id, []):
            self._on_event(session, notice)
        session.cancelled = False
        session.running = asyncio.create_task(self._run(session, sent, text))
        try:
            result = await asyncio.shield(session.running)
        except asyncio.CancelledError:  # the connection is closing
            agent.interrupt("the editor went away")
            await asyncio.gather(session.running, return_exceptions=True)
            raise
        finally:
            session.running = None
        self._check_mode(session)
        await self._flush(session)
        if session.cancelled:
            return PromptResponse(stop_reason="cancelled")
        if result.stop_reason == "error":
            raise RequestError(-32603, result.error or "the run failed")
        return PromptResponse(stop_reason=up.stop_reason(result.stop_reason))

    async def _run(self, session: _Session, prompt: str, label: str) -> RunResult:
        agent = session.agent

        def sink(event: Event) -> None:
            self._on_event(session, event)

        if session.unfinished:
            session.unfinished = False
            sink(Notice("continuing the turn this session stopped in"))
            result = await agent.resume(sink)
            if result.stop_reason != "end_turn":
                return result
            sink(TextDelta("\n\n"))  # that turn's last words and this prompt's apart
        return await agent.run(prompt, sink, label=label)

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        session = self._sessions.get(session_id)
        if session is None:
            return
        if session.running is not None:
            session.cancelled = True
            session.agent.interrupt("cancelled by the editor")

    # -- events → updates --------------------------------------------------------------------------

    def _on_event(self, session: _Session, event: Event, label: str = "") -> None:
        """Called synchronously for every event, in order: translate and queue, never block,
        never raise into the loop (an event keel cannot show is logged and left out)."""
        try:
            self._translate(session, event, label)
        except Exception:
            log.exception("keel acp: could not show a %s event", type(event).__name__)

    def _translate(self, session: _Session, event: Event, label: str) -> None:
        """`label` names the subagent an event comes from (only its tool calls are shown)."""
        match event:
            case SubagentEvent(agent=name, event=inner):
                self._translate(session, inner, f"{label} › {name}" if label else name)
            case TextDelta(text=text) if not label:
                session.put(up.message_chunk(text))
            case ThinkingDelta(text=text) if not label:
                session.put(up.thought_chunk(text))
            case Notice(text=text, level=level) if not label:
                # A warning (no sandbox, a budget reached) is shown; progress is a thought.
                text = f"⚠ {text}\n\n" if level == "warning" else f"{text}\n"
                session.put(
                    up.message_chunk(text) if level == "warning" else up.thought_chunk(text)
                )
            case AssistantMessage() | ToolStarted() | ToolFinished():
                self._on_tool_event(session, event, label)
            case PermissionAsked(call=call):
                self._announce(session, call, label)
                session.put(_Ask(event))
            case PermissionAnswered(request_id=request_id, by=by):
                ask = session.asks.get(request_id)
                if ask is not None and by != "user":  # answered otherwise: withdraw it
                    ask.cancel()
                self._check_mode(session)
            case QuestionRequest(request_id=request_id, reply=reply):
                asyncio.get_running_loop().call_soon(
                    self._refuse_question, session, request_id, reply
                )
            case _:
                pass

    def _on_tool_event(
        self, session: _Session, event: AssistantMessage | ToolStarted | ToolFinished, label: str
    ) -> None:
        match event:
            case AssistantMessage(message=message):
                for call in message.tool_uses:
                    self._announce(session, call, label)
            case ToolStarted(call=call) if call.name != up.PLAN_TOOL:
                self._announce(session, call, label)
                session.put(up.started(call))
            case ToolFinished(call=call, result=result, display=display):
                if call.name == up.PLAN_TOOL:
                    if (plan := up.plan_of(call, result, display)) is not None:
                        session.put(plan)
                else:
                    self._announce(session, call, label)
                    session.put(up.finished(call, result, session.cwd))
                if call.name == "exit_plan_mode":
                    self._check_mode(session)
            case _:
                pass

    def _announce(self, session: _Session, call: ToolUse, label: str) -> None:
        if call.name == up.PLAN_TOOL or call.id in session.announced:
            return
        session.announced.add(call.id)
        session.put(up.announce(call, session.cwd, label=label))

    def _check_mode(self, session: _Session) -> None:
        """Tell the client when the agent's mode changed (a plan approved): as the session's
        mode and as its config option."""
        mode = _gate_mode(session.agent)
        if mode != session.mode and mode in up.MODE_INFO:
            session.mode = mode
            session.put(up.mode_update(_mode(mode)))
            session.put(up.config_update(self._config_options(session)))

    @staticmethod
    def _refuse_question(session: _Session, request_id: str, reply: asyncio.Future[Any]) -> None:
        answer = getattr(session.agent, "answer", None)
        if request_id and answer is not None and answer(request_id, NO_QUESTIONS):
            return
        if not reply.done():
            reply.set_result(NO_QUESTIONS)

    # -- the pump ----------------------------------------------------------------------------------

    async def _pump(self, session: _Session) -> None:
        while True:
            item = await session.outbox.get()
            if isinstance(item, _Flush):
                if not item.done.done():
                    item.done.set_result(None)
            elif isinstance(item, _Ask):
                rid = item.event.request_id
                session.asks[rid] = asyncio.create_task(self._ask(session, item.event))
                await asyncio.sleep(0)  # let it queue its request before the next update
            else:
                try:
                    await self.conn.session_update(session_id=session.id, update=item)
                except ConnectionError:
                    log.warning("keel acp: the client went away; update dropped")
                except Exception:  # one bad update must not stop the ones after it
                    log.exception("keel acp: could not send a %s update", type(item).__name__)

    async def _flush(self, session: _Session) -> None:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        session.put(_Flush(done))
        if session.pump is None or session.pump.done():
            return  # nothing sends any more (the connection is closing)
        await asyncio.wait({done, session.pump}, return_when=asyncio.FIRST_COMPLETED)

    async def _ask(self, session: _Session, event: PermissionAsked) -> None:
        """Ask the client; its answer (or the failure to get one: a denial) goes to the agent."""
        from pydantic import ValidationError

        plan = event.call.name == "exit_plan_mode"
        try:
            response = await self.conn.request_permission(
                session_id=session.id,
                tool_call=_question(event, session.cwd),
                options=_options(event, plan=plan),
            )
            reply = _reply(response.outcome, event, plan=plan)
        except asyncio.CancelledError:
            return  # answered otherwise (the run stopped, or a hook answered)
        except (RequestError, ConnectionError, ValidationError) as exc:
            reply = PermissionReply(False, reason=f"the editor did not answer ({exc})")
        finally:
            session.asks.pop(event.request_id, None)
        answer: Callable[[str, PermissionReply], bool] | None = getattr(
            session.agent, "answer", None
        )
        if answer is None or not answer(event.request_id, reply):
            log.info("keel acp: permission %s was no longer pending", event.request_id)

    # -- teardown ----------------------------------------------------------------------------------

    async def close(self) -> None:
        """End every session: interrupt what runs, close the agents (their locks released)."""
        for session in list(self._sessions.values()):
            if session.running is not None:
                session.agent.interrupt("the editor went away")
                await asyncio.gather(session.running, return_exceptions=True)
            for task in list(session.asks.values()):
                task.cancel()
            if session.pump is not None:
                session.pump.cancel()
                await asyncio.gather(session.pump, return_exceptions=True)
            try:
                await session.agent.aclose()
            except Exception:
                log.exception("keel acp: closing session %s failed", session.id)
        self._sessions.clear()


#: Sessions per `session/list` page.
LIST_PAGE = 100


def _by_activity(paths: list[Path]) -> list[Path]:
    """Most recently written first (a file that vanished meanwhile goes last)."""

    def written(path: Path) -> int:
        try:
            return path.stat().st_mtime_ns
        except OSError:
            return 0

    return sorted(paths, key=written, reverse=True)


def _session_info(path: Path) -> SessionInfo | None:
    """A session file as `session/list` shows it: None for a file keel cannot read or a
    session with no prompt yet."""
    from datetime import UTC, datetime

    from keel.session.records import Meta, RecordError, UserRecord, decode

    meta: Meta | None = None
    title = ""
    try:
        with path.open("rb") as f:
            for number, line in enumerate(f):
                if number == 0:
                    head = decode(line).payload
                    if not isinstance(head, Meta):
                        return None
                    meta = head
                elif b'"type":"user"' in line:
                    record = decode(line).payload
                    if isinstance(record, UserRecord) and record.source == "prompt":
                        title = up.typed_prompt(record.message.text).strip()
                        break
                if number > 10_000:
                    break
        mtime = path.stat().st_mtime
    except (OSError, RecordError):
        return None
    if meta is None or not title:
        return None
    return SessionInfo(
        session_id=meta.id,
        cwd=meta.cwd,
        title=_one_line(title),
        updated_at=datetime.fromtimestamp(mtime, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    )


def _one_line(text: str, width: int = 80) -> str:
    first = text.splitlines()[0] if text else ""
    return first if len(first) <= width else first[: width - 1] + "…"


def _mode(value: str) -> Mode:
    return parse_mode(value)


def _model_choice(ref: ModelRef) -> up.ModelChoice:
    """`ref` as the model option offers it, with its window and prices when the catalog knows
    them."""
    info = BY_PROVIDER.get(ref.provider, {}).get(ref.model)
    if info is None:
        return up.ModelChoice(str(ref))
    about = f"{info.window // 1000}k context window"
    if info.input_price is not None and info.output_price is not None:
        about += f", ${info.input_price:g} in / ${info.output_price:g} out per Mtok"
    return up.ModelChoice(str(ref), about)


def _question(event: PermissionAsked, cwd: Path) -> ToolCallUpdate:
    """The call a permission question is about, as the client shows it."""
    call = event.call
    content: list[up.ToolContent]
    if event.call.name == "exit_plan_mode":
        plan = event.plan or str((call.input or {}).get("plan", ""))
        content = [tool_content(text_block(plan))]
    else:
        content = up.diffs(call, cwd) or [
            tool_content(text_block(f"keel needs your permission to {event.reason}"))
        ]
    heading = up.title(call)
    return ToolCallUpdate(
        tool_call_id=call.id,
        title=f"{event.agent}: {heading}" if event.agent else heading,
        kind=up.kind(call.name),
        status="pending",
        content=content,
        locations=up.locations(call, cwd) or None,
        raw_input=call.input,
    )


#: Plan approval: which mode each "yes" switches to.
PLAN_OPTIONS: dict[str, Mode] = {"accept-edits": "accept-edits", "default": "default"}


def _options(event: PermissionAsked, *, plan: bool) -> list[PermissionOption]:
    if plan:
        return [
            PermissionOption(
                option_id="accept-edits", name="Yes, and accept edits", kind="allow_always"
            ),
            PermissionOption(
                option_id="default", name="Yes, and ask before edits", kind="allow_once"
            ),
            PermissionOption(option_id="reject_once", name="No, keep planning", kind="reject_once"),
        ]
    options = [PermissionOption(option_id="allow_once", name="Allow once", kind="allow_once")]
    if event.suggestion:  # "always" saves this rule; without one there is nothing to save
        options.append(
            PermissionOption(
                option_id="allow_always",
                name=f"Always allow {event.suggestion}",
                kind="allow_always",
            )
        )
    options.append(PermissionOption(option_id="reject_once", name="Reject", kind="reject_once"))
    return options


def _reply(
    outcome: AllowedOutcome | DeniedOutcome, event: PermissionAsked, *, plan: bool
) -> PermissionReply:
    """The client's choice as keel's answer. Anything but an offered "allow" denies."""
    if isinstance(outcome, DeniedOutcome):
        return PermissionReply(False, reason="the prompt was cancelled")
    choice = outcome.option_id
    if plan:
        if choice in PLAN_OPTIONS:
            return PermissionReply(True, mode=PLAN_OPTIONS[choice])
        return PermissionReply(False, reason="the user chose to keep planning")
    if choice == "allow_once":
        return PermissionReply(True, scope="once")
    if choice == "allow_always" and event.suggestion:
        return PermissionReply(True, scope="always")
    if choice == "reject_once":
        return PermissionReply(False)
    return PermissionReply(
        False, reason=f"the editor chose an option keel did not offer ({choice!r})"
    )


__all__ = ["NO_QUESTIONS", "Defaults", "KeelAcpAgent"]
