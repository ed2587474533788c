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
            assert r.status_code == 404, (path, r.status_code)
        # The API still needs the token.
        assert c.get("/v1/info").status_code == 401


@pytest.mark.parametrize("path", ["/", "/web/app.js"])
def test_a_rebinding_host_gets_no_page(served: Served, path: str) -> None:
    with served.client(None, host="evil.example") as c:
        assert c.get(path).status_code == 403
