"""The `bash` tool: one command in its own process group, bounded in time and output.

The whole group is killed on timeout or cancellation (SIGTERM, then SIGKILL after a grace), so a
command that ignores SIGTERM or forks children cannot outlive its call. Provider credentials are
removed from the environment the command sees.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from keel.tools.base import ToolContext, ToolError, ToolOutput, tool

if TYPE_CHECKING:
    from keel.permissions.sandbox import Sandbox
    from keel.tools.background import BackgroundTask, Status

DEFAULT_TIMEOUT = 120
MAX_TIMEOUT = 600
#: Bytes of each end of the output held in memory; the middle of a flood is only counted.
KEEP_BYTES = 64 * 1024
KILL_GRACE = 1.0
#: After the command exits, how long to wait for children still holding its output open;
#: past that, the command's process group is stopped.
DRAIN_GRACE = 0.3
#: Characters of a background command's last output carried in its notification.
RESULT_TAIL = 4000

#: Credentials of the providers keel talks to; anything matching `_SECRET_SUFFIXES` goes too.
PROVIDER_ENV = frozenset(
    {
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_AUTH_TOKEN",
        "OPENAI_API_KEY",
        "OPENAI_ORG_ID",
        "GEMINI_API_KEY",
        "GOOGLE_API_KEY",
        "OPENROUTER_API_KEY",
        "GROQ_API_KEY",
        "DEEPSEEK_API_KEY",
        "XAI_API_KEY",
        "MISTRAL_API_KEY",
        "TOGETHER_API_KEY",
        "OPENAI_COMPATIBLE_API_KEY",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AZURE_OPENAI_API_KEY",
    }
)
_SECRET_SUFFIXES = ("_API_KEY", "_AUTH_TOKEN", "_ACCESS_TOKEN")
_FIXED_ENV = {"NO_COLOR": "1", "PAGER": "cat", "GIT_PAGER": "cat", "TERM": "dumb"}

_ANSI = re.compile(r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)|[@-Z\\-_])")


def command_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment a command runs with: credentials removed, pagers and colour off."""
    out = {
        k: v for k, v in env.items() if k not in PROVIDER_ENV and not k.endswith(_SECRET_SUFFIXES)
    }
    out.update(_FIXED_ENV)
    return out


def clean_output(text: str) -> str:
    """Strip ANSI escapes and keep only the final state of `\\r`-redrawn lines."""
    text = _ANSI.sub("", text)
    if "\r" not in text:
        return text
    lines = []
    for line in text.split("\n"):
        if "\r" in line:
            parts = [p for p in line.split("\r") if p]
            line = parts[-1] if parts else ""
        lines.append(line)
    return "\n".join(lines)


class _Capture:
    """Keeps the head and tail of a stream and counts what falls between."""

    def __init__(self, keep: int = KEEP_BYTES) -> None:
        self.keep = keep
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self.keep - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > self.keep:
                del self.tail[: len(self.tail) - self.keep]

    def text(self, limit: int) -> str:
        head, tail = bytes(self.head), bytes(self.tail)
        if self.total <= limit:
            return (head + tail).decode("utf-8", "replace")
        head_len = limit * 2 // 3
        tail_len = limit - head_len
        # With nothing dropped the tail may be short; the end of head + tail is the true end.
        end = (head + tail if self.total == len(head) + len(tail) else tail)[-tail_len:]
        start = head[:head_len]
        cut = self.total - len(start) - len(end)
        return (
            start.decode("utf-8", "ignore")
            + f"\n... [{cut} bytes truncated] ...\n"
            + end.decode("utf-8", "ignore")
        )


async def _kill_group(proc: asyncio.subprocess.Process) -> None:
    for sig, wait in ((signal.SIGTERM, KILL_GRACE), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        try:
            await asyncio.wait_for(proc.wait(), wait)
            # The leader is gone; make sure no member of its group survives it.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            return
        except TimeoutError:
            continue


async def _spawn(
    argv: list[str], cwd: str, env: Mapping[str, str], out_fd: int
) -> asyncio.subprocess.Process:
    """Start `argv` in its own process group, output to `out_fd`. Cancelled while the process
    is starting, it lets the start finish and stops the group, so nothing is left running that
    nobody can stop."""
    spawn = asyncio.ensure_future(
        asyncio.create_subprocess_exec(
            *argv,
            cwd=cwd,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=out_fd,
            stderr=out_fd,
            start_new_session=True,
        )
    )
    try:
        return await asyncio.shield(spawn)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await _kill_group(await spawn)
        raise


class Sink(Protocol):
    def feed(self, data: bytes) -> None: ...


class _PipeReader(asyncio.Protocol):
    """Feeds the command's output pipe into a sink; `closed` resolves at end of stream."""

    def __init__(self, capture: Sink, closed: asyncio.Future[None]) -> None:
        self.capture = capture
        self.closed = closed

    def data_received(self, data: bytes) -> None:
        self.capture.feed(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


async def run_command(
    command: str,
    *,
    cwd: str,
    env: Mapping[str, str],
    time_limit: float | None,
    sandbox: Sandbox | None = None,
    sink: Sink | None = None,
) -> tuple[str, int | None, bool]:
    """Run `command` with bash (inside `sandbox` when given). Returns (cleaned output, exit code
    or None, timed out). With `sink`, the output goes there as it arrives (and the returned
    output is empty); `time_limit` None means no limit.

    The output pipe is ours (not asyncio's), so when children that outlive the command keep it
    open we can stop them and close it rather than wait for them."""
    loop = asyncio.get_running_loop()
    argv = ["bash", "-c", command]
    run_env = command_env(env)
    if sandbox is not None:
        argv = sandbox.argv(argv, Path(cwd))
        run_env = sandbox.env(run_env)
    read_fd, write_fd = os.pipe()
    try:
        proc = await _spawn(argv, cwd, run_env, write_fd)
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)
    capture = _Capture()
    closed: asyncio.Future[None] = loop.create_future()
    transport: asyncio.BaseTransport | None = None
    timed_out = False
    try:  # from here on, a cancellation stops the whole group
        transport, _ = await loop.connect_read_pipe(
            lambda: _PipeReader(sink or capture, closed), os.fdopen(read_fd, "rb", buffering=0)
        )
        try:
            await asyncio.wait_for(proc.wait(), time_limit)
        except TimeoutError:
            timed_out = True
            await _kill_group(proc)
        # Background children may still hold the pipe: give them a moment, then stop them.
        try:
            await asyncio.wait_for(asyncio.shield(closed), DRAIN_GRACE)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(closed), DRAIN_GRACE)
    except asyncio.CancelledError:
        await _kill_group(proc)
        raise
    finally:
        if transport is not None:
            transport.close()
    # Everything captured (up to 64 kB of each end); the one truncation function cuts it for the
    # model and keeps it whole beside the session.
    text = clean_output(capture.text(2 * KEEP_BYTES))
    return text, proc.returncode, timed_out


@tool
async def bash(
    ctx: ToolContext,
    command: str,
    timeout: int = DEFAULT_TIMEOUT,  # noqa: ASYNC109 - the argument name the model sees
    description: str = "",
    sandbox: bool = True,
    run_in_background: bool = False,
) -> ToolOutput:
    """Run a shell command with bash in the working directory and return its combined stdout
    and stderr, ending with the exit code. Output over about 30 kB keeps its head and tail.
    Use for builds, tests, git and other programs; prefer read, grep and glob for looking at files.
    Processes still running in the background when the command ends are stopped.

    Args:
        command: The command line to run.
        timeout: Seconds before the command is killed (default 120, at most 600). Not applied
            to background commands.
        description: A few words on what the command does, shown to the user.
        sandbox: Run inside the sandbox (the default, when one is available): the project and a
            temp dir are writable, there is no network. Set false only for a command that
            needs more; that asks the user.
        run_in_background: Start the command and return its id at once, for long builds,
            test runs or servers; keep working meanwhile. Read its output with bash_output,
            stop it with bash_kill; you are told when it ends.
    """
    if not command.strip():
        raise ToolError("command is empty")
    if timeout < 1 or timeout > MAX_TIMEOUT:
        raise ToolError(f"timeout must be between 1 and {MAX_TIMEOUT} seconds")
    if run_in_background:
        return start_background(ctx, command, description, sandbox)
    async with _checkpointed(ctx, command):
        text, code, timed_out = await run_command(
            command,
            cwd=str(ctx.cwd),
            env=ctx.env or os.environ,
            time_limit=timeout,
            sandbox=ctx.sandbox if sandbox else None,
        )
    text = text.rstrip("\n")
    sep = "\n" if text else ""
    if timed_out:
        return ToolOutput(
            f"{text}{sep}[timed out after {timeout} s; process group killed]", is_error=True
        )
    # A failing command is a result the model should read, not a failed tool call.
    return ToolOutput(f"{text}{sep}[exit code {code}]")


def _checkpointed(ctx: ToolContext, command: str) -> contextlib.AbstractAsyncContextManager[None]:
    """Around a command: in a git repository, keep for `/undo` what it changes."""
    if ctx.checkpoints is None:
        return contextlib.nullcontext()
    return ctx.checkpoints.bash(ctx.cwd, command)


def start_background(ctx: ToolContext, command: str, description: str, sandbox: bool) -> ToolOutput:
    """Start `command` as a background task whose output collects for `bash_output`."""
    if ctx.background is None:
        raise ToolError("background commands are not available here; run it without it")

    async def work(task: BackgroundTask) -> tuple[Status, str]:
        assert task.output is not None
        _, code, _ = await run_command(
            command,
            cwd=str(ctx.cwd),
            env=ctx.env or os.environ,
            time_limit=None,
            sandbox=ctx.sandbox if sandbox else None,
            sink=task.output,
        )
        tail = clean_output(task.output.tail(RESULT_TAIL)).rstrip("\n")
        status: Status = "completed" if code == 0 else "failed"
        return status, f"{tail}\n[exit code {code}]" if tail else f"[exit code {code}]"

    task = ctx.background.start("shell", description or command, work)
    return ToolOutput(
        f"started {task.id} in the background: {command}\nRead its output with "
        f'bash_output(id="{task.id}"); stop it with bash_kill(id="{task.id}"). You will be '
        "told when it ends."
    )
