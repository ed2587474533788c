"""Queue routes (a run's priority and the worker labels it needs) and reading the queue by them.

A run request's subject names its route: `keel.queue.runs` for a normal run that needs no label
(the subject every keel before routes used, so old messages and old workers keep working), else
`keel.queue.runs.<priority>.<needs>`, the needs sorted and joined by `+`, or `any`. The queue is
a work-queue stream, whose consumers may not overlap: each route has its own durable consumer,
filtered to exactly its subject and named after it (`workers` for the default route, else
`workers-<priority>-<needs>`), made by whichever worker first needs it.

`QueueReader` is how a worker takes its next run: one stream-info request says which routes hold
messages; it keeps those whose needs are among its labels and fetches from the highest priority
first; with nothing there it waits up to a second on the default route (so an idle worker asks
the server about once a second, and picks up a new run within about a second). Every consumer it
binds gets the settings keel relies on (explicit acks, the worker's ack wait, no delivery limit,
no limit on unacknowledged runs); a consumer found with another ack wait is changed to this
worker's, and the worker says so once.

It never imports nats-py at import time.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from keel.errors import UserError
from keel.fleet import streams

if TYPE_CHECKING:
    from nats.aio.msg import Msg
    from nats.js.client import JetStreamContext

#: Priorities, highest first.
PRIORITIES = ("high", "normal", "low")
DEFAULT_PRIORITY = "normal"
#: The needs token of a route that needs no label (so no label may be called that).
NO_NEEDS = "any"
#: Labels a run may need and a worker may offer.
LABEL = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")
#: Labels one run may need.
MAX_NEEDS = 8
#: Seconds an idle worker waits on the default route before it looks at every route again.
IDLE_WAIT = 1.0
#: Seconds a fetch from a route that had messages waits (they may all be another worker's now,
#: in flight): long enough that a loaded server's answer is not missed, so a higher priority is
#: not passed over for a slow round trip.
ROUTE_WAIT = 0.5


def check_priority(value: str | None) -> str:
    """A run's priority: `value` (high, normal or low), normal when empty."""
    priority = (value or DEFAULT_PRIORITY).strip().lower()
    if priority not in PRIORITIES:
        raise UserError(f"{value!r} is not a priority", hint=f"give one of {', '.join(PRIORITIES)}")
    return priority


def check_labels(values: Iterable[str], *, what: str = "label") -> list[str]:
    """Labels as given (a list, or items holding comma lists), checked, sorted, deduplicated."""
    labels: set[str] = set()
    for value in values:
        for part in str(value).split(","):
            label = part.strip().lower()
            if not label:
                continue
            if label == NO_NEEDS:
                raise UserError(
                    f"{what} {label!r} is reserved (a run that needs no label)",
                    hint="name the label after what the worker has: gpu, python, arm64",
                )
            if not LABEL.match(label):
                raise UserError(
                    f"{part.strip()!r} is not a {what}",
                    hint="a label is 1 to 32 of a-z, 0-9, - and _, starting with a letter or digit",
                )
            labels.add(label)
    if what == "need" and len(labels) > MAX_NEEDS:
        raise UserError(
            f"{len(labels)} needs: a run may need at most {MAX_NEEDS} labels",
            hint="a worker label can stand for several things (gpu-large)",
        )
    return sorted(labels)


def parse_labels(text: str, *, what: str = "label") -> list[str]:
    """A comma list of labels (`--labels python,gpu`, `--needs gpu`)."""
    return check_labels([text], what=what)


@dataclass(frozen=True, order=True)
class Route:
    """Where a run request is queued: its priority and the labels it needs (sorted)."""

    priority: str = DEFAULT_PRIORITY
    needs: tuple[str, ...] = ()

    @classmethod
    def of(cls, priority: str | None, needs: Iterable[str] | None) -> Route:
        return cls(check_priority(priority), tuple(check_labels(needs or (), what="need")))

    @classmethod
    def of_request(cls, request: Any) -> Route:
        """The route of a run request, or of a summary's copy of it (a dict): what an answer, a
        cancel or a retry queues the run on. A request from before routes is the default."""
        if isinstance(request, dict):
            priority, needs = request.get("priority"), request.get("needs")
        else:
            priority, needs = getattr(request, "priority", None), getattr(request, "needs", None)
        try:
            return cls.of(priority if isinstance(priority, str) else None, needs or ())
        except UserError:
            return cls()

    @property
    def subject(self) -> str:
        if self.is_default:
            return streams.QUEUE_SUBJECT
        return f"{streams.QUEUE_SUBJECT}.{self.priority}.{'+'.join(self.needs) or NO_NEEDS}"

    @property
    def consumer(self) -> str:
        """The durable consumer of this route (no `.`, `*` or `>`: `+` is allowed)."""
        if self.is_default:
            return streams.CONSUMER
        return f"{streams.CONSUMER}-{self.priority}-{'+'.join(self.needs) or NO_NEEDS}"

    @property
    def is_default(self) -> bool:
        return self.priority == DEFAULT_PRIORITY and not self.needs

    @property
    def rank(self) -> tuple[int, int]:
        """Sort key, lowest first: higher priorities, then routes that need more labels (a
        worker takes first what fewer workers can)."""
        return (PRIORITIES.index(self.priority), -len(self.needs))

    def served_by(self, labels: Iterable[str]) -> bool:
        return set(self.needs) <= set(labels)

    def describe(self) -> str:
        needs = f", needs {','.join(self.needs)}" if self.needs else ""
        return f"{self.priority}{needs}"


def route_of_subject(subject: str) -> Route | None:
    """The route a queue subject names; None for a subject that is no route."""
    if subject == streams.QUEUE_SUBJECT:
        return Route()
    prefix = f"{streams.QUEUE_SUBJECT}."
    if not subject.startswith(prefix):
        return None
    parts = subject[len(prefix) :].split(".")
    if len(parts) != 2 or parts[0] not in PRIORITIES:
        return None
    needs = () if parts[1] == NO_NEEDS else tuple(parts[1].split("+"))
    if any(not LABEL.match(n) or n == NO_NEEDS for n in needs) or list(needs) != sorted(needs):
        return None
    return Route(parts[0], needs)


def consumer_config(route: Route, ack_wait: float) -> Any:
    """The settings of a route's consumer: explicit acks, `ack_wait`, no delivery limit (the
    attempt limit is keel's, in the summary), no limit on runs in flight."""
    from nats.js.api import AckPolicy, ConsumerConfig

    return ConsumerConfig(
        durable_name=route.consumer,
        filter_subject=route.subject,
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=ack_wait,
        max_deliver=-1,
        max_ack_pending=-1,
    )


def _differs(config: Any, route: Route, ack_wait: float) -> list[str]:
    from nats.js.api import AckPolicy

    out = []
    if (config.filter_subject or "") != route.subject:
        # Unfiltered, the default route's consumer would hand any worker every route's runs.
        out.append(f"filter {config.filter_subject or '(none)'} → {route.subject}")
    have = float(config.ack_wait or 0)
    if abs(have - ack_wait) > 0.001:
        out.append(f"ack wait {have:g} s → {ack_wait:g} s")
    if config.ack_policy not in (AckPolicy.EXPLICIT, "explicit"):
        out.append("ack policy → explicit")
    if (config.max_deliver or -1) != -1:
        out.append(f"max deliver {config.max_deliver} → unlimited")
    if (config.max_ack_pending or -1) != -1:
        out.append(f"max ack pending {config.max_ack_pending} → unlimited")
    return out


async def ensure_consumer(
    js: JetStreamContext, route: Route, ack_wait: float
) -> tuple[Any, list[str]]:
    """(consumer info, changes made) for `route`'s consumer: created if missing, its settings
    changed to keel's (the ack wait to `ack_wait`) if they differ."""
    from nats.js.errors import NotFoundError

    try:
        info = await js.consumer_info(streams.QUEUE_STREAM, route.consumer)
    except NotFoundError:
        info = None
    if info is not None:
        changes = _differs(info.config, route, ack_wait)
        if not changes:
            return info, []
    else:
        changes = []
    # Create, or update in place: a durable consumer's ack wait and limits may be edited.
    info = await js.add_consumer(streams.QUEUE_STREAM, consumer_config(route, ack_wait))
    return info, changes


async def waiting_routes(js: JetStreamContext) -> dict[Route, int]:
    """Routes that hold messages (waiting or in flight), with their counts: one request."""
    info = await js.stream_info(streams.QUEUE_STREAM, subjects_filter=f"{streams.QUEUE_SUBJECT}.>")
    # The filter `keel.queue.runs.>` leaves out `keel.queue.runs` itself: count it from the total.
    subjects: dict[str, int] = dict(info.state.subjects or {})
    routed = sum(subjects.values())
    out: dict[Route, int] = {}
    for subject, count in subjects.items():
        route = route_of_subject(subject)
        if route is not None and count:
            out[route] = out.get(route, 0) + int(count)
    default = int(info.state.messages or 0) - routed
    if default > 0:
        out[Route()] = out.get(Route(), 0) + default
    return out


async def in_flight(js: JetStreamContext) -> int:
    """Runs delivered to a worker and not acknowledged yet, over every route's consumer."""
    total = 0
    for consumer in await js.consumers_info(streams.QUEUE_STREAM):
        total += int(consumer.num_ack_pending or 0)
    return total


class QueueReader:
    """A worker's view of the queue: the routes its `labels` serve, highest priority first."""

    def __init__(
        self,
        js: JetStreamContext,
        *,
        labels: Sequence[str] = (),
        ack_wait: float,
        say: Callable[[str], None] = lambda _line: None,
        is_closed: Callable[[], bool] = lambda: False,
    ) -> None:
        self.js = js
        self.labels = tuple(labels)
        self.ack_wait = ack_wait
        self.say = say
        self.is_closed = is_closed
        self._subs: dict[Route, JetStreamContext.PullSubscription] = {}
        self._said: set[str] = set()

    async def start(self) -> float:
        """Bind the default route's consumer (converging its settings); the ack wait that
        rules the heartbeats (the consumer's). `FleetError` when the queue cannot be read."""
        from nats.js.errors import APIError

        from keel.fleet.connect import FleetError

        try:
            await self._sub(Route())
        except APIError as exc:
            raise FleetError(
                f"cannot read the queue {streams.QUEUE_STREAM}: {exc.description or exc}",
                hint="create the fleet's streams with `keel fleet init` (or `keel fleet up`)",
            ) from None
        return self.ack_wait

    async def _sub(self, route: Route) -> JetStreamContext.PullSubscription:
        sub = self._subs.get(route)
        if sub is not None:
            return sub
        info, changes = await ensure_consumer(self.js, route, self.ack_wait)
        if changes and route.consumer not in self._said:
            self._said.add(route.consumer)
            self.say(f"queue consumer {route.consumer}: {', '.join(changes)}")
        self.ack_wait = float(info.config.ack_wait or self.ack_wait)
        sub = await self.js.pull_subscribe_bind(durable=route.consumer, stream=streams.QUEUE_STREAM)
        self._subs[route] = sub
        return sub

    async def next(self) -> Msg | None:
        """The next run request for this worker, or None after about IDLE_WAIT seconds with
        none. NATS trouble (an election, a reconnect) waits a second and returns None; a
        closed connection raises `FleetError`."""
        import nats.errors

        from keel.fleet.connect import FleetError

        try:
            return await self._next()
        except (nats.errors.TimeoutError, TimeoutError):
            return None
        except nats.errors.Error:
            if self.is_closed():
                raise FleetError(
                    "the connection to the fleet's server closed",
                    hint="start the worker again once the server answers",
                ) from None
            # No consumer leader for a moment, the connection reconnecting, a consumer gone (a
            # server that lost its store): bind again next time.
            await self._forget()
            await asyncio.sleep(1.0)
            return None

    async def _next(self) -> Msg | None:
        import nats.errors

        started = time.monotonic()
        for sub in list(self._subs.values()):
            # A run delivered just as an earlier fetch gave up waits here, delivered to this
            # worker: taken first, before its ack wait sends it to another.
            if sub.pending_msgs:
                try:
                    msgs = await sub.fetch(1, timeout=ROUTE_WAIT)
                except (nats.errors.TimeoutError, TimeoutError):
                    continue
                if msgs:
                    return msgs[0]
        routes = await waiting_routes(self.js)
        mine = sorted((r for r in routes if r.served_by(self.labels)), key=lambda r: r.rank)
        for route in mine:
            sub = await self._sub(route)
            try:
                msgs = await sub.fetch(1, timeout=ROUTE_WAIT)
            except (nats.errors.TimeoutError, TimeoutError):
                continue  # all in flight on other workers
            if msgs:
                return msgs[0]
        wait = IDLE_WAIT - (time.monotonic() - started)
        sub = await self._sub(Route())
        msgs = await sub.fetch(1, timeout=max(wait, ROUTE_WAIT))
        return msgs[0] if msgs else None

    async def _forget(self) -> None:
        subs, self._subs = self._subs, {}
        for sub in subs.values():
            try:
                await sub.unsubscribe()
            except Exception:  # the connection is in trouble already; the binding is dropped
                continue

    async def close(self) -> None:
        await self._forget()
