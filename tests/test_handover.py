"""The issue's measurement with the real browser: one session started in `keel attach` (HOME A)
continues in the web page (chromium through playwright), then in a second `keel attach` (HOME
B) that comes in while a prompt sent from the browser waits for permission, with nothing lost.

The terminals are Textual apps driven by their pilot, each in a thread of its own with its own
event loop (playwright's sync API holds this thread's); the server is a real `keel serve`
process and its model a loopback Anthropic server scripted here. The page's event stream is
read twice: by the page, and by a copy of the same bytes (`SEQ_TAP`) that records each event's
number, so the test sees what the page saw.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import pytest

from keel.session.fold import fold
from keel.session.journal import read_records
from keel.testing import reply
from keel.testing.anthropic_server import AnthropicServer
from keel.tui.format import typed_prompt
from keel.tui.screens import PermissionScreen
from tests.server_helpers import (  # noqa: F401 (fixtures)
    Served,
    anthropic_fixture,
    served_fixture,
    servers_fixture,
)
from tests.test_attach import SIZE, attached, describe, remote, send, settle, transcript, wait_until
from tests.web_helpers import (  # noqa: F401 (fixtures)
    browser_fixture,
    expect,
    session_url,
    tabs_fixture,
)

pytestmark = pytest.mark.needs("chromium")

T = TypeVar("T")

#: Copies the page's event stream and keeps each event's `id:` (its seq) in `window.seqs`.
SEQ_TAP = """
(() => {
  window.seqs = [];
  const fetched = window.fetch.bind(window);
  window.fetch = async (input, init) => {
    const response = await fetched(input, init);
    const url = typeof input === "string" ? input : input.url;
    if (!/\\/events(\\?|$)/.test(url) || !response.body) return response;
    const [page, copy] = response.body.tee();
    (async () => {
      const reader = copy.pipeThrough(new TextDecoderStream()).getReader();
      let rest = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) return;
        const lines = (rest + value).split("\\n");
        rest = lines.pop();
        for (const line of lines) {
          if (line.startsWith("id:")) window.seqs.push(Number(line.slice(3)));
        }
      }
    })().catch(() => {});
    return new Response(page, { status: response.status, headers: response.headers });
  };
})();
"""


def in_a_thread(work: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a terminal's coroutine to its end on an event loop of its own."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, work()).result(timeout=120)


def test_one_session_moves_from_attach_to_the_web_page_to_a_second_attach(
    served: Served,
    anthropic: AnthropicServer,
    project: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    browser: Any,
    tabs: Any,
) -> None:
    """Attach #1 starts the session and runs a prompt; the page opens it, sends a prompt and
    approves an edit from its diff card, then sends a third whose call waits for permission;
    attach #2 comes in, answers it, and the page's card closes. Attach #2 shows the session
    file's conversation; the page shows every prompt and answer in order; neither skipped an
    event number."""
    anthropic.add(
        reply("One.", ("write", {"path": "one.txt", "content": "1\n"})),
        reply("Wrote one."),
        reply("", ("read", {"path": "one.txt"})),
        reply("Two.", ("edit", {"path": "one.txt", "old_string": "1", "new_string": "2"})),
        reply("Edited one."),
        reply("Three.", ("write", {"path": "three.txt", "content": "3\n"})),
        reply("Wrote three."),
    )
    timings: dict[str, float] = {}

    # 1. A terminal on "machine A" starts the session.
    monkeypatch.setenv("HOME", str(tmp_path / "home-a"))

    async def first_terminal() -> str:
        began = time.monotonic()
        async with attached(served, new=True) as app:
            async with app.run_test(size=SIZE) as pilot:
                await pilot.pause()
                timings["attach #1: command to first frame"] = time.monotonic() - began
                await send(pilot, app, "write one")
                await wait_until(pilot, lambda: isinstance(app.screen, PermissionScreen))
                await pilot.press("1")
                await settle(pilot, app)
                assert transcript(app)[-1] == ("reply", "Wrote one.")
            return remote(app).session_id

    sid = in_a_thread(first_terminal)

    # 2. The web page opens that session, sends a prompt, approves an edit from its diff card.
    context = browser.new_context(viewport={"width": 1200, "height": 800})
    context.add_init_script(SEQ_TAP)
    try:
        opened_at = describe(served, sid)["last_seq"]
        began = time.monotonic()
        tab = tabs(session_url(served, sid), context=context)
        expect(tab.loc("#transcript .assistant")).to_have_text(["One.", "Wrote one."])
        timings["browser: open to transcript shown"] = time.monotonic() - began
        expect(tab.loc("#link-state")).to_have_text("live")
        tab.prompt("edit one")
        card = tab.loc(".tool").last
        expect(card.locator(".diff-line")).to_have_text(["- 1", "+ 2"])
        ask = tab.loc(".tool .ask")
        expect(ask).to_be_focused()
        expect(ask).to_have_class(re.compile(r"\barmed\b"))  # takes keys now
        tab.page.keyboard.press("y")
        expect(card.locator(".answered.allowed")).to_have_text("allowed once")
        tab.result("done · 3 turns")
        # The third prompt: its call waits when the second terminal comes in.
        tab.prompt("write three")
        expect(tab.loc(".tool .ask")).to_be_visible()

        # 3. A terminal on "machine B", mid-task, answers it.
        monkeypatch.setenv("HOME", str(tmp_path / "home-b"))

        async def second_terminal() -> tuple[list[tuple[str, str]], list[int], int]:
            began = time.monotonic()
            async with attached(served) as app:  # `keel attach URL`: the latest session
                start_seq = remote(app).last_seq
                async with app.run_test(size=SIZE) as pilot:
                    await wait_until(pilot, lambda: isinstance(app.screen, PermissionScreen))
                    timings["attach #2: command to the question on screen"] = (
                        time.monotonic() - began
                    )
                    screen = app.screen
                    assert isinstance(screen, PermissionScreen)
                    assert screen.request.call.input == {"path": "three.txt", "content": "3\n"}
                    answered = time.monotonic()
                    await pilot.press("1")
                    await wait_until(pilot, lambda: ("reply", "Wrote three.") in transcript(app))
                    timings["attach #2: answer to done"] = time.monotonic() - answered
                    await settle(pilot, app)
                    seen = [seq for seq, _kind in remote(app).seen if seq is not None]
                    return transcript(app), seen, start_seq

        shown, seen, start_seq = in_a_thread(second_terminal)

        # The page's card closed on the stream's permission_answered, and the run ended there.
        expect(tab.loc(".ask")).to_have_count(0)
        expect(tab.loc(".answered.allowed").last).to_have_text("allowed once")
        tab.result("done · 2 turns")
        expect(tab.loc("#busy")).to_be_hidden()
        last = describe(served, sid)["last_seq"]
        page_seqs = tab.page.wait_for_function(
            f"() => window.seqs.includes({last}) && window.seqs"
        ).json_value()
        prompts = tab.loc("#transcript .user-text").all_text_contents()
        answers = tab.loc("#transcript .assistant").all_text_contents()
    finally:
        context.close()

    # Nothing lost: attach #2 shows the session file's conversation, in order.
    path = Path(describe(served, sid)["path"])
    conversation = fold(read_records(path).records).conversation.messages
    expected: list[tuple[str, str]] = []
    for message in conversation:
        if message.role == "assistant":
            if message.text:  # a reply of tool calls alone shows only their cards
                expected.append(("reply", message.text))
            expected += [("tool", f"{c.id} done") for c in message.tool_uses]
        elif message.text.strip() and not message.tool_results:
            expected.append(("prompt", typed_prompt(message.text)))
    assert [p for p in shown if p[0] == "prompt"] == [
        ("prompt", "write one"),
        ("prompt", "edit one"),
        ("prompt", "write three"),
    ]
    assert shown == expected
    # The page: every prompt and every answer, in order.
    assert prompts == ["write one", "edit one", "write three"]
    texts = [m.text for m in conversation if m.role == "assistant" and m.text]
    assert (
        answers == texts == ["One.", "Wrote one.", "Two.", "Edited one.", "Three.", "Wrote three."]
    )
    assert (project / "one.txt").read_text(encoding="utf-8") == "2\n"
    assert (project / "three.txt").read_text(encoding="utf-8") == "3\n"
    # Every event each of them saw, numbered without a hole, up to the server's last.
    assert seen == list(range(start_seq + 1, last + 1))
    assert page_seqs == list(range(opened_at + 1, last + 1))
    print("\nhand-over timings (s):", json.dumps({k: round(v, 3) for k, v in timings.items()}))
    for took in timings.values():
        assert took < 10
