"""`keel` without `-p`: the line mode (stdin not a terminal, or `--no-tui`) driven through the
real binary with a scripted model, the first-run help, `--continue`, and the pieces both front
ends share (answers to permission questions, "always allow" rules)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from keel.agent.events import AssistantMessage, ContextCompacted
from keel.agent.prompt import context_text
from keel.cli.interactive import FIRST_RUN
from keel.errors import UserError
from keel.hooks import claude
from keel.llm.events import Notice
from keel.llm.messages import Text
from keel.permissions.gate import PermissionReply, PermissionRequest
from keel.session.index import latest_session
from keel.session.journal import read_records
from keel.session.records import ToolResultRecord, UndoRecord, UserRecord
from keel.testing import ScriptedProvider, reply
from keel.testing.ollama_server import OllamaServer
from keel.tui.control import save_local_rule
from keel.tui.line import parse_answer
from keel.tui.view import Output, PromptSubmitted
from tests.helpers import unsandboxed_line_dropped
from tests.test_cli import keel
from tests.tui_helpers import MODEL, Recorder, make_controller

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
    """The prompts journaled, without the context block that opens the first one (its own text
    block, checked here: the first prompt has it, no other does)."""
    blocks = [
        [b.text for b in r.payload.message.blocks if isinstance(b, Text)]
        for r in read_records(session).records
        if isinstance(r.payload, UserRecord) and r.payload.source == "prompt"
    ]
    opens = [
        texts[0].startswith("<context>\n") and texts[0].endswith("\n</context>") for texts in blocks
    ]
    assert opens == [len(texts) == 2 for texts in blocks[:1]] + [False] * (len(blocks) - 1)
    return ["".join(texts[1:] if i == 0 else texts) for i, texts in enumerate(blocks)]


def test_line_mode_edit_approve_undo_and_the_model_is_told(project: Path, tmp_path: Path) -> None:
    out = keel(
        "--model",
        script(tmp_path),
        cwd=project,
        stdin="write the notes\ny\n/undo\nok?\n/exit\n",
    )
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""
    lines = [line.rstrip() for line in unsandboxed_line_dropped(out.stdout).splitlines()]
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
    assert rest[-3] == "Understood, the file is gone."
    assert not (project / "notes.md").exists()
    session = latest_session(project)
    # After the footer, how to come back to this session.
    assert rest[-1] == f"To resume this session: keel --continue (or keel --resume {session.stem})"
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
    lines = unsandboxed_line_dropped(out.stdout).splitlines()
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
    assert "export GEMINI_API_KEY=" in out.stderr
    assert "11434" in out.stderr  # Ollama
    assert "1234" in out.stderr  # LM Studio
    assert FIRST_RUN.splitlines()[0] in out.stderr


@pytest.mark.parametrize(
    ("variable", "url", "provider"),
    [
        ("OPENAI_COMPATIBLE_BASE_URL", "http://127.0.0.1:9/v1", "openai-compatible"),
        ("OLLAMA_HOST", "http://127.0.0.1:9", "ollama"),
    ],
)
def test_a_local_server_without_a_model_is_one_line(
    project: Path, variable: str, url: str, provider: str
) -> None:
    out = keel(cwd=project, env={variable: url})
    assert out.returncode == 2
    assert out.stderr == (
        f"keel: error: a local server is configured ({variable}={url}) but no model (hint: "
        f'name the model it serves: keel --model {provider}/NAME, or set "model" in '
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


# -- the controller behind both front ends ----------------------------------------------------


@pytest.fixture
def with_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")


def hooks_file(project: Path, log: Path) -> None:
    """SessionStart and Notification hooks that append what they get to `log`."""
    record = f"cat >> {log}; echo >> {log}"
    entry = [{"matcher": "", "hooks": [{"type": "command", "command": record}]}]
    # The user's own settings: a project file's hooks would wait for approval.
    path = Path(os.environ["KEEL_CONFIG_DIR"]) / "settings.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"hooks": {"SessionStart": entry, "Notification": entry}}))


def hook_events(log: Path) -> list[tuple[str, str]]:
    out = []
    for line in log.read_text(encoding="utf-8").splitlines():
        if line.strip():
            d = json.loads(line)
            out.append((d["hook_event_name"], d.get("source") or d.get("message", "")))
    return out


async def test_clear_starts_a_fresh_context_with_session_start_clear(
    project: Path, with_key: None
) -> None:
    log = project.parent / "hooks.log"
    hooks_file(project, log)
    provider = ScriptedProvider([reply("One."), reply("Two.")], model=MODEL.model)
    recorder = Recorder()
    controller = await make_controller(project, provider, "--mode", "accept-edits")
    controller.attach(recorder)
    controller.submit("first")
    await controller.wait()
    first_session = controller.agent.session_id
    controller.submit("/clear")
    await controller.wait()
    assert [type(e).__name__ for e in recorder.events] == ["Notice"]  # the transcript restarts
    assert controller.status().mode == "accept-edits"  # the mode carries over
    controller.submit("second")
    await controller.wait()
    assert controller.agent.session_id != first_session
    assert [m.role for m in provider.requests[1].messages] == ["user"]  # a fresh context
    assert hook_events(log) == [("SessionStart", "startup"), ("SessionStart", "clear")]
    await controller.close()


async def test_the_notification_hook_fires_before_a_permission_question(
    project: Path, with_key: None
) -> None:
    log = project.parent / "hooks.log"
    hooks_file(project, log)
    provider = ScriptedProvider(
        [reply("", ("write", {"path": "a.md", "content": "a\n"})), reply("Done.")],
        model=MODEL.model,
    )
    seen: list[list[tuple[str, str]]] = []

    class Asking(Recorder):
        async def ask(self, request: PermissionRequest) -> PermissionReply:
            await asyncio.sleep(0.3)  # the hook runs beside the question, not after it
            seen.append(hook_events(log))
            return await super().ask(request)

    recorder = Asking(answers=[PermissionReply(True, "once")])
    controller = await make_controller(project, provider)
    controller.attach(recorder)
    controller.submit("write a")
    await controller.wait()
    assert [r.call.name for r in recorder.asked] == ["write"]
    assert seen[0][-1][0] == "Notification"
    assert seen[0][-1][1] == "keel needs your permission to change a.md"
    await controller.close()


async def test_notification_hooks_hear_idle_prompt_once_the_user_keeps_them_waiting(
    project: Path, with_key: None
) -> None:
    log = project.parent / "hooks.log"
    hooks_file(project, log)
    provider = ScriptedProvider([reply("One."), reply("Two.")], model=MODEL.model)
    controller = await make_controller(project, provider)
    controller.attach(Recorder())
    controller.idle_after = 0.2
    controller.submit("first")
    await controller.wait()
    controller.submit("second")  # answered in time: no notification for the first wait
    await controller.wait()
    await asyncio.sleep(0.4)
    await controller.wait()
    assert hook_events(log) == [
        ("SessionStart", "startup"),
        ("Notification", "keel is waiting for your input"),
    ]
    last = json.loads(log.read_text(encoding="utf-8").strip().splitlines()[-1])
    assert last["notification_type"] == "idle_prompt"
    await controller.close()


async def test_model_picker_switches_the_model_for_the_next_request(
    project: Path, with_key: None
) -> None:
    provider = ScriptedProvider([reply("From haiku.")], model=MODEL.model)
    recorder = Recorder(picks=["anthropic/claude-haiku-4-5"])
    controller = await make_controller(project, provider)
    controller.attach(recorder)
    controller.submit("/model")
    await controller.wait()
    title, choices = recorder.offered[0]
    assert title == "Model"
    assert choices[0].value == "anthropic/claude-sonnet-4-5"
    assert choices[0].detail == "(now)"
    assert "anthropic/claude-haiku-4-5" in [c.value for c in choices]
    assert controller.status().model == "anthropic/claude-haiku-4-5"
    controller.submit("hi")
    await controller.wait()
    assert provider.requests[0].model == "claude-haiku-4-5"
    controller.submit("/model llama")
    await controller.wait()
    errors = [e for e in recorder.events if isinstance(e, Output) and e.kind == "error"]
    assert errors[-1].text.startswith("unknown model 'llama' (hint: write it as provider/model")
    assert controller.status().model == "anthropic/claude-haiku-4-5"  # unchanged
    await controller.close()


async def test_model_picker_lists_the_models_of_a_local_ollama_server(
    project: Path, with_key: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider = ScriptedProvider([reply("From qwen.")], model=MODEL.model)
    recorder = Recorder(picks=["ollama/qwen3:8b"])
    with OllamaServer([reply("From qwen.")]) as ollama:
        monkeypatch.setenv("OLLAMA_HOST", ollama.url)
        controller = await make_controller(project, provider)
        controller.attach(recorder)
        controller.submit("/model")
        await controller.wait()
        _, choices = recorder.offered[0]
        assert [(c.value, c.detail) for c in choices[1:3]] == [
            ("ollama/llama3:8b", "on this machine, 8.0B Q4_K_M, free"),
            ("ollama/qwen3:8b", "on this machine, 8.2B Q4_K_M, free"),
        ]
        assert controller.status().model == "ollama/qwen3:8b"
        assert controller.agent.info.input_price == 0.0  # a local model costs nothing
        await controller.close()
    assert [r.path for r in ollama.requests if r.method == "GET"] == ["/api/tags"]


async def test_rewind_forks_before_a_prompt_and_offers_it_again(
    project: Path, with_key: None
) -> None:
    provider = ScriptedProvider([reply("A."), reply("B."), reply("B again.")], model=MODEL.model)
    recorder = Recorder(picks=[None])
    controller = await make_controller(project, provider)
    controller.attach(recorder)
    for prompt in ("first", "second"):
        controller.submit(prompt)
        await controller.wait()
    before = controller.agent.session_id
    controller.submit("/rewind")
    await controller.wait()
    title, choices = recorder.offered[0]
    assert title == "Rewind to just before…"
    assert [(c.label, c.detail) for c in choices] == [("second", "prompt 2"), ("first", "prompt 1")]
    recorder.picks.append(choices[0].value)
    controller.submit("/rewind")
    await controller.wait()
    assert recorder.inputs == ["second"]
    assert controller.agent.session_id != before
    opening = [context_text(controller.agent.context), "first"]
    assert [[b.text for b in m.blocks] for m in controller.agent.messages] == [  # type: ignore[union-attr]
        opening,
        ["A."],
    ]
    shown = [e.text for e in recorder.events if isinstance(e, PromptSubmitted)]
    assert shown == ["first"]
    controller.submit("second, differently")
    await controller.wait()
    assert [[b.text for b in m.blocks] for m in provider.requests[-1].messages] == [  # type: ignore[union-attr]
        opening,
        ["A."],
        ["second, differently"],
    ]
    await controller.close()


async def test_resume_picks_another_session_and_shows_it(project: Path, with_key: None) -> None:
    provider = ScriptedProvider([reply("Old answer."), reply("New answer.")], model=MODEL.model)
    recorder = Recorder()
    controller = await make_controller(project, provider)
    controller.attach(recorder)
    controller.submit("old question")
    await controller.wait()
    old = controller.agent.session_id
    controller.submit("/clear")
    await controller.wait()
    controller.submit("new question")
    await controller.wait()
    recorder.picks.append(None)
    controller.submit("/resume")
    await controller.wait()
    title, choices = recorder.offered[0]
    assert title == "Resume a session"
    assert [c.label for c in choices] == [f"{old}  old question"]
    recorder.picks.append(choices[0].value)
    controller.submit("/resume")
    await controller.wait()
    assert controller.agent.session_id == old
    shown = [e.text for e in recorder.events if isinstance(e, PromptSubmitted)]
    assert shown == ["old question"]
    await controller.close()


async def test_compact_replaces_the_conversation_with_a_summary(
    project: Path, with_key: None
) -> None:
    provider = ScriptedProvider(
        [reply("One."), reply("The user said first; keep it short."), reply("Two.")],
        model=MODEL.model,
    )
    recorder = Recorder()
    controller = await make_controller(project, provider)
    controller.attach(recorder)
    controller.submit("first")
    await controller.wait()
    controller.submit("/compact keep it short")
    await controller.wait()
    compacted = [e for e in recorder.events if isinstance(e, ContextCompacted)]
    assert [c.trigger for c in compacted] == ["manual"]
    assert "keep it short" in provider.requests[1].messages[-1].text
    controller.submit("second")
    await controller.wait()
    assert "The user said first" in provider.requests[2].messages[0].text
    await controller.close()


async def test_a_custom_command_expands_and_unknown_commands_are_one_line(
    project: Path, with_key: None
) -> None:
    command = project / ".claude" / "commands" / "greet.md"
    command.parent.mkdir(parents=True)
    command.write_text("---\ndescription: say hello\n---\nSay hello to $ARGUMENTS.\n")
    provider = ScriptedProvider([reply("Hello, Ada!")], model=MODEL.model)
    recorder = Recorder()
    controller = await make_controller(project, provider)
    controller.attach(recorder)
    controller.submit("/help")
    await controller.wait()
    help_out = [e for e in recorder.events if isinstance(e, Output)][-1]
    assert "- `/greet`: say hello" in help_out.text
    controller.submit("/greet Ada")
    await controller.wait()
    assert "Say hello to Ada." in provider.requests[0].messages[-1].text
    controller.submit("/frobnicate now")
    await controller.wait()
    error = [e for e in recorder.events if isinstance(e, Output)][-1]
    assert (error.kind, error.text) == (
        "error",
        "unknown command /frobnicate (hint: /help lists commands; to send a line starting with "
        "/, start it with a space)",
    )
    assert len(provider.requests) == 1
    await controller.close()


def test_ctrl_c_in_line_mode_interrupts_the_running_prompt(project: Path, tmp_path: Path) -> None:
    model = script(
        tmp_path,
        "model: demo\nturns:\n"
        "  - tool_calls:\n      - name: bash\n        input: {command: 'sleep 30'}\n"
        "  - text: Next one.\n",
    )
    with subprocess.Popen(
        [sys.executable, "-m", "keel", "--model", model, "--mode", "bypass"],
        cwd=project,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stdin is not None
        assert proc.stdout is not None
        assert proc.stderr is not None
        proc.stdin.write("wait\n")
        proc.stdin.flush()
        seen = []
        for line in proc.stdout:  # until the command runs
            seen.append(line.rstrip())
            if line.startswith("⏺ bash"):
                break
        time.sleep(0.3)
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        for line in proc.stdout:
            seen.append(line.rstrip())
            if line.startswith("⏹"):
                break
        assert time.monotonic() - started < 5
        proc.stdin.write("again\n/exit\n")
        proc.stdin.close()
        rest = proc.stdout.read()
        assert proc.wait(timeout=20) == 0
        assert proc.stderr.read() == ""
    assert seen[-1] == "⏹ interrupted"
    assert seen[-2].startswith("  └ ✗ ")
    assert seen[-2].endswith("interrupted by user")
    assert "Next one." in rest  # the session goes on after the interrupt


async def test_reopening_a_session_stopped_mid_round_finishes_the_round_first(
    project: Path, with_key: None
) -> None:
    # Only a crash leaves a round half-answered (a suspend waits for the whole round): the
    # session file of a run killed after the first of two calls.
    from keel.llm.messages import Message, Text, ToolUse, Usage, tool_result, user
    from keel.session.store import SessionLog

    provider = ScriptedProvider(
        [reply("Both steps done."), reply("And the follow-up.")], model=MODEL.model
    )
    session = SessionLog.create(cwd=project, model=str(MODEL))
    session.user(user("do two steps"))
    calls = (
        ToolUse("t1", "bash", {"command": "echo one >> log"}),
        ToolUse("t2", "bash", {"command": "echo two >> log"}),
    )
    answer = Message("assistant", (Text("Two steps."), *calls), MODEL.provider, MODEL.model)
    session.assistant(answer, Usage(10, 5), 0.0, "tool_use", 1)
    (project / "log").write_text("one\n")
    session.tool_result(tool_result("t1", "(no output)"), 0.1)
    path = session.path
    session.close()

    recorder = Recorder()
    again = await make_controller(project, provider, "--mode", "bypass", start=False)
    await again.start_session(path)
    again.attach(recorder)
    assert [e.text for e in recorder.events if isinstance(e, PromptSubmitted)] == ["do two steps"]
    again.begin("and then?")
    await again.wait()
    assert (project / "log").read_text() == "one\ntwo\n"  # the unanswered call ran, once
    notices = [e.text for e in recorder.events if isinstance(e, Notice)]
    assert "continuing the turn this session stopped in" in notices
    texts = [e.message.text for e in recorder.events if isinstance(e, AssistantMessage)]
    assert texts[-2:] == ["Both steps done.", "And the follow-up."]
    await again.close()


async def test_undo_without_a_session_file_uses_a_temporary_store(
    project: Path, with_key: None, isolated_env: Path
) -> None:
    provider = ScriptedProvider(
        [reply("", ("write", {"path": "new.md", "content": "x\n"})), reply("Done.")],
        model=MODEL.model,
    )
    recorder = Recorder()
    controller = await make_controller(project, provider, "--mode", "bypass", "--no-session")
    controller.attach(recorder)
    controller.submit("make new.md")
    await controller.wait()
    assert controller.agent.session is None
    assert (project / "new.md").exists()
    store = controller.agent.ctx.checkpoints
    assert store is not None
    assert not store.directory.is_relative_to(isolated_env)  # not beside any session
    controller.submit("/undo")
    await controller.wait()
    assert not (project / "new.md").exists()
    controller.submit("/undo")
    await controller.wait()
    error = [e for e in recorder.events if isinstance(e, Output)][-1]
    assert (error.kind, error.text) == (
        "error",
        "nothing to undo (hint: undo covers keel's file edits and bash commands' changes in the "
        "project)",
    )
    await controller.close()
    assert not store.directory.exists()
    assert not list(isolated_env.glob("sessions/*/*"))


def test_a_prompt_on_the_command_line_is_the_first_prompt(project: Path, tmp_path: Path) -> None:
    model = script(tmp_path, "model: demo\nturns:\n  - text: Hello back.\n")
    out = keel("--model", model, "hello", "there", cwd=project, stdin="/exit\n")
    assert out.returncode == 0, out.stderr
    lines = unsandboxed_line_dropped(out.stdout).splitlines()
    assert lines[:2] == ["› hello there", "Hello back."]
    assert prompts_sent(latest_session(project)) == ["hello there"]


async def test_read_only_reports(project: Path, with_key: None) -> None:
    skill = project / ".claude" / "skills" / "deploy" / "SKILL.md"
    skill.parent.mkdir(parents=True)
    skill.write_text("---\nname: deploy\ndescription: ship it\n---\nDeploy.\n")
    recorder = Recorder()
    controller = await make_controller(
        project, ScriptedProvider([], model=MODEL.model), "--allowed-tools", "bash(git status)"
    )
    controller.attach(recorder)
    for command in ("/mcp", "/skills", "/permissions", "/hooks", "/cost"):
        controller.submit(command)
        await controller.wait()
    outputs = {e.title: e for e in recorder.events if isinstance(e, Output)}
    assert sorted(outputs) == ["cost", "hooks", "mcp", "permissions", "skills"]
    assert outputs["mcp"].text.startswith("No MCP servers in this session")
    assert "- **deploy** (`/deploy`, the model): ship it" in outputs["skills"].text
    assert "**Mode:** default" in outputs["permissions"].text
    assert "- `bash(git status)`" in outputs["permissions"].text
    assert outputs["hooks"].kind == "text"
    assert outputs["cost"].text.startswith("**Session cost:** $0.00 over 0 model turns")
    await controller.close()


async def test_debug_on_traces_the_next_prompt_and_survives_clear(
    project: Path, with_key: None
) -> None:
    from keel.trace import read
    from keel.tui.view import Output

    provider = ScriptedProvider([reply("One."), reply("Two."), reply("Three.")], model=MODEL.model)
    recorder = Recorder()
    controller = await make_controller(project, provider)
    controller.attach(recorder)
    controller.submit("/debug")
    await controller.wait()
    shown = [e.text for e in recorder.events if isinstance(e, Output) and e.title == "debug"]
    assert shown == ["Debug trace is **off** (`/debug on` starts one)."]
    controller.submit("/debug on")
    await controller.wait()
    controller.submit("first")
    await controller.wait()
    session = controller.agent.session
    assert session is not None
    first = session.path.with_name(session.path.stem + ".trace")
    controller.submit("/clear")
    await controller.wait()
    controller.submit("second")
    await controller.wait()
    second_session = controller.agent.session
    assert second_session is not None
    second = second_session.path.with_name(second_session.path.stem + ".trace")
    controller.submit("/debug off")
    await controller.wait()
    controller.submit("third")
    await controller.wait()
    await controller.close()
    outputs = [e.text for e in recorder.events if isinstance(e, Output) and e.title == "debug"]
    assert outputs == [f"Debug trace **off**; what was written stays in `{second}`."]
    prompts = [
        [r["data"]["prompt"] for r in read(folder) if r["kind"] == "turn_start"]
        for folder in (first, second)
    ]
    assert prompts == [["first"], ["second"]]  # the third prompt was not traced


#: A status line script as people write them for Claude Code: reads the JSON, prints a line
#: (here: whether a session file exists yet), and logs what it was fed.
STATUS_SCRIPT = """\
import json, os, sys
data = json.load(sys.stdin)
with open(sys.argv[1], "a", encoding="utf-8") as log:
    log.write(json.dumps(data) + "\\n")
journal = os.path.basename(data["transcript_path"]) or "no session yet"
print(f"\\033[32m[status]\\033[0m {journal}")
print("a second line is not shown")
"""


def test_line_mode_prints_the_status_line_before_a_prompt_when_it_changed(
    project: Path, tmp_path: Path, isolated_env: Path
) -> None:
    status = tmp_path / "statusline.py"
    status.write_text(STATUS_SCRIPT, encoding="utf-8")
    log = tmp_path / "statusline.log"
    settings = {
        "statusLine": {"type": "command", "command": f"python3 {status} {log}", "padding": 2}
    }
    (isolated_env / "config").mkdir(parents=True, exist_ok=True)
    (isolated_env / "config" / "settings.json").write_text(json.dumps(settings), encoding="utf-8")
    turns = "model: demo\nturns:\n  - text: One.\n  - text: Two.\n"
    out = keel(
        "--no-tui", "--model", script(tmp_path, turns), cwd=project, stdin="hi\nagain\n/exit\n"
    )
    assert out.returncode == 0, out.stderr
    session = latest_session(project)
    lines = [line.rstrip() for line in unsandboxed_line_dropped(out.stdout).splitlines()]
    # Before the first prompt, before the second (a session now), and not again before /exit:
    # the line did not change. Colours are dropped where stdout is not a terminal.
    # The session's UUID and its Claude Code–format transcript, as hooks see them.
    uuid = claude.hook_session_id(session.stem)
    transcript = session.with_suffix(".transcript") / f"{uuid}.jsonl"
    assert [line for line in lines if line.startswith("  [status]")] == [
        "  [status] no session yet",
        f"  [status] {transcript.name}",
    ]
    assert lines.index("  [status] no session yet") < lines.index("› hi")
    assert lines.index(f"  [status] {transcript.name}") < lines.index("› again")
    fed = [json.loads(x) for x in log.read_text(encoding="utf-8").splitlines()]
    assert len(fed) == 3
    assert {k: fed[-1][k] for k in ("hook_event_name", "session_id", "cwd", "transcript_path")} == {
        "hook_event_name": "Status",
        "session_id": uuid,
        "cwd": str(project),
        "transcript_path": str(transcript),
    }
    assert [json.loads(x)["type"] for x in transcript.read_text(encoding="utf-8").splitlines()] == [
        "user",
        "assistant",
        "user",
        "assistant",
    ]
    assert set(fed[-1]) == {
        "hook_event_name", "session_id", "transcript_path", "cwd", "model", "workspace",
        "version", "output_style", "cost", "context_window",
    }  # fmt: skip
