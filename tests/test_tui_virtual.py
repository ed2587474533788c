"""The transcript of a long session stays a bounded number of widgets: a reopened session of
thousands of messages draws only its last segments, the ones above come back when the user
scrolls (or pages, or goes Home) up to them, and a session that keeps streaming drops the
widgets it scrolled past. The session files are the benchmark's (bench/bench_tui.py), reopened
the way `keel --continue` does."""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from textual.widgets import Collapsible

from keel.llm.catalog import ModelInfo
from keel.llm.events import Notice
from keel.session.index import latest_session
from keel.session.journal import read_records
from keel.testing import ScriptedProvider, reply
from keel.tui import app as tui_app
from keel.tui.app import KeelApp
from keel.tui.control import Controller
from keel.tui.replay import replay
from keel.tui.view import PromptSubmitted
from keel.tui.widgets import CommandOutput, ToolCard, UserPrompt
from keel.tui.widgets import Reply as ReplyWidget
from tests.tui_helpers import MODEL, Hang, HangingProvider, make_controller

ROOT = Path(__file__).resolve().parent.parent
SIZE = (100, 36)
#: Widgets a drawn window may hold: `WINDOW` segments (and the `CHUNK` that may pile up above
#: them), each a prompt, a reply (Markdown: a widget per block), or cards and notices.
BOUND = 40 * (tui_app.WINDOW + tui_app.CHUNK)


def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_tui", ROOT / "bench/bench_tui.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")


async def reopened(project: Path, messages: int, provider: object, *argv: str) -> Controller:
    bench().write_session(project, messages)
    controller = await make_controller(project, provider, *argv, start=False)
    await controller.start_session(latest_session(project))
    return controller


async def settle(pilot: object, app: KeelApp) -> None:
    await app.idle()
    await pilot.pause()  # type: ignore[attr-defined]


def widgets(app: KeelApp) -> int:
    return len(list(app.transcript.query("*")))


def prompts(app: KeelApp) -> list[str]:
    return [str(p.render()) for p in app.transcript.query(UserPrompt)]


def following(app: KeelApp) -> bool:
    return app.transcript.following


def at_bottom(app: KeelApp) -> bool:
    transcript = app.transcript
    return transcript.scroll_y >= transcript.max_scroll_y - 1


def shown(app: KeelApp, widget: object) -> bool:
    """Whether `widget` is (at least partly) inside the transcript's visible region."""
    region = widget.region  # type: ignore[attr-defined]
    visible = app.transcript.content_region
    return bool(region.height) and region.overlaps(visible)


async def test_a_long_reopened_session_draws_only_its_last_segments(project: Path) -> None:
    controller = await reopened(project, 2_000, ScriptedProvider([], model=MODEL.model))
    app = KeelApp(controller)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, app)
        assert 0 < widgets(app) <= BOUND, widgets(app)
        drawn = prompts(app)
        assert drawn[-1] == "Round 333: fix the parser in module_333.py"
        assert "Round 0: fix the parser in module_0.py" not in drawn
        assert len(drawn) < 20
        last = app.transcript.query(ReplyWidget).last()
        assert last.text.startswith("Round 333 done.")  # 334 rounds of 6 messages
        assert at_bottom(app)
        assert app.transcript.following
        assert app.focused is app.prompt
    await controller.close()


def small_window(app: KeelApp) -> KeelApp:
    """A window of 6 segments, drawn 4 at a time above: the same logic, fewer widgets to build
    (and scrolls not animated: fewer frames to wait for)."""
    app.window, app.chunk = 6, 4
    app.animation_level = "none"
    return app


async def test_scrolling_up_reaches_the_first_message_and_paging_down_the_end(
    project: Path,
) -> None:
    controller = await reopened(project, 36, ScriptedProvider([], model=MODEL.model))
    app = small_window(KeelApp(controller))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, app)
        transcript = app.transcript
        assert len(prompts(app)) <= 3
        assert "Round 0: fix the parser in module_0.py" not in prompts(app)
        # Page up until the first prompt is drawn: each time the top is reached, more of the
        # transcript is drawn above, and the view stays on what it showed.
        for _ in range(200):
            await pilot.press("pageup")
            await settle(pilot, app)
            if transcript.scroll_y < 1 and not app._first:
                break
        assert app._first == 0
        first = transcript.query(UserPrompt).first()
        assert str(first.render()) == "Round 0: fix the parser in module_0.py"
        assert len(prompts(app)) == 6
        await pilot.pause(0.2)
        assert shown(app, first)
        assert not following(app)
        # Back down: page by page, to the end, where it follows again.
        for _ in range(1_000):
            await pilot.press("pagedown")
            if following(app):
                break
        await settle(pilot, app)
        assert following(app)
        assert shown(app, transcript.query(ReplyWidget).last())
        # New output at the end drops what piled up above.
        app.show(Notice("after the scroll"))
        await settle(pilot, app)
        assert len(prompts(app)) <= 3
        assert app._first > 0
    await controller.close()


async def test_home_goes_to_the_top_and_draws_more_above_each_time(project: Path) -> None:
    controller = await reopened(project, 36, ScriptedProvider([], model=MODEL.model))
    app = small_window(KeelApp(controller))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, app)
        app.transcript.focus()
        # Home goes to the top of what is drawn; reaching it draws more above (the view stays
        # on what it showed): each Home goes further up, until the first message.
        firsts = [app._first]
        for _ in range(20):
            await pilot.press("home")
            await settle(pilot, app)
            await pilot.pause(0.1)
            firsts.append(app._first)
            if not app._first and app.transcript.scroll_y == 0:
                break
        assert firsts[-1] == 0
        assert all(a > b for a, b in itertools.pairwise(firsts) if a), firsts
        first = app.transcript.query(UserPrompt).first()
        assert str(first.render()) == "Round 0: fix the parser in module_0.py"
        assert shown(app, first)
    await controller.close()


async def test_a_new_streamed_reply_on_a_long_transcript_is_followed(project: Path) -> None:
    answer = "\n\n".join(f"Paragraph {i} of the answer." for i in range(40))
    provider = HangingProvider(Hang(answer))
    controller = await reopened(project, 2_000, provider)
    app = KeelApp(controller)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, app)
        app.prompt.load_text("tell me everything")
        await pilot.press("enter")
        await asyncio.wait_for(provider.streaming.wait(), 5)
        await pilot.pause(0.5)
        assert app.transcript.query(ReplyWidget).last().text == answer
        assert app.transcript.following
        assert at_bottom(app), (app.transcript.scroll_y, app.transcript.max_scroll_y)
        await pilot.press("escape")
        await settle(pilot, app)
    await controller.close()


async def test_ctrl_o_and_undo_work_on_a_long_transcript(project: Path) -> None:
    provider = ScriptedProvider(
        [reply("", ("write", {"path": "util.py", "content": "X = 99\n"})), reply("Changed.")],
        model=MODEL.model,
    )
    controller = await reopened(project, 2_000, provider, "--mode", "accept-edits")
    app = KeelApp(controller)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, app)
        folds = list(app.transcript.query(Collapsible))
        assert folds
        assert any(f.collapsed for f in folds)
        await pilot.press("ctrl+o")
        assert not any(f.collapsed for f in folds)
        # Segments drawn again above open as Ctrl+O said.
        first = app._first
        app.transcript.scroll_home(animate=False, immediate=True)
        app.transcript.following = False
        app._reached_top(False)
        await settle(pilot, app)
        assert app._first == first - tui_app.CHUNK
        older = [f for f in app.transcript.query(Collapsible) if f not in folds]
        assert older
        assert not any(f.collapsed for f in older)
        await pilot.press("ctrl+o")
        assert all(f.collapsed for f in app.transcript.query(Collapsible))
        # A turn that writes a file, then /undo: the whole transcript is drawn anew, bounded.
        app.prompt.load_text("change @util.py")
        await pilot.press("enter")
        await settle(pilot, app)
        assert (project / "util.py").read_text() == "X = 99\n"
        app.prompt.load_text("/undo")
        await pilot.press("enter")
        await settle(pilot, app)
        assert (project / "util.py").read_text() == "X = 1\n"
        out = app.transcript.query(CommandOutput).last()
        assert out.border_title == "/undo"
        assert "restored `util.py`" in out.text
        assert 0 < widgets(app) <= BOUND
        assert "Round 0: fix the parser in module_0.py" not in prompts(app)
    await controller.close()


async def test_a_thousand_more_messages_keep_the_widgets_bounded(project: Path) -> None:
    """Messages that keep coming (1,000 prompts and answers, shown one by one as a live session
    shows them) leave the same number of widgets, and no card behind."""
    path = bench().write_session(project, 12)
    events = replay(read_records(path).records, _info(), project)
    controller = await make_controller(project, ScriptedProvider([], model=MODEL.model))
    app = small_window(KeelApp(controller))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, app)
        for event in events:  # two rounds with cards, thinking and diffs
            app.show(event)
        counts = []
        for n in range(500):
            app.show(PromptSubmitted(f"question {n}"))
            app.show(Notice(f"answer {n}"))
            if n % 100 == 99:
                await settle(pilot, app)
                counts.append(widgets(app))
        await settle(pilot, app)
        assert max(counts) <= 10 * (app.window + app.chunk), counts
        assert counts[-1] == counts[0]
        assert not app._cards  # the cards went with their segments
        assert not app.transcript.query(ToolCard)
        assert prompts(app)[-1] == "question 499"
        assert len(app._segments) == 1 + 3 * 2 + 500  # a round: prompt, two more requests
        assert app.transcript.following
        assert at_bottom(app)
    await controller.close()


def _info() -> ModelInfo:
    return ModelInfo(window=200_000, max_output=64_000)


def test_the_benchmark_runs_its_quick_mode(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench/bench_tui.py"),
            "--quick",
            "--json",
            str(tmp_path / "r"),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("| messages | reopen s |")
    assert [line.split("|")[1].strip() for line in lines[2:]] == ["12", "60"]
    rows = json.loads((tmp_path / "r").read_text(encoding="utf-8"))
    for row in rows:
        assert row["reopen_s"] > row["replay_s"] > 0
        assert row["keys"] > 0
        assert row["frames"] > 0
        assert row["widgets"] > 0
        assert row["peak_rss_mb"] >= row["rss_mb"] > 0
