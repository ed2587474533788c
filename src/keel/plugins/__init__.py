"""Claude Code plugins: marketplaces, the install cache, which plugins are on, and what each
brings (docs/extensions.md, "Plugins"). Loaded lazily: `keel --version` never imports it, and a
start on a machine where no plugin is installed imports only this file (`plugin_components`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from keel.plugins.active import PluginSet, PluginState, load_plugins
    from keel.plugins.manifest import Plugin, read_plugin


def plugins_home(env: Mapping[str, str] | None = None) -> Path:
    """Where installed plugins are kept: `plugins/` in keel's data folder."""
    from keel.session.store import keel_home

    return keel_home(env) / "plugins"


def installed_file() -> Path:
    return plugins_home() / "installed.json"


def claude_plugins_dir(home: Path) -> Path:
    """Claude Code's own plugin files (`known_marketplaces.json`, `installed_plugins.json`, its
    cache), in the user's `~/.claude`: keel reads them, never writes them."""
    return home / ".claude" / "plugins"


def plugin_components(
    cwd: Path, *, user_dir: Path | None, home: Path | None = None
) -> list[Plugin]:
    """The plugins whose components load in `cwd` (`keel.plugins.active.plugin_components`).
    Only an installed plugin runs: with no install record, keel's or Claude Code's, there are
    none, and nothing else of the package is imported."""
    home = home or Path.home()
    records = (installed_file(), claude_plugins_dir(home) / "installed_plugins.json")
    if user_dir is None or not any(path.exists() for path in records):
        return []
    from keel.plugins.active import plugin_components as read

    return read(cwd, user_dir=user_dir, home=home)


def __getattr__(name: str) -> Any:
    """The rest of the package's names, imported when first used."""
    if name in ("PluginSet", "PluginState", "load_plugins"):
        from keel.plugins import active

        return getattr(active, name)
    if name in ("Plugin", "read_plugin"):
        from keel.plugins import manifest

        return getattr(manifest, name)
    raise AttributeError(name)


__all__ = [
    "Plugin",
    "PluginSet",
    "PluginState",
    "claude_plugins_dir",
    "installed_file",
    "load_plugins",
    "plugin_components",
    "plugins_home",
    "read_plugin",
]
