"""Context management: the system prompt's sources, compaction (threshold, overflow, manual,
malformed summaries, a half-finished batch, resume), the loop guard, and raw outputs."""

from __future__ import annotations

import os
from datetime import date
from pathlib import Path
from typing import Any

import pytest

from keel.agent.compaction import (
    COMPACT_PROMPT,
    CONTINUE,
    PREAMBLE,
    compaction_messages,
    parse_summary,
    summary_cap,
)
from keel.agent.events import ContextCompacted, Event
from keel.agent.limits import MIN_OUTPUT_TOKENS
from keel.agent.loop import Agent
from keel.agent.prompt import (
    BASE_PROMPT,
    build_context,
    build_system_prompt,
    context_text,
    instruction_files,
)
from keel.llm.catalog import ModelInfo
from keel.llm.events import Notice
from keel.llm.messages import Message, Text, ToolUse, Usage, tool_result, user
from keel.llm.providers.scripted import ScriptedProvider
from keel.llm.request import Request
from keel.llm.script import Fault, Reply
from keel.permissions import AllowAll
from keel.session.fold import fold
from keel.session.journal import read_records
from keel.session.records import CompactionRecord
from keel.session.store import SessionLog
from keel.tools.builtin import builtin_tools

SMALL = ModelInfo(window=1000, max_output=500)


DEFAULT_USAGE = Usage(100, 10)


def say(text: str, usage: Usage = DEFAULT_USAGE) -> Reply:
    return Reply(Message("assistant", (Text(text),)), usage)


def calls(*uses: ToolUse, usage: Usage = DEFAULT_USAGE) -> Reply:
    return Reply(Message("assistant", uses), usage)


def agent_for(project: Path, steps: list[Any], **kw: Any) -> tuple[Agent, ScriptedProvider]:
    provider = ScriptedProvider(steps)
    kw.setdefault("info", SMALL)
    agent = Agent(
        provider=provider,
        model="scripted",
        tools=builtin_tools(),
        cwd=project,
        system="system prompt",
        **kw,
    )
    return agent, provider


# -- the system prompt -----------------------------------------------------------------------------


def test_instruction_files_from_the_user_and_the_git_root_down(tmp_path: Path) -> None:
    user_dir = tmp_path / "config"
    user_dir.mkdir()
    (user_dir / "AGENTS.md").write_text("Answer in British English.", encoding="utf-8")
    root = tmp_path / "repo"
    sub = root / "pkg" / "mod"
    sub.mkdir(parents=True)
    (root / ".git").mkdir()
    (root / "AGENTS.md").write_text("Run make test.", encoding="utf-8")
    (root / "CLAUDE.md").write_text("ignored: AGENTS.md wins here", encoding="utf-8")
    (root / "pkg" / "CLAUDE.md").write_text("pkg is vendored; do not edit.", encoding="utf-8")
    (sub / "AGENTS.md").write_text("Tests live in tests/.", encoding="utf-8")
    assert instruction_files(sub, user_dir=user_dir) == [
        user_dir / "AGENTS.md",
        root / "AGENTS.md",
        root / "pkg" / "CLAUDE.md",
        sub / "AGENTS.md",
    ]
    context = build_context(
        sub, today=date(2026, 11, 30), user_dir=user_dir, extra_sections=["<skills/>"]
    )
    uname = os.uname()
    assert context == (
        f"<env>\nWorking directory: {sub}\nPlatform: {uname.sysname.lower()} {uname.release}\n"
        f"Date: 2026-11-30\nGit repository: {root}\n</env>\n\n"
        f'<instructions source="{user_dir / "AGENTS.md"}">\nAnswer in British English.\n</instructions>\n\n'
        f'<instructions source="{root / "AGENTS.md"}">\nRun make test.\n</instructions>\n\n'
        f'<instructions source="{root / "pkg" / "CLAUDE.md"}">\npkg is vendored; do not edit.\n</instructions>\n\n'
        f'<instructions source="{sub / "AGENTS.md"}">\nTests live in tests/.\n</instructions>\n\n'
        "<skills/>"
    )
    # The system prompt holds none of it: the same bytes in every project.
    assert build_system_prompt() == BASE_PROMPT


async def test_the_system_prompt_is_fixed_for_the_context(project: Path) -> None:
    (project / "AGENTS.md").write_text("Be brief.", encoding="utf-8")
    provider = ScriptedProvider([say("a"), say("b")])
    agent = Agent(provider=provider, model="scripted", tools=[], cwd=project)
    await agent.run("one")
    (project / "AGENTS.md").write_text("Be verbose.", encoding="utf-8")  # waits for a fresh context
    await agent.run("two")
    first, second = provider.requests
    assert first.system == second.system == BASE_PROMPT
    # The context opens the first user message and stays as it was sent.
    opening = Message("user", (Text(context_text(agent.context)), Text("one")))
    assert first.messages[0] == second.messages[0] == opening
    assert (
        f'<instructions source="{project / "AGENTS.md"}">\nBe brief.\n</instructions>'
        in agent.context
    )


# -- compaction: the pieces ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "summary"),
    [
        ("<summary>kept</summary>", "kept"),
        ("Sure.\n<summary>\nkept\n</summary>\nDone.", "kept"),
        ("no tags at all", "no tags at all"),
        ("<summary>cut off by the limit", "cut off by the limit"),
        ("<summary>draft</summary> <SUMMARY>final</summary>", "final"),
    ],
)
def test_summaries_are_parsed_leniently(reply: str, summary: str) -> None:
    assert parse_summary(reply) == summary


def test_summary_cap() -> None:
    assert summary_cap(200_000, 64_000) == 32_000
    assert summary_cap(200_000, 8_192) == 8_192
    assert summary_cap(32_768, 16_000) == 8_192
    assert summary_cap(2_000, 16_000) == 1_000


def test_the_summary_request_keeps_the_prefix_and_answers_waiting_calls() -> None:
    a = Message("assistant", (ToolUse("t1", "read", {"path": "x"}),))
    history = (user("go"), a)
    out = compaction_messages(history, "keep the error text")
    assert out[:2] == history
    assert out[2] == Message(
        "user",
        (
            tool_result("t1", "not run yet: the conversation is being summarized", is_error=True),
            Text(COMPACT_PROMPT + "\n\nAlso: keep the error text"),
        ),
    )
    ending_on_results = (user("go"), a, Message("user", (tool_result("t1", "x!"),)))
    out = compaction_messages(ending_on_results)
    assert out[:2] == ending_on_results[:2]
    assert out[2] == Message("user", (tool_result("t1", "x!"), Text(COMPACT_PROMPT)))


# -- compaction in the loop ----------------------------------------------------------------------


async def test_threshold_compaction_mid_turn(project: Path, tmp_path: Path) -> None:
    session = SessionLog.create(cwd=project, model="scripted", directory=tmp_path / "s")
    agent, provider = agent_for(
        project,
        [
            calls(ToolUse("t1", "glob", {"pattern": "*.py"}), usage=Usage(300, 20)),
            calls(ToolUse("t2", "read", {"path": "util.py"}), usage=Usage(700, 150)),  # 850 > 80%
            say("<summary>The user asked to list and read files.</summary>", Usage(900, 40)),
            say("Finished.", Usage(200, 5)),
        ],
        session=session,
    )
    events: list[Event] = []
    result = await agent.run("list and read the files", events.append)
    session.close()
    assert result.stop_reason == "end_turn"
    agent_turn_2 = Message(
        "assistant", (ToolUse("t2", "read", {"path": "util.py"}),), "scripted", "scripted"
    )
    summary_request = provider.requests[2]
    assert summary_request.system == provider.requests[1].system
    assert summary_request.tools == provider.requests[1].tools
    # summary_cap gives 1,000, but the 1,000-token window is nearly full: the floor is asked.
    assert summary_request.max_tokens == MIN_OUTPUT_TOKENS
    assert summary_request.messages[:3] == provider.requests[1].messages
    assert summary_request.messages[3] == agent_turn_2
    assert summary_request.messages[4].blocks[-1] == Text(COMPACT_PROMPT)
    expected = (
        f"{PREAMBLE}\n\n<summary>\nThe user asked to list and read files.\n</summary>\n\n"
        f"The full transcript before this point is in {session.path} (JSON lines). If you need an "
        "exact detail the summary left out (a command, an error, a path), grep it there rather "
        f"than guessing.\n\n{CONTINUE}"
    )
    assert provider.requests[3].messages == (Message("user", (Text(expected),)),)
    assert agent.messages[0] == Message("user", (Text(expected),))
    (compacted,) = [e for e in events if isinstance(e, ContextCompacted)]
    assert compacted.trigger == "auto"
    assert compacted.tokens_before >= 850
    records = [r.payload for r in read_records(session.path).records]
    (record,) = [p for p in records if isinstance(p, CompactionRecord)]
    assert record.summary == expected
    assert record.usage == Usage(900, 40)
    # Resume rebuilds the same state, spend included.
    state = fold(read_records(session.path).records)
    assert state.messages == [
        Message("user", (Text(expected),)),
        Message("assistant", (Text("Finished."),), "scripted", "scripted"),
    ]
    assert state.usage == Usage(300 + 700 + 900 + 200, 20 + 150 + 40 + 5)


async def test_compaction_at_the_start_of_a_turn_carries_open_todos(project: Path) -> None:
    todos = {
        "todos": [
            {"content": "write tests", "status": "completed"},
            {"content": "fix the parser", "status": "in_progress"},
            {"content": "update docs", "status": "pending"},
        ]
    }
    agent, provider = agent_for(
        project,
        [
            calls(ToolUse("t1", "todo_write", todos)),
            say("Working on it.", Usage(800, 100)),  # the next turn starts above the threshold
            # It names both unfinished items: the check finds them, no repair is asked.
            say("<summary>Parser work: fix the parser, then update docs.</summary>"),
            say("ok"),
        ],
    )
    await agent.run("plan it")
    await agent.run("go on")
    first = provider.requests[3].messages[0]
    assert first.blocks[0] == Text(
        f"{PREAMBLE}\n\n<summary>\nParser work: fix the parser, then update docs.\n</summary>\n\n"
        "Unfinished todo items:\n- [>] fix the parser\n- [ ] update docs"
    )
    assert first.blocks[1] == Text("go on")  # the new prompt joins the summary message


async def test_auto_compact_off_never_compacts(project: Path) -> None:
    agent, provider = agent_for(
        project,
        [
            calls(ToolUse("t1", "glob", {"pattern": "*"}), usage=Usage(900, 90)),
            calls(ToolUse("t2", "glob", {"pattern": "*"}), usage=Usage(950, 40)),
            say("done"),
        ],
    )
    agent.auto_compact = False
    assert (await agent.run("go")).stop_reason == "end_turn"
    assert len(provider.requests) == 3


async def test_overflow_compacts_once_and_retries(project: Path) -> None:
    seen: list[tuple[str, str]] = []

    async def pre_compact(trigger: str, instructions: str) -> None:
        seen.append((trigger, instructions))

    agent, provider = agent_for(
        project,
        [
            calls(ToolUse("t1", "glob", {"pattern": "*"})),
            Fault("overflow", message="prompt is too long: 1200 tokens > 1000 maximum"),
            say("<summary>s</summary>"),
            say("done after compacting"),
        ],
        info=ModelInfo(100_000, 4_000),
    )
    agent.pre_compact.append(pre_compact)
    events: list[Event] = []
    result = await agent.run("go", events.append)
    assert result.stop_reason == "end_turn"
    assert result.text == "done after compacting"
    assert seen == [("overflow", "")]
    assert (
        Notice("the prompt no longer fits the context window; compacting and retrying", "warning")
        in events
    )
    assert provider.requests[3].messages[0].text.endswith(CONTINUE)


async def test_overflow_right_after_compaction_is_a_clear_error(project: Path) -> None:
    agent, _ = agent_for(
        project,
        [
            calls(ToolUse("t1", "glob", {"pattern": "*"})),
            Fault("overflow", message="prompt is too long"),
            say("<summary>s</summary>"),
            Fault("overflow", message="prompt is still too long"),
        ],
        info=ModelInfo(100_000, 4_000),
    )
    result = await agent.run("go")
    assert result.stop_reason == "error"
    assert result.error == (
        "the conversation does not fit the context window even after compacting: prompt is still "
        "too long (hint: start a fresh session, or use a model with a larger window)"
    )


async def test_overflow_recovery_is_once_per_request_and_armed_again_by_progress(
    project: Path,
) -> None:
    """An overflow compacts and retries once; a retry that overflows again ends the turn (no
    loop of compactions). Once a request has succeeded, a later overflow in the same prompt may
    compact again: a long prompt that makes progress is not cut short."""
    seen: list[tuple[str, str]] = []

    async def pre_compact(trigger: str, instructions: str) -> None:
        seen.append((trigger, instructions))

    agent, provider = agent_for(
        project,
        [
            calls(ToolUse("t1", "glob", {"pattern": "*"})),
            Fault("overflow", message="prompt is too long"),
            say("<summary>first</summary>"),
            calls(ToolUse("t2", "glob", {"pattern": "*"})),  # progress: recovery armed again
            Fault("overflow", message="prompt is too long"),
            say("<summary>second</summary>"),
            Fault("overflow", message="prompt is too long again"),  # the retry overflows too
        ],
        info=ModelInfo(100_000, 4_000),
    )
    agent.pre_compact.append(pre_compact)
    events: list[Event] = []
    result = await agent.run("go", events.append)
    assert result.stop_reason == "error"
    assert result.error == (
        "the conversation does not fit the context window even after compacting: prompt is too "
        "long again (hint: start a fresh session, or use a model with a larger window)"
    )
    assert [e.trigger for e in events if isinstance(e, ContextCompacted)] == [
        "overflow",
        "overflow",
    ]
    assert len(provider.requests) == 7
    assert seen == [("overflow", ""), ("overflow", "")]


async def test_overflow_on_the_first_request_says_the_prompt_is_too_long(project: Path) -> None:
    agent, provider = agent_for(project, [Fault("overflow", message="prompt is too long")])
    result = await agent.run("x" * 10)
    assert result.error == (
        "the prompt alone does not fit the model's context window: prompt is too long "
        "(hint: shorten the prompt, or use a model with a larger window)"
    )
    assert len(provider.requests) == 1


async def test_manual_compaction_of_a_half_finished_batch(project: Path, tmp_path: Path) -> None:
    session = SessionLog.create(cwd=project, model="scripted", directory=tmp_path / "s")
    agent, provider = agent_for(
        project,
        [say("<summary>Looking for docs and code.</summary>")],
        session=session,
        info=ModelInfo(100_000, 4_000),
    )
    # A run that died after journaling the reply, before any of its calls ran (a suspend waits
    # for the whole batch, so only a crash leaves a batch half-answered).
    session.user(user("find things"))
    uses = (ToolUse("t1", "glob", {"pattern": "*.md"}), ToolUse("t2", "glob", {"pattern": "*.py"}))
    session.assistant(
        Message("assistant", uses, "scripted", "scripted"), DEFAULT_USAGE, 0.0, "tool_use", 1
    )
    agent.restore(fold(read_records(session.path).records))
    record = await agent.compact("mention both patterns")
    request: Request = provider.requests[0]
    not_run = (
        "not run: the conversation was summarized before this call ran; call it again if "
        "it is still needed"
    )
    assert request.messages[-1].blocks[:2] == (
        tool_result("t1", not_run, is_error=True),
        tool_result("t2", not_run, is_error=True),
    )
    assert request.messages[-1].blocks[2].text.endswith("Also: mention both patterns")  # type: ignore[union-attr]
    assert record.trigger == "manual"
    assert agent.messages == [Message("user", (Text(record.summary),))]
    assert record.summary.endswith("Continue the task from where it left off.")  # it was mid-task
    session.close()
    # The journal answers every call, so a resume sees a consistent history.
    state = fold(read_records(session.path).records)
    assert state.pending is None
    assert state.messages == [Message("user", (Text(record.summary),))]


# -- the loop guard ------------------------------------------------------------------------------


async def test_the_loop_guard_stops_an_unattended_run(project: Path) -> None:
    same = [calls(ToolUse(f"t{i}", "glob", {"pattern": "*.md"})) for i in range(6)]
    agent, provider = agent_for(project, same, info=ModelInfo(100_000, 4_000))
    events: list[Event] = []
    result = await agent.run("go", events.append)
    assert result.stop_reason == "loop"
    assert len(provider.requests) == 4
    assert (
        Notice("stopped: the same tool round repeated 4 times in the last 8 rounds", "warning")
        in events
    )


async def test_the_loop_guard_only_warns_an_interactive_user_once(project: Path) -> None:
    same = [calls(ToolUse(f"t{i}", "glob", {"pattern": "*.md"})) for i in range(6)] + [say("ok")]
    agent, _ = agent_for(project, same, info=ModelInfo(100_000, 4_000))
    agent.interactive = True
    events: list[Event] = []
    result = await agent.run("go", events.append)
    assert result.stop_reason == "end_turn"
    warnings = [e for e in events if isinstance(e, Notice) and "repeated" in e.text]
    assert len(warnings) == 1


async def test_different_results_are_not_a_loop(project: Path) -> None:
    steps = [calls(ToolUse(f"t{i}", "bash", {"command": "date +%N"})) for i in range(6)] + [
        say("ok")
    ]
    agent, _ = agent_for(project, steps, info=ModelInfo(100_000, 4_000))
    assert (await agent.run("go")).stop_reason == "end_turn"


# -- raw outputs ---------------------------------------------------------------------------------


async def test_truncated_outputs_are_kept_and_paged(project: Path, tmp_path: Path) -> None:
    session = SessionLog.create(cwd=project, model="scripted", directory=tmp_path / "s")
    command = "python3 -c \"print('\\n'.join('line %05d' % i for i in range(9000)))\""
    agent, _ = agent_for(
        project,
        [
            calls(ToolUse("big1", "bash", {"command": command})),
            calls(
                ToolUse("page", "raw_output", {"tool_use_id": "big1", "offset": 45000, "limit": 30})
            ),
            say("ok"),
        ],
        session=session,
        info=ModelInfo(100_000, 4_000),
        gate=AllowAll(),  # about truncation: bash runs the same with or without a sandbox here
    )
    await agent.run("go")
    session.close()
    big = agent.messages[2].tool_results[0].text
    assert 'bytes truncated; the whole output: raw_output(tool_use_id="big1")] ...' in big
    raw = tmp_path / "s" / f"{session.id}.raw" / "big1.txt"
    assert raw.stat().st_mode & 0o777 == 0o600
    assert raw.read_text(encoding="utf-8").endswith("line 08999\n[exit code 0]")
    page = agent.messages[4].tool_results[0].text
    # 9,000 lines of 11 bytes, then "[exit code 0]": byte 45,000 is the newline after line 4090.
    assert (
        page
        == "\nline 04091\nline 04092\nline 04\n\n[bytes 45000-45030 of 99013; continue with offset=45030]"
    )
