"""A new user's first run, through the real `keel` binary: the packaged demos from any directory
with or without bubblewrap, headless output a person can follow (tool calls and their results on
stderr, `--quiet` for the answer alone), and a reader that goes away (`keel -p … | head`) ending
the run quietly, recorded as stopped by its reader and resumable."""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from keel.cli.headless import Printer
from keel.llm.events import Notice
from keel.session.journal import read_records
from keel.session.records import TerminalRecord, ToolResultRecord
from tests.test_cli import keel, session_files, write_script

REPO = Path(__file__).resolve().parents[1]
PACKAGED = REPO / "src" / "keel" / "demo"
DEMO_PROMPT = "list the Python files here and count their lines"
DEMO_ANSWER = (
    "Done. The glob above lists the Python files here, and `grep -c ''` counted the lines of\n"
    "each (FILE:LINES). This was a scripted demo: for real work, set ANTHROPIC_API_KEY,\n"
    "OPENAI_API_KEY or GEMINI_API_KEY, or point keel at a local server.\n"
)
GREP = (
    "grep -c '' -r --include='*.py' --exclude-dir='.?*' --exclude-dir=node_modules . | head -n 25"
)


def without_bwrap(tmp_path: Path) -> dict[str, str]:
    """A PATH with every program of this machine's PATH but bubblewrap."""
    bin_dir = tmp_path / "bin-without-bwrap"
    bin_dir.mkdir()
    for folder in os.environ["PATH"].split(os.pathsep):
        if not os.path.isdir(folder):
            continue
        for name in os.listdir(folder):
            target = bin_dir / name
            if name != "bwrap" and not os.path.lexists(target):  # a dangling link counts too
                target.symlink_to(os.path.join(folder, name))
    return {"PATH": str(bin_dir)}


def tool_lines(stderr: str) -> list[str]:
    """stderr without the sandbox notice (said on a machine without bubblewrap), each result's
    duration written `Ts`."""
    return [
        re.sub(r"^  └ ([✓✗]) \d+(\.\d)?s", r"  └ \1 Ts", line)
        for line in stderr.splitlines()
        if "sandbox" not in line
    ]


@pytest.mark.parametrize("machine", ["as is", "without bubblewrap"])
def test_demo_runs_from_any_directory(
    machine: str, project: Path, isolated_env: Path, tmp_path: Path
) -> None:
    env = without_bwrap(tmp_path) if machine == "without bubblewrap" else {}
    if env:
        assert subprocess.run(["which", "bwrap"], env=env, capture_output=True).returncode != 0
    (project / "pkg").mkdir()
    (project / "pkg" / "mod.py").write_text("a = 1\nb = 2\n", encoding="utf-8")
    (project / ".venv").mkdir()  # hidden folders are not counted
    (project / ".venv" / "big.py").write_text("x\n" * 50, encoding="utf-8")
    out = keel("-p", DEMO_PROMPT, "--model", "scripted:demo", cwd=project, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout == DEMO_ANSWER
    # One line per call and one for its result, in line mode's format; nothing was denied.
    lines = tool_lines(out.stderr)
    first_count = lines[3].removeprefix("  └ ✓ Ts  ").split(" ")[0]  # directory order
    assert first_count in ("./app.py:5", "./pkg/mod.py:2", "./util.py:1")
    assert lines == [
        "⏺ glob **/*.py",
        "  └ ✓ Ts  app.py (+2 more lines)",
        f"⏺ bash {GREP}",
        f"  └ ✓ Ts  {first_count} (+3 more lines)",
    ]
    (path,) = session_files(isolated_env)
    results = [r.payload for r in read_records(path).records if r.payload.type == "tool_result"]
    assert isinstance(results[0], ToolResultRecord)
    assert isinstance(results[1], ToolResultRecord)
    assert results[0].result.text.splitlines() == ["app.py", "pkg/mod.py", "util.py"]
    counted, exit_line = results[1].result.text.rsplit("\n", 1)
    assert sorted(counted.splitlines()) == ["./app.py:5", "./pkg/mod.py:2", "./util.py:1"]
    assert exit_line == "[exit code 0]"
    end = read_records(path).records[-1].payload
    assert isinstance(end, TerminalRecord)
    assert end.reason == "completed"


def test_the_file_path_form_still_works(project: Path, tmp_path: Path) -> None:
    nested = project / "deep" / "er"
    nested.mkdir(parents=True)
    absolute = keel("-p", "x", "--model", f"scripted:{PACKAGED / 'demo.yaml'}", cwd=nested)
    assert (absolute.returncode, absolute.stdout) == (0, DEMO_ANSWER), absolute.stderr
    (tmp_path / "mine.yaml").write_text("turns:\n  - text: mine\n", encoding="utf-8")
    relative = keel("-p", "x", "--model", "scripted:../../../mine.yaml", cwd=nested)
    assert (relative.returncode, relative.stdout) == (0, "mine\n"), relative.stderr
    # The old path in the clone still plays the same demo.
    clone = keel("-p", "x", "--model", "scripted:examples/demo.yaml", cwd=REPO, stdin="")
    assert (clone.returncode, clone.stdout) == (0, DEMO_ANSWER), clone.stderr


def test_an_unknown_script_names_the_packaged_ones(project: Path) -> None:
    out = keel("-p", "x", "--model", "scripted:demoo", cwd=project)
    assert (out.returncode, out.stdout) == (2, "")
    assert out.stderr == (
        "keel: error: cannot read script demoo: No such file or directory (hint: --model "
        "scripted:demo plays keel's packaged demo (demo, demo-subagents))\n"
    )
    empty = keel("-p", "x", "--model", "scripted:", cwd=project)
    assert empty.stderr == (
        "keel: error: scripted: needs a script (hint: --model scripted:demo, or scripted:PATH)\n"
    )


def test_no_key_hint_suggests_the_packaged_demo(project: Path) -> None:
    out = keel("-p", "hi", cwd=project)
    assert out.returncode == 2
    assert out.stderr.endswith("or try keel offline with --model scripted:demo)\n"), out.stderr


def test_subagents_demo_offline(project: Path, isolated_env: Path) -> None:
    out = keel("-p", "survey this project", "--model", "scripted:demo-subagents", cwd=project)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("Done. Two explore subagents ran at the same time")
    lines = tool_lines(out.stderr)
    # The children's calls are marked ↳; each task's result follows its (repeated) call line.
    assert sorted(line for line in lines if "↳" in line) == [
        "  ↳ [explore] glob **/*.md",
        "  ↳ [explore] glob **/*.py",
    ]
    parents = [line for line in lines if "↳" not in line]
    assert parents[:2] == ["⏺ task find the Python files", "⏺ task find the Markdown files"]
    # The two run at once: each result is printed when it finishes, in either order.
    python_done = [
        "⏺ task find the Python files",
        "  └ ✓ Ts  The glob above lists the Python files.",
    ]
    markdown_done = [
        "⏺ task find the Markdown files",
        "  └ ✓ Ts  The glob above lists the Markdown files.",
    ]
    assert parents[2:] in (python_done + markdown_done, markdown_done + python_done), parents
    (parent,) = session_files(isolated_env)
    children = sorted(parent.with_name(f"{parent.stem}.agents").glob("*.jsonl"))
    assert len(children) == 2
    for child in children:
        records = read_records(child).records
        end = records[-1].payload
        assert isinstance(end, TerminalRecord)
        assert end.reason == "completed"
        found = [r.payload.result.text for r in records if isinstance(r.payload, ToolResultRecord)]
        assert found in (["app.py\nutil.py"], ["README.md"])


def test_quiet_prints_the_answer_alone(project: Path) -> None:
    loud = keel("-p", DEMO_PROMPT, "--model", "scripted:demo", cwd=project)
    quiet = keel("-p", DEMO_PROMPT, "--model", "scripted:demo", "-q", cwd=project)
    assert (quiet.returncode, quiet.stdout) == (0, loud.stdout)
    assert tool_lines(loud.stderr)
    # Only a warning may remain (a machine without a sandbox says so even then).
    assert all(line.startswith("keel: warning: ") for line in quiet.stderr.splitlines())
    assert tool_lines(quiet.stderr) == []


def test_a_failed_call_shows_why(project: Path, tmp_path: Path, isolated_env: Path) -> None:
    script = write_script(
        tmp_path / "s.json",
        [{"tool_calls": [{"name": "read", "input": {"path": "nope.py"}}]}, {"text": "ok"}],
    )
    out = keel("-p", "x", "--model", f"scripted:{script}", cwd=project)
    assert out.returncode == 0, out.stderr
    (path,) = session_files(isolated_env)
    (result,) = [r.payload for r in read_records(path).records if r.payload.type == "tool_result"]
    assert isinstance(result, ToolResultRecord)
    assert result.result.is_error
    first = result.result.text.splitlines()[0]
    assert tool_lines(out.stderr) == ["⏺ read nope.py", f"  └ ✗ Ts  {first}"]


# -- a reader that goes away -------------------------------------------------------------------


def sleeper(tmp_path: Path) -> Path:
    """A run that sits in a 30 s command (allowed by a rule, so it runs with or without a
    sandbox), then answers."""
    return write_script(
        tmp_path / "sleep.json",
        [
            {
                "text": "Waiting.",
                "tool_calls": [{"name": "bash", "input": {"command": "sleep 30"}}],
            },
            {"text": "finished"},
        ],
    )


def start(project: Path, script: Path, *extra: str) -> subprocess.Popen[bytes]:
    argv = ["-p", "wait", "--model", f"scripted:{script}", "--allowed-tools", "bash(sleep *)"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "keel", *argv, *extra],
        cwd=project,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    # Wait until the command runs: text mode says so on stderr, stream-json on stdout.
    stream = proc.stdout if "stream-json" in extra else proc.stderr
    assert stream is not None
    for raw in stream:
        line = raw.decode()
        if line.startswith("⏺ bash sleep 30") or '"type": "tool_started"' in line:
            return proc
    proc.kill()
    raise AssertionError(f"keel ended before running the command: {proc.wait()}")


def check_stopped_by_reader(proc: subprocess.Popen[bytes], began: float, home: Path) -> None:
    assert proc.wait(timeout=20) == 141
    assert time.monotonic() - began < 15  # not after the 30 s command
    assert proc.stderr is not None
    rest = proc.stderr.read().decode()
    proc.stderr.close()
    assert rest == "", rest  # quietly: no traceback, no "internal error", no notice
    (path,) = session_files(home)
    end = read_records(path).records[-1].payload
    assert end == TerminalRecord("interrupted", "output closed", turns=1, cost=0.0, prompt="wait")


def resume_finishes(project: Path, home: Path, script: Path) -> None:
    (path,) = session_files(home)
    out = keel("resume", path.stem, "--model", f"scripted:{script}", cwd=project)
    assert (out.returncode, out.stdout) == (0, "finished\n"), out.stderr
    end = read_records(path).records[-1].payload
    assert isinstance(end, TerminalRecord)
    assert end.reason == "completed"


def test_closed_stdout_stops_the_run_quietly(
    project: Path, isolated_env: Path, tmp_path: Path
) -> None:
    """Text mode writes the answer only at the end; the reader's going is noticed at once."""
    script = sleeper(tmp_path)
    proc = start(project, script)
    began = time.monotonic()
    assert proc.stdout is not None
    proc.stdout.close()  # the reader goes away while the command runs
    check_stopped_by_reader(proc, began, isolated_env)
    resume_finishes(project, isolated_env, script)


def test_keel_piped_into_head(project: Path, isolated_env: Path, tmp_path: Path) -> None:
    """`keel -p … --output-format stream-json | head -c 1` through a real shell pipeline."""
    script = sleeper(tmp_path)
    began = time.monotonic()
    out = subprocess.run(
        [
            "bash",
            "-c",
            f'{sys.executable} -m keel -p wait --model "scripted:{script}" '
            '--allowed-tools "bash(sleep *)" --output-format stream-json | head -c 1; '
            'echo " ${PIPESTATUS[0]}"',
        ],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.stdout == "{ 141\n"
    assert out.stderr == ""
    assert time.monotonic() - began < 15
    (path,) = session_files(isolated_env)
    end = read_records(path).records[-1].payload
    assert isinstance(end, TerminalRecord)
    assert (end.reason, end.message) == ("interrupted", "output closed")
    # No resume here: head usually leaves before the command starts, and a resume would then
    # run the whole 30 s command; resuming after "output closed" is the test above.


def test_sigpipe_stops_the_run_as_its_reader_leaving(
    project: Path, isolated_env: Path, tmp_path: Path
) -> None:
    script = sleeper(tmp_path)
    proc = start(project, script, "--output-format", "stream-json")
    began = time.monotonic()
    proc.send_signal(signal.SIGPIPE)
    check_stopped_by_reader(proc, began, isolated_env)
    assert proc.stdout is not None
    after = proc.stdout.read()  # what came after the tool_started event `start` read
    proc.stdout.close()
    assert after == b""  # it stopped writing when told its reader left: no result object


def test_printer_write_to_a_closed_pipe(tmp_path: Path) -> None:
    """The write path itself: a real pipe whose reader closed; no exception, the stream now
    points at /dev/null, and the run is told once."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    with open(write_end, "w", encoding="utf-8") as out:
        told: list[str] = []
        printer = Printer("stream-json", quiet=False, out=out, err=io.StringIO())
        printer.on_closed = lambda: told.append("closed")
        printer(Notice("one", "info"))
        printer(Notice("two", "info"))
        assert (printer.closed, told) == (True, ["closed"])
        os.write(write_end, b"more")  # would raise BrokenPipeError without the /dev/null


def test_a_reader_gone_before_the_run_starts(project: Path, isolated_env: Path) -> None:
    """stderr's reader is gone from the start (and a notice may fail on it while the run is set
    up): nothing runs to completion, and keel ends with 141 without a traceback."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        out = subprocess.run(
            [sys.executable, "-m", "keel", "-p", DEMO_PROMPT, "--model", "scripted:demo"],
            cwd=project,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=write_end,
            env={**os.environ, "KEEL_NO_SANDBOX": "1"},  # a notice at set-up
            timeout=60,
        )
    finally:
        os.close(write_end)
    assert (out.returncode, out.stdout) == (141, b"")
    for path in session_files(isolated_env):
        end = read_records(path).records[-1].payload
        assert not (isinstance(end, TerminalRecord) and end.reason == "completed")
