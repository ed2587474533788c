"""Serving tools to other agents over NATS (`keel serve-tools`; docs/remote-tools.md).

`ToolServer` publishes a set of tools as a NATS micro service (`keel-tools`, the identity as
queue group, so several servers of one identity share the load): a discovery endpoint that
answers with the agent card, and a call endpoint. A call is acked at once, kept alive while the
tool runs (at the interval the caller asked for), then answered with the reply or an error. A
server with every slot busy refuses (`capacity`) instead of queueing, so the caller's retry lands
on another member. Each call runs through keel's own tool runner (argument checks, PreToolUse
and PostToolUse hooks, the output truncation) with the serving agent's permission gate, which
never asks anyone: a call the gate would ask about or deny is refused, with the reason.

Which tools may be served at all (`servable`): never session tools (background tasks, todos,
plan approval, subagents, skills), memory, tools that are remote themselves, or tools whose
metadata says they need confirmation. Built-in tools only when named (`--tools`).

This module must never import a front end, and never let a malformed message, a failing tool
or a lost caller end the server: each becomes an error reply or a line in the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from keel import __version__
from keel.agent.events import Event, ToolFinished
from keel.agent.tool_runner import ToolRunner
from keel.errors import UserError
from keel.frozen import mutable
from keel.llm.messages import Image, ToolResult, ToolUse
from keel.permissions.gate import Decision, Deny, Gate, HookOpinion, PermissionGate
from keel.remote.protocol import (
    ENVELOPE_ROOM,
    IDENTITY,
    MAX_MESSAGE_BYTES,
    PROTOCOL,
    VERSIONS,
    ProtocolError,
    call_subject,
    control_subject,
    cut_to_fit,
    discovery_subject,
    encode,
    envelope,
    error_message,
    new_id,
    parse,
)
from keel.tools.base import Tool, ToolContext
from keel.tools.registry import Registry

if TYPE_CHECKING:
    from nats.aio.client import Client
    from nats.aio.msg import Msg
    from nats.aio.subscription import Subscription
    from nats.micro.service import Service

    from keel.hooks.runner import HookRunner

#: Tools that belong to one conversation of the serving agent, never served.
SESSION_TOOLS = frozenset(
    {
        "task",
        "task_stop",
        "task_wait",
        "bash_output",
        "bash_kill",
        "raw_output",
        "todo_write",
        "exit_plan_mode",
        "skill",
    }
)
#: Kinds never served: memory is never exposed to remote callers; a remote tool is not passed on.
NEVER_SERVED_KINDS = frozenset({"memory", "remote", "subagent"})
#: The built-in tools (served only when named).
BUILTIN_NAMES = frozenset(
    {"bash", "edit", "glob", "grep", "ls", "multi_edit", "read", "web_fetch", "write"}
)

DEFAULT_CALL_TIMEOUT = 300.0
#: Keepalive interval when the caller asks for none, and the bounds of what it may ask.
DEFAULT_KEEPALIVE = 10.0
MIN_KEEPALIVE, MAX_KEEPALIVE = 0.1, 30.0
#: Conversations whose tool context (files read, for read-before-edit) is kept.
MAX_CONVERSATIONS = 64


def default_concurrency() -> int:
    import os

    return max(2, min(8, os.cpu_count() or 2))


def tool_kind(tool: Tool) -> str:
    """The tool's kind (`kind` attribute, else told from its name)."""
    kind = getattr(tool, "kind", "")
    if isinstance(kind, str) and kind:
        return kind
    if tool.name.startswith("mcp__"):
        return "mcp"
    if tool.name.startswith("memory"):
        return "memory"
    return "builtin" if tool.name in BUILTIN_NAMES | SESSION_TOOLS else "local"


def needs_confirm(tool: Tool) -> bool:
    try:
        from keel.tools.base import tool_meta  # type: ignore[attr-defined,unused-ignore]
    except ImportError:
        return bool(getattr(tool, "confirm", False))
    return bool(getattr(tool_meta(tool), "confirm", False) or getattr(tool, "confirm", False))


def why_not_served(tool: Tool) -> str | None:
    if tool.name in SESSION_TOOLS:
        return "it belongs to one conversation of the serving agent"
    if (kind := tool_kind(tool)) in NEVER_SERVED_KINDS:
        return f"{kind} tools are never served"
    if needs_confirm(tool):
        return "it needs the user's confirmation for every call, which nobody gives remotely"
    return None


def servable(tools: Iterable[Tool], names: list[str] | None) -> list[Tool]:
    """The tools to serve: those `names` names (each must be servable), or, with no names,
    every servable tool that is not built in."""
    by_name = {t.name: t for t in tools}
    if names is None:
        return [
            t for t in by_name.values() if why_not_served(t) is None and tool_kind(t) != "builtin"
        ]
    chosen = []
    for name in names:
        found = by_name.get(name)
        if found is None:
            offered = sorted(n for n, t in by_name.items() if why_not_served(t) is None)
            raise UserError(
                f"--tools: no tool {name!r} here", hint=f"tools that can be served: {offered}"
            )
        if (why := why_not_served(found)) is not None:
            raise UserError(f"--tools: {name} cannot be served: {why}")
        chosen.append(found)
    return chosen


def _meta(tool: Tool) -> tuple[bool, bool, bool]:
    """(read_only, destructive, idempotent), as `keel.tools.base.tool_meta` says."""
    try:
        from keel.tools.base import tool_meta  # type: ignore[attr-defined,unused-ignore]
    except ImportError:
        read_only = bool(tool.read_only)
        destructive = bool(getattr(tool, "destructive", not read_only))
        return read_only, destructive, bool(getattr(tool, "idempotent", read_only))
    meta = tool_meta(tool)
    return bool(meta.read_only), bool(meta.destructive), bool(meta.idempotent)


def card_entry(tool: Tool) -> dict[str, Any]:
    """How the card describes one tool: its schema and its metadata."""
    read_only, destructive, idempotent = _meta(tool)
    return {
        "name": tool.name,
        "description": tool.description,
        "input_schema": tool.input_schema,
        "kind": tool_kind(tool),
        "read_only": read_only,
        "destructive": destructive,
        "idempotent": idempotent,
    }


class ServingGate:
    """The serving agent's gate, with nobody to ask: what it would ask about or deny is refused,
    with its reason. PermissionRequest hooks and the asker are left out (no one answers for a
    remote caller); a call that is not read-only must also pass `would_allow`."""

    def __init__(self, gate: PermissionGate) -> None:
        self.inner = replace(
            gate,
            asker=None,
            permission_hook=None,
            notify=None,
            record=None,
            headless_hint=(
                "the serving agent's permission rules do not allow this call without asking, "
                "and nobody is asked for a remote call (allow it in the serving project's "
                "settings, permissions.allow)"
            ),
        )

    async def authorize(
        self,
        call: ToolUse,
        *,
        read_only: bool,
        hook: HookOpinion = None,
        confirm: bool = False,
        hook_reason: str = "",
    ) -> Decision:
        if confirm:  # never served; refused here too should one slip through
            return Deny(
                f"refused by the serving agent: {call.name} needs the user's confirmation",
                "serving",
            )
        decision = await self.inner.authorize(
            call, read_only=read_only, hook=hook, hook_reason=hook_reason
        )
        if isinstance(decision, Deny):
            return Deny(f"refused by the serving agent: {decision.reason}", decision.source)
        if (
            not read_only
            and hook != "allow"
            and not self.inner.would_allow(call.name, call.input or {})
        ):
            return Deny(
                f"refused by the serving agent: its rules do not allow {call.name} here "
                "without asking",
                "serving",
            )
        return decision


@mutable
class _Call:
    ident: str
    tool: str
    sender: str
    reply_to: str
    started: float


class ToolServer:
    """Serves `tools` as `identity` on the NATS connection `nc` (the caller owns it)."""

    def __init__(
        self,
        nc: Client,
        identity: str,
        tools: Iterable[Tool],
        ctx: ToolContext,
        *,
        gate: Gate,
        hooks: HookRunner | None = None,
        concurrency: int | None = None,
        call_timeout: float = DEFAULT_CALL_TIMEOUT,
        log: Callable[[str], None] = lambda _line: None,
    ) -> None:
        if not IDENTITY.match(identity):
            raise UserError(
                f"--identity {identity!r}: use 1 to 64 letters, digits, '_' or '-'",
                hint="it is one NATS subject token",
            )
        self.nc = nc
        self.identity = identity
        self.registry = Registry(tools)
        self.ctx = ctx
        self.gate: Gate = ServingGate(gate) if isinstance(gate, PermissionGate) else gate
        self.hooks = hooks
        self.concurrency = concurrency or default_concurrency()
        self.call_timeout = call_timeout
        self.log = log
        self.instance = new_id()
        self.control = control_subject(identity, self.instance)
        self.running: dict[str, asyncio.Task[None]] = {}
        self.busy = 0
        #: Counters, for the log and the tests: accepted, refused for capacity, bad messages.
        self.accepted = self.refused = self.malformed = 0
        self._contexts: OrderedDict[str, ToolContext] = OrderedDict()
        self._service: Service | None = None
        self._control_sub: Subscription | None = None
        self._card = self._card_entries()

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        from nats.micro import add_service
        from nats.micro.service import EndpointConfig, ServiceConfig

        self._service = await add_service(
            self.nc,
            ServiceConfig(
                name="keel-tools",
                version=_semver(__version__),
                description=f"keel remote tools ({PROTOCOL})",
                metadata={"identity": self.identity, "protocol": PROTOCOL},
                queue_group=self.identity,
            ),
        )
        await self._service.add_endpoint(
            EndpointConfig(
                name="discovery",
                subject=discovery_subject(self.identity),
                handler=self._on_discover,
                queue_group=self.identity,
            )
        )
        await self._service.add_endpoint(
            EndpointConfig(
                name="call",
                subject=call_subject(self.identity),
                handler=self._on_call,
                queue_group=self.identity,
            )
        )
        self._control_sub = await self.nc.subscribe(self.control, cb=self._on_control)
        await self.nc.flush()

    async def stop(self) -> None:
        """Stop taking calls, cancel the running ones (each caller gets `cancelled`)."""
        if self._service is not None:
            with contextlib.suppress(Exception):  # a connection already gone has nothing to stop
                await self._service.stop()
        if self._control_sub is not None:
            with contextlib.suppress(Exception):
                await self._control_sub.unsubscribe()
        tasks = list(self.running.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    # -- the card ----------------------------------------------------------------------------

    def _card_entries(self) -> list[dict[str, Any]]:
        entries = [card_entry(t) for t in self.registry]
        size = len(encode({"tools": entries}))
        if size > MAX_MESSAGE_BYTES - ENVELOPE_ROOM:
            raise UserError(
                f"the agent card would take {size:,} bytes, over the {MAX_MESSAGE_BYTES:,} cap",
                hint="serve fewer tools (--tools)",
            )
        return entries

    def card(self, ident: str) -> dict[str, Any]:
        return envelope(
            "card",
            ident,
            agent={
                "identity": self.identity,
                "keel_version": __version__,
                "protocol": PROTOCOL,
                "versions": list(VERSIONS),
            },
            tools=self._card,
            limits={
                "max_message_bytes": MAX_MESSAGE_BYTES,
                "concurrency": self.concurrency,
                "call_timeout": self.call_timeout,
            },
        )

    # -- handlers (each returns at once: NATS runs one subscription's callbacks in order) ------

    async def _send(self, subject: str, message: dict[str, Any]) -> None:
        try:
            await self.nc.publish(subject, encode(message))
        except Exception as exc:  # a caller gone or a connection lost is not the server's end
            self.log(f"could not answer on {subject}: {type(exc).__name__}: {exc}")

    async def _refuse(self, reply_to: str, data: bytes, exc: ProtocolError) -> None:
        self.malformed += 1
        self.log(f"refused a malformed message ({exc.code}): {exc}")
        if reply_to:
            await self._send(reply_to, error_message(_loose_id(data), exc.code, str(exc)))

    async def _on_discover(self, request: Any) -> None:
        msg: Msg = request._msg
        try:
            message = parse(msg.data, {"discover"})
        except ProtocolError as exc:
            await self._refuse(msg.reply, msg.data, exc)
            return
        if msg.reply:
            await self._send(msg.reply, self.card(message["id"]))

    async def _on_call(self, request: Any) -> None:
        msg: Msg = request._msg
        reply_to = msg.reply
        try:
            message = parse(msg.data, {"call"})
        except ProtocolError as exc:
            await self._refuse(reply_to, msg.data, exc)
            return
        ident, name = message["id"], message["tool"]
        if not reply_to:
            self.log(f"call {ident} of {name} has no reply subject; ignored")
            return
        if self.busy >= self.concurrency:
            self.refused += 1
            self.log(f"call {ident} of {name}: refused, every slot busy ({self.concurrency})")
            refusal = {
                "code": "capacity",
                "message": f"all {self.concurrency} slots of this server are busy",
            }
            await self._send(reply_to, envelope("ack", ident, accepted=False, error=refusal))
            return
        if name not in self.registry:
            served = ", ".join(self.registry.names) or "none"
            text = f"this agent does not serve a tool {name!r} (it serves: {served})"
            await self._send(reply_to, error_message(ident, "unknown_tool", text))
            return
        self.busy += 1
        self.accepted += 1
        sender = _printable(str(message.get("sender", "")))[:200]
        call = _Call(ident, name, sender, reply_to, time.monotonic())
        ack = envelope("ack", call.ident, accepted=True, control=self.control, server=self.instance)
        await self._send(reply_to, ack)
        who = f" from {call.sender}" if call.sender else ""
        self.log(f"call {ident} of {name}{who}: started")
        task = asyncio.get_running_loop().create_task(self._serve(call, message))
        self.running[ident] = task

    async def _on_control(self, msg: Msg) -> None:
        try:
            message = parse(msg.data, {"cancel"})
        except ProtocolError as exc:
            await self._refuse(msg.reply, msg.data, exc)
            return
        task = self.running.get(message["id"])
        if task is not None:
            self.log(f"call {message['id']}: cancelled by the caller")
            task.cancel()

    # -- running one call --------------------------------------------------------------------

    async def _serve(self, call: _Call, message: dict[str, Any]) -> None:
        interval = _keepalive(message.get("keepalive"))
        beat = asyncio.get_running_loop().create_task(self._keep_alive(call, interval))
        outcome = "ok"
        try:
            async with asyncio.timeout(self.call_timeout):
                result = await self._run_tool(call, message)
            outcome = "error" if result.is_error else "ok"
            await self._send(call.reply_to, self._reply(call.ident, result))
        except TimeoutError:
            outcome = "timeout"
            text = f"{call.tool} ran longer than the serving agent's {self.call_timeout:g} s limit"
            await self._send(call.reply_to, error_message(call.ident, "timeout", text))
        except asyncio.CancelledError:
            outcome = "cancelled"
            text = f"{call.tool} was cancelled"
            await self._send(call.reply_to, error_message(call.ident, "cancelled", text))
        except Exception as exc:  # a defect must end this call, never the server
            outcome = "internal error"
            text = f"the serving agent failed: {type(exc).__name__}: {exc}"
            await self._send(call.reply_to, error_message(call.ident, "internal", text))
        finally:
            beat.cancel()
            self.busy -= 1
            self.running.pop(call.ident, None)
            seconds = time.monotonic() - call.started
            who = f" from {call.sender}" if call.sender else ""
            self.log(f"call {call.ident} of {call.tool}{who}: {outcome} in {seconds:.2f} s")

    async def _keep_alive(self, call: _Call, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            elapsed = round(time.monotonic() - call.started, 3)
            await self._send(call.reply_to, envelope("keepalive", call.ident, elapsed=elapsed))

    async def _run_tool(self, call: _Call, message: dict[str, Any]) -> ToolResult:
        use = ToolUse(call.ident, call.tool, message["input"])
        runner = ToolRunner(self.registry, self._context(message.get("conversation")), self.gate)
        runner.hooks = self.hooks
        results: dict[str, ToolResult] = {}

        def emit(event: Event) -> None:
            if isinstance(event, ToolFinished) and event.result.is_error:
                self.log(f"call {call.ident} of {call.tool}: {event.result.text[:200]}")

        await runner.run((use,), emit, results, _no_record)
        if call.ident not in results:
            raise RuntimeError("the tool runner left the call unanswered")
        return results[call.ident]

    def _context(self, conversation: object) -> ToolContext:
        """The tool context of one calling conversation (files it read, for read-before-edit),
        kept for the last `MAX_CONVERSATIONS`; a call naming none gets a fresh one."""
        key = conversation if isinstance(conversation, str) and conversation else ""
        if key and key in self._contexts:
            self._contexts.move_to_end(key)
            return self._contexts[key]
        ctx = replace(
            self.ctx,
            read_files={},
            read_ranges={},
            background=None,
            checkpoints=None,
            raw_dir=None,
            on_process=None,
        )
        if key:
            self._contexts[key] = ctx
            while len(self._contexts) > MAX_CONVERSATIONS:
                self._contexts.popitem(last=False)
        return ctx

    def _reply(self, ident: str, result: ToolResult) -> dict[str, Any]:
        parts = [
            b.text if not isinstance(b, Image) else "[an image: remote tools carry text only]"
            for b in result.content
        ]
        content, truncated = cut_to_fit("\n".join(parts), MAX_MESSAGE_BYTES - ENVELOPE_ROOM)
        return envelope(
            "reply", ident, content=content, is_error=result.is_error, truncated=truncated
        )


def _printable(text: str) -> str:
    """`text` for one log line: what a caller sent may hold newlines or escapes."""
    return "".join(c if c.isprintable() else "?" for c in text)


def _no_record(*_args: object) -> None:
    return None  # the serving side keeps no session: the caller journals the call


def _keepalive(asked: object) -> float:
    if isinstance(asked, int | float) and not isinstance(asked, bool) and asked == asked:
        return min(MAX_KEEPALIVE, max(MIN_KEEPALIVE, float(asked)))
    return DEFAULT_KEEPALIVE


def _loose_id(data: bytes) -> str:
    """The id of a message that failed its checks, when one can be read, for the error reply."""
    import json

    try:
        found = json.loads(data).get("id")
    except (ValueError, AttributeError, RecursionError):
        return "unknown"
    return found if isinstance(found, str) and IDENTITY.match(found) else "unknown"


def _semver(version: str) -> str:
    import re

    return version if re.fullmatch(r"\d+\.\d+\.\d+", version) else "0.0.0"


__all__ = [
    "BUILTIN_NAMES",
    "SESSION_TOOLS",
    "ServingGate",
    "ToolServer",
    "default_concurrency",
    "servable",
    "tool_kind",
    "why_not_served",
]
