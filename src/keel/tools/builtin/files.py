"""File tools: `read`, `write`, `edit`, `multi_edit`.

Only regular files are opened (a FIFO or a device is refused before anything could block on
it), reads run off the event loop in a worker a cancellation abandons, and a read holds about a
megabyte however long the file or its lines. Writes are confined to the project root (symlinks
resolved first, so a link cannot escape), an existing file must have been read in this context
and be unchanged since, and every write is an atomic replace through a temp file in the same
directory.
"""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

from keel.llm.messages import Image, Text
from keel.permissions.boundary import refuse_write
from keel.proc import in_worker
from keel.tools.base import FileStamp, ToolContext, ToolError, ToolOutput, tool
from keel.tools.truncate import LineReader

READ_MAX_LINES = 2000
READ_MAX_BYTES = 60_000
READ_MAX_LINE_CHARS = 2000
IMAGE_TYPES = {
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".gif": "image/gif",
    ".webp": "image/webp",
}
IMAGE_MAX_BYTES = 5 * 1024 * 1024
#: A read that has not finished after this long is abandoned with an error.
READ_TIMEOUT = 60.0

T = TypeVar("T")


def stamp(path: Path) -> FileStamp:
    st = path.stat()
    return FileStamp(st.st_mtime_ns, st.st_size)


def display_path(ctx: ToolContext, path: Path) -> str:
    try:
        return str(path.relative_to(ctx.cwd))
    except ValueError:
        return str(path)


def confine(ctx: ToolContext, raw: str) -> Path:
    """The absolute path `raw` names, refused unless it lies inside the project root after
    resolving symlinks and outside the protected locations: the tools hold the boundary
    themselves, whatever the permission gate decided."""
    refusal = refuse_write(raw, ctx.cwd, ctx.root, ctx.extra_roots)
    if refusal is not None:
        raise ToolError(refusal)
    return ctx.resolve(raw).resolve()


def _is_binary(head: bytes) -> bool:
    return b"\x00" in head


_KINDS = (
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def is_directory(raw: str) -> ToolError:
    """The error for a directory given to a file tool (small models copy the hint as it is)."""
    return ToolError(f"{raw} is a directory, not a file; list it with ls (or glob)")


def not_regular(raw: str, mode: int) -> ToolError:
    """The error for a path that is not a regular file: reading a FIFO waits for a writer
    forever, a device may never end; the tools refuse them rather than hang."""
    if stat.S_ISDIR(mode):
        return is_directory(raw)
    kind = next((name for test, name in _KINDS if test(mode)), "")
    return ToolError(
        f"{raw} is {kind + ', ' if kind else ''}not a regular file; the file tools only open "
        f"regular files (for a special file use bash with a bounded command, e.g. "
        f"`timeout 5 head -c 4096 {raw}`)"
    )


def check_regular(target: Path, raw: str) -> os.stat_result:
    """`target`'s stat, refused unless it is a regular file (stat never blocks)."""
    try:
        st = target.stat()
    except OSError as exc:
        raise ToolError(f"cannot open {raw}: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise not_regular(raw, st.st_mode)
    return st


def open_regular(target: Path, raw: str) -> BinaryIO:
    """`target` opened for reading, only if it is a regular file. The open itself cannot block
    (O_NONBLOCK: a FIFO swapped in after the check opens at once and is refused by fstat)."""
    check_regular(target, raw)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(target, flags)
    except OSError as exc:
        raise ToolError(f"cannot open {raw}: {exc.strerror}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise not_regular(raw, mode)
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


async def off_loop(raw: str, func: Callable[[], T]) -> T:
    """`func()` (file reading) in a daemon worker: the event loop never waits on a disk, a
    cancellation returns at once, and a read stuck for `READ_TIMEOUT` s becomes an error."""
    try:
        return await asyncio.wait_for(in_worker(func, name=f"keel read {raw}"), READ_TIMEOUT)
    except TimeoutError:
        raise ToolError(
            f"reading {raw} took longer than {READ_TIMEOUT:g} s and was abandoned (a network or "
            "special filesystem that does not answer?)"
        ) from None


def _read_lines(
    path: Path, raw: str, offset: int, limit: int
) -> tuple[list[str], int, bool] | None:
    """Lines [offset, offset+limit) (1-based), cut at READ_MAX_BYTES on a line boundary, each
    cut to READ_MAX_LINE_CHARS while it is read. Returns (numbered lines, total line count, cut
    by size), None for a binary file. Memory stays within about a megabyte however long the
    file or its lines."""
    out: list[str] = []
    size = 0
    total = 0
    cut = False
    with open_regular(path, raw) as f:
        if _is_binary(f.read(8192)):
            return None
        f.seek(0)
        reader = LineReader(f, READ_MAX_LINE_CHARS * 4)
        for total, line in enumerate(reader, start=1):
            if total < offset:
                continue
            if len(out) >= limit:
                break
            numbered = f"{total:6d}\t{line.text(READ_MAX_LINE_CHARS)}"
            if size + len(numbered) + 1 > READ_MAX_BYTES and out:
                cut = True
                break
            out.append(numbered)
            size += len(numbered) + 1
        total += reader.count_rest()
    return out, total, cut


def _read_image(path: Path, raw: str) -> bytes:
    with open_regular(path, raw) as f:
        return f.read(IMAGE_MAX_BYTES + 1)


@tool(read_only=True, kind="builtin")
async def read(
    ctx: ToolContext, path: str, offset: int = 1, limit: int = READ_MAX_LINES
) -> ToolOutput:
    """Read a file from the filesystem. Returns numbered lines (`     1\\tfirst line`), at most
    2000 lines or about 60 kB per call; when cut, the result says which offset to continue from.
    Images (png, jpg, gif, webp) are returned as images. Read a file before editing it.

    Args:
        path: The file to read, relative to the working directory or absolute.
        offset: The first line to return, counting from 1.
        limit: The most lines to return (at most 2000).
    """
    target = ctx.resolve(path)
    if offset < 1:
        raise ToolError("offset counts from 1")
    limit = max(1, min(limit, READ_MAX_LINES))
    if not target.exists():
        raise ToolError(f"{path} does not exist; check the path with glob")
    if target.is_dir():
        raise is_directory(path)
    st = check_regular(target, path)
    current = FileStamp(st.st_mtime_ns, st.st_size)
    key = (target, offset, limit)
    if ctx.read_ranges.get(key) == current:
        ctx.read_files[target] = current
        return ToolOutput(
            f"{path}: unchanged since you last read it (same lines); "
            "use the content you already have"
        )
    media = IMAGE_TYPES.get(target.suffix.lower())
    if media:
        if current.size > IMAGE_MAX_BYTES:
            raise ToolError(f"{path} is an image of {current.size} bytes; the limit is 5 MB")
        import base64

        raw = await off_loop(path, lambda: _read_image(target, path))
        if len(raw) > IMAGE_MAX_BYTES:
            raise ToolError(f"{path} is an image of over 5 MB; the limit is 5 MB")
        data = base64.b64encode(raw).decode()
        ctx.read_files[target] = current
        return ToolOutput((Text(f"Image {path} ({current.size} bytes):"), Image(media, data)))
    found = await off_loop(path, lambda: _read_lines(target, path, offset, limit))
    if found is None:
        raise ToolError(f"{path} is a binary file ({current.size} bytes); read cannot show it")
    lines, total, cut = found
    ctx.read_files[target] = current
    ctx.read_ranges[key] = current
    if not lines:
        if total == 0:
            return ToolOutput(f"{path} is empty.")
        raise ToolError(f"offset {offset} is past the end of {path} ({total} lines)")
    last = offset + len(lines) - 1
    body = "\n".join(lines)
    if last < total:
        reason = "size limit" if cut else "line limit"
        body += (
            f"\n\n[{reason}: showed lines {offset}-{last} of {total}; "
            f"continue with offset={last + 1}]"
        )
    return ToolOutput(body)


def _check_fresh(ctx: ToolContext, target: Path, raw: str) -> None:
    """An existing file must have been read and be unchanged since."""
    seen = ctx.read_files.get(target)
    if seen is None:
        raise ToolError(f"{raw} exists but was not read in this conversation; read it first")
    if stamp(target) != seen:
        raise ToolError(f"{raw} changed since you read it; read it again before changing it")


def _atomic_write(target: Path, content: str) -> None:
    import tempfile  # only when a tool writes: keeps it off the startup path

    target.parent.mkdir(parents=True, exist_ok=True)
    mode = target.stat().st_mode & 0o7777 if target.exists() else None
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".keel-tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(content)
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _diff(before: str, after: str, name: str) -> str:
    import difflib

    return "".join(
        difflib.unified_diff(
            before.splitlines(keepends=True),
            after.splitlines(keepends=True),
            fromfile=f"a/{name}",
            tofile=f"b/{name}",
            n=3,
        )
    )


def _checkpoint(ctx: ToolContext, target: Path, raw: str) -> None:
    """Keep what `target` holds for `/undo` (once per prompt); no snapshot, no write."""
    if ctx.checkpoints is None:
        return
    from keel.checkpoints import CheckpointError  # loaded already: ctx.checkpoints exists

    try:
        ctx.checkpoints.before_write(target)
    except CheckpointError as exc:
        raise ToolError(f"{exc.one_line()}; nothing was written to {raw}") from None


def _check_size(ctx: ToolContext, target: Path, after: str, raw: str) -> None:
    """Refuse a write that would leave a file over `ctx.max_file_size` that was not over it
    already (a large file that was there before may still be edited)."""
    limit = ctx.max_file_size
    if limit is None:
        return
    size = len(after.encode("utf-8", "replace"))
    if size <= limit or (target.exists() and target.stat().st_size > limit):
        return
    from keel.tools.builtin.listing import human_size

    why = ctx.max_file_reason or f"files over {human_size(limit)} are refused here"
    raise ToolError(
        f"{raw} would be {human_size(size)}: {why}; nothing was written. Write a smaller file, "
        "or keep large data out of the workspace"
    )


def _commit(ctx: ToolContext, target: Path, before: str | None, after: str, raw: str) -> ToolOutput:
    _check_size(ctx, target, after, raw)
    _checkpoint(ctx, target, raw)
    _atomic_write(target, after)
    if ctx.checkpoints is not None:
        ctx.checkpoints.after_write(target)
    # The model knows what it wrote, so the new content counts as read.
    ctx.read_files[target] = stamp(target)
    name = display_path(ctx, target)
    lines = after.count("\n") + (0 if after.endswith("\n") or not after else 1)
    if before is None:
        return ToolOutput(f"Created {raw} ({lines} lines).", display=_diff("", after, name))
    return ToolOutput(f"Updated {raw}.", display=_diff(before, after, name))


async def _diagnosed(ctx: ToolContext, target: Path, text: str, out: ToolOutput) -> ToolOutput:
    """`out` with what the language server of `target` reports after the change (keel.lsp):
    its errors, and new errors in files importing it; `out` itself when no server applies."""
    if ctx.lsp is None:
        return out
    block = await ctx.lsp.after_write(target, text)
    if not block:
        return out
    return ToolOutput(f"{out.content}\n\n{block}", display=out.display, notice=out.notice)


# Not destructive: keel snapshots the file first (/undo) and writes only inside the project;
# idempotent: the same content twice leaves the same file.
@tool(idempotent=True, kind="builtin")
async def write(ctx: ToolContext, path: str, content: str) -> ToolOutput:
    """Create a file or overwrite one. Overwriting needs the file to have been read first.
    Prefer `edit` for changes to an existing file.

    Args:
        path: The file to write, relative to the working directory or absolute; inside the project.
        content: The whole new content of the file.
    """
    target = confine(ctx, path)
    if target.is_dir():
        raise is_directory(path)
    before = None
    if target.exists():
        check_regular(target, path)
        _check_fresh(ctx, target, path)
        before = target.read_text(encoding="utf-8", errors="replace")
    return await _diagnosed(ctx, target, content, _commit(ctx, target, before, content, path))


# Not idempotent: a second run finds old_string gone (or, if new_string holds it, replaces again).
@tool(idempotent=False, kind="builtin")
async def edit(
    ctx: ToolContext, path: str, old_string: str, new_string: str, replace_all: bool = False
) -> ToolOutput:
    """Replace exact text in a file. `old_string` must match the file exactly (whitespace
    included) and be unique unless `replace_all` is true; include surrounding lines to make it
    unique. Read the file first.

    Args:
        path: The file to change, relative to the working directory or absolute.
        old_string: The exact text to replace.
        new_string: The text to put in its place (must differ from old_string).
        replace_all: Replace every occurrence instead of exactly one.
    """
    target = confine(ctx, path)
    if not target.exists():
        raise ToolError(f"{path} does not exist; use write to create it")
    check_regular(target, path)
    if not old_string:
        raise ToolError("old_string is empty; to create a file use write")
    if old_string == new_string:
        raise ToolError("old_string and new_string are identical; nothing would change")
    _check_fresh(ctx, target, path)
    before = target.read_text(encoding="utf-8", errors="replace")
    after, n = _replace(before, old_string, new_string, replace_all, path)
    out = _commit(ctx, target, before, after, path)
    return await _diagnosed(
        ctx,
        target,
        after,
        ToolOutput(f"Edited {path}: {_plural(n, 'replacement')}.", display=out.display),
    )


def _replace(text: str, old: str, new: str, replace_all: bool, raw: str) -> tuple[str, int]:
    """`text` with `old` replaced by `new`, and how many times; `old` must occur, and only once
    unless `replace_all`."""
    count = text.count(old)
    if count == 0:
        raise ToolError(
            f"old_string not found in {raw}; read the file again and copy the text exactly"
        )
    if count > 1 and not replace_all:
        raise ToolError(
            f"old_string occurs {count} times in {raw}; add surrounding lines to make it "
            "unique, or set replace_all"
        )
    if replace_all:
        return text.replace(old, new), count
    return text.replace(old, new, 1), 1


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' if n != 1 else ''}"


_EDIT_KEYS = ("old_string", "new_string", "replace_all")


def _check_edits(edits: list[dict[str, Any]]) -> list[tuple[str, str, bool]]:
    """The edits as (old, new, replace_all), or an INVALID_ARGUMENTS error naming the first
    malformed one (1-based, as the model counts)."""
    if not edits:
        raise ToolError("INVALID_ARGUMENTS: edits is empty; give at least one edit")
    out = []
    for i, item in enumerate(edits, start=1):
        where = f"INVALID_ARGUMENTS: edit {i} of {len(edits)}"
        unknown = sorted(set(item) - set(_EDIT_KEYS))
        if unknown:
            raise ToolError(
                f"{where}: unknown key(s) {', '.join(unknown)}; accepted: {', '.join(_EDIT_KEYS)}"
            )
        for key in ("old_string", "new_string"):
            if key not in item:
                raise ToolError(f"{where}: missing {key}")
            if not isinstance(item[key], str):
                raise ToolError(f"{where}: {key} must be a string")
        old, new, replace_all = item["old_string"], item["new_string"], item.get("replace_all")
        if replace_all is None:
            replace_all = False
        if not isinstance(replace_all, bool):
            raise ToolError(f"{where}: replace_all must be true or false")
        if not old:
            raise ToolError(f"{where}: old_string is empty; to create a file use write")
        if old == new:
            raise ToolError(f"{where}: old_string and new_string are identical")
        out.append((old, new, replace_all))
    return out


@tool(idempotent=False, kind="builtin")
async def multi_edit(ctx: ToolContext, path: str, edits: list[dict[str, Any]]) -> ToolOutput:
    """Make several exact-text replacements in one file, all or nothing. Edits apply in order,
    each to the text the previous ones produced; if any fails, the file is left untouched. Each
    edit follows the rules of `edit`: `old_string` must match exactly and be unique unless
    `replace_all` is true. Prefer this over several `edit` calls to the same file. Read the file
    first.

    Args:
        path: The file to change, relative to the working directory or absolute.
        edits: The edits, in order; each is {"old_string": ..., "new_string": ...,
            "replace_all": false}.
    """
    target = confine(ctx, path)
    if not target.exists():
        raise ToolError(f"{path} does not exist; use write to create it")
    if target.is_dir():
        raise is_directory(path)
    check_regular(target, path)
    checked = _check_edits(edits)
    _check_fresh(ctx, target, path)
    before = target.read_text(encoding="utf-8", errors="replace")
    after = before
    total = 0
    for i, (old, new, replace_all) in enumerate(checked, start=1):
        try:
            after, n = _replace(after, old, new, replace_all, path)
        except ToolError as exc:
            # Later edits see the text earlier ones produced; say so, since that is the usual
            # reason a string copied from the file no longer matches.
            applied = {1: "", 2: " (after edit 1 was applied)"}.get(
                i, f" (after edits 1-{i - 1} were applied)"
            )
            raise ToolError(
                f"edit {i} of {len(checked)} failed{applied}: {exc}. Nothing was written to {path}."
            ) from None
        total += n
    if after == before:
        raise ToolError(f"the edits leave {path} unchanged; nothing was written")
    out = _commit(ctx, target, before, after, path)
    return await _diagnosed(
        ctx,
        target,
        after,
        ToolOutput(
            f"Edited {path}: {_plural(len(checked), 'edit')}, {_plural(total, 'replacement')}.",
            display=out.display,
        ),
    )


# `@tool` describes list[dict] items only as objects; spell out their keys for the model.
multi_edit.input_schema["properties"]["edits"]["items"] = {
    "type": "object",
    "properties": {
        "old_string": {"type": "string", "description": "The exact text to replace."},
        "new_string": {"type": "string", "description": "The text to put in its place."},
        "replace_all": {
            "type": "boolean",
            "description": "Replace every occurrence instead of exactly one.",
            "default": False,
        },
    },
    "required": ["old_string", "new_string"],
    "additionalProperties": False,
}
