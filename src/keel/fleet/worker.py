"""`keel worker`: take runs from the fleet's queue and run them to a durable end.

One worker process runs up to `concurrency` runs at once in its event loop. For each queue message
it takes: heartbeats (in-progress acks) while the run is active; the run's journal is created in
JetStream, or taken over (a claim record first, then the tail is read) and resumed; the message is
acked only once the run's terminal record is durable, or once it parked. A worker that dies stops
heart-beating, so the message goes to another worker, which resumes the run from its journal (a
journal that is already complete is answered from without a model call). A worker fenced out of a
run (another took it over) stops it without writing or acking anything. SIGTERM: take no more
work, let each run reach its loop boundary (`suspended`), hand the message back.

Attempts: each take of a run (a start or a resume) is one entry in the summary's `attempt_log`. An
entry still open when the next worker takes the run was lost (its worker died); a run lost
`max_attempts` times ends `failed` (its journal left as it is, so `keel runs retry` resumes it).
A worker that cannot serve a run because of its own configuration (no key for the model, a
workspace outside its roots, a model its catalog does not know: a `UserError` while preparing the
run, before any model call) refuses it: the run goes back to the queue with a note, and fails
once `max_attempts` workers, or every live worker, refused it. The worker's own entry in the
registry (`keel-workers`, keel/fleet/registry.py) is rewritten every 2 s while it runs.

Questions park: a permission question or plan approval is looked up in the run's answers; with
none, a `park` record is journaled, the summary says what the run waits on, the journal is fenced
(nothing more of this attempt lands), the run stops and the message is acked. `keel runs answer`
stores the answer and queues the run again; the worker that takes it resumes the half-answered tool
round (no model call for what is journaled) and the gate's question finds the answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import socket
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from keel.agent.events import (
    Event,
    PermissionAsked,
    QuestionRequest,
    RequestStarted,
    ToolFinished,
    TurnFinished,
)
from keel.errors import UserError
from keel.fleet import streams
from keel.fleet.connect import FleetError
from keel.fleet.runs import Fleet, RunRequest, max_attempts, stamp
from keel.frozen import mutable
from keel.session.journal import JournalWriteError, SessionLocked

if TYPE_CHECKING:
    from nats.aio.msg import Msg

    from keel.agent.loop import Agent, RunResult
    from keel.fleet.connect import Bridge
    from keel.fleet.journal import JetStreamStore
    from keel.fleet.registry import Registration
    from keel.llm.catalog import ModelRef
    from keel.llm.messages import ToolUse
    from keel.llm.provider import Provider
    from keel.session.fold import SessionState
    from keel.tools.base import Tool


T = TypeVar("T")


#: Seconds a worker that refused a run hands it back at once, without trying it again.
REFUSAL_MEMORY = 60.0
#: Seconds the worker's loop may be blocked (a journal append waiting through a leader election:
#: at most 3 publish timeouts and a margin) while its runs' heartbeats go on from the journal's
#: thread; a loop blocked longer lets its runs go to another worker.
STALL_LIMIT = 40.0
#: Seconds before a refused run is offered again when no other worker waits for work.
REFUSAL_DELAY = 2.0
#: Attempt log entries kept in a run's summary.
ATTEMPT_LOG = 20


class Refused(Exception):
    """This worker cannot serve the run: its own configuration, not the run, is the reason."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@contextlib.contextmanager
def preparing() -> Iterator[None]:
    """A `UserError` while a run is prepared (workspace, settings, model, provider) is this
    worker's refusal; trouble with the fleet's server is not."""
    try:
        yield
    except FleetError:
        raise
    except UserError as exc:
        raise Refused(exc.one_line()) from exc


def default_scratch(env: Mapping[str, str] | None = None) -> Path:
    """Where workers on this machine keep run workspaces and journal mirrors. The same for every
    worker of the machine, so a run resumed on the same machine finds its directory again."""
    from keel.session.store import keel_home

    return keel_home(env) / "fleet" / "work"


@mutable
class _Active:
    """One run this worker is running."""

    req: RunRequest
    msg: Msg
    agent: Agent | None = None
    workspace: Any = None
    parked: bool = False
    fenced: bool = False
    cancelled: bool = False
    handed_back: bool = False
    #: The attempt stopped on a failure worth another try (a push that failed): nak it.
    retry: bool = False
    dirty: bool = False
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)
    #: When the journal's park records were written, by tool-use id (how long an answer took).
    parked_at: dict[str, str] = field(default_factory=dict)


class Worker:
    def __init__(
        self,
        url: str,
        *,
        concurrency: int = 1,
        scratch: Path | None = None,
        name: str = "",
        env: Mapping[str, str] | None = None,
        provider_for: Any = None,
        say: Any = None,
        tools: Sequence[Tool] = (),
        labels: Sequence[str] = (),
    ) -> None:
        if concurrency < 1:
            raise UserError("--concurrency must be 1 or more")
        self.url = url
        self.concurrency = concurrency
        self.env = dict(os.environ if env is None else env)
        self.scratch = scratch or default_scratch(self.env)
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(2)}"
        self.provider_for = provider_for
        #: Tools of a Python program that runs this worker, offered to every run (a tool may
        #: raise `AnswerLater`: the run parks until `keel runs answer … --result`).
        self.tools = tuple(tools)
        self.say = say or (lambda _line: None)
        self.active: dict[str, _Active] = {}
        self.stopping = asyncio.Event()
        self.ack_wait = streams.ack_wait(self.env)
        #: What this worker offers (`keel worker --labels`), written in its registry entry.
        self.labels = tuple(labels)
        self.started = stamp()
        self.done_runs = 0
        self._fleet: Fleet | None = None
        self._store: JetStreamStore | None = None
        self._bridge: Bridge | None = None
        #: Runs this worker refused lately (run id → [when, when it last handed it back],
        #: monotonic): handed back at once, without trying them again.
        self._refused: dict[str, list[float]] = {}
        self._providers: list[str] | None = None
        #: Set when the runs this worker holds change: its registry entry is rewritten then.
        self._changed = asyncio.Event()
        self._closed = False

    # -- the main loop -----------------------------------------------------------------------

    def stop(self) -> None:
        """Take no more work; suspend every run at its loop boundary and hand it back."""
        if self.stopping.is_set():
            return
        self.stopping.set()
        self._changed.set()
        for active in self.active.values():
            active.handed_back = True
            if active.agent is not None:
                active.agent.request_suspend()

    async def run(self) -> int:
        from keel.fleet.connect import Bridge
        from keel.fleet.journal import JetStreamStore
        from keel.fleet.queues import QueueReader
        from keel.fleet.schedules import Scheduler

        fleet = self._fleet = await Fleet.open(self.url, self.env, reconnect=True)
        fleet.say = self.say  # a webhook or event that failed is said in the worker's log
        await fleet.kv()  # the fleet exists here (a clear error if not)
        bridge = await asyncio.to_thread(Bridge, self.url, name=f"keel worker {self.name}")
        self._bridge = bridge
        # The worker writes the summaries itself (one writer: the store's own would race it).
        self._store = JetStreamStore(
            bridge, scratch=self.scratch / "journals", worker=self.name, auto_summary=False
        )
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self.stop)
        control = await fleet.nc.subscribe(f"{streams.CONTROL_PREFIX}.*", cb=self._control)
        ticker = Scheduler(fleet, say=self.say).start()  # fires due schedules (schedules.py)
        registration = await self._through_election(self._register, "registry")
        beats = asyncio.create_task(self._registry_beats(registration))
        try:
            reader = QueueReader(
                fleet.js,
                labels=self.labels,
                ack_wait=self.ack_wait,
                say=self.say,
                is_closed=lambda: fleet.nc.is_closed,
            )
            # The consumer's own wait rules the heartbeats.
            self.ack_wait = await self._through_election(reader.start, "queue")
            labels = f", labels {','.join(self.labels)}" if self.labels else ""
            self.say(
                f"worker {self.name} takes runs from {self.url} ({self.concurrency} at once{labels})"
            )
            slots = asyncio.Semaphore(self.concurrency)
            running: set[asyncio.Task[None]] = set()
            while not self.stopping.is_set():
                await slots.acquire()
                if self.stopping.is_set():
                    slots.release()
                    break
                msg = await reader.next()
                if msg is None:
                    slots.release()
                    continue
                task = asyncio.create_task(self._take(msg))
                running.add(task)
                task.add_done_callback(running.discard)
                task.add_done_callback(lambda _t: slots.release())
            if running:
                await asyncio.gather(*running, return_exceptions=True)
            with contextlib.suppress(Exception):
                await reader.close()
        finally:
            await ticker.stop()
            self._closed = True
            beats.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await beats
            with contextlib.suppress(Exception):  # a clean stop: gone from `keel workers` now
                await registration.remove()
            with contextlib.suppress(Exception):
                await control.unsubscribe()
            self._store.close()
            await asyncio.to_thread(bridge.close)
            with contextlib.suppress(Exception):
                await fleet.close()
        return 0

    async def _through_election(self, step: Callable[[], Awaitable[T]], what: str) -> T:
        """`step()`, asked again while the fleet's replicated streams elect a leader (a node
        lost: a timeout or "no responders" for a few seconds), so a worker that starts during an
        election waits it out instead of exiting; after `ELECTION_WAIT` the error stands."""
        from keel.fleet.runs import ELECTION_WAIT, _electing

        patience = time.monotonic() + ELECTION_WAIT
        while True:
            try:
                return await step()
            except _electing() as exc:
                if time.monotonic() > patience:
                    raise
                self.say(f"{what}: {type(exc).__name__}: {exc}; trying again")
                await asyncio.sleep(0.5)

    # -- the registry -------------------------------------------------------------------------

    async def _register(self) -> Registration:
        from keel.fleet.registry import Registration, workers_bucket

        assert self._fleet is not None
        kv = await workers_bucket(self._fleet.js, create=True)
        assert kv is not None
        registration = Registration(kv, self.name)
        await registration.put(self.entry())
        return registration

    def entry(self) -> dict[str, Any]:
        """This worker's registry entry as of now."""
        from keel import __version__
        from keel.fleet.registry import stamp_beat
        from keel.fleet.workspace import allowed_roots

        if self._providers is None:
            self._providers = self._servable()
        return stamp_beat(
            {
                "name": self.name,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "version": __version__,
                "started": self.started,
                "concurrency": self.concurrency,
                "running": sorted(self.active),
                "labels": list(self.labels),
                "roots": [str(root) for root in allowed_roots(self.env)],
                "providers": self._providers,
                "ack_wait": self.ack_wait,
                "stopping": self.stopping.is_set(),
            }
        )

    def _servable(self) -> list[str]:
        from keel.config.settings import load_settings
        from keel.fleet.registry import servable_providers

        try:
            settings = load_settings(self.scratch, self.env)
        except UserError:
            settings = None
        return servable_providers(self.env, settings)

    async def _registry_beats(self, registration: Registration) -> None:
        # Ends on `_closed`, not only on a cancel: nats-py turns a cancel that lands inside a
        # request (the put) into its own TimeoutError, which the beat would swallow.
        while not self._closed:
            # A beat every WORKER_BEAT s, and at once when the runs it holds change.
            with contextlib.suppress(TimeoutError):
                # asyncio.timeout, not wait_for: 3.11's wait_for can swallow the cancel that
                # stops this task when the event is set at the same moment.
                async with asyncio.timeout(streams.WORKER_BEAT):
                    await self._changed.wait()
            self._changed.clear()
            with contextlib.suppress(Exception):  # NATS trouble: the next beat tries again
                await registration.put(self.entry())

    async def _control(self, msg: Msg) -> None:
        run = msg.subject.rsplit(".", 1)[-1]
        active = self.active.get(run)
        if active is not None and msg.data == b"cancel":
            active.cancelled = True
            if active.agent is not None:
                active.agent.request_suspend()

    # -- one queue message -------------------------------------------------------------------

    async def _take(self, msg: Msg) -> None:
        try:
            req = RequestFromMsg.parse(msg)
        except UserError as exc:
            self.say(f"dropped a queue message: {exc}")
            await msg.term()
            return
        if req.run in self.active:  # a redelivery of what this worker runs (a slow heartbeat)
            return
        refused = self._refused.get(req.run)
        now = time.monotonic()
        if refused is not None and now - refused[0] < REFUSAL_MEMORY:
            # Refused here a moment ago: this worker's configuration has not changed since. Back
            # at once, to the worker that has waited longest; back again within a second means
            # no other worker waits: then after a delay, not in a tight loop.
            delay = REFUSAL_DELAY if now - refused[1] < 1.0 else 0.0
            refused[1] = now
            with contextlib.suppress(Exception):
                await msg.nak(delay=delay or None)
            return
        assert self._fleet is not None
        req = await self._fleet.original(req)
        active = self.active[req.run] = _Active(req, msg)
        self._changed.set()
        beat = asyncio.create_task(self._heartbeat(msg))
        try:
            await self._handle(active)
        except Refused as exc:
            await self._refuse(active, exc.reason)
        except (FleetError, JournalWriteError, SessionLocked) as exc:
            # The stream, not the run: another attempt (here or elsewhere) goes on from the
            # journal once it answers again.
            self.say(f"run {req.run}: {exc.one_line()}; handed back")
            await self._hand_back(active, exc.one_line())
        except Exception as exc:  # one run's failure must not stop the worker
            import nats.errors

            if isinstance(exc, nats.errors.Error | TimeoutError | ConnectionError):
                # NATS trouble (an election, a reconnect), not the run's: hand it back.
                self.say(f"run {req.run}: {type(exc).__name__}: {exc}; handed back")
                await self._hand_back(active, f"{type(exc).__name__}: {exc}")
            elif not active.fenced:
                self.say(f"run {req.run}: {type(exc).__name__}: {exc}")
                with contextlib.suppress(Exception):
                    await self._summary(
                        req.run,
                        status="error",
                        error=str(exc)[:500],
                        update=self._ended("error", str(exc)[:200]),
                    )
                    await msg.ack()
        finally:
            beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beat
            self.active.pop(req.run, None)
            self._changed.set()
            if active.fenced:
                with contextlib.suppress(Exception):
                    await self._summary(req.run, update=self._taken_over())
            # A fenced attempt's directory may be the new owner's now (the same machine).
            if active.workspace is not None and not (active.handed_back or active.fenced):
                with contextlib.suppress(Exception):
                    active.workspace.cleanup()

    async def _heartbeat(self, msg: Msg) -> None:
        """In-progress acks for `msg`, sent from the journal's connection on its own thread: a
        journal append blocks this loop, and during a cluster's leader election it may wait for
        seconds; beats sent from here would stop then, and another worker would take over a
        live run (and run its tool call in flight again). This loop still ticks the beats: one
        stuck for more than STALL_LIMIT s stops them, and the run moves on."""
        interval = self.ack_wait / streams.BEATS_PER_WAIT
        bridge = self._bridge
        if bridge is None or not msg.reply:
            while True:
                await asyncio.sleep(interval)
                with contextlib.suppress(Exception):
                    await msg.in_progress()
        ticked = [time.monotonic()]
        beats = bridge.submit(_beat(bridge, msg.reply, interval, ticked))
        try:
            while True:
                ticked[0] = time.monotonic()
                await asyncio.sleep(interval)
        finally:
            beats.cancel()

    async def _summary(self, run: str, **changes: Any) -> dict[str, Any]:
        assert self._fleet is not None
        return await self._fleet.put_summary(run, **changes)

    async def _hand_back(self, active: _Active, reason: str) -> None:
        """Give the run back to the queue for a trouble of the fleet's, not the run's: another
        attempt goes on from the journal (not a lost attempt)."""
        with contextlib.suppress(Exception):
            await self._summary(
                active.req.run,
                status="queued",
                worker="",
                update=self._ended("handed back", reason[:200]),
            )
        with contextlib.suppress(Exception):
            await active.msg.nak(delay=5)

    # -- attempts ------------------------------------------------------------------------------

    def _ended(self, how: str, reason: str = "") -> Callable[[dict[str, Any]], dict[str, Any]]:
        """A summary update that closes this worker's open attempt: it ended `how`."""

        def update(current: dict[str, Any]) -> dict[str, Any]:
            log = _attempt_log(current)
            for entry in reversed(log):
                if entry.get("worker") == self.name and not entry.get("ended"):
                    entry.update(ended=how, at=stamp())
                    if reason:
                        entry["reason"] = reason
                    break
            return {"attempt_log": log}

        return update

    def _taken_over(self) -> Callable[[dict[str, Any]], dict[str, Any]]:
        """A summary update for a fenced attempt: the worker that took the run over counted it
        lost, but this worker is alive (it stalled): not a lost attempt."""

        def update(current: dict[str, Any]) -> dict[str, Any]:
            log = _attempt_log(current)
            for entry in reversed(log):
                if entry.get("worker") != self.name or entry.get("ended") not in (None, "lost"):
                    continue
                changes: dict[str, Any] = {"attempt_log": log}
                if entry.get("ended") == "lost":
                    changes["lost"] = max(0, int(current.get("lost") or 0) - 1)
                    if not entry.get("progress"):
                        streak = int(current.get("lost_in_a_row") or 0)
                        changes["lost_in_a_row"] = max(0, streak - 1)
                entry.update(
                    ended="taken over",
                    at=stamp(),
                    reason="another worker took the run over while this one was alive",
                )
                return changes
            return {}

        return update

    async def _begin_attempt(self, active: _Active, work: int = 0) -> bool:
        """Record this take of the run in its summary; an attempt another worker left open was
        lost (that worker died). `work`: how many model replies and tool results the journal
        holds now. A lost attempt that added none made no progress: a run lost `max_attempts`
        times in a row without progress (a poison run: whatever it does next kills its worker)
        is `failed` and its message acked (its journal is left for `keel runs retry`). A lost
        attempt that made progress was bad luck, not poison: it restarts that count."""
        assert self._fleet is not None
        req = active.req
        limit = max_attempts(req.max_attempts, self.env)
        current = await self._fleet.summary(req.run) or {}
        pickup = await self._pickup(current)

        def update(current: dict[str, Any]) -> dict[str, Any]:
            log = _attempt_log(current)
            changes: dict[str, Any] = {}
            lost = int(current.get("lost") or 0)
            streak = int(current.get("lost_in_a_row") or 0)
            open_entry = log[-1] if log and not log[-1].get("ended") else None
            if open_entry is None and not log and current.get("status") == "running":
                # A summary from before attempts were recorded: its worker's attempt is open.
                open_entry = {"worker": current.get("worker") or "?", "started": ""}
                log.append(open_entry)
            if open_entry is not None:
                who = open_entry.get("worker") or "?"
                open_entry.update(
                    ended="lost",
                    at=stamp(),
                    reason=f"worker {who} stopped while running it (killed or crashed)",
                )
                lost += 1
                before = open_entry.get("work")
                if isinstance(before, int) and work > before:
                    open_entry["progress"] = True  # it got somewhere before it died
                    streak = 0
                else:
                    streak += 1
                changes.update(lost=lost, lost_in_a_row=streak)
                if pickup is not None:
                    changes["pickup_s"] = pickup
            if streak >= limit:
                took = [str(e.get("worker")) for e in log if e.get("ended") == "lost"][-streak:]
                changes.update(
                    status="failed",
                    worker="",
                    finished=stamp(),
                    error=f"the run was lost {streak} time{'s' if streak != 1 else ''} in a row "
                    f"without progress: worker{'s' if len(took) != 1 else ''} {', '.join(took)} "
                    "stopped while running it (killed or crashed)",
                )
            else:
                log.append({"worker": self.name, "started": stamp(), "work": work})
                changes["attempts"] = int(current.get("attempts") or 0) + 1
                changes["note"] = ""  # why it was queued again: moot once a worker has it
            changes["attempt_log"] = log[-ATTEMPT_LOG:]
            return changes

        summary = await self._summary(req.run, update=update)
        if summary.get("status") == "failed":
            self.say(f"run {req.run} failed: {summary.get('error')}")
            await active.msg.ack()
            return False
        return True

    async def _pickup(self, current: dict[str, Any]) -> float | None:
        """Seconds from the last sign of life of the worker whose attempt is open in `current`
        (its last registry beat, else the attempt's start) to now; None when none is open."""
        log = _attempt_log(current)
        if log and not log[-1].get("ended"):
            who, started = str(log[-1].get("worker") or ""), str(log[-1].get("started") or "")
        elif not log and current.get("status") == "running":
            who, started = str(current.get("worker") or ""), str(current.get("started") or "")
        else:
            return None
        since: float | None = None
        assert self._fleet is not None
        with contextlib.suppress(Exception):
            from keel.fleet.registry import workers_bucket

            kv = await workers_bucket(self._fleet.js)
            if kv is not None and who:
                import json

                entry = await kv.get(streams.worker_key(who))
                since = float(json.loads(entry.value or b"{}").get("beat_at") or 0) or None
        if since is None and started:
            import calendar

            with contextlib.suppress(ValueError):
                since = float(calendar.timegm(time.strptime(started, "%Y-%m-%dT%H:%M:%SZ")))
        return None if since is None else round(max(0.0, time.time() - since), 2)

    async def _refuse(self, active: _Active, reason: str) -> None:
        """This worker cannot serve the run (its own configuration): hand it back with a note,
        or fail it once `max_attempts` workers, or every live worker, refused it."""
        from keel.fleet.registry import live_workers

        assert self._fleet is not None
        req = active.req
        now = time.monotonic()
        self._refused = {r: t for r, t in self._refused.items() if now - t[0] < REFUSAL_MEMORY}
        self._refused[req.run] = [now, now]
        self.say(f"run {req.run}: this worker cannot serve it: {reason}; handed back")
        live: set[str] = set()
        with contextlib.suppress(Exception):
            live = {str(w.get("name")) for w in await live_workers(self._fleet)}
        limit = max_attempts(req.max_attempts, self.env)
        close = self._ended("refused", reason[:300])

        def update(current: dict[str, Any]) -> dict[str, Any]:
            changes = close(current)
            refused = [
                dict(r)
                for r in current.get("refused") or []
                if isinstance(r, dict) and r.get("worker") != self.name
            ]
            refused.append({"worker": self.name, "reason": reason[:300]})
            changes["refused"] = refused
            names = {str(r.get("worker")) for r in refused}
            if len(names) >= limit or (live and live <= names):
                each = "; ".join(f"{r['worker']}: {r['reason']}" for r in refused)
                changes.update(
                    status="failed",
                    worker="",
                    finished=stamp(),
                    error=f"no worker can serve this run: {each}",
                )
            else:
                changes.update(
                    status="queued",
                    worker="",
                    note=f"worker {self.name} cannot serve it ({reason[:200]}); back in the "
                    "queue for another worker",
                )
            return changes

        try:
            summary = await self._summary(req.run, update=update)
        except Exception:
            with contextlib.suppress(Exception):
                await active.msg.nak(delay=REFUSAL_DELAY)
            raise
        if summary.get("status") == "failed":
            self.say(f"run {req.run} failed: {summary.get('error')}")
            await active.msg.ack()
        else:
            await active.msg.nak()  # to the worker that has waited longest for work

    async def _handle(self, active: _Active) -> None:
        assert self._fleet is not None
        assert self._store is not None
        req, msg, store = active.req, active.msg, self._store
        attempt = int(msg.metadata.num_delivered or 1)
        cancel = await self._fleet.cancelled(req.run)
        exists = await asyncio.to_thread(store.exists, req.run)
        if not exists:
            if req.why not in ("start", "retry"):
                self.say(f"run {req.run}: no journal for a {req.why} message; dropped")
                await msg.ack()
                return
            if cancel:
                await self._summary(req.run, status="cancelled", finished=stamp())
                await msg.ack()
                return
            if await self._begin_attempt(active):
                await self._start(active)
            return
        journal, loaded = await asyncio.to_thread(
            store.open, req.run, worker=self.name, attempt=attempt
        )
        from keel.session.fold import fold

        state = fold(loaded.records)
        if cancel and (state.terminal is None or state.terminal.reason == "suspended"):
            from keel.session.store import SessionLog

            SessionLog(journal, req.run).terminal(
                "cancelled", "cancelled (keel runs cancel)", turns=state.turns, cost=state.cost
            )
            journal.close()
            await self._summary(
                req.run, status="cancelled", finished=stamp(), turns=state.turns, cost=state.cost
            )
            await msg.ack()
            return
        again = (
            req.why == "retry" and state.terminal is not None and state.terminal.reason == "error"
        )
        if state.terminal is not None and state.terminal.reason != "suspended" and not again:
            await self._answer_from_journal(active, journal, state)
            return
        if state.parked is not None:
            answer = await self._fleet.get_answer(req.run, state.parked.request_id)
            if answer is None:  # still waiting: it stays parked, the message goes
                journal.close()
                await self._summary(req.run, status="parked")
                await msg.ack()
                return
        try:
            begun = await self._begin_attempt(active, _work(loaded.records))
        except BaseException:
            journal.close()
            raise
        if not begun:
            journal.close()
            return
        await self._resume(active, journal, loaded, state)

    async def _answer_from_journal(
        self, active: _Active, journal: Any, state: SessionState
    ) -> None:
        """The run ended before the worker that ran it could ack (it died in between)."""
        terminal = state.terminal
        assert terminal is not None
        if state.recovered:  # killed after its final answer: make the end durable
            from keel.session.store import SessionLog

            SessionLog(journal, active.req.run).terminal(
                terminal.reason, terminal.message, turns=state.turns, cost=state.cost
            )
        journal.close()
        text = _final_text(state)
        await self._summary(
            active.req.run,
            status=terminal.reason,
            text=text,
            turns=state.turns,
            cost=round(state.cost, 8),
            finished=stamp(),
            answered_from_journal=True,
        )
        await active.msg.ack()

    # -- running -------------------------------------------------------------------------------

    def _options(self, req: RunRequest, cwd: Path) -> Any:
        from keel.app.options import Options

        return Options(
            cwd=cwd,
            model=req.model,
            mode=req.mode,
            max_turns=req.max_turns,
            max_tokens_budget=req.max_tokens_budget,
            max_budget_usd=req.max_budget_usd,
            interactive=False,
        )

    def _provider(self, ref: ModelRef) -> Provider | None:
        return self.provider_for(ref) if self.provider_for is not None else None

    async def _workspace(self, active: _Active) -> Path:
        from keel.fleet.workspace import Workspace, parse_workspace

        spec = parse_workspace(active.req.workspace or {})
        active.workspace = await asyncio.to_thread(
            Workspace.prepare, spec, active.req.run, self.scratch / "runs", env=self.env
        )
        return Path(active.workspace.path)

    async def _start(self, active: _Active) -> None:
        from keel import __version__
        from keel.app.assembly import choose_model, open_agent, read_settings
        from keel.session.records import Meta
        from keel.session.store import SessionLog

        assert self._store is not None
        req = active.req
        with preparing():
            cwd = await self._workspace(active)
            options = self._options(req, cwd)
            notice = self._notice(req.run)
            settings = read_settings(cwd, notice)
            ref = choose_model(req.model, settings)
            agent = await open_agent(
                options,
                notice,
                settings=settings,
                ref=ref,
                provider=self._provider(ref),
                session=False,
                session_id=req.run,
                tools=self.tools,
            )
        try:
            meta = Meta(req.run, str(cwd), str(ref), agent.fingerprint(), None, None, __version__)
            try:
                journal = await asyncio.to_thread(self._store.create, meta)
            except UserError:
                if not await asyncio.to_thread(self._store.exists, req.run):
                    raise
                # Another worker started it first (a redelivery while this one was starting):
                # it is theirs; let it go as a fenced attempt does (no ack, no summary).
                active.fenced = True
                self.say(f"run {req.run} was started by another worker; this worker let it go")
                return
            agent.session = SessionLog(journal, req.run)
            _journal_saved(active, agent)
            await self._summary(
                req.run, status="running", worker=self.name, started=stamp(), cwd=str(cwd)
            )
            result = await self._drive(active, agent, req.prompt)
        finally:
            await agent.aclose()
        await self._finish(active, result)

    async def _resume(
        self, active: _Active, journal: Any, loaded: Any, state: SessionState
    ) -> None:
        from keel.app.assembly import continue_session
        from keel.session.resume import left_running, reap

        req = active.req
        active.parked_at = _park_times(loaded.records)
        try:
            # What an earlier attempt on this machine left running goes first: it must not
            # write into the workspace this attempt is about to prepare.
            await asyncio.to_thread(reap, left_running(journal.path, state.processes))
            with preparing():
                cwd = await self._workspace(active)
                options = self._options(req, cwd)
                agent, state, journal, _ref = await continue_session(
                    journal,
                    loaded,
                    options,
                    self._notice(req.run),
                    where=f"run {req.run}",
                    provider_for=self.provider_for,
                    cwd=cwd,
                    tools=self.tools,
                )
        except BaseException:
            with contextlib.suppress(Exception):
                journal.close()
            raise
        for note in state.undo_notes:
            agent.add_note(note)
        if state.parked is not None and state.parked.waits_for == "deferred":
            assert self._fleet is not None
            answer = await self._fleet.get_answer(req.run, state.parked.request_id) or {}
            agent.supply_result(
                state.parked.tool_use_id,
                str(answer.get("result", "")),
                is_error=bool(answer.get("is_error")),
            )
        lost = active.workspace.resume_note(*_last_saved(loaded.records))
        if lost:
            agent.add_resume_note(lost)
        try:
            await self._summary(req.run, status="running", worker=self.name, cwd=str(cwd))
            prompt = None if agent.resumable else (state.last_prompt or req.prompt or None)
            result = await self._drive(active, agent, prompt)
        finally:
            await agent.aclose()
        await self._finish(active, result)

    async def _drive(self, active: _Active, agent: Agent, prompt: str | None) -> RunResult | None:
        active.agent = agent
        self._bound_workspace(active, agent)
        agent.ask_through_events()

        async def later(call: ToolUse, note: str) -> None:
            await self._park(active, agent, call, "deferred", note)

        agent.on_answer_later(later)
        if self.stopping.is_set() or active.cancelled:
            agent_suspend_soon(agent)
        try:
            if prompt is None:
                result = await agent.resume(lambda e: self._event(active, e))
            else:
                result = await agent.run(prompt, lambda e: self._event(active, e))
            journal = agent.session.journal if agent.session is not None else None
            if getattr(journal, "fenced", False) and not (active.parked or active.retry):
                active.fenced = True  # another worker took the run over: not ours to end
                return None
            if getattr(journal, "broken", False) and not active.parked:
                # The stream stopped answering mid-run (a node lost, say): the run is not over,
                # only this attempt; another resumes it from what is stored.
                self.say(f"run {active.req.run}: the journal stopped answering; handed back")
                active.retry = True
                return None
            if result.stop_reason == "suspended" and active.cancelled and agent.session:
                agent.session.terminal(
                    "cancelled",
                    "cancelled (keel runs cancel)",
                    turns=agent.total_turns,
                    cost=agent.spend.cost,
                    prompt=agent.last_prompt,
                )
            return result
        except JournalWriteError as exc:
            from keel.fleet.journal import Fenced

            if isinstance(exc, Fenced) or active.parked or active.retry:
                active.fenced = active.fenced or not (active.parked or active.retry)
                return None
            raise
        finally:
            active.agent = None

    def _event(self, active: _Active, event: Event) -> None:
        if isinstance(event, ToolFinished):
            active.dirty = True
        elif isinstance(event, RequestStarted | TurnFinished) and active.dirty:
            active.dirty = False
            self._save_workspace(active)
        if isinstance(event, PermissionAsked):
            task = asyncio.create_task(self._question(active, event))
            active.tasks.add(task)
            task.add_done_callback(active.tasks.discard)
        elif isinstance(event, QuestionRequest) and active.agent is not None:
            # An MCP server's question: nobody can answer it in a fleet run.
            active.agent.answer(event.request_id, "a fleet run cannot answer questions")

    def _bound_workspace(self, active: _Active, agent: Agent) -> None:
        """Hold the run to its git workspace's limits: the file tools refuse a file the saves
        would leave out, and each round is saved before the next model request is built, so
        what a save left out is told in that very request."""
        from keel.fleet.workspace import MAX_FILE_ENV, size_text

        workspace = active.workspace
        if workspace is None or workspace.spec.kind != "git":
            return
        if workspace.limits.per_file is not None:
            agent.ctx.max_file_size = workspace.limits.per_file
            agent.ctx.max_file_reason = (
                f"files over {size_text(workspace.limits.per_file)} are not kept in this fleet "
                f"run's workspace ({MAX_FILE_ENV})"
            )

        def save_round() -> None:
            if active.dirty:
                active.dirty = False
                self._save_workspace(active)

        agent.before_request.append(save_round)

    def _save_workspace(self, active: _Active) -> None:
        """Push the files of the tool round that just ended, before the next model request (it
        blocks the worker's loop for the push: the next request must not start before it). A
        push another worker's moved the branch under is a takeover: this attempt stops like a
        fenced one. A push that fails otherwise stops the attempt too and hands the run back,
        since going on would let more than the round in flight go unsaved."""
        if active.workspace is None or active.parked or active.fenced:
            return
        from keel.fleet.workspace import WorkspaceConflict

        try:
            saved = active.workspace.save(f"keel run {active.req.run}: tool round")
            if saved is not None:
                _journal_saved(active, active.agent)
            for note in active.workspace.take_notes():  # files left out for a limit
                self.say(f"run {active.req.run}: {note}")
                if active.agent is not None:
                    active.agent.add_request_note(note)
        except WorkspaceConflict as exc:
            self.say(f"run {active.req.run}: {exc.one_line()}")
            self._stop_attempt(active, fenced=True)
        except UserError as exc:
            self.say(f"run {active.req.run}: cannot save the workspace: {exc.one_line()}")
            self._stop_attempt(active, fenced=False)

    def _stop_attempt(self, active: _Active, *, fenced: bool) -> None:
        """End this attempt now without writing anything more to the journal."""
        agent = active.agent
        if agent is None or agent.session is None:
            return
        fence = getattr(agent.session.journal, "fence", None)
        if fence is not None:
            fence()
        if fenced:
            active.fenced = True
        else:
            active.handed_back = active.retry = True
        agent.interrupt("workspace")

    async def _question(self, active: _Active, event: PermissionAsked) -> None:
        assert self._fleet is not None
        agent = active.agent
        if agent is None:
            return
        from keel.permissions.gate import PermissionReply

        request = event.call.id  # stable across workers: the journaled tool-use id
        answer = await self._fleet.get_answer(active.req.run, request)
        if answer is not None:
            agent.answer(
                event.request_id,
                PermissionReply(bool(answer.get("allow")), reason=str(answer.get("reason", ""))),
                # The question waited from the park to the answer, not the moment it took here.
                waited_ms=_waited_ms(active.parked_at.get(request), answer.get("at")),
            )
            return
        await self._park(
            active,
            agent,
            event.call,
            "plan" if event.plan else "permission",
            event.plan or event.reason,
        )

    async def _park(
        self, active: _Active, agent: Agent, call: ToolUse, waits_for: str, question: str
    ) -> None:
        """Journal what the run waits for, fence this attempt, stop it; the worker goes on."""
        from keel.session.records import ParkRecord

        session = agent.session
        assert session is not None
        record = ParkRecord(call.id, call.id, call.name, waits_for, question)
        await asyncio.to_thread(session.journal.append, record)
        fence = getattr(session.journal, "fence", None)
        if fence is not None:
            fence()  # nothing more of this attempt lands in the journal
        active.parked = True
        await self._summary(
            active.req.run,
            status="parked",
            waits_on={
                "request": call.id,
                "tool": call.name,
                "waits_for": waits_for,
                "question": question[:500],
                "input": call.input,
            },
        )
        if waits_for != "deferred":  # a deferred call stops its round itself
            agent.interrupt("parked")

    async def _finish(self, active: _Active, result: RunResult | None) -> None:
        req, msg = active.req, active.msg
        if active.fenced:
            self.say(f"run {req.run} was taken over by another worker; this worker let it go")
            return  # the message is the other worker's now: no ack, no nak
        if active.parked:
            self.say(f"run {req.run} parked: it waits for an answer")
            await self._summary(req.run, update=self._ended("parked"))
            await msg.ack()
            return
        if active.retry:
            await self._summary(
                req.run,
                status="queued",
                worker="",
                update=self._ended("handed back", "the workspace or the journal failed"),
            )
            await msg.nak(delay=5)
            return
        assert result is not None
        if result.stop_reason == "suspended" and active.cancelled:
            await self._summary(
                req.run,
                status="cancelled",
                finished=stamp(),
                turns=result.turns,
                cost=result.cost,
                update=self._ended("cancelled"),
            )
            await msg.ack()
            return
        if result.stop_reason == "suspended" and active.handed_back:
            await self._summary(
                req.run,
                status="queued",
                worker="",
                update=self._ended("handed back", "the worker stopped (SIGTERM)"),
            )
            await msg.nak()
            self.say(f"run {req.run} suspended and handed back")
            return
        from keel.agent.loop import _TERMINAL

        self.done_runs += 1
        status = _TERMINAL.get(result.stop_reason, result.stop_reason)
        await self._summary(
            req.run,
            update=self._ended(status, (result.error or "")[:200]),
            status=status,
            text=result.text,
            error=result.error or "",
            turns=result.turns,
            cost=round(result.cost, 8),
            usage=result.usage.to_json(),
            finished=stamp(),
        )
        await msg.ack()

    def _notice(self, run: str) -> Any:
        def notice(event: Event) -> None:
            text = getattr(event, "text", "")
            if text and getattr(event, "level", "") == "warning":
                self.say(f"run {run}: {text}")

        return notice


async def _beat(bridge: Bridge, reply: str, interval: float, ticked: list[float]) -> None:
    """In-progress acks to `reply` every `interval` s while the worker's loop ticked (`ticked`)
    within STALL_LIMIT s; runs on the bridge's loop."""
    while True:
        await asyncio.sleep(interval)
        if time.monotonic() - ticked[0] > STALL_LIMIT:
            continue  # the worker's loop is stuck past any append's bound: let the run move on
        with contextlib.suppress(Exception):
            await bridge.nc.publish(reply, b"+WPI")


def agent_suspend_soon(agent: Agent) -> None:
    """Ask for a suspend as soon as the run has a task to stop."""

    async def later() -> None:
        for _ in range(100):
            if agent.busy:
                agent.request_suspend()
                return
            await asyncio.sleep(0.01)

    asyncio.get_running_loop().create_task(later())


#: The note a worker journals after each push of a git workspace (and its starting commit).
SAVED = "fleet workspace saved at "


def _journal_saved(active: _Active, agent: Agent | None) -> None:
    pushed = getattr(active.workspace, "pushed", None)
    if agent is not None and agent.session is not None and pushed:
        agent.session.note(SAVED + str(pushed))


def _last_saved(records: list[Any]) -> tuple[str | None, int]:
    """The last commit the journal says was pushed, and how many tool rounds it holds after."""
    from keel.session.records import AssistantRecord, NoteRecord

    last: str | None = None
    rounds = 0
    for record in records:
        p = record.payload
        if isinstance(p, NoteRecord) and p.text.startswith(SAVED):
            last, rounds = p.text.removeprefix(SAVED), 0
        elif isinstance(p, AssistantRecord) and p.message.tool_uses:
            rounds += 1
    return last, rounds


def _attempt_log(summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A copy of the summary's attempt log (entries that are not objects dropped)."""
    return [dict(e) for e in summary.get("attempt_log") or [] if isinstance(e, dict)]


def _park_times(records: list[Any]) -> dict[str, str]:
    from keel.session.records import ParkRecord

    return {r.payload.tool_use_id: r.ts for r in records if isinstance(r.payload, ParkRecord)}


def _waited_ms(parked: str | None, answered: Any) -> float | None:
    """Milliseconds from a park record's time to its answer's `at` (None: either is unknown)."""
    from datetime import datetime

    if not parked or not isinstance(answered, str):
        return None
    try:
        start = datetime.fromisoformat(parked.replace("Z", "+00:00"))
        end = datetime.fromisoformat(answered.replace("Z", "+00:00"))
    except ValueError:
        return None
    return max((end - start).total_seconds() * 1000, 0.0)


def _work(records: list[Any]) -> int:
    """The model replies and tool results in a journal: what an attempt gets done (a tool
    started but not finished, a claim or a note is not progress)."""
    from keel.session.records import AssistantRecord, ToolResultRecord

    return sum(isinstance(r.payload, AssistantRecord | ToolResultRecord) for r in records)


def _final_text(state: SessionState) -> str:
    for message in reversed(state.messages):
        if message.role == "assistant":
            return message.text
    return ""


class RequestFromMsg:
    @staticmethod
    def parse(msg: Msg) -> RunRequest:
        return RunRequest.from_bytes(msg.data)


def run_worker(url: str, **kwargs: Any) -> int:
    worker = Worker(url, **kwargs)
    started = time.monotonic()
    code = asyncio.run(worker.run())
    worker.say(
        f"worker {worker.name} stopped after {worker.done_runs} run(s) in "
        f"{time.monotonic() - started:.1f} s"
    )
    return code
