"""`keel -p --input-format stream-json`: a parent program drives a long-lived keel process over
its stdin and stdout (as Claude Code's SDK mode does). Each stdin line is one JSON object:

- a prompt: `{"type": "user", "message": {"role": "user", "content": "…" | [{"type": "text",
  "text": "…"}]}}` (Claude Code's shape) or `{"type": "prompt", "text": "…"}`; prompts run one
  after another, in the order they came;
- an answer to a `permission_request` line: `{"type": "permission_response", "request_id": "…",
  "allow": true, "scope": "once" | "session" | "always", "reason": "…"}`, or Claude Code's
  `{"type": "control_response", "response": {"request_id": "…", "subtype": "success",
  "response": {"behavior": "allow" | "deny", "message": "…"}}}`;
- an answer to a `question` line: `{"type": "question_response", "request_id": "…", "values":
  {…} | null}`;
- `{"type": "interrupt"}` (or `{"type": "control_request", "request": {"subtype":
  "interrupt"}}`): stop the running prompt.

stdout carries the stream-json events, one `result` line per prompt. A line keel cannot use is
answered with an `input_error` line naming the line number and why, and skipped. End of input:
keel finishes the running prompt and the ones queued, then exits with the last one's code.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from keel.agent.loop import Agent, RunResult
from keel.errors import UserError
from keel.permissions.gate import PermissionGate, PermissionReply

#: A parsed input line: ("prompt", text) | ("answer", request_id, reply) | ("interrupt",)
Command = tuple[Any, ...]


class InputError(ValueError):
    """A line that is not a command keel knows (the message says why)."""


def parse_line(line: str) -> Command:
    try:
        obj = json.loads(line)
    except ValueError as exc:
        raise InputError(f"not JSON ({exc})") from exc
    if not isinstance(obj, dict):
        raise InputError("not a JSON object")
    parse = _PARSERS.get(obj.get("type"))  # type: ignore[arg-type]
    if parse is None:
        raise InputError(f"unknown type {obj.get('type')!r}")
    return parse(obj)


def _prompt(obj: dict[str, Any]) -> Command:
    return ("prompt", _text(obj.get("text")))


def _user(obj: dict[str, Any]) -> Command:
    message = obj.get("message")
    if not isinstance(message, dict):
        raise InputError('"user" needs a "message" object')
    return ("prompt", _text(message.get("content")))


def _permission(obj: dict[str, Any]) -> Command:
    allow = obj.get("allow")
    if not isinstance(allow, bool):
        raise InputError('"permission_response" needs "allow": true or false')
    scope = obj.get("scope", "once")
    if scope not in ("once", "session", "always"):
        raise InputError('"scope" is one of once, session, always')
    return ("answer", _id(obj), PermissionReply(allow, scope, str(obj.get("reason") or "")))


def _question(obj: dict[str, Any]) -> Command:
    values = obj.get("values")
    if values is not None and not isinstance(values, dict):
        raise InputError('"values" is an object, or null to decline')
    return ("answer", _id(obj), values)


def _control_response(obj: dict[str, Any]) -> Command:
    response = obj.get("response")
    inner = response.get("response") if isinstance(response, dict) else None
    behavior = inner.get("behavior") if isinstance(inner, dict) else None
    if not isinstance(response, dict) or not isinstance(inner, dict):
        raise InputError('"control_response" needs "response": {"request_id", "response"}')
    if behavior not in ("allow", "deny"):
        raise InputError('a control_response answers with "behavior": "allow" or "deny"')
    reason = str(inner.get("message") or "")
    return ("answer", _id(response), PermissionReply(behavior == "allow", reason=reason))


def _interrupt(_obj: dict[str, Any]) -> Command:
    return ("interrupt",)


def _control_request(obj: dict[str, Any]) -> Command:
    request = obj.get("request")
    if isinstance(request, dict) and request.get("subtype") == "interrupt":
        return ("interrupt",)
    raise InputError("the only control_request keel takes is interrupt")


_PARSERS: dict[str, Callable[[dict[str, Any]], Command]] = {
    "prompt": _prompt,
    "user": _user,
    "permission_response": _permission,
    "question_response": _question,
    "control_response": _control_response,
    "interrupt": _interrupt,
    "control_request": _control_request,
}


def _text(content: object) -> str:
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        text = "\n".join(
            str(b.get("text", ""))
            for b in content
            if isinstance(b, dict) and b.get("type") == "text"
        )
    else:
        raise InputError("a prompt's content is a string or a list of text blocks")
    if not text.strip():
        raise InputError("the prompt is empty")
    return text


def _id(obj: dict[str, Any]) -> str:
    request_id = obj.get("request_id")
    if not isinstance(request_id, str) or not request_id:
        raise InputError('"request_id" is missing')
    return request_id


async def _lines() -> asyncio.Queue[str | None]:
    """stdin's lines as they come (None at the end), read without blocking the loop."""
    queue: asyncio.Queue[str | None] = asyncio.Queue()
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=64 * 1024 * 1024)
    try:
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin.buffer)
    except (ValueError, OSError):  # a regular file: read it at once
        for line in sys.stdin.read().splitlines():
            queue.put_nowait(line)
        queue.put_nowait(None)
        return queue

    async def pump() -> None:
        while line := await reader.readline():
            queue.put_nowait(line.decode("utf-8", "replace"))
        queue.put_nowait(None)

    task = loop.create_task(pump())
    _keep.add(task)
    task.add_done_callback(_keep.discard)
    return queue


_keep: set[asyncio.Task[None]] = set()


async def drive(agent: Agent, printer: Any, model: str, first: str = "") -> RunResult | None:
    """Run prompts from stdin until it ends; answers and interrupts apply as they come. Returns
    the last prompt's result (None when no prompt came)."""
    agent.ask_through_events()
    prompts: asyncio.Queue[str | None] = asyncio.Queue()
    if first:
        prompts.put_nowait(first)
    lines = await _lines()
    last: RunResult | None = None

    async def read() -> None:
        number = 0
        while (line := await lines.get()) is not None:
            number += 1
            if not line.strip():
                continue
            try:
                command = parse_line(line)
            except InputError as exc:
                printer.line({"type": "input_error", "line": number, "error": str(exc)})
                continue
            if command[0] == "prompt":
                prompts.put_nowait(command[1])
            elif command[0] == "interrupt":
                if agent.busy:
                    agent.interrupt("interrupted by the parent program")
            else:
                try:
                    known = agent.answer(command[1], command[2])
                except TypeError as exc:
                    printer.line({"type": "input_error", "line": number, "error": str(exc)})
                    continue
                if not known:
                    printer.line(
                        {
                            "type": "input_error",
                            "line": number,
                            "error": f"no question {command[1]!r} is waiting",
                        }
                    )
        # Nobody is left to answer: what waits is refused, and so is what would ask later.
        if isinstance(agent.gate, PermissionGate):
            agent.gate.asker = None
        agent.questions.cancel_all("the input ended before an answer")
        prompts.put_nowait(None)

    reading = asyncio.create_task(read())
    try:
        while (prompt := await prompts.get()) is not None:
            start = time.monotonic()
            last = await agent.run(prompt, printer)
            path = str(agent.session.path) if agent.session else None
            printer.finish(last, model=model, seconds=time.monotonic() - start, path=path)
    finally:
        reading.cancel()
        await asyncio.gather(reading, return_exceptions=True)
    return last


def check_formats(args: Any) -> None:
    if args.input_format == "stream-json" and args.output_format != "stream-json":
        raise UserError(
            "--input-format stream-json needs --output-format stream-json",
            hint="the questions it answers arrive as stream-json lines on stdout",
        )
