"""What one installed plugin brings, read from its folder in Claude Code's layout.

A plugin is a folder with an optional `.claude-plugin/plugin.json` (`name`, `version`,
`description`, and paths that add to the default component folders) and its components:
`commands/*.md`, `agents/*.md`, `skills/*/SKILL.md`, `hooks/hooks.json`, `.mcp.json`, `.lsp.json`.
Paths in the manifest are relative to the plugin folder and start with `./`; `hooks`,
`mcpServers` and `lspServers` may also be written inline as objects.

`${CLAUDE_PLUGIN_ROOT}` (the plugin's folder) and `${CLAUDE_PLUGIN_DATA}` (its writable data
folder, kept across updates) are filled in a hook's command and an MCP server's entry, and set in
their environment (`Plugin.env`).

It reads files and nothing else: it must never run, install or write anything.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from keel.config.settings import read_json_object
from keel.frozen import frozen

#: The manifest, relative to the plugin's folder.
MANIFEST = Path(".claude-plugin") / "plugin.json"
#: Manifest keys naming components (a path, a list of paths, or for some an inline object).
COMPONENT_KEYS = ("commands", "agents", "skills", "hooks", "mcpServers", "lspServers")
#: Manifest keys keel reads for their meaning or passes over as metadata.
METADATA_KEYS = frozenset(
    {"$schema", "name", "version", "description", "author", "homepage", "repository", "license",
     "keywords", "category", "tags"}
)  # fmt: skip


@frozen
class Plugin:
    """One plugin as installed: its id (`name@marketplace`), folders, and what it brings."""

    name: str
    marketplace: str
    root: Path
    data_dir: Path
    version: str = ""
    description: str = ""
    #: Folders of `*.md` commands, or single command files.
    commands: tuple[Path, ...] = ()
    agents: tuple[Path, ...] = ()
    #: Folders holding `<skill>/SKILL.md`.
    skills: tuple[Path, ...] = ()
    #: Each hooks object with the file it came from (`hooks/hooks.json`, or the manifest).
    hooks: tuple[tuple[Path, Any], ...] = ()
    #: Each `mcpServers` object with its file, `${CLAUDE_PLUGIN_ROOT}` filled in.
    mcp_servers: tuple[tuple[Path, dict[str, Any]], ...] = ()
    #: Files declaring LSP servers (`.lsp.json`, or the manifest's `lspServers`; keel.lsp).
    lsp: tuple[Path, ...] = ()
    #: Turned on by the user's own settings (else by a project file the user approved): only
    #: then may its commands' `allowed-tools` pre-approve anything.
    user_level: bool = False

    @property
    def ident(self) -> str:
        return f"{self.name}@{self.marketplace}"

    def env(self) -> dict[str, str]:
        return {"CLAUDE_PLUGIN_ROOT": str(self.root), "CLAUDE_PLUGIN_DATA": str(self.data_dir)}

    def expand(self, text: str) -> str:
        """`text` with `${CLAUDE_PLUGIN_ROOT}` and `${CLAUDE_PLUGIN_DATA}` filled in."""
        for key, value in self.env().items():
            text = text.replace("${" + key + "}", value)
        return text

    def brings(self) -> list[str]:
        """What it brings, in a few words each (for `keel plugin list` and `keel doctor`)."""
        counts = [
            ("command(s)", sum(len(_markdown(p)) for p in self.commands)),
            ("agent(s)", sum(len(_markdown(p)) for p in self.agents)),
            ("skill(s)", sum(len(list(p.glob("*/SKILL.md"))) for p in self.skills)),
            ("hook(s)", sum(_hook_count(h) for _, h in self.hooks)),
            ("MCP server(s)", sum(len(s) for _, s in self.mcp_servers)),
            ("LSP server file(s)", len(self.lsp)),
        ]
        return [f"{n} {what}" for what, n in counts if n]


def read_manifest(root: Path, warnings: list[str]) -> dict[str, Any]:
    """The plugin's manifest ({} when it has none, or with a warning when it cannot be read)."""
    data = read_json_object(root / MANIFEST, warnings, skipped="the plugin's defaults are used")
    return data or {}


def read_plugin(root: Path, *, marketplace: str, data_dir: Path, warnings: list[str]) -> Plugin:
    """The plugin in `root`: the default folders that exist, plus the manifest's paths."""
    manifest = read_manifest(root, warnings)
    where = root / MANIFEST
    name = manifest.get("name") if isinstance(manifest.get("name"), str) else root.name
    for key in sorted(set(manifest) - METADATA_KEYS - set(COMPONENT_KEYS)):
        warnings.append(f"{where}: {key!r} is not a plugin manifest key keel reads; skipped")
    plugin = Plugin(
        name=str(name),
        marketplace=marketplace,
        root=root,
        data_dir=data_dir,
        version=str(manifest.get("version", "")),
        description=str(manifest.get("description", "")),
    )
    paths = {key: _paths(manifest.get(key), where, key, root, warnings) for key in COMPONENT_KEYS}
    commands = _existing([root / "commands", *paths["commands"]])
    agents = _existing([root / "agents", *paths["agents"]])
    skills = _existing([root / "skills", *paths["skills"]])
    hooks: list[tuple[Path, Any]] = []
    for path in _existing([root / "hooks" / "hooks.json", *paths["hooks"]]):
        data = read_json_object(path, warnings, skipped="its hooks skipped")
        if data is not None and "hooks" in data:
            hooks.append((path, data["hooks"]))
    if isinstance(manifest.get("hooks"), dict):
        hooks.append((where, manifest["hooks"]))
    servers: list[tuple[Path, dict[str, Any]]] = []
    for path in _existing([root / ".mcp.json", *paths["mcpServers"]]):
        data = read_json_object(path, warnings, skipped="its MCP servers skipped")
        if data:
            found = data.get("mcpServers", data)
            if isinstance(found, dict):
                servers.append((path, _filled(plugin, found)))
    if isinstance(manifest.get("mcpServers"), dict):
        servers.append((where, _filled(plugin, manifest["mcpServers"])))
    lsp = _existing([root / ".lsp.json", *paths["lspServers"]])
    if isinstance(manifest.get("lspServers"), dict):
        lsp.append(where)
    return dataclasses.replace(
        plugin,
        commands=tuple(commands),
        agents=tuple(agents),
        skills=tuple(skills),
        hooks=tuple(hooks),
        mcp_servers=tuple(servers),
        lsp=tuple(lsp),
    )


def _paths(value: Any, where: Path, key: str, root: Path, warnings: list[str]) -> list[Path]:
    """A manifest component value as paths inside the plugin (an inline object gives none)."""
    if value is None or (isinstance(value, dict) and key in ("hooks", "mcpServers", "lspServers")):
        return []
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        warnings.append(f"{where}: {key} must be a path or a list of paths; skipped")
        return []
    paths: list[Path] = []
    for raw in values:
        path = (root / raw).resolve()
        if not path.is_relative_to(root.resolve()):
            warnings.append(f"{where}: {key} path {raw!r} leads outside the plugin; skipped")
        elif not path.exists():
            warnings.append(f"{where}: {key} path {raw!r} does not exist; skipped")
        else:
            paths.append(path)
    return paths


def _existing(paths: list[Path]) -> list[Path]:
    return list(dict.fromkeys(p for p in paths if p.exists()))


def _filled(plugin: Plugin, value: dict[str, Any]) -> dict[str, Any]:
    """An `mcpServers` object with the plugin's variables filled in, and set in each server's
    environment (a stdio server's `env`)."""
    filled: dict[str, Any] = _expand_all(plugin, value)
    for entry in filled.values():
        if isinstance(entry, dict) and "command" in entry:
            env = entry.get("env")
            entry["env"] = {**plugin.env(), **(env if isinstance(env, dict) else {})}
    return filled


def _expand_all(plugin: Plugin, value: Any) -> Any:
    if isinstance(value, str):
        return plugin.expand(value)
    if isinstance(value, list):
        return [_expand_all(plugin, v) for v in value]
    if isinstance(value, dict):
        return {k: _expand_all(plugin, v) for k, v in value.items()}
    return value


def _markdown(path: Path) -> list[Path]:
    if path.is_file():
        return [path] if path.suffix == ".md" else []
    return [p for p in path.rglob("*.md") if not p.name.startswith(".")]


def _hook_count(hooks: Any) -> int:
    if not isinstance(hooks, dict):
        return 0
    return sum(
        len(group["hooks"])
        for groups in hooks.values()
        if isinstance(groups, list)
        for group in groups
        if isinstance(group, dict) and isinstance(group.get("hooks"), list)
    )


__all__ = ["MANIFEST", "Plugin", "read_manifest", "read_plugin"]
