"""What a person watching the fleet sees: every run's summary in one pass, the listing's filters
and pages, each run's status changes as they happen, the events and webhooks for the changes a
person may act on (a run parked, a run over), and the fleet's numbers in Prometheus text.

Summaries are read through KV watches on `keel-runs` (the latest value of every key in one
pass, then live changes), never one read per run; the watch's subject `$KV.keel-runs.*` takes
only keys without a dot, so answers and cancel flags never travel. This module never writes a
summary (`keel.fleet.runs.Fleet.put_summary` does, and calls `event` here) and imports nats-py
and keel's HTTP client only inside functions.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from keel.errors import UserError
from keel.fleet import streams
from keel.fleet.connect import FleetError
from keel.frozen import mutable

if TYPE_CHECKING:
    from nats.js.kv import KeyValue

#: Every status a summary can hold: first those of a run that is not over (`ACTIVE`), then the
#: ends (`keel.agent.loop`'s terminal reasons, `cancelled`, and `failed` for a run stopped after
#: its attempt limit).
STATUSES = (
    "queued",
    "running",
    "parked",
    "completed",
    "failed",
    "error",
    "cancelled",
    "interrupted",
    "max_turns",
    "budget",
    "loop",
    "blocked",
    "refusal",
    "max_tokens",
    "hook_stopped",
    "unknown_outcome",
    "empty_response",
    "context_full",
    "unrun_tool_call",
    "suspended",
)
#: Statuses of a run that is not over (`keel.fleet.runs.ACTIVE`).
ACTIVE = STATUSES[:3]
#: The word `--status` takes for every run that is not over.
ACTIVE_WORD = "active"
#: Characters of a run's final answer an event carries.
EVENT_TEXT = 2000
#: Seconds a webhook POST may take, and how many times it is tried.
WEBHOOK_TIMEOUT = 5.0
WEBHOOK_TRIES = 2
#: Seconds to wait for the next value while a watch delivers what is stored.
READ_WAIT = 10.0


def decode(raw: bytes | None) -> dict[str, Any] | None:
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def order_key(summary: dict[str, Any]) -> tuple[str, str]:
    return (str(summary.get("submitted", "")), str(summary.get("id", "")))


def newest_first(summaries: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(summaries, key=order_key, reverse=True)


# -- reading ----------------------------------------------------------------------------------------


class SummaryWatch:
    """A KV watch on every run's summary: `start` returns what is stored (one pass), then
    `next` each change as it is written. Deleted runs drop out."""

    def __init__(self, kv: KeyValue) -> None:
        self.kv = kv
        self.known: dict[str, dict[str, Any]] = {}
        self._watcher: Any = None

    async def start(self) -> list[dict[str, Any]]:
        import nats.errors

        self._watcher = await self.kv.watch("*")
        while True:
            try:
                entry = await self._watcher.updates(timeout=READ_WAIT)
            except nats.errors.TimeoutError:
                await self.stop()
                raise FleetError(
                    f"the fleet's bucket {streams.KV_BUCKET} stopped answering while it was read",
                    hint="try again; `keel fleet status` shows the server",
                ) from None
            if entry is None:  # the marker: everything stored has been delivered
                return newest_first(self.known.values())
            self._take(entry)

    async def next(self) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        """The next change: (the run's summary before, after); waits for one (bound it with
        `asyncio.timeout`). `EOFError` once the watch was stopped."""
        assert self._watcher is not None, "start() first"
        while True:
            entry = await self._watcher.updates(timeout=None)
            if entry is None:
                continue
            if not hasattr(entry, "key"):  # the watch was stopped
                raise EOFError("the watch was stopped")
            before = self.known.get(entry.key)
            after = self._take(entry)
            if after is not None:
                return before, after

    def _take(self, entry: Any) -> dict[str, Any] | None:
        value = None if entry.operation in ("DEL", "PURGE") else decode(entry.value)
        if value is None:
            self.known.pop(entry.key, None)
            return None
        value.setdefault("id", entry.key)
        self.known[entry.key] = value
        return value

    async def stop(self) -> None:
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            try:
                await watcher.stop()
            except Exception as exc:  # the connection went first: nothing left to stop
                if not _nats_error(exc):
                    raise


async def read_summaries(kv: KeyValue) -> list[dict[str, Any]]:
    """Every run's summary, newest first, in one pass over the bucket."""
    watch = SummaryWatch(kv)
    try:
        return await watch.start()
    finally:
        await watch.stop()


async def bucket_entries(kv: Any, *, wait: float = 5.0) -> list[Any]:
    """The entries a KV bucket holds now that have a value (deletes left out), from one watch
    of every key: what listing workers and schedules reads instead of a get per key."""
    watcher = await kv.watchall(ignore_deletes=True)
    out: list[Any] = []
    try:
        while True:
            entry = await watcher.updates(timeout=wait)
            if entry is None:  # the end of what the bucket holds now
                return out
            if entry.value:
                out.append(entry)
    finally:
        await watcher.stop()


# -- the listing ------------------------------------------------------------------------------------


def parse_statuses(values: Iterable[str]) -> frozenset[str] | None:
    """`--status` values (repeated, or comma lists) as a set of statuses; `active` is every
    status of a run that is not over. None: no filter."""
    words = [w.strip().lower() for v in values for w in v.split(",") if w.strip()]
    if not words:
        return None
    out: set[str] = set()
    for word in words:
        if word == ACTIVE_WORD:
            out.update(ACTIVE)
        elif word in STATUSES:
            out.add(word)
        else:
            raise UserError(
                f"{word!r} is not a run status",
                hint=f"statuses: {ACTIVE_WORD} ({', '.join(ACTIVE)}), "
                + ", ".join(STATUSES[len(ACTIVE) :]),
            )
    return frozenset(out)


@mutable
class Page:
    """One page of the listing: `runs`, newest first; `skipped` matching runs before it,
    `more` after it; `total` matching runs in all."""

    runs: list[dict[str, Any]] = field(default_factory=list)
    total: int = 0
    skipped: int = 0

    @property
    def more(self) -> int:
        return self.total - self.skipped - len(self.runs)


def select(
    summaries: list[dict[str, Any]],
    *,
    statuses: frozenset[str] | None = None,
    limit: int | None = None,
    page: int = 1,
    after: str | None = None,
) -> Page:
    """The page of `summaries` (newest first) a listing shows: those with a status in
    `statuses`; `limit` of them (None: all), from page `page` (1 is the newest) or from just
    after run `after` (an id or a unique prefix, as in the listing's footer)."""
    ordered = newest_first(summaries)
    matching = [s for s in ordered if statuses is None or s.get("status") in statuses]
    start = 0
    if after:
        found = [s for s in ordered if str(s.get("id", "")).startswith(after)]
        exact = [s for s in found if s.get("id") == after]
        if not found or (len(found) > 1 and not exact):
            raise UserError(
                f"--after {after!r} names {'no run' if not found else 'several runs'}",
                hint="give the id the listing's footer names",
            )
        mark = order_key((exact or found)[0])
        start = sum(1 for s in matching if order_key(s) >= mark)
    elif limit is not None:
        start = (page - 1) * limit
    shown = matching[start:] if limit is None else matching[start : start + limit]
    return Page(shown, len(matching), min(start, len(matching)))


def status_text(summary: dict[str, Any]) -> str:
    """The STATUS column: the status word, and what a parked run waits for."""
    status = str(summary.get("status", "?"))
    waits = summary.get("waits_on") or {}
    if status == "parked" and waits:
        return f"parked: waits for {waits.get('waits_for')} on {waits.get('tool')}"
    return status


def reason_text(summary: dict[str, Any]) -> str:
    """The REASON column: why the run is where it is, one line: a parked run's request id (what
    `keel runs answer` takes) and question, else the run's error or the note on it."""
    waits = summary.get("waits_on") or {}
    if summary.get("status") == "parked" and waits:
        question = _first_line(waits.get("question"))
        return f"{waits.get('request')}" + (f": {question}" if question else "")
    for value in (summary.get("error"), summary.get("reason"), summary.get("note")):
        if line := _first_line(value):
            return line
    return ""


def _first_line(value: Any) -> str:
    lines = str(value or "").strip().splitlines()
    return lines[0].strip() if lines else ""


def _cut(text: str, room: int) -> str:
    if len(text) <= room:
        return text
    return text[: room - 1] + "…" if room > 1 else ""


#: The widest PROMPT column of the listing, and the narrowest shown (less: no PROMPT column).
PROMPT_WIDTH = (30, 8)


def table(summaries: list[dict[str, Any]], width: int = 80) -> str:
    """The runs as a table for a terminal `width` columns wide: RUN, STATUS, TURNS, COST, then
    PROMPT and REASON cut to share what is left (PROMPT goes first when there is little). A
    parked run's request id is never cut: it is what `keel runs answer` takes."""
    if not summaries:
        return "no runs"
    rows = []
    keep = []  # how much of each row's reason is never cut
    for s in summaries:
        cost = s.get("cost")
        reason = reason_text(s)
        waits = s.get("waits_on") or {}
        keep.append(len(str(waits.get("request"))) if s.get("status") == "parked" and waits else 0)
        rows.append(
            (
                str(s.get("id", "")),
                status_text(s),
                str(s.get("turns", "") or ""),
                "" if not isinstance(cost, int | float) else f"${cost:.4f}",
                " ".join(str(s.get("last_prompt", "")).split()),
                reason,
            )
        )
    head = ("RUN", "STATUS", "TURNS", "COST", "PROMPT", "REASON")
    w = [max(len(r[i]) for r in (head, *rows)) for i in range(5)]
    rest = width - (w[0] + w[1] + w[2] + w[3] + 8)
    widest, narrowest = PROMPT_WIDTH
    w_prompt = min(w[4], widest, max(rest // 3, rest - 40))
    if w_prompt < narrowest:
        w_prompt = 0
    room = rest - (w_prompt + 2 if w_prompt else 0)
    lines = []
    for r, kept in zip((head, *rows), (len(head[5]), *keep), strict=True):
        line = f"{r[0]:<{w[0]}}  {r[1]:<{w[1]}}  {r[2]:>{w[2]}}  {r[3]:>{w[3]}}  "
        if w_prompt:
            line += f"{_cut(r[4], w_prompt):<{w_prompt}}  "
        lines.append(
            (line + _cut(r[5], max(room, kept + 2 if kept < len(r[5]) else kept))).rstrip()
        )
    return "\n".join(lines)


def footer(page: Page) -> str:
    if not page.total:
        return ""
    first, last = page.skipped + 1, page.skipped + len(page.runs)
    shown = f"runs {first}–{last} of {page.total}" if page.runs else f"0 of {page.total} runs"
    if page.more <= 0:
        return shown
    tail = str(page.runs[-1].get("id", "")) if page.runs else ""
    hint = f" (--after {tail}, or --all)" if tail else " (--all)"
    return f"{shown}; {page.more} more{hint}"


# -- changes and events -----------------------------------------------------------------------------


def change(before: dict[str, Any] | None, after: dict[str, Any]) -> dict[str, Any] | None:
    """A run's status change as one JSON object (None when the status did not change):
    `run`, `status`, `previous` (None for a new run), `at`, and `waits_on` (parked) and
    `error` when there are."""
    old = before.get("status") if before else None
    new = after.get("status")
    if old == new:
        return None
    out: dict[str, Any] = {
        "run": after.get("id"),
        "status": new,
        "previous": old,
        "at": after.get("updated") or stamp(),
    }
    if new == "parked" and after.get("waits_on"):
        out["waits_on"] = after["waits_on"]
    if after.get("error"):
        out["error"] = str(after["error"])
    return out


def notable(status: Any) -> bool:
    """A status a person may act on: the run parked, or it is over."""
    return status == "parked" or (isinstance(status, str) and status not in ACTIVE)


def event(before: dict[str, Any] | None, after: dict[str, Any]) -> dict[str, Any] | None:
    """The event of `keel.events.<run>` (and the webhook's body) for this change, or None:
    published when a run parks or ends, with the first EVENT_TEXT characters of its answer."""
    out = change(before, after)
    if out is None or not notable(out["status"]):
        return None
    text = after.get("text")
    if out["status"] != "parked" and isinstance(text, str) and text:
        out["text"] = text[:EVENT_TEXT]
    return out


def change_line(item: dict[str, Any]) -> str:
    """`--watch`'s line for a change: time, run, old → new status, what a parked run waits on."""
    at = str(item.get("at", ""))
    when = at[11:19] if len(at) >= 19 else time.strftime("%H:%M:%S")
    line = f"{when}  {item.get('run')}  {item.get('previous') or '(new)'} → {item.get('status')}"
    waits = item.get("waits_on")
    if isinstance(waits, dict) and waits:
        line += (
            f": waits for {waits.get('waits_for')} on {waits.get('tool')} ({waits.get('request')})"
        )
    elif item.get("error"):
        line += f": {str(item['error']).strip().splitlines()[0][:200]}"
    return line


def check_notify_url(url: str) -> str:
    """A webhook URL as `--notify` takes it: http or https, with a host."""
    try:
        parts = urlsplit(url)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname)
        _ = parts.port  # a port that is not a number raises
    except ValueError:
        ok = False
    if not ok:
        raise UserError(
            f"--notify {url!r} is not an http or https URL",
            hint="--notify https://HOST/PATH (the run's events are POSTed there as JSON)",
        )
    return url


async def post_webhook(url: str, body: dict[str, Any], say: Callable[[str], None]) -> bool:
    """POST `body` as JSON to `url`: WEBHOOK_TIMEOUT seconds a try, WEBHOOK_TRIES tries; a
    failure is said, never raised (a webhook never fails a run)."""
    from keel.llm import h1
    from keel.llm.http import shared_ssl_context

    data = json.dumps(body, separators=(",", ":")).encode()
    problem = ""
    for attempt in range(WEBHOOK_TRIES):
        # A client per try: a webhook is rare, and a retry should not reuse what failed.
        client = h1.Client(
            tls=shared_ssl_context, connect_timeout=WEBHOOK_TIMEOUT, stall_timeout=None
        )
        try:
            async with asyncio.timeout(WEBHOOK_TIMEOUT):
                response = await client.post(url, data, {"content-type": "application/json"})
                try:
                    await response.read()
                finally:
                    response.release()
            if response.status < 300:
                return True
            problem = f"HTTP {response.status}"
        except (h1.TransportError, TimeoutError, OSError) as exc:
            problem = f"{type(exc).__name__}: {exc}".strip().rstrip(":")
        finally:
            await client.close()
        if attempt + 1 < WEBHOOK_TRIES:
            await asyncio.sleep(1.0)
    say(
        f"run {body.get('run')}: the webhook {_shown(url)} failed ({problem}) for "
        f"{body.get('status')}; the run goes on"
    )
    return False


def _shown(url: str) -> str:
    """`url` without its query and credentials (a webhook's secret often lives there)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


# -- metrics ----------------------------------------------------------------------------------------


def metrics(
    *,
    queue: tuple[int, int],
    summaries: list[dict[str, Any]],
    workers: int | None,
) -> str:
    """The fleet in Prometheus text format 0.0.4."""
    by_status: dict[str, int] = dict.fromkeys(ACTIVE, 0)
    pickups: list[float] = []
    attempts = 0
    for s in summaries:
        status = str(s.get("status", "unknown"))
        by_status[status] = by_status.get(status, 0) + 1
        attempts += _whole(s.get("attempts"))
        for value in _numbers(s.get("pickup_s")):
            pickups.append(value)
    out: list[str] = []

    def family(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
        out.append(f"# HELP {name} {help_text}")
        out.append(f"# TYPE {name} {kind}")
        out.extend(f"{sample} {_number(value)}" for sample, value in samples)

    family(
        "keel_fleet_queue_messages",
        "gauge",
        "Run requests on the work queue (waiting or in flight).",
        [("keel_fleet_queue_messages", queue[0])],
    )
    family(
        "keel_fleet_queue_in_flight",
        "gauge",
        "Run requests delivered to a worker and not yet acked.",
        [("keel_fleet_queue_in_flight", queue[1])],
    )
    family(
        "keel_fleet_runs",
        "gauge",
        "Runs by status (their summaries in the keel-runs bucket).",
        [(f'keel_fleet_runs{{status="{_label(k)}"}}', v) for k, v in sorted(by_status.items())],
    )
    family(
        "keel_fleet_workers",
        "gauge",
        "Live workers: entries in the keel-workers bucket with a recent heartbeat.",
        [("keel_fleet_workers", workers or 0)],
    )
    family(
        "keel_fleet_pickup_seconds",
        "summary",
        "Seconds from a worker's death to another worker resuming its run.",
        [
            ("keel_fleet_pickup_seconds_count", len(pickups)),
            ("keel_fleet_pickup_seconds_sum", sum(pickups)),
        ],
    )
    family(
        "keel_fleet_attempts_total",
        "counter",
        "Deliveries of runs to workers, summed over the runs (repeats show as more than one a "
        "run).",
        [("keel_fleet_attempts_total", attempts)],
    )
    return "\n".join(out) + "\n"


def _whole(value: Any) -> int:
    return int(value) if isinstance(value, int | float) and math.isfinite(value) else 0


def _numbers(value: Any) -> list[float]:
    """`pickup_s` as a list: one number, or a list of them (one per takeover)."""
    items = value if isinstance(value, list) else [value]
    return [
        float(v)
        for v in items
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    ]


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def stamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _nats_error(exc: BaseException) -> bool:
    import sys

    errors = sys.modules.get("nats.errors")
    return errors is not None and isinstance(exc, errors.Error)
