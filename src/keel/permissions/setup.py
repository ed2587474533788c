"""Permissions as every front end gets them: the gate (mode, the settings' rules, the caller's
extra rules, `additionalDirectories`) and the bash sandbox when it works here, with one line
saying so when bash will run unsandboxed (why, and how to fix it).

`keel -p`, the terminal UI and line mode (through `keel.app.assembly.build_gate`) and a library
`Agent` built without a gate all come through `build_permissions`, so the library is exactly as
safe by default as `keel -p`. The public spellings are on `Permissions`: `from_settings(cwd)`,
`ask(asker)` and `allow_all()`, the last being the only way to run everything unasked.

Front-end neutral: nothing here prints or asks. What it has to say goes to a `notice` callback
(or waits on the gate's `notices` for the `Agent` to emit); asking is the caller's `asker`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from keel.config.settings import Settings, load_settings
from keel.llm.events import Notice
from keel.permissions.gate import AllowAll, Asker, Mode, PermissionGate, parse_mode
from keel.permissions.rules import Rule, settings_rules
from keel.permissions.sandbox import DEFAULT_ENV_DENY, Sandbox, probe

#: What a denied question tells the model when a library `Agent` has nobody to ask.
LIBRARY_HINT = (
    "permission needed, but this Agent has nobody to ask; the program using keel can pass "
    "gate=Permissions.ask(asker) to answer such questions, add allow rules to the settings, or "
    "pass gate=Permissions.allow_all() to run everything unasked"
)


def build_permissions(
    cwd: Path,
    settings: Settings,
    *,
    mode: str | None = None,
    extra_rules: Iterable[Rule] = (),
    asker: Asker | None = None,
    notice: Callable[[Notice], None] | None = None,
    headless_hint: str | None = None,
) -> PermissionGate:
    """The gate for `cwd` as `settings` say (mode `mode`, else the settings' default, else
    `default`), with `extra_rules` after the settings' (flags such as `--allowed-tools`), and the
    bash sandbox attached when it works here. Without `notice`, rule warnings and the sandbox
    status wait on `gate.notices`."""
    notices: list[Notice] = []
    say = notice if notice is not None else notices.append
    rules: list[Rule] = []
    for parsed, warnings in (
        settings_rules(settings.deny, "deny"),
        settings_rules(settings.ask, "ask"),
        settings_rules(settings.allow, "allow"),
    ):
        rules += parsed
        for warning in warnings:
            say(Notice(warning, "warning"))
    rules += list(extra_rules)
    chosen = parse_mode(mode or settings.default_mode or "default")
    root = project_root(cwd)
    extra = tuple(path for path, _ in settings.additional_dirs)
    sandbox, why_not = sandbox_for(root, settings, extra_writable=extra)
    if why_not is not None:
        say(Notice(unsandboxed_line(why_not, chosen), "warning"))
    gate = PermissionGate(
        chosen,
        root,
        cwd,
        rules,
        sandboxed=sandbox is not None,
        sandbox=sandbox,
        asker=asker,
        extra_roots=extra,
        notices=notices,
    )
    if headless_hint is not None:
        gate.headless_hint = headless_hint
    return gate


def project_root(cwd: Path) -> Path:
    """The enclosing git work tree (`keel.config.intake.find_root`, as every loader finds it),
    else `cwd`."""
    from keel.config.intake import find_root

    return find_root(cwd) or cwd


def sandbox_for(
    root: Path, settings: Settings, *, extra_writable: tuple[Path, ...] = ()
) -> tuple[Sandbox | None, str | None]:
    """The bash sandbox for project `root`, or None and why there is none (with the fix)."""
    if not settings.sandbox:
        return None, (
            "the sandbox is turned off in your settings (sandbox.enabled: false; remove it to "
            "turn it back on)"
        )
    result = probe()
    if not result.ok:
        return None, result.detail
    hide, unhide = hidden_settings(settings)
    sandbox = Sandbox(
        root,
        network=settings.sandbox_network,
        env_deny=(*DEFAULT_ENV_DENY, *settings.sandbox_env_deny),
        env_passthrough=settings.sandbox_env_passthrough,
        hide=hide,
        unhide=unhide,
    )
    if extra_writable:
        sandbox.extra_writable = (*sandbox.extra_writable, *extra_writable)
    return sandbox, None


def hidden_settings(settings: Settings) -> tuple[tuple[Path, ...], tuple[Path, ...]]:
    """`sandbox.hide` and `sandbox.unhide` as paths, `~` expanded."""
    return (
        tuple(Path(p).expanduser() for p in settings.sandbox_hide),
        tuple(Path(p).expanduser() for p in settings.sandbox_unhide),
    )


def unsandboxed_line(why: str, mode: Mode) -> str:
    """The one line every front end shows at start when bash will run without a sandbox."""
    if mode == "bypass":
        return f"no sandbox: {why}; in bypass mode bash commands run unsandboxed and unasked"
    return f"no sandbox: {why}; commands will need permission"


class Permissions:
    """The ways to give an `Agent` its permissions (`Agent(..., gate=...)`):

    - `Permissions.from_settings(cwd)`: what `keel -p` gets, and what an `Agent` without a gate
      gets: mode `default`, the settings' rules for `cwd`, the sandbox when it works here;
      nobody to ask, so what would ask is denied (the model is told how to allow it).
    - `Permissions.ask(asker)`: the same, with `asker` answering the questions.
    - `Permissions.allow_all()`: every call runs, unasked, and bash without a sandbox.
    """

    @staticmethod
    def from_settings(
        cwd: Path | None = None,
        *,
        mode: Mode | None = None,
        asker: Asker | None = None,
        env: Mapping[str, str] | None = None,
    ) -> PermissionGate:
        where = (cwd or Path.cwd()).resolve()
        settings = load_settings(where, env)
        gate = build_permissions(
            where, settings, mode=mode, asker=asker, headless_hint=LIBRARY_HINT
        )
        gate.notices[:0] = [Notice(warning, "warning") for warning in settings.warnings]
        return gate

    @staticmethod
    def ask(
        asker: Asker,
        *,
        cwd: Path | None = None,
        mode: Mode | None = None,
        env: Mapping[str, str] | None = None,
    ) -> PermissionGate:
        return Permissions.from_settings(cwd, mode=mode, asker=asker, env=env)

    @staticmethod
    def allow_all() -> AllowAll:
        return AllowAll()


__all__ = [
    "LIBRARY_HINT",
    "Permissions",
    "build_permissions",
    "hidden_settings",
    "project_root",
    "sandbox_for",
    "unsandboxed_line",
]
