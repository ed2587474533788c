"""Which session store a front end writes to and reads from: session files (the default), or a
JetStream stream when `KEEL_STORE=nats://…` (docs/fleet.md "Sessions in JetStream").

`keel -p`, `keel -p --resume`, `keel resume` and `keel sessions list|show` go through here. A
JetStream session keeps a local mirror of its records (hooks and transcripts read a file) under
`<keel home>/fleet/mirror/`. nats-py is imported only when the store is JetStream.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from keel.session.backend import is_nats, store_url

if TYPE_CHECKING:
    from keel.fleet.journal import JetStreamStore
    from keel.session.backend import AppendLog
    from keel.session.records import Payload, Record


def jetstream_url(env: Mapping[str, str] | None = None) -> str:
    """The JetStream store's URL when `KEEL_STORE` names one, else ""."""
    url = store_url(env)
    if url and url != "file" and not is_nats(url):
        from keel.errors import UserError

        raise UserError(
            f"KEEL_STORE={url!r} is not a store keel knows",
            hint="leave it unset (or `file`) for session files, or nats://HOST:PORT for JetStream",
        )
    return url if is_nats(url) else ""


def open_jetstream(url: str) -> JetStreamStore:
    from keel.fleet.journal import JetStreamStore
    from keel.session.store import keel_home

    return JetStreamStore.connect(
        url, scratch=keel_home() / "fleet" / "mirror", worker=f"keel pid {os.getpid()}"
    )


class StoreJournal:
    """A store's journal that also closes the store (its connection) when it closes."""

    def __init__(self, journal: AppendLog, store: JetStreamStore) -> None:
        self.journal = journal
        self.store = store

    @property
    def path(self) -> Path:
        return self.journal.path

    @property
    def last_seq(self) -> int:
        return self.journal.last_seq

    def append(self, payload: Payload, *, durable: bool = True) -> Record:
        return self.journal.append(payload, durable=durable)

    def sync(self) -> None:
        self.journal.sync()

    def sync_in_background(self) -> None:
        self.journal.sync_in_background()

    def repair(self) -> Path | None:
        return self.journal.repair()

    def close(self) -> None:
        try:
            self.journal.close()
        finally:
            self.store.close()
