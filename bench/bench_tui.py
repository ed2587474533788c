"""Benchmark: does the terminal UI stay fast as the session grows? Reopen time, keystroke
latency while a reply streams at 200 tokens/s, frame cost and memory, for transcripts of 100,
1,000 and 5,000 messages.

Each size is a real session file (keel.session's journal) in a scratch project, written as
rounds of six messages: a prompt; the model thinking, saying a line and calling `bash`; the
command's 200-line output; an `edit` of 50 lines by 50 others (a 100-line diff); its result;
a Markdown answer (a heading, a list, a code block). Every size runs in a fresh process (for an
honest RSS) that does what `keel --continue` does: `Controller.start_session` on the latest
session (journal read, replay into view events) and the Textual app (`KeelApp`) on top, driven
headless by Textual's pilot at 110×36 cells. The model is the loopback Anthropic server
(keel.testing), streaming each reply as one-token (4 characters) text deltas, one every 5 ms.

What is measured, per size:
- reopen: from `start_session` to the first frame drawn after the transcript is rendered and
  the prompt has the focus (the replay, the widgets, the layout). `replay` is the
  `start_session` part alone.
- keystroke: while a 1,000-token reply streams, a key every 150 ms goes to the prompt through
  the app's driver queue (as a terminal's key does); its latency is the time until the end of
  the first frame whose prompt shows it. Median and p95.
- frame: the time of each screen update while that reply streams (`Screen._on_timer_update`:
  layout when needed, the compositor's update and the rendered update; the headless driver
  skips only the terminal write). Median and p95, and the number of frames.
- memory: the process's RSS after the reopen and its peak (`ru_maxrss`), and the number of
  widgets mounted in the transcript after the reopen.

Run: `python bench/bench_tui.py [--sizes 100,1000,5000] [--json out.json] [--timeout 600]`;
`--quick` is a short run (12 and 60 messages, a 100-token reply). Nothing is asserted; a table (or JSON) goes
to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MODEL = "anthropic/claude-sonnet-4-5"
KEY = "sk-ant-bench"
SIZE = (110, 36)
#: Messages in one round of the session (see the module docstring).
ROUND = 6
TOKEN = "abc "  # one token of the streamed reply: 4 characters
TOKEN_INTERVAL = 1 / 200


# -- the session file -----------------------------------------------------------------------------


def write_session(project: Path, messages: int) -> Path:
    """A session of at least `messages` messages (whole rounds: a round cut short would leave
    a call unanswered, which a reopen runs) in `project`'s session folder."""
    from keel.llm.messages import Message, Text, Thinking, ToolUse, Usage, tool_result, user
    from keel.session.journal import Journal
    from keel.session.records import (
        AssistantRecord,
        Meta,
        TerminalRecord,
        ToolResultRecord,
        UserRecord,
    )
    from keel.session.store import sessions_dir

    directory = sessions_dir(project)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "bench-tui.jsonl"
    journal = Journal.create(path, Meta("bench-tui", str(project), MODEL))

    def said(*blocks: Any) -> Message:
        return Message("assistant", tuple(blocks), "anthropic", "claude-sonnet-4-5")

    usage = Usage(2_000, 300, 40_000, 500)
    output = "\n".join(
        f"tests/test_module.py::test_case_{n} PASSED [{n // 2:3d}%]" for n in range(200)
    )
    old = "\n".join(f"def f_{n}(x):  return x + {n}" for n in range(50))
    new = "\n".join(f"def f_{n}(x: int) -> int:  return x + {n} * 2" for n in range(50))
    answer = (
        "## What changed\n\nThe parser now keeps **every** token:\n\n"
        + "".join(f"- item {n}: `value_{n}` is checked\n" for n in range(8))
        + "\n```python\n"
        + "".join(f"print({n})\n" for n in range(6))
        + "```\n\nAll tests pass."
    )
    i = 0
    written = 0
    while written < messages:
        bash = ToolUse(f"toolu_b{i:06d}", "bash", {"command": f"pytest -q tests/test_{i}.py"})
        edit = ToolUse(
            f"toolu_e{i:06d}",
            "edit",
            {"path": f"src/module_{i}.py", "old_string": old, "new_string": new},
        )
        round_: list[Any] = [
            UserRecord(user(f"Round {i}: fix the parser in module_{i}.py")),
            AssistantRecord(
                said(
                    Thinking(f"The failing test is in module {i}. " * 6, "sig"),
                    Text("Let me run the tests first."),
                    bash,
                ),
                usage,
                0.01,
                "tool_use",
                3 * i,
            ),
            ToolResultRecord(tool_result(bash.id, output), 1.25),
            AssistantRecord(said(edit), usage, 0.01, "tool_use", 3 * i + 1),
            ToolResultRecord(tool_result(edit.id, f"Edited src/module_{i}.py"), 0.01),
            AssistantRecord(
                said(Text(f"Round {i} done.\n\n" + answer)), usage, 0.01, "end_turn", 3 * i + 2
            ),
        ]
        for record in round_:
            journal.append(record, durable=False)
        written += len(round_)
        journal.append(
            TerminalRecord("completed", "", 3 * i + 3, 0.03 * (i + 1), "fix"), durable=False
        )
        i += 1
    journal.sync()
    journal.close()
    return path


# -- the model: a loopback server that streams at 200 tokens/s --------------------------------


def slow_server(tokens: int) -> Any:
    from keel.llm.messages import Message, Text, Usage
    from keel.testing.anthropic_server import AnthropicServer
    from keel.testing.script import Reply

    class Streaming(AnthropicServer):
        """Each text delta is one token, sent `TOKEN_INTERVAL` after the one before."""

        async def _reply(self, step: Any, request: Any, response: Any, streaming: bool) -> None:
            if not streaming:
                await super()._reply(step, request, response, streaming)
                return
            await response.start_stream(headers=self.stream_headers())
            for event in self.render_stream(step, request):
                if b'"text_delta"' not in event:
                    await response.chunk(event)
                    continue
                data = json.loads(event.decode().split("data: ", 1)[1])
                text = data["delta"]["text"]
                for start in range(0, len(text), len(TOKEN)):
                    data["delta"]["text"] = text[start : start + len(TOKEN)]
                    await response.chunk(self.sse("content_block_delta", data))
                    await asyncio.sleep(TOKEN_INTERVAL)
            await response.end_stream()

    text = "".join(TOKEN if n % 12 else "\n\n" for n in range(tokens))
    reply = Reply(Message("assistant", (Text(text),)), Usage(100, tokens))
    return Streaming([reply], api_key=KEY)


# -- one size, in its own process -------------------------------------------------------------


def rss_mb() -> float:
    with open("/proc/self/statm", encoding="utf-8") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(project: Path, tokens: int) -> dict[str, Any]:
    from textual import events
    from textual.screen import Screen

    from keel.cli.main import build_parser
    from keel.config.settings import load_settings
    from keel.session.index import latest_session
    from keel.tui.app import KeelApp
    from keel.tui.control import AgentFactory, Controller

    frames: list[tuple[float, float]] = []  # (start, end) of each screen update
    on_frame: list[Any] = []
    original = Screen._on_timer_update

    def timed_update(self: Screen[Any]) -> None:
        start = time.perf_counter()
        original(self)
        end = time.perf_counter()
        frames.append((start, end))
        for hook in on_frame:
            hook(end)

    Screen._on_timer_update = timed_update  # type: ignore[method-assign]

    args = build_parser().parse_args(["--continue", "--model", MODEL])
    started = time.perf_counter()
    controller = Controller(AgentFactory(args, cwd=project, settings=load_settings(project)))
    await controller.start_session(latest_session(project))
    replayed = time.perf_counter()
    app = KeelApp(controller)
    result: dict[str, Any] = {}

    def busy() -> bool:
        return controller.busy

    async with app.run_test(size=SIZE) as pilot:
        await app.idle()
        await pilot.pause()  # one frame: the layout and the screen of what is now drawn
        assert app.focused is app.prompt
        reopened = frames[-1][1]
        result["reopen_s"] = reopened - started
        result["replay_s"] = replayed - started
        result["widgets"] = len(list(app.transcript.query("*")))
        result["rss_mb"] = rss_mb()
        await pilot.pause()

        # A reply streams; a key every 150 ms.
        frames.clear()
        stream_start = time.perf_counter()
        latencies: list[float] = []
        expected = 0
        driver = app._driver
        assert driver is not None
        app.prompt.load_text("go")
        enter = events.Key("enter", "\r")
        enter.set_sender(app)
        driver.send_message(enter)  # not the pilot's press: that waits for the whole reply
        for _ in range(500):
            if busy():
                break
            await asyncio.sleep(0.01)
        while busy():
            await asyncio.sleep(0.15)
            if not busy():
                break
            expected += 1
            pressed = time.perf_counter()
            seen = asyncio.get_running_loop().create_future()

            def typed(end: float, count: int = expected, fut: Any = seen) -> None:
                if not fut.done() and app.prompt.text.count("x") >= count:
                    fut.set_result(end)

            on_frame.append(typed)
            key = events.Key("x", "x")
            key.set_sender(app)
            driver.send_message(key)
            try:
                latencies.append(await asyncio.wait_for(seen, 10) - pressed)
            except TimeoutError:
                latencies.append(float("nan"))
            on_frame.clear()
        streamed = [end - start for start, end in frames if start >= stream_start]
        await app.idle()
        result["stream_s"] = time.perf_counter() - stream_start
        result["keys"] = len(latencies)
        result["key_ms_median"] = 1000 * statistics.median(latencies) if latencies else None
        result["key_ms_p95"] = 1000 * percentile(latencies, 0.95) if latencies else None
        result["frames"] = len(streamed)
        result["frame_ms_median"] = 1000 * statistics.median(streamed) if streamed else None
        result["frame_ms_p95"] = 1000 * percentile(streamed, 0.95) if streamed else None
        result["widgets_after_stream"] = len(list(app.transcript.query("*")))
    await controller.close()
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return result


def child(messages: int, tokens: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-tui-") as tmp:
        root = Path(tmp)
        project = root / "project"
        project.mkdir()
        os.environ["KEEL_HOME"] = str(root / "home")
        os.environ["XDG_CONFIG_HOME"] = str(root / "config")
        os.environ["HOME"] = str(root)
        write_session(project, messages)
        with slow_server(tokens) as server:
            os.environ["ANTHROPIC_BASE_URL"] = server.url
            os.environ["ANTHROPIC_API_KEY"] = KEY
            result = asyncio.run(measure(project, tokens))
    return {"messages": -(-messages // ROUND) * ROUND, **result}


def run_size(messages: int, tokens: int, timeout: float) -> dict[str, Any]:
    """One size in a fresh process; a run past `timeout` seconds is a row that says so."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    try:
        out = subprocess.run(
            [sys.executable, __file__, "--child", str(messages), "--tokens", str(tokens)],
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return {"messages": -(-messages // ROUND) * ROUND, "timed_out_s": timeout}
    if out.returncode != 0:
        raise SystemExit(f"bench_tui: the {messages}-message run failed:\n{out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def editable_prompt(repeats: int) -> list[float]:
    """Seconds from starting `keel` in a tmux window (a fresh session in an empty project, the
    loopback server as its model) until the prompt shows what was typed at once: keys typed
    while keel starts are kept for the prompt, so this is process start → a prompt that takes
    keys, as the terminal shows it."""
    import shlex
    import shutil

    if shutil.which("tmux") is None:
        return []
    times = []
    for n in range(repeats):
        with tempfile.TemporaryDirectory(prefix="bench-tui-") as tmp, slow_server(1) as server:
            root = Path(tmp)
            (root / "project").mkdir()
            env = {
                "KEEL_HOME": str(root / "home"),
                "XDG_CONFIG_HOME": str(root / "config"),
                "HOME": str(root),
                "ANTHROPIC_BASE_URL": server.url,
                "ANTHROPIC_API_KEY": KEY,
                "PYTHONPATH": str(ROOT / "src"),
                "PATH": os.environ["PATH"],
                "TERM": "xterm-256color",
            }
            argv = [sys.executable, "-m", "keel", "--model", MODEL]
            command = shlex.join(["env", "-i", *(f"{k}={v}" for k, v in env.items()), *argv])
            tmux = ["tmux", "-L", f"bench-tui-{os.getpid()}-{n}"]
            start = time.perf_counter()
            subprocess.run(
                [*tmux, "new-session", "-d", "-x", "110", "-y", "36", "-c", str(root / "project"),
                 command],
                check=True,
            )  # fmt: skip
            subprocess.run([*tmux, "send-keys", "-l", "qzq"], check=True)
            try:
                while time.perf_counter() - start < 60:
                    screen = subprocess.run(
                        [*tmux, "capture-pane", "-p"], capture_output=True, text=True
                    ).stdout
                    # In the prompt's box (the terminal echoes keys before keel takes it).
                    if re.search(r"^\s*│\s*qzq", screen, re.MULTILINE):
                        times.append(time.perf_counter() - start)
                        break
                    time.sleep(0.02)
            finally:
                subprocess.run([*tmux, "kill-server"], capture_output=True)
    return times


def table(rows: list[dict[str, Any]]) -> Iterator[str]:
    def f(value: Any, digits: int = 1) -> str:
        return "–" if value is None else f"{value:.{digits}f}"

    yield (
        "| messages | reopen s | replay s | widgets | key median ms | key p95 ms | "
        "frame median ms | frame p95 ms | frames | RSS MB | peak RSS MB |"
    )
    yield "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    for r in rows:
        if "timed_out_s" in r:
            yield f"| {r['messages']:,} | > {r['timed_out_s']:.0f} (did not finish) |" + " |" * 9
            continue
        yield (
            f"| {r['messages']:,} | {f(r['reopen_s'], 2)} | {f(r['replay_s'], 2)} | "
            f"{r['widgets']:,} | {f(r['key_ms_median'])} | {f(r['key_ms_p95'])} | "
            f"{f(r['frame_ms_median'], 2)} | {f(r['frame_ms_p95'], 2)} | {r['frames']} | "
            f"{f(r['rss_mb'], 0)} | {f(r['peak_rss_mb'], 0)} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100,1000,5000", help="transcript sizes in messages")
    parser.add_argument("--tokens", type=int, default=1000, help="tokens of the streamed reply")
    parser.add_argument("--quick", action="store_true", help="50 and 200 messages, 150 tokens")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument(
        "--timeout", type=float, default=600, help="seconds one size may take (default 600)"
    )
    parser.add_argument(
        "--prompt",
        type=int,
        metavar="N",
        help="instead: N starts of `keel` in tmux, to a prompt that shows a typed key",
    )
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.child, args.tokens)))
        return
    if args.prompt:
        times = editable_prompt(args.prompt)
        print(json.dumps({"editable_prompt_s": times, "median": statistics.median(times)}))
        return
    sizes = [12, 60] if args.quick else [int(s) for s in args.sizes.split(",")]
    tokens = 100 if args.quick else args.tokens
    rows = []
    for n in sizes:
        rows.append(run_size(n, tokens, args.timeout))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    for line in table(rows):
        print(line)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
