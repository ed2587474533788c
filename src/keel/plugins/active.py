"""Which plugins are on here, and which of them run.

`enabledPlugins` is read from every settings scope (`keel.config.settings`): the user's files,
then the project's from its root down to the working directory; a later file wins. A project
file's `enabledPlugins` and `extraKnownMarketplaces` come with the repository and run code, so
they apply only once the user approved them (`keel trust approve settings`, the same pin as the
file's other gated entries); until then each plugin they name is reported as waiting. A plugin
that is on runs only if the user installed it (`keel plugin install`): keel never installs one
by itself, it names the command that does.

Every loader that reads a plugin's components (commands, agents, skills, hooks, MCP servers)
asks `load_plugins` here, so they all agree. It must never install, fetch or run anything.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import field
from pathlib import Path

from keel.config.intake import intake_for
from keel.config.settings import Settings, load_settings
from keel.frozen import frozen, mutable
from keel.plugins import claude_plugins_dir, installed_file
from keel.plugins.manifest import Plugin, read_plugin
from keel.plugins.store import Installed, data_dir, read_installed


@frozen
class PluginState:
    """One plugin named by `enabledPlugins` somewhere, and what keel does with it."""

    ident: str
    enabled: bool
    #: The settings file whose entry decides (None: waits for approval only).
    file: Path | None
    #: Decided by the user's own settings (else a project file the user approved).
    user_level: bool
    installed: Installed | None
    #: Project files that turn it on (True) or off (False), waiting for the user's approval.
    waiting: tuple[tuple[Path, bool], ...] = ()

    @property
    def runs(self) -> bool:
        return self.enabled and self.installed is not None


@mutable
class PluginSet:
    states: list[PluginState] = field(default_factory=list)
    #: The plugins that run here, read from the install cache.
    active: list[Plugin] = field(default_factory=list)
    #: Installed plugins nothing turns on.
    idle: list[Installed] = field(default_factory=list)
    #: Each plugin that waits for approval or installation, in one line (`states` say the same).
    unready: list[str] = field(default_factory=list)
    #: Problems with a plugin's files.
    warnings: list[str] = field(default_factory=list)

    def notices(self) -> list[str]:
        """What a run says about plugins when it starts."""
        return [*self.unready, *self.warnings]


def settings_for(cwd: Path, *, user_dir: Path, home: Path) -> Settings:
    """The settings of `cwd` as `user_dir` and `home` see them (the loaders are told both)."""
    env: Mapping[str, str] = {**os.environ, "KEEL_CONFIG_DIR": str(user_dir), "HOME": str(home)}
    return load_settings(cwd, env)


def load_plugins(
    cwd: Path, *, user_dir: Path, home: Path | None = None, settings: Settings | None = None
) -> PluginSet:
    """The plugins named here, their state, and those that run."""
    home = home or Path.home()
    if settings is None:
        settings = settings_for(cwd, user_dir=user_dir, home=home)
    result = PluginSet()
    installed = read_installed(home)
    waiting: dict[str, list[tuple[Path, bool]]] = {}
    for pending in settings.pending:
        if pending.approved:
            continue
        for entry in pending.entries:
            if entry.key == "enabledPlugins" and isinstance(entry.value, dict):
                for ident, on in entry.value.items():
                    waiting.setdefault(str(ident), []).append((pending.path, on is True))
    intake = intake_for(cwd, user_dir=user_dir, home=home)
    for ident in sorted({*settings.enabled_plugins, *waiting}):
        enabled, file = settings.enabled_plugins.get(ident, (False, None))
        state = PluginState(
            ident,
            enabled,
            file,
            file is not None and not intake.supplied(file),
            installed.get(ident),
            tuple(waiting.get(ident, ())),
        )
        result.states.append(state)
        for where, on in state.waiting:
            result.unready.append(
                f"{where} turns plugin {ident} {'on' if on else 'off'}, which waits for your "
                f"approval (`keel trust list` shows it, `keel trust approve settings` allows it); "
                f"until then it {'runs' if state.runs else 'does not run'}"
            )
        if state.enabled and state.installed is None:
            result.unready.append(
                f"plugin {ident} is enabled in {file} but not installed, so it does not run: "
                f"`keel plugin install {ident}` installs it"
            )
        if state.enabled and state.installed is not None:
            plugin = _read(state, state.installed, result.warnings)
            if plugin is not None:
                result.active.append(plugin)
    named = {s.ident for s in result.states}
    result.idle = [i for ident, i in sorted(installed.items()) if ident not in named]
    return result


def _read(state: PluginState, installed: Installed, warnings: list[str]) -> Plugin | None:
    name, _, marketplace = state.ident.partition("@")
    if not installed.path.is_dir():
        warnings.append(
            f"plugin {state.ident}: its files are gone from {installed.path}: "
            f"`keel plugin install {state.ident}` installs it again"
        )
        return None
    data = data_dir(name, marketplace)
    data.mkdir(parents=True, exist_ok=True)
    plugin = read_plugin(installed.path, marketplace=marketplace, data_dir=data, warnings=warnings)
    if plugin.name != name:
        # Its components are namespaced by the name in its id, so `/name:command` and
        # `keel plugin list` agree even where the manifest spells it otherwise.
        plugin = dataclasses.replace(plugin, name=name)
    return dataclasses.replace(plugin, user_level=state.user_level)


#: `plugin_components`' last answer per (cwd, user config dir, home, environment), with the state
#: of the files it rests on: five loaders ask it in every run (commands, skills, agents, hooks, MCP
#: servers), and each answer reads every settings file.
_components: dict[tuple[object, ...], tuple[tuple[object, ...], list[Plugin]]] = {}


def plugin_components(
    cwd: Path, *, user_dir: Path | None, home: Path | None = None
) -> list[Plugin]:
    """The plugins whose components load in `cwd` (none without keel's user config directory:
    a caller that reads no user configuration reads no plugins either). Read again only when a
    settings file, the approvals or an install record changed."""
    if user_dir is None:
        return []
    home = home or Path.home()
    key = (cwd, user_dir, home, *sorted(os.environ.items()))
    files = _files_read(cwd, user_dir, home)
    known = _components.get(key)
    if known is not None and known[0] == files:
        return list(known[1])
    active = load_plugins(cwd, user_dir=user_dir, home=home).active
    _components[key] = (files, active)
    return list(active)


def _files_read(cwd: Path, user_dir: Path, home: Path) -> tuple[object, ...]:
    """The state (inode, size, change time) of every file `load_plugins` rests on."""
    intake = intake_for(cwd, user_dir=user_dir, home=home)
    paths = [
        *intake.settings_files(),
        intake.approvals(),
        installed_file(),
        claude_plugins_dir(home) / "installed_plugins.json",
    ]
    state: list[object] = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            state.append(None)
        else:
            state.append((st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    return tuple(state)


__all__ = ["PluginSet", "PluginState", "load_plugins", "plugin_components", "settings_for"]
