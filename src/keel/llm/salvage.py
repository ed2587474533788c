"""Tool calls that local models write as text, turned into real calls, and the ones keel did not run.

Small local models often answer a tool-calling prompt with the markup their chat template would
have parsed instead of the server's structured field (docs/providers.md lists what is read):

- tags, anywhere in the reply: `<tool_call>`, `<tool_calls>`, `<function_call>`, `<tools>` holding
  one or several JSON call objects (one per line, or an array), `<function=NAME>` with
  `<parameter=KEY>` children or a JSON object, `<function>{json}</function>`, and
  `<function><name>NAME</name><arguments>{json}</arguments></function>`;
- JSON outside tags: fenced (```` ```json ````) or bare objects `{"name": TOOL, "arguments" |
  "parameters" | "input": {…}}`, several of them, or an array of them.

Tags are the template's own call syntax, so they are read wherever they are and hidden while the
reply streams. JSON outside tags is also how a model *shows* a call while explaining one, so it
runs only when the reply is a call: the JSON calls end the reply (nothing but white space after
them) and the prose around them is at most `LEAD_LIMIT` characters. A reply that goes on talking
after the JSON, or leads up to it at length, is taken as talking about a call: nothing runs and
nothing is reported.

Each piece (a tagged block, a fenced block, a bare JSON value) runs whole or not at all: every call
in it must name a tool the request offered, with arguments that are a JSON object holding the
tool's required properties. A piece that looks like a call but fails that stays in the text, and
why is reported: a `Notice`, and `Done.unrun_calls` for the loop (its `tool_call_text` setting
decides what follows).

It must never invent a call the request did not offer a tool for.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import re
from collections.abc import AsyncGenerator, Mapping
from dataclasses import field, replace
from typing import Any, Final, TypeAlias

from keel.frozen import mutable
from keel.llm.events import Done, Notice, StreamEvent, TextDelta, ToolUseStart
from keel.llm.messages import Block, Message, Text, ToolUse, Usage, new_call_id
from keel.llm.provider import ModelFacts, Provider, model_facts
from keel.llm.request import Request, ToolSpec

Call: TypeAlias = tuple[str, dict[str, Any]]
#: A piece of markup's calls, or why it is not run.
Outcome: TypeAlias = list[Call] | str

#: Opening tag → closing tag.
TAGS: Final[Mapping[str, str]] = {
    "<tool_call>": "</tool_call>",
    "<tool_calls>": "</tool_calls>",
    "<function_call>": "</function_call>",
    "<tools>": "</tools>",
    "<function>": "</function>",
    "<function=": "</function>",
}
#: Keys of a call object that may hold its arguments, in the order they are looked for.
ARGUMENT_KEYS: Final = ("arguments", "parameters", "input")
#: The most prose (characters, white space aside) a reply may hold besides JSON calls outside
#: tags for them to run.
LEAD_LIMIT: Final = 500

_XML_CALL: Final = re.compile(r"<function=([\w.\-]+)>(.*?)</function>", re.DOTALL)
_XML_PARAM: Final = re.compile(r"<parameter=([\w.\-]+)>(.*?)</parameter>", re.DOTALL)
_NAMED_CALL: Final = re.compile(
    r"<function>\s*<name>\s*([\w.\-]+)\s*</name>\s*"
    r"(?:<(arguments|parameters)>(.*?)</\2>\s*)?</function>",
    re.DOTALL,
)
#: `<function>NAME</function>` followed by the arguments as JSON (inside a `<tool_call>`).
_NAME_THEN_JSON: Final = re.compile(r"<function>\s*([\w.\-]+)\s*</function>\s*(\{.*\})", re.DOTALL)
_ELEMENT: Final = re.compile(r"<([\w.\-]+)>(.*?)</\1>", re.DOTALL)
_FUNCTIONS: Final = re.compile(r"<function[=>].*?</function>", re.DOTALL)
_FENCE: Final = re.compile(r"```[ \t]*([\w-]*)[ \t]*\n?(.*?)\n?[ \t]*```", re.DOTALL)
_FENCE_LANGS: Final = frozenset({"", "json", "jsonc", "json5", "tool_call", "tool_code", "tools"})
#: Where bare JSON may start: at the start of a line (after Llama's `<|python_tag|>`, if any).
_LINE_JSON: Final = re.compile(r"^[ \t]*(?:<\|python_tag\|>)?[ \t]*([\[{])", re.MULTILINE)
#: Special tokens a server may leave in the text (`<|eot_id|>`); not prose.
_SPECIAL: Final = re.compile(r"<\|[\w]+\|>")
_PARTIAL_CLOSING: Final = re.compile(r"</[\w\-]*>?\s*$")
_CLOSINGS: Final = frozenset(TAGS.values())
_SEPARATORS: Final = " \t\r\n,;"
#: Lenient about control characters in strings: small models put a raw TAB or newline inside a
#: JSON string (a file's content), which strict JSON refuses.
_DECODER: Final = json.JSONDecoder(strict=False)
_NOT_STRINGS: Final = frozenset({"integer", "number", "boolean", "object", "array"})


# -- one call -------------------------------------------------------------------------------------


def _checked(name: str, arguments: Any, tools: Mapping[str, ToolSpec]) -> Call | str:
    """`(name, arguments)` when they make a call to an offered tool; else why not."""
    spec = tools.get(name)
    if spec is None:
        return f"{name} is not one of the offered tools"
    if isinstance(arguments, str):
        try:
            arguments = _DECODER.decode(arguments) if arguments.strip() else {}
        except ValueError:
            return f"the arguments of {name} are not valid JSON"
    if not isinstance(arguments, dict):
        return f"the arguments of {name} are not a JSON object"
    missing = [key for key in spec.input_schema.get("required") or () if key not in arguments]
    if missing:
        return f"{name} lacks its required argument(s) {', '.join(missing)}"
    return spec.name, arguments


def _call_shaped(value: Any, *, tagged: bool) -> bool:
    """An object naming a tool and its arguments. Inside tags the arguments may be left out (a
    tool without parameters); outside they must be there, or it is just JSON."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"]:
        return False
    if _definition(value):
        return False
    return tagged or any(key in value for key in ARGUMENT_KEYS)


def _definition(value: Mapping[str, Any]) -> bool:
    """A tool's definition echoed back (a description and a JSON schema), not a call."""
    schema = value.get("parameters")
    return (
        "description" in value
        and isinstance(schema, dict)
        and schema.get("type") == "object"
        and "properties" in schema
    )


def _object_call(value: Mapping[str, Any], tools: Mapping[str, ToolSpec]) -> Call | str:
    key = next((k for k in ARGUMENT_KEYS if k in value), None)
    return _checked(value["name"], value[key] if key else {}, tools)


def _all_or_nothing(results: list[Call | str]) -> Outcome:
    """The calls of one piece, or why the piece is not run (each problem once)."""
    problems = [r for r in results if isinstance(r, str)]
    if problems:
        return "; ".join(dict.fromkeys(problems))
    return [r for r in results if not isinstance(r, str)]


# -- JSON values ----------------------------------------------------------------------------------


def _json_values(text: str) -> list[Any] | None:
    """The JSON values `text` holds one after another (white space, commas or semicolons
    between), arrays flattened; None when anything else is in it."""
    values: list[Any] = []
    at, end = 0, len(text)
    while True:
        while at < end and text[at] in _SEPARATORS:
            at += 1
        if text.startswith("<|python_tag|>", at):
            at += len("<|python_tag|>")
            continue
        if at >= end:
            return values or None
        try:
            value, at = _DECODER.raw_decode(text, at)
        except ValueError:
            return None
        values.extend(value if isinstance(value, list) else [value])


def _unfence(text: str) -> str:
    """`text` without a Markdown fence around it (a model may fence JSON inside a tag)."""
    match = _FENCE.fullmatch(text.strip())
    return match.group(2) if match else text


# -- tagged markup --------------------------------------------------------------------------------


def _xml_value(raw: str, schema: Mapping[str, Any]) -> Any:
    """A parameter's value: text as written, or JSON when the tool's schema wants a non-string."""
    value = raw.strip("\n")
    if schema.get("type") in _NOT_STRINGS:
        with contextlib.suppress(ValueError):
            return _DECODER.decode(value)
    return value


def _xml_arguments(name: str, body: str, tools: Mapping[str, ToolSpec]) -> dict[str, Any] | str:
    """Arguments written as child elements (`<parameter=KEY>v</parameter>` or `<KEY>v</KEY>`),
    typed by the tool's schema."""
    spec = tools.get(name)
    properties = (spec.input_schema.get("properties") or {}) if spec else {}
    pairs = _XML_PARAM.findall(body) or _ELEMENT.findall(body)
    return {key: _xml_value(value, properties.get(key) or {}) for key, value in pairs}


def _function(element: str, tools: Mapping[str, ToolSpec]) -> Outcome:
    """One `<function…>…</function>` element."""
    if (match := _XML_CALL.fullmatch(element)) is not None:
        name, inner = match.group(1), match.group(2).strip()
        if inner.startswith("{"):
            return _all_or_nothing([_checked(name, inner, tools)])
        return _all_or_nothing([_checked(name, _xml_arguments(name, inner, tools), tools)])
    if (match := _NAMED_CALL.fullmatch(element)) is not None:
        name, inner = match.group(1), (match.group(3) or "").strip()
        if inner and not inner.startswith("{"):
            return _all_or_nothing([_checked(name, _xml_arguments(name, inner, tools), tools)])
        return _all_or_nothing([_checked(name, inner, tools)])
    return _json_body(element.removeprefix("<function>").removesuffix("</function>"), tools)


def _json_body(body: str, tools: Mapping[str, ToolSpec]) -> Outcome:
    values = _json_values(_unfence(body))
    if values is None or not all(_call_shaped(v, tagged=True) for v in values):
        return "it is not JSON naming a tool and its arguments"
    return _all_or_nothing([_object_call(v, tools) for v in values])


def parse_markup(markup: str, tools: Mapping[str, ToolSpec]) -> Outcome:
    """The calls one piece of tagged markup (opening tag to closing tag) makes, or why not."""
    opening = max((t for t in TAGS if markup.startswith(t)), key=len)
    if opening in ("<function>", "<function="):
        outcome = _function(markup, tools)
    else:
        body = markup[len(opening) :].removesuffix(TAGS[opening]).strip()
        outcome = _tagged_body(body, tools)
    if isinstance(outcome, str):
        return f"{opening.rstrip('=>')}>: {outcome}"
    return outcome


def _tagged_body(body: str, tools: Mapping[str, ToolSpec]) -> Outcome:
    """What is inside `<tool_call>`, `<tools>`…: JSON call objects or `<function…>` elements."""
    if not body.startswith("<function"):
        return _json_body(body, tools)
    if (match := _NAME_THEN_JSON.fullmatch(body)) is not None:
        return _all_or_nothing([_checked(match.group(1), match.group(2), tools)])
    elements = _FUNCTIONS.findall(body)
    if not elements or _FUNCTIONS.sub("", body).strip():
        return "its <function> markup does not parse"
    results: list[Call] = []
    for element in elements:
        outcome = _function(element, tools)
        if isinstance(outcome, str):
            return outcome
        results.extend(outcome)
    return results


@mutable
class MarkupFilter:
    """Splits streamed text into what may be shown and the calls hidden in it. Text that could be
    the start of a tag is held back until the next piece decides it. `problems` holds each piece
    of tagged markup that was not a call (left in the text), with why."""

    tools: Mapping[str, ToolSpec]
    calls: list[Call] = field(default_factory=list)
    problems: list[tuple[str, str]] = field(default_factory=list)
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
                self._closing = ""
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
        """Whatever was held back at the end of the reply. A tag the reply left open (a small
        model may stop before the closing tag, or misspell it) is read as if closed; if that is
        not a call it stays text, unreported (a reply cut short is reported as such)."""
        held, closing = self._held, self._closing
        self._held = self._closing = ""
        if closing:
            outcome = parse_markup(_closed(held, closing), self.tools)
            if not isinstance(outcome, str):
                self.calls.extend(outcome)
                return ""
        return held

    def _settle(self, markup: str) -> str:
        """Hide a complete piece of markup that is a call; give back any other."""
        outcome = parse_markup(markup, self.tools)
        if isinstance(outcome, str):
            self.problems.append((markup, outcome))
            return markup
        self.calls.extend(outcome)
        return ""


def _closed(markup: str, closing: str) -> str:
    """Markup the reply left open, closed: a misspelt or unfinished closing tag (`</tool` for
    `</tools>`) is replaced."""
    end = _PARTIAL_CLOSING.search(markup)
    if end is not None and any(c.startswith(end.group().strip().rstrip(">")) for c in _CLOSINGS):
        markup = markup[: end.start()]
    return markup + closing


def _partial_tag(text: str) -> int:
    """Length of the longest end of `text` that could begin an opening tag."""
    for size in range(min(len(text), max(map(len, TAGS))), 0, -1):
        tail = text[-size:]
        if any(tag.startswith(tail) for tag in TAGS):
            return size
    return 0


# -- JSON outside tags ----------------------------------------------------------------------------


@mutable
class _Piece:
    """A span of the reply that holds nothing but call-shaped JSON."""

    start: int
    end: int
    values: list[dict[str, Any]]


def _call_objects(value: Any) -> list[dict[str, Any]] | None:
    """The call objects a JSON value is (one, or an array of them); None for any other value."""
    values = value if isinstance(value, list) else [value]
    if not values or not all(_call_shaped(v, tagged=False) for v in values):
        return None
    return values


def _calls_only(text: str) -> list[dict[str, Any]] | None:
    values = _json_values(text)
    return None if values is None else _call_objects(values)


def _fenced(text: str) -> tuple[list[_Piece], list[tuple[int, int]]]:
    """Fenced blocks holding only call objects, and the spans of every fenced block."""
    pieces: list[_Piece] = []
    spans: list[tuple[int, int]] = []
    for match in _FENCE.finditer(text):
        spans.append(match.span())
        if match.group(1).lower() in _FENCE_LANGS:
            values = _calls_only(match.group(2))
            if values is not None:
                pieces.append(_Piece(match.start(), match.end(), values))
    return pieces, spans


def _bare(text: str, fences: list[tuple[int, int]]) -> list[_Piece]:
    """Runs of call objects that start a line outside fenced blocks: `{…}`, `[…]`, or several
    objects with white space, commas or semicolons between."""
    pieces: list[_Piece] = []
    after = 0
    for match in _LINE_JSON.finditer(text):
        start = match.start(1)
        if start < after or any(a <= start < b for a, b in fences):
            continue
        end, values = _run_of_calls(text, start)
        if values:
            pieces.append(_Piece(match.start(), end, values))
            after = end
    return pieces


def _run_of_calls(text: str, start: int) -> tuple[int, list[dict[str, Any]]]:
    """Where the call objects from `start` on end, and what they are."""
    values: list[dict[str, Any]] = []
    end = at = start
    while True:
        try:
            value, at = _DECODER.raw_decode(text, at)
        except ValueError:
            break
        found = _call_objects(value)
        if found is None:
            break
        values.extend(found)
        end = at
        while at < len(text) and text[at] in _SEPARATORS:
            at += 1
        at = at + len("<|python_tag|>") if text.startswith("<|python_tag|>", at) else at
        if not text.startswith(("{", "["), at):
            break
    return end, values


def _prose(text: str) -> str:
    return _SPECIAL.sub("", text).strip()


def json_calls(text: str, tools: Mapping[str, ToolSpec]) -> tuple[str, list[Call], list[str]]:
    """Calls written as JSON outside tags: `text` without the pieces that run, their calls, and
    why pieces that look like calls were not run. Nothing at all unless the reply is a call
    (the module's docstring)."""
    fenced, spans = _fenced(text)
    pieces = sorted(fenced + _bare(text, spans), key=lambda p: p.start)
    if not pieces:
        return text, [], []
    gaps = [text[: pieces[0].start]]
    gaps += [text[a.end : b.start] for a, b in itertools.pairwise(pieces)]
    if _prose(text[pieces[-1].end :]) or sum(len(_prose(g)) for g in gaps) > LEAD_LIMIT:
        return text, [], []
    calls: list[Call] = []
    problems: list[str] = []
    kept: list[str] = []
    at = 0
    for piece in pieces:
        outcome = _all_or_nothing([_object_call(v, tools) for v in piece.values])
        if isinstance(outcome, str):
            problems.append(f"JSON call: {outcome}")
            continue
        calls.extend(outcome)
        kept.append(text[at : piece.start])
        at = piece.end
    kept.append(text[at:])
    clean = "".join(kept)
    return (_SPECIAL.sub("", clean) if calls else clean), calls, problems


# -- a whole reply --------------------------------------------------------------------------------


def _quoted(markup: str, text: str) -> bool:
    """Whether `markup` is quoted as code in `text` (inside a fenced block or backticks): shown,
    not called, so it is not reported when it is not a call (a call there still runs)."""
    at = text.find(markup)
    if text[at - 1 : at] == "`":
        return True
    return any(m.start() < at < m.end() for m in _FENCE.finditer(text))


def salvage(
    text: str, tools: Mapping[str, ToolSpec], *, json_too: bool = True
) -> tuple[str, list[Call], list[str]]:
    """`text` without the markup of the calls found in it, those calls, and why markup that looks
    like a call was not run. `json_too`: also JSON outside tags (not when the reply already made
    structured calls: then its text is talk)."""
    found = MarkupFilter(tools)
    clean = found.feed(text) + found.flush()
    calls = found.calls
    problems = [why for markup, why in found.problems if not _quoted(markup, text)]
    if json_too:
        clean, more, unrun = json_calls(clean, tools)
        calls, problems = calls + more, problems + unrun
        if not calls and not problems:
            problems = _broken_calls(clean)
    return clean, calls, problems


#: A line that opens as a call object does (`{"name": "bash", "arguments": …`, a brace doubled as
#: small models sometimes write it).
_CALL_OPENING: Final = re.compile(
    r'^[ \t]*(\{+)\s*"name"\s*:\s*"([\w.\-]+)"\s*,\s*"(?:arguments|parameters|input)"\s*:',
    re.MULTILINE,
)


def _broken_calls(text: str) -> list[str]:
    """Lines that open as a call object but are not JSON (a doubled brace, quotes left unescaped
    in a command): a call the model meant and keel cannot read, so it is named, never taken for
    an answer. Valid JSON there is an example in prose (`json_calls` decided)."""
    out = []
    for match in _CALL_OPENING.finditer(text):
        start = match.start(1) + len(match.group(1)) - 1  # from the last opening brace
        try:
            _DECODER.raw_decode(text, start)
        except ValueError:
            if len(match.group(1)) == 1:
                out.append(f"JSON call to {match.group(2)} that is not valid JSON")
            else:
                out.append(f"JSON call to {match.group(2)} with a doubled brace")
            continue
        if len(match.group(1)) > 1:
            out.append(f"JSON call to {match.group(2)} with a doubled brace")
    return out


def salvaged_done(done: Done, tools: Mapping[str, ToolSpec]) -> tuple[Done, list[Notice]]:
    """`done` with the calls written in its text made real (and the ones not run named in
    `unrun_calls`), and the notices to give."""
    text = "".join(b.text for b in done.message.blocks if isinstance(b, Text))
    structured = bool(done.message.tool_uses)
    clean, calls, problems = salvage(text, tools, json_too=not structured)
    notices: list[Notice] = []
    if problems:
        done = replace(done, unrun_calls=tuple(problems))
        notices.append(
            Notice(f"a tool call written as text was not run ({'; '.join(problems)})", "warning")
        )
    if not calls:
        return done, notices
    unique = list({json.dumps([n, a], sort_keys=True): (n, a) for n, a in calls}.values())
    if len(unique) < len(calls):
        # The same call again in one reply is a small model repeating itself: run it once.
        notices.append(
            Notice(
                f"the model wrote the same tool call more than once in one reply; each runs "
                f"once ({len(calls) - len(unique)} left out)",
                "warning",
            )
        )
        calls = unique
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
    notices.insert(
        0, Notice(f"the model wrote {len(calls)} tool call(s) as text ({names}); running them")
    )
    return replace(done, message=message, stop_reason=stop), notices


#: A reply whose last lines are the same line this many times over (each at least
#: `LOOP_LINE_CHARS` long) is a small model stuck in a loop: it is cut after the first.
LOOP_LINES = 5
LOOP_LINE_CHARS = 40


@mutable
class LineLoop:
    """Watches streamed text for the loop small models fall into: one long line (often a tool
    call written as JSON) written again and again until `max_tokens`. `feed` returns the text to
    keep (everything up to the end of the line's first copy) once the loop is seen."""

    pieces: list[str] = field(default_factory=list)
    #: The reply has structured calls: it is not cut (they would be lost with it).
    structured: bool = False
    partial: str = ""
    #: Characters of the complete lines seen so far (their newlines included).
    length: int = 0
    line: str = ""
    copies: int = 0
    #: Where the first copy of `line` ends.
    first_end: int = 0

    def feed(self, delta: str) -> str | None:
        self.pieces.append(delta)
        if "\n" not in delta or self.structured:
            self.partial += delta if not self.structured else ""
            return None
        *complete, self.partial = (self.partial + delta).split("\n")
        for line in complete:
            end = self.length + len(line)
            self.length = end + 1
            if line == self.line and len(line.strip()) >= LOOP_LINE_CHARS:
                self.copies += 1
            else:
                self.line, self.copies, self.first_end = line, 1, end
            if self.copies >= LOOP_LINES:
                return "".join(self.pieces)[: self.first_end]
        return None

    def notice(self) -> str:
        return (
            f"the model wrote the same line {self.copies} times in a row "
            f"({self.line.strip()[:60]}…); its reply was cut after the first"
        )


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
        lines = LineLoop()
        stream = self.inner.stream(request)
        cut: Done | None = None
        async with contextlib.aclosing(stream):
            async for event in stream:
                if not tools:
                    yield event
                elif isinstance(event, TextDelta):
                    shown = markup.feed(event.text)
                    if shown:
                        yield TextDelta(shown)
                    if (kept := lines.feed(event.text)) is not None:
                        # Stop reading: the rest would be more of the same, at a few tokens/s.
                        yield Notice(lines.notice(), "warning")
                        message = Message("assistant", (Text(kept),), model=request.model)
                        cut = Done(message, Usage(), "end_turn")
                        break
                elif isinstance(event, Done):
                    cut = event
                    break
                else:
                    lines.structured = lines.structured or isinstance(event, ToolUseStart)
                    yield event
        if cut is not None:
            rest = markup.flush()
            if rest:
                yield TextDelta(rest)
            done, notices = salvaged_done(cut, tools)
            for notice in notices:
                yield notice
            yield done

    async def model_facts(self, model: str) -> ModelFacts:
        return await model_facts(self.inner, model)

    async def aclose(self) -> None:
        await self.inner.aclose()
