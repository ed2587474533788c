"""The journal's fence on a replicated (R3) stream, where the server answers a publish whose
Msg-Id it has seen with a duplicate ack before any fence check: a stale owner whose next record
number is the one a new owner's claim took must be refused, not told its record is stored (it
would then go on from the claim and two workers would run the run)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from keel.fleet.journal import Fenced, JetStreamStore
from keel.fleet.setup import ensure_streams_sync
from keel.session.records import ClaimRecord, Meta, NoteRecord
from tests.nats_fixture import NatsCluster, nats_cluster  # noqa: F401

pytestmark = pytest.mark.needs("nats-server")

RUN = "20261203-060000-fa11ed"


def meta() -> Meta:
    return Meta(RUN, "/work/project", "scripted:demo", None, None, None, "test")


@pytest.fixture
def stores(nats_cluster: NatsCluster, tmp_path: Path) -> Iterator[tuple[JetStreamStore, ...]]:  # noqa: F811
    first = JetStreamStore.connect(nats_cluster.url, scratch=tmp_path / "w1", worker="w1")
    second = JetStreamStore.connect(nats_cluster.url, scratch=tmp_path / "w2", worker="w2")
    try:
        ensure_streams_sync(first.bridge, replicas=3)
        yield first, second
    finally:
        first.close()
        second.close()


def test_a_stale_owner_whose_record_number_a_claim_took_is_fenced_on_a_cluster(
    stores: tuple[JetStreamStore, JetStreamStore],
) -> None:
    store, other = stores
    old = store.create(meta())
    old.append(NoteRecord("w1 worked"))
    # w2 takes the run over (w1 stalled past the ack wait): its claim is record 3, Msg-Id <run>-3.
    journal, loaded = other.open(RUN, worker="w2", attempt=2)
    assert [r.payload for r in loaded.records][-1] == ClaimRecord("w2", 2)
    # w1 wakes and appends its record 3: the same Msg-Id as the claim.
    with pytest.raises(Fenced, match=r"its record 3 exists"):
        old.append(NoteRecord("w1 still thinks it owns the run"))
    with pytest.raises(Fenced):
        old.append(NoteRecord("w1's record 4"))
    journal.append(NoteRecord("w2 continues"))
    assert [r.payload for r in store.read(RUN).records] == [
        meta(),
        NoteRecord("w1 worked"),
        ClaimRecord("w2", 2),
        NoteRecord("w2 continues"),
    ]
    journal.close()


def test_a_late_running_write_does_not_reopen_a_finished_run(
    stores: tuple[JetStreamStore, JetStreamStore],
) -> None:
    """A worker's summary write that waited through an election lands after another worker
    finished the run: the run stays finished (a retry, `queued`, still reopens it)."""
    from keel.fleet.runs import Fleet

    store, _ = stores

    async def body() -> list[tuple[str, str]]:
        fleet = Fleet(store.bridge.nc)
        seen = []
        await fleet.put_summary(RUN, status="running", worker="w2")
        await fleet.put_summary(RUN, status="completed", worker="w2", text="done")
        late = await fleet.put_summary(RUN, status="running", worker="w1", attempt=1)
        seen.append((late["status"], late["worker"]))
        await fleet.put_summary(RUN, status="failed", worker="")
        retried = await fleet.put_summary(RUN, status="queued")
        seen.append((retried["status"], retried["worker"]))
        again = await fleet.put_summary(RUN, status="running", worker="w3")
        seen.append((again["status"], again["worker"]))
        return seen

    assert store.bridge.call(body()) == [("completed", "w2"), ("queued", ""), ("running", "w3")]
