"""A hand-made trace (format v1, docs/traces.md) of a scripted session, for the viewer's tests.

The session: turn 1 asks for flaky tests; the first request is retried after a 529; the model
starts two `task` subagents side by side (each greps or reads, then reports); it then runs a bash
command that the headless run refuses (a denied permission, a PreToolUse hook before it) and
answers. Turn 2 is compacted first (a compaction request, a `compaction` record, then a request
with `reset`). Turn 3's system prompt changed one line (the git status it quotes): an unexpected
cache break. A tool output carries `</script>` and `<!--` to test that the page escapes content.

`write_trace` writes `events.jsonl` and the `http/` bodies into a folder and returns what a test
needs to check the page against (records, agent labels, request numbers).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from keel.llm.messages import Message, Text, Thinking, ToolResult, ToolUse, message_to_json

T0 = 1_764_590_000.0
MODEL = "anthropic/claude-sonnet-4-5"
HOSTILE = "</script><script>document.title='pwned'</script><!-- <b>not bold</b> &amp;"

SYSTEM = "\n".join(
    [
        "You are keel, a coding agent working in the user's repository.",
        "Be concise. Prefer reading code over guessing.",
        "",
        "# Environment",
        "Working directory: /work/project",
        "Platform: linux",
        "Current branch: main",
        "Status: clean",
        "",
        "# Tools",
        "Use the task tool for broad searches.",
    ]
)
#: Turn 3's system prompt: the git status line changed (the cache break the detector must find).
SYSTEM_DIRTY = SYSTEM.replace("Status: clean", "Status: 2 files modified")
SUB_SYSTEM = "You are an explore subagent. Search, read, and report what you found in one reply."
COMPACT_SYSTEM = "Summarize the conversation so far so that the work can continue from the summary."


def _tool(name: str, summary: str, **props: str) -> dict[str, Any]:
    return {
        "name": name,
        "description": summary,
        "input_schema": {
            "type": "object",
            "properties": {k: {"type": v} for k, v in props.items()},
            "required": list(props),
        },
    }


TOOLS = [
    _tool("bash", "Run a shell command.", command="string"),
    _tool("grep", "Search file contents.", pattern="string"),
    _tool("read", "Read a file.", path="string"),
    _tool("task", "Hand a task to a subagent.", description="string", prompt="string"),
]
SUB_TOOLS = [t for t in TOOLS if t["name"] in ("grep", "read")]


def sha(value: object) -> str:
    text = (
        value
        if isinstance(value, str)
        else json.dumps(value, sort_keys=True, separators=(",", ":"))
    )
    return hashlib.sha256(text.encode()).hexdigest()


def user(text: str) -> dict[str, Any]:
    return message_to_json(Message("user", (Text(text),)))


def assistant(*blocks: Text | Thinking | ToolUse) -> dict[str, Any]:
    return message_to_json(
        Message("assistant", blocks, provider="anthropic", model="claude-sonnet-4-5")
    )


def results(*items: tuple[str, str, bool]) -> dict[str, Any]:
    return message_to_json(
        Message("user", tuple(ToolResult(i, (Text(t),), is_error=e) for i, t, e in items))
    )


@dataclass
class Trace:
    directory: Path
    records: list[dict[str, Any]] = field(default_factory=list)
    seq: int = 0
    req: int = 0
    n: int = 0
    t: float = T0
    #: What each agent (label, parent task call) has sent so far: the delta encoder's memory.
    sent: dict[tuple[str, str], list[dict[str, Any]]] = field(default_factory=dict)
    seen_hashes: set[str] = field(default_factory=set)

    def add(
        self,
        kind: str,
        data: dict[str, Any],
        *,
        agent: str = "",
        parent: str = "",
        req: int | None = None,
        dt: float = 0.05,
    ) -> dict[str, Any]:
        self.t += dt
        self.seq += 1
        rec: dict[str, Any] = {"seq": self.seq, "t": round(self.t, 3), "kind": kind}
        if agent:
            rec["agent"] = agent
        if parent:
            rec["parent"] = parent
        if req is not None:
            rec["req"] = req
        rec["data"] = data
        self.records.append(rec)
        return rec

    def request(
        self,
        messages: list[dict[str, Any]],
        *,
        agent: str = "",
        parent: str = "",
        system: str = SYSTEM,
        tools: list[dict[str, Any]] = TOOLS,
        purpose: str = "turn",
        turn: int = 1,
        reset: bool = False,
    ) -> int:
        """A request record delta-encoded against the agent's previous one; returns its number."""
        self.req += 1
        full = messages if reset else self.sent.get((agent, parent), []) + messages
        self.sent[agent, parent] = full
        data: dict[str, Any] = {
            "model": MODEL,
            "purpose": purpose,
            "turn": turn,
            "max_tokens": 32000,
            "effort": "medium",
            "system_hash": sha(system),
        }
        if data["system_hash"] not in self.seen_hashes:
            data["system"] = system
            self.seen_hashes.add(data["system_hash"])
        data["tools_hash"] = sha(tools)
        if data["tools_hash"] not in self.seen_hashes:
            data["tools"] = tools
            self.seen_hashes.add(data["tools_hash"])
        data.update(messages_total=len(full), reset=reset, messages=messages)
        self.add("request", data, agent=agent, parent=parent, req=self.req, dt=0.02)
        self._system, self._tools = system, tools
        return self.req

    def http(
        self,
        req: int,
        *,
        status: int,
        agent: str = "",
        parent: str = "",
        response: str,
        duration_ms: float,
    ) -> None:
        self.n += 1
        name = f"{self.n:04d}"
        body = {
            "model": MODEL.split("/", 1)[1],
            "max_tokens": 32000,
            "stream": True,
            "system": self._system,
            "tools": self._tools,
            "messages": [
                {"role": m["role"], "content": m["content"]} for m in self.sent[agent, parent]
            ],
        }
        raw = json.dumps(body).encode()
        http = self.directory / "http"
        http.mkdir(exist_ok=True)
        (http / f"{name}-request.json").write_bytes(raw)
        (http / f"{name}-response.txt").write_text(response, encoding="utf-8")
        self.add(
            "http",
            {
                "n": self.n,
                "method": "POST",
                "url": "https://api.anthropic.com/v1/messages",
                "status": status,
                "request_headers": {
                    "x-api-key": "[redacted]",
                    "anthropic-version": "2023-06-01",
                    "content-type": "application/json",
                },
                "response_headers": {
                    "content-type": "text/event-stream" if status == 200 else "application/json",
                    "request-id": f"req_{self.n:04d}",
                },
                "started_at": round(self.t, 3),
                "ttfb_ms": min(duration_ms, 640.0),
                "duration_ms": duration_ms,
                "bytes_sent": len(raw),
                "bytes_received": len(response.encode()),
                "request_file": f"http/{name}-request.json",
                "response_file": f"http/{name}-response.txt",
            },
            agent=agent,
            parent=parent,
            req=req,
            dt=duration_ms / 1000,
        )

    def response(
        self,
        req: int,
        message: dict[str, Any],
        *,
        agent: str = "",
        parent: str = "",
        usage: tuple[int, int, int, int],
        cost: float,
        ttft_ms: float,
        duration_ms: float,
        stop: str = "end_turn",
        attempts: int = 1,
        notices: tuple[str, ...] = (),
    ) -> None:
        i, o, r, w = usage
        self.add(
            "response",
            {
                "message": message,
                "usage": {"input": i, "output": o, "cache_read": r, "cache_write": w},
                "cost": cost,
                "stop_reason": stop,
                "ttft_ms": ttft_ms,
                "thinking_ms": ttft_ms,
                "generating_ms": duration_ms - ttft_ms,
                "duration_ms": duration_ms,
                "output_tokens_per_s": round(o / ((duration_ms - ttft_ms) / 1000), 1),
                "attempts": attempts,
                "notices": list(notices),
            },
            agent=agent,
            parent=parent,
            req=req,
            dt=0.01,
        )

    def tool(
        self,
        call_id: str,
        name: str,
        inp: dict[str, Any],
        output: str,
        *,
        agent: str = "",
        parent: str = "",
        seconds: float = 0.2,
        is_error: bool = False,
        between: tuple[tuple[str, dict[str, Any]], ...] = (),
    ) -> None:
        start = self.add(
            "tool_start", {"id": call_id, "name": name, "input": inp}, agent=agent, parent=parent
        )
        for kind, data in between:
            self.add(kind, data, agent=agent, parent=parent, dt=0.01)
        self.t = max(self.t, start["t"] + seconds)
        self.add(
            "tool_end",
            {
                "id": call_id,
                "name": name,
                "is_error": is_error,
                "output": output,
                "seconds": seconds,
                "started_at": start["t"],
            },
            agent=agent,
            parent=parent,
            dt=0.001,
        )


def sse(text: str) -> str:
    return (
        'event: message_start\ndata: {"type":"message_start"}\n\n'
        f"event: content_block_delta\ndata: {json.dumps({'type': 'content_block_delta', 'delta': {'type': 'text_delta', 'text': text}})}\n\n"
        'event: message_stop\ndata: {"type":"message_stop"}\n\n'
    )


def write_trace(directory: Path) -> Trace:
    directory.mkdir(parents=True, exist_ok=True)
    tr = Trace(directory)
    tr.add(
        "session",
        {
            "session_id": "0193a7f2-demo",
            "keel_version": "0.1.0",
            "cwd": "/work/project",
            "model": MODEL,
            "reopened": False,
            "format": 1,
        },
    )
    prompt = "find the flaky tests and fix them"
    tr.add("turn_start", {"prompt": prompt, "sent": prompt, "resumed": False}, dt=0.5)
    tr.add(
        "hook",
        {
            "event": "UserPromptSubmit",
            "target": "",
            "command": "./.keel/hooks/log-prompt.sh",
            "duration_ms": 14.0,
            "exit_code": 0,
            "blocked": False,
            "halted": False,
        },
        dt=0.02,
    )

    # Request 1, retried after a 529.
    r1 = tr.request([user(prompt)])
    tr.http(
        r1,
        status=529,
        response='{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}',
        duration_ms=420.0,
    )
    tr.add(
        "notice",
        {
            "message": "anthropic: overloaded (529), retrying in 1.0 s (attempt 2 of 5)",
            "level": "warning",
        },
        dt=0.01,
    )
    tr.t += 1.0
    tr.http(r1, status=200, response=sse("I'll search in parallel."), duration_ms=3100.0)
    a1 = assistant(
        Thinking(
            "Two independent searches: the tests that sleep, and the CI history.", signature="sig-1"
        ),
        Text("I'll look at the test suite and the CI logs in parallel."),
        ToolUse(
            "toolu_task1",
            "task",
            {"description": "find sleeping tests", "prompt": "grep tests/ for time.sleep"},
        ),
        ToolUse(
            "toolu_task2",
            "task",
            {"description": "read CI history", "prompt": "read .ci/history.txt"},
        ),
    )
    tr.response(
        r1,
        a1,
        usage=(1200, 180, 0, 5400),
        cost=0.0239,
        ttft_ms=2050.0,
        duration_ms=4560.0,
        stop="tool_use",
        attempts=2,
        notices=("anthropic: overloaded (529), retried once",),
    )

    # Two subagents side by side, each under the task call that started it.
    tr.add(
        "tool_start",
        {"id": "toolu_task1", "name": "task", "input": a1["content"][2]["input"]},
        dt=0.01,
    )
    task1_t = tr.t
    tr.add(
        "tool_start",
        {"id": "toolu_task2", "name": "task", "input": a1["content"][3]["input"]},
        dt=0.01,
    )
    task2_t = tr.t
    s1 = s2 = "explore"  # one label, two agents: told apart by their parent task call
    q2 = tr.request(
        [user("grep tests/ for time.sleep")],
        agent=s1,
        parent="toolu_task1",
        system=SUB_SYSTEM,
        tools=SUB_TOOLS,
    )
    q3 = tr.request(
        [user("read .ci/history.txt")],
        agent=s2,
        parent="toolu_task2",
        system=SUB_SYSTEM,
        tools=SUB_TOOLS,
    )
    tr.http(
        q2, status=200, agent=s1, parent="toolu_task1", response=sse("grep"), duration_ms=1500.0
    )
    g1 = assistant(ToolUse("toolu_g1", "grep", {"pattern": "time.sleep"}))
    tr.response(
        q2,
        g1,
        agent=s1,
        parent="toolu_task1",
        usage=(300, 40, 0, 900),
        cost=0.0049,
        ttft_ms=900.0,
        duration_ms=1500.0,
        stop="tool_use",
    )
    tr.http(
        q3, status=200, agent=s2, parent="toolu_task2", response=sse("read"), duration_ms=1200.0
    )
    rd = assistant(ToolUse("toolu_r1", "read", {"path": ".ci/history.txt"}))
    tr.response(
        q3,
        rd,
        agent=s2,
        parent="toolu_task2",
        usage=(290, 35, 0, 880),
        cost=0.0046,
        ttft_ms=800.0,
        duration_ms=1200.0,
        stop="tool_use",
    )
    grep_out = (
        f'tests/test_net.py:12:    time.sleep(0.5)\ntests/test_ui.py:40:    html = "{HOSTILE}"'
    )
    tr.tool(
        "toolu_g1",
        "grep",
        {"pattern": "time.sleep"},
        grep_out,
        agent=s1,
        parent="toolu_task1",
        seconds=0.12,
    )
    history = "\n".join(f"run {i}: {'FAIL test_net' if i % 3 == 0 else 'ok'}" for i in range(1, 40))
    tr.tool(
        "toolu_r1",
        "read",
        {"path": ".ci/history.txt"},
        history,
        agent=s2,
        parent="toolu_task2",
        seconds=0.03,
    )
    q4 = tr.request(
        [g1, results(("toolu_g1", grep_out, False))],
        agent=s1,
        parent="toolu_task1",
        system=SUB_SYSTEM,
        tools=SUB_TOOLS,
    )
    q5 = tr.request(
        [rd, results(("toolu_r1", history, False))],
        agent=s2,
        parent="toolu_task2",
        system=SUB_SYSTEM,
        tools=SUB_TOOLS,
    )
    tr.http(
        q4, status=200, agent=s1, parent="toolu_task1", response=sse("report"), duration_ms=2100.0
    )
    rep1 = "test_net sleeps 0.5 s waiting for a server; test_ui embeds HTML."
    tr.response(
        q4,
        assistant(Text(rep1)),
        agent=s1,
        parent="toolu_task1",
        usage=(420, 60, 900, 120),
        cost=0.0031,
        ttft_ms=1100.0,
        duration_ms=2100.0,
    )
    tr.http(
        q5, status=200, agent=s2, parent="toolu_task2", response=sse("report"), duration_ms=1800.0
    )
    rep2 = "test_net failed in every third CI run."
    tr.response(
        q5,
        assistant(Text(rep2)),
        agent=s2,
        parent="toolu_task2",
        usage=(610, 30, 880, 300),
        cost=0.0035,
        ttft_ms=950.0,
        duration_ms=1800.0,
    )
    tr.add(
        "tool_end",
        {
            "id": "toolu_task1",
            "name": "task",
            "is_error": False,
            "output": rep1,
            "seconds": round(tr.t - task1_t, 3),
            "started_at": round(task1_t, 3),
        },
        dt=0.01,
    )
    tr.add(
        "tool_end",
        {
            "id": "toolu_task2",
            "name": "task",
            "is_error": False,
            "output": rep2,
            "seconds": round(tr.t - task2_t, 3),
            "started_at": round(task2_t, 3),
        },
        dt=0.01,
    )

    # Request 6: a bash call that the headless run refuses.
    r6 = tr.request([a1, results(("toolu_task1", rep1, False), ("toolu_task2", rep2, False))])
    tr.http(r6, status=200, response=sse("bash"), duration_ms=2600.0)
    b1 = assistant(
        Text("Let me rerun the test in a loop."),
        ToolUse(
            "toolu_bash1",
            "bash",
            {"command": "for i in $(seq 20); do pytest tests/test_net.py -x; done"},
        ),
    )
    tr.response(
        r6,
        b1,
        usage=(160, 90, 6600, 210),
        cost=0.0048,
        ttft_ms=1300.0,
        duration_ms=2600.0,
        stop="tool_use",
    )
    denied = "permission denied: bash needs approval and this run cannot ask (headless); allow it with --allow 'bash(pytest:*)'"
    tr.tool(
        "toolu_bash1",
        "bash",
        b1["content"][1]["input"],
        denied,
        seconds=0.02,
        is_error=True,
        between=(
            (
                "hook",
                {
                    "event": "PreToolUse",
                    "target": "bash",
                    "command": "./.keel/hooks/guard.sh",
                    "duration_ms": 31.0,
                    "exit_code": 0,
                    "blocked": False,
                    "halted": False,
                },
            ),
            (
                "permission",
                {
                    "request_id": "perm-1",
                    "tool_use_id": "toolu_bash1",
                    "tool": "bash",
                    "reason": "bash is not allowed by a rule and this run cannot ask",
                    "suggestion": "bash(pytest:*)",
                    "allow": False,
                    "scope": "once",
                    "by": "headless",
                    "waited_ms": 0.0,
                },
            ),
        ),
    )
    r7 = tr.request([b1, results(("toolu_bash1", denied, True))])
    tr.http(r7, status=200, response=sse("answer"), duration_ms=3300.0)
    answer = "test_net waits a fixed 0.5 s for its server; replace the sleep with a readiness poll."
    tr.response(
        r7,
        assistant(Text(answer)),
        usage=(140, 220, 6810, 190),
        cost=0.0062,
        ttft_ms=1200.0,
        duration_ms=3300.0,
    )
    tr.add(
        "turn_end",
        {
            "stop_reason": "end_turn",
            "turns": 1,
            "usage": {"input": 3120, "output": 655, "cache_read": 16090, "cache_write": 8000},
            "cost": 0.051,
        },
        dt=0.01,
    )

    # Turn 2, two minutes later: compacted first (a compaction request, then a reset).
    prompt2 = "now make that change"
    tr.add("turn_start", {"prompt": prompt2, "sent": prompt2, "resumed": False}, dt=120.0)
    r8 = tr.request(
        [assistant(Text(answer)), user("Summarize the conversation so far.")],
        system=COMPACT_SYSTEM,
        tools=[],
        purpose="compaction",
        turn=2,
    )
    tr.http(r8, status=200, response=sse("summary"), duration_ms=5200.0)
    summary = "The user wants flaky tests fixed; test_net sleeps 0.5 s for a server (fix: poll)."
    tr.response(
        r8,
        assistant(Text(summary)),
        usage=(7400, 310, 0, 0),
        cost=0.0269,
        ttft_ms=1500.0,
        duration_ms=5200.0,
    )
    tr.add(
        "compaction", {"trigger": "auto", "tokens_before": 161_000, "tokens_after": 2_900}, dt=0.01
    )
    r9 = tr.request([user(f"<summary>{summary}</summary>\n\n{prompt2}")], turn=2, reset=True)
    tr.http(r9, status=200, response=sse("done"), duration_ms=2900.0)
    tr.response(
        r9,
        assistant(Text("Done: the test now polls the port.")),
        usage=(180, 140, 0, 1900),
        cost=0.0098,
        ttft_ms=1000.0,
        duration_ms=2900.0,
    )
    tr.add(
        "turn_end",
        {
            "stop_reason": "end_turn",
            "turns": 1,
            "usage": {"input": 7580, "output": 450, "cache_read": 0, "cache_write": 1900},
            "cost": 0.0367,
        },
        dt=0.01,
    )

    # Turn 3: the system prompt quotes git status, which changed: an unexpected cache break.
    prompt3 = "commit it"
    tr.add("turn_start", {"prompt": prompt3, "sent": prompt3, "resumed": False}, dt=30.0)
    r10 = tr.request(
        [assistant(Text("Done: the test now polls the port.")), user(prompt3)],
        system=SYSTEM_DIRTY,
        turn=3,
    )
    tr.http(r10, status=200, response=sse("ok"), duration_ms=2200.0)
    tr.response(
        r10,
        assistant(Text("Committed.")),
        usage=(60, 40, 0, 2150),
        cost=0.0087,
        ttft_ms=900.0,
        duration_ms=2200.0,
    )
    tr.add(
        "turn_end",
        {
            "stop_reason": "end_turn",
            "turns": 1,
            "usage": {"input": 60, "output": 40, "cache_read": 0, "cache_write": 2150},
            "cost": 0.0087,
        },
        dt=0.01,
    )

    with (directory / "events.jsonl").open("w", encoding="utf-8") as f:
        for rec in tr.records:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    return tr


def rebuild(records: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """Every request's full message list, rebuilt from the delta records (what the page does)."""
    last: dict[tuple[str, str], list[dict[str, Any]]] = {}
    out: dict[int, list[dict[str, Any]]] = {}
    for rec in records:
        if rec["kind"] != "request":
            continue
        agent = (rec.get("agent", ""), rec.get("parent", ""))
        full = ([] if rec["data"]["reset"] else last.get(agent, [])) + rec["data"]["messages"]
        last[agent] = full
        out[rec["req"]] = full
    return out


# ------------------------------------------------------------------ a real recorded session

REAL_PROMPT = "find the flaky tests and fix them"


def record_session(root: Path) -> Path:
    """Run a real scripted session with `keel -p --debug` against a loopback Anthropic server
    and return its trace folder: the first request fails with a 529 and is retried; the model
    starts two `task` subagents (one label, `explore`, two agents); a PreToolUse hook (the
    user's own settings) sees the `write` call that the headless run then refuses; `keel
    compact` compacts the session; a resume with `--force` after AGENTS.md changed sends the
    summary (opened by the context it was compacted with: the system prompt is the same) with the
    new prompt in one request (the cache break: the messages before it were dropped), and one
    subagent's report carries `</script>` and `<!--`.
    """
    import os
    import subprocess
    import sys

    from keel.llm.messages import Usage
    from keel.testing.anthropic_server import AnthropicServer
    from keel.testing.script import Fault, Reply, reply

    home, project = root / "home", root / "project"
    (project / "tests").mkdir(parents=True)
    (project / "tests" / "test_net.py").write_text(
        "import time\n\ndef test_x():\n    time.sleep(0.5)\n", encoding="utf-8"
    )
    (home / "config").mkdir(parents=True)
    hooks = {
        "PreToolUse": [{"matcher": "write", "hooks": [{"type": "command", "command": "true"}]}]
    }
    (home / "config" / "settings.json").write_text(json.dumps({"hooks": hooks}), encoding="utf-8")
    key = "sk-ant-viewer-test"
    env = {
        **os.environ,
        "KEEL_HOME": str(home),
        "KEEL_CONFIG_DIR": str(home / "config"),
        "HOME": str(home / "user"),
        "ANTHROPIC_API_KEY": key,
    }
    env.pop("KEEL_DEBUG", None)

    def usage(i: int, o: int, r: int = 0, w: int = 0) -> Usage:
        return Usage(input=i, output=o, cache_read=r, cache_write=w)

    def slow(step: Reply, delay: float) -> Reply:
        step.delay = delay  # server-side think time, so the timeline has something to show
        return step

    task = "task"
    script: list[Reply | Fault] = [
        Fault("status", status=529),
        slow(
            reply(
                "I'll search in parallel.",
                (
                    task,
                    {
                        "description": "find sleeping tests",
                        "prompt": "grep tests/ for time.sleep",
                        "subagent_type": "explore",
                    },
                ),
                (
                    task,
                    {
                        "description": "count test files",
                        "prompt": "glob tests/*.py and count",
                        "subagent_type": "explore",
                    },
                ),
                usage=usage(1200, 80, 0, 4000),
            ),
            0.5,
        ),
        slow(
            reply(f"tests/test_net.py sleeps 0.5 s: {HOSTILE}", usage=usage(300, 30, 0, 900)), 0.6
        ),
        slow(reply("one test file.", usage=usage(300, 30, 0, 900)), 0.3),
        slow(
            reply(
                "Let me fix the sleep.",
                (
                    "write",
                    {
                        "path": "tests/test_net.py",
                        "content": "def test_x():\n    wait_for_port()\n",
                    },
                ),
                usage=usage(100, 40, 5200, 200),
            ),
            0.4,
        ),
        slow(
            reply(
                "The test sleeps; replace it with a readiness poll.", usage=usage(90, 60, 5400, 150)
            ),
            0.4,
        ),
        slow(
            reply(
                "Summary: the user wants the flaky test fixed; test_net sleeps.",
                usage=usage(3000, 100),
            ),
            0.5,
        ),
        slow(reply("Done.", usage=usage(200, 20, 1500, 60)), 0.3),
    ]
    model = "anthropic/claude-sonnet-4-5"

    def keel(*args: str) -> None:
        run = subprocess.run(
            [sys.executable, "-m", "keel", *args],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert run.returncode == 0, (args, run.stdout, run.stderr)

    with AnthropicServer(script, api_key=key) as server:
        env["ANTHROPIC_BASE_URL"] = server.url
        keel("-p", "--debug", "--model", model, REAL_PROMPT)
        (session,) = home.glob("sessions/*/*.jsonl")
        keel("compact", "--debug", "--model", model, session.stem)
        (project / "AGENTS.md").write_text("Run the tests with pytest -x.\n", encoding="utf-8")
        keel(
            "-p", "--debug", "--force", "--model", model, "-r", session.stem, "now make that change"
        )
        assert not server.script, "the session did not use the whole script"
        assert not server.errors, server.errors
    return session.with_name(f"{session.stem}.trace")
