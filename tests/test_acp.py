"""`keel acp` end to end: a scripted Agent Client Protocol client speaking raw JSON-RPC lines to a
real `keel acp` process over real pipes, with a loopback Anthropic server as the model.

Raw lines, not the `acp` package's client, so the wire format is checked against the spec's
shapes independently of the package keel's side is built on. Every line keel writes to stdout
must be a JSON-RPC 2.0 message (logs go to stderr). Streamed text arrives in chunks of the fake
server's choosing, so consecutive chunks of one kind are joined before whole sequences are
compared.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from keel.llm.catalog import BY_PROVIDER, parse_model
from keel.llm.script import Fault, Reply, reply
from keel.session.journal import read_records
from keel.session.records import AssistantRecord
from keel.testing.anthropic_server import AnthropicServer
from keel.testing.openai_server import OpenAIResponsesServer
from tests.helpers import context_of
from tests.test_cli import session_files

MODEL = "anthropic/claude-sonnet-4-5"
TIMEOUT = 30.0

Json = dict[str, Any]


@pytest.fixture
def anthropic() -> Iterator[AnthropicServer]:
    with AnthropicServer(api_key="sk-ant-test") as server:
        yield server


class Client:
    """One ACP client connection to a `keel acp` process."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.updates: list[Json] = []
        #: Requests keel sent us (session/request_permission), in order.
        self.requests: list[Json] = []
        #: Errors keel answered with id null (to lines that were not requests), in order.
        self.refusals: list[Json] = []
        self.answer: Callable[[Json], Json | None] = lambda _msg: None
        self._next = 0
        self._waiting: dict[int, asyncio.Future[Json]] = {}
        self._arrived = asyncio.Event()
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            message = json.loads(line)  # every stdout line is JSON-RPC: nothing else gets there
            assert message["jsonrpc"] == "2.0", message
            if "method" not in message and message["id"] is None:
                self.refusals.append(message)
            elif "method" not in message:
                self._waiting.pop(message["id"]).set_result(message)
            elif message["method"] == "session/update":
                assert "id" not in message
                self.updates.append(message["params"])
            else:
                self.requests.append(message)
                result = self.answer(message)
                if result is not None:
                    await self.respond(message["id"], result)
            self._arrived.set()

    async def send(self, message: Json) -> None:
        await self.send_raw((json.dumps(message) + "\n").encode())

    async def send_raw(self, line: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line)
        await self.proc.stdin.drain()

    async def call(self, method: str, params: Json) -> Json:
        """Send a request; the whole response message."""
        rid = self._next
        self._next += 1
        future: asyncio.Future[Json] = asyncio.get_running_loop().create_future()
        self._waiting[rid] = future
        await self.send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        return await asyncio.wait_for(future, TIMEOUT)

    def start(self, method: str, params: Json) -> asyncio.Task[Json]:
        return asyncio.create_task(self.call(method, params))

    async def notify(self, method: str, params: Json) -> None:
        await self.send({"jsonrpc": "2.0", "method": method, "params": params})

    async def respond(self, rid: Any, result: Json) -> None:
        await self.send({"jsonrpc": "2.0", "id": rid, "result": result})

    async def until(self, check: Callable[[], bool]) -> None:
        async def wait() -> None:
            while not check():
                self._arrived.clear()
                await self._arrived.wait()

        await asyncio.wait_for(wait(), TIMEOUT)

    async def initialize(self) -> Json:
        return await self.call(
            "initialize",
            {
                "protocolVersion": 1,
                "clientCapabilities": {"fs": {"readTextFile": False, "writeTextFile": False}},
                "clientInfo": {"name": "test-client", "version": "1"},
            },
        )

    async def new_session(self, cwd: Path) -> str:
        response = await self.call("session/new", {"cwd": str(cwd), "mcpServers": []})
        sid: str = response["result"]["sessionId"]
        return sid

    async def prompt(self, sid: str, text: str) -> Json:
        return await self.call(
            "session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": text}]}
        )

    async def close(self) -> tuple[int, str]:
        assert self.proc.stdin is not None
        assert self.proc.stderr is not None
        self.proc.stdin.close()
        await asyncio.wait_for(self._reader, TIMEOUT)
        stderr = (await self.proc.stderr.read()).decode()
        return await asyncio.wait_for(self.proc.wait(), TIMEOUT), stderr


@pytest.fixture
async def connect(anthropic: AnthropicServer, project: Path) -> AsyncIterator[Callable[..., Any]]:
    clients: list[Client] = []

    async def start(*args: str) -> Client:
        env = {
            **os.environ,
            "ANTHROPIC_API_KEY": "sk-ant-test",
            "ANTHROPIC_BASE_URL": anthropic.url,
        }
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "keel",
            "acp",
            "--model",
            MODEL,
            *args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=project,
            env=env,
        )
        client = Client(proc)
        clients.append(client)
        return client

    yield start
    for client in clients:
        if client.proc.returncode is None:
            client.proc.kill()
            await client.proc.wait()
        client._reader.cancel()
        await asyncio.gather(client._reader, return_exceptions=True)


#: How the first prompt's reply starts where bash has no sandbox (without bubblewrap).
NO_SANDBOX = "⚠ no sandbox:"


def joined(updates: list[Json]) -> list[Json]:
    """The updates with consecutive text chunks of one kind joined into one (the session id
    checked and dropped)."""
    out: list[Json] = []
    for params in updates:
        update = params["update"]
        kind = update["sessionUpdate"]
        if kind == "agent_message_chunk" and update["content"]["text"].startswith(NO_SANDBOX):
            continue  # this machine's sandbox status (test_the_sandbox_status_reaches_the_editor)
        if (
            kind in ("agent_message_chunk", "agent_thought_chunk", "user_message_chunk")
            and out
            and out[-1]["sessionUpdate"] == kind
        ):
            last = out[-1]["content"]
            out[-1] = {
                **out[-1],
                "content": {**last, "text": last["text"] + update["content"]["text"]},
            }
        else:
            out.append(update)
    return out


def for_session(updates: list[Json], sid: str) -> list[Json]:
    assert {u["sessionId"] for u in updates} <= {sid}
    return joined(updates)


def call_id(step: Reply, index: int = 0) -> str:
    return step.message.tool_uses[index].id


def text(value: str) -> Json:
    return {"type": "text", "text": value}


def message(value: str) -> Json:
    return {"sessionUpdate": "agent_message_chunk", "content": text(value)}


MODES: Json = {
    "currentModeId": "default",
    "availableModes": [
        {
            "id": "default",
            "name": "Default",
            "description": "Ask before edits and before commands outside the sandbox",
        },
        {
            "id": "accept-edits",
            "name": "Accept edits",
            "description": "Edit files in the project without asking",
        },
        {
            "id": "plan",
            "name": "Plan",
            "description": "Read and plan only: no edits, no commands that change anything",
        },
        {
            "id": "bypass",
            "name": "Bypass permissions",
            "description": "Run every tool without asking (deny and ask rules still apply)",
        },
        {
            "id": "auto",
            "name": "Auto",
            "description": "A model classifier decides what would ask you (deny and ask rules "
            "still apply)",
        },
    ],
}


MODE_CONFIG: Json = {
    "id": "mode",
    "name": "Mode",
    "description": "How keel asks before it acts (the permission mode)",
    "category": "mode",
    "type": "select",
    "currentValue": "default",
    "options": [
        {"value": m["id"], "name": m["name"], "description": m["description"]}
        for m in MODES["availableModes"]
    ],
}


def model_config(current: str, *named: str) -> Json:
    """The `model` config option: the session's and `--model`'s models first, then the catalog's
    models of their providers, each described by its window and prices."""
    refs = [parse_model(spec) for spec in named]
    providers = dict.fromkeys(r.provider for r in refs)
    specs = [*named, *(f"{p}/{m}" for p in providers for m in BY_PROVIDER[p])]
    options = []
    for spec in dict.fromkeys(specs):
        info = BY_PROVIDER[parse_model(spec).provider][parse_model(spec).model]
        prices = f"${info.input_price:g} in / ${info.output_price:g} out per Mtok"
        about = f"{info.window // 1000}k context window, {prices}"
        options.append({"value": spec, "name": spec, "description": about})
    return {
        "id": "model",
        "name": "Model",
        "description": "The model the next request goes to (provider/model)",
        "category": "model",
        "type": "select",
        "currentValue": current,
        "options": options,
    }


def allow(option: str) -> Callable[[Json], Json]:
    return lambda _msg: {"outcome": {"outcome": "selected", "optionId": option}}


# -- initialize, new session, a streamed prompt with tool calls and a plan -------------------------


async def test_initialize_new_session_and_a_prompt_streams_text_tools_and_plan(
    connect: Callable[..., Any], anthropic: AnthropicServer, project: Path
) -> None:
    read = reply("Let me look. ", ("read", {"path": "util.py"}))
    todo = reply(
        "",
        (
            "todo_write",
            {
                "todos": [
                    {"content": "Read util.py", "status": "completed"},
                    {"content": "Explain it", "status": "in_progress", "active_form": "Explaining"},
                ]
            },
        ),
    )
    anthropic.add(reply("Looking", thinking="I should read the file."))
    client = await connect()
    init = await client.initialize()
    assert init == {
        "jsonrpc": "2.0",
        "id": 0,
        "result": {
            "protocolVersion": 1,
            "agentCapabilities": {
                "loadSession": True,
                "promptCapabilities": {"image": False, "audio": False, "embeddedContext": True},
                "sessionCapabilities": {"list": {}},
            },
            "authMethods": [],
            "agentInfo": {
                "name": "keel",
                "title": "keel",
                "version": init["result"]["agentInfo"]["version"],
            },
        },
    }
    created = await client.call("session/new", {"cwd": str(project), "mcpServers": []})
    sid = created["result"]["sessionId"]
    assert created == {
        "jsonrpc": "2.0",
        "id": 1,
        "result": {
            "sessionId": sid,
            "modes": MODES,
            "configOptions": [MODE_CONFIG, model_config(MODEL, MODEL)],
        },
    }

    first = await client.prompt(sid, "hi")
    assert first == {"jsonrpc": "2.0", "id": 2, "result": {"stopReason": "end_turn"}}
    assert for_session(client.updates, sid) == [
        {"sessionUpdate": "agent_thought_chunk", "content": text("I should read the file.")},
        message("Looking"),
    ]

    client.updates.clear()
    anthropic.add(read, todo, reply("util.py sets X to 1."))
    second = await client.prompt(sid, "what is in util.py?")
    assert second["result"] == {"stopReason": "end_turn"}
    rid = call_id(read)
    assert for_session(client.updates, sid) == [
        message("Let me look. "),
        {
            "sessionUpdate": "tool_call",
            "toolCallId": rid,
            "title": "Read util.py",
            "kind": "read",
            "status": "pending",
            "locations": [{"path": str(project / "util.py")}],
            "rawInput": {"path": "util.py"},
        },
        {"sessionUpdate": "tool_call_update", "toolCallId": rid, "status": "in_progress"},
        {
            "sessionUpdate": "tool_call_update",
            "toolCallId": rid,
            "status": "completed",
            "content": [{"type": "content", "content": text("```\n     1\tX = 1\n```")}],
        },
        {
            "sessionUpdate": "plan",
            "entries": [
                {"content": "Read util.py", "priority": "medium", "status": "completed"},
                {"content": "Explain it", "priority": "medium", "status": "in_progress"},
            ],
        },
        message("util.py sets X to 1."),
    ]
    # The model saw the prompt as typed.
    last = anthropic.model_requests[-1].json["messages"]
    assert last[2]["content"][0]["text"] == "what is in util.py?"
    rc, stderr = await client.close()
    assert rc == 0, stderr
    assert not anthropic.script


# -- permissions ---------------------------------------------------------------------------------


def permission_request(sid: str, call: str, project: Path, request_id: int) -> Json:
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "session/request_permission",
        "params": {
            "sessionId": sid,
            "toolCall": {
                "toolCallId": call,
                "kind": "edit",
                "status": "pending",
                "title": "Write new.txt",
                "content": [
                    {"type": "diff", "path": str(project / "new.txt"), "newText": "hello\n"}
                ],
                "locations": [{"path": str(project / "new.txt")}],
                "rawInput": {"path": "new.txt", "content": "hello\n"},
            },
            "options": [
                {"optionId": "allow_once", "name": "Allow once", "kind": "allow_once"},
                {
                    "optionId": "allow_always",
                    "name": "Always allow write",
                    "kind": "allow_always",
                },
                {"optionId": "reject_once", "name": "Reject", "kind": "reject_once"},
            ],
        },
    }


def write_call(sid: str, call: str, project: Path) -> Json:
    return {
        "sessionUpdate": "tool_call",
        "toolCallId": call,
        "title": "Write new.txt",
        "kind": "edit",
        "status": "pending",
        "content": [{"type": "diff", "path": str(project / "new.txt"), "newText": "hello\n"}],
        "locations": [{"path": str(project / "new.txt")}],
        "rawInput": {"path": "new.txt", "content": "hello\n"},
    }


async def test_permission_allowed_once_runs_the_write(
    connect: Callable[..., Any], anthropic: AnthropicServer, project: Path
) -> None:
    write = reply("", ("write", {"path": "new.txt", "content": "hello\n"}))
    anthropic.add(write, reply("Written."))
    client = await connect()
    client.answer = allow("allow_once")
    await client.initialize()
    sid = await client.new_session(project)
    done = await client.prompt(sid, "write new.txt")
    assert done["result"] == {"stopReason": "end_turn"}
    wid = call_id(write)
    assert client.requests == [permission_request(sid, wid, project, 0)]
    diff = [{"type": "diff", "path": str(project / "new.txt"), "newText": "hello\n"}]
    assert for_session(client.updates, sid) == [
        write_call(sid, wid, project),
        {"sessionUpdate": "tool_call_update", "toolCallId": wid, "status": "in_progress"},
        {
            "sessionUpdate": "tool_call_update",
            "toolCallId": wid,
            "status": "completed",
            "content": diff,
        },
        message("Written."),
    ]
    assert (project / "new.txt").read_text(encoding="utf-8") == "hello\n"
    result = anthropic.model_requests[-1].json["messages"][-1]["content"][0]
    assert (result["type"], result["tool_use_id"], result.get("is_error", False)) == (
        "tool_result",
        wid,
        False,
    )
    await client.close()


async def test_permission_rejected_denies_the_write_and_the_model_is_told(
    connect: Callable[..., Any], anthropic: AnthropicServer, project: Path
) -> None:
    write = reply("", ("write", {"path": "new.txt", "content": "hello\n"}))
    anthropic.add(write, reply("Understood, not writing."))
    client = await connect()
    client.answer = allow("reject_once")
    await client.initialize()
    sid = await client.new_session(project)
    done = await client.prompt(sid, "write new.txt")
    assert done["result"] == {"stopReason": "end_turn"}
    wid = call_id(write)
    assert client.requests == [permission_request(sid, wid, project, 0)]
    assert for_session(client.updates, sid) == [
        write_call(sid, wid, project),
        {
            "sessionUpdate": "tool_call_update",
            "toolCallId": wid,
            "status": "failed",
            "content": [{"type": "content", "content": text("the user denied this")}],
        },
        message("Understood, not writing."),
    ]
    assert not (project / "new.txt").exists()
    result = anthropic.model_requests[-1].json["messages"][-1]["content"][0]
    assert result["is_error"] is True
    assert result["content"] == [{"type": "text", "text": "the user denied this"}]
    await client.close()


async def test_an_unknown_option_denies(
    connect: Callable[..., Any], anthropic: AnthropicServer, project: Path
) -> None:
    """Fail closed: an answer keel did not offer is a no."""
    write = reply("", ("write", {"path": "new.txt", "content": "hello\n"}))
    anthropic.add(write, reply("ok"))
    client = await connect()
    client.answer = allow("allow_everything_forever")
    await client.initialize()
    sid = await client.new_session(project)
    assert (await client.prompt(sid, "write"))["result"] == {"stopReason": "end_turn"}
    assert not (project / "new.txt").exists()
    result = anthropic.model_requests[-1].json["messages"][-1]["content"][0]
    assert result["is_error"] is True
    assert result["content"] == [
        {
            "type": "text",
            "text": "the user denied this: the editor chose an option keel did not offer "
            "('allow_everything_forever')",
        }
    ]
    await client.close()


# -- cancel --------------------------------------------------------------------------------------


async def test_cancel_mid_tool_stops_the_command_and_the_prompt_returns_cancelled(
    connect: Callable[..., Any], anthropic: AnthropicServer, project: Path
) -> None:
    sleep = reply("", ("bash", {"command": "sleep 30"}))
    anthropic.add(sleep)
    client = await connect("--allowed-tools", "bash(sleep *)")
    await client.initialize()
    sid = await client.new_session(project)
    running = client.start(
        "session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "wait"}]}
    )
    sid_call = call_id(sleep)
    started = {"sessionUpdate": "tool_call_update", "toolCallId": sid_call, "status": "in_progress"}
    await client.until(lambda: started in joined(client.updates))
    t0 = asyncio.get_running_loop().time()
    await client.notify("session/cancel", {"sessionId": sid})
    done = await running
    assert asyncio.get_running_loop().time() - t0 < 10
    assert done["result"] == {"stopReason": "cancelled"}
    updates = for_session(client.updates, sid)
    assert updates == [
        {
            "sessionUpdate": "tool_call",
            "toolCallId": sid_call,
            "title": "`sleep 30`",
            "kind": "execute",
            "status": "pending",
            "rawInput": {"command": "sleep 30"},
        },
        started,
        {
            "sessionUpdate": "tool_call_update",
            "toolCallId": sid_call,
            "status": "failed",
            "content": [{"type": "content", "content": text("```\ninterrupted by user\n```")}],
        },
    ]
    # No model request after the cancel.
    assert len(anthropic.model_requests) == 1
    # The session goes on: a next prompt runs.
    anthropic.add(reply("Back."))
    client.updates.clear()
    assert (await client.prompt(sid, "again"))["result"] == {"stopReason": "end_turn"}
    assert for_session(client.updates, sid) == [message("Back.")]
    await client.close()


async def test_cancel_while_a_permission_question_waits_denies_it(
    connect: Callable[..., Any], anthropic: AnthropicServer, project: Path
) -> None:
    """The client answers an open question `cancelled` when it cancels (the spec's rule): the
    call is denied, nothing is written."""
    write = reply("", ("write", {"path": "new.txt", "content": "hello\n"}))
    anthropic.add(write)
    client = await connect()
    await client.initialize()
    sid = await client.new_session(project)
    running = client.start(
        "session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "write"}]}
    )
    await client.until(lambda: bool(client.requests))
    await client.notify("session/cancel", {"sessionId": sid})
    await client.respond(client.requests[0]["id"], {"outcome": {"outcome": "cancelled"}})
    done = await running
    assert done["result"] == {"stopReason": "cancelled"}
    assert not (project / "new.txt").exists()
    await client.close()


# -- modes ---------------------------------------------------------------------------------------


async def test_set_mode_accept_edits_writes_unasked_and_an_unknown_mode_is_refused(
    connect: Callable[..., Any], anthropic: AnthropicServer, project: Path
) -> None:
    write = reply("", ("write", {"path": "new.txt", "content": "hello\n"}))
    anthropic.add(write, reply("Done."))
    client = await connect()
    await client.initialize()
    sid = await client.new_session(project)
    bad = await client.call("session/set_mode", {"sessionId": sid, "modeId": "yolo"})
    assert bad["error"]["code"] == -32602
    assert bad["error"]["message"] == (
        "unknown mode 'yolo' (hint: modes: default, accept-edits, plan, bypass, auto)"
    )
    ok = await client.call("session/set_mode", {"sessionId": sid, "modeId": "accept-edits"})
    assert ok == {"jsonrpc": "2.0", "id": ok["id"], "result": {}}
    # The mode's config option follows, before the answer.
    assert [u["update"] for u in client.updates] == [
        {
            "sessionUpdate": "config_option_update",
            "configOptions": [
                {**MODE_CONFIG, "currentValue": "accept-edits"},
                model_config(MODEL, MODEL),
            ],
        }
    ]
    assert (await client.prompt(sid, "write it"))["result"] == {"stopReason": "end_turn"}
    assert client.requests == []
    assert (project / "new.txt").read_text(encoding="utf-8") == "hello\n"
    # The model is told of the mode change with the prompt, after the context block.
    sent = anthropic.model_requests[0].json
    assert [block["text"] for block in sent["messages"][0]["content"]] == [
        context_of(sent),
        "<system-note>\nThe permission mode is now accept-edits.\n</system-note>\n\nwrite it",
    ]
    await client.close()


async def test_plan_approval_switches_mode_and_tells_the_client(
    connect: Callable[..., Any], anthropic: AnthropicServer, project: Path
) -> None:
    plan_text = "1. write new.txt"
    approve = reply("", ("exit_plan_mode", {"plan": plan_text}))
    write = reply("", ("write", {"path": "new.txt", "content": "hello\n"}))
    anthropic.add(approve, write, reply("Done."))
    client = await connect("--mode", "plan")
    client.answer = allow("accept-edits")
    await client.initialize()
    created = await client.call("session/new", {"cwd": str(project), "mcpServers": []})
    sid = created["result"]["sessionId"]
    assert created["result"]["modes"]["currentModeId"] == "plan"
    assert (await client.prompt(sid, "plan it"))["result"] == {"stopReason": "end_turn"}
    pid = call_id(approve)
    assert client.requests == [
        {
            "jsonrpc": "2.0",
            "id": 0,
            "method": "session/request_permission",
            "params": {
                "sessionId": sid,
                "toolCall": {
                    "toolCallId": pid,
                    "kind": "switch_mode",
                    "status": "pending",
                    "title": "Ready to code: approve the plan",
                    "content": [{"type": "content", "content": text(plan_text)}],
                    "rawInput": {"plan": plan_text},
                },
                "options": [
                    {
                        "optionId": "accept-edits",
                        "name": "Yes, and accept edits",
                        "kind": "allow_always",
                    },
                    {
                        "optionId": "default",
                        "name": "Yes, and ask before edits",
                        "kind": "allow_once",
                    },
                    {"optionId": "reject_once", "name": "No, keep planning", "kind": "reject_once"},
                ],
            },
        }
    ]
    updates = for_session(client.updates, sid)
    wid = call_id(write)
    diff = [{"type": "diff", "path": str(project / "new.txt"), "newText": "hello\n"}]
    approved = "The user approved the plan. Carry it out now, step by step."
    # The mode changed before the write, which then ran without a question.
    assert updates == [
        {
            "sessionUpdate": "tool_call",
            "toolCallId": pid,
            "title": "Ready to code: approve the plan",
            "kind": "switch_mode",
            "status": "pending",
            "rawInput": {"plan": plan_text},
        },
        {"sessionUpdate": "tool_call_update", "toolCallId": pid, "status": "in_progress"},
        {
            "sessionUpdate": "tool_call_update",
            "toolCallId": pid,
            "status": "completed",
            "content": [{"type": "content", "content": text(approved)}],
        },
        {"sessionUpdate": "current_mode_update", "currentModeId": "accept-edits"},
        {
            "sessionUpdate": "config_option_update",
            "configOptions": [
                {**MODE_CONFIG, "currentValue": "accept-edits"},
                model_config(MODEL, MODEL),
            ],
        },
        write_call(sid, wid, project),
        {"sessionUpdate": "tool_call_update", "toolCallId": wid, "status": "in_progress"},
        {
            "sessionUpdate": "tool_call_update",
            "toolCallId": wid,
            "status": "completed",
            "content": diff,
        },
        message("Done."),
    ]
    assert len(client.requests) == 1
    assert (project / "new.txt").read_text(encoding="utf-8") == "hello\n"
    await client.close()


# -- load ----------------------------------------------------------------------------------------


async def test_load_replays_an_earlier_session_and_continues_it(
    connect: Callable[..., Any], anthropic: AnthropicServer, project: Path
) -> None:
    read = reply("Reading. ", ("read", {"path": "util.py"}))
    anthropic.add(read, reply("X is 1."))
    first = await connect()
    await first.initialize()
    sid = await first.new_session(project)
    assert (await first.prompt(sid, "what is X?"))["result"] == {"stopReason": "end_turn"}
    rc, _ = await first.close()
    assert rc == 0

    second = await connect()
    await second.initialize()
    unknown = await second.call(
        "session/load", {"sessionId": "nope", "cwd": str(project), "mcpServers": []}
    )
    assert unknown["error"]["code"] == -32602
    prefix = await second.call(
        "session/load", {"sessionId": sid[:-2], "cwd": str(project), "mcpServers": []}
    )
    assert prefix["error"]["data"] == {"details": f"no session {sid[:-2]}"}
    loaded = await second.call(
        "session/load", {"sessionId": sid, "cwd": str(project), "mcpServers": []}
    )
    assert loaded == {
        "jsonrpc": "2.0",
        "id": loaded["id"],
        "result": {"modes": MODES, "configOptions": [MODE_CONFIG, model_config(MODEL, MODEL)]},
    }
    rid = call_id(read)
    assert for_session(second.updates, sid) == [
        {"sessionUpdate": "user_message_chunk", "content": text("what is X?")},
        message("Reading. "),
        {
            "sessionUpdate": "tool_call",
            "toolCallId": rid,
            "title": "Read util.py",
            "kind": "read",
            "status": "pending",
            "locations": [{"path": str(project / "util.py")}],
            "rawInput": {"path": "util.py"},
        },
        {
            "sessionUpdate": "tool_call_update",
            "toolCallId": rid,
            "status": "completed",
            "content": [{"type": "content", "content": text("```\n     1\tX = 1\n```")}],
        },
        message("X is 1."),
    ]
    # It continues with the whole conversation.
    anthropic.add(reply("Still 1."))
    assert (await second.prompt(sid, "and now?"))["result"] == {"stopReason": "end_turn"}
    sent = anthropic.model_requests[-1].json["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user", "assistant", "user"]
    assert sent[-1]["content"][-1]["text"] == "and now?"
    await second.close()


async def test_load_names_what_changed_and_force_goes_on(
    connect: Callable[..., Any], anthropic: AnthropicServer, project: Path
) -> None:
    """A session whose instructions changed since it ran is refused with the change named;
    `keel acp --force` loads it anyway (an editor has no other way to say "go on")."""
    anthropic.add(reply("Hi."))
    first = await connect()
    await first.initialize()
    sid = await first.new_session(project)
    assert (await first.prompt(sid, "hi"))["result"] == {"stopReason": "end_turn"}
    await first.close()
    (project / "AGENTS.md").write_text("Always answer in French.\n", encoding="utf-8")
    params = {"sessionId": sid, "cwd": str(project), "mcpServers": []}
    second = await connect()
    await second.initialize()
    refused = await second.call("session/load", params)
    assert "error" in refused, refused
    assert "AGENTS.md" in json.dumps(refused["error"])
    await second.close()
    third = await connect("--force")
    await third.initialize()
    loaded = await third.call("session/load", params)
    assert "result" in loaded, loaded
    anthropic.add(reply("Bonjour."))
    assert (await third.prompt(sid, "again"))["result"] == {"stopReason": "end_turn"}
    await third.close()


async def test_load_keeps_the_sessions_model_and_the_editor_switches_it(
    connect: Callable[..., Any],
    anthropic: AnthropicServer,
    project: Path,
    isolated_env: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Claude session loads in a `keel acp --model openai/gpt-5` and goes on with Claude; the
    editor then switches the model through the `model` config option, and the next request goes
    to OpenAI with the whole conversation."""
    anthropic.add(reply("X is 1."))
    first = await connect()
    await first.initialize()
    sid = await first.new_session(project)
    assert (await first.prompt(sid, "what is X?"))["result"] == {"stopReason": "end_turn"}
    await first.close()

    with OpenAIResponsesServer(api_key="sk-openai-test") as openai:
        monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-test")
        monkeypatch.setenv("OPENAI_BASE_URL", openai.url + "/v1")
        second = await connect("--model", "openai/gpt-5")
        await second.initialize()
        loaded = await second.call(
            "session/load", {"sessionId": sid, "cwd": str(project), "mcpServers": []}
        )
        assert loaded["result"]["modes"] == MODES
        options = loaded["result"]["configOptions"]
        assert options == [MODE_CONFIG, model_config(MODEL, MODEL, "openai/gpt-5")]
        assert options[1]["options"][:2] == [
            {
                "value": MODEL,
                "name": MODEL,
                "description": "200k context window, $3 in / $15 out per Mtok",
            },
            {
                "value": "openai/gpt-5",
                "name": "openai/gpt-5",
                "description": options[1]["options"][1]["description"],
            },
        ]

        anthropic.add(reply("Still 1."))
        assert (await second.prompt(sid, "and now?"))["result"] == {"stopReason": "end_turn"}
        assert anthropic.model_requests[-1].json["model"] == "claude-sonnet-4-5"

        second.updates.clear()
        switch = {"sessionId": sid, "configId": "model", "value": "openai/gpt-5"}
        switched = await second.call("session/set_config_option", switch)
        assert switched["result"] == {
            "configOptions": [MODE_CONFIG, model_config("openai/gpt-5", MODEL, "openai/gpt-5")]
        }
        openai.add(reply("gpt-5 here: X is 1."))
        answer = await second.prompt(sid, "who answers?")
        assert answer["result"] == {"stopReason": "end_turn"}
        assert for_session(second.updates, sid) == [message("gpt-5 here: X is 1.")]
        assert len(anthropic.model_requests) == 2
        [request] = openai.model_requests
        assert request.json["model"] == "gpt-5"
        # The context the session opened with travels with its first prompt to the new model.
        context = context_of(anthropic.model_requests[0].json)
        assert context.startswith("<context>\n")
        assert [(i["role"], [c["text"] for c in i["content"]]) for i in request.json["input"]] == [
            ("user", [context, "what is X?"]),
            ("assistant", ["X is 1."]),
            ("user", ["and now?"]),
            ("assistant", ["Still 1."]),
            ("user", ["who answers?"]),
        ]

        # The mode is a config option too; unknown options and models are refused.
        plan = await second.call(
            "session/set_config_option", {"sessionId": sid, "configId": "mode", "value": "plan"}
        )
        assert plan["result"]["configOptions"][0]["currentValue"] == "plan"
        assert second.updates[-1]["update"] == {
            "sessionUpdate": "current_mode_update",
            "currentModeId": "plan",
        }
        unknown = await second.call(
            "session/set_config_option", {"sessionId": sid, "configId": "speed", "value": "x"}
        )
        assert unknown["error"]["data"] == {
            "details": "unknown config option 'speed': keel has mode and model"
        }
        bad = await second.call(
            "session/set_config_option",
            {"sessionId": sid, "configId": "model", "value": "nowhere/model"},
        )
        assert bad["error"]["code"] == -32602
        rc, stderr = await second.close()
        assert rc == 0, stderr
    [path] = session_files(isolated_env)
    models = [
        (r.payload.message.provider, r.payload.message.model)
        for r in read_records(path).records
        if isinstance(r.payload, AssistantRecord)
    ]
    assert models == [
        ("anthropic", "claude-sonnet-4-5"),
        ("anthropic", "claude-sonnet-4-5"),
        ("openai", "gpt-5"),
    ]


async def test_a_session_of_another_project_is_not_loaded(
    connect: Callable[..., Any], anthropic: AnthropicServer, project: Path, tmp_path: Path
) -> None:
    anthropic.add(reply("hi"))
    first = await connect()
    await first.initialize()
    sid = await first.new_session(project)
    await first.prompt(sid, "hi")
    await first.close()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    second = await connect()
    await second.initialize()
    refused = await second.call(
        "session/load", {"sessionId": sid, "cwd": str(elsewhere), "mcpServers": []}
    )
    assert refused["error"] == {
        "code": -32602,
        "message": f"session {sid} belongs to {project}, not {elsewhere} "
        "(hint: open it from its own project)",
        "data": None,
    }
    assert second.updates == []
    await second.close()


# -- the transport -------------------------------------------------------------------------------


async def test_bad_requests_get_errors_not_a_crash(
    connect: Callable[..., Any], project: Path
) -> None:
    client = await connect()
    await client.initialize()
    relative = await client.call("session/new", {"cwd": "project", "mcpServers": []})
    assert relative["error"]["code"] == -32602
    assert relative["error"]["data"] == {"details": "cwd must be absolute, not 'project'"}
    ghost = await client.call(
        "session/prompt", {"sessionId": "ghost", "prompt": [{"type": "text", "text": "hi"}]}
    )
    assert ghost["error"]["code"] == -32602
    sid = await client.new_session(project)
    image = await client.call(
        "session/prompt",
        {"sessionId": sid, "prompt": [{"type": "image", "data": "AAAA", "mimeType": "image/png"}]},
    )
    assert image["error"]["data"] == {"details": "images are not supported by keel over ACP yet"}
    rc, stderr = await client.close()
    assert rc == 0, stderr


def refusal(code: int, message: str) -> Json:
    return {"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}}


async def test_a_line_that_is_not_a_request_is_answered_and_serving_goes_on(
    connect: Callable[..., Any],
) -> None:
    client = await connect()
    for line in (b"[1,2]", b"42", b'"x"', b"null", b"{}", b'{"id": [1], "result": 1}', b"{no"):
        await client.send_raw(line + b"\n")
    assert (await client.initialize())["result"]["protocolVersion"] == 1
    not_object = refusal(-32600, "Invalid Request: a JSON-RPC message is a JSON object")
    assert client.refusals == [
        *[not_object] * 4,
        refusal(-32600, "Invalid Request: a message needs a method (a request) or an id"),
        refusal(-32600, "Invalid Request: an id is a string, a number or null"),
        refusal(-32700, "Parse error: not JSON"),
    ]
    rc, stderr = await client.close()
    assert (rc, stderr) == (0, "")


def peak_rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text(encoding="utf-8")
    return next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:"))


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc/<pid>/status")
async def test_a_line_over_the_limit_is_refused_without_being_kept(
    connect: Callable[..., Any],
) -> None:
    """A 100 MiB line is skipped as it streams past (never held whole), answered with one error,
    and the next request is answered at once."""
    client = await connect()
    await client.initialize()
    before = peak_rss_kib(client.proc.pid)
    started = time.monotonic()
    huge = b"x" * (100 << 20)
    await client.send_raw(b'{"jsonrpc": "2.0", "id": 7, "method": "initialize", "params": "' + huge)
    await client.send_raw(b'"}\n')
    del huge
    assert (await client.initialize())["result"]["protocolVersion"] == 1
    assert time.monotonic() - started < 10
    assert client.refusals == [
        refusal(-32600, "Invalid Request: a message is at most 16 MiB (this line was longer)")
    ]
    assert peak_rss_kib(client.proc.pid) - before < 40 << 10
    rc, stderr = await client.close()
    assert (rc, stderr) == (0, "")


def test_stdio_is_taken_for_the_protocol(tmp_path: Path) -> None:
    """After `claim_stdio`, a stray print, a write to fd 1 and a child process inheriting the
    descriptors all land on stderr; only what is written to the protocol's stream reaches
    stdout, and fd 0 no longer reads the client's messages."""
    script = (
        "import os, subprocess, sys\n"
        "from keel.acp.stdio import claim_stdio\n"
        "rpc_in, rpc_out = claim_stdio()\n"
        "print('stray print')\n"
        "os.write(1, b'stray fd write\\n')\n"
        "subprocess.run(['sh', '-c', 'echo child; cat'], check=True)\n"
        'rpc_out.write(b\'{"jsonrpc": "2.0"}\\n\')\n'
        "rpc_out.write(rpc_in.readline())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        input=b"client line\n",
        capture_output=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == b'{"jsonrpc": "2.0"}\nclient line\n'
    assert out.stderr == b"stray print\nstray fd write\nchild\n"


@pytest.mark.parametrize("argv", [["--version"], ["-p", "hi", "--model", "scripted:demo"]])
def test_keel_version_and_print_do_not_import_acp(argv: list[str], project: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "keel", *argv],
        capture_output=True,
        text=True,
        cwd=project,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    modules = [line.split("|")[-1].strip() for line in out.stderr.splitlines() if "|" in line]
    assert "keel.cli.main" in modules
    assert [m for m in modules if m.split(".")[0] == "acp" or m.startswith("keel.acp")] == []


async def test_always_allow_saves_the_rule_and_the_next_write_is_not_asked(
    connect: Callable[..., Any], anthropic: AnthropicServer, project: Path
) -> None:
    write = reply("", ("write", {"path": "new.txt", "content": "hello\n"}))
    again = reply("", ("write", {"path": "other.txt", "content": "more\n"}))
    anthropic.add(write, again, reply("Both written."))
    client = await connect()
    client.answer = allow("allow_always")
    await client.initialize()
    sid = await client.new_session(project)
    assert (await client.prompt(sid, "write two files"))["result"] == {"stopReason": "end_turn"}
    assert [r["params"]["toolCall"]["toolCallId"] for r in client.requests] == [call_id(write)]
    saved = json.loads((project / ".keel" / "settings.local.json").read_text(encoding="utf-8"))
    assert saved == {"permissions": {"allow": ["write"]}}

    def done(call: str, name: str, body: str) -> list[Json]:
        diff = [{"type": "diff", "path": str(project / name), "newText": body}]
        return [
            {"sessionUpdate": "tool_call_update", "toolCallId": call, "status": "in_progress"},
            {
                "sessionUpdate": "tool_call_update",
                "toolCallId": call,
                "status": "completed",
                "content": diff,
            },
        ]

    wid, oid = call_id(write), call_id(again)
    other = write_call(sid, oid, project)
    other = {
        **other,
        "title": "Write other.txt",
        "content": [{"type": "diff", "path": str(project / "other.txt"), "newText": "more\n"}],
        "locations": [{"path": str(project / "other.txt")}],
        "rawInput": {"path": "other.txt", "content": "more\n"},
    }
    assert for_session(client.updates, sid) == [
        write_call(sid, wid, project),
        {
            "sessionUpdate": "agent_thought_chunk",
            "content": text("always allowed write (saved to .keel/settings.local.json)\n"),
        },
        *done(wid, "new.txt", "hello\n"),
        other,
        *done(oid, "other.txt", "more\n"),
        message("Both written."),
    ]
    assert (project / "other.txt").read_text(encoding="utf-8") == "more\n"
    await client.close()


async def test_a_run_that_fails_answers_with_keels_one_line_error(
    connect: Callable[..., Any], anthropic: AnthropicServer, project: Path
) -> None:
    anthropic.add(Fault("status", status=400, message="messages: bad request"))
    client = await connect()
    await client.initialize()
    sid = await client.new_session(project)
    failed = await client.prompt(sid, "hi")
    assert failed["error"] == {
        "code": -32603,
        "message": "anthropic returned 400: messages: bad request",
        "data": None,
    }
    rc, stderr = await client.close()
    assert rc == 0, stderr


async def test_a_session_another_process_holds_is_refused(
    connect: Callable[..., Any], anthropic: AnthropicServer, project: Path
) -> None:
    anthropic.add(reply("hi"))
    holder = await connect()
    await holder.initialize()
    sid = await holder.new_session(project)
    await holder.prompt(sid, "hi")
    other = await connect()
    await other.initialize()
    refused = await other.call(
        "session/load", {"sessionId": sid, "cwd": str(project), "mcpServers": []}
    )
    assert refused["error"]["code"] == -32602
    assert refused["error"]["message"] == (
        f"session {sid} is already open for writing by pid {holder.proc.pid} "
        "(hint: wait for that run to finish, or suspend it with `keel suspend`)"
    )
    assert other.updates == []
    await other.close()
    await holder.close()


async def test_killed_mid_tool_then_loaded_finishes_the_turn_before_the_next_prompt(
    connect: Callable[..., Any], anthropic: AnthropicServer, project: Path
) -> None:
    """The journal is the truth: kill -9 keel while a command runs, load the session in a new
    `keel acp`, and the next prompt first finishes the cut-off turn (the call runs again,
    through the gate), then runs."""
    sleep = reply("", ("bash", {"command": "sleep 1"}))
    anthropic.add(sleep)
    first = await connect("--allowed-tools", "bash(sleep *)")
    await first.initialize()
    sid = await first.new_session(project)
    first.start("session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "nap"}]})
    sid_call = call_id(sleep)
    running = {"sessionUpdate": "tool_call_update", "toolCallId": sid_call, "status": "in_progress"}
    await first.until(lambda: running in joined(first.updates))
    first.proc.kill()
    await first.proc.wait()

    anthropic.add(reply("Slept."), reply("Next."))
    second = await connect("--allowed-tools", "bash(sleep *)")
    await second.initialize()
    loaded = await second.call(
        "session/load", {"sessionId": sid, "cwd": str(project), "mcpServers": []}
    )
    assert "result" in loaded, loaded
    announced = {
        "sessionUpdate": "tool_call",
        "toolCallId": sid_call,
        "title": "`sleep 1`",
        "kind": "execute",
        "status": "pending",
        "rawInput": {"command": "sleep 1"},
    }
    assert for_session(second.updates, sid) == [
        {"sessionUpdate": "user_message_chunk", "content": text("nap")},
        announced,
    ]
    second.updates.clear()
    done = await second.prompt(sid, "then?")
    assert done["result"] == {"stopReason": "end_turn"}
    assert for_session(second.updates, sid) == [
        {
            "sessionUpdate": "agent_thought_chunk",
            "content": text(
                "continuing the turn this session stopped in\n"
                "resuming: 1 unanswered tool call(s) to run\n"
            ),
        },
        running,
        {
            "sessionUpdate": "tool_call_update",
            "toolCallId": sid_call,
            "status": "completed",
            "content": [{"type": "content", "content": text("```\n[exit code 0]\n```")}],
        },
        message("Slept.\n\nNext."),
    ]
    # The cut-off call's result reached the model, then the new prompt did.
    assert len(anthropic.model_requests) == 3
    resumed = anthropic.model_requests[1].json["messages"]
    assert resumed[-1]["content"][0]["tool_use_id"] == sid_call
    assert anthropic.model_requests[2].json["messages"][-1]["content"][-1]["text"] == "then?"
    await second.close()


async def test_list_shows_the_projects_prompted_sessions_latest_first(
    connect: Callable[..., Any], anthropic: AnthropicServer, project: Path
) -> None:
    from datetime import UTC, datetime

    from keel.session.index import find_session

    anthropic.add(reply("one"), reply("two"))
    client = await connect()
    await client.initialize()
    older = await client.new_session(project)
    await client.prompt(older, "first question\nwith a second line")
    newer = await client.new_session(project)
    await client.prompt(newer, "second question")
    await client.new_session(project)  # never prompted: not listed

    def updated(sid: str) -> str:
        mtime = find_session(sid, project).stat().st_mtime
        return datetime.fromtimestamp(mtime, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    listed = await client.call("session/list", {"cwd": str(project)})
    assert listed["result"] == {
        "sessions": [
            {
                "sessionId": newer,
                "cwd": str(project),
                "title": "second question",
                "updatedAt": updated(newer),
            },
            {
                "sessionId": older,
                "cwd": str(project),
                "title": "first question",
                "updatedAt": updated(older),
            },
        ]
    }
    bad = await client.call("session/list", {"cursor": "not-a-cursor"})
    assert bad["error"]["data"] == {"details": "not a cursor keel gave: 'not-a-cursor'"}
    await client.close()


async def test_a_subagents_tool_calls_are_shown_labelled_and_its_text_is_not(
    connect: Callable[..., Any], anthropic: AnthropicServer, project: Path
) -> None:
    task = reply(
        "",
        (
            "task",
            {
                "description": "find X",
                "prompt": "What is X in util.py?",
                "subagent_type": "explore",
            },
        ),
    )
    child_read = reply("Reading.", ("read", {"path": "util.py"}))
    anthropic.add(task, child_read, reply("X is 1."), reply("The subagent says X is 1."))
    client = await connect()
    await client.initialize()
    sid = await client.new_session(project)
    assert (await client.prompt(sid, "ask a subagent"))["result"] == {"stopReason": "end_turn"}
    tid, rid = call_id(task), call_id(child_read)
    updates = for_session(client.updates, sid)
    assert [
        (u["sessionUpdate"], u.get("toolCallId"), u.get("status"), u.get("title")) for u in updates
    ] == [
        ("tool_call", tid, "pending", "Task: find X"),
        ("tool_call_update", tid, "in_progress", None),
        ("tool_call", rid, "pending", "explore: Read util.py"),
        ("tool_call_update", rid, "in_progress", None),
        ("tool_call_update", rid, "completed", None),
        ("tool_call_update", tid, "completed", None),
        ("agent_message_chunk", None, None, None),
    ]
    assert updates[0]["kind"] == "think"
    assert updates[-1] == message("The subagent says X is 1.")
    # The task's result is the subagent's report; the subagent's own text is not streamed.
    assert updates[-2]["content"] == [{"type": "content", "content": text("X is 1.")}]
    await client.close()


async def test_linked_and_embedded_files_are_attached_to_the_prompt(
    connect: Callable[..., Any], anthropic: AnthropicServer, project: Path
) -> None:
    """A `resource_link` is a mention keel attaches from disk; an embedded resource (an
    unsaved buffer) is attached as the editor sent it, and mentions in it are not followed."""
    anthropic.add(reply("Seen."))
    client = await connect()
    await client.initialize()
    sid = await client.new_session(project)
    done = await client.call(
        "session/prompt",
        {
            "sessionId": sid,
            "prompt": [
                {"type": "text", "text": "compare"},
                {"type": "resource_link", "name": "util.py", "uri": f"file://{project}/util.py"},
                {"type": "text", "text": "with"},
                {
                    "type": "resource",
                    "resource": {
                        "uri": f"file://{project}/app.py",
                        "mimeType": "text/x-python",
                        "text": "@README.md\ndef main(): ...",
                    },
                },
            ],
        },
    )
    assert done["result"] == {"stopReason": "end_turn"}
    sent = anthropic.model_requests[0].json
    assert [block["text"] for block in sent["messages"][0]["content"]] == [
        context_of(sent),
        "compare @util.py with\n\n"
        '<attached-file path="util.py">\nX = 1\n</attached-file>\n\n'
        '<attached-file path="app.py">\n@README.md\ndef main(): ...\n</attached-file>',
    ]
    await client.close()


async def test_an_error_instead_of_an_answer_denies(
    connect: Callable[..., Any], anthropic: AnthropicServer, project: Path
) -> None:
    """Fail closed: a client that answers the question with a JSON-RPC error is a no."""
    write = reply("", ("write", {"path": "new.txt", "content": "hello\n"}))
    anthropic.add(write, reply("ok"))
    client = await connect()
    await client.initialize()
    sid = await client.new_session(project)
    running = client.start(
        "session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "write"}]}
    )
    await client.until(lambda: bool(client.requests))
    await client.send(
        {
            "jsonrpc": "2.0",
            "id": client.requests[0]["id"],
            "error": {"code": -32603, "message": "the panel crashed"},
        }
    )
    assert (await running)["result"] == {"stopReason": "end_turn"}
    assert not (project / "new.txt").exists()
    result = anthropic.model_requests[-1].json["messages"][-1]["content"][0]
    assert result["is_error"] is True
    assert result["content"] == [
        {
            "type": "text",
            "text": "the user denied this: the editor did not answer (the panel crashed)",
        }
    ]
    await client.close()


async def test_the_sandbox_status_reaches_the_editor(
    connect: Callable[..., Any], anthropic: AnthropicServer, project: Path
) -> None:
    """Where bash has no sandbox, the editor is told once, in the first reply, before anything
    runs (the other tests leave that line out: it depends on the machine)."""
    from tests.conftest import missing

    anthropic.add(reply("Hello"))
    client = await connect()
    await client.initialize()
    created = await client.call("session/new", {"cwd": str(project), "mcpServers": []})
    sid = created["result"]["sessionId"]
    assert (await client.prompt(sid, "hi"))["result"] == {"stopReason": "end_turn"}
    texts = [
        u["update"]["content"]["text"]
        for u in client.updates
        if u["update"]["sessionUpdate"] == "agent_message_chunk"
    ]
    warned = [t for t in texts if t.startswith(NO_SANDBOX)]
    if missing("sandbox") is None:
        assert warned == []
        assert "".join(texts) == "Hello"
    else:
        assert len(warned) == 1
        assert "commands will need permission" in warned[0]
        assert "".join(texts).endswith("Hello")
