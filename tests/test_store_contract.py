"""The session store contract (keel/session/backend.py), one suite run on both stores: the file
store over a temp directory, and the JetStream store over a real nats-server on loopback."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from keel.errors import UserError
from keel.fleet.journal import Fenced, JetStreamStore
from keel.fleet.setup import ensure_streams_sync
from keel.fleet.streams import RUNS_STREAM, run_subject
from keel.llm.messages import ToolUse, Usage, assistant, tool_result, user
from keel.session.backend import FileStore, SessionStore
from keel.session.fold import fold
from keel.session.index import SessionSummary
from keel.session.journal import CorruptSession, SessionLocked
from keel.session.records import (
    ClaimRecord,
    Meta,
    NoteRecord,
    Payload,
    Record,
    TerminalRecord,
    UserRecord,
    encode,
)
from keel.session.store import SessionLog
from tests.nats_fixture import NatsServer, nats_server  # noqa: F401

CWD = "/work/project"


class Backend:
    """A store under test plus what the suite cannot do through the interface."""

    kind: str
    store: Any

    def new_store(self) -> SessionStore:
        """A second, independent handle on the same sessions (another process's view)."""
        raise NotImplementedError

    def damage(self, run_id: str, seq: int) -> None:
        """Make record `seq` unreadable (the file: garbage; the stream: the message purged)."""
        raise NotImplementedError

    def mirror(self, run_id: str) -> Path:
        raise NotImplementedError


class FileBackend(Backend):
    kind = "file"

    def __init__(self, tmp: Path) -> None:
        self.directory = tmp / "sessions"
        self.store = FileStore(self.directory)

    def new_store(self) -> SessionStore:
        return FileStore(self.directory)

    def damage(self, run_id: str, seq: int) -> None:
        path = self.store.path(run_id)
        lines = path.read_bytes().split(b"\n")
        lines[seq - 1] = b'{"not": "a record"}'
        path.write_bytes(b"\n".join(lines))

    def mirror(self, run_id: str) -> Path:
        return Path(self.store.path(run_id))


class JetStreamBackend(Backend):
    kind = "jetstream"

    def __init__(self, tmp: Path, server: NatsServer) -> None:
        self.tmp = tmp
        self.url = server.url
        self.store = JetStreamStore.connect(server.url, scratch=tmp / "scratch", worker="w1")
        ensure_streams_sync(self.store.bridge)
        self.others: list[JetStreamStore] = []

    def new_store(self) -> SessionStore:
        other = JetStreamStore.connect(self.url, scratch=self.tmp / "scratch2", worker="w2")
        self.others.append(other)
        return other

    def damage(self, run_id: str, seq: int) -> None:
        js = self.store.bridge.js
        self.store.bridge.call(js.purge_stream(RUNS_STREAM, subject=run_subject(run_id, seq)))

    def mirror(self, run_id: str) -> Path:
        return Path(self.store.mirror_path(run_id))

    def close(self) -> None:
        for other in self.others:
            other.close()
        self.store.close()


@pytest.fixture(params=["file", pytest.param("jetstream", marks=pytest.mark.needs("nats-server"))])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "file":
        yield FileBackend(tmp_path)
        return
    server = NatsServer(tmp_path / "nats-store")
    js = JetStreamBackend(tmp_path, server)
    try:
        yield js
    finally:
        js.close()
        server.stop()


def meta(run_id: str, model: str = "scripted:demo", parent: str | None = None) -> Meta:
    return Meta(run_id, CWD, model, None, parent, None, "test")


def payloads(records: list[Record]) -> list[Payload]:
    return [r.payload for r in records]


def without_ts(records: list[Record]) -> list[bytes]:
    return [encode(dataclasses.replace(r, ts="")) for r in records]


def test_create_append_read_order_and_seqs(backend: Backend) -> None:
    journal = backend.store.create(meta("20261201-000000-aaaaaa"))
    appended = [
        UserRecord(user("list the files")),
        NoteRecord("a note"),
        TerminalRecord("completed", "", 1, 0.25, "list the files"),
    ]
    returned = [journal.append(p) for p in appended]
    assert [r.seq for r in returned] == [2, 3, 4]
    assert journal.last_seq == 4
    journal.close()
    loaded = backend.new_store().read("20261201-000000-aaaaaa")
    assert [r.seq for r in loaded.records] == [1, 2, 3, 4]
    assert payloads(loaded.records) == [meta("20261201-000000-aaaaaa"), *appended]
    assert [r.ts for r in loaded.records[1:]] == [r.ts for r in returned]
    assert loaded.repaired_bytes == 0


def test_non_durable_appends_then_sync(backend: Backend) -> None:
    journal = backend.store.create(meta("20261201-000000-bbbbbb"))
    notes = [NoteRecord(f"n{i}") for i in range(5)]
    for note in notes:
        journal.append(note, durable=False)
    journal.sync_in_background()
    journal.sync()
    # Another process (a fresh store) sees every record, in order, once synced.
    loaded = backend.new_store().read("20261201-000000-bbbbbb")
    assert payloads(loaded.records) == [meta("20261201-000000-bbbbbb"), *notes]
    journal.close()


def test_second_create_of_an_id_is_refused(backend: Backend) -> None:
    first = backend.store.create(meta("20261201-000000-cccccc"))
    first.append(NoteRecord("first"))
    with pytest.raises(UserError, match="already exists"):
        backend.new_store().create(meta("20261201-000000-cccccc", model="other/model"))
    # The refused create wrote nothing, and the first writer carries on.
    first.append(NoteRecord("second"))
    loaded = backend.store.read("20261201-000000-cccccc")
    assert payloads(loaded.records) == [
        meta("20261201-000000-cccccc"),
        NoteRecord("first"),
        NoteRecord("second"),
    ]
    first.close()


def test_read_without_lock_while_a_writer_holds_it(backend: Backend) -> None:
    journal = backend.store.create(meta("20261201-000000-dddddd"))
    journal.append(NoteRecord("one"))
    loaded = backend.new_store().read("20261201-000000-dddddd")
    assert payloads(loaded.records) == [meta("20261201-000000-dddddd"), NoteRecord("one")]
    # Reading took nothing over: the writer's next append lands right after.
    assert journal.append(NoteRecord("two")).seq == 3
    loaded = backend.store.read("20261201-000000-dddddd")
    assert payloads(loaded.records)[1:] == [NoteRecord("one"), NoteRecord("two")]
    journal.close()


def test_exists(backend: Backend) -> None:
    assert not backend.store.exists("20261201-000000-eeeeee")
    backend.store.create(meta("20261201-000000-eeeeee")).close()
    assert backend.store.exists("20261201-000000-eeeeee")
    assert backend.new_store().exists("20261201-000000-eeeeee")
    with pytest.raises(UserError, match=r"no (session|run)"):
        backend.store.read("20261201-000000-ffffff")


def test_a_second_writer_never_interleaves(backend: Backend) -> None:
    run = "20261201-000000-abcdef"
    first = backend.store.create(meta(run))
    first.append(NoteRecord("first's"))
    other = backend.new_store()
    if backend.kind == "file":
        with pytest.raises(SessionLocked):
            other.open(run)
        first.append(NoteRecord("first's again"))
        expected = [meta(run), NoteRecord("first's"), NoteRecord("first's again")]
    else:
        second, loaded = other.open(run, worker="w2")
        assert payloads(loaded.records) == [meta(run), NoteRecord("first's"), ClaimRecord("w2")]
        with pytest.raises(Fenced):
            first.append(NoteRecord("first's again"))
        second.append(NoteRecord("second's"))
        second.close()
        expected = [meta(run), NoteRecord("first's"), ClaimRecord("w2"), NoteRecord("second's")]
    assert payloads(backend.store.read(run).records) == expected
    first.close()


def run_like_the_loop(log: SessionLog) -> None:
    """What one turn with a tool call writes, in the loop's order."""
    call = ToolUse("toolu_1", "read_file", {"path": "README.md"})
    log.user(user("summarise the README"))
    log.assistant(
        assistant("reading it", call, provider="scripted", model="demo"),
        Usage(120, 30, 0, 0),
        0.002,
        "tool_use",
        1,
    )
    log.barrier()
    log.decision("toolu_1", "read_file", "allow", "mode")
    log.tool_started("toolu_1", "read_file", "test", "read README.md")
    log.process("toolu_1", 4242, 1234567, "boot")
    log.tool_result(tool_result("toolu_1", "# keel\n"), 0.01)
    log.barrier()
    log.note("a note")
    log.assistant(
        assistant("It is about keel.", provider="scripted", model="demo"),
        Usage(160, 12, 100, 0),
        0.001,
        "end_turn",
        2,
    )
    log.terminal("completed", turns=2, cost=0.003, prompt="summarise the README")
    log.close()


def write_run(store: SessionStore, run_id: str, **kw: Any) -> list[Record]:
    log = SessionLog(store.create(meta(run_id, **kw)), run_id)
    run_like_the_loop(log)
    return store.read(run_id).records


def test_session_log_over_the_store_folds_like_the_loop_wrote_it(backend: Backend) -> None:
    records = write_run(backend.store, "20261201-000000-121212")
    state = fold(records)
    assert (state.turns, state.cost, state.last_prompt) == (2, 0.003, "summarise the README")
    assert state.terminal == TerminalRecord("completed", "", 2, 0.003, "summarise the README")
    assert state.pending is None
    assert [m.role for m in state.messages] == ["user", "assistant", "user", "assistant"]
    assert [r.payload.type for r in records] == [
        "meta",
        "user",
        "assistant",
        "decision",
        "tool_started",
        "process",
        "tool_result",
        "note",
        "assistant",
        "terminal",
    ]
    # The local path names a transcript holding the same lines (the JetStream mirror).
    assert backend.mirror("20261201-000000-121212").read_bytes() == b"".join(
        encode(r) for r in records
    )


def test_summaries_do_not_read_the_records(backend: Backend) -> None:
    write_run(backend.store, "20261201-000000-111111")
    write_run(backend.store, "20261201-000001-222222", model="other/m", parent="p1")
    # Record 5 of each becomes unreadable: reading the run fails, listing does not need it.
    backend.damage("20261201-000000-111111", 5)
    backend.damage("20261201-000001-222222", 5)
    with pytest.raises(CorruptSession):
        backend.store.read("20261201-000000-111111")
    got = backend.new_store().summaries()
    started = {s.id: s.started for s in got}
    assert got == [
        SessionSummary(
            "20261201-000001-222222",
            got[0].path,
            started["20261201-000001-222222"],
            CWD,
            "other/m",
            "completed",
            "summarise the README",
            2,
            0.003,
            "p1",
        ),
        SessionSummary(
            "20261201-000000-111111",
            got[1].path,
            started["20261201-000000-111111"],
            CWD,
            "scripted:demo",
            "completed",
            "summarise the README",
            2,
            0.003,
            None,
        ),
    ]
    assert [s.path.name for s in got] == [
        "20261201-000001-222222.jsonl",
        "20261201-000000-111111.jsonl",
    ]
    assert all(s.started.endswith("Z") for s in got)


@pytest.mark.needs("nats-server")
def test_both_stores_hold_the_same_bytes_and_fold_the_same(
    tmp_path: Path,
    nats_server: NatsServer,  # noqa: F811
) -> None:
    file_store = FileStore(tmp_path / "sessions")
    js_store = JetStreamStore.connect(nats_server.url, scratch=tmp_path / "scratch")
    try:
        ensure_streams_sync(js_store.bridge)
        from_file = write_run(file_store, "20261201-000000-343434")
        from_js = write_run(js_store, "20261201-000000-343434")
    finally:
        js_store.close()
    assert len(from_file) == 10
    assert without_ts(from_js) == without_ts(from_file)

    def blank(records: list[Record]) -> list[Record]:
        return [dataclasses.replace(r, ts="") for r in records]

    assert fold(blank(from_js)) == fold(blank(from_file))
    # Both local files are 0600 in 0700 directories.
    for path in (
        file_store.path("20261201-000000-343434"),
        js_store.mirror_path("20261201-000000-343434"),
    ):
        assert os.stat(path).st_mode & 0o777 == 0o600
        assert os.stat(path.parent).st_mode & 0o777 == 0o700
