"""Subagents and background tasks, in process: scripted parent and child conversations (routed by
their first message, since children run concurrently) with real tools, real shells and real
session files."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from keel.agent.events import BackgroundFinished, Event, SubagentEvent, ToolStarted
from keel.agent.limits import Limits
from keel.agent.loop import NOTIFICATIONS_PROMPT, Agent
from keel.agent.prompt import context_text, env_block
from keel.agent.subagents import (
    EXPLORE_PROMPT,
    PARENT_ONLY,
    REPORT_FOOTER,
    enable_subagents,
    load_agent_types,
)
from keel.agent.worktrees import list_worktrees
from keel.checkpoints import Checkpoints
from keel.llm.catalog import ModelInfo
from keel.llm.messages import Text, ToolResult, Usage
from keel.llm.script import Fault, Reply, reply
from keel.permissions import AllowAll
from keel.session.journal import Journal
from keel.session.records import Meta, TerminalRecord
from keel.session.store import SessionLog
from keel.testing.routing import RoutedProvider
from keel.tools.background import STOPPED, BackgroundTask, BackgroundTasks, Status
from keel.tools.base import ToolContext
from keel.tools.builtin import builtin_tools
from keel.tools.builtin.shell import start_background

PARENT = "PARENT: look into the project"


_OPEN: list[Agent] = []


@pytest.fixture(autouse=True)
async def _close_agents() -> AsyncIterator[None]:
    """Close every agent a test made, so a failed assertion does not leave tasks running."""
    yield
    while _OPEN:
        await _OPEN.pop().aclose()


def make_agent(
    project: Path,
    scripts: dict[str, list[Any]],
    *,
    session: bool = False,
    limits: Limits | None = None,
    info: ModelInfo | None = None,
) -> tuple[Agent, RoutedProvider]:
    provider = RoutedProvider(scripts)
    agent = Agent(
        provider=provider,
        model="scripted",
        tools=builtin_tools(),
        cwd=project,
        system="parent system",
        limits=limits,
        info=info,
        gate=AllowAll(),
    )
    if session:
        agent.session = SessionLog.create(
            cwd=project, model="scripted/scripted", directory=project.parent / "sessions"
        )
    enable_subagents(agent, load_agent_types(project, user_dir=None, home=project / "no-home"))
    _OPEN.append(agent)
    return agent, provider


def results_of(agent: Agent, index: int) -> list[ToolResult]:
    return agent.messages[index].tool_results


def task(prompt: str, kind: str = "general", **extra: Any) -> tuple[str, dict[str, Any]]:
    return (
        "task",
        {"description": f"{kind} job", "prompt": prompt, "subagent_type": kind, **extra},
    )


async def test_two_subagents_run_side_by_side(project: Path) -> None:
    first_child = [
        Reply(reply("", ("grep", {"pattern": "def main"})).message, delay=0.2),
        reply("main() is defined in app.py line 1."),
    ]
    second_child = [
        Reply(reply("", ("read", {"path": "util.py"})).message, delay=0.2),
        reply("util.py sets X = 1."),
    ]
    agent, provider = make_agent(
        project,
        {
            PARENT: [
                reply("", task("CHILD-A: find main", "explore"), task("CHILD-B: read util")),
                reply("Both reported."),
            ],
            "CHILD-A": first_child,
            "CHILD-B": second_child,
        },
        session=True,
    )
    events: list[Event] = []
    result = await agent.run(PARENT, events.append)
    assert result.stop_reason == "end_turn"
    assert result.text == "Both reported."

    # Concurrent: both children asked the model before either got its first answer back.
    order = [key for key, _ in provider.requests]
    assert order[0] == PARENT
    assert sorted(order[1:3]) == ["CHILD-A", "CHILD-B"]
    assert order[-1] == PARENT

    a, b = results_of(agent, 2)
    assert (a.text, a.is_error) == ("main() is defined in app.py line 1.", False)
    assert (b.text, b.is_error) == ("util.py sets X = 1.", False)

    explore = provider.of("CHILD-A")[0]
    assert explore.system.startswith(f"{EXPLORE_PROMPT}\n\n{REPORT_FOOTER}\n\nSafety:")
    assert "<env>" not in explore.system  # the environment opens the task, in its context
    assert explore.messages[0].blocks == (
        Text(context_text(env_block(project))),
        Text("CHILD-A: find main"),
    )
    assert [t.name for t in explore.tools] == [
        "glob",
        "grep",
        "ls",
        "raw_output",
        "read",
        "web_fetch",
    ]
    general = provider.of("CHILD-B")[0]
    assert general.messages[0].blocks == (
        Text(context_text(env_block(project))),
        Text("CHILD-B: read util"),
    )
    names = [t.name for t in general.tools]
    assert not PARENT_ONLY & set(names)
    assert {"bash", "edit", "write", "read"} <= set(names)
    # The parent's spend includes the children's (four child requests, two parent requests).
    assert agent.spend.usage == Usage(600, 120)

    # Child events reach the parent's sink labelled with the task call that started them.
    calls = agent.messages[1].tool_uses
    nested = {
        (e.tool_use_id, e.agent, e.event.call.name)
        for e in events
        if isinstance(e, SubagentEvent) and isinstance(e.event, ToolStarted)
    }
    assert nested == {
        (calls[0].id, "explore", "grep"),
        (calls[1].id, "general", "read"),
    }
    # Each child journaled its own session beside the parent's, linked by meta.
    assert agent.session is not None
    children = sorted(agent.session.path.with_name(f"{agent.session_id}.agents").glob("*.jsonl"))
    assert len(children) == 2
    metas = []
    for path in children:
        journal, loaded = Journal.open(path)
        journal.close()
        meta = loaded.records[0].payload
        assert isinstance(meta, Meta)
        metas.append((meta.parent, meta.agent))
        assert isinstance(loaded.records[-1].payload, TerminalRecord)
        assert loaded.records[-1].payload.reason == "completed"
    assert sorted(metas) == [(agent.session_id, "explore"), (agent.session_id, "general")]


async def test_a_background_subagent_reports_while_the_parent_works(project: Path) -> None:
    agent, provider = make_agent(
        project,
        {
            PARENT: [
                reply("", task("CHILD: summarise README", run_in_background=True)),
                Reply(reply("", ("read", {"path": "app.py"})).message, delay=0.4),
                reply("Done: app.py read and the summary is in."),
            ],
            "CHILD": [reply("README says: demo.")],
        },
    )
    events: list[Event] = []
    result = await agent.run(PARENT, events.append)
    assert result.text == "Done: app.py read and the summary is in."
    started = results_of(agent, 2)[0]
    assert started.text.startswith("started bg-1: a general subagent working on 'general job'")
    # The child finished while the parent's second reply streamed: its report rode along with
    # the next request, after the read's result, in the same user message.
    last = provider.of(PARENT)[-1].messages[-1]
    assert last.role == "user"
    assert isinstance(last.blocks[0], ToolResult)
    assert last.blocks[1] == Text(
        '<task-notification id="bg-1" kind="agent" status="completed" agent="general" '
        'description="general job">\nREADME says: demo.\n</task-notification>'
    )
    assert BackgroundFinished("bg-1", "agent", "completed", "general job") in events
    assert not agent.background.pending


async def test_a_background_shell_outlives_its_turn_and_is_delivered_after(project: Path) -> None:
    command = "echo starting; sleep 0.6; echo finished"
    agent, provider = make_agent(
        project,
        {
            PARENT: [
                reply("", ("bash", {"command": command, "run_in_background": True})),
                Reply(reply("", ("bash_output", {"id": "bg-1"})).message, delay=0.3),
                reply("The build runs in the background."),
                reply("The build finished."),
            ]
        },
    )
    result = await agent.run(PARENT)
    assert result.text == "The build runs in the background."
    assert results_of(agent, 2)[0].text.startswith(f"started bg-1 in the background: {command}")
    peek = results_of(agent, 4)[0].text
    assert peek.startswith("bg-1: running after ")
    assert peek.endswith("\nstarting")
    assert [t.id for t in agent.background.running()] == ["bg-1"]

    await agent.background.wait()
    delivered = await agent.run_notifications()
    assert delivered is not None
    assert delivered.text == "The build finished."
    sent = provider.of(PARENT)[-1].messages[-1]
    assert sent.blocks == (
        Text(
            '<task-notification id="bg-1" kind="shell" status="completed" '
            f'description="{command}">\nstarting\nfinished\n[exit code 0]\n</task-notification>'
        ),
        Text(NOTIFICATIONS_PROMPT),
    )
    assert await agent.run_notifications() is None  # nothing twice


async def test_failing_and_exhausted_subagents_report_why(project: Path) -> None:
    (project / ".keel" / "agents").mkdir(parents=True)
    (project / ".keel" / "agents" / "looper.md").write_text(
        "---\nname: looper\ndescription: Reads forever.\ntools: Read, LS\nmax_turns: 2\n---\n\n"
        "You read files.\n",
        encoding="utf-8",
    )
    agent, provider = make_agent(
        project,
        {
            PARENT: [
                reply("", task("CHILD-ERR: go"), task("CHILD-LOOP: go", "looper")),
                reply("Neither worked."),
            ],
            "CHILD-ERR": [Fault("status", status=400, message="bad things")],
            "CHILD-LOOP": [
                reply("", ("read", {"path": "app.py"})),
                reply("", ("ls", {})),
                reply("never reached"),
            ],
        },
    )
    await agent.run(PARENT)
    failed, exhausted = results_of(agent, 2)
    assert failed.is_error
    assert failed.text.startswith("the general subagent failed: ")
    assert "bad things" in failed.text
    assert exhausted.is_error
    assert exhausted.text == "the looper subagent ran out of turns (2) before finishing"
    looper = provider.of("CHILD-LOOP")[0]
    assert [t.name for t in looper.tools] == ["ls", "read"]
    assert looper.system.startswith("You read files.\n\n" + REPORT_FOOTER)


async def test_task_stop_stops_a_background_subagent(project: Path) -> None:
    agent, _ = make_agent(
        project,
        {
            PARENT: [
                reply("", task("CHILD: slow work", run_in_background=True)),
                # Late enough that the child is waiting for its model.
                Reply(reply("", ("task_stop", {"id": "bg-1"})).message, delay=0.3),
                reply("Stopped it."),
            ],
            "CHILD": [Reply(reply("never seen").message, delay=30)],
        },
        session=True,
    )
    result = await agent.run(PARENT)
    assert result.text == "Stopped it."
    assert results_of(agent, 4)[0].text == "bg-1: stopped\nstopped before it finished"
    assert agent.background.tasks["bg-1"].status == "stopped"
    assert not agent.background.pending  # task_stop delivered the outcome
    assert agent.session is not None
    (child,) = agent.session.path.with_name(f"{agent.session_id}.agents").glob("*.jsonl")
    journal, loaded = Journal.open(child)
    journal.close()
    terminal = loaded.records[-1].payload
    assert isinstance(terminal, TerminalRecord)
    assert terminal.reason == "interrupted"


async def test_a_subagent_can_spend_the_parents_budget(project: Path) -> None:
    priced = ModelInfo(window=200_000, max_output=8_000, input_price=10.0, output_price=10.0)
    big = Usage(50_000, 1_000)  # $0.51 a request at $10 per million
    agent, provider = make_agent(
        project,
        {
            PARENT: [
                reply("", task("CHILD: spend"), usage=Usage(1_000, 100)),
                reply("The child ran out.", usage=Usage(1_200, 100)),
            ],
            "CHILD": [
                reply("", ("ls", {}), usage=big),
                reply("", ("ls", {}), usage=big),
                reply("unreached"),
            ],
        },
        limits=Limits(max_usd=1.0),
        info=priced,
    )
    result = await agent.run(PARENT)
    (report,) = results_of(agent, 2)
    assert report.is_error
    # The child's second request would reread its 50k-token context ($0.50 and more) with
    # $0.479 of the session's dollar left: it is not sent.
    assert report.text.startswith(
        "the general subagent stopped at the session's budget (budget: $0.4790 left of the "
        "session's $1.0000 USD budget; the next request needs ~$0.52"
    )
    assert len(provider.of("CHILD")) == 1
    # The parent's own next request fits what is left.
    assert (result.stop_reason, result.text) == ("end_turn", "The child ran out.")
    assert agent.spend.cost == pytest.approx(0.011 + 0.51 + 0.013)
    assert agent.spend.cost <= 1.0


async def test_a_looping_subagent_is_stopped(project: Path) -> None:
    # The first read returns the file, the next ones "unchanged": four identical rounds after it.
    same = [reply("", ("read", {"path": "util.py"})) for _ in range(5)]
    agent, _ = make_agent(
        project,
        {PARENT: [reply("", task("CHILD: loop")), reply("ok")], "CHILD": [*same, reply("no")]},
    )
    await agent.run(PARENT)
    (report,) = results_of(agent, 2)
    assert report.text == "the general subagent was stopped for repeating the same tool calls"


async def test_background_limits_and_unknown_ids(project: Path) -> None:
    calls = [("bash", {"command": "sleep 5", "run_in_background": True}) for _ in range(9)]
    agent, _ = make_agent(
        project,
        {
            PARENT: [
                reply("", *calls),
                reply("", ("bash_output", {"id": "bg-42"}), ("task_stop", {"id": "nope"})),
                reply("ok"),
            ]
        },
    )
    await agent.run(PARENT)
    results = results_of(agent, 2)
    assert [r.is_error for r in results] == [False] * 8 + [True]
    assert results[8].text == (
        "8 background tasks are already running (bg-1, bg-2, bg-3, bg-4, bg-5, bg-6, bg-7, "
        "bg-8); wait for one with task_wait or stop one with task_stop first"
    )
    unknown_shell, unknown_task = results_of(agent, 4)
    assert unknown_shell.text == (
        "no background shell task 'bg-42' (known: bg-1, bg-2, bg-3, bg-4, bg-5, bg-6, bg-7, bg-8)"
    )
    assert unknown_task.is_error
    await agent.aclose()
    assert all(t.status == "stopped" for t in agent.background.tasks.values())


async def test_task_wait_returns_results_and_times_out_cleanly(project: Path) -> None:
    agent, _ = make_agent(
        project,
        {
            PARENT: [
                reply(
                    "",
                    ("bash", {"command": "echo quick", "run_in_background": True}),
                    ("bash", {"command": "sleep 20", "run_in_background": True}),
                ),
                reply("", ("task_wait", {"ids": ["bg-1"], "timeout": 10})),
                reply("", ("task_wait", {"ids": ["bg-2"], "timeout": 0})),
                reply("done"),
            ]
        },
    )
    await agent.run(PARENT)
    assert results_of(agent, 4)[0].text == (
        '<task-notification id="bg-1" kind="shell" status="completed" description="echo quick">'
        "\nquick\n[exit code 0]\n</task-notification>"
    )
    waited = results_of(agent, 6)[0].text
    assert waited.startswith("bg-2 shell running after ")
    assert waited.endswith(": sleep 20 (still running)")
    # bg-1 was handed over by task_wait: it is not notified again.
    assert [t.id for t in agent.background.undelivered()] == []


def git(project: Path, *args: str) -> str:
    command = ["git", "-C", str(project), "-c", "user.name=t", "-c", "user.email=t@t", *args]
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout


@pytest.fixture
def repo(project: Path) -> Path:
    git(project, "init", "-q")
    git(project, "add", "-A")
    git(project, "commit", "-qm", "init")
    return project


@pytest.mark.needs("git")
async def test_worktree_isolation_keeps_a_branch_with_the_changes(repo: Path) -> None:
    agent, provider = make_agent(
        repo,
        {
            PARENT: [
                reply(
                    "",
                    task("CHILD-W: add notes", isolation="worktree"),
                    task("CHILD-N: look", isolation="worktree"),
                ),
                reply("ok"),
            ],
            "CHILD-W": [
                reply("", ("write", {"path": "NOTES.md", "content": "notes\n"})),
                reply("Wrote NOTES.md."),
            ],
            "CHILD-N": [reply("Nothing to change.")],
        },
    )
    store = Checkpoints.temporary()  # /undo's store: a worktree child leaves no unit in it
    agent.ctx.checkpoints = store
    store.begin_unit(PARENT)
    try:
        await agent.run(PARENT)
        assert store.units() == []
    finally:
        store.close()
    changed, unchanged = results_of(agent, 2)
    assert changed.text.startswith(
        "Wrote NOTES.md.\n\n[worktree] The subagent's changes are on branch keel/task-"
    )
    branch = changed.text.split("on branch ", 1)[1].split(" ", 1)[0]
    assert " NOTES.md | 1 +" in changed.text
    assert unchanged.text == (
        "Nothing to change.\n\n[worktree] The subagent changed nothing; its worktree was removed."
    )
    assert not (repo / "NOTES.md").exists()  # the main tree is untouched
    shown = await asyncio.to_thread(git, repo, "show", f"{branch}:NOTES.md")
    assert shown == "notes\n"
    # The child worked in its own checkout, which is kept for review.
    (kept,) = await list_worktrees(repo)
    assert kept[0] == branch
    assert provider.of("CHILD-W")[0].messages[0].blocks == (
        Text(context_text(env_block(kept[1]))),
        Text("CHILD-W: add notes"),
    )
    assert (kept[1] / "NOTES.md").read_text() == "notes\n"
    listed = ("branch", "--list", "keel/*", "--format=%(refname:short)")
    assert (await asyncio.to_thread(git, repo, *listed)).split() == [branch]


def test_agent_definitions_in_claude_code_format(project: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".claude" / "agents").mkdir(parents=True)
    (home / ".claude" / "agents" / "reviewer.md").write_text(
        "---\nname: reviewer\ndescription: Reviews code.\ntools: Read, Grep, Glob\nmodel: sonnet\n---\n\nReview.\n",
        encoding="utf-8",
    )
    (project / ".claude" / "agents").mkdir(parents=True)
    (project / ".claude" / "agents" / "reviewer.md").write_text(
        "---\nname: reviewer\ndescription: Reviews this project's code.\ntools: Read, MultiEdit, mcp__github\n---\n\nReview here.\n",
        encoding="utf-8",
    )
    (project / ".claude" / "agents" / "broken.md").write_text(
        "no frontmatter, no description\n", encoding="utf-8"
    )
    types = load_agent_types(project, user_dir=None, home=home)
    reviewer = types.get("reviewer")
    assert reviewer is not None
    assert reviewer.description == "Reviews this project's code."  # the project's wins
    assert reviewer.tools == ("read", "multi_edit", "mcp__github")
    assert reviewer.allows("mcp__github__create_issue")
    assert not reviewer.allows("bash")
    assert reviewer.model is None
    assert types.get("general-purpose") is types.get("general")
    assert types.warnings == (
        f"{project / '.claude' / 'agents' / 'broken.md'}:1: no description (it tells the parent "
        "when to use this agent); skipped",
    )


def test_the_task_tool_lists_the_agent_types(project: Path) -> None:
    agent, _ = make_agent(project, {PARENT: []})
    spec = next(s for s in agent.registry.specs() if s.name == "task")
    assert spec.input_schema["properties"]["subagent_type"]["enum"] == ["general", "explore"]
    assert spec.description.endswith(
        "Agent types: general (A general-purpose agent for multi-step tasks: researching, changing "
        "code, running commands. Has every tool.), explore (Fast, read-only exploration: finding "
        "files, searching code, answering questions about the codebase. Cannot change anything.)."
    )
    assert json.dumps(spec.input_schema)  # serialisable as sent


async def test_a_task_stopped_before_it_starts_is_settled() -> None:
    tasks = BackgroundTasks()
    ran: list[str] = []

    async def work(task: BackgroundTask) -> tuple[Status, str]:
        ran.append(task.id)
        return "completed", "never"

    started = tasks.start("shell", "quick", work)
    stopped = await tasks.stop(started.id)  # before the event loop ever ran it
    assert (stopped.status, stopped.result, ran) == ("stopped", STOPPED, [])
    assert await tasks.wait([started.id], timeout=1) == [started]


async def test_a_command_stopped_while_it_starts_leaves_no_process(project: Path) -> None:
    tasks = BackgroundTasks()
    ctx = ToolContext(cwd=project, root=project, background=tasks)
    marker = "sleep 31.25"  # unique enough to find with pgrep
    for steps in range(12):  # stop each one a step later in its start
        started = start_background(ctx, marker, "", sandbox=False)
        for _ in range(steps):
            await asyncio.sleep(0)
        await tasks.stop(str(started.content).split()[1])
    assert [t.status for t in tasks.tasks.values()] == ["stopped"] * 12
    found = await asyncio.to_thread(
        subprocess.run, ["pgrep", "-f", marker], capture_output=True, text=True, check=False
    )
    assert found.stdout == ""
