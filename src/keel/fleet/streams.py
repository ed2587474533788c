"""The fleet's JetStream layout: names, subjects and stream settings, in one place.

- `KEEL_RUNS` (subjects `keel.run.>`): run journals. A run's meta at `keel.run.<run>._meta`,
  record n at `keel.run.<run>.<n>`; one message per subject, discard-new per subject, no max age.
  Every append is fenced with `Nats-Expected-Last-Subject-Sequence` (the stream sequence of the
  run's last message) over `keel.run.<run>.*` and carries `Nats-Msg-Id` `<run>-<n>`.
- `KEEL_QUEUE` (subjects `keel.queue.>`): the work queue of run requests (work-queue retention);
  workers pull through the shared durable consumer `workers`.
- KV bucket `keel-runs`: one summary per run (`<run>`), its answers (`<run>.answer.<request>`)
  and its cancel flag (`<run>.cancel`).
- Core subject `keel.control.<run>`: a nudge to the worker running it (cancel), best effort; the
  KV flag is what counts.
- KV bucket `keel-workers`: one entry per live worker (`<worker key>`), rewritten at every
  heartbeat; entries expire WORKERS_TTL seconds after a worker's last beat.
- KV bucket `keel-schedules`: scheduled and recurring runs (`<schedule id>`), fired by whichever
  worker wins the compare-and-swap on the entry.
- Core subject `keel.events.<run>`: a run's state changes that a person may act on (parked,
  finished), as JSON; best effort (the KV summary is what counts).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

RUNS_STREAM = "KEEL_RUNS"
RUNS_PREFIX = "keel.run"
QUEUE_STREAM = "KEEL_QUEUE"
QUEUE_SUBJECT = "keel.queue.runs"
CONSUMER = "workers"
KV_BUCKET = "keel-runs"
CONTROL_PREFIX = "keel.control"
WORKERS_BUCKET = "keel-workers"
SCHEDULES_BUCKET = "keel-schedules"
EVENTS_PREFIX = "keel.events"
#: Seconds a worker's registry entry outlives its last heartbeat.
WORKERS_TTL = 60.0

#: How long a delivered run may go without a heartbeat before it goes to another worker: a dead
#: worker's run is taken again 6 to 8 s after it died (`KEEL_FLEET_ACK_WAIT` seconds overrides
#: it: a shorter wait moves a dead worker's runs sooner, at the price of more heartbeats and of
#: a takeover of a worker whose loop stalls that long).
ACK_WAIT = 8.0
#: Heartbeats (in-progress acks) per ACK_WAIT while a run is active: one every 2 s by default.
BEATS_PER_WAIT = 4
#: Seconds between a worker's registry entries (`keel-workers`).
WORKER_BEAT = 2.0
#: A registry entry older than this many seconds is a silent worker (three missed beats).
WORKER_SILENT = 3 * WORKER_BEAT + 1.0


def ack_wait(env: Mapping[str, str]) -> float:
    try:
        value = float(env.get("KEEL_FLEET_ACK_WAIT", "") or ACK_WAIT)
    except ValueError:
        value = ACK_WAIT
    return value if 1.0 <= value <= 3600.0 else ACK_WAIT


_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")


def check_run_id(run_id: str) -> str:
    """A run id is a session id: no dots, stars or `>` (they would change the subject)."""
    from keel.errors import UserError

    if not _RUN_ID.match(run_id):
        raise UserError(
            f"{run_id!r} is not a run id", hint="`keel runs list` shows the runs and their ids"
        )
    return run_id


def worker_key(name: str) -> str:
    """A worker's key in `keel-workers`: its name with every character outside [A-Za-z0-9_-]
    made `_` (a KV key may not hold dots, stars, `>` or spaces)."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", name) or "_"


def run_subject(run_id: str, seq: int | str) -> str:
    return f"{RUNS_PREFIX}.{run_id}.{seq}"


def meta_subject(run_id: str) -> str:
    return f"{RUNS_PREFIX}.{run_id}._meta"


def run_filter(run_id: str) -> str:
    return f"{RUNS_PREFIX}.{run_id}.*"
