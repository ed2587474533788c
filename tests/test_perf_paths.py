"""The performance fixes of issue 16 keep their promises: the assistant record's one fsync runs
off the event loop thread and still before any of its tools, and `in_worker` reuses its daemon
threads without letting a call that never returns hold up the next one."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from keel.agent.loop import Agent
from keel.llm.messages import Message, Text, ToolUse, Usage
from keel.llm.providers.scripted import ScriptedProvider
from keel.llm.script import Reply, reply
from keel.permissions import AllowAll
from keel.proc import in_worker
from keel.session import journal as journal_module
from keel.session.journal import read_records
from keel.session.store import SessionLog
from keel.tools.base import ToolContext, tool


async def test_assistant_fsync_runs_off_the_loop_thread_before_its_tool(
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = SessionLog.create(cwd=project, model="scripted", directory=tmp_path / "s")
    real = journal_module._datasync
    #: (thread, records on disk) of every fsync, and of the tool's start.
    log: list[tuple[str, bool, list[str]]] = []
    loop_thread = threading.current_thread()

    def types() -> list[str]:
        return [r.payload.type for r in read_records(session.path).records]

    def datasync(fd: int) -> None:
        log.append(("fsync", threading.current_thread() is loop_thread, types()))
        real(fd)

    @tool
    async def side_effect(ctx: ToolContext) -> str:
        """A tool with an effect."""
        log.append(("tool", threading.current_thread() is loop_thread, types()))
        return "done"

    monkeypatch.setattr(journal_module, "_datasync", datasync)
    call = ToolUse("a", "side_effect", {})
    provider = ScriptedProvider(
        [Reply(Message("assistant", (Text("Go."), call)), Usage(10, 2)), reply("ok")]
    )
    agent = Agent(
        provider=provider,
        model="scripted",
        cwd=project,
        system="s",
        tools=[side_effect],
        gate=AllowAll(),
        session=session,
    )
    await agent.run("go")
    agent.session = None
    session.close()

    start = ["meta", "user", "assistant"]
    assert log[:3] == [
        # The prompt's record, durable before the request, off the loop thread too (a server's
        # other sessions go on meanwhile).
        ("fsync", False, ["meta", "user"]),
        # The assistant record: its one fsync, on a worker thread, before the tool starts.
        ("fsync", False, start),
        ("tool", True, start),
    ]
    assert types() == ["meta", "user", "assistant", "tool_result", "assistant", "terminal"]


async def test_a_cancelled_durable_wait_still_lets_its_sync_finish(
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = SessionLog.create(cwd=project, model="scripted", directory=tmp_path / "s")
    real = journal_module._datasync
    entered, release, finished = threading.Event(), threading.Event(), threading.Event()

    def slow(fd: int) -> None:
        entered.set()
        release.wait(10)
        real(fd)
        finished.set()

    session.user(Message("user", (Text("hi"),)))
    monkeypatch.setattr(journal_module, "_datasync", slow)
    session.assistant(
        Message("assistant", (Text("a"),)), Usage(), 0.0, "end_turn", 1, durable=False
    )
    task = asyncio.create_task(session.make_durable())
    assert await asyncio.to_thread(entered.wait, 10)
    task.cancel()
    await asyncio.sleep(0.05)
    # Cancelled, it waits for the sync in flight rather than leave it running beside the caller.
    assert not task.done()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert finished.is_set()
    session.close()


async def test_in_worker_reuses_its_thread_and_names_it_for_the_call() -> None:
    first = await in_worker(threading.current_thread, name="keel one")
    second = await in_worker(threading.current_thread, name="keel two")
    assert first is second  # the same Thread object: no new thread for the second call
    assert second is not threading.current_thread()
    assert second.daemon
    assert second.name == "keel two"


async def test_in_worker_call_that_blocks_does_not_hold_up_the_next() -> None:
    release = threading.Event()
    blocked = asyncio.ensure_future(in_worker(lambda: release.wait(10), name="keel stuck"))
    try:
        await asyncio.sleep(0.05)
        # The stuck call holds its own thread; the next call gets another one and finishes.
        other = await asyncio.wait_for(in_worker(threading.current_thread), 5)
        assert other.name != "keel stuck"
        # Cancelling the stuck call abandons its thread at once.
        blocked.cancel()
        with pytest.raises(asyncio.CancelledError):
            await blocked
    finally:
        release.set()

    # Once free, that thread serves calls again: nothing is lost or left waiting.
    def double(i: int) -> Callable[[], int]:
        return lambda: i * 2

    results = await asyncio.gather(*(in_worker(double(i)) for i in range(20)))
    assert results == [i * 2 for i in range(20)]


def test_wire_cache_holds_at_most_its_byte_budget() -> None:
    from keel.llm.providers.anthropic import _WireCache, encode_message

    messages = [Message("user", (Text(f"{i} " + "x" * 1000),)) for i in range(10)]
    size = len(encode_message(messages[0]))
    cache = _WireCache(100, 3 * size + 10)
    # Each request a new conversation (as after a compaction): nothing extends the last one.
    for message in messages:
        assert cache.encoded((message,), "m") == [encode_message(message)]
    # Only the 3 newest fit the budget; the others (no longer in any request) are gone.
    assert [entry[0] for entry in cache._entries.values()] == messages[-3:]
    assert cache._bytes == sum(len(encode_message(m)) for m in messages[-3:])
    # A conversation that extends the previous request still reuses that request's bytes.
    again = (messages[-1], messages[0])
    assert cache.encoded(again, "m") == [encode_message(m) for m in again]


def test_sessions_list_imports_no_event_loop_and_no_assembly(project: Path) -> None:
    # `keel sessions list` reads session files: asyncio (~16 ms) and keel.app (the whole agent
    # assembly, ~60 ms) are not needed for that, with KEEL_STORE unset.
    code = (
        "import sys; from keel.cli.main import main; rc = main(['sessions', 'list']); "
        "print(sorted(m for m in sys.modules if m == 'asyncio' or m.startswith('keel.app')))"
    )
    env = {k: v for k, v in os.environ.items() if k != "KEEL_STORE"}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=project, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == "[]"
