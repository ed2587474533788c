"""Hook configuration in Claude Code's format, from every settings file that may hold hooks, and
which of them may run.

`{"hooks": {Event: [{"matcher": regex, "hooks": [{"type": "command", "command": …, "timeout": s}]}]}}`

Sources: keel's user settings, `.keel/settings.json` (shared), `.keel/settings.local.json`
(personal), and Claude Code's `~/.claude/settings.json`, `.claude/settings.json` (shared) and
`.claude/settings.local.json` (personal). Hooks from shared files run only once approved: the
approval is a hash of their configuration, kept in the user's own config directory (never in the
project), so changing a shared hook needs a new approval. A "personal" project file that git
tracks came with the repository and counts as shared. A problem in one entry is reported with
its file and skipped; the rest load.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from keel.config.settings import read_json_object
from keel.config.trust import (
    approvals_file,
    approve,
    approved_pins,
    came_with_repo,
    read_approvals,
)
from keel.frozen import frozen

EVENTS = (
    "SessionStart",
    "UserPromptSubmit",
    "PreToolUse",
    "PostToolUse",
    "Stop",
    "SubagentStop",
    "PreCompact",
    "Notification",
    "SessionEnd",
)
DEFAULT_TIMEOUT = 60.0
MAX_TIMEOUT = 86_400.0

Source = Literal["personal", "shared"]


@frozen
class HookCommand:
    event: str
    matcher: str
    command: str
    timeout: float
    source: Source
    file: str

    def matches(self, value: str) -> bool:
        """Claude Code's matcher: case-insensitive and anchored; empty or `*` matches all; an
        invalid regex falls back to an exact comparison."""
        if self.matcher in ("", "*"):
            return True
        try:
            return re.fullmatch(f"(?:{self.matcher})", value, re.IGNORECASE) is not None
        except re.error:
            return self.matcher == value


@dataclass
class HookConfig:
    hooks: list[HookCommand] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def for_event(self, event: str) -> list[HookCommand]:
        return [h for h in self.hooks if h.event == event]

    def shared_hash(self) -> str:
        """The approval pin of the shared hooks (empty when there are none)."""
        shared = [
            (h.event, h.matcher, h.command, h.timeout) for h in self.hooks if h.source == "shared"
        ]
        if not shared:
            return ""
        return hashlib.sha256(json.dumps(sorted(shared)).encode()).hexdigest()[:16]

    def runnable(self, approved: set[str]) -> list[HookCommand]:
        """Personal hooks, and shared ones if their pin is approved."""
        ok = self.shared_hash() in approved
        return [h for h in self.hooks if h.source == "personal" or ok]


def hook_files(project: Path, *, keel_user_dir: Path, home: Path) -> list[tuple[Path, Source]]:
    return [
        (home / ".claude" / "settings.json", "personal"),
        (keel_user_dir / "settings.json", "personal"),
        (project / ".claude" / "settings.json", "shared"),
        (project / ".keel" / "settings.json", "shared"),
        (project / ".claude" / "settings.local.json", "personal"),
        (project / ".keel" / "settings.local.json", "personal"),
    ]


def _entries(data: Any, path: Path, source: Source, config: HookConfig) -> None:
    w = config.warnings
    if not isinstance(data, dict):
        w.append(f"{path}: hooks must be an object keyed by event; skipped")
        return
    for event, groups in data.items():
        if event not in EVENTS:
            w.append(f"{path}: unknown hook event {event!r} skipped (events: {', '.join(EVENTS)})")
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


def _hook(
    hook: Any, where: str, event: str, matcher: str, path: Path, source: Source, config: HookConfig
) -> None:
    w = config.warnings
    if not isinstance(hook, dict):
        w.append(f"{where} must be an object; skipped")
        return
    kind = hook.get("type", "command")
    if kind != "command":
        w.append(f'{where}: hook type {kind!r} is not supported (only "command"); skipped')
        return
    command = hook.get("command")
    if not isinstance(command, str) or not command.strip():
        w.append(f"{where} needs a command; skipped")
        return
    timeout = hook.get("timeout", DEFAULT_TIMEOUT)
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not 0 < timeout <= MAX_TIMEOUT
    ):
        w.append(f"{where}: timeout must be 1-86400 seconds; using {DEFAULT_TIMEOUT:g}")
        timeout = DEFAULT_TIMEOUT
    config.hooks.append(HookCommand(event, matcher, command, float(timeout), source, str(path)))


def load_hooks(project: Path, *, keel_user_dir: Path, home: Path | None = None) -> HookConfig:
    config = HookConfig()
    for path, source in hook_files(project, keel_user_dir=keel_user_dir, home=home or Path.home()):
        data = read_json_object(path, config.warnings, skipped="its hooks skipped")
        if data is not None and "hooks" in data:
            if source == "personal" and path.is_relative_to(project) and came_with_repo(path):
                source = "shared"  # committed: it came with the repository
            _entries(data["hooks"], path, source, config)
    return config


__all__ = [
    "EVENTS",
    "HookCommand",
    "HookConfig",
    "approvals_file",
    "approve",
    "approved_pins",
    "load_hooks",
    "read_approvals",
]
