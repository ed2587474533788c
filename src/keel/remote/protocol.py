"""The wire protocol of remote tools (docs/remote-tools.md): subjects, limits, and every message
as versioned JSON, built and validated here for both sides.

Each message is one flat JSON object with `protocol` (`keel.remote-tools`), `v` (the version),
`type` and `id` (the call's id, or the discovery request's). `parse` checks a message before
anything else reads it: the size first (before decoding), then JSON, then the protocol, the
version, the type and every field's type and bounds. A message that fails is a `ProtocolError`
carrying a code and one line; neither side ever lets one escape as a crash.

This module must never touch a network connection: it only turns bytes into checked values and
back.
"""

from __future__ import annotations

import json
import re
import secrets
from typing import Any

PROTOCOL = "keel.remote-tools"
VERSION = 1
#: Versions this keel reads (a card lists them; a message of another version is refused).
VERSIONS = (1,)

#: Subjects: discovery answers with the agent card; calls go to the tool subject, served with the
#: identity as queue group; each server instance takes cancels on its own control subject.
SUBJECT_PREFIX = "keel.tools"


def discovery_subject(identity: str) -> str:
    return f"{SUBJECT_PREFIX}.discovery.{identity}"


def call_subject(identity: str) -> str:
    return f"{SUBJECT_PREFIX}.call.{identity}"


def control_subject(identity: str, instance: str) -> str:
    return f"{SUBJECT_PREFIX}.control.{identity}.{instance}"


#: An identity or alias: one NATS subject token (no dots, spaces or wildcards).
IDENTITY = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
#: A tool name as a card may give it (what providers accept).
TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

#: Largest message read or sent, in bytes (a call's input, a reply, a card), before decoding.
MAX_MESSAGE_BYTES = 1024 * 1024
#: Room for the envelope around a reply's content.
ENVELOPE_ROOM = 4096
#: A card may list this many tools; each schema may take this many bytes as JSON.
MAX_TOOLS = 128
MAX_SCHEMA_BYTES = 64 * 1024
MAX_DESCRIPTION = 2048
#: JSON nested deeper than this is refused (a schema, an input).
MAX_DEPTH = 32

#: Error codes (docs/remote-tools.md).
ERROR_CODES = frozenset(
    {
        "bad_request",  # not JSON, wrong fields, wrong protocol
        "version",  # a protocol version this side does not speak
        "too_large",  # a message over the cap
        "unknown_tool",  # the server does not serve that tool
        "refused",  # the serving side's permission gate would ask or deny
        "capacity",  # every slot busy: try another member of the group
        "timeout",  # the serving side's per-call timeout ran out
        "cancelled",  # the caller cancelled
        "internal",  # a defect on the serving side
    }
)


class ProtocolError(Exception):
    """A message that cannot be taken: `code` is one of ERROR_CODES, the text is one line."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def new_id() -> str:
    return secrets.token_hex(12)


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode()


def envelope(kind: str, ident: str, **fields: Any) -> dict[str, Any]:
    return {"protocol": PROTOCOL, "v": VERSION, "type": kind, "id": ident, **fields}


# -- parsing -------------------------------------------------------------------------------------

#: The fields of each message type beyond the envelope: name → (type check, required).
_STR, _BOOL, _NUM, _OBJ, _LIST = "string", "boolean", "number", "object", "array"
_FIELDS: dict[str, dict[str, tuple[str, bool]]] = {
    "discover": {},
    "card": {"agent": (_OBJ, True), "tools": (_LIST, True), "limits": (_OBJ, True)},
    "call": {
        "tool": (_STR, True),
        "input": (_OBJ, True),
        "conversation": (_STR, False),
        "sender": (_STR, False),
        "keepalive": (_NUM, False),
    },
    "ack": {
        "accepted": (_BOOL, True),
        "control": (_STR, False),
        "server": (_STR, False),
        "error": (_OBJ, False),
    },
    "keepalive": {"elapsed": (_NUM, False)},
    "reply": {"content": (_STR, True), "is_error": (_BOOL, True), "truncated": (_BOOL, False)},
    "error": {"error": (_OBJ, True)},
    "cancel": {},
}


def _is(kind: str, value: Any) -> bool:
    if kind == _STR:
        return isinstance(value, str)
    if kind == _BOOL:
        return isinstance(value, bool)
    if kind == _NUM:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == _OBJ:
        return isinstance(value, dict)
    return isinstance(value, list)


def depth(value: Any, limit: int = MAX_DEPTH) -> int:
    """How deeply `value` nests (stops counting past `limit`)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if level > limit:
            return level
        deepest = max(deepest, level)
        if isinstance(item, dict):
            stack.extend((v, level + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, level + 1) for v in item)
    return deepest


def parse(data: bytes, expect: frozenset[str] | set[str]) -> dict[str, Any]:
    """The message in `data`, checked; its `type` is one of `expect`. Raises `ProtocolError`."""
    if len(data) > MAX_MESSAGE_BYTES:
        raise ProtocolError(
            "too_large", f"message of {len(data):,} bytes is over the {MAX_MESSAGE_BYTES:,} cap"
        )
    try:
        message = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise ProtocolError("bad_request", f"not JSON ({type(exc).__name__})") from None
    if not isinstance(message, dict):
        raise ProtocolError("bad_request", "a message must be a JSON object")
    if message.get("protocol") != PROTOCOL:
        raise ProtocolError(
            "bad_request", f"protocol must be {PROTOCOL!r}, got {_clip(message.get('protocol'))}"
        )
    version = message.get("v")
    if version not in VERSIONS or isinstance(version, bool):
        raise ProtocolError(
            "version",
            f"protocol version {_clip(version)} is not spoken here (this keel speaks "
            f"{', '.join(map(str, VERSIONS))})",
        )
    kind = message.get("type")
    if kind not in expect:
        raise ProtocolError(
            "bad_request",
            f"unexpected message type {_clip(kind)} (expected {' or '.join(sorted(expect))})",
        )
    ident = message.get("id")
    if not isinstance(ident, str) or not IDENTITY.match(ident):
        raise ProtocolError("bad_request", "id must be 1 to 64 letters, digits, '_' or '-'")
    _check_fields(message, str(kind))
    return message


def _check_fields(message: dict[str, Any], kind: str) -> None:
    """The fields of a `kind` message beyond the envelope: present, of their types, bounded."""
    for name, (want, required) in _FIELDS[kind].items():
        if name not in message:
            if required:
                raise ProtocolError("bad_request", f"{kind} message without {name!r}")
            continue
        if not _is(want, message[name]):
            raise ProtocolError("bad_request", f"{kind}.{name} must be a JSON {want}")
    if depth(message) > MAX_DEPTH:
        raise ProtocolError("bad_request", f"message nested deeper than {MAX_DEPTH} levels")
    if kind == "call" and not TOOL_NAME.match(message["tool"]):
        raise ProtocolError("bad_request", "call.tool must be 1 to 64 letters, digits, '_' or '-'")
    if kind == "error" or (kind == "ack" and "error" in message):
        error = message["error"]
        if not isinstance(error.get("code"), str) or not isinstance(error.get("message"), str):
            raise ProtocolError("bad_request", f"{kind}.error needs a string code and message")


def _clip(value: Any, limit: int = 40) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


# -- building ------------------------------------------------------------------------------------


def error_message(ident: str, code: str, message: str) -> dict[str, Any]:
    return envelope("error", ident, error={"code": code, "message": message})


def cut_to_fit(text: str, room: int) -> tuple[str, bool]:
    """`text` cut (head and tail kept, a mark between) so its UTF-8 takes at most `room` bytes
    once JSON-escaped; and whether it was cut."""
    size = len(json.dumps(text, ensure_ascii=False).encode())
    if size <= room:
        return text, False
    # Escaping can grow text up to 6x (\u0000); cut by the escaped size, keeping head and tail.
    ratio = size / max(1, len(text))
    keep = max(0, int((room - 200) / ratio))
    head, tail = text[: keep * 2 // 3], text[len(text) - keep // 3 :] if keep // 3 else ""
    mark = (
        f"\n[… {len(text) - len(head) - len(tail):,} characters cut by the serving agent: "
        f"replies are capped at {room:,} bytes …]\n"
    )
    return head + mark + tail, True


__all__ = [
    "ERROR_CODES",
    "IDENTITY",
    "MAX_MESSAGE_BYTES",
    "PROTOCOL",
    "TOOL_NAME",
    "VERSION",
    "VERSIONS",
    "ProtocolError",
    "call_subject",
    "control_subject",
    "cut_to_fit",
    "discovery_subject",
    "encode",
    "envelope",
    "error_message",
    "new_id",
    "parse",
]
