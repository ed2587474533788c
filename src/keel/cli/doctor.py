"""`keel doctor`: what keel sees on this machine: version, Python, settings files (and what was
skipped, and why), provider keys (by name only, never the value), ripgrep, whether the bash
sandbox really starts, every permission rule with its file, and what project settings wait for
approval. Exit 0 when everything needed to work is there, 1 otherwise (a settings file that
cannot be read, a sandbox that does not start)."""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from keel import __version__
from keel.config.settings import Settings, load_settings, settings_files
from keel.session.store import keel_home

if TYPE_CHECKING:
    from keel.config.foreign import Found

KEY_VARIABLES = (
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "OPENAI_API_KEY",
    "OPENAI_COMPATIBLE_BASE_URL",
)


def doctor(argv: list[str]) -> int:
    if argv:
        print("usage: keel doctor", file=sys.stderr)
        return 2
    from keel.config.foreign import load_foreign
    from keel.config.intake import intake_for
    from keel.permissions.sandbox import probe
    from keel.tools.builtin.search import ripgrep

    cwd = Path.cwd()
    settings = load_settings(cwd)
    foreign = load_foreign(intake_for(cwd))
    ok = True
    print(f"keel {__version__} on Python {platform.python_version()} ({sys.platform})")
    print(f"sessions: {keel_home() / 'sessions'}")
    print("settings files:")
    broken = _settings_files(cwd, settings, shown_below=set(foreign.unused_lines()))
    if broken:
        ok = False
    present = [v for v in KEY_VARIABLES if os.environ.get(v)]
    print(f"provider keys: {', '.join(present) if present else 'none set'}")
    if settings.model:
        print(f"default model: {settings.model}")
    rg = ripgrep()
    print(f"ripgrep: {rg or 'not installed (grep and glob use a slower built-in search)'}")
    if settings.sandbox:
        result = probe()
        print(f"sandbox: {'ok' if result.ok else 'NOT AVAILABLE'}: {result.detail}")
        if result.ok:
            _hidden(settings)
        if not result.ok:
            print("  without it, every bash command asks for permission (headless runs deny them)")
            ok = False
    else:
        print(
            "sandbox: turned off in settings (sandbox.enabled: false); every bash command asks "
            "for permission (headless runs deny them)"
        )
    print(
        f"permission mode: {settings.default_mode or 'default'}; "
        f"{len(settings.allow)} allow, {len(settings.ask)} ask and {len(settings.deny)} deny "
        "rules in settings"
    )
    for effect, rules in (
        ("allow", settings.allow),
        ("ask", settings.ask),
        ("deny", settings.deny),
    ):
        for rule, source in rules:
            print(f"  {effect} {rule}  ({source})")
    _trust(settings)
    _project_files(cwd, settings)
    _hooks(cwd)
    _plugins(cwd, settings)
    _language_servers(cwd, settings)
    _foreign(foreign.found)
    _instructions(cwd)
    return 0 if ok else 1


def _settings_files(cwd: Path, settings: Settings, *, shown_below: set[str]) -> bool:
    """Each settings file: loaded, missing, or skipped with why (the warning that named it);
    then the other warnings but those `shown_below`. True when a file that is there could not
    be read (broken)."""
    said: set[str] = set(shown_below)
    broken = False
    for path in settings_files(cwd):
        if path in settings.files:
            print(f"  loaded   {path}")
            continue
        if not path.exists():
            print(f"  missing  {path}")
            continue
        why = [w for w in settings.warnings if w.startswith(f"{path}:")]
        said.update(why)
        if why:
            broken = True
            for reason in why:
                print(f"  skipped  {reason.removesuffix('; file skipped')}")
        else:  # the sandbox's placeholder for a missing protected file
            print(f"  skipped  {path}: an empty folder in its place (read as missing)")
    for warning in settings.warnings:
        if warning not in said:
            print(f"  warning: {warning}")
    return broken


def _hooks(cwd: Path) -> None:
    """How many hooks apply, and every Claude Code hook event or type keel does not run."""
    from keel.config.settings import user_config_dir
    from keel.hooks.config import load_hooks

    config = load_hooks(cwd, keel_user_dir=user_config_dir())
    print(f"hooks: {len(config.hooks)} configured (`keel hooks list` shows them)")
    for file, event, count in config.unsupported:
        print(
            f"  not supported: {event} ({count} hook(s) in {file}): a Claude Code event keel does not run"
        )
    for warning in config.warnings:
        # A file that cannot be read was named under "settings files" already.
        if "does not support" not in warning and warning not in config.unreadable:
            print(f"  warning: {warning}")


def _plugins(cwd: Path, settings: Settings) -> None:
    """Each Claude Code plugin named or installed here: its state, the settings file that turns
    it on, what it brings, and what waits for approval or installation."""
    from keel.cli.plugin import plugin_lines
    from keel.config.settings import user_config_dir
    from keel.plugins import load_plugins

    found = load_plugins(cwd, user_dir=user_config_dir(), settings=settings)
    if not found.states and not found.idle:
        return
    print(f"plugins: {len(found.active)} of {len(found.states) + len(found.idle)} run here")
    for line in plugin_lines(found, "  "):
        print(line)


def _language_servers(cwd: Path, settings: Settings) -> None:
    """Which language servers would report errors after edits here (docs/lsp.md)."""
    if not settings.lsp_enabled or os.environ.get("KEEL_LSP") == "0":
        print("language servers: off (the lsp setting, or KEEL_LSP=0)")
        return
    from keel.lsp.servers import load_specs, plugin_servers

    warnings: list[str] = []
    specs = load_specs(
        [(str(path), servers) for path, servers in settings.lsp_servers],
        plugins=plugin_servers(cwd, os.environ, warnings),
        warnings=warnings,
    )
    ready = [s for s in specs if s.available()]
    print(f"language servers: {len(ready)} of {len(specs)} installed (docs/lsp.md)")
    for spec in specs:
        files = " ".join(ext for ext, _ in spec.languages)
        state = "ready" if spec in ready else f"{spec.command} not on PATH"
        print(f"  {spec.name}: {state} ({files}; {spec.source})")
    for warning in warnings:
        print(f"  warning: {warning}")


def _foreign(found: list[Found]) -> None:
    """Every Codex and OpenCode file found, the user's and the project's, with what keel took
    from it and what it does not use."""
    if not found:
        print("Codex and OpenCode files: none")
        return
    print(f"Codex and OpenCode files ({len(found)}):")
    for f in found:
        whose = "came with the project" if f.supplied else "yours"
        print(f"  {f.path} [{f.tool}, {whose}]: {'; '.join(f.took) or 'nothing keel uses'}")
        if f.unused or f.notes:
            print(f"    {f.line().removeprefix(f'{f.path}: ')}")


def _hidden(settings: Settings) -> None:
    """The credential stores on this machine that sandboxed commands cannot read."""
    from keel.permissions.sandbox import hidden_candidates, hidden_targets
    from keel.permissions.setup import hidden_settings, project_root

    hide, unhide = hidden_settings(settings)
    found = hidden_targets(hidden_candidates(hide=hide, unhide=unhide), project_root(Path.cwd()))
    home = Path.home()
    shown = [f"~/{p.relative_to(home)}" if p.is_relative_to(home) else str(p) for p in found]
    print(
        f"  hides {len(found)} credential store(s) found here from sandboxed commands"
        f"{': ' + ', '.join(shown) if shown else ''} (sandbox.hide and sandbox.unhide in "
        "your settings change the list)"
    )


def _project_files(cwd: Path, settings: Settings) -> None:
    """Every configuration file the project brings, at any depth, with its verdict."""
    from keel.app.project_files import project_report, report_lines
    from keel.config.settings import user_config_dir

    report = project_report(cwd, settings, user_dir=user_config_dir())
    for line in report_lines(report):
        print(line)


def _trust(settings: Settings) -> None:
    """What came with the project and waits for the user's approval (`keel trust`)."""
    waiting = [p for p in settings.pending if not p.approved]
    approved = len(settings.pending) - len(waiting)
    if not settings.pending:
        print("project settings: nothing that needs approval")
        return
    print(
        f"project settings: {approved} file(s) approved, {len(waiting)} waiting "
        "(`keel trust list` shows them, `keel trust approve` applies them)"
    )
    for pending in waiting:
        for entry in pending.entries:
            print(f"  not applied: {pending.path}: {entry.line()}")


def _instructions(cwd: Path) -> None:
    """The instruction files sent in the context, with their `@path` imports."""
    from keel.agent.prompt import load_instructions, load_rules, rule_dirs
    from keel.config.settings import user_config_dir

    loaded = load_instructions(cwd, user_dir=user_config_dir())
    count = len(loaded.files)
    print(f"instructions: {count} file(s) in the context" if count else "instructions: none")
    for f in loaded.files:
        via = f"  (imported by {f.imported_from})" if f.imported_from is not None else ""
        print(f"  {'  ' * f.depth}{f.path}{via}")
    for warning in loaded.warnings:
        print(f"  warning: {warning}")
    dirs = rule_dirs(cwd, user_dir=user_config_dir())
    scoped = [r for d in dirs for r in load_rules(d, []) if r.patterns]
    if scoped:
        print(f"rules sent when the model reads or edits a matching file: {len(scoped)}")
        for rule in scoped:
            print(f"  {rule.path} ({', '.join(rule.patterns)})")
