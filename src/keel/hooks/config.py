"""Hook configuration in Claude Code's format, from every settings file that may hold hooks, and
which of them may run.

`{"hooks": {Event: [{"matcher": regex, "hooks": [{"type": "command", "command": …, "timeout": s}]}]}}`

Handler types: `command` (run with bash; `async` / `asyncRewake` run it in the background),
`http` (the payload POSTed as JSON to `url`, with `headers` whose `$VAR`s are filled only from
`allowedEnvVars`) and `prompt` (a model answers `{"ok": …, "reason": …}`; `model` picks it,
else the `hooks_model` setting, else the session's).
Claude Code's other types (`agent`, `mcp_tool`) and events keel does not run are reported with
the file, never skipped silently (keel.hooks.claude lists Claude Code's events).

Sources: the settings files (`keel.config.intake`): the user's own (`~/.claude/settings.json`,
keel's user settings) are "personal"; every project file, both spellings, shared or "local", at
any directory from the project root down to the working directory, came with the project and is
"shared", whatever git says of it. Shared hooks run only once approved: the approval is a hash
of their configuration, kept in the user's own config directory (never in the project), so
changing a shared hook needs a new approval. Until then a shared guard (a `command` hook of
PreToolUse or PermissionRequest) still runs, as `guard_only`: in a read-only sandbox, with only
its blocking answers honoured (`HookConfig.guards`). A problem in one entry is reported with its
file and skipped; the rest load.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from dataclasses import field
from pathlib import Path
from typing import Any, Literal

from keel.config.intake import intake_for
from keel.config.settings import read_json_object
from keel.config.trust import approvals_file, approve, approved_pins, read_approvals
from keel.frozen import frozen, mutable
from keel.hooks.claude import CLAUDE_EVENTS, EVENTS, UNSUPPORTED_EVENTS

DEFAULT_TIMEOUT = 60.0
#: Claude Code's default for a prompt hook.
PROMPT_TIMEOUT = 30.0
MAX_TIMEOUT = 86_400.0
#: Handler types keel runs; Claude Code's others are reported.
KINDS = ("command", "http", "prompt")
CLAUDE_ONLY_KINDS = ("agent", "mcp_tool")
#: Claude Code hook options keel does not honour (named in a warning; `statusMessage` is only
#: cosmetic and accepted quietly).
IGNORED_KEYS = ("once", "if", "shell")

Source = Literal["personal", "shared"]


@frozen
class HookCommand:
    event: str
    matcher: str
    command: str
    timeout: float
    source: Source
    file: str
    #: `command` (the command line is `command`), `http` (`command` is the URL) or `prompt`
    #: (`command` is the prompt).
    kind: str = "command"
    #: http: request headers (after `$VAR` interpolation from `allowed_env`).
    headers: tuple[tuple[str, str], ...] = ()
    allowed_env: tuple[str, ...] = ()
    #: prompt: the model that decides ("" = the `hooks_model` setting, else the session's).
    model: str = ""
    #: An unapproved project guard: it runs in a read-only sandbox without network or secrets,
    #: and only its blocking answers (deny, ask, exit 2) count.
    guard_only: bool = False
    #: `async`: runs in the background and blocks nothing; `rewake` (`asyncRewake`): the same,
    #: and its exit 2 wakes the model with its stderr ("" = runs in the foreground).
    background: Literal["", "async", "rewake"] = ""
    #: The plugin (`name@marketplace`) it came with ("" for a settings file's hook), and what
    #: its command gets in its environment (`CLAUDE_PLUGIN_ROOT`, `CLAUDE_PLUGIN_DATA`).
    plugin: str = ""
    env: tuple[tuple[str, str], ...] = ()

    @property
    def label(self) -> str:
        return self.command if self.kind == "command" else f"{self.kind}: {self.command}"

    def pin(self) -> tuple[Any, ...]:
        """What an approval covers: everything that decides what the hook does."""
        base: tuple[Any, ...] = (self.event, self.matcher, self.command, self.timeout)
        if self.background:
            base += (self.background,)
        if self.kind == "command":
            return base  # as before: existing approvals stay valid
        return (*base, self.kind, list(self.headers), list(self.allowed_env), self.model)

    @property
    def can_guard(self) -> bool:
        """A guard that may run before its project is approved (`HookConfig.guards`)."""
        return self.event in GUARD_ONLY_EVENTS and self.kind == "command" and not self.background

    def matches(self, value: str) -> bool:
        """Claude Code's matcher: case-insensitive and anchored; empty or `*` matches all; an
        invalid regex falls back to an exact comparison."""
        if self.matcher in ("", "*"):
            return True
        try:
            return re.fullmatch(f"(?:{self.matcher})", value, re.IGNORECASE) is not None
        except re.error:
            return self.matcher == value


@mutable
class HookConfig:
    hooks: list[HookCommand] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    #: The warnings (also in `warnings`) about a settings file that could not be read at all:
    #: the settings loader says the same of the same file, so a front end that shows its
    #: warnings leaves these out.
    unreadable: list[str] = field(default_factory=list)
    #: Claude Code events keel does not run, as (file, event, number of hooks).
    unsupported: list[tuple[str, str, int]] = field(default_factory=list)

    def for_event(self, event: str) -> list[HookCommand]:
        return [h for h in self.hooks if h.event == event]

    def shared_hash(self) -> str:
        """The approval pin of the shared hooks (empty when there are none)."""
        shared = [h.pin() for h in self.hooks if h.source == "shared"]
        if not shared:
            return ""
        return hashlib.sha256(json.dumps(sorted(shared)).encode()).hexdigest()[:16]

    def runnable(self, approved: set[str]) -> list[HookCommand]:
        """Personal hooks, and shared ones if their pin is approved."""
        ok = self.shared_hash() in approved
        return [h for h in self.hooks if h.source == "personal" or ok]

    def guards(self, approved: set[str]) -> list[HookCommand]:
        """The shared guard hooks that wait for approval, marked `guard_only`: a project's
        PreToolUse and PermissionRequest command hooks protect the user from the model before
        anyone approved them, but may only block."""
        if not self.shared_hash() or self.shared_hash() in approved:
            return []
        return [
            dataclasses.replace(h, guard_only=True)
            for h in self.hooks
            if h.source == "shared" and h.can_guard
        ]


#: Events whose unapproved project hooks still run, sandboxed, for their blocking answers.
GUARD_ONLY_EVENTS = ("PreToolUse", "PermissionRequest")


def hook_files(cwd: Path, *, keel_user_dir: Path, home: Path) -> list[tuple[Path, Source]]:
    """The settings files (`keel.config.intake.Intake.settings_files`, in their order) and
    whether each is shared: every file that came with the project is."""
    intake = intake_for(cwd, user_dir=keel_user_dir, home=home)
    return [
        (path, "shared" if intake.supplied(path) else "personal")
        for path in intake.settings_files()
    ]


def _entries(data: Any, path: Path, source: Source, config: HookConfig) -> None:
    w = config.warnings
    if not isinstance(data, dict):
        w.append(f"{path}: hooks must be an object keyed by event; skipped")
        return
    for event, groups in data.items():
        if event in UNSUPPORTED_EVENTS:
            count = _count(groups)
            config.unsupported.append((str(path), event, count))
            w.append(
                f"{path}: hooks.{event}: {event} is a Claude Code hook event keel does not "
                f"support; its {count} hook(s) will not run"
            )
            continue
        if event not in EVENTS:
            import difflib  # only for a misspelt event's suggestion: ~6 ms of start-up

            close = difflib.get_close_matches(str(event), CLAUDE_EVENTS, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}?" if close else f"keel runs: {', '.join(EVENTS)}"
            w.append(
                f"{path}: unknown hook event {event!r} skipped: not a Claude Code event ({hint})"
            )
            continue
        if not isinstance(groups, list):
            w.append(f"{path}: hooks.{event} must be a list; skipped")
            continue
        for i, group in enumerate(groups):
            where = f"{path}: hooks.{event}[{i}]"
            if not isinstance(group, dict) or not isinstance(group.get("hooks", []), list):
                w.append(f"{where} must be an object with a hooks list; skipped")
                continue
            matcher = str(group.get("matcher", "") or "")
            for j, hook in enumerate(group.get("hooks", [])):
                _hook(hook, f"{where}.hooks[{j}]", event, matcher, path, source, config)


def _count(groups: Any) -> int:
    if not isinstance(groups, list):
        return 0
    return sum(
        len(g["hooks"]) for g in groups if isinstance(g, dict) and isinstance(g.get("hooks"), list)
    )


def _hook(
    hook: Any, where: str, event: str, matcher: str, path: Path, source: Source, config: HookConfig
) -> None:
    w = config.warnings
    if not isinstance(hook, dict):
        w.append(f"{where} must be an object; skipped")
        return
    kind = hook.get("type", "command")
    if kind in CLAUDE_ONLY_KINDS:
        w.append(
            f"{where}: hook type {kind!r} is a Claude Code hook type keel does not run "
            f"(keel runs: {', '.join(KINDS)}); skipped"
        )
        return
    if kind not in KINDS:
        w.append(f"{where}: hook type {kind!r} is not supported ({', '.join(KINDS)}); skipped")
        return
    key = {"command": "command", "http": "url", "prompt": "prompt"}[kind]
    value = hook.get(key)
    if not isinstance(value, str) or not value.strip():
        w.append(f"{where} needs a {key}; skipped")
        return
    if kind == "http" and not re.match(r"https?://", value):
        w.append(f"{where}: url must start with http:// or https://; skipped")
        return
    background: Literal["", "async", "rewake"] = ""
    if hook.get("async") is True or hook.get("asyncRewake") is True:
        background = "rewake" if hook.get("asyncRewake") is True else "async"
    if background and kind != "command":
        w.append(f"{where}: async runs only command hooks; this {kind} hook runs in the foreground")
        background = ""
    ignored = sorted(k for k in IGNORED_KEYS if k in hook)
    if ignored:
        waits = " in the background" if background else " and keel waits for it"
        w.append(
            f"{where}: {', '.join(ignored)} not supported by keel; the hook runs on every "
            f"match{waits}"
        )
    default = PROMPT_TIMEOUT if kind == "prompt" else DEFAULT_TIMEOUT
    timeout = hook.get("timeout", default)
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not 0 < timeout <= MAX_TIMEOUT
    ):
        w.append(f"{where}: timeout must be 1-86400 seconds; using {default:g}")
        timeout = default
    headers: list[tuple[str, str]] = []
    raw_headers = hook.get("headers", {})
    if kind == "http" and isinstance(raw_headers, dict):
        headers = [(str(k), str(v)) for k, v in raw_headers.items()]
    elif kind == "http":
        w.append(f"{where}: headers must be an object; sent without headers")
    allowed = hook.get("allowedEnvVars", [])
    allowed_env = tuple(str(v) for v in allowed) if isinstance(allowed, list) else ()
    model = hook.get("model", "")
    config.hooks.append(
        HookCommand(
            event,
            matcher,
            value,
            float(timeout),
            source,
            str(path),
            kind=kind,
            headers=tuple(headers),
            allowed_env=allowed_env,
            model=model if isinstance(model, str) else "",
            background=background,
        )
    )


def load_hooks(cwd: Path, *, keel_user_dir: Path, home: Path | None = None) -> HookConfig:
    """The hooks of every settings file read for a run in `cwd` (the working directory)."""
    config = HookConfig()
    for path, source in hook_files(cwd, keel_user_dir=keel_user_dir, home=home or Path.home()):
        problems: list[str] = []
        data = read_json_object(path, problems, skipped="its hooks skipped")
        config.warnings += problems
        config.unreadable += problems
        if data is not None and "hooks" in data:
            _entries(data["hooks"], path, source, config)
    _plugin_hooks(cwd, keel_user_dir, home or Path.home(), config)
    return config


def _plugin_hooks(cwd: Path, user_dir: Path, home: Path, config: HookConfig) -> None:
    """The hooks of the plugins that run here (`keel.plugins`): the user's own, as if in their
    settings (a plugin turned on by a project file runs only once the user approved that), with
    `${CLAUDE_PLUGIN_ROOT}` filled in and the plugin's variables in their environment."""
    from keel.plugins import plugin_components

    for plugin in plugin_components(cwd, user_dir=user_dir, home=home):
        for path, data in plugin.hooks:
            first = len(config.hooks)
            _entries(data, path, "personal", config)
            config.hooks[first:] = [
                dataclasses.replace(
                    h,
                    command=plugin.expand(h.command),
                    plugin=plugin.ident,
                    env=tuple(plugin.env().items()),
                )
                for h in config.hooks[first:]
            ]


__all__ = [
    "CLAUDE_EVENTS",
    "EVENTS",
    "GUARD_ONLY_EVENTS",
    "UNSUPPORTED_EVENTS",
    "HookCommand",
    "HookConfig",
    "approvals_file",
    "approve",
    "approved_pins",
    "load_hooks",
    "read_approvals",
]
