"""Marketplaces and installed plugins: where they are kept and how they get there.

Owns:
- marketplace sources, as Claude Code writes them in `extraKnownMarketplaces`
  (`{"source": "directory", "path": …}`, `{"source": "git", "url": …}`,
  `{"source": "github", "repo": "owner/name"}`, each git one with an optional `ref`), and the ones
  the user added with `keel plugin marketplace add` (kept in keel's config directory,
  `plugins/marketplaces.json`, in the same shape);
- reading a marketplace's `.claude-plugin/marketplace.json` (a git one is cloned with the `git`
  program into keel's data folder first);
- the install cache in keel's data folder: `plugins/cache/<marketplace>/<plugin>/<version>/`, a
  copy made when the user installs or updates, listed in `plugins/installed.json`; and each
  plugin's data folder (`CLAUDE_PLUGIN_DATA`), `plugins/data/<plugin>-<marketplace>/`, kept
  across updates.

Nothing here decides whether a plugin may run (`keel.plugins.active` does, from the settings
and their approvals); nothing here runs a plugin's code. It runs `git` only when the user asks
for an install, an update or a marketplace.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from keel.config.settings import read_json_object
from keel.errors import UserError
from keel.frozen import frozen
from keel.plugins import claude_plugins_dir, installed_file, plugins_home
from keel.plugins.manifest import COMPONENT_KEYS, MANIFEST, read_manifest

#: A marketplace's catalogue, relative to its folder.
CATALOGUE = Path(".claude-plugin") / "marketplace.json"
#: Seconds a `git clone` or `git pull` may take.
GIT_TIMEOUT = 300.0
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def data_dir(name: str, marketplace: str, env: Mapping[str, str] | None = None) -> Path:
    """A plugin's own writable folder (`CLAUDE_PLUGIN_DATA`), kept across updates."""
    return plugins_home(env) / "data" / _safe(f"{name}-{marketplace}")


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", text)


# -- marketplaces ------------------------------------------------------------------------------


@frozen
class Source:
    """Where a marketplace is: a local `directory`, or a `git` repository (`github` is a git
    repository on GitHub) at an optional `ref`."""

    kind: str
    location: str
    ref: str = ""

    def as_json(self) -> dict[str, str]:
        key = {"directory": "path", "git": "url", "github": "repo"}[self.kind]
        data = {"source": self.kind, key: self.location}
        return {**data, "ref": self.ref} if self.ref else data

    def describe(self) -> str:
        return self.location + (f" at {self.ref}" if self.ref else "")

    def git_url(self) -> str:
        return f"https://github.com/{self.location}.git" if self.kind == "github" else self.location


def parse_source(value: object, *, base: Path) -> Source:
    """A marketplace `source` object; a relative `path` is taken from `base`."""
    if not isinstance(value, dict):
        example = '{"source": "directory", "path": "…"}'
        raise UserError(f"a marketplace source must be an object like {example}")
    kind = value.get("source")
    key = {"directory": "path", "git": "url", "github": "repo"}.get(str(kind))
    if key is None:
        raise UserError(
            f"marketplace source {kind!r} is not supported",
            hint="keel reads directory, git and github sources",
        )
    location = value.get(key)
    if not isinstance(location, str) or not location.strip():
        raise UserError(f"a {kind} marketplace source needs a {key}")
    ref = value.get("ref", "")
    if kind == "directory":
        location = str((base / Path(location).expanduser()).resolve())
    return Source(str(kind), location, ref if isinstance(ref, str) else "")


def source_from_argument(text: str, cwd: Path) -> Source:
    """What `keel plugin marketplace add` was given: a folder, a git URL, or `owner/name`."""
    if re.match(r"^(https?|file|ssh|git)://", text) or text.startswith("git@"):
        return Source("git", text)
    path = Path(text).expanduser()
    path = path if path.is_absolute() else cwd / path
    if path.name == "marketplace.json" and path.is_file():
        path = path.parent.parent
    if path.is_dir():
        return Source("directory", str(path.resolve()))
    if re.fullmatch(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+", text):
        return Source("github", text)
    raise UserError(
        f"{text}: not a folder, a git URL or owner/name",
        hint="give the folder that holds .claude-plugin/marketplace.json, or a git URL",
    )


@frozen
class Marketplace:
    name: str
    source: Source
    #: Where it was named: a file (keel's or Claude Code's marketplaces, a settings file), or
    #: "built in".
    origin: str
    #: Its folder on this machine (a clone for a git one; it may not exist yet).
    folder: Path


def user_marketplaces_file(user_dir: Path) -> Path:
    return user_dir / "plugins" / "marketplaces.json"


#: The marketplace Claude Code knows without being told, as Claude Code names it.
OFFICIAL = "claude-plugins-official"
_OFFICIAL_SOURCE = {"source": "github", "repo": "anthropics/claude-plugins-official"}


def known_marketplaces(
    user_dir: Path,
    settings_marketplaces: Mapping[str, tuple[object, Path]],
    warnings: list[str],
    *,
    home: Path | None = None,
) -> dict[str, Marketplace]:
    """The marketplaces known here, a later one winning for a name: Claude Code's official one,
    those Claude Code knows (`~/.claude/plugins/known_marketplaces.json`), those the user added
    to keel, then those of `extraKnownMarketplaces` (each relative directory from the folder
    holding the settings file's `.claude/` or `.keel/`)."""
    home = home or Path.home()
    found: dict[str, Marketplace] = {}
    entries: list[tuple[str, object, str, Path]] = [(OFFICIAL, _OFFICIAL_SOURCE, "built in", home)]
    for path in (
        claude_plugins_dir(home) / "known_marketplaces.json",
        user_marketplaces_file(user_dir),
    ):
        for name, entry in (read_json_object(path, warnings, skipped="ignored") or {}).items():
            source = entry.get("source") if isinstance(entry, dict) else None
            entries.append((name, source, str(path), home))
    for name, (source, file) in settings_marketplaces.items():
        entries.append((name, source, str(file), file.parent.parent))
    for name, source, origin, base in entries:
        try:
            parsed = parse_source(source, base=base)
        except UserError as exc:
            warnings.append(f"{origin}: marketplace {name}: {exc.one_line()}; ignored")
            continue
        found[name] = Marketplace(name, parsed, origin, marketplace_folder(name, parsed))
    return found


def marketplace_folder(name: str, source: Source) -> Path:
    """Where a marketplace's files are on this machine (a git one's clone)."""
    if source.kind == "directory":
        return Path(source.location)
    return plugins_home() / "marketplaces" / _safe(name)


def save_user_marketplace(user_dir: Path, name: str, source: Source | None) -> None:
    """Add (or with None, remove) a marketplace in keel's marketplaces file."""
    path = user_marketplaces_file(user_dir)
    data = read_json_object(path, [], skipped="") or {}
    if source is None:
        data.pop(name, None)
    else:
        data[name] = {"source": source.as_json()}
    _write_json(path, data)


def fetch_marketplace(market: Marketplace, *, refresh: bool) -> None:
    """Make sure a git marketplace is cloned (and, with `refresh`, pulled)."""
    if market.source.kind == "directory":
        if not (market.folder / CATALOGUE).is_file():
            raise UserError(
                f"marketplace {market.name}: no {CATALOGUE} in {market.folder}",
                hint="a marketplace folder holds .claude-plugin/marketplace.json",
            )
        return
    if (market.folder / ".git").exists():
        if refresh:
            _git(["-C", str(market.folder), "pull", "--ff-only", "--quiet"], market.name)
        return
    clone(market.source, market.folder, market.name)


def clone(source: Source, into: Path, what: str, *, sha: str = "") -> None:
    """A shallow clone of `source` at its ref, or at the commit `sha` (a marketplace entry may
    pin one)."""
    into.parent.mkdir(parents=True, exist_ok=True)
    if sha:
        into.mkdir(parents=True, exist_ok=True)
        _git(["-C", str(into), "init", "--quiet"], what)
        _git(["-C", str(into), "fetch", "--quiet", "--depth", "1", source.git_url(), sha], what)
        _git(["-C", str(into), "checkout", "--quiet", "FETCH_HEAD"], what)
        return
    branch = ["--branch", source.ref] if source.ref else []
    _git(["clone", "--quiet", "--depth", "1", *branch, source.git_url(), str(into)], what)


def _git(args: list[str], what: str) -> None:
    if shutil.which("git") is None:
        raise UserError(f"{what}: git is not installed", hint="install git, then run it again")
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}
    try:
        done = subprocess.run(
            ["git", *args], capture_output=True, text=True, env=env, timeout=GIT_TIMEOUT
        )
    except subprocess.TimeoutExpired:
        raise UserError(f"{what}: git {args[0]} took over {GIT_TIMEOUT:g} s") from None
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or ["(no output)"]
        said = next((line for line in lines if line.startswith("fatal:")), lines[-1])
        raise UserError(f"{what}: git failed: {said}", hint="check the URL and your access to it")


@frozen
class Entry:
    """One plugin a marketplace lists."""

    name: str
    description: str
    version: str
    source: object
    marketplace: Marketplace
    #: Components the entry itself names (`commands`, `hooks`…: Claude Code merges them with
    #: the plugin's manifest); written into the installed copy's `plugin.json`.
    components: tuple[tuple[str, Any], ...] = ()


def read_catalogue(market: Marketplace) -> list[Entry]:
    """The plugins a (fetched) marketplace lists."""
    path = market.folder / CATALOGUE
    problems: list[str] = []
    data = read_json_object(path, problems, skipped="")
    if data is None:
        said = problems[0] if problems else f"{path}: missing"
        raise UserError(
            said.removesuffix("; "), hint="`keel plugin marketplace update` fetches it again"
        )
    plugins = data.get("plugins")
    if not isinstance(plugins, list):
        raise UserError(f"{path}: plugins must be a list")
    entries = []
    for item in plugins:
        if isinstance(item, dict) and isinstance(item.get("name"), str):
            entries.append(
                Entry(
                    item["name"],
                    str(item.get("description", "")),
                    str(item.get("version", "")),
                    item.get("source"),
                    market,
                    tuple((k, item[k]) for k in COMPONENT_KEYS if k in item),
                )
            )
    return entries


def _plugin_root(data: dict[str, Any]) -> str:
    metadata = data.get("metadata")
    root = metadata.get("pluginRoot") if isinstance(metadata, dict) else None
    return root if isinstance(root, str) else ""


# -- the install cache -----------------------------------------------------------------------------


@frozen
class Installed:
    ident: str
    version: str
    path: Path
    #: A hash of the copied files: an update replaces them only when it changed.
    digest: str
    installed_at: float
    #: Installed by Claude Code (in `~/.claude/plugins`): keel runs it, Claude Code updates it.
    by_claude: bool = False


def read_installed(home: Path | None = None) -> dict[str, Installed]:
    """What keel installed; with `home`, also what Claude Code installed there
    (`~/.claude/plugins/installed_plugins.json`) that keel did not."""
    found = _claude_installed(home) if home is not None else {}
    data = read_json_object(installed_file(), [], skipped="") or {}
    plugins = data.get("plugins")
    for ident, entry in plugins.items() if isinstance(plugins, dict) else ():
        if isinstance(entry, dict) and isinstance(entry.get("path"), str):
            found[ident] = Installed(
                ident,
                str(entry.get("version", "")),
                Path(entry["path"]),
                str(entry.get("digest", "")),
                float(entry.get("installed_at", 0)),
            )
    return found


def _claude_installed(home: Path) -> dict[str, Installed]:
    """Claude Code's installs (`{"version": 2, "plugins": {"name@marketplace": [{"installPath":
    …, "version": …}]}}`): the first whose folder exists, for each plugin."""
    path = claude_plugins_dir(home) / "installed_plugins.json"
    data = read_json_object(path, [], skipped="") or {}
    plugins = data.get("plugins")
    found: dict[str, Installed] = {}
    for ident, entries in plugins.items() if isinstance(plugins, dict) else ():
        for entry in entries if isinstance(entries, list) else [entries]:
            folder = entry.get("installPath") if isinstance(entry, dict) else None
            if isinstance(folder, str) and Path(folder).is_dir():
                version = str(entry.get("version", ""))
                found[ident] = Installed(ident, version, Path(folder), "", 0.0, by_claude=True)
                break
    return found


def _write_installed(found: dict[str, Installed]) -> None:
    data = {
        "version": 1,
        "plugins": {
            i.ident: {
                "version": i.version,
                "path": str(i.path),
                "digest": i.digest,
                "installed_at": i.installed_at,
            }
            for i in sorted(found.values(), key=lambda i: i.ident)
        },
    }
    _write_json(installed_file(), data)


def install(entry: Entry) -> Installed:
    """Copy `entry`'s plugin into the cache (again, when its files changed) and list it."""
    market = entry.marketplace
    ident = f"{entry.name}@{market.name}"
    with tempfile.TemporaryDirectory(prefix="keel-plugin-") as scratch:
        folder = _plugin_folder(entry, Path(scratch))
        warnings: list[str] = []
        manifest = read_manifest(folder, warnings)
        version = str(manifest.get("version") or entry.version or "")
        digest = _digest(folder, json.dumps(entry.components, sort_keys=True))
        version = version or f"sha-{digest[:12]}"
        target = plugins_home() / "cache" / _safe(market.name) / _safe(entry.name) / _safe(version)
        found = read_installed()
        old = found.get(ident)
        if old is None or old.digest != digest or not old.path.is_dir():
            if target.exists():
                shutil.rmtree(target)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copytree(folder, target, symlinks=True, ignore=shutil.ignore_patterns(".git"))
            _merge_components(target, entry)
            if old is not None and old.path != target and old.path.is_dir():
                shutil.rmtree(old.path)
        data_dir(entry.name, market.name).mkdir(parents=True, exist_ok=True)
        done = Installed(ident, version, target, digest, time.time())
        found[ident] = done
        _write_installed(found)
        return done


def _merge_components(target: Path, entry: Entry) -> None:
    """Write the components the marketplace entry names into the copy's manifest, where the
    plugin's own manifest does not name them (its own win)."""
    if not entry.components:
        return
    manifest = read_manifest(target, [])
    merged = {**dict(entry.components), **manifest}
    merged.setdefault("name", entry.name)
    (target / MANIFEST).parent.mkdir(parents=True, exist_ok=True)
    (target / MANIFEST).write_text(json.dumps(merged, indent=2) + "\n", encoding="utf-8")


def uninstall(ident: str) -> Installed:
    found = read_installed()
    gone = found.pop(ident, None)
    if gone is None:
        raise UserError(f"plugin {ident} is not installed", hint="`keel plugin list` shows them")
    if gone.path.is_dir():
        shutil.rmtree(gone.path)
    _write_installed(found)
    return gone


def _plugin_folder(entry: Entry, scratch: Path) -> Path:
    """The folder holding `entry`'s plugin: in the marketplace, or cloned into `scratch`."""
    market = entry.marketplace
    where = f"plugin {entry.name}@{market.name}"
    source = entry.source
    if isinstance(source, str):
        catalogue = read_json_object(market.folder / CATALOGUE, [], skipped="") or {}
        base = market.folder
        if not source.startswith(("./", "../")) and _plugin_root(catalogue):
            base = market.folder / _plugin_root(catalogue)
        folder = (base / source).resolve()
        if not folder.is_relative_to(market.folder.resolve()):
            raise UserError(f"{where}: its source {source!r} leads outside the marketplace")
        if not folder.is_dir():
            raise UserError(f"{where}: {folder} is not a folder")
        return folder
    if isinstance(source, dict) and source.get("source") in ("github", "url", "git-subdir"):
        kind = "github" if source["source"] == "github" else "git"
        location = source.get("repo") if kind == "github" else source.get("url")
        if not isinstance(location, str):
            raise UserError(f"{where}: its {source['source']} source names no repository")
        ref, sha = source.get("ref", ""), source.get("sha", "")
        clone(Source(kind, location, str(ref)), scratch / "clone", where, sha=str(sha))
        folder = scratch / "clone"
        subdir = source.get("path")
        if isinstance(subdir, str):
            folder = (folder / subdir).resolve()
            if not folder.is_relative_to((scratch / "clone").resolve()) or not folder.is_dir():
                raise UserError(f"{where}: path {subdir!r} is not a folder of the repository")
        return folder
    kind = str(source.get("source")) if isinstance(source, dict) else type(source).__name__
    raise UserError(
        f"{where}: source {kind!r} is not supported",
        hint="keel installs plugins from a marketplace folder, git and github",
    )


def _digest(folder: Path, extra: str) -> str:
    h = hashlib.sha256(extra.encode())
    for path in sorted(folder.rglob("*")):
        if ".git" in path.relative_to(folder).parts or not path.is_file():
            continue
        h.update(path.relative_to(folder).as_posix().encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()


# -- enabling, in keel's user settings ------------------------------------------------------------


def set_enabled(user_dir: Path, ident: str, enabled: bool | None) -> Path:
    """Write `enabledPlugins[ident]` into keel's user settings (None: remove it)."""
    path = user_dir / "settings.json"
    problems: list[str] = []
    data = read_json_object(path, problems, skipped="")
    if data is None and problems:
        raise UserError(problems[0].removesuffix("; "), hint="fix the file, then run it again")
    data = data or {}
    plugins = data.get("enabledPlugins")
    plugins = dict(plugins) if isinstance(plugins, dict) else {}
    if enabled is None:
        plugins.pop(ident, None)
    else:
        plugins[ident] = enabled
    if plugins:
        data["enabledPlugins"] = plugins
    else:
        data.pop("enabledPlugins", None)
    _write_json(path, data)
    return path


def _write_json(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)


def valid_name(name: str) -> bool:
    return bool(_NAME.match(name))


__all__ = [
    "CATALOGUE",
    "Entry",
    "Installed",
    "Marketplace",
    "Source",
    "claude_plugins_dir",
    "clone",
    "data_dir",
    "fetch_marketplace",
    "install",
    "known_marketplaces",
    "marketplace_folder",
    "parse_source",
    "plugins_home",
    "read_catalogue",
    "read_installed",
    "save_user_marketplace",
    "set_enabled",
    "source_from_argument",
    "uninstall",
    "user_marketplaces_file",
]
