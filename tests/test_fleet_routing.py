"""Queue routes on a real nats-server: priorities taken highest first, a run that needs worker
labels taken only by a worker that has them, answers and cancels queued on the run's own route,
messages on the subject of keel before routes still taken, and the queue consumers' settings
brought to the configured ack wait."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from keel.errors import UserError
from keel.fleet import streams
from keel.fleet.connect import FleetError
from keel.fleet.queues import (
    QueueReader,
    Route,
    check_labels,
    ensure_consumer,
    route_of_subject,
    waiting_routes,
)
from keel.fleet.runs import Fleet, RunRequest
from tests.fleet_helpers import WorkerProc, keel, script, setup_fleet, with_fleet
from tests.nats_fixture import nats_server, nats_url  # noqa: F401

pytestmark = [pytest.mark.needs("nats-server")]


@pytest.fixture
def fleet(nats_url: str) -> str:  # noqa: F811
    setup_fleet(nats_url)
    return nats_url


def test_routes_name_their_subject_and_consumer_and_read_back() -> None:
    assert Route().subject == "keel.queue.runs"  # the subject of keel before routes
    assert Route().consumer == "workers"
    gpu = Route.of("HIGH", ["python", "gpu", "gpu"])
    assert (gpu.subject, gpu.consumer) == (
        "keel.queue.runs.high.gpu+python",
        "workers-high-gpu+python",
    )
    assert Route.of("low", []).subject == "keel.queue.runs.low.any"
    assert Route.of("normal", ["gpu"]).subject == "keel.queue.runs.normal.gpu"
    for route in (Route(), gpu, Route.of("low", []), Route.of("normal", ["gpu"])):
        assert route_of_subject(route.subject) == route
    assert route_of_subject("keel.queue.other") is None
    assert route_of_subject("keel.queue.runs.urgent.any") is None
    # A summary from before routes (no priority, no needs) is on the default route.
    assert Route.of_request({"run": "r", "prompt": "p"}) == Route()
    assert gpu.served_by(["gpu", "python", "arm64"])
    assert not gpu.served_by(["gpu"])
    assert Route().served_by([])


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (["GPU!"], "'GPU!' is not a need"),
        (["any"], "need 'any' is reserved"),
        (["x" * 33], "is not a need"),
        ([",".join(f"l{i}" for i in range(9))], "a run may need at most 8 labels"),
    ],
)
def test_bad_needs_are_refused_with_one_line(given: list[str], message: str) -> None:
    with pytest.raises(UserError) as caught:
        check_labels(given, what="need")
    assert message in caught.value.message
    assert caught.value.hint


def test_keel_submit_and_worker_refuse_bad_labels_and_priorities(fleet: str) -> None:
    bad = keel("submit", "--nats", fleet, "--workspace", "none", "--needs", "gpu,Big GPU", "x")
    assert bad.returncode == 2, bad
    assert "keel: error: 'Big GPU' is not a need (hint: a label is" in bad.stderr, bad
    assert "Traceback" not in bad.stderr
    prio = keel("submit", "--nats", fleet, "--workspace", "none", "--priority", "urgent", "x")
    assert prio.returncode == 2, prio
    assert "invalid choice: 'urgent'" in prio.stderr, prio
    worker = keel("worker", "--nats", fleet, "--labels", "gpu,any")
    assert worker.returncode == 2, worker
    assert "label 'any' is reserved" in worker.stderr, worker


async def _taken(reader: QueueReader, within: float = 15.0) -> Any:
    """The reader's next message: `next()` returns None after an idle second, and a loaded
    machine may take longer than that to answer the first fetch of a new consumer."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        msg = await reader.next()
        if msg is not None:
            return msg
    raise AssertionError(f"no message for the reader within {within:g} s")


def test_a_high_priority_run_submitted_after_ten_normal_ones_is_taken_first(fleet: str) -> None:
    async def body(fleet: Fleet) -> list[str]:
        for i in range(10):
            await fleet.submit(RunRequest(f"normal{i}", "x"))
        await fleet.submit(RunRequest("urgent", "x", priority="high"))
        await fleet.submit(RunRequest("later", "x", priority="low"))
        reader = QueueReader(fleet.js, ack_wait=30)
        await reader.start()
        taken = []
        for _ in range(12):
            msg = await _taken(reader)
            taken.append(RunRequest.from_bytes(msg.data).run)
            await msg.ack_sync()
        assert await reader.next() is None  # drained: an idle wait, then nothing
        await reader.close()
        return taken

    taken = with_fleet(fleet, body)
    assert taken == ["urgent", *(f"normal{i}" for i in range(10)), "later"]


def test_a_run_that_needs_a_label_waits_for_a_worker_that_has_it(fleet: str) -> None:
    async def body(fleet: Fleet) -> None:
        await fleet.submit(RunRequest("needsgpu", "x", needs=["gpu"]))
        await fleet.submit(RunRequest("plain", "x"))
        plain = QueueReader(fleet.js, ack_wait=30)
        gpu = QueueReader(fleet.js, labels=["gpu", "python"], ack_wait=30)
        msg = await _taken(plain)
        assert RunRequest.from_bytes(msg.data).run == "plain"
        await msg.ack_sync()
        # Only the gpu run is left: the unlabelled reader stays idle, the message stays queued.
        assert await plain.next() is None
        assert await waiting_routes(fleet.js) == {Route.of("normal", ["gpu"]): 1}
        msg = await _taken(gpu)
        assert RunRequest.from_bytes(msg.data).run == "needsgpu"
        await msg.ack_sync()
        assert await waiting_routes(fleet.js) == {}
        await plain.close()
        await gpu.close()

    with_fleet(fleet, body)


def test_a_message_on_the_old_subject_is_taken_by_any_worker(fleet: str) -> None:
    async def body(fleet: Fleet) -> None:
        # What a keel before routes queued: no priority, no needs, the bare subject.
        old = json.dumps({"run": "oldrun", "prompt": "x", "why": "start"}).encode()
        await fleet.js.publish(streams.QUEUE_SUBJECT, old)
        reader = QueueReader(fleet.js, labels=["gpu"], ack_wait=30)
        msg = await _taken(reader)
        req = RunRequest.from_bytes(msg.data)
        assert (req.run, req.priority, req.needs) == ("oldrun", "normal", [])
        await msg.ack_sync()
        await reader.close()

    with_fleet(fleet, body)


def test_answers_cancels_and_retries_go_back_to_the_runs_route(fleet: str) -> None:
    async def body(fleet: Fleet) -> dict[str, int]:
        request = RunRequest("routed", "x", priority="low", needs=["gpu"])
        await fleet.submit(request)
        reader = QueueReader(fleet.js, labels=["gpu"], ack_wait=30)
        msg = await _taken(reader)
        await msg.ack_sync()
        # As a worker leaves a parked run: waiting for an answer.
        waits = {"request": "toolu_1", "waits_for": "permission", "tool": "write"}
        await fleet.put_summary("routed", status="parked", waits_on=waits)
        await fleet.answer("routed", "toolu_1", True)
        await fleet.put_summary("routed", status="parked", waits_on=waits)
        await fleet.cancel("routed")
        await fleet.put_summary("routed", status="failed")
        await fleet.retry("routed")
        info = await fleet.js.stream_info(streams.QUEUE_STREAM, subjects_filter="keel.queue.>")
        await reader.close()
        return dict(info.state.subjects or {})

    # Three messages, all on the run's own route: only a gpu worker takes them.
    assert with_fleet(fleet, body) == {"keel.queue.runs.low.gpu": 3}


def test_a_consumer_made_with_another_ack_wait_converges_to_the_configured_one(
    fleet: str,
) -> None:
    said: list[str] = []

    async def body(fleet: Fleet) -> tuple[float, float]:
        from nats.js.api import AckPolicy, ConsumerConfig

        # As a fleet whose first worker ran with the old 30 s default left it.
        await fleet.js.add_consumer(
            streams.QUEUE_STREAM,
            ConsumerConfig(
                durable_name=streams.CONSUMER,
                filter_subject=streams.QUEUE_SUBJECT,
                ack_policy=AckPolicy.EXPLICIT,
                ack_wait=30,
                max_deliver=5,
                max_ack_pending=1000,
            ),
        )
        reader = QueueReader(fleet.js, ack_wait=8, say=said.append)
        used = await reader.start()
        await reader.close()
        again = QueueReader(fleet.js, ack_wait=8, say=said.append)
        await again.start()  # already right: nothing to say
        await again.close()
        info = await fleet.js.consumer_info(streams.QUEUE_STREAM, streams.CONSUMER)
        assert (info.config.max_deliver, info.config.max_ack_pending) == (-1, -1)
        # A route's consumer made on demand gets the same settings.
        routed, changes = await ensure_consumer(fleet.js, Route.of("high", ["gpu"]), 8)
        assert changes == []
        assert routed.config.filter_subject == "keel.queue.runs.high.gpu"
        return used, float(info.config.ack_wait or 0)

    assert with_fleet(fleet, body) == (8.0, 8.0)
    assert said == [
        "queue consumer workers: ack wait 30 s → 8 s, max deliver 5 → unlimited, "
        "max ack pending 1000 → unlimited"
    ]


def test_workers_take_only_what_their_labels_serve_and_an_answer_follows_the_route(
    fleet: str, tmp_path: Path
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    edit = script(
        tmp_path / "edit.json",
        [
            {
                "text": "Writing.",
                "tool_calls": [
                    {
                        "id": "toolu_gpu_1",
                        "name": "write",
                        "input": {"path": "out.txt", "content": "from the gpu worker"},
                    }
                ],
            },
            {"text": "Done."},
        ],
    )
    plain = script(tmp_path / "plain.json", [{"text": "Plain done."}])
    workers = [
        WorkerProc(fleet, tmp_path / "scratch-cpu", "cpu"),
        WorkerProc(fleet, tmp_path / "scratch-gpu", "gpu", labels="gpu,python"),
    ]

    def submit(*args: str) -> str:
        out = keel("submit", "--nats", fleet, *args)
        assert out.returncode == 0, out
        return out.stdout.strip()

    def wait(run: str) -> dict[str, Any]:
        out = keel("runs", "--nats", fleet, "wait", run, "--timeout", "60", "--json", timeout=90)
        assert out.returncode in (0, 1), out
        summary: dict[str, Any] = json.loads(out.stdout)[0]
        return summary

    try:
        # default mode: the write asks, so the run parks; its answer must reach a gpu worker.
        routed = submit(
            "--needs", "gpu", "--model", edit, "--workspace", f"path:{shared}", "write it"
        )
        parked = wait(routed)
        assert (parked["status"], parked["worker"]) == ("parked", "gpu"), parked
        assert parked["request"]["needs"] == ["gpu"]
        plain_runs = [
            submit("--model", plain, "--workspace", "none", f"plain {i}") for i in range(4)
        ]
        answered = keel("runs", "--nats", fleet, "answer", routed, "toolu_gpu_1", "allow")
        assert answered.returncode == 0, answered
        done = wait(routed)
        plain_done = [wait(run) for run in plain_runs]
    finally:
        for w in workers:
            w.terminate()
            w.close()
    assert (done["status"], done["text"], done["worker"]) == ("completed", "Done.", "gpu"), done
    assert (shared / "out.txt").read_text() == "from the gpu worker"
    assert all(s["status"] == "completed" for s in plain_done), plain_done
    # A run that needs nothing goes to either worker.
    assert {s["worker"] for s in plain_done} <= {"cpu", "gpu"}
    assert "labels gpu,python" in workers[1].log(), workers[1].log()


def test_the_http_submit_body_takes_priority_and_needs() -> None:
    from keel.server.fleet_routes import run_request
    from keel.server.host import ApiError

    req = run_request(
        {"prompt": "x", "workspace": "none", "priority": "high", "needs": ["python", "gpu"]}
    )
    assert (req.priority, req.needs) == ("high", ["gpu", "python"])
    assert run_request({"prompt": "x", "workspace": "none", "needs": "gpu"}).needs == ["gpu"]
    plain = run_request({"prompt": "x", "workspace": "none"})
    assert (plain.priority, plain.needs) == ("normal", [])
    with pytest.raises(ApiError) as caught:
        run_request({"prompt": "x", "workspace": "none", "priority": "urgent"})
    assert caught.value.status == 400
    assert "'urgent' is not a priority" in caught.value.error
    with pytest.raises(ApiError) as caught:
        run_request({"prompt": "x", "workspace": "none", "needs": [3]})
    assert "needs must be a list of labels" in caught.value.error


def test_a_worker_on_a_server_without_the_queue_stream_stops_with_one_line(
    nats_url: str,  # noqa: F811
) -> None:
    async def body() -> str:
        from keel.fleet.connect import FleetError, connect

        nc = await connect(nats_url, reconnect=False)
        try:
            with pytest.raises(FleetError) as caught:
                await QueueReader(nc.jetstream(), ack_wait=8).start()
            return caught.value.one_line()
        finally:
            await nc.close()

    line = asyncio.run(body())
    assert line.startswith(f"cannot read the queue {streams.QUEUE_STREAM}: "), line
    assert line.endswith(
        "(hint: create the fleet's streams with `keel fleet init` (or `keel fleet up`))"
    )


def test_a_submit_during_a_stream_election_is_asked_again_and_queued_once(fleet: str) -> None:
    """A replicated stream answers nothing while it elects a leader (after a node loss, or just
    after `keel fleet init` on a cluster): the submit asks again instead of failing, and the
    message id makes a publish that did land before its answer was lost count once."""
    import nats.js.errors

    async def body(fleet: Fleet) -> tuple[int, int, list[str]]:
        publish = fleet.js.publish
        calls = 0

        async def electing(subject: str, payload: bytes, **kw: Any) -> Any:
            nonlocal calls
            if not subject.startswith("keel.queue."):  # the run's own event
                return await publish(subject, payload, **kw)
            calls += 1
            if calls == 1:
                raise nats.js.errors.NoStreamResponseError
            if calls == 2:  # it landed, but its answer was lost
                await publish(subject, payload, **kw)
                raise nats.js.errors.ServiceUnavailableError
            return await publish(subject, payload, **kw)

        fleet.js.publish = electing  # type: ignore[method-assign,assignment]
        await fleet.submit(RunRequest("elected", "x"))
        fleet.js.publish = publish  # type: ignore[method-assign]
        reader = QueueReader(fleet.js, ack_wait=30)
        await reader.start()
        msg = await _taken(reader)
        taken = [RunRequest.from_bytes(msg.data).run]
        await msg.ack_sync()
        assert await reader.next() is None  # once: an idle wait, then nothing
        await reader.close()
        return calls, len(taken), taken

    assert with_fleet(fleet, body) == (3, 1, ["elected"])


def test_a_submit_to_a_server_without_the_queue_stream_fails_at_once_with_the_hint(
    fleet: str,
) -> None:
    async def body(fleet: Fleet) -> tuple[float, str]:
        await fleet.js.delete_stream(streams.QUEUE_STREAM)
        began = time.monotonic()
        with pytest.raises(FleetError) as caught:
            await fleet.submit(RunRequest("nowhere", "x"))
        return time.monotonic() - began, caught.value.one_line()

    took, line = with_fleet(fleet, body)
    assert line.startswith("cannot queue run nowhere: "), line
    assert line.endswith(
        "(hint: create the fleet's streams with `keel fleet init` (or `keel fleet up`))"
    )
    assert took < 5, took  # not the election wait
