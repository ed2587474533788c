"""`keel mcp list|approve|login` (`keel mcp serve`: keel.cli.mcp_serve) and `keel skills`: what MCP servers, skills and custom slash commands
apply in this project, and approving the project's shared MCP servers (each pinned to a hash of
its entry)."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from keel.agent.prompt import git_root
from keel.config.settings import load_settings, user_config_dir
from keel.config.trust import project_key
from keel.hooks.config import approvals_file, approve, approved_pins
from keel.session.store import keel_home

if TYPE_CHECKING:
    from keel.mcp.config import ServerConfig

MCP_USAGE = "usage: keel mcp [list | approve [NAME ...] | login NAME | serve [--http] …]"


def mcp(argv: list[str]) -> int:
    action, names = (argv[0], argv[1:]) if argv else ("list", [])
    if action == "serve":
        from keel.cli.mcp_serve import mcp_serve

        return mcp_serve(names)
    if action not in ("list", "approve", "login") or (
        (action == "list" and names) or (action == "login" and len(names) != 1)
    ):
        print(MCP_USAGE, file=sys.stderr)
        return 2
    from keel.mcp.config import load_servers

    cwd = Path.cwd()
    root = git_root(cwd) or cwd
    settings = load_settings(cwd)
    servers, warnings = load_servers(root, settings.mcp_servers, os.environ, home=Path.home())
    for warning in [*settings.warnings, *warnings]:
        print(f"warning: {warning}")
    if not servers:
        print("no MCP servers configured (add them to .mcp.json or the mcp_servers setting)")
        return 0
    user_dir = user_config_dir()
    if action == "approve":
        waiting = {s.name: s for s in servers if s.needs_approval}
        unknown = [n for n in names if n not in waiting]
        if unknown:
            known = ", ".join(waiting) or "none"
            print(
                f"keel: error: no project MCP server named {', '.join(unknown)} "
                f"(hint: project servers here: {known})",
                file=sys.stderr,
            )
            return 2
        for name in names or list(waiting):
            approve(approvals_file(user_dir, project_key(root)), "mcp", waiting[name].config_hash())
            print(f"approved MCP server {name}; it starts from now on, until its entry changes")
        if not waiting:
            print("this project has no shared MCP servers to approve")
        return 0
    approved = approved_pins(user_dir, project_key(root), "mcp")
    if action == "login":
        chosen = [s for s in servers if s.name == names[0]]
        if not chosen or chosen[0].transport != "http":
            remote = ", ".join(s.name for s in servers if s.transport == "http") or "none"
            print(
                f"keel: error: no http MCP server named {names[0]} (hint: http servers here: "
                f"{remote})",
                file=sys.stderr,
            )
            return 2
        return asyncio.run(_login(chosen[0], root, approved))
    return asyncio.run(_list(servers, root, approved))


async def _login(server: ServerConfig, root: Path, approved: set[str]) -> int:
    """Sign in to one http server with OAuth (the URL printed, the browser opened); its tokens
    are kept for the runs that follow."""
    from keel.app.mcp_wiring import sign_in_opener
    from keel.llm.events import Notice
    from keel.mcp.client import CONNECT_TIMEOUT, McpManager
    from keel.mcp.oauth import SIGN_IN_TIMEOUT

    def show(event: object) -> None:
        if isinstance(event, Notice):
            print(event.text, flush=True)

    manager = McpManager(
        [server],
        root=root,
        env=os.environ,
        log_dir=keel_home() / "mcp-logs" / project_key(root),
        approved=approved,
        auth_dir=keel_home() / "mcp-auth",
    )
    manager.open_url = sign_in_opener(show)
    async with manager:
        await manager.wait_ready(SIGN_IN_TIMEOUT + CONNECT_TIMEOUT)
        status = manager.server(server.name)
    if status.state != "connected":
        print(f"keel: error: {server.name}: {status.state}: {status.detail}", file=sys.stderr)
        return 1
    print(f"signed in to {server.name} ({status.detail}); keel keeps the token for later runs")
    return 0


async def _list(servers: list[ServerConfig], root: Path, approved: set[str]) -> int:
    """Start the servers as a run would, and say how each one fared."""
    from keel.app.assembly import MCP_WAIT
    from keel.mcp.client import McpManager, describe

    manager = McpManager(
        servers,
        root=root,
        env=os.environ,
        log_dir=keel_home() / "mcp-logs" / project_key(root),
        approved=approved,
        auth_dir=keel_home() / "mcp-auth",
    )
    async with manager:
        await manager.wait_ready(MCP_WAIT)
        for line in describe(manager):
            print(line)
        status = manager.status()
    if any(s.state == "needs approval" for s in status):
        print(
            "\nproject servers need approval before they start: review their entries, then "
            "run `keel mcp approve` (or `keel mcp approve NAME`)"
        )
    return 0


def skills(argv: list[str]) -> int:
    if argv:
        print("usage: keel skills", file=sys.stderr)
        return 2
    from keel.skills import load_extensions

    found, commands = load_extensions(Path.cwd(), user_dir=user_config_dir(), home=Path.home())
    for warning in [*found.warnings, *commands.warnings]:
        print(f"warning: {warning}")
    if not found.skills and not commands.commands:
        print("no skills or custom commands (add them under .claude/skills or .claude/commands)")
        return 0
    for skill in sorted(found.skills.values(), key=lambda s: s.name):
        how = []
        if skill.user_invocable and skill.name not in found.builtins:
            how.append(f"/{skill.name}")
        if not skill.disable_model_invocation:
            how.append("model")
        print(f"skill {skill.name}  ({', '.join(how) or 'hidden'})  {skill.path}")
    for command in commands.all():
        hint = f" {command.argument_hint}" if command.argument_hint else ""
        print(f"command /{command.name}{hint}  {command.path}")
    return 0
