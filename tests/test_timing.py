"""Request timing measured by the loop (issue 18, part 1): TTFT, thinking, generating, tokens per
second, attempts and notices, against a loopback Anthropic server that holds back its first byte
and its first text by known amounts; the journal's copy, `keel sessions show`, stream-json lines,
a retried request, a compaction's request events, tool start times, and a resumed session (and
the TUI's "thought for Ns") keeping them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from keel.agent.compaction import compaction_messages
from keel.agent.events import (
    AssistantMessage,
    ContextCompacted,
    Event,
    RequestFinished,
    RequestStarted,
    RequestTiming,
    ToolFinished,
    ToolStarted,
)
from keel.agent.loop import Agent
from keel.agent.timing import RequestClock, event_timing, journal_timing, thought_seconds
from keel.app.jsonout import event_json
from keel.llm.catalog import lookup
from keel.llm.events import Done, Notice, TextDelta, ThinkingDelta, ToolUseStart
from keel.llm.messages import Message, Text, Thinking, Usage, message_to_json
from keel.llm.script import Fault, Reply, reply
from keel.permissions import AllowAll
from keel.session.journal import read_records
from keel.session.records import (
    AssistantRecord,
    DecisionRecord,
    Record,
    ReplyTiming,
    ToolResultRecord,
    decode,
    encode,
)
from keel.session.store import SessionLog
from keel.testing.anthropic_server import AnthropicServer
from keel.testing.server import RecordedRequest
from keel.tools.builtin import builtin_tools
from keel.tui.replay import replay

MODEL = "claude-sonnet-4-5"
#: Slack on top of a scripted delay: two shared cores and a loopback round trip. Lower bounds
#: are exact (the server holds back at least that long); upper bounds take this much more.
SLACK_MS = 900.0


@pytest.fixture
def anthropic() -> Iterator[AnthropicServer]:
    with AnthropicServer(api_key="sk-ant-test") as server:
        yield server


def env_for(server: AnthropicServer) -> dict[str, str]:
    return {"ANTHROPIC_API_KEY": "sk-ant-test", "ANTHROPIC_BASE_URL": server.url}


def make_agent(server: AnthropicServer, project: Path, *, session: bool = True) -> Agent:
    agent = Agent.from_model(
        f"anthropic/{MODEL}",
        tools=builtin_tools(),
        env={**os.environ, **env_for(server)},
        cwd=project,
        system="timing system",
        gate=AllowAll(),
    )
    if session:
        agent.session = SessionLog.create(
            cwd=project, model=f"anthropic/{MODEL}", directory=project.parent / "sessions"
        )
    return agent


def event_index(step: Reply, block_type: str, *, then: int = 0) -> int:
    """The index, in the SSE stream the server renders for `step`, of the `content_block_start`
    of the first `block_type` block, plus `then` (a stall `after_events` that many events on)."""
    request = RecordedRequest(
        "POST", "/v1/messages", {}, json.dumps({"model": MODEL, "stream": True}).encode()
    )
    for i, raw in enumerate(AnthropicServer().render_stream(step, request)):
        data = json.loads(raw.decode().split("data: ", 1)[1])
        if data["type"] == "content_block_start" and data["content_block"]["type"] == block_type:
            return i + then
    raise AssertionError(f"no {block_type} block in the rendered stream")


def only(events: list[Event], kind: type[Any]) -> list[Any]:
    return [e for e in events if isinstance(e, kind)]


# -- the clock itself, on a fake clock: exact values ---------------------------------------------


class FakeTime:
    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return 1_796_000_000.0 + self.now


def test_the_clock_splits_a_request_into_its_phases(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeTime()
    monkeypatch.setattr("keel.agent.timing.time", fake)
    clock = RequestClock()
    fake.now += 0.5
    clock.see(Notice("anthropic returned 529: overloaded; retrying in 0.0 s", "warning"))
    clock.see(Notice("web search: 3 results", "info"))  # an info notice is not an attempt
    fake.now += 0.25
    clock.see(ThinkingDelta("hm"))  # first output of any kind: TTFT
    fake.now += 1.0
    clock.see(TextDelta("Hi"))  # first text: thinking ends
    fake.now += 2.0
    clock.see(Notice("the model wrote 1 tool call(s) as text (read); running them"))
    timing = clock.timing(output_tokens=300)
    assert timing == RequestTiming(
        sent_at=1_796_000_100.0,
        ttft_ms=750.0,
        thinking_ms=1750.0,
        generating_ms=2000.0,
        duration_ms=3750.0,
        output_tokens_per_s=100.0,  # thinking and text tokens over the 3 s they streamed
        attempts=2,
        notices=(
            "anthropic returned 529: overloaded; retrying in 0.0 s",
            "web search: 3 results",
            "the model wrote 1 tool call(s) as text (read); running them",
        ),
    )
    assert journal_timing(timing) == ReplyTiming(
        1_796_000_100.0, 750.0, 1750.0, 2000.0, 3750.0, 100.0, 2, timing.notices
    )
    assert event_timing(journal_timing(timing)) == timing
    assert thought_seconds(timing) == 2


def test_phases_that_did_not_happen_are_none(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeTime()
    monkeypatch.setattr("keel.agent.timing.time", fake)
    silent = RequestClock()  # nothing streamed: only a final message
    fake.now += 0.25
    silent.see(Done(Message("assistant", (Text("x"),)), Usage(1, 1), "end_turn"))
    assert silent.timing(output_tokens=1) == RequestTiming(
        silent.sent_at, None, None, None, 250.0, None, 1, ()
    )
    quick = RequestClock()  # a tool call streamed in 31 ms: too short for a rate
    fake.now += 0.125
    quick.see(ToolUseStart("t1", "read"))
    fake.now += 0.03125
    assert quick.timing(output_tokens=20) == RequestTiming(
        quick.sent_at, 125.0, 125.0, 31.25, 156.25, None, 1, ()
    )
    assert thought_seconds(quick.timing(output_tokens=20)) is None
    unreported = RequestClock()  # a provider that reports no output tokens: no rate either
    unreported.see(TextDelta("a"))
    fake.now += 1.0
    assert unreported.timing(output_tokens=0).output_tokens_per_s is None


# -- against the loopback server -----------------------------------------------------------------


async def test_ttft_thinking_and_generating_from_a_server_that_holds_back(
    anthropic: AnthropicServer, project: Path
) -> None:
    step = Reply(
        Message("assistant", (Thinking("Let me think it over.", "sig-1"), Text("It is 42."))),
        Usage(100, 40),
        delay=0.3,  # before the first byte
    )
    # ... and 1 s of silence between the thinking and the text.
    anthropic.add(Fault("stall", reply=step, after_events=event_index(step, "text"), seconds=1.0))
    agent = make_agent(anthropic, project)
    events: list[Event] = []
    result = await agent.run("what is it?", events.append)
    await agent.aclose()
    assert result.stop_reason == "end_turn"

    (started,) = only(events, RequestStarted)
    (finished,) = only(events, RequestFinished)
    (assistant,) = only(events, AssistantMessage)
    assert started == RequestStarted(1, MODEL, started.request, "turn")
    assert started.request is not None
    assert started.request.model == MODEL
    assert started.request.system == "timing system"
    assert started.request.messages == (Message("user", (Text("what is it?"),)),)
    assert anthropic.model_requests[0].json["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is it?", "cache_control": {"type": "ephemeral"}}
            ],
        }
    ]
    timing = assistant.timing
    assert timing is not None
    assert finished == RequestFinished(
        "turn",
        MODEL,
        assistant.message,
        assistant.usage,
        "end_turn",
        assistant.cost,
        timing,
    )
    # The request finished before its message was journaled and announced.
    kinds = [type(e).__name__ for e in events]
    assert kinds.index("RequestFinished") + 1 == kinds.index("AssistantMessage")

    assert timing.ttft_ms is not None
    assert timing.thinking_ms is not None
    assert timing.generating_ms is not None
    assert timing.output_tokens_per_s is not None
    assert 300.0 <= timing.ttft_ms < 300.0 + SLACK_MS
    assert 1300.0 <= timing.thinking_ms < 1300.0 + SLACK_MS
    assert timing.ttft_ms < timing.thinking_ms
    assert 0.0 <= timing.generating_ms < SLACK_MS
    assert timing.duration_ms == pytest.approx(timing.thinking_ms + timing.generating_ms)
    streaming_s = (timing.duration_ms - timing.ttft_ms) / 1000
    assert timing.output_tokens_per_s == pytest.approx(40 / streaming_s)
    assert (timing.attempts, timing.notices) == (1, ())
    assert abs(timing.sent_at - time.time()) < 30

    # The journal keeps it, rounded, and reads it back as written.
    assert agent.session is not None
    records = read_records(agent.session.path).records
    (record,) = [r for r in records if isinstance(r.payload, AssistantRecord)]
    assert isinstance(record.payload, AssistantRecord)
    assert record.payload.timing == journal_timing(timing)
    assert decode(encode(record)) == record
    raw = json.loads(agent.session.path.read_text(encoding="utf-8").splitlines()[record.seq - 1])
    assert raw["timing"] == {
        "sent_at": round(timing.sent_at, 3),
        "ttft_ms": round(timing.ttft_ms, 1),
        "thinking_ms": round(timing.thinking_ms, 1),
        "generating_ms": round(timing.generating_ms, 1),
        "duration_ms": round(timing.duration_ms, 1),
        "output_tokens_per_s": round(timing.output_tokens_per_s, 1),
        "attempts": 1,
        "notices": [],
    }


async def test_generating_time_when_the_text_stalls_midway(
    anthropic: AnthropicServer, project: Path
) -> None:
    step = Reply(Message("assistant", (Text("one two three four five six seven"),)), Usage(50, 30))
    # The text block starts and one delta arrives, then 0.6 s of silence, then the rest.
    after = event_index(step, "text", then=2)
    anthropic.add(Fault("stall", reply=step, after_events=after, seconds=0.6))
    agent = make_agent(anthropic, project, session=False)
    events: list[Event] = []
    await agent.run("count", events.append)
    await agent.aclose()
    (assistant,) = only(events, AssistantMessage)
    timing = assistant.timing
    assert timing is not None
    assert timing.ttft_ms is not None
    assert timing.generating_ms is not None
    assert timing.output_tokens_per_s is not None
    assert timing.ttft_ms < SLACK_MS
    assert timing.thinking_ms == timing.ttft_ms  # no thinking: the first output was text
    # At least the silence, less however late the first delta was read (a loaded machine).
    assert 400.0 <= timing.generating_ms < 600.0 + SLACK_MS
    assert timing.output_tokens_per_s == pytest.approx(30 / (timing.generating_ms / 1000))
    assert thought_seconds(timing) is None


async def test_a_retried_request_counts_its_attempts_and_keeps_the_notice(
    anthropic: AnthropicServer, project: Path
) -> None:
    anthropic.add(
        Fault("status", status=529, retry_after=0, message="overloaded"), reply("fine", usage=None)
    )
    agent = make_agent(anthropic, project)
    events: list[Event] = []
    result = await agent.run("hello", events.append)
    await agent.aclose()
    assert result.text == "fine"
    notices = [e.text for e in only(events, Notice) if "retrying" in e.text]
    assert notices == ["anthropic returned 529: overloaded; retrying in 0.0 s (attempt 2 of 4)"]
    (assistant,) = only(events, AssistantMessage)
    assert assistant.timing is not None
    assert (assistant.timing.attempts, assistant.timing.notices) == (2, tuple(notices))
    assert len(anthropic.model_requests) == 2
    assert agent.session is not None
    (record,) = [
        r.payload
        for r in read_records(agent.session.path).records
        if isinstance(r.payload, AssistantRecord)
    ]
    assert record.timing is not None
    assert (record.timing.attempts, record.timing.notices) == (2, tuple(notices))


async def test_tool_calls_carry_their_start_time_into_events_and_the_journal(
    anthropic: AnthropicServer, project: Path
) -> None:
    anthropic.add(
        reply("", ("read", {"path": "util.py"}), ("no_such_tool", {})),
        reply("X is 1."),
    )
    agent = make_agent(anthropic, project)
    events: list[Event] = []
    before = time.time()
    await agent.run("what is X?", events.append)
    after = time.time()
    await agent.aclose()
    (started,) = only(events, ToolStarted)  # the unknown tool never starts
    finished = {e.call.name: e for e in only(events, ToolFinished)}
    read_done, unknown_done = finished["read"], finished["no_such_tool"]
    assert started.call.name == "read"
    assert before <= started.started_at <= after
    assert read_done.started_at == started.started_at
    assert unknown_done.call.name == "no_such_tool"
    assert unknown_done.started_at == 0.0  # it never ran
    assert agent.session is not None
    lines = [json.loads(line) for line in agent.session.path.read_text().splitlines()]
    results = [line for line in lines if line["type"] == "tool_result"]
    by_id = {r["result"]["tool_use_id"]: r for r in results}
    read_line = by_id[started.call.id]
    assert read_line["started_at"] == round(started.started_at, 6)
    assert read_line["seconds"] == round(read_done.seconds, 4)
    assert "started_at" not in by_id[unknown_done.call.id]  # unknown: left out
    records = read_records(agent.session.path).records
    payloads = [r.payload for r in records if isinstance(r.payload, ToolResultRecord)]
    assert {p.result.tool_use_id: p.started_at for p in payloads} == {
        started.call.id: round(started.started_at, 6),
        unknown_done.call.id: 0.0,
    }
    assert event_json(started) == {
        "type": "tool_started",
        "id": started.call.id,
        "name": "read",
        "kind": "builtin",
        "input": {"path": "util.py"},
        "started_at": round(started.started_at, 3),
    }


async def test_a_compaction_request_is_announced_and_timed(
    anthropic: AnthropicServer, project: Path
) -> None:
    anthropic.add(
        reply("Hello."),
        Reply(Message("assistant", (Text("<summary>They said hello.</summary>"),)), delay=0.25),
    )
    agent = make_agent(anthropic, project)
    await agent.run("hi")
    before = list(agent.messages)
    events: list[Event] = []
    await agent.compact("keep it short", events.append)
    await agent.aclose()
    assert [type(e).__name__ for e in events] == [
        "Notice",
        "RequestStarted",
        "RequestFinished",
        "ContextCompacted",
        "Notice",
    ]
    started, finished = events[1], events[2]
    assert isinstance(started, RequestStarted)
    assert isinstance(finished, RequestFinished)
    assert started == RequestStarted(1, MODEL, started.request, "compaction")
    assert started.request is not None
    assert started.request.messages == compaction_messages(before, "keep it short")
    timing = finished.timing
    assert finished == RequestFinished(
        "compaction",
        MODEL,
        Message("assistant", (Text("<summary>They said hello.</summary>"),), "anthropic", MODEL),
        Usage(100, 20),
        "end_turn",
        lookup(MODEL).cost(Usage(100, 20)),
        timing,
    )
    assert timing.ttft_ms is not None
    assert 250.0 <= timing.ttft_ms < 250.0 + SLACK_MS
    assert (timing.attempts, timing.notices) == (1, ())
    assert isinstance(events[3], ContextCompacted)
    # stream-json prints a compaction's request as its own lines (a turn's is the assistant one).
    assert event_json(started) == {
        "type": "request",
        "turn": 1,
        "model": MODEL,
        "purpose": "compaction",
    }
    assert event_json(finished) == {
        "type": "request_finished",
        "purpose": "compaction",
        "model": MODEL,
        "message": message_to_json(finished.message),
        "usage": {"input": 100, "output": 20, "cache_read": 0, "cache_write": 0},
        "stop_reason": "end_turn",
        "cost_usd": round(finished.cost, 6),
        "timing": journal_timing(timing).to_json(),
    }
    turn = RequestFinished("turn", MODEL, finished.message, Usage(), "end_turn", 0.0, timing)
    assert event_json(turn) is None


async def test_a_subagents_requests_are_timed_through_its_own_loop(project: Path) -> None:
    from keel.agent.events import SubagentEvent
    from keel.agent.subagents import enable_subagents, load_agent_types
    from keel.testing.routing import RoutedProvider

    task = {"description": "look", "prompt": "CHILD: look around", "subagent_type": "general"}
    provider = RoutedProvider(
        {
            "PARENT": [reply("", ("task", task)), reply("Reported.")],
            "CHILD": [Reply(reply("Nothing here.").message, delay=0.3)],
        }
    )
    agent = Agent(
        provider=provider,
        model="scripted",
        tools=builtin_tools(),
        cwd=project,
        system="parent system",
        gate=AllowAll(),
    )
    enable_subagents(agent, load_agent_types(project, user_dir=None, home=project / "no-home"))
    events: list[Event] = []
    await agent.run("PARENT: ask a child", events.append)
    await agent.aclose()
    child = [e.event for e in only(events, SubagentEvent)]
    (started,) = only(child, RequestStarted)
    (finished,) = only(child, RequestFinished)
    (answer,) = only(child, AssistantMessage)
    assert started.purpose == "turn"
    assert started.request is not None
    opening = started.request.messages[0]
    assert opening.blocks[0].text.startswith("<context>\n<env>\n")
    assert opening.blocks[-1].text.startswith("CHILD: look around")
    assert answer.timing is finished.timing
    assert answer.timing.ttft_ms is not None
    assert 300.0 <= answer.timing.ttft_ms < 300.0 + SLACK_MS
    # Its lines in stream-json are the assistant line, labelled; the turn's RequestFinished is not.
    labelled = [event_json(e) for e in only(events, SubagentEvent)]
    kinds = [line["type"] for line in labelled if line is not None]
    assert "request_finished" not in kinds
    assert kinds.count("assistant") == 1


# -- keel -p: stream-json, the journal, sessions show, resume ------------------------------------


def keel(
    args: list[str], project: Path, server: AnthropicServer
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "keel", *args],
        cwd=project,
        input="",
        capture_output=True,
        text=True,
        env={**os.environ, **env_for(server)},
        timeout=60,
    )


def session_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def shown_timing(t: dict[str, Any]) -> str:
    """`keel sessions show`'s timing text for a journaled timing (its documented shape)."""
    parts = [f"ttft {t['ttft_ms'] / 1000:.2f}s", f"thought {t['thinking_ms'] / 1000:.2f}s"]
    if t["output_tokens_per_s"] is not None:
        parts.append(f"{t['output_tokens_per_s']:.0f} tok/s")
    parts.append(f"{t['duration_ms'] / 1000:.2f}s in all")
    if t["attempts"] > 1:
        parts.append(f"{t['attempts']} attempts")
    return " · ".join(parts)


def test_stream_json_sessions_show_and_resume_keep_the_timing(
    anthropic: AnthropicServer, project: Path
) -> None:
    anthropic.add(
        Reply(reply("", ("read", {"path": "util.py"})).message, Usage(80, 12), delay=0.3),
        Fault("status", status=529, retry_after=0, message="overloaded"),
        reply("X is 1."),
    )
    out = keel(
        ["-p", "what is X?", "--model", f"anthropic/{MODEL}", "--output-format", "stream-json"],
        project,
        anthropic,
    )
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert "request_finished" not in [line["type"] for line in lines]  # turns: `assistant` only
    result = lines[-1]
    path = Path(result["session_path"])
    journal = session_lines(path)

    # The assistant lines are the journal's assistant records, timing included.
    assistants = [line for line in lines if line["type"] == "assistant"]
    records = [r for r in journal if r["type"] == "assistant"]
    assert assistants == [
        {
            "type": "assistant",
            "message": r["message"],
            "usage": r["usage"],
            "stop_reason": r["stop_reason"],
            "cost_usd": round(r["cost"], 6),
            "timing": r["timing"],
        }
        for r in records
    ]
    first, second = (r["timing"] for r in records)
    assert set(first) == {
        "sent_at",
        "ttft_ms",
        "thinking_ms",
        "generating_ms",
        "duration_ms",
        "output_tokens_per_s",
        "attempts",
        "notices",
    }
    assert 300.0 <= first["ttft_ms"] < 300.0 + SLACK_MS
    assert first["thinking_ms"] == first["ttft_ms"]  # the tool call was the first output
    assert (first["attempts"], first["notices"]) == (1, [])
    assert second["attempts"] == 2
    assert second["notices"] == [
        "anthropic returned 529: overloaded; retrying in 0.0 s (attempt 2 of 4)"
    ]
    assert second["sent_at"] > first["sent_at"]

    (tool_result,) = [r for r in journal if r["type"] == "tool_result"]
    call_id = tool_result["result"]["tool_use_id"]
    started_at = round(tool_result["started_at"], 3)
    assert first["sent_at"] < tool_result["started_at"] < second["sent_at"]
    tool_lines = [line for line in lines if line["type"] in ("tool_started", "tool_finished")]
    assert tool_lines == [
        {
            "type": "tool_started",
            "id": call_id,
            "name": "read",
            "kind": "builtin",
            "input": {"path": "util.py"},
            "started_at": started_at,
        },
        {
            "type": "tool_finished",
            "id": call_id,
            "name": "read",
            "kind": "builtin",
            "is_error": False,
            "output": "     1\tX = 1",
            "seconds": tool_result["seconds"],
            "started_at": started_at,
        },
    ]

    # keel sessions show: --json is the file; the text names each reply's timing.
    sid = path.stem
    shown_json = keel(["sessions", "show", sid, "--json"], project, anthropic)
    assert shown_json.returncode == 0, shown_json.stderr
    assert [json.loads(line) for line in shown_json.stdout.splitlines()] == journal
    shown = keel(["sessions", "show", sid], project, anthropic)
    assert shown.returncode == 0, shown.stderr
    heads = [line for line in shown.stdout.splitlines() if "] assistant (" in line]
    assert heads == [
        f"[{r['seq']}] assistant ({MODEL}, {sum(r['usage'].values())} tokens, "
        f"${r['cost']:.4f}, {r['stop_reason']}): {shown_timing(r['timing'])}"
        for r in records
    ]

    # Resumed: the earlier records stay as written (timing and all); the new reply is timed too.
    anthropic.add(Reply(reply("Still 1.").message, delay=0.2))
    before = path.read_bytes()
    again = keel(
        ["-p", "--resume", sid, "and now?", "--model", f"anthropic/{MODEL}"], project, anthropic
    )
    assert again.returncode == 0, again.stderr
    after = path.read_bytes()
    assert after.startswith(before)
    resumed = [r for r in session_lines(path) if r["type"] == "assistant"]
    assert resumed[:2] == records
    assert 200.0 <= resumed[2]["timing"]["ttft_ms"] < 200.0 + SLACK_MS

    # A front end replaying the session shows every reply with its journaled timing.
    loaded = read_records(path).records
    replayed = [e for e in replay(loaded, lookup(MODEL)) if isinstance(e, AssistantMessage)]
    assert [e.timing for e in replayed] == [
        event_timing(ReplyTiming.from_json(r["timing"])) for r in resumed
    ]
    tool_replays = [e for e in replay(loaded, lookup(MODEL)) if isinstance(e, ToolFinished)]
    assert [e.started_at for e in tool_replays] == [tool_result["started_at"]]


# -- records: old files load; new fields round-trip ------------------------------------------------


def test_records_without_timing_still_load_and_new_fields_round_trip() -> None:
    old_assistant = {
        "v": 1,
        "seq": 3,
        "type": "assistant",
        "ts": "2026-11-30T00:00:00.000Z",
        "message": {"v": 1, "role": "assistant", "content": [{"type": "text", "text": "hi"}]},
        "usage": {"input": 1, "output": 2, "cache_read": 0, "cache_write": 0},
        "cost": 0.0,
        "stop_reason": "end_turn",
        "turn": 1,
    }
    old = decode(json.dumps(old_assistant))
    assert isinstance(old.payload, AssistantRecord)
    assert old.payload.timing is None
    assert json.loads(encode(old)) == old_assistant  # no timing: the line is as before
    old_result = decode(
        json.dumps(
            {
                "v": 1,
                "seq": 4,
                "type": "tool_result",
                "ts": "2026-11-30T00:00:00.000Z",
                "result": {"type": "tool_result", "tool_use_id": "t1", "content": []},
                "seconds": 0.5,
            }
        )
    )
    assert isinstance(old_result.payload, ToolResultRecord)
    assert old_result.payload.started_at == 0.0

    timing = ReplyTiming(1_796_000_000.123, 12.5, 900.1, 40.0, 940.1, 55.5, 3, ("a", "b"))
    message = Message("assistant", (Text("hi"),), "anthropic", MODEL)
    for payload in (
        AssistantRecord(message, Usage(1, 2), 0.1, "end_turn", 1, timing),
        DecisionRecord("t1", "bash", "allow", "user", "asked", 2345.6),
    ):
        record = Record(5, "2026-11-30T00:00:00.000Z", payload)
        assert decode(encode(record)) == record
    decision = json.loads(
        encode(Record(6, "2026-11-30T00:00:00.000Z", DecisionRecord("t1", "bash", "allow", "rule")))
    )
    assert "waited_ms" not in decision  # nobody was asked: the line is as before


# -- the TUI: "thought for Ns", live and from the journal -----------------------------------------


async def test_the_tui_says_how_long_the_model_thought_live_and_when_reopened(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from keel.session.index import latest_session
    from keel.testing import ScriptedProvider
    from keel.tui.app import KeelApp
    from keel.tui.widgets import NoticeLine
    from tests.tui_helpers import make_controller

    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    # Over a second before the answer: said for a model that thought (here without showing
    # it, as encrypted reasoning is), not for one that did not (that time is prompt reading).
    thinking = Thinking("", "encrypted", source="openai")
    slow = Reply(Message("assistant", (thinking, Text("Forty-two."))), delay=1.1)
    unthinking = Reply(reply("Forty-three.").message, delay=1.1)
    provider = ScriptedProvider([slow, unthinking, reply("Quick.")], model=MODEL)
    controller = await make_controller(project, provider)
    app = KeelApp(controller)

    def notices(app: KeelApp) -> list[str]:
        return [str(n.render()) for n in app.query(NoticeLine) if "thought" in str(n.render())]

    async with app.run_test(size=(100, 36)) as pilot:
        for prompt in ("what is it?", "and the next?", "and quickly?"):
            app.prompt.load_text(prompt)
            await pilot.press("enter")
            await app.idle()
            await pilot.pause()
            while controller.busy:
                await pilot.pause(0.05)
        assert notices(app) == ["· thought for 1s"]  # the others say nothing
    await controller.close()

    session = latest_session(project)
    assert session is not None
    again = await make_controller(project, ScriptedProvider([], model=MODEL), start=False)
    await again.start_session(session)
    app2 = KeelApp(again)
    async with app2.run_test(size=(100, 36)) as pilot:
        await app2.idle()
        await pilot.pause()
        assert notices(app2) == ["· thought for 1s"]
    await again.close()


async def test_line_mode_says_how_long_the_model_thought(project: Path) -> None:
    import asyncio
    import io

    from rich.console import Console

    from keel.testing import ScriptedProvider
    from keel.tui.line import LineFrontEnd, LineReader
    from tests.tui_helpers import make_controller

    controller = await make_controller(project, ScriptedProvider([], model=MODEL), start=False)
    out = io.StringIO()
    reader = LineReader(io.StringIO(""), asyncio.get_running_loop())
    front = LineFrontEnd(controller, Console(file=out, width=100), reader, echo=False)
    thought = Message("assistant", (Thinking("", "sig"), Text("Done.")), "anthropic", MODEL)
    plain = Message("assistant", (Text("Done."),), "anthropic", MODEL)
    for message, thinking_ms in ((thought, 2400.0), (thought, 400.0), (plain, 2400.0)):
        # Only the first is worth a line: the second was quick, the third did not think.
        timing = RequestTiming(1.0, 300.0, thinking_ms, 50.0, thinking_ms + 50.0, None)
        front.show(AssistantMessage(message, Usage(1, 1), "end_turn", 0.0, timing))
    front.show(AssistantMessage(thought, Usage(1, 1), "end_turn", 0.0))  # no timing: none
    lines = out.getvalue().splitlines()
    assert lines == ["✻ thought for 2s", "Done.", "Done.", "Done.", "Done."]  # above the reply
    await controller.close()
