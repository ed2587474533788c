"""The web front end's routes on `keel serve` (docs/web.md): the pages at `/` (sessions) and
`/fleet` (the fleet's queue, with `--fleet`), and their files at `/web/NAME`.

The pages and files need no token (they hold none and show nothing until the page has one: it
is given once in the address's fragment, `#token=…`, which the browser never sends, and kept in
the tab's session storage). The Host check applies as on every route. Every answer carries a
Content-Security-Policy that lets the page load and connect to this server only, so nothing the
agent writes into a transcript can run script or reach another origin.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

#: What the pages may load and connect to: this server only.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; font-src 'self'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)
#: Paths that answer without a token (the Host check still applies).
PAGES = {"/": "index.html", "/fleet": "fleet.html"}
#: The prefix of the pages' files; `is_open` lets them through the Guard.
FILES = "/web/"
#: A file's name: letters, digits, dots, dashes, underscores; no directories.
NAME = re.compile(r"\A[A-Za-z0-9_-][A-Za-z0-9_.-]*\Z")
TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".txt": "text/plain; charset=utf-8",
}


def is_open(path: str) -> bool:
    """A path of the web front end (served without a token): a page, or one file's name right
    under `/web/` (never `/web/../v1/info`: the router would not match it anyway, but the
    Guard does not count on that)."""
    return path in PAGES or (path.startswith(FILES) and bool(NAME.match(path[len(FILES) :])))


@cache
def _read(name: str) -> bytes | None:
    try:
        return resources.files("keel.server.web").joinpath(name).read_bytes()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None


def _answer(name: str) -> Response:
    suffix = name[name.rfind(".") :] if "." in name else ""
    body = _read(name) if NAME.match(name) and suffix in TYPES else None
    if body is None:
        return Response(
            b'{"error": "no such file", "hint": "the web front end is at /"}',
            404,
            media_type="application/json",
        )
    return Response(
        body,
        media_type=TYPES[suffix],
        headers={
            "content-security-policy": CSP,
            "x-content-type-options": "nosniff",
            "referrer-policy": "no-referrer",
            "cache-control": "no-cache",
        },
    )


async def page(request: Request) -> Response:
    return _answer(PAGES[request.url.path])


async def file(request: Request) -> Response:
    return _answer(request.path_params["name"])


def routes() -> list[Route]:
    return [
        *(Route(path, page, methods=["GET"]) for path in PAGES),
        Route(FILES + "{name}", file, methods=["GET"]),
    ]


__all__ = ["CSP", "FILES", "PAGES", "is_open", "routes"]
