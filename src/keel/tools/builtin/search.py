"""Search tools: `grep` and `glob`. ripgrep when installed, else a pure-Python walk; both respect
`.gitignore` and stop at 500 lines or about 30 kB with a note saying so.

Output streams into that budget: ripgrep's lines are taken as they arrive and ripgrep is killed
once the result is full; the fallback reads files line by line in bounded slices; `glob` keeps
only the names it can show. Neither opens anything but regular files and directories (a FIFO
would block ripgrep forever), and a cancellation stops ripgrep or the walk at once. The fallback
grep runs in a worker process, since a regular expression that backtracks holds the GIL."""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import fnmatch
import inspect
import json
import os
import re
import shutil
import signal
import sys
import threading
from collections.abc import Awaitable, Callable, Iterable, Iterator
from pathlib import Path
from typing import TypeAlias

from keel.frozen import frozen
from keel.globs import translate
from keel.proc import in_worker
from keel.tools.base import ToolContext, ToolError, ToolOutput, tool
from keel.tools.builtin.files import check_regular, open_regular
from keel.tools.truncate import LineReader

MAX_LINES = 500
MAX_BYTES = 30_000
ALWAYS_SKIPPED = frozenset({".git", ".hg", ".svn"})


def ripgrep() -> str | None:
    """Path of `rg`, unless KEEL_NO_RIPGREP is set (tests force the fallback with it)."""
    if os.environ.get("KEEL_NO_RIPGREP"):
        return None
    return shutil.which("rg")


class _Collector:
    """The lines of a result as they arrive, up to MAX_LINES or MAX_BYTES: `take` says False
    once the result is full, so the producer stops (ripgrep is killed, the walk ends)."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.lines: list[str] = []
        self.size = 0
        self.full = False

    def take(self, line: str) -> bool:
        if self.full or len(self.lines) >= MAX_LINES or self.size + len(line) + 1 > MAX_BYTES:
            self.full = True
            return False
        self.lines.append(line)
        self.size += len(line) + 1
        return True

    def text(self) -> str:
        note = [
            f"[stopped at {len(self.lines)} {self.what}; narrow the pattern or the path to see more]"
        ]
        return "\n".join(self.lines + (note if self.full else []))


def _cap(lines: Iterable[str], what: str) -> str:
    collector = _Collector(what)
    for line in lines:
        if not collector.take(line):
            break
    return collector.text()


#: Bytes of one ripgrep output line kept (`--max-columns` bounds grep lines; paths are short).
_RG_LINE = 4096


Take: TypeAlias = Callable[[str], bool | Awaitable[bool]]


async def _rg(args: list[str], cwd: Path, take: Take) -> bool:
    """Run ripgrep and hand each output line to `take` as it arrives, until `take` says False:
    then ripgrep is killed, so its output is never held whole (while an async `take` works,
    ripgrep waits on the full pipe). Returns False when stopped early. Cancelled, ripgrep is
    killed too."""
    rg = ripgrep()
    assert rg is not None
    return await _stream([rg, *args], cwd, take, "ripgrep", ok=(0, 1))  # 1: no matches


async def _stream(
    argv: list[str], cwd: Path, take: Take, what: str, ok: tuple[int, ...] = (0,)
) -> bool:
    """Run `argv`, handing `take` each line of its output, killing it once `take` says False
    (or on cancellation). An exit code outside `ok` is an error naming `what`."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        stdin=asyncio.subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    assert proc.stderr is not None
    errors = asyncio.ensure_future(_head(proc.stderr, 4096))
    going = True
    try:
        pending = b""
        while going and (chunk := await proc.stdout.read(65536)):
            *lines, pending = (pending + chunk).split(b"\n")
            pending = pending[:_RG_LINE]
            for line in lines:
                if not await _taken(take, line[:_RG_LINE].decode("utf-8", "replace")):
                    going = False
                    break
        if going and pending:
            going = await _taken(take, pending.decode("utf-8", "replace"))
    except BaseException:
        errors.cancel()
        raise
    finally:
        if proc.returncode is None:
            # Not proc.kill(): Popen polls first, which can reap the process behind the back of
            # asyncio's child watcher (that then reports exit code 255).
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
        with contextlib.suppress(BaseException):
            await asyncio.shield(proc.wait())
    if not going:  # stopped by us: whatever ripgrep said after that does not matter
        errors.cancel()
        return False
    err = await errors
    if proc.returncode not in ok:
        raise ToolError(f"{what} failed: {err.decode(errors='replace').strip()}")
    return True


async def _taken(take: Take, line: str) -> bool:
    answer = take(line)
    return await answer if inspect.isawaitable(answer) else answer


async def _head(stream: asyncio.StreamReader, keep: int) -> bytes:
    """The first `keep` bytes of `stream`, reading (and dropping) the rest to its end."""
    data = b""
    while chunk := await stream.read(65536):
        data += chunk[: max(0, keep - len(data))]
    return data


async def _rg_files(top: Path, cwd: Path, pattern: str, take: Take) -> bool:
    """Hand `take` the files under `top` that ripgrep does not ignore and whose path below
    `top` matches `pattern`, relative to cwd, as ripgrep lists them (until `take` says False)."""
    base = _relative(top, cwd) or "."
    prefix = "" if base == "." else base.rstrip("/") + "/"
    is_dir = top.is_dir()

    async def each(line: str) -> bool:
        line = line.removeprefix("./")
        below = line.removeprefix(prefix) if is_dir else Path(line).name
        return await _taken(take, line) if _glob_match(below, pattern) else True

    return await _rg(["--files", "--", base], cwd, each)


class _Smallest:
    """The `keep` smallest of the names it is given, sorted: a sorted listing of a huge tree
    without holding the tree."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.names: list[str] = []

    def take(self, name: str) -> bool:
        if len(self.names) < self.keep or name < self.names[-1]:
            bisect.insort(self.names, name)
            if len(self.names) > self.keep:
                self.names.pop()
        return True


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
    """Every file under `top` not ignored by a `.gitignore` on the way down (nor inside .git).
    Symbolic links are not followed, files or folders, as ripgrep does not follow them: a link
    committed in a repository must not bring a file from outside it into a search. Hidden files
    and folders below `top` (a `.venv`, an `.env`) are left out, as ripgrep leaves them out."""
    stack: list[tuple[Path, list[IgnoreRule]]] = [(top, load_ignore_rules(top))]
    while stack:
        directory, rules = stack.pop()
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError:
            continue
        subdirs = []
        for entry in entries:
            if entry.name.startswith("."):  # ALWAYS_SKIPPED among them
                continue
            path = Path(entry.path)
            is_dir = entry.is_dir(follow_symlinks=False)
            if is_ignored(path, is_dir, rules):
                continue
            if is_dir:
                subdirs.append(path)
            elif entry.is_file(follow_symlinks=False):  # as rg: links are not followed
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


#: Bytes of one line the pure-Python grep searches (the rest of a longer line is not searched).
_FALLBACK_LINE = 1024 * 1024


def _python_grep(
    regex: re.Pattern[str], top: Path, cwd: Path, file_glob: str | None, files_only: bool
) -> Iterator[str]:
    files = [top] if top.is_file() else walk_files(top)
    for path in files:
        rel_top = path.relative_to(top).as_posix() if path != top else path.name
        if file_glob and not _glob_match(rel_top, file_glob):
            continue
        try:
            f = open_regular(path, str(path))
        except ToolError:
            continue
        with f:
            if b"\x00" in f.read(8192):
                continue
            f.seek(0)
            shown = _relative(path, cwd)
            for number, raw in enumerate(LineReader(f, _FALLBACK_LINE), 1):
                line = raw.data.decode("utf-8", "replace")
                if regex.search(line):
                    if files_only:
                        yield shown
                        break
                    yield f"{shown}:{number}:{line[:500]}"


_WORKER = (
    "import sys; from keel.tools.builtin.search import fallback_main; fallback_main(sys.argv[1])"
)


def fallback_main(spec: str) -> None:
    """The pure-Python grep as a worker process: one JSON string per result line on stdout."""
    pattern, ignore_case, top, cwd, file_glob, files_only = json.loads(spec)
    regex = re.compile(pattern, re.IGNORECASE if ignore_case else 0)
    out = sys.stdout
    try:
        for line in _python_grep(regex, Path(top), Path(cwd), file_glob, files_only):
            out.write(json.dumps(line) + "\n")
        out.flush()
    except BrokenPipeError:  # keel has all it needs and stopped reading
        os._exit(0)


def _relative(path: Path, cwd: Path) -> str:
    try:
        return path.relative_to(cwd).as_posix()
    except ValueError:
        return str(path)


# -- the tools ---------------------------------------------------------------------------------------


async def _grep_rg(
    found: _Collector,
    cwd: Path,
    top: Path,
    pattern: str,
    glob: str | None,
    ignore_case: bool,
    files_only: bool,
) -> None:
    args = ["--line-number", "--no-heading", "--color", "never", "--max-columns", "500"]
    args += ["-i"] if ignore_case else []
    args += ["--files-with-matches"] if files_only else []

    def take(line: str) -> bool:
        return found.take(line.removeprefix("./"))

    if not glob:
        await _rg([*args, "-e", pattern, "--", _relative(top, cwd) or "."], cwd, take)
        return
    # rg's own --glob overrides .gitignore; filter the ignore-aware file list instead, searching
    # it 500 files at a time as it is listed.
    batch: list[str] = []

    async def search(targets: list[str]) -> bool:
        return await _rg([*args, "--with-filename", "-e", pattern, "--", *targets], cwd, take)

    async def each_file(name: str) -> bool:
        batch.append(name)
        if len(batch) < 500:
            return True
        targets = batch[:]
        batch.clear()
        return await search(targets)

    if await _rg_files(top, cwd, glob, each_file) and batch:
        await search(batch)


@tool(read_only=True, kind="builtin")
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
    if not top.is_dir():
        check_regular(top, path)  # ripgrep would wait forever on a FIFO named here
    found = _Collector("lines")
    if ripgrep():
        await _grep_rg(found, ctx.cwd, top, pattern, glob, ignore_case, files_only)
    else:
        try:
            re.compile(pattern, re.IGNORECASE if ignore_case else 0)
        except re.error as exc:
            raise ToolError(f"invalid regular expression: {exc}") from exc
        # In a process of its own: a regular expression can backtrack for hours inside one
        # call that holds the GIL; only a process can be stopped then.
        spec = json.dumps([pattern, ignore_case, str(top), str(ctx.cwd), glob, files_only])
        worker = [sys.executable, "-c", _WORKER, spec]
        await _stream(worker, ctx.cwd, lambda line: found.take(json.loads(line)), "grep")
    if not found.lines:
        return ToolOutput(f"No matches for {pattern!r}.")
    return ToolOutput(found.text())


@tool(read_only=True, kind="builtin")
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
    smallest = _Smallest(MAX_LINES + 1)  # one more than shown, so the cut is noticed
    if ripgrep():
        await _rg_files(top, ctx.cwd, pattern, smallest.take)
    else:
        stop = threading.Event()

        def find() -> None:
            for p in walk_files(top):
                if stop.is_set():
                    return
                if _glob_match(p.relative_to(top).as_posix(), pattern):
                    smallest.take(_relative(p, ctx.cwd))

        try:
            await in_worker(find, name="keel glob")
        finally:
            stop.set()
    if not smallest.names:
        return ToolOutput(f"No files match {pattern!r}.")
    return ToolOutput(_cap(smallest.names, "files"))
