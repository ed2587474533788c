"""The project intake (DESIGN.md, invariant 5): one answer, for every loader and every front end,
to "did the user write this file, or did it come with the project?".

Owns:
- the project tree (`find_root`: the nearest directory at or above the working directory that
  holds a `.git`, found by looking, never by asking git; else the working directory);
- provenance (`Intake.supplied`): a file inside the project tree came with the project, whatever
  git says of it (tracked, untracked, ignored, or a repository git refuses to read), whatever
  its depth, and whether or not it is reached through a symlink. Only the user's own files (their
  home and config directories, when those are not inside the project tree) are theirs;
- which settings files are read, in merge order (`Intake.settings_files`): the user's, then both
  spellings (`.claude/`, `.keel/`) at every directory from the project root down to the working
  directory;
- what keel wrote into a project file for the user (`record_written`, `Intake.written`): content
  hashes kept in the user's own config directory, never in the project. Content that keel did
  not write and the user did not approve (`keel trust approve`) is never taken as theirs;
- every project configuration file at any depth (`scan`), so `keel trust list` and `keel doctor`
  show each one with its verdict and nothing applies without appearing there.

It must never print, read a credential's value, or import anything above `keel.config`.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from keel.config.trust import approvals_file, approve, project_key, read_approvals

#: Directories of project configuration (keel's, or another tool's that keel reads: settings,
#: hooks, MCP servers, agents, commands, skills, rules, plugins), at any depth of the project.
CONFIG_DIRS: tuple[str, ...] = (".keel", ".claude", ".codex", ".opencode", ".claude-plugin")
#: Files of project configuration, at any depth of the project.
CONFIG_FILES: tuple[str, ...] = (".mcp.json", "opencode.json", "opencode.jsonc")
#: Instruction files (prompt text: they join the context or a note), at any depth.
INSTRUCTION_FILES: tuple[str, ...] = (
    "AGENTS.md",
    "AGENTS.override.md",
    "CLAUDE.md",
    "CLAUDE.local.md",
)
#: The approvals-file kind under which keel records what it wrote for the user.
WRITTEN_KIND = "written"
#: Directories `scan` does not descend into: dependencies, build output, caches, VCS data.
_SKIP_DIRS = frozenset(
    {".git", "node_modules", ".venv", "venv", "__pycache__", ".tox", ".nox", ".mypy_cache",
     ".ruff_cache", ".pytest_cache", "target", "dist", "build", ".cache", ".gradle", ".idea"}
)  # fmt: skip
#: `scan` stops after this many directories (a huge tree is named as cut short, never hangs).
SCAN_DIR_LIMIT = 20_000
SCAN_SECONDS = 2.0


def find_root(cwd: Path, *, skip: Callable[[Path, Path], bool] | None = None) -> Path | None:
    """The enclosing git work tree, found by walking up for `.git` (no subprocess: git may refuse
    a repository another user owns, and its refusal must not change the answer). `skip(dot,
    directory)` may pass over a `.git` that is not one (the sandbox's placeholder)."""
    for d in (cwd, *cwd.parents):
        dot = d / ".git"
        if os.path.lexists(dot) and not (skip is not None and skip(dot, d)):
            return d
    return None


def is_configuration(path: Path) -> bool:
    """Whether `path` is project configuration by its name: inside a configuration directory,
    a configuration file, or an instruction file, at any depth."""
    parts = path.parts
    return (
        any(part in CONFIG_DIRS for part in parts[:-1])
        or path.name in CONFIG_FILES
        or path.name in INSTRUCTION_FILES
    )


def _inside(path: Path, root: Path) -> bool:
    """Whether `path` lies in `root`'s tree, as written or once symlinks are resolved (either
    side: the project may be reached through a link)."""
    try:
        real, real_root = path.resolve(), root.resolve()
    except (OSError, RuntimeError):
        return True  # a loop or an unreadable link: it cannot be shown to lie outside
    plain = Path(os.path.normpath(path.absolute()))
    return any(p == r or p.is_relative_to(r) for p in (plain, real) for r in (root, real_root))


def written_pin(rel: str, key: str, value: str) -> str:
    """The record of one entry keel wrote into the project file `rel` for the user."""
    return hashlib.sha256(f"{rel}\0{key}\0{value}".encode()).hexdigest()[:32]


class Intake:
    """Provenance for one working directory: the project tree, the user's own files, and what
    keel wrote for the user. Cheap to build (no subprocess); build one per load."""

    def __init__(
        self,
        cwd: Path,
        *,
        user_dir: Path,
        home: Path,
        root: Path | None = None,
    ) -> None:
        self.cwd = Path(os.path.normpath(cwd.absolute()))
        found = root if root is not None else find_root(self.cwd)
        self.root = Path(os.path.normpath((found or self.cwd).absolute()))
        self.home = Path(os.path.normpath(home.absolute()))
        self.user_dir = Path(os.path.normpath(user_dir.absolute()))
        self.key = project_key(self.root)
        self._written: set[str] | None = None

    # -- provenance ---------------------------------------------------------------------------

    def home_inside_project(self) -> bool:
        """The home directory lies strictly inside the project tree (a checkout used as $HOME's
        parent): then even the "user" files there came with the project."""
        return self.home != self.root and self.home.is_relative_to(self.root)

    def user_places(self) -> tuple[Path, ...]:
        """The user's own configuration (files, and folders with everything in them)."""
        return (
            self.home / ".claude",
            self.home / ".claude.json",
            self.home / ".keel",
            self.user_dir,
            self.home / ".codex",
            self.home / ".config" / "opencode",
        )

    def in_project(self, path: Path) -> bool:
        return _inside(path, self.root)

    def supplied(self, path: Path) -> bool:
        """Whether `path` came with the project: inside the project tree and not in one of the
        user's own places (which count as theirs only while the home directory is not inside
        the project tree). Git's opinion and the depth never enter into it."""
        plain = Path(os.path.normpath(path.absolute()))
        if not self.home_inside_project() and any(
            plain == p or plain.is_relative_to(p) for p in self.user_places()
        ):
            return False
        return self.in_project(path)

    def rel(self, path: Path) -> str:
        plain = Path(os.path.normpath(path.absolute()))
        try:
            return plain.relative_to(self.root).as_posix()
        except ValueError:
            return str(plain)

    # -- what keel wrote for the user -----------------------------------------------------------

    def approvals(self) -> Path:
        return approvals_file(self.user_dir, self.key)

    def written(self, path: Path, key: str, value: str) -> bool:
        """Whether keel wrote `value` under `key` into the project file `path` for the user."""
        if self._written is None:
            self._written = set(read_approvals(self.approvals()).get(WRITTEN_KIND, []))
        return written_pin(self.rel(path), key, value) in self._written

    def record_written(self, path: Path, key: str, value: str) -> None:
        """Record that keel wrote `value` under `key` into `path` on the user's behalf."""
        approve(self.approvals(), WRITTEN_KIND, written_pin(self.rel(path), key, value))
        self._written = None

    # -- which files are read -------------------------------------------------------------------

    def chain(self) -> list[Path]:
        """The directories from the project root down to the working directory."""
        if self.cwd != self.root and self.cwd.is_relative_to(self.root):
            parts = self.cwd.relative_to(self.root).parts
            return [self.root.joinpath(*parts[:i]) for i in range(len(parts) + 1)]
        return [self.cwd]

    def settings_files(self) -> list[Path]:
        """Every settings file, in merge order (later wins for a single value; rules add up):
        Claude Code's user file, keel's user file, then at each directory from the project root
        down to the working directory Claude Code's and keel's shared, then personal, files."""
        files = [self.home / ".claude" / "settings.json", self.user_dir / "settings.json"]
        for directory in self.chain():
            files += [
                directory / ".claude" / "settings.json",
                directory / ".keel" / "settings.json",
                directory / ".claude" / "settings.local.json",
                directory / ".keel" / "settings.local.json",
            ]
        return list(dict.fromkeys(files))  # keel started in the home directory: read once


def user_config_dir(env: Mapping[str, str] | None = None) -> Path:
    """keel's user config directory: `$KEEL_CONFIG_DIR`, else `$XDG_CONFIG_HOME/keel`, else
    `~/.config/keel`."""
    env = os.environ if env is None else env
    if env.get("KEEL_CONFIG_DIR"):
        return Path(env["KEEL_CONFIG_DIR"]).expanduser()
    base = env.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "keel"


def intake_for(
    cwd: Path,
    env: Mapping[str, str] | None = None,
    *,
    user_dir: Path | None = None,
    home: Path | None = None,
    root: Path | None = None,
) -> Intake:
    """The intake of `cwd` with the user's directories taken from `env` (the process's by
    default) unless given."""
    env = os.environ if env is None else env
    if home is None:
        home = Path(env["HOME"]) if env.get("HOME") else Path.home()
    return Intake(cwd, user_dir=user_dir or user_config_dir(env), home=home, root=root)


# -- every project configuration file, at any depth ------------------------------------------------

#: What keel does with each configuration name (relative to its directory) when it is read.
_KINDS: tuple[tuple[str, str], ...] = (
    (".keel/settings.json", "settings"),
    (".keel/settings.local.json", "settings"),
    (".claude/settings.json", "settings"),
    (".claude/settings.local.json", "settings"),
    (".mcp.json", "mcp"),
    (".claude/agents", "agents"),
    (".keel/agents", "agents"),
    (".claude/commands", "commands"),
    (".keel/commands", "commands"),
    (".claude/skills", "skills"),
    (".keel/skills", "skills"),
    (".keel/bench", "bench"),
    (".claude/rules", "rules"),
    (".claude/output-styles", "output-styles"),
    (".claude-plugin", "plugin"),
    (".codex", "foreign"),
    (".opencode", "foreign"),
    ("opencode.json", "foreign"),
    ("opencode.jsonc", "foreign"),
    *((name, "instructions") for name in INSTRUCTION_FILES),
    (".claude/CLAUDE.md", "instructions"),
)


def scan(intake: Intake) -> tuple[list[tuple[Path, str]], bool]:
    """Every project configuration file or directory under the project root, at any depth, as
    (path, kind), and whether the walk was cut short (`SCAN_DIR_LIMIT`, `SCAN_SECONDS`).
    Symlinked directories are not followed (a link is listed as what it is named)."""
    found: list[tuple[Path, str]] = []
    deadline = time.monotonic() + SCAN_SECONDS
    seen = 0
    stack = [intake.root]
    while stack:
        directory = stack.pop()
        seen += 1
        if seen > SCAN_DIR_LIMIT or time.monotonic() > deadline:
            return sorted(found), True
        for rel, kind in _KINDS:
            path = directory / rel
            if os.path.lexists(path):
                found.append((path, kind))
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                continue
            if is_dir and entry.name not in _SKIP_DIRS and entry.name not in CONFIG_DIRS:
                stack.append(Path(entry.path))
    return sorted(found), False


__all__ = [
    "CONFIG_DIRS",
    "CONFIG_FILES",
    "INSTRUCTION_FILES",
    "SCAN_DIR_LIMIT",
    "WRITTEN_KIND",
    "Intake",
    "find_root",
    "intake_for",
    "is_configuration",
    "scan",
    "user_config_dir",
    "written_pin",
]
