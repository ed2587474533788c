"""`keel acp`'s framing: newline-delimited JSON-RPC messages, each line capped, each checked to be
a JSON-RPC message before the `acp` package's connection sees it.

The package's own reader joins a line of any length before parsing it and hands on whatever
JSON it parses (a bare `42` ends its receive loop). Here a line over `LINE_LIMIT` is dropped as
it streams past, never held whole, and a line that is not a JSON-RPC message is answered with a
JSON-RPC error (id null); serving goes on after both. Never reads or writes the process's own
stdio: `keel.acp.stdio` hands in the streams.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, Final

#: The longest line read as a message. Messages can carry whole files (embedded context), so
#: it is far above asyncio's 64 KiB default, but bounded: a longer line is refused.
LINE_LIMIT: Final = 16 << 20

#: How much one read asks for.
CHUNK: Final = 1 << 20

PARSE_ERROR: Final = -32700
INVALID_REQUEST: Final = -32600


class Oversize:
    """A line longer than the limit, skipped to its end."""


OVERSIZE: Final = Oversize()


class LineReader:
    """Lines from a byte source, at most `limit` bytes each (the newline not counted)."""

    def __init__(self, read: Callable[[int], Awaitable[bytes]], *, limit: int = LINE_LIMIT):
        self._read = read
        self._limit = limit
        self._buffer = bytearray()
        self._eof = False

    @property
    def limit(self) -> int:
        return self._limit

    async def next_line(self) -> bytes | Oversize | None:
        """The next line without its newline; `OVERSIZE` for a line over the limit (its bytes
        already dropped); None at the end of the input."""
        skipping = False
        scanned = 0
        while True:
            end = self._buffer.find(b"\n", scanned)
            if end >= 0:
                line = bytes(memoryview(self._buffer)[:end])
                del self._buffer[: end + 1]
                return OVERSIZE if skipping or end > self._limit else line
            if len(self._buffer) > self._limit:
                skipping = True
                self._buffer.clear()
            scanned = len(self._buffer)
            if self._eof:
                break
            chunk = await self._read(CHUNK)
            if not chunk:
                self._eof = True
            self._buffer += chunk
        if skipping:
            return OVERSIZE
        if self._buffer:
            line = bytes(self._buffer)
            self._buffer.clear()
            return line
        return None


def malformed(message: object) -> str | None:
    """Why `message` is not a JSON-RPC message the connection can route; None if it is one."""
    if not isinstance(message, dict):
        return "a JSON-RPC message is a JSON object"
    if "method" in message and not isinstance(message["method"], str):
        return "a method is a string"
    if "id" in message and not isinstance(message["id"], str | int | float | None):
        return "an id is a string, a number or null"
    if "method" not in message and "id" not in message:
        return "a message needs a method (a request) or an id"
    return None


class JsonLineTransport:
    """The `acp` package's message transport (`send`, `receive`, `close`) over JSON lines."""

    def __init__(self, lines: LineReader, writer: asyncio.StreamWriter) -> None:
        self._lines = lines
        self._writer = writer
        self._writing = asyncio.Lock()

    async def send(self, message: dict[str, Any]) -> None:
        data = (json.dumps(message, separators=(",", ":")) + "\n").encode()
        async with self._writing:  # one message at a time, whole
            self._writer.write(data)
            await self._writer.drain()

    async def receive(self) -> dict[str, Any] | None:
        """The next JSON-RPC message, answering every line before it that was not one."""
        while True:
            line = await self._lines.next_line()
            if line is None:
                return None
            if isinstance(line, Oversize):
                await self._refuse(
                    INVALID_REQUEST,
                    f"Invalid Request: a message is at most {_size(self._lines.limit)} "
                    "(this line was longer)",
                )
                continue
            if not line.strip():
                continue
            try:
                message = json.loads(line)
            except ValueError:
                await self._refuse(PARSE_ERROR, "Parse error: not JSON")
                continue
            except RecursionError:
                await self._refuse(PARSE_ERROR, "Parse error: JSON nested too deep")
                continue
            problem = malformed(message)
            if problem is not None:
                await self._refuse(INVALID_REQUEST, f"Invalid Request: {problem}")
                continue
            received: dict[str, Any] = message
            return received

    async def close(self) -> None:
        """Nothing to release: the streams belong to `keel.acp.stdio`."""

    async def _refuse(self, code: int, message: str) -> None:
        await self.send({"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}})


def _size(limit: int) -> str:
    return f"{limit >> 20} MiB" if limit >= 1 << 20 else f"{limit} bytes"


__all__ = ["LINE_LIMIT", "OVERSIZE", "JsonLineTransport", "LineReader", "Oversize", "malformed"]
