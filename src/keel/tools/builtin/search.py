"""Search tools: `grep` and `glob`. ripgrep when installed, else a pure-Python walk; both respect
`.gitignore` and stop at 500 lines or about 30 kB with a note saying so.

Output streams into that budget: ripgrep's lines are taken as they arrive and ripgrep is killed
once the result is full; the fallback reads files line by line in bounded slices; `glob` keeps
only the names it can show. Neither opens anything but regular files and directories (a FIFO
would block ripgrep forever), and a cancellation stops ripgrep or the walk at once. The fallback
grep runs in a worker process, since a regular expression that backtracks holds the GIL.

Patterns come from `keel.globs` (pathspec, git's rules): `.gitignore` files read by the fallback
(and by `ls`, which hides what the walk skips), and the `glob` filters of both tools, which read
as ripgrep's `--glob` (gitignore syntax plus `{a,b}`; the same matcher on both paths).

Content a `read` deny rule covers never comes back from grep: every file is asked about
(`ToolContext.content_denied`, the permission gate's one answer) before it is searched, and the
result says how many files were left out and names a few (names are not content: `glob` and `ls`
list them). Which files are left out is decided from the file list alone, never from whether
they would have matched, so the note tells the model nothing about what they hold."""

from __future__ import annotations

import asyncio
import bisect
import contextlib
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
from typing import TYPE_CHECKING, TypeAlias

from keel.frozen import frozen
from keel.globs import PatternError, gitignore, glob_matcher, ignored
from keel.proc import in_worker
from keel.tools.base import ToolContext, ToolError, ToolOutput, tool
from keel.tools.builtin.files import check_regular, open_regular
from keel.tools.truncate import LineReader

if TYPE_CHECKING:
    from pathspec import GitIgnoreSpec

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


async def _rg(args: list[str], cwd: Path, take: Take, sep: bytes = b"\n") -> bool:
    """Run ripgrep and hand each output line (or `sep`-ended record) to `take` as it arrives,
    until `take` says False: then ripgrep is killed, so its output is never held whole (while
    an async `take` works, ripgrep waits on the full pipe). Returns False when stopped early.
    Cancelled, ripgrep is killed too."""
    rg = ripgrep()
    assert rg is not None
    return await _stream([rg, *args], cwd, take, "ripgrep", ok=(0, 1), sep=sep)  # 1: no matches


async def _stream(
    argv: list[str],
    cwd: Path,
    take: Take,
    what: str,
    ok: tuple[int, ...] = (0,),
    *,
    sep: bytes = b"\n",
    stdin: bytes | None = None,
) -> bool:
    """Run `argv`, handing `take` each `sep`-ended record of its output, killing it once `take`
    says False (or on cancellation). An exit code outside `ok` is an error naming `what`.
    `stdin` is written to the process first (it must read all of it before it writes much)."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        stdin=asyncio.subprocess.DEVNULL if stdin is None else asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    assert proc.stderr is not None
    errors = asyncio.ensure_future(_head(proc.stderr, 4096))
    going = True
    try:
        if stdin is not None:
            assert proc.stdin is not None
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # it died: see below
                proc.stdin.write(stdin)
                await proc.stdin.drain()
            proc.stdin.close()
        pending = b""
        while going and (chunk := await proc.stdout.read(65536)):
            *lines, pending = (pending + chunk).split(sep)
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


GlobFilter: TypeAlias = Callable[[str], bool]


def glob_filter(pattern: str) -> GlobFilter:
    """A `glob` argument as a test of a path below the search root (`keel.globs.glob_matcher`,
    ripgrep's --glob), or a ToolError that says what is wrong with it."""
    try:
        return glob_matcher(pattern)
    except PatternError as exc:
        raise ToolError(f"invalid glob {pattern!r}: {exc}") from None


async def _rg_files(top: Path, cwd: Path, match: GlobFilter | None, take: Take) -> bool:
    """Hand `take` the files under `top` that ripgrep does not ignore and whose path below
    `top` passes `match` (all of them without one), relative to cwd, as ripgrep lists them
    (until `take` says False)."""
    base = _relative(top, cwd) or "."
    prefix = "" if base == "." else base.rstrip("/") + "/"
    is_dir = top.is_dir()

    async def each(line: str) -> bool:
        line = line.removeprefix("./")
        below = line.removeprefix(prefix) if is_dir else Path(line).name
        return await _taken(take, line) if match is None or match(below) else True

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


class _Withheld:
    """The files whose content a `read` deny rule keeps from the model (`content_denied`),
    asked once per file, and the note that says how many were left out."""

    #: Names the note shows before "…".
    NAMED = 3

    def __init__(self, cwd: Path, denied: Callable[[Path], str | None] | None) -> None:
        self.cwd = cwd
        self.denied = denied
        self.verdicts: dict[str, bool] = {}
        self.names: list[str] = []

    @property
    def active(self) -> bool:
        """Whether files are asked about at all (no gate: nothing is withheld)."""
        return self.denied is not None

    def withholds(self, shown: str) -> bool:
        """Whether `shown` (relative to cwd, or absolute) is left out; counted once."""
        if self.denied is None:
            return False
        verdict = self.verdicts.get(shown)
        if verdict is None:
            verdict = self.verdicts[shown] = self.denied(self.cwd / shown) is not None
            if verdict:
                self.names.append(shown)
        return verdict

    def note(self) -> str:
        count = len(self.names)
        if not count:
            return ""
        named = ", ".join(sorted(self.names)[: self.NAMED]) + (", …" if count > self.NAMED else "")
        files = "1 file" if count == 1 else f"{count} files"
        return (
            f"[{files} not searched: a read deny rule keeps {'its' if count == 1 else 'their'} "
            f"content from you ({named})]"
        )


# -- the pure-Python fallback ---------------------------------------------------------------------


@frozen
class IgnoreFile:
    """One `.gitignore`: the folder it is in and its patterns."""

    base: Path
    spec: GitIgnoreSpec


def load_ignore_rules(directory: Path) -> list[IgnoreFile]:
    """The `.gitignore` of `directory`, if it has one with any pattern keel can apply."""
    try:
        text = (directory / ".gitignore").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    spec = gitignore(text.splitlines())
    return [IgnoreFile(directory, spec)] if len(spec) else []


def walk_files(top: Path) -> Iterator[Path]:
    """Every file under `top` not ignored by a `.gitignore` on the way down (nor inside .git).
    Symbolic links are not followed, files or folders, as ripgrep does not follow them: a link
    committed in a repository must not bring a file from outside it into a search. Hidden files
    and folders below `top` (a `.venv`, an `.env`) are left out, as ripgrep leaves them out."""
    stack: list[tuple[Path, list[IgnoreFile]]] = [(top, load_ignore_rules(top))]
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


def is_ignored(path: Path, is_dir: bool, rules: list[IgnoreFile]) -> bool:
    """Whether the `.gitignore` files `rules` (from the top down) ignore `path`: the deepest
    file with a pattern that matches decides, and in it the last such pattern, as in git (a
    directory that is ignored is never entered, so nothing below it comes back)."""
    for rule in reversed(rules):
        verdict = ignored(rule.spec, path.relative_to(rule.base).as_posix(), is_dir)
        if verdict is not None:
            return verdict
    return False


#: Bytes of one line the pure-Python grep searches (the rest of a longer line is not searched).
_FALLBACK_LINE = 1024 * 1024


def _fallback_files(
    top: Path, cwd: Path, match: GlobFilter | None, withheld: _Withheld, stop: threading.Event
) -> list[tuple[str, str]]:
    """(path, path as shown) of each file the fallback grep searches: not ignored, passing the
    glob filter, and not withheld by a read deny rule."""
    chosen: list[tuple[str, str]] = []
    for path in [top] if top.is_file() else walk_files(top):
        if stop.is_set():
            break
        below = path.relative_to(top).as_posix() if path != top else path.name
        if match is not None and not match(below):
            continue
        shown = _relative(path, cwd)
        if not withheld.withholds(shown):
            chosen.append((str(path), shown))
    return chosen


def _python_grep(
    regex: re.Pattern[str], files: Iterable[tuple[str, str]], files_only: bool
) -> Iterator[str]:
    for name, shown in files:
        try:
            f = open_regular(Path(name), name)
        except ToolError:
            continue
        with f:
            if b"\x00" in f.read(8192):
                continue
            f.seek(0)
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
    """The pure-Python grep as a worker process: the files to search come on stdin (a JSON list
    of [path, shown]), one JSON string per result line goes to stdout."""
    pattern, ignore_case, files_only = json.loads(spec)
    regex = re.compile(pattern, re.IGNORECASE if ignore_case else 0)
    files = json.load(sys.stdin)
    out = sys.stdout
    try:
        for line in _python_grep(regex, files, files_only):
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


def _rg_take(found: _Collector, withheld: _Withheld, files_only: bool) -> Callable[[str], bool]:
    """What takes each record of `rg --null`: a match line (`path NUL line:text`), or a path
    with files_only. A file a read deny rule covers is left out here too (it was not listed,
    so it appeared since)."""

    def take(record: str) -> bool:
        name, nul, rest = record.partition("\0")
        if not files_only and not nul:
            return True  # "binary file matches" of a file named on the command line
        name = name.removeprefix("./")
        if withheld.withholds(name):
            return True
        return found.take(name if files_only else f"{name}:{rest}")

    return take


async def _grep_rg(
    found: _Collector,
    withheld: _Withheld,
    cwd: Path,
    top: Path,
    pattern: str,
    match: GlobFilter | None,
    ignore_case: bool,
    files_only: bool,
) -> None:
    # --null ends each path with a NUL: a file's name is known exactly, whatever it holds.
    args = ["--line-number", "--no-heading", "--with-filename", "--color", "never", "--null"]
    args += ["--max-columns", "500"]
    args += ["-i"] if ignore_case else []
    args += ["--files-with-matches"] if files_only else []
    take = _rg_take(found, withheld, files_only)

    async def search(targets: list[str]) -> bool:
        sep = b"\0" if files_only else b"\n"
        return await _rg([*args, "-e", pattern, "--", *targets], cwd, take, sep)

    if match is not None:
        await _search_listed(top, cwd, match, withheld, search)
        return
    # The whole tree in one search, unless a read deny rule leaves part of it out (the files
    # are listed first to know).
    listed = await _listed(top, cwd, withheld) if withheld.active else []
    if not withheld.names:
        await search([_relative(top, cwd) or "."])
        return
    for start in range(0, len(listed), 500):
        if not await search(listed[start : start + 500]):
            return


async def _listed(top: Path, cwd: Path, withheld: _Withheld) -> list[str]:
    """The files under `top` ripgrep searches, less those a read deny rule covers."""
    names: list[str] = []

    def each(name: str) -> bool:
        if not withheld.withholds(name):
            names.append(name)
        return True

    await _rg_files(top, cwd, None, each)
    return names


async def _search_listed(
    top: Path,
    cwd: Path,
    match: GlobFilter,
    withheld: _Withheld,
    search: Callable[[list[str]], Awaitable[bool]],
) -> None:
    """`search` the files under `top` that pass the glob filter, 500 at a time as they are
    listed (ignore-aware: ripgrep's own --glob would override .gitignore), less those a read
    deny rule covers."""
    batch: list[str] = []

    async def each_file(name: str) -> bool:
        if withheld.withholds(name):
            return True
        batch.append(name)
        if len(batch) < 500:
            return True
        targets = batch[:]
        batch.clear()
        return await search(targets)

    if await _rg_files(top, cwd, match, each_file) and batch:
        await search(batch)


async def _grep_python(
    found: _Collector,
    withheld: _Withheld,
    cwd: Path,
    top: Path,
    pattern: str,
    match: GlobFilter | None,
    ignore_case: bool,
    files_only: bool,
) -> None:
    try:
        re.compile(pattern, re.IGNORECASE if ignore_case else 0)
    except re.error as exc:
        raise ToolError(f"invalid regular expression: {exc}") from exc
    stop = threading.Event()
    try:
        files = await in_worker(
            lambda: _fallback_files(top, cwd, match, withheld, stop), name="keel grep walk"
        )
    finally:
        stop.set()
    # In a process of its own: a regular expression can backtrack for hours inside one call
    # that holds the GIL; only a process can be stopped then.
    spec = json.dumps([pattern, ignore_case, files_only])
    worker = [sys.executable, "-c", _WORKER, spec]
    await _stream(
        worker,
        cwd,
        lambda line: found.take(json.loads(line)),
        "grep",
        stdin=json.dumps(files).encode(),
    )


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
    match = glob_filter(glob) if glob else None
    found = _Collector("lines")
    withheld = _Withheld(ctx.cwd, ctx.content_denied)
    search = _grep_rg if ripgrep() else _grep_python
    await search(found, withheld, ctx.cwd, top, pattern, match, ignore_case, files_only)
    text = found.text() if found.lines else f"No matches for {pattern!r}."
    note = withheld.note()
    return ToolOutput(text + "\n" + note if note else text)


@tool(read_only=True, kind="builtin")
async def glob(ctx: ToolContext, pattern: str, path: str = ".") -> ToolOutput:
    """Find files by name with a glob pattern such as "**/*.py", "src/*.ts" or "*.{js,ts}".
    Returns matching paths, sorted. Respects .gitignore.

    Args:
        pattern: The glob (ripgrep's --glob); a pattern without "/" matches file names in any
            directory.
        path: The directory to search from, relative to the working directory.
    """
    top = ctx.resolve(path)
    if not top.is_dir():
        raise ToolError(f"{path} is not a directory")
    match = glob_filter(pattern)
    smallest = _Smallest(MAX_LINES + 1)  # one more than shown, so the cut is noticed
    if ripgrep():
        await _rg_files(top, ctx.cwd, match, smallest.take)
    else:
        stop = threading.Event()

        def find() -> None:
            for p in walk_files(top):
                if stop.is_set():
                    return
                if match(p.relative_to(top).as_posix()):
                    smallest.take(_relative(p, ctx.cwd))

        try:
            await in_worker(find, name="keel glob")
        finally:
            stop.set()
    if not smallest.names:
        return ToolOutput(f"No files match {pattern!r}.")
    return ToolOutput(_cap(smallest.names, "files"))
