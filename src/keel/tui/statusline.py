"""Claude Code's `statusLine`: a command whose first line of output is shown above the status
bar, fed the session as JSON on stdin, in Claude Code's shape (`payload`).

How it runs, as in Claude Code: after new messages (and whatever else refreshes the status),
at most once per `INTERVAL` seconds (a request meanwhile runs once when the interval is over),
with `bash -c` in the working directory. A run that takes longer than `TIME_LIMIT` is killed
with everything it started (`keel.proc.run_tree`) and the line shown before stays. A command
that fails (non-zero exit) blanks the line. ANSI colours are kept.

The command comes from `Settings.status_line`: the user's files, or a project's once its
entry is approved (`keel trust approve`: it runs code). This module never decides that.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from keel import __version__
from keel.hooks.claude import hook_session_id

if TYPE_CHECKING:
    from keel.agent.loop import Agent
    from keel.config.settings import StatusLineConfig

#: The shortest time between two runs (Claude Code: "at most every 300 ms").
INTERVAL = 0.3
#: A run taking longer is killed; the line shown before stays.
TIME_LIMIT = 2.0
#: Output kept from one run (only the first line is shown).
MAX_OUTPUT = 64_000


def payload(agent: Agent, *, context: int, started: float) -> dict[str, Any]:
    """What Claude Code sends a status line command (`context`: the tokens the last request
    held). Fields keel has no count of (lines added and removed, time spent in API calls) are
    0; `session_id` is the session's UUID and `transcript_path` its Claude Code–format
    transcript, as hooks see them ("" before the first prompt)."""

    usage = agent.spend.usage
    window = agent.info.window
    used = round(100 * context / window, 1) if window else 0.0
    return {
        "hook_event_name": "Status",
        "session_id": hook_session_id(agent.session_id),
        "transcript_path": agent.hook_transcript_path(),
        "cwd": str(agent.cwd),
        "model": {"id": agent.model, "display_name": agent.model},
        "workspace": {"current_dir": str(agent.cwd), "project_dir": str(agent.ctx.root)},
        "version": __version__,
        "output_style": {"name": agent.output_style.name if agent.output_style else "default"},
        "cost": {
            "total_cost_usd": agent.spend.cost,
            "total_duration_ms": int((time.monotonic() - started) * 1000),
            "total_api_duration_ms": 0,
            "total_lines_added": 0,
            "total_lines_removed": 0,
        },
        "context_window": {
            "total_input_tokens": usage.input + usage.cache_read + usage.cache_write,
            "total_output_tokens": usage.output,
            "context_window_size": window,
            "used_percentage": used,
            "remaining_percentage": round(100 - used, 1),
            "current_usage": None,
        },
    }


async def run_once(
    config: StatusLineConfig, data: dict[str, Any], *, cwd: str, env: dict[str, str]
) -> str | None:
    """The line to show for one run: the first line of stdout ("" when the command failed or
    printed nothing), or None when it ran out of time or could not start (keep the old one)."""
    import json

    from keel.proc import Head, run_tree

    out = Head(MAX_OUTPUT)
    try:
        finished = await run_tree(
            ["bash", "-c", config.command],
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=Head(MAX_OUTPUT),
            stdin=json.dumps(data).encode(),
            time_limit=TIME_LIMIT,
            term_grace=0.2,
            drain_grace=0.1,
        )
    except OSError:
        return None
    if finished.timed_out:
        return None
    if finished.returncode != 0:
        return ""
    text = out.data.decode("utf-8", "replace")
    return text.splitlines()[0].rstrip() if text.strip() else ""


class StatusLine:
    """Runs the command when asked, throttled, and hands each new line to `show`."""

    def __init__(
        self,
        config: StatusLineConfig,
        data: Callable[[], dict[str, Any]],
        show: Callable[[str], None],
        *,
        cwd: str,
        env: dict[str, str],
        interval: float = INTERVAL,
    ) -> None:
        self.config = config
        self.data = data
        self.show = show
        self.cwd = cwd
        self.env = env
        self.interval = interval
        #: How many times the command ran (for tests and `/doctor`-like reports).
        self.runs = 0
        self._wanted = False
        self._last = float("-inf")
        self._task: asyncio.Task[None] | None = None

    def request(self) -> None:
        """Ask for a run (after a new message, a mode change…): now, or when the interval ends;
        requests in between are one run."""
        self._wanted = True
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def _loop(self) -> None:
        while self._wanted:
            wait = self._last + self.interval - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            self._wanted = False
            self._last = time.monotonic()
            self.runs += 1
            line = await run_once(self.config, self.data(), cwd=self.cwd, env=self.env)
            if line is not None:
                self.show(line)

    async def aclose(self) -> None:
        self._wanted = False
        if self._task is not None and not self._task.done():
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass


__all__ = ["INTERVAL", "TIME_LIMIT", "StatusLine", "payload", "run_once"]
