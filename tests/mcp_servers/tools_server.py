"""A real MCP server for keel's tests, built with the official SDK (`MCPServer`, formerly
`FastMCP`). Usage: `tools_server.py stdio` | `tools_server.py http PORT` | `tools_server.py sse PORT`.

Its tools cover what keel must map: text, an image, an oversized image, an `isError` result,
embedded resources, a tool that kills the server mid-call and one that never answers. It only
ever listens on 127.0.0.1.
"""

from __future__ import annotations

import base64
import os
import sys

import anyio
from mcp.server.mcpserver import Context, Image, MCPServer
from mcp_types import (
    BlobResourceContents,
    CallToolResult,
    EmbeddedResource,
    TextContent,
    TextResourceContents,
    ToolAnnotations,
)

# A 1x1 transparent PNG.
PIXEL = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
)

server: MCPServer = MCPServer("keel-test")


@server.tool(annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False))
def echo(text: str, times: int = 1) -> str:
    """Return the text, repeated."""
    return " ".join([text] * times)


@server.tool(name="search.web", annotations=ToolAnnotations(read_only_hint=True))
def search_web(query: str) -> str:
    """Pretend to search the web (read-only, but open-world)."""
    return f"results for {query}"


@server.tool()
def picture() -> Image:
    """A one-pixel PNG."""
    return Image(data=PIXEL, format="png")


@server.tool()
def big_picture() -> Image:
    """A PNG of more than 5 MB."""
    return Image(data=PIXEL + b"\0" * (5 * 1024 * 1024 + 10), format="png")


@server.tool()
def fails() -> CallToolResult:
    """A tool-level error."""
    return CallToolResult(content=[TextContent(text="the widget is jammed")], is_error=True)


@server.tool()
def document() -> list[TextContent | EmbeddedResource]:
    """Text plus two embedded resources: one text, one binary."""
    return [
        TextContent(text="see attached"),
        EmbeddedResource(resource=TextResourceContents(uri="file:///notes.txt", text="note body")),
        EmbeddedResource(
            resource=BlobResourceContents(
                uri="file:///data.bin", mime_type="application/octet-stream", blob="AAAA"
            )
        ),
    ]


@server.tool()
def crash() -> str:
    """Kill the server process in the middle of the call."""
    print("boom: the server is going down", file=sys.stderr, flush=True)
    os._exit(1)


@server.tool()
async def hang() -> str:
    """Never answer."""
    await anyio.sleep(3600)
    return "unreachable"


@server.tool()
async def header(name: str, ctx: Context) -> str:
    """The value of an HTTP request header (HTTP transports only)."""
    request = ctx.request_context.request
    headers = getattr(request, "headers", None)
    return str(headers.get(name, "")) if headers is not None else ""


@server.tool(name="a_tool_with_a_very_long_name_that_will_not_fit_in_sixty_four_characters_at_all")
def long_name() -> str:
    """A tool whose prefixed name is over the 64-character limit."""
    return "long"


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "stdio"
    if mode == "stdio":
        print("tools_server: starting on stdio", file=sys.stderr, flush=True)
        server.run("stdio")
    elif mode == "http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    elif mode == "sse":
        server.run("sse", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
