"""keel's hook payloads against those real Claude Code sent (tests/fixtures/claude_code_payloads,
recorded from Claude Code 2.1.197 by its record.py): the same scripted session, played by
`keel -p` with a scripted model, must give every hook the same payloads, field for field, after
the normalisation both sides share (paths, ids, times). Then hooks written the way published
ones are read what they need: the diff of an edit, a UUID session id, the token counts of the
transcript. And the events and `async` hooks keel added run as Claude Code runs them.
"""

from __future__ import annotations

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
    events += ["PostToolUseFailure", "Stop", "SessionEnd"]
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
