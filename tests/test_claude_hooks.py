"""Claude Code–format guard hooks, written for these tests the way published guards are (Python,
Node and shell with jq): they check `tool_name` and `tool_input` themselves, so they only work
if keel sends exactly what Claude Code sends. Each runs end to end through `keel -p` with a
scripted model, and the tests assert the tool result the model got and that the side effect did
not happen. Plus the payload table itself, every event keel runs, http and prompt hooks, and
hooks that fail loudly."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from keel.hooks import claude
from keel.hooks.config import HookCommand
from keel.hooks.runner import HookRunner
from keel.permissions.sandbox import probe
from tests.test_cli import keel, write_script

PY_GUARD = """#!{python}
# bash guard in the style of published PreToolUse validators: checks tool_name itself
import json, re, sys
data = json.load(sys.stdin)
if data.get("tool_name") != "Bash":
    sys.exit(0)
command = data.get("tool_input", {{}}).get("command", "")
if re.search(r"\\brm\\s+-[a-zA-Z]*r[a-zA-Z]*f|\\brm\\s+-[a-zA-Z]*f[a-zA-Z]*r", command):
    print("Blocked: rm -rf is not allowed", file=sys.stderr)
    sys.exit(2)
if re.match(r"^grep\\b", command):
    print("Use 'rg' (ripgrep) instead of 'grep' for better performance", file=sys.stderr)
    sys.exit(2)
sys.exit(0)
"""

NODE_GUARD = """#!/usr/bin/env node
// protects .env files from Read/Edit/Write, answering with JSON as Claude Code documents
const path = require("path");
let raw = "";
process.stdin.on("data", (c) => (raw += c));
process.stdin.on("end", () => {
  const data = JSON.parse(raw);
  const tools = ["Read", "Edit", "MultiEdit", "Write"];
  if (!tools.includes(data.tool_name)) process.exit(0);
  const file = (data.tool_input && data.tool_input.file_path) || "";
  if (!path.isAbsolute(file)) process.exit(0);
  if (path.basename(file).startsWith(".env")) {
    console.log(JSON.stringify({
      hookSpecificOutput: {
        hookEventName: "PreToolUse",
        permissionDecision: "deny",
        permissionDecisionReason: "Access to " + path.basename(file) + " is blocked",
      },
    }));
  }
  process.exit(0);
});
"""

SHELL_GUARD = """#!/bin/bash
# git guard with jq, as shell hooks are usually written
input=$(cat)
tool=$(echo "$input" | jq -r '.tool_name')
cmd=$(echo "$input" | jq -r '.tool_input.command // empty')
if [ "$tool" = "Bash" ] && echo "$cmd" | grep -qE 'git +reset +--hard'; then
  echo "git reset --hard destroys uncommitted work; blocked" >&2
  exit 2
fi
exit 0
"""


def guard(directory: Path, name: str, body: str) -> Path:
    path = directory / name
    path.write_text(body, encoding="utf-8")
    path.chmod(0o755)
    return path


def settings(path: Path, hooks: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"hooks": hooks}), encoding="utf-8")


def entry(command: str, matcher: str = "*", **extra: Any) -> list[dict[str, Any]]:
    return [{"matcher": matcher, "hooks": [{"type": "command", "command": command, **extra}]}]


def run(
    project: Path, tmp_path: Path, *calls: dict[str, Any], args: tuple[str, ...] = ()
) -> tuple[list[str], str]:
    """`keel -p` with a model that makes `calls` one by one: the tool results it got, and the
    notices and stderr."""
    turns: list[dict[str, object]] = [{"tool_calls": [c]} for c in calls]
    turns.append({"text": "done"})
    script = write_script(tmp_path / "script.json", turns)
    out = keel(
        "-p",
        "go",
        "--model",
        f"scripted:{script}",
        "--output-format",
        "stream-json",
        *args,
        cwd=project,
    )
    assert out.returncode == 0, out.stderr
    events = [json.loads(line) for line in out.stdout.splitlines()]
    notices = [e["text"] for e in events if e["type"] == "notice"]
    results = [e["output"] for e in events if e["type"] == "tool_finished"]
    return results, "\n".join([*notices, out.stderr])


@pytest.fixture
def home(isolated_env: Path) -> Path:
    return Path(os.environ["HOME"])


# -- the guards, end to end ------------------------------------------------------------------


def test_python_guard_blocks_rm_rf_and_steers_grep_to_rg(
    project: Path, home: Path, tmp_path: Path
) -> None:
    hook = guard(tmp_path, "bash_guard.py", PY_GUARD.format(python=sys.executable))
    settings(home / ".claude" / "settings.json", {"PreToolUse": entry(str(hook))})
    (project / "build").mkdir()
    (project / "build" / "out.o").write_text("x", encoding="utf-8")
    results, _ = run(
        project,
        tmp_path,
        {"name": "bash", "input": {"command": "rm -rf build"}},
        {"name": "bash", "input": {"command": "grep -r X ."}},
        {"name": "bash", "input": {"command": "echo fine"}},
    )
    assert results == [
        "denied by a PreToolUse hook: Blocked: rm -rf is not allowed",
        "denied by a PreToolUse hook: Use 'rg' (ripgrep) instead of 'grep' for better performance",
        "fine\n[exit code 0]",
    ]
    assert (project / "build" / "out.o").exists()


@pytest.mark.needs("node")
def test_node_guard_keeps_env_files_from_read_edit_and_write(
    project: Path, home: Path, tmp_path: Path
) -> None:
    hook = guard(tmp_path, "protect_env.js", NODE_GUARD)
    settings(
        home / ".claude" / "settings.json",
        {"PreToolUse": entry(f"node {hook}", "Read|Edit|MultiEdit|Write")},
    )
    secret = "API_KEY=sk-live-123\n"
    (project / ".env").write_text(secret, encoding="utf-8")
    results, _ = run(
        project,
        tmp_path,
        {"name": "read", "input": {"path": ".env"}},
        {"name": "read", "input": {"path": "./.env"}},
        {"name": "edit", "input": {"path": ".env", "old_string": "123", "new_string": "0"}},
        {"name": "write", "input": {"path": ".env.local", "content": "A=1"}},
        {"name": "read", "input": {"path": "util.py"}},
    )
    assert results == [
        "denied by a PreToolUse hook: Access to .env is blocked",
        "denied by a PreToolUse hook: Access to .env is blocked",
        "denied by a PreToolUse hook: Access to .env is blocked",
        "denied by a PreToolUse hook: Access to .env.local is blocked",
        "     1\tX = 1",
    ]
    assert (project / ".env").read_text(encoding="utf-8") == secret
    assert not (project / ".env.local").exists()


@pytest.mark.needs("jq", "git")
def test_shell_jq_guard_from_the_project_blocks_git_reset_hard_before_and_after_approval(
    project: Path, home: Path, tmp_path: Path
) -> None:
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], cwd=project, check=True)
    subprocess.run([*git, "add", "."], cwd=project, check=True)
    subprocess.run([*git, "commit", "-qm", "init"], cwd=project, check=True)
    (project / ".claude" / "hooks").mkdir(parents=True)
    hook = guard(project / ".claude" / "hooks", "git_guard.sh", SHELL_GUARD)
    command = '"$CLAUDE_PROJECT_DIR"/.claude/hooks/git_guard.sh'
    settings(project / ".claude" / "settings.json", {"PreToolUse": entry(command, "Bash")})
    assert hook.exists()
    (project / "util.py").write_text("X = 2  # uncommitted work\n", encoding="utf-8")
    call = {"name": "bash", "input": {"command": "git reset --hard"}}
    allowed = ("--allowed-tools", "Bash(git *)")  # the user allows git: only the guard stands
    # Not approved yet: the guard still guards (in a read-only sandbox, heard only when it
    # blocks); where no sandbox runs it cannot, so the call is asked about (headless: refused).
    results, stderr = run(project, tmp_path, call, args=allowed)
    assert (
        "1 project hook(s) are not approved: 1 guard hook(s) among them run in a read-only "
        "sandbox and may only block" in stderr
    )
    (refused,) = results
    if probe().ok:
        assert refused == (
            "denied by a PreToolUse hook: git reset --hard destroys uncommitted work; blocked"
        )
    else:
        assert "no sandbox runs here to run it safely" in refused
    assert (project / "util.py").read_text(encoding="utf-8") == "X = 2  # uncommitted work\n"
    approved = keel("hooks", "approve", cwd=project)
    assert approved.returncode == 0, approved.stderr
    results, _ = run(project, tmp_path, call, args=allowed)
    assert results == [
        "denied by a PreToolUse hook: git reset --hard destroys uncommitted work; blocked"
    ]
    assert (project / "util.py").read_text(encoding="utf-8") == "X = 2  # uncommitted work\n"


def test_updated_input_comes_back_in_keel_fields_with_the_timeout_in_seconds(
    project: Path, home: Path, tmp_path: Path
) -> None:
    """A hook caps Bash's timeout at 1000 ms the way it would in Claude Code: keel kills the
    command after 1 s (not 1000 s)."""
    cap = guard(
        tmp_path,
        "cap.py",
        f"#!{sys.executable}\nimport json, sys\n"
        "d = json.load(sys.stdin)\n"
        "inp = dict(d['tool_input'], timeout=1000)\n"
        "print(json.dumps({'hookSpecificOutput': {'hookEventName': 'PreToolUse',"
        " 'permissionDecision': 'allow', 'updatedInput': inp}}))\n",
    )
    settings(home / ".claude" / "settings.json", {"PreToolUse": entry(str(cap), "Bash")})
    start = time.monotonic()
    results, _ = run(
        project, tmp_path, {"name": "bash", "input": {"command": "sleep 20", "timeout": 600}}
    )
    assert time.monotonic() - start < 15
    assert results == ["[timed out after 1 s; process group killed]"]


def test_permission_request_hooks_answer_for_the_user(
    project: Path, home: Path, tmp_path: Path
) -> None:
    """keel -p cannot ask: a PermissionRequest hook allows one write and denies another."""
    decide = guard(
        tmp_path,
        "decide.py",
        f"#!{sys.executable}\nimport json, sys\n"
        "d = json.load(sys.stdin)\n"
        "assert d['hook_event_name'] == 'PermissionRequest' and d['tool_name'] == 'Write', d\n"
        "ok = d['tool_input']['file_path'].endswith('ok.txt')\n"
        "behavior = {'behavior': 'allow'} if ok else {'behavior': 'deny', 'message': 'not there'}\n"
        "print(json.dumps({'hookSpecificOutput': {'hookEventName': 'PermissionRequest',"
        " 'decision': behavior}}))\n",
    )
    settings(home / ".claude" / "settings.json", {"PermissionRequest": entry(str(decide))})
    results, _ = run(
        project,
        tmp_path,
        {"name": "write", "input": {"path": "ok.txt", "content": "yes"}},
        {"name": "write", "input": {"path": "no.txt", "content": "no"}},
    )
    assert results == [
        "Created ok.txt (1 lines).",
        "denied by a PermissionRequest hook: not there",
    ]
    assert (project / "ok.txt").read_text(encoding="utf-8") == "yes"
    assert not (project / "no.txt").exists()


@pytest.mark.needs("sandbox")  # bash runs unasked only in the sandbox
def test_post_tool_use_failure_gets_the_error(project: Path, home: Path, tmp_path: Path) -> None:
    log = tmp_path / "failure.json"
    settings(
        home / ".claude" / "settings.json",
        {"PostToolUseFailure": entry(f"cat > {log}", "Bash"), "PostToolUse": entry("exit 0")},
    )
    run(project, tmp_path, {"name": "bash", "input": {"command": "echo oops >&2; exit 3"}})
    payload = json.loads(log.read_text(encoding="utf-8"))
    assert payload["hook_event_name"] == "PostToolUseFailure"
    assert payload["tool_name"] == "Bash"
    assert payload["tool_input"] == {"command": "echo oops >&2; exit 3"}
    assert payload["error"] == "Exit code 3\noops"  # Claude Code's shape, no keel marker
    assert payload["is_interrupt"] is False
    assert "tool_response" not in payload


def test_unsupported_and_misspelled_events_are_named_at_startup(
    project: Path, home: Path, tmp_path: Path
) -> None:
    path = home / ".claude" / "settings.json"
    settings(path, {"TeammateIdle": entry("true"), "PreTooluse": entry("true")})
    _, stderr = run(project, tmp_path)
    assert (
        f"{path}: hooks.TeammateIdle: TeammateIdle is a Claude Code hook event keel does not "
        "support; its 1 hook(s) will not run"
    ) in stderr
    assert (
        f"{path}: unknown hook event 'PreTooluse' skipped: not a Claude Code event (did you "
        "mean 'PreToolUse'?)"
    ) in stderr
    listed = keel("hooks", "list", cwd=project)
    unsupported = (
        f"not supported: TeammateIdle (1 hook(s) in {path}): a Claude Code event keel does not run"
    )
    assert unsupported in listed.stdout.splitlines()
    doctor = keel("doctor", cwd=project)
    assert f"  {unsupported}" in doctor.stdout.splitlines()


# -- the payload table -------------------------------------------------------------------------


def test_tool_input_in_claude_codes_fields(tmp_path: Path) -> None:
    cwd = tmp_path
    cases: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
        (
            "bash",
            {"command": "ls", "timeout": 30, "description": "list", "run_in_background": False},
            {"command": "ls", "timeout": 30000, "description": "list", "run_in_background": False},
        ),
        (
            "bash",
            {"command": "ls", "sandbox": False},
            {"command": "ls", "dangerouslyDisableSandbox": True},
        ),
        (
            "read",
            {"path": "a.py", "offset": 3, "limit": 5},
            {"file_path": f"{cwd}/a.py", "offset": 3, "limit": 5},
        ),
        ("write", {"path": "/x/b.py", "content": "c"}, {"file_path": "/x/b.py", "content": "c"}),
        (
            "edit",
            {"path": "a.py", "old_string": "a", "new_string": "b", "replace_all": True},
            {"file_path": f"{cwd}/a.py", "old_string": "a", "new_string": "b", "replace_all": True},
        ),
        (
            "multi_edit",
            {"path": "a.py", "edits": [{"old_string": "a", "new_string": "b"}]},
            {"file_path": f"{cwd}/a.py", "edits": [{"old_string": "a", "new_string": "b"}]},
        ),
        (
            "glob",
            {"pattern": "**/*.py", "path": "src"},
            {"pattern": "**/*.py", "path": f"{cwd}/src"},
        ),
        (
            "grep",
            {"pattern": "X", "path": ".", "glob": "*.py", "ignore_case": True},
            {
                "pattern": "X",
                "path": str(cwd),
                "glob": "*.py",
                "-i": True,
                "output_mode": "content",
                "-n": True,
            },
        ),
        (
            "grep",
            {"pattern": "X", "files_only": True},
            {"pattern": "X", "output_mode": "files_with_matches"},
        ),
        (
            "web_fetch",
            {"url": "https://e.x/", "max_length": 5},
            {"url": "https://e.x/", "max_length": 5},
        ),
        (
            "todo_write",
            {"todos": [{"content": "a", "status": "pending", "active_form": "Doing a"}]},
            {"todos": [{"content": "a", "status": "pending", "activeForm": "Doing a"}]},
        ),
        (
            "task",
            {"description": "d", "prompt": "p", "subagent_type": "explore"},
            {"description": "d", "prompt": "p", "subagent_type": "explore"},
        ),
        ("bash_output", {"id": "b1"}, {"bash_id": "b1"}),
        ("raw_output", {"tool_use_id": "t"}, {"tool_use_id": "t"}),
    ]
    for tool, args, expected in cases:
        assert claude.tool_input(tool, args, cwd) == expected, tool
    assert [claude.tool_name(t) for t in ("bash", "read", "multi_edit", "task", "raw_output")] == [
        "Bash",
        "Read",
        "MultiEdit",
        "Task",
        "raw_output",
    ]
    assert claude.matcher_names("task") == ("task", "Task", "Agent")
    assert claude.matcher_names("bash_kill") == ("bash_kill", "KillShell", "KillBash")
    assert claude.matcher_names("raw_output") == ("raw_output",)
    assert claude.matcher_names("mcp__gh__create") == ("mcp__gh__create",)
    assert [claude.permission_mode(m) for m in ("default", "accept-edits", "bypass", "plan")] == [
        "default",
        "acceptEdits",
        "bypassPermissions",
        "plan",
    ]


def test_updated_input_maps_back(tmp_path: Path) -> None:
    original = {"path": "a.py", "content": "x"}
    sent = claude.tool_input("write", original, tmp_path)
    same = claude.updated_input("write", {**sent, "content": "y"}, sent=sent, original=original)
    assert same == {"path": "a.py", "content": "y"}  # the path as keel had it
    moved = claude.updated_input(
        "write", {**sent, "file_path": "/elsewhere/b.py"}, sent=sent, original=original
    )
    assert moved == {"path": "/elsewhere/b.py", "content": "x"}
    bash = claude.updated_input(
        "bash",
        {"command": "ls", "timeout": 1500, "dangerouslyDisableSandbox": False},
        sent={},
        original={},
    )
    assert bash == {"command": "ls", "timeout": 2, "sandbox": True}
    grep = claude.updated_input(
        "grep",
        {"pattern": "X", "output_mode": "files_with_matches", "-i": True},
        sent={},
        original={},
    )
    assert grep == {"pattern": "X", "files_only": True, "ignore_case": True}


def test_tool_response_in_claude_codes_shapes(tmp_path: Path) -> None:
    cwd = tmp_path
    assert claude.tool_response("bash", {"command": "ls"}, "a\nb\n[exit code 0]", cwd) == {
        "stdout": "a\nb",
        "stderr": "",
        "interrupted": False,
        "isImage": False,
        "noOutputExpected": False,
    }
    read = "     3\tc\n     4\td\n\n[line limit: showed lines 3-4 of 9; continue with offset=5]"
    assert claude.tool_response("read", {"path": "f"}, read, cwd) == {
        "type": "text",
        "file": {
            "filePath": f"{cwd}/f",
            "content": "c\nd\n",
            "numLines": 2,
            "startLine": 3,
            "totalLines": 9,
        },
    }
    assert claude.tool_response(
        "write", {"path": "f", "content": "x"}, "Created f (1 lines).", cwd
    ) == {
        "type": "create",
        "filePath": f"{cwd}/f",
        "content": "x",
        "structuredPatch": [],
        "originalFile": None,
        "userModified": False,
    }
    edit = {"path": "f", "old_string": "a", "new_string": "b"}
    assert claude.tool_response(
        "edit", edit, "Edited f: 1 replacement.", cwd, before="a\n", after="b\n"
    ) == {
        "filePath": f"{cwd}/f",
        "oldString": "a",
        "newString": "b",
        "originalFile": "a\n",
        "structuredPatch": [
            {"oldStart": 1, "oldLines": 1, "newStart": 1, "newLines": 1, "lines": ["-a", "+b"]}
        ],
        "userModified": False,
        "replaceAll": False,
    }
    assert claude.tool_response("glob", {"pattern": "*"}, "a.py\nb.py", cwd, duration_ms=7) == {
        "filenames": [f"{cwd}/a.py", f"{cwd}/b.py"],
        "durationMs": 7,
        "numFiles": 2,
        "truncated": False,
    }
    assert claude.tool_response("grep", {"pattern": "X", "files_only": True}, "a.py", cwd) == {
        "mode": "files_with_matches",
        "filenames": [f"{cwd}/a.py"],
        "numFiles": 1,
    }
    assert claude.tool_response("grep", {"pattern": "X"}, "a.py:1:X = 1\nb.py:2:X", cwd) == {
        "mode": "content",
        "numFiles": 2,
        "filenames": [],
        "content": "a.py:1:X = 1\nb.py:2:X",
        "numLines": 2,
    }
    assert claude.tool_response("raw_output", {}, "text", cwd) == [{"type": "text", "text": "text"}]


def test_every_claude_code_event_is_run_or_reported() -> None:
    assert set(claude.EVENTS) | set(claude.UNSUPPORTED_EVENTS) == set(claude.CLAUDE_EVENTS)
    assert not set(claude.EVENTS) & set(claude.UNSUPPORTED_EVENTS)
    for needed in (
        "PermissionRequest",
        "PostToolUseFailure",
        "SubagentStart",
        "SubagentStop",
        "Notification",
        "PreCompact",
        "SessionStart",
        "SessionEnd",
        "Stop",
        "UserPromptSubmit",
        "PreToolUse",
        "PostToolUse",
    ):
        assert needed in claude.EVENTS


# -- http and prompt hooks -----------------------------------------------------------------------


class _Server:
    def __init__(self, status: int, body: bytes, delay: float = 0.0) -> None:
        self.received: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                outer.received.append(json.loads(self.rfile.read(length)))
                outer.headers.append(dict(self.headers))
                time.sleep(delay)
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/hook"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server_factory() -> Iterator[Any]:
    servers: list[_Server] = []

    def make(status: int, body: bytes, delay: float = 0.0) -> _Server:
        servers.append(_Server(status, body, delay))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


def http_hook(url: str, timeout: float = 10, **extra: Any) -> HookCommand:
    return HookCommand("PreToolUse", "Bash", url, timeout, "personal", "test", kind="http", **extra)


def bash_fields() -> dict[str, Any]:
    return {"tool_name": "Bash", "tool_input": {"command": "rm -rf /"}, "tool_use_id": "t1"}


async def test_http_hook_posts_the_payload_and_its_answer_blocks(
    tmp_path: Path, server_factory: Any
) -> None:
    deny = {"hookSpecificOutput": {"permissionDecision": "deny", "permissionDecisionReason": "no"}}
    server = server_factory(200, json.dumps(deny).encode())
    hook = http_hook(
        server.url,
        headers=(("Authorization", "Bearer $HOOK_TOKEN/${OTHER}"),),
        allowed_env=("HOOK_TOKEN",),
    )
    runner = HookRunner([hook], tmp_path, tmp_path, {"HOOK_TOKEN": "s3", "OTHER": "leak"})
    result = await runner.run("PreToolUse", bash_fields(), match="bash")
    assert (result.permission, result.permission_reason, result.errors) == ("deny", "no", [])
    assert server.received == [
        {
            "session_id": "",
            "transcript_path": "",
            "cwd": str(tmp_path),
            "permission_mode": "default",
            "hook_event_name": "PreToolUse",
            **bash_fields(),
        }
    ]
    assert server.headers[0]["Authorization"] == "Bearer s3/"  # only allowed variables


async def test_http_hook_errors_and_deadline_are_loud(tmp_path: Path, server_factory: Any) -> None:
    failing = server_factory(500, b"boom")
    slow = server_factory(200, b"{}", delay=5)
    runner = HookRunner(
        [http_hook(failing.url), http_hook(slow.url, timeout=1)], tmp_path, tmp_path, {}
    )
    start = time.monotonic()
    result = await runner.run("PreToolUse", bash_fields(), match="bash")
    assert time.monotonic() - start < 3
    assert result.permission is None
    went_ahead = " (it could not block; the call goes on to the permission check)"
    assert result.errors == [
        f"PreToolUse hook `http: {failing.url}` failed: HTTP 500: boom{went_ahead}",
        f"PreToolUse hook `http: {slow.url}` timed out after 1 s and was killed{went_ahead}",
    ]


async def test_prompt_hook_asks_a_model_and_ok_false_blocks(tmp_path: Path) -> None:
    asked: list[tuple[str, str]] = []

    async def model(question: str, name: str) -> str:
        asked.append((question, name))
        if '"rm -rf /"' in question:
            return 'Looks dangerous.\n{"ok": false, "reason": "deletes everything"}'
        return '{"ok": true}'

    hook = HookCommand(
        "PreToolUse",
        "",
        "Is this safe? $ARGUMENTS",
        5,
        "personal",
        "t",
        kind="prompt",
        model="haiku",
    )
    runner = HookRunner([hook], tmp_path, tmp_path, {}, ask_model=model)
    blocked = await runner.run("PreToolUse", bash_fields(), match="bash")
    assert (blocked.block, blocked.permission, blocked.reason) == (
        True,
        "deny",
        "deletes everything",
    )
    assert asked[0][0].startswith('Is this safe? {"session_id": ""')
    assert asked[0][1] == "haiku"
    fields = {**bash_fields(), "tool_input": {"command": "ls"}}
    allowed = await runner.run("PreToolUse", fields, match="bash")
    assert (allowed.block, allowed.permission, allowed.errors) == (False, None, [])


async def test_prompt_hook_deadline_and_bad_answers_are_loud(tmp_path: Path) -> None:
    async def slow(question: str, name: str) -> str:
        await asyncio.sleep(10)
        return "{}"

    async def chatty(question: str, name: str) -> str:
        return "I think it is fine"

    hook = HookCommand("PreToolUse", "", "Safe?", 1, "personal", "t", kind="prompt")
    start = time.monotonic()
    result = await HookRunner([hook], tmp_path, tmp_path, {}, ask_model=slow).run(
        "PreToolUse", bash_fields(), match="bash"
    )
    assert time.monotonic() - start < 3
    went_ahead = " (it could not block; the call goes on to the permission check)"
    assert result.errors == [
        f"PreToolUse hook `prompt: Safe?` timed out after 1 s and was killed{went_ahead}"
    ]
    result = await HookRunner([hook], tmp_path, tmp_path, {}, ask_model=chatty).run(
        "PreToolUse", bash_fields(), match="bash"
    )
    assert result.errors == [
        f'PreToolUse hook `prompt: Safe?` failed: the model did not answer {{"ok": …}}: I think it is fine{went_ahead}'
    ]


def test_prompt_hook_end_to_end_against_a_loopback_model_server(
    project: Path, home: Path, tmp_path: Path
) -> None:
    """The `hooks_model` setting answers on the session's provider (here a loopback Anthropic
    server): its request is a small one with no tools; ok false blocks the call."""
    from keel.llm.messages import Message, Text, ToolUse
    from keel.llm.script import Reply
    from keel.testing.anthropic_server import AnthropicServer

    prompt_hook = {"type": "prompt", "prompt": "Block rm. $ARGUMENTS"}
    keel_settings = Path(os.environ["KEEL_CONFIG_DIR"]) / "settings.json"
    keel_settings.parent.mkdir(parents=True, exist_ok=True)
    keel_settings.write_text(json.dumps({"hooks_model": "claude-haiku-4-5"}), encoding="utf-8")
    settings(
        home / ".claude" / "settings.json",
        {"PreToolUse": [{"matcher": "Bash", "hooks": [prompt_hook]}]},
    )
    (project / "build").mkdir()
    with AnthropicServer(api_key="sk-ant-test") as server:
        server.add(
            Reply(Message("assistant", (ToolUse("toolu_1", "bash", {"command": "rm -rf build"}),))),
            Reply(Message("assistant", (Text('{"ok": false, "reason": "rm is blocked"}'),))),
            Reply(Message("assistant", (Text("done"),))),
        )
        out = keel(
            "-p",
            "go",
            "--model",
            "anthropic/claude-sonnet-4-5",
            cwd=project,
            env={"ANTHROPIC_API_KEY": "sk-ant-test", "ANTHROPIC_BASE_URL": server.url},
        )
        bodies = [r.json for r in server.model_requests]
    assert out.returncode == 0, out.stderr
    assert (project / "build").is_dir()
    hook_request = bodies[1]
    assert hook_request["model"] == "claude-haiku-4-5"
    assert "tools" not in hook_request
    question = hook_request["messages"][0]["content"][0]["text"]
    assert question.startswith('Block rm. {"session_id": "')
    assert '"tool_name": "Bash", "tool_input": {"command": "rm -rf build"}' in question
    result = bodies[2]["messages"][-1]["content"][0]
    assert result["tool_use_id"] == "toolu_1"
    assert result["is_error"] is True
    assert result["content"] == [
        {"type": "text", "text": "denied by a PreToolUse hook: rm is blocked"}
    ]


# -- the other events, with Claude Code's fields ----------------------------------------------------


def recorder(tmp_path: Path, log: Path) -> str:
    """A hook that appends its payload to `log`, one JSON per line."""
    path = guard(
        tmp_path,
        "record.py",
        f"#!{sys.executable}\nimport json, sys\n"
        f"open({str(log)!r}, 'a').write(json.dumps(json.load(sys.stdin)) + '\\n')\n",
    )
    return str(path)


def loaded(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]


async def test_subagent_start_and_stop_carry_the_agent_and_start_adds_context(
    project: Path, tmp_path: Path
) -> None:
    from keel.agent.loop import Agent
    from keel.agent.subagents import enable_subagents, load_agent_types
    from keel.hooks.config import HookConfig
    from keel.llm.messages import Text
    from keel.llm.script import reply
    from keel.session.store import SessionLog
    from keel.testing.routing import RoutedProvider
    from keel.tools.builtin import builtin_tools

    log = tmp_path / "events.jsonl"
    record = recorder(tmp_path, log)
    context = guard(
        tmp_path,
        "context.sh",
        "#!/bin/bash\ncat > /dev/null\n"
        'echo \'{"hookSpecificOutput": {"hookEventName": "SubagentStart", '
        '"additionalContext": "the repo uses tabs"}}\'\n',
    )
    hooks = [
        HookCommand("SubagentStart", "explore", record, 10, "personal", "t"),
        HookCommand("SubagentStart", "Explore|explore", str(context), 10, "personal", "t"),
        HookCommand("SubagentStop", "", record, 10, "personal", "t"),
        HookCommand("Stop", "", record, 10, "personal", "t"),
    ]
    assert HookConfig(hooks).hooks == hooks
    provider = RoutedProvider(
        {
            "PARENT": [
                reply(
                    "",
                    (
                        "task",
                        {"description": "d", "prompt": "CHILD: look", "subagent_type": "explore"},
                    ),
                ),
                reply("parent done"),
            ],
            "CHILD": [reply("child report")],
        }
    )
    agent = Agent(
        provider=provider, model="scripted", tools=builtin_tools(), cwd=project, system="s"
    )
    agent.session = SessionLog.create(cwd=project, model="scripted", directory=tmp_path / "s")
    enable_subagents(agent, load_agent_types(project, user_dir=None, home=project / "no-home"))
    agent.hooks = HookRunner(hooks, project, project, dict(os.environ))
    try:
        await agent.run("PARENT: go")
    finally:
        await agent.aclose()
    start, stop, parent_stop = loaded(log)
    child_id = start["agent_id"]
    session_uuid = claude.hook_session_id(agent.session_id)
    transcript = agent.session.path.with_name(f"{agent.session.path.stem}.transcript")
    assert start == {
        "session_id": session_uuid,
        "transcript_path": str(transcript / f"{session_uuid}.jsonl"),
        "cwd": str(project),
        "prompt_id": parent_stop["prompt_id"],
        "hook_event_name": "SubagentStart",
        "agent_id": child_id,
        "agent_type": "explore",
    }
    assert child_id != agent.session_id
    assert stop["hook_event_name"] == "SubagentStop"
    assert stop["session_id"] == session_uuid  # the parent's, not the child's
    assert (stop["agent_id"], stop["agent_type"]) == (child_id, "explore")
    assert stop["agent_transcript_path"].endswith(f"agent-{child_id}.jsonl")
    side = [
        json.loads(line)
        for line in Path(stop["agent_transcript_path"]).read_text(encoding="utf-8").splitlines()
    ]
    assert [(x["type"], x["isSidechain"], x["agentId"], x["sessionId"]) for x in side] == [
        ("user", True, child_id, session_uuid),
        ("assistant", True, child_id, session_uuid),
    ]
    assert side[1]["message"]["content"] == [{"type": "text", "text": "child report"}]
    assert (stop["stop_hook_active"], stop["last_assistant_message"]) == (False, "child report")
    assert parent_stop["hook_event_name"] == "Stop"
    assert parent_stop["last_assistant_message"] == "parent done"
    # The child's own context opens its first message; the hook's context follows, then the task.
    first = provider.of("CHILD")[0].messages[0]
    opening, task = (b.text for b in first.blocks if isinstance(b, Text))
    assert opening.startswith(f"<context>\n<env>\nWorking directory: {project}\n")
    assert opening.endswith("\n</context>")
    assert task == (
        '<hook-context source="SubagentStart">\nthe repo uses tabs\n</hook-context>\n\nCHILD: look'
    )


async def test_session_start_sources_pre_compact_and_session_end_reasons(
    project: Path, tmp_path: Path
) -> None:
    from keel.agent.loop import Agent
    from keel.llm.providers.scripted import ScriptedProvider
    from keel.llm.script import reply
    from keel.tools.builtin import builtin_tools

    log = tmp_path / "events.jsonl"
    record = recorder(tmp_path, log)
    hooks = [
        HookCommand(event, "", record, 10, "personal", "t")
        for event in ("SessionStart", "PreCompact", "SessionEnd")
    ]
    provider = ScriptedProvider([reply("a"), reply("<summary>s</summary>"), reply("b")])
    agent = Agent(
        provider=provider, model="scripted", tools=builtin_tools(), cwd=project, system="s"
    )
    agent.hooks = HookRunner(hooks, project, project, dict(os.environ))
    await agent.run("one")
    await agent.compact("keep the API notes")
    await agent.run("two")
    await agent.aclose("prompt_input_exit")
    got = [
        {
            k: v
            for k, v in e.items()
            if k
            in ("hook_event_name", "source", "model", "trigger", "custom_instructions", "reason")
        }
        for e in loaded(log)
    ]
    assert got == [
        {"hook_event_name": "SessionStart", "source": "startup", "model": "scripted"},
        {
            "hook_event_name": "PreCompact",
            "trigger": "manual",
            "custom_instructions": "keep the API notes",
        },
        {"hook_event_name": "SessionStart", "source": "compact", "model": "scripted"},
        {"hook_event_name": "SessionEnd", "reason": "prompt_input_exit"},
    ]


def test_pick_model_for_prompt_hooks() -> None:
    from keel.hooks.model import pick_model

    assert pick_model("", provider="anthropic", session_model="s") == "s"
    assert (
        pick_model("claude-haiku-4-5", provider="anthropic", session_model="s")
        == "claude-haiku-4-5"
    )
    assert (
        pick_model("anthropic/claude-haiku-4-5", provider="anthropic", session_model="s")
        == "claude-haiku-4-5"
    )
    assert pick_model("openai/gpt-5-mini", provider="anthropic", session_model="s") == "s"
    assert pick_model("haiku", provider="openai", session_model="s") == "s"


def test_project_http_and_prompt_hooks_wait_for_approval_pinned_to_what_they_do(
    project: Path,
) -> None:
    from keel.hooks.config import load_hooks

    def project_hooks(url: str, header: str) -> Any:
        hook = {"type": "http", "url": url, "headers": {"X-Key": header}}
        prompt = {"type": "prompt", "prompt": "Is it safe? $ARGUMENTS"}
        settings(
            project / ".claude" / "settings.json",
            {"PreToolUse": [{"matcher": "Bash", "hooks": [hook, prompt]}]},
        )
        return load_hooks(project, keel_user_dir=project / "u", home=project / "h")

    first = project_hooks("http://127.0.0.1:9/a", "1")
    assert [(h.kind, h.command, h.source) for h in first.hooks] == [
        ("http", "http://127.0.0.1:9/a", "shared"),
        ("prompt", "Is it safe? $ARGUMENTS", "shared"),
    ]
    assert first.runnable(set()) == []
    pin = first.shared_hash()
    assert [h.kind for h in first.runnable({pin})] == ["http", "prompt"]
    assert project_hooks("http://127.0.0.1:9/b", "1").shared_hash() != pin  # another URL
    assert project_hooks("http://127.0.0.1:9/a", "2").shared_hash() != pin  # other headers


def test_claude_code_hook_options_keel_does_not_honour_are_named(project: Path) -> None:
    from keel.hooks.config import load_hooks

    path = project / ".claude" / "settings.local.json"
    hook = {
        "type": "command",
        "command": "true",
        "async": True,
        "if": "Bash(git *)",
        "statusMessage": "x",
    }
    settings(path, {"PostToolUse": [{"matcher": "Bash", "hooks": [hook]}]})
    config = load_hooks(project, keel_user_dir=project / "u", home=project / "h")
    assert config.warnings == [
        f"{path}: hooks.PostToolUse[0].hooks[0]: if not supported by keel; the hook runs "
        "on every match in the background"
    ]
    assert [h.command for h in config.hooks] == ["true"]


def test_a_guard_that_crashes_or_hangs_is_loud_end_to_end(
    project: Path, home: Path, tmp_path: Path
) -> None:
    """As in Claude Code, a PreToolUse hook that crashes or times out does not block; keel says
    so on stderr, naming the hook, every time."""
    crash = guard(
        tmp_path,
        "crash.py",
        f"#!{sys.executable}\nimport json, sys\nraise SystemExit(json.load(sys.stdin)['nope'])\n",
    )
    hang = guard(tmp_path, "hang.sh", "#!/bin/bash\n(sleep 60; echo late) &\nsleep 60\n")
    settings(
        home / ".claude" / "settings.json",
        {"PreToolUse": entry(str(crash), "Bash") + entry(str(hang), "Bash", timeout=1)},
    )
    start = time.monotonic()
    results, stderr = run(project, tmp_path, {"name": "bash", "input": {"command": "echo ran"}})
    assert time.monotonic() - start < 20
    assert results == ["ran\n[exit code 0]"]
    went_ahead = "(it could not block; the call goes on to the permission check)"
    (crashed,) = [line for line in stderr.splitlines() if f"hook `{crash}`" in line]
    assert f"PreToolUse hook `{crash}` exited with 1: Traceback" in crashed
    assert crashed.endswith(went_ahead)
    assert f"PreToolUse hook `{hang}` timed out after 1 s and was killed {went_ahead}" in stderr
