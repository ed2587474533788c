"""Tool calls that local models write as text, turned into real calls.

Small local models often answer a tool-calling prompt with the markup their chat template would
have parsed (`<tool_call>{"name": …, "arguments": …}</tool_call>`, `<function_call>…`, or the
XML form `<tool_call><function=NAME><parameter=KEY>value</parameter></function></tool_call>`)
instead of the server's structured field. This module hides that markup while the reply streams,
and at the end turns each piece that names a tool the request offered into a `ToolUse`, with a
`Notice` saying so. Markup that does not parse, or names a tool the request did not offer, stays in
the text as the model wrote it.

It must never invent a call the request did not offer a tool for.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final

from keel.llm.events import Done, Notice, StreamEvent, TextDelta
from keel.llm.messages import Block, Message, Text, ToolUse, new_call_id
from keel.llm.provider import Provider
from keel.llm.request import Request, ToolSpec

#: Opening tag → closing tag.
TAGS: Final[Mapping[str, str]] = {
    "<tool_call>": "</tool_call>",
    "<function_call>": "</function_call>",
}
_XML_CALL: Final = re.compile(r"<function=([\w.\-]+)>(.*?)</function>", re.DOTALL)
_XML_PARAM: Final = re.compile(r"<parameter=([\w.\-]+)>(.*?)</parameter>", re.DOTALL)
_NOT_STRINGS: Final = frozenset({"integer", "number", "boolean", "object", "array"})


def _xml_value(raw: str, schema: Mapping[str, Any]) -> Any:
    """A parameter's value: text as written, or JSON when the tool's schema wants a non-string."""
    value = raw.strip("\n")
    if schema.get("type") in _NOT_STRINGS:
        with contextlib.suppress(ValueError):
            return json.loads(value)
    return value


def parse_call(body: str, tools: Mapping[str, ToolSpec]) -> tuple[str, dict[str, Any]] | None:
    """`(name, arguments)` of one piece of call markup (what is between the tags), or None when
    it does not parse or names a tool that was not offered."""
    body = body.strip()
    xml = _XML_CALL.fullmatch(body)
    if xml is not None:
        spec = tools.get(xml.group(1))
        if spec is None:
            return None
        properties = spec.input_schema.get("properties") or {}
        params = {
            key: _xml_value(value, properties.get(key) or {})
            for key, value in _XML_PARAM.findall(xml.group(2))
        }
        return spec.name, params
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("name") not in tools:
        return None
    arguments = data.get("arguments", data.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    return (str(data["name"]), arguments) if isinstance(arguments, dict) else None


@dataclass
class MarkupFilter:
    """Splits streamed text into what may be shown and the calls hidden in it. Text that could be
    the start of a tag is held back until the next piece decides it."""

    tools: Mapping[str, ToolSpec]
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    _held: str = ""
    _closing: str = ""

    def feed(self, text: str) -> str:
        """The part of `text` (with what was held back) that is safe to show now."""
        buffer = self._held + text
        shown: list[str] = []
        while buffer:
            if self._closing:
                end = buffer.find(self._closing)
                if end < 0:
                    break
                end += len(self._closing)
                markup, buffer = buffer[:end], buffer[end:]
                shown.append(self._settle(markup))
                continue
            start, tag = min(((buffer.find(t), t) for t in TAGS if t in buffer), default=(-1, ""))
            if start < 0:
                keep = _partial_tag(buffer)
                shown.append(buffer[: len(buffer) - keep])
                buffer = buffer[len(buffer) - keep :]
                break
            shown.append(buffer[:start])
            buffer = buffer[start:]
            self._closing = TAGS[tag]
        self._held = buffer
        return "".join(shown)

    def flush(self) -> str:
        """Whatever was held back at the end of the reply (an unclosed tag stays text)."""
        held, self._held, self._closing = self._held, "", ""
        return held

    def _settle(self, markup: str) -> str:
        """Hide a complete piece of markup that is a call; give back any other."""
        opening = next(t for t, c in TAGS.items() if c == self._closing)
        self._closing = ""
        call = parse_call(markup[len(opening) : -len(TAGS[opening])], self.tools)
        if call is None:
            return markup
        self.calls.append(call)
        return ""


def _partial_tag(text: str) -> int:
    """Length of the longest end of `text` that could begin an opening tag."""
    for size in range(min(len(text), max(map(len, TAGS))), 0, -1):
        tail = text[-size:]
        if any(tag.startswith(tail) for tag in TAGS):
            return size
    return 0


def salvage(
    text: str, tools: Mapping[str, ToolSpec]
) -> tuple[str, list[tuple[str, dict[str, Any]]]]:
    """`text` without the markup of the calls found in it, and those calls."""
    found = MarkupFilter(tools)
    clean = found.feed(text) + found.flush()
    return clean, found.calls


def salvaged_done(done: Done, tools: Mapping[str, ToolSpec]) -> tuple[Done, Notice | None]:
    """`done` with the calls written in its text made real, and the notice to give."""
    text = "".join(b.text for b in done.message.blocks if isinstance(b, Text))
    clean, calls = salvage(text, tools)
    if not calls:
        return done, None
    blocks: list[Block] = []
    for block in done.message.blocks:
        if not isinstance(block, Text):
            blocks.append(block)
        elif not any(isinstance(b, Text) for b in blocks) and clean.strip():
            blocks.append(Text(clean.strip()))
    blocks.extend(ToolUse(new_call_id(), name, arguments) for name, arguments in calls)
    message = Message("assistant", tuple(blocks), done.message.provider, done.message.model)
    stop = "tool_use" if done.stop_reason in ("end_turn", "stop_sequence") else done.stop_reason
    names = ", ".join(name for name, _ in calls)
    notice = Notice(f"the model wrote {len(calls)} tool call(s) as text ({names}); running them")
    return replace(done, message=message, stop_reason=stop), notice


class SalvagingProvider:
    """Wraps a local model's client: hides call markup in streamed text and salvages the calls."""

    def __init__(self, inner: Provider) -> None:
        self.inner = inner

    @property
    def name(self) -> str:
        return self.inner.name

    async def stream(self, request: Request) -> AsyncGenerator[StreamEvent, None]:
        tools = {spec.name: spec for spec in request.tools}
        markup = MarkupFilter(tools)
        stream = self.inner.stream(request)
        async with contextlib.aclosing(stream):
            async for event in stream:
                if not tools:
                    yield event
                elif isinstance(event, TextDelta):
                    shown = markup.feed(event.text)
                    if shown:
                        yield TextDelta(shown)
                elif isinstance(event, Done):
                    rest = markup.flush()
                    if rest:
                        yield TextDelta(rest)
                    done, notice = salvaged_done(event, tools)
                    if notice is not None:
                        yield notice
                    yield done
                else:
                    yield event

    async def aclose(self) -> None:
        await self.inner.aclose()
