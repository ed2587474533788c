"""Where session files live, how sessions are named, and `SessionLog`: the typed writer the loop
records through.

Layout: `<KEEL_HOME or the user data dir>/sessions/<project>-<hash8>/<id>.jsonl`, directories
0700 and files 0600. Ids sort by creation time: `YYYYMMDD-HHMMSS-xxxxxx`.
"""

from __future__ import annotations

import os
import re
import secrets
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

# project_key is re-exported: sessions are kept by project.
from keel.config.trust import project_key as project_key
from keel.errors import UserError
from keel.llm.messages import Message, ToolResult, Usage
from keel.session.journal import Journal
from keel.session.records import (
    AssistantRecord,
    CompactionRecord,
    DecisionRecord,
    Fingerprint,
    Meta,
    NoteRecord,
    Payload,
    PinRecord,
    ProcessRecord,
    ReplyTiming,
    TerminalReason,
    TerminalRecord,
    ToolResultRecord,
    ToolStartedRecord,
    UndoRecord,
    UserRecord,
    UserSource,
)

if TYPE_CHECKING:
    from keel.checkpoints import UndoSummary
    from keel.session.backend import AppendLog

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")


def keel_home(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    if env.get("KEEL_HOME"):
        return Path(env["KEEL_HOME"]).expanduser()
    import platformdirs

    return Path(platformdirs.user_data_dir("keel", appauthor=False))


def sessions_dir(cwd: Path, env: Mapping[str, str] | None = None) -> Path:
    return keel_home(env) / "sessions" / project_key(cwd)


def new_session_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)


def check_id(session_id: str) -> str:
    if not _ID.match(session_id):
        raise UserError(
            f"{session_id!r} is not a session id",
            hint="ids look like 20261130-041918-a1b2c3; `keel sessions list` shows them",
        )
    return session_id


class SessionLog:
    """The loop's journal: one method per durable event, in the order the contract needs."""

    def __init__(self, journal: AppendLog, session_id: str) -> None:
        self.journal = journal
        self.id = session_id
        #: Told each prompt, assistant message and tool result as it is journaled (a derived
        #: view: keel.hooks.transcript); None costs nothing.
        self.on_record: Callable[[Payload], None] | None = None

    @property
    def path(self) -> Path:
        return self.journal.path

    @classmethod
    def create(
        cls,
        *,
        cwd: Path,
        model: str,
        fingerprint: Fingerprint | None = None,
        directory: Path | None = None,
        session_id: str | None = None,
        parent: str | None = None,
        parent_seq: int | None = None,
        env: Mapping[str, str] | None = None,
        agent: str = "",
    ) -> SessionLog:
        from keel import __version__

        sid = check_id(session_id) if session_id else new_session_id()
        directory = directory or sessions_dir(cwd, env)
        meta = Meta(sid, str(cwd), model, fingerprint, parent, parent_seq, __version__, agent)
        return cls(Journal.create(directory / f"{sid}.jsonl", meta), sid)

    def user(
        self, message: Message, source: UserSource = "prompt", *, durable: bool = True
    ) -> None:
        """With `durable` False the caller makes it durable (`make_durable`) before going on."""
        record = UserRecord(message, source)
        self.journal.append(record, durable=durable)
        if self.on_record is not None:
            self.on_record(record)

    def assistant(
        self,
        message: Message,
        usage: Usage,
        cost: float,
        stop_reason: str,
        turn: int,
        timing: ReplyTiming | None = None,
        *,
        durable: bool = True,
    ) -> None:
        # Durable before any of its tools runs (invariant 4): here, or, with `durable=False`, by
        # the caller's `make_durable` before anything else happens.
        record = AssistantRecord(message, usage, cost, stop_reason, turn, timing)
        self.journal.append(record, durable=durable)
        if self.on_record is not None:
            self.on_record(record)

    async def make_durable(self) -> None:
        """Everything recorded so far is durable when this returns, as after `barrier`, but the
        fsync runs on a worker thread: the event loop goes on serving other runs meanwhile (many
        agents in one process). Cancelled, it still waits for that one sync to finish, so the
        journal is never synced from two threads at once."""
        import asyncio  # here: `keel sessions list` imports this module and needs no event loop

        sync = asyncio.get_running_loop().run_in_executor(None, self.journal.sync)
        try:
            await asyncio.shield(sync)
        except asyncio.CancelledError:
            await asyncio.wait([sync])
            raise

    def tool_result(
        self, result: ToolResult, seconds: float, started_at: float = 0.0, kind: str = ""
    ) -> None:
        # Written now (a killed process cannot lose it); the fsync runs on a worker thread so it
        # overlaps what comes next. `barrier` makes it durable before any other tool runs.
        record = ToolResultRecord(result, seconds, started_at, kind)
        self.journal.append(record, durable=False)
        self.journal.sync_in_background()
        if self.on_record is not None:
            self.on_record(record)

    def tool_started(
        self, tool_use_id: str, tool: str, reason: str, summary: str, kind: str = ""
    ) -> None:
        """A call that is not safe to repeat is about to run: durable (fsync) before it starts,
        so a resume knows its outcome is unknown rather than running it again blindly."""
        self.journal.append(ToolStartedRecord(tool_use_id, tool, reason, summary, kind))

    def process(self, tool_use_id: str, pgid: int, start_time: int, boot_id: str) -> None:
        """A tool call started a process group. Written at once, not fsynced: a killed keel
        cannot lose a written line, and a machine that went down took the process with it."""
        self.journal.append(ProcessRecord(tool_use_id, pgid, start_time, boot_id), durable=False)

    def barrier(self) -> None:
        """Everything recorded so far is durable when this returns (called before a tool runs)."""
        self.journal.sync()

    def compaction(self, record: CompactionRecord) -> None:
        self.journal.append(record)

    def pin(self, text: str, *, pinned: bool = True) -> None:
        """A `/pin` or `/unpin` (durable: a resume must keep what the user pinned)."""
        self.journal.append(PinRecord(text, pinned))

    def note(self, text: str) -> None:
        self.journal.append(NoteRecord(text), durable=False)

    def decision(
        self,
        tool_use_id: str,
        tool: str,
        outcome: str,
        source: str,
        reason: str = "",
        waited_ms: float = 0.0,
    ) -> None:
        self.journal.append(
            DecisionRecord(tool_use_id, tool, outcome, source, reason, waited_ms), durable=False
        )

    def undo(self, summary: UndoSummary, note: str = "") -> None:
        """Record an `/undo` (after it happened: only then is it known what it put back) and the
        `note` queued for the model, which a resume queues again until a prompt carries it."""
        self.journal.append(
            UndoRecord(
                summary.unit,
                summary.label,
                tuple(str(p) for p in summary.restored),
                tuple(str(p) for p in summary.removed),
                tuple(f"{p.path}: {p.why}" for p in summary.failed),
                note,
            )
        )

    def terminal(
        self,
        reason: TerminalReason,
        message: str = "",
        *,
        turns: int = 0,
        cost: float = 0.0,
        prompt: str = "",
    ) -> None:
        self.journal.append(TerminalRecord(reason, message, turns, round(cost, 8), prompt[:200]))

    def close(self) -> None:
        self.journal.close()
