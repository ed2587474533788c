"""SVG snapshots of the main screens of the terminal UI: a finished exchange (reply, folded
thinking, tool cards, a diff, the todo list, the status line), a permission card and plan
approval.

Each screen is saved as `tests/snapshots/<name>.svg` (to look at) and compared as the text grid
the SVG draws (`<name>.txt`): what is where on screen, independent of colours and of how a
textual release spells its SVG. Durations and the spinner are frozen so the screens are
deterministic. `KEEL_UPDATE_SNAPSHOTS=1 pytest tests/test_tui_snapshots.py` rewrites them.
"""

from __future__ import annotations

import html
import os
import re
from pathlib import Path

import pytest

from keel.permissions import setup
from keel.permissions.sandbox import Probe
from keel.testing import ScriptedProvider, reply
from keel.tui import widgets
from keel.tui.app import KeelApp
from keel.tui.screens import PermissionScreen, PlanScreen
from tests.tui_helpers import MODEL, make_controller

SNAPSHOTS = Path(__file__).parent / "snapshots"
SIZE = (100, 34)
#: The width of one character cell in textual's SVG export.
CELL_WIDTH = 12.2
_TEXT = re.compile(
    r'<text class="[^"]*" x="([\d.]+)" y="[\d.]+" textLength="[\d.]+" '
    r'clip-path="url\(#[\w-]+-line-(\d+)\)">([^<]*)</text>'
)


@pytest.fixture(autouse=True)
def _frozen(monkeypatch: pytest.MonkeyPatch, project: Path) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    monkeypatch.setattr(widgets, "duration", lambda _seconds: "1.2s")
    monkeypatch.setattr(widgets, "SPINNER", "⠿")
    # And the sandbox status: these screens run no bash, and a machine without bubblewrap would
    # add its "no sandbox" line to them (that line is tested in test_library_safety).
    monkeypatch.setattr(setup, "probe", lambda: Probe(True, "frozen for the snapshots"))


def text_grid(svg: str, size: tuple[int, int] = SIZE) -> str:
    """The characters an exported SVG shows, line by line (trailing blanks dropped)."""
    width, height = size
    grid = [[" "] * width for _ in range(height)]
    for x, line, content in _TEXT.findall(svg):
        text = html.unescape(content).replace("\xa0", " ")
        column = round(float(x) / CELL_WIDTH) - 1  # the terminal starts one cell in
        for i, char in enumerate(text):
            if 0 <= column + i < width and int(line) < height:
                grid[int(line)][column + i] = char
    return "\n".join("".join(row).rstrip() for row in grid).rstrip("\n") + "\n"


def check(app: KeelApp, name: str) -> None:
    svg = app.export_screenshot(title="keel")
    grid = text_grid(svg)
    svg_path, txt_path = SNAPSHOTS / f"{name}.svg", SNAPSHOTS / f"{name}.txt"
    if os.environ.get("KEEL_UPDATE_SNAPSHOTS"):
        SNAPSHOTS.mkdir(exist_ok=True)
        svg_path.write_text(svg, encoding="utf-8")
        txt_path.write_text(grid, encoding="utf-8")
    assert txt_path.exists(), f"no snapshot {txt_path.name}: run with KEEL_UPDATE_SNAPSHOTS=1"
    assert grid == txt_path.read_text(encoding="utf-8")


async def wait_for(pilot: object, app: KeelApp, kind: type) -> None:
    for _ in range(100):
        if isinstance(app.screen, kind):
            break
        await pilot.pause(0.05)  # type: ignore[attr-defined]
    assert isinstance(app.screen, kind)
    await pilot.pause(0.1)  # type: ignore[attr-defined]


TODOS = [
    {"content": "Read util.py", "status": "completed", "active_form": "Reading util.py"},
    {"content": "Set X to 2", "status": "in_progress", "active_form": "Setting X to 2"},
    {"content": "Run the tests", "status": "pending", "active_form": "Running the tests"},
]


async def test_snapshot_a_finished_exchange(project: Path) -> None:
    provider = ScriptedProvider(
        [
            reply(
                "I'll read it first.",
                ("read", {"path": "util.py"}),
                thinking="The user wants X changed; read util.py before editing.",
            ),
            reply("", ("todo_write", {"todos": TODOS})),
            reply("", ("edit", {"path": "util.py", "old_string": "X = 1", "new_string": "X = 2"})),
            reply("## Done\n\n`X` is now **2** in `util.py`. Run the tests with `pytest -q`."),
        ],
        model=MODEL.model,
    )
    controller = await make_controller(project, provider, "--mode", "accept-edits")
    app = KeelApp(controller)
    async with app.run_test(size=SIZE) as pilot:
        app.prompt.load_text("set X to 2 in util.py")
        await pilot.press("enter")
        await app.idle()
        await pilot.pause(0.1)
        app.transcript.scroll_end(animate=False, immediate=True)  # as a user following it sees it
        await pilot.pause(0.1)
        check(app, "exchange")
    await controller.close()


async def test_snapshot_a_permission_card(project: Path) -> None:
    provider = ScriptedProvider(
        [
            reply(
                "I'll change the value.",
                ("edit", {"path": "util.py", "old_string": "X = 1", "new_string": "X = 2"}),
            )
        ],
        model=MODEL.model,
    )
    controller = await make_controller(project, provider)
    app = KeelApp(controller)
    async with app.run_test(size=SIZE) as pilot:
        app.prompt.load_text("set X to 2 in @util.py")
        await pilot.press("enter")
        await wait_for(pilot, app, PermissionScreen)
        check(app, "permission")
        await pilot.press("escape")  # stops the turn
        await app.idle()
    await controller.close()


async def test_snapshot_plan_approval(project: Path) -> None:
    plan = (
        "## Plan\n\n1. Change `X = 1` to `X = 2` in `util.py`.\n2. Run `pytest -q`.\n\n"
        "No other files change."
    )
    provider = ScriptedProvider([reply("", ("exit_plan_mode", {"plan": plan}))], model=MODEL.model)
    controller = await make_controller(project, provider, "--mode", "plan")
    app = KeelApp(controller)
    async with app.run_test(size=SIZE) as pilot:
        app.prompt.load_text("plan how to set X to 2")
        await pilot.press("enter")
        await wait_for(pilot, app, PlanScreen)
        check(app, "plan")
        await pilot.press("escape")
        await app.idle()
    await controller.close()


def test_text_grid_places_characters_by_column() -> None:
    svg = (
        '<text class="t-r1" x="12.2" y="20" textLength="24.4" '
        'clip-path="url(#t-line-0)">ab</text>'
        '<text class="t-r1" x="61" y="44.4" textLength="12.2" '
        'clip-path="url(#t-line-1)">&#160;c</text>'
    )
    assert text_grid(svg, (8, 3)) == "ab\n     c\n"
