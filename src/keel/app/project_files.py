"""Every configuration file a project brings, at any depth, with keel's verdict on it: what
`keel trust list` and `keel doctor` show, so that nothing from a project applies without
appearing there (DESIGN.md, invariant 5).

The files are found by `keel.config.intake.scan`; the verdicts come from the same loaders a run
uses (settings with their pending approvals, hooks, MCP servers), never from a second opinion.
It must never run or start anything.
"""

from __future__ import annotations

import os
from pathlib import Path

from keel.config.intake import CONFIG_DIRS, Intake, intake_for, scan
from keel.config.settings import Settings, read_json_object
from keel.config.trust import approved_pins
from keel.frozen import frozen
from keel.hooks.config import HookConfig, load_hooks
from keel.mcp.config import ServerConfig, load_servers

#: What keel does with prompt text.
_PROMPT_TEXT = "whatever it makes the model do passes the permission gate"


@frozen
class ProjectFile:
    path: Path
    kind: str
    #: Whether it came with the project (always, inside the project tree, but for the user's own
    #: configuration when the project is the home directory).
    supplied: bool
    #: What keel does with it, in a few words.
    verdict: str
    #: Whether something in it waits for the user's approval.
    waiting: bool = False


@frozen
class ProjectReport:
    root: Path
    files: tuple[ProjectFile, ...]
    #: The scan stopped early (a huge tree); files past that point are not listed.
    cut_short: bool


def project_report(
    cwd: Path,
    settings: Settings,
    *,
    user_dir: Path,
    home: Path | None = None,
    hooks: HookConfig | None = None,
    servers: list[ServerConfig] | None = None,
) -> ProjectReport:
    """Every project configuration file under the project root of `cwd`, with its verdict."""
    home = home or Path.home()
    intake = intake_for(cwd, user_dir=user_dir, home=home)
    if hooks is None:
        hooks = load_hooks(cwd, keel_user_dir=user_dir, home=home)
    if servers is None:
        servers, _ = load_servers(intake.root, settings.mcp_servers, os.environ, home=home)
    found, cut = scan(intake)
    judge = _Judge(intake, settings, hooks, servers)
    files = tuple(judge.verdict(path, kind) for path, kind in found)
    return ProjectReport(intake.root, files, cut)


class _Judge:
    def __init__(
        self, intake: Intake, settings: Settings, hooks: HookConfig, servers: list[ServerConfig]
    ) -> None:
        self.intake = intake
        self.settings = settings
        self.hooks = hooks
        self.servers = servers
        self.chain = set(intake.chain())
        self.hook_pins = approved_pins(intake.user_dir, intake.key, "hooks")
        self.mcp_pins = approved_pins(intake.user_dir, intake.key, "mcp")

    def verdict(self, path: Path, kind: str) -> ProjectFile:
        supplied = self.intake.supplied(path)
        owner = _owner(path)
        if kind == "plugin":
            return ProjectFile(path, kind, supplied, _plugin(path))
        if kind == "bench":
            return ProjectFile(
                path, kind, supplied, "bench tasks: `keel bench` runs them only once approved"
            )
        if kind == "mcp":
            if owner != self.intake.root:
                why = "not read: keel reads `.mcp.json` only at the project root"
                return ProjectFile(path, kind, supplied, why)
            return self._servers(path, supplied)
        if kind == "instructions":
            return ProjectFile(path, kind, supplied, self._instructions(path, owner))
        if owner not in self.chain:
            return ProjectFile(path, kind, supplied, self._elsewhere(owner))
        if kind == "rules":
            return ProjectFile(path, kind, supplied, _rules(path))
        if kind == "output-styles":
            return ProjectFile(path, kind, supplied, _styles(path, self.settings))
        if kind == "settings":
            return self._settings(path, supplied)
        if kind == "foreign":
            return self._foreign(path, supplied)
        return ProjectFile(path, kind, supplied, f"prompt text: read; {_PROMPT_TEXT}")

    def _instructions(self, path: Path, owner: Path) -> str:
        """An instruction file: in the context on the chain, delivered when the model
        reads or edits a file of its directory elsewhere, unless one beside it wins."""
        from keel.agent.prompt import directory_files

        if path.name in ("AGENTS.override.md", "AGENTS.md", "CLAUDE.md"):
            used = directory_files(path.parent)[:1]
            if used and used[0].name != path.name:
                return f"not read: the {used[0].name} beside it is"
        if owner in self.chain:
            return f"prompt text: in the context; {_PROMPT_TEXT}"
        return (
            f"prompt text: sent when the model reads or edits a file in {self.intake.rel(owner)}/ "
            f"(once per context); {_PROMPT_TEXT}"
        )

    def _elsewhere(self, owner: Path) -> str:
        return (
            f"not read in this directory (read when keel starts in {self.intake.rel(owner)}/ "
            "or below it; then it is a project file like any other)"
        )

    def _settings(self, path: Path, supplied: bool) -> ProjectFile:
        if path not in self.settings.files:
            return ProjectFile(path, "settings", supplied, "not read: see the warning about it")
        if not supplied:
            return ProjectFile(path, "settings", supplied, "yours: applies")
        parts: list[str] = []
        waiting = False
        for pending in self.settings.pending:
            if pending.path == path:
                keys = ", ".join(e.key for e in pending.entries)
                if pending.approved:
                    parts.append(f"approved: {keys}")
                else:
                    waiting = True
                    parts.append(f"WAITS FOR APPROVAL: {keys}")
        own = [h for h in self.hooks.hooks if h.file == str(path)]
        if own:
            if self.hooks.shared_hash() in self.hook_pins:
                parts.append(f"{len(own)} hook(s): approved")
            else:
                waiting = True
                guards = sum(1 for h in own if h.can_guard)
                guarded = f" ({guards} guard(s) run read-only and may only block)" if guards else ""
                parts.append(f"{len(own)} hook(s) WAIT FOR APPROVAL{guarded}")
        mine = [s for s in self.servers if s.origin == str(path)]
        for server in mine:
            state = "approved" if server.config_hash() in self.mcp_pins else "WAITS FOR APPROVAL"
            waiting = waiting or state != "approved"
            parts.append(f"MCP server {server.name}: {state}")
        rest = "what only tightens applies"
        verdict = "; ".join([rest, *parts]) if parts else f"{rest}; nothing in it needs approval"
        return ProjectFile(path, "settings", supplied, verdict, waiting)

    def _foreign(self, path: Path, supplied: bool) -> ProjectFile:
        """Codex's and OpenCode's files (`keel.config.foreign`): rules as a settings file's,
        MCP servers as `.mcp.json`'s, commands, agents and skills as prompt text."""
        prompt = "read as prompt text (what it makes the model do passes the permission gate)"
        if path.name == ".codex":
            unread = [n for n in ("config.toml", "prompts") if (path / n).exists()]
            extra = (
                f"; {' and '.join(unread)} not read (keel reads Codex's configuration and "
                "custom prompts only from ~/.codex, as Codex does)"
                if unread
                else ""
            )
            return ProjectFile(
                path, "foreign", supplied, f"Codex skills (skills/): {prompt}{extra}"
            )
        if path.name == ".opencode":
            code = [n for n in ("plugin", "plugins", "tool", "tools") if (path / n).is_dir()]
            extra = (
                f"; {', '.join(n + '/' for n in code)} not run (OpenCode's JavaScript)"
                if code
                else ""
            )
            return ProjectFile(
                path, "foreign", supplied, f"OpenCode agents, commands and skills: {prompt}{extra}"
            )
        parts = ["OpenCode: deny and ask rules apply"]
        waiting = False
        for pending in self.settings.pending:
            if pending.path == path:
                keys = ", ".join(e.key for e in pending.entries)
                waiting = waiting or not pending.approved
                parts.append(f"{'approved' if pending.approved else 'WAITS FOR APPROVAL'}: {keys}")
        for server in self.servers:
            if server.origin == str(path):
                ok = server.approved(self.mcp_pins)
                waiting = waiting or not ok
                parts.append(
                    f"MCP server {server.name}: {'starts' if ok else 'WAITS FOR APPROVAL'}"
                )
        parts.append(f"commands, agents, instructions: {prompt}")
        return ProjectFile(path, "foreign", supplied, "; ".join(parts), waiting)

    def _servers(self, path: Path, supplied: bool) -> ProjectFile:
        mine = [s for s in self.servers if s.origin == str(path)]
        if not mine:
            data = read_json_object(path, [], skipped="")
            return ProjectFile(
                path, "mcp", supplied, "no servers" if data is not None else "not readable"
            )
        parts = []
        waiting = False
        for server in mine:
            ok = not server.needs_approval or server.config_hash() in self.mcp_pins
            waiting = waiting or not ok
            parts.append(f"{server.name}: {'starts' if ok else 'WAITS FOR APPROVAL'}")
        return ProjectFile(path, "mcp", supplied, "MCP servers " + ", ".join(parts), waiting)


def _plugin(path: Path) -> str:
    """A `.claude-plugin` folder: a marketplace, a plugin, or both; nothing in it runs until the
    user installs it (keel.plugins), whatever a project file says."""
    what = []
    if (path / "marketplace.json").is_file():
        what.append("a plugin marketplace")
    if (path / "plugin.json").is_file():
        what.append("a plugin")
    return (
        f"{' and '.join(what) or 'a plugin folder'}: nothing in it runs by itself; a plugin runs "
        "once you install it (`keel plugin marketplace add`, `keel plugin install`) and it is "
        "turned on by your settings or by a project file you approved"
    )


def _rules(directory: Path) -> str:
    from keel.agent.prompt import load_rules

    warnings: list[str] = []
    rules = load_rules(directory, warnings)
    scoped = sum(1 for r in rules if r.patterns)
    parts = [
        f"prompt text: {len(rules) - scoped} always-on rule(s) in the context, {scoped} "
        "sent when the model reads or edits a file their paths match",
    ]
    if warnings:
        parts.append(f"{len(warnings)} not usable (keel doctor names them)")
    return "; ".join([*parts, _PROMPT_TEXT])


def _styles(directory: Path, settings: Settings) -> str:
    from keel.agent.output_styles import load_styles

    names = ", ".join(s.name for s in load_styles([directory], []) if s.path is not None)
    chosen = f"; outputStyle picks {settings.output_style}" if settings.output_style else ""
    return (
        f"prompt text: output styles {names or '(none usable)'} (chosen with outputStyle or "
        f"/output-style){chosen}; {_PROMPT_TEXT}"
    )


def report_lines(report: ProjectReport, indent: str = "  ") -> list[str]:
    """The report as lines: one per file, its path from the project root, kind and verdict."""
    if not report.files:
        return [
            "project files: none (no settings, hooks, MCP servers, agents, commands, skills, "
            "rules or instruction files anywhere in the project)"
        ]
    lines = [
        f"project files ({len(report.files)}, at every depth; each came with the project "
        "unless it says yours):"
    ]
    for f in report.files:
        rel = f.path.relative_to(report.root) if f.path.is_relative_to(report.root) else f.path
        lines.append(f"{indent}{rel} [{f.kind}]: {f.verdict}")
    if report.cut_short:
        lines.append(
            f"{indent}(the project is too large to look through whole: files past this point "
            "are not listed)"
        )
    return lines


def _owner(path: Path) -> Path:
    """The directory a configuration entry belongs to (`sub` for `sub/.keel/settings.json`)."""
    for parent in path.parents:
        if parent.name not in CONFIG_DIRS:
            return parent
    return path.parent


__all__ = ["ProjectFile", "ProjectReport", "project_report", "report_lines"]
