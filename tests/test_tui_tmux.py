"""End to end: the real `keel` binary in a real terminal (tmux), talking to the loopback Anthropic
server. Keys go in with `send-keys`; what the screen shows comes back with `capture-pane`. Runs
on its own tmux server socket, so it neither sees nor touches the user's tmux sessions."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from keel.session.index import latest_session
from keel.session.journal import read_records
from keel.session.records import UndoRecord
from keel.testing import reply
from keel.testing.anthropic_server import AnthropicServer

pytestmark = pytest.mark.needs("tmux")

KEY = "sk-ant-test"


class Terminal:
    """One tmux window running a command, on a private tmux server."""

    def __init__(self, socket: str, cwd: Path) -> None:
        self.socket = socket
        self.cwd = cwd

    def tmux(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["tmux", "-L", self.socket, *args], capture_output=True, text=True, timeout=10
        )

    def start(self, argv: list[str], env: dict[str, str]) -> None:
        assignments = [f"{k}={v}" for k, v in env.items()]
        command = shlex.join(["env", *assignments, *argv])
        out = self.tmux(
            "new-session", "-d", "-s", "keel", "-x", "110", "-y", "36", "-c", str(self.cwd),
            command,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        self.tmux("set-option", "-t", "keel", "remain-on-exit", "on")

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "keel").stdout

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", "keel", *keys)

    def type(self, text: str) -> None:
        self.tmux("send-keys", "-t", "keel", "-l", text)

    def wait_for(self, what: str | Callable[[str], bool], timeout: float = 20) -> str:
        test = what if callable(what) else (lambda screen: what in screen)
        deadline = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < deadline:
            screen = self.screen()
            if test(screen):
                return screen
            time.sleep(0.1)
        files = sorted(p.name for p in self.cwd.iterdir())
        raise AssertionError(
            f"timed out waiting for {what!r}; files: {files}; the screen:\n{screen}"
        )

    def exited(self) -> bool:
        out = self.tmux("display-message", "-p", "-t", "keel", "#{pane_dead}")
        return out.stdout.strip() == "1"


@pytest.fixture
def terminal(project: Path) -> Iterator[Terminal]:
    term = Terminal(f"keel-test-{os.getpid()}-{time.monotonic_ns()}", project)
    yield term
    term.tmux("kill-server")


def keel_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "keel", *args]


def test_keel_in_a_real_terminal(terminal: Terminal, project: Path) -> None:
    notes = "# Notes\n\nkeel was here.\n"
    with AnthropicServer(api_key=KEY) as server:
        server.add(
            reply("I'll write the notes.", ("write", {"path": "notes.md", "content": notes})),
            reply("Wrote **notes.md** with a heading and one line."),
        )
        env = {
            "ANTHROPIC_API_KEY": KEY,
            "ANTHROPIC_BASE_URL": server.url,
            "TERM": "xterm-256color",
            **{k: os.environ[k] for k in ("KEEL_HOME", "KEEL_CONFIG_DIR", "HOME", "PATH")},
        }
        terminal.start(keel_argv("--model", "anthropic/claude-sonnet-4-5"), env)
        terminal.wait_for("/help for commands")
        terminal.type("write the notes")
        terminal.keys("Enter")
        card = terminal.wait_for("Allow write")
        assert "+keel was here." in card
        assert "1. Yes" in card
        terminal.keys("1")
        done = terminal.wait_for("Wrote notes.md with a heading")
        assert "✓ write" in done
        assert "claude-sonnet-4-5 · default ·" in done
        assert (project / "notes.md").read_text(encoding="utf-8") == notes

        terminal.type("/undo")
        terminal.keys("Enter")
        terminal.wait_for("removed notes.md")
        assert not (project / "notes.md").exists()

        terminal.keys("BTab")  # shift+tab: the next mode
        terminal.wait_for("accept edits")

        terminal.keys("C-c")  # on an empty prompt: says how to quit
        terminal.wait_for("press Ctrl+C again to quit")
        terminal.keys("C-c")
        deadline = time.monotonic() + 10
        while not terminal.exited() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert terminal.exited()
    assert not server.script
    assert not server.errors
    session = latest_session(project)
    records = read_records(session).records
    assert [r.payload.type for r in records if r.payload.type in ("undo", "terminal")] == [
        "terminal",
        "undo",
    ]
    undo = next(r.payload for r in records if isinstance(r.payload, UndoRecord))
    assert undo.removed == (str(project / "notes.md"),)


def test_continue_in_a_real_terminal_shows_the_session(
    terminal: Terminal, project: Path, tmp_path: Path
) -> None:
    script = tmp_path / "script.yaml"
    script.write_text("model: demo\nturns:\n  - text: 'The answer is **42**.'\n", encoding="utf-8")
    first = subprocess.run(
        keel_argv("--model", f"scripted:{script}", "--no-tui"),
        cwd=project,
        input="what is the answer?\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert first.returncode == 0, first.stderr
    env = {k: os.environ[k] for k in ("KEEL_HOME", "KEEL_CONFIG_DIR", "HOME", "PATH")}
    terminal.start(keel_argv("--continue"), {**env, "TERM": "xterm-256color"})
    screen = terminal.wait_for("The answer is 42.")
    assert "what is the answer?" in screen
    terminal.keys("Escape")
    terminal.keys("Escape")
    terminal.wait_for("Quit keel?")
    terminal.keys("Enter")
    deadline = time.monotonic() + 10
    while not terminal.exited() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert terminal.exited()


def test_keys_typed_while_keel_starts_end_up_in_the_prompt(
    terminal: Terminal, project: Path, tmp_path: Path
) -> None:
    # The bug: keys typed before the prompt was on screen went to the transcript (the first
    # widget that takes the focus) and were lost.
    script = tmp_path / "script.yaml"
    script.write_text("model: demo\nturns:\n  - text: 'Heard you.'\n", encoding="utf-8")
    env = {k: os.environ[k] for k in ("KEEL_HOME", "KEEL_CONFIG_DIR", "HOME", "PATH")}
    terminal.start(keel_argv("--model", f"scripted:{script}"), {**env, "TERM": "xterm-256color"})
    terminal.type("typed before the prompt was there")  # at once: keel is still starting
    screen = terminal.wait_for("/help for commands")
    screen = terminal.wait_for(lambda s: "│ typed before the prompt was there" in s, timeout=10)
    prompt_line = next(line for line in screen.splitlines() if "typed before" in line)
    assert prompt_line.strip().startswith("│ typed before the prompt was there"), screen
    terminal.keys("Enter")
    done = terminal.wait_for("Heard you.")
    assert "typed before the prompt was there" in done
    session = latest_session(project)
    records = read_records(session).records
    [opening] = [r.payload.message for r in records if r.payload.type == "user"]
    context, typed = opening.blocks
    assert context.text.startswith("<context>\n<env>\n")  # type: ignore[union-attr]
    assert typed.text == "typed before the prompt was there"  # type: ignore[union-attr]


def test_ctrl_c_stops_a_running_tool_and_a_second_one_quits(
    terminal: Terminal, project: Path
) -> None:
    with AnthropicServer(api_key=KEY) as server:
        server.add(reply("Waiting.", ("bash", {"command": "sleep 30", "description": "wait"})))
        env = {
            "ANTHROPIC_API_KEY": KEY,
            "ANTHROPIC_BASE_URL": server.url,
            "TERM": "xterm-256color",
            **{k: os.environ[k] for k in ("KEEL_HOME", "KEEL_CONFIG_DIR", "HOME", "PATH")},
        }
        argv = keel_argv("--model", "anthropic/claude-sonnet-4-5", "--mode", "bypass")
        terminal.start(argv, env)
        terminal.wait_for("/help for commands")
        terminal.type("wait a while")
        terminal.keys("Enter")
        terminal.wait_for("Esc to interrupt")
        terminal.wait_for("sleep 30")
        started = time.monotonic()
        terminal.keys("C-c")
        screen = terminal.wait_for("⚠ interrupted", timeout=10)
        assert time.monotonic() - started < 10
        assert "✗ bash" in screen
        assert "Quit keel?" not in screen
        assert "press Ctrl+C again to quit" in screen
        assert not terminal.exited()
        terminal.keys("C-c")
        deadline = time.monotonic() + 10
        while not terminal.exited() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert terminal.exited()
    assert not server.errors
