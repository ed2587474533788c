"""The `bash` tool: one command under a supervisor (`keel.proc`), bounded in time and output.

The command's whole tree (its process group and every descendant, detached ones included) is
killed on timeout or cancellation (SIGTERM, then SIGKILL after a grace), so a command that
ignores SIGTERM, forks, or detaches (`&`, `disown`, `setsid`, `nohup`) cannot outlive its call.
Output is held as 64 kB of its head and of its tail (the middle is only counted), so a flood
costs no memory. Provider credentials are removed from the environment the command sees.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from keel.proc import Sink, run_tree
from keel.tools.base import ToolContext, ToolError, ToolOutput, tool
from keel.tools.effects import command_repeat_risk

if TYPE_CHECKING:
    from keel.permissions.sandbox import Sandbox
    from keel.tools.background import BackgroundTask, Status

DEFAULT_TIMEOUT = 120
MAX_TIMEOUT = 600
#: Bytes of each end of the output held in memory; the middle of a flood is only counted.
KEEP_BYTES = 64 * 1024
KILL_GRACE = 1.0
#: After the command exits, how long children it left running get; past that, they are killed.
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


async def run_command(
    command: str,
    *,
    cwd: str,
    env: Mapping[str, str],
    time_limit: float | None,
    sandbox: Sandbox | None = None,
    sink: Sink | None = None,
    on_start: Callable[[int], None] | None = None,
) -> tuple[str, int | None, bool]:
    """Run `command` with bash (inside `sandbox` when given). Returns (cleaned output, exit code
    or None, timed out). With `sink`, the output goes there as it arrives (and the returned
    output is empty); `time_limit` None means no limit. `on_start` gets the process group id.

    The command runs under `keel.proc`'s supervisor: at the deadline or on cancellation its
    whole tree is killed, children that detached included, and the output pipe is let go even
    if something still holds it open; children left running when the command exits get
    `DRAIN_GRACE` seconds."""
    argv = ["bash", "-c", command]
    run_env = command_env(env)
    if sandbox is not None:
        from keel.permissions.sandbox import SandboxError

        try:  # placeholders for missing protected paths are made now, released below
            argv = sandbox.argv(argv, Path(cwd))
        except SandboxError as exc:
            raise ToolError(str(exc)) from exc
        run_env = sandbox.env(run_env)
    capture = _Capture()
    try:
        finished = await run_tree(
            argv,
            cwd=cwd,
            env=run_env,
            stdout=sink or capture,
            time_limit=time_limit,
            term_grace=KILL_GRACE,
            drain_grace=DRAIN_GRACE,
            on_start=on_start,
        )
    finally:
        if sandbox is not None:
            sandbox.release()
    # At most 64 kB of each end is held; the one truncation function cuts it for the model and
    # keeps what was held beside the session.
    text = clean_output(capture.text(2 * KEEP_BYTES))
    code = None if finished.timed_out else finished.returncode
    return text, code, finished.timed_out


# Whether a command destroys anything is not known before it runs: not marked destructive (the
# gate asks outside the sandbox), not idempotent; `git push *` and the like are not run twice blindly.
@tool(repeat_risk=command_repeat_risk, idempotent=False, kind="builtin")
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
            on_start=ctx.on_process,  # journaled: a resume stops what a killed run left
        )
    text = text.rstrip("\n")
    sep = "\n" if text else ""
    notice = _configuration_changed(ctx)
    if timed_out:
        return ToolOutput(
            f"{text}{sep}[timed out after {timeout} s; process group killed]",
            is_error=True,
            notice=notice,
        )
    # A command that exits non-zero failed, as Claude Code reports it (is_error): the model
    # still reads its output and the exit code.
    return ToolOutput(f"{text}{sep}[exit code {code}]", is_error=code != 0, notice=notice)


def _configuration_changed(ctx: ToolContext) -> str:
    """A notice naming the project configuration the command just created or changed (settings,
    hooks, MCP servers, instructions… at any depth), so the user sees it: it applies only once
    approved (`keel.config.intake`). Seen through the checkpoint's comparison (git status in a
    repository, so not for ignored paths there; a scan of the tree elsewhere)."""
    if ctx.checkpoints is None or not ctx.checkpoints.last_changed:
        return ""
    from keel.config.intake import is_configuration

    changed = [_relative(p, ctx.root) for p in ctx.checkpoints.last_changed]
    found = [p for p in changed if is_configuration(Path(p))]
    if not found:
        return ""
    names = ", ".join(found[:5])
    more = f" and {len(found) - 5} more" if len(found) > 5 else ""
    return (
        f"a command created or changed project configuration: {names}{more}; nothing in it "
        "applies until you approve it (`keel trust list` shows it)"
    )


def _relative(path: str, root: Path) -> str:
    try:
        return Path(path).relative_to(root).as_posix()
    except ValueError:
        return path


def _checkpointed(ctx: ToolContext, command: str) -> contextlib.AbstractAsyncContextManager[None]:
    """Around a command: keep for `/undo` what it changes in the project (git status in a
    repository, a scan of the tree elsewhere; `ctx.checkpoint_limits` bounds the scan)."""
    if ctx.checkpoints is None:
        return contextlib.nullcontext()
    return ctx.checkpoints.bash(ctx.cwd, command, root=ctx.root, limits=ctx.checkpoint_limits)


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
            on_start=ctx.on_process,
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
