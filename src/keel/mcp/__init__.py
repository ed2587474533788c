"""keel.mcp: MCP servers as keel tools.

`config` reads `.mcp.json` and the `mcp_servers` settings key; `client.McpManager` starts the
servers in the background and owns their sessions; `tools.McpTool` turns each server tool into a
keel `Tool`; `describe` renders `keel mcp list`. Importing this package must never import the
`mcp` SDK (it loads in a worker thread once a server is started) or start anything.

The other way round, `serve` is keel as an MCP server (`keel mcp serve`); it imports the SDK and
is not re-exported here.
"""

from keel.mcp.client import (
    McpCallError,
    McpCallTimeout,
    McpManager,
    McpRemoteError,
    McpServerLost,
    McpServerUnavailable,
    RemoteTool,
    ServerStatus,
    State,
    describe,
)
from keel.mcp.config import ServerConfig, Source, Transport, load_servers, source_of
from keel.mcp.tools import McpTool, build_tools, tool_name

__all__ = [
    "McpCallError",
    "McpCallTimeout",
    "McpManager",
    "McpRemoteError",
    "McpServerLost",
    "McpServerUnavailable",
    "McpTool",
    "RemoteTool",
    "ServerConfig",
    "ServerStatus",
    "Source",
    "State",
    "Transport",
    "build_tools",
    "describe",
    "load_servers",
    "source_of",
    "tool_name",
]
