"""The one truncation function every tool result passes through, and the bounded line reader
tools use so that what they read costs about their budget in memory, not the size of the input.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import BinaryIO

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


# -- reading within a budget -------------------------------------------------------------------

#: UTF-8 continuation bytes: a line's characters are its bytes minus these.
_CONTINUATION = bytes(range(0x80, 0xC0))
_CHUNK = 1024 * 1024


class Line:
    """One line as `LineReader` read it: at most `keep` bytes of it and its length in
    characters (counted as UTF-8, the whole line, however much of it was kept)."""

    __slots__ = ("chars_beyond", "cut", "data")

    def __init__(self, data: bytes, cut: bool, chars_beyond: int) -> None:
        self.data = data
        #: Whether bytes past `data` were dropped.
        self.cut = cut
        self.chars_beyond = chars_beyond

    def text(self, max_chars: int) -> str:
        """The line decoded (a trailing `\\r` dropped), cut to `max_chars` characters with
        `… [line truncated, N chars]`."""
        text = self.data.decode("utf-8", "replace")
        if not self.cut:
            text = text.rstrip("\r")
        chars = len(text) + self.chars_beyond
        if chars <= max_chars:
            return text
        return text[:max_chars] + f"… [line truncated, {chars} chars]"


class LineReader:
    """The lines of a binary file in bounded memory: reads `_CHUNK` bytes at a time and keeps at
    most `keep` bytes of each line (the rest is counted, never held), so a 300 MB line costs a
    chunk, not 300 MB. `count_rest()` counts the lines not yet read without materialising them."""

    def __init__(self, f: BinaryIO, keep: int) -> None:
        self.f = f
        self.keep = keep
        self._chunk = b""
        self._pos = 0

    def _fill(self) -> bool:
        if self._pos < len(self._chunk):
            return True
        self._chunk = self.f.read(_CHUNK)
        self._pos = 0
        return bool(self._chunk)

    def __iter__(self) -> Iterator[Line]:
        kept = bytearray()
        beyond = 0  # characters dropped
        dropped = False
        partial = False  # part of a line has been read
        while self._fill():
            chunk, start = self._chunk, self._pos
            partial = True
            end = chunk.find(b"\n", start)
            stop = len(chunk) if end < 0 else end
            room = max(self.keep - len(kept), 0)
            kept += chunk[start : min(stop, start + room)]
            if stop - start > room:
                dropped = True
                piece = chunk[start + room : stop]
                beyond += len(piece.translate(None, _CONTINUATION))
            if end < 0:
                self._pos = len(chunk)
                continue
            self._pos = end + 1
            yield Line(bytes(kept), dropped, beyond)
            kept.clear()
            beyond, dropped, partial = 0, False, False
        if partial:
            yield Line(bytes(kept), dropped, beyond)

    def count_rest(self) -> int:
        """How many lines follow what was read (a last line without a newline counts)."""
        count = 0
        last = b"\n"
        while self._fill():
            piece = self._chunk[self._pos :]
            count += piece.count(b"\n")
            last = piece[-1:]
            self._pos = len(self._chunk)
        return count + (last != b"\n")
