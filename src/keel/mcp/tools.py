"""MCP tools as keel tools: naming, schema validation, read-only policy and result mapping.

`McpTool` implements keel's `Tool` protocol for one tool of one connected server: its name is
`mcp__<server>__<tool>` (sanitised to `[A-Za-z0-9_-]`, at most 64 characters, de-duplicated),
its arguments are checked against the server's `inputSchema` before the permission prompt, and
its result becomes keel blocks (text, images within limits, notes for what the model cannot
take). It counts as read-only only when the server says `readOnlyHint: true` and
`openWorldHint: false` (the spec's default for `openWorldHint` is true). It is not safe to
repeat after a crash (keel.tools.effects) unless the server says `readOnlyHint: true` or
`idempotentHint: true` (the spec's default for `idempotentHint` is false: an unannotated tool
is asked about after a crash, never run again blindly).

Every tool here is of kind `mcp` (keel.tools.base `tool_kind`). Its metadata (`tool_meta`) maps
the server's annotations, which are claims of an untrusted server, so they are used only where
a lie cannot widen what runs unasked: `read_only` is keel's read-only above (both hints; a
`readOnlyHint: true` alone changes nothing: the call is asked about as any other); `destructive`
is the spec's reading (true unless the server says `readOnlyHint: true` or `destructiveHint:
false`); `idempotent` is `idempotentHint: true` (or read-only per `readOnlyHint`), used only for
repeat safety as above; `confirm` is never set by a server (no annotation can ask keel to skip or
add the confirm gate). The server's progress notifications
for a call go to `McpManager.on_tool_progress` with the keel call's id (the tool card shows the
latest). When a connected server offers resources, two read-only tools list and read them
(`list_mcp_resources`, `read_mcp_resource`).

This module must never talk to a session itself (only through `McpManager.call`), never import
the `mcp` SDK or `jsonschema` at module level (both load lazily, when a result or an argument
check needs them). Output is left for keel's tool runner to truncate, except that one result
keeps at most `MAX_RESULT_CHARS` characters of text (its head and tail), cut as it is converted,
so a huge result is not copied on whole.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from dataclasses import field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from keel.frozen import mutable
from keel.llm.messages import Image, Text
from keel.mcp.client import McpCallError, McpManager, ProgressSink, RemoteTool
from keel.tools.base import ToolContext, ToolError, ToolOutput, current_call_id

if TYPE_CHECKING:
    from jsonschema.exceptions import ValidationError
    from jsonschema.protocols import Validator
    from mcp_types import CallToolResult

#: Longest tool name every provider accepts.
MAX_NAME = 64
#: Longest description passed on to the model.
MAX_DESCRIPTION = 2048
#: Largest image (decoded) sent to the model, and how many one call may return.
MAX_IMAGE_BYTES = 5 * 1024 * 1024
MAX_IMAGES = 4
IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
#: Schema problems reported for one call at most.
MAX_PROBLEMS = 10
#: Characters of text one result keeps: far more than the model is shown (the runner cuts it to
#: about 30 kB and keeps this much for `raw_output`), far less than a server can send.
MAX_RESULT_CHARS = 1_000_000

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def sanitise(part: str) -> str:
    return _UNSAFE.sub("_", part) or "_"


def tool_name(server: str, tool: str) -> str:
    """`mcp__<server>__<tool>`, sanitised; over 64 characters the tool part is cut and a short
    hash of the original names keeps it unique (the `mcp__<server>__` prefix that permission
    rules match is kept whenever it fits)."""
    prefix, rest = f"mcp__{sanitise(server)}__", sanitise(tool)
    if len(prefix) + len(rest) <= MAX_NAME:
        return prefix + rest
    digest = "_" + hashlib.sha256(f"{server}\0{tool}".encode()).hexdigest()[:8]
    room = MAX_NAME - len(digest)
    if len(prefix) < room:
        return prefix + rest[: room - len(prefix)] + digest
    return (prefix + rest)[:room] + digest


def _unique(name: str, taken: set[str]) -> str:
    if name not in taken:
        return name
    n = 2
    while True:
        suffix = f"_{n}"
        candidate = name[: MAX_NAME - len(suffix)] + suffix
        if candidate not in taken:
            return candidate
        n += 1


@mutable(eq=False)
class McpTool:
    """One tool of one MCP server, as keel's `Tool`."""

    name: str
    description: str
    input_schema: dict[str, Any]
    read_only: bool
    #: The server's name and the tool's own name there.
    server: str
    remote_name: str
    manager: McpManager = field(repr=False)
    #: False: a call cut off by a crash is not run again blindly (keel.tools.effects).
    repeat_safe: bool = True
    #: Metadata from the server's annotations (see the module docstring; `tool_meta`).
    destructive: bool = True
    idempotent: bool = False
    kind: ClassVar[Literal["mcp"]] = "mcp"
    _validator: Validator | None = field(default=None, repr=False)
    _schema_checked: bool = field(default=False, repr=False)

    @classmethod
    def create(cls, manager: McpManager, server: str, remote: RemoteTool, name: str) -> McpTool:
        schema = dict(remote.input_schema) if remote.input_schema else {}
        schema.setdefault("type", "object")
        description = (
            remote.description.strip()
            or remote.title
            or (f'Tool "{remote.name}" of the MCP server "{server}".')
        )
        if len(description) > MAX_DESCRIPTION:
            description = description[: MAX_DESCRIPTION - 1] + "…"
        read_only = remote.read_only_hint is True and remote.open_world_hint is False
        # The spec's defaults: a tool is not idempotent unless it says so. Failing closed, an
        # unannotated call cut off by a crash is asked about rather than run again blindly.
        repeat_safe = remote.read_only_hint is True or remote.idempotent_hint is True
        # The spec's defaults again: destructive unless it says read-only or not destructive.
        destructive = not read_only and not (
            remote.read_only_hint is True or remote.destructive_hint is False
        )
        return cls(
            name,
            description,
            schema,
            read_only,
            server,
            remote.name,
            manager,
            repeat_safe,
            destructive=destructive,
            idempotent=repeat_safe,
        )

    def validate(self, args: Any) -> str | None:
        """None if `args` fits the tool's `inputSchema`, else one line per problem."""
        if not isinstance(args, dict):
            return f"arguments must be a JSON object, got {type(args).__name__}"
        validator = self._compiled()
        if validator is None:
            return None
        errors = sorted(
            validator.iter_errors(args),
            key=lambda e: ([str(p) for p in e.absolute_path], e.message),
        )
        lines = [_problem(e) for e in errors[:MAX_PROBLEMS]]
        if len(errors) > MAX_PROBLEMS:
            lines.append(f"… and {len(errors) - MAX_PROBLEMS} more problems")
        return "\n".join(lines) or None

    def _compiled(self) -> Validator | None:
        """The schema's validator, built once; None when the server's schema is itself invalid
        (the server then checks the arguments; keel does not block calls on its behalf)."""
        if not self._schema_checked:
            self._schema_checked = True
            from jsonschema import Draft202012Validator, validators
            from jsonschema.exceptions import SchemaError

            cls = validators.validator_for(self.input_schema, default=Draft202012Validator)
            try:
                cls.check_schema(self.input_schema)
            except SchemaError:
                return None
            self._validator = cls(self.input_schema)
        return self._validator

    async def run(self, ctx: ToolContext, args: dict[str, Any]) -> ToolOutput:
        try:
            result = await self.manager.call(
                self.server, self.remote_name, args, on_progress=self._progress_sink()
            )
        except McpCallError as exc:
            raise ToolError(str(exc)) from None
        return to_output(result)

    def _progress_sink(self) -> ProgressSink | None:
        report = self.manager.on_tool_progress
        call_id = current_call_id.get()
        if report is None or not call_id:
            return None

        def sink(progress: float, total: float | None, message: str | None) -> None:
            report(call_id, progress, total, message)

        return sink


LIST_RESOURCES = "list_mcp_resources"
READ_RESOURCE = "read_mcp_resource"


@mutable(eq=False)
class ListResourcesTool:
    """`list_mcp_resources`: the resources of the connected servers that offer them."""

    manager: McpManager = field(repr=False)
    name: str = LIST_RESOURCES
    description: str = (
        "List the resources MCP servers offer (files, notes, records), one per line as "
        "`server uri (name, type): description`. Read one with read_mcp_resource."
    )
    input_schema: dict[str, Any] = field(
        default_factory=lambda: {
            "type": "object",
            "properties": {
                "server": {"type": "string", "description": "Only this server's resources."}
            },
            "additionalProperties": False,
        }
    )
    read_only: bool = True
    kind: ClassVar[Literal["mcp"]] = "mcp"

    async def run(self, ctx: ToolContext, args: dict[str, Any]) -> ToolOutput:
        wanted = args.get("server")
        servers = resource_servers(self.manager)
        if wanted is not None and wanted not in servers:
            raise ToolError(
                f'no connected MCP server "{wanted}" offers resources '
                f"(servers with resources: {', '.join(servers) or 'none'})"
            )
        lines: list[str] = []
        for server in [wanted] if wanted else servers:
            try:
                found = await self.manager.list_resources(server)
            except McpCallError as exc:
                lines.append(f"{server}: {exc}")
                continue
            for r in found:
                what = ", ".join(x for x in (r.name, r.mime_type) if x)
                line = f"{server} {r.uri}" + (f" ({what})" if what else "")
                lines.append(line + (f": {r.description}" if r.description else ""))
        return ToolOutput("\n".join(lines) or "no resources")


@mutable(eq=False)
class ReadResourceTool:
    """`read_mcp_resource`: one resource's text (binary parts as a one-line note)."""

    manager: McpManager = field(repr=False)
    name: str = READ_RESOURCE
    description: str = (
        "Read a resource of an MCP server by its URI (list them with list_mcp_resources)."
    )
    input_schema: dict[str, Any] = field(
        default_factory=lambda: {
            "type": "object",
            "properties": {
                "server": {"type": "string", "description": "The MCP server's name."},
                "uri": {"type": "string", "description": "The resource's URI."},
            },
            "required": ["server", "uri"],
            "additionalProperties": False,
        }
    )
    read_only: bool = True
    kind: ClassVar[Literal["mcp"]] = "mcp"

    async def run(self, ctx: ToolContext, args: dict[str, Any]) -> ToolOutput:
        server, uri = str(args.get("server", "")), str(args.get("uri", ""))
        if server not in resource_servers(self.manager):
            raise ToolError(
                f'no connected MCP server "{server}" offers resources; '
                "list them with list_mcp_resources"
            )
        try:
            return ToolOutput(await resource_text(self.manager, server, uri))
        except McpCallError as exc:
            raise ToolError(f"{exc} (list the URIs with list_mcp_resources)") from None


def resource_servers(manager: McpManager) -> list[str]:
    """Connected servers that offer resources, sorted."""
    return [s.name for s in manager.status() if s.state == "connected" and s.resources]


async def resource_text(manager: McpManager, server: str, uri: str) -> str:
    """A resource as text for the model: each text part, a note for each binary one."""
    parts = []
    for c in await manager.read_resource(server, uri):
        if c.text is not None:
            parts.append(c.text)
        else:
            kind = c.mime_type or "binary"
            parts.append(f"[{kind} resource {c.uri} ({_size(c.size)}) omitted: binary]")
    return "\n".join(parts)


def _problem(error: ValidationError) -> str:
    path = ""
    for part in error.absolute_path:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    message = str(error.message)
    if len(message) > 300:
        message = message[:299] + "…"
    return f"{path}: {message}" if path else message


def build_tools(manager: McpManager) -> list[McpTool]:
    """Tools of every server connected now, named uniquely, sorted by name."""
    taken: set[str] = set()
    tools: list[McpTool] = []
    for status in manager.status():
        if status.state != "connected":
            continue
        for remote in status.tools:
            name = _unique(tool_name(status.name, remote.name), taken)
            taken.add(name)
            tools.append(McpTool.create(manager, status.name, remote, name))
    return sorted(tools, key=lambda t: t.name)


def build_resource_tools(manager: McpManager) -> list[ListResourcesTool | ReadResourceTool]:
    """`list_mcp_resources` and `read_mcp_resource` when a connected server has resources."""
    if not resource_servers(manager):
        return []
    return [ListResourcesTool(manager), ReadResourceTool(manager)]


# -- results -----------------------------------------------------------------------------------


def to_output(result: CallToolResult) -> ToolOutput:
    """The model's view of a tool result: text and images pass; audio, binary resources,
    images over the limits become one-line notes; `isError` marks the output an error."""
    from mcp_types import (
        AudioContent,
        BlobResourceContents,
        EmbeddedResource,
        ImageContent,
        ResourceLink,
        TextContent,
        TextResourceContents,
    )

    blocks: list[Text | Image] = []
    images = 0
    budget = _TextBudget()
    for item in result.content:
        if isinstance(item, TextContent):
            blocks.append(Text(budget.cut(item.text)))
        elif isinstance(item, ImageContent):
            block = _image(item.mime_type, item.data, images)
            images += isinstance(block, Image)
            blocks.append(block)
        elif isinstance(item, AudioContent):
            size = _size(_decoded_bytes(item.data))
            blocks.append(
                Text(f"[{item.mime_type} audio of {size} omitted: audio is not supported]")
            )
        elif isinstance(item, EmbeddedResource):
            resource = item.resource
            if isinstance(resource, TextResourceContents):
                blocks.append(Text(budget.cut(resource.text)))
            elif isinstance(resource, BlobResourceContents):
                size = _size(_decoded_bytes(resource.blob))
                kind = resource.mime_type or "binary"
                blocks.append(Text(f"[{kind} resource {resource.uri} ({size}) omitted: binary]"))
        elif isinstance(item, ResourceLink):
            blocks.append(Text(f"[resource {item.name}: {item.uri}]"))
    if not result.content and result.structured_content is not None:
        blocks.append(Text(budget.cut(json.dumps(result.structured_content, ensure_ascii=False))))
    return ToolOutput(tuple(blocks), is_error=result.is_error)


class _TextBudget:
    """What is left of `MAX_RESULT_CHARS` for the texts of one result."""

    def __init__(self) -> None:
        self.left = MAX_RESULT_CHARS

    def cut(self, text: str) -> str:
        """`text` whole if it fits, else its head (two thirds) and tail within what is left."""
        if len(text) <= self.left:
            self.left -= len(text)
            return text
        keep, self.left = self.left, 0
        if keep == 0:
            return f"[{len(text)} characters omitted: the result is over {MAX_RESULT_CHARS}]"
        head = keep * 2 // 3
        tail = keep - head
        cut = len(text) - keep
        return f"{text[:head]}\n... [{cut} characters cut] ...\n{text[len(text) - tail :]}"


def _image(media_type: str, data: str, sent: int) -> Text | Image:
    nbytes = _decoded_bytes(data)
    if media_type not in IMAGE_TYPES:
        return Text(f"[{media_type} image of {_size(nbytes)} omitted: only PNG, JPEG, GIF, WebP]")
    if nbytes > MAX_IMAGE_BYTES:
        return Text(
            f"[{media_type} image of {_size(nbytes)} omitted: images over "
            f"{MAX_IMAGE_BYTES // (1024 * 1024)} MB are not sent to the model]"
        )
    if sent >= MAX_IMAGES:
        return Text(f"[{media_type} image omitted: at most {MAX_IMAGES} images per call]")
    try:
        base64.b64decode(data[:64], validate=True)
    except (binascii.Error, ValueError):
        return Text(f"[{media_type} image omitted: its data is not valid base64]")
    return Image(media_type, data)


def _decoded_bytes(data: str) -> int:
    return len(data) * 3 // 4 - data[-2:].count("=")


def _size(nbytes: int) -> str:
    if nbytes >= 1024 * 1024:
        return f"{nbytes / (1024 * 1024):.1f} MB"
    if nbytes >= 1024:
        return f"{nbytes / 1024:.0f} KB"
    return f"{nbytes} bytes"


__all__ = [
    "LIST_RESOURCES",
    "READ_RESOURCE",
    "ListResourcesTool",
    "McpTool",
    "ReadResourceTool",
    "build_resource_tools",
    "build_tools",
    "resource_servers",
    "resource_text",
    "sanitise",
    "to_output",
    "tool_name",
]
