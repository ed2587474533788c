"""A real MCP server for keel's tests of the protocol's other features, built with the official
SDK (`MCPServer`). Usage: `features_server.py stdio` | `features_server.py http PORT`.

It reports its own environment (what keel passed in), writes files where asked (to show what a
sandbox holds back), adds a tool and says its list changed, dies on request (once per marker
file, for restarts), reports progress, offers a prompt and resources, and asks keel for roots,
sampling and elicitation. It only ever listens on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CreateMessageResult, SamplingMessage, TextContent, ToolAnnotations
from pydantic import BaseModel

server: MCPServer = MCPServer("keel-features")


@server.tool(annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False))
def environment() -> str:
    """The server's environment as JSON."""
    return json.dumps(dict(os.environ), sort_keys=True)


@server.tool()
def write(path: str, text: str) -> str:
    """Write `text` to `path`; say what happened."""
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as exc:
        return f"refused: {exc.strerror}"
    return "written"


@server.tool()
def read(path: str) -> str:
    """The text of `path`, or why it cannot be read."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        return f"refused: {exc.strerror}"


@server.tool()
async def grow(ctx: Context) -> str:
    """Add the tool `extra` and tell the client the tool list changed."""

    def extra() -> str:
        """A tool added while the server runs."""
        return "extra here"

    server.add_tool(extra, name="extra")
    await ctx.session.send_tool_list_changed()
    return "grown"


@server.tool()
def pid() -> int:
    """The server's process id."""
    return os.getpid()


@server.tool()
def die() -> str:
    """Exit at once (a crash in the middle of the call)."""
    print("dying on request", file=sys.stderr, flush=True)
    os._exit(3)


@server.tool()
async def slow(ctx: Context, steps: int = 3) -> str:
    """Report progress `steps` times, then finish."""
    for i in range(steps):
        await ctx.report_progress(i + 1, steps, f"step {i + 1} of {steps}")
        await anyio.sleep(0.05)
    return "done"


@server.tool()
async def roots(ctx: Context) -> str:
    """The client's roots as JSON."""
    result = await ctx.session.list_roots()
    return json.dumps([{"uri": str(r.uri), "name": r.name} for r in result.roots])


@server.tool()
async def summarise(ctx: Context, text: str) -> str:
    """Ask the client's model to summarise `text` (sampling)."""
    try:
        result: CreateMessageResult = await ctx.session.create_message(
            messages=[SamplingMessage(role="user", content=TextContent(text=f"Summarise: {text}"))],
            max_tokens=50,
            system_prompt="Be brief.",
        )
    except Exception as exc:  # the refusal is the answer under test
        return f"sampling refused: {exc}"
    content = result.content
    said = content.text if isinstance(content, TextContent) else str(content)
    return f"{result.model} said: {said}"


class Colour(BaseModel):
    colour: str
    shade: int = 1


@server.tool()
async def favourite(ctx: Context) -> str:
    """Ask the user for a colour (elicitation)."""
    try:
        result = await ctx.elicit("Which colour?", Colour)
    except Exception as exc:  # the refusal is the answer under test
        return f"elicitation refused: {exc}"
    if result.action == "accept":
        return f"accepted {result.data.colour} {result.data.shade}"
    return result.action


@server.prompt()
def review(file: str, focus: str = "bugs") -> str:
    """Review a file for something."""
    return f"Review {file} looking for {focus}."


@server.resource("notes://readme", name="readme", mime_type="text/plain")
def readme() -> str:
    """The project notes."""
    return "the notes say hello"


@server.resource("notes://logo", name="logo", mime_type="image/png")
def logo() -> bytes:
    """A binary resource."""
    return b"\x89PNG\r\n\x1a\n" + b"\0" * 100


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "stdio"
    if mode == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
