"""Claude Code plugins: marketplaces, the install cache, which plugins are on, and what each
brings (docs/extensions.md, "Plugins"). Loaded lazily: `keel --version` never imports it."""

from keel.plugins.active import PluginSet, PluginState, load_plugins, plugin_components
from keel.plugins.manifest import Plugin, read_plugin

__all__ = [
    "Plugin",
    "PluginSet",
    "PluginState",
    "load_plugins",
    "plugin_components",
    "read_plugin",
]
