"""Trust in what comes with a repository (DESIGN.md, invariant 5).

Owns three things:
- `project_key`: the name under which a project's approvals (and sessions) are kept;
- the approvals themselves: pins (content hashes) in the user's own config directory, one file
  per project, never in the project, by kind (`settings`, `hooks`, `mcp`);
- which entries of a shared project settings file need an approval before they apply
  (`gated_entries`): anything that decides where a credential goes, runs code, or widens a
  permission. Everything else in such a file (deny rules, a stricter sandbox, lower limits,
  catalog facts) applies at once.

Which files came with the project is decided by `keel.config.intake` (provenance), never here.

It must never print, read a credential's value, or import anything above `keel.config`.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from keel.frozen import frozen

KINDS = ("settings", "hooks", "mcp")


def project_key(cwd: Path) -> str:
    resolved = str(cwd.resolve())
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", Path(resolved).name) or "root"
    return f"{name}-{hashlib.sha256(resolved.encode()).hexdigest()[:8]}"


# -- approvals: in the user's own config directory, keyed by project --------------------------------


def approvals_file(keel_user_dir: Path, project_key: str) -> Path:
    return keel_user_dir / "projects" / f"{project_key}.json"


def read_approvals(path: Path) -> dict[str, list[str]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: [p for p in v if isinstance(p, str)] for k, v in data.items() if isinstance(v, list)}


def _write_approvals(path: Path, data: dict[str, list[str]]) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    tmp.chmod(0o600)
    tmp.replace(path)


def approve(path: Path, kind: str, pin: str) -> None:
    """Add `pin` to the approvals of `kind` (`settings`, `hooks`, `mcp`), keeping the rest."""
    data = read_approvals(path)
    pins = data.get(kind, [])
    if pin not in pins:
        pins.append(pin)
    data[kind] = pins
    _write_approvals(path, data)


def revoke(path: Path, kind: str | None = None) -> int:
    """Forget the approvals of `kind` (every kind when None); how many pins were dropped."""
    data = read_approvals(path)
    kinds = [kind] if kind is not None else list(data)
    dropped = sum(len(data.pop(k, [])) for k in kinds)
    if dropped:
        _write_approvals(path, data)
    return dropped


def approved_pins(keel_user_dir: Path, project_key: str, kind: str) -> set[str]:
    return set(read_approvals(approvals_file(keel_user_dir, project_key)).get(kind, []))


# -- which project settings need an approval ---------------------------------------------------------


@frozen
class Gated:
    """One entry of a shared project file that applies only once the user approves it."""

    key: str
    value: Any
    why: str

    def line(self) -> str:
        return f"{self.key} = {json.dumps(self.value)}: {self.why}"


#: Claude Code's plugin settings: a plugin runs code (hooks, MCP servers), and turning one off
#: may remove a guard.
_PLUGIN_KEYS = {
    "enabledPlugins": "turns these plugins on or off: a plugin runs its own code (hooks, MCP "
    "servers), and turning one off may remove a guard",
    "extraKnownMarketplaces": "adds these plugin marketplaces, to install plugins from",
}
#: Provider keys that decide where a key is sent, or which variable is sent.
_PROVIDER_GATED = ("base_url", "api_key_env", "wire")
_PRICE_KEYS = ("input_price", "output_price", "cache_read_price", "cache_write_price")
#: Permission modes a shared file may set without approval (they only ask more).
_TIGHT_MODES = ("default", "plan")


def gated_entries(data: dict[str, Any]) -> tuple[dict[str, Any], list[Gated]]:
    """Split a shared file's object into what applies at once and what needs an approval.
    Values of the wrong shape stay in the first part: the settings loader reports them."""
    safe = dict(data)
    gated: list[Gated] = []
    for key, split in _SECTIONS.items():
        if isinstance(data.get(key), dict):
            safe[key] = split(data[key], gated)
    for key, why in _PLUGIN_KEYS.items():
        if key in safe:
            gated.append(Gated(key, safe.pop(key), why))
    if "remote_tools" in safe:
        why = "sends your tool inputs to these agents over NATS and offers their tools to the model"
        gated.append(Gated("remote_tools", safe.pop("remote_tools"), why))
    return safe, gated


def _providers(providers: dict[str, Any], gated: list[Gated]) -> dict[str, Any]:
    kept: dict[str, Any] = {}
    for name, conf in providers.items():
        if isinstance(conf, dict):
            conf = dict(conf)
            for key in _PROVIDER_GATED:
                if key in conf:
                    gated.append(Gated(f"providers.{name}.{key}", conf.pop(key), _why(name, key)))
        kept[name] = conf
    return kept


def _permissions(permissions: dict[str, Any], gated: list[Gated]) -> dict[str, Any]:
    rest = dict(permissions)
    if "allow" in rest:
        why = "lets these tool calls run without asking you"
        gated.append(Gated("permissions.allow", rest.pop("allow"), why))
    for key in ("default_mode", "defaultMode"):
        # auto is not gated: no approval lets a project turn it on (the settings say so).
        if key in rest and rest[key] not in (*_TIGHT_MODES, "auto"):
            why = "changes the permission mode so that fewer calls ask you"
            gated.append(Gated(f"permissions.{key}", rest.pop(key), why))
    if "additionalDirectories" in rest:
        why = "lets tools change files in these directories outside the project"
        gated.append(
            Gated("permissions.additionalDirectories", rest.pop("additionalDirectories"), why)
        )
    return rest


def _sandbox(sandbox: dict[str, Any], gated: list[Gated]) -> dict[str, Any]:
    rest = dict(sandbox)
    if rest.get("enabled") is False:
        gated.append(Gated("sandbox.enabled", rest.pop("enabled"), "turns the sandbox off"))
    if rest.get("network") is True:
        why = "lets sandboxed commands reach the network"
        gated.append(Gated("sandbox.network", rest.pop("network"), why))
    if "env_passthrough" in rest:
        why = "passes these environment variables (secrets too) to sandboxed commands"
        gated.append(Gated("sandbox.env_passthrough", rest.pop("env_passthrough"), why))
    return rest


def _models(models: dict[str, Any], gated: list[Gated]) -> dict[str, Any]:
    kept: dict[str, Any] = {}
    for model, conf in models.items():
        if isinstance(conf, dict) and any(k in conf for k in _PRICE_KEYS):
            prices = {k: conf[k] for k in _PRICE_KEYS if k in conf}
            why = "sets the prices a USD budget is counted with"
            gated.append(Gated(f"models.{model} prices", prices, why))
            conf = {k: v for k, v in conf.items() if k not in _PRICE_KEYS}
        kept[model] = conf
    return kept


def _status_line(status_line: dict[str, Any], gated: list[Gated]) -> dict[str, Any]:
    why = "runs this command each time the status line refreshes"
    gated.append(Gated("statusLine", status_line, why))
    return {}


def _lsp(lsp: dict[str, Any], gated: list[Gated]) -> dict[str, Any]:
    """A language server entry runs its command on your machine whenever a matching file
    changes; only `{"disabled": true}` (turning one off) applies at once."""
    rest = dict(lsp)
    servers = rest.get("servers")
    if isinstance(servers, dict):
        kept: dict[str, Any] = {}
        for name, entry in servers.items():
            if entry == {"disabled": True}:
                kept[name] = entry
            else:
                why = "runs this language server on your machine when a matching file changes"
                gated.append(Gated(f"lsp.servers.{name}", entry, why))
        rest["servers"] = kept
    return rest


_SECTIONS: dict[str, Callable[[dict[str, Any], list[Gated]], dict[str, Any]]] = {
    "providers": _providers,
    "permissions": _permissions,
    "sandbox": _sandbox,
    "models": _models,
    "statusLine": _status_line,
    "lsp": _lsp,
}


def _why(name: str, key: str) -> str:
    return {
        "base_url": f"sends your {name} API key and your prompts to this URL",
        "api_key_env": f"sends this environment variable to the {name} server",
        "wire": f"defines a custom provider {name!r}",
    }[key]


def settings_pin(path: Path, gated: list[Gated], *, rel: str = "") -> str:
    """The approval pin of one file's gated entries: changing any of them needs a new one. A file
    below the project root (`rel`, its path from the root) is pinned with that path, so the same
    entries in another directory need an approval of their own; a file at the root keeps the
    pin it always had."""
    where: list[str] = [path.name, path.parent.name]
    if rel.count("/") > 1:
        where = [rel]
    payload = json.dumps([*where, [(g.key, g.value) for g in gated]], sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


__all__ = [
    "KINDS",
    "Gated",
    "approvals_file",
    "approve",
    "approved_pins",
    "gated_entries",
    "project_key",
    "read_approvals",
    "revoke",
    "settings_pin",
]
