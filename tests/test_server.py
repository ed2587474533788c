"""`keel serve` end to end: a real server process on a loopback port, driven over HTTP and SSE
(httpx), its model a loopback Anthropic server scripted by the test, its HOME isolated.

Covers the routes with whole bodies, the event stream and its replay (Last-Event-ID), permission
questions answered over HTTP, a session surviving `kill -9` of the server mid-tool, two clients
on one session, and the attacks the server must refuse (no or wrong token, a token in the query
string of the wrong route, a rebinding Host header, malformed bodies). The ring's gap and slow
subscriber cases run in process; so does the OpenAPI check against the app's real routes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from keel.llm.script import reply
from keel.testing.anthropic_server import AnthropicServer
from keel.testing.script import Reply

TOKEN = "test-token-0123456789abcdef"
MODEL = "anthropic/claude-sonnet-4-5"


# -- a server process ------------------------------------------------------------------------------


@dataclass
class Served:
    proc: subprocess.Popen[str]
    url: str
    port: int
    stdout: list[str]

    def client(self, token: str | None = TOKEN, **headers: str) -> httpx.Client:
        if token is not None:
            headers["authorization"] = f"Bearer {token}"
        return httpx.Client(base_url=self.url, headers=headers, timeout=httpx.Timeout(20.0))


@dataclass
class Servers:
    project: Path
    model: AnthropicServer
    log: Path
    started: list[Served] = field(default_factory=list)

    def start(self, *args: str, env: dict[str, str] | None = None) -> Served:
        full = {
            **os.environ,
            "ANTHROPIC_API_KEY": "sk-ant-test",
            "ANTHROPIC_BASE_URL": self.model.url,
            "KEEL_SERVER_TOKEN": TOKEN,
            **(env or {}),
        }
        err = self.log.open("a", encoding="utf-8")
        proc = subprocess.Popen(
            [sys.executable, "-m", "keel", "serve", "--port", "0", *args],
            cwd=self.project,
            env=full,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
        err.close()
        lines = _first_line(proc)
        head = lines[0]
        assert head.startswith("keel serve: listening on http://127.0.0.1:"), (head, self.errors())
        url = head.split()[4]
        served = Served(proc, url, int(url.rsplit(":", 1)[1]), lines)
        self.started.append(served)
        return served

    def errors(self) -> str:
        return self.log.read_text(encoding="utf-8") if self.log.exists() else ""

    def stop_all(self) -> None:
        for served in self.started:
            if served.proc.poll() is None:
                served.proc.send_signal(signal.SIGTERM)
                try:
                    served.proc.wait(10)
                except subprocess.TimeoutExpired:
                    served.proc.kill()
                    served.proc.wait(5)
            if served.proc.stdout is not None:
                served.proc.stdout.close()


def _first_line(proc: subprocess.Popen[str]) -> list[str]:
    got: list[str] = []
    assert proc.stdout is not None
    stdout = proc.stdout
    reader = threading.Thread(target=lambda: got.append(stdout.readline()), daemon=True)
    reader.start()
    reader.join(30)
    assert got, f"keel serve printed nothing in 30 s (exit {proc.poll()})"
    assert got[0], f"keel serve exited before printing its address (exit {proc.poll()})"
    return [got[0].rstrip("\n")]


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


# -- SSE -------------------------------------------------------------------------------------------


@dataclass
class Frame:
    id: int | None
    event: str
    data: dict[str, Any]


class Events:
    """One SSE connection, read frame by frame."""

    def __init__(
        self,
        client: httpx.Client,
        sid: str,
        *,
        after: int | None = None,
        last_id: int | None = None,
        token_in_query: str | None = None,
    ) -> None:
        params: dict[str, Any] = {}
        headers: dict[str, str] = {}
        if after is not None:
            params["after"] = after
        if last_id is not None:
            headers["last-event-id"] = str(last_id)
        if token_in_query is not None:
            params["token"] = token_in_query
        self._cm = client.stream(
            "GET", f"/v1/sessions/{sid}/events", params=params, headers=headers
        )
        self.response = self._cm.__enter__()
        assert self.response.status_code == 200, self.response.read()
        assert self.response.headers["content-type"].startswith("text/event-stream")
        self._lines = self.response.iter_lines()
        self.comments: list[str] = []

    def next(self) -> Frame:
        fields: dict[str, str] = {}
        for line in self._lines:
            if line == "":
                if "data" in fields:
                    raw_id = fields.get("id")
                    return Frame(
                        int(raw_id) if raw_id else None,
                        fields.get("event", "message"),
                        json.loads(fields["data"]),
                    )
                fields = {}
                continue
            if line.startswith(":"):
                self.comments.append(line)
                continue
            name, _, value = line.partition(":")
            fields[name] = value.removeprefix(" ")
        raise AssertionError("the stream ended")

    def until(self, kind: str, **match: Any) -> list[Frame]:
        """Frames up to and including the first of `kind` whose data has `match`."""
        frames: list[Frame] = []
        while True:
            frame = self.next()
            frames.append(frame)
            if frame.event == kind and all(frame.data.get(k) == v for k, v in match.items()):
                return frames

    def close(self) -> None:
        self._cm.__exit__(None, None, None)


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
            "last_seq": 0,
            "pending": [],
            "tasks": [],
        }
        events = Events(c, sid, after=0)
        r = c.post(f"/v1/sessions/{sid}/prompt", json={"text": "which files?"})
        assert (r.status_code, r.json()) == (202, {"session": sid, "after_seq": 0})
        frames = events.until("status", busy=False)
        events.close()
    assert [f.id for f in frames] == list(range(1, len(frames) + 1))
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
            "input": {"pattern": "*.py"},
            "started_at": "…",
        },
        {
            "type": "tool_finished",
            "id": gid,
            "name": "glob",
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
    assert after["last_seq"] == len(frames)
    assert after["busy"] is False
    assert [m["role"] for m in messages["messages"]] == ["user", "assistant", "user", "assistant"]
    assert messages["id"] == sid
    assert messages["last_seq"] == len(frames)


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
        "after_seq": 0,
    }
    assert body["duration_ms"] >= 1500
