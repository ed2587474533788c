"""`keel attach URL [SESSION]`: the terminal UI on a session that a `keel serve` hosts
(docs/server.md, "Attaching a terminal"). The same screen as `keel`, fed by the server's event
stream and answering over HTTP (`keel.tui.remote`); leaving it detaches, and the session's work
goes on on the server.

The token: `--token-file F` (refused when others can read it, as `keel serve` refuses it), the
URL's `#token=…` (the address `keel serve` prints), else `KEEL_SERVER_TOKEN`. Every failure
before the screen opens (no server there, a wrong token, no such session) is one line on stderr
and exit 2. textual and httpx are imported here, never by `keel` or `keel -p`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from urllib.parse import parse_qs, urlsplit

from keel.cli.main import EXIT_OK, _Parser
from keel.errors import UserError


def parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="keel attach",
        description="Drive a session that `keel serve` hosts from this terminal: the same screen "
        "as keel, over HTTP. Leaving (Ctrl+C twice, Ctrl+D, /quit) detaches; the session goes on.",
    )
    p.add_argument("url", metavar="URL", help="the server, e.g. http://127.0.0.1:4096/#token=…")
    p.add_argument(
        "session",
        metavar="SESSION",
        nargs="?",
        help="a session id or a unique prefix (default: the server's latest session)",
    )
    p.add_argument("--token-file", metavar="F", help="read the bearer token from F (mode 0600)")
    p.add_argument("--new", action="store_true", help="start a new session on the server")
    p.add_argument("--model", metavar="M", help="the new session's model (with --new)")
    p.add_argument("--mode", metavar="X", help="the new session's permission mode (with --new)")
    p.add_argument(
        "--force",
        action="store_true",
        help="load a session made under another configuration anyway",
    )
    p.add_argument(
        "--no-tui",
        action="store_true",
        help="line mode (also when stdin or stdout is not a terminal)",
    )
    p.add_argument("--debug", action="store_true", help="tracebacks")
    return p


def server_address(url: str) -> tuple[str, str | None]:
    """The server's base URL and the token in its `#token=…` fragment (None: none)."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise UserError(
            f"{url!r} is not an http:// address",
            hint="give the address keel serve printed, e.g. http://127.0.0.1:4096",
        )
    token = parse_qs(parts.fragment).get("token", [None])[-1] if parts.fragment else None
    return f"{parts.scheme}://{parts.netloc}", token


def token_for(fragment: str | None, token_file: str | None, env: dict[str, str]) -> str:
    """--token-file, else the URL's `#token=`, else KEEL_SERVER_TOKEN."""
    if token_file is not None:
        from keel.cli.serve import read_token

        token, _generated = read_token(token_file, {})  # refuses a file others can read
        return token
    if fragment:
        return fragment.strip()
    if env.get("KEEL_SERVER_TOKEN", "").strip():
        return env["KEEL_SERVER_TOKEN"].strip()
    raise UserError(
        "no token for the server",
        hint="give the URL keel serve printed (…/#token=…), --token-file F, or KEEL_SERVER_TOKEN",
    )


def attach(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    base, fragment = server_address(args.url)
    token = token_for(fragment, args.token_file, dict(os.environ))
    return asyncio.run(_attach(args, base, token))


async def _attach(args: argparse.Namespace, base: str, token: str) -> int:
    from keel.tui.remote import Connection, RemoteController, open_session

    connection = Connection(base, token)
    try:
        described = await open_session(
            connection,
            args.session,
            new=args.new,
            model=args.model,
            mode=args.mode,
            force=args.force,
        )
        controller = RemoteController(connection, described)
        await controller.load()
    except BaseException:
        await connection.aclose()
        raise
    if args.no_tui or not (sys.stdin.isatty() and sys.stdout.isatty()):
        from keel.tui.line import run_line

        await run_line(controller)  # closes the controller
    else:
        from keel.tui.app import KeelApp

        app = KeelApp(controller)
        try:
            await app.run_async()
        finally:
            await controller.close()
    print(detached_line(controller.session_id, base, controller.running), flush=True)
    return EXIT_OK


def detached_line(session_id: str, base: str, running: bool) -> str:
    going = "its work goes on there" if running else "it stays loaded there"
    return (
        f"Detached from session {session_id} on {base}: {going}. "
        f"To come back: keel attach {base} {session_id}"
    )


__all__ = ["attach", "detached_line", "parser", "server_address", "token_for"]
