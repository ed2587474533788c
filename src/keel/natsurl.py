"""A quick look at a NATS URL before nats-py connects to it.

nats-py (2.16) retries a refused first connect up to its reconnect limit even with reconnects
off, which turns "nothing listens there" into a two-minute wait. keel looks first and says it at
once. Imports nothing heavy (never nats-py).
"""

from __future__ import annotations

import asyncio
import contextlib


async def refused(url: str, within: float) -> str | None:
    """Why nothing listens at a `nats://` or `tls://` URL's first address (a refused
    connection), else None (a listener, or a URL this check does not read)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url.split(",")[0].strip())
        host, port = parts.hostname, parts.port or 4222
    except ValueError:
        return None
    if parts.scheme not in ("nats", "tls") or not host:
        return None
    try:
        _reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), within)
    except (OSError, TimeoutError) as exc:
        if isinstance(exc, ConnectionRefusedError):
            return "connection refused"
        return None  # let nats-py try, and say what it found
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return None
