"""`keel serve` end to end: a real server process on a loopback port, driven over HTTP and SSE
(httpx), its model a loopback Anthropic server scripted by the test, its HOME isolated.

Covers the routes with whole bodies, the event stream and its replay (Last-Event-ID), permission
questions answered over HTTP, a session surviving `kill -9` of the server mid-tool, two clients
on one session, and the attacks the server must refuse (no or wrong token, a token in the query
string of the wrong route, a rebinding Host header, malformed bodies). The ring's gap and slow
subscriber cases run in process; so does the OpenAPI check against the app's real routes.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from keel.llm.script import reply
from keel.testing.anthropic_server import AnthropicServer
from keel.testing.script import Reply
from tests.helpers import context_of
from tests.server_helpers import MODEL, TOKEN, Events, Frame, Served, Servers


@pytest.fixture
def anthropic() -> Iterator[AnthropicServer]:
    with AnthropicServer(api_key="sk-ant-test") as server:
        yield server


@pytest.fixture
def servers(project: Path, anthropic: AnthropicServer, tmp_path: Path) -> Iterator[Servers]:
    s = Servers(project, anthropic, tmp_path / "serve.log")
    try:
        yield s
    finally:
        s.stop_all()


@pytest.fixture
def served(servers: Servers) -> Served:
    return servers.start()


#: Fields whose values change from run to run (times, measured durations).
VOLATILE = frozenset({"seconds", "started_at", "timing", "duration_ms", "sent_at", "waited_ms"})


def norm(value: Any, sid: str = "") -> Any:
    """`value` with volatile fields as "…" and the session id as "<sid>"."""
    if isinstance(value, dict):
        return {k: "…" if k in VOLATILE else norm(v, sid) for k, v in value.items()}
    if isinstance(value, list):
        return [norm(v, sid) for v in value]
    if isinstance(value, str) and sid:
        return value.replace(sid, "<sid>")
    return value


def kinds(frames: list[Frame]) -> list[str]:
    return [f.event for f in frames]


def built_notices() -> int:
    """Events a new session starts with: the notice that bash has no sandbox here, if so."""
    from keel.permissions.sandbox import probe

    return 0 if probe().ok else 1


def create(client: httpx.Client, **body: Any) -> dict[str, Any]:
    r = client.post("/v1/sessions", json={"model": MODEL, **body})
    assert r.status_code == 201, r.text
    data: dict[str, Any] = r.json()
    return data


def tool_id(step: Reply) -> str:
    return step.message.tool_uses[0].id


# -- the run over SSE ------------------------------------------------------------------------------


def test_prompt_streams_the_run_over_sse(
    served: Served, anthropic: AnthropicServer, project: Path, isolated_env: Path
) -> None:
    glob = reply("Looking.", ("glob", {"pattern": "*.py"}))
    anthropic.add(glob, reply("Two files."))
    with served.client() as c:
        session = create(c)
        sid = session["id"]
        built = built_notices()
        path = next(isolated_env.glob(f"sessions/*/{sid}.jsonl"))
        assert session == {
            "id": sid,
            "loaded": True,
            "path": str(path),
            "cwd": str(project),
            "model": MODEL,
            "effort": None,
            "mode": "default",
            "busy": False,
            "work": None,
            "turns": 0,
            "usage": {"input": 0, "output": 0, "cache_read": 0, "cache_write": 0},
            "cost_usd": 0.0,
            "spend": {
                "budget": {
                    "usd": None,
                    "tokens": None,
                    "min_output_tokens": 1024,
                    "usd_left": None,
                    "tokens_left": None,
                },
                "agents": [],
            },
            "last_seq": built,
            "pending": [],
            "tasks": [],
        }
        if built:
            notices = Events(c, sid, after=0)
            frame = notices.next()
            notices.close()
            assert (frame.id, frame.event) == (1, "notice")
            assert frame.data["text"].startswith("no sandbox: ")
        events = Events(c, sid, after=built)
        r = c.post(f"/v1/sessions/{sid}/prompt", json={"text": "which files?"})
        assert (r.status_code, r.json()) == (202, {"session": sid, "after_seq": built})
        frames = events.until("status", busy=False)
        events.close()
    assert [f.id for f in frames] == list(range(built + 1, built + len(frames) + 1))
    assert all(f.data["seq"] == f.id and f.data["session"] == sid for f in frames)
    assert all(f.event == f.data["type"] for f in frames)
    got = [
        norm({k: v for k, v in f.data.items() if k not in ("seq", "session")}, sid) for f in frames
    ]
    gid = tool_id(glob)
    usage = {"input": 100, "output": 20, "cache_read": 0, "cache_write": 0}
    assert [g["type"] for g in got] == [
        "user_message",
        "status",
        "turn_started",
        "request",
        "text_delta",
        "text_delta",
        "text_delta",
        "tool_use_start",
        "tool_use_delta",
        "tool_use_delta",
        "tool_use_delta",
        "assistant",
        "usage",
        "tool_started",
        "tool_finished",
        "request",
        "text_delta",
        "text_delta",
        "text_delta",
        "assistant",
        "usage",
        "result",
        "status",
    ]
    assert got[:4] == [
        {"type": "user_message", "text": "which files?"},
        {"type": "status", "busy": True, "work": "prompt"},
        {"type": "turn_started", "prompt": "which files?", "session_id": "<sid>"},
        {"type": "request", "turn": 1, "model": "claude-sonnet-4-5"},
    ]
    assert "".join(g["text"] for g in got[4:7]) == "Looking."
    assert got[7] == {"type": "tool_use_start", "id": gid, "name": "glob"}
    assert "".join(g["partial_json"] for g in got[8:11]) == '{"pattern": "*.py"}'
    assert got[11] == {
        "type": "assistant",
        "message": {
            "v": 1,
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Looking."},
                {"type": "tool_use", "id": gid, "name": "glob", "input": {"pattern": "*.py"}},
            ],
            "provider": "anthropic",
            "model": "claude-sonnet-4-5",
        },
        "usage": usage,
        "stop_reason": "tool_use",
        "cost_usd": pytest.approx((100 * 3 + 20 * 15) / 1e6),
        "timing": "…",
    }
    assert got[13:15] == [
        {
            "type": "tool_started",
            "id": gid,
            "name": "glob",
            "kind": "builtin",
            "input": {"pattern": "*.py"},
            "started_at": "…",
        },
        {
            "type": "tool_finished",
            "id": gid,
            "name": "glob",
            "kind": "builtin",
            "is_error": False,
            "output": "app.py\nutil.py",
            "seconds": "…",
            "started_at": "…",
        },
    ]
    assert got[-2:] == [
        {
            "type": "result",
            "result": "Two files.",
            "stop_reason": "end_turn",
            "is_error": False,
            "error": None,
            "session_id": "<sid>",
            "session_path": str(path).replace(sid, "<sid>"),
            "model": MODEL,
            "turns": 2,
            "usage": {"input": 200, "output": 40, "cache_read": 0, "cache_write": 0},
            "cache_read_share": 0.0,
            "cost_usd": pytest.approx(2 * (100 * 3 + 20 * 15) / 1e6),
            "duration_ms": "…",
        },
        {"type": "status", "busy": False, "work": None},
    ]
    assert got[12] == {
        "type": "usage",
        "turn": usage,
        "total": usage,
        "cost_usd": pytest.approx((100 * 3 + 20 * 15) / 1e6),
        "context_tokens": 120,
        "context_window": 200_000,
    }
    with served.client() as c:
        after = c.get(f"/v1/sessions/{sid}").json()
        messages = c.get(f"/v1/sessions/{sid}/messages").json()
    assert after["turns"] == 2
    assert after["last_seq"] == built + len(frames)
    assert after["busy"] is False
    assert [m["role"] for m in messages["messages"]] == ["user", "assistant", "user", "assistant"]
    assert messages["id"] == sid
    assert messages["last_seq"] == built + len(frames)


def test_wait_returns_the_result_and_a_busy_session_is_409(
    served: Served, anthropic: AnthropicServer
) -> None:
    slow = reply("Slow answer.")
    slow.delay = 1.5
    anthropic.add(slow)
    with served.client() as c, served.client() as other:
        sid = create(c)["id"]
        waiting: list[httpx.Response] = []
        t = threading.Thread(
            target=lambda: waiting.append(
                c.post(f"/v1/sessions/{sid}/prompt", json={"text": "go", "wait": True})
            )
        )
        t.start()
        deadline = time.monotonic() + 10
        while not other.get(f"/v1/sessions/{sid}").json()["busy"]:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        busy = other.post(f"/v1/sessions/{sid}/prompt", json={"text": "again"})
        assert (busy.status_code, busy.json()) == (
            409,
            {
                "error": f"session {sid} is busy (prompt running)",
                "hint": f"wait for its `status` event with busy false, or POST /v1/sessions/{sid}/cancel",
            },
        )
        # The mode may change while it runs; the model and effort may not.
        model = other.patch(f"/v1/sessions/{sid}", json={"effort": "high"})
        assert model.status_code == 409
        mode = other.patch(f"/v1/sessions/{sid}", json={"mode": "plan"})
        assert (mode.status_code, mode.json()["mode"]) == (200, "plan")
        t.join(20)
    [done] = waiting
    assert done.status_code == 200
    body = done.json()
    assert norm(body, sid) == {
        "type": "result",
        "result": "Slow answer.",
        "stop_reason": "end_turn",
        "is_error": False,
        "error": None,
        "session_id": "<sid>",
        "session_path": body["session_path"].replace(sid, "<sid>"),
        "model": MODEL,
        "turns": 1,
        "usage": {"input": 100, "output": 20, "cache_read": 0, "cache_write": 0},
        "cache_read_share": 0.0,
        "cost_usd": pytest.approx((100 * 3 + 20 * 15) / 1e6),
        "duration_ms": "…",
        "after_seq": built_notices(),
    }
    assert body["duration_ms"] >= 1500


# -- permission questions over HTTP ----------------------------------------------------------------


def test_a_permission_question_is_answered_over_http_by_a_second_client(
    served: Served, anthropic: AnthropicServer, project: Path
) -> None:
    """One client prompts and watches; another answers the gate's question. Both streams are
    the same events, in the same order, with the same numbers."""
    first = reply("", ("write", {"path": "notes.txt", "content": "hi\n"}))
    second = reply("", ("write", {"path": "secret.txt", "content": "no\n"}))
    anthropic.add(first, second, reply("Wrote one, the other was refused."))
    with served.client() as a, served.client() as b:
        sid = create(a)["id"]
        watch_a, watch_b = Events(a, sid, after=0), Events(b, sid, after=0)
        assert a.post(f"/v1/sessions/{sid}/prompt", json={"text": "write two"}).status_code == 202
        upto = watch_b.until("permission_request")
        asked = norm({k: v for k, v in upto[-1].data.items() if k not in ("seq", "session")})
        rid = asked["request_id"]
        assert asked == {
            "type": "permission_request",
            "request_id": rid,
            "tool_use_id": tool_id(first),
            "tool": "write",
            "input": {"path": "notes.txt", "content": "hi\n"},
            "reason": "change notes.txt",
            "suggestion": "write",
        }
        pending = b.get(f"/v1/sessions/{sid}/permissions")
        assert pending.json() == {"pending": [asked]}
        assert b.get(f"/v1/sessions/{sid}").json()["pending"] == [asked]
        answered = b.post(f"/v1/sessions/{sid}/permissions/{rid}", json={"allow": True})
        assert (answered.status_code, answered.json()) == (
            200,
            {"request_id": rid, "allow": True, "scope": "once"},
        )
        again = b.post(f"/v1/sessions/{sid}/permissions/{rid}", json={"allow": True})
        assert again.status_code == 404
        assert again.json() == {
            "error": f"no pending question {rid!r} in session {sid}",
            "hint": f"GET /v1/sessions/{sid}/permissions lists them (answered already, or the run stopped)",
        }
        upto += watch_b.until("permission_request")
        rid2 = upto[-1].data["request_id"]
        assert rid2 != rid
        denied = b.post(
            f"/v1/sessions/{sid}/permissions/{rid2}",
            json={"allow": False, "reason": "not that file"},
        )
        assert denied.json() == {"request_id": rid2, "allow": False, "scope": "once"}
        upto += watch_b.until("status", busy=False)
        seen_by_a = watch_a.until("status", busy=False)
        watch_a.close()
        watch_b.close()
    assert [(f.id, f.event, f.data) for f in seen_by_a] == [(f.id, f.event, f.data) for f in upto]
    answers = [norm(f.data) for f in upto if f.event == "permission_answered"]
    assert [{k: v for k, v in x.items() if k not in ("seq", "session")} for x in answers] == [
        {
            "type": "permission_answered",
            "request_id": rid,
            "tool_use_id": tool_id(first),
            "allow": True,
            "scope": "once",
            "reason": "",
            "by": "user",
            "waited_ms": "…",
        },
        {
            "type": "permission_answered",
            "request_id": rid2,
            "tool_use_id": tool_id(second),
            "allow": False,
            "scope": "once",
            "reason": "not that file",
            "by": "user",
            "waited_ms": "…",
        },
    ]
    assert (project / "notes.txt").read_text(encoding="utf-8") == "hi\n"
    assert not (project / "secret.txt").exists()
    last = anthropic.model_requests[-1].json["messages"][-1]["content"][0]
    assert last["tool_use_id"] == tool_id(second)
    assert last["is_error"] is True
    assert "not that file" in last["content"][0]["text"]


# -- reconnecting ----------------------------------------------------------------------------------


def test_a_client_that_reconnects_with_last_event_id_gets_exactly_what_it_missed(
    served: Served, anthropic: AnthropicServer
) -> None:
    late = reply("All done after a pause.")
    late.delay = 1.0
    anthropic.add(reply("", ("glob", {"pattern": "*.py"})), late)
    with served.client() as c, served.client() as steady:
        sid = create(c)["id"]
        whole = Events(steady, sid, after=0)
        first = Events(c, sid, after=0)
        assert c.post(f"/v1/sessions/{sid}/prompt", json={"text": "go"}).status_code == 202
        before = first.until("tool_finished")
        first.close()  # the connection drops mid-run, while the model thinks
        time.sleep(0.3)
        resumed = Events(c, sid, last_id=before[-1].id)
        after = resumed.until("status", busy=False)
        resumed.close()
        everything = whole.until("status", busy=False)
        whole.close()
        # ?after= is the same as Last-Event-ID (for EventSource's first connect).
        replay = Events(c, sid, after=before[-1].id)
        again = [replay.next() for _ in after]
        replay.close()
        # EventSource reconnects to the same URL (?after=0) with Last-Event-ID: the header wins.
        browser = Events(c, sid, after=0, last_id=before[-1].id)
        reconnected = [browser.next() for _ in after]
        browser.close()
    assert before[-1].id is not None
    assert [f.id for f in after] == list(range(before[-1].id + 1, before[-1].id + 1 + len(after)))
    assert [(f.id, f.data) for f in before + after] == [(f.id, f.data) for f in everything]
    assert [(f.id, f.data) for f in again] == [(f.id, f.data) for f in after]
    assert [(f.id, f.data) for f in reconnected] == [(f.id, f.data) for f in after]
    assert after[-2].data["result"] == "All done after a pause."


def test_a_seq_from_before_a_restart_gets_a_gap(served: Served, anthropic: AnthropicServer) -> None:
    anthropic.add(reply("Hi."))
    with served.client() as c:
        sid = create(c)["id"]
        events = Events(c, sid, last_id=500)
        frame = events.next()
        events.close()
    assert (frame.id, frame.event) == (None, "gap")
    assert frame.data == {
        "type": "gap",
        "session": sid,
        "after": 500,
        "first": 1,
        "last_seq": built_notices(),
        "reason": "the server does not know that seq (it restarted?)",
        "hint": f"reload the transcript: GET /v1/sessions/{sid}/messages",
    }


# -- a session outlives its server -----------------------------------------------------------------


def test_kill_9_mid_tool_then_resume_through_the_api(
    servers: Servers, anthropic: AnthropicServer
) -> None:
    bash = reply("", ("bash", {"command": "sleep 2 && echo slept"}))
    anthropic.add(bash, reply("It slept."))
    first = servers.start()
    with first.client() as c:
        sid = create(c)["id"]
        events = Events(c, sid, after=0)
        assert c.post(f"/v1/sessions/{sid}/prompt", json={"text": "sleep"}).status_code == 202
        events.answering(c, "tool_started")
        first.proc.kill()  # SIGKILL: no cleanup of any kind
        first.proc.wait(10)
        events.close()
    assert len(anthropic.model_requests) == 1
    second = servers.start()
    with second.client() as c:
        r = c.post("/v1/sessions", json={"resume": sid})
        assert r.status_code == 201, r.text
        assert {k: r.json()[k] for k in ("id", "busy", "work", "turns")} == {
            "id": sid,
            "busy": True,
            "work": "resume",
            "turns": 1,
        }
        events = Events(c, sid, after=0)
        frames = events.answering(c, "status", busy=False)
        events.close()
        # Loaded already: returned as it is.
        again = c.post("/v1/sessions", json={"resume": sid})
        assert (again.status_code, again.json()["id"], again.json()["turns"]) == (200, sid, 2)
    got = [f.data for f in frames if f.event in ("tool_started", "tool_finished", "result")]
    assert [(g["type"], g.get("id"), g.get("output"), g.get("result")) for g in got] == [
        ("tool_started", tool_id(bash), None, None),
        ("tool_finished", tool_id(bash), "slept\n[exit code 0]", None),
        ("result", None, None, "It slept."),
    ]
    assert kinds(frames)[-1] == "status"
    assert len(anthropic.model_requests) == 2
    result = anthropic.model_requests[1].json["messages"][-1]["content"][0]
    assert (result["tool_use_id"], result["content"][0]["text"]) == (
        tool_id(bash),
        "slept\n[exit code 0]",
    )


def test_a_session_held_by_another_process_is_409(
    servers: Servers, anthropic: AnthropicServer
) -> None:
    one, two = servers.start(), servers.start()
    with one.client() as a, two.client() as b:
        sid = create(a)["id"]
        r = b.post("/v1/sessions", json={"resume": sid})
        listed = b.get("/v1/sessions").json()["sessions"]
    assert (r.status_code, r.json()) == (
        409,
        {
            "error": f"session {sid} is already open for writing by pid {one.proc.pid}",
            "hint": "wait for that run to finish, or suspend it with `keel suspend`",
        },
    )
    assert [(s["id"], s["loaded"], s["busy"]) for s in listed] == [(sid, False, False)]


# -- attacks ---------------------------------------------------------------------------------------

NO_TOKEN_HINT = (
    "send `Authorization: Bearer <token>` with the token keel serve printed "
    "(or KEEL_SERVER_TOKEN, or --token-file)"
)


def test_requests_without_the_right_token_are_refused(served: Served) -> None:
    with served.client() as c:
        sid = create(c)["id"]
    cases: list[tuple[str | None, dict[str, str], str, dict[str, Any], str]] = [
        (None, {}, "/v1/info", {}, "no bearer token"),
        ("wrong-token-0123456789", {}, "/v1/info", {}, "wrong bearer token"),
        (TOKEN[:-1], {}, "/v1/sessions", {}, "wrong bearer token"),  # a prefix is not the token
        (TOKEN + "x", {}, "/v1/sessions", {}, "wrong bearer token"),
        (
            None,
            {"authorization": f"Basic {TOKEN}"},
            "/v1/info",
            {},
            "the Authorization header is not `Bearer <token>`",
        ),
        (
            None,
            {},
            f"/v1/sessions/{sid}/events",
            {"token": "wrong-token-0123456789"},
            "wrong bearer token",
        ),
    ]
    for token, headers, path, params, error in cases:
        with served.client(token, **headers) as c:
            r = c.get(path, params=params)
        assert (r.status_code, r.json()) == (401, {"error": error, "hint": NO_TOKEN_HINT}), path
        assert r.headers["www-authenticate"] == "Bearer"
    # The token in a query string is for EventSource only: anywhere else it is refused, so
    # that it does not end up in the URLs (and logs) of ordinary requests.
    with served.client(None) as c:
        r = c.get("/v1/info", params={"token": TOKEN})
        assert (r.status_code, r.json()) == (
            401,
            {
                "error": "a token in the query string is accepted only on the event streams (…/events, …/journal)",
                "hint": "send it as `Authorization: Bearer <token>`",
            },
        )
        post = c.post(f"/v1/sessions/{sid}/prompt", params={"token": TOKEN}, json={"text": "x"})
        assert post.status_code == 401
        events = Events(c, sid, after=0, token_in_query=TOKEN)
        events.close()
        health = c.get("/v1/health")
        assert (health.status_code, health.json()) == (200, {"ok": True, "version": "0.1.0"})


def test_a_host_header_that_does_not_name_this_server_is_refused(served: Served) -> None:
    """DNS rebinding: a page on evil.example whose name now resolves to 127.0.0.1 can make the
    browser send requests here, but with `Host: evil.example`."""
    hint = (
        "connect to the address keel serve printed (a page on another name reaching this port "
        "is refused: DNS rebinding)"
    )
    for host in (
        f"evil.example:{served.port}",
        "evil.example",
        f"127.0.0.1:{served.port + 1}",
        f"localhost.evil.example:{served.port}",
        "127.0.0.1",
    ):
        for path in ("/v1/health", "/v1/info", "/v1/sessions"):
            with served.client(host=host) as c:
                r = c.get(path)
            assert (r.status_code, r.json()) == (
                403,
                {"error": f"Host header {host!r} does not name this server", "hint": hint},
            ), (host, path)
    for host in (
        f"127.0.0.1:{served.port}",
        f"localhost:{served.port}",
        f"LOCALHOST:{served.port}",
    ):
        with served.client(host=host) as c:
            assert c.get("/v1/info").status_code == 200, host


def test_malformed_bodies_get_a_400_with_one_line(served: Served) -> None:
    with served.client() as c:
        sid = create(c)["id"]
        cases: list[tuple[str, str, bytes, dict[str, str]]] = [
            (
                "/v1/sessions",
                "POST",
                b'{"model": ',
                {
                    "error": "malformed JSON body: Expecting value: line 1 column 11 (char 10)",
                    "hint": "send one JSON object",
                },
            ),
            (
                f"/v1/sessions/{sid}/prompt",
                "POST",
                b'{"text": "a"} {"text": "b"}',
                {
                    "error": "malformed JSON body: Extra data: line 1 column 15 (char 14)",
                    "hint": "send one JSON object",
                },
            ),
            (
                f"/v1/sessions/{sid}/prompt",
                "POST",
                b'["text"]',
                {
                    "error": "the body must be a JSON object, not a list",
                    "hint": "send one JSON object, e.g. {}",
                },
            ),
            (
                f"/v1/sessions/{sid}/prompt",
                "POST",
                b'{"text": 5}',
                {"error": "text must be a string, not a number", "hint": ""},
            ),
            (
                f"/v1/sessions/{sid}/prompt",
                "POST",
                b'{"text": "hi", "wait": 1}',
                {"error": "wait must be true or false, not a number", "hint": ""},
            ),
            (
                f"/v1/sessions/{sid}/prompt",
                "POST",
                b'{"txt": "hi"}',
                {"error": "unknown field 'txt'", "hint": "this route takes: text, wait"},
            ),
            (
                f"/v1/sessions/{sid}/prompt",
                "POST",
                b"{}",
                {"error": "text is missing or empty", "hint": 'send {"text": "…"}'},
            ),
            (
                f"/v1/sessions/{sid}/prompt",
                "POST",
                b"[" * 100_000 + b"]" * 100_000,
                {"error": "malformed JSON body: nested too deep", "hint": "send one JSON object"},
            ),
            (
                "/v1/sessions",
                "POST",
                b'{"a": ' * 100_000 + b"1" + b"}" * 100_000,
                {"error": "malformed JSON body: nested too deep", "hint": "send one JSON object"},
            ),
            (
                f"/v1/sessions/{sid}/prompt",
                "POST",
                b"\xff\xfe",
                {"error": "malformed JSON body: not UTF-8", "hint": "send one JSON object"},
            ),
            (
                f"/v1/sessions/{sid}",
                "PATCH",
                b'{"mode": "yolo"}',
                {
                    "error": "unknown mode 'yolo'",
                    "hint": "modes: default, accept-edits, plan, bypass, auto",
                },
            ),
            (
                "/v1/sessions",
                "POST",
                b'{"resume": "x", "model": "m"}',
                {
                    "error": "resume cannot be combined with model",
                    "hint": "a reopened session keeps its model, effort and mode; PATCH it afterwards",
                },
            ),
        ]
        for path, method, raw, expected in cases:
            r = c.request(method, path, content=raw, headers={"content-type": "application/json"})
            assert (r.status_code, r.json()) == (400, expected), raw
        unknown = c.post("/v1/sessions/nope/prompt", json={"text": "hi"})
        assert (unknown.status_code, unknown.json()) == (
            404,
            {
                "error": "no loaded session 'nope'",
                "hint": 'load it with POST /v1/sessions {"resume": "nope"}; GET /v1/sessions lists them',
            },
        )
        route = c.get("/v1/nothing")
        assert (route.status_code, route.json()) == (
            404,
            {"error": "not found", "hint": "GET /openapi.json lists the routes"},
        )
        wrong = c.put("/v1/sessions")
        assert (wrong.status_code, wrong.json()) == (
            405,
            {"error": "method not allowed", "hint": "GET /openapi.json lists the methods"},
        )


def test_patch_checks_every_field_before_changing_any(served: Served) -> None:
    with served.client() as c:
        sid = create(c)["id"]
        bad = c.patch(f"/v1/sessions/{sid}", json={"mode": "plan", "effort": "extreme"})
        assert (bad.status_code, bad.json()) == (
            400,
            {
                "error": "unknown effort 'extreme'",
                "hint": "efforts: low, medium, high, max or null",
            },
        )
        no_key = c.patch(f"/v1/sessions/{sid}", json={"mode": "plan", "model": "openai/gpt-5"})
        assert no_key.status_code == 400
        assert no_key.json()["error"].endswith(f"(still on {MODEL})")
        unchanged = c.get(f"/v1/sessions/{sid}").json()
        assert (unchanged["mode"], unchanged["effort"], unchanged["model"]) == (
            "default",
            None,
            MODEL,
        )
        good = c.patch(
            f"/v1/sessions/{sid}",
            json={"mode": "accept-edits", "effort": "high", "model": "anthropic/claude-haiku-4-5"},
        )
        assert good.status_code == 200
        changed = good.json()
        assert (changed["mode"], changed["effort"], changed["model"]) == (
            "accept-edits",
            "high",
            "anthropic/claude-haiku-4-5",
        )


# -- the other routes ------------------------------------------------------------------------------


def run(c: httpx.Client, sid: str, text: str) -> dict[str, Any]:
    r = c.post(f"/v1/sessions/{sid}/prompt", json={"text": text, "wait": True})
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def test_undo_compact_fork_clear_tasks_and_delete(
    served: Served, anthropic: AnthropicServer, project: Path, isolated_env: Path
) -> None:
    anthropic.add(
        reply("", ("write", {"path": "new.txt", "content": "new\n"})),
        reply("Wrote it."),
        reply("<summary>We wrote new.txt.</summary>"),  # the compaction
        reply("Second."),
    )
    with served.client() as c:
        sid = create(c, mode="accept-edits")["id"]
        assert run(c, sid, "write new.txt")["result"] == "Wrote it."
        assert (project / "new.txt").exists()
        undo = c.post(f"/v1/sessions/{sid}/undo")
        assert (undo.status_code, undo.json()) == (
            200,
            {
                "label": "write new.txt",
                "restored": [],
                "removed": ["new.txt"],
                "overwritten": [],
                "failed": [],
                "notes": [],
                "checks": [],
            },
        )
        assert not (project / "new.txt").exists()
        nothing = c.post(f"/v1/sessions/{sid}/undo")
        assert nothing.status_code == 409
        assert nothing.json()["error"] == "nothing to undo"
        compact = c.post(f"/v1/sessions/{sid}/compact", json={"instructions": "keep the file name"})
        assert compact.status_code == 200, compact.text
        summary = compact.json()
        assert set(summary) == {"summary", "tokens_before", "tokens_after", "cost_usd"}
        assert summary["summary"].startswith("This session continues from an earlier conversation")
        assert "<summary>\nWe wrote new.txt.\n</summary>" in summary["summary"]
        assert summary["cost_usd"] == pytest.approx((100 * 3 + 20 * 15) / 1e6)
        assert run(c, sid, "and now?")["result"] == "Second."
        # The model reads the summary after a fresh context (the route showed the summary alone).
        after = anthropic.model_requests[-1].json
        assert context_of(after).startswith("<context>\n<env>\n")
        opening = after["messages"][0]["content"][0]["text"]
        assert opening == f"{context_of(after)}\n\n{summary['summary']}"
        # The model heard of the undo with the next prompt.
        last = after["messages"][-1]["content"]
        sent = "".join(block.get("text", "") for block in last)
        note = sent[sent.index("<system-note>") : sent.index("</system-note>")]
        assert "new.txt" in note
        assert sent.endswith("and now?")
        tasks = c.get(f"/v1/sessions/{sid}/tasks")
        assert (tasks.status_code, tasks.json()) == (200, {"tasks": []})
        stop = c.delete(f"/v1/sessions/{sid}/tasks/bg-9")
        assert (stop.status_code, stop.json()) == (
            404,
            {
                "error": "no background task 'bg-9' (known: none started)",
                "hint": f"GET /v1/sessions/{sid}/tasks lists them",
            },
        )
        cancel = c.post(f"/v1/sessions/{sid}/cancel")
        assert (cancel.status_code, cancel.json()) == (200, {"interrupted": False})
        fork = c.post(f"/v1/sessions/{sid}/fork", json={})
        assert fork.status_code == 201, fork.text
        forked = fork.json()
        assert forked == {"id": forked["id"], "parent": sid, "prompt": "", "loaded": False}
        assert next(isolated_env.glob(f"sessions/*/{forked['id']}.jsonl")).exists()
        at_first = c.post(f"/v1/sessions/{sid}/fork", json={"at": 2}).json()
        assert (at_first["prompt"], at_first["parent"]) == ("write new.txt", sid)
        bad_fork = c.post(f"/v1/sessions/{sid}/fork", json={"at": 3})
        assert (bad_fork.status_code, bad_fork.json()["error"]) == (
            400,
            f"seq 3 of session {sid} is not a prompt; forks start at a prompt boundary",
        )
        events = Events(c, sid, after=0)
        cleared = c.post(f"/v1/sessions/{sid}/clear")
        assert cleared.status_code == 201, cleared.text
        fresh = cleared.json()
        assert fresh["id"] != sid
        assert (fresh["previous"], fresh["mode"], fresh["model"], fresh["turns"]) == (
            sid,
            "accept-edits",
            MODEL,
            0,
        )
        tail = events.until("session_closed")
        with pytest.raises(AssertionError, match="the stream ended"):
            events.next()
        events.close()
        assert [norm(f.data, sid) for f in tail[-2:]] == [
            {"type": "cleared", "new_session": fresh["id"], "seq": tail[-2].id, "session": "<sid>"},
            {"type": "session_closed", "reason": "clear", "seq": tail[-1].id, "session": "<sid>"},
        ]
        gone = c.get(f"/v1/sessions/{sid}")
        assert gone.status_code == 404
        info = c.get("/v1/info").json()
        assert info["loaded"] == [fresh["id"]]
        deleted = c.delete(f"/v1/sessions/{fresh['id']}")
        assert (deleted.status_code, deleted.content) == (204, b"")
        assert c.get("/v1/info").json()["loaded"] == []
        listed = [s["id"] for s in c.get("/v1/sessions").json()["sessions"]]
        assert set(listed) == {sid, forked["id"], at_first["id"], fresh["id"]}


# -- the description -------------------------------------------------------------------------------


def test_openapi_describes_exactly_the_routes(served: Served, tmp_path: Path) -> None:
    from starlette.routing import Route

    from keel.server.host import Host
    from keel.server.http import Api
    from keel.server.openapi import spec
    from keel.server.webpage import FILES, PAGES, TRACES

    routes = {
        (method.lower(), route.path)
        for route in Api(Host(tmp_path)).routes()
        if isinstance(route, Route)
        # The web pages, their files and the trace views are no API.
        and not (route.path in PAGES or route.path.startswith((FILES, TRACES)))
        for method in route.methods or ()
        if method != "HEAD"
    }
    document = spec()
    described = {
        (method, path) for path, operations in document["paths"].items() for method in operations
    }
    assert described == routes
    assert document["openapi"] == "3.1.0"
    # Every $ref resolves, every path parameter is declared.
    text = json.dumps(document)
    for ref in {part.split('"')[0] for part in text.split('"$ref": "#/components/')[1:]}:
        section, name = ref.split("/")
        assert name in document["components"][section], ref
    for path, operations in document["paths"].items():
        names = {seg[1:-1] for seg in path.split("/") if seg.startswith("{")}
        for op in operations.values():
            declared = {
                document["components"]["parameters"]["SessionId"]["name"]
                if "$ref" in p
                else p["name"]
                for p in op.get("parameters", [])
                if "$ref" in p or p["in"] == "path"
            }
            assert declared == names, (path, declared)
    with served.client(None) as c:
        served_doc = c.get("/openapi.json")
    assert (served_doc.status_code, served_doc.json()) == (200, document)


# -- the ring, in process --------------------------------------------------------------------------


async def _read(stream: Any, count: int) -> list[bytes]:
    got = []
    async for chunk in stream:
        got.append(chunk)
        if len(got) == count:
            break
    return got


def test_the_ring_replays_what_it_holds_and_marks_the_gap() -> None:
    from keel.server.ring import EventRing

    async def main() -> None:
        ring = EventRing("s1", size=3)
        for n in range(5):
            ring.publish({"type": "text_delta", "text": str(n)})
        stream = ring.stream(1, keepalive=60)
        got = await _read(stream, 5)
        await stream.aclose()
        assert got == [
            b"retry: 1000\n\n",
            b'event: gap\ndata: {"type":"gap","session":"s1","after":1,"first":3,"last_seq":5,'
            b'"reason":"events 2 to 2 are no longer held","hint":"reload the transcript: '
            b'GET /v1/sessions/s1/messages"}\n\n',
            b'id: 3\nevent: text_delta\ndata: {"type":"text_delta","text":"2","seq":3,"session":"s1"}\n\n',
            b'id: 4\nevent: text_delta\ndata: {"type":"text_delta","text":"3","seq":4,"session":"s1"}\n\n',
            b'id: 5\nevent: text_delta\ndata: {"type":"text_delta","text":"4","seq":5,"session":"s1"}\n\n',
        ]
        assert ring.subscribers == 0
        # Nothing missed: no gap, no replay; then live events, and keepalives while idle.
        live = ring.stream(5, keepalive=0.05)
        assert await _read(live, 1) == [b"retry: 1000\n\n"]
        assert await _read(live, 1) == [b": keepalive\n\n"]
        ring.publish({"type": "status", "busy": False, "work": None})
        assert await _read(live, 1) == [
            b'id: 6\nevent: status\ndata: {"type":"status","busy":false,"work":null,"seq":6,'
            b'"session":"s1"}\n\n'
        ]
        ring.close()
        assert [chunk async for chunk in live] == []

    asyncio.run(main())


def test_a_slow_subscriber_is_dropped_and_the_agent_never_waits() -> None:
    from keel.server.ring import EventRing

    async def main() -> None:
        ring = EventRing("s1", limit=10)
        slow = ring.stream(0, keepalive=60)
        fast = ring.stream(0, keepalive=60)
        assert await _read(slow, 1) == [b"retry: 1000\n\n"]
        assert await _read(fast, 1) == [b"retry: 1000\n\n"]
        started = time.monotonic()
        for n in range(5):
            ring.publish({"type": "text_delta", "text": str(n)})
        fast_got = await _read(fast, 1)  # the fast one keeps up
        for n in range(5, 13):  # 13 unread for the slow one: over its 10
            ring.publish({"type": "text_delta", "text": str(n)})
        assert time.monotonic() - started < 0.5  # publishing never waited for anyone
        assert fast_got[0].count(b"\n\n") == 5
        assert (await _read(fast, 1))[0].count(b"\n\n") == 8
        dropped = await _read(slow, 2)
        assert dropped == [
            b'event: dropped\ndata: {"type":"dropped","session":"s1","reason":"this client fell 10 '
            b'events behind","hint":"reconnect with Last-Event-ID to replay what was missed"}\n\n'
        ]
        assert ring.subscribers == 1
        await fast.aclose()

    asyncio.run(main())


# -- the command line ------------------------------------------------------------------------------


def keel_serve(
    *args: str, env: dict[str, str] | None = None, cwd: Path
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "keel", "serve", *args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_serve_refuses_unsafe_settings_in_one_line(project: Path, tmp_path: Path) -> None:
    loose = tmp_path / "token"
    loose.write_text("a-token-that-is-long-enough\n", encoding="utf-8")
    loose.chmod(0o644)
    short = tmp_path / "short"
    short.write_text("abc\n", encoding="utf-8")
    short.chmod(0o600)
    cases = [
        (
            ("--host", "0.0.0.0"),
            {},
            "keel: error: --host 0.0.0.0 is not a loopback address (hint: add --allow-remote to "
            "listen there (anyone who reaches it and has the token runs commands as you))",
        ),
        (
            ("--token-file", str(loose)),
            {},
            f"keel: error: --token-file {loose} can be read by other users (mode 0644) "
            f"(hint: chmod 600 {loose})",
        ),
        (
            ("--token-file", str(short)),
            {},
            f"keel: error: the token in --token-file {short} is too short or has spaces (at least "
            "16 characters) (hint: generate one: python -c 'import secrets; "
            "print(secrets.token_hex(32))')",
        ),
        (
            (),
            {"KEEL_SERVER_TOKEN": ""},
            "keel: error: the token in KEEL_SERVER_TOKEN is too short or has spaces (at least 16 "
            "characters) (hint: generate one: python -c 'import secrets; "
            "print(secrets.token_hex(32))')",
        ),
        (
            ("--port", "70000"),
            {},
            "keel: error: --port must be from 0 to 65535, not 70000",
        ),
    ]
    for args, env, line in cases:
        port = () if "--port" in args else ("--port", "0")
        out = keel_serve(*port, *args, env=env, cwd=project)
        assert (out.returncode, out.stdout, out.stderr) == (2, "", line + "\n"), args
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        busy = taken.getsockname()[1]
        out = keel_serve("--port", str(busy), cwd=project)
    assert (out.returncode, out.stdout, out.stderr) == (
        2,
        "",
        f"keel: error: cannot listen on 127.0.0.1:{busy}: Address already in use "
        "(hint: pick another --port (0: a free one))\n",
    )


def test_a_generated_token_is_printed_and_required(servers: Servers) -> None:
    env = {k: v for k, v in os.environ.items() if k != "KEEL_SERVER_TOKEN"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "keel", "serve", "--port", "0"],
        cwd=servers.project,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        head = proc.stdout.readline().rstrip("\n")
        open_line = proc.stdout.readline().rstrip("\n")
        token_line = proc.stdout.readline().rstrip("\n")
        url = head.split()[4]
        assert head == f"keel serve: listening on {url} for {servers.project}"
        assert token_line.startswith("keel serve: token ")
        token = token_line.removeprefix("keel serve: token ")
        # The web page's address, the token in its fragment (docs/web.md).
        assert open_line == f"keel serve: open {url}/#token={token}"
        assert len(token) == 64
        assert int(token, 16) >= 0
        with httpx.Client(base_url=url) as c:
            assert c.get("/v1/info").status_code == 401
            assert (
                c.get("/v1/info", headers={"authorization": f"Bearer {token}"}).status_code == 200
            )
    finally:
        proc.terminate()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


def test_keel_version_and_keel_p_import_no_server(project: Path) -> None:
    heavy: tuple[str, ...] = ("starlette", "uvicorn", "keel.server", "keel.cli.serve")
    # Nor what the cold start shed (tests/test_http_transport.py checks a hosted model's path).
    heavy += ("aiohttp", "httpx", "keel.hooks.runner")
    for args in (["--version"], ["-p", "hi", "--model", "scripted:demo", "--no-session"]):
        out = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "keel", *args],
            cwd=project,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        imported = {
            line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if "|" in line
        }
        assert "keel.cli.main" in imported
        assert (
            sorted(m for m in imported if m.split(".")[0] in heavy or m.startswith(heavy)) == []
        ), args


def test_cancel_interrupts_a_run_and_withdraws_its_question(
    served: Served, anthropic: AnthropicServer, project: Path
) -> None:
    write = reply("", ("write", {"path": "x.txt", "content": "x\n"}))
    anthropic.add(write)
    with served.client() as c:
        sid = create(c)["id"]
        events = Events(c, sid, after=0)
        assert c.post(f"/v1/sessions/{sid}/prompt", json={"text": "write"}).status_code == 202
        rid = events.until("permission_request")[-1].data["request_id"]
        cancel = c.post(f"/v1/sessions/{sid}/cancel", json={})
        assert (cancel.status_code, cancel.json()) == (200, {"interrupted": True})
        tail = events.until("status", busy=False)
        events.close()
        assert c.get(f"/v1/sessions/{sid}/permissions").json() == {"pending": []}
        late = c.post(f"/v1/sessions/{sid}/permissions/{rid}", json={"allow": True})
        assert late.status_code == 404
    answered = [f.data for f in tail if f.event == "permission_answered"]
    assert [(a["request_id"], a["allow"], a["by"]) for a in answered] == [(rid, False, "cancelled")]
    result = next(f.data for f in tail if f.event == "result")
    assert result["stop_reason"] == "interrupted"
    assert not (project / "x.txt").exists()


def test_sigterm_ends_the_streams_and_the_server_promptly(
    served: Served, anthropic: AnthropicServer
) -> None:
    with served.client() as c:
        session = create(c)
        sid = session["id"]
        events = Events(c, sid, after=session["last_seq"])
        started = time.monotonic()
        served.proc.send_signal(signal.SIGTERM)
        frame = events.next()
        with pytest.raises(AssertionError, match="the stream ended"):
            events.next()
        events.close()
    # uvicorn stops cleanly, then re-raises the signal: the exit status says what stopped it.
    assert served.proc.wait(10) == -signal.SIGTERM
    assert time.monotonic() - started < 4
    assert (frame.event, frame.data) == (
        "server_stopping",
        {"type": "server_stopping", "seq": session["last_seq"] + 1, "session": sid},
    )


def test_info_and_health(served: Served, project: Path, isolated_env: Path) -> None:
    from keel.permissions.sandbox import probe
    from keel.session.store import sessions_dir

    with served.client() as c:
        sid = create(c)["id"]
        info = c.get("/v1/info")
    sandbox = probe()
    assert (info.status_code, info.json()) == (
        200,
        {
            "version": "0.1.0",
            "cwd": str(project),
            "all_projects": False,
            "sessions_dir": str(sessions_dir(project)),
            "pid": served.proc.pid,
            "loaded": [sid],
            "sandbox": {"ok": sandbox.ok, "detail": sandbox.detail},
            "fleet": False,
        },
    )


def test_one_project_unless_all_projects(servers: Servers, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    everywhere = servers.start("--all-projects")
    with everywhere.client() as c:
        theirs = c.post("/v1/sessions", json={"model": MODEL, "cwd": str(other)}).json()
        assert theirs["cwd"] == str(other)
        c.delete(f"/v1/sessions/{theirs['id']}")
        assert [s["id"] for s in c.get("/v1/sessions").json()["sessions"]] == [theirs["id"]]
    one = servers.start()
    with one.client() as c:
        r = c.post("/v1/sessions", json={"resume": theirs["id"]})
        assert (r.status_code, r.json()) == (
            404,
            {
                "error": f"session {theirs['id']} belongs to another project",
                "hint": f"this server hosts {servers.project}; start `keel serve --all-projects` "
                "to host every project",
            },
        )
        elsewhere = c.post("/v1/sessions", json={"model": MODEL, "cwd": str(other)})
        assert (elsewhere.status_code, elsewhere.json()) == (
            400,
            {
                "error": f"this server hosts {servers.project}, not {other}",
                "hint": "start `keel serve --all-projects` to host sessions of other projects",
            },
        )
        assert c.get("/v1/sessions").json() == {"sessions": []}


def test_sigterm_mid_tool_suspends_and_the_tool_is_not_run_again(
    servers: Servers, anthropic: AnthropicServer, project: Path
) -> None:
    bash = reply("", ("bash", {"command": "sleep 1 && echo once >> ran.txt"}))
    anthropic.add(bash, reply("Finished."))
    first = servers.start()
    with first.client() as c:
        sid = create(c)["id"]
        events = Events(c, sid, after=0)
        assert c.post(f"/v1/sessions/{sid}/prompt", json={"text": "run it"}).status_code == 202
        events.answering(c, "tool_started")
        first.proc.send_signal(signal.SIGTERM)
        assert events.until("server_stopping")[-1].data["type"] == "server_stopping"
        events.close()
    assert first.proc.wait(15) == -signal.SIGTERM
    # The call in flight finished and was journaled before the server went: suspended.
    assert (project / "ran.txt").read_text(encoding="utf-8") == "once\n"
    assert len(anthropic.model_requests) == 1
    second = servers.start()
    with second.client() as c:
        listed = c.get("/v1/sessions").json()["sessions"]
        assert [(s["id"], s["status"]) for s in listed] == [(sid, "suspended")]
        assert c.post("/v1/sessions", json={"resume": sid}).json()["work"] == "resume"
        events = Events(c, sid, after=0)
        frames = events.until("status", busy=False)
        events.close()
    assert [f.data["result"] for f in frames if f.event == "result"] == ["Finished."]
    assert not [f for f in frames if f.event == "tool_started"]
    assert (project / "ran.txt").read_text(encoding="utf-8") == "once\n"
    assert len(anthropic.model_requests) == 2


def test_the_host_check_follows_the_address() -> None:
    from keel.cli.serve import allowed_hosts, is_loopback

    loopback = frozenset({"127.0.0.1:8080", "localhost:8080", "[::1]:8080"})
    assert allowed_hosts("127.0.0.1", 8080, False) == loopback
    names = frozenset({"127.0.0.1", "localhost", "[::1]"})
    assert allowed_hosts("127.0.0.1", 80, False) == names | {f"{n}:80" for n in names}
    assert allowed_hosts("10.0.0.5", 8080, True) == loopback | {"10.0.0.5:8080"}
    assert allowed_hosts("fd00::5", 8080, True) == loopback | {"[fd00::5]:8080"}
    assert allowed_hosts("Box.Example", 8080, True) == loopback | {"box.example:8080"}
    assert allowed_hosts("0.0.0.0", 8080, True) is None
    assert allowed_hosts("::", 8080, True) is None
    assert [is_loopback(h) for h in ("127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost")] == [
        True
    ] * 5
    assert [is_loopback(h) for h in ("0.0.0.0", "10.0.0.5", "::", "localhost.example")] == [
        False
    ] * 4


def test_always_saves_the_rule_as_the_tui_does(
    served: Served, anthropic: AnthropicServer, project: Path
) -> None:
    anthropic.add(
        reply("", ("write", {"path": "a.txt", "content": "a\n"})),
        reply("", ("write", {"path": "b.txt", "content": "b\n"})),  # not asked again
        reply("Both written."),
    )
    with served.client() as c:
        sid = create(c)["id"]
        events = Events(c, sid, after=0)
        assert c.post(f"/v1/sessions/{sid}/prompt", json={"text": "write"}).status_code == 202
        rid = events.until("permission_request")[-1].data["request_id"]
        r = c.post(f"/v1/sessions/{sid}/permissions/{rid}", json={"allow": True, "always": True})
        assert r.json() == {"request_id": rid, "allow": True, "scope": "always"}
        frames = events.until("status", busy=False)
        events.close()
    assert [f.event for f in frames].count("permission_request") == 0
    saved = project / ".keel" / "settings.local.json"
    notices = [f.data["text"] for f in frames if f.event == "notice"]
    assert notices == [f"always allowed write (saved to {saved})"]
    assert json.loads(saved.read_text(encoding="utf-8")) == {"permissions": {"allow": ["write"]}}
    assert (project / "b.txt").read_text(encoding="utf-8") == "b\n"


async def test_a_defect_is_a_json_500_and_one_line_on_stderr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from keel.server.host import Host
    from keel.server.http import Api, create_app

    async def broken(self: Api, request: Any) -> Any:
        raise RuntimeError("a bug\nover two lines")

    monkeypatch.setattr(Api, "info", broken)
    app = create_app(Host(tmp_path), token=TOKEN, hosts=["testserver"])
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
        r = await c.get("/v1/info", headers={"authorization": f"Bearer {TOKEN}"})
    assert (r.status_code, r.json()) == (
        500,
        {
            "error": "internal error: RuntimeError: a bug over two lines",
            "hint": "the server's stderr has the details (the traceback with keel serve --debug)",
        },
    )
    assert capsys.readouterr().err == (
        "keel serve: error: internal error in GET /v1/info: RuntimeError: a bug over two lines "
        "(hint: run keel serve with --debug for the traceback)\n"
    )


@pytest.mark.needs("sandbox")  # its bash runs unasked only in the sandbox
def test_background_tasks_are_listed_and_stopped_and_continue_loads_the_latest(
    served: Served, anthropic: AnthropicServer
) -> None:
    start = reply("", ("bash", {"command": "sleep 30", "run_in_background": True}))
    anthropic.add(start, reply("Started it."), reply("It was stopped."))
    with served.client() as c:
        sid = create(c)["id"]
        assert run(c, sid, "start a long job")["result"] == "Started it."
        events = Events(c, sid, last_id=c.get(f"/v1/sessions/{sid}").json()["last_seq"])
        [task] = c.get(f"/v1/sessions/{sid}/tasks").json()["tasks"]
        assert norm(task) == {
            "id": "bg-1",
            "kind": "shell",
            "status": "running",
            "description": "sleep 30",
            "agent": "",
            "seconds": "…",
            "result": None,
        }
        stopped = c.delete(f"/v1/sessions/{sid}/tasks/bg-1")
        assert stopped.status_code == 200
        assert (stopped.json()["id"], stopped.json()["status"]) == ("bg-1", "stopped")
        # Its end reaches the model in a turn keel starts itself, as in the TUI.
        frames = events.until("status", busy=False)
        events.close()
        assert [f.data for f in frames if f.event == "status"] == [
            {
                "type": "status",
                "busy": True,
                "work": "notifications",
                "seq": frames[1].id,
                "session": sid,
            },
            {"type": "status", "busy": False, "work": None, "seq": frames[-1].id, "session": sid},
        ]
        assert [f.data["result"] for f in frames if f.event == "result"] == ["It was stopped."]
        assert (
            "<task-notification"
            in anthropic.model_requests[-1].json["messages"][-1]["content"][0]["text"]
        )
        assert c.delete(f"/v1/sessions/{sid}").status_code == 204
        again = c.post("/v1/sessions", json={"continue": True})
        assert (again.status_code, again.json()["id"], again.json()["turns"]) == (201, sid, 3)
