"""Where the fleet's NATS server is, and a connection to it.

The URL: `KEEL_NATS_URL`, else the local fleet's (`keel fleet up` writes it to
`<keel home>/fleet/url` and removes it on `keel fleet down`). Credentials as nats-py takes them:
`KEEL_NATS_CREDS` (a `.creds` file), `KEEL_NATS_TOKEN`, or a user and password in the URL; TLS
with a `tls://` URL (system trust store, or `KEEL_NATS_CA`, plus `KEEL_NATS_CERT`/`KEEL_NATS_KEY`
for a client certificate). nats-py is imported only here, when a fleet command runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Coroutine, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from keel.errors import UserError

if TYPE_CHECKING:
    from nats.aio.client import Client

T = TypeVar("T")

CONNECT_TIMEOUT = 5.0


class FleetError(UserError):
    """The fleet's NATS server cannot be reached or refused what keel asked."""


def url_file(env: Mapping[str, str] | None = None) -> Path:
    from keel.session.store import keel_home

    return keel_home(env) / "fleet" / "url"


def resolve_url(env: Mapping[str, str] | None = None, given: str = "") -> str:
    """The NATS URL a fleet command uses: `given` (a flag), `KEEL_NATS_URL`, the local fleet's."""
    env = os.environ if env is None else env
    if given:
        return given
    if env.get("KEEL_NATS_URL"):
        return env["KEEL_NATS_URL"]
    path = url_file(env)
    try:
        url = path.read_text(encoding="utf-8").strip()
    except OSError:
        url = ""
    if url:
        return url
    raise FleetError(
        "no fleet server: KEEL_NATS_URL is not set and no local fleet is up",
        hint="start one with `keel fleet up`, or set KEEL_NATS_URL=nats://HOST:PORT",
    )


def is_loopback(url: str) -> bool:
    """Whether every server `url` names (a comma list) listens on this machine's loopback
    address. Then only processes of this machine reach it, so the fleet's workers run here and
    see this machine's files and settings (`keel submit` checks a run request against them)."""
    import ipaddress
    from urllib.parse import urlsplit

    hosts: list[str] = []
    for part in (p.strip() for p in url.split(",")):
        if not part:
            continue
        try:
            host = urlsplit(part if "://" in part else f"nats://{part}").hostname
        except ValueError:
            return False
        if not host:
            return False
        hosts.append(host)

    def local(host: str) -> bool:
        if host == "localhost":
            return True
        try:
            return ipaddress.ip_address(host).is_loopback
        except ValueError:
            return False

    return bool(hosts) and all(local(h) for h in hosts)


def _tls(env: Mapping[str, str]) -> Any:
    import ssl

    context = ssl.create_default_context(cafile=env.get("KEEL_NATS_CA") or None)
    if env.get("KEEL_NATS_CERT"):
        context.load_cert_chain(env["KEEL_NATS_CERT"], env.get("KEEL_NATS_KEY") or None)
    return context


async def _quiet(_exc: Exception) -> None:
    return None  # nats-py reports connection trouble here; keel says it where it matters


async def connect(
    url: str, *, name: str = "keel", env: Mapping[str, str] | None = None, reconnect: bool = True
) -> Client:
    """A connection to `url`; `FleetError` (one line, with a hint) when nothing answers."""
    import nats

    env = os.environ if env is None else env
    options: dict[str, Any] = {
        "name": name,
        "connect_timeout": CONNECT_TIMEOUT,
        "allow_reconnect": reconnect,
        "max_reconnect_attempts": -1 if reconnect else 0,
        "reconnect_time_wait": 0.5,
        "error_cb": _quiet,
    }
    if env.get("KEEL_NATS_CREDS"):
        options["user_credentials"] = env["KEEL_NATS_CREDS"]
    if env.get("KEEL_NATS_TOKEN"):
        options["token"] = env["KEEL_NATS_TOKEN"]
    if url.startswith("tls://") or env.get("KEEL_NATS_CA"):
        options["tls"] = _tls(env)
    from keel.fleet.local import preflight

    # Said at once: nats-py retries a refused first connect until its timeout.
    await asyncio.to_thread(preflight, url)
    servers = [u.strip() for u in url.split(",") if u.strip()]
    try:
        # Bounded: with reconnects on, nats-py retries a first connect for ever.
        client: Client = await asyncio.wait_for(
            nats.connect(servers, **options), CONNECT_TIMEOUT * 2
        )
    except Exception as exc:  # nats-py raises several kinds; all mean "no server there"
        why = "no answer" if isinstance(exc, TimeoutError) else f"{type(exc).__name__}: {exc}"
        raise FleetError(
            f"cannot connect to the fleet's NATS server at {url} ({why})",
            hint="is it running? `keel fleet up` starts a local one; KEEL_NATS_URL names another",
        ) from None
    return client


async def _cancel_tasks() -> None:
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


class Bridge:
    """A NATS connection on its own thread and event loop, for callers that are not async (the
    journal's `append` is called from inside the agent loop, synchronously). `call` runs a
    coroutine there and waits for it."""

    def __init__(self, url: str, *, name: str = "keel", env: Mapping[str, str] | None = None):
        self.url = url
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="keel-fleet-nats", daemon=True
        )
        self._thread.start()
        try:
            self.nc: Client = self.call(connect(url, name=name, env=env))
        except BaseException:
            self._stop()
            raise
        self.js = self.nc.jetstream()

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = 30.0) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return future.result(timeout)

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
            self.call(self.nc.drain(), timeout=5)
        except Exception:  # closing: nothing more to say to a server that is gone
            # drain refuses while reconnecting; close still stops the client's own tasks (its
            # reconnect loop, its subscriptions' readers), which would outlive the loop.
            with contextlib.suppress(Exception):
                self.call(self.nc.close(), timeout=5)
            # nats-py's close can fail half-way (writing what it buffered to a dead socket)
            # and leave those tasks pending: cancel whatever still runs on this loop.
            with contextlib.suppress(Exception):
                self.call(_cancel_tasks(), timeout=5)
        self._stop()

    def _stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        if not self._thread.is_alive():
            self._loop.close()
