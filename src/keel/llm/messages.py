"""The neutral message model: the one shape every provider adapter translates to and from.

This module owns messages, content blocks, usage and their versioned JSON form (the journal stores
exactly this form). It must never import a provider, an HTTP library or anything above `keel.llm`.
Provider-specific data lives in named fields (a thinking block's `signature`, a tool call's
`signature`, a search result's `encrypted_content`), never smuggled into ids or text, so every
adapter can replay what it produced.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

from keel.errors import UserError
from keel.frozen import frozen

#: Version of the serialised message form. Bump it and add a migration in `_MIGRATIONS` when the
#: shape changes; `message_from_json` reads every older version. A message is written with the
#: lowest version that holds it (`_version`), so a session without web searches stays readable
#: by a keel that predates them. 2: `web_search` blocks and citations on text.
MESSAGE_FORMAT = 2

Role: TypeAlias = Literal["user", "assistant"]


@frozen
class Citation:
    """A source a provider's answer cites (a web search result). `source` names the provider
    family that produced it; adapters replay only their own.

    `encrypted_index` is Anthropic's opaque pointer into its search results (it goes back byte for
    byte); `start`/`end` locate the cited span in the text block (OpenAI's `start_index` and
    `end_index`, Gemini's segment), -1 when the provider gave none.
    """

    url: str
    title: str = ""
    cited_text: str = ""
    encrypted_index: str = ""
    start: int = -1
    end: int = -1
    source: str = ""


@frozen
class Text:
    text: str
    citations: tuple[Citation, ...] = ()


@frozen
class SearchResult:
    """One page a web search found. `encrypted_content` is Anthropic's opaque copy of the page,
    which must go back byte for byte for the model to cite it later."""

    url: str
    title: str = ""
    page_age: str = ""
    encrypted_content: str = ""


@frozen
class WebSearch:
    """A web search the provider ran on its side (keel executes nothing): the call and its results
    in one block. Anthropic's `server_tool_use` + `web_search_tool_result`, OpenAI's
    `web_search_call`, Gemini's grounding queries.

    `status` is `completed`, `failed` (`error` holds the provider's code) or `in_progress` (the
    reply stopped before the results came). `action` is `search`, or OpenAI's `open_page` and
    `find_in_page` (with `url` and `pattern`). `source` names the provider family that ran it;
    only that family's adapter sends it back.
    """

    id: str
    query: str = ""
    results: tuple[SearchResult, ...] = ()
    status: str = "completed"
    error: str = ""
    source: str = ""
    action: str = "search"
    url: str = ""
    pattern: str = ""


@frozen
class Thinking:
    """Model reasoning. `signature` is opaque (Anthropic's signature or redacted data, OpenAI's
    encrypted reasoning content, Gemini's thought signature) and must round-trip byte for byte.

    `source` names the provider family that produced it; adapters replay only their own.
    `item_id` is the provider's id for the reasoning item where it has one (OpenAI `rs_…`).
    """

    text: str
    signature: str = ""
    redacted: bool = False
    source: str = ""
    item_id: str = ""


@frozen
class ToolUse:
    """A tool call. `input` is None when the model's arguments were not valid JSON (a stream cut
    short); `raw_input` then keeps what arrived so the loop can tell the model what went wrong."""

    id: str
    name: str
    input: dict[str, Any] | None
    raw_input: str = ""
    signature: str = ""


@frozen
class Image:
    media_type: str
    data: str  # base64


@frozen
class ToolResult:
    tool_use_id: str
    content: tuple[Text | Image, ...]
    is_error: bool = False

    @property
    def text(self) -> str:
        return "\n".join(b.text for b in self.content if isinstance(b, Text))


Block: TypeAlias = Text | Thinking | ToolUse | ToolResult | Image | WebSearch


@frozen
class Message:
    """One message. Assistant messages record the provider and model that produced them."""

    role: Role
    blocks: tuple[Block, ...]
    provider: str = ""
    model: str = ""

    @property
    def text(self) -> str:
        return "".join(b.text for b in self.blocks if isinstance(b, Text))

    @property
    def tool_uses(self) -> list[ToolUse]:
        return [b for b in self.blocks if isinstance(b, ToolUse)]

    @property
    def tool_results(self) -> list[ToolResult]:
        return [b for b in self.blocks if isinstance(b, ToolResult)]

    @property
    def web_searches(self) -> list[WebSearch]:
        return [b for b in self.blocks if isinstance(b, WebSearch)]

    @property
    def citations(self) -> list[Citation]:
        """Every source the text cites, first citation of each URL only, in order."""
        seen: set[str] = set()
        out: list[Citation] = []
        for block in self.blocks:
            if isinstance(block, Text):
                for citation in block.citations:
                    if citation.url not in seen:
                        seen.add(citation.url)
                        out.append(citation)
        return out


def user(*parts: str | Block) -> Message:
    """A user message from strings and blocks: `user("hi")`, `user(ToolResult(...))`."""
    return Message("user", tuple(Text(p) if isinstance(p, str) else p for p in parts))


def assistant(*parts: str | Block, provider: str = "", model: str = "") -> Message:
    return Message(
        "assistant",
        tuple(Text(p) if isinstance(p, str) else p for p in parts),
        provider=provider,
        model=model,
    )


#: The tags around the context (environment, instruction files) that opens the first user message
#: of each context (`keel.agent.prompt.context_text`).
CONTEXT_OPEN, CONTEXT_CLOSE = "<context>", "</context>"


def without_context(text: str) -> str:
    """A user message's text without the context block that opens it (if it does): the words a
    user gave, as a transcript shows them."""
    if not text.startswith(CONTEXT_OPEN + "\n"):
        return text
    end = text.find("\n" + CONTEXT_CLOSE)
    if end < 0:
        return text
    return text[end + len(CONTEXT_CLOSE) + 1 :].removeprefix("\n\n")


def new_call_id() -> str:
    """An id for a tool call whose provider gave it none (Gemini, Ollama, text salvaged from a
    local model): the loop and the journal need one per call."""
    return f"call_{os.urandom(12).hex()}"


def tool_result(tool_use_id: str, text: str, *, is_error: bool = False) -> ToolResult:
    return ToolResult(tool_use_id, (Text(text),), is_error)


@frozen
class Usage:
    """Tokens of one response (or a sum). `input` excludes cached tokens, so the four tiers add up
    to everything the provider processed."""

    input: int = 0
    output: int = 0
    cache_read: int = 0
    cache_write: int = 0
    #: Searches the provider ran server-side (billed per search, not per token).
    web_searches: int = 0

    @property
    def total(self) -> int:
        return self.input + self.output + self.cache_read + self.cache_write

    @property
    def context(self) -> int:
        """Tokens the conversation occupies after this response (prompt plus reply)."""
        return self.total

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input + other.input,
            self.output + other.output,
            self.cache_read + other.cache_read,
            self.cache_write + other.cache_write,
            self.web_searches + other.web_searches,
        )

    def to_json(self) -> dict[str, int]:
        out = {
            "input": self.input,
            "output": self.output,
            "cache_read": self.cache_read,
            "cache_write": self.cache_write,
        }
        if self.web_searches:
            out["web_searches"] = self.web_searches
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Usage:
        return cls(
            int(data.get("input", 0)),
            int(data.get("output", 0)),
            int(data.get("cache_read", 0)),
            int(data.get("cache_write", 0)),
            int(data.get("web_searches", 0)),
        )


StopReason: TypeAlias = Literal[
    "end_turn", "tool_use", "max_tokens", "refusal", "pause_turn", "stop_sequence"
]


@dataclass(slots=True)
class Conversation:
    """An append-only list of messages that keeps roles alternating.

    A user message that follows a user message is merged into it (an interrupted turn followed by a
    new prompt), which every provider requires.
    """

    messages: list[Message] = field(default_factory=list)

    def append(self, message: Message) -> None:
        last = self.messages[-1] if self.messages else None
        if last is not None and last.role == message.role == "user":
            self.messages[-1] = Message("user", last.blocks + message.blocks)
        else:
            self.messages.append(message)

    def __len__(self) -> int:
        return len(self.messages)


# ---------------------------------------------------------------------------------------------
# Versioned JSON form. Hand-written (no reflection) because it runs for every journal record.


def block_to_json(block: Block) -> dict[str, Any]:
    match block:
        case Text():
            return _text_json(block)
        case WebSearch():
            return _web_search_json(block)
        case Thinking(text, signature, redacted, source, item_id):
            out: dict[str, Any] = {"type": "thinking", "text": text}
            if signature:
                out["signature"] = signature
            if redacted:
                out["redacted"] = True
            if source:
                out["source"] = source
            if item_id:
                out["item_id"] = item_id
            return out
        case ToolUse(id_, name, input_, raw_input, signature):
            out = {"type": "tool_use", "id": id_, "name": name, "input": input_}
            if raw_input:
                out["raw_input"] = raw_input
            if signature:
                out["signature"] = signature
            return out
        case ToolResult(tool_use_id, content, is_error):
            out = {
                "type": "tool_result",
                "tool_use_id": tool_use_id,
                "content": [block_to_json(b) for b in content],
            }
            if is_error:
                out["is_error"] = True
            return out
        case Image(media_type, data):
            return {"type": "image", "media_type": media_type, "data": data}
    raise TypeError(f"not a content block: {block!r}")


def _text_json(block: Text) -> dict[str, Any]:
    if not block.citations:
        return {"type": "text", "text": block.text}
    return {
        "type": "text",
        "text": block.text,
        "citations": [_citation(c) for c in block.citations],
    }


def _citation(c: Citation) -> dict[str, Any]:
    out: dict[str, Any] = {"url": c.url}
    for key, value in (
        ("title", c.title),
        ("cited_text", c.cited_text),
        ("encrypted_index", c.encrypted_index),
        ("source", c.source),
    ):
        if value:
            out[key] = value
    if c.start >= 0:
        out["start"] = c.start
    if c.end >= 0:
        out["end"] = c.end
    return out


def _web_search_json(b: WebSearch) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "web_search", "id": b.id}
    if b.query:
        out["query"] = b.query
    results = []
    for r in b.results:
        item: dict[str, Any] = {"url": r.url}
        for key, value in (
            ("title", r.title),
            ("page_age", r.page_age),
            ("encrypted_content", r.encrypted_content),
        ):
            if value:
                item[key] = value
        results.append(item)
    out["results"] = results
    out["status"] = b.status
    for key, value in (
        ("error", b.error),
        ("source", b.source),
        ("url", b.url),
        ("pattern", b.pattern),
    ):
        if value:
            out[key] = value
    if b.action != "search":
        out["action"] = b.action
    return out


def _text(d: dict[str, Any]) -> Block:
    citations = tuple(
        Citation(
            c["url"],
            c.get("title", ""),
            c.get("cited_text", ""),
            c.get("encrypted_index", ""),
            int(c.get("start", -1)),
            int(c.get("end", -1)),
            c.get("source", ""),
        )
        for c in d.get("citations", ())
    )
    return Text(d["text"], citations)


def _web_search(d: dict[str, Any]) -> Block:
    results = tuple(
        SearchResult(
            r["url"], r.get("title", ""), r.get("page_age", ""), r.get("encrypted_content", "")
        )
        for r in d.get("results", ())
    )
    return WebSearch(
        d["id"],
        d.get("query", ""),
        results,
        d.get("status", "completed"),
        d.get("error", ""),
        d.get("source", ""),
        d.get("action", "search"),
        d.get("url", ""),
        d.get("pattern", ""),
    )


def _thinking(d: dict[str, Any]) -> Block:
    return Thinking(
        d.get("text", ""),
        d.get("signature", ""),
        bool(d.get("redacted", False)),
        d.get("source", ""),
        d.get("item_id", ""),
    )


def _tool_use(d: dict[str, Any]) -> Block:
    return ToolUse(
        d["id"], d["name"], d.get("input"), d.get("raw_input", ""), d.get("signature", "")
    )


def _tool_result(d: dict[str, Any]) -> Block:
    content: list[Text | Image] = []
    for item in d.get("content", ()):
        inner = block_from_json(item)
        if not isinstance(inner, Text | Image):
            raise ValueError(f"tool_result content may hold text and images, not {item!r}")
        content.append(inner)
    return ToolResult(d["tool_use_id"], tuple(content), bool(d.get("is_error", False)))


def _image(d: dict[str, Any]) -> Block:
    return Image(d["media_type"], d["data"])


_BLOCK_READERS = {
    "text": _text,
    "thinking": _thinking,
    "tool_use": _tool_use,
    "tool_result": _tool_result,
    "image": _image,
    "web_search": _web_search,
}


def block_from_json(data: dict[str, Any]) -> Block:
    reader = _BLOCK_READERS.get(data.get("type", ""))
    if reader is None:
        raise ValueError(f"unknown content block type {data.get('type')!r}")
    return reader(data)


def _version(message: Message) -> int:
    """The lowest format that holds `message`: 2 only for web searches and citations."""
    for block in message.blocks:
        if isinstance(block, WebSearch) or (isinstance(block, Text) and block.citations):
            return 2
    return 1


def message_to_json(message: Message) -> dict[str, Any]:
    out: dict[str, Any] = {
        "v": _version(message),
        "role": message.role,
        "content": [block_to_json(b) for b in message.blocks],
    }
    if message.provider:
        out["provider"] = message.provider
    if message.model:
        out["model"] = message.model
    return out


def _migrate_0_to_1(data: dict[str, Any]) -> dict[str, Any]:
    """Format 0 (pre-release) named the block list `blocks`; format 1 calls it `content`."""
    data = dict(data)
    data["content"] = data.pop("blocks", [])
    data["v"] = 1
    return data


def _migrate_1_to_2(data: dict[str, Any]) -> dict[str, Any]:
    """Format 2 only added block types and fields: every format 1 message is a format 2 one."""
    return {**data, "v": 2}


_MIGRATIONS = {0: _migrate_0_to_1, 1: _migrate_1_to_2}


def message_from_json(data: dict[str, Any]) -> Message:
    version = data.get("v", 0)
    if version != MESSAGE_FORMAT:
        if not isinstance(version, int) or version > MESSAGE_FORMAT:
            raise UserError(
                f"message format version {version!r} is newer than this keel understands "
                f"(up to {MESSAGE_FORMAT})",
                hint="upgrade keel to read this session",
            )
        while version < MESSAGE_FORMAT:
            data = _MIGRATIONS[version](data)
            version = data["v"]
    role = data.get("role")
    if role != "user" and role != "assistant":
        raise ValueError(f"message role must be user or assistant, not {role!r}")
    blocks = tuple([block_from_json(b) for b in data.get("content", ())])
    return Message(role, blocks, data.get("provider", ""), data.get("model", ""))
