"""Spend governance (issue 31): budgets that hold before a request is sent, caps on the subagents
a prompt starts, and the tree's spend reported live per agent.

The USD tests run the real loop against the loopback Anthropic server playing the worst case:
every reply uses all the `max_tokens` its request asked for, and its input is counted at 4
characters a token over what the request sent, so what each request cost is known from its body.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

import keel.trace as trace
from keel.agent.events import AgentSpend, Event, RequestStarted, SubagentEvent, TurnFinished
from keel.agent.limits import Limits
from keel.agent.loop import Agent
from keel.agent.subagents import (
    MAX_CONCURRENT,
    MAX_TOTAL,
    Subagents,
    enable_subagents,
    load_agent_types,
)
from keel.config.settings import (
    SHARED_CONCURRENT_CEILING,
    SHARED_SUBAGENTS_CEILING,
    load_settings,
)
from keel.llm.catalog import ModelInfo
from keel.llm.events import Notice
from keel.llm.http import HTTPSettings
from keel.llm.messages import Text, Usage
from keel.llm.providers.anthropic import AnthropicProvider
from keel.llm.script import Reply, Step, reply
from keel.permissions import AllowAll
from keel.testing.anthropic_server import AnthropicServer
from keel.testing.routing import RoutedProvider, routed_responder
from keel.testing.server import RecordedRequest
from keel.tools.base import Tool, ToolContext, tool

KEY = "sk-spend-test"
#: Anthropic-like prices: $3 in, $15 out, cache reads $0.30, cache writes $3.75 per million.
PRICED = ModelInfo(200_000, 8_000, 3.0, 15.0, 0.3, 3.75)
PARENT = "PARENT: split the work"


@tool
async def act(ctx: ToolContext, n: int) -> str:
    """Do one step of the work.

    Args:
        n: Which step.
    """
    return f"step {n} done"


def sent_tokens(body: Mapping[str, Any]) -> int:
    """The test server's tokenizer: 4 characters a token over the system prompt, the messages'
    text and tool inputs, and the tool definitions."""
    system = body.get("system", "")
    chars = len(system if isinstance(system, str) else "".join(b["text"] for b in system))
    for message in body.get("messages", []):
        content = message["content"]
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        for block in blocks:
            if block["type"] == "text":
                chars += len(block["text"])
            elif block["type"] == "tool_use":
                chars += len(json.dumps(block["input"]))
            elif block["type"] == "tool_result":
                inner = block.get("content", "")
                chars += len(inner if isinstance(inner, str) else json.dumps(inner))
    chars += len(json.dumps(body.get("tools", [])))
    return chars // 4


def worst_case(step: Callable[[RecordedRequest], Step]) -> Callable[[RecordedRequest], Step]:
    """A responder whose replies each write all of the request's `max_tokens` (as text, 4
    characters a token, before the step's own blocks), and say so in their usage."""

    def respond(request: RecordedRequest) -> Step:
        chosen = step(request)
        assert isinstance(chosen, Reply)
        body = request.json
        usage = Usage(sent_tokens(body), body["max_tokens"])
        padding = Text("w " * (2 * (body["max_tokens"] - 16)))  # the rest for the tool call
        message = dataclasses.replace(
            chosen.message,
            blocks=(padding, *(b for b in chosen.message.blocks if not isinstance(b, Text))),
        )
        return dataclasses.replace(chosen, message=message, usage=usage)

    return respond


def cost_of(request: RecordedRequest) -> float:
    body = request.json
    return PRICED.cost(Usage(sent_tokens(body), body["max_tokens"]))


def in_order(steps: Sequence[Step]) -> Callable[[RecordedRequest], Step]:
    """Each request gets the next step."""
    taken = iter(steps)
    return lambda _request: next(taken)


def priced_agent(
    url: str, project: Path, limits: Limits, tools: Sequence[Tool] = (act,), system: str = "sys"
) -> Agent:
    provider = AnthropicProvider(base_url=url, api_key=KEY, settings=HTTPSettings())
    return Agent(
        provider=provider,
        model="claude-sonnet-4-5",
        info=PRICED,
        tools=list(tools),
        cwd=project,
        system=system,
        limits=limits,
        gate=AllowAll(),
    )


def model_requests(server: AnthropicServer) -> list[RecordedRequest]:
    return [r for r in server.requests if r.path.startswith("/v1/messages")]


REFUSED = re.compile(
    r"budget: \$(?P<left>\d+\.\d{4}) left of (?P<whose>the|the session's) \$(?P<cap>\d+\.\d{4}) "
    r"USD budget; the next request needs ~\$(?P<needs>\d+\.\d{4}) \(~(?P<tokens>[\d,]+) input "
    r"tokens, \$(?P<input>\d+\.\d{4}), and at least (?P<floor>[\d,]+) output tokens, "
    r"\$(?P<output>\d+\.\d{4})\)"
)


# -- a USD cap holds before each request -------------------------------------------------------


async def test_a_run_under_a_usd_cap_never_crosses_it(project: Path) -> None:
    steps = in_order([reply("", ("act", {"n": i})) for i in range(10)])
    with AnthropicServer(responder=worst_case(steps), api_key=KEY) as server:
        agent = priced_agent(server.url, project, Limits(max_usd=0.40))
        events: list[Event] = []
        result = await agent.run("do the steps", events.append)
        await agent.aclose()
    sent = model_requests(server)
    costs = [cost_of(r) for r in sent]
    asked = [r.json["max_tokens"] for r in sent]
    # A full reply is 8,000 tokens ($0.12), and each is reread by the next request. Two fit at
    # the model's 8,000; the third is lowered to what the remainder pays for after its input
    # (priced as if uncached, at the $3.75 cache-write price); the fourth is never sent.
    assert result.stop_reason == "budget"
    assert len(sent) == 3
    assert asked[:2] == [8_000, 8_000]
    assert 1_024 <= asked[2] < 8_000
    assert sum(costs) <= 0.40
    # What is left over is what the worst-case input price kept back, and no more.
    kept_back = sent_tokens(sent[2].json) * (3.75 - 3.0) / 1e6
    assert 0.40 - sum(costs) < kept_back + 0.001
    assert agent.spend.cost == pytest.approx(sum(costs))
    # What the loop sent is what it said it would (RequestStarted carries the request).
    started = [e.request.max_tokens for e in events if isinstance(e, RequestStarted) and e.request]
    assert started == asked
    notices = [e for e in events if isinstance(e, Notice)]
    assert len(notices) == 3
    assert notices[0] == Notice(
        f"the budget left pays for {asked[2]:,} output tokens: max_tokens lowered to that", "info"
    )
    assert re.fullmatch(r"9\d% of the USD budget used \(\$0\.\d{4} of \$0\.4000\)", notices[1].text)
    refusal = REFUSED.fullmatch(notices[2].text)
    assert refusal is not None, notices[2]
    assert float(refusal["left"]) == pytest.approx(0.40 - sum(costs), abs=1e-4)
    assert (refusal["whose"], refusal["cap"], refusal["floor"]) == ("the", "0.4000", "1,024")
    assert float(refusal["needs"]) > float(refusal["left"])
    assert isinstance(events[-1], TurnFinished)
    assert events[-1].stop_reason == "budget"
    assert agent.over_budget is not None
    assert agent.over_budget.cap == "usd"


async def test_the_floor_stops_before_anything_is_sent(project: Path) -> None:
    with AnthropicServer(responder=worst_case(lambda r: reply("unreached")), api_key=KEY) as server:
        agent = priced_agent(server.url, project, Limits(max_usd=0.01))
        events: list[Event] = []
        result = await agent.run("hello", events.append)
        # The floor is a setting: 500 output tokens ($0.0075) fit what $0.01 leaves.
        lower = priced_agent(server.url, project, Limits(max_usd=0.01, min_output_tokens=500))
        second = await lower.run("hello")
        await agent.aclose()
        await lower.aclose()
    assert result.stop_reason == "budget"
    assert result.cost == 0.0
    assert not any(isinstance(e, RequestStarted) for e in events)
    notice = [e for e in events if isinstance(e, Notice)][-1]
    refusal = REFUSED.fullmatch(notice.text)
    assert refusal is not None, notice
    # $0.01 pays for ~660 output tokens after the input: fewer than the 1,024 of the floor.
    assert (refusal["left"], refusal["floor"], refusal["output"]) == ("0.0100", "1,024", "0.0154")
    (sent,) = model_requests(server)  # only the second agent's request reached the server
    assert second.stop_reason == "end_turn"
    assert 500 <= sent.json["max_tokens"] < 1_024
    assert cost_of(sent) <= 0.01


async def test_a_token_cap_lowers_max_tokens_too(project: Path) -> None:
    steps = in_order([reply("", ("act", {"n": i})) for i in range(10)])
    with AnthropicServer(responder=worst_case(steps), api_key=KEY) as server:
        agent = priced_agent(server.url, project, Limits(max_tokens=20_000))
        result = await agent.run("do the steps")
        await agent.aclose()
    sent = model_requests(server)
    used = [sent_tokens(r.json) + r.json["max_tokens"] for r in sent]
    assert result.stop_reason == "budget"
    # The first at the model's 8,000; the second rereads the first's 8,085 tokens and gets what
    # is left after them; the third cannot get the floor's 1,024.
    assert len(sent) == 2
    assert sent[0].json["max_tokens"] == 8_000
    assert 1_024 <= sent[1].json["max_tokens"] <= 20_000 - used[0] - sent_tokens(sent[1].json)
    assert sum(used) <= 20_000
    assert agent.over_budget is not None
    assert agent.over_budget.cap == "tokens"


# -- a subagent tree shares one budget ---------------------------------------------------------


async def test_a_subagent_tree_under_a_usd_cap_stops_before_crossing_it(project: Path) -> None:
    # Two children working side by side, each wanting ten requests; the parent's cap of $0.50
    # pays for about four at the worst case. A child's request in flight holds its worst case,
    # so the other child's next request sees it spent.
    def child(name: str) -> list[Step]:
        steps: list[Step] = [
            Reply(reply("", ("act", {"n": i})).message, delay=0.05) for i in range(10)
        ]
        return [*steps, reply(f"{name} done")]

    scripts: dict[str, list[Step]] = {
        PARENT: [
            reply(
                "",
                (
                    "task",
                    {"description": "a", "prompt": "CHILD-A: half", "subagent_type": "general"},
                ),
                (
                    "task",
                    {"description": "b", "prompt": "CHILD-B: half", "subagent_type": "general"},
                ),
            ),
            reply("unreached"),
        ],
        "CHILD-A": child("A"),
        "CHILD-B": child("B"),
    }
    with AnthropicServer(responder=worst_case(routed_responder(scripts)), api_key=KEY) as server:
        agent = priced_agent(server.url, project, Limits(max_usd=0.50), system="parent")
        enable_subagents(agent, load_agent_types(project, user_dir=None, home=project / "none"))
        tracer = trace.attach(agent, directory=project / "t.trace")
        events: list[Event] = []
        result = await agent.run(PARENT, events.append)
        await agent.aclose()
        tracer.close()
    sent = model_requests(server)
    costs = [cost_of(r) for r in sent]
    assert sum(costs) <= 0.50
    assert agent.spend.cost == pytest.approx(sum(costs))
    assert agent.spend.held_usd == pytest.approx(0.0)  # nothing left held
    assert result.stop_reason == "budget"
    # Both children ran, both stopped at the session's budget, and some request was lowered.
    reports = agent.messages[2].tool_results
    assert [r.is_error for r in reports] == [True, True]
    for report in reports:
        assert report.text.startswith("the general subagent stopped at the session's budget")
    assert any(r.json["max_tokens"] < 8_000 for r in sent)
    # The debug trace has each request's max_tokens as sent, and each agent's spend as it went.
    records = trace.read(project / "t.trace")
    traced = sorted(r["data"]["max_tokens"] for r in records if r["kind"] == "request")
    assert traced == sorted(r.json["max_tokens"] for r in sent)
    spends = [r["data"] for r in records if r["kind"] == "spend"]
    assert [s["agent"] for s in spends].count("main") == 1  # the parent never answered again
    assert {s["status"] for s in spends if s["agent"] == "general"} == {"running", "budget"}
    assert spends[-1]["tree_cost"] == pytest.approx(agent.spend.cost)
    assert all(s["tree_cost"] <= 0.50 for s in spends)


# -- caps on how many subagents a prompt starts ------------------------------------------------


def routed_agent(
    project: Path, scripts: dict[str, list[Step]], **caps: int
) -> tuple[Agent, RoutedProvider, Subagents]:
    provider = RoutedProvider(scripts)
    agent = Agent(
        provider=provider,
        model="scripted",
        tools=[act],
        cwd=project,
        system="parent",
        info=ModelInfo(200_000, 8_000, 10.0, 10.0),
        gate=AllowAll(),
    )
    types = load_agent_types(project, user_dir=None, home=project / "none")
    return agent, provider, enable_subagents(agent, types, **caps)


def task(key: str, **extra: Any) -> tuple[str, dict[str, Any]]:
    return ("task", {"description": key.lower(), "prompt": f"{key}: go", **extra})


def slow_child(name: str) -> list[Step]:
    return [Reply(reply("", ("act", {"n": 1})).message, delay=0.1), reply(f"{name} done")]


async def test_the_spawn_caps_hold_with_parallel_calls(project: Path) -> None:
    scripts: dict[str, list[Step]] = {
        PARENT: [
            reply("", task("C1"), task("C2"), task("C3"), task("C4")),
            reply("", task("C5", run_in_background=True)),
            reply("Three of four ran."),
        ],
        **{f"C{i}": slow_child(f"C{i}") for i in range(1, 6)},
    }
    agent, provider, subagents = routed_agent(project, scripts, max_total=3, max_concurrent=2)
    result = await agent.run(PARENT)
    await agent.aclose()
    assert result.text == "Three of four ran."
    first = agent.messages[2].tool_results
    assert [(r.text, r.is_error) for r in first[:3]] == [
        ("C1 done", False),
        ("C2 done", False),
        ("C3 done", False),
    ]
    refused = (
        "not started: this prompt has started 3 subagent(s), the most it may "
        "(subagents.max_total = 3); do the general task yourself, or wait for the reports you have"
    )
    assert (first[3].text, first[3].is_error) == (refused, True)
    # The background path counts too; the refused calls never reached the model.
    assert agent.messages[4].tool_results[0].text == refused
    assert {key for key, _ in provider.requests} == {PARENT, "C1", "C2", "C3"}
    assert subagents.most_at_once == 2  # three ran, never more than two at once
    assert subagents.running == 0


async def test_the_total_cap_counts_per_prompt_and_zero_means_none(project: Path) -> None:
    scripts: dict[str, list[Step]] = {
        PARENT: [reply("", task("C1")), reply("one"), reply("", task("C2")), reply("two")],
        "C1": slow_child("C1"),
        "C2": slow_child("C2"),
    }
    agent, _, _ = routed_agent(project, scripts, max_total=1)
    assert (await agent.run(PARENT)).text == "one"
    assert (await agent.run("PARENT: again")).text == "two"  # a new prompt starts a new count
    assert agent.messages[-2].tool_results[0].text == "C2 done"
    await agent.aclose()

    none, provider, _ = routed_agent(
        project, {PARENT: [reply("", task("C1")), reply("none")], "C1": []}, max_total=0
    )
    await none.run(PARENT)
    await none.aclose()
    assert (
        none.messages[2]
        .tool_results[0]
        .text.startswith(
            "not started: this prompt has started 0 subagent(s), the most it may "
            "(subagents.max_total = 0)"
        )
    )
    assert [key for key, _ in provider.requests] == [PARENT, PARENT]


# -- the tree's spend, live per agent ----------------------------------------------------------


async def test_the_trees_spend_is_reported_per_agent_as_it_happens(project: Path) -> None:
    # Every request costs $0.0012 (100 in, 20 out at $10 per million each).
    scripts: dict[str, list[Step]] = {
        PARENT: [reply("", task("CHILD")), reply("All done.")],
        "CHILD": [reply("", ("act", {"n": 1})), reply("child done")],
    }
    agent, _, _ = routed_agent(project, scripts)
    events: list[Event] = []
    await agent.run(PARENT, events.append)
    await agent.aclose()
    rows = [e for e in events if isinstance(e, AgentSpend)]
    call = agent.messages[1].tool_uses[0].id
    child_id = rows[1].agent_id
    one, two = Usage(100, 20), Usage(200, 40)

    def row(agent_: str, status: str, own: Usage, tree: Usage, *, child: bool = True) -> AgentSpend:
        who = child_id if child else agent.session_id
        return AgentSpend(
            who,
            agent_,
            "child" if child else "",
            status,
            own,
            own.total * 10 / 1e6,
            tree,
            tree.total * 10 / 1e6,
            call if child else "",
        )

    expected = [
        row("main", "running", one, one, child=False),  # the tree opens with the main agent
        row("general", "running", Usage(), one),
        row("general", "running", one, two),
        row("general", "running", two, Usage(300, 60)),
        row("general", "end_turn", two, Usage(300, 60)),
        row("main", "running", two, Usage(400, 80), child=False),
    ]
    assert [
        dataclasses.replace(r, cost=round(r.cost, 9), tree_cost=round(r.tree_cost, 9)) for r in rows
    ] == [
        dataclasses.replace(r, cost=round(r.cost, 9), tree_cost=round(r.tree_cost, 9))
        for r in expected
    ]
    # They reach the parent's sink as its own events, not wrapped as the child's.
    assert not any(isinstance(e, SubagentEvent) and isinstance(e.event, AgentSpend) for e in events)


# -- settings ----------------------------------------------------------------------------------


def test_budget_and_subagent_settings_parse_and_a_project_may_only_lower(tmp_path: Path) -> None:
    user = tmp_path / "user"
    user.mkdir()
    (user / "settings.json").write_text(
        json.dumps(
            {
                "budget": {"usd": 2, "min_output_tokens": 2048},
                "subagents": {"max_total": 10, "max_concurrent": 3},
            }
        ),
        encoding="utf-8",
    )
    project = tmp_path / "project"
    (project / ".keel").mkdir(parents=True)
    shared = project / ".keel" / "settings.json"
    shared.write_text(
        json.dumps({"subagents": {"max_total": 50, "max_concurrent": 2, "fan_out": 1}}),
        encoding="utf-8",
    )
    settings = load_settings(project, env={"KEEL_CONFIG_DIR": str(user), "HOME": str(tmp_path)})
    assert (settings.budget_usd, settings.budget_min_output_tokens) == (2.0, 2048)
    assert (settings.subagents_max_total, settings.subagents_max_concurrent) == (10, 2)
    assert (
        f"{shared}: subagents.max_total ignored: a project file may lower this limit, not raise it"
        in settings.warnings
    )
    assert (
        f"{shared}: subagents.fan_out: unknown key skipped (known: max_concurrent, max_total)"
        in settings.warnings
    )
    # keel's defaults are the ceilings a project file may not pass when the user set none.
    assert (MAX_TOTAL, MAX_CONCURRENT) == (SHARED_SUBAGENTS_CEILING, SHARED_CONCURRENT_CEILING)


# -- the TUI: each subagent's spend on its card, the tree's in the status bar, /cost by agent ---


async def test_the_tui_shows_each_subagents_spend_live(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from keel.tui import commands as cmds
    from keel.tui.app import KeelApp
    from keel.tui.widgets import StatusBar, ToolCard
    from tests.tui_helpers import MODEL, make_controller

    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    scripts: dict[str, list[Step]] = {
        PARENT: [reply("", task("CHILD")), reply("All done.")],
        # The child's second answer takes a while: the card and the status bar show it running.
        "CHILD": [reply("", ("read", {"path": "util.py"})), Reply(reply("ok").message, delay=1.0)],
    }
    provider = RoutedProvider(scripts, model=MODEL.model)
    controller = await make_controller(project, provider)
    app = KeelApp(controller)
    async with app.run_test(size=(110, 36)) as pilot:
        app.prompt.load_text(PARENT)
        await pilot.press("enter")
        status, progress = "", ""
        for _ in range(100):
            await pilot.pause(0.02)
            cards = [c for c in app.query(ToolCard) if c.tool_name == "task"]
            status = str(app.query_one(StatusBar).render())
            progress = cards[0].progress if cards else ""
            if "1 subagent running" in status and "general" in progress:
                break
        # Sonnet 4.5 prices: 100 input and 20 output tokens cost $0.0006 a request. The child
        # has answered once (its second request is in flight), the parent once.
        assert progress == "general · $0.0006 · 120 tokens", status
        assert status.endswith("$0.0012 · 240 tokens · 1 subagent running")
        for _ in range(200):
            if not controller.busy:
                break
            await pilot.pause(0.02)
        await app.idle()
        await pilot.pause()
        status = str(app.query_one(StatusBar).render())
        assert status.endswith("$0.0024 · 480 tokens")  # two parent and two child requests
    rows = list(controller.spend_rows.values())
    assert [(r.agent, r.status) for r in rows] == [("main", "running"), ("general", "end_turn")]
    assert controller.status().agents_running == 0
    shown = cmds.cost_text(controller.agent, controller.context, rows)
    assert shown.endswith(
        "**By agent:**\n\n- main · $0.0012 · 240 tokens\n- general · $0.0012 · 240 tokens (child)"
    )
    await controller.agent.aclose()


# -- keel serve: the rows on the session's stream, and in the session's JSON -------------------


def test_keel_serve_streams_and_describes_the_trees_spend(
    project: Path, isolated_env: Path, tmp_path: Path
) -> None:
    from tests.helpers import user_settings_file
    from tests.server_helpers import MODEL, TOKEN, Events, Servers

    user_settings_file().parent.mkdir(parents=True, exist_ok=True)
    user_settings_file().write_text(
        json.dumps({"budget": {"usd": 1.5, "min_output_tokens": 600}}), encoding="utf-8"
    )
    scripts: dict[str, list[Step]] = {
        PARENT: [reply("", task("CHILD")), reply("All done.")],
        "CHILD": [reply("", ("read", {"path": "util.py"})), reply("child done")],
    }
    with AnthropicServer(responder=routed_responder(scripts), api_key="sk-ant-test") as model:
        servers = Servers(project, model, tmp_path / "serve.log")
        try:
            served = servers.start()
            with served.client(TOKEN) as client:
                created = client.post("/v1/sessions", json={"model": MODEL})
                assert created.status_code == 201, created.text
                sid = created.json()["id"]
                events = Events(client, sid, after=created.json()["last_seq"])
                sent = client.post(f"/v1/sessions/{sid}/prompt", json={"text": PARENT})
                assert sent.status_code == 202, sent.text
                frames = events.until("status", busy=False)
                events.close()
                described = client.get(f"/v1/sessions/{sid}").json()
        finally:
            servers.stop_all()
    # Sonnet 4.5 prices: 100 input and 20 output tokens cost $0.0006 a request.
    rows = [f.data for f in frames if f.event == "agent_spend"]
    seen = [(r["agent"], r["status"], r["cost_usd"], r["tree_cost_usd"]) for r in rows]
    assert seen == [
        ("main", "running", 0.0006, 0.0006),
        ("general", "running", 0.0, 0.0006),
        ("general", "running", 0.0006, 0.0012),
        ("general", "running", 0.0012, 0.0018),
        ("general", "end_turn", 0.0012, 0.0018),
        ("main", "running", 0.0012, 0.0024),
    ]
    call = rows[1]["tool_use_id"]
    assert call.startswith("toolu_")
    child = rows[-2]
    assert {k: v for k, v in child.items() if k not in ("seq", "session", "agent_id")} == {
        "type": "agent_spend",
        "agent": "general",
        "description": "child",
        "status": "end_turn",
        "tool_use_id": call,
        "usage": {"input": 200, "output": 40, "cache_read": 0, "cache_write": 0},
        "cost_usd": 0.0012,
        "tree_usage": {"input": 300, "output": 60, "cache_read": 0, "cache_write": 0},
        "tree_cost_usd": 0.0018,
    }
    spend = described["spend"]
    assert spend["budget"] == {
        "usd": 1.5,
        "tokens": None,
        "min_output_tokens": 600,
        "usd_left": 1.4976,
        "tokens_left": None,
    }
    assert [(a["agent"], a["status"], a["cost_usd"]) for a in spend["agents"]] == [
        ("main", "running", 0.0012),
        ("general", "end_turn", 0.0012),
    ]
    assert described["cost_usd"] == 0.0024


# -- keel -p: --max-subagents, and agent_spend lines in stream-json ----------------------------


def test_keel_p_max_subagents_refuses_the_second_and_streams_the_spend(
    project: Path, isolated_env: Path
) -> None:
    from tests.test_cli import keel

    scripts: dict[str, list[Step]] = {
        PARENT: [reply("", task("C1"), task("C2")), reply("One ran.")],
        "C1": [reply("C1 done")],
        "C2": [reply("unreached")],
    }
    with AnthropicServer(responder=routed_responder(scripts), api_key="sk-ant-test") as model:
        out = keel(
            "-p", PARENT, "--model", "anthropic/claude-sonnet-4-5", "--max-subagents", "1",
            "--output-format", "stream-json",
            cwd=project,
            env={"ANTHROPIC_API_KEY": "sk-ant-test", "ANTHROPIC_BASE_URL": model.url},
        )  # fmt: skip
        sent = [r for r in model.requests if r.path.startswith("/v1/messages")]
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    finished = [x for x in lines if x["type"] == "tool_finished" and "subagent" not in x]
    # Both calls ran side by side; the refused one ended first.
    assert sorted((f["is_error"], f["output"]) for f in finished) == [
        (False, "C1 done"),
        (
            True,
            "not started: this prompt has started 1 subagent(s), the most it may "
            "(subagents.max_total = 1); do the general task yourself, or wait for the reports "
            "you have",
        ),
    ]
    assert len(sent) == 3  # the parent twice, C1 once: C2 never reached the model
    spend = [(x["agent"], x["status"]) for x in lines if x["type"] == "agent_spend"]
    assert spend == [
        ("main", "running"),
        ("general", "running"),
        ("general", "running"),
        ("general", "end_turn"),
        ("main", "running"),
    ]
    assert lines[-1]["type"] == "result"
    # Sonnet 4.5: $0.0006 a request. The result's cost is the prompt's own requests; the last
    # agent_spend line has the tree's (the subagent's request too).
    assert lines[-1]["cost_usd"] == 0.0012
    assert [x for x in lines if x["type"] == "agent_spend"][-1]["tree_cost_usd"] == 0.0018


# -- admit, the pure rule ----------------------------------------------------------------------


def test_admit_takes_the_tightest_budget_and_holds_the_worst_case() -> None:
    from keel.agent.limits import OverBudget, RequestCost, Spend, admit

    session = Spend(usage=Usage(1_000, 0), cost=0.40, held_usd=0.05)
    child = Spend(parent=session, usage=Usage(500, 0))
    cost = RequestCost(2_000, 0.0075, 15e-6)  # 2,000 input tokens at $3.75/M, $15/M out
    budgets = [
        (Limits(max_tokens=9_000), child, "the"),
        (Limits(max_usd=0.50), session, "the session's"),
    ]
    # Tokens: 9,000 - 500 - 2,000 = 6,500. Dollars: (0.50 - 0.40 - 0.05 - 0.0075) / 15e-6 = 2,833.
    got = admit(budgets, 8_000, cost)
    assert (got.max_tokens, got.lowered) == (2_833, True)
    assert got.held_usd == pytest.approx(0.0075 + 2_833 * 15e-6)
    assert got.held_tokens == 2_000 + 2_833
    assert admit([], 8_000, cost).max_tokens == 8_000  # no budget: as asked
    # A hold counts in every spend above it until it is released.
    child.hold(got.held_usd, got.held_tokens)
    assert session.held_usd == pytest.approx(0.05 + got.held_usd)
    assert session.held_tokens == 4_833
    with pytest.raises(OverBudget) as refused:
        admit(budgets, 8_000, cost)
    assert (refused.value.cap, refused.value.own) == ("usd", False)
    assert refused.value.message == (
        "budget: $0.0000 left of the session's $0.5000 USD budget; the next request needs "
        "~$0.0229 (~2,000 input tokens, $0.0075, and at least 1,024 output tokens, $0.0154)"
    )
    child.hold(-got.held_usd, -got.held_tokens)
    assert session.held_usd == pytest.approx(0.05)
    # The floor never asks for more than the request itself does (a small window's reply).
    tight = [(Limits(max_tokens=2_300), Spend(), "the")]
    assert admit(tight, 256, cost).max_tokens == 256
    with pytest.raises(OverBudget, match=r"^budget: 2,300 tokens left of the 2,300-token budget"):
        admit(tight, 512, cost)
