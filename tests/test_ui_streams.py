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
import sys
import threading
import time
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
    Servers,
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


def first_message_id(client: httpx.Client, sid: str) -> str:
    """The id the stream gives the assistant message of the session's next prompt: the seq of
    its first event (a session without a sandbox has a notice before it)."""
    last: int = client.get(f"/v1/sessions/{sid}").json()["last_seq"]
    return f"{sid}-{last + 1}"


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
        *text_message("run-1-1", "Looking."),
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
        *text_message("run-1-2", "Two files."),
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
        *text_message("run-3-3", "Wrote one."),
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


def test_a_failed_run_is_a_run_error_and_an_error_chunk(
    served: Served, anthropic: AnthropicServer
) -> None:
    bad = Fault("status", status=400, message="messages: bad request")
    anthropic.add(bad, bad)
    with served.client() as c:
        sid = create(c)
        events = agui(c, sid, run_input(sid, "run-1", "hi"))
        headers, chunks = post_stream(c, f"/v1/sessions/{sid}/ui-stream", chat_body(sid, "hi"))
    failure = "anthropic returned 400: messages: bad request"
    assert events == [
        {"type": "RUN_STARTED", "threadId": sid, "runId": "run-1"},
        state(sid, 0),
        {"type": "STEP_STARTED", "stepName": "turn 1"},
        {"type": "STEP_FINISHED", "stepName": "turn 1"},
        {"type": "STATE_DELTA", "delta": [{"op": "replace", "path": "/busy", "value": False}]},
        {
            "type": "RUN_ERROR",
            "message": failure,
            "code": "error",
            "usage": [
                {
                    "provider": "anthropic",
                    "model": "claude-sonnet-4-5",
                    "inputTokens": 0,
                    "outputTokens": 0,
                    "totalTokens": 0,
                    "cachedInputTokens": 0,
                    "cacheWriteInputTokens": 0,
                }
            ],
        },
    ]
    assert headers["x-vercel-ai-ui-message-stream"] == "v1"
    assert chunks == [
        {"type": "start", "messageMetadata": {"session": sid}, "messageId": chunks[0]["messageId"]},
        {"type": "start-step"},
        {"type": "finish-step"},
        {"type": "error", "errorText": failure},
        {
            "type": "finish",
            "finishReason": "error",
            "messageMetadata": {
                "stop_reason": "error",
                "turns": 1,
                "usage": usage_of(0),
                "cost_usd": 0.0,
            },
        },
        "[DONE]",
    ]


# -- the AI SDK's UI message stream ----------------------------------------------------------------


def chat_body(sid: str, text: str, *history: dict[str, Any]) -> dict[str, Any]:
    """The body the AI SDK's DefaultChatTransport sends for a new user message."""
    user = {"id": f"user-{len(history)}", "role": "user", "parts": [{"type": "text", "text": text}]}
    return {"id": sid, "messages": [*history, user], "trigger": "submit-message", "messageId": None}


def ui_stream(client: httpx.Client, sid: str, body: dict[str, Any]) -> list[Any]:
    headers, chunks = post_stream(client, f"/v1/sessions/{sid}/ui-stream", body)
    assert headers["x-vercel-ai-ui-message-stream"] == "v1"
    assert chunks[-1] == "[DONE]"
    return chunks


def tool_input(call_id: str, name: str, args: dict[str, Any]) -> list[dict[str, Any]]:
    raw = json.dumps(args)
    third = -(-len(raw) // 3)
    return [
        {"type": "tool-input-start", "toolCallId": call_id, "toolName": name, "dynamic": True},
        *(
            {
                "type": "tool-input-delta",
                "toolCallId": call_id,
                "inputTextDelta": raw[i : i + third],
            }
            for i in range(0, len(raw), third)
        ),
    ]


def text_part(part_id: str, text: str, kind: str = "text") -> list[dict[str, Any]]:
    third = -(-len(text) // 3)
    return [
        {"type": f"{kind}-start", "id": part_id},
        *(
            {"type": f"{kind}-delta", "id": part_id, "delta": text[i : i + third]}
            for i in range(0, len(text), third)
        ),
        {"type": f"{kind}-end", "id": part_id},
    ]


def metadata(turns: int) -> dict[str, Any]:
    return {
        "type": "message-metadata",
        "messageMetadata": {
            "usage": usage_of(turns),
            "cost_usd": round(COST * turns, 6),
            "context_tokens": 120,
            "context_window": 200_000,
        },
    }


def finish(turns: int, run_turns: int) -> dict[str, Any]:
    return {
        "type": "finish",
        "finishReason": "stop",
        "messageMetadata": {
            "stop_reason": "end_turn",
            "turns": run_turns,
            "usage": usage_of(run_turns),
            "cost_usd": round(COST * run_turns, 6),
        },
    }


def test_ui_stream_streams_a_run_with_thinking_text_and_a_tool(
    served: Served, anthropic: AnthropicServer
) -> None:
    glob = reply("Looking.", ("glob", {"pattern": "*.py"}), thinking="Hmm.")
    anthropic.add(glob, reply("Two files."))
    with served.client() as c:
        sid = create(c)
        mid = first_message_id(c, sid)
        chunks = ui_stream(c, sid, chat_body(sid, "which files?"))
    gid = tool_id(glob)
    assert chunks == [
        {"type": "start", "messageMetadata": {"session": sid}, "messageId": mid},
        {"type": "start-step"},
        *text_part("reasoning-1", "Hmm.", "reasoning"),
        *text_part("text-2", "Looking."),
        *tool_input(gid, "glob", {"pattern": "*.py"}),
        {
            "type": "tool-input-available",
            "toolCallId": gid,
            "toolName": "glob",
            "input": {"pattern": "*.py"},
            "dynamic": True,
        },
        metadata(1),
        {
            "type": "tool-output-available",
            "toolCallId": gid,
            "output": "app.py\nutil.py",
            "dynamic": True,
        },
        {"type": "finish-step"},
        {"type": "start-step"},
        *text_part("text-3", "Two files."),
        metadata(2),
        {"type": "finish-step"},
        finish(2, 2),
        "[DONE]",
    ]


def test_ui_stream_tool_approvals_answer_permission_questions(
    served: Served, anthropic: AnthropicServer, project: Path
) -> None:
    first = reply("", ("write", {"path": "notes.txt", "content": "hi\n"}))
    second = reply("", ("write", {"path": "secret.txt", "content": "no\n"}))
    anthropic.add(first, second, reply("Wrote one."))
    w1, w2 = tool_id(first), tool_id(second)
    with served.client() as c:
        sid = create(c)
        mid = first_message_id(c, sid)
        user = chat_body(sid, "write two")["messages"]
        chunks1 = ui_stream(c, sid, chat_body(sid, "write two"))
        rid = c.get(f"/v1/sessions/{sid}/permissions").json()["pending"][0]["request_id"]
        # What the Chat holds after the stream and `addToolApprovalResponse`: the tool part
        # with its approval answered (only the fields keel reads matter).
        assistant: dict[str, Any] = {
            "id": mid,
            "role": "assistant",
            "parts": [
                {"type": "step-start"},
                {
                    "type": "dynamic-tool",
                    "toolName": "write",
                    "toolCallId": w1,
                    "state": "approval-responded",
                    "input": {"path": "notes.txt", "content": "hi\n"},
                    "approval": {"id": rid, "approved": True},
                },
            ],
        }
        again = {"id": sid, "messages": [*user, assistant], "trigger": "submit-message"}
        chunks2 = ui_stream(c, sid, again)
        rid2 = c.get(f"/v1/sessions/{sid}/permissions").json()["pending"][0]["request_id"]
        assistant["parts"][1] |= {"state": "output-available", "output": "Created notes.txt."}
        assistant["parts"] += [
            {"type": "step-start"},
            {
                "type": "dynamic-tool",
                "toolName": "write",
                "toolCallId": w2,
                "state": "approval-responded",
                "input": {"path": "secret.txt", "content": "no\n"},
                "approval": {"id": rid2, "approved": False, "reason": "not that file"},
            },
        ]
        chunks3 = ui_stream(c, sid, again)
        stale = c.post(f"/v1/sessions/{sid}/ui-stream", json=again)
    assert (stale.status_code, stale.json()) == (
        404,
        {
            "error": f"no pending question {rid2!r} in session {sid}",
            "hint": "answered already, or the run stopped",
        },
    )
    assert chunks1 == [
        {"type": "start", "messageMetadata": {"session": sid}, "messageId": mid},
        {"type": "start-step"},
        *tool_input(w1, "write", {"path": "notes.txt", "content": "hi\n"}),
        {
            "type": "tool-input-available",
            "toolCallId": w1,
            "toolName": "write",
            "input": {"path": "notes.txt", "content": "hi\n"},
            "dynamic": True,
        },
        metadata(1),
        {
            "type": "tool-approval-request",
            "approvalId": rid,
            "toolCallId": w1,
            "reason": "change notes.txt",
        },
        {"type": "finish-step"},
        {"type": "finish", "finishReason": "tool-calls"},
        "[DONE]",
    ]
    assert chunks2 == [
        {"type": "start", "messageMetadata": {"session": sid}},
        {
            "type": "tool-output-available",
            "toolCallId": w1,
            "output": "Created notes.txt (1 lines).",
            "dynamic": True,
        },
        {"type": "start-step"},
        *tool_input(w2, "write", {"path": "secret.txt", "content": "no\n"}),
        {
            "type": "tool-input-available",
            "toolCallId": w2,
            "toolName": "write",
            "input": {"path": "secret.txt", "content": "no\n"},
            "dynamic": True,
        },
        metadata(2),
        {
            "type": "tool-approval-request",
            "approvalId": rid2,
            "toolCallId": w2,
            "reason": "change secret.txt",
        },
        {"type": "finish-step"},
        {"type": "finish", "finishReason": "tool-calls"},
        "[DONE]",
    ]
    assert chunks3 == [
        {"type": "start", "messageMetadata": {"session": sid}},
        {"type": "tool-output-denied", "toolCallId": w2},
        {"type": "start-step"},
        *text_part("text-1", "Wrote one."),
        metadata(3),
        {"type": "finish-step"},
        finish(3, 3),
        "[DONE]",
    ]
    assert (project / "notes.txt").read_text(encoding="utf-8") == "hi\n"
    assert not (project / "secret.txt").exists()
    last = anthropic.model_requests[-1].json["messages"][-1]["content"][0]
    assert (last["tool_use_id"], last["is_error"]) == (w2, True)
    assert "not that file" in last["content"][0]["text"]


# -- the protocols' own clients --------------------------------------------------------------------


@pytest.fixture
def clients() -> None:
    """The protocols' clients are installed (tests/ui_streams/node), or the test is skipped."""
    if not (NODE_DIR / "node_modules").is_dir():
        pytest.skip(
            "the protocol clients are not installed: npm ci --prefix tests/ui_streams/node "
            "--no-audit --no-fund"
        )


def node_client(served: Served, script: str, sid: str, prompt: str) -> dict[str, Any]:
    """Run a client script of tests/ui_streams/node against `served`; its one JSON line."""
    node = shutil.which("node")
    assert node is not None
    done = subprocess.run(
        [node, str(NODE_DIR / script), served.url, TOKEN, sid, prompt],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines, done.stderr
    out: dict[str, Any] = json.loads(lines[-1])
    return out


@pytest.mark.needs("node")
@pytest.mark.usefixtures("clients")
def test_the_ag_ui_client_runs_a_session_through_an_interrupt(
    served: Served, anthropic: AnthropicServer, project: Path
) -> None:
    write = reply("Writing.", ("write", {"path": "notes.txt", "content": "hi\n"}))
    anthropic.add(write, reply("Wrote it."))
    wid = tool_id(write)
    with served.client() as c:
        sid = create(c)
        got = node_client(served, "agui_client.mjs", sid, "write a note")
        rid = got["asked"][0]["id"]
        assert c.get(f"/v1/sessions/{sid}/permissions").json() == {"pending": []}
    assert got["invalid"] == []
    assert got["bodies"] == [
        {"runId": "run-1", "resume": None, "messages": 1},
        {
            "runId": "run-2",
            "resume": [{"interruptId": rid, "status": "resolved", "payload": {"approved": True}}],
            "messages": 2,
        },
    ]
    assert [(i["id"], i["reason"], i["toolCallId"]) for i in got["asked"]] == [
        (rid, "tool_call", wid)
    ]
    assert got["pending"] == []
    assert [o["outcome"] for o in got["outcomes"]] == ["interrupt", "success"]
    assert got["events"] == [
        "RUN_STARTED",
        "STATE_SNAPSHOT",
        "STEP_STARTED",
        *["TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_CONTENT"],
        *["TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END"],
        *["TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_ARGS", "TOOL_CALL_ARGS"],
        *["TOOL_CALL_END", "STATE_DELTA", "STEP_FINISHED", "STATE_SNAPSHOT", "RUN_FINISHED"],
        *["RUN_STARTED", "STATE_SNAPSHOT", "CUSTOM", "TOOL_CALL_RESULT", "STEP_STARTED"],
        *["TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_CONTENT"],
        *["TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END", "STATE_DELTA", "STEP_FINISHED"],
        *["STATE_DELTA", "RUN_FINISHED"],
    ]
    # The conversation as the client's agent holds it: what a UI renders.
    assert got["messages"] == [
        {"id": "user-1", "role": "user", "content": "write a note"},
        {
            "id": "run-1-1",
            "role": "assistant",
            "content": "Writing.",
            "toolCalls": [
                {
                    "id": wid,
                    "type": "function",
                    "function": {
                        "name": "write",
                        "arguments": '{"path": "notes.txt", "content": "hi\\n"}',
                    },
                }
            ],
        },
        {
            "id": f"run-2-result-{wid}",
            "role": "tool",
            "toolCallId": wid,
            "content": "Created notes.txt (1 lines).",
        },
        {"id": "run-2-2", "role": "assistant", "content": "Wrote it."},
    ]
    assert got["state"] == {
        "session": sid,
        "model": MODEL,
        "mode": "default",
        "busy": False,
        "usage": usage_of(2),
        "cost_usd": round(COST * 2, 6),
        "pending": [],
    }
    assert (project / "notes.txt").read_text(encoding="utf-8") == "hi\n"


@pytest.mark.needs("node")
@pytest.mark.usefixtures("clients")
def test_the_ai_sdk_chat_runs_a_session_through_a_tool_approval(
    served: Served, anthropic: AnthropicServer, project: Path
) -> None:
    write = reply("Writing.", ("write", {"path": "notes.txt", "content": "hi\n"}))
    anthropic.add(write, reply("Wrote it."))
    wid = tool_id(write)
    with served.client() as c:
        sid = create(c)
        mid = first_message_id(c, sid)
        got = node_client(served, "ai_chat.mjs", sid, "write a note")
        assert c.get(f"/v1/sessions/{sid}/permissions").json() == {"pending": []}
    assert got["invalid"] == []
    assert got["errors"] == []
    assert got["status"] == "ready"
    assert got["headers"] == ["v1", "v1"]
    keys = ["id", "messages", "trigger"]
    assert got["requests"] == [
        {"keys": keys, "id": sid, "trigger": "submit-message", "roles": ["user"]},
        {
            "keys": sorted([*keys, "messageId"]),
            "id": sid,
            "trigger": "submit-message",
            "roles": ["user", "assistant"],
        },
    ]
    rid = got["approvals"][0]["id"]
    assert got["approvals"] == [{"id": rid, "requestReason": "change notes.txt"}]
    assert got["chunks"] == [
        *["start", "start-step", "text-start", "text-delta", "text-delta", "text-delta"],
        *["text-end", "tool-input-start", "tool-input-delta", "tool-input-delta"],
        *["tool-input-delta", "tool-input-available", "message-metadata"],
        *["tool-approval-request", "finish-step", "finish", "[DONE]"],
        *["start", "tool-output-available", "start-step", "text-start", "text-delta"],
        *["text-delta", "text-delta", "text-end", "message-metadata", "finish-step"],
        *["finish", "[DONE]"],
    ]
    user, assistant = got["messages"]
    assert user["role"] == "user"
    assert user["parts"] == [{"type": "text", "text": "write a note"}]
    # One assistant message, continued by the stream after the approval, as useChat renders it.
    assert assistant["id"] == mid
    assert assistant["metadata"] == {
        "session": sid,
        "usage": usage_of(2),
        "cost_usd": round(COST * 2, 6),
        "context_tokens": 120,
        "context_window": 200_000,
        "stop_reason": "end_turn",
        "turns": 2,
    }
    assert assistant["parts"] == [
        {"type": "step-start"},
        {"type": "text", "text": "Writing.", "state": "done"},
        {
            "type": "dynamic-tool",
            "toolName": "write",
            "toolCallId": wid,
            "state": "output-available",
            "input": {"path": "notes.txt", "content": "hi\n"},
            "output": "Created notes.txt (1 lines).",
            "approval": {"id": rid, "requestReason": "change notes.txt", "approved": True},
        },
        {"type": "step-start"},
        {"type": "text", "text": "Wrote it.", "state": "done"},
    ]
    assert (project / "notes.txt").read_text(encoding="utf-8") == "hi\n"


# -- refusals --------------------------------------------------------------------------------------


def test_bad_requests_get_one_line_and_a_hint(served: Served, anthropic: AnthropicServer) -> None:
    anthropic.add(Fault("stall", after_events=0, seconds=20))
    with served.client() as c:
        sid = create(c)
        agui_path, ui_path = f"/v1/sessions/{sid}/agui", f"/v1/sessions/{sid}/ui-stream"

        def refused(path: str, body: Any, status: int = 400) -> dict[str, Any]:
            r = (
                c.post(path, json=body)
                if not isinstance(body, bytes)
                else c.post(path, content=body)
            )
            assert r.status_code == status, r.text
            assert r.headers["content-type"] == "application/json"
            got: dict[str, Any] = r.json()
            return got

        assert refused(agui_path, b"{not json")["error"].startswith("malformed JSON body: ")
        assert refused(agui_path, {"threadId": sid, "messages": []}) == {
            "error": "runId is missing",
            "hint": "send a RunAgentInput: {threadId, runId, messages, …}",
        }
        assert refused(agui_path, {**run_input(sid, "r", "hi"), "thread_id": sid}) == {
            "error": "unknown field 'thread_id'",
            "hint": "this route takes: threadId, runId, parentRunId, protocolVersion, state, "
            "messages, tools, context, forwardedProps, resume",
        }
        assert refused(agui_path, run_input(sid, "r")) == {
            "error": "the last message is not the user's",
            "hint": "add the prompt as the last message: {id, role: user, content}",
        }
        assert refused("/v1/sessions/nope/agui", run_input("nope", "r", "hi"), 404) == {
            "error": "no loaded session 'nope'",
            "hint": 'load it with POST /v1/sessions {"resume": "nope"}; GET /v1/sessions lists them',
        }
        assert refused(ui_path, {**chat_body(sid, "hi"), "trigger": "regenerate-message"}) == {
            "error": "trigger 'regenerate-message' is not supported",
            "hint": "keel runs new prompts (submit-message); fork the session to try a turn again",
        }
        assert refused(ui_path, {"id": sid, "messages": []}) == {
            "error": "messages is empty",
            "hint": "send the chat's messages, the last one new",
        }
        lone = {"id": "a", "role": "assistant", "parts": [{"type": "text", "text": "hi"}]}
        assert refused(ui_path, {"id": sid, "messages": [lone]}) == {
            "error": "the last message is the assistant's and answers no approval",
            "hint": "add a user message, or answer the tool approval requests",
        }
        no_text = {"id": "u", "role": "user", "parts": [{"type": "file", "url": "x"}]}
        assert refused(ui_path, {"id": sid, "messages": [no_text]}) == {
            "error": "the last user message has no text part",
            "hint": "give it a text part",
        }
        # A run in progress (the model stalls): both routes are a 409, as a prompt is.
        assert c.post(f"/v1/sessions/{sid}/prompt", json={"text": "slow"}).status_code == 202
        busy = {
            "error": f"session {sid} is busy (prompt running)",
            "hint": f"wait for its `status` event with busy false, or POST /v1/sessions/{sid}/cancel",
        }
        assert refused(agui_path, run_input(sid, "r", "hi"), 409) == busy
        assert refused(ui_path, chat_body(sid, "hi"), 409) == busy
        assert c.post(f"/v1/sessions/{sid}/cancel", json={}).json() == {"interrupted": True}
    with served.client(token=None) as anonymous:
        r = anonymous.post(agui_path, json=run_input(sid, "r", "hi"))
        assert (r.status_code, r.json()["error"]) == (401, "no bearer token")


# -- the translations of what a scripted run does not reach ----------------------------------------


def test_every_other_keel_event_is_mapped_or_dropped_deliberately() -> None:
    from keel.server.agui import AguiRun
    from keel.server.ui_stream import UiStreamRun

    question: dict[str, Any] = {
        "type": "question",
        "request_id": "q-1",
        "source": "mcp:notes",
        "message": "Which title?",
        "schema": {"type": "object", "properties": {"title": {"type": "string"}}},
    }
    waiting = [question]
    session = {"session": "s", "model": MODEL, "mode": "default", "usage": usage_of(0)}

    def agui_run() -> AguiRun:
        return AguiRun(
            thread_id="t", run_id="r", session=lambda: dict(session), pending=lambda: waiting
        )

    def ui_run() -> UiStreamRun:
        return UiStreamRun(session="s", pending=lambda: waiting, message_id=None, seen=set())

    notice = {"type": "notice", "level": "warning", "text": "no sandbox", "seq": 3, "session": "s"}
    answered = {
        "type": "question_answered",
        "request_id": "q-1",
        "action": "accept",
        "by": "user",
        "waited_ms": 812.5,
        "seq": 4,
        "session": "s",
    }
    sub: dict[str, Any] = {
        "type": "text_delta",
        "text": "inner",
        "subagent": {"parent_tool_use_id": "t1"},
    }
    quiet = [
        {"type": k}
        for k in ("user_message", "status", "turn_started", "tool_started", "request_finished")
    ]
    a = agui_run()
    assert [a.feed(e) for e in [*quiet, sub]] == [[]] * 6
    assert a.feed(notice) == [
        {
            "type": "CUSTOM",
            "name": "keel.notice",
            "value": {"type": "notice", "level": "warning", "text": "no sandbox"},
        }
    ]
    # A question answered (in this client or another): every client closes its form.
    assert a.feed(answered) == [
        {
            "type": "CUSTOM",
            "name": "keel.question_answered",
            "value": {k: v for k, v in answered.items() if k not in ("seq", "session")},
        }
    ]
    # A reply that came whole (not streamed): its tool calls at once.
    whole = {
        "type": "assistant",
        "message": {"content": [{"type": "tool_use", "id": "t9", "name": "glob", "input": {}}]},
    }
    assert a.feed(whole) == [
        {
            "type": "TOOL_CALL_START",
            "toolCallId": "t9",
            "toolCallName": "glob",
            "parentMessageId": "r-0",
        },
        {"type": "TOOL_CALL_ARGS", "toolCallId": "t9", "delta": "{}"},
        {"type": "TOOL_CALL_END", "toolCallId": "t9"},
    ]
    assert agui_checked(a.feed({**question, "seq": 9, "session": "s"}))[-1] == {
        "type": "RUN_FINISHED",
        "threadId": "t",
        "runId": "r",
        "outcome": {
            "type": "interrupt",
            "interrupts": [
                {
                    "id": "q-1",
                    "reason": "input_required",
                    "message": "Which title?",
                    "responseSchema": question["schema"],
                    "metadata": {"keel": {"source": "mcp:notes"}},
                }
            ],
        },
    }
    assert a.done
    ends = {
        "error": ({"error": "the model failed", "hint": "retry"}, "the model failed (hint: retry)"),
        "session_closed": ({"reason": "other"}, "the session was closed (other)"),
        "cleared": ({"new_session": "s2"}, "the session was cleared; it goes on as s2"),
        "dropped": (
            {"reason": "this client fell behind the run"},
            "this client fell behind the run",
        ),
        "server_stopping": ({}, "the server is stopping"),
    }
    for kind, (fields, message) in ends.items():
        a, u = agui_run(), ui_run()
        assert agui_checked(a.feed({"type": kind, **fields})) == [
            {
                "type": "RUN_ERROR",
                "message": message,
                "code": kind,
            }
        ]
        assert u.feed({"type": kind, **fields}) == [{"type": "error", "errorText": message}]
        assert a.done
        assert u.done

    u = ui_run()
    assert [u.feed(e) for e in [*quiet, sub]] == [[]] * 6
    assert u.feed(notice) == [
        {
            "type": "data-keel-notice",
            "data": {"level": "warning", "text": "no sandbox"},
            "transient": True,
        }
    ]
    assert u.feed(answered) == [
        {
            "type": "data-keel-question_answered",
            "data": {"request_id": "q-1", "action": "accept", "by": "user", "waited_ms": 812.5},
            "id": "q-1",
            "transient": True,
        }
    ]
    # No chunk asks for input: the question is a data part the UI answers over keel's route,
    # and the stream goes on.
    assert u.feed(question) == [
        {
            "type": "data-keel-question",
            "data": {k: v for k, v in question.items() if k != "type"},
            "id": "q-1",
        }
    ]
    assert u.feed(question) == []
    assert not u.done

    # A subagent's permission question: its call is not in the message, so it comes first.
    asked = {
        "type": "permission_request",
        "request_id": "perm-7",
        "tool_use_id": "t7",
        "tool": "bash",
        "input": {"command": "ls"},
        "reason": "run ls",
        "suggestion": "bash(ls)",
        "agent": "explore",
    }
    waiting[:] = [asked]
    u = ui_run()
    assert u.feed({**asked, "subagent": {"parent_tool_use_id": "t1"}}) == [
        {
            "type": "tool-input-available",
            "toolCallId": "t7",
            "toolName": "bash",
            "input": {"command": "ls"},
            "dynamic": True,
        },
        {
            "type": "tool-approval-request",
            "approvalId": "perm-7",
            "toolCallId": "t7",
            "reason": "run ls",
        },
        {"type": "finish", "finishReason": "tool-calls"},
    ]
    assert u.done


def test_an_mcp_servers_question_is_an_input_required_interrupt(
    servers: Servers, anthropic: AnthropicServer
) -> None:
    """An MCP server's elicitation (the real features server): AG-UI's `input_required`
    interrupt with the server's fields as its schema; the resume's payload is the answer."""
    from tests.helpers import user_settings_file

    features = Path(__file__).parent / "mcp_servers" / "features_server.py"
    settings = {"mcp_servers": {"feat": {"command": sys.executable, "args": [str(features)]}}}
    user_settings_file().parent.mkdir(parents=True, exist_ok=True)
    user_settings_file().write_text(json.dumps(settings), encoding="utf-8")
    ask = reply("", ("mcp__feat__favourite", {}))
    anthropic.add(ask, reply("Blue it is."))
    served = servers.start()
    with served.client() as c:
        sid = create(c)
        run1 = agui(c, sid, run_input(sid, "run-1", "my favourite colour?"))
        allow = run1[-1]["outcome"]["interrupts"][0]
        assert (allow["reason"], allow["toolCallId"]) == ("tool_call", tool_id(ask))
        approve = [
            {"interruptId": allow["id"], "status": "resolved", "payload": {"approved": True}}
        ]
        run2 = agui(c, sid, run_input(sid, "run-2", resume=approve))
        assert run2[-1]["outcome"]["type"] == "interrupt", run2[-3:]
        question = run2[-1]["outcome"]["interrupts"]
        assert question == [
            {
                "id": question[0]["id"],
                "reason": "input_required",
                "message": "Which colour?",
                "responseSchema": question[0]["responseSchema"],
                "metadata": {"keel": {"source": "feat"}},
            }
        ]
        assert sorted(question[0]["responseSchema"]["properties"]) == ["colour", "shade"]
        answer = [
            {
                "interruptId": question[0]["id"],
                "status": "resolved",
                "payload": {"colour": "blue", "shade": 2},
            }
        ]
        run3 = agui(c, sid, run_input(sid, "run-3", resume=answer))
    result = next(e for e in run3 if e["type"] == "TOOL_CALL_RESULT")
    assert result["content"] == "accepted blue 2"
    assert run3[-1]["outcome"] == {"type": "success"}


def test_a_cancelled_run_and_an_unloaded_session_end_both_streams(
    served: Served, anthropic: AnthropicServer
) -> None:
    """`POST …/cancel` mid-run, or `DELETE` of the session: AG-UI's cancelled outcome, the AI
    SDK's finish `other`."""
    stall = Fault("stall", after_events=0, seconds=20)
    anthropic.add(stall, stall, stall, stall)
    got: dict[str, list[Any]] = {}

    def read(name: str, path: str, body: dict[str, Any]) -> None:
        with served.client() as c:
            got[name] = post_stream(c, path, body)[1]

    def run(name: str, sid: str, then: str) -> None:
        path, body = (
            (f"/v1/sessions/{sid}/agui", run_input(sid, "run-1", "hi"))
            if name.startswith("agui")
            else (f"/v1/sessions/{sid}/ui-stream", chat_body(sid, "hi"))
        )
        reader = threading.Thread(target=read, args=(name, path, body))
        reader.start()
        with served.client() as c:
            deadline = time.monotonic() + 20
            while not c.get(f"/v1/sessions/{sid}").json()["busy"]:
                assert time.monotonic() < deadline, "the run never started"
                time.sleep(0.02)
            if then == "cancel":
                assert c.post(f"/v1/sessions/{sid}/cancel", json={}).status_code == 200
            else:
                assert c.delete(f"/v1/sessions/{sid}").status_code == 204
        reader.join(30)
        assert not reader.is_alive()

    with served.client() as c:
        sids = [create(c) for _ in range(4)]
    run("agui-cancel", sids[0], "cancel")
    run("ui-cancel", sids[1], "cancel")
    run("agui-unload", sids[2], "unload")
    run("ui-unload", sids[3], "unload")
    agui_checked(got["agui-cancel"])
    agui_checked(got["agui-unload"])
    assert got["agui-cancel"][-1]["outcome"] == {"type": "cancelled"}
    assert got["agui-cancel"][-1]["result"]["stop_reason"] == "interrupted"
    assert got["ui-cancel"][-2:] == [
        {
            "type": "finish",
            "finishReason": "other",
            "messageMetadata": {
                "stop_reason": "interrupted",
                "turns": 1,
                "usage": usage_of(0),
                "cost_usd": 0.0,
            },
        },
        "[DONE]",
    ]
    # Unloading interrupts the run first: its result ends the streams before `session_closed`.
    assert got["agui-unload"][-1]["outcome"] == {"type": "cancelled"}
    assert got["ui-unload"][-2:] == got["ui-cancel"][-2:]
