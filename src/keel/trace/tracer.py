"""The tracer: a consumer of an agent's event stream (plus the HTTP and hook observers) that
writes a debug trace, `<session>.trace/` (docs/traces.md, trace_format.md).

It owns the trace folder: `events.jsonl` (one record per line, flushed as it happens) and the
raw HTTP bodies under `http/`, every file 0600 in 0700 folders. It sees events through
`Tracer.wrap(sink)`, which the loop calls once per run when `agent.tracer` is set; with no
tracer the loop passes the caller's sink through untouched and nothing here runs.

Subagent events arrive as `SubagentEvent`s and are written with `agent` (the label) and `parent`
(the `task` call's id). HTTP exchanges and hook runs are matched to the agent and request they
belong to through a context variable set when the request is recorded. Credentials in headers
and URLs are redacted (`keel.trace.redact`); content is not. A trace that cannot be written
stops with one warning; it never stops the run.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from keel.agent.events import (
    AgentSpend,
    AssistantMessage,
    BackgroundFinished,
    ContextCompacted,
    Event,
    PermissionAnswered,
    PermissionAsked,
    RequestFinished,
    RequestStarted,
    RequestTiming,
    SubagentEvent,
    ToolFinished,
    ToolStarted,
    TurnFinished,
    TurnStarted,
)
from keel.frozen import mutable
from keel.llm.events import Notice
from keel.llm.http import HTTP_OBSERVER
from keel.llm.messages import Message, Text, ToolUse, Usage, message_to_json
from keel.trace.delta import AgentKey, DeltaEncoder, read
from keel.trace.redact import redact_headers, redact_url

if TYPE_CHECKING:
    from keel.agent.loop import Agent
    from keel.hooks.runner import HookObservation

FORMAT = 1
#: A request body sharing at least this many leading bytes with the one before it is written
#: as its tail (`request_delta`); shorter ones in full.
MIN_SHARED_PREFIX = 1024
#: Tool output kept in a `tool_end` record.
MAX_TOOL_OUTPUT = 64 * 1024
Sink = Callable[[Event], None]
RecordSink = Callable[[dict[str, Any]], None]


@dataclass(slots=True)
class _Where:
    """Which agent and request the code running in this context works for."""

    tracer: Tracer
    req: int | None
    agent: str
    parent: str


_CURRENT: ContextVar[_Where | None] = ContextVar("keel_trace_where", default=None)


def default_directory(agent: Agent) -> Path:
    """Beside the session file (`<id>.jsonl` → `<id>.trace/`); without one, under
    `keel_home()/traces`."""
    if agent.session is not None:
        path = agent.session.path
        return path.with_name(path.name.removesuffix(".jsonl") + ".trace")
    from keel.session.store import keel_home

    return keel_home() / "traces" / f"{agent.session_id}.trace"


def _private_dir(path: Path) -> None:
    """`path` and the parents it needs, created 0700; `path` itself made 0700."""
    missing: list[Path] = []
    probe = path
    while not probe.exists():
        missing.append(probe)
        probe = probe.parent
    for folder in reversed(missing):
        folder.mkdir(mode=0o700, exist_ok=True)
    os.chmod(path, 0o700)


def _open_private(path: Path, flags: int) -> int:
    """`path` opened for writing, 0600: created so (the umask can only take bits away), or an
    existing file (a reopened trace) narrowed to it. Never through a symlink."""
    flags |= os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        return os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        fd = os.open(path, flags)
    os.fchmod(fd, 0o600)
    return fd


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _common_prefix(a: bytes, b: bytes) -> int:
    """How many leading bytes `a` and `b` share (compared a block at a time)."""
    limit = min(len(a), len(b))
    block = 65_536
    start = 0
    while start < limit:
        end = min(start + block, limit)
        if a[start:end] != b[start:end]:
            if block == 1:
                return start
            block = max(1, block // 16)
            continue
        start = end
    return limit


def _default(value: object) -> object:
    if isinstance(value, Path | set | frozenset | tuple):
        return list(value) if not isinstance(value, Path) else str(value)
    return repr(value)


def _usage(usage: Usage) -> dict[str, int]:
    return usage.to_json()


def _timing(timing: RequestTiming | None) -> dict[str, Any]:
    if timing is None:
        return {
            "sent_at": None,
            "ttft_ms": None,
            "thinking_ms": None,
            "generating_ms": None,
            "duration_ms": None,
            "output_tokens_per_s": None,
            "attempts": 1,
            "notices": [],
        }
    return {
        "sent_at": timing.sent_at,
        "ttft_ms": timing.ttft_ms,
        "thinking_ms": timing.thinking_ms,
        "generating_ms": timing.generating_ms,
        "duration_ms": timing.duration_ms,
        "output_tokens_per_s": timing.output_tokens_per_s,
        "attempts": timing.attempts,
        "notices": list(timing.notices),
    }


def _session_id(agent: Agent) -> str:
    return agent.session.id if agent.session is not None else agent.session_id


def _sent_text(message: Message | None) -> str:
    """The prompt as sent (the user's words after expansion, notes included): the last text
    block of the turn's last user message. The blocks before it are not the prompt's: the
    context that opens a fresh context, a compaction's summary the prompt follows (the request
    record holds them)."""
    if message is None or message.role != "user":
        return ""
    texts = [b.text for b in message.blocks if isinstance(b, Text)]
    return texts[-1] if texts else ""


class Tracer:
    """Writes one trace folder. Opened lazily at the first record (so an agent whose session
    file is created at its first prompt gets its trace beside it); reopening a folder continues
    its numbering."""

    def __init__(self, directory: Path | None = None, *, agent: Agent | None = None) -> None:
        self._directory = directory
        self.agent = agent
        #: False: nothing is written to disk; the records only go to the sinks (an OpenTelemetry
        #: export without a debug trace).
        self.files = True
        self._started = False
        #: Traces older than this are pruned when `attach` starts one (`follow` keeps it).
        self.retention_days = 14
        self.closed = False
        self.error = ""
        self._fd: int | None = None
        self._opened_at: Path | None = None
        self._seq = 0
        self._req = 0
        self._n = 0
        self._sinks: list[RecordSink] = []
        self._delta = DeltaEncoder()
        self._req_of: dict[AgentKey, int] = {}
        self._answered: set[int] = set()
        self._attempts: dict[int, int] = {}
        self._turns: dict[AgentKey, tuple[TurnStarted, float]] = {}
        self._asked: dict[str, tuple[PermissionAsked, str, str]] = {}
        self._outer: dict[AgentKey, _Where | None] = {}
        #: The last request body each agent sent (http number, bytes): the next one is written
        #: as what it adds (a request repeats its predecessor as a byte prefix).
        self._bodies: dict[AgentKey, tuple[int, bytes]] = {}
        self._handlers: dict[type, Callable[[Any, str, str], None]] = {
            TurnStarted: self._turn_started,
            RequestStarted: self._request_started,
            RequestFinished: self._request_finished,
            AssistantMessage: self._assistant,
            ToolStarted: self._tool_started,
            ToolFinished: self._tool_finished,
            PermissionAsked: self._permission_asked,
            PermissionAnswered: self._permission_answered,
            ContextCompacted: self._compacted,
            Notice: self._notice,
            TurnFinished: self._turn_finished,
            SubagentEvent: self._subagent,
            BackgroundFinished: self._background,
            AgentSpend: self._spend,
        }

    # -- public API -------------------------------------------------------------------------------

    @property
    def directory(self) -> Path:
        """The folder this tracer writes (or will write, once something happens)."""
        if self._opened_at is not None:
            return self._opened_at
        if self._directory is not None:
            return self._directory
        if self.agent is None:
            raise ValueError("a Tracer needs a directory or an agent")
        return default_directory(self.agent)

    @property
    def explicit_directory(self) -> Path | None:
        return self._directory

    def add_sink(self, fn: RecordSink) -> None:
        """Call `fn` with every record dict after it is written (an exporter)."""
        self._sinks.append(fn)

    def wrap(self, sink: Sink | None) -> Sink:
        """`sink` with every event recorded first. Also makes this tracer the observer of the
        model calls and hooks that run in the calling context (and the tasks it starts)."""
        self.activate()

        def traced(event: Event) -> None:
            if not self.closed:
                self._record_safely(event, sink)
            if sink is not None:
                sink(event)

        return traced

    def activate(self) -> None:
        """Observe HTTP exchanges and hook runs from the calling context on."""
        if self.closed:
            return
        HTTP_OBSERVER.set(self)
        agent = self.agent
        if agent is not None and agent.hooks is not None:
            agent.hooks.observer = self.hook_ran

    def record(self, event: Event, agent: str = "", parent: str = "") -> None:
        """Write what `event` says (events with nothing to trace, like deltas, are skipped)."""
        handler = self._handlers.get(type(event))
        if handler is not None:
            handler(event, agent, parent)

    def decision(self, call: ToolUse, outcome: str, source: str, reason: str) -> None:
        """A notable decision of the permission gate that nobody was asked about (a rule, a
        mode, a hook, a headless refusal); answers the user gave arrive as events."""
        if self.closed or source.startswith("user"):
            return
        where = self._where()
        self._safely(
            lambda: self._write(
                "permission",
                {
                    "request_id": "",
                    "tool_use_id": call.id,
                    "tool": call.name,
                    "reason": reason,
                    "suggestion": "",
                    "allow": outcome == "allow",
                    "scope": "once",
                    "by": source.split(":", 1)[0],
                    "source": source,
                    "waited_ms": 0.0,
                },
                agent=where.agent if where else "",
                parent=where.parent if where else "",
                req=where.req if where else None,
            )
        )

    def hook_ran(self, run: HookObservation) -> None:
        """The hook runner's observer: one `hook` record per hook run."""
        if self.closed:
            return
        where = self._where()
        hook = run.hook
        command = redact_url(hook.command) if hook.kind == "http" else hook.command
        data: dict[str, Any] = {
            "event": run.event,
            "target": run.target,
            "command": command,
            "hook_kind": hook.kind,
            "started_at": run.started_at,
            "duration_ms": run.duration_ms,
            "exit_code": run.exit_code,
            "blocked": run.blocked,
            "halted": run.halted,
        }
        if run.error:
            data["error"] = run.error
        self._safely(
            lambda: self._write(
                "hook",
                data,
                agent=where.agent if where else "",
                parent=where.parent if where else "",
                req=where.req if where else None,
            )
        )

    def exchange(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes
    ) -> _Exchange | None:
        """The HTTP observer: called as a model request is sent."""
        if self.closed or not self.files:
            return None
        try:
            self._ensure_open()
            where = self._where()
            self._n += 1
            n = self._n
            req = where.req if where else None
            attempt = 1
            if req is not None:
                attempt = self._attempts[req] = self._attempts.get(req, 0) + 1
            http = self.directory / "http"
            key = (where.agent, where.parent) if where else ("", "")
            previous = self._bodies.get(key)
            self._bodies[key] = (n, body)
            keep = _common_prefix(previous[1], body) if previous is not None else 0
            delta: dict[str, Any] | None = None
            if previous is not None and keep >= MIN_SHARED_PREFIX:
                request_file = f"http/{n:04d}-request.tail"
                delta = {"base": previous[0], "keep": keep, "file": request_file}
                content = body[keep:]
            else:
                request_file = f"http/{n:04d}-request.json"
                content = body
            fd = _open_private(self.directory / request_file, os.O_WRONLY | os.O_TRUNC)
            try:
                _write_all(fd, content)
            finally:
                os.close(fd)
            response_file = f"http/{n:04d}-response.txt"
            out = _open_private(http / f"{n:04d}-response.txt", os.O_WRONLY | os.O_TRUNC)
        except Exception as exc:
            self._fail(exc, None)
            return None
        return _Exchange(
            self,
            n,
            req,
            where.agent if where else "",
            where.parent if where else "",
            method,
            redact_url(url),
            redact_headers(headers),
            len(body),
            attempt,
            "" if delta is not None else request_file,
            response_file,
            out,
            delta,
        )

    def close(self) -> None:
        """Stop tracing: the file is closed; observers set by this tracer stop observing."""
        if self.closed:
            return
        self.closed = True
        agent = self.agent
        if agent is not None and agent.hooks is not None and agent.hooks.observer == self.hook_ran:
            agent.hooks.observer = None
        if HTTP_OBSERVER.get() is self:
            HTTP_OBSERVER.set(None)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    # -- writing ----------------------------------------------------------------------------------

    def _ensure_open(self) -> None:
        if self._fd is not None:
            return
        if self.closed:
            raise OSError("the tracer is closed")
        directory = self.directory
        events = directory / "events.jsonl"
        for path in (directory, directory / "http", events):
            if path.is_symlink():  # never write, truncate or chmod through a planted link
                raise OSError(f"{path} is a symbolic link; not written through")
        _private_dir(directory)
        _private_dir(directory / "http")
        reopened = events.exists()
        if reopened:
            self._continue(events)
        self._fd = _open_private(events, os.O_WRONLY | os.O_APPEND)
        self._opened_at = directory
        self._write("session", self._session_data(directory.stem, reopened))

    def _session_data(self, fallback_id: str, reopened: bool) -> dict[str, Any]:
        from keel import __version__

        agent = self.agent
        return {
            "session_id": _session_id(agent) if agent is not None else fallback_id,
            "keel_version": __version__,
            "cwd": str(agent.cwd) if agent is not None else os.getcwd(),
            "model": f"{agent.provider.name}/{agent.model}" if agent is not None else "",
            "reopened": reopened,
            "format": FORMAT,
        }

    def _continue(self, events: Path) -> None:
        """Take up the numbering of an existing trace (and cut a torn last line)."""
        raw = events.read_bytes()
        if raw and not raw.endswith(b"\n"):
            with events.open("r+b") as f:
                f.truncate(raw.rfind(b"\n") + 1)
        try:
            records = read(events.parent)
        except ValueError as exc:  # not a trace: leave it as it is, write nothing into it
            raise OSError(f"{events} is not a trace file ({exc})") from exc
        for record in records:
            self._seq = max(self._seq, int(record.get("seq", 0)))
            req = record.get("req")
            if isinstance(req, int):
                self._req = max(self._req, req)
            data = record.get("data", {})
            if record.get("kind") == "http":
                self._n = max(self._n, int(data.get("n", 0)))
            elif record.get("kind") == "request":
                if "system" in data:
                    self._delta.seen_systems.add(data["system_hash"])
                if "tools" in data:
                    self._delta.seen_tools.add(data["tools_hash"])
        # Bodies of an exchange that never got its record (a crash) keep their numbers.
        for body in (events.parent / "http").glob("*-request.json"):
            number = body.name.split("-", 1)[0]
            if number.isdigit():
                self._n = max(self._n, int(number))

    def _write(
        self,
        kind: str,
        data: dict[str, Any],
        *,
        agent: str = "",
        parent: str = "",
        req: int | None = None,
        t: float | None = None,
    ) -> None:
        if not self._started:
            self._started = True
            if self.files:
                self._ensure_open()
            else:
                self._write("session", self._session_data("", False))
        self._seq += 1
        record: dict[str, Any] = {"seq": self._seq, "t": time.time() if t is None else t}
        record["kind"] = kind
        if agent:
            record["agent"] = agent
        if parent:
            record["parent"] = parent
        if req is not None:
            record["req"] = req
        record["data"] = data
        if self._fd is not None:
            _write_all(self._fd, orjson.dumps(record, default=_default) + b"\n")
        for fn in list(self._sinks):
            try:
                fn(record)
            except Exception as exc:  # an exporter's failure must not stop the trace or the run
                self._sinks.remove(fn)
                self._write("error", {"message": f"a trace sink failed and was removed: {exc!r}"})

    # A trace that fails (a full disk, or a bug here) stops, says so once, and never takes the
    # run down with it: these catch everything the tracer itself raises.

    def _record_safely(self, event: Event, sink: Sink | None) -> None:
        try:
            self.record(event)
        except Exception as exc:
            self._fail(exc, sink)

    def _safely(self, work: Callable[[], None]) -> None:
        try:
            work()
        except Exception as exc:
            self._fail(exc, None)

    def _fail(self, exc: Exception, sink: Sink | None) -> None:
        """The trace cannot go on: stop it, say so once, let the run go on."""
        where = self._opened_at or self._directory or "the trace folder"
        if isinstance(exc, OSError):
            self.error = f"debug trace stopped: cannot write {where}: {exc.strerror or exc}"
        else:
            self.error = f"debug trace stopped by an internal error: {type(exc).__name__}: {exc}"
        self.close()
        if sink is not None:
            sink(Notice(self.error, "warning"))

    def _where(self) -> _Where | None:
        where = _CURRENT.get()
        return where if where is not None and where.tracer is self else None

    # -- events -----------------------------------------------------------------------------------

    def _turn_started(self, e: TurnStarted, agent: str, parent: str) -> None:
        key = (agent, parent)
        self._turns[key] = (e, time.time())
        if agent:
            self._outer[key] = _CURRENT.get()
        _CURRENT.set(_Where(self, None, agent, parent))

    def _flush_turn(self, key: AgentKey, sent: str) -> None:
        pending = self._turns.pop(key, None)
        if pending is None:
            return
        event, started_at = pending
        self._write(
            "turn_start",
            {
                "prompt": event.prompt,
                "sent": sent,
                "resumed": event.resumed,
                "session_id": event.session_id,
                "started_at": started_at,
            },
            agent=key[0],
            parent=key[1],
        )

    def _request_started(self, e: RequestStarted, agent: str, parent: str) -> None:
        key = (agent, parent)
        if e.purpose == "turn" and e.request is not None:
            self._flush_turn(
                key, _sent_text(e.request.messages[-1] if e.request.messages else None)
            )
        self._req += 1
        req = self._req
        self._req_of[key] = req
        _CURRENT.set(_Where(self, req, agent, parent))
        if e.request is None:
            data: dict[str, Any] = {"model": e.model, "purpose": e.purpose, "turn": e.turn}
        else:
            data = self._delta.encode(key, e.request, e.purpose, e.turn)
        self._write("request", data, agent=agent, parent=parent, req=req)

    def _response(
        self,
        key: AgentKey,
        message: Message,
        usage: Usage,
        cost: float,
        stop_reason: str,
        timing: RequestTiming | None,
    ) -> None:
        req = self._req_of.get(key)
        if req is not None:
            self._answered.add(req)
        self._write(
            "response",
            {
                "message": message_to_json(message),
                "usage": _usage(usage),
                "cost": cost,
                "stop_reason": stop_reason,
                **_timing(timing),
            },
            agent=key[0],
            parent=key[1],
            req=req,
        )

    def _request_finished(self, e: RequestFinished, agent: str, parent: str) -> None:
        self._response((agent, parent), e.message, e.usage, e.cost, e.stop_reason, e.timing)

    def _assistant(self, e: AssistantMessage, agent: str, parent: str) -> None:
        """A reply with no `RequestFinished` before it (an interrupted one kept in part)."""
        req = self._req_of.get((agent, parent))
        if req is not None and req in self._answered:
            return
        self._response((agent, parent), e.message, e.usage, e.cost, e.stop_reason, e.timing)

    def _tool_started(self, e: ToolStarted, agent: str, parent: str) -> None:
        call = e.call
        data: dict[str, Any] = {"id": call.id, "name": call.name, "input": call.input}
        if call.input is None:
            data["raw_input"] = call.raw_input
        if e.kind:  # builtin, local, mcp, memory, remote, subagent (docs/tools.md)
            data["kind"] = e.kind
        self._write(
            "tool_start",
            data,
            agent=agent,
            parent=parent,
            req=self._req_of.get((agent, parent)),
            t=e.started_at or None,
        )

    def _tool_finished(self, e: ToolFinished, agent: str, parent: str) -> None:
        output = e.result.text
        data: dict[str, Any] = {
            "id": e.call.id,
            "name": e.call.name,
            "is_error": e.result.is_error,
            "output": output,
            "seconds": e.seconds,
            "started_at": e.started_at,
        }
        if len(output) > MAX_TOOL_OUTPUT:
            data["output"] = output[:MAX_TOOL_OUTPUT]
            data["truncated"] = True
            data["output_chars"] = len(output)
        images = sum(1 for b in e.result.content if not isinstance(b, Text))
        if images:
            data["images"] = images
        self._write(
            "tool_end", data, agent=agent, parent=parent, req=self._req_of.get((agent, parent))
        )

    def _permission_asked(self, e: PermissionAsked, agent: str, parent: str) -> None:
        self._asked[e.request_id] = (e, agent or e.agent, parent)

    def _permission_answered(self, e: PermissionAnswered, agent: str, parent: str) -> None:
        asked, agent, parent = self._asked.pop(e.request_id, (None, agent, parent))
        self._write(
            "permission",
            {
                "request_id": e.request_id,
                "tool_use_id": e.call_id,
                "tool": asked.call.name if asked else "",
                "reason": asked.reason if asked else "",
                "suggestion": asked.suggestion if asked else "",
                "allow": e.allow,
                "scope": e.scope,
                "by": e.by,
                "answer": e.reason,
                "waited_ms": e.waited_ms,
            },
            agent=agent,
            parent=parent,
            req=self._req_of.get((agent, parent)),
        )

    def _compacted(self, e: ContextCompacted, agent: str, parent: str) -> None:
        self._write(
            "compaction",
            {
                "trigger": e.trigger,
                "tokens_before": e.tokens_before,
                "tokens_after": e.tokens_after,
                # The summary's check (docs/compaction.md), when there was something to check.
                **(
                    {
                        "kept": list(e.kept),
                        "missing_first": list(e.missing_first),
                        "repaired": list(e.repaired),
                        "lost": list(e.lost),
                    }
                    if e.kept or e.missing_first
                    else {}
                ),
            },
            agent=agent,
            parent=parent,
        )

    def _notice(self, e: Notice, agent: str, parent: str) -> None:
        self._write(
            "notice",
            {"message": e.text, "level": e.level},
            agent=agent,
            parent=parent,
            req=self._req_of.get((agent, parent)),
        )

    def _background(self, e: BackgroundFinished, agent: str, parent: str) -> None:
        self._write(
            "notice",
            {
                "message": f"background {e.kind} {e.task_id} {e.status}: {e.description}",
                "level": "info",
                "task_id": e.task_id,
            },
            agent=agent,
            parent=parent,
        )

    def _spend(self, e: AgentSpend, agent: str, parent: str) -> None:
        """One agent's row of the tree's spend, in the lane of the agent that reported it (the
        main agent's, for its subagents); `data.agent` names whose it is."""
        self._write(
            "spend",
            {
                "agent": e.agent,
                "agent_id": e.agent_id,
                "description": e.description,
                "status": e.status,
                "tool_use_id": e.tool_use_id,
                "usage": _usage(e.usage),
                "cost": e.cost,
                "tree_usage": _usage(e.tree_usage),
                "tree_cost": e.tree_cost,
            },
            agent=agent,
            parent=parent,
        )

    def _turn_finished(self, e: TurnFinished, agent: str, parent: str) -> None:
        key = (agent, parent)
        self._flush_turn(key, "")
        if e.error:
            self._write("error", {"message": e.error}, agent=agent, parent=parent)
        data: dict[str, Any] = {
            "stop_reason": e.stop_reason,
            "turns": e.turns,
            "usage": _usage(e.usage),
            "cost": e.cost,
        }
        if e.error:
            data["error"] = e.error
        self._write("turn_end", data, agent=agent, parent=parent)
        if agent:
            # A subagent is done: its delta state goes, and this context works for its parent.
            self._delta.forget(key)
            self._req_of.pop(key, None)
            self._bodies.pop(key, None)
            _CURRENT.set(self._outer.pop(key, None))
        else:
            # The run is over: what runs next in this context (another, untraced agent) is not
            # observed (the next run of this agent activates the tracer again).
            _CURRENT.set(None)
            if HTTP_OBSERVER.get() is self:
                HTTP_OBSERVER.set(None)

    def _subagent(self, e: SubagentEvent, agent: str, parent: str) -> None:
        inner: Event = e
        while isinstance(inner, SubagentEvent):
            agent, parent, inner = inner.agent, inner.tool_use_id, inner.event
        self.record(inner, agent, parent)


@mutable
class _Exchange:
    """One HTTP exchange being written: its body files now, its record at the end."""

    tracer: Tracer
    n: int
    req: int | None
    agent: str
    parent: str
    method: str
    url: str
    request_headers: dict[str, str]
    bytes_sent: int
    attempt: int
    request_file: str
    response_file: str
    out: int | None
    #: The body as what it adds to an earlier one (`request_delta`), or None: `request_file`.
    delta: dict[str, Any] | None = None
    started_at: float = 0.0
    start: float = 0.0
    status: int = 0
    ttfb_ms: float | None = None
    response_headers: dict[str, str] | None = None
    bytes_received: int = 0

    def __post_init__(self) -> None:
        self.started_at, self.start = time.time(), time.monotonic()

    def response(
        self, status: int, headers: Mapping[str, str], sent_headers: Mapping[str, str]
    ) -> None:
        self.ttfb_ms = round((time.monotonic() - self.start) * 1000, 3)
        self.status = status

        def heads() -> None:
            self.response_headers = redact_headers(_items(headers))
            self.request_headers = redact_headers(_items(sent_headers))

        self.tracer._safely(heads)

    def received(self, chunk: bytes) -> None:
        self.bytes_received += len(chunk)
        if self.out is not None:
            try:
                _write_all(self.out, chunk)
            except OSError as exc:
                self._close()
                self.tracer._fail(exc, None)

    def finished(self, error: str = "") -> None:
        self._close()
        if self.tracer.closed:
            return
        data: dict[str, Any] = {
            "n": self.n,
            "method": self.method,
            "url": self.url,
            "status": self.status,
            "attempt": self.attempt,
            "request_headers": self.request_headers,
            "response_headers": self.response_headers or {},
            "started_at": self.started_at,
            "ttfb_ms": self.ttfb_ms,
            "duration_ms": round((time.monotonic() - self.start) * 1000, 3),
            "bytes_sent": self.bytes_sent,
            "bytes_received": self.bytes_received,
            "response_file": self.response_file,
        }
        if self.delta is not None:
            data["request_delta"] = self.delta
        else:
            data["request_file"] = self.request_file
        if error:
            data["error"] = error
        self.tracer._safely(
            lambda: self.tracer._write(
                "http", data, agent=self.agent, parent=self.parent, req=self.req
            )
        )

    def _close(self) -> None:
        if self.out is not None:
            os.close(self.out)
            self.out = None


def _items(headers: Mapping[str, str]) -> list[tuple[str, str]]:
    """Every header, repeated ones included (httpx's `multi_items`)."""
    multi = getattr(headers, "multi_items", None)
    return list(multi()) if callable(multi) else list(headers.items())


# -- attaching ------------------------------------------------------------------------------------


def attach(
    agent: Agent, *, directory: Path | None = None, retention_days: int | None = None
) -> Tracer:
    """Trace `agent` from now on (`agent.tracer`), into `directory` (default: beside its session
    file). Traces older than `retention_days` (default 14) are pruned first, across projects."""
    from keel.trace.retention import DEFAULT_RETENTION_DAYS, prune

    detach(agent)
    tracer = Tracer(directory, agent=agent)
    tracer.retention_days = retention_days or DEFAULT_RETENTION_DAYS
    prune(tracer.retention_days, keep=tracer.directory)
    agent.tracer = tracer
    return tracer


def detach(agent: Agent) -> None:
    """Stop tracing `agent` (nothing happens if it is not traced)."""
    tracer = agent.tracer
    if isinstance(tracer, Tracer):
        tracer.close()
    agent.tracer = None


def follow(old: Agent, new: Agent) -> Tracer | None:
    """For a front end that replaces its agent (`/clear`, `/resume`): if `old` was traced, stop
    that and trace `new` (into its own session's folder). None when `old` was not traced."""
    tracer = old.tracer
    if not isinstance(tracer, Tracer):
        return None
    detach(old)
    return attach(new, retention_days=tracer.retention_days)


__all__ = ["FORMAT", "MAX_TOOL_OUTPUT", "Tracer", "attach", "default_directory", "detach", "follow"]
