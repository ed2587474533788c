"""A hand-made trace (format v1, /work/briefs/trace_format.md) shared by the stats, ATIF and
OpenTelemetry tests: two prompts; the first reads a file, runs a subagent (`task`), has a
command denied by the user, and its first request is retried after a 529; the second is
compacted first. Times are offsets from T0 so every duration below is exact."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

T0 = 1_764_590_000.0
SID = "20251201-120000-abc123"
SONNET = "anthropic/claude-sonnet-4-5"
HAIKU = "anthropic/claude-haiku-4-5"
READ_OUTPUT = "print('hi')\n" * 100
TOOLS = [
    {
        "name": "bash",
        "description": "Run a command",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
    },
    {
        "name": "read",
        "description": "Read a file",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
    },
    {
        "name": "task",
        "description": "Run a subagent",
        "input_schema": {"type": "object", "properties": {"prompt": {"type": "string"}}},
    },
]


def user(*texts: str) -> dict[str, Any]:
    return {"v": 1, "role": "user", "content": [{"type": "text", "text": t} for t in texts]}


def result(use_id: str, text: str, *, error: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {
        "type": "tool_result",
        "tool_use_id": use_id,
        "content": [{"type": "text", "text": text}],
    }
    if error:
        out["is_error"] = True
    return out


def assistant(model: str, *blocks: dict[str, Any]) -> dict[str, Any]:
    return {
        "v": 1,
        "role": "assistant",
        "content": list(blocks),
        "provider": "anthropic",
        "model": model,
    }


REPLY1 = assistant(
    "claude-sonnet-4-5-20250929",
    {"type": "thinking", "text": "Look first.", "signature": "sig"},
    {"type": "text", "text": "Reading."},
    {"type": "tool_use", "id": "t1", "name": "read", "input": {"path": "app.py"}},
    {"type": "tool_use", "id": "t2", "name": "task", "input": {"prompt": "explore the repo"}},
)
REPLY2 = assistant("claude-haiku-4-5-20251001", {"type": "text", "text": "Found app.py."})
REPLY3 = assistant(
    "claude-sonnet-4-5-20250929",
    {"type": "tool_use", "id": "t3", "name": "bash", "input": {"command": "rm -rf /"}},
)
REPLY4 = assistant(
    "claude-sonnet-4-5-20250929", {"type": "text", "text": "I will not run that. Fixed."}
)
SUMMARY = assistant("claude-sonnet-4-5-20250929", {"type": "text", "text": "Summary: fixed."})
REPLY6 = assistant("claude-sonnet-4-5-20250929", {"type": "text", "text": "Tests pass."})


def usage(inp: int, out: int, read: int = 0, write: int = 0) -> dict[str, int]:
    return {"input": inp, "output": out, "cache_read": read, "cache_write": write}


def response(
    message: dict[str, Any],
    use: dict[str, int],
    cost: float,
    stop: str,
    ttft: float,
    generating: float,
    tps: float,
    *,
    attempts: int = 1,
    notices: tuple[str, ...] = (),
) -> dict[str, Any]:
    return {
        "message": message,
        "usage": use,
        "cost": cost,
        "stop_reason": stop,
        "ttft_ms": ttft,
        "thinking_ms": ttft,
        "generating_ms": generating,
        "duration_ms": 1000.0 if attempts == 1 else 2000.0,
        "output_tokens_per_s": tps,
        "attempts": attempts,
        "notices": list(notices),
    }


def request(
    model: str,
    turn: int,
    total: int,
    messages: list[dict[str, Any]],
    *,
    purpose: str = "turn",
    first: bool = False,
    reset: bool = False,
    system: tuple[str, str] = ("h1", "You are keel."),
    tools: tuple[str, list[dict[str, Any]]] = ("k1", TOOLS),
) -> dict[str, Any]:
    data: dict[str, Any] = {
        "model": model,
        "purpose": purpose,
        "turn": turn,
        "max_tokens": 64000,
        "effort": "high",
        "system_hash": system[0],
        "tools_hash": tools[0],
        "messages_total": total,
        "reset": reset,
        "messages": messages,
    }
    if first:
        data["system"] = system[1]
        data["tools"] = tools[1]
    return data


def http(n: int, status: int, error: str = "") -> dict[str, Any]:
    data: dict[str, Any] = {
        "n": n,
        "method": "POST",
        "url": "http://127.0.0.1:9/v1/messages",
        "status": status,
        "request_headers": {"x-api-key": "[redacted]"},
        "response_headers": {},
        "started_at": T0,
        "ttfb_ms": 10.0,
        "duration_ms": 20.0,
        "bytes_sent": 100,
        "bytes_received": 200,
        "request_file": f"http/{n:04d}-request.json",
        "response_file": f"http/{n:04d}-response.txt",
    }
    if error:
        data["error"] = error
    return data


def records() -> list[dict[str, Any]]:
    """The sample trace's records, numbered."""
    sub = {"agent": "explore-1", "parent": "t2"}
    rows: list[tuple[float, str, dict[str, Any], dict[str, Any]]] = [
        (
            0.0,
            "session",
            {},
            {
                "session_id": SID,
                "keel_version": "0.1.0",
                "cwd": "/work/p",
                "model": SONNET,
                "reopened": False,
                "format": 1,
            },
        ),
        (0.1, "turn_start", {}, {"prompt": "/fix", "sent": "Fix the bug", "resumed": False}),
        (0.2, "request", {"req": 1}, request(SONNET, 1, 1, [user("Fix the bug")], first=True)),
        (0.9, "http", {"req": 1}, http(1, 529, "overloaded")),
        (1.95, "http", {"req": 1}, http(2, 200)),
        (
            2.2,
            "response",
            {"req": 1},
            response(
                REPLY1,
                usage(1000, 50, 0, 2000),
                0.01125,
                "tool_use",
                400.0,
                500.0,
                100.0,
                attempts=2,
                notices=("retrying after 529",),
            ),
        ),
        (2.3, "tool_start", {}, {"id": "t1", "name": "read", "input": {"path": "app.py"}}),
        (
            2.4,
            "tool_end",
            {},
            {
                "id": "t1",
                "name": "read",
                "is_error": False,
                "output": READ_OUTPUT,
                "seconds": 0.1,
                "started_at": T0 + 2.3,
            },
        ),
        (2.4, "tool_start", {}, {"id": "t2", "name": "task", "input": {"prompt": "explore"}}),
        (
            2.5,
            "request",
            {"req": 2, **sub},
            request(
                HAIKU,
                1,
                1,
                [user("explore the repo")],
                first=True,
                system=("h2", "You explore."),
                tools=("k2", TOOLS[1:2]),
            ),
        ),
        (
            3.5,
            "response",
            {"req": 2, **sub},
            response(REPLY2, usage(500, 20), 0.0006, "end_turn", 200.0, 800.0, 25.0),
        ),
        (
            3.6,
            "tool_end",
            {},
            {
                "id": "t2",
                "name": "task",
                "is_error": False,
                "output": "Found app.py.",
                "seconds": 1.2,
                "started_at": T0 + 2.4,
            },
        ),
        (
            3.7,
            "request",
            {"req": 3},
            request(
                SONNET,
                2,
                3,
                [
                    REPLY1,
                    {
                        "v": 1,
                        "role": "user",
                        "content": [result("t1", READ_OUTPUT), result("t2", "Found app.py.")],
                    },
                ],
            ),
        ),
        (
            4.7,
            "response",
            {"req": 3},
            response(REPLY3, usage(100, 30, 3000, 400), 0.00315, "tool_use", 300.0, 700.0, 43.0),
        ),
        (4.8, "tool_start", {}, {"id": "t3", "name": "bash", "input": {"command": "rm -rf /"}}),
        (
            6.8,
            "permission",
            {},
            {
                "request_id": "p1",
                "tool_use_id": "t3",
                "tool": "bash",
                "reason": "runs outside the sandbox: rm -rf /",
                "suggestion": "",
                "allow": False,
                "scope": "once",
                "by": "user",
                "waited_ms": 2000.0,
            },
        ),
        (
            6.8,
            "tool_end",
            {},
            {
                "id": "t3",
                "name": "bash",
                "is_error": True,
                "output": "denied by the user",
                "seconds": 2.0,
                "started_at": T0 + 4.8,
            },
        ),
        (
            6.9,
            "hook",
            {},
            {
                "event": "PostToolUse",
                "target": "bash",
                "command": "./audit.sh --secret-flag",
                "duration_ms": 50.0,
                "exit_code": 0,
                "blocked": False,
                "halted": False,
            },
        ),
        (
            7.0,
            "request",
            {"req": 4},
            request(
                SONNET,
                3,
                5,
                [
                    REPLY3,
                    {
                        "v": 1,
                        "role": "user",
                        "content": [result("t3", "denied by the user", error=True)],
                    },
                ],
            ),
        ),
        (
            8.0,
            "response",
            {"req": 4},
            response(REPLY4, usage(50, 10, 3400, 100), 0.001695, "end_turn", 250.0, 750.0, 13.3),
        ),
        (
            8.2,
            "turn_end",
            {},
            {
                "stop_reason": "end_turn",
                "turns": 3,
                "usage": usage(1150, 90, 6400, 2500),
                "cost": 0.016695,
            },
        ),
        (10.0, "turn_start", {}, {"prompt": "and tests", "sent": "and tests", "resumed": False}),
        (
            10.1,
            "request",
            {"req": 5},
            request(SONNET, 1, 6, [user("Summarize the conversation.")], purpose="compaction"),
        ),
        (
            11.1,
            "response",
            {"req": 5},
            response(SUMMARY, usage(4000, 100), 0.0135, "end_turn", 500.0, 500.0, 200.0),
        ),
        (11.2, "compaction", {}, {"trigger": "auto", "tokens_before": 4000, "tokens_after": 120}),
        (
            11.3,
            "request",
            {"req": 6},
            request(SONNET, 1, 1, [user("Summary: fixed.", "and tests")], reset=True),
        ),
        (
            12.3,
            "response",
            {"req": 6},
            response(REPLY6, usage(120, 5), 0.000435, "end_turn", 300.0, 700.0, 7.1),
        ),
        (12.4, "error", {}, {"message": "hook ./audit.sh timed out"}),
        (
            12.5,
            "turn_end",
            {},
            {"stop_reason": "end_turn", "turns": 1, "usage": usage(4120, 105), "cost": 0.013935},
        ),
    ]
    out = []
    for seq, (dt, kind, top, data) in enumerate(rows, 1):
        out.append({"seq": seq, "t": T0 + dt, "kind": kind, **top, "data": data})
    return out


def write_trace(directory: Path, rows: list[dict[str, Any]] | None = None) -> Path:
    """Write `rows` (the sample by default) as `directory/events.jsonl` (0700/0600)."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = directory / "events.jsonl"
    text = "".join(json.dumps(r) + "\n" for r in (records() if rows is None else rows))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    return directory
