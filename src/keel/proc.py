"""Running a command so that it cannot outlive its deadline: hooks and bash both start here.

Each command runs under `keel._reaper`, a per-command supervisor that is a child subreaper in a
new session: the command and everything it starts, including children that detach
(`sleep 300 &`, `setsid`, `nohup`, double forks), stay in the supervisor's tree and are killed
with it. keel enforces the deadline itself, as wall-clock time from the spawn: at the deadline
(or on cancellation) it tells the supervisor to kill the tree, and stops reading the pipes
whether or not something still holds them open. If the supervisor does not answer, keel kills
its process group. If keel itself dies, the supervisor sees its control socket close (and gets
its parent-death signal) and kills the tree too.

Why a supervisor rather than keel itself as the subreaper: orphans would then be re-parented to
keel, and reaping them (`waitpid(-1)`) would steal the exit status of children other code waits
for (MCP servers, git); a cgroup needs a delegation an ordinary user does not have. The cost is
one small Python start (~15 ms) per command.

What remains possible: a process started for the command by a daemon outside its tree (an
already running tmux, docker or systemd) is not the command's descendant and is not killed.

`read_in_worker` is the other half of "nothing blocks": a blocking call in a daemon thread that
a cancellation abandons (it cannot hold the event loop or the exit of the process).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol, TypeVar

from keel.frozen import frozen

_REAPER = str(Path(__file__).with_name("_reaper.py"))
#: How long keel waits for the supervisor to finish killing before it kills the group itself.
SUPERVISOR_WAIT = 3.0
#: After the supervisor exits, how long the pipes may take to reach end of file.
PIPE_GRACE = 0.2

T = TypeVar("T")


class Sink(Protocol):
    def feed(self, data: bytes) -> None: ...


class Head:
    """A sink that keeps the first `limit` bytes of a stream and drops the rest (a command that
    floods its output costs `limit` bytes, not what it printed)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.data = bytearray()

    def feed(self, data: bytes) -> None:
        if len(self.data) < self.limit:
            self.data += data[: self.limit - len(self.data)]

    @property
    def full(self) -> bool:
        return len(self.data) >= self.limit


@frozen
class Finished:
    """How a command ended: `returncode` as asyncio reports it (negative: killed by that signal;
    None: it did not end before the deadline or the cancellation)."""

    returncode: int | None
    timed_out: bool
    pgid: int


class _Reader(asyncio.Protocol):
    def __init__(self, sink: Sink, closed: asyncio.Future[None]) -> None:
        self.sink = sink
        self.closed = closed

    def data_received(self, data: bytes) -> None:
        self.sink.feed(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


class _Control(asyncio.Protocol):
    """keel's end of the supervisor's control socket: `x STATUS` says the command exited."""

    def __init__(self, exited: asyncio.Future[int], closed: asyncio.Future[None]) -> None:
        self.exited = exited
        self.closed = closed
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if b"\n" in self.buffer and not self.exited.done():
            line = self.buffer.split(b"\n", 1)[0]
            if line.startswith(b"x "):
                self.exited.set_result(os.waitstatus_to_exitcode(int(line[2:])))

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


async def run_tree(
    argv: list[str],
    *,
    cwd: str | Path,
    env: Mapping[str, str],
    stdout: Sink,
    stderr: Sink | None = None,
    stdin: bytes | None = None,
    time_limit: float | None = None,
    term_grace: float = 1.0,
    drain_grace: float = 0.3,
    on_start: Callable[[int], None] | None = None,
) -> Finished:
    """Run `argv` under a supervisor until it ends, `time_limit` seconds pass (wall clock from
    the spawn) or the caller is cancelled; in the last two cases the whole tree is killed
    (SIGTERM, `term_grace` s, SIGKILL) before this returns or re-raises. Output goes to the
    sinks as it arrives (stderr into `stdout` when no `stderr` sink is given); `stdin` is
    written to the command (closed after it) or /dev/null. When the command exits, children it
    left behind get `drain_grace` seconds before they are killed. `on_start` gets the process
    group id (the supervisor's pid) as soon as it exists."""
    if not sys.executable:
        raise OSError("no Python interpreter to run keel's process supervisor with")
    deadline = None if time_limit is None else time.monotonic() + time_limit
    pipes = _Pipes(stderr is not None, stdin is not None)
    supervisor = [sys.executable, "-I", "-S", _REAPER, str(pipes.ctl_r), str(pipes.status_w)]
    supervisor.append(str(os.getpid()))
    try:
        proc = await _spawn(
            [*supervisor, str(term_grace), str(drain_grace), "--", *argv],
            cwd=str(cwd),
            env=dict(env),
            stdin=pipes.in_r if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=pipes.out_w,
            stderr=pipes.err_w if stderr is not None else pipes.out_w,
            pass_fds=(pipes.ctl_r, pipes.status_w),
        )
    except BaseException:
        pipes.close()
        raise
    finally:
        pipes.spawned()
    timed_out = False
    try:  # from here on, every way out stops the whole tree
        if on_start is not None:
            on_start(proc.pid)
        await pipes.connect(stdout, stderr, stdin)
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            await asyncio.wait_for(asyncio.shield(proc.wait()), remaining)
        except TimeoutError:
            timed_out = not pipes.exited.done()
            await _stop(proc, pipes)
        # The tree is gone, so the pipes close at once, unless something escaped it.
        await asyncio.wait(pipes.closed, timeout=PIPE_GRACE)
    except BaseException:  # cancelled (or a sink failed): the tree goes first
        with contextlib.suppress(BaseException):
            await asyncio.shield(_stop(proc, pipes))
        raise
    finally:
        pipes.close()
    if pipes.exited.done():
        code: int | None = pipes.exited.result()
    else:  # the supervisor exits the way the command did
        code = None if timed_out else proc.returncode
    return Finished(code, timed_out, proc.pid)


class _Pipes:
    """The command's pipes and the supervisor's two (control: keel writes `k` to have the tree
    killed, and closes it when it dies; status: the supervisor reports the command's exit)."""

    def __init__(self, with_stderr: bool, with_stdin: bool) -> None:
        self.ctl_r, self.ctl_w = os.pipe()
        self.status_r, self.status_w = os.pipe()
        self.out_r, self.out_w = os.pipe()
        self.err_r, self.err_w = os.pipe() if with_stderr else (-1, -1)
        self.in_r, self.in_w = os.pipe() if with_stdin else (-1, -1)
        #: Our ends not yet handed to a transport.
        self.fds = {fd for fd in (self.status_r, self.out_r, self.err_r, self.in_w) if fd >= 0}
        self.transports: list[asyncio.BaseTransport] = []
        loop = asyncio.get_running_loop()
        self.exited: asyncio.Future[int] = loop.create_future()
        self.closed: list[asyncio.Future[None]] = [loop.create_future()]

    def spawned(self) -> None:
        """Close the child's ends (it has its copies, or it never started)."""
        for fd in (self.ctl_r, self.status_w, self.out_w, self.err_w, self.in_r):
            if fd >= 0:
                os.close(fd)

    async def connect(self, stdout: Sink, stderr: Sink | None, stdin: bytes | None) -> None:
        loop = asyncio.get_running_loop()
        self.fds.discard(self.status_r)
        status, _ = await loop.connect_read_pipe(
            functools.partial(_Control, self.exited, self.closed[0]),
            os.fdopen(self.status_r, "rb", buffering=0),
        )
        self.transports.append(status)
        for fd, sink in ((self.out_r, stdout), (self.err_r, stderr)):
            if fd < 0 or sink is None:
                continue
            done: asyncio.Future[None] = loop.create_future()
            self.closed.append(done)
            self.fds.discard(fd)
            reader, _ = await loop.connect_read_pipe(
                functools.partial(_Reader, sink, done), os.fdopen(fd, "rb", buffering=0)
            )
            self.transports.append(reader)
        if stdin is not None:
            self.fds.discard(self.in_w)
            writer, _ = await loop.connect_write_pipe(
                asyncio.Protocol, os.fdopen(self.in_w, "wb", buffering=0)
            )
            self.transports.append(writer)
            writer.write(stdin)
            writer.close()  # once the buffer is flushed; a command that never reads is fine

    def request_kill(self) -> bool:
        """Ask the supervisor to kill the tree; False if the control pipe is gone."""
        if self.ctl_w < 0:
            return False
        try:
            os.write(self.ctl_w, b"k")
        except OSError:  # the supervisor is gone (EPIPE)
            return False
        return True

    def close(self) -> None:
        for transport in self.transports:
            if isinstance(transport, asyncio.WriteTransport):
                if transport.get_write_buffer_size():  # (a finished one cannot be aborted)
                    transport.abort()  # what the command did not read is dropped
            else:
                transport.close()
        for fd in (*self.fds, self.ctl_w):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.fds.clear()
        self.ctl_w = -1


async def _spawn(argv: list[str], **kwargs: object) -> asyncio.subprocess.Process:
    """Start the supervisor in a new session. Cancelled while it is starting, this lets the start
    finish and kills it, so nothing is left running that nobody can stop."""
    spawn = asyncio.ensure_future(
        asyncio.create_subprocess_exec(*argv, start_new_session=True, **kwargs)  # type: ignore[arg-type]
    )
    try:
        return await asyncio.shield(spawn)
    except asyncio.CancelledError:
        with contextlib.suppress(BaseException):
            proc = await spawn
            _kill_group(proc.pid)
            await asyncio.wait_for(proc.wait(), SUPERVISOR_WAIT)
        raise


async def _stop(proc: asyncio.subprocess.Process, pipes: _Pipes) -> None:
    """Ask the supervisor to kill the tree; if it has not exited after `SUPERVISOR_WAIT` s,
    kill its whole process group (descendants that left the group may then survive)."""
    if proc.returncode is not None:
        return
    if not pipes.request_kill():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(proc.pid, signal.SIGTERM)
    try:
        await asyncio.wait_for(asyncio.shield(proc.wait()), SUPERVISOR_WAIT)
    except TimeoutError:
        _kill_group(proc.pid)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(proc.wait()), SUPERVISOR_WAIT)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


#: A call for a worker thread: it does the work and returns what delivers the outcome.
Job = Callable[[], Callable[[], None]]


class _DaemonThreads:
    """The daemon threads `in_worker` runs calls on, kept for the next call instead of one new
    thread per call (starting one costs a few hundred µs on a loaded machine, and `Thread.start`
    blocks the event loop until the thread runs). A call takes an idle thread or starts a new one,
    so a call that never returns only ever holds its own thread; a thread idle for `IDLE_EXIT`
    seconds ends. A job returns what delivers its outcome: the thread counts itself idle before
    that runs, so the caller's next call finds it."""

    IDLE_EXIT = 30.0

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Job, str]] = queue.SimpleQueue()
        self._idle = 0
        self._lock = threading.Lock()

    def submit(self, job: Job, name: str) -> None:
        with self._lock:
            if self._idle:
                self._idle -= 1
                self._jobs.put((job, name))
                return
        threading.Thread(target=self._work, args=(job,), name=name, daemon=True).start()

    def _work(self, job: Job) -> None:
        while True:
            deliver = job()
            with self._lock:
                self._idle += 1
            deliver()
            while True:
                try:
                    job, name = self._jobs.get(timeout=self.IDLE_EXIT)
                    break
                except queue.Empty:
                    with self._lock:
                        # A job put while this thread waited for the lock is this thread's.
                        if self._jobs.empty():
                            self._idle -= 1
                            return
            threading.current_thread().name = name


_THREADS = _DaemonThreads()


async def in_worker(func: Callable[[], T], *, name: str = "keel worker") -> T:
    """`func()` in a daemon thread. Cancelling the await abandons the thread (a blocked system
    call cannot be interrupted; a daemon thread neither holds the event loop nor keeps the
    process from exiting, unlike the default executor's threads, which exit waits for). Threads
    are reused from call to call (`_DaemonThreads`)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]

    def work() -> Callable[[], None]:
        try:
            outcome: tuple[T | None, BaseException | None] = (func(), None)
        except BaseException as exc:  # handed to the awaiting task, which re-raises it
            outcome = (None, exc)

        def deliver() -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(settle, *outcome)

        return deliver

    _THREADS.submit(work, name)
    return await future


__all__ = ["Finished", "Sink", "in_worker", "run_tree"]
