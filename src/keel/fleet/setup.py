"""Creating the fleet's streams and bucket, or checking an operator-made set (`keel fleet init`).

`ensure_streams` owns the settings (names and subjects come from keel/fleet/streams.py):
- `KEEL_RUNS`: subjects `keel.run.>`, file storage, limits retention, one message per subject,
  discard new (per subject), no max age, a 2-minute duplicate window: what makes appends fenced
  and idempotent and journals kept until an operator deletes them.
- `KEEL_QUEUE`: subjects `keel.queue.>`, work-queue retention, file storage.
- KV buckets `keel-runs` and `keel-schedules`: history 1, no TTL; `keel-workers`: history 1, its
  entries expire `WORKERS_TTL` seconds after a worker's last heartbeat.

A stream that exists with a shape that would break the journal's promises (another subject, a
retention that deletes, no discard-new-per-subject, more than one message per subject, a max age,
memory storage) is refused with a `FleetError` naming the setting and the fix; nothing is changed
on the server then. Differences that do not break them (replicas, the duplicate window) are
returned as notes, and with `create=True` the replicas are raised to what was asked. nats-py is
imported only inside the functions.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from keel.fleet import streams
from keel.fleet.connect import FleetError

if TYPE_CHECKING:
    from nats.js.client import JetStreamContext

    from keel.fleet.connect import Bridge

#: Seconds within which a repeated `Nats-Msg-Id` is recognised as a retry.
DUPLICATE_WINDOW = 120.0
KV_STREAM = f"KV_{streams.KV_BUCKET}"
INIT_HINT = "`keel fleet init` creates the streams with the right settings"


def _wrong(stream: str, setting: str, have: object, want: object) -> FleetError:
    return FleetError(
        f"stream {stream} has {setting} {have}, keel needs {want}",
        hint=f"fix it with `nats stream edit {stream}` (or delete it and run `keel fleet init`)",
    )


def _runs_config(replicas: int) -> Any:
    from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig

    return StreamConfig(
        name=streams.RUNS_STREAM,
        description="keel run journals: one message per subject, fenced appends",
        subjects=[f"{streams.RUNS_PREFIX}.>"],
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        max_msgs_per_subject=1,
        discard=DiscardPolicy.NEW,
        discard_new_per_subject=True,
        max_age=0,
        duplicate_window=DUPLICATE_WINDOW,
        num_replicas=replicas,
        allow_direct=True,
    )


def _queue_config(replicas: int) -> Any:
    from nats.js.api import RetentionPolicy, StorageType, StreamConfig

    return StreamConfig(
        name=streams.QUEUE_STREAM,
        description="keel run requests (work queue)",
        subjects=[f"{streams.QUEUE_SUBJECT.rsplit('.', 1)[0]}.>"],
        retention=RetentionPolicy.WORK_QUEUE,
        storage=StorageType.FILE,
        num_replicas=replicas,
    )


def _check_common(name: str, config: Any, want: Any, replicas: int, notes: list[str]) -> None:
    from nats.js.api import StorageType

    subjects = list(config.subjects or [])
    if want.subjects[0] not in subjects:
        raise _wrong(name, "subjects", subjects, f"[{want.subjects[0]!r}]")
    if config.retention != want.retention:
        raise _wrong(name, "retention", _value(config.retention), _value(want.retention))
    if config.storage != StorageType.FILE:
        # Memory storage loses every journal when the server restarts.
        raise _wrong(name, "storage", _value(config.storage), "file")
    if (config.num_replicas or 1) != replicas:
        notes.append(f"stream {name} has {config.num_replicas or 1} replica(s), not {replicas}")


def _value(setting: Any) -> str:
    return str(getattr(setting, "value", setting))


def _check_runs(config: Any, replicas: int, notes: list[str]) -> None:
    from nats.js.api import DiscardPolicy

    name = streams.RUNS_STREAM
    want = _runs_config(replicas)
    _check_common(name, config, want, replicas, notes)
    if config.max_msgs_per_subject != 1:
        raise _wrong(name, "max_msgs_per_subject", config.max_msgs_per_subject, 1)
    if config.discard != DiscardPolicy.NEW:
        raise _wrong(name, "discard", _value(config.discard), "new")
    if not config.discard_new_per_subject:
        raise _wrong(name, "discard_new_per_subject", False, True)
    if config.max_age:
        # A max age deletes journals of runs that are still waiting or resumable.
        raise _wrong(name, "max_age", f"{config.max_age:g} s", "0 (none)")
    if (config.duplicate_window or 0) < DUPLICATE_WINDOW:
        notes.append(
            f"stream {name} has a duplicate window of {config.duplicate_window or 0:g} s; keel "
            f"uses {DUPLICATE_WINDOW:g} s (retried appends are still safe: they are fenced)"
        )


def _check_queue(config: Any, replicas: int, notes: list[str]) -> None:
    _check_common(streams.QUEUE_STREAM, config, _queue_config(replicas), replicas, notes)


async def _stream(
    js: JetStreamContext, config: Any, check: Any, replicas: int, create: bool
) -> list[str]:
    from nats.js.errors import APIError, NotFoundError

    notes: list[str] = []
    name = config.name
    try:
        info = await js.stream_info(name)
    except NotFoundError:
        if not create:
            raise FleetError(f"stream {name} does not exist", hint=INIT_HINT) from None
        try:
            await js.add_stream(config)
        except APIError as exc:
            if _placing(exc):
                raise  # a cluster still forming: `_patiently` asks again
            raise FleetError(
                f"cannot create stream {name}: {exc.description or exc}",
                hint="another stream may already hold these subjects; `nats stream ls` shows them",
            ) from None
        notes.append(f"created stream {name} ({replicas} replica(s))")
        if replicas > 1:
            await _leader(js, name)
        return notes
    check(info.config, replicas, notes)
    if create and (info.config.num_replicas or 1) != replicas:
        info.config.num_replicas = replicas
        try:
            await js.update_stream(info.config)
        except APIError as exc:
            if _placing(exc):
                raise
            raise FleetError(
                f"cannot change stream {name} to {replicas} replica(s): {exc.description or exc}",
                hint="a cluster needs at least as many JetStream servers as replicas",
            ) from None
        notes = [f"stream {name}: replicas set to {replicas}"]
    return notes


def _placing(exc: Exception) -> bool:
    """Whether JetStream refused to place a replicated stream because a peer is offline: in a
    cluster that has just started, its servers' routes come up a moment after the servers do,
    so the same request succeeds shortly after."""
    return "peer offline" in str(getattr(exc, "description", "") or "")


async def _patiently(step: Callable[[], Awaitable[list[str]]], wait: float = 30.0) -> list[str]:
    """`step()`, again while JetStream answers "not now" (a fresh cluster still electing its
    meta leader, its peers still connecting, a stream's group forming): creating the same
    stream or bucket twice is a no-op, so a request that timed out after it took effect is safe
    to repeat."""
    import asyncio
    import time

    from nats.errors import TimeoutError as NatsTimeout
    from nats.js.errors import APIError, ServiceUnavailableError

    deadline = time.monotonic() + wait
    while True:
        try:
            return await step()
        except (NatsTimeout, TimeoutError, ServiceUnavailableError):
            if time.monotonic() > deadline:
                raise
        except APIError as exc:
            if not _placing(exc):
                raise
            if time.monotonic() > deadline:
                raise FleetError(
                    f"cannot place the fleet's streams: {exc.description} (for {wait:g} s)",
                    hint="a cluster needs as many JetStream servers up as --replicas; "
                    "`nats server report jetstream` shows them",
                ) from None
        await asyncio.sleep(0.5)


async def _leader(js: JetStreamContext, name: str, wait: float = 15.0) -> bool:
    """A new replicated stream has no leader for a moment, and refuses publishes until it does:
    True once it has one, False after `wait` s without."""
    import asyncio
    import time

    from nats.errors import Error as NatsError
    from nats.js.errors import APIError

    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            info = await js.stream_info(name)
        except (NatsError, APIError, TimeoutError):
            info = None  # not answering yet, while the group forms: ask again
        if info is not None and (info.cluster is None or info.cluster.leader):
            return True
        await asyncio.sleep(0.1)
    return False


#: The fleet's KV buckets: (name, TTL in seconds (0: none), description).
BUCKETS = (
    (streams.KV_BUCKET, 0.0, "keel run summaries"),
    (streams.WORKERS_BUCKET, streams.WORKERS_TTL, "keel live workers (heartbeats)"),
    (streams.SCHEDULES_BUCKET, 0.0, "keel scheduled and recurring runs"),
)


async def _bucket(
    js: JetStreamContext, bucket: str, ttl: float, description: str, replicas: int, create: bool
) -> list[str]:
    from nats.js.errors import APIError, BucketNotFoundError, NotFoundError

    try:
        kv = await js.key_value(bucket)
    except (BucketNotFoundError, NotFoundError):
        if not create:
            raise FleetError(f"KV bucket {bucket} does not exist", hint=INIT_HINT) from None
        try:
            await js.create_key_value(
                bucket=bucket,
                history=1,
                ttl=ttl or None,
                replicas=replicas,
                description=description,
            )
        except APIError as exc:
            if _placing(exc):
                raise
            raise FleetError(
                f"cannot create KV bucket {bucket}: {exc.description or exc}", hint=INIT_HINT
            ) from None
        if replicas > 1:
            # A new replicated bucket refuses puts until its stream has a leader, as a stream
            # does: `keel fleet init` returns only once every one can be written.
            await _leader(js, f"KV_{bucket}")
        return [f"created KV bucket {bucket} ({replicas} replica(s))"]
    status = await kv.status()
    notes: list[str] = []
    if status.ttl and not ttl:
        # Summaries, answers, cancel flags and schedules would expire while they are needed.
        raise _wrong(f"KV_{bucket} (KV bucket {bucket})", "a TTL of", f"{status.ttl:g} s", "none")
    config = status.stream_info.config
    have = config.num_replicas or 1
    if have != replicas and create:
        config.num_replicas = replicas
        try:
            await js.update_stream(config)
        except APIError as exc:
            if _placing(exc):
                raise
            raise FleetError(
                f"cannot change KV bucket {bucket} to {replicas} replica(s): "
                f"{exc.description or exc}",
                hint="a cluster needs at least as many JetStream servers as replicas",
            ) from None
        notes.append(f"KV bucket {bucket}: replicas set to {replicas}")
    elif have != replicas:
        notes.append(f"KV bucket {bucket} has {have} replica(s), not {replicas}")
    return notes


async def ensure_bucket(js: JetStreamContext, bucket: str, *, replicas: int = 1) -> list[str]:
    """Create one of the fleet's KV buckets (BUCKETS) if it is missing, as `keel fleet init`
    would: a worker on a fleet made before the bucket existed makes it itself."""
    for name, ttl, description in BUCKETS:
        if name == bucket:
            return await _bucket(js, name, ttl, description, replicas, True)
    raise ValueError(f"{bucket} is not one of the fleet's buckets")


async def ensure_streams(
    js: JetStreamContext, *, replicas: int = 1, create: bool = True
) -> list[str]:
    """Create (or with `create=False` only check) `KEEL_RUNS`, `KEEL_QUEUE` and the KV buckets
    (BUCKETS). Returns notes (what was created or differs harmlessly); a wrong shape raises
    `FleetError` naming the setting and the fix."""
    from nats.errors import Error as NatsError
    from nats.errors import NoRespondersError, TimeoutError
    from nats.js.errors import APIError, NoStreamResponseError, ServiceUnavailableError

    if replicas < 1:
        raise FleetError(
            f"replicas must be at least 1, not {replicas}", hint="--replicas 1, 3 or 5"
        )
    try:
        notes = await _patiently(
            lambda: _stream(js, _runs_config(replicas), _check_runs, replicas, create)
        )
        notes += await _patiently(
            lambda: _stream(js, _queue_config(replicas), _check_queue, replicas, create)
        )
        for bucket, ttl, description in BUCKETS:
            notes += await _patiently(
                functools.partial(_bucket, js, bucket, ttl, description, replicas, create)
            )
        if create:
            # Every stream and bucket can be written once this returns: a replicated one whose
            # group is still electing (new, raised, or a node just lost) is waited for.
            names = [streams.RUNS_STREAM, streams.QUEUE_STREAM, *(f"KV_{b}" for b, *_ in BUCKETS)]
            for name in names:
                if not await _leader(js, name):
                    raise FleetError(
                        f"stream {name} has no leader after 15 s",
                        hint="are enough of the cluster's JetStream servers up? "
                        "`nats server report jetstream` shows them",
                    )
    except (NoRespondersError, NoStreamResponseError, ServiceUnavailableError):
        raise FleetError(
            "the NATS server has no JetStream",
            hint="start nats-server with -js (`keel fleet up` does)",
        ) from None
    except TimeoutError:
        raise FleetError(
            "the NATS server did not answer a JetStream request in time",
            hint="is JetStream enabled and has the cluster a leader? `nats server report jetstream`",
        ) from None
    except APIError as exc:
        raise FleetError(f"JetStream refused: {exc.description or exc}", hint=INIT_HINT) from None
    except NatsError as exc:
        raise FleetError(f"NATS error: {exc}", hint="check the server and the connection") from None
    return notes


def ensure_streams_sync(bridge: Bridge, *, replicas: int = 1, create: bool = True) -> list[str]:
    """`ensure_streams` for callers that are not async, on the bridge's loop."""
    return bridge.call(ensure_streams(bridge.js, replicas=replicas, create=create))
