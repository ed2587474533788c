"""`keel plugin …`: Claude Code plugins (docs/extensions.md, "Plugins").

`list` (the default) shows every plugin named in a settings file or installed, with its state:
on and running, on but not installed, waiting for approval (a project file turns it on), off.
`install NAME[@MARKETPLACE]` copies a plugin from a known marketplace into keel's cache and turns
it on in keel's user settings; `enable`, `disable` switch it there; `update [NAME@MARKETPLACE]`
fetches the marketplaces again and copies what changed; `uninstall` removes it.
`marketplace add SOURCE | list | remove NAME | update [NAME]` manage the user's own marketplaces
(a folder, a git URL or `owner/name`; kept in keel's config directory). A project's
`extraKnownMarketplaces` count once the user approved them (`keel trust approve settings`).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

from keel.config.settings import read_json_object, user_config_dir
from keel.errors import UserError
from keel.plugins import active, store

USAGE = (
    "usage: keel plugin [list | install NAME[@MARKETPLACE] | enable NAME@MARKETPLACE | "
    "disable NAME@MARKETPLACE | update [NAME@MARKETPLACE] | uninstall NAME@MARKETPLACE | "
    "marketplace add SOURCE | marketplace list | marketplace remove NAME | "
    "marketplace update [NAME]]"
)


def plugin(argv: list[str]) -> int:
    action, rest = (argv[0], argv[1:]) if argv else ("list", [])
    one = {"install", "enable", "disable", "uninstall"}
    if action == "marketplace":
        return _marketplace(rest)
    if (
        action not in (*one, "list", "update")
        or (action in one and len(rest) != 1)
        or (action == "list" and rest)
        or (action == "update" and len(rest) > 1)
    ):
        print(USAGE, file=sys.stderr)
        return 2
    cwd = Path.cwd()
    user_dir = user_config_dir()
    if action == "list":
        return _list(cwd, user_dir)
    if action == "install":
        return _install(cwd, user_dir, rest[0])
    if action == "update":
        return _update(cwd, user_dir, rest[0] if rest else None)
    ident = _ident(rest[0])
    if action == "uninstall":
        theirs = store.read_installed(Path.home()).get(ident)
        if ident not in store.read_installed() and theirs is not None and theirs.by_claude:
            raise UserError(
                f"plugin {ident} was installed by Claude Code ({theirs.path})",
                hint="`claude plugin uninstall` removes it; `keel plugin disable` turns it off "
                "for keel",
            )
        gone = store.uninstall(ident)
        store.set_enabled(user_dir, ident, None)
        print(f"uninstalled {ident} {gone.version}; its data folder is kept")
        return 0
    return _switch(cwd, user_dir, ident, on=action == "enable")


def _ident(text: str) -> str:
    if text.count("@") != 1 or not all(text.split("@")):
        raise UserError(
            f"{text!r} is not NAME@MARKETPLACE", hint="`keel plugin list` shows plugins by id"
        )
    return text


def _list(cwd: Path, user_dir: Path) -> int:
    found = active.load_plugins(cwd, user_dir=user_dir)
    if not found.states and not found.idle:
        print(
            "no plugins: `keel plugin marketplace add SOURCE`, then `keel plugin install "
            "NAME@MARKETPLACE`"
        )
        return 0
    print("\n".join(plugin_lines(found)))
    return 0


def plugin_lines(found: active.PluginSet, indent: str = "") -> list[str]:
    """Each plugin named here or installed, with its state and what it brings, then the
    warnings about them (for `keel plugin list`, `keel doctor` and `keel trust list`)."""
    running = {p.ident: p for p in found.active}
    lines: list[str] = []
    for state in found.states:
        lines.append(f"{indent}{state.ident}: {_state(state)}")
        plugin = running.get(state.ident)
        if plugin is not None:
            lines.append(f"{indent}  brings: {', '.join(plugin.brings()) or 'nothing keel reads'}")
    for idle in found.idle:
        lines.append(f"{indent}{idle.ident}: installed {idle.version}, not enabled anywhere")
    lines += [f"{indent}warning: {w}" for w in found.warnings]
    return lines


def _state(state: active.PluginState) -> str:
    where = f" in {state.file}" if state.file is not None else ""
    installed = "not installed"
    if state.installed is not None:
        by = " by Claude Code" if state.installed.by_claude else ""
        installed = f"installed{by} {state.installed.version}"
    if not state.enabled:
        text = f"disabled{where}; {installed}" if state.file is not None else f"off; {installed}"
    elif state.installed is None:
        text = f"enabled{where}; not installed: `keel plugin install {state.ident}`"
    else:
        scope = "your settings" if state.user_level else "a project file you approved"
        text = f"runs ({installed}; enabled{where}, {scope})"
    for file, on in state.waiting:
        text += f"; WAITS FOR APPROVAL: {file} turns it {'on' if on else 'off'}"
    return text


def _markets(cwd: Path, user_dir: Path) -> dict[str, store.Marketplace]:
    settings = active.settings_for(cwd, user_dir=user_dir, home=Path.home())
    warnings: list[str] = []
    markets = store.known_marketplaces(user_dir, settings.marketplaces, warnings, home=Path.home())
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    return markets


def _find(cwd: Path, user_dir: Path, text: str) -> store.Entry:
    """The marketplace entry `NAME@MARKETPLACE` (or `NAME`, when one marketplace has it)."""
    name, _, market_name = text.partition("@")
    markets = _markets(cwd, user_dir)
    if market_name and market_name not in markets:
        raise UserError(
            f"no marketplace named {market_name} here",
            hint="`keel plugin marketplace add SOURCE` adds one; `keel trust list` shows a "
            "project's that wait for approval",
        )
    # Without a marketplace named, only those already on this machine are looked through (a
    # git one is fetched only when named).
    chosen = (
        [markets[market_name]]
        if market_name
        else [m for m in markets.values() if (m.folder / store.CATALOGUE).is_file()]
    )
    entries: list[store.Entry] = []
    for market in chosen:
        store.fetch_marketplace(market, refresh=False)
        entries += [e for e in store.read_catalogue(market) if e.name == name]
    if not entries:
        where = market_name or ", ".join(m.name for m in chosen) or "no fetched marketplace"
        raise UserError(
            f"no plugin named {name} in {where}",
            hint="`keel plugin marketplace list` shows what each offers; "
            "NAME@MARKETPLACE fetches that marketplace first",
        )
    if len(entries) > 1:
        ids = ", ".join(f"{e.name}@{e.marketplace.name}" for e in entries)
        raise UserError(f"{name} is in more than one marketplace: {ids}", hint="name one")
    return entries[0]


def _install(cwd: Path, user_dir: Path, text: str) -> int:
    entry = _find(cwd, user_dir, text)
    done = store.install(entry)
    settings = active.settings_for(cwd, user_dir=user_dir, home=Path.home())
    on, file = settings.enabled_plugins.get(done.ident, (False, None))
    if not on:
        file = store.set_enabled(user_dir, done.ident, True)
    print(f"installed {done.ident} {done.version} into {done.path}")
    print(f"enabled in {file}; it runs from the next session")
    return 0


def _update(cwd: Path, user_dir: Path, text: str | None) -> int:
    installed = store.read_installed()
    idents = [_ident(text)] if text else sorted(installed)
    if text and text not in installed:
        raise UserError(f"plugin {text} is not installed", hint=f"`keel plugin install {text}`")
    markets = _markets(cwd, user_dir)
    refreshed: set[str] = set()
    for ident in idents:
        name, _, market_name = ident.partition("@")
        market = markets.get(market_name)
        if market is None:
            print(f"{ident}: marketplace {market_name} is not known here; not updated")
            continue
        store.fetch_marketplace(market, refresh=market.name not in refreshed)
        refreshed.add(market.name)
        entry = next((e for e in store.read_catalogue(market) if e.name == name), None)
        if entry is None:
            print(f"{ident}: no longer in marketplace {market_name}; kept as it is")
            continue
        old = installed[ident]
        new = store.install(entry)
        changed = new.digest != old.digest
        print(f"{ident}: {f'updated {old.version} -> {new.version}' if changed else 'up to date'}")
    if not idents:
        print("no plugins installed")
    return 0


def _switch(cwd: Path, user_dir: Path, ident: str, *, on: bool) -> int:
    if on and ident not in store.read_installed(Path.home()):
        raise UserError(f"plugin {ident} is not installed", hint=f"`keel plugin install {ident}`")
    path = store.set_enabled(user_dir, ident, on)
    settings = active.settings_for(cwd, user_dir=user_dir, home=Path.home())
    now, file = settings.enabled_plugins.get(ident, (on, path))
    print(f"{'enabled' if on else 'disabled'} {ident} in {path}; from the next session")
    if now != on and file is not None:
        print(
            f"note: {file} says otherwise and wins here (a later settings file); "
            f"`keel trust revoke settings` takes back a project file's approval"
        )
    return 0


def _marketplace(argv: list[str]) -> int:
    action, rest = (argv[0], argv[1:]) if argv else ("list", [])
    if (
        action not in ("add", "list", "remove", "update")
        or (action in ("add", "remove") and len(rest) != 1)
        or (action == "list" and rest)
        or (action == "update" and len(rest) > 1)
    ):
        print(USAGE, file=sys.stderr)
        return 2
    cwd = Path.cwd()
    user_dir = user_config_dir()
    if action == "add":
        return _add(cwd, user_dir, rest[0])
    markets = _markets(cwd, user_dir)
    if action == "remove":
        own = read_json_object(store.user_marketplaces_file(user_dir), [], skipped="") or {}
        if rest[0] not in own:
            raise UserError(
                f"you added no marketplace named {rest[0]}",
                hint="`keel plugin marketplace list` shows them",
            )
        store.save_user_marketplace(user_dir, rest[0], None)
        print(f"removed marketplace {rest[0]}; plugins installed from it stay installed")
        return 0
    if action == "update":
        if rest and rest[0] not in markets:
            raise UserError(
                f"no marketplace named {rest[0]} here",
                hint="`keel plugin marketplace list` shows them",
            )
        # Without a name: those already on this machine (a git one is fetched only when named).
        chosen = (
            [markets[rest[0]]]
            if rest
            else [m for m in markets.values() if (m.folder / store.CATALOGUE).is_file()]
        )
        for market in chosen:
            store.fetch_marketplace(market, refresh=True)
            print(f"{market.name}: fetched")
        return 0
    if not markets:
        print("no marketplaces: `keel plugin marketplace add SOURCE` adds one")
    for market in markets.values():
        print(f"{market.name}: {market.source.kind} {market.source.describe()} ({market.origin})")
        if not (market.folder / store.CATALOGUE).is_file():
            print(f"  not fetched yet: `keel plugin marketplace update {market.name}` fetches it")
            continue
        for entry in store.read_catalogue(market):
            about = f" {entry.version}" if entry.version else ""
            print(f"  {entry.name}{about}: {entry.description}")
    return 0


def _add(cwd: Path, user_dir: Path, text: str) -> int:
    source = store.source_from_argument(text, cwd)
    origin = str(store.user_marketplaces_file(user_dir))
    if source.kind == "directory":
        return _added(user_dir, store.Marketplace("", source, origin, Path(source.location)))
    with tempfile.TemporaryDirectory(prefix="keel-marketplace-") as scratch:
        clone = Path(scratch) / "clone"
        store.clone(source, clone, f"marketplace {text}")
        market = store.Marketplace("", source, origin, clone)
        name = _name(market)
        final = store.marketplace_folder(name, source)
        if final.exists():
            shutil.rmtree(final)
        final.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(clone, final)
    return _added(user_dir, store.Marketplace(name, source, origin, final))


def _name(market: store.Marketplace) -> str:
    """The name a marketplace's catalogue gives it."""
    store.fetch_marketplace(market, refresh=False)
    data = read_json_object(market.folder / store.CATALOGUE, [], skipped="") or {}
    name = data.get("name")
    if not isinstance(name, str) or not store.valid_name(name):
        raise UserError(
            f"{market.folder / store.CATALOGUE}: needs a name (letters, digits, - _ .)",
            hint="a marketplace.json names its marketplace",
        )
    return name


def _added(user_dir: Path, market: store.Marketplace) -> int:
    name = market.name or _name(market)
    store.save_user_marketplace(user_dir, name, market.source)
    count = len(store.read_catalogue(market))
    source = market.source
    print(f"added marketplace {name} ({source.kind} {source.describe()}): {count} plugin(s)")
    return 0
