"""`keel mcp serve`: keel as an MCP server for other agents (docs/mcp-server.md), on stdio or, with
`--http`, streamable HTTP on a loopback port behind keel serve's guard (Host check, bearer token).

Parses the flags and picks the transport; the tools live in `keel.mcp.serve`, which imports the
`mcp` SDK and is imported only here. In stdio mode nothing but MCP goes to stdout (the SDK claims
fds 0 and 1 while it serves; keel's own lines go to stderr).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from keel.cli.main import _Parser, add_rule_flags
from keel.errors import UserError

if TYPE_CHECKING:
    import socket

    from mcp.server.mcpserver import MCPServer

#: Where the MCP endpoint is served with --http.
HTTP_PATH = "/mcp"


def parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="keel mcp serve",
        description="Serve keel to other agents as an MCP server (docs/mcp-server.md): the tools "
        "keel_run, keel_reply, keel_session and keel_sessions, working in this project. Speaks "
        "MCP on stdin/stdout, or with --http streamable HTTP on 127.0.0.1 (a bearer token: "
        "KEEL_SERVER_TOKEN, --token-file, or generated and printed on stderr).",
    )
    p.add_argument("--cwd", help="the project runs happen in (default: the current directory)")
    p.add_argument(
        "-m", "--model", help="provider/model of runs that name none (default: settings)"
    )
    p.add_argument(
        "--mode",
        choices=("default", "accept-edits", "plan", "bypass"),
        help="permission mode of runs that name none (default: the settings', else default)",
    )
    p.add_argument(
        "--permissions",
        choices=("ask", "refuse"),
        default="ask",
        help="permission questions: ask the client (MCP elicitation) when it can answer, else "
        "refuse (ask, the default); or always refuse, as keel -p does (refuse)",
    )
    p.add_argument(
        "--allow-bypass",
        action="store_true",
        help="let a call ask for mode bypass (everything runs unasked); refused without this",
    )
    add_rule_flags(p)
    p.add_argument("--http", action="store_true", help="streamable HTTP instead of stdio")
    p.add_argument(
        "--port", type=int, default=0, help="with --http: the port (default: a free one)"
    )
    p.add_argument("--host", default="127.0.0.1", help="with --http: a loopback address")
    p.add_argument("--token-file", metavar="F", help="with --http: read the token from F (0600)")
    p.add_argument("--debug", action="store_true", help="the SDK's log and tracebacks on stderr")
    return p


def mcp_serve(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    cwd = Path(args.cwd).expanduser().resolve() if args.cwd else Path.cwd().resolve()
    if not cwd.is_dir():
        raise UserError(f"--cwd {args.cwd}: no such directory")
    if not args.http:
        for flag in ("port", "token_file"):
            if getattr(args, flag) not in (None, 0):
                raise UserError(f"--{flag.replace('_', '-')} needs --http")
    from keel.mcp.serve import ServeOptions, build_server

    server = build_server(
        ServeOptions(
            project=cwd,
            model=args.model,
            mode=args.mode,
            permissions=args.permissions,
            allow_bypass=args.allow_bypass,
            allowed_tools=list(args.allowed_tools),
            disallowed_tools=list(args.disallowed_tools),
            debug=args.debug,
        )
    )
    if not args.http:
        import anyio

        anyio.run(server.run_stdio_async)
        return 0
    return _http(server, args, cwd)


def _http(server: MCPServer, args: argparse.Namespace, cwd: Path) -> int:
    from keel.cli.serve import allowed_hosts, bind, is_loopback, read_token

    if not 0 <= args.port <= 65535:
        raise UserError(f"--port must be from 0 to 65535, not {args.port}")
    if not is_loopback(args.host):
        raise UserError(
            f"--host {args.host} is not a loopback address",
            hint="keel mcp serve listens on this machine only (127.0.0.1, ::1, localhost)",
        )
    token, generated = read_token(args.token_file, dict(os.environ))
    sock = bind(args.host, args.port)
    port = sock.getsockname()[1]
    shown = f"[{args.host}]" if ":" in args.host else args.host
    print(
        f"keel mcp serve: listening on http://{shown}:{port}{HTTP_PATH} for {cwd}",
        file=sys.stderr,
        flush=True,
    )
    if generated:
        print(f"keel mcp serve: token {token}", file=sys.stderr, flush=True)
    return _run_http(server, sock, token, allowed_hosts(args.host, port, False), args.debug)


def _run_http(
    server: MCPServer, sock: socket.socket, token: str, hosts: frozenset[str] | None, debug: bool
) -> int:
    import asyncio

    import uvicorn
    from mcp.server.transport_security import TransportSecuritySettings

    from keel.server.http import Guard

    # The guard checks the Host header and the token in front of everything; the SDK's own
    # Host and Origin check stays on, with the same names.
    names = sorted(hosts or ())
    security = TransportSecuritySettings(
        enable_dns_rebinding_protection=hosts is not None,
        allowed_hosts=names,
        allowed_origins=[f"http://{h}" for h in names],
    )
    app = server.streamable_http_app(streamable_http_path=HTTP_PATH, transport_security=security)
    guarded = Guard(app, token=token, hosts=hosts, debug=debug)
    config = uvicorn.Config(
        guarded,
        log_level="info" if debug else "warning",
        access_log=False,
        ws="none",
        lifespan="on",
        timeout_graceful_shutdown=5,
    )
    asyncio.run(uvicorn.Server(config).serve(sockets=[sock]))
    return 0


__all__ = ["mcp_serve", "parser"]
