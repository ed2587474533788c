"""`keel` as a user runs it: a real process, real files, exit codes and one-line errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from keel.session.journal import read_records
from tests.helpers import unsandboxed_line_dropped

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "src" / "keel" / "demo" / "demo.yaml"  # examples/demo.yaml links to it


def keel(
    *args: str,
    cwd: Path,
    stdin: str | None = "",
    env: dict[str, str] | None = None,
    timeout: float = 60,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "keel", *args],
        cwd=cwd,
        input=stdin,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=timeout,
    )


def write_script(path: Path, turns: list[dict[str, object]]) -> Path:
    path.write_text(json.dumps({"model": "test", "turns": turns}), encoding="utf-8")
    return path


def session_files(home: Path) -> list[Path]:
    """Every session file under `home`, by name (a name starts with its second of creation, so
    two made within one second come in either order: use `latest_session_file` or the id)."""
    return sorted(home.glob("sessions/*/*.jsonl"))


def latest_session_file(home: Path) -> Path:
    """The session written to last (as `keel --continue` picks it)."""
    return max(session_files(home), key=lambda p: p.stat().st_mtime_ns)


def test_version_is_cheap_and_plain(project: Path) -> None:
    out = keel("--version", cwd=project)
    assert out.returncode == 0
    assert out.stdout == "keel 0.1.0\n"
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from keel.cli.main import main; main(['--version']);"
            "heavy = [m for m in ('httpx', 'asyncio', 'yaml', 'rich', 'textual', 'anthropic', 'openai', "
            "'mcp', 'platformdirs') if m in sys.modules]; print(heavy)",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert probe.stdout.splitlines()[-1] == "[]"


def test_demo_runs_offline_and_journals(project: Path, isolated_env: Path) -> None:
    out = keel(
        "-p",
        "list the Python files here and count their lines",
        "--model",
        f"scripted:{DEMO}",
        cwd=project,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("Done. The glob above lists the Python files")
    calls = [line for line in out.stderr.splitlines() if line.startswith("⏺ ")]
    assert calls == [
        "⏺ glob **/*.py",
        "⏺ bash grep -c '' -r --include='*.py' --exclude-dir='.?*' --exclude-dir=node_modules . "
        "| head -n 25",
    ]
    (path,) = session_files(isolated_env)
    records = read_records(path).records
    assert [r.payload.type for r in records] == [
        "meta",
        "user",
        "assistant",
        "tool_result",
        "assistant",
        "process",  # the bash command's process group, for a resume after a crash
        "tool_result",
        "assistant",
        "terminal",
    ]
    bash_result = records[6].payload.result.text  # type: ignore[union-attr]
    counted, exit_line = bash_result.rsplit("\n", 1)  # grep -r lists in directory order
    assert (sorted(counted.splitlines()), exit_line) == (
        ["./app.py:5", "./util.py:1"],
        "[exit code 0]",
    )


def test_json_output_is_one_object(project: Path, tmp_path: Path) -> None:
    script = write_script(
        tmp_path / "s.json",
        [
            {
                "text": "Reading.",
                "tool_calls": [{"name": "read", "input": {"path": "util.py"}}],
                "usage": {"input": 1000, "output": 50},
            },
            {"text": "X is 1.", "usage": {"input": 1200, "output": 20, "cache_read": 900}},
        ],
    )
    out = keel(
        "-p", "what is X", "--model", f"scripted:{script}", "--output-format", "json", cwd=project
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data.pop("duration_ms") >= 0
    session_id = data.pop("session_id")
    assert data.pop("session_path").endswith(f"{session_id}.jsonl")
    assert data == {
        "type": "result",
        "result": "X is 1.",
        "stop_reason": "end_turn",
        "is_error": False,
        "error": None,
        "model": f"scripted:{script}",
        "turns": 2,
        "usage": {"input": 2200, "output": 70, "cache_read": 900, "cache_write": 0},
        "cache_read_share": 0.2903,
        "cost_usd": 0.0,
    }


def test_stream_json_is_one_event_per_line(project: Path, tmp_path: Path) -> None:
    script = write_script(
        tmp_path / "s.json",
        [
            {"tool_calls": [{"name": "glob", "input": {"pattern": "*.md"}}]},
            {"text": "One README."},
        ],
    )
    out = keel(
        "-p",
        "docs?",
        "--model",
        f"scripted:{script}",
        "--output-format",
        "stream-json",
        "--no-session",
        cwd=project,
    )
    assert out.returncode == 0, out.stderr
    events = [json.loads(line) for line in out.stdout.splitlines()]
    # Without bubblewrap a notice says so first; this test is about the events after it.
    events = [e for e in events if not e.get("text", "").startswith("no sandbox: ")]
    assert [e["type"] for e in events] == [
        "turn_started",
        "request",
        "tool_use_start",
        "tool_use_delta",
        "assistant",
        "usage",
        "tool_started",
        "tool_finished",
        "request",
        "text_delta",
        "assistant",
        "usage",
        "result",
    ]
    finished = events[7]
    assert finished["name"] == "glob"
    assert finished["output"] == "README.md"
    assert finished["is_error"] is False
    assert events[-1]["result"] == "One README."
    assert events[-1]["session_path"] is None


def test_prompt_from_stdin_and_from_both(project: Path, tmp_path: Path) -> None:
    script = write_script(
        tmp_path / "s.json",
        [
            {"text": "ok", "expect": {"last_user_contains": "summarise this\n\nline one"}},
        ],
    )
    out = keel(
        "-p", "summarise this", "--model", f"scripted:{script}", cwd=project, stdin="line one\n"
    )
    assert out.returncode == 0, out.stderr
    script = write_script(
        tmp_path / "t.json", [{"text": "ok", "expect": {"last_user_contains": "piped only"}}]
    )
    out = keel("-p", "--model", f"scripted:{script}", cwd=project, stdin="piped only")
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (
            ["-p", ""],
            {},
            'keel: error: the prompt is empty (hint: keel -p "what to do", or pipe it on stdin)',
        ),
        (
            ["-p", "hi", "--model", "anthropic/claude-sonnet-4-5"],
            {},
            "keel: error: ANTHROPIC_API_KEY is not set; anthropic needs an API key (hint: export "
            "ANTHROPIC_API_KEY=… , or try keel offline with --model scripted:demo)",
        ),
        (
            ["-p", "hi", "--model", "openai/gpt-5"],
            {},
            "keel: error: OPENAI_API_KEY is not set; openai needs an API key (hint: export "
            "OPENAI_API_KEY=… , or try keel offline with --model scripted:demo)",
        ),
        (
            ["-p", "hi"],
            {},
            "keel: error: no model chosen and no API key found (hint: set ANTHROPIC_API_KEY, "
            "OPENAI_API_KEY or GEMINI_API_KEY, pass --model provider/model, or try keel offline "
            "with --model "
            "scripted:demo)",
        ),
        (
            ["-p", "hi", "--model", "llama"],
            {},
            "keel: error: unknown model 'llama' (hint: write it as provider/model, e.g. "
            "anthropic/claude-sonnet-4-5 or openai/gpt-5)",
        ),
        (
            ["-p", "hi", "--model", "acme/x"],
            {},
            "keel: error: unknown provider 'acme' in model 'acme/x' (hint: known providers: anthropic, "
            "openai, gemini, openai-compatible, ollama, lmstudio, vllm, openrouter, groq, deepseek, "
            "xai, mistral, together, scripted; or define providers.acme with base_url and wire in "
            "settings)",
        ),
        (
            ["-p", "hi", "--model", "scripted:/nonexistent.yaml"],
            {},
            "keel: error: cannot read script /nonexistent.yaml: No such file or directory (hint: "
            "--model scripted:demo plays keel's packaged demo (demo, demo-subagents))",
        ),
        (
            ["-p", "hi", "--max-turns", "0", "--model", f"scripted:{DEMO}"],
            {},
            "keel: error: max turns must be at least 1",
        ),
        (
            ["-p", "hi", "--cwd", "/nonexistent"],
            {},
            "keel: error: --cwd /nonexistent: no such directory",
        ),
        (
            ["--frobnicate"],
            {},
            "keel: error: unrecognized arguments: --frobnicate (hint: run `keel --help` for usage)",
        ),
    ],
)
def test_bad_input_gets_one_line_and_exit_2(
    project: Path, args: list[str], env: dict[str, str], message: str
) -> None:
    out = keel(*args, cwd=project, env=env)
    assert out.returncode == 2
    assert out.stderr == message + "\n"
    assert out.stdout == ""


def test_bad_script_names_file_and_turn(project: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("turns:\n  - text: hi\n    colour: red\n", encoding="utf-8")
    out = keel("-p", "hi", "--model", f"scripted:{bad}", cwd=project)
    assert out.returncode == 2
    assert out.stderr.startswith(f"keel: error: {bad} turn 1: unknown key(s) colour")
    bad.write_text("turns: [\n", encoding="utf-8")
    out = keel("-p", "hi", "--model", f"scripted:{bad}", cwd=project)
    assert out.returncode == 2
    assert out.stderr.startswith(f"keel: error: {bad} is not valid YAML:")


def test_broken_settings_file_is_skipped_with_a_warning(project: Path, tmp_path: Path) -> None:
    (project / ".keel").mkdir()
    (project / ".keel" / "settings.json").write_text(
        '{\n  "model": "x",\n  oops\n}\n', encoding="utf-8"
    )
    out = keel("-p", "hi", "--model", f"scripted:{DEMO}", "--no-session", cwd=project)
    assert out.returncode == 0
    assert out.stderr.splitlines()[0] == (
        f"keel: warning: {project}/.keel/settings.json:3:3: invalid JSON "
        "(Expecting property name enclosed in double quotes); file skipped"
    )


def test_limits_have_their_own_exit_code(project: Path, tmp_path: Path) -> None:
    script = write_script(
        tmp_path / "s.json",
        [
            {"tool_calls": [{"name": "glob", "input": {"pattern": "*"}}]},
            {"tool_calls": [{"name": "glob", "input": {"pattern": "*"}}]},
        ],
    )
    out = keel(
        "-p",
        "loop",
        "--model",
        f"scripted:{script}",
        "--max-turns",
        "1",
        "--output-format",
        "json",
        cwd=project,
    )
    assert out.returncode == 3
    assert json.loads(out.stdout)["stop_reason"] == "max_turns"
    assert "keel: warning: stopped after 1 model turns (max_turns)" in out.stderr


def test_model_error_exits_1_with_the_error(project: Path, tmp_path: Path) -> None:
    script = write_script(
        tmp_path / "s.json",
        [{"fault": {"kind": "status", "status": 400, "message": "bad request: no"}}],
    )
    out = keel("-p", "x", "--model", f"scripted:{script}", cwd=project)
    assert out.returncode == 1
    assert unsandboxed_line_dropped(out.stderr) == "keel: error: bad request: no\n"


def start_keel(
    project: Path, script: Path, *extra: str, prompt: str = "go"
) -> subprocess.Popen[str]:
    """`keel -p PROMPT --model scripted:SCRIPT --output-format json …`, running in the background."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "keel",
            "-p",
            prompt,
            "--model",
            f"scripted:{script}",
            "--output-format",
            "json",
            *extra,
        ],
        cwd=project,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(path: Path) -> None:
    for _ in range(400):
        if path.exists():
            return
        time.sleep(0.025)
    raise AssertionError(f"{path} never appeared")


@pytest.mark.needs("sandbox")  # bash runs unasked only in the sandbox
def test_first_signal_suspends_after_the_tool_batch_in_flight(
    project: Path, tmp_path: Path, isolated_env: Path
) -> None:
    script = write_script(
        tmp_path / "s.json",
        [
            {
                "tool_calls": [
                    {
                        "name": "bash",
                        "input": {"command": "touch started; sleep 1; echo one >> log"},
                    },
                    {"name": "bash", "input": {"command": "echo two >> log"}},
                ]
            },
            {"text": "never reached before the resume"},
        ],
    )
    proc = start_keel(project, script)
    wait_for(project / "started")
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=20)
    assert proc.returncode == 6, stderr
    result = json.loads(stdout)
    assert result["stop_reason"] == "suspended"
    assert f"keel: suspended; resume with: keel resume {result['session_id']}" in stderr
    # Honoured at the loop boundary: the batch's second call still ran, no model call followed.
    assert (project / "log").read_text(encoding="utf-8") == "one\ntwo\n"
    (path,) = session_files(isolated_env)
    kinds = [r.payload.type for r in read_records(path).records if r.payload.type != "process"]
    assert kinds == ["meta", "user", "assistant", "tool_result", "tool_result", "terminal"]
    assert read_records(path).records[-1].payload.reason == "suspended"  # type: ignore[union-attr]


@pytest.mark.needs("sandbox")  # bash runs unasked only in the sandbox
def test_second_signal_aborts_and_records_interrupted(
    project: Path, tmp_path: Path, isolated_env: Path
) -> None:
    script = write_script(
        tmp_path / "s.json",
        [
            {"tool_calls": [{"name": "bash", "input": {"command": "touch started; sleep 30"}}]},
        ],
    )
    proc = start_keel(project, script)
    wait_for(project / "started")
    proc.send_signal(signal.SIGINT)
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    stdout, _stderr = proc.communicate(timeout=20)
    assert proc.returncode == 130
    assert json.loads(stdout)["stop_reason"] == "interrupted"
    (path,) = session_files(isolated_env)
    records = read_records(path).records
    assert records[-2].payload.result.text == "interrupted by user"  # type: ignore[union-attr]
    assert records[-1].payload.reason == "interrupted"  # type: ignore[union-attr]
