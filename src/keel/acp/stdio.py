"""`keel acp`'s transport: JSON-RPC over this process's stdin and stdout, and only there.

Before anything runs, the protocol takes stdin and stdout for itself (private, non-inheritable
copies of the descriptors); fd 0 then reads /dev/null and fd 1 writes to stderr. So nothing
else in the process (a stray print, a hook or tool child that inherits the descriptors) can
write into the protocol stream or read the client's messages. Logs go to stderr.
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
import sys
from collections.abc import Awaitable, Callable
from typing import IO, cast

from keel.acp.agent import Defaults, KeelAcpAgent
from keel.acp.lines import JsonLineTransport, LineReader


def claim_stdio() -> tuple[IO[bytes], IO[bytes]]:
    """The protocol's input and output, taken from fds 0 and 1; fd 0 becomes /dev/null and fd 1
    a copy of stderr (and `sys.stdout` writes there)."""
    sys.stdout.flush()
    rpc_in = os.dup(0)  # dup'ed descriptors are not inherited by child processes
    rpc_out = os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    return os.fdopen(rpc_in, "rb", buffering=0), os.fdopen(rpc_out, "wb", buffering=0)


async def open_streams(
    rpc_in: IO[bytes], rpc_out: IO[bytes]
) -> tuple[LineReader, asyncio.StreamWriter]:
    """Capped lines from the protocol's input and a writer for its output: pipes (as an editor
    starts keel) read and written without blocking; a regular file (`keel acp <
    requests.jsonl > replies`) read in a worker thread and written directly. Input is read
    only as lines are asked for, so a client that writes faster than keel reads is held back."""
    loop = asyncio.get_running_loop()
    read: Callable[[int], Awaitable[bytes]]
    if _is_file(rpc_in):

        async def read(size: int) -> bytes:
            return await loop.run_in_executor(None, rpc_in.read, size)

    else:
        pipe = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(pipe), rpc_in)
        read = pipe.read
    protocol = asyncio.StreamReaderProtocol(asyncio.StreamReader())
    transport: asyncio.WriteTransport
    if _is_file(rpc_out):
        transport = _FileTransport(rpc_out)
        protocol.connection_made(transport)
    else:
        transport, _ = await loop.connect_write_pipe(lambda: protocol, rpc_out)
    return LineReader(read), asyncio.StreamWriter(transport, protocol, None, loop)


def _is_file(f: IO[bytes]) -> bool:
    return stat.S_ISREG(os.fstat(f.fileno()).st_mode)


class _FileTransport(asyncio.WriteTransport):
    """Writes straight to a regular file (a write to a file does not wait on a reader)."""

    def __init__(self, target: IO[bytes]) -> None:
        super().__init__()
        self._target = target
        self._closing = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._target.write(bytes(data))

    def can_write_eof(self) -> bool:
        return False

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        self._closing = True


async def serve(defaults: Defaults, rpc_in: IO[bytes], rpc_out: IO[bytes]) -> None:
    """Serve one client until it closes the connection, then end every session."""
    import acp

    lines, writer = await open_streams(rpc_in, rpc_out)
    agent = KeelAcpAgent(defaults)
    try:
        # The router looks each method up on the agent: those keel leaves out (session/list,
        # config options, the unstable fork/resume/close) answer "method not found".
        await acp.run_agent(cast(acp.Agent, agent), JsonLineTransport(lines, writer))
    finally:
        await agent.close()


def run(defaults: Defaults) -> int:
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO if defaults.debug else logging.WARNING,
        format="%(message)s",
    )
    rpc_in, rpc_out = claim_stdio()
    asyncio.run(serve(defaults, rpc_in, rpc_out))
    return 0


__all__ = ["claim_stdio", "open_streams", "run", "serve"]
