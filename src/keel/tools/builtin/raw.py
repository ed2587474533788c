"""Whole tool outputs that were too long to show: kept beside the session file
(`<session>.raw/<tool_use_id>.txt`, 0600 in a 0700 directory) and paged by `raw_output`."""

from __future__ import annotations

import os
import re
from pathlib import Path

from keel.tools.base import ToolContext, ToolError, ToolOutput, tool

MAX_PAGE = 20_000
_ID = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")


def save_raw(directory: Path, tool_use_id: str, text: str) -> Path | None:
    """Keep `text` for `raw_output`; None when the id cannot name a file safely."""
    if not _ID.match(tool_use_id):
        return None
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = directory / f"{tool_use_id}.txt"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8", errors="replace") as f:
        f.write(text)
    return path


@tool(read_only=True, kind="builtin")
async def raw_output(
    ctx: ToolContext, tool_use_id: str, offset: int = 0, limit: int = MAX_PAGE
) -> ToolOutput:
    """Page through the whole output of an earlier tool call whose result was truncated (its
    result says `raw_output(tool_use_id=…)`). Returns the bytes from `offset`, at most 20,000.

    Args:
        tool_use_id: The id of the tool call whose output was cut.
        offset: The byte to start from.
        limit: How many bytes to return (at most 20,000).
    """
    if ctx.raw_dir is None:
        raise ToolError("no outputs are kept in this run (it has no session file)")
    if not _ID.match(tool_use_id):
        raise ToolError(f"{tool_use_id!r} is not a tool call id")
    path = ctx.raw_dir / f"{tool_use_id}.txt"
    if not path.is_file():
        raise ToolError(
            f"no kept output for {tool_use_id}: only outputs that were truncated are kept"
        )
    if offset < 0:
        raise ToolError("offset must be 0 or more")
    limit = max(1, min(limit, MAX_PAGE))
    data = path.read_bytes()
    chunk = data[offset : offset + limit].decode("utf-8", "replace")
    end = min(len(data), offset + limit)
    note = (
        f"\n\n[bytes {offset}-{end} of {len(data)}; continue with offset={end}]"
        if end < len(data)
        else f"\n\n[bytes {offset}-{end} of {len(data)}; the end]"
    )
    return ToolOutput(chunk + note)
