"""Search tools: `grep` and `glob`. ripgrep when installed, else a pure-Python walk; both respect
`.gitignore` and stop at 500 lines or about 30 kB with a note saying so."""

from __future__ import annotations

import asyncio
import fnmatch
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

from keel.frozen import frozen
from keel.globs import translate
from keel.tools.base import ToolContext, ToolError, ToolOutput, tool

MAX_LINES = 500
MAX_BYTES = 30_000
ALWAYS_SKIPPED = frozenset({".git", ".hg", ".svn"})


def ripgrep() -> str | None:
    """Path of `rg`, unless KEEL_NO_RIPGREP is set (tests force the fallback with it)."""
    if os.environ.get("KEEL_NO_RIPGREP"):
        return None
    return shutil.which("rg")


def _cap(lines: Iterator[str] | list[str], what: str) -> str:
    out: list[str] = []
    size = 0
    for line in lines:
        if len(out) >= MAX_LINES or size + len(line) + 1 > MAX_BYTES:
            out.append(
                f"[stopped at {len(out)} {what}; narrow the pattern or the path to see more]"
            )
            break
        out.append(line)
        size += len(line) + 1
    return "\n".join(out)


async def _rg(args: list[str], cwd: Path) -> list[str]:
    rg = ripgrep()
    assert rg is not None
    proc = await asyncio.create_subprocess_exec(
        rg,
        *args,
        cwd=cwd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        stdin=asyncio.subprocess.DEVNULL,
    )
    out, err = await proc.communicate()
    if proc.returncode not in (0, 1):  # 1 means "no matches"
        raise ToolError(f"ripgrep failed: {err.decode(errors='replace').strip()}")
    return out.decode("utf-8", "replace").splitlines()


async def _rg_files(top: Path, cwd: Path, pattern: str) -> list[str]:
    """Files under `top` that ripgrep does not ignore and whose path below `top` matches
    `pattern`, relative to cwd."""
    base = _relative(top, cwd) or "."
    files = await _rg(["--files", "--", base], cwd)
    prefix = "" if base == "." else base.rstrip("/") + "/"
    out = []
    for line in files:
        line = line.removeprefix("./")
        below = line.removeprefix(prefix) if top.is_dir() else Path(line).name
        if _glob_match(below, pattern):
            out.append(line)
    return out


# -- the pure-Python fallback ---------------------------------------------------------------------


@frozen
class IgnoreRule:
    base: Path
    regex: re.Pattern[str]
    negate: bool
    dir_only: bool


def _gitignore_regex(pattern: str) -> re.Pattern[str]:
    # A pattern with a slash (other than a trailing one) is anchored to its .gitignore's
    # directory; a match on a directory covers everything below it.
    anchored = "/" in pattern.rstrip("/")
    body = translate(pattern.strip("/"))
    return re.compile(("^" if anchored else "^(?:.*/)?") + body + "(?:/.*)?$")


def load_ignore_rules(directory: Path) -> list[IgnoreRule]:
    rules: list[IgnoreRule] = []
    try:
        text = (directory / ".gitignore").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return rules
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        line = line[1:] if negate else line
        rules.append(IgnoreRule(directory, _gitignore_regex(line), negate, line.endswith("/")))
    return rules


def walk_files(top: Path) -> Iterator[Path]:
    """Every file under `top` not ignored by a `.gitignore` on the way down (nor inside .git)."""
    stack: list[tuple[Path, list[IgnoreRule]]] = [(top, load_ignore_rules(top))]
    while stack:
        directory, rules = stack.pop()
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError:
            continue
        subdirs = []
        for entry in entries:
            if entry.name in ALWAYS_SKIPPED:
                continue
            path = Path(entry.path)
            is_dir = entry.is_dir(follow_symlinks=False)
            if is_ignored(path, is_dir, rules):
                continue
            if is_dir:
                subdirs.append(path)
            elif entry.is_file():
                yield path
        for sub in reversed(subdirs):
            stack.append((sub, rules + load_ignore_rules(sub)))


def is_ignored(path: Path, is_dir: bool, rules: list[IgnoreRule]) -> bool:
    ignored = False
    for rule in rules:
        if rule.dir_only and not is_dir:
            continue
        rel = path.relative_to(rule.base).as_posix()
        if rule.regex.match(rel):
            ignored = not rule.negate
    return ignored


def _glob_match(rel: str, pattern: str) -> bool:
    """`rel` (relative to the search root) against a glob; a pattern without "/" matches the
    file name in any directory, as ripgrep's --glob does."""
    if "/" not in pattern:
        return fnmatch.fnmatchcase(rel.rsplit("/", 1)[-1], pattern)
    return re.match("^" + translate(pattern.lstrip("/")) + "$", rel) is not None


def _python_grep(
    regex: re.Pattern[str], top: Path, cwd: Path, file_glob: str | None, files_only: bool
) -> Iterator[str]:
    files = [top] if top.is_file() else walk_files(top)
    for path in files:
        rel_top = path.relative_to(top).as_posix() if path != top else path.name
        if file_glob and not _glob_match(rel_top, file_glob):
            continue
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if b"\x00" in data[:8192]:
            continue
        shown = _relative(path, cwd)
        for number, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
            if regex.search(line):
                if files_only:
                    yield shown
                    break
                yield f"{shown}:{number}:{line[:500]}"


def _relative(path: Path, cwd: Path) -> str:
    try:
        return path.relative_to(cwd).as_posix()
    except ValueError:
        return str(path)


# -- the tools ---------------------------------------------------------------------------------------


@tool(read_only=True)
async def grep(
    ctx: ToolContext,
    pattern: str,
    path: str = ".",
    glob: str | None = None,
    ignore_case: bool = False,
    files_only: bool = False,
) -> ToolOutput:
    """Search file contents with a regular expression (ripgrep syntax). Returns matching lines as
    `path:line:text`, or only file names with files_only. Respects .gitignore.

    Args:
        pattern: The regular expression to search for.
        path: File or directory to search, relative to the working directory (default: all of it).
        glob: Only search files matching this glob, e.g. "*.py" or "src/**/*.ts".
        ignore_case: Match case-insensitively.
        files_only: Return only the paths of files that match.
    """
    top = ctx.resolve(path)
    if not top.exists():
        raise ToolError(f"{path} does not exist")
    if ripgrep():
        args = ["--line-number", "--no-heading", "--color", "never", "--max-columns", "500"]
        args += ["-i"] if ignore_case else []
        args += ["--files-with-matches"] if files_only else []
        if glob:
            # rg's own --glob overrides .gitignore; filter the ignore-aware file list instead.
            targets = await _rg_files(top, ctx.cwd, glob)
            lines = []
            for i in range(0, len(targets), 500):
                lines += await _rg(
                    [*args, "--with-filename", "-e", pattern, "--", *targets[i : i + 500]], ctx.cwd
                )
        else:
            lines = await _rg([*args, "-e", pattern, "--", _relative(top, ctx.cwd) or "."], ctx.cwd)
        lines = [line.removeprefix("./") for line in lines]
    else:
        try:
            regex = re.compile(pattern, re.IGNORECASE if ignore_case else 0)
        except re.error as exc:
            raise ToolError(f"invalid regular expression: {exc}") from exc
        lines = await asyncio.to_thread(
            lambda: list(_python_grep(regex, top, ctx.cwd, glob, files_only))
        )
    if not lines:
        return ToolOutput(f"No matches for {pattern!r}.")
    return ToolOutput(_cap(lines, "lines"))


@tool(read_only=True)
async def glob(ctx: ToolContext, pattern: str, path: str = ".") -> ToolOutput:
    """Find files by name with a glob pattern such as "**/*.py" or "src/*.ts". Returns matching
    paths, sorted. Respects .gitignore.

    Args:
        pattern: The glob; a pattern without "/" matches file names in any directory.
        path: The directory to search from, relative to the working directory.
    """
    top = ctx.resolve(path)
    if not top.is_dir():
        raise ToolError(f"{path} is not a directory")
    if ripgrep():
        lines = sorted(await _rg_files(top, ctx.cwd, pattern))
    else:

        def find() -> list[str]:
            return sorted(
                _relative(p, ctx.cwd)
                for p in walk_files(top)
                if _glob_match(p.relative_to(top).as_posix(), pattern)
            )

        lines = await asyncio.to_thread(find)
    if not lines:
        return ToolOutput(f"No files match {pattern!r}.")
    return ToolOutput(_cap(lines, "files"))
