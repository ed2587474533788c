"""What tests of `keel serve` share: a real server process on a loopback port (`Servers`,
`Served`), its model a loopback Anthropic server scripted by the test, and an SSE reader that
takes the event stream frame by frame (`Events`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from keel.testing.anthropic_server import AnthropicServer

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

    def stop(self) -> None:
        """SIGTERM (SIGKILL after 10 s), and its stdout closed."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


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
            served.stop()


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

    def answering(self, client: httpx.Client, kind: str, **match: Any) -> list[Frame]:
        """`until`, allowing every permission question on the way (bash asks where it has no
        sandbox; the test is about something else)."""
        frames: list[Frame] = []
        while True:
            frame = self.next()
            frames.append(frame)
            if frame.event == "permission_request":
                url = f"/v1/sessions/{frame.data['session']}/permissions/{frame.data['request_id']}"
                assert client.post(url, json={"allow": True}).status_code == 200
            if frame.event == kind and all(frame.data.get(k) == v for k, v in match.items()):
                return frames

    def close(self) -> None:
        self._cm.__exit__(None, None, None)


# -- fixtures: import them by these names (`from tests.server_helpers import served_fixture`);
# tests take them as `anthropic`, `servers` and `served`.


@pytest.fixture(name="anthropic")
def anthropic_fixture() -> Iterator[AnthropicServer]:
    with AnthropicServer(api_key="sk-ant-test") as server:
        yield server


@pytest.fixture(name="servers")
def servers_fixture(project: Path, anthropic: AnthropicServer, tmp_path: Path) -> Iterator[Servers]:
    s = Servers(project, anthropic, tmp_path / "serve.log")
    try:
        yield s
    finally:
        s.stop_all()


@pytest.fixture(name="served")
def served_fixture(servers: Servers) -> Served:
    return servers.start()
