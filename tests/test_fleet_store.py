"""The JetStream store's own promises, against a real nats-server on loopback: fenced appends
(two writers, a stale owner after a claim), idempotent retries of a publish whose ack was lost,
the stream settings checked, a server that goes away, run ids that would change the subject."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from keel.errors import UserError
from keel.fleet import journal as fleet_journal
from keel.fleet.connect import Bridge, FleetError
from keel.fleet.journal import (
    ClaimRefused,
    CorruptRun,
    Fenced,
    JetStreamJournal,
    JetStreamStore,
)
from keel.fleet.setup import DUPLICATE_WINDOW, ensure_streams_sync
from keel.fleet.streams import RUNS_STREAM, run_filter, run_subject
from keel.session.fold import fold
from keel.session.journal import JournalWriteError, SessionLocked
from keel.session.records import (
    ClaimRecord,
    Meta,
    NoteRecord,
    ParkRecord,
    Payload,
    Record,
    TerminalRecord,
)
from tests.nats_fixture import NatsServer, nats_server  # noqa: F401

pytestmark = pytest.mark.needs("nats-server")

RUN = "20261201-120000-f1f1f1"


def meta(run_id: str = RUN) -> Meta:
    return Meta(run_id, "/work/project", "scripted:demo", None, None, None, "test")


@pytest.fixture
def store(tmp_path: Path, nats_server: NatsServer) -> Iterator[JetStreamStore]:  # noqa: F811
    s = JetStreamStore.connect(nats_server.url, scratch=tmp_path / "w1", worker="w1")
    ensure_streams_sync(s.bridge)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def other(tmp_path: Path, nats_server: NatsServer) -> Iterator[JetStreamStore]:  # noqa: F811
    s = JetStreamStore.connect(nats_server.url, scratch=tmp_path / "w2", worker="w2")
    try:
        yield s
    finally:
        s.close()


def payloads(records: list[Record]) -> list[Payload]:
    return [r.payload for r in records]


def run_messages(store: JetStreamStore, run_id: str = RUN) -> int:
    """How many messages the stream holds for the run (from the server, not through the store)."""

    async def count() -> int:
        info = await store.bridge.js.stream_info(RUNS_STREAM, subjects_filter=run_filter(run_id))
        return len(info.state.subjects or {})

    return store.bridge.call(count())


# -- fencing -------------------------------------------------------------------------------------


def test_a_second_writer_from_the_same_point_is_fenced_and_never_interleaves(
    store: JetStreamStore, other: JetStreamStore
) -> None:
    first = store.create(meta())
    first.append(NoteRecord("before the fork"))
    # A second writer that read the run at the same moment (same last message, same record).
    second = JetStreamJournal(
        other.bridge, RUN, first.last_stream_seq, first.last_seq, other.mirror_path(RUN)
    )
    first.append(NoteRecord("first's 3"))
    # Same subject and the same Msg-Id (`<run>-3`) as first's record: still refused.
    with pytest.raises(Fenced) as refused:
        second.append(NoteRecord("second's 3"))
    assert refused.value.one_line() == (
        f"run {RUN} was taken over by another worker (its record 3 exists); this worker stops "
        "(hint: nothing to do: the other worker continues the run)"
    )
    first.append(NoteRecord("first's 4"))
    # Dead for good: refused at once, even where the fence would now match nothing stale.
    other.close()  # no connection left: a refusal here is the journal's own
    with pytest.raises(Fenced):
        second.append(NoteRecord("second's 4"))
    assert payloads(store.read(RUN).records) == [
        meta(),
        NoteRecord("before the fork"),
        NoteRecord("first's 3"),
        NoteRecord("first's 4"),
    ]


def test_two_writers_racing_from_one_point_leave_one_writers_records(
    store: JetStreamStore, other: JetStreamStore
) -> None:
    first = store.create(meta())
    writers = {
        "a": first,
        "b": JetStreamJournal(other.bridge, RUN, first.last_stream_seq, 1, other.mirror_path(RUN)),
    }
    landed: dict[str, list[int]] = {"a": [], "b": []}
    fenced: dict[str, bool] = {"a": False, "b": False}
    start = threading.Barrier(2)

    def write(name: str) -> None:
        start.wait()
        for i in range(30):
            try:
                landed[name].append(writers[name].append(NoteRecord(f"{name}{i}")).seq)
            except Fenced:
                fenced[name] = True
                return

    threads = [threading.Thread(target=write, args=(n,)) for n in writers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    winner = "a" if len(landed["a"]) == 30 else "b"
    loser = "b" if winner == "a" else "a"
    assert landed[winner] == list(range(2, 32))
    assert fenced == {winner: False, loser: True}
    records = store.read(RUN).records
    assert payloads(records) == [meta()] + [NoteRecord(f"{winner}{i}") for i in range(30)]
    # Whoever lands record 2 wins; the other is refused at its first append.
    assert landed[loser] == []


def test_a_claim_fences_the_previous_owner(store: JetStreamStore, other: JetStreamStore) -> None:
    old = store.create(meta())
    old.append(NoteRecord("w1 worked"))
    journal, loaded = other.open(RUN, worker="w2", attempt=2)
    # The claim is appended first: what was read ends with it.
    assert payloads(loaded.records) == [meta(), NoteRecord("w1 worked"), ClaimRecord("w2", 2)]
    assert fold(loaded.records).claims == [("w2", 2)]
    with pytest.raises(Fenced, match=r"its record 3 exists"):
        old.append(NoteRecord("w1 still thinks it owns the run"))
    journal.append(NoteRecord("w2 continues"))
    assert payloads(store.read(RUN).records) == [
        meta(),
        NoteRecord("w1 worked"),
        ClaimRecord("w2", 2),
        NoteRecord("w2 continues"),
    ]
    # The new owner's mirror is the whole transcript, claim included.
    assert journal.path == other.scratch / f"{RUN}.jsonl"
    assert len(journal.path.read_bytes().splitlines()) == 4
    assert other.get_summary(RUN) == {
        **(store.get_summary(RUN) or {}),
        "status": "running",
        "worker": "w2",
        "attempt": 2,
    }
    journal.close()


def test_a_claim_that_loses_a_race_looks_again(
    store: JetStreamStore, other: JetStreamStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = store.create(meta())
    stale = (journal.last_stream_seq, journal.last_seq)
    journal.append(NoteRecord("landed after w2 looked"))
    real_last = JetStreamStore._last
    looks: list[tuple[int, int]] = []

    def last(self: JetStreamStore, run_id: str) -> tuple[int, int]:
        found = stale if not looks else real_last(self, run_id)
        looks.append(found)
        return found

    monkeypatch.setattr(JetStreamStore, "_last", last)
    claimed, loaded = other.open(RUN, worker="w2")
    assert len(looks) == 2
    assert payloads(loaded.records)[-2:] == [
        NoteRecord("landed after w2 looked"),
        ClaimRecord("w2"),
    ]
    claimed.close()
    # Always stale: refused after a bounded number of looks, nothing appended.
    looks.clear()
    monkeypatch.setattr(JetStreamStore, "_last", lambda self, run_id: stale)
    with pytest.raises(ClaimRefused) as refused:
        other.open(RUN, worker="w3")
    assert isinstance(refused.value, SessionLocked)
    assert "could not be claimed" in refused.value.one_line()
    assert run_messages(store) == 3  # meta, the note, w2's claim


def test_fence_stops_appends_locally(store: JetStreamStore) -> None:
    journal = store.create(meta())
    journal.fence("parked")
    with pytest.raises(Fenced, match=r"parked; this journal appends no more"):
        journal.append(NoteRecord("after parking"))
    assert run_messages(store) == 1


# -- idempotent retries --------------------------------------------------------------------------


def lose_acks(monkeypatch: pytest.MonkeyPatch, store: JetStreamStore, *, stored: bool) -> list[str]:
    """The next publish's ack is lost: the message is (or, with stored=False, is not) stored and
    the client sees a timeout, as when the connection drops between the store and the ack."""
    import nats.errors

    js = store.bridge.js
    real = js.publish
    calls: list[str] = []

    async def publish(subject: str, payload: bytes = b"", **kw: Any) -> Any:
        calls.append(subject)
        if len(calls) == 1:
            if stored:
                await real(subject, payload, **kw)
            raise nats.errors.TimeoutError
        return await real(subject, payload, **kw)

    monkeypatch.setattr(js, "publish", publish)
    return calls


def test_a_retry_of_a_stored_publish_is_not_a_duplicate(
    store: JetStreamStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = store.create(meta())
    calls = lose_acks(monkeypatch, store, stored=True)
    record = journal.append(NoteRecord("acked late"))
    assert calls == [run_subject(RUN, 2), run_subject(RUN, 2)]
    assert record.seq == 2
    journal.append(NoteRecord("the chain goes on"))
    monkeypatch.undo()
    assert payloads(store.read(RUN).records) == [
        meta(),
        NoteRecord("acked late"),
        NoteRecord("the chain goes on"),
    ]
    assert run_messages(store) == 3


def test_a_retry_of_a_lost_publish_stores_it_once(
    store: JetStreamStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = store.create(meta())
    calls = lose_acks(monkeypatch, store, stored=False)
    journal.append(NoteRecord("sent twice"))
    assert len(calls) == 2
    monkeypatch.undo()
    assert payloads(store.read(RUN).records) == [meta(), NoteRecord("sent twice")]


def test_a_retried_create_is_not_refused_as_existing(
    store: JetStreamStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    lose_acks(monkeypatch, store, stored=True)
    journal = store.create(meta())
    journal.append(NoteRecord("after"))
    monkeypatch.undo()
    assert payloads(store.read(RUN).records) == [meta(), NoteRecord("after")]


# -- the server going away -----------------------------------------------------------------------


def test_the_server_going_away_is_a_bounded_one_line_error(tmp_path: Path) -> None:
    server = NatsServer(tmp_path / "nats-store")
    store = JetStreamStore.connect(server.url, scratch=tmp_path / "w1", timeout=1.0)
    try:
        ensure_streams_sync(store.bridge)
        journal = store.create(meta())
        journal.append(NoteRecord("stored"))
        server.stop()
        began = time.monotonic()
        with pytest.raises(JournalWriteError) as failed:
            journal.append(NoteRecord("nobody acknowledges this"))
        took = time.monotonic() - began
        assert not isinstance(failed.value, Fenced)
        assert failed.value.one_line() == (
            f"the fleet's NATS server did not acknowledge record 3 of run {RUN} within 1 s "
            "(tried twice) (hint: the run's records so far are safe in the stream; resume it "
            "when the server is back)"
        )
        assert took < 2 * 1.0 + 3, took
        # The server comes back: this journal does not guess where its chain ends.
        server = NatsServer(tmp_path / "nats-store", port=server.port)
        with pytest.raises(JournalWriteError, match=r"outcome of record 3 is unknown"):
            journal.append(NoteRecord("after the outage"))
        # A resume claims the run and finds a contiguous journal (record 3 landed or not).
        deadline = time.monotonic() + 10
        while not store.bridge.nc.is_connected and time.monotonic() < deadline:
            time.sleep(0.05)
        resumed, loaded = store.open(RUN, worker="w1b")
        got = payloads(loaded.records)
        assert got[:2] == [meta(), NoteRecord("stored")]
        assert got[2:] in (
            [ClaimRecord("w1b")],
            [NoteRecord("nobody acknowledges this"), ClaimRecord("w1b")],
        )
        resumed.close()
    finally:
        store.close()
        server.stop()


def test_reading_from_a_server_that_is_gone_is_one_line(tmp_path: Path) -> None:
    server = NatsServer(tmp_path / "nats-store")
    store = JetStreamStore.connect(server.url, scratch=tmp_path / "w1", timeout=1.0)
    try:
        ensure_streams_sync(store.bridge)
        store.create(meta()).close()
        server.stop()
        with pytest.raises(FleetError) as failed:
            store.read(RUN)
        line = failed.value.one_line()
        assert line.startswith(f"cannot read run {RUN} on {server.url} (")
        assert line.endswith("(hint: is the fleet's NATS server up? `keel fleet status` tells)")
        assert "\n" not in line
    finally:
        store.close()


# -- run ids and broken journals -----------------------------------------------------------------


@pytest.mark.parametrize("bad", ["a.b", "a*", "a.>", ">", "run.*", ""])
def test_a_run_id_that_would_change_the_subject_is_refused(store: JetStreamStore, bad: str) -> None:
    for attempt in (
        lambda: store.create(meta(bad)),
        lambda: store.open(bad),
        lambda: store.read(bad),
        lambda: store.exists(bad),
        lambda: store.put_summary(bad, {}),
    ):
        with pytest.raises(UserError, match=r"is not a run id"):
            attempt()

    async def total() -> int:
        return int((await store.bridge.js.stream_info(RUNS_STREAM)).state.messages)

    assert store.bridge.call(total()) == 0


def test_a_gap_or_a_foreign_message_is_a_corrupt_run(store: JetStreamStore) -> None:
    journal = store.create(meta())
    journal.append(NoteRecord("two"))
    journal.append(NoteRecord("three"))
    journal.close()
    js = store.bridge.js
    store.bridge.call(js.purge_stream(RUNS_STREAM, subject=run_subject(RUN, 2)))
    with pytest.raises(CorruptRun) as gap:
        store.read(RUN)
    assert gap.value.one_line() == (
        f"{run_subject(RUN, 3)}: not a valid record (record 3 where 2 was expected) "
        "(hint: nothing was written; inspect the stream (`nats stream view KEEL_RUNS`))"
    )
    # A message that is not a record, published by something else than keel.
    other_run = "20261201-120000-999999"
    store.create(meta(other_run)).close()
    store.bridge.call(js.publish(run_subject(other_run, 2), b"not json"))
    with pytest.raises(CorruptRun) as foreign:
        store.read(other_run)
    line = foreign.value.one_line()
    assert line.startswith(f"{run_subject(other_run, 2)}: not a valid record (not JSON: ")
    assert "\n" not in line


# -- summaries -----------------------------------------------------------------------------------


def test_the_summary_follows_the_run(store: JetStreamStore, other: JetStreamStore) -> None:
    journal = store.create(meta())
    first = store.get_summary(RUN)
    assert first is not None
    assert {k: v for k, v in first.items() if k not in ("started", "created_at")} == {
        "id": RUN,
        "cwd": "/work/project",
        "model": "scripted:demo",
        "status": "running",
        "last_prompt": "",
        "turns": None,
        "cost": None,
        "parent": None,
        "agent": "",
    }
    journal.append(ParkRecord("req1", "toolu_1", "bash", "permission", "run make?"))
    assert store.get_summary(RUN) == {**first, "status": "parked", "waits_for": "permission"}
    journal.append(TerminalRecord("completed", "", 3, 0.5, "do it\nplease"))
    assert store.get_summary(RUN) == {
        **first,
        "status": "completed",
        "waits_for": "",
        "turns": 3,
        "cost": 0.5,
        "last_prompt": "do it\nplease",
    }
    store.put_summary(RUN, {**first, "status": "cancelled"})
    [summary] = other.summaries(cwd=Path("/work/project"))
    assert (summary.status, summary.path) == ("cancelled", other.scratch / f"{RUN}.jsonl")
    assert other.summaries(cwd=Path("/elsewhere")) == []
    assert other.get_summary("20261201-120000-000000") is None


# -- the stream settings -------------------------------------------------------------------------


def test_ensure_streams_creates_the_layout_once(store: JetStreamStore) -> None:
    from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType

    assert ensure_streams_sync(store.bridge) == []
    assert ensure_streams_sync(store.bridge, create=False) == []

    async def configs() -> tuple[Any, Any, Any]:
        js = store.bridge.js
        runs = (await js.stream_info(RUNS_STREAM)).config
        queue = (await js.stream_info("KEEL_QUEUE")).config
        kv = await (await js.key_value("keel-runs")).status()
        return runs, queue, kv

    runs, queue, kv = store.bridge.call(configs())
    assert (
        runs.subjects,
        runs.retention,
        runs.storage,
        runs.max_msgs_per_subject,
        runs.discard,
        runs.discard_new_per_subject,
        runs.max_age,
        runs.duplicate_window,
        runs.num_replicas,
    ) == (
        ["keel.run.>"],
        RetentionPolicy.LIMITS,
        StorageType.FILE,
        1,
        DiscardPolicy.NEW,
        True,
        0,
        DUPLICATE_WINDOW,
        1,
    )
    assert (queue.subjects, queue.retention, queue.storage) == (
        ["keel.queue.>"],
        RetentionPolicy.WORK_QUEUE,
        StorageType.FILE,
    )
    assert (kv.history, kv.ttl) == (1, 0)


GOOD = {
    "subjects": ["keel.run.>"],
    "retention": "limits",
    "storage": "file",
    "max_msgs_per_subject": 1,
    "discard": "new",
    "discard_new_per_subject": True,
    "duplicate_window": 120,
}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"max_msgs_per_subject": 5}, "stream KEEL_RUNS has max_msgs_per_subject 5, keel needs 1"),
        (
            {"max_msgs_per_subject": -1, "discard_new_per_subject": False},
            "stream KEEL_RUNS has max_msgs_per_subject -1, keel needs 1",
        ),
        ({"discard": "old", "discard_new_per_subject": False}, "stream KEEL_RUNS has discard old"),
        ({"discard_new_per_subject": False}, "discard_new_per_subject False, keel needs True"),
        ({"max_age": 3600}, "stream KEEL_RUNS has max_age 3600 s, keel needs 0 (none)"),
        ({"storage": "memory"}, "stream KEEL_RUNS has storage memory, keel needs file"),
        ({"retention": "interest"}, "stream KEEL_RUNS has retention interest, keel needs limits"),
        ({"subjects": ["keel.run.x.>"]}, "stream KEEL_RUNS has subjects ['keel.run.x.>']"),
    ],
)
def test_a_stream_of_the_wrong_shape_is_refused(
    tmp_path: Path,
    nats_server: NatsServer,  # noqa: F811
    change: dict[str, Any],
    message: str,
) -> None:
    from nats.js.api import StreamConfig

    bridge = Bridge(nats_server.url)
    try:
        config = StreamConfig.from_response({"name": RUNS_STREAM, **GOOD, **change})
        config.max_age = change.get("max_age", 0)
        config.duplicate_window = 120
        bridge.call(bridge.js.add_stream(config))
        for create in (False, True):
            with pytest.raises(FleetError) as refused:
                ensure_streams_sync(bridge, create=create)
            line = refused.value.one_line()
            assert message in line
            assert line.endswith(
                "(hint: fix it with `nats stream edit KEEL_RUNS` (or delete it and run "
                "`keel fleet init`))"
            )
        # Nothing else was made while refusing.
        names = bridge.call(bridge.js.streams_info())
        assert [s.config.name for s in names] == [RUNS_STREAM]
    finally:
        bridge.close()


def test_checking_streams_that_do_not_exist(
    tmp_path: Path,
    nats_server: NatsServer,  # noqa: F811
) -> None:
    bridge = Bridge(nats_server.url)
    try:
        with pytest.raises(FleetError) as missing:
            ensure_streams_sync(bridge, create=False)
        assert missing.value.one_line() == (
            "stream KEEL_RUNS does not exist "
            "(hint: `keel fleet init` creates the streams with the right settings)"
        )
        notes = ensure_streams_sync(bridge, replicas=1)
        assert notes == [
            "created stream KEEL_RUNS (1 replica(s))",
            "created stream KEEL_QUEUE (1 replica(s))",
            "created KV bucket keel-runs (1 replica(s))",
            "created KV bucket keel-workers (1 replica(s))",
            "created KV bucket keel-schedules (1 replica(s))",
        ]
        with pytest.raises(FleetError, match=r"cannot change stream KEEL_RUNS to 3 replica"):
            ensure_streams_sync(bridge, replicas=3)
    finally:
        bridge.close()


def test_nats_is_not_imported_by_the_module(tmp_path: Path) -> None:
    import subprocess
    import sys

    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, keel.fleet.journal, keel.fleet.setup; print('nats' in sys.modules)",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "False"
    assert fleet_journal.APPEND_TIMEOUT == 10.0


def test_without_the_bucket_listing_says_so_and_appends_still_land(
    tmp_path: Path,
    nats_server: NatsServer,  # noqa: F811
) -> None:
    store = JetStreamStore.connect(nats_server.url, scratch=tmp_path / "w1")
    try:
        ensure_streams_sync(store.bridge)
        store.bridge.call(store.bridge.js.delete_key_value("keel-runs"))
        journal = store.create(meta())
        journal.append(TerminalRecord("completed"))
        # The records are stored; the summary could not be written, and the journal says so.
        assert payloads(store.read(RUN).records)[1:] == [TerminalRecord("completed")]
        assert (
            journal.warnings
            == [
                f"cannot update the summary of run {RUN}: no KV bucket keel-runs on "
                f"{nats_server.url} (hint: create the streams and the bucket with `keel fleet init`)"
            ]
            * 2
        )
        with pytest.raises(FleetError) as failed:
            store.summaries()
        assert failed.value.one_line() == (
            f"cannot list the runs: no KV bucket keel-runs on {nats_server.url} "
            "(hint: create the streams and the bucket with `keel fleet init`)"
        )
    finally:
        store.close()


def test_a_store_without_auto_summaries_leaves_them_to_its_caller(
    tmp_path: Path,
    nats_server: NatsServer,  # noqa: F811
) -> None:
    bridge = Bridge(nats_server.url)
    try:
        ensure_streams_sync(bridge)
        store = JetStreamStore(bridge, scratch=tmp_path / "w1", auto_summary=False)
        journal = store.create(meta())
        journal.append(TerminalRecord("completed"))
        assert store.get_summary(RUN) is None
        store.put_summary(RUN, {"id": RUN, "status": "queued"})
        journal.append(NoteRecord("after"))
        assert store.get_summary(RUN) == {"id": RUN, "status": "queued"}
        store.close()  # not its bridge: the caller's
        assert bridge.nc.is_connected
    finally:
        bridge.close()
