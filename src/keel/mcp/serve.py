"""keel as an MCP server (`keel mcp serve`, docs/mcp-server.md): another agent calls keel's tools
(`keel_run`, `keel_reply`, `keel_session`, `keel_sessions`) to run tasks in this server's project.

A front end like `keel -p`: each call opens an agent through `keel.app`, runs it to the end in
a task of its own, and turns its events into MCP progress notifications; a permission question
goes to the client as `elicitation/create` (when it declared the capability and the connection
can carry a request from the server), else it is refused as a headless run refuses it. A
`notifications/cancelled` for the call interrupts the run: its session is journaled as
`interrupted` and stays resumable with `keel_reply`.

It never decides what may run (the gate does, as in `keel -p`), never writes to stdout (the
transport owns it) and imports the `mcp` SDK, so only `keel mcp serve` imports this module.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import sys
import time
import traceback
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import field
from pathlib import Path
from typing import Annotated, Any, Literal

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
from mcp_types import CallToolResult, InputRequiredResult, TextContent, ToolAnnotations
from pydantic import BaseModel, Field, ValidationError

from keel import __version__
from keel.agent.events import (
    Event,
    PermissionAsked,
    RequestStarted,
    SubagentEvent,
    ToolFinished,
    ToolStarted,
    TurnStarted,
)
from keel.agent.loop import Agent, RunResult
from keel.errors import KeelError, UserError
from keel.frozen import mutable
from keel.permissions.gate import PermissionGate, PermissionReply

#: What the server does with a permission question: `ask` the client (elicitation) when it can
#: answer, else refuse; `refuse` always (what would ask is denied, as `keel -p` denies it).
Permissions = Literal["ask", "refuse"]
RunMode = Literal["default", "accept-edits", "plan", "bypass"]

#: What the model sees when a question was refused: the client cannot answer, or the server's
#: owner said never to ask (`--permissions refuse`).
REFUSED = {
    "client": "permission needed, but nobody can answer it: keel runs as an MCP server whose "
    "client cannot answer questions here (MCP elicitation); the caller may pass mode "
    "accept-edits, or the server's owner may allow it with keel mcp serve --allowed-tools",
    "setting": "permission needed, but keel runs as an MCP server that asks no questions "
    "(--permissions refuse); the caller may pass mode accept-edits, or the server's owner may "
    "allow it with keel mcp serve --allowed-tools",
}
INTERRUPTED = "cancelled by the MCP client"
#: How a question reaches the client: an `elicitation/create` request within the call, or (the
#: 2026-07-28 protocol, where a call carries no request from the server) the call's result is
#: an `input_required` one and the client's next round carries the answer. None: refused.
Asking = Literal["request", "rounds"] | None
ROUNDS_PROTOCOL = "2026-07-28"
#: The key of the answer in an `input_required` result's requests.
ANSWER_KEY = "permission"
#: How long a run waits for the next round that answers its question before it is stopped.
PARK_SECONDS = 600.0


@mutable
class ServeOptions:
    """What `keel mcp serve`'s command line sets for every run."""

    #: The project: runs happen in it (or a directory under it), sessions are read from it.
    project: Path
    model: str | None = None
    #: The mode a run starts in when the call names none (None: the settings').
    mode: str | None = None
    permissions: Permissions = "ask"
    #: A call may ask for mode `bypass` (it may never without this).
    allow_bypass: bool = False
    allowed_tools: list[str] = field(default_factory=list)
    disallowed_tools: list[str] = field(default_factory=list)
    debug: bool = False


class RunOutput(BaseModel):
    """A finished run, as `keel -p --output-format json` reports it."""

    result: str = Field(description="the final answer's text")
    stop_reason: str = Field(
        description="why the run stopped: end_turn (done), interrupted, budget, max_turns, "
        "error, blocked, refusal, …"
    )
    is_error: bool = Field(description="the run failed (stop_reason error)")
    error: str | None = Field(description="what failed, for stop_reason error")
    session_id: str = Field(description="continue it with keel_reply, read it with keel_session")
    session_path: str | None = Field(description="the session's journal file")
    model: str = Field(description="provider/model the run used")
    turns: int = Field(description="model requests made")
    usage: dict[str, int] = Field(description="tokens: input, output, cache_read, cache_write")
    cache_read_share: float = Field(description="share of input tokens read from the cache")
    cost_usd: float = Field(description="what the run cost, in US dollars")
    duration_ms: int = Field(description="wall time of the run")


class SessionItem(BaseModel):
    id: str
    started: str
    status: str = Field(
        description="how its last run ended (completed, interrupted, …), or running / crashed"
    )
    last_prompt: str
    turns: int | None
    cost_usd: float | None
    model: str
    cwd: str


class SessionList(BaseModel):
    sessions: list[SessionItem] = Field(description="newest first")


class Decision(BaseModel):
    """The answer to a permission question (the elicitation's schema)."""

    decision: Literal["allow", "deny"] = Field(
        description="allow: run this call once; deny: refuse it (keel's model is told)"
    )
    reason: str = Field(default="", description="why (a denial's reason is shown to the model)")


def _log_notice(event: Event) -> None:
    """What opening an agent had to say: its warnings on the server's stderr (nobody reads
    the rest; the run's own notices are in its session)."""
    from keel.llm.events import Notice

    if isinstance(event, Notice) and event.level == "warning":
        print(f"keel mcp serve: warning: {event.text}", file=sys.stderr, flush=True)


# -- the server ------------------------------------------------------------------------------------


class _Server(MCPServer):
    """The SDK's server, with invalid arguments said in one line."""

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None = None
    ) -> CallToolResult | InputRequiredResult:
        try:
            return await super().call_tool(name, arguments, context)
        except UnexpectedToolError as exc:  # a defect: one line here and on stderr
            cause = exc.__cause__ or exc
            what = f"{type(cause).__name__}: {cause}".replace("\n", " ")
            if self.settings.debug:
                traceback.print_exception(cause, file=sys.stderr)
            print(
                f"keel mcp serve: error: internal error in {name}: {what} "
                "(hint: run keel mcp serve with --debug for the traceback)",
                file=sys.stderr,
                flush=True,
            )
            raise ToolError(f"internal error in keel: {what}") from None
        except ToolError as exc:
            if isinstance(exc.__cause__, ValidationError):
                raise ToolError(f"invalid arguments for {name}: {_fields(exc.__cause__)}") from None
            if isinstance(exc.__cause__, ToolError):  # the tool's own words, without a prefix
                raise ToolError(str(exc.__cause__)) from None
            raise


def _fields(error: ValidationError) -> str:
    """A validation error in one line: `field: what was wrong` for each."""
    parts = []
    for e in error.errors():
        where = ".".join(str(p) for p in e["loc"]) or "arguments"
        parts.append(f"{where}: {e['msg']}")
    return "; ".join(parts) + " (hint: tools/list shows each tool's input schema)"


def build_server(options: ServeOptions) -> MCPServer:
    """The MCP server with keel's tools."""
    keel = KeelTools(options)

    @asynccontextmanager
    async def lifespan(_server: MCPServer[Any]) -> AsyncIterator[dict[str, Any]]:
        try:
            yield {}
        finally:
            with anyio.CancelScope(shield=True):
                await keel.aclose()

    server = _Server(
        "keel",
        title="keel",
        version=__version__,
        instructions="keel, a coding agent, working in "
        f"{options.project}: keel_run gives it a task and returns its answer; keel_reply "
        "continues a session; keel_session and keel_sessions read them.",
        debug=options.debug,
        lifespan=lifespan,
        log_level="DEBUG" if options.debug else "WARNING",
    )
    server.add_tool(keel.keel_run, annotations=ToolAnnotations(open_world_hint=True))
    server.add_tool(keel.keel_reply, annotations=ToolAnnotations(open_world_hint=True))
    server.add_tool(
        keel.keel_session, annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False)
    )
    server.add_tool(
        keel.keel_sessions,
        annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False),
    )
    return server


class KeelTools:
    """The tools: each a method whose signature is its input schema."""

    def __init__(self, options: ServeOptions) -> None:
        self.options = options
        self.project = options.project.resolve()
        #: Runs waiting for a later round's answer (2026-07-28), by request state.
        self.parked: dict[str, tuple[_Run, PermissionAsked]] = {}
        self._stopping: set[asyncio.Task[None]] = set()

    async def keel_run(
        self,
        prompt: Annotated[str, Field(min_length=1, description="the task, as you would tell keel")],
        ctx: Context,
        mode: Annotated[
            RunMode | None,
            Field(
                description="permission mode: default (asks before edits and commands), "
                "accept-edits, plan (read-only until a plan is approved), bypass (only if the "
                "server allows it); default: the server's"
            ),
        ] = None,
        model: Annotated[
            str | None, Field(description="provider/model, e.g. anthropic/claude-sonnet-4-5")
        ] = None,
        max_turns: Annotated[int | None, Field(ge=1, description="at most this many turns")] = None,
        max_budget_usd: Annotated[
            float | None, Field(gt=0, description="stop once the run has cost this much")
        ] = None,
        cwd: Annotated[
            str | None,
            Field(description="directory to work in, inside the server's project (default: it)"),
        ] = None,
    ) -> Annotated[CallToolResult, RunOutput] | InputRequiredResult:
        """Run a task with keel, a coding agent, in this server's project, to its end: it reads,
        edits and runs commands there as its permission mode allows. Returns the answer and
        the session id (continue it with keel_reply)."""
        from keel.app import Options, choose_model, open_agent, read_settings

        if ctx.request_state is not None:
            return await self._answered(ctx)
        try:
            where = self._cwd(cwd)
            options = Options(
                cwd=where,
                model=model or self.options.model,
                mode=self._mode(mode),
                allowed_tools=list(self.options.allowed_tools),
                disallowed_tools=list(self.options.disallowed_tools),
                max_turns=max_turns,
                max_budget_usd=max_budget_usd,
                debug=self.options.debug,
            )
            settings = read_settings(where, _log_notice)
            ref = choose_model(options.model, settings)
            agent = await open_agent(options, _log_notice, settings=settings, ref=ref)
        except KeelError as exc:
            raise ToolError(exc.one_line()) from None
        return await self._drive(agent, [prompt], ctx, str(ref))

    async def keel_reply(
        self,
        session_id: Annotated[str, Field(min_length=1, description="from keel_run's result")],
        prompt: Annotated[str, Field(min_length=1, description="what to tell keel next")],
        ctx: Context,
        mode: Annotated[
            RunMode | None,
            Field(description="permission mode for this run, as for keel_run"),
        ] = None,
    ) -> Annotated[CallToolResult, RunOutput] | InputRequiredResult:
        """Continue a keel session (one that ended, or was interrupted) with a new prompt, in
        the conversation it had; returns the answer as keel_run does."""
        from keel.app import Options, resume_agent

        if ctx.request_state is not None:
            return await self._answered(ctx)
        try:
            path = self._own_session(session_id)
            options = Options(
                cwd=self.project,
                mode=self._mode(mode),
                allowed_tools=list(self.options.allowed_tools),
                disallowed_tools=list(self.options.disallowed_tools),
                debug=self.options.debug,
            )
            opened = await resume_agent(path, options, _log_notice)
        except KeelError as exc:
            raise ToolError(exc.one_line()) from None
        agent = opened.agent
        # The unanswered calls of an interrupted turn are settled first, then the prompt goes.
        steps: list[str | None] = [None, prompt] if agent.unanswered_calls else [prompt]
        return await self._drive(agent, steps, ctx, str(opened.ref))

    def keel_session(
        self,
        session_id: Annotated[str, Field(min_length=1, description="a session id or a prefix")],
    ) -> str:
        """A keel session's transcript as text: prompts, answers, tool calls and results."""
        from keel.cli.sessions import describe
        from keel.session.journal import read_records

        try:
            path = self._own_session(session_id)
            records = read_records(path).records
        except KeelError as exc:
            raise ToolError(exc.one_line()) from None
        except OSError as exc:
            raise ToolError(f"cannot read session {session_id}: {exc.strerror}") from None
        return "\n".join(line for record in records for line in describe(record))

    def keel_sessions(
        self,
        limit: Annotated[int, Field(ge=1, le=500, description="at most this many")] = 20,
    ) -> SessionList:
        """This project's keel sessions, newest first: id, status, last prompt, turns, cost."""
        from keel.session.index import session_files, summarize

        items = []
        for path in session_files(self.project)[:limit]:
            try:
                s = summarize(path)
            except (KeelError, OSError):
                continue  # a file being written or broken: listed by `keel sessions`
            items.append(
                SessionItem(
                    id=s.id,
                    started=s.started,
                    status=s.status,
                    last_prompt=s.last_prompt,
                    turns=s.turns,
                    cost_usd=s.cost,
                    model=s.model,
                    cwd=s.cwd,
                )
            )
        return SessionList(sessions=items)

    # -- checks ------------------------------------------------------------------------------------

    def _cwd(self, given: str | None) -> Path:
        if not given:
            return self.project
        where = (self.project / given).resolve()
        if not where.is_relative_to(self.project):
            raise UserError(
                f"cwd {given} is outside the server's project {self.project}",
                hint="give a directory inside it, or start keel mcp serve --cwd there",
            )
        if not where.is_dir():
            raise UserError(f"cwd {given}: no such directory in {self.project}")
        return where

    def _mode(self, asked: str | None) -> str | None:
        mode = asked or self.options.mode
        if asked == "bypass" and not self.options.allow_bypass and self.options.mode != "bypass":
            raise UserError(
                "mode bypass is not allowed by this server",
                hint="its owner may start keel mcp serve --allow-bypass; accept-edits lets "
                "edits through",
            )
        return mode

    def _own_session(self, session_id: str) -> Path:
        """The file of a session of this project (or of a directory under it)."""
        from keel.session.index import find_session, summarize

        path = find_session(session_id, self.project)
        cwd = Path(summarize(path).cwd)
        if not cwd.is_relative_to(self.project):
            raise UserError(
                f"session {path.stem} belongs to another project ({cwd})",
                hint="keel_sessions lists this project's sessions",
            )
        return path

    def _asking(self, ctx: Context) -> Asking:
        """How this call's questions reach the client, if they can."""
        if self.options.permissions == "refuse":
            return None
        caps = ctx.client_capabilities
        if caps is None or caps.elicitation is None:
            return None
        if ctx.session.can_send_request:
            return "request"
        protocol = ctx.protocol_version or ""
        return "rounds" if protocol >= ROUNDS_PROTOCOL else None

    # -- a run -------------------------------------------------------------------------------------

    async def _drive(
        self, agent: Agent, steps: list[str | None], ctx: Context, model: str
    ) -> CallToolResult | InputRequiredResult:
        """Run `steps` (a prompt, or None to settle an unfinished turn) while this call's
        progress and questions go to the client; a cancelled call interrupts the run."""
        how = self._asking(ctx)
        relay = _Relay(ctx, agent, how)
        if how is not None:
            agent.ask_through_events()
        elif isinstance(agent.gate, PermissionGate):
            refuse = self.options.permissions == "refuse"
            agent.gate.headless_hint = REFUSED["setting" if refuse else "client"]
        task = asyncio.create_task(_steps(agent, steps, relay.sink), name="keel mcp run")
        task.add_done_callback(lambda _: relay.put(None))
        return await self._follow(_Run(agent, task, relay, model, time.monotonic()), ctx)

    async def _follow(self, run: _Run, ctx: Context) -> CallToolResult | InputRequiredResult:
        """Relay `run`'s events to the call `ctx` until it ends, or (2026-07-28) until it asks
        a question, which goes back as this call's result: the client's next round answers it."""
        agent = run.agent
        run.relay.ctx = ctx
        try:
            asked = await run.relay.serve()
            if asked is not None:
                return self._park(run, asked)
            result = await run.task
        except KeelError as exc:  # the run could not go on (a resume with nothing to do, …)
            await agent.aclose()
            raise ToolError(exc.one_line()) from None
        except BaseException:
            # The call was cancelled (or the client went away): stop the run; its session is
            # journaled as interrupted and can be continued with keel_reply.
            with anyio.CancelScope(shield=True):
                await _stop(run)
            raise
        path = str(agent.session.path) if agent.session else None
        await agent.aclose()
        return _result(result, model=run.model, seconds=time.monotonic() - run.start, path=path)

    def _park(self, run: _Run, asked: PermissionAsked) -> InputRequiredResult:
        from mcp.server.elicitation import render_elicitation_schema
        from mcp_types import ElicitRequest, ElicitRequestFormParams

        state = secrets.token_urlsafe(16)
        loop = asyncio.get_running_loop()
        run.expiry = loop.call_later(PARK_SECONDS, self._expire, state)
        self.parked[state] = (run, asked)
        params = ElicitRequestFormParams(
            message=question(asked), requested_schema=render_elicitation_schema(Decision)
        )
        return InputRequiredResult(
            input_requests={ANSWER_KEY: ElicitRequest(params=params)}, request_state=state
        )

    async def _answered(self, ctx: Context) -> CallToolResult | InputRequiredResult:
        """A later round of a call whose run asked a question: the answer goes to the run, and
        the call goes on following it."""
        from mcp_types import ElicitResult

        state = ctx.request_state or ""
        parked = self.parked.pop(state, None)
        if parked is None:
            raise ToolError(
                "no question of keel waits under this request state (hint: the run it "
                f"belonged to ended or waited more than {PARK_SECONDS:g} s; call again)"
            )
        run, asked = parked
        if run.expiry is not None:
            run.expiry.cancel()
        answer = (ctx.input_responses or {}).get(ANSWER_KEY)
        if isinstance(answer, ElicitResult):
            reply = decision_reply(asked, answer.action, answer.content)
        else:
            reply = PermissionReply(False, reason="the MCP client did not answer")
        run.agent.answer(asked.request_id, reply)
        return await self._follow(run, ctx)

    async def aclose(self) -> None:
        """The server stops: runs still waiting for an answer are stopped (their sessions are
        journaled as interrupted)."""
        for run, _asked in self.parked.values():
            if run.expiry is not None:
                run.expiry.cancel()
            await _stop(run)
        self.parked.clear()
        if self._stopping:
            await asyncio.wait(self._stopping)

    def _expire(self, state: str) -> None:
        """Nobody came back with an answer: the run is stopped (its session stays)."""
        parked = self.parked.pop(state, None)
        if parked is not None:
            task = asyncio.get_running_loop().create_task(_stop(parked[0]))
            self._stopping.add(task)
            task.add_done_callback(self._stopping.discard)


@mutable(eq=False)
class _Run:
    """A run in progress, followed by one call (or by one round after another)."""

    agent: Agent
    task: asyncio.Task[RunResult]
    relay: _Relay
    model: str
    start: float
    expiry: asyncio.TimerHandle | None = None


async def _stop(run: _Run) -> None:
    if run.agent.busy:
        run.agent.interrupt(INTERRUPTED)
    else:
        run.task.cancel()  # it had not started yet
    await asyncio.wait([run.task])
    await run.agent.aclose()


async def _steps(agent: Agent, steps: list[str | None], sink: Any) -> RunResult:
    result: RunResult | None = None
    for step in steps:
        ran = await (agent.resume(sink) if step is None else agent.run(step, sink))
        result = ran if result is None else _together(result, ran)
        if step is None and ran.stop_reason == "error":
            continue  # the unfinished turn failed: the prompt is still sent
        if ran.stop_reason != "end_turn":
            break
    assert result is not None  # steps is never empty
    return result


def _together(before: RunResult, after: RunResult) -> RunResult:
    from dataclasses import replace

    return replace(
        after,
        usage=before.usage + after.usage,
        cost=before.cost + after.cost,
        turns=before.turns + after.turns,
    )


def _result(finished: RunResult, *, model: str, seconds: float, path: str | None) -> CallToolResult:
    from keel.app.jsonout import result_json

    data = result_json(finished, model=model, duration_ms=int(seconds * 1000), session_path=path)
    data.pop("type")
    text = finished.text
    if finished.stop_reason == "error":
        text = f"keel: error: {finished.error}" + (f"\n\n{text}" if text else "")
    elif finished.stop_reason != "end_turn":
        text = (text + "\n\n" if text else "") + f"keel: stopped: {finished.stop_reason}"
    text += f"\n\n[session {finished.session_id}; continue it with keel_reply]"
    return CallToolResult(
        content=[TextContent(type="text", text=text)],
        structured_content=data,
        is_error=finished.stop_reason == "error",
    )


# -- events → the client ---------------------------------------------------------------------------


class _Relay:
    """One run's events, in order: progress notifications (when the call sent a progressToken;
    the SDK sends nothing otherwise) and permission questions, asked one at a time. The
    agent's sink only queues: it must not block or raise. `ctx` is the call being answered (a
    later round's, on the 2026-07-28 protocol)."""

    def __init__(self, ctx: Context, agent: Agent, how: Asking) -> None:
        self.ctx = ctx
        self.agent = agent
        self.how = how
        self.queue: asyncio.Queue[str | PermissionAsked | None] = asyncio.Queue()
        self.count = 0

    def put(self, item: str | PermissionAsked | None) -> None:
        self.queue.put_nowait(item)

    def sink(self, event: Event) -> None:
        if isinstance(event, PermissionAsked):
            self.put(event)
        elif (line := progress_line(event)) is not None:
            self.put(line)

    async def serve(self) -> PermissionAsked | None:
        """Until the run ends (None), or, when questions go back as the call's result, until
        one is asked (it is returned)."""
        while (item := await self.queue.get()) is not None:
            if isinstance(item, PermissionAsked):
                if self.how == "rounds":
                    return item
                await self._ask(item)
            else:
                self.count += 1
                await self.ctx.report_progress(self.count, None, item)
        return None

    async def _ask(self, event: PermissionAsked) -> None:
        """Ask the client; its answer (or the failure to get one: a denial) goes to the agent."""
        from mcp import MCPError

        try:
            answer = await self.ctx.elicit(question(event), Decision)
        except (MCPError, ValidationError, RuntimeError, OSError) as exc:
            said = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            reply = PermissionReply(False, reason=f"the MCP client did not answer ({said})")
        else:
            data = answer.data.model_dump() if answer.action == "accept" else None
            reply = decision_reply(event, answer.action, data)
        self.agent.answer(event.request_id, reply)


def decision_reply(
    event: PermissionAsked, action: str, content: dict[str, Any] | None
) -> PermissionReply:
    """The client's answer to a question as keel's. Anything but an accepted "allow" denies."""
    if action != "accept":
        return PermissionReply(False, reason=f"the MCP client's user chose {action}")
    try:
        decision = Decision.model_validate(content or {})
    except ValidationError:
        return PermissionReply(False, reason="the MCP client's answer did not fit the question")
    if decision.decision == "allow":
        plan = event.call.name == "exit_plan_mode"
        return PermissionReply(True, mode="default" if plan else None)
    return PermissionReply(False, reason=decision.reason.strip())


def question(event: PermissionAsked) -> str:
    """A permission question as the elicitation's message: what keel wants to do, and the call."""
    who = f"keel ({event.agent})" if event.agent else "keel"
    if event.call.name == "exit_plan_mode":
        plan = event.plan or str((event.call.input or {}).get("plan", ""))
        return f"{who} asks to approve its plan and start working:\n\n{plan}"
    args = json.dumps(event.call.input, ensure_ascii=False) if event.call.input else ""
    if len(args) > 2000:
        args = args[:2000] + "…"
    return f"{who} needs your permission to {event.reason}.\n\n{event.call.name} {args}".rstrip()


def progress_line(event: Event, agent: str = "") -> str | None:
    """The progress message for an event (None: not reported)."""
    from keel.tui.format import duration, key_argument

    who = f"[{agent}] " if agent else ""
    match event:
        case SubagentEvent(agent=name, event=inner):
            return progress_line(inner, name) if isinstance(inner, ToolStarted) else None
        case TurnStarted(resumed=resumed):
            return "continuing the unfinished turn" if resumed else "started"
        case RequestStarted(turn=turn, purpose="turn"):
            return f"turn {turn}"
        case RequestStarted(purpose="compaction"):
            return "compacting the conversation"
        case ToolStarted(call=call):
            return f"{who}{call.name} {key_argument(call, 100)}".rstrip()
        case ToolFinished(call=call, result=result, seconds=seconds):
            mark = "failed" if result.is_error else "done"
            return f"{who}{call.name} {mark} in {duration(seconds)}"
        case _:
            return None


__all__ = [
    "Decision",
    "KeelTools",
    "Permissions",
    "RunOutput",
    "ServeOptions",
    "build_server",
    "progress_line",
    "question",
]
