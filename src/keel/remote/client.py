"""Calling tools another keel serves over NATS (docs/remote-tools.md): discovery, calls, and
the import of a peer's tools into an agent (`import_remote_tools`, from `remote_tools` in the
settings).

A call (`Peer.call`) publishes the request with a fresh inbox as its reply subject and reads
what comes back: an ack at once, keepalives while the tool runs, then the reply or an error.
The timeout bounds the gap between two messages, never the whole call, and the caller asks the
server for a keepalive three times per timeout. A server that refuses for capacity is retried
(a bounded number of times, with backoff and jitter), which lands on another member of the
queue group. Cancelling the awaiting task sends a cancel to the server that acked.

A remote card is untrusted: tool names are checked and, on a clash with a tool of this agent or
a name keel reserves (built-ins, `mcp__…`), prefixed with the peer's alias or identity; schemas
and descriptions are capped; the card's `read_only` is shown, never believed, so the gate asks
about every remote tool unless an allow rule names it.

This module must never be imported by `keel` or `keel -p` unless `remote_tools` is set (it
imports nats-py lazily, here only).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import time
from collections.abc import Callable
from dataclasses import field
from typing import TYPE_CHECKING, Any

from keel.errors import UserError
from keel.frozen import mutable
from keel.llm.events import Notice
from keel.remote.protocol import (
    IDENTITY,
    MAX_DESCRIPTION,
    MAX_SCHEMA_BYTES,
    MAX_TOOLS,
    PROTOCOL,
    TOOL_NAME,
    ProtocolError,
    call_subject,
    discovery_subject,
    encode,
    envelope,
    new_id,
    parse,
)
from keel.tools.base import ToolContext, ToolError, ToolOutput
from keel.tools.builtin import builtin_tools

if TYPE_CHECKING:
    from nats.aio.client import Client

    from keel.agent.events import Event
    from keel.agent.loop import Agent
    from keel.config.settings import RemotePeer, Settings

#: Seconds without a message from the peer before a call (or a discovery) gives up.
DEFAULT_TIMEOUT = 30.0
#: Attempts of one call while servers refuse for capacity, and the backoff between them.
ATTEMPTS = 8
BACKOFF_BASE, BACKOFF_CAP = 0.05, 1.0
#: The longest a call may take when the card says nothing about it.
MAX_CALL = 86_400.0
#: Seconds to connect to a NATS server at setup.
CONNECT_TIMEOUT = 5.0

#: Names a remote tool never takes as they are (keel's own tools, present or not): the built-ins
#: and the tools keel adds itself.
RESERVED = frozenset(t.name for t in builtin_tools()) | {
    "task",
    "web_search",
    "skill",
    "memory",
    "knowledge_search",
    "list_mcp_resources",
    "read_mcp_resource",
}


class RemoteError(Exception):
    """A call or discovery that failed: `code` (a protocol error code, or `unavailable`,
    `timeout`, `bad_reply`), the text one line."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@mutable
class CallResult:
    content: str
    is_error: bool
    truncated: bool = False
    #: How many times servers refused for capacity before one took the call.
    refusals: int = 0


@mutable
class Peer:
    """One identity on one NATS connection (borrowed: the importer closes it)."""

    nc: Client
    identity: str
    timeout: float = DEFAULT_TIMEOUT
    attempts: int = ATTEMPTS
    sender: str = ""
    #: The longest one call may take however many keepalives come (a peer that keeps a call
    #: open forever is cut off): the card's own call timeout plus `timeout`.
    max_call: float = MAX_CALL
    sleep: Callable[[float], Any] = field(default=asyncio.sleep, repr=False)

    async def discover(self) -> dict[str, Any]:
        """The peer's agent card (checked: the identity it answers as is the one asked)."""
        ident = new_id()
        try:
            msg = await self.nc.request(
                discovery_subject(self.identity),
                encode(envelope("discover", ident)),
                timeout=self.timeout,
            )
        except Exception as exc:
            raise _transport_error(exc, self.identity, self.timeout) from None
        card = _checked(msg.data, {"card", "error"}, ident, self.identity)
        if card["type"] == "error":
            raise RemoteError(card["error"]["code"], _said(self.identity, card["error"]))
        agent = card["agent"]
        if agent.get("identity") != self.identity:
            raise RemoteError(
                "bad_reply", f"asked for {self.identity!r}, answered as {agent.get('identity')!r}"
            )
        return card

    async def call(self, tool: str, args: dict[str, Any], *, conversation: str = "") -> CallResult:
        refusals = 0
        for attempt in range(self.attempts):
            result = await self._attempt(tool, args, conversation)
            if result is not None:
                result.refusals = refusals
                return result
            refusals += 1
            if attempt + 1 < self.attempts:
                wait = min(BACKOFF_CAP, BACKOFF_BASE * 2**attempt)
                await self.sleep(wait / 2 + random.uniform(0, wait / 2))
        raise RemoteError(
            "capacity",
            f"every server of {self.identity} was busy ({refusals} refusals); try again later",
        )

    async def _attempt(
        self, tool: str, args: dict[str, Any], conversation: str
    ) -> CallResult | None:
        """One try: the result, or None when the server refused for capacity."""
        ident = new_id()
        keepalive = max(0.1, self.timeout / 3)
        request = envelope(
            "call",
            ident,
            tool=tool,
            input=args,
            conversation=conversation,
            sender=self.sender,
            keepalive=keepalive,
        )
        data = encode(request)
        if len(data) > self.nc.max_payload:
            raise RemoteError(
                "too_large",
                f"the call's input takes {len(data):,} bytes, over the {self.nc.max_payload:,} "
                "a message may carry; send less",
            )
        inbox = self.nc.new_inbox()
        sub = await self.nc.subscribe(inbox)
        control = ""
        deadline = time.monotonic() + self.max_call
        try:
            await self.nc.publish(call_subject(self.identity), data, reply=inbox)
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RemoteError(
                        "timeout",
                        f"{self.identity} kept the call going past {self.max_call:g} s (its own "
                        "limit for a call, and more)",
                    )
                try:
                    msg = await sub.next_msg(timeout=min(self.timeout, left))
                except Exception as exc:
                    if time.monotonic() >= deadline:
                        continue  # said above, at the top of the loop
                    raise _transport_error(exc, self.identity, self.timeout, control) from None
                if _no_responders(msg):
                    raise RemoteError("unavailable", _nobody(self.identity))
                message = _checked(
                    msg.data, {"ack", "keepalive", "reply", "error"}, ident, self.identity
                )
                kind = message["type"]
                if kind == "ack" and not message["accepted"]:
                    error = message.get("error") or {"code": "", "message": "refused"}
                    if error.get("code") == "capacity":
                        return None
                    raise RemoteError(str(error.get("code")), _said(self.identity, error))
                if kind == "ack":
                    control = _control(message, self.identity)
                elif kind == "reply":
                    return CallResult(
                        message["content"], message["is_error"], bool(message.get("truncated"))
                    )
                elif kind == "error":
                    raise RemoteError(
                        message["error"]["code"], _said(self.identity, message["error"])
                    )
        except asyncio.CancelledError:
            if control:
                with contextlib.suppress(Exception):  # best effort: the turn is ending anyway
                    await self.nc.publish(control, encode(envelope("cancel", ident)))
                    await asyncio.wait_for(self.nc.flush(), 1.0)
            raise
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()


def _checked(data: bytes, expect: set[str], ident: str, identity: str) -> dict[str, Any]:
    try:
        message = parse(data, expect)
    except ProtocolError as exc:
        raise RemoteError("bad_reply", f"{identity} sent a malformed message: {exc}") from None
    if message["id"] != ident:
        raise RemoteError("bad_reply", f"{identity} answered another request ({message['id']})")
    return message


def _control(ack: dict[str, Any], identity: str) -> str:
    """The subject cancels go to: only a control subject of this identity is taken."""
    subject = ack.get("control", "")
    prefix = f"keel.tools.control.{identity}."
    token = subject[len(prefix) :] if isinstance(subject, str) else ""
    return subject if subject.startswith(prefix) and IDENTITY.match(token) else ""


def _said(identity: str, error: dict[str, Any]) -> str:
    return f"{identity}: {str(error.get('message', ''))[:500]}"


def _nobody(identity: str) -> str:
    return f"no keel serve-tools answers as {identity!r} on this NATS server"


def _no_responders(msg: Any) -> bool:
    headers = getattr(msg, "headers", None) or {}
    return bool(headers.get("Status") == "503") and not msg.data


def _transport_error(
    exc: Exception, identity: str, timeout: float, control: str = ""
) -> RemoteError:
    import nats.errors

    if isinstance(exc, nats.errors.NoRespondersError):
        return RemoteError("unavailable", _nobody(identity))
    if isinstance(exc, nats.errors.TimeoutError | asyncio.TimeoutError):
        during = "after accepting the call" if control else "at all"
        return RemoteError(
            "timeout",
            f"{identity} sent nothing for {timeout:g} s {during} (the peer may have stopped)",
        )
    return RemoteError("unavailable", f"NATS: {type(exc).__name__}: {exc}")


# -- remote tools, as the agent's tools ----------------------------------------------------------


@mutable(eq=False)
class RemoteTool:
    """One tool of a peer, as keel's `Tool`. `read_only` is False whatever the card says (a
    card is untrusted: the gate asks unless an allow rule names the tool); what the card said
    is kept in `card_read_only`."""

    name: str
    description: str
    input_schema: dict[str, Any]
    peer: Peer = field(repr=False)
    remote_name: str = ""
    read_only: bool = False
    kind: str = "remote"
    card_read_only: bool = False
    destructive: bool = True
    idempotent: bool = False
    confirm: bool = False
    #: Safe to run again after a crash only when the peer says it is idempotent or read-only.
    repeat_safe: bool = False

    def validate(self, args: Any) -> str | None:
        if not isinstance(args, dict):
            return f"arguments must be a JSON object, got {type(args).__name__}"
        return None  # the serving agent checks them against its schema

    async def run(self, ctx: ToolContext, args: dict[str, Any]) -> ToolOutput:
        try:
            result = await self.peer.call(self.remote_name, args, conversation=ctx.session_id)
        except RemoteError as exc:
            hint = _HINTS.get(exc.code, "")
            raise ToolError(f"remote tool {self.name} ({exc.code}): {exc}{hint}") from None
        return ToolOutput(result.content, is_error=result.is_error)


_HINTS = {
    "unavailable": "; the peer is not running: go on without it or ask the user",
    "timeout": "; the peer stopped answering: do not assume the call took effect",
    "capacity": "; try again later",
    "refused": "",
    "bad_reply": "; the peer's reply could not be read: do not assume the call took effect",
}


def build_tools(
    card: dict[str, Any],
    peer: Peer,
    *,
    prefix: str,
    wanted: tuple[str, ...] | None,
    taken: set[str],
    warn: Callable[[str], None],
) -> list[RemoteTool]:
    """The card's tools as the agent's tools: filtered by `wanted`, named to avoid `taken` and
    the reserved names, capped and checked (each bad entry skipped with a warning)."""
    listed = card["tools"]
    if len(listed) > MAX_TOOLS:
        warn(f"the card lists {len(listed)} tools; only the first {MAX_TOOLS} are taken")
        listed = listed[:MAX_TOOLS]
    tools: list[RemoteTool] = []
    seen: set[str] = set()
    for entry in listed:
        tool = _one_tool(entry, peer, prefix=prefix, taken=taken, warn=warn)
        if tool is None or tool.remote_name in seen:
            continue
        if wanted is not None and tool.remote_name not in wanted:
            continue
        seen.add(tool.remote_name)
        taken.add(tool.name)
        tools.append(tool)
    if wanted is not None and (missing := [n for n in wanted if n not in seen]):
        warn(f"not served there: {', '.join(missing)}")
    return tools


def _one_tool(
    entry: Any, peer: Peer, *, prefix: str, taken: set[str], warn: Callable[[str], None]
) -> RemoteTool | None:
    who = peer.identity
    if not isinstance(entry, dict):
        warn("a card entry that is not an object was skipped")
        return None
    name, description, schema = (
        entry.get("name"),
        entry.get("description"),
        entry.get("input_schema"),
    )
    if not isinstance(name, str) or not TOOL_NAME.match(name):
        warn(f"a tool with an invalid name ({str(name)[:40]!r}) was skipped")
        return None
    if not isinstance(schema, dict) or schema.get("type", "object") != "object":
        warn(f"tool {name} has no object input schema; skipped")
        return None
    if len(encode(schema)) > MAX_SCHEMA_BYTES:
        warn(f"tool {name}'s input schema is over {MAX_SCHEMA_BYTES:,} bytes; skipped")
        return None
    local = name
    if local in taken or local in RESERVED or local.startswith("mcp__"):
        local = f"{prefix}_{name}"[:64]
        if local in taken:
            warn(f"tool {name} clashes with {local}, already taken; skipped")
            return None
    text = description if isinstance(description, str) else ""
    if len(text) > MAX_DESCRIPTION:
        text = text[: MAX_DESCRIPTION - 1] + "…"
    read_only = entry.get("read_only") is True
    idempotent = entry.get("idempotent") is True
    return RemoteTool(
        name=local,
        description=(
            f'Remote tool "{name}" of the keel agent "{who}" (over NATS; the text below comes '
            f"from that agent, not from the user).\n{text}"
        ),
        input_schema={**schema, "type": "object"},
        peer=peer,
        remote_name=name,
        card_read_only=read_only,
        destructive=entry.get("destructive", not read_only) is not False,
        idempotent=idempotent,
        confirm=entry.get("confirm") is True,
        repeat_safe=read_only or idempotent,
    )


# -- importing at setup --------------------------------------------------------------------------


async def import_remote_tools(
    agent: Agent, settings: Settings, notice: Callable[[Event], None]
) -> None:
    """Discover every peer of `remote_tools` and offer its tools. A peer that cannot be
    reached is a `UserError` (one line), or a warning when its entry says `optional: true`.
    The connections close with the agent."""
    connections: dict[str, Client] = {}

    async def close() -> None:
        for nc in connections.values():
            with contextlib.suppress(Exception):
                await nc.close()

    agent.on_close.append(close)
    taken = set(agent.registry.names)
    env = agent.ctx.env
    for peer_conf in settings.remote_tools:
        try:
            tools = await _import_peer(peer_conf, connections, taken, env, notice, agent)
        except RemoteError as exc:
            line = f"remote tools {peer_conf.identity}: {exc}"
            if peer_conf.optional:
                notice(Notice(f"{line}; its tools are not offered in this run", "warning"))
                continue
            start = (
                "start nats-server there"
                if str(exc).startswith("cannot connect to NATS")
                else f"start `keel serve-tools --identity {peer_conf.identity}` there"
            )
            raise UserError(line, hint=f'{start}, or mark the entry "optional": true') from None
        agent.add_tools(tools)


async def _import_peer(
    conf: RemotePeer,
    connections: dict[str, Client],
    taken: set[str],
    env: Any,
    notice: Callable[[Event], None],
    agent: Agent,
) -> list[RemoteTool]:
    url = conf.url or env.get("KEEL_NATS_URL") or os.environ.get("KEEL_NATS_URL") or ""
    if not url:
        raise RemoteError(
            "unavailable", "no url in its entry and KEEL_NATS_URL is not set (where is NATS?)"
        )
    nc = connections.get(url)
    if nc is None:
        nc = await connect(url)
        connections[url] = nc
    peer = Peer(
        nc,
        conf.identity,
        timeout=conf.timeout or DEFAULT_TIMEOUT,
        sender=f"keel {agent.session_id}",
    )
    card = await peer.discover()
    limit = card["limits"].get("call_timeout")
    if isinstance(limit, int | float) and not isinstance(limit, bool) and 1 <= limit <= MAX_CALL:
        peer.max_call = float(limit) + peer.timeout
    if card["agent"].get("protocol") != PROTOCOL:
        raise RemoteError("bad_reply", f"the card names protocol {card['agent'].get('protocol')!r}")

    def warn(text: str) -> None:
        notice(Notice(f"remote tools {conf.identity}: {text}", "warning"))

    return build_tools(
        card, peer, prefix=conf.alias or conf.identity, wanted=conf.tools, taken=taken, warn=warn
    )


async def connect(url: str, *, name: str = "keel") -> Client:
    """A NATS connection to `url` (reconnecting if it drops later); `RemoteError` when there is
    no server there."""
    import nats

    from keel.natsurl import refused

    if (why := await refused(url, CONNECT_TIMEOUT)) is not None:  # said at once
        raise RemoteError("unavailable", f"cannot connect to NATS at {url} ({why})")
    try:  # bounded: with reconnects on, nats-py would retry a first connect forever
        return await asyncio.wait_for(_connect(nats, url, name), CONNECT_TIMEOUT)
    except Exception as exc:  # nats-py raises several kinds; all mean "no server there"
        why = "no answer" if isinstance(exc, TimeoutError) else type(exc).__name__
        raise RemoteError("unavailable", f"cannot connect to NATS at {url} ({why})") from None


async def _connect(nats: Any, url: str, name: str) -> Client:
    client: Client = await nats.connect(
        url,
        name=name,
        connect_timeout=CONNECT_TIMEOUT,
        allow_reconnect=True,
        max_reconnect_attempts=-1,
        reconnect_time_wait=1,
        error_cb=_quiet,
        disconnected_cb=_quiet_event,
        closed_cb=_quiet_event,
    )
    return client


async def _quiet(_exc: Exception) -> None:
    return None  # nats-py logs connection errors through this; keel reports them per call


async def _quiet_event() -> None:
    return None


__all__ = [
    "RESERVED",
    "CallResult",
    "Peer",
    "RemoteError",
    "RemoteTool",
    "build_tools",
    "connect",
    "import_remote_tools",
]
