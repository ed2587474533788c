"""`keel serve-tools`: serve this project's tools to other keel agents over NATS
(docs/remote-tools.md).

Builds the agent `keel -p` would build here (same tools, permission gate, sandbox, hooks and MCP
servers; no model is called and no session is written), keeps the tools that may be served
(`keel.remote.server.servable`, narrowed by `--tools`), and serves them until SIGINT or SIGTERM.
Each call is one line on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from pathlib import Path

from keel.cli.main import _Parser, _whole
from keel.errors import UserError


def parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="keel serve-tools",
        description="Serve this project's tools to other keel agents over NATS "
        "(docs/remote-tools.md). Calls are checked by this project's permission rules; what "
        "would ask is refused. Built-in tools are served only when named in --tools.",
    )
    p.add_argument("--nats", metavar="URL", help="the NATS server (default: KEEL_NATS_URL)")
    p.add_argument("--identity", required=True, help="the name callers import (a queue group)")
    p.add_argument(
        "--tools", metavar="A,B", help="serve only these tools (built-ins must be named here)"
    )
    p.add_argument(
        "--concurrency",
        type=_whole(1, 256, ""),
        help="calls run at once; more are refused so another server takes them "
        "(default: CPUs, 2 to 8)",
    )
    p.add_argument(
        "--call-timeout",
        type=_whole(1, 86_400, " seconds"),
        default=300,
        help="longest a call may run, in seconds (default 300)",
    )
    p.add_argument("--cwd", help="the project (default: the current directory)")
    p.add_argument("--debug", action="store_true", help="tracebacks for errors")
    return p


def serve_tools(argv: list[str]) -> int:
    import os

    args = parser().parse_args(argv)
    url = args.nats or os.environ.get("KEEL_NATS_URL", "")
    if not url:
        raise UserError("keel serve-tools needs a NATS server", hint="--nats nats://HOST:4222")
    cwd = Path(args.cwd).expanduser().resolve() if args.cwd else Path.cwd()
    if not cwd.is_dir():
        raise UserError(f"--cwd {cwd}: not a directory")
    names = [n.strip() for n in args.tools.split(",") if n.strip()] if args.tools else None
    return asyncio.run(_serve(url, args.identity, names, args.concurrency, args.call_timeout, cwd))


def _log(line: str) -> None:
    print(f"keel serve-tools: {line}", file=sys.stderr, flush=True)


async def _serve(
    url: str,
    identity: str,
    names: list[str] | None,
    concurrency: int | None,
    call_timeout: int,
    cwd: Path,
) -> int:
    from keel.app import Options, open_agent
    from keel.llm.catalog import ModelRef
    from keel.llm.events import Notice
    from keel.llm.providers.scripted import ScriptedProvider
    from keel.permissions.gate import PermissionGate
    from keel.remote.client import RemoteError, connect
    from keel.remote.server import ToolServer, servable

    def notice(event: object) -> None:
        if isinstance(event, Notice):
            _log(f"{event.level}: {event.text}")

    options = Options(cwd=cwd, interactive=False, no_session=True)
    agent = await open_agent(
        options,
        notice,
        ref=ModelRef("scripted", "serve-tools"),
        provider=ScriptedProvider([]),  # an empty script: no model is ever called
    )
    try:
        if isinstance(agent.gate, PermissionGate):  # the sandbox's status, rule warnings
            for pending in agent.gate.notices:
                notice(pending)
        tools = servable(agent.registry, names)
        if not tools:
            raise UserError(
                "nothing to serve: no MCP or local tools here, and built-in tools are served "
                "only when named",
                hint="--tools read,grep (for example)",
            )
        try:
            nc = await connect(url, name=f"keel serve-tools {identity}")
        except RemoteError as exc:
            raise UserError(str(exc), hint="start nats-server, or pass --nats URL") from None
        server = ToolServer(
            nc,
            identity,
            tools,
            agent.ctx,
            gate=agent.gate,
            hooks=agent.hooks,
            concurrency=concurrency,
            call_timeout=float(call_timeout),
            log=_log,
        )
        try:
            await server.start()
            served = ", ".join(t.name for t in tools)
            _log(
                f"serving {len(tools)} tool(s) as {identity} on {url} ({served}); "
                f"{server.concurrency} at once"
            )
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            await stop.wait()
            _log("stopping")
        finally:
            await server.stop()
            with contextlib.suppress(Exception):
                await nc.close()
    finally:
        await agent.aclose()
    return 0
