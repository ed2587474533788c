"""Which language servers there are: keel's built-in defaults, the `lsp.servers` entries of the
settings files, and the `.lsp.json` / `lspServers` of the plugins that run (Claude Code's
format), as `ServerSpec`s in the order they are asked.

An entry (settings or plugin) is an object: `command` and `args`, `extensionToLanguage`
(`{".py": "python"}`; keel also reads `extensions`, a list), `rootMarkers`,
`initializationOptions`, `settings` (answers to the server's `workspace/configuration`), `env`,
`startupTimeout` (milliseconds, as Claude Code writes it), `maxRestarts`, `restartOnCrash` and
`disabled`. An entry named like a built-in server changes it (`{"disabled": true}` turns it off).

Approval is not decided here: a project file's entries that run a command wait for the user's
approval in the settings intake (`keel.config.trust`, `lsp.servers.NAME`) and never reach this
module until approved; plugins run only once the user turned them on (`keel.plugins`).

It reads configuration and looks for programs on PATH; it must never start anything.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from keel.frozen import frozen

#: Keys of one server entry (Claude Code's, and keel's `extensions`, `rootMarkers`, `disabled`).
ENTRY_KEYS = frozenset(
    {"command", "args", "extensionToLanguage", "extensions", "rootMarkers", "root_markers",
     "initializationOptions", "settings", "env", "startupTimeout", "shutdownTimeout",
     "maxRestarts", "restartOnCrash", "disabled", "transport", "workspaceFolder"}
)  # fmt: skip
#: Seconds a server may take to start and answer `initialize`, unless its entry says.
STARTUP_TIMEOUT = 15.0
#: Restarts after a crash, unless its entry says (then it stays down for the session).
MAX_RESTARTS = 3


@frozen
class ServerSpec:
    """One language server keel may start: for the files whose extension it names, in the
    directory holding the nearest of its root markers (else the project root)."""

    name: str
    command: str
    args: tuple[str, ...] = ()
    #: (".py", "python"): file extension (lower case) and the LSP language id sent for it.
    languages: tuple[tuple[str, str], ...] = ()
    root_markers: tuple[str, ...] = ()
    #: JSON (canonical text; "" = none), to keep the spec hashable.
    init_options: str = ""
    settings: str = ""
    env: tuple[tuple[str, str], ...] = ()
    startup_timeout: float = STARTUP_TIMEOUT
    max_restarts: int = MAX_RESTARTS
    #: Where it comes from, for messages: "built-in", a settings file, "plugin NAME".
    source: str = "built-in"
    disabled: bool = False

    def language_of(self, path: Path) -> str | None:
        suffix = path.suffix.lower()
        return next((lang for ext, lang in self.languages if ext == suffix), None)

    def available(self) -> bool:
        """Whether its command can be run here (on PATH, or a path that exists)."""
        return bool(shutil.which(self.command))

    def argv(self) -> list[str]:
        return [shutil.which(self.command) or self.command, *self.args]

    def options(self) -> object:
        import json

        return json.loads(self.init_options) if self.init_options else None

    def config(self) -> object:
        import json

        return json.loads(self.settings) if self.settings else None


def _langs(pairs: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    return tuple(pairs)


_PY = _langs([(".py", "python"), (".pyi", "python")])
_PY_ROOTS = ("pyproject.toml", "pyrightconfig.json", "setup.py", "setup.cfg", "requirements.txt")
_TS = _langs(
    [(".ts", "typescript"), (".tsx", "typescriptreact"), (".mts", "typescript"),
     (".cts", "typescript"), (".js", "javascript"), (".jsx", "javascriptreact"),
     (".mjs", "javascript"), (".cjs", "javascript")]
)  # fmt: skip
_C = _langs(
    [(".c", "c"), (".h", "c"), (".cc", "cpp"), (".cpp", "cpp"), (".cxx", "cpp"),
     (".hpp", "cpp"), (".hh", "cpp"), (".hxx", "cpp")]
)  # fmt: skip

#: keel's defaults, used only where their command is on PATH, in the order asked (the first
#: that is installed handles a file). rust-analyzer is told not to run the project's build
#: scripts and proc macros: editing a file must not run code that came with the project.
BUILT_IN: tuple[ServerSpec, ...] = (
    ServerSpec("pyright", "pyright-langserver", ("--stdio",), _PY, _PY_ROOTS),
    ServerSpec("basedpyright", "basedpyright-langserver", ("--stdio",), _PY, _PY_ROOTS),
    ServerSpec(
        "typescript",
        "typescript-language-server",
        ("--stdio",),
        _TS,
        ("tsconfig.json", "jsconfig.json", "package.json"),
    ),
    ServerSpec("gopls", "gopls", (), ((".go", "go"),), ("go.work", "go.mod")),
    ServerSpec(
        "rust-analyzer",
        "rust-analyzer",
        (),
        ((".rs", "rust"),),
        ("Cargo.toml",),
        init_options='{"cargo":{"buildScripts":{"enable":false}},"procMacro":{"enable":false}}',
    ),
    ServerSpec(
        "clangd",
        "clangd",
        (),
        _C,
        ("compile_commands.json", "compile_flags.txt", ".clangd"),
    ),
)


def parse_entry(
    name: str, entry: object, *, source: str, base: ServerSpec | None, warnings: list[str]
) -> ServerSpec | None:
    """One entry as a spec (over `base`, the built-in of that name, if any), or None with a
    warning naming `source` and the server when it cannot be used."""
    where = f"{source}: lsp server {name!r}"
    if not isinstance(entry, dict):
        warnings.append(f"{where} must be an object with a command; skipped")
        return None
    for key in sorted(set(entry) - ENTRY_KEYS):
        warnings.append(f"{where}: unknown key {key!r} skipped")
    spec = base or ServerSpec(name, "", source=source)
    changes: dict[str, Any] = {"source": source}
    problems = [check(entry, spec, changes) for check in (_program, _files, _passed, _lifetime)]
    problem = next((p for p in problems if p), "")
    disabled = entry.get("disabled", False)
    if not isinstance(disabled, bool):
        problem = problem or "disabled must be true or false"
    changes["disabled"] = disabled is True
    if problem and not (disabled is True and base is not None):
        warnings.append(f"{where}: {problem}; skipped")
        return None
    return dataclasses.replace(spec, **changes)


def _program(entry: dict[str, Any], spec: ServerSpec, changes: dict[str, Any]) -> str:
    transport = entry.get("transport", "stdio")
    if transport != "stdio":
        return f"transport {transport!r} is not supported (only stdio)"
    command = entry.get("command", spec.command)
    if not isinstance(command, str) or not command.strip():
        return "command must be a non-empty string"
    changes["command"] = command.strip()
    args = entry.get("args", list(spec.args))
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        return "args must be a list of strings"
    changes["args"] = tuple(args)
    return ""


def _files(entry: dict[str, Any], spec: ServerSpec, changes: dict[str, Any]) -> str:
    languages = _languages(entry, spec.languages)
    if languages is None:
        return 'extensionToLanguage must map extensions to language ids, like {".py": "python"}'
    if not languages:
        return "it names no file extensions (extensionToLanguage)"
    changes["languages"] = languages
    markers = entry.get("rootMarkers", entry.get("root_markers", list(spec.root_markers)))
    if not isinstance(markers, list) or not all(isinstance(m, str) and m for m in markers):
        return "rootMarkers must be a list of file names"
    changes["root_markers"] = tuple(markers)
    return ""


def _passed(entry: dict[str, Any], spec: ServerSpec, changes: dict[str, Any]) -> str:
    """What the server is given: `env`, `initializationOptions`, `settings`."""
    import json

    env = entry.get("env", dict(spec.env))
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        return "env must be an object of strings"
    changes["env"] = tuple(sorted((str(k), v) for k, v in env.items()))
    for key, attr in (("initializationOptions", "init_options"), ("settings", "settings")):
        if key in entry:
            changes[attr] = json.dumps(entry[key], sort_keys=True) if entry[key] is not None else ""
    return ""


def _lifetime(entry: dict[str, Any], spec: ServerSpec, changes: dict[str, Any]) -> str:
    startup = entry.get("startupTimeout")
    if startup is not None:
        if isinstance(startup, bool) or not isinstance(startup, int | float) or startup <= 0:
            return "startupTimeout must be a positive number of milliseconds"
        changes["startup_timeout"] = min(float(startup) / 1000, 300.0)
    restarts = entry.get("maxRestarts")
    if restarts is not None:
        if isinstance(restarts, bool) or not isinstance(restarts, int) or restarts < 0:
            return "maxRestarts must be a whole number, 0 or more"
        changes["max_restarts"] = min(restarts, 20)
    if entry.get("restartOnCrash") is False:
        changes["max_restarts"] = 0
    return ""


def _languages(entry: dict[str, Any], old: tuple[tuple[str, str], ...]) -> Any:
    """(ext, language) pairs from `extensionToLanguage` or `extensions`; None when malformed."""
    if "extensionToLanguage" in entry:
        value = entry["extensionToLanguage"]
        if not isinstance(value, dict) or not all(
            isinstance(k, str) and k.startswith(".") and isinstance(v, str) and v
            for k, v in value.items()
        ):
            return None
        return tuple((k.lower(), v) for k, v in value.items())
    if "extensions" in entry:
        value = entry["extensions"]
        if not isinstance(value, list) or not all(
            isinstance(k, str) and k.startswith(".") for k in value
        ):
            return None
        return tuple((k.lower(), k[1:].lower()) for k in value)
    return old


def load_specs(
    entries: Iterable[tuple[str, object]],
    *,
    plugins: Iterable[tuple[str, Path, Mapping[str, object]]] = (),
    warnings: list[str],
) -> list[ServerSpec]:
    """Every server in the order a file's server is chosen: settings entries (each file's
    `lsp.servers`, a later file's entry replacing an earlier one of the same name), then the
    plugins' (`plugin:NAME:SERVER`), then the built-ins nobody replaced; disabled ones left out.
    `entries` holds (source, the `servers` object); `plugins`, (plugin name, file, servers)."""
    built_in = {s.name: s for s in BUILT_IN}
    chosen: dict[str, ServerSpec] = {}
    #: Names a settings file turns off with `{"disabled": true}` (a plugin's server too).
    off: set[str] = set()
    for source, servers in entries:
        if not isinstance(servers, dict):
            warnings.append(f"{source}: lsp.servers must be an object keyed by name; ignored")
            continue
        for name, entry in servers.items():
            if entry == {"disabled": True} and name not in chosen and name not in built_in:
                off.add(str(name))
                continue
            base = chosen.get(name) or built_in.get(name)
            spec = parse_entry(str(name), entry, source=source, base=base, warnings=warnings)
            if spec is not None:
                chosen[str(name)] = spec
    for plugin, path, servers in plugins:
        for name, entry in servers.items():
            full = f"plugin:{plugin}:{name}"
            if full in off:
                continue
            spec = parse_entry(full, entry, source=f"plugin {plugin} ({path})", base=None,
                               warnings=warnings)  # fmt: skip
            if spec is not None:
                chosen[full] = spec
    specs = [s for s in chosen.values() if not s.disabled]
    specs += [s for name, s in built_in.items() if name not in chosen]
    return specs


def plugin_servers(
    cwd: Path, env: Mapping[str, str], warnings: list[str]
) -> list[tuple[str, Path, Mapping[str, object]]]:
    """The LSP servers of the plugins that run here: each `.lsp.json` (or the manifest's
    inline `lspServers`), `${CLAUDE_PLUGIN_ROOT}` and `${CLAUDE_PLUGIN_DATA}` filled in and set
    in each server's environment."""
    from keel.config.intake import user_config_dir
    from keel.config.settings import read_json_object
    from keel.plugins import plugin_components
    from keel.plugins.manifest import MANIFEST

    home = Path(env["HOME"]) if env.get("HOME") else Path.home()
    found: list[tuple[str, Path, Mapping[str, object]]] = []
    for plugin in plugin_components(cwd, user_dir=user_config_dir(env), home=home):
        for path in plugin.lsp:
            data = read_json_object(path, warnings, skipped="its LSP servers skipped")
            if not data:
                continue
            inline = data.get("lspServers")
            if path == plugin.root / MANIFEST:
                data = inline if isinstance(inline, dict) else {}
            elif isinstance(inline, dict):
                data = inline
            filled: dict[str, object] = {}
            for name, entry in data.items():
                if isinstance(entry, dict):
                    entry = _expand(plugin.expand, entry)
                    env_of = entry.get("env") if isinstance(entry.get("env"), dict) else {}
                    entry["env"] = {**plugin.env(), **env_of}
                filled[name] = entry
            found.append((plugin.name, path, filled))
    return found


def _expand(expand: Any, value: Any) -> Any:
    if isinstance(value, str):
        return expand(value)
    if isinstance(value, list):
        return [_expand(expand, v) for v in value]
    if isinstance(value, dict):
        return {k: _expand(expand, v) for k, v in value.items()}
    return value


def server_root(spec: ServerSpec, path: Path, project_root: Path) -> Path:
    """The directory a server for `path` runs in: the nearest one from the file's folder up to
    the project root that holds one of `spec`'s root markers, else the project root."""
    directory = path.parent
    while True:
        if any(os.path.exists(directory / marker) for marker in spec.root_markers):
            return directory
        if directory == project_root or directory == directory.parent:
            return project_root
        if not directory.is_relative_to(project_root):
            return project_root
        directory = directory.parent


__all__ = [
    "BUILT_IN",
    "ServerSpec",
    "load_specs",
    "parse_entry",
    "plugin_servers",
    "server_root",
]
