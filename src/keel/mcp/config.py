"""MCP server configuration: `.mcp.json` and the `mcp_servers` key of keel's settings files.

This module owns the shape of a server entry (the Claude Code format: `command`/`args`/`env`/`cwd`
for stdio servers, `type`/`url`/`headers` for `http` (streamable HTTP) and `sse` servers, plus
`disabled` and keel's per-call `timeout`; for stdio servers keel's `inherit_env` and `sandbox`),
`${VAR}` / `${VAR:-default}` expansion, where each server comes from (`user`, `project-shared`,
`project-local`; Claude Code's `~/.claude.json` gives user and local servers) and the hash that
pins a project server's approval. Loading never raises for a bad entry: it warns naming the file and the server,
and loads the rest. It must never import the `mcp` package or start anything; it only reads
files.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal, TypeAlias

from keel.config.settings import read_json_object
from keel.frozen import frozen

Transport: TypeAlias = Literal["stdio", "http", "sse"]
Source: TypeAlias = Literal["user", "project-shared", "project-local"]

#: Seconds a tool call may take unless the server's entry sets `timeout`.
DEFAULT_CALL_TIMEOUT = 120.0

_TRANSPORTS: dict[str, Transport] = {
    "stdio": "stdio",
    "http": "http",
    "streamable-http": "http",
    "streamable_http": "http",
    "sse": "sse",
}
_COMMON_KEYS = frozenset({"type", "disabled", "timeout"})
_STDIO_KEYS = frozenset({"command", "args", "env", "cwd", "inherit_env", "sandbox"})
_HTTP_KEYS = frozenset({"url", "headers"})
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


@frozen
class ServerConfig:
    """One configured MCP server, with variables already expanded.

    `error` is set when the entry is well-formed but cannot be used as written (an undefined
    variable): the server is listed as failed with that reason and never started."""

    name: str
    transport: Transport
    source: Source
    #: The file the entry came from, for messages.
    origin: str
    command: str = ""
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    #: The working directory as written ("" = the project root; relative = below it).
    cwd: str = ""
    url: str = ""
    headers: tuple[tuple[str, str], ...] = ()
    disabled: bool = False
    #: stdio: pass keel's whole environment (API keys included) instead of the safe base.
    inherit_env: bool = False
    #: stdio: run the server inside keel's sandbox (bubblewrap), with network when
    #: `sandbox_network` (`"sandbox": {"network": true}`).
    sandbox: bool = False
    sandbox_network: bool = False
    #: Seconds one tool call may take.
    timeout: float = DEFAULT_CALL_TIMEOUT
    error: str = ""
    #: Canonical JSON of the entry as written (before expansion, without `disabled`).
    canonical: str = ""

    def config_hash(self) -> str:
        """sha256 of the entry's canonical JSON as written (variables unexpanded, so a rotated
        token in the environment does not revoke an approval; `disabled` left out, so toggling
        it does not either). Any other change to the entry needs a new approval."""
        return hashlib.sha256(self.canonical.encode()).hexdigest()

    @property
    def needs_approval(self) -> bool:
        """Servers from files committed to the project (`.mcp.json`, `.keel/settings.json`)
        start only once the user approved this exact entry."""
        return self.source == "project-shared"

    def approved(self, hashes: set[str] | frozenset[str]) -> bool:
        return not self.needs_approval or self.config_hash() in hashes


def mcp_json_path(project_root: Path) -> Path:
    return project_root / ".mcp.json"


def source_of(settings_file: Path, project_root: Path, *, home: Path | None = None) -> Source:
    """The source of servers in a settings file, by provenance (`keel.config.intake`): any file
    inside the project tree, at any depth, shared or "local", tracked by git or not, came with
    the project ("project-shared": it needs an approval); anything else is the user's."""
    from keel.config.intake import intake_for

    intake = intake_for(project_root, home=home, root=project_root)
    return "project-shared" if intake.supplied(settings_file) else "user"


def load_servers(
    project_root: Path,
    settings_servers: Iterable[tuple[Path, object]],
    env: Mapping[str, str],
    *,
    home: Path | None = None,
) -> tuple[list[ServerConfig], list[str]]:
    """Every configured server (sorted by name) and the warnings about entries skipped.

    `settings_servers` holds, for each settings file that has one, its path and the value of its
    `mcp_servers` key; the source of each server follows from the path (`source_of`). With
    `home`, Claude Code's `~/.claude.json` is read too: its top-level `mcpServers` are user
    servers, its `projects.<project root>.mcpServers` local ones (both the user's own: they need
    no approval). When two files define the same name, the more personal one wins:
    `~/.claude.json` user < user settings < `.mcp.json` < `.keel/settings.json` <
    `~/.claude.json` local < `.keel/settings.local.json`."""
    warnings: list[str] = []
    ranked: list[tuple[int, int, ServerConfig]] = []
    sections: list[tuple[int, Path, Source, object]] = []
    claude_json = home / ".claude.json" if home is not None else None
    claude_user, claude_local = (
        _read_claude_json(claude_json, project_root, warnings) if claude_json else (None, None)
    )
    if claude_json is not None and claude_user is not None:
        sections.append((0, claude_json, "user", claude_user))
    mcp_json = _read_mcp_json(mcp_json_path(project_root), warnings)
    if mcp_json is not None:
        sections.append((1, mcp_json_path(project_root), "project-shared", mcp_json))
    if claude_json is not None and claude_local is not None:
        sections.append((3, claude_json, "project-local", claude_local))
    rank_of: dict[Source, int] = {"user": 0, "project-shared": 2, "project-local": 3}
    for path, value in settings_servers:
        source = source_of(path, project_root, home=home)
        sections.append((rank_of[source], path, source, value))
    for path, value in _foreign_servers(project_root, env, home):
        source = source_of(path, project_root, home=home)
        sections.append((rank_of[source], path, source, value))
    plugin_servers = _plugin_servers(project_root, env, home)
    sections += plugin_servers
    order = 0
    for rank, path, source, value in sections:
        where = f"{path}: mcp_servers"
        if (
            any(path == p for _, p, _, _ in plugin_servers)
            or path.name == ".mcp.json"
            or (path == claude_json and source == "user")
        ):
            where = f"{path}: mcpServers"
        elif path == claude_json:
            where = f"{path}: projects.{project_root}.mcpServers"
        if not isinstance(value, dict):
            warnings.append(f"{where} must be an object keyed by server name; ignored")
            continue
        for name, entry in value.items():
            server = parse_server(name, entry, source=source, origin=str(path), env=env)
            if isinstance(server, str):
                warnings.append(server)
                continue
            warnings.extend(_unknown_key_warnings(name, entry, str(path)))
            ranked.append((rank, order, server))
            order += 1
    chosen: dict[str, ServerConfig] = {}
    for _, _, server in sorted(ranked, key=lambda r: (r[0], r[1])):
        chosen[server.name] = server
    return sorted(chosen.values(), key=lambda s: s.name), warnings


def _plugin_servers(
    project_root: Path, env: Mapping[str, str], home: Path | None
) -> list[tuple[int, Path, Source, object]]:
    """The MCP servers of the plugins that run here (`keel.plugins`), the user's own, named
    `plugin:<plugin>:<server>` as Claude Code names them (tools `mcp__plugin_<plugin>_<server>__…`),
    with `${CLAUDE_PLUGIN_ROOT}` filled in. None without `home` (no user configuration read)."""
    if home is None:
        return []
    from keel.config.intake import user_config_dir
    from keel.plugins import plugin_components

    sections: list[tuple[int, Path, Source, object]] = []
    for plugin in plugin_components(project_root, user_dir=user_config_dir(env), home=home):
        for path, servers in plugin.mcp_servers:
            named = {f"plugin:{plugin.name}:{name}": entry for name, entry in servers.items()}
            sections.append((0, path, "user", named))
    return sections


def _foreign_servers(
    project_root: Path, env: Mapping[str, str], home: Path | None
) -> list[tuple[Path, dict[str, Any]]]:
    """Servers from `~/.codex/config.toml`, `~/.config/opencode/opencode.json` and the project
    root's `opencode.json(c)`, in keel's shape (`keel.config.foreign`; read with `home` only,
    as `~/.claude.json` is)."""
    if home is None:
        return []
    from keel.config.foreign import load_foreign
    from keel.config.intake import intake_for

    intake = intake_for(project_root, env, home=home, root=project_root)
    return load_foreign(intake, env).servers


def _read_claude_json(
    path: Path, project_root: Path, warnings: list[str]
) -> tuple[object | None, object | None]:
    """Claude Code's `~/.claude.json`: (its user `mcpServers`, this project's local ones)."""
    data = read_json_object(path, warnings, skipped="no MCP servers loaded from it")
    if not data:
        return None, None
    projects = data.get("projects")
    local: object | None = None
    if isinstance(projects, dict):
        for key in dict.fromkeys((str(project_root), str(project_root.resolve()))):
            entry = projects.get(key)
            if isinstance(entry, dict) and entry.get("mcpServers"):
                local = entry["mcpServers"]
                break
    return data.get("mcpServers") or None, local


def _read_mcp_json(path: Path, warnings: list[str]) -> object | None:
    data = read_json_object(path, warnings, skipped="no project MCP servers loaded")
    if not data:
        return None
    servers = data.get("mcpServers")
    if servers is None:
        warnings.append(f'{path}: no "mcpServers" key; no project MCP servers loaded')
    return servers


def parse_server(
    name: object, entry: object, *, source: Source, origin: str, env: Mapping[str, str]
) -> ServerConfig | str:
    """One entry as a `ServerConfig`, or the message saying why it was skipped."""
    where = f"{origin}: mcp server {name!r}"
    if not isinstance(name, str) or not name.strip():
        return f"{origin}: an mcp server needs a non-empty name; entry skipped"
    if not isinstance(entry, dict):
        return f"{where} must be an object; skipped"
    problem = _shape_problem(entry)
    if problem:
        return f"{where}: {problem}; skipped"
    transport = _transport(entry)
    canonical = json.dumps(
        {"name": name, **{k: v for k, v in entry.items() if k != "disabled"}},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    expand = _Expander(env)
    timeout = float(entry.get("timeout", DEFAULT_CALL_TIMEOUT))
    common: dict[str, Any] = {
        "name": name,
        "transport": transport,
        "source": source,
        "origin": origin,
        "disabled": bool(entry.get("disabled", False)),
        "timeout": timeout,
        "canonical": canonical,
    }
    if transport == "stdio":
        sandbox = entry.get("sandbox", False)
        server = ServerConfig(
            inherit_env=bool(entry.get("inherit_env", False)),
            sandbox=sandbox is True or isinstance(sandbox, dict),
            sandbox_network=isinstance(sandbox, dict) and sandbox.get("network") is True,
            command=expand(entry["command"], "command"),
            args=tuple(expand(a, f"args[{i}]") for i, a in enumerate(entry.get("args", []))),
            env=tuple((k, expand(v, f"env.{k}")) for k, v in entry.get("env", {}).items()),
            cwd=entry.get("cwd", ""),
            **common,
        )
    else:
        url = expand(entry["url"], "url")
        if not expand.errors and not re.match(r"^https?://", url, re.IGNORECASE):
            return f"{where}: url must start with http:// or https:// (got {url!r}); skipped"
        server = ServerConfig(
            url=url,
            headers=tuple(
                (k, expand(v, f"headers.{k}")) for k, v in entry.get("headers", {}).items()
            ),
            **common,
        )
    if expand.errors:
        return replace(server, error="; ".join(expand.errors))
    return server


def _transport(entry: dict[str, Any]) -> Transport:
    kind = entry.get("type")
    if isinstance(kind, str):
        return _TRANSPORTS[kind.lower()]
    return "stdio" if "command" in entry else "http"


def _is_strings(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _is_string_map(value: object) -> bool:
    return isinstance(value, dict) and all(isinstance(v, str) for v in value.values())


def _shape_problem(entry: dict[str, Any]) -> str | None:
    kind = entry.get("type")
    if kind is not None and (not isinstance(kind, str) or kind.lower() not in _TRANSPORTS):
        return f'"type" must be "stdio", "http" (or "streamable-http") or "sse", got {kind!r}'
    if kind is None and "command" in entry and "url" in entry:
        return 'has both "command" and "url"; set "type" to say which transport to use'
    if kind is None and "command" not in entry and "url" not in entry:
        return 'needs "command" (a local server) or "url" (a remote one)'
    transport = _transport(entry)
    if "disabled" in entry and not isinstance(entry["disabled"], bool):
        return '"disabled" must be true or false'
    timeout = entry.get("timeout", DEFAULT_CALL_TIMEOUT)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
        return f'"timeout" must be a positive number of seconds, got {timeout!r}'
    if transport == "stdio":
        return _stdio_problem(entry)
    url = entry.get("url")
    if not isinstance(url, str) or not url.strip():
        return '"url" must be a non-empty string'
    if "headers" in entry and not _is_string_map(entry["headers"]):
        return '"headers" must be an object whose values are strings'
    return None


def _stdio_problem(entry: dict[str, Any]) -> str | None:
    command = entry.get("command")
    if not isinstance(command, str) or not command.strip():
        return '"command" must be a non-empty string'
    if "args" in entry and not _is_strings(entry["args"]):
        return '"args" must be a list of strings'
    if "env" in entry and not _is_string_map(entry["env"]):
        return '"env" must be an object whose values are strings'
    if "cwd" in entry and not isinstance(entry["cwd"], str):
        return '"cwd" must be a string'
    if "inherit_env" in entry and not isinstance(entry["inherit_env"], bool):
        return '"inherit_env" must be true or false'
    sandbox = entry.get("sandbox", False)
    if not isinstance(sandbox, bool) and not (
        isinstance(sandbox, dict)
        and set(sandbox) <= {"network"}
        and isinstance(sandbox.get("network", False), bool)
    ):
        return '"sandbox" must be true, false or {"network": true|false}'
    return None


def _unknown_key_warnings(name: str, entry: dict[str, Any], origin: str) -> list[str]:
    transport = _transport(entry)
    known = _COMMON_KEYS | (_STDIO_KEYS if transport == "stdio" else _HTTP_KEYS)
    unknown = sorted(set(entry) - known)
    if not unknown:
        return []
    note = (
        " (keel signs in with OAuth by itself; a pre-registered client is not supported)"
        if "oauth" in unknown
        else ""
    )
    return [
        f"{origin}: mcp server {name!r}: key(s) {', '.join(unknown)} ignored for a "
        f"{transport} server{note} (known: {', '.join(sorted(known))})"
    ]


class _Expander:
    """`${VAR}` and `${VAR:-default}` (the default when VAR is unset or empty, as in a shell).
    An undefined variable without a default is recorded in `errors`, naming the field."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = env
        self.errors: list[str] = []

    def __call__(self, value: str, field: str) -> str:
        def sub(m: re.Match[str]) -> str:
            var, default = m.group(1), m.group(2)
            got = self.env.get(var)
            if got:
                return got
            if default is not None:
                return default
            if got is None:
                self.errors.append(
                    f"undefined variable ${{{var}}} in {field} "
                    f"(set it, or write ${{{var}:-default}})"
                )
            return ""

        return _VAR.sub(sub, value)


__all__ = [
    "DEFAULT_CALL_TIMEOUT",
    "ServerConfig",
    "Source",
    "Transport",
    "load_servers",
    "mcp_json_path",
    "parse_server",
    "source_of",
]
