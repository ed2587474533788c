"""`keel` without `-p`: the line mode (stdin not a terminal, or `--no-tui`) driven through the
real binary with a scripted model, the first-run help, `--continue`, and the pieces both front
ends share (answers to permission questions, "always allow" rules)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from keel.cli.interactive import FIRST_RUN
from keel.errors import UserError
from keel.permissions.gate import PermissionReply
from keel.session.index import latest_session
from keel.session.journal import read_records
from keel.session.records import ToolResultRecord, UndoRecord, UserRecord
from keel.tui.control import save_local_rule
from keel.tui.line import parse_answer
from tests.test_cli import keel

SCRIPT = """\
model: demo
turns:
  - thinking: I should write the notes file.
    text: I'll write the notes.
    tool_calls:
      - name: write
        input: {path: notes.md, content: "# Notes\\nhello\\n"}
  - text: "Wrote **notes.md**."
  - text: "Understood, the file is gone."
"""


def script(tmp_path: Path, text: str = SCRIPT) -> str:
    path = tmp_path / "script.yaml"
    path.write_text(text, encoding="utf-8")
    return f"scripted:{path}"


def prompts_sent(session: Path) -> list[str]:
    return [
        r.payload.message.text
        for r in read_records(session).records
        if isinstance(r.payload, UserRecord) and r.payload.source == "prompt"
    ]


def test_line_mode_edit_approve_undo_and_the_model_is_told(project: Path, tmp_path: Path) -> None:
    out = keel(
        "--model",
        script(tmp_path),
        cwd=project,
        stdin="write the notes\ny\n/undo\nok?\n/exit\n",
    )
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""
    lines = [line.rstrip() for line in out.stdout.splitlines()]
    expected = [
        "› write the notes",
        "✻ I should write the notes file.",
        "I'll write the notes.",
        "? Allow write notes.md  (change notes.md)",
        "    +# Notes",
        "    +hello",
        "  [y] yes  [s] yes, for this session  [a] always allow write  [n] no (n REASON: tell "
        "the model why)",
        "⏺ write notes.md",
    ]
    assert lines[: len(expected)] == expected
    rest = lines[len(expected) :]
    assert rest[0].startswith("  └ ✓ ")
    assert rest[0].endswith("Created notes.md (2 lines).")
    assert "Wrote **notes.md**." in rest
    assert "Put back the files changed by “write the notes”." in rest
    assert " • removed notes.md (the prompt created it)" in rest
    assert "› ok?" in rest
    assert rest[-2] == "Understood, the file is gone."
    assert not (project / "notes.md").exists()
    session = latest_session(project)
    undos = [r.payload for r in read_records(session).records if isinstance(r.payload, UndoRecord)]
    assert [(u.label, u.removed) for u in undos] == [
        ("write the notes", (str(project / "notes.md"),))
    ]
    assert prompts_sent(session)[1] == (
        "<system-note>\n" + undos[0].note + "\n</system-note>\n\nok?"
    )


def test_line_mode_deny_with_a_reason_the_model_sees(project: Path, tmp_path: Path) -> None:
    out = keel(
        "--no-tui",
        "--model",
        script(tmp_path),
        cwd=project,
        stdin="write the notes\nmaybe\nn put them in README.md instead\n",
    )
    assert out.returncode == 0, out.stderr
    assert "  answer y, s, a or n (n REASON)" in out.stdout  # "maybe" is not an answer
    assert not (project / "notes.md").exists()
    results = [
        r.payload.result
        for r in read_records(latest_session(project)).records
        if isinstance(r.payload, ToolResultRecord)
    ]
    assert len(results) == 1
    assert results[0].is_error
    assert "put them in README.md instead" in results[0].text


def test_bang_command_runs_and_its_output_goes_with_the_next_prompt(
    project: Path, tmp_path: Path
) -> None:
    out = keel(
        "--model",
        script(tmp_path, 'model: demo\nturns:\n  - text: "I see the listing."\n'),
        cwd=project,
        stdin="!ls\nwhat do you see?\n",
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[:5] == ["$ ls", "    README.md", "    app.py", "    util.py", lines[4]]
    assert lines[4].startswith("[exit 0, ")
    sent = prompts_sent(latest_session(project))
    assert sent == [
        "<system-note>\nThe user ran this shell command themselves (exit code 0):\n$ ls\n"
        "<output>\nREADME.md\napp.py\nutil.py\n</output>\n</system-note>\n\nwhat do you see?"
    ]


def test_continue_shows_the_session_as_it_was(project: Path, tmp_path: Path) -> None:
    model = script(tmp_path)
    first = keel("--model", model, cwd=project, stdin="write the notes\na\n")
    assert first.returncode == 0, first.stderr
    assert json.loads((project / ".keel" / "settings.local.json").read_text()) == {
        "permissions": {"allow": ["write"]}
    }
    again = keel("--continue", "--no-tui", cwd=project, stdin="/exit\n")
    assert again.returncode == 0, again.stderr
    lines = [line.rstrip() for line in again.stdout.splitlines()]
    assert lines[0] == "› write the notes"
    assert "✻ I should write the notes file." in lines
    assert "⏺ write notes.md" in lines
    assert "Wrote notes.md." in lines  # replayed as Markdown


def test_first_run_without_a_key_explains_and_exits_cleanly(project: Path) -> None:
    out = keel(cwd=project)
    assert out.returncode == 0
    assert out.stdout == ""
    assert out.stderr.startswith("keel needs a model to talk to, and found no API key")
    assert "export ANTHROPIC_API_KEY=" in out.stderr
    assert "export OPENAI_API_KEY=" in out.stderr
    assert "11434" in out.stderr  # Ollama
    assert "1234" in out.stderr  # LM Studio
    assert FIRST_RUN.splitlines()[0] in out.stderr


def test_a_local_server_without_a_model_is_one_line(project: Path) -> None:
    out = keel(cwd=project, env={"OPENAI_COMPATIBLE_BASE_URL": "http://127.0.0.1:9/v1"})
    assert out.returncode == 2
    assert out.stderr == (
        "keel: error: a local server is configured (http://127.0.0.1:9/v1) but no model (hint: "
        'name the model it serves: keel --model openai-compatible/NAME, or set "model" in '
        "settings)\n"
    )


@pytest.mark.parametrize(
    ("line", "plan", "reply"),
    [
        ("y", False, PermissionReply(True, "once")),
        ("s", False, PermissionReply(True, "session")),
        ("a", False, PermissionReply(True, "always")),
        ("n", False, PermissionReply(False, reason="")),
        ("n, use git mv", False, PermissionReply(False, reason="use git mv")),
        ("what?", False, None),
        ("a", True, PermissionReply(True, mode="accept-edits")),
        ("y", True, PermissionReply(True, mode="default")),
        ("n add tests first", True, PermissionReply(False, reason="add tests first")),
        ("s", True, None),
    ],
)
def test_typed_answers(line: str, plan: bool, reply: PermissionReply | None) -> None:
    assert parse_answer(line, plan=plan) == reply


def test_always_allow_keeps_other_settings_and_refuses_a_broken_file(tmp_path: Path) -> None:
    local = tmp_path / ".keel" / "settings.local.json"
    local.parent.mkdir()
    local.write_text('{"model": "openai/gpt-5", "permissions": {"allow": ["read"]}}')
    save_local_rule(tmp_path, "bash(git commit*)")
    save_local_rule(tmp_path, "bash(git commit*)")  # once only
    assert json.loads(local.read_text()) == {
        "model": "openai/gpt-5",
        "permissions": {"allow": ["read", "bash(git commit*)"]},
    }
    local.write_text("{not json")
    with pytest.raises(UserError, match="is not valid JSON"):
        save_local_rule(tmp_path, "write")
    assert local.read_text() == "{not json"
