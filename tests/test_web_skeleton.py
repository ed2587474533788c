"""The web front end's files on `keel serve`: served without a token, with the Host check and a
Content-Security-Policy that keeps the page to this server; nothing outside the web folder."""

from __future__ import annotations

import pytest

from keel.server.webpage import CSP
from tests.server_helpers import (  # noqa: F401 (fixtures)
    Served,
    anthropic_fixture,
    served_fixture,
    servers_fixture,
)


def test_pages_and_files_are_served_with_the_csp_and_nothing_else(served: Served) -> None:
    with served.client(None) as c:
        for path, kind in [
            ("/", "text/html"),
            ("/fleet", "text/html"),
            ("/web/app.js", "text/javascript"),
            ("/web/app.css", "text/css"),
            ("/web/markdown.js", "text/javascript"),
        ]:
            r = c.get(path)
            assert r.status_code == 200, (path, r.text)
            assert r.headers["content-type"].startswith(kind)
            assert r.headers["content-security-policy"] == CSP
            assert r.headers["x-content-type-options"] == "nosniff"
        for path in [
            "/web/__init__.py",
            "/web/%2e%2e%2fhttp.py",
            "/web/.hidden.js",
            "/web/nothing.js",
        ]:
            r = c.get(path)
            # Not a file of the page: nothing (404), or not open at all (401: needs the token).
            assert r.status_code in (401, 404), (path, r.status_code)
            assert "import" not in r.text
        # The API still needs the token.
        assert c.get("/v1/info").status_code == 401


@pytest.mark.parametrize("path", ["/", "/web/app.js"])
def test_a_rebinding_host_gets_no_page(served: Served, path: str) -> None:
    with served.client(None, host="evil.example") as c:
        assert c.get(path).status_code == 403


def test_dot_segments_and_encoded_slashes_do_not_pass_the_guard(served: Served) -> None:
    """Raw request lines (a client library would normalize them): a path that starts like a web
    file but names an API route still needs the token, or matches nothing."""
    import socket

    def status(path: str) -> int:
        with socket.create_connection(("127.0.0.1", served.port), timeout=10) as s:
            s.sendall(
                f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{served.port}\r\n"
                "Connection: close\r\n\r\n".encode()
            )
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        return int(data.split(b" ", 2)[1])

    assert status("/web/app.js") == 200
    for path in ["/web/../v1/info", "/web/..%2fv1%2finfo", "/fleet/../v1/info", "//v1/info"]:
        assert status(path) in (401, 404), path
    assert status("/web/../v1/sessions") in (401, 404)
