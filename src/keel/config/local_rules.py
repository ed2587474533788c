"""The project's personal settings file (`.keel/settings.local.json`), where an "always allow"
answer is saved, from whichever front end gave it (the TUI, `keel serve`, `keel acp`,
stream-json input). Each rule saved is recorded by hash in the user's own config directory
(`keel.config.intake`): that record, not the file's name or git's opinion, is what makes the
rule the user's. Anything else in the file came with the project. The file is kept out of git by
a `.gitignore` beside it."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from keel.config.intake import intake_for
from keel.errors import UserError

LOCAL_SETTINGS = Path(".keel") / "settings.local.json"


def save_local_rule(cwd: Path, rule: str) -> Path:
    """Add `rule` to `permissions.allow` in `cwd/.keel/settings.local.json` (created if needed;
    other keys kept). Raises `UserError` if the file is not a JSON object."""
    path = cwd / LOCAL_SETTINGS
    data = _read(path, "the rule")
    permissions = data.setdefault("permissions", {})
    if not isinstance(permissions, dict):
        raise UserError(f"{path}: permissions is not an object; the rule was not saved")
    allow = permissions.setdefault("allow", [])
    if not isinstance(allow, list):
        raise UserError(f"{path}: permissions.allow is not a list; the rule was not saved")
    if rule not in allow:
        allow.append(rule)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Recorded before the file changes: a rule in the file is never the user's unrecorded.
    intake_for(cwd).record_written(path, "permissions.allow", rule)
    _write(path, data)
    return path


def save_local_setting(cwd: Path, key: str, value: str) -> Path:
    """Set `key` to `value` in `cwd/.keel/settings.local.json` (created if needed; other keys
    kept): a choice of prompt text (`outputStyle`), which needs no record of whose it is.
    Raises `UserError` if the file is not a JSON object."""
    path = cwd / LOCAL_SETTINGS
    data = _read(path, key)
    data[key] = value
    path.parent.mkdir(parents=True, exist_ok=True)
    _write(path, data)
    return path


def _read(path: Path, what: str) -> dict[str, object]:
    if not path.exists():
        return {}
    text = path.read_text(encoding="utf-8")
    try:
        loaded = json.loads(text) if text.strip() else {}
    except ValueError as exc:
        raise UserError(f"{path} is not valid JSON ({exc}); {what} was not saved") from exc
    if not isinstance(loaded, dict):
        raise UserError(f"{path} does not hold a JSON object; {what} was not saved")
    return loaded


def _write(path: Path, data: dict[str, object]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    _ignore_locals(path.parent)


def _ignore_locals(directory: Path) -> None:
    """Keep keel's personal files out of `git status`: a `.gitignore` in `.keel/` naming them,
    written once (an existing one is left as the user keeps it)."""
    ignore = directory / ".gitignore"
    if ignore.exists() or ignore.is_symlink():
        return
    text = "# keel's personal files, kept out of git (keel writes this once)\nsettings.local.json\n"
    # Not being able to hide the file from git changes nothing keel relies on.
    with contextlib.suppress(OSError):
        ignore.write_text(text, encoding="utf-8")
