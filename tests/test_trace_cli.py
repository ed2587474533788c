"""`keel trace`: stats from trace records, and the command (stats, --atif, --html, the viewer,
a session without a trace) run as a user runs it, against sessions `keel -p` really wrote."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from keel.cli.main import main
from keel.session.store import sessions_dir
from keel.trace.stats import compute, percentile, render, to_json
from tests.test_trace_atif import Trajectory
from tests.trace_records import (
    REPLY1,
    REPLY3,
    TOOLS,
    records,
    result,
    user,
    write_trace,
)


def keel(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "keel", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=120,
    )


def _chars(messages: list[dict[str, Any]]) -> int:
    """The documented estimate's prompt size: system + tools JSON + messages JSON."""
    return len("You are keel.") + len(json.dumps(TOOLS)) + len(json.dumps(messages))


def expected_tools() -> dict[str, dict[str, Any]]:
    """Cost attribution of the sample, from the definition in keel.trace.stats' docstring."""
    turn3 = [user("Fix the bug"), REPLY1, {"v": 1, "role": "user", "content": [
        result("t1", "print('hi')\n" * 100), result("t2", "Found app.py.")]}]  # fmt: skip
    turn4 = [*turn3, REPLY3, {"v": 1, "role": "user", "content": [
        result("t3", "denied by the user", error=True)]}]  # fmt: skip
    per3 = _chars(turn3) / 3500  # characters per token of the request that first carried them
    per4 = _chars(turn4) / 3550
    read_tokens, task_tokens = math.ceil(1200 / per3), math.ceil(13 / per3)
    bash_tokens = math.ceil(18 / per4)
    # read and task: carried by requests 3 (fresh: input price), 4 (a cache read) and 5 (the
    # compaction, which read nothing from the cache: input price); request 6 reset them away.
    # bash: requests 4 (fresh) and 5. Sonnet 4.5: $3/M input, $0.30/M cache read.
    three = (3.0 + 0.3 + 3.0) / 1e6
    rows = {
        "read": (read_tokens, 3, read_tokens * three),
        "bash": (bash_tokens, 2, bash_tokens * 6.0 / 1e6),
        "task": (task_tokens, 3, task_tokens * three),
    }
    return {
        name: {"calls": 1, "result_tokens": t, "carried": c, "attributed_cost_usd": round(x, 6)}
        for name, (t, c, x) in sorted(rows.items(), key=lambda kv: (-kv[1][2], kv[0]))
    }


def test_percentile_interpolates() -> None:
    assert percentile([], 50) is None
    assert percentile([200, 250, 300, 300, 400, 500], 50) == 300
    assert percentile([200, 250, 300, 300, 400, 500], 95) == pytest.approx(475)
    assert percentile([7.0], 95) == 7.0


def test_stats_of_the_sample_whole() -> None:
    assert to_json(compute(records())) == {
        "session_id": "20251201-120000-abc123",
        "requests": {
            "total": 6,
            "by_purpose": {"compaction": 1, "turn": 5},
            "by_agent": {"explore-1": 1, "main": 5},
        },
        "ttft_ms": {"p50": 300.0, "p95": 475.0},
        # 215 output tokens over 3.95 s of generating; the median of the six requests' speeds
        "output_tokens_per_s": {"overall": 54.4, "p50": 34.0},
        "tokens": {
            "input": 5770,
            "output": 215,
            "cache_read": 6400,
            "cache_write": 2500,
            "cache_read_share": 0.4363,
        },
        # turn 1: 8.1 s of wall time; requests, tools and the 2 s permission wait cover 7.3 s
        # (the subagent's request runs inside its task call); turn 2: 2.5 s, 2 s of requests
        "turns": [
            {"wall_s": 8.1, "busy_s": 7.3, "overhead_s": 0.8},
            {"wall_s": 2.5, "busy_s": 2.0, "overhead_s": 0.5},
        ],
        "harness_overhead_s": {"per_turn_mean": 0.65, "per_turn_p50": 0.65, "total": 1.3},
        "cost_usd": {
            "total": 0.03063,
            "by_model": {
                "anthropic/claude-haiku-4-5": 0.0006,
                "anthropic/claude-sonnet-4-5": 0.03003,
            },
            "by_agent": {"explore-1": 0.0006, "main": 0.03003},
        },
        "tools": expected_tools(),
        "retries": 1,
        "http_errors": 1,
        "tool_errors": 1,
        "errors": ["hook ./audit.sh timed out"],
    }


def expected_text() -> str:
    tools = expected_tools()
    rows = "".join(
        f"{name:<18}{t['calls']:>6}{t['result_tokens']:>15,}{t['carried']:>9}"
        f"{'$' + format(t['attributed_cost_usd'], '.4f'):>12}\n"
        for name, t in tools.items()
    )
    return (
        "session 20251201-120000-abc123\n"
        "requests                  6 (compaction 1, turn 5)\n"
        "  by agent                explore-1 1, main 5\n"
        "time to first token       p50 300 ms, p95 475 ms\n"
        "output speed              54.4 tokens/s\n"
        "tokens                    input 5,770, output 215, cache read 6,400, cache write 2,500\n"
        "cache-read share          43.6%\n"
        "harness overhead          650 ms per turn (mean of 2), p50 650 ms\n"
        "cost                      $0.0306\n"
        "  anthropic/claude-haiku-4-5 $0.0006\n"
        "  anthropic/claude-sonnet-4-5 $0.0300\n"
        "cost by agent\n"
        "  explore-1               $0.0006\n"
        "  main                    $0.0300\n"
        "tool               calls  result tokens  carried        cost\n"
        f"{rows}"
        "retries                   1\n"
        "errors                    1 (tool errors 1, http errors 1)\n"
        "  hook ./audit.sh timed out\n"
    )


def test_stats_text_whole() -> None:
    assert render(compute(records())) == expected_text()


def test_a_torn_last_line_is_left_out(tmp_path: Path) -> None:
    from keel.trace.stats import load_records

    directory = write_trace(tmp_path / "x.trace")
    with (directory / "events.jsonl").open("a", encoding="utf-8") as f:
        f.write('{"seq": 99, "kind": "resp')
    assert load_records(directory) == records()


# -- the command, on real sessions -----------------------------------------------------------


@pytest.fixture
def session(project: Path) -> Path:
    """A session `keel -p` wrote (scripted, offline), with the sample trace beside it."""
    run = keel("-p", "--model", "scripted:demo", "hello", cwd=project)
    assert run.returncode == 0, run.stderr
    (path,) = sessions_dir(project).glob("*.jsonl")
    write_trace(path.with_name(f"{path.stem}.trace"))
    return path


def test_stats_command_prints_the_table(session: Path, project: Path) -> None:
    run = keel("trace", "stats", session.stem[:17], cwd=project)
    assert (run.returncode, run.stderr) == (0, "")
    assert run.stdout == expected_text()
    run = keel("trace", "stats", "--json", cwd=project)  # the latest session by default
    assert run.returncode == 0
    assert json.loads(run.stdout) == to_json(compute(records()))


def test_a_session_without_a_trace_is_one_line_with_the_hint(project: Path) -> None:
    run = keel("-p", "--model", "scripted:demo", "hello", cwd=project)
    assert run.returncode == 0
    (path,) = sessions_dir(project).glob("*.jsonl")
    for args in (["trace", "stats", path.stem], ["trace", "--atif", path.stem], ["trace"]):
        run = keel(*args, cwd=project)
        assert (run.returncode, run.stdout) == (2, ""), args
        assert run.stderr == (
            f"keel: error: session {path.stem} has no trace (hint: traces are recorded with "
            "debug mode on: run `keel -p --debug …`, type `/debug on` in the TUI, or set "
            "KEEL_DEBUG=1)\n"
        )


def test_unknown_session_and_bad_flags_are_usage_errors(session: Path, project: Path) -> None:
    run = keel("trace", "stats", "nosuchsession", cwd=project)
    assert run.returncode == 2
    assert run.stderr.startswith("keel: error: no session 'nosuchsession'")
    run = keel("trace", "--html", session.stem, cwd=project)
    assert (run.returncode, run.stderr) == (
        2,
        "keel: error: --html needs -o FILE (hint: run `keel --help` for usage)\n",
    )


def test_atif_to_stdout_and_to_files(session: Path, project: Path, tmp_path: Path) -> None:
    from keel.trace.atif import to_atif

    run = keel("trace", "--atif", session.stem, cwd=project)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == to_atif(records())
    latest = keel("trace", "--atif", cwd=project)  # the project's latest session
    assert (latest.returncode, latest.stdout) == (0, run.stdout)
    out = tmp_path / "run.json"
    run = keel("trace", "--atif", session.stem, "-o", str(out), cwd=project)
    assert (run.returncode, run.stdout) == (0, "")
    assert run.stderr == f"wrote {out} and 1 subagent trajectories beside it\n"
    main_t = json.loads(out.read_text(encoding="utf-8"))
    sub_t = json.loads((tmp_path / "run.explore-1.json").read_text(encoding="utf-8"))
    assert main_t == to_atif(records(), subagent_paths={"t2": "run.explore-1.json"})
    assert sub_t == to_atif(records(), subagent="t2")
    for t in (main_t, sub_t):
        Trajectory.model_validate(t)
    assert {oct(p.stat().st_mode & 0o777) for p in tmp_path.glob("run*.json")} == {"0o600"}


def test_html_writes_the_viewers_page(session: Path, project: Path, tmp_path: Path) -> None:
    out = tmp_path / "page.html"
    run = keel("trace", "--html", session.stem, "-o", str(out), cwd=project)
    assert (run.returncode, run.stdout, run.stderr) == (0, "", f"wrote {out}\n")
    page = out.read_text(encoding="utf-8")
    assert page.lstrip().lower().startswith("<!doctype html")
    assert "20251201-120000-abc123" in page  # the records are inlined


def test_the_viewer_is_served_for_the_session(
    session: Path, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from keel.trace import viewer

    calls: list[tuple[Path, bool, int]] = []

    def serve(directory: Path, *, open_browser: bool, port: int = 0) -> None:
        calls.append((directory, open_browser, port))

    monkeypatch.setattr(viewer, "serve", serve)
    monkeypatch.chdir(project)
    trace_dir = session.with_name(f"{session.stem}.trace")
    assert main(["trace", "--no-open", "--port", "8123"]) == 0
    assert main(["trace", session.stem[:18]]) == 0
    assert calls == [(trace_dir, False, 8123), (trace_dir, True, 0)]
    assert main(["trace", "--port", "70000"]) == 2


def test_a_real_debug_session_end_to_end(project: Path) -> None:
    """`keel -p --debug` (the tracer's real records) → stats and a valid ATIF trajectory."""
    run = keel("-p", "--debug", "--model", "scripted:demo", "hello", cwd=project)
    assert run.returncode == 0, run.stderr
    (path,) = sessions_dir(project).glob("*.jsonl")
    stats = keel("trace", "stats", "--json", path.stem, cwd=project)
    assert stats.returncode == 0, stats.stderr
    numbers = json.loads(stats.stdout)
    assert numbers["session_id"] == path.stem
    assert numbers["requests"] == {"total": 3, "by_purpose": {"turn": 3}, "by_agent": {"main": 3}}
    assert [set(t) for t in numbers["turns"]] == [{"wall_s", "busy_s", "overhead_s"}]
    assert numbers["tools"].keys() == {"glob", "bash"}
    assert numbers["errors"] == []
    assert numbers["retries"] == 0
    atif = keel("trace", "--atif", path.stem, cwd=project)
    assert atif.returncode == 0, atif.stderr
    trajectory = Trajectory.model_validate(json.loads(atif.stdout))
    assert [s.source for s in trajectory.steps] == ["system", "user", "agent", "agent", "agent"]
    assert [c.function_name for s in trajectory.steps for c in s.tool_calls or ()] == [
        "glob",
        "bash",
    ]
    assert trajectory.session_id == path.stem


def test_version_imports_none_of_it(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "keel", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert run.returncode == 0
    modules = set(re.findall(r"\|\s+([\w.]+)\s*$", run.stderr, re.M))
    assert "keel.cli.main" in modules  # the parse found the table
    assert not {
        m for m in modules if m.startswith(("keel.cli.trace", "keel.trace", "opentelemetry"))
    }


# -- a real recorded session (the viewer's: a 529 retry, two `explore` subagents side by side, a
# refused write, keel compact, a forced resume) through stats, ATIF and OpenTelemetry ----------


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    from keel.trace import read
    from tests.trace_fixture import record_session

    return read(record_session(tmp_path_factory.mktemp("recorded")))


def test_recorded_session_stats(recorded: list[dict[str, Any]]) -> None:
    numbers = to_json(compute(recorded))
    # The main agent's: the first prompt's three, the compaction, the resumed prompt's one (the
    # summary goes with it: it is not a prompt of its own).
    assert numbers["requests"] == {
        "total": 7,
        "by_purpose": {"compaction": 1, "turn": 6},
        "by_agent": {"explore": 2, "main": 5},
    }
    assert numbers["retries"] == 1  # the 529
    assert numbers["http_errors"] == 1
    assert numbers["tools"].keys() == {"task", "write"}
    assert numbers["tools"]["task"]["calls"] == 2
    assert len(numbers["turns"]) == 2  # the main agent's two prompts; the subagents' are inside
    assert all(t["overhead_s"] >= 0 and t["busy_s"] <= t["wall_s"] for t in numbers["turns"])
    costs = numbers["cost_usd"]
    assert round(sum(costs["by_agent"].values()), 6) == costs["total"]
    assert round(sum(costs["by_model"].values()), 6) == costs["total"]


def test_recorded_session_atif(recorded: list[dict[str, Any]]) -> None:
    from keel.trace.atif import Subagent, subagents, to_atif

    children = subagents(recorded)
    # The `task` calls' ids come from the script's counter, which other tests in the same
    # process have moved on: take them from the main agent's own tool records.
    tasks = [
        r["data"]["id"]
        for r in recorded
        if r["kind"] == "tool_start" and r["data"]["name"] == "task" and not r.get("agent")
    ]
    assert len(tasks) == 2
    assert children == [
        Subagent("explore", tasks[0], "explore-1"),
        Subagent("explore", tasks[1], "explore-2"),
    ]
    main_t = to_atif(recorded, subagent_paths={c.call_id: f"{c.name}.json" for c in children})
    Trajectory.model_validate(main_t)
    # The prompts as sent: the context that opened the first one is not the user's.
    assert [s["message"] for s in main_t["steps"] if s["source"] == "user"] == [
        "find the flaky tests and fix them",
        "now make that change",
    ]
    refs = [
        ref
        for step in main_t["steps"]
        for r in step.get("observation", {}).get("results", [])
        for ref in r.get("subagent_trajectory_ref", [])
    ]
    sid = main_t["session_id"]
    assert refs == [
        {"session_id": f"{sid}:explore-1", "trajectory_path": "explore-1.json",
         "extra": {"agent": "explore"}},
        {"session_id": f"{sid}:explore-2", "trajectory_path": "explore-2.json",
         "extra": {"agent": "explore"}},
    ]  # fmt: skip
    prompts = []
    for child in children:
        sub = to_atif(recorded, subagent=child.call_id)
        Trajectory.model_validate(sub)
        assert sub["session_id"] == f"{sid}:{child.name}"
        assert sub["extra"]["parent_tool_call_id"] == child.call_id
        assert [s["source"] for s in sub["steps"]] == ["system", "user", "agent"]
        prompts.append(sub["steps"][1]["message"])
    assert prompts == ["grep tests/ for time.sleep", "glob tests/*.py and count"]
    with pytest.raises(ValueError, match="no subagent"):
        to_atif(recorded, subagent="toolu_nope")


def test_recorded_session_otel(recorded: list[dict[str, Any]]) -> None:
    from tests.test_trace_otel import Receiver, attrs, export

    receiver = Receiver()
    try:
        export(receiver, recorded)
        spans = receiver.spans()
    finally:
        receiver.close()
    tasks = [s for s in spans if s.name == "execute_tool task"]
    subs = [s for s in spans if s.name == "invoke_agent explore"]
    assert len(tasks) == 2
    assert len(subs) == 2
    # each subagent under the task call that started it, its request under it
    assert sorted(s.parent_span_id for s in subs) == sorted(t.span_id for t in tasks)
    for sub in subs:
        (chat,) = [s for s in spans if s.parent_span_id == sub.span_id]
        assert chat.name.startswith("chat ")
    (write,) = [s for s in spans if s.name == "execute_tool write"]  # refused before it ran
    assert write.status.code == 2
    assert attrs(write)["error.type"] == "tool_error"
    assert write.end_time_unix_nano >= write.start_time_unix_nano


def test_a_trace_with_no_prompt_yet(project: Path) -> None:
    run = keel("-p", "--model", "scripted:demo", "hello", cwd=project)
    assert run.returncode == 0
    (path,) = sessions_dir(project).glob("*.jsonl")
    write_trace(path.with_name(f"{path.stem}.trace"), records()[:1])  # just the session record
    atif = keel("trace", "--atif", cwd=project)
    assert (atif.returncode, atif.stdout) == (2, "")
    assert atif.stderr == (
        f"keel: error: cannot export {path.stem}.trace: the trace holds no prompt or model "
        "request yet (ATIF needs a step) (hint: run a prompt first)\n"
    )
    stats = keel("trace", "stats", cwd=project)
    assert stats.returncode == 0
    assert stats.stdout == (
        "session 20251201-120000-abc123\n"
        "requests                  0\n"
        "time to first token       p50 -, p95 -\n"
        "output speed              -\n"
        "tokens                    input 0, output 0, cache read 0, cache write 0\n"
        "cache-read share          -\n"
        "harness overhead          -\n"
        "cost                      $0.0000\n"
        "retries                   0\n"
        "errors                    0 (tool errors 0, http errors 0)\n"
    )
