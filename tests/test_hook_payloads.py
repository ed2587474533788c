"""keel's hook payloads against those real Claude Code sent (tests/fixtures/claude_code_payloads,
recorded from Claude Code 2.1.197 by its record.py): the same scripted session, played by
`keel -p` with a scripted model, must give every hook the same payloads, field for field, after
the normalisation both sides share (paths, ids, times). Then hooks written the way published
ones are read what they need: the diff of an edit, a UUID session id, the token counts of the
transcript. And the events and `async` hooks keel added run as Claude Code runs them.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from keel.hooks import claude
from tests.fixtures.claude_code_payloads.scenario import FILES, PROMPT, STEPS, normalise
from tests.test_cli import keel, write_script

FIXTURES = Path(__file__).parent / "fixtures" / "claude_code_payloads"
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def user_hooks(home: Path, hooks: dict[str, list[dict[str, Any]]]) -> None:
    """The user's own Claude Code settings (~/.claude/settings.json): they run unasked."""
    path = home / "user-home" / ".claude" / "settings.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"hooks": hooks}), encoding="utf-8")


def command(script: Path, **extra: Any) -> list[dict[str, Any]]:
    return [{"matcher": "", "hooks": [{"type": "command", "command": str(script), **extra}]}]


def executable(path: Path, body: str) -> Path:
    path.write_text(body, encoding="utf-8")
    path.chmod(0o755)
    return path


def recorder(directory: Path, log: Path) -> Path:
    return executable(
        directory / "record.py",
        f"#!{sys.executable}\nimport json, sys\n"
        f"with open({str(log)!r}, 'a') as f:\n"
        "    f.write(json.dumps(json.load(sys.stdin)) + '\\n')\n",
    )


@pytest.fixture
def scenario(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    for name, text in FILES.items():
        (root / name).write_text(text, encoding="utf-8")
    return root


def play(project: Path, tmp_path: Path, *extra: str) -> Any:
    turns: list[dict[str, object]] = [
        {"tool_calls": [{"id": f"toolu_{i:02d}", "name": name, "input": args}]}
        for i, (_, _, name, args) in enumerate(STEPS)
    ]
    turns.append({"text": "done"})
    script = write_script(tmp_path / "script.json", turns)
    return keel(
        "-p",
        PROMPT,
        "--model",
        f"scripted:{script}",
        "--allowed-tools",
        "Read,Edit,Write,Bash",
        *extra,
        cwd=project,
        timeout=120,
    )


def test_payloads_match_claude_codes_field_for_field(
    isolated_env: Path, scenario: Path, tmp_path: Path
) -> None:
    log = tmp_path / "payloads.jsonl"
    hook = recorder(tmp_path, log)
    events = ["SessionStart", "UserPromptSubmit", "PreToolUse", "PostToolUse"]
    events += ["PostToolUseFailure", "PostToolBatch", "Stop", "SessionEnd"]
    user_hooks(isolated_env, {event: command(hook) for event in events})
    done = play(scenario, tmp_path, "--effort", "high")
    assert done.returncode == 0, done.stderr
    raw = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
    home = isolated_env / "user-home"
    got = [normalise(p, project=scenario, home=home) for p in raw]
    want = json.loads((FIXTURES / "payloads.json").read_text(encoding="utf-8"))
    # Claude Code documents SessionStart's `model`; its headless run left it out, keel sends it.
    assert got[0].pop("model") == str(tmp_path / "script.json")
    assert [p["hook_event_name"] for p in got] == [p["hook_event_name"] for p in want]
    for mine, theirs in zip(got, want, strict=True):
        if mine["hook_event_name"] == "PostToolBatch":
            # `tool_response` is the text the model got: keel's tools word it in their own way
            # (a shell's output is the same).
            ((call,), (their_call,)) = mine["tool_calls"], theirs["tool_calls"]
            said, their_said = call.pop("tool_response"), their_call.pop("tool_response")
            assert isinstance(said, str)
            if call["tool_name"] == "Bash":
                assert said == their_said
        assert mine == theirs
    # What normalising hid: one UUID per session and per prompt, in every payload.
    assert len({p["session_id"] for p in raw}) == 1
    assert _UUID.match(raw[0]["session_id"])
    prompt_ids = {p.get("prompt_id") for p in raw[1:]}
    assert len(prompt_ids) == 1
    assert _UUID.match(str(prompt_ids.pop()))
    assert "prompt_id" not in raw[0]


def test_transcript_lines_are_claude_codes(
    isolated_env: Path, scenario: Path, tmp_path: Path
) -> None:
    log = tmp_path / "payloads.jsonl"
    user_hooks(isolated_env, {"SessionEnd": command(recorder(tmp_path, log))})
    done = play(scenario, tmp_path)
    assert done.returncode == 0, done.stderr
    (end,) = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
    path = Path(end["transcript_path"])
    assert path.name == f"{end['session_id']}.jsonl"
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    theirs = [
        json.loads(line)
        for line in (FIXTURES / "transcript.jsonl").read_text(encoding="utf-8").splitlines()
    ]
    assert [(x["type"], _content_kinds(x)) for x in lines] == [
        (x["type"], _content_kinds(x)) for x in theirs
    ]
    for mine, claude_line in zip(lines, theirs, strict=True):
        # Every key keel writes is one Claude Code writes, with a value of the same type.
        extra = set(mine) - set(claude_line)
        assert not extra, extra
        for key in mine:
            assert type(mine[key]) is type(claude_line[key]) or claude_line[key] is None, key
        assert mine["sessionId"] == end["session_id"]
        assert mine["cwd"] == str(scenario)
    # The lines chain, and each tool result names the assistant line of its call.
    assert lines[0]["parentUuid"] is None
    for before, after in itertools.pairwise(lines):
        assert after["parentUuid"] == before["uuid"]
        if after["type"] == "user":
            assert after["sourceToolAssistantUUID"] == before["uuid"]
    # The conversation, in Claude Code's tool names and fields.
    uses = [x["message"]["content"][0] for x in lines if x["type"] == "assistant"]
    want_uses = [x["message"]["content"][0] for x in theirs if x["type"] == "assistant"]
    assert [normalise(u, project=scenario, home=scenario) for u in uses] == want_uses
    assert lines[0]["message"] == {"role": "user", "content": PROMPT}
    # What Claude Code records of each call's outcome, as its PostToolUse hooks see it.
    results = [x.get("toolUseResult") for x in lines if x["type"] == "user"]
    want_results = [x.get("toolUseResult") for x in theirs if x["type"] == "user"]
    assert [normalise(r, project=scenario, home=scenario) for r in results] == want_results
    assert lines[-2]["message"]["content"][0]["is_error"] is True
    usage = lines[1]["message"]["usage"]
    assert set(usage) >= {
        "input_tokens",
        "output_tokens",
        "cache_read_input_tokens",
        "cache_creation_input_tokens",
    }


def _content_kinds(line: dict[str, Any]) -> Any:
    content = line["message"]["content"]
    return "text" if isinstance(content, str) else [b["type"] for b in content]


COST_LEDGER = """#!{python}
# A cost ledger as published ones are: on Stop it sums the assistant lines' usage of the
# transcript and appends one line per session to its ledger.
import json, sys
event = json.load(sys.stdin)
tokens = {{"input": 0, "output": 0}}
with open(event["transcript_path"]) as f:
    for line in f:
        entry = json.loads(line)
        if entry.get("type") != "assistant":
            continue
        usage = entry["message"]["usage"]
        tokens["input"] += usage.get("input_tokens", 0)
        tokens["output"] += usage.get("output_tokens", 0)
with open({ledger!r}, "a") as out:
    out.write(json.dumps({{"session": event["session_id"], **tokens}}) + "\\n")
"""

UUID_GUARD = """#!{python}
# Refuses to run for a session whose id is not a UUID, as hooks that key state by it do.
import json, sys, uuid
event = json.load(sys.stdin)
try:
    uuid.UUID(event["session_id"])
except ValueError:
    print("session_id is not a UUID: " + event["session_id"], file=sys.stderr)
    sys.exit(2)
"""

DIFF_LOGGER = """#!/bin/bash
# Keeps the hunks of every edit, read from tool_response.structuredPatch.
jq -c '{{file: .tool_response.filePath, before: .tool_response.originalFile,
        hunks: .tool_response.structuredPatch}}' >> {log}
"""


def test_published_style_hooks_read_usage_uuid_and_hunks(
    isolated_env: Path, scenario: Path, tmp_path: Path
) -> None:
    ledger, diffs = tmp_path / "ledger.jsonl", tmp_path / "diffs.jsonl"
    cost = executable(
        tmp_path / "cost.py", COST_LEDGER.format(python=sys.executable, ledger=str(ledger))
    )
    guard = executable(tmp_path / "uuid_guard.py", UUID_GUARD.format(python=sys.executable))
    differ = executable(tmp_path / "diffs.sh", DIFF_LOGGER.format(log=diffs))
    user_hooks(
        isolated_env,
        {
            "Stop": command(cost),
            "PreToolUse": command(guard),
            "PostToolUse": [
                {"matcher": "Edit|Write", "hooks": [{"type": "command", "command": str(differ)}]}
            ],
        },
    )
    done = play(scenario, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "not a UUID" not in done.stderr
    (entry,) = [json.loads(line) for line in ledger.read_text(encoding="utf-8").splitlines()]
    assert _UUID.match(entry["session"])
    # The scripted model reports no usage: the ledger's sums are the journal's.
    journal = next((isolated_env / "sessions").glob("*/*.jsonl"))
    records = [json.loads(line) for line in journal.read_text(encoding="utf-8").splitlines()]
    usage = [r["usage"] for r in records if r["type"] == "assistant"]
    assert entry["input"] == sum(u.get("input", 0) for u in usage)
    assert entry["output"] == sum(u.get("output", 0) for u in usage)
    assert len(usage) == len(STEPS) + 1
    hunks = [json.loads(line) for line in diffs.read_text(encoding="utf-8").splitlines()]
    assert hunks[0] == {
        "file": str(scenario / "notes.txt"),
        "before": "alpha\nbeta\ngamma\n",
        "hunks": [
            {
                "oldStart": 1,
                "oldLines": 3,
                "newStart": 1,
                "newLines": 3,
                "lines": [" alpha", "-beta", "+BETA", " gamma"],
            }
        ],
    }


def test_session_uuid_is_stable_and_one_to_one() -> None:
    first = claude.hook_session_id("20261202-143046-5e5fe3")
    assert first == claude.hook_session_id("20261202-143046-5e5fe3")
    assert first != claude.hook_session_id("20261202-143046-5e5fe4")
    assert _UUID.match(first)
    already = "0b5e0d7e-8d5c-4a52-9f1e-2f0f5d0f7a11"
    assert claude.hook_session_id(already) == already


def test_read_counts_as_claude_code_counts(tmp_path: Path) -> None:
    text = "a\nb\nc\n"
    numbered = "     1\ta\n     2\tb\n     3\tc"
    whole = claude.tool_response("read", {"path": "f"}, numbered, tmp_path, before=text)
    assert whole["file"] | {"filePath": ""} == {
        "filePath": "",
        "content": "a\nb\nc\n",
        "numLines": 4,
        "startLine": 1,
        "totalLines": 4,
    }
    part = claude.tool_response(
        "read", {"path": "f", "offset": 2, "limit": 1}, "     2\tb", tmp_path, before=text
    )
    assert (part["file"]["content"], part["file"]["numLines"], part["file"]["totalLines"]) == (
        "b",
        1,
        4,
    )
    # A limit that ends on the last line does not reach the empty one after it.
    upto = claude.tool_response(
        "read",
        {"path": "f", "offset": 2, "limit": 2},
        "     2\tb\n     3\tc",
        tmp_path,
        before=text,
    )
    assert (upto["file"]["content"], upto["file"]["numLines"]) == ("b\nc", 2)


def test_no_output_expected_as_claude_code_decides() -> None:
    assert claude.no_output_expected("mkdir -p a && cd a")
    assert claude.no_output_expected("rm -f x; touch y")
    assert not claude.no_output_expected("mkdir a && ls")
    assert not claude.no_output_expected("echo hi")
    assert not claude.no_output_expected("")


def test_structured_patch_marks_a_missing_final_newline() -> None:
    assert claude.structured_patch("a\nb", "a\nb\n") == [
        {
            "oldStart": 1,
            "oldLines": 2,
            "newStart": 1,
            "newLines": 2,
            "lines": [" a", "-b", "\\ No newline at end of file", "+b"],
        }
    ]
    assert claude.structured_patch("same\n", "same\n") == []


# -- the events keel added, and async hooks ------------------------------------------------------


def _agent(project: Path, steps: list[Any], hooks: list[Any], **gate: Any) -> Any:
    from keel.agent.loop import Agent
    from keel.hooks.runner import HookRunner
    from keel.llm.providers.scripted import ScriptedProvider
    from keel.permissions.gate import PermissionGate
    from keel.tools.builtin import builtin_tools

    permissions = PermissionGate("default", project, project, **gate)
    provider = ScriptedProvider(steps)
    agent = Agent(
        provider=provider,
        model="scripted",
        tools=builtin_tools(),
        cwd=project,
        system="s",
        gate=permissions,
    )
    agent.hooks = HookRunner(hooks, project, project, {}, mode=lambda: permissions.mode)
    return agent, provider


def _hook(event: str, command: str, matcher: str = "", **extra: Any) -> Any:
    from keel.hooks.config import HookCommand

    return HookCommand(event, matcher, command, 10, "personal", "t", **extra)


def _calls(*uses: tuple[str, str, dict[str, Any]]) -> Any:
    from keel.llm.messages import Message, ToolUse, Usage
    from keel.llm.script import Reply

    return Reply(Message("assistant", tuple(ToolUse(*u) for u in uses)), Usage(10, 5))


def _say(text: str) -> Any:
    from keel.llm.messages import Message, Text, Usage
    from keel.llm.script import Reply

    return Reply(Message("assistant", (Text(text),)), Usage(10, 5))


def _sent(provider: Any, number: int) -> str:
    return "\n".join(m.text for m in provider.requests[number].messages if m.role == "user")


async def test_async_hook_blocks_nothing_and_its_context_reaches_the_next_request(
    scenario: Path, tmp_path: Path
) -> None:
    done = tmp_path / "async.done"
    slow = executable(
        tmp_path / "lint.sh",
        "#!/bin/bash\ncat > /dev/null\nsleep 0.6\n"
        'echo \'{"hookSpecificOutput": {"hookEventName": "PostToolUse", '
        '"additionalContext": "lint: 2 warnings in notes.txt"}}\'\n'
        f"touch {done}\n",
    )
    steps = [
        _calls(("t1", "read", {"path": "notes.txt"})),
        _calls(("t2", "bash", {"command": "sleep 1.5"})),
        _say("done"),
    ]
    hooks = [_hook("PostToolUse", str(slow), "read", background="async")]
    agent, provider = _agent(scenario, steps, hooks, rules=_allow("bash"))
    try:
        await agent.run("go")
    finally:
        await agent.aclose()
    # The read's result went back at once (the hook was still sleeping), the context later.
    assert "lint: 2 warnings" not in _sent(provider, 1)
    assert _sent(provider, 2).endswith(
        '<hook-context source="PostToolUse">\nlint: 2 warnings in notes.txt\n</hook-context>'
    )
    assert done.exists()


async def test_async_rewake_hook_exit_2_wakes_an_idle_session(
    scenario: Path, tmp_path: Path
) -> None:
    from keel.agent.events import BackgroundFinished

    tests = executable(
        tmp_path / "tests.sh",
        "#!/bin/bash\ncat > /dev/null\nsleep 0.3\necho '2 tests failed: test_notes' >&2\nexit 2\n",
    )
    steps = [_calls(("t1", "read", {"path": "notes.txt"})), _say("done"), _say("fixing")]
    hooks = [_hook("PostToolUse", str(tests), "Read", background="rewake")]
    agent, provider = _agent(scenario, steps, hooks)
    seen: list[Any] = []
    agent.on_background_event = seen.append
    try:
        await agent.run("go")
        for _ in range(50):
            if agent.undelivered:
                break
            await asyncio.sleep(0.1)
        assert seen == [
            BackgroundFinished("asyncRewake", "hook", "exited 2", f"PostToolUse hook `{tests}`")
        ]
        woke = await agent.run_notifications()
    finally:
        await agent.aclose()
    assert woke is not None
    assert woke.text == "fixing"
    assert (
        '<hook-feedback source="PostToolUse">\n2 tests failed: test_notes\n</hook-feedback>'
        in _sent(provider, 2)
    )


async def test_post_tool_batch_sees_the_round_and_its_context_and_exit_2(
    scenario: Path, tmp_path: Path
) -> None:
    log = tmp_path / "batch.jsonl"
    record = recorder(tmp_path, log)
    context = executable(
        tmp_path / "context.sh",
        "#!/bin/bash\ncat > /dev/null\n"
        'echo \'{"hookSpecificOutput": {"hookEventName": "PostToolBatch", '
        '"additionalContext": "both files are generated"}}\'\n',
    )
    steps = [
        _calls(("t1", "read", {"path": "notes.txt"}), ("t2", "bash", {"command": "echo hi"})),
        _say("done"),
    ]
    # PostToolBatch has no matcher in Claude Code: one written anyway changes nothing.
    hooks = [_hook("PostToolBatch", str(record), "Edit"), _hook("PostToolBatch", str(context))]
    agent, provider = _agent(scenario, steps, hooks, rules=_allow("bash"))
    try:
        await agent.run("go")
    finally:
        await agent.aclose()
    (batch,) = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
    assert batch["hook_event_name"] == "PostToolBatch"
    assert batch["permission_mode"] == "default"
    assert batch["tool_calls"] == [
        {
            "tool_name": "Read",
            "tool_input": {"file_path": str(scenario / "notes.txt")},
            "tool_use_id": "t1",
            "tool_response": "     1\talpha\n     2\tbeta\n     3\tgamma",
        },
        {
            "tool_name": "Bash",
            "tool_input": {"command": "echo hi"},
            "tool_use_id": "t2",
            "tool_response": "hi",
        },
    ]
    last = provider.requests[1].messages[-1]
    assert last.text == (
        '<hook-context source="PostToolBatch">\nboth files are generated\n</hook-context>'
    )
    stop = executable(tmp_path / "stop.sh", "#!/bin/bash\necho 'enough' >&2\nexit 2\n")
    agent, provider = _agent(
        scenario,
        [_calls(("t1", "read", {"path": "notes.txt"})), _say("never")],
        [_hook("PostToolBatch", str(stop))],
    )
    try:
        result = await agent.run("go")
    finally:
        await agent.aclose()
    assert result.stop_reason == "hook_stopped"
    assert len(provider.requests) == 1


def _allow(tool: str) -> list[Any]:
    from keel.permissions.rules import parse_rule

    return [parse_rule(tool, "allow", "test")]


async def test_permission_denied_post_compact_and_stop_failure(
    scenario: Path, tmp_path: Path
) -> None:
    from keel.llm.script import Fault
    from keel.permissions.rules import parse_rule

    log = tmp_path / "events.jsonl"
    record = recorder(tmp_path, log)
    retry = executable(
        tmp_path / "retry.sh",
        "#!/bin/bash\ncat > /dev/null\n"
        'echo \'{"hookSpecificOutput": {"hookEventName": "PermissionDenied", "retry": true}}\'\n',
    )
    hooks = [
        _hook("PermissionDenied", str(record), "Bash"),
        _hook("PermissionDenied", str(retry)),
        _hook("PostCompact", str(record)),
        _hook("StopFailure", str(record), "rate_limit"),
    ]
    steps = [
        _calls(("t1", "bash", {"command": "rm -rf build"})),
        _say("ok"),
        _say("<summary>they tried rm</summary>"),
        Fault("status", status=429, message="slow down"),
    ]
    agent, provider = _agent(
        scenario, steps, hooks, rules=[parse_rule("bash(rm *)", "deny", "test")]
    )
    try:
        await agent.run("clean")
        await agent.compact("")
        failed = await agent.run("again")
    finally:
        await agent.aclose()
    assert failed.stop_reason == "error"
    denied, compacted, failure = [
        json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()
    ]
    result = provider.requests[1].messages[-1].tool_results[0]
    assert result.text.endswith("\n(a PermissionDenied hook says you may retry this call)")
    assert {
        k: denied[k] for k in ("hook_event_name", "tool_name", "tool_input", "tool_use_id")
    } == {
        "hook_event_name": "PermissionDenied",
        "tool_name": "Bash",
        "tool_input": {"command": "rm -rf build"},
        "tool_use_id": "t1",
    }
    assert denied["reason"] == result.text.split("\n(a PermissionDenied")[0]
    assert {k: compacted[k] for k in ("hook_event_name", "trigger", "compact_summary")} == {
        "hook_event_name": "PostCompact",
        "trigger": "manual",
        "compact_summary": "they tried rm",
    }
    assert "permission_mode" not in compacted
    assert failure["hook_event_name"] == "StopFailure"
    assert failure["error"] == "rate_limit"
    assert "slow down" in failure["error_details"]


def test_session_uuid_and_transcript_carry_on_across_a_resume(
    isolated_env: Path, scenario: Path, tmp_path: Path
) -> None:
    log = tmp_path / "payloads.jsonl"
    user_hooks(isolated_env, {"UserPromptSubmit": command(recorder(tmp_path, log))})
    model = f"scripted:{tmp_path / 'script.json'}"  # a resume goes on with its next reply
    write_script(tmp_path / "script.json", [{"text": "one"}, {"text": "two"}])
    assert keel("-p", "first", "--model", model, cwd=scenario).returncode == 0
    again = keel("-p", "second", "-c", "--model", model, cwd=scenario)
    assert again.returncode == 0, again.stderr
    one, two = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
    assert one["session_id"] == two["session_id"]
    assert one["transcript_path"] == two["transcript_path"]
    assert one["prompt_id"] != two["prompt_id"]
    lines = [
        json.loads(line)
        for line in Path(two["transcript_path"]).read_text(encoding="utf-8").splitlines()
    ]
    assert [(x["type"], x["message"]["content"]) for x in lines] == [
        ("user", "first"),
        ("assistant", [{"type": "text", "text": "one"}]),
        ("user", "second"),
        ("assistant", [{"type": "text", "text": "two"}]),
    ]
    assert [x.get("promptId") for x in lines if x["type"] == "user"] == [
        one["prompt_id"],
        two["prompt_id"],
    ]
    assert all(b["parentUuid"] == a["uuid"] for a, b in itertools.pairwise(lines))


def test_a_transcript_started_late_begins_with_what_the_journal_holds(
    isolated_env: Path, scenario: Path, tmp_path: Path
) -> None:
    model = f"scripted:{tmp_path / 'script.json'}"  # a resume goes on with its next reply
    write_script(tmp_path / "script.json", [{"text": "one"}, {"text": "two"}])
    assert keel("-p", "first", "--model", model, cwd=scenario).returncode == 0
    log = tmp_path / "payloads.jsonl"
    user_hooks(isolated_env, {"Stop": command(recorder(tmp_path, log))})
    again = keel("-p", "second", "-c", "--model", model, cwd=scenario)
    assert again.returncode == 0, again.stderr
    (stop,) = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
    lines = Path(stop["transcript_path"]).read_text(encoding="utf-8").splitlines()
    assert [json.loads(x)["message"]["content"] for x in lines] == [
        "first",
        [{"type": "text", "text": "one"}],
        "second",
        [{"type": "text", "text": "two"}],
    ]


EXPANSION_GUARD = """#!{python}
# Keeps /deploy out of agent sessions and adds a reminder to /review.
import json, sys
event = json.load(sys.stdin)
with open({log!r}, "a") as f:
    f.write(json.dumps(event) + "\\n")
if event["command_name"] == "deploy":
    print("deploys go through CI, not the agent", file=sys.stderr)
    sys.exit(2)
print("focus on the tests")
"""


def test_user_prompt_expansion_blocks_a_command_or_adds_context(
    isolated_env: Path, scenario: Path, tmp_path: Path
) -> None:
    commands = scenario / ".claude" / "commands"
    commands.mkdir(parents=True)
    (commands / "deploy.md").write_text("Deploy to $ARGUMENTS now.\n", encoding="utf-8")
    (commands / "review.md").write_text("Review the last change.\n", encoding="utf-8")
    log = tmp_path / "expansion.jsonl"
    guard = executable(
        tmp_path / "guard.py", EXPANSION_GUARD.format(python=sys.executable, log=str(log))
    )
    user_hooks(isolated_env, {"UserPromptExpansion": command(guard)})
    nothing = write_script(tmp_path / "none.json", [])
    blocked = keel("-p", "/deploy prod", "--model", f"scripted:{nothing}", cwd=scenario)
    assert "/deploy blocked by a UserPromptExpansion hook: deploys go through CI" in (
        blocked.stderr
    )
    (event,) = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
    assert {k: event[k] for k in event if k not in ("session_id", "transcript_path")} == {
        "cwd": str(scenario),
        "prompt_id": event["prompt_id"],
        "permission_mode": "default",
        "hook_event_name": "UserPromptExpansion",
        "expansion_type": "slash_command",
        "command_name": "deploy",
        "command_args": "prod",
        "command_source": "projectSettings",
        "prompt": "/deploy prod",
    }
    reply = write_script(tmp_path / "reply.json", [{"text": "reviewed"}])
    done = keel("-p", "/review", "--model", f"scripted:{reply}", cwd=scenario)
    assert done.returncode == 0, done.stderr
    journal = max((isolated_env / "sessions").glob("*/*.jsonl"), key=lambda p: p.stat().st_mtime)
    sent = [
        json.loads(line)
        for line in journal.read_text(encoding="utf-8").splitlines()
        if '"type":"user"' in line
    ]
    # The context opens the message; the hook's context follows it, ahead of the command's text.
    opening, text = (block["text"] for block in sent[0]["message"]["content"])
    assert opening.startswith(f"<context>\n<env>\nWorking directory: {scenario}\n")
    assert opening.endswith("\n</context>")
    assert text == (
        "<system-note>\n"
        '<hook-context source="UserPromptExpansion">\nfocus on the tests\n</hook-context>\n'
        "</system-note>\n\nReview the last change."
    )


def test_instructions_loaded_names_each_file_and_why(
    isolated_env: Path, scenario: Path, tmp_path: Path
) -> None:
    def write(path: Path, text: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")

    (scenario / ".git").mkdir()
    write(scenario / "CLAUDE.md", "ROOT: run make test")
    write(scenario / "pkg" / "AGENTS.md", "PKG: generated code")
    write(scenario / "pkg" / "gen.py", "X = 1\n")
    rule = scenario / ".claude" / "rules" / "python.md"
    write(rule, '---\npaths:\n  - "pkg/**/*.py"\n---\nPY: type every function')
    log = tmp_path / "loaded.jsonl"
    user_hooks(isolated_env, {"InstructionsLoaded": command(recorder(tmp_path, log))})
    script = write_script(
        tmp_path / "script.json",
        [{"tool_calls": [{"name": "read", "input": {"path": "pkg/gen.py"}}]}, {"text": "ok"}],
    )
    done = keel("-p", "look", "--model", f"scripted:{script}", cwd=scenario)
    assert done.returncode == 0, done.stderr
    loaded = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
    assert [
        {k: v for k, v in e.items() if k not in ("session_id", "transcript_path", "prompt_id")}
        for e in loaded
    ] == [
        {
            "cwd": str(scenario),
            "hook_event_name": "InstructionsLoaded",
            "file_path": str(scenario / "CLAUDE.md"),
            "memory_type": "Project",
            "load_reason": "session_start",
        },
        {
            "cwd": str(scenario),
            "hook_event_name": "InstructionsLoaded",
            "file_path": str(scenario / "pkg" / "AGENTS.md"),
            "memory_type": "Project",
            "load_reason": "nested_traversal",
            "trigger_file_path": str(scenario / "pkg" / "gen.py"),
        },
        {
            "cwd": str(scenario),
            "hook_event_name": "InstructionsLoaded",
            "file_path": str(rule),
            "memory_type": "Project",
            "load_reason": "path_glob_match",
            "trigger_file_path": str(scenario / "pkg" / "gen.py"),
        },
    ]


def test_hooks_list_says_which_hooks_run_in_the_background(
    isolated_env: Path, scenario: Path
) -> None:
    hook = {"type": "command", "command": "lint.sh"}
    user_hooks(
        isolated_env,
        {
            "PostToolUse": [{"matcher": "Edit", "hooks": [{**hook, "async": True}]}],
            "Stop": [{"matcher": "", "hooks": [{**hook, "asyncRewake": True, "timeout": 300}]}],
        },
    )
    listing = keel("hooks", "list", cwd=scenario)
    settings = isolated_env / "user-home" / ".claude" / "settings.json"
    assert listing.stdout.splitlines() == [
        f"PostToolUse [Edit]: lint.sh  ({settings}, runs, in the background, timeout 60 s)",
        f"Stop: lint.sh  ({settings}, runs, in the background, exit 2 wakes, timeout 300 s)",
    ]
