"""The sessions one `keel serve` process hosts: each a ready `Agent` (built by `keel.app`), the
ring its events go to, and the one piece of work it runs at a time.

A session is one agent and one session file; its id is the file's. Work (a prompt, a resume, a
compaction, an undo, a clear) runs as a task of its own, so an HTTP request returns at once and
a client that goes away stops nothing. A second piece of work while one runs is refused
(`Busy`, a 409). Permission questions reach the ring as `permission_asked` events and are
answered through `agent.answer`: the gate, hooks and sandbox decide exactly as in the TUI.

Nothing here knows about HTTP: errors are `ApiError`s with a status the routes send as they are.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Container, Coroutine
from dataclasses import field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from keel.agent.events import (
    AgentSpend,
    BackgroundFinished,
    Event,
    PermissionAsked,
    QuestionRequest,
    TurnFinished,
)
from keel.errors import KeelError, UserError
from keel.frozen import mutable
from keel.server.ring import EventRing

if TYPE_CHECKING:
    from keel.agent.loop import Agent, RunResult
    from keel.app import Options
    from keel.session.index import SessionSummary


#: Seconds a stopping server gives running work to suspend before interrupting it.
SUSPEND_WAIT = 5.0


class ApiError(Exception):
    """An answer other than success: HTTP `status`, a one-line `error` and a `hint`."""

    def __init__(self, status: int, error: str, hint: str = "") -> None:
        super().__init__(error)
        self.status = status
        self.error = error
        self.hint = hint

    def body(self) -> dict[str, str]:
        return {"error": self.error, "hint": self.hint}

    @classmethod
    def of(cls, exc: KeelError, status: int = 400) -> ApiError:
        return cls(status, exc.message.replace("\n", " "), exc.hint)


def not_loaded(session_id: str) -> ApiError:
    return ApiError(
        404,
        f"no loaded session {session_id!r}",
        f'load it with POST /v1/sessions {{"resume": "{session_id}"}}; GET /v1/sessions lists them',
    )


def question_json(event: PermissionAsked | QuestionRequest) -> dict[str, Any]:
    """A pending question as the `permission_asked` (or `question`) event shows it."""
    from keel.app.jsonout import event_json

    data = event_json(event)
    if data is None:  # pragma: no cover - event_json describes every question
        raise AssertionError(f"event_json has no JSON for {type(event).__name__}")
    return data


@mutable(eq=False)
class Hosted:
    """One loaded session."""

    agent: Agent
    ring: EventRing
    options: Options
    #: What runs now (None: idle) and what it is.
    work: asyncio.Task[Any] | None = None
    work_kind: str = ""
    work_started: float = 0.0
    #: Each agent's row of the tree's spend as last reported (`agent_spend` events), by id.
    spend_rows: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return self.agent.session_id

    @property
    def path(self) -> Path | None:
        return self.agent.session.path if self.agent.session is not None else None

    @property
    def busy(self) -> bool:
        return self.work is not None

    # -- events ------------------------------------------------------------------------------------

    def sink(self, event: Event) -> None:
        """The agent's event sink: numbered into the ring. Must not block or raise."""
        if isinstance(event, TurnFinished):
            self.ring.publish(self._result(event))
            return
        from keel.app.jsonout import event_json

        data = event_json(event)
        if data is not None:
            self.ring.publish(data)
        if isinstance(event, AgentSpend) and data is not None:
            self.spend_rows[event.agent_id] = data
        if isinstance(event, BackgroundFinished) and self.work is None:
            # Nobody's prompt is running: deliver the result in a turn of keel's own, as the
            # TUI does when a background task ends while it waits for input.
            self._deliver_background()

    def _result(self, event: TurnFinished) -> dict[str, Any]:
        from keel.agent.loop import RunResult
        from keel.app.jsonout import result_json

        took = int((time.monotonic() - self.work_started) * 1000) if self.work_started else 0
        return result_json(
            RunResult.from_event(event),
            model=self.model,
            duration_ms=took,
            session_path=str(self.path) if self.path else None,
        )

    def save_rule(self, rule: str) -> None:
        """An "always" answer: the rule goes to the project's `.keel/settings.local.json`, as
        in the TUI; what happened is a notice on the stream."""
        # It belongs below the front ends (keel.config); until it moves there, borrowed from
        # the TUI, whose rule file this is too.
        from keel.config.local_rules import save_local_rule

        try:
            path = save_local_rule(self.agent.cwd, rule)
        except (UserError, OSError) as exc:
            why = exc.one_line() if isinstance(exc, UserError) else str(exc)
            self.ring.publish(
                {"type": "notice", "level": "warning", "text": f"could not save {rule}: {why}"}
            )
            return
        self.ring.publish(
            {"type": "notice", "level": "info", "text": f"always allowed {rule} (saved to {path})"}
        )

    def _status(self) -> None:
        self.ring.publish({"type": "status", "busy": self.busy, "work": self.work_kind or None})

    # -- work --------------------------------------------------------------------------------------

    def ensure_idle(self) -> None:
        """Raise `ApiError(409)` while a piece of work runs."""
        if self.work is not None:
            raise ApiError(
                409,
                f"session {self.id} is busy ({self.work_kind} running)",
                f"wait for its `status` event with busy false, or POST /v1/sessions/{self.id}/cancel",
            )

    def start(self, kind: str, work: Callable[[], Coroutine[Any, Any, Any]]) -> asyncio.Task[Any]:
        """Run `work` as this session's one piece of work. Raises `ApiError(409)` when busy."""
        self.ensure_idle()
        self.work_kind = kind
        self.work_started = time.monotonic()
        task = asyncio.get_running_loop().create_task(self._run(work()), name=f"keel serve {kind}")
        # Its failure is published as an `error` event; a caller that waits sees it too.
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        self.work = task
        self._status()
        return task

    async def _run(self, work: Awaitable[Any]) -> Any:
        try:
            return await work
        except KeelError as exc:
            error = exc.message.replace("\n", " ")
            self.ring.publish({"type": "error", "error": error, "hint": exc.hint})
            raise
        except Exception as exc:  # a defect: said on the stream and stderr, the server goes on
            import sys

            what = f"{type(exc).__name__}: {exc}".replace("\n", " ")
            print(
                f"keel serve: error: internal error in {self.work_kind} of session {self.id}: "
                f"{what}",
                file=sys.stderr,
            )
            self.ring.publish(
                {
                    "type": "error",
                    "error": f"internal error: {what}",
                    "hint": "the server's stderr has the details",
                }
            )
            raise
        finally:
            self.work = None
            self.work_kind = ""
            self._status()

    def _deliver_background(self) -> None:
        if self.agent.undelivered:
            self.start("notifications", lambda: self.agent.run_notifications(self.sink))

    @property
    def model(self) -> str:
        from keel.llm.catalog import ModelRef

        return str(ModelRef(self.agent.provider.name, self.agent.model))

    @property
    def mode(self) -> str | None:
        from keel.permissions.gate import PermissionGate

        gate = self.agent.gate
        return gate.mode if isinstance(gate, PermissionGate) else None

    def describe(self) -> dict[str, Any]:
        agent = self.agent
        return {
            "id": self.id,
            "loaded": True,
            "path": str(self.path) if self.path else None,
            "cwd": str(agent.cwd),
            "model": self.model,
            "effort": agent.effort,
            "mode": self.mode,
            "busy": self.busy,
            "work": self.work_kind or None,
            "turns": agent.total_turns,
            "usage": agent.spend.usage.to_json(),
            "cost_usd": round(agent.spend.cost, 6),
            "spend": self.spend(),
            "last_seq": self.ring.last_seq,
            "pending": [question_json(q) for q in agent.pending_questions()],
            "tasks": [task_json(t) for t in agent.background.tasks.values()],
        }

    def spend(self) -> dict[str, Any]:
        """The session's budget and what is left of it, and each agent's own spend once it
        started subagents (the `agent_spend` rows)."""
        limits, spent = self.agent.limits, self.agent.spend
        usd_left = None if limits.max_usd is None else round(limits.max_usd - spent.cost, 6)
        tokens_left = None if limits.max_tokens is None else limits.max_tokens - spent.usage.total
        return {
            "budget": {
                "usd": limits.max_usd,
                "tokens": limits.max_tokens,
                "min_output_tokens": limits.min_output_tokens,
                "usd_left": usd_left,
                "tokens_left": tokens_left,
            },
            "agents": list(self.spend_rows.values()),
        }


def task_json(task: Any) -> dict[str, Any]:
    return {
        "id": task.id,
        "kind": task.kind,
        "status": task.status,
        "description": task.description,
        "agent": task.agent,
        "seconds": round(task.seconds(), 1),
        "result": task.result if task.done else None,
    }


class Summaries:
    """`GET /v1/sessions`'s summary of each session file, read again only when the file changed.

    A summary is a function of the file's bytes and, for a session without a final record
    (`running`, `crashed`, `empty`), of whether a writer holds its lock; so it is kept under the
    file's (inode, mtime, size) and, for those, checked against the lock. Reading a thousand files
    took the listing 1.6 s on a 2-core machine, during which the server answered nothing else.
    A listing forgets the files it no longer saw, so this holds one entry per file on disk."""

    UNENDED = frozenset({"running", "crashed", "empty"})

    def __init__(self) -> None:
        self._kept: dict[Path, tuple[tuple[int, int, int], SessionSummary]] = {}

    def of(self, paths: list[Path], held: Container[str] = ()) -> list[SessionSummary]:
        """The summaries of `paths` (in order); unreadable files are left out, as `keel sessions
        list` leaves them (it says why). `held`: the ids of sessions whose lock this process
        holds (they are not probed)."""
        from keel.session.index import is_locked, summarize

        before, self._kept = self._kept, {}
        out: list[SessionSummary] = []
        for path in paths:
            try:
                st = path.stat()
                key = (st.st_ino, st.st_mtime_ns, st.st_size)
                kept = before.get(path)
                if kept is not None and kept[0] == key:
                    summary = kept[1]
                    if summary.status not in self.UNENDED or (
                        (summary.status == "running") == (path.stem in held or is_locked(path))
                    ):
                        self._kept[path] = kept
                        out.append(summary)
                        continue
                summary = summarize(path)
            except (UserError, OSError):
                continue
            self._kept[path] = (key, summary)
            out.append(summary)
        return out

    def __len__(self) -> int:
        return len(self._kept)


class Host:
    """The sessions of one server: of the project at `cwd`, or of every project."""

    def __init__(self, cwd: Path, *, all_projects: bool = False) -> None:
        self.cwd = cwd.resolve()
        self.all_projects = all_projects
        self.sessions: dict[str, Hosted] = {}
        self.summaries = Summaries()
        self._opening = asyncio.Lock()
        #: What else ends its streams when the server stops (the fleet's, keel.server.fleet_routes).
        self.stream_enders: list[Callable[[], None]] = []

    def get(self, session_id: str) -> Hosted:
        hosted = self.sessions.get(session_id)
        if hosted is None:
            raise not_loaded(session_id)
        return hosted

    def _options(self, cwd: Path, **given: Any) -> Options:
        from keel.app import Options

        # Someone answers over HTTP: questions are events, never refused unasked, never
        # allowed unasked either (the gate and sandbox are the TUI's).
        return Options(cwd=cwd, interactive=True, **given)

    def _hosted(self, agent: Agent, options: Options) -> Hosted:
        from keel.permissions.gate import PermissionGate

        ring = EventRing(agent.session_id)
        hosted = Hosted(agent, ring, options)
        agent.on_background_event = hosted.sink
        agent.takes_questions = True  # an MCP server's question waits for a client's answer
        if isinstance(agent.gate, PermissionGate):
            agent.gate.save_rule = hosted.save_rule
        self.sessions[agent.session_id] = hosted
        return hosted

    async def create(
        self, *, model: str | None, effort: str | None, mode: str | None, cwd: Path | None
    ) -> Hosted:
        from keel.app import open_agent

        options = self._options(cwd or self.cwd, model=model, effort=effort, mode=mode)
        notices: list[Event] = []
        try:
            agent = await open_agent(options, notice=notices.append)
        except KeelError as exc:
            raise ApiError.of(exc) from exc
        hosted = self._hosted(agent, options)
        for event in notices:
            hosted.sink(event)
        return hosted

    def _session_path(self, session_id: str | None, latest: bool) -> Path:
        from keel.session.index import find_session, latest_session
        from keel.session.store import sessions_dir

        try:
            path = latest_session(self.cwd) if latest else find_session(session_id or "", self.cwd)
        except UserError as exc:
            raise ApiError.of(exc, 404) from exc
        if not self.all_projects and path.parent != sessions_dir(self.cwd):
            raise ApiError(
                404,
                f"session {path.stem} belongs to another project",
                f"this server hosts {self.cwd}; start `keel serve --all-projects` to host every project",
            )
        return path

    async def resume(
        self, session_id: str | None, *, latest: bool = False, force: bool = False
    ) -> tuple[Hosted, bool]:
        """The session `session_id` (or the latest), loaded: as it is when it already is
        (False), else reopened from its journal (True), its unfinished run resumed. `force`:
        despite a changed configuration (`keel resume --force`); without it such a session is a
        409 naming each change."""
        from keel.app import resume_agent
        from keel.session.journal import SessionLocked
        from keel.session.resume import ConfigurationChanged

        async with self._opening:
            path = self._session_path(session_id, latest)
            if path.stem in self.sessions:
                return self.sessions[path.stem], False
            options = self._options(self.cwd, force=force)
            notices: list[Event] = []
            try:
                opened = await resume_agent(path, options, notice=notices.append)
            except SessionLocked as exc:
                raise ApiError.of(exc, 409) from exc
            except ConfigurationChanged as exc:
                raise ApiError(
                    409,
                    exc.message,
                    'load it with "force": true to go on with the configuration as it is now',
                ) from exc
            except KeelError as exc:
                raise ApiError.of(exc) from exc
            agent = opened.agent  # the undo notes the model was not told yet are queued
            options.cwd = agent.cwd
            hosted = self._hosted(agent, options)
            for event in notices:
                hosted.sink(event)
            if agent.resumable:
                hosted.start("resume", lambda: agent.resume(hosted.sink))
            return hosted, True

    def prompt(self, hosted: Hosted, text: str) -> asyncio.Task[RunResult]:
        hosted.ensure_idle()
        hosted.ring.publish({"type": "user_message", "text": text})
        return hosted.start("prompt", lambda: hosted.agent.run(text, hosted.sink))

    async def close(self, hosted: Hosted, reason: str = "other") -> None:
        """Unload a session: stop its work, close the agent (the file stays), end its streams."""
        self.sessions.pop(hosted.id, None)
        if hosted.work is not None:
            hosted.agent.interrupt("the server unloaded the session")
            with contextlib.suppress(BaseException):
                await hosted.work
        await hosted.agent.aclose(reason)
        hosted.ring.publish({"type": "session_closed", "reason": reason})
        hosted.ring.close()

    async def clear(self, hosted: Hosted) -> Hosted:
        """A fresh context (`/clear`): a new session with the same model, effort, mode and
        session rules; the old one is unloaded (its file stays)."""
        from keel.app import open_agent
        from keel.permissions.gate import PermissionGate

        old = hosted.agent
        options = self._options(
            hosted.options.cwd,
            model=hosted.model,
            effort=old.effort,
            mode=hosted.mode,
        )
        notices: list[Event] = []
        try:
            new = await open_agent(options, notice=notices.append)
        except KeelError as exc:
            raise ApiError.of(exc) from exc
        if isinstance(old.gate, PermissionGate) and isinstance(new.gate, PermissionGate):
            new.gate.session_rules = list(old.gate.session_rules)
        new.session_start_source = "clear"
        fresh = self._hosted(new, options)
        for event in notices:
            fresh.sink(event)
        hosted.ring.publish({"type": "cleared", "new_session": new.session_id})
        await self.close(hosted, "clear")
        return fresh

    def end_streams(self) -> None:
        """The server is stopping: every event stream ends (with `server_stopping`), so that
        no open connection holds the shutdown up."""
        for hosted in self.sessions.values():
            hosted.ring.publish({"type": "server_stopping"})
            hosted.ring.close()
        for end in self.stream_enders:
            end()

    async def aclose(self) -> None:
        """Stop every session: running work is asked to suspend at the next loop boundary
        (resumable with `{resume: id}`), and interrupted if it has not after `SUSPEND_WAIT`."""
        for hosted in self.sessions.values():
            if hosted.work is not None:
                hosted.agent.request_suspend()
        running = [h.work for h in self.sessions.values() if h.work is not None]
        if running:
            await asyncio.wait(running, timeout=SUSPEND_WAIT)
        for hosted in list(self.sessions.values()):
            await self.close(hosted, "exit")


__all__ = ["ApiError", "Host", "Hosted", "Summaries", "not_loaded", "question_json", "task_json"]
