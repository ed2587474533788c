"""`keel.app`: the one assembly every front end uses, and questions as events answered through
`Agent.answer` (issue 15)."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest

from keel.agent.events import Event, PermissionAnswered, PermissionAsked, ToolFinished
from keel.agent.loop import Agent, RunResult
from keel.app import Options, open_agent, resume_agent
from keel.llm.events import Notice
from keel.permissions.gate import PermissionReply
from keel.session.journal import SessionLocked, read_records
from keel.session.records import DecisionRecord
from tests.test_cli import write_script

SRC = Path(__file__).resolve().parent.parent / "src" / "keel"


def writer(tmp_path: Path) -> Path:
    return write_script(
        tmp_path / "s.json",
        [
            {
                "text": "writing",
                "tool_calls": [{"name": "write", "input": {"path": "out.txt", "content": "hi"}}],
            },
            {"text": "done"},
        ],
    )


async def until_asked(
    project: Path, tmp_path: Path
) -> tuple[Agent, list[Event], asyncio.Task[RunResult]]:
    """An interactive agent running `writer`'s prompt, once its permission question is out:
    the agent, the events so far (still filling), the running prompt."""
    options = Options(cwd=project, model=f"scripted:{writer(tmp_path)}", interactive=True)
    agent = await open_agent(options)
    events: list[Event] = []
    asked = asyncio.Event()

    def sink(event: Event) -> None:
        events.append(event)
        if isinstance(event, PermissionAsked):
            asked.set()

    run = asyncio.create_task(agent.run("write it", sink))
    try:
        await asyncio.wait_for(asked.wait(), 10)
    except BaseException:
        await agent.aclose()
        raise
    return agent, events, run


async def test_a_question_waits_for_its_answer(project: Path, tmp_path: Path) -> None:
    agent, events, run = await until_asked(project, tmp_path)
    try:
        question = next(e for e in events if isinstance(e, PermissionAsked))
        assert agent.pending_questions() == [question]
        assert (question.call.name, question.reason, question.suggestion) == (
            "write",
            "change out.txt",
            "write",
        )
        assert not (project / "out.txt").exists()
        assert agent.answer("perm-404", PermissionReply(True)) is False
        with pytest.raises(TypeError):
            agent.answer(question.request_id, {"values": 1})
        assert agent.answer(question.request_id, PermissionReply(True)) is True
        assert agent.answer(question.request_id, PermissionReply(True)) is False  # once
        result = await asyncio.wait_for(run, 10)
    finally:
        await agent.aclose()
    assert (result.stop_reason, result.text) == ("end_turn", "done")
    assert (project / "out.txt").read_text() == "hi"
    assert agent.pending_questions() == []
    answered = [e for e in events if isinstance(e, PermissionAnswered)]
    assert [(a.request_id, a.call_id, a.allow, a.scope, a.by) for a in answered] == [
        (question.request_id, question.call.id, True, "once", "user")
    ]
    assert answered[0].waited_ms >= 0
    assert agent.session is not None
    decisions = [
        r.payload
        for r in read_records(agent.session.path).records
        if isinstance(r.payload, DecisionRecord)
    ]
    assert [(d.tool, d.outcome, d.source) for d in decisions] == [("write", "allow", "user:once")]
    assert decisions[0].waited_ms == pytest.approx(answered[0].waited_ms, abs=0.1)
    assert decisions[0].waited_ms > 0


async def test_an_interrupt_withdraws_the_question(project: Path, tmp_path: Path) -> None:
    agent, events, run = await until_asked(project, tmp_path)
    try:
        agent.interrupt()
        result = await asyncio.wait_for(run, 10)
    finally:
        await agent.aclose()
    assert result.stop_reason == "interrupted"
    assert agent.pending_questions() == []
    answered = [e for e in events if isinstance(e, PermissionAnswered)]
    assert [(a.allow, a.by, a.reason) for a in answered] == [(False, "cancelled", "cancelled")]
    assert not (project / "out.txt").exists()


async def test_without_someone_to_ask_the_question_is_refused(
    project: Path, tmp_path: Path
) -> None:
    options = Options(cwd=project, model=f"scripted:{writer(tmp_path)}", interactive=False)
    agent = await open_agent(options)
    events: list[Event] = []
    try:
        result = await agent.run("write it", events.append)
    finally:
        await agent.aclose()
    assert result.stop_reason == "end_turn"
    assert not [e for e in events if isinstance(e, PermissionAsked)]
    finished = next(e for e in events if isinstance(e, ToolFinished))
    assert finished.result.is_error
    assert "keel is running non-interactively" in finished.result.text
    assert not (project / "out.txt").exists()


async def test_build_notices_go_to_the_front_end(project: Path, tmp_path: Path) -> None:
    (project / ".keel").mkdir()
    (project / ".keel" / "settings.local.json").write_text('{"max_turns": "many"}')
    notices: list[Event] = []
    agent = await open_agent(
        Options(cwd=project, model=f"scripted:{writer(tmp_path)}"), notices.append
    )
    await agent.aclose()
    warnings = [e.text for e in notices if isinstance(e, Notice) and e.level == "warning"]
    # (Without bubblewrap the sandbox status is a warning too.)
    settings = [w for w in warnings if "settings.local.json" in w]
    assert len(settings) == 1
    assert "max_turns" in settings[0]
    assert all(w == settings[0] or w.startswith("no sandbox") for w in warnings), warnings


async def test_a_session_opens_once(project: Path, tmp_path: Path) -> None:
    options = Options(cwd=project, model=f"scripted:{writer(tmp_path)}")
    agent = await open_agent(options)
    try:
        await agent.run("write it")
        assert agent.session is not None
        path = agent.session.path
        with pytest.raises(SessionLocked):  # the first agent holds it
            await resume_agent(path, options)
    finally:
        await agent.aclose()
    opened = await resume_agent(path, options)
    try:
        assert opened.state.meta.id == agent.session_id
        assert opened.agent.session_id == agent.session_id
        assert opened.ref.provider == "scripted"
    finally:
        await opened.agent.aclose()


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


FRONT_ENDS = ("tui", "server", "acp")


@pytest.mark.parametrize("package", ["tui", "app", "agent", "session", "server", "acp", "trace"])
def test_front_ends_import_downward_only(package: str) -> None:
    """`keel.cli` is the top: nothing below it imports it, and no front end imports another
    (the TUI, the server and ACP build agents through `keel.app` and share what is below)."""
    above = ["cli", *(f for f in FRONT_ENDS if f != package)]

    def upward(module: str) -> bool:
        return any(module == f"keel.{a}" or module.startswith(f"keel.{a}.") for a in above)

    offenders = {
        str(path.relative_to(SRC)): sorted(m for m in _imports(path) if upward(m))
        for path in sorted((SRC / package).rglob("*.py"))
    }
    assert {k: v for k, v in offenders.items() if v} == {}
