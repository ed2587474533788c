"""The web front end's routes on `keel serve` (docs/web.md): the pages at `/` (sessions) and
`/fleet` (the fleet's queue, with `--fleet`), their files at `/web/NAME`, and the trace viewer of
a session's debug trace at a capability URL, `/trace/CAPABILITY/` (`TraceViews`).

The pages and files need no token (they hold none and show nothing until the page has one: it
is given once in the address's fragment, `#token=…`, which the browser never sends, and kept in
the tab's session storage). The Host check applies as on every route. Every answer carries a
Content-Security-Policy that lets the page load and connect to this server only, so nothing the
agent writes into a transcript can run script or reach another origin.
"""

from __future__ import annotations

import re
import secrets
from functools import cache
from importlib import resources
from pathlib import Path

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

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
#: The prefix of the trace viewers' capability URLs (`TraceViews`).
TRACES = "/trace/"
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
    """A path of the web front end (served without a token): a page, one file's name right
    under `/web/`, or a trace view's capability URL (its handler checks the capability). Never
    a dot segment (`/web/../v1/info`): the router would not match it anyway, but the Guard does
    not count on that."""
    if path in PAGES:
        return True
    if path.startswith(FILES):
        return bool(NAME.match(path[len(FILES) :]))
    if path.startswith(TRACES):
        segments = path[len(TRACES) :].removesuffix("/").split("/")
        return all(seg not in ("", ".", "..") for seg in segments)
    return False


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


class TraceViews:
    """The trace viewer (`keel.trace.viewer`) over sessions' debug traces, each at
    `/trace/CAPABILITY/`, a URL that `GET /v1/sessions/{id}/trace` hands out to a client holding
    the token. A tab opened on a link sends no `Authorization` header, so the unguessable
    capability in the path is the credential there, as in `keel trace`'s own server (whose app
    this is, with its Host check and CSP). Capabilities last as long as the server."""

    def __init__(self) -> None:
        self._apps: dict[str, ASGIApp] = {}
        self._capabilities: dict[Path, str] = {}

    def capability(self, directory: Path, port: int) -> str:
        """The path of the viewer of the trace in `directory` (made on first use)."""
        from keel.trace.viewer import live_app

        capability = self._capabilities.get(directory)
        if capability is None:
            capability = secrets.token_urlsafe(32)
            self._apps[capability] = live_app(directory, capability, port)
            self._capabilities[directory] = capability
        return f"{TRACES}{capability}/"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # `/trace/CAP/rest` is the viewer's `/CAP/rest`.
        path = str(scope["path"]).removeprefix(TRACES.rstrip("/"))
        capability = path.split("/")[1] if path.count("/") >= 2 else ""
        app = self._apps.get(capability)
        if app is None:
            await _answer("")(scope, receive, send)  # a 404: no such file
            return
        inner = {**scope, "path": path, "raw_path": path.encode(), "root_path": ""}
        await app(inner, receive, send)


def routes() -> list[Route]:
    return [
        *(Route(path, page, methods=["GET"]) for path in PAGES),
        Route(FILES + "{name}", file, methods=["GET"]),
    ]


__all__ = ["CSP", "FILES", "PAGES", "TRACES", "TraceViews", "is_open", "routes"]
