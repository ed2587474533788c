"""`keel serve` holding many sessions (issue 32): bench/bench_serve_scale.py's quick run gives every
measure and leaves the server as it found it (no task, subscriber, ring or session left behind by
hundreds of create/run/close cycles with subscribers leaving mid-run); the server raises its
open-files limit so that hundreds of sessions load under the usual soft limit; the session list
reads an unchanged session file once."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from keel.llm.script import reply
from keel.testing.anthropic_server import AnthropicServer
from tests.server_helpers import (
    MODEL,
    TOKEN,
    Served,
    _first_line,
    anthropic_fixture,
    served_fixture,
    servers_fixture,
)

__all__ = ["anthropic_fixture", "served_fixture", "servers_fixture"]

ROOT = Path(__file__).resolve().parents[1]


def test_the_scale_bench_quick_run_measures_everything_and_leaks_nothing(tmp_path: Path) -> None:
    samples = tmp_path / "samples.jsonl"
    run = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench/bench_serve_scale.py"),
            "--quick",
            "--soak-seconds",
            "4",
            "--samples",
            str(samples),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert set(out) == {
        "idle_sessions",
        "active_sessions",
        "python",
        "cores",
        "startup",
        "idle",
        "requests",
        "active",
        "soak",
        "errors",
    }
    assert out["errors"] == []
    assert set(out["startup"]) == {"runs", "listening_ms", "info_ms", "first_answer_ms"}
    assert 0 < out["startup"]["listening_ms"] < out["startup"]["info_ms"]
    assert out["startup"]["info_ms"] < out["startup"]["first_answer_ms"]
    idle = out["idle"]
    assert idle["sessions"] == 20
    # Each idle session holds its journal and the journal's lock open, no more (the rest: the
    # bench's own connections, at most 8 creating at once).
    assert 2 * 20 <= idle["fds_after"] - idle["fds_before"] <= 2 * 20 + 8
    assert idle["per_session_kb"] > 0
    requests = out["requests"]
    assert set(requests) == {"get_sessions_list", "get_session", "get_info", "post_prompt"}
    assert all(r["requests"] > 0 and r["per_second"] > 0 for r in requests.values())
    assert out["active"]["runs_per_second"] > 0
    # Three text deltas per model reply, three replies per run, every run followed to its end.
    assert out["active"]["latency"]["n"] == 3 * 3 * 5 * 2
    soak = out["soak"]
    assert soak["runs"] > 0
    assert soak["created"] == soak["deleted"] > 0
    assert soak["latency"]["n"] > 0
    for key in ("rss_slope_mb_per_hour", "first_window", "last_window"):
        assert key in soak
    # Every session the soak created was closed: the server is back where it started.
    start, end = soak["start"], soak["end"]
    for key in ("hosted", "ring_events", "tasks"):
        assert end[key] == start[key], (key, start, end)
    assert end["subscribers"] == 0
    # The collector, paused while the server started, runs again; what start-up built is frozen.
    assert end["gc_enabled"] is True
    assert end["gc_frozen"] > 10_000
    assert end["fds"] <= start["fds"]
    lines = [json.loads(line) for line in samples.read_text(encoding="utf-8").splitlines()]
    assert len(lines) == soak["samples"] >= 2
    assert {"t", "runs", "rss_mb", "fds", "tasks", "hosted", "ring_events"} <= set(lines[0])


def _serve_with_limit(project: Path, model: AnthropicServer, limit: int) -> subprocess.Popen[str]:
    def lower() -> None:
        resource.setrlimit(
            resource.RLIMIT_NOFILE, (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
        )

    return subprocess.Popen(
        [sys.executable, "-m", "keel", "serve", "--port", "0"],
        cwd=project,
        env={
            **os.environ,
            "ANTHROPIC_API_KEY": "sk-ant-test",
            "ANTHROPIC_BASE_URL": model.url,
            "KEEL_SERVER_TOKEN": TOKEN,
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        preexec_fn=lower,
    )


@pytest.mark.skipif(
    resource.getrlimit(resource.RLIMIT_NOFILE)[1] < 1024, reason="the hard open-files limit is low"
)
def test_serve_loads_more_sessions_than_its_soft_fd_limit_allows(
    project: Path, anthropic: AnthropicServer
) -> None:
    proc = _serve_with_limit(project, anthropic, 96)
    try:
        url = _first_line(proc)[0].split()[4]
        with httpx.Client(
            base_url=url, headers={"authorization": f"Bearer {TOKEN}"}, timeout=20
        ) as c:
            statuses = [
                c.post("/v1/sessions", json={"model": MODEL}).status_code for _ in range(60)
            ]
            assert statuses == [201] * 60
            assert len(c.get("/v1/info").json()["loaded"]) == 60
        fds = len(os.listdir(f"/proc/{proc.pid}/fd")) if Path("/proc").is_dir() else 200
        assert fds > 96  # more than the soft limit it was started with
    finally:
        proc.terminate()
        proc.wait(15)
        assert proc.stdout is not None
        proc.stdout.close()


def _summaries(c: httpx.Client) -> dict[str, dict[str, Any]]:
    return {s["id"]: s for s in c.get("/v1/sessions").json()["sessions"]}


def test_the_session_list_reads_a_file_again_only_when_it_changed(
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from keel.llm.messages import Message, Text
    from keel.server.host import Summaries
    from keel.session import index
    from keel.session.store import SessionLog

    read: list[str] = []
    real = index.summarize

    def summarize(path: Path) -> index.SessionSummary:
        read.append(path.stem)
        return real(path)

    monkeypatch.setattr(index, "summarize", summarize)
    folder = tmp_path / "s"
    held = SessionLog.create(cwd=project, model="scripted", directory=folder)
    ended = SessionLog.create(cwd=project, model="scripted", directory=folder)
    ended.user(Message("user", (Text("first"),)))
    ended.close()
    files = sorted(folder.glob("*.jsonl"))
    summaries = Summaries()

    def statuses() -> dict[str, tuple[str, str]]:
        return {s.id: (s.status, s.last_prompt) for s in summaries.of(files)}

    assert statuses() == {held.id: ("running", ""), ended.id: ("crashed", "first")}
    assert sorted(read) == sorted([held.id, ended.id])
    read.clear()
    assert statuses() == {held.id: ("running", ""), ended.id: ("crashed", "first")}
    assert read == []  # nothing changed: nothing read
    probed: list[str] = []
    real_locked = index.is_locked

    def is_locked(path: Path) -> bool:
        probed.append(path.stem)
        return real_locked(path)

    monkeypatch.setattr(index, "is_locked", is_locked)
    assert [s.status for s in summaries.of(files, {held.id})] == ["running", "crashed"][
        :: 1 if files[0].stem == held.id else -1
    ]
    assert probed == [ended.id]  # a session this process holds is not probed
    held.user(Message("user", (Text("second"),)))
    assert statuses() == {held.id: ("running", "second"), ended.id: ("crashed", "first")}
    assert read == [held.id]  # its file grew
    read.clear()
    held.close()  # the same bytes, but nobody writes it any more
    assert statuses() == {held.id: ("crashed", "second"), ended.id: ("crashed", "first")}
    assert read == [held.id]
    (folder / f"{ended.id}.jsonl").unlink()
    files = sorted(folder.glob("*.jsonl"))
    assert statuses() == {held.id: ("crashed", "second")}
    assert len(summaries) == 1  # a file gone is forgotten


def test_get_sessions_follows_the_files_as_they_change(
    served: Served, anthropic: AnthropicServer
) -> None:
    anthropic.add(reply("Hi."))
    with served.client() as c:
        made = [c.post("/v1/sessions", json={"model": MODEL}).json()["id"] for _ in range(3)]
        first = _summaries(c)
        assert set(first) == set(made)
        assert {s["status"] for s in first.values()} == {"running"}
        r = c.post(f"/v1/sessions/{made[0]}/prompt", json={"text": "hello", "wait": True})
        assert r.status_code == 200, r.text
        assert c.delete(f"/v1/sessions/{made[1]}").status_code == 204
        after = _summaries(c)
        assert (after[made[0]]["last_prompt"], after[made[0]]["turns"]) == ("hello", 1)
        assert after[made[1]]["status"] == "empty"  # unloaded before any prompt
        assert after[made[1]]["loaded"] is False
        assert after[made[2]] == first[made[2]]


def test_sessions_that_synced_in_the_background_share_a_few_threads(
    project: Path, tmp_path: Path
) -> None:
    import threading

    from keel.llm.messages import Message, Text
    from keel.session.journal import SYNC_THREADS
    from keel.session.records import UserRecord
    from keel.session.store import SessionLog

    def syncers() -> int:
        return sum(t.name.startswith("keel-journal-sync") for t in threading.enumerate())

    before = syncers()
    logs = [
        SessionLog.create(cwd=project, model="scripted", directory=tmp_path / "s")
        for _ in range(24)
    ]
    for log in logs:
        log.journal.append(UserRecord(Message("user", (Text("hello"),))), durable=False)
        log.journal.sync_in_background()
    for log in logs:
        log.journal.sync()  # each waits for its own background sync
    # A server holding a thousand sessions that each ran once held a thousand threads.
    assert syncers() - before <= SYNC_THREADS
    for log in logs:
        log.close()
    assert all(log.journal.last_seq == 2 for log in logs)


def test_the_ring_holds_at_most_its_bytes_and_says_what_it_dropped() -> None:
    import asyncio

    from keel.server.ring import EventRing

    async def main() -> None:
        ring = EventRing("s1", size=100, max_bytes=1000)
        big = "x" * 300  # a tool's output, say
        for n in range(10):
            ring.publish({"type": "tool_finished", "n": n, "output": big})
        # Each event's JSON is ~350 characters: the last two fit in 1000, not the ten.
        held = [json.loads(s.data)["n"] for s in ring._ring]
        assert held == [8, 9]
        assert ring.held_bytes == sum(len(s.data) for s in ring._ring) <= 1000
        sub, missed, gap = ring.subscribe(0)
        ring.unsubscribe(sub)
        assert [s.seq for s in missed] == [9, 10]
        assert gap is not None
        assert gap["reason"] == "events 1 to 8 are no longer held"
        # One event larger than the bound is still held (the latest always is).
        ring.publish({"type": "tool_finished", "n": 10, "output": "y" * 2000})
        assert [json.loads(s.data)["n"] for s in ring._ring] == [10]
        # The count bound still applies, and the bytes follow what it drops.
        small = EventRing("s2", size=3, max_bytes=10**6)
        for n in range(5):
            small.publish({"type": "text_delta", "text": str(n)})
        assert small.held_bytes == sum(len(s.data) for s in small._ring)
        assert len(small._ring) == 3

    asyncio.run(main())


def test_a_closed_session_is_freed_with_its_ring_and_streams(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio
    import gc
    import weakref

    from keel.server.host import Host

    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")

    async def main() -> None:
        host = Host(project)
        refs: list[weakref.ref[Any]] = []
        streams = []
        for _ in range(5):
            hosted = await host.create(model=MODEL, effort=None, mode=None, cwd=None)
            refs += [weakref.ref(hosted), weakref.ref(hosted.agent), weakref.ref(hosted.ring)]
            stream = hosted.ring.stream(0, keepalive=60)
            assert await anext(stream) == b"retry: 1000\n\n"  # subscribed
            streams.append(stream)
        before = asyncio.all_tasks()
        for hosted in list(host.sessions.values()):
            await host.close(hosted)
        for stream in streams:
            rest = [chunk async for chunk in stream]  # each stream ends with the close
            assert rest[-1].startswith(b"id: "), rest
            assert b"session_closed" in rest[-1]
        del hosted, stream, streams
        gc.collect()
        assert host.sessions == {}
        assert [r for r in refs if r() is not None] == []
        assert asyncio.all_tasks() <= before

    asyncio.run(main())
