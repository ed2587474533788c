"""Run journals in JetStream: `JetStreamJournal` (an `AppendLog`) and `JetStreamStore` (a
`SessionStore`), the fleet's counterparts of the session file and its directory.

A run's meta is the message at `keel.run.<run>._meta`, record n (n >= 2) the one at
`keel.run.<run>.<n>`; a body is exactly the session file's line for the record
(`keel.session.records.encode`). Every append is fenced: it names the stream sequence of the
run's last message (`Nats-Expected-Last-Subject-Sequence` over `keel.run.<run>.*`), so of two
writers the second is refused (`Fenced`), never interleaved; `Nats-Msg-Id` `<run>-<n>` plus a
per-journal `Keel-Writer` token tell a retried publish that was in fact stored (success) from
another writer's record (fenced).

Every append is published and its acknowledgement awaited before `append` returns, `durable=False`
ones included: a fenced chain cannot be pipelined, since each append names the stream sequence
the previous one got. `sync` and `sync_in_background` have nothing left to do.

`open` claims before it reads: it appends a `ClaimRecord` after the last message it sees, and only
then reads the records, so a worker that still thinks it owns the run is refused at its next
append and nothing of it lands after the claim. Each appended line is also written (not fsynced)
to a mirror file in the worker's scratch directory (`<scratch>/<run>.jsonl`, 0600 in 0700
directories) so hooks and `transcript_path` see a transcript. Listing reads one summary per run
from the KV bucket `keel-runs` (written at create, claim, park and terminal records), never the
journals. This module never imports nats at import time, and never lets a nats exception out:
appends fail with `JournalWriteError` (or `Fenced`), reads with one-line `UserError`s.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import time
from collections.abc import Coroutine, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from keel.errors import UserError
from keel.fleet import streams
from keel.fleet.connect import Bridge, FleetError
from keel.session.journal import (
    FILE_MODE,
    CorruptSession,
    JournalWriteError,
    Loaded,
    SessionLocked,
    make_dirs,
)
from keel.session.records import (
    ClaimRecord,
    Meta,
    NewerFormat,
    ParkRecord,
    Payload,
    Record,
    RecordError,
    TerminalRecord,
    decode,
    encode,
    now,
)

if TYPE_CHECKING:
    from nats.js.kv import KeyValue

    from keel.session.index import SessionSummary

T = TypeVar("T")
log = logging.getLogger(__name__)

#: Seconds one publish waits for its acknowledgement (it is retried once, same Msg-Id).
APPEND_TIMEOUT = 10.0
#: Seconds between asks while a stream has no leader (an election after a node loss).
ELECTION_PAUSE = 0.25
#: Seconds a read may wait for the next message of a run.
READ_TIMEOUT = 10.0
#: JetStream's error code for a publish whose expected last sequence is not the last one.
WRONG_LAST_SEQUENCE = 10071
#: How often `open` retries its claim when another append lands in between.
CLAIM_ATTEMPTS = 5
WRITER_HEADER = "Keel-Writer"
RETRY_HINT = "the run's records so far are safe in the stream; resume it when the server is back"


class Fenced(JournalWriteError):
    """Another worker took the run over (or this one released it): this journal appends no more."""


class CorruptRun(CorruptSession):
    """A run's messages do not form a journal (a gap, a body that is not a record)."""

    def __init__(self, subject: str, seq: int, why: str, *, newer: bool = False) -> None:
        hint = (
            "upgrade keel to read this run; nothing was written"
            if newer
            else "nothing was written; inspect the stream (`nats stream view KEEL_RUNS`)"
        )
        UserError.__init__(self, f"{subject}: not a valid record ({why})", hint=hint)
        self.path = Path(subject)
        self.line = seq


class ClaimRefused(SessionLocked):
    """`open` could not append its claim: other appends kept landing first."""


def record_seq(subject: str) -> int:
    """The record number a run subject holds (`_meta` is 1)."""
    tail = subject.rsplit(".", 1)[-1]
    if tail == "_meta":
        return 1
    if tail.isdigit() and int(tail) >= 2:
        return int(tail)
    raise CorruptRun(subject, 0, "the subject names no record")


def subject_for(run_id: str, seq: int) -> str:
    return streams.meta_subject(run_id) if seq == 1 else streams.run_subject(run_id, seq)


def _nats_error() -> tuple[type[BaseException], ...]:
    import nats.errors

    return (nats.errors.Error, TimeoutError)


# -- the journal ---------------------------------------------------------------------------------


class JetStreamJournal:
    """One run's fenced appender. `last_stream_seq` is the stream sequence of the run's last
    message (0 before its meta), `last_seq` its record number."""

    def __init__(
        self,
        bridge: Bridge,
        run_id: str,
        last_stream_seq: int,
        last_seq: int,
        mirror_path: Path,
        *,
        timeout: float = APPEND_TIMEOUT,
        store: JetStreamStore | None = None,
    ) -> None:
        self.bridge = bridge
        self.run_id = streams.check_run_id(run_id)
        self.last_stream_seq = last_stream_seq
        self.last_seq = last_seq
        self.path = mirror_path
        self.timeout = timeout
        self.writer = secrets.token_hex(8)
        self.warnings: list[str] = []
        self._store = store
        self._dead: Fenced | None = None
        self._broken: str | None = None
        self._closed = False
        self._mirror_fd = -1

    # -- the mirror ------------------------------------------------------------------------------

    def start_mirror(self, records: list[Record]) -> None:
        """(Re)write the mirror file with `records` (what the stream holds), then keep it."""
        make_dirs(self.path.parent)
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, FILE_MODE)
            os.fchmod(fd, FILE_MODE)
            os.write(fd, b"".join(encode(r) for r in records))
        except OSError as exc:
            raise JournalWriteError(
                f"cannot write the transcript mirror {self.path}: {exc.strerror or exc}",
                hint="free disk space or fix the scratch directory's permissions",
            ) from exc
        self._mirror_fd = fd

    def _mirror(self, line: bytes) -> None:
        if self._mirror_fd < 0:
            return
        try:
            os.write(self._mirror_fd, line)
        except OSError as exc:
            raise JournalWriteError(
                f"record {self.last_seq} of run {self.run_id} is stored, but the transcript "
                f"mirror {self.path} cannot be written: {exc.strerror or exc}",
                hint="free disk space on the worker; the run can be resumed from the stream",
            ) from exc

    # -- appending -------------------------------------------------------------------------------

    def append(self, payload: Payload, *, durable: bool = True) -> Record:
        """Publish one record and wait for the stream's acknowledgement (whatever `durable` says:
        the next append's fence needs this one's stream sequence)."""
        if self._dead is not None:
            raise Fenced(self._dead.message, hint=self._dead.hint)
        if self._closed:
            raise JournalWriteError(
                f"the journal of run {self.run_id} is closed", hint="this is a bug in the caller"
            )
        if self._broken is not None:
            raise JournalWriteError(self._broken, hint="resume the run to continue it")
        record = Record(self.last_seq + 1, now(), payload)
        line = encode(record)
        try:
            stream_seq = self._call(self._publish(record.seq, line))
        except Fenced:
            raise
        except JournalWriteError:
            # The publish may still land (nats-py resends what it buffered when it reconnects):
            # the chain's end is unknown, so nothing more is appended through this journal.
            self._broken = (
                f"run {self.run_id}: the outcome of record {record.seq} is unknown (an earlier "
                "append failed); this journal appends no more"
            )
            raise
        self.last_seq, self.last_stream_seq = record.seq, stream_seq
        self._mirror(line)
        self._after(record)
        return record

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        try:
            # Bounded twice over: each publish has its own timeout and there is one retry.
            return self.bridge.call(coro, timeout=self.timeout * 3 + 5)
        except TimeoutError:
            raise JournalWriteError(
                f"the fleet's NATS server did not acknowledge record {self.last_seq + 1} of run "
                f"{self.run_id} in time",
                hint=RETRY_HINT,
            ) from None
        except RuntimeError as exc:  # the bridge's loop is gone (the store was closed)
            coro.close()
            raise JournalWriteError(
                f"cannot append to run {self.run_id}: {exc}", hint="the store was closed"
            ) from None

    def _headers(self, seq: int) -> dict[str, str]:
        return {
            "Nats-Msg-Id": f"{self.run_id}-{seq}",
            "Nats-Expected-Last-Subject-Sequence": str(self.last_stream_seq),
            "Nats-Expected-Last-Subject-Sequence-Subject": streams.run_filter(self.run_id),
            WRITER_HEADER: self.writer,
        }

    async def _publish(self, seq: int, line: bytes) -> int:
        """Publish record `seq`; its stream sequence. A timeout is retried once with the same
        Msg-Id; a refusal of the fence is a retry of a stored publish (ours is there) or a
        takeover (`Fenced`)."""
        import nats.errors
        from nats.js.errors import APIError, NoStreamResponseError

        subject = subject_for(self.run_id, seq)
        # A replicated stream electing a leader (a node lost) answers "no responders" or 503
        # for a few seconds: asked again within the window, so an election stops no run (a
        # stopped attempt would run its tool call in flight again on the next worker).
        deadline = time.monotonic() + 2 * self.timeout
        timeouts = 0
        while True:
            try:
                ack = await self.bridge.js.publish(
                    subject, line, timeout=self.timeout, headers=self._headers(seq)
                )
            except (nats.errors.TimeoutError, TimeoutError):
                timeouts += 1
                if timeouts == 2 or time.monotonic() >= deadline:
                    raise JournalWriteError(
                        f"the fleet's NATS server did not acknowledge record {seq} of run "
                        f"{self.run_id} within {self.timeout:g} s (tried twice)",
                        hint=RETRY_HINT,
                    ) from None
            except APIError as exc:
                if exc.err_code == WRONG_LAST_SEQUENCE:
                    return await self._stored_or_fenced(subject, seq, line)
                if exc.code == 503 and time.monotonic() < deadline:
                    await asyncio.sleep(ELECTION_PAUSE)
                    continue
                raise JournalWriteError(
                    f"the stream refused record {seq} of run {self.run_id}: "
                    f"{exc.description or exc}",
                    hint="`keel fleet init --check` checks the stream's settings",
                ) from None
            except NoStreamResponseError:
                if time.monotonic() < deadline:
                    await asyncio.sleep(ELECTION_PAUSE)
                    continue
                raise JournalWriteError(
                    f"no stream {streams.RUNS_STREAM} answers for run {self.run_id}",
                    hint="create the streams with `keel fleet init`",
                ) from None
            except nats.errors.Error as exc:
                raise JournalWriteError(
                    f"cannot append record {seq} of run {self.run_id}: {type(exc).__name__}: {exc}",
                    hint=RETRY_HINT,
                ) from None
            else:
                if ack.duplicate:
                    # The server matched the Msg-Id `<run>-<seq>` within its duplicate window
                    # and stored nothing, before any fence check: our own earlier publish, or
                    # another writer's record `seq` (a takeover racing this worker). Only the
                    # first is ours to go on from.
                    return await self._stored_or_fenced(subject, seq, line)
                return int(ack.seq)

    async def _stored_or_fenced(self, subject: str, seq: int, line: bytes) -> int:
        from nats.js.errors import NotFoundError

        js = self.bridge.js
        with contextlib.suppress(NotFoundError):
            stored = await js.get_last_msg(streams.RUNS_STREAM, subject)
            headers = stored.headers or {}
            if (
                headers.get("Nats-Msg-Id") == f"{self.run_id}-{seq}"
                and headers.get(WRITER_HEADER) == self.writer
                and stored.data == line
            ):
                return int(stored.seq or 0)  # our own publish, whose ack was lost: it is stored
        latest = "?"
        with contextlib.suppress(NotFoundError, CorruptRun):
            last = await js.get_last_msg(streams.RUNS_STREAM, streams.run_filter(self.run_id))
            latest = str(record_seq(last.subject or ""))
        self._dead = Fenced(
            f"run {self.run_id} was taken over by another worker (its record {latest} exists); "
            "this worker stops",
            hint="nothing to do: the other worker continues the run",
        )
        raise self._dead

    def _after(self, record: Record) -> None:
        """The run's summary follows the records a listing shows."""
        if self._store is None:
            return
        changes = summary_changes(record.payload)
        if changes:
            self._store.update_summary(self.run_id, changes, warnings=self.warnings)

    def sync(self) -> None:
        """Nothing to do: every append was acknowledged before it returned."""

    def sync_in_background(self) -> None:
        """Nothing to do (see `sync`)."""

    def repair(self) -> Path | None:
        """A stream has no torn tail: a message is stored whole or not at all."""
        return None

    def fence(self, why: str = "this worker released it") -> None:
        """Refuse every later append here (a parked or handed-back run is someone else's)."""
        if self._dead is None:
            self._dead = Fenced(
                f"run {self.run_id}: {why}; this journal appends no more",
                hint="the run continues wherever it is claimed next",
            )

    @property
    def fenced(self) -> bool:
        return self._dead is not None

    @property
    def broken(self) -> bool:
        """An append's outcome is unknown (the server went away): this journal appends no more,
        and only a new claim (a resume) finds out where the run really stands."""
        return bool(self._broken)

    def close(self) -> None:
        self._closed = True
        if self._mirror_fd >= 0:
            os.close(self._mirror_fd)
            self._mirror_fd = -1


def summary_changes(payload: Payload) -> dict[str, Any]:
    """What a record changes in the run's summary ({} for most records)."""
    match payload:
        case TerminalRecord():
            return {
                "status": payload.reason,
                "turns": payload.turns,
                "cost": payload.cost,
                "last_prompt": payload.prompt,
                "waits_for": "",
            }
        case ClaimRecord():
            return {"status": "running", "worker": payload.worker, "attempt": payload.attempt}
        case ParkRecord():
            return {"status": "parked", "waits_for": payload.waits_for}
        case _:
            return {}


# -- the store -----------------------------------------------------------------------------------


class JetStreamStore:
    """Runs in the stream `KEEL_RUNS`, their summaries in the KV bucket `keel-runs`."""

    def __init__(
        self,
        bridge: Bridge,
        *,
        scratch: Path,
        worker: str = "",
        timeout: float = APPEND_TIMEOUT,
        owns_bridge: bool = False,
        auto_summary: bool = True,
    ) -> None:
        self.bridge = bridge
        #: Whether the journals keep the run's KV summary (create, claim, park, terminal) up to
        #: date themselves; a caller that writes every summary field itself turns it off.
        self.auto_summary = auto_summary
        self.scratch = scratch
        self.worker = worker
        self.timeout = timeout
        self.name = f"{bridge.url} stream {streams.RUNS_STREAM}"
        self._owns_bridge = owns_bridge
        self._kv: KeyValue | None = None

    @classmethod
    def connect(
        cls,
        url: str,
        *,
        scratch: Path,
        worker: str = "",
        env: Mapping[str, str] | None = None,
        timeout: float = APPEND_TIMEOUT,
    ) -> JetStreamStore:
        """A store on its own connection (closed by `close`)."""
        return cls(
            Bridge(url, name=f"keel {worker}".strip(), env=env),
            scratch=scratch,
            worker=worker,
            timeout=timeout,
            owns_bridge=True,
        )

    def mirror_path(self, run_id: str) -> Path:
        return self.scratch / f"{streams.check_run_id(run_id)}.jsonl"

    def _journal(self, run_id: str, stream_seq: int, seq: int) -> JetStreamJournal:
        return JetStreamJournal(
            self.bridge,
            run_id,
            stream_seq,
            seq,
            self.mirror_path(run_id),
            timeout=self.timeout,
            store=self if self.auto_summary else None,
        )

    def _call(self, coro: Coroutine[Any, Any, T], what: str, *, records: int = 0) -> T:
        """Run a request on the bridge (bounded: longer for a long run's `records`); nats'
        failures become one line."""
        from nats.js.errors import BucketNotFoundError, NoStreamResponseError

        try:
            return self.bridge.call(coro, timeout=self.timeout * 3 + 5 + records / 1000)
        except BucketNotFoundError:
            raise FleetError(
                f"cannot {what}: no KV bucket {streams.KV_BUCKET} on {self.bridge.url}",
                hint="create the streams and the bucket with `keel fleet init`",
            ) from None
        except NoStreamResponseError:
            raise FleetError(
                f"cannot {what}: no stream {streams.RUNS_STREAM} on {self.bridge.url}",
                hint="create the streams with `keel fleet init`",
            ) from None
        except _nats_error() as exc:
            why = "no answer in time" if isinstance(exc, TimeoutError) else f"{exc}"
            raise FleetError(
                f"cannot {what} on {self.bridge.url} ({type(exc).__name__}: {why})",
                hint="is the fleet's NATS server up? `keel fleet status` tells",
            ) from None

    # -- creating and claiming -------------------------------------------------------------------

    def create(self, meta: Meta) -> JetStreamJournal:
        """A new run holding `meta` as its first record; refused if the run exists."""
        run_id = streams.check_run_id(meta.id)
        journal = self._journal(run_id, 0, 0)
        try:
            record = journal.append(meta)
        except Fenced:
            journal.close()
            raise UserError(
                f"run {run_id} already exists in {self.name}",
                hint="pick another id (keel makes a fresh one when none is given)",
            ) from None
        journal.start_mirror([record])
        if self.auto_summary:
            self.update_summary(run_id, _meta_summary(record), warnings=journal.warnings)
        return journal

    def open(
        self, session_id: str, *, worker: str = "", attempt: int = 1
    ) -> tuple[JetStreamJournal, Loaded]:
        """Claim the run (a `ClaimRecord` after its last message), then read every record up to
        the claim. Any earlier owner is refused at its next append."""
        run_id = streams.check_run_id(session_id)
        claim = ClaimRecord(worker or self.worker, attempt)
        for _ in range(CLAIM_ATTEMPTS):
            stream_seq, seq = self._last(run_id)
            journal = self._journal(run_id, stream_seq, seq)
            try:
                journal.append(claim)
            except Fenced:
                continue  # another append landed between our look and our claim: look again
            break
        else:
            raise ClaimRefused(
                f"run {run_id} could not be claimed: other appends kept landing first "
                f"({CLAIM_ATTEMPTS} attempts)",
                hint="another worker is writing it; stop that worker or wait for it to finish",
            )
        try:
            records = self._records(run_id, journal.last_stream_seq, journal.last_seq)
            journal.start_mirror(records)
        except BaseException:
            journal.close()
            raise
        return journal, Loaded(records)

    # -- reading ---------------------------------------------------------------------------------

    def _last(self, run_id: str) -> tuple[int, int]:
        """(stream seq, record seq) of the run's last message; `UserError` if it has none."""
        from nats.js.errors import NotFoundError

        async def last() -> tuple[int, int] | None:
            try:
                msg = await self.bridge.js.get_last_msg(
                    streams.RUNS_STREAM, streams.run_filter(run_id)
                )
            except NotFoundError:
                return None
            return int(msg.seq or 0), record_seq(msg.subject or "")

        found = self._call(last(), f"read run {run_id}")
        if found is None:
            raise UserError(
                f"no run {run_id!r} in {self.name}", hint="`keel runs list` shows the runs"
            )
        return found

    def read(self, session_id: str) -> Loaded:
        """Every record of the run, in order, without claiming it."""
        run_id = streams.check_run_id(session_id)
        stream_seq, seq = self._last(run_id)
        return Loaded(self._records(run_id, stream_seq, seq))

    def _records(self, run_id: str, upto: int, count: int) -> list[Record]:
        """The run's `count` records, up to stream sequence `upto`, through one ordered
        consumer."""
        messages = self._call(self._fetch(run_id, upto), f"read run {run_id}", records=count)
        records: list[Record] = []
        for subject, data in messages:
            expected = len(records) + 1
            seq = record_seq(subject)
            if seq != expected:
                raise CorruptRun(subject, seq, f"record {seq} where {expected} was expected")
            try:
                record = decode(data)
            except RecordError as exc:
                raise CorruptRun(
                    subject, seq, str(exc), newer=isinstance(exc, NewerFormat)
                ) from None
            if record.seq != seq:
                raise CorruptRun(subject, seq, f"it holds record {record.seq}")
            records.append(record)
        return records

    async def _fetch(self, run_id: str, upto: int) -> list[tuple[str, bytes]]:
        subscription = await self.bridge.js.subscribe(
            streams.run_filter(run_id), ordered_consumer=True, pending_msgs_limit=-1
        )
        out: list[tuple[str, bytes]] = []
        try:
            while True:
                msg = await subscription.next_msg(timeout=READ_TIMEOUT)
                meta = msg.metadata
                if meta.sequence.stream > upto:
                    break  # appended after the look: not part of what was asked for
                out.append((msg.subject, msg.data))
                if meta.sequence.stream == upto or meta.num_pending == 0:
                    break
        finally:
            await subscription.unsubscribe()
        return out

    def exists(self, session_id: str) -> bool:
        run_id = streams.check_run_id(session_id)  # a bad id is refused, not "absent"
        try:
            self._last(run_id)
        except FleetError:
            raise
        except UserError:
            return False
        return True

    # -- summaries -------------------------------------------------------------------------------

    async def _bucket(self) -> KeyValue:
        if self._kv is None:
            self._kv = await self.bridge.js.key_value(streams.KV_BUCKET)
        return self._kv

    def put_summary(self, run_id: str, summary: Mapping[str, Any]) -> None:
        """Replace the run's summary (JSON: id, started, cwd, model, status, last_prompt, turns,
        cost, parent, and whatever else a caller keeps there)."""
        streams.check_run_id(run_id)
        value = json.dumps(dict(summary), ensure_ascii=False).encode()

        async def put() -> None:
            await (await self._bucket()).put(run_id, value)

        self._call(put(), f"write the summary of run {run_id}")

    def update_summary(
        self, run_id: str, changes: Mapping[str, Any], *, warnings: list[str] | None = None
    ) -> None:
        """Merge `changes` into the run's summary (compare-and-swap, retried). A failure is a
        warning (the record itself is stored; only the listing lags), unless `warnings` is None."""
        try:
            self._call(self._merge(run_id, dict(changes)), f"update the summary of run {run_id}")
        except FleetError as exc:
            if warnings is None:
                raise
            text = exc.one_line()
            warnings.append(text)
            log.warning("%s", text)

    async def _merge(self, run_id: str, changes: dict[str, Any]) -> None:
        from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError

        kv = await self._bucket()
        for _ in range(5):
            try:
                entry = await kv.get(run_id)
            except KeyNotFoundError:
                entry = None
            old = _loads(entry.value if entry is not None else None)
            value = json.dumps({**old, **changes}, ensure_ascii=False).encode()
            try:
                if entry is None or entry.revision is None:
                    await kv.create(run_id, value)
                else:
                    await kv.update(run_id, value, last=entry.revision)
                return
            except KeyWrongLastSequenceError:
                continue  # another writer changed it in between: merge again
        raise FleetError(
            f"the summary of run {run_id} kept changing under this update",
            hint="several processes update it at once; the records themselves are stored",
        )

    def get_summary(self, run_id: str) -> dict[str, Any] | None:
        from nats.js.errors import KeyNotFoundError

        streams.check_run_id(run_id)

        async def get() -> dict[str, Any] | None:
            try:
                entry = await (await self._bucket()).get(run_id)
            except KeyNotFoundError:
                return None
            return _loads(entry.value)

        return self._call(get(), f"read the summary of run {run_id}")

    def summaries(self, cwd: Path | None = None) -> list[SessionSummary]:
        """One summary per run (of the project at `cwd`, or all), newest first, from the KV
        bucket only: no journal is read."""
        from keel.session.index import SessionSummary

        found = self._call(self._all_summaries(), "list the runs")
        out = []
        for run_id, d in found.items():
            if cwd is not None and d.get("cwd") != str(cwd):
                continue
            prompt = str(d.get("last_prompt") or "").strip()
            out.append(
                SessionSummary(
                    str(d.get("id") or run_id),
                    self.scratch / f"{run_id}.jsonl",
                    str(d.get("started", "")),
                    str(d.get("cwd", "")),
                    str(d.get("model", "")),
                    str(d.get("status", "")),
                    prompt.splitlines()[0][:80] if prompt else "",
                    _int_or_none(d.get("turns")),
                    _float_or_none(d.get("cost")),
                    d.get("parent") or None,
                    str(d.get("agent") or ""),
                )
            )
        out.sort(key=lambda s: s.id, reverse=True)
        return out

    async def _all_summaries(self) -> dict[str, dict[str, Any]]:
        kv = await self._bucket()
        # `*` is one token: the runs' summaries, not their answers or cancel flags.
        watcher = await kv.watch("*", ignore_deletes=True)
        found: dict[str, dict[str, Any]] = {}
        try:
            async for entry in watcher:
                if entry is None:  # the end of what is stored now
                    break
                found[entry.key] = _loads(entry.value)
        finally:
            await watcher.stop()  # type: ignore[no-untyped-call]
        return found

    def close(self) -> None:
        if self._owns_bridge:
            self.bridge.close()


def _meta_summary(record: Record) -> dict[str, Any]:
    meta = record.payload
    assert isinstance(meta, Meta)
    return {
        "id": meta.id,
        "started": record.ts,
        "cwd": meta.cwd,
        "model": meta.model,
        "status": "running",
        "last_prompt": "",
        "turns": None,
        "cost": None,
        "parent": meta.parent,
        "agent": meta.agent,
        "created_at": time.time(),
    }


def _loads(value: bytes | None) -> dict[str, Any]:
    if not value:
        return {}
    try:
        d = json.loads(value)
    except ValueError:
        return {}
    return d if isinstance(d, dict) else {}


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float_or_none(value: object) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None
