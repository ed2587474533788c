"""The project boundary: which paths the file tools may change. Shared by the write tools (which
refuse on their own, whatever the gate said) and the permission gate (which refuses before
asking anyone, in every mode).

A path is inside when it is inside the project root after symlinks are resolved, so a link cannot
lead a write out. Protected locations inside the project (code that runs later, configuration
that grants permissions) are refused too: `PROTECTED` at the root, and project configuration
(`keel.config.intake.CONFIG_DIRS`, `CONFIG_FILES`) at any depth, through a link or not.
"""

from __future__ import annotations

import os
from pathlib import Path

from keel.config.intake import CONFIG_DIRS, CONFIG_FILES

#: Entries of a `.git` directory that can make git run code or point it elsewhere (hooks,
#: config with its `core.hooksPath`/`fsmonitor`/aliases, submodule and worktree git dirs, a
#: `commondir` that swaps in another config and hooks). The rest of `.git` is git's own data.
GIT_PROTECTED = ("hooks", "config", "config.worktree", "info", "modules", "worktrees", "commondir")

#: Shell start-up files at the project root (sourced by a shell whose home is the project).
SHELL_RC = (
    ".bashrc", ".bash_profile", ".bash_login", ".bash_logout", ".profile",
    ".zshrc", ".zshenv", ".zprofile", ".zlogin", ".zlogout",
)  # fmt: skip

#: Paths inside the project that no tool may write, in any mode: code that runs later (git
#: hooks and config, editor tasks, direnv, shell rc files), configuration that grants
#: permissions (keel's and Claude Code's), MCP servers. The `.git/...` entries come before
#: `.git` so a refusal names the most specific one. The sandbox holds the same set read-only
#: (apart from git's own data in `.git`), whether or not each path exists.
PROTECTED = (
    *(f".git/{name}" for name in GIT_PROTECTED),
    ".git", ".keel", ".claude", ".mcp.json", ".vscode", ".idea", ".envrc", *SHELL_RC,
)  # fmt: skip


def resolve_in(raw: str, cwd: Path) -> Path:
    """`raw` (relative to `cwd`, or absolute, `~` expanded) made absolute, not yet resolved."""
    path = Path(raw).expanduser()
    return path if path.is_absolute() else cwd / path


def _container(resolved: Path, root: Path, also: tuple[Path, ...]) -> Path | None:
    """The directory of the project root and the additional directories that holds `resolved`."""
    for base in (root, *also):
        base = base.resolve()
        if resolved == base or resolved.is_relative_to(base):
            return base
    return None


def outside_project(raw: str, cwd: Path, root: Path, also: tuple[Path, ...] = ()) -> str | None:
    """Why `raw` may not be changed because it lies outside the project (and outside the
    additional directories `also`, `permissions.additionalDirectories`), or None."""
    path = resolve_in(raw, cwd)
    if _container(path.resolve(), root, also) is not None:
        return None
    root = root.resolve()
    via = " (through a symlink)" if Path(os.path.normpath(path)).is_relative_to(root) else ""
    extra = f" or the additional directories {', '.join(map(str, also))}" if also else ""
    return (
        f"{raw} is outside the project root {root}{extra}{via}; only files inside "
        f"{'them' if also else 'it'} can be changed"
    )


def protected_path(path: Path, root: Path) -> str | None:
    """The protected location `path` (absolute) falls in, relative to `root`, if any: one of
    `PROTECTED`, or project configuration at any depth (`sub/.keel`, `a/b/.mcp.json`)."""
    try:
        rel = path.relative_to(root.resolve()).as_posix()
    except ValueError:
        return None
    for p in PROTECTED:
        if rel == p or rel.startswith(p + "/"):
            return p
    parts = rel.split("/")
    for depth, part in enumerate(parts):
        if part in CONFIG_DIRS:
            return "/".join(parts[: depth + 1])
    return rel if parts[-1] in CONFIG_FILES else None


def refuse_write(raw: str, cwd: Path, root: Path, also: tuple[Path, ...] = ()) -> str | None:
    """Why a write to `raw` is refused in every mode, or None. Checked where the write lands
    (links resolved) and where it is named, so a link cannot make protected configuration
    (`sub/.mcp.json -> notes.json`) writable."""
    if (outside := outside_project(raw, cwd, root, also)) is not None:
        return outside
    resolved = resolve_in(raw, cwd).resolve()
    protected = protected_path(resolved, _container(resolved, root, also) or root)
    if protected is None:
        named = Path(os.path.normpath(resolve_in(raw, cwd.resolve())))
        protected = protected_path(named, _container(named, root, also) or root)
    if protected is not None:
        return (
            f"{raw} is in {protected}, which keel protects in every mode (it could run code or "
            "grant permissions later); change it yourself if you mean to"
        )
    return None
