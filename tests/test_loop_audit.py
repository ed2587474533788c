"""The seeds' loop where keel differed (issue 12's audit): suspend only at the loop boundary, a
default token budget for unattended runs, thinking and effort in the resume fingerprint, the Stop
hook on a refusal, `/undo` checkpoints begun by the loop for every front end (`keel undo`), and
numeric flags that refuse nan, inf and negatives."""

from __future__ import annotations

import json
import re
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from keel.agent.events import Event, RequestStarted, ToolStarted
from keel.agent.limits import DEFAULT_UNATTENDED_TOKENS, Limits
from keel.agent.loop import Agent
from keel.agent.subagents import enable_subagents, load_agent_types
from keel.errors import UserError
from keel.llm.events import Notice
from keel.llm.messages import Message, Text, ToolResult, Usage
from keel.llm.providers.scripted import ScriptedProvider
from keel.llm.script import Reply, reply
from keel.permissions import AllowAll
from keel.session.fold import fold
from keel.session.journal import Journal, read_records
from keel.session.records import Fingerprint, TerminalRecord
from keel.session.resume import check_resume
from keel.session.store import SessionLog
from keel.testing.routing import RoutedProvider
from keel.tools.builtin import builtin_tools
from tests.helpers import unsandboxed_line_dropped, user_settings_file
from tests.test_cli import keel, session_files, write_script
from tests.test_hooks import agent_with, hook, script, write_hooks


def bash(command: str) -> tuple[str, dict[str, Any]]:
    return ("bash", {"command": command})


def new_agent(project: Path, steps: list[Any], sessions: Path, **kw: Any) -> Agent:
    kw.setdefault("gate", AllowAll())
    agent = Agent(
        provider=ScriptedProvider(steps),
        model="scripted",
        tools=builtin_tools(),
        cwd=project,
        system="s",
        session=SessionLog.create(cwd=project, model="scripted/scripted", directory=sessions),
        **kw,
    )
    return agent


#: The records of the conversation (bookkeeping such as process records is left out).
CONVERSATION = {"meta", "user", "assistant", "tool_result", "terminal", "undo", "compaction"}


def kinds(path: Path) -> list[str]:
    records = read_records(path, allow_torn_tail=False).records
    return [r.payload.type for r in records if r.payload.type in CONVERSATION]


# -- 1. suspend only at the loop boundary -------------------------------------------------------


async def test_a_suspend_during_the_first_of_three_tools_waits_for_the_batch(
    project: Path, tmp_path: Path
) -> None:
    steps = [
        reply(
            "Three steps.",
            bash("echo one >> log"),
            bash("echo two >> log"),
            bash("echo three >> log"),
        ),
        reply("All three done."),
    ]
    agent = new_agent(project, steps, tmp_path / "s")
    assert agent.session is not None
    path = agent.session.path

    def on_event(event: Event) -> None:
        if isinstance(event, ToolStarted) and event.call.input == {"command": "echo one >> log"}:
            agent.request_suspend()  # as `keel suspend` or SIGTERM would, mid-batch

    result = await agent.run("do three steps", on_event)
    await agent.aclose()
    assert result.stop_reason == "suspended"
    assert (project / "log").read_text(encoding="utf-8") == "one\ntwo\nthree\n"
    assert kinds(path) == [
        "meta",
        "user",
        "assistant",
        "tool_result",
        "tool_result",
        "tool_result",
        "terminal",
    ]
    records = read_records(path).records
    assert isinstance(records[-1].payload, TerminalRecord)
    assert records[-1].payload.reason == "suspended"

    # Resume: no tool runs again; the next thing is the model call that sees all three results.
    journal, loaded = Journal.open(path)
    state = fold(loaded.records)
    assert state.pending is None
    provider = ScriptedProvider([reply("All three done.")])
    again = Agent(
        provider=provider,
        model="scripted",
        tools=builtin_tools(),
        cwd=project,
        system="s",
        gate=AllowAll(),
    )
    again.restore(state)
    again.session = SessionLog(journal, state.meta.id)
    resumed = await again.resume()
    await again.aclose()
    assert (resumed.stop_reason, resumed.text) == ("end_turn", "All three done.")
    assert (project / "log").read_text(encoding="utf-8") == "one\ntwo\nthree\n"
    (request,) = provider.requests
    assert [type(b) for b in request.messages[-1].blocks] == [ToolResult] * 3
    assert kinds(path)[7:] == ["assistant", "terminal"]


async def test_a_suspend_during_the_model_reply_still_runs_its_tools(
    project: Path, tmp_path: Path
) -> None:
    steps = [reply("", bash("echo one >> log"), bash("echo two >> log")), reply("unreached")]
    agent = new_agent(project, steps, tmp_path / "s")
    assert agent.session is not None
    path = agent.session.path

    def on_event(event: Event) -> None:
        if isinstance(event, RequestStarted):
            agent.request_suspend()

    result = await agent.run("go", on_event)
    await agent.aclose()
    assert result.stop_reason == "suspended"
    assert (project / "log").read_text(encoding="utf-8") == "one\ntwo\n"
    assert kinds(path) == ["meta", "user", "assistant", "tool_result", "tool_result", "terminal"]
    state = fold(read_records(path).records)
    assert state.pending is None  # coherent: every tool_use has its tool_result
    assert state.messages[-1].role == "user"


# -- 2. a default token budget for unattended runs ------------------------------------------------


@pytest.mark.needs("sandbox")  # bash runs unasked only in the sandbox
def test_keel_p_has_a_token_budget_by_default(
    project: Path, tmp_path: Path, isolated_env: Path
) -> None:
    # Two responses reach the budget: no compaction in between (it would summarize them away).
    user_settings_file().parent.mkdir(parents=True, exist_ok=True)
    user_settings_file().write_text(json.dumps({"auto_compact": False}), encoding="utf-8")
    cap = DEFAULT_UNATTENDED_TOKENS
    big = {"input": cap - 50_000, "output": 1_000}
    turns: list[dict[str, object]] = [
        {"tool_calls": [{"name": "bash", "input": {"command": "echo one >> log"}}], "usage": big},
        {
            "tool_calls": [{"name": "bash", "input": {"command": "echo two >> log"}}],
            "usage": {"input": 40_000, "output": 500, "cache_read": 9_000, "cache_write": 500},
        },
        {"text": "done"},
    ]
    script = write_script(tmp_path / "s.json", turns)
    out = keel("-p", "go", "--model", f"scripted:{script}", "--output-format", "json", cwd=project)
    assert out.returncode == 3, out.stderr
    assert json.loads(out.stdout)["stop_reason"] == "budget"
    sid = json.loads(out.stdout)["session_id"]
    lines = out.stderr.splitlines()
    assert lines[0] == "⏺ bash echo one >> log"
    assert lines[1].startswith("  └ ✓ ")
    assert lines[1].endswith("s  [exit code 0]")
    # The second request would reread the ~9.95M-token context: it is not sent.
    refused = f"keel: warning: budget: 49,000 tokens left of the {cap:,}-token budget; the next "
    assert lines[3].startswith(refused), lines[3]
    assert re.fullmatch(
        r".*needs ~9,95\d,\d{3} \(~9,95\d,\d{3} input and at least 512 output tokens\)", lines[3]
    )
    assert lines[2:3] + lines[4:] == [
        f"keel: warning: {(cap - 49_000) / cap:.0%} of the token budget used "
        f"({cap - 49_000:,} tokens of {cap:,} tokens)",
        "keel: the session stopped at its budget; raise it with --max-tokens-budget N (or "
        "budget.tokens in settings; 0 for none), and continue this session with: keel resume "
        f"{sid} --max-tokens-budget {2 * cap}",
    ]
    assert (project / "log").read_text(encoding="utf-8") == "one\n"  # the second call did not run
    (path,) = session_files(isolated_env)
    meta = read_records(path).records[0].payload
    assert meta.fingerprint.max_tokens == DEFAULT_UNATTENDED_TOKENS  # type: ignore[union-attr]

    # Configurable: a flag (0 turns it off), or budget.tokens in settings.
    (project / "log").unlink()
    out = keel("-p", "go", "--model", f"scripted:{script}", "--max-tokens-budget", "0", cwd=project)
    assert (out.returncode, out.stdout) == (0, "done\n"), out.stderr
    (project / "log").unlink()
    settings = project / ".keel" / "settings.local.json"
    settings.parent.mkdir()
    settings.write_text(json.dumps({"budget": {"tokens": 2 * cap}}), encoding="utf-8")
    out = keel("-p", "go", "--model", f"scripted:{script}", cwd=project)
    assert (out.returncode, out.stdout) == (0, "done\n"), out.stderr


async def test_a_subagent_has_a_token_budget_of_its_own(project: Path) -> None:
    parent = "PARENT: look"
    provider = RoutedProvider(
        {
            parent: [
                reply("", ("task", {"description": "spend", "prompt": "CHILD: spend"})),
                reply("The child stopped."),
            ],
            "CHILD": [
                reply("", ("ls", {}), usage=Usage(DEFAULT_UNATTENDED_TOKENS - 50_000, 1_000)),
                reply("", ("ls", {}), usage=Usage(49_000, 1_000)),
                reply("unreached"),
            ],
        }
    )
    # An interactive parent: no token budget of its own.
    agent = Agent(
        provider=provider,
        model="scripted",
        tools=builtin_tools(),
        cwd=project,
        system="p",
        gate=AllowAll(),
    )
    assert agent.limits.max_tokens is None
    agent.auto_compact = False  # the child's two responses reach the budget as they are
    enable_subagents(agent, load_agent_types(project, user_dir=None, home=project / "no-home"))
    result = await agent.run(parent)
    await agent.aclose()
    assert (result.stop_reason, result.text) == ("end_turn", "The child stopped.")
    # Its second request would reread its ~9.95M-token context with 49,000 tokens left.
    assert len(provider.of("CHILD")) == 1
    report = provider.of(parent)[1].messages[-1].blocks[0]
    assert isinstance(report, ToolResult)
    assert report.is_error
    cap = DEFAULT_UNATTENDED_TOKENS
    assert report.text.startswith(
        "the general subagent stopped at its own token budget (budget: 49,000 tokens left of "
        f"the {cap:,}-token budget; the next request needs ~9,95"
    )
    # The child's spend counts in the parent's.
    assert agent.spend.usage.total == cap - 49_000 + 2 * 120


# -- 3. thinking and effort in the resume fingerprint ---------------------------------------------


async def test_the_fingerprint_holds_thinking_and_effort(project: Path, tmp_path: Path) -> None:
    thinking = new_agent(project, [], tmp_path / "s", effort="high")
    plain = new_agent(project, [], tmp_path / "s")
    stored, current = thinking.fingerprint(), plain.fingerprint()
    assert (stored.thinking, stored.effort) == ("on", "high")
    assert (current.thinking, current.effort) == ("off", None)
    assert replace(stored, thinking="off", effort=None) == current  # nothing else differs
    assert Fingerprint.from_json(json.loads(json.dumps(stored.to_json()))) == stored
    assert thinking.session is not None
    state = fold(read_records(thinking.session.path).records)
    await thinking.aclose()
    await plain.aclose()
    session = replace(state, meta=replace(state.meta, fingerprint=stored))
    with pytest.raises(UserError) as info:
        check_resume(session, current, force=False)
    assert info.value.one_line() == (
        f"session {state.meta.id} was made with a different configuration: thinking: on -> off; "
        "effort: high -> none (hint: resume with the same model and settings, or pass --force "
        "to accept the change)"
    )
    assert check_resume(session, current, force=True) == [
        "thinking: on -> off",
        "effort: high -> none",
    ]
    # A file written before thinking and effort were recorded is not refused for them.
    old = replace(session, meta=replace(state.meta, fingerprint=replace(stored, thinking="")))
    assert check_resume(old, current, force=False) == []


def test_resume_with_another_effort_is_refused_unless_forced(
    project: Path, tmp_path: Path, isolated_env: Path
) -> None:
    turns: list[dict[str, object]] = [
        {"tool_calls": [{"name": "bash", "input": {"command": "echo one >> log"}}]},
        {"text": "resumed"},
    ]
    script = write_script(tmp_path / "s.json", turns)
    model = f"scripted:{script}"
    out = keel("-p", "go", "--model", model, "--effort", "high", "--max-turns", "1", cwd=project)
    assert out.returncode == 3, out.stderr
    (path,) = session_files(isolated_env)
    sid = path.stem
    out = keel("resume", sid, "--model", model, "--effort", "low", cwd=project)
    assert out.returncode == 2
    assert unsandboxed_line_dropped(out.stderr) == (
        f"keel: error: session {sid} was made with a different configuration: effort: high -> "
        "low (hint: resume with the same model and settings, or pass --force to accept the "
        "change)\n"
    )
    force = ("--effort", "low", "--max-turns", "2", "--force")
    out = keel("resume", sid, "--model", model, *force, cwd=project)
    assert out.returncode == 0, out.stderr
    assert unsandboxed_line_dropped(out.stderr).splitlines() == [
        "keel: resuming with max_turns: 1 -> 2 (as given)",  # a limit given needs no --force
        "keel: warning: resuming despite a changed configuration: effort: high -> low",
    ]
    assert out.stdout == "resumed\n"


# -- 4. the Stop hook also runs on a refusal ------------------------------------------------------


def refusal(text: str) -> Reply:
    return Reply(Message("assistant", (Text(text),)), Usage(10, 5), "refusal")


async def test_the_stop_hook_runs_on_a_refusal_and_may_send_the_model_back(
    project: Path, tmp_path: Path
) -> None:
    log = tmp_path / "stop.log"
    stop = script(
        project,
        "stop.py",
        "#!" + sys.executable + "\nimport json, sys\n"
        "p = json.load(sys.stdin)\n"
        f"open({str(log)!r}, 'a').write(p['hook_event_name'] + ' ' + str(p['stop_hook_active']) + '\\n')\n"
        "if not p['stop_hook_active']:\n"
        "    print(json.dumps({'decision': 'block', 'reason': 'answer the safe part'}))\n",
    )
    write_hooks(project, {"Stop": hook(stop)})
    agent, provider = agent_with(
        project, [refusal("I can't help with that."), reply("Here is the safe part.")]
    )
    result = await agent.run("go")
    assert (result.stop_reason, result.text) == ("end_turn", "Here is the safe part.")
    assert log.read_text(encoding="utf-8").splitlines() == ["Stop False", "Stop True"]
    assert provider.requests[1].messages[-1] == Message(
        "user", (Text('<hook-feedback source="Stop">\nanswer the safe part\n</hook-feedback>'),)
    )


async def test_a_refusal_the_stop_hook_lets_stand_ends_as_refusal(
    project: Path, tmp_path: Path
) -> None:
    log = tmp_path / "stop.log"
    stop = script(project, "stop.sh", f"#!/bin/bash\ncat > /dev/null\necho ran >> {log}\n")
    write_hooks(project, {"Stop": hook(stop)})
    agent, provider = agent_with(project, [refusal("No.")])
    result = await agent.run("go")
    assert (result.stop_reason, len(provider.requests)) == ("refusal", 1)
    assert log.read_text(encoding="utf-8") == "ran\n"
    halt = script(
        project,
        "halt.sh",
        '#!/bin/bash\ncat > /dev/null\necho \'{"continue": false, "stopReason": "enough"}\'\n',
    )
    write_hooks(project, {"Stop": hook(halt)})
    agent, _ = agent_with(project, [refusal("No.")])
    assert (await agent.run("go")).stop_reason == "hook_stopped"


# -- 5. checkpoints begun by the loop, for every front end; `keel undo SESSION` ---------------------


async def test_a_library_run_with_a_session_can_be_undone(project: Path, tmp_path: Path) -> None:
    steps = [reply("", ("write", {"path": "new.md", "content": "x\n"})), reply("Written.")]
    agent = new_agent(project, steps, tmp_path / "s")
    assert agent.ctx.checkpoints is None  # nobody set a store: the loop opens one
    await agent.run("write new.md")
    assert (project / "new.md").exists()
    summary = agent.undo()
    assert summary.removed == (project / "new.md",)
    assert not (project / "new.md").exists()
    assert agent.session is not None
    path = agent.session.path
    await agent.aclose()
    assert kinds(path)[-1] == "undo"


async def test_a_store_that_cannot_open_warns_and_the_run_goes_on(
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from keel.checkpoints import Checkpoints

    def broken(path: Path) -> Checkpoints:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(Checkpoints, "for_session", broken)
    agent = new_agent(project, [reply("Fine.")], tmp_path / "s")
    events: list[Event] = []
    result = await agent.run("hi", events.append)
    await agent.aclose()
    assert (result.stop_reason, agent.ctx.checkpoints) == ("end_turn", None)
    warnings = [e.text for e in events if isinstance(e, Notice) and e.level == "warning"]
    assert len(warnings) == 1
    assert warnings[0].startswith(
        "/undo is off for this prompt: cannot open checkpoints: [Errno 13] Permission denied"
    )


def test_keel_undo_puts_back_what_keel_p_changed(
    project: Path, tmp_path: Path, isolated_env: Path
) -> None:
    # One script for the session's three prompts (a scripted model picks its step by history).
    script = write_script(
        tmp_path / "s.json",
        [
            {"tool_calls": [{"name": "read", "input": {"path": "app.py"}}]},
            {
                "tool_calls": [
                    {
                        "name": "edit",
                        "input": {"path": "app.py", "old_string": "hello", "new_string": "bye"},
                    },
                    {"name": "write", "input": {"path": "docs/new.md", "content": "new\n"}},
                ]
            },
            {"text": "changed"},
            {"tool_calls": [{"name": "read", "input": {"path": "util.py"}}]},
            {"tool_calls": [{"name": "write", "input": {"path": "util.py", "content": "X = 2\n"}}]},
            {"text": "util changed"},
            {"text": "noted", "expect": {"last_user_contains": "The user ran /undo"}},
        ],
    )
    bypass = ("--mode", "bypass")
    out = keel("-p", "change app.py", "--model", f"scripted:{script}", *bypass, cwd=project)
    assert out.returncode == 0, out.stderr
    (path,) = session_files(isolated_env)
    sid = path.stem
    out = keel("-p", "--resume", sid, "change util.py", *bypass, cwd=project)
    assert out.returncode == 0, out.stderr
    app = project / "app.py"
    assert app.read_text(encoding="utf-8").startswith("def main():\n    print('bye')")
    assert (project / "util.py").read_text(encoding="utf-8") == "X = 2\n"

    out = keel("undo", sid, "--list", cwd=project)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [line.split("  ", 1)[0] for line in lines] == ["1", "2"]
    assert lines[0].endswith("“change util.py”  util.py")
    assert lines[1].endswith("“change app.py”  app.py, docs/new.md")

    out = keel("undo", sid[:12], cwd=project)  # a prefix will do
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "undone: “change util.py”",
        "  restored util.py",
        f'keel: the model is told with the next prompt: keel -p --resume {sid} "…"',
    ]
    assert (project / "util.py").read_text(encoding="utf-8") == "X = 1\n"
    assert app.read_text(encoding="utf-8").startswith("def main():\n    print('bye')")

    out = keel("undo", sid, cwd=project)  # one further
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "undone: “change app.py”",
        "  restored app.py",
        "  removed docs (the prompt created it)",
        "  removed docs/new.md (the prompt created it)",
        f'keel: the model is told with the next prompt: keel -p --resume {sid} "…"',
    ]
    assert app.read_text(encoding="utf-8").startswith("def main():\n    print('hello')")
    assert not (project / "docs" / "new.md").exists()
    assert kinds(path).count("undo") == 2

    out = keel("undo", sid, cwd=project)
    assert (out.returncode, out.stdout) == (2, "")
    assert out.stderr == (
        f"keel: error: nothing to undo in session {sid} (hint: undo covers keel's file edits "
        "and bash commands' changes in the project; `keel undo ID --list` shows what can be "
        "undone)\n"
    )
    out = keel("undo", "nosuchsession", cwd=project)
    assert out.returncode == 2
    assert out.stderr == (
        "keel: error: no session 'nosuchsession' (hint: `keel sessions list --all` shows every "
        "session)\n"
    )
    # The model hears of the undos with the session's next prompt.
    out = keel("-p", "--resume", sid, "what now?", *bypass, cwd=project)
    assert (out.returncode, out.stdout) == (0, "noted\n"), out.stderr


# -- 7. numeric flags refuse nan, inf and negatives ---------------------------------------------


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--max-budget-usd", "nan", "must be a positive number of dollars, not 'nan'"),
        ("--max-budget-usd", "inf", "must be a positive number of dollars, not 'inf'"),
        ("--max-budget-usd", "-1", "must be a positive number of dollars, not '-1'"),
        ("--max-budget-usd", "0", "must be a positive number of dollars, not '0'"),
        ("--max-budget-usd", "five", "must be a positive number of dollars, not 'five'"),
        (
            "--max-tokens-budget",
            "-5",
            "must be a whole number from 0 to 1,000,000,000,000 (0: no token budget), not '-5'",
        ),
        (
            "--max-tokens-budget",
            "1e9",
            "must be a whole number from 0 to 1,000,000,000,000 (0: no token budget), not '1e9'",
        ),
        ("--max-retries", "-1", "must be a whole number from 0 to 20, not '-1'"),
        ("--max-retries", "1000", "must be a whole number from 0 to 20, not '1000'"),
    ],
)
def test_numeric_flags_refuse_nonsense(project: Path, flag: str, value: str, message: str) -> None:
    for command in (["-p", "hi"], ["resume", "someid"]):
        out = keel(*command, flag, value, "--model", "scripted:x.json", cwd=project)
        assert out.returncode == 2
        assert out.stderr == (
            f"keel: error: argument {flag}: {message} (hint: run `keel --help` for usage)\n"
        )


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0, 0.0])
def test_limits_refuse_a_nan_budget(bad: float) -> None:
    with pytest.raises(UserError) as info:
        Limits(max_usd=bad)
    assert info.value.one_line() == f"the USD budget must be a positive number, not {bad}"
