"""`keel serve`: host this project's sessions over HTTP + SSE (docs/server.md).

Parses the flags, settles the token (KEEL_SERVER_TOKEN, else --token-file, else a generated one,
printed) and the address (loopback unless --allow-remote), binds the socket itself (so port 0's
pick is known before the first request and goes into the Host check), and runs the app on
uvicorn. Starlette and uvicorn are imported here, never by `keel` or `keel -p`.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import secrets
import socket
import stat
import sys
from pathlib import Path

from keel.cli.main import _Parser
from keel.errors import UserError

DEFAULT_PORT = 4096
#: Descriptors each loaded session holds open (its journal and the journal's lock file).
FDS_PER_SESSION = 2
#: A token shorter than this is refused (a generated one is 32 bytes, as hex).
MIN_TOKEN = 16


def parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="keel serve",
        description="Host this project's keel sessions over HTTP with Server-Sent Events "
        "(docs/server.md). Listens on 127.0.0.1; every request but /v1/health needs the bearer "
        "token (KEEL_SERVER_TOKEN, --token-file, or generated and printed).",
    )
    p.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help=f"port (default {DEFAULT_PORT}; 0: a free one)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument(
        "--allow-remote",
        action="store_true",
        help="allow a --host that is not loopback (the token then crosses the network in clear: "
        "put TLS in front)",
    )
    p.add_argument(
        "--all-projects",
        action="store_true",
        help="host sessions of every project, not only this one",
    )
    p.add_argument("--token-file", metavar="F", help="read the bearer token from F (mode 0600)")
    p.add_argument("--cwd", help="the project (default: the current directory)")
    p.add_argument(
        "--fleet",
        nargs="?",
        const="",
        metavar="URL",
        help="also front the fleet's work queue at /v1/runs (URL, else KEEL_NATS_URL or the "
        "local fleet; docs/server.md)",
    )
    p.add_argument("--debug", action="store_true", help="tracebacks and uvicorn's log")
    return p


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def read_token(token_file: str | None, env: dict[str, str]) -> tuple[str, bool]:
    """The bearer token (--token-file, else KEEL_SERVER_TOKEN, else generated) and whether it
    was generated (then it is printed)."""
    given: str | None = None
    where = ""
    if token_file is not None:
        path = Path(token_file).expanduser()
        try:
            mode = path.stat().st_mode
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise UserError(f"cannot read --token-file {path}: {exc.strerror}") from exc
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise UserError(
                f"--token-file {path} can be read by other users (mode {stat.S_IMODE(mode):04o})",
                hint=f"chmod 600 {path}",
            )
        given, where = text.strip(), f"--token-file {path}"
    elif "KEEL_SERVER_TOKEN" in env:
        given, where = env["KEEL_SERVER_TOKEN"].strip(), "KEEL_SERVER_TOKEN"
    if given is None:
        return secrets.token_hex(32), True
    if len(given) < MIN_TOKEN or any(c.isspace() for c in given):
        raise UserError(
            f"the token in {where} is too short or has spaces (at least {MIN_TOKEN} characters)",
            hint="generate one: python -c 'import secrets; print(secrets.token_hex(32))'",
        )
    return given, False


def allowed_hosts(host: str, port: int, allow_remote: bool) -> frozenset[str] | None:
    """The Host header values this server answers (None: any, a wildcard address)."""
    names = {"127.0.0.1", "localhost", "[::1]"}
    if allow_remote:
        if host in ("0.0.0.0", "::", ""):
            return None
        names.add(f"[{host}]" if ":" in host else host)
    hosts = {f"{name}:{port}" for name in names}
    if port == 80:
        hosts |= names
    return frozenset(h.lower() for h in hosts)


def bind(host: str, port: int) -> socket.socket:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _, address = infos[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError:
            sock.close()
            raise
    except OSError as exc:
        raise UserError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}",
            hint="pick another --port (0: a free one)",
        ) from exc
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def raise_fd_limit() -> int:
    """Raise this process's soft limit on open files to its hard limit, and return it.

    Each loaded session holds `FDS_PER_SESSION` descriptors and each running one a connection to
    its model: under the usual soft limit of 1024, a server stops loading sessions (EMFILE) at
    about 500. The hard limit is what the administrator allows; asking for it is what servers
    do (nginx's worker_rlimit_nofile, Go's runtime since 1.19)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # An unlimited hard limit (macOS) cannot be the soft one: ask for a generous number.
    wanted = max(soft, 1 << 16) if hard == resource.RLIM_INFINITY else hard
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    except (ValueError, OSError):  # a container that refuses: keep what we were given
        return soft
    return wanted


def serve(argv: list[str]) -> int:
    from keel.startup import pause_gc

    # Start-up builds long-lived objects (modules, classes) and few cycles: the collector waits
    # until the server is up, then freezes them (`Server.startup`), so that the full collections
    # of a server holding many sessions no longer walk them.
    pause_gc()
    args = parser().parse_args(argv)
    if not 0 <= args.port <= 65535:
        raise UserError(f"--port must be from 0 to 65535, not {args.port}")
    if not is_loopback(args.host) and not args.allow_remote:
        raise UserError(
            f"--host {args.host} is not a loopback address",
            hint="add --allow-remote to listen there (anyone who reaches it and has the token "
            "runs commands as you)",
        )
    cwd = Path(args.cwd).resolve() if args.cwd else Path.cwd()
    if not cwd.is_dir():
        raise UserError(f"--cwd {cwd} is not a directory")
    token, generated = read_token(args.token_file, dict(os.environ))
    fleet_url: str | None = None
    if args.fleet is not None:
        from keel.fleet.connect import resolve_url
        from keel.fleet.local import preflight

        fleet_url = resolve_url(given=args.fleet)
        preflight(fleet_url)  # a fleet that is not there is said now, in one line
    raise_fd_limit()
    sock = bind(args.host, args.port)
    port = sock.getsockname()[1]
    hosts = allowed_hosts(args.host, port, args.allow_remote)
    shown = f"[{args.host}]" if ":" in args.host else args.host
    if args.allow_remote and not is_loopback(args.host):
        print(
            f"keel serve: warning: listening on {shown}:{port}, beyond this machine: anyone who "
            "reaches it with the token runs commands as you, and the token crosses the network "
            "in clear (put TLS in front)"
            + ("; any Host header is accepted on a wildcard address" if hosts is None else ""),
            file=sys.stderr,
        )
    print(f"keel serve: listening on http://{shown}:{port} for {cwd}", flush=True)
    if fleet_url is not None:
        from keel.server.fleet_routes import redact

        print(f"keel serve: fronting the fleet at {redact(fleet_url)} (/v1/runs)", flush=True)
    # The page reads the token from the fragment, which the browser never sends (docs/web.md).
    local = "127.0.0.1" if args.host in ("0.0.0.0", "::", "") else shown
    fragment = f"#token={token}" if generated else ""
    print(f"keel serve: open http://{local}:{port}/{fragment}", flush=True)
    if generated:
        print(f"keel serve: token {token}", flush=True)
    from keel.permissions.sandbox import start_probe

    start_probe()  # GET /v1/info and every session's gate need it: bubblewrap's start overlaps ours
    return _run(
        sock,
        cwd,
        token,
        hosts,
        all_projects=args.all_projects,
        debug=args.debug,
        fleet_url=fleet_url,
    )


def _run(
    sock: socket.socket,
    cwd: Path,
    token: str,
    hosts: frozenset[str] | None,
    *,
    all_projects: bool,
    debug: bool,
    fleet_url: str | None = None,
) -> int:
    import asyncio

    import uvicorn

    from keel.server.host import Host
    from keel.server.http import create_app

    class Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            from keel.startup import resume_gc

            resume_gc()

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            host.end_streams()  # open SSE connections would hold the shutdown up
            await super().shutdown(sockets)

    host = Host(cwd, all_projects=all_projects)

    async def main() -> None:
        app = create_app(host, token=token, hosts=hosts, debug=debug, fleet_url=fleet_url)
        config = uvicorn.Config(
            app,
            log_level="info" if debug else "warning",
            # The access log would write `?token=` of the events route to the terminal.
            access_log=False,
            ws="none",
            lifespan="on",
            timeout_graceful_shutdown=5,
            timeout_keep_alive=30,
        )
        await Server(config).serve(sockets=[sock])

    asyncio.run(main())
    return 0


__all__ = ["serve"]
