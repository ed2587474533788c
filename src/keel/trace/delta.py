"""Delta encoding of requests in a trace (trace_format.md, kind `request`), and reading it back.

A request record carries the system prompt and the tool list by hash (the full text only the
first time a hash appears in the trace) and only the messages that are new since the previous
request of the same agent (`reset` when the already-sent prefix no longer matches: a
compaction, a /clear, a user message merged into the last one). So a long session's trace grows
with what is new, not with the whole conversation per request. `rebuild_requests` turns the
records back into keel `Request` objects, equal to the ones sent.

An agent is (label, parent): two subagents of one type started by different `task` calls are two
agents.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson

from keel.llm.messages import Message, message_from_json, message_to_json
from keel.llm.request import Request, ToolSpec, WebSearchOptions

AgentKey = tuple[str, str]


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def tools_json(tools: Iterable[ToolSpec]) -> list[dict[str, Any]]:
    return [
        {"name": t.name, "description": t.description, "input_schema": t.input_schema}
        for t in tools
    ]


def tools_hash(tools: list[dict[str, Any]]) -> str:
    return hashlib.sha256(orjson.dumps(tools, option=orjson.OPT_SORT_KEYS)).hexdigest()


class DeltaEncoder:
    """What of each request is new, per agent. Holds references to the last request's messages
    (no copies) and the hashes already written."""

    def __init__(self) -> None:
        self.seen_systems: set[str] = set()
        self.seen_tools: set[str] = set()
        self._last: dict[AgentKey, tuple[Message, ...]] = {}
        # Hashing the same objects again per request is skipped: (object id, hash, object).
        self._system: tuple[str, str] = ("", text_hash(""))
        self._tools: tuple[tuple[ToolSpec, ...] | None, str, list[dict[str, Any]]] = (None, "", [])

    def forget(self, key: AgentKey) -> None:
        self._last.pop(key, None)

    def encode(self, key: AgentKey, request: Request, purpose: str, turn: int) -> dict[str, Any]:
        data: dict[str, Any] = {
            "model": request.model,
            "purpose": purpose,
            "turn": turn,
            "max_tokens": request.max_tokens,
        }
        if request.effort is not None:
            data["effort"] = request.effort
        if request.temperature is not None:
            data["temperature"] = request.temperature
        if request.top_p is not None:
            data["top_p"] = request.top_p
        if request.cache_key:
            data["cache_key"] = request.cache_key
        if request.metadata:
            data["metadata"] = dict(request.metadata)
        if request.web_search is not None:
            ws = request.web_search
            data["web_search"] = {
                "max_uses": ws.max_uses,
                "allowed_domains": list(ws.allowed_domains),
                "blocked_domains": list(ws.blocked_domains),
            }
        if request.system is not self._system[0] and request.system != self._system[0]:
            self._system = (request.system, text_hash(request.system))
        system_hash = self._system[1]
        data["system_hash"] = system_hash
        if system_hash not in self.seen_systems:
            self.seen_systems.add(system_hash)
            data["system"] = request.system
        if request.tools is not self._tools[0]:
            specs = tools_json(request.tools)
            self._tools = (request.tools, tools_hash(specs), specs)
        data["tools_hash"] = self._tools[1]
        if self._tools[1] not in self.seen_tools:
            self.seen_tools.add(self._tools[1])
            data["tools"] = self._tools[2]
        messages = request.messages
        previous = self._last.get(key)
        reset = previous is None or not _extends(previous, messages)
        new = messages if reset or previous is None else messages[len(previous) :]
        self._last[key] = messages
        data["messages_total"] = len(messages)
        data["reset"] = reset
        data["messages"] = [message_to_json(m) for m in new]
        return data


def _extends(previous: tuple[Message, ...], messages: tuple[Message, ...]) -> bool:
    """Whether `messages` starts with every message of `previous` (the same objects, or equal)."""
    if len(messages) < len(previous):
        return False
    return all(a is b or a == b for a, b in zip(previous, messages, strict=False))


def read(directory: Path) -> list[dict[str, Any]]:
    """The records of the trace in `directory` (`events.jsonl`), in order; a torn last line
    (a crash mid-write) is left out."""
    path = Path(directory) / "events.jsonl"
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return []
    records: list[dict[str, Any]] = []
    lines = raw.split(b"\n")
    for index, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError:
            if index == len(lines) - 1:
                break  # torn tail
            raise
        records.append(record)
    return records


def http_bodies(directory: Path, records: Iterable[dict[str, Any]]) -> dict[int, bytes]:
    """The request body of every `http` record, by its `n`: read from `request_file`, or put
    together from `request_delta` (the first `keep` bytes of body `base`, then the tail file)."""
    bodies: dict[int, bytes] = {}
    folder = Path(directory)
    for record in records:
        if record.get("kind") != "http":
            continue
        data = record["data"]
        delta = data.get("request_delta")
        if delta is None:
            bodies[data["n"]] = (folder / data["request_file"]).read_bytes()
        else:
            base = bodies[delta["base"]]
            bodies[data["n"]] = base[: delta["keep"]] + (folder / delta["file"]).read_bytes()
    return bodies


def rebuild_requests(records: Iterable[dict[str, Any]]) -> list[tuple[str, Request]]:
    """Every request of the trace as sent: (agent label, "" for the main agent; Request)."""
    systems: dict[str, str] = {}
    tools: dict[str, tuple[ToolSpec, ...]] = {}
    last: dict[AgentKey, list[Message]] = {}
    out: list[tuple[str, Request]] = []
    for record in records:
        if record.get("kind") != "request" or "messages" not in record.get("data", {}):
            continue
        data = record["data"]
        key = (record.get("agent", ""), record.get("parent", ""))
        if "system" in data:
            systems[data["system_hash"]] = data["system"]
        if "tools" in data:
            tools[data["tools_hash"]] = tuple(
                ToolSpec(t["name"], t["description"], t["input_schema"]) for t in data["tools"]
            )
        new = [message_from_json(m) for m in data["messages"]]
        messages = new if data["reset"] else [*last.get(key, []), *new]
        last[key] = messages
        ws = data.get("web_search")
        out.append(
            (
                key[0],
                Request(
                    model=data["model"],
                    system=systems[data["system_hash"]],
                    messages=tuple(messages),
                    tools=tools[data["tools_hash"]],
                    web_search=None
                    if ws is None
                    else WebSearchOptions(
                        ws["max_uses"], tuple(ws["allowed_domains"]), tuple(ws["blocked_domains"])
                    ),
                    max_tokens=data["max_tokens"],
                    effort=data.get("effort"),
                    temperature=data.get("temperature"),
                    top_p=data.get("top_p"),
                    cache_key=data.get("cache_key", ""),
                    metadata=dict(data.get("metadata", {})),
                ),
            )
        )
    return out


__all__ = [
    "DeltaEncoder",
    "http_bodies",
    "read",
    "rebuild_requests",
    "text_hash",
    "tools_hash",
    "tools_json",
]
