"""`keel init` and `/init`: the model studies the project with reading tools only and proposes
AGENTS.md (or CLAUDE.md); keel shows the diff and writes it only when approved (`--yes`, a yes on
the terminal or in the TUI). Driven through the real command with a scripted model, and against
the loopback Anthropic server where the request itself is checked."""

from __future__ import annotations

import io
import json
import os
import pty
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from keel.app.init import (
    NUDGE,
    PROMPT,
    PROPOSE_TOOL,
    SYSTEM,
    InitState,
    init_prompt,
    unified_diff,
)
from keel.cli.main import EXIT_ERROR, EXIT_NOT_WRITTEN, EXIT_OK, main
from keel.llm.script import Step, reply
from keel.session.journal import read_records
from keel.session.records import DecisionRecord
from keel.testing.anthropic_server import AnthropicServer
from keel.testing.server import RecordedRequest
from tests.helpers import unsandboxed_line_dropped

NEW = "# AGENTS.md\n\n## Commands\n\n- `make test` runs the tests (`pytest -q`).\n"
OLD = (
    "# AGENTS.md\n\n## Commands\n\n- `make check` runs the tests.\n\n## Layout\n\n- `src/`: code\n"
)
UPDATED = (
    "# AGENTS.md\n\n## Commands\n\n- `make test` runs the tests.\n\n## Layout\n\n- `src/`: code\n"
)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A small project: a README, a Makefile, a source folder and its tests."""
    root = tmp_path / "repo"
    (root / "src").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "README.md").write_text("# demo\n\nRun `make test`.\n", encoding="utf-8")
    (root / "Makefile").write_text("test:\n\tpytest -q\n", encoding="utf-8")
    (root / "src" / "app.py").write_text("print('hi')\n", encoding="utf-8")
    (root / "tests" / "test_app.py").write_text("def test_x():\n    pass\n", encoding="utf-8")
    return root


def script(tmp_path: Path, *turns: dict[str, Any]) -> str:
    path = tmp_path / "init-script.json"
    path.write_text(json.dumps({"model": "init-test", "turns": list(turns)}), encoding="utf-8")
    return f"scripted:{path}"


def call(name: str, **args: Any) -> dict[str, Any]:
    return {"name": name, "input": args}


def studies_then_proposes(content: str) -> list[dict[str, Any]]:
    return [
        {
            "text": "Looking around.",
            "tool_calls": [call("glob", pattern="*"), call("read", path="Makefile")],
        },
        {"tool_calls": [call(PROPOSE_TOOL, content=content)]},
        {"text": "AGENTS.md covers the test command."},
    ]


def keel_init(
    project: Path, *args: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> tuple[int, str, str]:
    """`keel init ARGS` in `project`, in this process, with no terminal on stdin (stderr without
    the "no sandbox" line a machine without bubblewrap adds)."""
    monkeypatch.chdir(project)
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    code = main(["init", "-q", *args])
    out, err = capsys.readouterr()
    return code, out, unsandboxed_line_dropped(err)


def session_of(err: str) -> str:
    return err.split("`keel undo ")[1].split("`")[0]


# -- writing and updating -------------------------------------------------------------------------


def test_yes_writes_a_new_agents_md_and_undo_removes_it(
    repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    model = script(tmp_path, *studies_then_proposes(NEW))
    code, out, err = keel_init(
        repo, "--yes", "--model", model, capsys=capsys, monkeypatch=monkeypatch
    )
    assert code == EXIT_OK, err
    assert (repo / "AGENTS.md").read_text(encoding="utf-8") == NEW
    assert out == unified_diff(None, NEW, "AGENTS.md")
    assert out.startswith("--- /dev/null\n+++ b/AGENTS.md\n@@ -0,0 +1,5 @@\n+# AGENTS.md\n")
    session = session_of(err)
    assert err == f"keel: wrote AGENTS.md (`keel undo {session}` puts it back)\n"
    # Journaled like any run: the proposal's approval is a decision record.
    from keel.session.index import find_session

    path = find_session(session, repo)
    decisions = [
        r.payload for r in read_records(path).records if isinstance(r.payload, DecisionRecord)
    ]
    assert [(d.tool, d.outcome, d.source) for d in decisions] == [
        (PROPOSE_TOOL, "allow", "init:--yes")
    ]
    assert main(["undo", session]) == 0
    assert not (repo / "AGENTS.md").exists()


def test_an_existing_agents_md_is_updated_from_what_the_model_was_given(
    repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (repo / "AGENTS.md").write_text(OLD, encoding="utf-8")
    model = script(tmp_path, *studies_then_proposes(UPDATED))
    code, out, err = keel_init(
        repo, "--yes", "--model", model, capsys=capsys, monkeypatch=monkeypatch
    )
    assert code == EXIT_OK, err
    assert (repo / "AGENTS.md").read_text(encoding="utf-8") == UPDATED
    assert out == (
        "--- a/AGENTS.md\n"
        "+++ b/AGENTS.md\n"
        "@@ -2,7 +2,7 @@\n"
        " \n"
        " ## Commands\n"
        " \n"
        "-- `make check` runs the tests.\n"
        "+- `make test` runs the tests.\n"
        " \n"
        " ## Layout\n"
        " \n"
    )
    assert err.startswith("keel: updated AGENTS.md (`keel undo ")


def test_the_prompt_hands_over_the_current_file_and_asks_to_keep_what_holds(repo: Path) -> None:
    from keel.app.init import InitState

    state = InitState(target=repo / "AGENTS.md", root=repo, before=OLD)
    prompt = init_prompt(state)
    assert prompt.startswith("Write AGENTS.md for this project")
    assert "Update it: keep what is still true" in prompt
    assert f'<current-file path="AGENTS.md">\n{OLD.rstrip()}\n</current-file>' in prompt
    assert f"call {PROPOSE_TOOL} with the whole new content of AGENTS.md" in prompt
    fresh = init_prompt(InitState(target=repo / "AGENTS.md", root=repo, before=None))
    assert "<current-file" not in fresh
    assert fresh == PROMPT.format(
        name="AGENTS.md",
        readers="keel, Codex and most other coding agents read AGENTS.md",
        tool=PROPOSE_TOOL,
        existing="",
    )


@pytest.mark.needs("git")
def test_headless_without_yes_writes_nothing_and_prints_a_diff_git_applies(
    repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    model = script(tmp_path, *studies_then_proposes(NEW))
    code, out, err = keel_init(repo, "--model", model, capsys=capsys, monkeypatch=monkeypatch)
    assert code == EXIT_NOT_WRITTEN == 8
    assert not (repo / "AGENTS.md").exists()
    assert out == unified_diff(None, NEW, "AGENTS.md")
    assert err == (
        "keel: AGENTS.md was not written: nobody to approve it (no terminal, no --yes) (hint: "
        "`keel init --yes` writes without asking; or `git apply` the diff above)\n"
    )
    patch = tmp_path / "agents.patch"
    patch.write_text(out, encoding="utf-8")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "apply", str(patch)], cwd=repo, check=True)
    assert (repo / "AGENTS.md").read_text(encoding="utf-8") == NEW


def test_a_claude_md_only_project_gets_its_claude_md_updated(
    repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (repo / "CLAUDE.md").write_text("# CLAUDE.md\n\nOld notes.\n", encoding="utf-8")
    new = "# CLAUDE.md\n\nRun `make test`.\n"
    model = script(tmp_path, {"tool_calls": [call(PROPOSE_TOOL, content=new)]}, {"text": "Done."})
    code, _out, err = keel_init(
        repo, "--yes", "--model", model, capsys=capsys, monkeypatch=monkeypatch
    )
    assert code == EXIT_OK, err
    assert (repo / "CLAUDE.md").read_text(encoding="utf-8") == new
    assert not (repo / "AGENTS.md").exists()
    assert err.startswith("keel: updated CLAUDE.md")


def test_the_model_is_told_which_file_and_why_for_claude_md(repo: Path) -> None:
    from keel.app.init import InitState, choose_target

    (repo / "CLAUDE.md").write_text("x\n", encoding="utf-8")
    assert choose_target(repo) == repo / "CLAUDE.md"
    assert choose_target(repo, "AGENTS.md") == repo / "AGENTS.md"
    claude = init_prompt(InitState(target=repo / "CLAUDE.md", root=repo, before="x\n"))
    assert (
        "this project keeps its instructions in CLAUDE.md, which Claude Code and keel read"
        in claude
    )
    forced = init_prompt(InitState(target=repo / "AGENTS.md", root=repo, before=None))
    assert "keel reads it instead of CLAUDE.md: read CLAUDE.md and carry over" in forced
    (repo / "AGENTS.md").write_text("y\n", encoding="utf-8")
    assert choose_target(repo) == repo / "AGENTS.md"


def test_a_model_that_proposes_nothing_is_reminded_once_then_it_is_an_error(
    repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    model = script(tmp_path, {"text": "Here is the file: # AGENTS.md"}, {"text": "Sorry."})
    code, out, err = keel_init(
        repo, "--yes", "--model", model, capsys=capsys, monkeypatch=monkeypatch
    )
    assert code == EXIT_ERROR
    assert out == ""
    assert err == (
        "keel: error: the model ended without proposing AGENTS.md (hint: run keel init again, "
        "or try a more capable model)\n"
    )
    assert not (repo / "AGENTS.md").exists()
    from keel.session.index import latest_session
    from keel.session.records import UserRecord

    records = read_records(latest_session(repo)).records
    prompts = [r.payload.message.text for r in records if isinstance(r.payload, UserRecord)]
    assert prompts == [
        init_prompt(InitState(target=repo / "AGENTS.md", root=repo, before=None)),
        NUDGE.format(tool=PROPOSE_TOOL, name="AGENTS.md"),
    ]


# -- what the model is offered, and what it may not do --------------------------------------------


@pytest.fixture
def anthropic() -> Iterator[AnthropicServer]:
    with AnthropicServer(api_key="sk-ant-test") as server:
        yield server


def run_keel(
    project: Path, server: AnthropicServer, *args: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "keel", "init", "--model", "anthropic/claude-sonnet-4-5", *args],
        cwd=project,
        input="",
        capture_output=True,
        text=True,
        env={**os.environ, "ANTHROPIC_API_KEY": "sk-ant-test", "ANTHROPIC_BASE_URL": server.url},
        timeout=60,
    )


def results(body: dict[str, Any]) -> list[tuple[bool, str]]:
    """(is_error, text) of each tool result in the last user message of a request."""
    return [
        (bool(block.get("is_error")), block["content"][0]["text"])
        for block in body["messages"][-1]["content"]
        if block["type"] == "tool_result"
    ]


def test_the_request_offers_only_reading_tools_and_the_proposal(
    repo: Path, anthropic: AnthropicServer
) -> None:
    (repo / "AGENTS.md").write_text(OLD, encoding="utf-8")
    anthropic.add(
        reply("", ("write", {"path": "AGENTS.md", "content": "pwned\n"})),
        reply("", ("edit", {"path": "README.md", "old_string": "demo", "new_string": "x"})),
        reply("", (PROPOSE_TOOL, {"content": UPDATED})),
        reply("Updated."),
    )
    out = run_keel(repo, anthropic, "--yes")
    assert out.returncode == 0, out.stderr
    first, second, third, _fourth = [r.json for r in anthropic.model_requests]
    assert [t["name"] for t in first["tools"]] == [
        "bash",
        "glob",
        "grep",
        "ls",
        PROPOSE_TOOL,
        "read",
    ]
    assert first["system"][0]["text"].startswith(SYSTEM)
    assert first["messages"][0]["content"][0]["text"].startswith("Write AGENTS.md for this project")
    assert OLD.rstrip() in first["messages"][0]["content"][0]["text"]
    offered = "bash, glob, grep, ls, propose_instructions, read"
    assert results(second) == [(True, f"unknown tool 'write'; available tools: {offered}")]
    assert results(third) == [(True, f"unknown tool 'edit'; available tools: {offered}")]
    assert (repo / "README.md").read_text(encoding="utf-8") == "# demo\n\nRun `make test`.\n"
    assert (repo / "AGENTS.md").read_text(encoding="utf-8") == UPDATED


WRITES_THROUGH_BASH = [
    "echo pwned > AGENTS.md",
    "touch pwned.txt",
    "tee AGENTS.md < README.md",
    "sed -i s/demo/pwned/ README.md",
    "python3 -c \"open('pwned.txt', 'w').write('x')\"",
    "cp README.md AGENTS.md",
    "git init -q",
    "make test",
]


def test_a_model_that_writes_through_bash_is_refused(
    repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attack: with keel -p's gate, a sandbox lets each of these write the project (and,
    without one, allow rules would). An init run refuses every command off the safe list."""
    calls = [call("bash", command=c) for c in WRITES_THROUGH_BASH]
    model = script(
        tmp_path,
        {"tool_calls": [*calls, call("bash", command="cat Makefile")]},
        {"tool_calls": [call(PROPOSE_TOOL, content=NEW)]},
        {"text": "Done."},
    )
    before = sorted(p.relative_to(repo) for p in repo.rglob("*"))
    code, _out, err = keel_init(
        repo, "--model", model, "--yes", capsys=capsys, monkeypatch=monkeypatch
    )
    assert code == EXIT_OK, err
    after = sorted(p.relative_to(repo) for p in repo.rglob("*") if p.name != "AGENTS.md")
    assert after == before
    assert (repo / "README.md").read_text(encoding="utf-8") == "# demo\n\nRun `make test`.\n"
    from keel.session.index import find_session

    records = read_records(find_session(session_of(err), repo)).records
    decisions = [r.payload for r in records if isinstance(r.payload, DecisionRecord)]
    assert [(d.tool, d.outcome, d.source) for d in decisions] == [
        *[("bash", "deny", "mode:init")] * len(WRITES_THROUGH_BASH),
        (PROPOSE_TOOL, "allow", "init:--yes"),
    ]
    assert all(
        d.reason.startswith("refused: this command is not on the read-only safe list")
        for d in decisions[:-1]
    )


def test_an_agents_md_linking_out_of_the_project_is_neither_read_nor_written(
    repo: Path, anthropic: AnthropicServer, tmp_path: Path
) -> None:
    """The attack: a repository ships AGENTS.md -> a file of the user's; keel init would send its
    content to the model as "the current file" and then write over it."""
    secret = tmp_path / "secret.txt"
    secret.write_text("ssh-key-material\n", encoding="utf-8")
    (repo / "AGENTS.md").symlink_to(secret)
    anthropic.add(reply("", (PROPOSE_TOOL, {"content": NEW})), reply("Done."))
    out = run_keel(repo, anthropic, "--yes")
    assert out.returncode == 2, out.stderr
    assert out.stderr == (
        f"keel: error: {repo / 'AGENTS.md'} is a link to {secret}, outside the project; keel "
        "init will not read or write it (hint: replace the link with a file of the project)\n"
    )
    assert anthropic.model_requests == []
    assert secret.read_text(encoding="utf-8") == "ssh-key-material\n"


def test_a_deny_rule_for_the_file_refuses_the_write(
    repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    model = script(tmp_path, *studies_then_proposes(NEW))
    code, out, err = keel_init(
        repo,
        "--yes",
        "--model",
        model,
        "--disallowed-tools",
        "write(AGENTS.md)",
        capsys=capsys,
        monkeypatch=monkeypatch,
    )
    assert code == EXIT_ERROR
    assert not (repo / "AGENTS.md").exists()
    assert out == unified_diff(None, NEW, "AGENTS.md")
    assert err == (
        "keel: error: AGENTS.md was not written: refused: denied by rule write(AGENTS.md) "
        "(--disallowed-tools)\n"
    )


def test_a_file_changed_while_the_model_worked_is_not_overwritten(
    repo: Path, tmp_path: Path
) -> None:
    (repo / "AGENTS.md").write_text(OLD, encoding="utf-8")
    mine = OLD + "\n- my own note, written meanwhile\n"
    steps: list[Step] = [reply("", (PROPOSE_TOOL, {"content": UPDATED})), reply("Done.")]

    def respond(_request: RecordedRequest) -> Step:
        if len(steps) == 2:  # the user edits the file while the model is thinking
            (repo / "AGENTS.md").write_text(mine, encoding="utf-8")
        return steps.pop(0)

    with AnthropicServer(api_key="sk-ant-test", responder=respond) as server:
        out = run_keel(repo, server, "--yes")
    assert out.returncode == EXIT_ERROR, out.stderr
    assert (repo / "AGENTS.md").read_text(encoding="utf-8") == mine
    assert out.stderr.endswith(
        "keel: error: AGENTS.md was not written: the write failed: "
        f"{repo / 'AGENTS.md'} changed since you read it; read it again before changing it\n"
    )


# -- asking on a terminal ---------------------------------------------------------------------------


@pytest.mark.parametrize(("answer", "written"), [("y", True), ("n", False)])
def test_on_a_terminal_the_diff_is_shown_and_the_answer_decides(
    repo: Path, tmp_path: Path, answer: str, written: bool
) -> None:
    model = script(tmp_path, *studies_then_proposes(NEW))
    leader, follower = pty.openpty()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "keel", "init", "-q", "--model", model],
            cwd=repo,
            stdin=follower,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        os.close(follower)
        os.write(leader, f"{answer}\n".encode())
        out, err = proc.communicate(timeout=60)
    finally:
        os.close(leader)
    err = unsandboxed_line_dropped(err)
    assert out == unified_diff(None, NEW, "AGENTS.md")  # shown once, before the question
    assert err.startswith("Write AGENTS.md? [y/N] keel: ")
    if written:
        assert proc.returncode == EXIT_OK, err
        assert (repo / "AGENTS.md").read_text(encoding="utf-8") == NEW
    else:
        assert proc.returncode == EXIT_NOT_WRITTEN, err
        assert not (repo / "AGENTS.md").exists()
        assert err.endswith("keel: AGENTS.md was not written: declined\n")


# -- /init in the TUI -------------------------------------------------------------------------------


async def test_slash_init_in_the_tui_shows_the_diff_and_writes_on_yes(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from keel.agent.prompt import context_text
    from keel.testing import ScriptedProvider
    from keel.tui.app import KeelApp
    from keel.tui.screens import PickerScreen
    from keel.tui.widgets import CommandOutput
    from tests.tui_helpers import MODEL, make_controller

    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    provider = ScriptedProvider(
        [
            reply("Looking.", ("read", {"path": "Makefile"})),
            reply("", (PROPOSE_TOOL, {"content": NEW})),
            reply("AGENTS.md covers the test command."),
            reply("Noted."),  # the session's own next prompt
        ],
        model=MODEL.model,
    )
    controller = await make_controller(repo, provider)
    app = KeelApp(controller)
    async with app.run_test(size=(100, 40)) as pilot:
        app.prompt.load_text("/init")
        await pilot.press("enter")
        for _ in range(100):
            await pilot.pause()
            if isinstance(app.screen, PickerScreen):
                break
        assert isinstance(app.screen, PickerScreen)
        assert not (repo / "AGENTS.md").exists()  # nothing before the answer
        shown = app.query(CommandOutput).last()
        assert shown.border_title == "/init"
        assert shown.text == (
            "The proposed AGENTS.md, as a diff:\n\n```diff\n"
            + unified_diff(None, NEW, "AGENTS.md")
            + "```"
        )
        await pilot.press("enter")  # the first choice: yes
        await controller.wait()
        await pilot.pause()
        assert (repo / "AGENTS.md").read_text(encoding="utf-8") == NEW
        done = app.query(CommandOutput).last()
        assert done.text.startswith(
            "wrote AGENTS.md (it is read from the next fresh context: /clear; /undo puts it back)"
        )
        # The init agent's tools ran as cards in the transcript; the session's model was not
        # asked anything yet, and hears of the file with the next prompt.
        offered = [t.name for t in provider.requests[0].tools]
        assert offered == ["bash", "glob", "grep", "ls", PROPOSE_TOOL, "read"]
        app.prompt.load_text("/undo")
        await pilot.press("enter")
        await controller.wait()
        await pilot.pause()
        assert not (repo / "AGENTS.md").exists()
        app.prompt.load_text("thanks")
        await pilot.press("enter")
        await controller.wait()
    # The session's first request: its context, then the note with the prompt.
    blocks = [getattr(block, "text", "") for block in provider.requests[-1].messages[-1].blocks]
    assert len(blocks) == 2, blocks
    opening, note = blocks
    assert opening == context_text(controller.agent.context)
    assert note.startswith("<system-note>\n/init wrote AGENTS.md at the project root")
    assert "The user ran /undo" in note


async def test_slash_init_declined_writes_nothing(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from keel.testing import ScriptedProvider
    from keel.tui.view import Output
    from tests.tui_helpers import MODEL, Recorder, make_controller

    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    (repo / "AGENTS.md").write_text(OLD, encoding="utf-8")
    provider = ScriptedProvider(
        [reply("", (PROPOSE_TOOL, {"content": UPDATED})), reply("Not written, then.")],
        model=MODEL.model,
    )
    controller = await make_controller(repo, provider)
    ui = Recorder(picks=["no"])
    controller.attach(ui)
    await controller.handle("/init")
    assert (repo / "AGENTS.md").read_text(encoding="utf-8") == OLD
    assert [(title, [c.value for c in choices]) for title, choices in ui.offered] == [
        ("Write AGENTS.md?", ["yes", "no"])
    ]
    outputs = [e for e in ui.events if isinstance(e, Output)]
    assert outputs[0].text.startswith(
        "The proposed AGENTS.md, as a diff:\n\n```diff\n--- a/AGENTS.md"
    )
    assert outputs[-1].kind == "text"
    assert outputs[-1].text.startswith("AGENTS.md was not written: declined")
    await controller.close()


def test_help_lists_init() -> None:
    from keel.tui.commands import BUILTINS

    assert BUILTINS["init"].arguments == "[AGENTS.md|CLAUDE.md]"
    assert not BUILTINS["init"].while_busy


OUTSIDE_READS = [
    ("read", {"path": "{secret}"}),
    ("read", {"path": "../secret.txt"}),
    ("read", {"path": "notes-link"}),
    ("grep", {"pattern": "key", "path": "{outside}"}),
    ("glob", {"pattern": "*.txt", "path": ".."}),
    ("ls", {"path": "~"}),
    ("bash", {"command": "cat {secret}"}),
    ("bash", {"command": "cat ../secret.txt"}),
    ("bash", {"command": "cat ~/secret.txt"}),
    ("bash", {"command": "cat $HOME/secret.txt"}),
    ("bash", {"command": "head -n 5 notes-link"}),
    ("bash", {"command": "cat notes-li*"}),
    ("bash", {"command": "ls .."}),
    ("bash", {"command": "wc -c --files0-from={secret}"}),
]


def test_an_init_run_reads_nothing_outside_the_project(
    repo: Path, anthropic: AnthropicServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attack: a README tells the model to put the user's credentials into AGENTS.md
    ("for the deploy docs"); what the model reads goes into the proposal, and with --yes into a
    file the project may commit. An init run reads only inside the project."""
    home = Path(os.environ["HOME"])
    home.mkdir(parents=True, exist_ok=True)
    secret = tmp_path / "secret.txt"
    secret.write_text("aws_secret_access_key=TOPSECRET\n", encoding="utf-8")
    (home / "secret.txt").write_text("TOPSECRET at home\n", encoding="utf-8")
    (repo / "notes-link").symlink_to(secret)
    outside = str(tmp_path)
    calls = [
        (name, {k: v.format(secret=secret, outside=outside) for k, v in args.items()})
        for name, args in OUTSIDE_READS
    ]
    anthropic.add(
        reply("", *calls, ("read", {"path": "README.md"}), ("bash", {"command": "cat Makefile"})),
        reply("", (PROPOSE_TOOL, {"content": NEW})),
        reply("Done."),
    )
    out = run_keel(repo, anthropic, "--yes")
    assert out.returncode == 0, out.stderr
    bodies = [r.body.decode() for r in anthropic.model_requests]
    assert not any("TOPSECRET" in body for body in bodies)
    answered = results(anthropic.model_requests[1].json)
    assert [error for error, _text in answered] == [True] * len(calls) + [False, False]
    for (_error, text), (name, args) in zip(answered, calls, strict=False):
        assert "keel init reads only inside the project" in text, (name, args, text)
    assert answered[-2] == (False, "     1\t# demo\n     2\t\n     3\tRun `make test`.")
    assert answered[-1][1].startswith("test:\n\tpytest -q")


LOOKING_AROUND = [
    "git log --oneline -20",
    "ls -la src tests",
    "cat pyproject.toml | head -5",
    "git diff --stat",
    "wc -l src/*.py",
    "head -n 20 README.md",
    "git log -p HEAD~3 -- src/",
    "git status --short",
    "cat ./Makefile",
]


@pytest.mark.parametrize("command", LOOKING_AROUND)
async def test_commands_that_look_inside_the_project_run(repo: Path, command: str) -> None:
    from keel.app.init import InitGate
    from keel.llm.messages import ToolUse
    from keel.permissions.gate import Allow

    gate = InitGate(
        "default", repo, repo, state=InitState(target=repo / "AGENTS.md", root=repo, before=None)
    )
    decision = await gate.authorize(ToolUse("t1", "bash", {"command": command}), read_only=False)
    assert decision == Allow("read-only")


@pytest.mark.parametrize("engine", ["rg", "fallback"])
async def test_grep_and_glob_do_not_follow_a_link_out_of_the_project(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine: str
) -> None:
    """The attack: `notes.txt -> ~/secret` committed in a repository; an init run's grep would
    read the user's file through it. ripgrep does not follow links; keel's fallback (used
    where ripgrep is not installed) must not either."""
    import keel.tools.builtin.search as search
    from keel.tools.base import ToolContext
    from keel.tools.builtin import glob, grep

    if engine == "rg" and search.ripgrep() is None:
        pytest.skip("needs rg: not on PATH (install ripgrep)")
    if engine == "fallback":
        monkeypatch.setattr(search, "ripgrep", lambda: None)
    secret = tmp_path / "secret.txt"
    secret.write_text("TOPSECRET\n", encoding="utf-8")
    (repo / "notes.txt").symlink_to(secret)
    ctx = ToolContext(cwd=repo, root=repo)
    found = await grep.run(ctx, {"pattern": "TOPSECRET"})
    assert found.content == "No matches for 'TOPSECRET'."
    listed = await glob.run(ctx, {"pattern": "**/*.txt"})
    assert "notes.txt" not in str(listed.content)


def test_without_a_model_the_hint_does_not_offer_the_offline_demo(repo: Path) -> None:
    """The offline demo plays a fixed conversation and cannot write a project's AGENTS.md, so
    `keel init` without a key says what does work instead of suggesting it."""
    env = {k: v for k, v in os.environ.items() if not k.endswith(("_API_KEY", "_AUTH_TOKEN"))}
    done = subprocess.run(
        [sys.executable, "-m", "keel", "init"],
        cwd=repo,
        capture_output=True,
        text=True,
        env=env,
        input="",
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr == (
        "keel: error: no model chosen and no API key found (hint: keel init needs a real model: "
        "set ANTHROPIC_API_KEY, OPENAI_API_KEY or GEMINI_API_KEY, pass --model provider/model, "
        "or run a local one (--model ollama/qwen3:8b; docs/providers.md))\n"
    )
    assert not (repo / "AGENTS.md").exists()
