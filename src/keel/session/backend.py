"""Session stores: where a session's records live, behind one interface.

`AppendLog` is what the loop writes through (`SessionLog` wraps one): the file `Journal`, or the
fleet's `JetStreamJournal` (keel/fleet/journal.py). `SessionStore` creates, opens (exclusively),
reads and lists sessions: `FileStore` over the session directories, `JetStreamStore` over a
JetStream stream. `store_from_env` picks one: `KEEL_STORE=nats://…` (or `file`), default file.

The contract both keep (tests/test_store_contract.py runs the same suite on each):
- `create` makes a session whose first record (seq 1) is its meta; a second `create` of the same
  id is refused.
- `append(durable=True)` returns once the record survives a crash of this process (file: written
  and fsynced; JetStream: acknowledged by the stream and its replicas); `durable=False` records are
  made durable by the next `sync` or durable append, in order.
- seqs are 1, 2, 3, … with no gap; `read` returns them in order without locking.
- `open` gives one writer at a time: a second `open` of a session being written is refused
  (`SessionLocked`); on JetStream a second writer is fenced: its next append raises `Fenced`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from keel.errors import UserError

if TYPE_CHECKING:
    from keel.session.index import SessionSummary
    from keel.session.journal import Loaded
    from keel.session.records import Meta, Payload, Record


class AppendLog(Protocol):
    """One session's exclusive appender (see the module's contract)."""

    @property
    def path(self) -> Path:
        """A local path naming the session: the file itself, or (JetStream) a mirror of it in
        the worker's scratch directory; checkpoints, raw payloads and subagents' sessions sit
        beside it."""
        ...

    @property
    def last_seq(self) -> int: ...

    def append(self, payload: Payload, *, durable: bool = True) -> Record: ...

    def sync(self) -> None: ...

    def sync_in_background(self) -> None: ...

    def repair(self) -> Path | None: ...

    def close(self) -> None: ...


class SessionStore(Protocol):
    """Where sessions live (see the module's contract)."""

    #: What a user reads in messages: "file" or the NATS URL and stream.
    name: str

    def create(self, meta: Meta) -> AppendLog:
        """A new session holding `meta` as its first record."""
        ...

    def open(
        self, session_id: str, *, worker: str = "", attempt: int = 1
    ) -> tuple[AppendLog, Loaded]:
        """Take the session over for writing and return its records. JetStream first appends a
        claim record naming `worker` (so an earlier owner is fenced), then reads the tail."""
        ...

    def read(self, session_id: str) -> Loaded:
        """Every record, without taking the session over."""
        ...

    def exists(self, session_id: str) -> bool: ...

    def summaries(self, cwd: Path | None = None) -> list[SessionSummary]:
        """One summary per session (of the project at `cwd`, or all), newest first, without
        reading every record."""
        ...

    def close(self) -> None: ...


class FileStore:
    """Session files in one directory (`<id>.jsonl`), or found across projects by id."""

    name = "file"

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def path(self, session_id: str) -> Path:
        from keel.session.store import check_id

        return self.directory / f"{check_id(session_id)}.jsonl"

    def create(self, meta: Meta) -> AppendLog:
        from keel.session.journal import Journal

        return Journal.create(self.path(meta.id), meta)

    def open(
        self, session_id: str, *, worker: str = "", attempt: int = 1
    ) -> tuple[AppendLog, Loaded]:
        from keel.session.journal import Journal

        return Journal.open(self.path(session_id))

    def read(self, session_id: str) -> Loaded:
        from keel.session.journal import read_records

        path = self.path(session_id)
        if not path.exists():
            raise UserError(f"no session {session_id!r} in {self.directory}")
        return read_records(path)

    def exists(self, session_id: str) -> bool:
        return self.path(session_id).exists()

    def summaries(self, cwd: Path | None = None) -> list[SessionSummary]:
        from keel.session.index import summarize

        files = sorted(self.directory.glob("*.jsonl"), key=lambda p: p.stem, reverse=True)
        out = []
        for path in files:
            try:
                out.append(summarize(path))
            except (UserError, OSError):
                continue
        return out

    def close(self) -> None:
        pass


def store_url(env: Mapping[str, str] | None = None) -> str:
    """`KEEL_STORE`: "" or "file" for session files, `nats://…` (or `tls://…`) for JetStream."""
    env = os.environ if env is None else env
    return env.get("KEEL_STORE", "").strip()


def is_nats(url: str) -> bool:
    return url.startswith(("nats://", "tls://"))
