"""`keel attach`: the terminal UI as a client of a real `keel serve` process (whose model is a
loopback Anthropic server scripted by the test), driven with Textual's pilot in this process,
and once as the real command in tmux.

Covers the events' JSON round trip (`keel.app.jsonin`), a prompt streamed, a permission allowed
and one denied with a reason the model sees, Esc, detaching while the run goes on, attaching to
a session mid-run, the one-line errors, and the hand-over the issue asks to measure: one session
driven from `keel attach`, then over HTTP as a browser would, then from a second `keel attach`
mid-task, with nothing lost.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import Markdown

from keel.agent.events import (
    AgentSpend,
    AssistantMessage,
    AutoDecision,
    BackgroundFinished,
    ContextCompacted,
    Event,
    PermissionAnswered,
    PermissionAsked,
    QuestionAnswered,
    QuestionRequest,
    RequestFinished,
    RequestStarted,
    RequestTiming,
    SubagentEvent,
    ToolFinished,
    ToolStarted,
    TurnFinished,
    TurnStarted,
    UsageUpdated,
)
from keel.agent.loop import RunResult
from keel.app.jsonin import EventDecoder
from keel.app.jsonout import event_json, result_json
from keel.llm.events import Notice, TextDelta, ThinkingDelta, ToolUseDelta, ToolUseStart
from keel.llm.messages import (
    Message,
    Text,
    Thinking,
    ToolUse,
    Usage,
    assistant,
    message_to_json,
    tool_result,
    user,
)
from keel.session.fold import fold
from keel.session.journal import read_records
from keel.testing import reply
from keel.testing.anthropic_server import AnthropicServer
from keel.tui.app import KeelApp
from keel.tui.format import typed_prompt
from keel.tui.remote import Connection, Frame, RemoteController, open_session
from keel.tui.screens import PermissionScreen, PlanScreen, QuestionScreen
from keel.tui.view import PromptSubmitted
from keel.tui.widgets import CommandOutput, NoticeLine, StatusLineBar, ToolCard, UserPrompt
from keel.tui.widgets import Reply as ReplyWidget
from tests.server_helpers import (  # noqa: F401
    TOKEN,
    Events,
    Served,
    Servers,
    anthropic_fixture,
    served_fixture,
    servers_fixture,
)

SIZE = (100, 36)


# -- the events' JSON, back --------------------------------------------------------------------


def every_event() -> list[Event]:
    """One event of each kind `event_json` writes (with values as the JSON rounds them)."""
    call = ToolUse("toolu_1", "write", {"path": "a.txt", "content": "hi\n"})
    timing = RequestTiming(1700000000.123, 120.5, 130.0, 400.2, 530.7, 50.0, 2, ("retried",))
    usage = Usage(100, 20, 5, 3)
    message = Message("assistant", (Thinking("hmm", "sig"), Text("Hello."), call), "anthropic", "m")
    return [
        TurnStarted("hi", "s1"),
        RequestStarted(1, "claude"),
        RequestStarted(2, "claude", None, "compaction"),
        RequestFinished("compaction", "claude", message, usage, "end_turn", 0.25, timing),
        TextDelta("Hel"),
        ThinkingDelta("hm"),
        ToolUseStart("toolu_1", "write"),
        ToolUseDelta("toolu_1", '{"path'),
        Notice("careful", "warning"),
        Notice("fyi"),
        AssistantMessage(message, usage, "tool_use", 0.5, timing),
        AssistantMessage(message, usage, "end_turn", 0.5),
        ToolStarted(call, 1700000001.5, "builtin"),
        PermissionAsked("r1", call, "change a.txt", "write", "", "", False),
        PermissionAsked("r2", call, "plan", "", "# Plan", "helper", True),
        PermissionAnswered("r1", "toolu_1", False, "once", "not that", "user", 1200.0),
        QuestionAnswered("question-2", "accept", "user", 850.5),
        ToolFinished(call, tool_result("toolu_1", "Created a.txt"), 0.25, None, 1.5, "builtin"),
        UsageUpdated(usage, usage + usage, 1.25, 1234, 200000),
        ContextCompacted("manual", 5000, 800),
        ContextCompacted(
            "auto", 5000, 800, ("a fact",), ("a todo", "a pin"), ("a todo",), ("a pin",)
        ),
        SubagentEvent("toolu_9", "explore", "look around", TextDelta("sub"), "bg-1"),
        SubagentEvent("toolu_9", "explore", "look around", ToolStarted(call, 2.0, "builtin")),
        BackgroundFinished("bg-1", "subagent", "completed", "look around"),
        AgentSpend(
            "s2", "explore", "look around", "end_turn", usage, 0.5, usage + usage, 1.25, "t9"
        ),
        AutoDecision(call, "deny", "writes outside the request", "claude-haiku", 0.000125),
    ]


async def test_every_event_kind_round_trips_through_its_json() -> None:
    decoder = EventDecoder()
    for event in every_event():
        line = event_json(event)
        assert line is not None, event
        back = decoder.decode(json.loads(json.dumps(line)))
        assert back == event, line
        assert event_json(back) == line
    # A question: its reply is a fresh future, answered over HTTP by whoever shows it.
    loop = asyncio.get_running_loop()
    question = QuestionRequest("mcp srv", "Name?", {"type": "object"}, loop.create_future(), "q1")
    line = event_json(question)
    assert line is not None
    back = decoder.decode(line)
    assert isinstance(back, QuestionRequest)
    assert (back.source, back.message, back.schema, back.request_id) == (
        "mcp srv",
        "Name?",
        {"type": "object"},
        "q1",
    )
    assert event_json(back) == line
    # The server's `result` line is the turn's end; lines of the server's own are not events.
    finished = TurnFinished("end_turn", "Done.", Usage(1, 2), 0.5, 3, "s1")
    result = result_json(RunResult.from_event(finished), model="m", duration_ms=5, session_path="p")
    assert decoder.decode(result) == finished
    for own in ("status", "user_message", "gap", "cleared", "session_closed", "server_stopping"):
        assert decoder.decode({"type": own}) is None


def test_a_finished_call_gets_its_input_from_the_call_seen_before() -> None:
    decoder = EventDecoder()
    call = ToolUse("t1", "edit", {"path": "a.py", "old_string": "x", "new_string": "y"})
    decoder.decode(event_json(ToolStarted(call)) or {})
    done = decoder.decode(
        event_json(ToolFinished(call, tool_result("t1", "Edited a.py"), 0.5)) or {}
    )
    assert isinstance(done, ToolFinished)
    assert done.call == call


# -- helpers -----------------------------------------------------------------------------------


@asynccontextmanager
async def attached(
    served: Served, session: str | None = None, **options: Any
) -> AsyncIterator[KeelApp]:
    """The app attached to `session` on `served` (as `keel attach` builds it); the connection
    closes on the way out."""
    connection = Connection(served.url, TOKEN)
    controller: RemoteController | None = None
    try:
        described = await open_session(connection, session, **options)
        controller = RemoteController(connection, described)
        await controller.load()
        yield KeelApp(controller)
    finally:
        await (controller.close() if controller is not None else connection.aclose())


def remote(app: KeelApp) -> RemoteController:
    assert isinstance(app.controller, RemoteController)
    return app.controller


async def wait_until(pilot: Any, test: Callable[[], bool], within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while not test():
        assert time.monotonic() < deadline, "timed out"
        await pilot.pause(0.05)


async def send(pilot: Any, app: KeelApp, text: str) -> None:
    app.prompt.load_text(text)
    await pilot.press("enter")


async def settle(pilot: Any, app: KeelApp) -> None:
    await asyncio.wait_for(app.idle(), 40)
    await pilot.pause()


def transcript(app: KeelApp) -> list[tuple[str, str]]:
    """What the transcript shows, in order: prompts, replies and tool cards (by call id)."""
    shown: list[tuple[str, str]] = []
    for widget in app.transcript.children:
        if isinstance(widget, UserPrompt):
            shown.append(("prompt", str(widget.render())))
        elif isinstance(widget, ReplyWidget):
            shown.append(("reply", widget.text))
        elif isinstance(widget, ToolCard):
            shown.append(("tool", f"{widget.call_id} {widget.state}"))
    return shown


def notices(app: KeelApp) -> list[str]:
    return [str(w.render()) for w in app.transcript.children if isinstance(w, NoticeLine)]


def tool_id(step: Any) -> str:
    [call] = [b for b in step.message.blocks if isinstance(b, ToolUse)]
    return call.id


def last_tool_result(request_body: dict[str, Any]) -> dict[str, Any]:
    """The tool result block of a model request's last user message."""
    last = request_body["messages"][-1]
    [result] = [b for b in last["content"] if b.get("type") == "tool_result"]
    return dict(result)


def describe(served: Served, sid: str) -> dict[str, Any]:
    with served.client() as c:
        data: dict[str, Any] = c.get(f"/v1/sessions/{sid}").json()
        return data


# -- the screen, remote ------------------------------------------------------------------------


@pytest.mark.parametrize("answer", ["allow", "deny"])
async def test_a_prompt_streams_and_a_permission_is_answered_from_attach(
    served: Served, anthropic: AnthropicServer, project: Path, answer: str
) -> None:
    write = reply("I'll write it.", ("write", {"path": "notes.md", "content": "X = 2\n"}))
    anthropic.add(write, reply("**Done.**"))
    async with attached(served, new=True) as app:
        sid = remote(app).session_id
        async with app.run_test(size=SIZE) as pilot:
            await send(pilot, app, "write the notes")
            await wait_until(pilot, lambda: isinstance(app.screen, PermissionScreen))
            screen = app.screen
            assert isinstance(screen, PermissionScreen)
            assert (screen.request.call.name, screen.request.suggestion) == ("write", "write")
            if answer == "allow":
                await pilot.press("1")
            else:
                await pilot.press("4", *"use edit instead", "enter")
            await settle(pilot, app)
            card = f"{tool_id(write)} {'done' if answer == 'allow' else 'error'}"
            assert transcript(app) == [
                ("prompt", "write the notes"),
                ("reply", "I'll write it."),
                ("tool", card),
                ("reply", "**Done.**"),
            ]
            bar = str(app.query_one(StatusLineBar).render())
            assert bar == f"attached to {served.url} · session {sid}"
            assert not remote(app).busy
    result = last_tool_result(anthropic.model_requests[1].json)
    if answer == "allow":
        assert (project / "notes.md").read_text() == "X = 2\n"
        assert result.get("is_error") is not True
    else:
        assert not (project / "notes.md").exists()
        assert result["is_error"] is True
        assert "use edit instead" in json.dumps(result["content"])
    # Leaving stopped nothing on the server: the session is still loaded, idle.
    assert describe(served, sid)["busy"] is False


async def test_escape_interrupts_the_run_on_the_server(
    served: Served, anthropic: AnthropicServer
) -> None:
    slow = reply("Too slow.")
    slow.delay = 10
    anthropic.add(slow, reply("Back."))
    async with attached(served, new=True) as app:
        sid = remote(app).session_id
        async with app.run_test(size=SIZE) as pilot:
            await send(pilot, app, "take your time")
            await wait_until(pilot, lambda: remote(app).running)
            await pilot.press("escape")
            await settle(pilot, app)
            assert "⚠ interrupted" in notices(app)
            await send(pilot, app, "again")
            await settle(pilot, app)
            assert transcript(app)[-1] == ("reply", "Back.")
    assert describe(served, sid)["busy"] is False


async def test_detaching_leaves_the_run_going(served: Served, anthropic: AnthropicServer) -> None:
    slow = reply("Finished without you.")
    slow.delay = 2.0
    anthropic.add(slow)
    async with attached(served, new=True) as app:
        sid = remote(app).session_id
        async with app.run_test(size=SIZE) as pilot:
            await send(pilot, app, "work while I am away")
            await wait_until(pilot, lambda: remote(app).running)
            await pilot.press("ctrl+d")  # detach
            await pilot.pause()
        # It left before the run ended: no result had reached it.
        assert "result" not in [kind for _seq, kind in remote(app).seen]
    with served.client() as c:
        deadline = time.monotonic() + 30
        while c.get(f"/v1/sessions/{sid}").json()["busy"]:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        messages = c.get(f"/v1/sessions/{sid}/messages").json()["messages"]
    assert messages[-1]["content"][0]["text"] == "Finished without you."


async def test_attaching_mid_run_shows_what_happened_and_follows(
    served: Served, anthropic: AnthropicServer, project: Path
) -> None:
    """Attached while a call waits for permission: the transcript so far, the question on
    screen; another client answers it, the card closes and the run is followed to its end."""
    glob = reply("Looking.", ("glob", {"pattern": "*.py"}))
    write = reply("Writing.", ("write", {"path": "count.txt", "content": "2\n"}))
    anthropic.add(glob, write, reply("Two Python files."))
    with served.client() as c:
        sid = c.post("/v1/sessions", json={}).json()["id"]
        events = Events(c, sid, after=0)
        assert c.post(f"/v1/sessions/{sid}/prompt", json={"text": "count"}).status_code == 202
        asked = events.until("permission_request")[-1].data
        async with attached(served, sid[:8]) as app, app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: isinstance(app.screen, PermissionScreen))
            assert transcript(app) == [
                ("prompt", "count"),
                ("reply", "Looking."),
                ("tool", f"{tool_id(glob)} done"),
                ("reply", "Writing."),
                ("tool", f"{tool_id(write)} pending"),
            ]
            assert "· attached while the session works: following it from here" in notices(app)
            url = f"/v1/sessions/{sid}/permissions/{asked['request_id']}"
            assert c.post(url, json={"allow": True}).status_code == 200
            await wait_until(pilot, lambda: not isinstance(app.screen, PermissionScreen))
            await settle(pilot, app)
            assert transcript(app)[-2:] == [
                ("tool", f"{tool_id(write)} done"),
                ("reply", "Two Python files."),
            ]
        events.close()
    assert (project / "count.txt").read_text() == "2\n"


async def test_plan_approval_and_mode_changes_go_to_the_server(
    served: Served, anthropic: AnthropicServer, project: Path
) -> None:
    plan = "## Plan\n\n1. Set X to 2 in `util.py`."
    edit = {"path": "util.py", "old_string": "X = 1", "new_string": "X = 2"}
    anthropic.add(
        reply("", ("exit_plan_mode", {"plan": plan})), reply("", ("read", {"path": "util.py"}))
    )
    anthropic.add(reply("", ("edit", edit)), reply("Done."))
    async with attached(served, new=True) as app, app.run_test(size=SIZE) as pilot:
        sid = remote(app).session_id
        await pilot.press("shift+tab", "shift+tab")  # default → accept-edits → plan
        await wait_until(pilot, lambda: describe(served, sid)["mode"] == "plan")
        await settle(pilot, app)
        assert remote(app).status().mode == "plan"
        await send(pilot, app, "set X to 2")
        await wait_until(pilot, lambda: bool(app.screen.query(Markdown)))
        assert isinstance(app.screen, PlanScreen)
        assert app.screen.query_one(Markdown).source == plan
        await pilot.press("1")  # yes, and accept edits
        # The answer goes over HTTP and the run goes on there: wait for its effect, then idle.
        await wait_until(pilot, lambda: (project / "util.py").read_text() == "X = 2\n")
        await settle(pilot, app)
        assert describe(served, sid)["mode"] == "accept-edits"
        assert remote(app).status().mode == "accept-edits"
        assert transcript(app)[-1] == ("reply", "Done.")


async def test_slash_commands_run_on_the_server_or_say_they_cannot(
    served: Served, anthropic: AnthropicServer, project: Path
) -> None:
    anthropic.add(
        reply("", ("write", {"path": "new.txt", "content": "new\n"})),
        reply("Wrote it."),
        reply("<summary>We wrote new.txt.</summary>"),  # the compaction
    )
    async with (
        attached(served, new=True, mode="accept-edits") as app,
        app.run_test(size=SIZE) as pilot,
    ):
        sid = remote(app).session_id
        await send(pilot, app, "write new.txt")
        await settle(pilot, app)
        assert (project / "new.txt").exists()
        for line in ("/undo", "/model anthropic/claude-opus-4-1", "/init", "!ls"):
            await send(pilot, app, line)
            await settle(pilot, app)
        assert not (project / "new.txt").exists()
        outputs = [
            (w.border_title, w.text, w.kind)
            for w in app.transcript.children
            if isinstance(w, CommandOutput)
        ]
        assert outputs == [
            ("/undo", "Undid **write new.txt**\n- removed `new.txt`", "markdown"),
            (
                "error",
                "/init works in a local session only (keel in the project), not in an "
                "attached one: /help lists what does",
                "error",
            ),
            (
                "error",
                "!commands run on this machine, not the server's: not in an attached session",
                "error",
            ),
        ]
        assert notices(app)[-1] == "· model: anthropic/claude-opus-4-1 (from the next request on)"
        assert describe(served, sid)["model"] == "anthropic/claude-opus-4-1"
        # /fork and /clear: the screen follows the new session.
        await send(pilot, app, "/fork")
        await wait_until(pilot, lambda: remote(app).session_id != sid)
        await settle(pilot, app)
        forked = remote(app).session_id
        assert notices(app)[-1] == f"· forked from {sid}: now session {forked}"
        assert [kind for kind, _ in transcript(app)] == ["prompt", "tool", "reply"]
        assert transcript(app)[-1] == ("reply", "Wrote it.")
        await send(pilot, app, "/compact")
        await settle(pilot, app)
        # The answer's line and the stream's own notice of the compaction race: either last.
        await wait_until(
            pilot, lambda: any(n.startswith("· compacted: 120 → ") for n in notices(app)[-3:])
        )
        await send(pilot, app, "/clear")
        await wait_until(pilot, lambda: remote(app).session_id != forked)
        await settle(pilot, app)
        cleared = remote(app).session_id
        bar = str(app.query_one(StatusLineBar).render())
        assert bar == f"attached to {served.url} · session {cleared}"
        assert notices(app)[-1] == f"· a fresh context (/clear): now session {cleared}"


async def test_ctrl_c_detaches_without_stopping_the_run(
    served: Served, anthropic: AnthropicServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from keel.tui import app as tui_app

    monkeypatch.setattr(tui_app, "QUIT_WINDOW", 60.0)  # a loaded machine is slow between keys
    write = reply("", ("write", {"path": "later.txt", "content": "x\n"}))
    anthropic.add(write, reply("Written after all."))
    async with attached(served, new=True) as app:
        sid = remote(app).session_id
        async with app.run_test(size=SIZE) as pilot:
            await send(pilot, app, "write later.txt")
            await wait_until(pilot, lambda: isinstance(app.screen, PermissionScreen))
            await pilot.press("ctrl+c")  # on a card of an attached session: only arms the quit
            await pilot.pause()
            assert isinstance(app.screen, PermissionScreen)
            await pilot.press("ctrl+c")
            await wait_until(pilot, lambda: not app.is_running)
    with served.client() as c:
        # The question still waits, for whoever attaches next.
        [pending] = c.get(f"/v1/sessions/{sid}/permissions").json()["pending"]
        assert pending["tool_use_id"] == tool_id(write)
        assert c.get(f"/v1/sessions/{sid}").json()["busy"] is True


async def test_a_restarted_server_is_reconnected_and_the_session_reloaded(
    servers: Servers, anthropic: AnthropicServer
) -> None:
    served = servers.start()
    anthropic.add(reply("Before."), reply("After."))
    async with attached(served, new=True) as app, app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "one")
        await settle(pilot, app)
        served.proc.send_signal(signal.SIGTERM)
        await asyncio.to_thread(served.proc.wait, 30)
        await wait_until(pilot, lambda: any("server is stopping" in n for n in notices(app)))
        servers.start("--port", str(served.port))  # the same address
        await wait_until(pilot, lambda: "· reloaded the session on the server" in notices(app))
        await send(pilot, app, "two")
        await settle(pilot, app)
        assert transcript(app) == [
            ("prompt", "one"),
            ("reply", "Before."),
            ("prompt", "two"),
            ("reply", "After."),
        ]


class ScriptedConnection(Connection):
    """A server that answers from the test: each `events` call streams the next list of
    frames, then holds the stream open; requests answer from `answers` and are recorded."""

    def __init__(self, streams: list[list[Frame]], answers: dict[str, Any]) -> None:
        self.url = "http://127.0.0.1:1"
        self.streams = streams
        self.answers = answers
        self.sent: list[tuple[str, str, dict[str, Any] | None]] = []
        self.followed_after: list[int] = []

    async def aclose(self) -> None:
        return None

    async def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        self.sent.append((method, path, body))
        return self.answers.get(f"{method} {path}", {})

    async def events(self, session: str, after: int) -> AsyncIterator[Frame]:
        self.followed_after.append(after)
        for frame in self.streams.pop(0) if self.streams else []:
            yield frame
        await asyncio.Event().wait()  # open until the follower goes


def user_message(text: str) -> dict[str, Any]:
    return message_to_json(user(text))


def assistant_message(text: str) -> dict[str, Any]:
    return message_to_json(assistant(text))


SCRIPTED = {"id": "s1", "model": "anthropic/claude-sonnet-4-5", "mode": "default", "cwd": "/p"}


async def test_a_gap_reloads_the_transcript_and_follows_on_from_the_server_s_seq() -> None:
    gap = {"type": "gap", "after": 3, "first": 10, "last_seq": 12, "reason": "no longer held"}
    connection = ScriptedConnection(
        [[Frame(None, "gap", gap)], [Frame(13, "notice", {"type": "notice", "text": "later"})]],
        {"GET /v1/sessions/s1/messages": {"messages": [user_message("hi")], "last_seq": 3}},
    )
    controller = RemoteController(connection, SCRIPTED)
    await controller.load()
    assert controller.transcript == [PromptSubmitted("hi")]
    # What the session file holds by the time the gap is read.
    connection.answers["GET /v1/sessions/s1/messages"] = {
        "messages": [user_message("hi"), assistant_message("Hello."), user_message("more")],
        "last_seq": 12,
    }
    app = KeelApp(controller)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: "· later" in notices(app))
        assert transcript(app) == [("prompt", "hi"), ("reply", "Hello."), ("prompt", "more")]
    await controller.close()
    assert connection.followed_after == [3, 12]


async def test_an_mcp_question_is_answered_over_http() -> None:
    question = {
        "type": "question",
        "request_id": "q1",
        "source": "tickets",
        "message": "Which ticket?",
        "schema": {"type": "object", "properties": {"id": {"type": "integer"}}},
    }
    connection = ScriptedConnection(
        [[Frame(5, "question", question)]],
        {"GET /v1/sessions/s1/messages": {"messages": [], "last_seq": 4}},
    )
    controller = RemoteController(connection, SCRIPTED)
    await controller.load()
    app = KeelApp(controller)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: isinstance(app.screen, QuestionScreen))
        await pilot.press("4", "2", "enter")
        posted = ("POST", "/v1/sessions/s1/permissions/q1", {"values": {"id": 42}})
        await wait_until(pilot, lambda: posted in connection.sent)
    await controller.close()


async def test_an_mcp_question_answered_elsewhere_closes_its_form() -> None:
    question = {
        "type": "question",
        "request_id": "q1",
        "source": "tickets",
        "message": "Which ticket?",
        "schema": {"type": "object", "properties": {"id": {"type": "integer"}}},
    }
    answered = {
        "type": "question_answered",
        "request_id": "q1",
        "action": "decline",
        "by": "user",
        "waited_ms": 900.0,
    }
    go_on = asyncio.Event()

    class AnsweredElsewhere(ScriptedConnection):
        async def events(self, session: str, after: int) -> AsyncIterator[Frame]:
            yield Frame(5, "question", question)
            await go_on.wait()  # until the form is on screen
            yield Frame(6, "question_answered", answered)
            await asyncio.Event().wait()

    connection = AnsweredElsewhere(
        [], {"GET /v1/sessions/s1/messages": {"messages": [], "last_seq": 4}}
    )
    controller = RemoteController(connection, SCRIPTED)
    await controller.load()
    app = KeelApp(controller)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: isinstance(app.screen, QuestionScreen))
        go_on.set()
        await wait_until(pilot, lambda: not isinstance(app.screen, QuestionScreen))
        await wait_until(pilot, lambda: bool(notices(app)))
        assert notices(app)[-1].endswith("tickets's question was declined in another client")
        await pilot.pause(0.1)
    await controller.close()
    # Nothing was answered from here: the form closed without a reply.
    assert [s for s in connection.sent if s[0] == "POST"] == []


async def test_an_answer_that_came_second_is_not_an_error() -> None:
    """Two clients answer one question at once: the server takes the first; the second's 404
    is no error on its screen (the form closed, the stream says how it ended)."""
    from keel.tui.remote import ServerRefused

    question = {
        "type": "question",
        "request_id": "q1",
        "source": "tickets",
        "message": "Which ticket?",
        "schema": {"type": "object", "properties": {"id": {"type": "integer"}}},
    }

    class AnsweredFirstElsewhere(ScriptedConnection):
        async def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
            if method == "POST":
                self.sent.append((method, path, body))
                raise ServerRefused("no question q1 waits", status=404)
            return await super().request(method, path, body)

    connection = AnsweredFirstElsewhere(
        [[Frame(5, "question", question)]],
        {"GET /v1/sessions/s1/messages": {"messages": [], "last_seq": 4}},
    )
    controller = RemoteController(connection, SCRIPTED)
    await controller.load()
    app = KeelApp(controller)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: isinstance(app.screen, QuestionScreen))
        await pilot.press("7", "enter")
        await wait_until(pilot, lambda: any(s[0] == "POST" for s in connection.sent))
        await settle(pilot, app)
        shown = [w for w in app.transcript.children if isinstance(w, CommandOutput)]
        assert shown == []
    await controller.close()


async def test_line_mode_leaves_an_mcp_question_to_a_client_that_shows_forms() -> None:
    """The line UI cannot show a form: attached, it says so and leaves the question waiting
    for the session's other clients rather than refusing it for all of them."""
    import io

    from rich.console import Console

    from keel.tui.line import LineFrontEnd, LineReader

    question = {
        "type": "question",
        "request_id": "q1",
        "source": "tickets",
        "message": "Which ticket?",
        "schema": {"type": "object", "properties": {"id": {"type": "integer"}}},
    }
    connection = ScriptedConnection(
        [[Frame(5, "question", question)]],
        {"GET /v1/sessions/s1/messages": {"messages": [], "last_seq": 4}},
    )
    controller = RemoteController(connection, SCRIPTED)
    await controller.load()
    out = io.StringIO()
    reader = LineReader(io.StringIO(""), asyncio.get_running_loop())
    ui = LineFrontEnd(controller, Console(file=out, width=200), reader, echo=False)
    controller.attach(ui)
    deadline = time.monotonic() + 10
    while "waits for a client that shows forms" not in out.getvalue():
        assert time.monotonic() < deadline, out.getvalue()
        await asyncio.sleep(0.02)
    await controller.close()
    assert "MCP server tickets asked: Which ticket?" in out.getvalue()
    assert [s for s in connection.sent if s[0] == "POST"] == []


# -- errors ------------------------------------------------------------------------------------


def test_errors_are_one_line_with_a_hint(
    served: Served,
    anthropic: AnthropicServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each failure before the screen opens, through the command's own entry point: one line on
    stderr with a hint, exit 2."""
    from keel.cli.main import main

    readable = tmp_path / "token"
    readable.write_text(TOKEN, encoding="utf-8")
    readable.chmod(0o644)
    monkeypatch.delenv("KEEL_SERVER_TOKEN", raising=False)
    cases: dict[str, tuple[tuple[str, ...], bool, str]] = {
        "not a URL": (("localhost",), False, "error: 'localhost' is not an http:// address"),
        "no token": ((served.url,), False, "error: no token for the server"),
        "readable token file": (
            (served.url, "--token-file", str(readable)),
            False,
            f"error: --token-file {readable} can be read by other users (mode 0644)",
        ),
        "wrong token": (
            (f"{served.url}/#token=wrong-token-0123456789",),
            False,
            "error: the server refused the token: wrong bearer token",
        ),
        "unreachable": (
            ("http://127.0.0.1:9",),
            True,
            "error: cannot reach keel serve at http://127.0.0.1:9",
        ),
        "not keel": ((anthropic.url,), True, f"error: {anthropic.url} is not a keel serve"),
        "no sessions": ((served.url,), True, f"error: no sessions on {served.url} yet"),
        "no such session": (
            (served.url, "nosuch"),
            True,
            f"error: no session 'nosuch' on {served.url}",
        ),
        "model without --new": (
            (served.url, "--model", "x/y"),
            True,
            "error: --model and --mode apply to a new session",
        ),
    }
    for name, (args, env_token, expected) in cases.items():
        if env_token:
            monkeypatch.setenv("KEEL_SERVER_TOKEN", TOKEN)
        else:
            monkeypatch.delenv("KEEL_SERVER_TOKEN", raising=False)
        code = main(["attach", *args])
        err = capsys.readouterr().err
        lines = err.strip().splitlines()
        assert code == 2, (name, err)
        assert len(lines) == 1, (name, err)
        assert "(hint: " in lines[0], (name, err)
        assert expected in lines[0], (name, lines[0])
    # And as a process of its own: no traceback, the same line.
    done = subprocess.run(
        [sys.executable, "-m", "keel", "attach", f"{served.url}/#token=wrong-token-0123456789"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("keel: error: the server refused the token: wrong bearer token")
    assert len(done.stderr.strip().splitlines()) == 1


async def test_a_changed_configuration_is_refused_until_forced(
    served: Served,
    anthropic: AnthropicServer,
    project: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from keel.cli.main import main

    anthropic.add(reply("One."))
    with served.client() as c:
        sid = c.post("/v1/sessions", json={}).json()["id"]
        assert c.post(f"/v1/sessions/{sid}/prompt", json={"text": "one", "wait": True}).is_success
        assert c.delete(f"/v1/sessions/{sid}").status_code == 204  # unloaded
    (project / "AGENTS.md").write_text("Indent with tabs.\n", encoding="utf-8")
    monkeypatch.setenv("KEEL_SERVER_TOKEN", TOKEN)
    assert await asyncio.to_thread(main, ["attach", served.url, sid]) == 2
    agents = project.resolve() / "AGENTS.md"
    assert capsys.readouterr().err == (
        f"keel: error: session {sid} was made with a different configuration: system prompt: "
        f"instruction file {agents} added (hint: add --force to go on with the configuration "
        "as it is now)\n"
    )
    connection = Connection(served.url, TOKEN)
    try:
        described = await open_session(connection, sid, force=True)
    finally:
        await connection.aclose()
    assert (described["id"], described["loaded"]) == (sid, True)


def test_line_mode_prompts_and_detaches(served: Served, anthropic: AnthropicServer) -> None:
    """`keel attach --no-tui` (and any attach whose stdin is not a terminal): the same session
    line by line; the end of stdin detaches."""
    anthropic.add(reply("Hello from the server."))
    done = subprocess.run(
        [sys.executable, "-m", "keel", "attach", f"{served.url}/#token={TOKEN}", "--new"],
        input="say hello\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "say hello" in out
    assert "Hello from the server." in out
    with served.client() as c:
        [sid] = [s["id"] for s in c.get("/v1/sessions").json()["sessions"]]
    assert out.rstrip().endswith(
        f"Detached from session {sid} on {served.url}: it stays loaded there. "
        f"To come back: keel attach {served.url} {sid}"
    )
    assert TOKEN not in out


# -- the hand-over -----------------------------------------------------------------------------


async def test_one_session_moves_from_attach_to_a_browser_to_a_second_attach(
    served: Served,
    anthropic: AnthropicServer,
    project: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Attach #1 (HOME A) starts the session and answers its first question; a browser's
    requests (a plain HTTP client) send the second prompt and answer its question; attach #2
    (HOME B) comes in while the third prompt's call waits for permission and answers it. The
    transcript #2 shows is the session file's conversation; no event number was skipped."""
    first = reply("One.", ("write", {"path": "one.txt", "content": "1\n"}))
    second = reply("Two.", ("write", {"path": "two.txt", "content": "2\n"}))
    third = reply("Three.", ("write", {"path": "three.txt", "content": "3\n"}))
    anthropic.add(first, reply("Wrote one."), second, reply("Wrote two."))
    anthropic.add(third, reply("Wrote three."))
    timings: dict[str, float] = {}

    # 1. A terminal on "machine A".
    monkeypatch.setenv("HOME", str(tmp_path / "home-a"))
    began = time.monotonic()
    async with attached(served, new=True) as app:
        sid = remote(app).session_id
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            timings["attach #1: command to first frame"] = time.monotonic() - began
            await send(pilot, app, "write one")
            await wait_until(pilot, lambda: isinstance(app.screen, PermissionScreen))
            await pilot.press("1")
            await settle(pilot, app)
            assert transcript(app)[-1] == ("reply", "Wrote one.")

    # 2. A browser: the page's requests, over plain HTTP.
    with served.client() as browser:
        stream = Events(browser, sid, after=describe(served, sid)["last_seq"])
        assert (
            browser.post(f"/v1/sessions/{sid}/prompt", json={"text": "write two"}).status_code
            == 202
        )
        asked = stream.until("permission_request")[-1].data
        url = f"/v1/sessions/{sid}/permissions/{asked['request_id']}"
        assert browser.post(url, json={"allow": True}).status_code == 200
        stream.until("status", busy=False)
        # The third prompt: its call waits for an answer when the second terminal comes in.
        assert (
            browser.post(f"/v1/sessions/{sid}/prompt", json={"text": "write three"}).status_code
            == 202
        )
        stream.until("permission_request")
        before = time.monotonic()

        # 3. A terminal on "machine B", mid-task.
        monkeypatch.setenv("HOME", str(tmp_path / "home-b"))
        began = time.monotonic()
        async with attached(served) as app:  # `keel attach URL`: the latest session
            start_seq = remote(app).last_seq
            async with app.run_test(size=SIZE) as pilot:
                await wait_until(pilot, lambda: isinstance(app.screen, PermissionScreen))
                timings["attach #2: command to the waiting question on screen"] = (
                    time.monotonic() - began
                )
                screen = app.screen
                assert isinstance(screen, PermissionScreen)
                assert screen.request.call.input == {"path": "three.txt", "content": "3\n"}
                answered = time.monotonic()
                await pilot.press("1")
                await wait_until(pilot, lambda: ("reply", "Wrote three.") in transcript(app))
                timings["attach #2: answer to the task finished"] = time.monotonic() - answered
                await settle(pilot, app)
                shown = transcript(app)
                seen = [seq for seq, _kind in remote(app).seen if seq is not None]
            timings["browser's question waiting to answered from #2"] = time.monotonic() - before
        frames = stream.until("status", busy=False)
        stream.close()
        last = describe(served, sid)["last_seq"]

    # Nothing lost: the transcript #2 shows is the session file's conversation, in order.
    path = Path(describe(served, sid)["path"])
    conversation = fold(read_records(path).records).conversation.messages
    expected: list[tuple[str, str]] = []
    for message in conversation:
        if message.role == "assistant":
            expected.append(("reply", message.text))
            expected += [("tool", f"{c.id} done") for c in message.tool_uses]
        elif message.text.strip() and not message.tool_results:
            expected.append(("prompt", typed_prompt(message.text)))
    assert [p for p in shown if p[0] == "prompt"] == [
        ("prompt", "write one"),
        ("prompt", "write two"),
        ("prompt", "write three"),
    ]
    assert shown == expected
    assert {p.name for p in project.iterdir()} >= {"one.txt", "two.txt", "three.txt"}
    # Every event #2 saw, numbered without a hole, up to the server's last.
    assert seen == list(range(start_seq + 1, last + 1))
    assert frames[-1].id == last
    print("\nhand-over timings (s):", json.dumps({k: round(v, 3) for k, v in timings.items()}))
    for took in timings.values():
        assert took < 10


# -- the real command, in a real terminal ------------------------------------------------------


@pytest.mark.needs("tmux")
def test_keel_attach_in_a_real_terminal(
    served: Served, anthropic: AnthropicServer, project: Path, tmp_path: Path
) -> None:
    from tests.test_tui_tmux import Terminal, keel_argv

    anthropic.add(reply("Hello from the server."))
    term = Terminal(f"keel-attach-{os.getpid()}-{time.monotonic_ns()}", tmp_path)
    try:
        env = {
            "TERM": "xterm-256color",
            **{k: os.environ[k] for k in ("KEEL_HOME", "KEEL_CONFIG_DIR", "HOME", "PATH")},
        }
        term.start(keel_argv("attach", f"{served.url}/#token={TOKEN}", "--new"), env)
        term.wait_for(f"attached to {served.url}", timeout=60)
        term.type("say hello")
        term.keys("Enter")
        term.wait_for("Hello from the server.", timeout=60)
        term.keys("C-d")  # on an empty prompt: detach
        screen = term.wait_for("Detached from session", timeout=60)
        assert f"To come back: keel attach {served.url} " in screen.replace("\n", "")
        assert TOKEN not in screen
    finally:
        term.tmux("kill-server")
