"""keel serve's streams for agent UIs, end to end: a real server process, its model the loopback
Anthropic server scripted by the test.

AG-UI (`POST …/agui`): whole event sequences for a run with thinking, text and a tool call, for
permission questions as interrupts answered by resume runs (approved, then denied with a reason
the model reads), for the interrupt contract's refusals, and for a failed run; every event and
request body is parsed with the protocol's own Python models (`ag-ui-protocol`), with no field
they do not know. The AI SDK (`POST …/ui-stream`): the same runs as UI message chunks, with the
stream's header and `[DONE]`. Then the protocols' own clients drive a run from node
(tests/ui_streams/node): @ag-ui/client's HttpAgent and the `ai` package's Chat over
DefaultChatTransport, each checking every event or chunk with the package's own schema.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import BaseModel, TypeAdapter

from keel.llm.script import reply
from keel.testing.anthropic_server import AnthropicServer
from keel.testing.script import Fault, Reply
from tests.server_helpers import (  # noqa: F401
    MODEL,
    TOKEN,
    Served,
    anthropic_fixture,
    served_fixture,
    servers_fixture,
)

NODE_DIR = Path(__file__).parent / "ui_streams" / "node"
COST = (100 * 3 + 20 * 15) / 1e6  # one scripted turn: 100 in, 20 out, at Sonnet's prices
USAGE = {"input": 100, "output": 20, "cache_read": 0, "cache_write": 0}


def usage_of(turns: int) -> dict[str, int]:
    return {k: v * turns for k, v in USAGE.items()}


def tool_id(step: Reply, n: int = 0) -> str:
    return step.message.tool_uses[n].id


def create(client: httpx.Client) -> str:
    r = client.post("/v1/sessions", json={"model": MODEL})
    assert r.status_code == 201, r.text
    sid: str = r.json()["id"]
    return sid


def post_stream(
    client: httpx.Client, path: str, body: dict[str, Any]
) -> tuple[httpx.Headers, list[Any]]:
    """POST `body`, read the SSE answer whole: its headers and its `data:` payloads."""
    with client.stream("POST", path, json=body) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        got: list[Any] = []
        for line in r.iter_lines():
            if line.startswith("data: "):
                raw = line.removeprefix("data: ")
                got.append(raw if raw == "[DONE]" else json.loads(raw))
            else:
                assert line == "" or line.startswith(":"), line
        return r.headers, got


# -- AG-UI -----------------------------------------------------------------------------------------


def _no_extras(model: Any, where: str) -> None:
    if isinstance(model, BaseModel):
        assert not model.model_extra, f"{where}: fields AG-UI does not define: {model.model_extra}"
        for name in type(model).model_fields:
            _no_extras(getattr(model, name), f"{where}.{name}")
    elif isinstance(model, list):
        for i, item in enumerate(model):
            _no_extras(item, f"{where}[{i}]")


def agui_checked(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each event parsed with ag_ui.core's models: every field one they define, and the model's
    own JSON of it exactly the event (camelCase names, nothing coerced)."""
    from ag_ui.core import Event

    adapter: TypeAdapter[Any] = TypeAdapter(Event)
    for event in events:
        model = adapter.validate_python(event)
        _no_extras(model, event["type"])
        assert model.model_dump(mode="json", by_alias=True) == event
    return events


def run_input(sid: str, run_id: str, text: str | None = None, **more: Any) -> dict[str, Any]:
    """A RunAgentInput as a client sends it (checked with the protocol's model)."""
    from ag_ui.core import RunAgentInput

    messages = [] if text is None else [{"id": f"u-{run_id}", "role": "user", "content": text}]
    body = {
        "threadId": sid,
        "runId": run_id,
        "state": {},
        "messages": messages,
        "tools": [],
        "context": [],
        "forwardedProps": {},
        **more,
    }
    model = RunAgentInput.model_validate(body)
    _no_extras(model, "RunAgentInput")
    return body


def agui(client: httpx.Client, sid: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    headers, events = post_stream(client, f"/v1/sessions/{sid}/agui", body)
    assert "x-vercel-ai-ui-message-stream" not in headers
    return agui_checked(events)


def state(sid: str, turns: int, *, pending: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "type": "STATE_SNAPSHOT",
        "snapshot": {
            "session": sid,
            "model": MODEL,
            "mode": "default",
            "busy": True,
            "usage": usage_of(turns),
            "cost_usd": round(COST * turns, 6),
            "pending": pending or [],
        },
    }


def usage_delta(turns: int) -> dict[str, Any]:
    return {
        "type": "STATE_DELTA",
        "delta": [
            {"op": "replace", "path": "/usage", "value": usage_of(turns)},
            {"op": "replace", "path": "/cost_usd", "value": round(COST * turns, 6)},
        ],
    }


def tool_call(call_id: str, name: str, args: dict[str, Any], parent: str) -> list[dict[str, Any]]:
    """A streamed tool call as the scripted model sends it (the JSON in three pieces)."""
    raw = json.dumps(args)
    third = -(-len(raw) // 3)
    pieces = [raw[i : i + third] for i in range(0, len(raw), third)]
    return [
        {
            "type": "TOOL_CALL_START",
            "toolCallId": call_id,
            "toolCallName": name,
            "parentMessageId": parent,
        },
        *({"type": "TOOL_CALL_ARGS", "toolCallId": call_id, "delta": p} for p in pieces),
        {"type": "TOOL_CALL_END", "toolCallId": call_id},
    ]


def text_message(message_id: str, text: str) -> list[dict[str, Any]]:
    third = -(-len(text) // 3)
    return [
        {"type": "TEXT_MESSAGE_START", "messageId": message_id, "role": "assistant"},
        *(
            {"type": "TEXT_MESSAGE_CONTENT", "messageId": message_id, "delta": text[i : i + third]}
            for i in range(0, len(text), third)
        ),
        {"type": "TEXT_MESSAGE_END", "messageId": message_id},
    ]


def finished(sid: str, run_id: str, text: str, turns: int, run_turns: int) -> list[dict[str, Any]]:
    return [
        {"type": "STATE_DELTA", "delta": [{"op": "replace", "path": "/busy", "value": False}]},
        {
            "type": "RUN_FINISHED",
            "threadId": sid,
            "runId": run_id,
            "result": {
                "result": text,
                "stop_reason": "end_turn",
                "turns": run_turns,
                "cost_usd": round(COST * run_turns, 6),
            },
            "outcome": {"type": "success"},
            "usage": [
                {
                    "provider": "anthropic",
                    "model": "claude-sonnet-4-5",
                    "inputTokens": 100 * run_turns,
                    "outputTokens": 20 * run_turns,
                    "totalTokens": 120 * run_turns,
                    "cachedInputTokens": 0,
                    "cacheWriteInputTokens": 0,
                }
            ],
        },
    ]


def test_agui_streams_a_run_with_thinking_text_and_a_tool(
    served: Served, anthropic: AnthropicServer
) -> None:
    glob = reply("Looking.", ("glob", {"pattern": "*.py"}), thinking="Hmm.")
    anthropic.add(glob, reply("Two files."))
    with served.client() as c:
        sid = create(c)
        events = agui(c, sid, run_input(sid, "run-1", "which files?"))
    gid = tool_id(glob)
    assert events == [
        {"type": "RUN_STARTED", "threadId": sid, "runId": "run-1"},
        state(sid, 0),
        {"type": "STEP_STARTED", "stepName": "turn 1"},
        {"type": "REASONING_START", "messageId": "run-1-1-reasoning1"},
        {"type": "REASONING_MESSAGE_START", "messageId": "run-1-1-reasoning1", "role": "reasoning"},
        {"type": "REASONING_MESSAGE_CONTENT", "messageId": "run-1-1-reasoning1", "delta": "Hm"},
        {"type": "REASONING_MESSAGE_CONTENT", "messageId": "run-1-1-reasoning1", "delta": "m."},
        {"type": "REASONING_MESSAGE_END", "messageId": "run-1-1-reasoning1"},
        {"type": "REASONING_END", "messageId": "run-1-1-reasoning1"},
        *text_message("run-1-1-text2", "Looking."),
        *tool_call(gid, "glob", {"pattern": "*.py"}, "run-1-1"),
        usage_delta(1),
        {
            "type": "TOOL_CALL_RESULT",
            "messageId": f"run-1-result-{gid}",
            "toolCallId": gid,
            "content": "app.py\nutil.py",
            "role": "tool",
        },
        {"type": "STEP_FINISHED", "stepName": "turn 1"},
        {"type": "STEP_STARTED", "stepName": "turn 2"},
        *text_message("run-1-2-text3", "Two files."),
        usage_delta(2),
        {"type": "STEP_FINISHED", "stepName": "turn 2"},
        *finished(sid, "run-1", "Two files.", 2, 2),
    ]


def test_agui_permission_questions_are_interrupts_that_resume_runs_answer(
    served: Served, anthropic: AnthropicServer, project: Path
) -> None:
    first = reply("", ("write", {"path": "notes.txt", "content": "hi\n"}))
    second = reply("", ("write", {"path": "secret.txt", "content": "no\n"}))
    anthropic.add(first, second, reply("Wrote one."))
    w1, w2 = tool_id(first), tool_id(second)
    with served.client() as c:
        sid = create(c)
        run1 = agui(c, sid, run_input(sid, "run-1", "write two"))
        asked = c.get(f"/v1/sessions/{sid}/permissions").json()["pending"]
        assert [q["tool_use_id"] for q in asked] == [w1]
        rid = asked[0]["request_id"]
        question = {k: v for k, v in asked[0].items() if k not in ("seq", "session")}
        interrupt = {
            "id": rid,
            "reason": "tool_call",
            "message": "allow write? change notes.txt",
            "toolCallId": w1,
            "responseSchema": {
                "type": "object",
                "properties": {
                    "approved": {"type": "boolean"},
                    "always": {
                        "type": "boolean",
                        "description": "allow this and later calls like it (saves the suggested rule)",
                    },
                    "reason": {"type": "string", "description": "why not: the model reads it"},
                    "mode": {
                        "type": "string",
                        "description": "a plan approval: the mode to go on in",
                    },
                },
                "required": ["approved"],
            },
            "metadata": {
                "keel": {
                    "tool": "write",
                    "input": {"path": "notes.txt", "content": "hi\n"},
                    "suggestion": "write",
                }
            },
        }
        assert run1 == [
            {"type": "RUN_STARTED", "threadId": sid, "runId": "run-1"},
            state(sid, 0),
            {"type": "STEP_STARTED", "stepName": "turn 1"},
            *tool_call(w1, "write", {"path": "notes.txt", "content": "hi\n"}, "run-1-1"),
            usage_delta(1),
            {"type": "STEP_FINISHED", "stepName": "turn 1"},
            state(sid, 1, pending=[question]),
            {
                "type": "RUN_FINISHED",
                "threadId": sid,
                "runId": "run-1",
                "outcome": {"type": "interrupt", "interrupts": [interrupt]},
            },
        ]

        # The contract's refusals (AG-UI's interrupts page): each a RUN_ERROR, nothing answered.
        def refused(body: dict[str, Any]) -> str:
            events = agui(c, sid, body)
            assert [e["type"] for e in events] == ["RUN_STARTED", "RUN_ERROR"]
            assert events[1]["code"] == "interrupt"
            message: str = events[1]["message"]
            return message

        assert refused(run_input(sid, "run-x", "another prompt")) == (
            f"the thread has open interrupts ({rid}): send a resume addressing every one"
        )
        assert refused(
            run_input(sid, "run-x", resume=[{"interruptId": "perm-99", "status": "resolved"}])
        ) == ("interrupt 'perm-99' is not open (answered already, or the run stopped)")
        assert refused(
            run_input(
                sid, "run-x", resume=[{"interruptId": rid, "status": "resolved", "payload": {}}]
            )
        ) == (f'interrupt {rid}: the payload must be {{"approved": true | false, …}}')
        assert refused(run_input(sid, "run-x", resume=[])) == (
            f"the thread has open interrupts ({rid}): send a resume addressing every one"
        )
        assert c.get(f"/v1/sessions/{sid}/permissions").json()["pending"] == asked

        approve = [{"interruptId": rid, "status": "resolved", "payload": {"approved": True}}]
        run2 = agui(c, sid, run_input(sid, "run-2", resume=approve))
        rid2 = c.get(f"/v1/sessions/{sid}/permissions").json()["pending"][0]["request_id"]
        deny = [
            {
                "interruptId": rid2,
                "status": "resolved",
                "payload": {"approved": False, "reason": "not that file"},
            }
        ]
        run3 = agui(c, sid, run_input(sid, "run-3", resume=deny))

    def answered(request_id: str, call: str, allow: bool, reason: str) -> dict[str, Any]:
        return {
            "type": "CUSTOM",
            "name": "keel.permission_answered",
            "value": {
                "type": "permission_answered",
                "request_id": request_id,
                "tool_use_id": call,
                "allow": allow,
                "scope": "once",
                "reason": reason,
                "by": "user",
                "waited_ms": "…",
            },
        }

    def steady(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for e in events:
            if e["type"] == "CUSTOM":
                e["value"]["waited_ms"] = "…"
        return events

    assert [e["type"] for e in run2][-1] == "RUN_FINISHED"
    second_interrupt = run2[-1]["outcome"]["interrupts"]
    assert [(i["id"], i["toolCallId"]) for i in second_interrupt] == [(rid2, w2)]
    assert steady(run2[:-2]) == [
        {"type": "RUN_STARTED", "threadId": sid, "runId": "run-2"},
        state(sid, 1, pending=[]),
        answered(rid, w1, True, ""),
        {
            "type": "TOOL_CALL_RESULT",
            "messageId": f"run-2-result-{w1}",
            "toolCallId": w1,
            "content": "Created notes.txt (1 lines).",
            "role": "tool",
        },
        {"type": "STEP_STARTED", "stepName": "turn 2"},
        *tool_call(w2, "write", {"path": "secret.txt", "content": "no\n"}, "run-2-2"),
        usage_delta(2),
        {"type": "STEP_FINISHED", "stepName": "turn 2"},
    ]
    denied = next(e for e in run3 if e["type"] == "TOOL_CALL_RESULT")
    assert steady(run3) == [
        {"type": "RUN_STARTED", "threadId": sid, "runId": "run-3"},
        state(sid, 2, pending=[]),
        answered(rid2, w2, False, "not that file"),
        {
            "type": "TOOL_CALL_RESULT",
            "messageId": f"run-3-result-{w2}",
            "toolCallId": w2,
            "content": denied["content"],
            "role": "tool",
        },
        {"type": "STEP_STARTED", "stepName": "turn 3"},
        *text_message("run-3-3-text1", "Wrote one."),
        usage_delta(3),
        {"type": "STEP_FINISHED", "stepName": "turn 3"},
        *finished(sid, "run-3", "Wrote one.", 3, 3),
    ]
    assert "not that file" in denied["content"]
    assert (project / "notes.txt").read_text(encoding="utf-8") == "hi\n"
    assert not (project / "secret.txt").exists()
    last = anthropic.model_requests[-1].json["messages"][-1]["content"][0]
    assert (last["tool_use_id"], last["is_error"]) == (w2, True)
    assert "not that file" in last["content"][0]["text"]
