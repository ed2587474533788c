"""The one truncation function every tool result passes through."""

from __future__ import annotations

#: Cap on a tool result the model sees, in bytes of UTF-8.
MAX_OUTPUT_BYTES = 30_000


def truncate(text: str, limit: int = MAX_OUTPUT_BYTES, *, note: str = "") -> str:
    """Keep the first two thirds and the last third of `text` within `limit` bytes, with
    `... [N bytes truncated] ...` (and `note`) between them. Cuts never split a character."""
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= limit:
        return text
    head_len = limit * 2 // 3
    tail_len = limit - head_len
    head = data[:head_len].decode("utf-8", "ignore")
    tail = data[len(data) - tail_len :].decode("utf-8", "ignore")
    dropped = len(data) - len(head.encode()) - len(tail.encode())
    extra = f"; {note}" if note else ""
    return f"{head}\n... [{dropped} bytes truncated{extra}] ...\n{tail}"
