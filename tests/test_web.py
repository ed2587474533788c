"""The web front end's sessions page as a user drives it: a real `keel serve` process (its model
a loopback Anthropic server scripted per test) and Debian's chromium through playwright.

A prompt streamed to the answer, an edit approved from its diff card (by key), a denial whose
reason the model reads, a plan approved into accept-edits, an interrupt with Esc, the page
recovering when the server is killed and started again, two tabs on one session in step, the
token flow (taken from the fragment, never in a URL the page requests), a hostile transcript
rendered inert, fork and unload from the list, and the page at a phone's width (the screenshot
in docs/web.md, written there with KEEL_UPDATE_SCREENSHOT=1).
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from keel.llm.script import reply
from keel.testing.anthropic_server import AnthropicServer
from tests.server_helpers import (  # noqa: F401 (fixtures)
    MODEL,
    TOKEN,
    Events,
    Served,
    Servers,
    anthropic_fixture,
    served_fixture,
    servers_fixture,
)
from tests.web_helpers import (  # noqa: F401 (fixtures)
    WAIT,
    browser_fixture,
    expect,
    new_session,
    session_url,
    tabs_fixture,
)

ROOT = Path(__file__).resolve().parent.parent
SCREENSHOT = ROOT / "docs" / "images" / "web.png"
pytestmark = pytest.mark.needs("chromium")


# -- the conversation ------------------------------------------------------------------------------


def test_a_prompt_streams_to_the_answer_as_markdown(
    served: Served, anthropic: AnthropicServer, tabs: Any
) -> None:
    anthropic.add(
        reply(
            "# Plan\n\nSome **bold** and `code`:\n\n- one\n- two\n\n```py\nx = 1\n```",
            thinking="The user wants a plan.",
        )
    )
    tab = tabs(session_url(served))
    tab.page.click("#new-session")
    expect(tab.loc("#conv-pane")).to_be_visible()
    tab.prompt("make a plan")
    expect(tab.loc("#transcript .user-text")).to_have_text("make a plan")
    thinking = tab.loc("#transcript details.thinking")
    expect(thinking.locator(".thinking-text")).to_have_text("The user wants a plan.")
    expect(thinking).not_to_have_attribute("open", "")  # folded until clicked
    answer = tab.loc("#transcript .assistant").last
    expect(answer.locator("h1")).to_have_text("Plan")
    expect(answer.locator("strong")).to_have_text("bold")
    expect(answer.locator("p code")).to_have_text("code")
    expect(answer.locator("li")).to_have_text(["one", "two"])
    expect(answer.locator("pre code")).to_have_text("x = 1")
    tab.result("done · 1 turn")
    expect(tab.loc("#busy")).to_be_hidden()
    expect(tab.loc("#cost-meter")).not_to_have_text("$0.0000")
    expect(tab.loc("#context-meter")).to_contain_text("/")
    # The session list shows it, with the prompt.
    expect(tab.loc("#sessions .session-prompt").first).to_have_text("make a plan")
    body = anthropic.model_requests[-1].json
    assert body["messages"][-1]["content"][-1]["text"].endswith("make a plan")


def test_an_edit_is_approved_from_its_diff_card_by_key(
    served: Served, anthropic: AnthropicServer, project: Path, tabs: Any
) -> None:
    anthropic.add(
        reply("", ("read", {"path": "util.py"})),
        reply("", ("edit", {"path": "util.py", "old_string": "X = 1", "new_string": "X = 2"})),
        reply("Changed X."),
    )
    tab = tabs(session_url(served, new_session(served)))
    tab.prompt("set X to 2")
    ask = tab.loc(".tool .ask")
    expect(ask).to_be_focused()
    expect(ask).to_have_class(re.compile(r"\barmed\b"))  # takes keys (not typed for the prompt)
    card = tab.loc(".tool").last
    expect(card.locator(".tool-name")).to_have_text("edit")
    expect(card.locator(".diff-path")).to_have_text("util.py")
    expect(card.locator(".diff-line")).to_have_text(["- X = 1", "+ X = 2"])
    expect(ask.locator("button")).to_have_text(
        ["Allow once [y]", "Allow for this session [s]", "Always allow edit [a]", "Deny [n]"]
    )
    tab.page.keyboard.press("y")
    expect(card.locator(".answered.allowed")).to_have_text("allowed once")
    tab.result("done · 3 turns")
    expect(card.locator(".tool-status")).to_have_text("done")
    assert (project / "util.py").read_text(encoding="utf-8") == "X = 2\n"
    # /undo in the prompt puts the file back, as in the TUI.
    tab.prompt("/undo")
    expect(tab.loc("#transcript .line.notice").last).to_have_text(
        re.compile(r"^undid .*: restored util\.py$")
    )
    assert (project / "util.py").read_text(encoding="utf-8") == "X = 1\n"


def test_a_denial_with_a_reason_reaches_the_model(
    served: Served, anthropic: AnthropicServer, project: Path, tabs: Any
) -> None:
    write = reply("", ("write", {"path": "notes.txt", "content": "hi\n"}))
    anthropic.add(write, reply("Understood."))
    tab = tabs(session_url(served, new_session(served)))
    tab.prompt("take notes")
    expect(tab.loc(".ask.armed")).to_be_focused()
    tab.page.keyboard.press("n")  # the reason field first
    expect(tab.loc(".ask-reason")).to_be_focused()
    tab.page.keyboard.type("use notes.md instead")
    tab.page.keyboard.press("Enter")
    expect(tab.loc(".answered.denied")).to_have_text("denied: use notes.md instead")
    tab.result("done · 2 turns")
    result = anthropic.model_requests[-1].json["messages"][-1]["content"][0]
    assert result["tool_use_id"] == write.message.tool_uses[0].id
    assert result["is_error"] is True
    assert "use notes.md instead" in result["content"][0]["text"]
    assert not (project / "notes.txt").exists()


def test_a_plan_is_approved_into_accept_edits(
    served: Served, anthropic: AnthropicServer, tabs: Any
) -> None:
    plan = "1. Change `util.py`\n2. Run the tests"
    anthropic.add(reply("", ("exit_plan_mode", {"plan": plan})), reply("Carrying it out."))
    tab = tabs(session_url(served, new_session(served, mode="plan")))
    expect(tab.loc("#mode")).to_have_value("plan")
    tab.prompt("plan it")
    ask = tab.loc(".ask")
    expect(ask.locator(".ask-title")).to_have_text("keel wants to leave plan mode with this plan")
    expect(ask.locator(".plan li")).to_have_text(["Change util.py", "Run the tests"])
    expect(ask.locator("button")).to_have_text(
        ["Approve, accept edits [a]", "Approve, ask before edits [y]", "Keep planning [n]"]
    )
    ask.locator("button", has_text="Approve, accept edits").click()
    tab.result("done · 2 turns")
    expect(tab.loc("#mode")).to_have_value("accept-edits")


def test_esc_interrupts_the_run(
    served: Served, anthropic: AnthropicServer, project: Path, tabs: Any
) -> None:
    anthropic.add(reply("", ("write", {"path": "x.txt", "content": "x\n"})))
    tab = tabs(session_url(served, new_session(served)))
    tab.prompt("write x")
    # Typing on (the next prompt) as the card appears answers nothing: the card does not take
    # the focus from text being written, nor keys before it is armed.
    tab.page.keyboard.type("yes sure")
    expect(tab.loc(".ask.armed")).to_be_visible()
    expect(tab.loc("#prompt")).to_be_focused()
    expect(tab.loc("#prompt")).to_have_value("yes sure")
    expect(tab.loc(".answered")).to_have_count(0)
    expect(tab.loc("#busy")).to_be_visible()
    tab.page.keyboard.press("Escape")
    expect(tab.loc(".answered.denied")).to_have_text("denied (cancelled)")
    tab.result("interrupted")
    expect(tab.loc("#busy")).to_be_hidden()
    assert not (project / "x.txt").exists()


def test_mode_switching_patches_the_session_and_clear_keeps_it(served: Served, tabs: Any) -> None:
    sid = new_session(served)
    tab = tabs(session_url(served, sid))
    expect(tab.loc("#mode")).to_have_value("default")
    tab.page.select_option("#mode", "accept-edits")
    with served.client() as c:
        for _ in range(100):
            if c.get(f"/v1/sessions/{sid}").json()["mode"] == "accept-edits":
                break
            tab.page.wait_for_timeout(50)
        assert c.get(f"/v1/sessions/{sid}").json()["mode"] == "accept-edits"
    # /clear: a fresh session with the same mode, the old one unloaded (its file stays).
    tab.prompt("/clear")
    expect(tab.loc("#conv-title")).not_to_have_text(sid)
    fresh = tab.loc("#conv-title").text_content()
    expect(tab.loc("#mode")).to_have_value("accept-edits")
    with served.client() as c:
        assert c.get(f"/v1/sessions/{fresh}").json()["mode"] == "accept-edits"
        assert c.get(f"/v1/sessions/{sid}").status_code == 404


def test_a_subagents_work_nests_under_the_call_that_started_it(
    served: Served, anthropic: AnthropicServer, tabs: Any
) -> None:
    anthropic.add(
        reply("", ("task", {"description": "look around", "prompt": "list the files"})),
        reply("Three files, **one** README."),  # the subagent's
        reply("The helper found three files."),
    )
    tab = tabs(session_url(served, new_session(served)))
    tab.prompt("delegate")
    tab.result("done · 2 turns")
    card = tab.loc("#transcript > .tool")
    expect(card.locator(".tool-name")).to_have_text("task")
    expect(card.locator(".tool-summary")).to_have_text("look around")
    expect(card.locator(".tool-nested .assistant")).to_have_text("Three files, one README.")
    expect(card.locator(".tool-nested strong")).to_have_text("one")
    expect(tab.loc("#transcript > .assistant")).to_have_text(["The helper found three files."])


def with_features_server(servers: Servers, isolated_env: Path) -> Served:
    """`keel serve` with tests/mcp_servers/features_server.py as MCP server `feat` (its
    `favourite` tool asks which colour)."""
    features = Path(__file__).parent / "mcp_servers" / "features_server.py"
    settings = isolated_env / "config" / "settings.json"
    settings.parent.mkdir(parents=True, exist_ok=True)
    server = {"command": sys.executable, "args": [str(features)]}
    settings.write_text(json.dumps({"mcp_servers": {"feat": server}}), encoding="utf-8")
    return servers.start()


def test_an_mcp_servers_question_is_answered_from_its_form(
    servers: Servers, anthropic: AnthropicServer, isolated_env: Path, tabs: Any
) -> None:
    served = with_features_server(servers, isolated_env)
    anthropic.add(reply("", ("mcp__feat__favourite", {})), reply("Blue it is."))
    tab = tabs(session_url(served, new_session(served)))
    tab.prompt("ask me")
    ask = tab.loc(".ask.armed:not(.question)")
    expect(ask).to_be_focused()
    tab.page.keyboard.press("y")
    form = tab.loc("form.question")
    expect(tab.loc("form.question, .line.result")).not_to_have_count(0)
    assert form.count() == 1, tab.loc("#transcript .tool-output pre").all_text_contents()
    expect(form.locator(".ask-title")).to_have_text("feat asks: Which colour?")
    expect(form.locator("label > span")).to_have_text(["Colour *", "Shade"])
    expect(form.locator("input[type=number]")).to_have_value("1")
    form.locator("input[type=text]").fill("blue")
    form.locator("input[type=number]").fill("2")
    form.locator("button", has_text="Send").click()
    tab.result("done · 2 turns")
    expect(tab.loc(".answered").last).to_have_text("answered")
    result = anthropic.model_requests[-1].json["messages"][-1]["content"][0]
    assert result["content"][0]["text"] == "accepted blue 2"


def test_an_mcp_question_answered_in_one_tab_closes_in_the_other(
    servers: Servers, anthropic: AnthropicServer, isolated_env: Path, tabs: Any
) -> None:
    served = with_features_server(servers, isolated_env)
    anthropic.add(reply("", ("mcp__feat__favourite", {})), reply("Green it is."))
    sid = new_session(served)
    a = tabs(session_url(served, sid))
    b = tabs(session_url(served, sid))
    expect(b.loc("#link-state")).to_have_text("live")
    with served.client() as c:
        stream = Events(c, sid, after=c.get(f"/v1/sessions/{sid}").json()["last_seq"])
        a.prompt("ask me")
        a.loc(".ask:not(.question) button", has_text="Allow once").click()
        for tab in (a, b):
            expect(tab.loc("form.question .ask-title")).to_have_text("feat asks: Which colour?")
        b.loc("form.question input[type=text]").fill("green")
        b.loc("form.question button", has_text="Send").click()
        # Tab A's form closes on the stream's question_answered, before the run's result
        # (which would say "withdrawn (the run ended)").
        expect(a.loc("form.question")).to_have_count(0)
        expect(a.loc(".answered").last).to_have_text("answered")
        frames = stream.until("result")
        stream.close()
    for tab in (a, b):
        tab.result("done · 2 turns")
    [asked] = [f.data for f in frames if f.event == "question"]
    [answered] = [f.data for f in frames if f.event == "question_answered"]
    assert answered == {
        "type": "question_answered",
        "request_id": asked["request_id"],
        "action": "accept",
        "by": "user",
        "waited_ms": answered["waited_ms"],
        "seq": answered["seq"],
        "session": sid,
    }
    assert answered["waited_ms"] > 0
    kinds = [f.event for f in frames]
    assert kinds.index("question") < kinds.index("question_answered") < kinds.index("result")
    result = anthropic.model_requests[-1].json["messages"][-1]["content"][0]
    assert result["content"][0]["text"] == "accepted green 1"


def test_a_background_command_shows_on_the_call_that_started_it(
    served: Served, anthropic: AnthropicServer, tabs: Any
) -> None:
    command = ("bash", {"command": "echo hi", "run_in_background": True})
    anthropic.add(reply("", command), reply("Started it."), reply("It said hi."))
    tab = tabs(session_url(served, new_session(served)))
    tab.prompt("run it in the background")
    expect(tab.loc(".ask, .task-line")).not_to_have_count(0)
    if tab.loc(".ask").count():  # no sandbox here: bash asks
        tab.loc(".ask button", has_text="Allow once").click()
    card = tab.loc("#transcript > .tool").first
    expect(card.locator(".task-line")).to_have_text(re.compile(r"background task \S+: completed"))
    expect(tab.loc("#tasks-button")).to_have_text("Tasks 0/1")
    tab.page.click("#tasks-button")
    expect(tab.loc("#tasks .task")).to_contain_text("shell")


# -- the stream: restarts and two tabs -------------------------------------------------------------


def test_the_page_recovers_when_the_server_is_killed_and_started_again(
    servers: Servers, anthropic: AnthropicServer, tabs: Any
) -> None:
    first = servers.start()
    anthropic.add(reply("First answer."), reply("Second answer."))
    sid = new_session(first)
    tab = tabs(session_url(first, sid))
    tab.prompt("one")
    tab.result("done")
    expect(tab.loc("#link-state")).to_have_text("live")
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait(10)
    expect(tab.loc("#link-state")).to_have_text("reconnecting…")
    second = servers.start("--port", str(first.port))
    assert second.url == first.url
    # The page tries again at most 8 s apart.
    expect(tab.loc("#link-state")).to_have_text("live", timeout=2 * WAIT)
    # Reloaded from the session file (the new server's ring said what it lost: a gap).
    expect(tab.loc("#transcript .assistant")).to_have_text(["First answer."])
    expect(tab.loc("#transcript .user-text")).to_have_text(["one"])
    tab.prompt("two")
    tab.result("done")
    expect(tab.loc("#transcript .assistant")).to_have_text(["First answer.", "Second answer."])
    with second.client() as c:
        assert c.get(f"/v1/sessions/{sid}").json()["turns"] >= 1


def test_two_tabs_on_one_session_stay_in_step(
    served: Served, anthropic: AnthropicServer, project: Path, tabs: Any
) -> None:
    anthropic.add(reply("", ("write", {"path": "notes.txt", "content": "hi\n"})), reply("Wrote."))
    sid = new_session(served)
    a = tabs(session_url(served, sid))
    b = tabs(session_url(served, sid))
    expect(b.loc("#link-state")).to_have_text("live")
    a.prompt("write notes")
    expect(b.loc("#transcript .user-text")).to_have_text("write notes")
    expect(a.loc(".ask")).to_be_visible()
    expect(b.loc(".ask")).to_be_visible()
    b.loc(".ask button", has_text="Allow for this session").click()
    # The card leaves tab A too: the answer came over the stream.
    expect(a.loc(".ask")).to_have_count(0)
    expect(a.loc(".answered.allowed")).to_have_text("allowed for this session")
    for tab in (a, b):
        tab.result("done · 2 turns")
        expect(tab.loc("#transcript .assistant")).to_have_text(["Wrote."])
    assert (project / "notes.txt").read_text(encoding="utf-8") == "hi\n"


def test_the_trace_link_opens_the_viewer_at_a_capability_url(
    servers: Servers, anthropic: AnthropicServer, tabs: Any
) -> None:
    plain = servers.start()
    sid = new_session(plain)
    with plain.client() as c:
        r = c.get(f"/v1/sessions/{sid}/trace")
        assert (r.status_code, r.json()["error"]) == (404, f"session {sid} has no trace")
    plain.proc.terminate()
    plain.proc.wait(10)
    served = servers.start(env={"KEEL_DEBUG": "1"})
    anthropic.add(reply("Traced."))
    tab = tabs(session_url(served, sid))
    tab.prompt("trace me")
    tab.result("done")
    link = tab.loc("#trace-link")
    expect(link).to_be_visible()
    href = link.get_attribute("href")
    assert href.startswith("/trace/")
    assert TOKEN not in href
    with tab.page.context.expect_page() as opened:
        link.click()
    viewer = opened.value
    viewer.wait_for_selector("#ledger tbody tr")
    assert viewer.url == f"{served.url}{href}"
    with served.client(None) as c:
        assert c.get(href).status_code == 200  # the capability is the credential
        assert c.get("/trace/not-a-capability/").status_code == 404
    with served.client(None, host="evil.example") as c:
        assert c.get(href).status_code == 403


# -- the token, and what the page will not do ------------------------------------------------------


def test_the_token_is_taken_from_the_fragment_and_never_put_in_a_url(
    served: Served, tabs: Any, browser: Any
) -> None:
    tab = tabs(session_url(served))
    expect(tab.loc("#new-session")).to_be_visible()
    assert tab.page.url == f"{served.url}/"
    tab.page.click("#new-session")
    expect(tab.loc("#link-state")).to_have_text("live")
    api = [r for r in tab.requests if "/v1/" in r.url]
    assert {r.url.split("?")[0].removeprefix(served.url) for r in api} >= {
        "/v1/info",
        "/v1/sessions",
    }
    assert all(TOKEN not in r.url for r in tab.requests)
    assert all(r.headers.get("authorization") == f"Bearer {TOKEN}" for r in api)
    # A reload keeps it (this tab's session storage), and the address stays clean.
    tab.page.reload()
    expect(tab.loc("#conv-pane")).to_be_visible()
    assert TOKEN not in tab.page.url

    # A new tab without it asks; a wrong one is refused, the right one lets it in.
    fresh = tabs(f"{served.url}/")
    expect(fresh.loc("#token-form")).to_be_visible()
    fresh.page.fill("#token-input", "wrong-token")
    fresh.page.press("#token-input", "Enter")
    expect(fresh.loc("#toast")).to_contain_text("the server refused the token")
    expect(fresh.loc("#token-form")).to_be_visible()
    fresh.page.fill("#token-input", TOKEN)
    fresh.page.press("#token-input", "Enter")
    expect(fresh.loc("#sessions .session")).to_have_count(1)
    assert all(TOKEN not in r.url for r in fresh.requests)
    fresh.problems.clear()  # the refused token's 401 is logged by chromium


HOSTILE = (
    "Look: <img src=x onerror=\"document.title='pwned'\"> and "
    "[click me](javascript:document.title='pwned') and "
    "<script>document.title='pwned'</script> and [safe](https://example.com/a) and "
    "![pic](http://127.0.0.1:1/x.png)"
)


def test_a_hostile_transcript_renders_inert(
    served: Served, anthropic: AnthropicServer, project: Path, tabs: Any
) -> None:
    (project / "page.html").write_text("<img src=y onerror=alert(1)>\n", encoding="utf-8")
    anthropic.add(reply("", ("read", {"path": "page.html"})), reply(HOSTILE))
    tab = tabs(session_url(served, new_session(served)))
    title = tab.page.title()
    tab.prompt("<b>hi</b>")
    expect(tab.loc(".user-text")).to_have_text("<b>hi</b>")
    tab.result("done · 2 turns")
    answer = tab.loc("#transcript .assistant").last
    expect(answer).to_contain_text("<img src=x onerror=\"document.title='pwned'\">")
    expect(answer).to_contain_text("<script>document.title='pwned'</script>")
    expect(answer).to_contain_text("click me (javascript:document.title='pwned')")
    links = answer.locator("a")
    expect(links).to_have_count(2)
    assert [links.nth(i).get_attribute("href") for i in range(2)] == [
        "https://example.com/a",
        "http://127.0.0.1:1/x.png",
    ]
    assert tab.loc("#transcript img, #transcript script").count() == 0
    assert tab.loc("#transcript b").count() == 0
    expect(tab.loc(".tool-output pre")).to_contain_text("<img src=y onerror=alert(1)>")
    assert tab.page.title() == title
    assert not [r.url for r in tab.requests if r.url.endswith(("/x", "/y", "x.png"))]


#: Markdown and what the renderer must build from it (tags, text and attributes only).
MARKDOWN = [
    ("a *b* **c** ~~d~~ `e`", "<p>a <em>b</em> <strong>c</strong> <s>d</s> <code>e</code></p>"),
    ("## T\n\n> q\n\n---", "<h2>T</h2><blockquote><p>q</p></blockquote><hr>"),
    ("- a\n  - b\n- c", "<ul><li><p>a</p><ul><li>b</li></ul></li><li>c</li></ul>"),
    ("3. x\n4. y", '<ol start="3"><li>x</li><li>y</li></ol>'),
    (
        "| a | b |\n|---|:-:|\n| 1 | 2 |",
        '<div class="table-wrap"><table><thead><tr><th>a</th>'
        "<th>b</th></tr></thead><tbody><tr><td>1</td><td>2</td></tr></tbody></table></div>",
    ),
    ("```js\n<b>x</b>\n```", '<pre><code data-lang="js">&lt;b&gt;x&lt;/b&gt;</code></pre>'),
    ("snake_case_name and 2 * 3 * 4", "<p>snake_case_name and 2 * 3 * 4</p>"),
    ("line one\nline two", "<p>line one<br>line two</p>"),
    (
        "<https://a.example/x>",
        '<p><a href="https://a.example/x" rel="noopener noreferrer '
        'nofollow" target="_blank">https://a.example/x</a></p>',
    ),
    (
        "[m](mailto:me@a.example)",
        '<p><a href="mailto:me@a.example" rel="noopener noreferrer '
        'nofollow" target="_blank">m</a></p>',
    ),
    (
        "see https://a.example/x.",
        '<p>see <a href="https://a.example/x" rel="noopener noreferrer nofollow" '
        'target="_blank">https://a.example/x</a>.</p>',
    ),
]
#: Links that must not be links.
INERT = [
    "javascript:alert(1)",
    "JaVaScRiPt:alert(1)",
    " javascript:alert(1)",
    "java\tscript:alert(1)",
    "data:text/html,<script>alert(1)</script>",
    "vbscript:x",
    "//evil.example/x",
    "/v1/sessions",
    "file:///etc/passwd",
]


def test_the_markdown_renderer_builds_only_safe_nodes(served: Served, tabs: Any) -> None:
    tab = tabs(f"{served.url}/")
    render = "t => { const d = document.createElement('div'); keelMarkdown.render(t, d); return d.innerHTML; }"
    got = [tab.page.evaluate(render, text) for text, _ in MARKDOWN]
    assert got == [html for _, html in MARKDOWN]
    for target in INERT:
        html = tab.page.evaluate(render, f"[x]({target}) and ![y]({target})")
        assert "<a" not in html, (target, html)
    hostile = [
        "<img src=x onerror=alert(1)>",
        "<svg/onload=alert(1)>",
        '[a](https://x.example/"onmouseover="alert(1))',
        '<a href="javascript:alert(1)">x</a>',
        "```\n</code><script>alert(1)</script>\n```",
        "**<iframe src=//evil.example>**",
    ]
    allowed = {"P", "A", "CODE", "PRE", "STRONG", "EM", "S", "BR"}
    for text in hostile:
        tags = tab.page.evaluate(
            "t => { const d = document.createElement('div'); keelMarkdown.render(t, d); "
            "return [...d.querySelectorAll('*')].map(e => [e.tagName, "
            "[...e.attributes].map(a => a.name)]); }",
            text,
        )
        for tag, attributes in tags:
            assert tag in allowed, (text, tag)
            assert set(attributes) <= {"href", "rel", "target"}, (text, attributes)


# -- the list ----------------------------------------------------------------------------------------


def test_fork_and_unload_from_the_list(
    served: Served, anthropic: AnthropicServer, tabs: Any
) -> None:
    anthropic.add(reply("Hello."))
    sid = new_session(served)
    with served.client() as c:
        assert c.post(f"/v1/sessions/{sid}/prompt", json={"text": "hi", "wait": True}).is_success
    tab = tabs(f"{served.url}/#token={TOKEN}")
    row = tab.loc(f"#sessions .session[data-id='{sid}']")
    expect(row.locator(".badge.loaded")).to_have_text("loaded")
    row.locator("button", has_text="Fork").click()
    expect(tab.loc("#transcript .assistant")).to_have_text(["Hello."])
    forked = tab.page.evaluate("location.hash").removeprefix("#session=")
    assert forked
    assert forked != sid
    expect(tab.loc("#sessions .session")).to_have_count(2)
    row.locator("button", has_text="Unload").click()
    expect(tab.loc("#toast")).to_contain_text(f"unloaded {sid}; its file stays")
    expect(row.locator(".badge.loaded")).to_have_count(0)
    with served.client() as c:
        assert c.get(f"/v1/sessions/{sid}").status_code == 404
        listed = {s["id"] for s in c.get("/v1/sessions").json()["sessions"]}
    assert {sid, forked} <= listed
    # Opening it from the list loads it again (resume), its transcript from the file.
    row.locator(".session-open").click()
    expect(row.locator(".badge.loaded")).to_have_text("loaded")
    expect(tab.loc("#conv-title")).to_have_text(sid)
    expect(tab.loc("#transcript .user-text")).to_have_text(["hi"])
    expect(tab.loc("#transcript .assistant")).to_have_text(["Hello."])
    with served.client() as c:
        assert c.get(f"/v1/sessions/{sid}").json()["loaded"] is True


def test_a_phone_width_and_the_screenshot(
    served: Served, anthropic: AnthropicServer, tabs: Any, tmp_path: Path
) -> None:
    """Readable at 390 px: nothing wider than the screen. The picture in docs/web.md;
    KEEL_UPDATE_SCREENSHOT=1 writes it there."""
    anthropic.add(
        reply(
            "I'll bump the version.",
            ("edit", {"path": "util.py", "old_string": "X = 1", "new_string": "X = 2"}),
        )
    )
    tab = tabs(session_url(served, new_session(served)), width=390, height=760)
    tab.prompt("bump X in util.py")
    expect(tab.loc(".ask")).to_be_visible()
    expect(tab.loc("#list-pane")).to_be_hidden()
    width = tab.page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390
    out = SCREENSHOT if os.environ.get("KEEL_UPDATE_SCREENSHOT") else tmp_path / "web.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    tab.page.screenshot(path=str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out.stat().st_size < 150_000
    tab.page.keyboard.press("Escape")
    tab.result("interrupted")


def test_the_fleet_link_follows_info(served: Served, tabs: Any) -> None:
    tab = tabs(session_url(served))
    expect(tab.loc("#new-session")).to_be_visible()
    expect(tab.loc("#fleet-link")).to_be_hidden()
    with httpx.Client(base_url=served.url, headers={"authorization": f"Bearer {TOKEN}"}) as c:
        assert c.get("/v1/info").json()["fleet"] is False
