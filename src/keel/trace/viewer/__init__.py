"""The trace viewer: one offline page over a session's trace folder (`<id>.trace/`).

This module owns the two ways to look at a trace: `serve`, a local web server that tails the
trace live (127.0.0.1 only, a random port, a random token in the URL path, the Host header pinned
against DNS rebinding, nothing cached), and `write_html`, one self-contained static page with the
records and the HTTP bodies inlined. The page itself (`page.html`, `viewer.css`, `viewer.js`) is
plain HTML, CSS and JavaScript that makes no external request; it rebuilds every request from the
delta records itself. Starlette and uvicorn are imported only inside `serve`.

It must never serve a file outside the trace folder, answer a request without the token or with
a foreign Host header, or put record content into the page other than as escaped JSON.
"""

from __future__ import annotations

import base64
import bisect
import hashlib
import hmac
import json
import os
import re
import secrets
import socket
import webbrowser
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["BODY_NAME", "live_app", "read_records", "serve", "write_html"]

#: The only names a body file may have: `http/0001-request.json`, `http/0001-response.txt` and
#: `http/0002-request.tail` (a body stored as what it adds to an earlier one, `request_delta`).
BODY_NAME = re.compile(r"\A[0-9]{4,12}-(?:request\.json|request\.tail|response\.txt)\Z")

#: What the page may load: only itself (served) or nothing at all (static). Content in records is
#: never markup, but if it ever were, it could neither run script nor reach the network.
_CSP_SERVED = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; base-uri 'none'; form-action 'none'"
)
#: The static page's: only its own script and style run, named by their hashes (so a script
#: that somehow got into the page would not), and nothing may be fetched.
_CSP_STATIC = (
    "default-src 'none'; script-src '{script}'; style-src '{style}'; "
    "img-src data:; base-uri 'none'; form-action 'none'"
)


def _csp_hash(text: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()


def _asset(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


class _Tail:
    """Reads `events.jsonl` incrementally: only the bytes appended since the last read, and only
    whole lines (a line still being written waits for the next poll)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.records: list[dict[str, Any]] = []
        self.seqs: list[int] = []  # the records' numbers, increasing while `ordered`
        self.ordered = True

    def refresh(self) -> list[dict[str, Any]]:
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return self.records
        end = chunk.rfind(b"\n")
        if end < 0:
            return self.records
        for line in chunk[: end + 1].splitlines():
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a damaged line: the rest of the trace is still worth seeing
            if isinstance(record, dict) and isinstance(record.get("seq"), int):
                if self.seqs and record["seq"] <= self.seqs[-1]:
                    self.ordered = False
                self.records.append(record)
                self.seqs.append(record["seq"])
        self.offset += end + 1
        return self.records

    def after(self, seq: int) -> list[dict[str, Any]]:
        """The records numbered above `seq`: a page that polls gets only what is new, found by
        bisection (a trace whose numbers went backwards is filtered in full)."""
        records = self.refresh()
        if self.ordered:
            return records[bisect.bisect_right(self.seqs, seq) :]
        return [r for r, n in zip(records, self.seqs, strict=True) if n > seq]


def read_records(directory: Path) -> list[dict[str, Any]]:
    """Every whole record of `directory/events.jsonl`, in file order (a torn last line is left
    out)."""
    return _Tail(directory / "events.jsonl").refresh()


def _body_path(directory: Path, name: str) -> Path | None:
    """The body file `name` inside `directory/http`, or None when the name is not one a body may
    have or the file is not a regular file inside the folder."""
    if not BODY_NAME.match(name):
        return None
    folder = (directory / "http").resolve()
    path = (folder / name).resolve()
    if path.parent != folder or not path.is_file():
        return None
    return path


def _file(directory: Path, ref: object) -> bytes | None:
    """The bytes of the body file a record names (`http/0001-response.txt`), or None when the
    name is not a body's or the file is missing."""
    if not isinstance(ref, str) or not ref.startswith("http/"):
        return None
    path = _body_path(directory, ref.removeprefix("http/"))
    return None if path is None else path.read_bytes()


def _exchanges(records: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """The `data` of every `http` record, by its number `n`."""
    out: dict[int, dict[str, Any]] = {}
    for record in records:
        data = record.get("data")
        if (
            record.get("kind") == "http"
            and isinstance(data, dict)
            and isinstance(data.get("n"), int)
        ):
            out[data["n"]] = data
    return out


def _request_body(directory: Path, exchanges: dict[int, dict[str, Any]], n: int) -> bytes | None:
    """The exact request body of exchange `n`: its `request_file`, or put together from its
    `request_delta` (the first `keep` bytes of body `base`, then the tail file). None when a
    file is missing or a record is malformed (a base must come before the body built on it)."""
    chain: list[tuple[int, bytes]] = []
    while True:
        data = exchanges.get(n)
        if data is None:
            return None
        delta = data.get("request_delta")
        if not isinstance(delta, dict):
            body = _file(directory, data.get("request_file"))
            break
        tail, base, keep = _file(directory, delta.get("file")), delta.get("base"), delta.get("keep")
        if tail is None or not isinstance(base, int) or not isinstance(keep, int) or base >= n:
            return None
        chain.append((keep, tail))
        n = base
    if body is None:
        return None
    for keep, tail in reversed(chain):
        body = body[:keep] + tail
    return body


def _response_body(directory: Path, exchanges: dict[int, dict[str, Any]], n: int) -> bytes | None:
    data = exchanges.get(n)
    return None if data is None else _file(directory, data.get("response_file"))


def _page_bodies(
    directory: Path, exchanges: dict[int, dict[str, Any]], cap: int
) -> dict[str, dict[str, Any]]:
    """Every body for the static page, by `request/N` and `response/N`: `{text, size,
    truncated}`, or for a request stored as what it adds to an earlier one (the tracer's
    `request_delta`) `{base, keep, tail, size, truncated}`: the page takes the first `keep`
    characters of body `base`, then `tail`. So a long session's page grows with what is new, as
    its trace does. Each text or tail is cut at `cap` bytes; a body whose base was cut is given
    whole (and cut)."""
    bodies: dict[str, dict[str, Any]] = {}
    recent: dict[int, bytes] = {}  # the last few whole bodies: the bases of the next ones
    complete: set[int] = set()  # bodies the page has byte for byte
    for n in sorted(exchanges):
        delta = exchanges[n].get("request_delta")
        raw: bytes | None = None
        entry: dict[str, Any] | None = None
        if (
            isinstance(delta, dict)
            and isinstance(delta.get("base"), int)
            and delta["base"] in recent
        ):
            base, keep = delta["base"], delta.get("keep")
            tail = _file(directory, delta.get("file"))
            if tail is not None and isinstance(keep, int) and 0 <= keep <= len(recent[base]):
                raw = recent[base][:keep] + tail
                if base in complete:
                    entry = _as_tail(raw, base, keep, cap)
        else:
            raw = _request_body(directory, exchanges, n)
        if raw is not None:
            entry = entry or _as_text(raw, cap)
            bodies[f"request/{n}"] = entry
            if not entry["truncated"]:
                complete.add(n)
            recent[n] = raw
            if len(recent) > 16:
                del recent[min(recent)]
        response = _response_body(directory, exchanges, n)
        if response is not None:
            bodies[f"response/{n}"] = _as_text(response, cap)
    return bodies


def _as_text(raw: bytes, cap: int) -> dict[str, Any]:
    return {
        "text": raw[:cap].decode("utf-8", errors="replace"),
        "size": len(raw),
        "truncated": len(raw) > cap,
    }


def _as_tail(raw: bytes, base: int, keep: int, cap: int) -> dict[str, Any]:
    """`raw` as its first `keep` bytes (shared with body `base`) and the rest, split at a
    character boundary and counted in the page's UTF-16 units; whole when it is not UTF-8."""
    while 0 < keep < len(raw) and raw[keep] & 0xC0 == 0x80:
        keep -= 1  # the split fell inside a UTF-8 sequence
    try:
        prefix, tail = raw[:keep].decode("utf-8"), raw[keep:].decode("utf-8")
    except UnicodeDecodeError:
        return _as_text(raw, cap)
    cut = raw[keep:][:cap].decode("utf-8", errors="ignore")
    return {
        "base": base,
        "keep": len(prefix.encode("utf-16-le")) // 2,
        "tail": cut,
        "size": len(raw),
        "truncated": len(cut) < len(tail),
    }


def _embed(value: object) -> str:
    """JSON that is inert inside a `<script>` element: no `<`, `>` or `&` (so no `</script>` and
    no `<!--`), and no line separators that older parsers took for line ends."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return (
        text.replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )


def _page(*, head: str, body_end: str, csp: str) -> str:
    page = _asset("page.html")
    return (
        page.replace("<!--CSP-->", csp.replace('"', "&quot;"))
        .replace("<!--HEAD-->", head)
        .replace("<!--BODY-END-->", body_end)
    )


def write_html(directory: Path, out: Path, *, body_cap: int = 256_000) -> None:
    """Write one self-contained page for the trace in `directory` to `out`: the records and every
    HTTP body they name inlined (each body cut at `body_cap` bytes, with a mark saying how big it
    was), no external reference of any kind."""
    records = read_records(directory)
    data = {
        "records": records,
        "bodies": _page_bodies(directory, _exchanges(records), body_cap),
        "source": directory.name,
    }
    style = _asset("viewer.css")
    head = f"<style>{style}</style>"
    script = _asset("viewer.js")
    if "</script" in script.lower() or "<!--" in script:
        raise ValueError("viewer.js must not contain '</script' or '<!--'")
    body_end = (
        f'<script type="application/json" id="trace-data">{_embed(data)}</script>\n'
        f"<script>{script}</script>"
    )
    csp = _CSP_STATIC.format(script=_csp_hash(script), style=_csp_hash(style))
    page = _page(head=head, body_end=body_end, csp=csp).encode()
    # The page holds the whole conversation: as private as the trace (0600), even if `out`
    # already existed with a wider mode.
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(page)


def _app(directory: Path, token: str, port: int) -> ASGIApp:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, PlainTextResponse, Response
    from starlette.routing import Route

    tail = _Tail(directory / "events.jsonl")
    page = _page(
        head='<link rel="stylesheet" href="viewer.css">',
        body_end='<script src="viewer.js"></script>',
        csp=_CSP_SERVED,
    )

    async def index(request: Request) -> Response:
        return Response(page, media_type="text/html; charset=utf-8")

    async def asset(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in ("viewer.js", "viewer.css"):
            return PlainTextResponse("not found", status_code=404)
        media = "text/css" if name.endswith(".css") else "text/javascript"
        return Response(_asset(name), media_type=f"{media}; charset=utf-8")

    async def events(request: Request) -> Response:
        try:
            after = int(request.query_params.get("after", "0"))
        except ValueError:
            return PlainTextResponse("after must be a record number", status_code=400)
        return JSONResponse({"records": tail.after(after)})

    async def body(request: Request) -> Response:
        path = _body_path(directory, request.path_params["name"])
        if path is None:
            return PlainTextResponse("no such body file", status_code=404)
        return Response(path.read_bytes(), media_type="text/plain; charset=utf-8")

    async def exchange(request: Request) -> Response:
        """The whole body of one side of exchange `n` (a request stored as a tail is put
        together from the bodies before it)."""
        exchanges = _exchanges(tail.refresh())
        n: int = request.path_params["n"]
        side = request.path_params["side"]
        if side == "request":
            raw = _request_body(directory, exchanges, n)
        elif side == "response":
            raw = _response_body(directory, exchanges, n)
        else:
            raw = None
        if raw is None:
            return PlainTextResponse("no such body", status_code=404)
        return Response(raw, media_type="text/plain; charset=utf-8")

    prefix = f"/{token}"
    inner = Starlette(
        routes=[
            Route(f"{prefix}/", index),
            Route(f"{prefix}/events", events),
            Route(f"{prefix}/{{name:str}}", asset),
            Route(prefix + "/http/{name:str}", body),
            Route(prefix + "/{side:str}/{n:int}", exchange),
        ]
    )
    return _Guard(inner, token=token, port=port)


class _Guard:
    """Refuses (403) any request whose Host is not this server's own loopback address (a page on
    another site that rebinds its name to 127.0.0.1 sends its own name) or whose path does not
    start with the token; marks every response `no-store`."""

    def __init__(self, app: ASGIApp, *, token: str, port: int) -> None:
        self.app = app
        self.prefix = f"/{token}/".encode()
        self.hosts = {f"127.0.0.1:{port}".encode(), f"localhost:{port}".encode()}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "lifespan":
                await self.app(scope, receive, send)
            return
        host = dict(scope["headers"]).get(b"host", b"").lower()
        path: bytes = scope.get("raw_path") or scope["path"].encode()
        has_token = hmac.compare_digest(path[: len(self.prefix)], self.prefix)
        if host not in self.hosts or not has_token:
            reason = b"forbidden: wrong Host header" if host not in self.hosts else b"forbidden"
            await send(
                {
                    "type": "http.response.start",
                    "status": 403,
                    "headers": [
                        (b"content-type", b"text/plain; charset=utf-8"),
                        (b"cache-control", b"no-store"),
                        (b"content-length", str(len(reason)).encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": reason})
            return

        async def send_secure(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = [
                    (k, v)
                    for k, v in message.get("headers", [])
                    if k.lower() not in (b"cache-control",)
                ]
                headers += [
                    (b"cache-control", b"no-store"),
                    (b"x-content-type-options", b"nosniff"),
                    (b"referrer-policy", b"no-referrer"),
                    (
                        b"content-security-policy",
                        _CSP_SERVED.encode() + b"; frame-ancestors 'none'",
                    ),
                ]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_secure)


def live_app(directory: Path, token: str, port: int) -> ASGIApp:
    """The live viewer of the trace in `directory` as an ASGI app, at `/{token}/` on
    127.0.0.1:`port` (or localhost): what `serve` runs, and what `keel serve` mounts for its
    web page's trace links (docs/web.md)."""
    return _app(directory, token, port)


def serve(directory: Path, *, open_browser: bool, port: int = 0) -> None:
    """Serve the trace in `directory` on 127.0.0.1 until Ctrl-C: print the URL (it carries a
    random token; a request without it is refused) and open it in a browser when asked."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(128)  # before the URL is printed: a browser that is quick waits in the backlog
    bound = int(sock.getsockname()[1])
    token = secrets.token_urlsafe(24)
    url = f"http://127.0.0.1:{bound}/{token}/"
    config = uvicorn.Config(
        _app(directory, token, bound),
        log_level="warning",
        access_log=False,
        lifespan="off",
        server_header=False,
    )
    server = uvicorn.Server(config)
    print(f"trace viewer: {url}  (Ctrl-C stops)", flush=True)
    if open_browser:
        webbrowser.open(url)
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        return  # uvicorn already stopped cleanly; Ctrl-C is how this ends
    finally:
        sock.close()
