"""Fleet drains at scale (issue 20): queued 5-turn runs (4 `glob` tool turns, then an answer from
a loopback Anthropic server) drained by real `keel worker` processes; every run must complete with
its own final text after 5 turns, and its journal must be the whole run, once. `drain` here is what bench/bench_fleet.py
measures.

The cluster test drains across a 3-node nats-server cluster with replicated streams and SIGKILLs
the node leading the journal stream once about a third of the runs are done: nothing may be lost,
the drain must finish, and the node comes back and catches up.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from keel.fleet import streams
from keel.fleet.connect import connect
from keel.fleet.runs import ACTIVE, Fleet, RunRequest
from keel.llm.messages import Message, Text, ToolUse, Usage
from keel.session.fold import fold
from keel.session.records import (
    AssistantRecord,
    ClaimRecord,
    TerminalRecord,
    ToolResultRecord,
)
from keel.testing.anthropic_server import AnthropicServer
from keel.testing.script import Reply, ScriptDivergence
from keel.testing.server import RecordedRequest
from tests.fleet_helpers import WorkerProc, read_run, setup_fleet
from tests.nats_fixture import NatsCluster, nats_server, nats_url  # noqa: F401

pytestmark = [pytest.mark.needs("nats-server")]

# -- the drain (bench/bench_fleet.py measures it) ---------------------------------------------

TOOL_TURNS = 4
MODEL = "anthropic/claude-sonnet-4-5"
API_KEY = "sk-ant-bench"
PATTERNS = ("*", "*.py", "**/*.md", "src/**")
_NAME = re.compile(r"drain run (\w+):")


def prompt(name: str) -> str:
    return f"drain run {name}: list the files, {TOOL_TURNS} times, then say so"


def final_text(name: str) -> str:
    return f"{name} finished after {TOOL_TURNS} tool turns."


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") for b in content or [] if isinstance(b, dict))


def respond(request: RecordedRequest) -> Reply:
    """The step numbered by the assistant messages already in the request, for the run named in
    its first user message: a `glob` for the first TOOL_TURNS, then the final answer."""
    messages = (request.json or {}).get("messages", [])
    first: dict[str, Any] = next((m for m in messages if m.get("role") == "user"), {})
    found = _NAME.search(_text(first.get("content")))
    if found is None:
        raise ScriptDivergence(f"no drain run in {_text(first.get('content'))[:80]!r}")
    name = found.group(1)
    turn = sum(1 for m in messages if m.get("role") == "assistant") + 1
    usage = Usage(input=1200, output=20)
    if turn <= TOOL_TURNS:
        # A different pattern each turn: the same call four times is what the loop guard stops.
        call = ToolUse(f"toolu_{name}_{turn}", "glob", {"pattern": PATTERNS[turn - 1]})
        return Reply(Message("assistant", (Text(f"Turn {turn}."), call)), usage=usage)
    if turn == TOOL_TURNS + 1:
        return Reply(Message("assistant", (Text(final_text(name)),)), usage=usage)
    raise ScriptDivergence(f"{name} made request #{turn}; its script has {TOOL_TURNS + 1}")


@dataclass
class Drain:
    """What one drain did: per run (id → name) its submit, start and finish times (monotonic,
    this process), its final summary, and the workers' logs."""

    names: dict[str, str]
    submitted: dict[str, float] = field(default_factory=dict)
    started: dict[str, float] = field(default_factory=dict)
    finished: dict[str, float] = field(default_factory=dict)
    summaries: dict[str, dict[str, Any]] = field(default_factory=dict)
    submit_seconds: float = 0.0
    workers_started: float = 0.0
    model_requests: int = 0
    #: CPU the worker processes used (user + system), read just before they are stopped.
    worker_cpu_seconds: float = 0.0
    model_errors: list[str] = field(default_factory=list)
    logs: list[str] = field(default_factory=list)

    def stats(self) -> dict[str, Any]:
        done = [r for r in self.names if r in self.finished]
        latency = sorted(self.finished[r] - self.submitted[r] for r in done)
        running = sorted(self.finished[r] - self.started[r] for r in done if r in self.started)
        last = max(self.finished.values()) if self.finished else self.workers_started
        first = min(self.finished.values()) if self.finished else self.workers_started
        wall = last - self.workers_started
        return {
            "runs": len(self.names),
            "completed": sum(
                self.summaries.get(r, {}).get("status") == "completed" for r in self.names
            ),
            "submit_per_s": round(len(self.names) / self.submit_seconds, 1),
            "drain_seconds": round(wall, 2),
            "first_run_started_s": round(min(self.started.values()) - self.workers_started, 2)
            if self.started
            else 0.0,
            "runs_per_s": round(len(done) / wall, 2) if wall > 0 else 0.0,
            "runs_per_s_steady": round((len(done) - 1) / (last - first), 2)
            if last > first
            else 0.0,
            "submit_to_result_p50_s": percentile(latency, 50),
            "submit_to_result_p99_s": percentile(latency, 99),
            "run_p50_s": percentile(running, 50),
            "run_p99_s": percentile(running, 99),
            "model_requests": self.model_requests,
            "worker_cpu_ms_per_run": round(self.worker_cpu_seconds * 1000 / len(self.names), 1),
        }


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a live process (Linux /proc; 0 elsewhere or once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text(encoding="ascii").rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(ordered: list[float], pct: int) -> float:
    if not ordered:
        return 0.0
    index = min(len(ordered) - 1, max(0, round(len(ordered) * pct / 100) - 1))
    return round(ordered[index], 3)


During = Callable[[int], Awaitable[None]]


async def drain(
    url: str,
    tmp: Path,
    *,
    runs: int,
    workers: int,
    concurrency: int = 1,
    env: Mapping[str, str] | None = None,
    during: During | None = None,
    limit: float = 900,
    prefix: str = "d",
) -> Drain:
    """Queue `runs` runs, start `workers` worker processes, return when every run's summary is
    over (or raise with the workers' logs: a worker that exits, a run that fails, `limit` s).
    `during(completed)` is awaited every poll (a test kills a node from it). The fleet's streams
    must exist on `url`."""
    server = AnthropicServer(responder=respond, api_key=API_KEY).start()
    # Its own connection reconnects (Fleet.open's does not): the watch must outlive a node.
    fleet = Fleet(await connect(url, name="drain", reconnect=True))
    result = Drain({})
    pool: list[WorkerProc] = []
    watcher: Any = None
    watching: asyncio.Task[None] | None = None
    try:
        kv = await fleet.kv()
        watcher = await kv.watchall()
        watching = asyncio.create_task(_watch(watcher, result))
        for i in range(runs):
            from keel.session.store import new_session_id

            run = f"{new_session_id()}-{prefix}{i:04d}"
            result.names[run] = f"{prefix}{i:04d}"
        began = time.monotonic()
        for run, name in result.names.items():
            result.submitted[run] = time.monotonic()
            req = RunRequest(run, prompt(name), model=MODEL, mode="bypass", workspace={})
            await fleet.submit(req)
        result.submit_seconds = time.monotonic() - began
        worker_env = {
            **(os.environ if env is None else env),
            "ANTHROPIC_API_KEY": API_KEY,
            "ANTHROPIC_BASE_URL": server.url,
        }
        result.workers_started = time.monotonic()
        pool = [
            WorkerProc(url, tmp / "scratch", f"w{i}", concurrency=concurrency, env=worker_env)
            for i in range(workers)
        ]
        deadline = time.monotonic() + limit
        while True:
            await asyncio.sleep(0.2)
            result.model_requests += len(server.requests)
            server.requests.clear()  # 5 requests per run, each with every tool's schema
            result.model_errors += [repr(e) for e in server.errors]
            server.errors.clear()
            over = {r: s for r, s in result.summaries.items() if s.get("status") not in ACTIVE}
            bad = {r: s for r, s in over.items() if s.get("status") != "completed"}
            if bad:
                raise AssertionError(
                    f"runs failed: {list(bad.values())[:3]}", [w.log()[-2000:] for w in pool]
                )
            if len(over) == runs:
                break
            dead = [w.name for w in pool if w.proc.poll() is not None]
            if dead:
                raise AssertionError(f"workers exited: {dead}", [w.log()[-3000:] for w in pool])
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{runs - len(over)} of {runs} runs not over after {limit:g} s",
                    [w.log()[-2000:] for w in pool],
                )
            if during is not None:
                await during(len(over))
    finally:
        result.worker_cpu_seconds = sum(cpu_seconds(w.proc.pid) for w in pool)
        for w in pool:
            await asyncio.to_thread(w.terminate, 20)
        result.logs = [w.log() for w in pool]
        for w in pool:
            w.close()
        if watching is not None:
            watching.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await watching
        if watcher is not None:
            with contextlib.suppress(Exception):
                await watcher.stop()
        with contextlib.suppress(Exception):
            await fleet.close()
        server.stop()
    return result


async def _watch(watcher: Any, result: Drain) -> None:
    async for entry in watcher:
        if entry is None or not entry.value or "." in entry.key:
            continue  # the end-of-history marker, a delete, answers and cancel flags
        now = time.monotonic()
        summary = json.loads(entry.value)
        status = summary.get("status")
        run = entry.key
        if status == "running":
            result.started.setdefault(run, now)
        elif status not in ACTIVE:
            result.finished.setdefault(run, now)
        result.summaries[run] = summary


# -- the tests ----------------------------------------------------------------------------------


#: A run's journal without a takeover: meta, the prompt, 4 rounds of (call, result), the answer,
#: the terminal record.
TYPES = ["meta", "user", *["assistant", "tool_result"] * TOOL_TURNS, "assistant", "terminal"]


def check_summaries(result: Drain) -> None:
    """Every run completed, with its own final text, after 5 turns, on the model it named."""
    wrong = {
        run: result.summaries.get(run, {})
        for run, name in result.names.items()
        if (
            result.summaries.get(run, {}).get("status"),
            result.summaries.get(run, {}).get("text"),
            result.summaries.get(run, {}).get("turns"),
            result.summaries.get(run, {}).get("model"),
        )
        != ("completed", final_text(name), TOOL_TURNS + 1, MODEL)
    }
    assert not wrong, (len(wrong), list(wrong.values())[:2], [log[-1500:] for log in result.logs])
    assert not result.model_errors, result.model_errors
    # Each run asked the model exactly 5 times (no turn asked twice), unless a takeover repeated
    # the request in flight.
    assert result.model_requests >= len(result.names) * (TOOL_TURNS + 1)


def check_journal(url: str, run: str, name: str, tmp: Path) -> int:
    """The run's journal is the whole run once: contiguous, each call answered once, in order,
    no model turn journaled twice, a completed terminal. Returns the number of claims."""
    records = read_run(url, run, tmp / "reader")
    assert [r.seq for r in records] == list(range(1, len(records) + 1)), run
    calls = [
        b.id
        for r in records
        if isinstance(r.payload, AssistantRecord)
        for b in r.payload.message.blocks
        if isinstance(b, ToolUse)
    ]
    assert calls == [f"toolu_{name}_{i}" for i in range(1, TOOL_TURNS + 1)], (run, calls)
    answered = Counter(
        r.payload.result.tool_use_id for r in records if isinstance(r.payload, ToolResultRecord)
    )
    assert answered == Counter(calls), (run, answered)
    claims = sum(isinstance(r.payload, ClaimRecord) for r in records)
    assert [r.payload.type for r in records if r.payload.type != "claim"] == TYPES, run
    # A run redelivered after it was over (its ack lost with a node) is claimed, then answered
    # from its journal: claims may follow the terminal record, nothing else.
    end = max(i for i, r in enumerate(records) if isinstance(r.payload, TerminalRecord))
    assert all(isinstance(r.payload, ClaimRecord) for r in records[end + 1 :]), run
    last = records[end].payload
    assert isinstance(last, TerminalRecord), (run, last)
    assert (last.reason, last.turns) == ("completed", TOOL_TURNS + 1), (run, last)
    state = fold(records)
    assert state.pending is None
    assert state.messages[-1].text == final_text(name)
    return claims


def test_a_drain_of_40_runs_across_2_workers_completes_every_run_once(
    nats_url: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    setup_fleet(nats_url)
    result = asyncio.run(drain(nats_url, tmp_path, runs=40, workers=2, concurrency=2, limit=120))
    check_summaries(result)
    assert result.model_requests == 40 * (TOOL_TURNS + 1)
    claims = sum(check_journal(nats_url, run, name, tmp_path) for run, name in result.names.items())
    assert claims == 0  # nobody died: no run was taken over
    # Both workers took runs.
    workers = Counter(s["worker"] for s in result.summaries.values())
    assert set(workers) == {"w0", "w1"}, workers
    print("drain", result.stats())


@pytest.mark.slow
def test_a_drain_of_1000_runs_across_4_workers_completes_every_run(
    nats_url: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    setup_fleet(nats_url)
    result = asyncio.run(drain(nats_url, tmp_path, runs=1000, workers=4, concurrency=4, limit=900))
    check_summaries(result)
    assert result.model_requests == 1000 * (TOOL_TURNS + 1)
    claims = sum(check_journal(nats_url, run, name, tmp_path) for run, name in result.names.items())
    assert claims == 0
    assert set(Counter(s["worker"] for s in result.summaries.values())) == {
        "w0",
        "w1",
        "w2",
        "w3",
    }
    print("drain", result.stats())


def calls_run_again(url: str, run: str, tmp: Path) -> int:
    """Tool calls of `run` that a resumed attempt ran again: after each claim, the calls of the
    last model turn that had no result journaled yet (the call in flight when the attempt
    before stopped; it may or may not have run then)."""
    again = 0
    answered: set[str] = set()
    calls: list[str] = []
    for record in read_run(url, run, tmp / "reader"):
        payload = record.payload
        if isinstance(payload, AssistantRecord):
            calls = [b.id for b in payload.message.blocks if isinstance(b, ToolUse)]
        elif isinstance(payload, ToolResultRecord):
            answered.add(payload.result.tool_use_id)
        elif isinstance(payload, ClaimRecord):
            again += sum(call not in answered for call in calls)
    return again


async def _runs_leader(url: str) -> str:
    nc = await connect(url, name="test", reconnect=False)
    try:
        info = await nc.jetstream().stream_info(streams.RUNS_STREAM)
        assert info.cluster is not None, info
        assert info.cluster.leader, info
        return str(info.cluster.leader)
    finally:
        await nc.close()


@pytest.mark.slow  # long: it runs in `pytest -m slow` (.ci/run)
def test_a_3_node_cluster_loses_its_journal_leader_mid_drain_and_no_run_is_lost(
    tmp_path: Path,
) -> None:
    cluster = NatsCluster(tmp_path / "cluster")
    try:
        setup_fleet(cluster.url, replicas=3)
        runs = 60
        killed: list[str] = []
        at: list[int] = []

        async def kill_a_node(completed: int) -> None:
            if killed or completed < runs // 3:
                return
            leader = await _runs_leader(cluster.url)
            killed.append(leader)
            at.append(completed)
            await asyncio.to_thread(cluster.kill, cluster.index(leader))

        env = {**os.environ, "KEEL_FLEET_ACK_WAIT": "5"}
        result = asyncio.run(
            drain(
                cluster.url,
                tmp_path,
                runs=runs,
                workers=2,
                concurrency=2,
                env=env,
                during=kill_a_node,
                limit=240,
            )
        )
        assert len(killed) == 1, killed
        assert at[0] < runs, at  # the kill came mid-drain
        check_summaries(result)
        claims = sum(
            check_journal(cluster.url, run, name, tmp_path) for run, name in result.names.items()
        )
        again = sum(calls_run_again(cluster.url, run, tmp_path) for run in result.names)
        print(
            "cluster drain",
            result.stats(),
            "killed",
            killed,
            "at",
            at,
            "claims",
            claims,
            "calls run again",
            again,
        )
        # A node loss stops no attempt while the election lasts (the journal and the summaries
        # wait for the new leader): at most the call in flight of a run that was taken over.
        assert again <= claims, (again, claims)
        # The node comes back and catches up on the journal stream.
        victim = cluster.index(killed[0])
        cluster.start(victim)
        live = cluster.stream_state(0 if victim else 1, streams.RUNS_STREAM)
        assert live is not None

        def caught_up() -> bool:
            mine = cluster.stream_state(victim, streams.RUNS_STREAM)
            return mine is not None and mine.get("last_seq") == live.get("last_seq")

        from tests.fleet_helpers import wait_for

        wait_for(caught_up, 30, f"node {killed[0]} to catch up on {streams.RUNS_STREAM}")
    finally:
        cluster.stop()


async def _recreate_consumer(url: str, pause: float) -> None:
    """What an operator does to change the queue consumer's settings: delete it, make it again
    (the settings the worker makes it with). In between, a worker's pull has no responder."""
    from nats.js.api import AckPolicy, ConsumerConfig

    nc = await connect(url, name="operator", reconnect=False)
    try:
        js = nc.jetstream()
        info = await js.consumer_info(streams.QUEUE_STREAM, streams.CONSUMER)
        await js.delete_consumer(streams.QUEUE_STREAM, streams.CONSUMER)
        await asyncio.sleep(pause)
        await js.add_consumer(
            streams.QUEUE_STREAM,
            ConsumerConfig(
                durable_name=streams.CONSUMER,
                ack_policy=AckPolicy.EXPLICIT,
                ack_wait=info.config.ack_wait,
                max_deliver=-1,
                max_ack_pending=-1,
            ),
        )
    finally:
        await nc.close()


def test_a_worker_outlives_its_queue_consumer_being_unavailable_for_a_moment(
    nats_url: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    """A pull that finds no consumer leader (a 503: a new R3 consumer electing its leader, a
    node loss, an operator re-making the consumer) is a moment to wait, not the end of the
    worker. Found by the cluster drain (two workers on a fresh R3 fleet: one died at its first
    fetch with `internal error: ServiceUnavailableError`); made deterministic here."""
    from tests.fleet_helpers import WorkerProc, keel, script, wait_for

    setup_fleet(nats_url)
    worker = WorkerProc(nats_url, tmp_path / "scratch", "w1")
    try:
        wait_for(lambda: "takes runs" in worker.log(), 30, "the worker to start")
        asyncio.run(_recreate_consumer(nats_url, pause=3.0))
        assert worker.proc.poll() is None, worker.log()
        model = script(tmp_path / "after.json", [{"text": "still here."}])
        out = keel(
            "submit", "--nats", nats_url, "hello", "--model", model, "--workspace", "none", "--wait"
        )
        assert (out.returncode, out.stdout) == (0, "still here.\n"), (out, worker.log())
    finally:
        worker.terminate(20)
        logs = worker.log()
        worker.close()
    assert "internal error" not in logs, logs
