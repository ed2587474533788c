"""`keel hooks list` and `keel hooks approve`: what hooks apply in this project, and approving
the project's shared ones (pinned to a hash of their configuration)."""

from __future__ import annotations

import sys
from pathlib import Path

from keel.agent.prompt import git_root
from keel.config.settings import user_config_dir
from keel.config.trust import project_key
from keel.hooks.config import approvals_file, approve, approved_pins, load_hooks

#: How `keel hooks list` says an `async` / `asyncRewake` hook runs.
_BACKGROUND = {"async": ", in the background", "rewake": ", in the background, exit 2 wakes"}


def hooks(argv: list[str]) -> int:
    action = argv[0] if argv else "list"
    if action not in ("list", "approve") or len(argv) > 1:
        print("usage: keel hooks [list|approve]", file=sys.stderr)
        return 2
    root = git_root(Path.cwd()) or Path.cwd()
    user_dir = user_config_dir()
    config = load_hooks(Path.cwd(), keel_user_dir=user_dir)
    pin = config.shared_hash()
    approved = pin in approved_pins(user_dir, project_key(root), "hooks")
    if action == "approve":
        if not pin:
            print("this project has no shared hooks to approve")
            return 0
        approve(approvals_file(user_dir, project_key(root)), "hooks", pin)
        print(f"approved the project's hooks (pin {pin}); they run from now on, until they change")
        return 0
    for warning in config.warnings:
        print(f"warning: {warning}")
    for file, event, count in config.unsupported:
        print(
            f"not supported: {event} ({count} hook(s) in {file}): a Claude Code event keel does not run"
        )
    if not config.hooks:
        print("no hooks configured")
        return 0
    for h in config.hooks:
        state = "runs" if h.source == "personal" or approved else "needs approval"
        if state == "needs approval" and h.can_guard:
            state = "needs approval; until then runs sandboxed, may only block"
        matcher = f" [{h.matcher}]" if h.matcher else ""
        where = f"plugin {h.plugin}: {h.file}" if h.plugin else h.file
        runs = _BACKGROUND.get(h.background, "")
        print(f"{h.event}{matcher}: {h.label}  ({where}, {state}{runs}, timeout {h.timeout:g} s)")
    if pin and not approved:
        print("\nshared project hooks need approval: review them, then run `keel hooks approve`")
    return 0
