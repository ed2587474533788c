"""The agent loop against ScriptedProvider: whole transcripts, whole event sequences."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import pytest

from keel.agent.events import (
    AssistantMessage,
    Event,
    RequestStarted,
    ToolFinished,
    ToolStarted,
    TurnFinished,
    TurnStarted,
    UsageUpdated,
)
from keel.agent.limits import Limits
from keel.agent.loop import Agent
from keel.llm.catalog import ModelInfo
from keel.llm.errors import APIError
from keel.llm.events import Done, Notice, StreamEvent, TextDelta, ToolUseDelta, ToolUseStart
from keel.llm.messages import Message, Text, ToolResult, ToolUse, Usage, tool_result
from keel.llm.providers.scripted import ScriptedProvider
from keel.llm.request import Request
from keel.llm.script import Fault, Reply, reply
from keel.permissions import AllowAll
from keel.session.journal import Journal, read_records
from keel.session.records import TerminalRecord, ToolResultRecord
from keel.session.store import SessionLog
from keel.tools.base import ToolContext, ToolError, tool
from keel.tools.builtin import builtin_tools

SYSTEM = "test system prompt"


def make_agent(provider: Any, project: Path, **kw: Any) -> Agent:
    kw.setdefault("tools", builtin_tools())
    kw.setdefault("gate", AllowAll())  # these tests are about the loop, not permissions
    return Agent(provider=provider, model="scripted", cwd=project, system=SYSTEM, **kw)


def call(id_: str, tool_name: str, /, **args: Any) -> ToolUse:
    return ToolUse(id_, tool_name, args)


def scripted_reply(*blocks: Any, usage: Usage | None = None, stop: Any = None) -> Reply:
    return Reply(Message("assistant", tuple(blocks)), usage or Usage(100, 20), stop)


def kinds(events: list[Event]) -> list[str]:
    return [type(e).__name__ for e in events]


async def test_tool_round_trip_whole_transcript_and_events(project: Path) -> None:
    provider = ScriptedProvider(
        [
            scripted_reply(Text("Reading."), call("t1", "read", path="util.py")),
            scripted_reply(Text("X is 1.")),
        ]
    )
    agent = make_agent(provider, project)
    events: list[Event] = []
    result = await agent.run("what is X?", events.append)

    assert result.stop_reason == "end_turn"
    assert result.text == "X is 1."
    assert result.turns == 2
    assert result.usage == Usage(200, 40)
    assert agent.messages == [
        Message("user", (Text("what is X?"),)),
        Message(
            "assistant",
            (Text("Reading."), call("t1", "read", path="util.py")),
            "scripted",
            "scripted",
        ),
        Message("user", (tool_result("t1", "     1\tX = 1"),)),
        Message("assistant", (Text("X is 1."),), "scripted", "scripted"),
    ]
    assert kinds(events) == [
        "TurnStarted",
        "RequestStarted",
        "TextDelta",
        "ToolUseStart",
        "ToolUseDelta",
        "RequestFinished",
        "AssistantMessage",
        "UsageUpdated",
        "ToolStarted",
        "ToolFinished",
        "RequestStarted",
        "TextDelta",
        "RequestFinished",
        "AssistantMessage",
        "UsageUpdated",
        "TurnFinished",
    ]
    assert events[0] == TurnStarted("what is X?", agent.session_id)
    assert events[3] == ToolUseStart("t1", "read")
    assert events[4] == ToolUseDelta("t1", '{"path": "util.py"}')
    finished = events[-1]
    assert finished == TurnFinished("end_turn", "X is 1.", Usage(200, 40), 0.0, 2, agent.session_id)

    first, second = provider.requests
    assert first.system == SYSTEM
    assert [t.name for t in first.tools] == [
        "bash",
        "bash_kill",
        "bash_output",
        "edit",
        "exit_plan_mode",
        "glob",
        "grep",
        "ls",
        "multi_edit",
        "raw_output",
        "read",
        "task_stop",
        "task_wait",
        "todo_write",
        "web_fetch",
        "write",
    ]
    assert first.messages == (Message("user", (Text("what is X?"),)),)
    assert second.messages == tuple(agent.messages[:3])
    assert second.tools is first.tools  # the tool set is fixed per context
    assert first.cache_key == second.cache_key == agent.session_id
    provider.assert_finished()


async def test_stream_yields_the_same_events_ending_with_turn_finished(project: Path) -> None:
    agent = make_agent(ScriptedProvider([reply("hi")]), project)
    events = [e async for e in agent.stream("hello")]
    assert kinds(events) == [
        "TurnStarted",
        "RequestStarted",
        "TextDelta",
        "RequestFinished",
        "AssistantMessage",
        "UsageUpdated",
        "TurnFinished",
    ]


async def test_consecutive_read_only_calls_run_concurrently_and_results_keep_call_order(
    project: Path,
) -> None:
    spans: dict[str, tuple[float, float]] = {}

    @tool(read_only=True)
    async def slow_look(ctx: ToolContext, name: str) -> str:
        """Look slowly.

        Args:
            name: What to look at.
        """
        start = time.monotonic()
        await asyncio.sleep(0.2 if name == "a" else 0.05)
        spans[name] = (start, time.monotonic())
        return f"looked at {name}"

    @tool
    async def change(ctx: ToolContext, name: str) -> str:
        """Change something.

        Args:
            name: What to change.
        """
        spans[name] = (time.monotonic(), time.monotonic())
        return f"changed {name}"

    provider = ScriptedProvider(
        [
            scripted_reply(
                call("1", "slow_look", name="a"),
                call("2", "slow_look", name="b"),
                call("3", "change", name="c"),
                call("4", "slow_look", name="d"),
            ),
            reply("done"),
        ]
    )
    agent = make_agent(provider, project, tools=[slow_look, change])
    events: list[Event] = []
    await agent.run("go", events.append)

    # a and b overlap; c starts only after both; d only after c.
    assert spans["b"][0] < spans["a"][1]
    assert spans["c"][0] >= spans["a"][1]
    assert spans["d"][0] >= spans["c"][1]
    results = agent.messages[2]
    assert results == Message(
        "user",
        (
            tool_result("1", "looked at a"),
            tool_result("2", "looked at b"),
            tool_result("3", "changed c"),
            tool_result("4", "looked at d"),
        ),
    )
    finished_order = [e.call.id for e in events if isinstance(e, ToolFinished)]
    assert finished_order == ["2", "1", "3", "4"]  # b finished before a


class HangingProvider:
    """Streams `text` and then waits until cancelled."""

    name = "hanging"

    def __init__(self, text: str) -> None:
        self.text = text
        self.started = asyncio.Event()

    async def stream(self, request: Request) -> AsyncGenerator[StreamEvent, None]:
        yield TextDelta(self.text)
        self.started.set()
        await asyncio.sleep(3600)
        yield Done(Message("assistant", ()), Usage(), "end_turn")

    async def aclose(self) -> None:
        return None


async def test_interrupt_mid_stream_keeps_partial_text_with_mark(project: Path) -> None:
    provider = HangingProvider("Let me th")
    agent = make_agent(provider, project)
    events: list[Event] = []
    task = asyncio.create_task(agent.run("think", events.append))
    await provider.started.wait()
    agent.interrupt()
    result = await task

    assert result.stop_reason == "interrupted"
    assert agent.messages == [
        Message("user", (Text("think"),)),
        Message("assistant", (Text("Let me th\n\n[interrupted by user]"),), "hanging", "scripted"),
    ]
    assert isinstance(events[-1], TurnFinished)
    assert events[-1].stop_reason == "interrupted"


async def test_interrupt_during_tools_answers_every_call(project: Path) -> None:
    started = asyncio.Event()

    @tool
    async def wait_forever(ctx: ToolContext) -> str:
        """Wait."""
        started.set()
        await asyncio.sleep(3600)
        return "never"

    @tool
    async def quick(ctx: ToolContext) -> str:
        """Quick."""
        return "quick done"

    provider = ScriptedProvider(
        [
            scripted_reply(call("1", "quick"), call("2", "wait_forever"), call("3", "quick")),
        ]
    )
    agent = make_agent(provider, project, tools=[wait_forever, quick])
    task = asyncio.create_task(agent.run("go"))
    await started.wait()
    agent.interrupt()
    result = await task

    assert result.stop_reason == "interrupted"
    assert agent.messages[-1] == Message(
        "user",
        (
            tool_result("1", "quick done"),
            tool_result("2", "interrupted by user", is_error=True),
            tool_result("3", "interrupted by user", is_error=True),
        ),
    )
    # The next prompt continues the same conversation with roles alternating.
    provider.steps.append(reply("ok"))
    await agent.run("continue")
    assert [m.role for m in agent.messages] == ["user", "assistant", "user", "assistant"]
    assert agent.messages[2].blocks[-1] == Text("continue")


async def test_max_turns_stops_with_notice(project: Path) -> None:
    provider = ScriptedProvider(
        [scripted_reply(call(f"t{i}", "glob", pattern="*.py")) for i in range(3)]
    )
    agent = make_agent(provider, project, limits=Limits(max_turns=2))
    events: list[Event] = []
    result = await agent.run("loop", events.append)
    assert result.stop_reason == "max_turns"
    assert len(provider.requests) == 2
    assert Notice("stopped after 2 model turns (max_turns)", "warning") in events
    assert agent.messages[-1].role == "user"  # tool results of turn 2 are in place


async def test_token_budget_warns_once_then_stops_before_a_request_it_cannot_pay(
    project: Path,
) -> None:
    ran: list[str] = []

    @tool
    async def act(ctx: ToolContext, n: int) -> str:
        """Act.

        Args:
            n: Which step.
        """
        ran.append(str(n))
        return "ok"

    provider = ScriptedProvider(
        [scripted_reply(call(f"t{i}", "act", n=i), usage=Usage(300, 20)) for i in range(5)]
    )
    agent = make_agent(
        provider, project, tools=[act], limits=Limits(max_tokens=700, min_output_tokens=10)
    )
    events: list[Event] = []
    result = await agent.run("go", events.append)

    assert result.stop_reason == "budget"
    # Two requests fit; the third, whose input alone is more than the 60 tokens left, is never
    # sent.
    assert ran == ["0", "1"]
    assert len(provider.requests) == 2
    # 700 less the first request's ~48 estimated tokens and the 400 a provider adds unseen.
    assert provider.requests[0].max_tokens == 252
    notices = [e for e in events if isinstance(e, Notice)]
    assert notices == [
        Notice("the budget left pays for 252 output tokens: max_tokens lowered to that", "info"),
        Notice("91% of the token budget used (640 tokens of 700 tokens)", "warning"),
        Notice(
            "budget: 60 tokens left of the 700-token budget; the next request needs ~330 "
            "(~320 input and at least 10 output tokens)",
            "warning",
        ),
    ]
    assert agent.messages[-1] == Message("user", (tool_result("t1", "ok"),))


async def test_usd_budget_stops_before_the_next_request(project: Path) -> None:
    priced = ModelInfo(200_000, 8_000, 3.0, 15.0, 0.3, 3.75)
    provider = ScriptedProvider(
        [scripted_reply(call("a", "glob", pattern="*"), usage=Usage(10_000, 1_000)), reply("x")]
    )
    agent = make_agent(provider, project, info=priced, limits=Limits(max_usd=0.04))
    result = await agent.run("go")
    # 10k * $3/M + 1k * $15/M = $0.045 ≥ $0.04: stop before tools.
    assert result.stop_reason == "budget"
    assert result.cost == pytest.approx(0.045)
    assert len(provider.requests) == 1


async def test_truncated_json_unknown_tool_and_bad_arguments_become_error_results(
    project: Path,
) -> None:
    provider = ScriptedProvider(
        [
            scripted_reply(
                ToolUse("a", "read", None, '{"path": "ap'),
                call("b", "teleport", to="mars"),
                call("c", "read"),
                call("d", "write", path="util.py", content="x", colour="red"),
            ),
            reply("ok"),
        ],
        check_tools=False,
    )
    agent = make_agent(provider, project)
    await agent.run("go")
    assert agent.messages[2] == Message(
        "user",
        (
            tool_result(
                "a",
                "INVALID_JSON: the arguments for read were cut off or not valid JSON "
                '(\'{"path": "ap\'); retry the call with complete, valid JSON',
                is_error=True,
            ),
            tool_result(
                "b",
                "unknown tool 'teleport'; available tools: bash, bash_kill, bash_output, edit, "
                "exit_plan_mode, glob, grep, ls, multi_edit, raw_output, read, task_stop, "
                "task_wait, todo_write, web_fetch, write",
                is_error=True,
            ),
            tool_result("c", "INVALID_ARGUMENTS: missing required argument 'path'", is_error=True),
            tool_result(
                "d",
                "INVALID_ARGUMENTS: unknown argument(s) colour; accepted: path, content",
                is_error=True,
            ),
        ),
    )


async def test_a_read_only_tool_ignores_an_argument_it_does_not_have(project: Path) -> None:
    """Small models add arguments (`read` with a `content`): a read-only tool runs without them
    and says so; a tool that changes something refuses them (above)."""
    provider = ScriptedProvider(
        [
            scripted_reply(
                call("a", "read", path="util.py"),
                call("b", "read", path="util.py", content="MAX=1", colour="red"),
            ),
            reply("ok"),
        ]
    )
    agent = make_agent(provider, project)
    await agent.run("go")
    plain, extra = agent.messages[2].tool_results
    assert not extra.is_error
    assert extra.text == (
        "(ignored unknown argument(s) colour, content; accepted: path, offset, limit)\n"
        + plain.text
    )


async def test_scripted_truncated_tool_json_reaches_the_model_as_invalid_json(
    project: Path,
) -> None:
    r = reply("", ("read", {"path": "util.py"}))
    r.truncate_tool_json = True
    provider = ScriptedProvider([r, reply("retrying later")])
    agent = make_agent(provider, project)
    result = await agent.run("go")
    assert result.stop_reason == "end_turn"
    (res,) = agent.messages[2].tool_results
    assert res.is_error
    assert res.text.startswith("INVALID_JSON")


@pytest.mark.parametrize(
    ("stop", "expected", "notice"),
    [
        ("max_tokens", "max_tokens", "the response hit the output token limit"),
        ("refusal", "refusal", "the model declined to answer"),
    ],
)
async def test_max_tokens_and_refusal_end_the_turn_with_a_notice(
    project: Path, stop: Any, expected: str, notice: str
) -> None:
    # Cut where keel asked (16,000 tokens, the default for a model of unknown output limit).
    cut = scripted_reply(Text("partial"), usage=Usage(100, 16_000), stop=stop)
    provider = ScriptedProvider([cut])
    events: list[Event] = []
    result = await make_agent(provider, project).run("go", events.append)
    assert provider.requests[0].max_tokens == 16_000
    assert result.stop_reason == expected
    assert Notice(notice, "warning") in events


async def test_pause_turn_resends_the_conversation(project: Path) -> None:
    provider = ScriptedProvider(
        [scripted_reply(Text("working"), stop="pause_turn"), reply("finished")]
    )
    agent = make_agent(provider, project)
    result = await agent.run("go")
    assert result.text == "finished"
    assert provider.requests[1].messages[-1] == Message(
        "assistant", (Text("working"),), "scripted", "scripted"
    )


async def test_provider_error_ends_turn_and_next_prompt_merges(project: Path) -> None:
    provider = ScriptedProvider([Fault("status", status=401, message="invalid x-api-key")])
    agent = make_agent(provider, project)
    events: list[Event] = []
    result = await agent.run("first", events.append)
    assert result.stop_reason == "error"
    assert result.error == "invalid x-api-key"
    assert isinstance(events[-1], TurnFinished)
    assert events[-1].error == "invalid x-api-key"
    provider.steps.append(reply("ok"))
    await agent.run("second")
    assert agent.messages[0] == Message("user", (Text("first"), Text("second")))


async def test_divergence_fails_loudly(project: Path) -> None:
    provider = ScriptedProvider([scripted_reply(call("a", "glob", pattern="*.md"))])
    result = await make_agent(provider, project).run("go")
    assert result.stop_reason == "error"
    assert result.error is not None
    assert "model request #2 but the script has only 1 step(s)" in result.error
    assert "ToolResult" in result.error


async def test_script_calling_a_tool_the_run_does_not_offer_is_divergence(project: Path) -> None:
    provider = ScriptedProvider([scripted_reply(call("a", "teleport"))])
    result = await make_agent(provider, project).run("go")
    assert result.error is not None
    assert "calls tool 'teleport' but the run offers only" in result.error


async def test_tool_failures_are_results(project: Path) -> None:
    @tool
    async def broken(ctx: ToolContext) -> str:
        """Broken."""
        raise KeyError("boom")

    @tool
    async def picky(ctx: ToolContext) -> str:
        """Picky."""
        raise ToolError("use a smaller input")

    provider = ScriptedProvider(
        [scripted_reply(call("a", "broken"), call("b", "picky")), reply("ok")]
    )
    agent = make_agent(provider, project, tools=[broken, picky])
    await agent.run("go")
    assert agent.messages[2].blocks == (
        tool_result("a", "broken failed unexpectedly: KeyError: 'boom'", is_error=True),
        tool_result("b", "use a smaller input", is_error=True),
    )


async def test_large_tool_output_is_truncated_once(project: Path) -> None:
    provider = ScriptedProvider(
        [
            scripted_reply(call("a", "bash", command="python3 -c 'print(\"x\" * 100000)'")),
            reply("ok"),
        ]
    )
    agent = make_agent(provider, project)
    await agent.run("go")
    (res,) = agent.messages[2].tool_results
    assert len(res.text.encode()) <= 30_100
    assert "bytes truncated] ..." in res.text
    assert res.text.endswith("[exit code 0]")


async def test_notes_are_prepended_to_the_next_prompt(project: Path) -> None:
    provider = ScriptedProvider([reply("ok")])
    agent = make_agent(provider, project)
    agent.add_note("The user undid the last change.")
    await agent.run("next")
    assert agent.messages[0].text == (
        "<system-note>\nThe user undid the last change.\n</system-note>\n\nnext"
    )


async def test_empty_response_is_stored_as_placeholder(project: Path) -> None:
    provider = ScriptedProvider([scripted_reply()])
    agent = make_agent(provider, project)
    await agent.run("go")
    assert agent.messages[1].blocks == (Text("(empty response)"),)


async def test_journal_records_before_side_effects(project: Path, tmp_path: Path) -> None:
    journal_seen: list[int] = []

    @tool
    async def side_effect(ctx: ToolContext) -> str:
        """Do something visible."""
        # When the tool runs, its assistant record is already on disk.
        records = read_records(session.path).records
        journal_seen.append(len(records))
        assert records[-1].payload.type == "assistant"
        return "done"

    session = SessionLog.create(cwd=project, model="scripted", directory=tmp_path / "s")
    provider = ScriptedProvider([scripted_reply(call("a", "side_effect")), reply("ok")])
    agent = make_agent(provider, project, tools=[side_effect], session=session)
    await agent.run("go")
    agent.session = None
    session.close()

    records = read_records(session.path).records
    assert [r.seq for r in records] == list(range(1, len(records) + 1))
    assert [r.payload.type for r in records] == [
        "meta",
        "user",
        "assistant",
        "tool_result",
        "assistant",
        "terminal",
    ]
    assert journal_seen == [3]
    result_payload, terminal = records[3].payload, records[-1].payload
    assert isinstance(result_payload, ToolResultRecord)
    assert result_payload.result == tool_result("a", "done")
    assert isinstance(terminal, TerminalRecord)
    assert terminal.reason == "completed"


async def test_each_tool_result_is_durable_before_the_next_tool_runs(
    project: Path, tmp_path: Path
) -> None:
    seen: list[tuple[str, int, int]] = []

    @tool
    async def step(ctx: ToolContext, name: str) -> str:
        """A step with a side effect.

        Args:
            name: Which step.
        """
        journal = session.journal
        assert isinstance(journal, Journal)
        seen.append((name, journal.last_seq, journal._synced_seq))
        return f"did {name}"

    session = SessionLog.create(cwd=project, model="scripted", directory=tmp_path / "s")
    provider = ScriptedProvider(
        [scripted_reply(call("a", "step", name="one"), call("b", "step", name="two")), reply("ok")]
    )
    agent = make_agent(provider, project, tools=[step], session=session)
    await agent.run("go")
    session.close()
    # meta=1, user=2, assistant=3: durable before the first tool; the first result (4) is durable
    # before the second tool starts.
    assert seen == [("one", 3, 3), ("two", 4, 4)]


async def test_usage_events_carry_context_and_window(project: Path) -> None:
    info = ModelInfo(1000, 100)
    provider = ScriptedProvider([scripted_reply(Text("hi"), usage=Usage(300, 50, 100, 0))])
    events: list[Event] = []
    await make_agent(provider, project, info=info).run("go", events.append)
    (usage,) = [e for e in events if isinstance(e, UsageUpdated)]
    assert usage == UsageUpdated(Usage(300, 50, 100, 0), Usage(300, 50, 100, 0), 0.0, 450, 1000)
    (msg,) = [e for e in events if isinstance(e, AssistantMessage)]
    assert msg.stop_reason == "end_turn"
    assert [type(e) for e in events[:2]] == [TurnStarted, RequestStarted]
    assert not [e for e in events if isinstance(e, ToolStarted)]


async def test_api_error_status_survives_to_the_result(project: Path) -> None:
    class Failing:
        name = "failing"

        async def stream(self, request: Request) -> AsyncGenerator[StreamEvent, None]:
            yield Notice("about to fail")
            raise APIError("boom", status=500, retryable=True, provider="failing", hint="try later")

        async def aclose(self) -> None:
            return None

    result = await make_agent(Failing(), project).run("go")
    assert result.error == "boom (hint: try later)"


def test_tool_result_helper_builds_one_text_block() -> None:
    assert tool_result("x", "y") == ToolResult("x", (Text("y"),), False)
