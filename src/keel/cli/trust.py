"""`keel trust [list | approve [KIND [NAME ...]] | revoke [KIND]]`: what came with this project
and needs the user's approval before keel uses it, and approving or revoking it.

`list` first shows every configuration file the project brings, at any depth, with its verdict
(`keel.app.project_files`). Kinds: `settings` (entries of the project's settings files, both
spellings, at every directory from the root down to here, that send a credential somewhere, widen
a permission or turn the sandbox down; `keel.config.trust`), `hooks` (the hooks of those files),
`mcp` (servers from `.mcp.json` and those files). Which files came with the project is decided by
provenance (`keel.config.intake`), never by git. Each approval is pinned to a hash of what was
approved and kept in the user's config directory under the project root's key; any change to the
approved entries needs a new one.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from keel.agent.prompt import git_root
from keel.config.settings import Settings, load_settings, user_config_dir
from keel.config.trust import KINDS, approvals_file, approve, approved_pins, project_key, revoke

if TYPE_CHECKING:
    from keel.hooks.config import HookConfig
    from keel.mcp.config import ServerConfig

USAGE = "usage: keel trust [list | approve [settings|hooks|mcp [NAME ...]] | revoke [KIND]]"


class _Project:
    """What this project's files ask for, and where their approvals live (one place per project
    root, whichever directory keel starts in)."""

    def __init__(self, cwd: Path) -> None:
        from keel.hooks.config import load_hooks
        from keel.mcp.config import load_servers

        self.cwd = cwd
        self.root = git_root(cwd) or cwd
        self.user_dir = user_config_dir()
        self.settings: Settings = load_settings(cwd)
        self.hooks: HookConfig = load_hooks(cwd, keel_user_dir=self.user_dir)
        servers, self.mcp_warnings = load_servers(
            self.root, self.settings.mcp_servers, os.environ, home=Path.home()
        )
        self.all_servers = servers
        self.servers: list[ServerConfig] = [s for s in servers if s.needs_approval]

    def file(self, kind: str) -> Path:
        return approvals_file(self.user_dir, project_key(self.root))

    def pins(self, kind: str) -> set[str]:
        return approved_pins(self.user_dir, project_key(self.root), kind)


def trust(argv: list[str]) -> int:
    action, rest = (argv[0], argv[1:]) if argv else ("list", [])
    if action not in ("list", "approve", "revoke") or (action == "list" and rest):
        print(USAGE, file=sys.stderr)
        return 2
    kind = rest[0] if rest else None
    if kind is not None and kind not in KINDS:
        print(f"keel: error: unknown kind {kind!r} (hint: {', '.join(KINDS)})", file=sys.stderr)
        return 2
    names = rest[1:]
    if names and kind != "mcp":
        print(USAGE, file=sys.stderr)
        return 2
    project = _Project(Path.cwd())
    if action == "list":
        return _list(project)
    if action == "revoke":
        kinds = [kind] if kind else list(KINDS)
        dropped = sum(revoke(project.file(k), k) for k in kinds)
        print(f"revoked {dropped} approval(s) of {', '.join(kinds)} for this project")
        return 0
    return _approve(project, kind, names)


def _list(project: _Project) -> int:
    settings, hooks = project.settings, project.hooks
    print(f"project: {project.root}")
    print(f"approvals: {project.file('settings')}")
    _files(project)
    _plugins(project)
    nothing = True
    for pending in settings.pending:
        nothing = False
        state = "approved" if pending.approved else "NEEDS APPROVAL"
        print(f"settings {pending.path}: {state} (pin {pending.pin})")
        for entry in pending.entries:
            print(f"    {entry.line()}")
    pin = hooks.shared_hash()
    if pin:
        nothing = False
        state = "approved" if pin in project.pins("hooks") else "NEEDS APPROVAL"
        print(f"hooks: {state} (pin {pin}); they run commands on your machine, unsandboxed")
        for h in hooks.hooks:
            if h.source == "shared":
                matcher = f" [{h.matcher}]" if h.matcher else ""
                print(f"    {h.event}{matcher}: {h.command}  ({h.file})")
    approved = project.pins("mcp")
    for server in project.servers:
        nothing = False
        state = "approved" if server.config_hash() in approved else "NEEDS APPROVAL"
        what = server.url or " ".join([server.command, *server.args])
        print(f"mcp {server.name}: {state} ({server.origin}); {server.transport}: {what}")
    if nothing:
        print("nothing here needs approval: no project file asks for more than it may")
        return 0
    if any(not p.approved for p in settings.pending) or _waiting(project):
        print("\nreview the entries above, then `keel trust approve` (or approve one kind)")
    return 0


def _files(project: _Project) -> None:
    """Every configuration file the project brings, at any depth, with what keel does with it."""
    from keel.app.project_files import project_report, report_lines

    report = project_report(
        project.cwd,
        project.settings,
        user_dir=project.user_dir,
        hooks=project.hooks,
        servers=project.all_servers,
    )
    print("\n".join(report_lines(report)))
    print()


def _plugins(project: _Project) -> None:
    """The plugins settings files here name: a project's wait for approval of its file's
    `enabledPlugins` (a `settings` approval), and run only once installed."""
    from keel.cli.plugin import plugin_lines
    from keel.plugins import load_plugins

    found = load_plugins(project.cwd, user_dir=project.user_dir, settings=project.settings)
    if found.states:
        print("plugins (turned on by settings files; a project's once you approve its file):")
        print("\n".join(plugin_lines(found, "  ")))
        print()


def _waiting(project: _Project) -> bool:
    pin = project.hooks.shared_hash()
    if pin and pin not in project.pins("hooks"):
        return True
    approved = project.pins("mcp")
    return any(s.config_hash() not in approved for s in project.servers)


def _approve(project: _Project, kind: str | None, names: list[str]) -> int:
    done: list[str] = []
    if kind in (None, "settings"):
        for pending in project.settings.pending:
            if not pending.approved:
                approve(project.file("settings"), "settings", pending.pin)
                keys = ", ".join(e.key for e in pending.entries)
                done.append(f"settings of {pending.path} ({keys})")
    if kind in (None, "hooks"):
        pin = project.hooks.shared_hash()
        if pin and pin not in project.pins("hooks"):
            approve(project.file("hooks"), "hooks", pin)
            count = sum(h.source == "shared" for h in project.hooks.hooks)
            done.append(f"{count} project hook(s)")
    if kind in (None, "mcp"):
        known = {s.name: s for s in project.servers}
        unknown = [n for n in names if n not in known]
        if unknown:
            print(
                f"keel: error: no project MCP server named {', '.join(unknown)} "
                f"(hint: project servers here: {', '.join(known) or 'none'})",
                file=sys.stderr,
            )
            return 2
        approved = project.pins("mcp")
        for name in names or list(known):
            server = known[name]
            if server.config_hash() not in approved:
                approve(project.file("mcp"), "mcp", server.config_hash())
                done.append(f"MCP server {name}")
    if not done:
        print("nothing waits for approval here")
        return 0
    for item in done:
        print(f"approved {item}; it applies from now on, until it changes")
    return 0
