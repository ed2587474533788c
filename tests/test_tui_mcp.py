"""The Textual front end's part of MCP: a tool card shows the latest progress a server
reported, and a server's question (elicitation) is a form whose answers go back typed."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from keel.agent.events import QuestionRequest, ToolFinished, ToolProgress, ToolStarted
from keel.llm.messages import Text, ToolResult, ToolUse
from keel.testing import ScriptedProvider
from keel.tui.app import KeelApp
from keel.tui.screens import QuestionScreen, form_values
from keel.tui.widgets import ToolCard
from tests.tui_helpers import MODEL, make_controller

SIZE = (100, 36)
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"colour": {"type": "string"}, "shade": {"type": "integer"}},
    "required": ["colour"],
}


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")


async def app_for(project: Path) -> KeelApp:
    return KeelApp(await make_controller(project, ScriptedProvider([], model=MODEL.model)))


async def test_the_card_shows_the_latest_progress_until_the_tool_ends(project: Path) -> None:
    app = await app_for(project)
    call = ToolUse("c1", "mcp__feat__slow", {"steps": 3})
    async with app.run_test(size=SIZE) as pilot:
        app.show(ToolStarted(call))
        app.show(ToolProgress("c1", 1, 3, "step 1 of 3"))
        app.show(ToolProgress("c1", 2, 3, ""))
        app.show(ToolProgress("other-call", 1, None, "not this card"))
        await app.idle()
        await pilot.pause()
        card = app.query_one(ToolCard)
        assert (card.state, card.progress) == ("running", "2/3")
        assert "2/3" in str(card.header.render())
        app.show(ToolFinished(call, ToolResult("c1", (Text("done"),)), 0.2))
        await app.idle()
        await pilot.pause()
        assert card.state == "done"
        assert "2/3" not in str(card.header.render())


@pytest.mark.parametrize("decline", [False, True])
async def test_a_servers_question_is_a_form(project: Path, decline: bool) -> None:
    app = await app_for(project)
    reply: asyncio.Future[dict[str, Any] | str | None] = asyncio.get_running_loop().create_future()
    async with app.run_test(size=SIZE) as pilot:
        app.show(QuestionRequest("feat", "Which colour?", SCHEMA, reply))
        for _ in range(50):
            if isinstance(app.screen, QuestionScreen):
                break
            await pilot.pause(0.05)
        assert isinstance(app.screen, QuestionScreen)
        if decline:
            await pilot.press("escape")
        else:
            await pilot.press(*"blue", "enter", "2", "enter")
        await pilot.pause(0.1)
        assert reply.done()
        assert reply.result() == (None if decline else {"colour": "blue", "shade": 2})


def test_form_values_are_typed_and_required_fields_checked() -> None:
    fields = {"n": {"type": "integer"}, "ok": {"type": "boolean"}, "s": {"type": "string"}}
    assert form_values(fields, {"s"}, {"n": "3", "ok": "yes", "s": "x"}) == (
        {"n": 3, "ok": True, "s": "x"},
        "",
    )
    assert form_values(fields, {"s"}, {"n": "3"}) == ({}, "s is required")
    assert form_values(fields, set(), {"n": "three"}) == ({}, "n must be an integer")
