"""Attacks on issue 30's surfaces, kept as regression tests: `keel serve`'s answers as a browser
reads them (headers on every answer, error bodies included; no CORS; a 401 that says nothing of
what exists), the trace viewer's capability URLs guessed and walked, a hostile server behind
`keel attach`, and `keel mcp serve`'s directories and sessions outside its project.

Real processes throughout: `keel serve` and `keel mcp serve` over a loopback model server,
`keel attach` against a loopback fake that answers as a hostile server would.
"""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from keel.llm.script import reply
from keel.testing.anthropic_server import AnthropicServer
from tests.server_helpers import (  # noqa: F401 (fixtures)
    MODEL,
    TOKEN,
    Served,
    Servers,
    anthropic_fixture,
    served_fixture,
    servers_fixture,
)


def new_session(served: Served) -> str:
    with served.client() as c:
        r = c.post("/v1/sessions", json={"model": MODEL})
        assert r.status_code == 201, r.text
        sid: str = r.json()["id"]
        return sid


# -- every answer, as a browser reads it -----------------------------------------------------------


def test_every_answer_carries_the_csp_and_nosniff_and_no_cors(
    served: Served, anthropic: AnthropicServer
) -> None:
    """A JSON error echoes what the request said (a Host, a field's name, a session id): a
    browser that sniffed it as HTML, or a page that framed it, must find nothing to run."""
    sid = new_session(served)
    evil = "https://evil.example"
    with served.client(origin=evil) as c, served.client(None, origin=evil) as anonymous:
        answers = {
            "page": anonymous.get("/"),
            "file": anonymous.get("/web/app.js"),
            "no such file": anonymous.get("/web/no-such.html"),
            "no token": anonymous.get(f"/v1/sessions/{sid}"),
            "token in a query": anonymous.get(f"/v1/sessions/{sid}?token={TOKEN}"),
            "foreign host": anonymous.get("/", headers={"host": "<b>evil.example</b>"}),
            "no route": c.get("/v1/<img src=x onerror=alert(1)>"),
            "no method": c.put("/v1/sessions"),
            "bad body": c.post("/v1/sessions", content=b"<script>alert(1)</script>"),
            "unknown field": c.post("/v1/sessions", json={"<svg onload=alert(1)>": 1}),
            "no session": c.get("/v1/sessions/<img src=x onerror=alert(1)>"),
            "no trace": c.get(f"/v1/sessions/{sid}/trace"),
            "wrong capability": anonymous.get("/trace/<script>/"),
            "health": anonymous.get("/v1/health"),
            "openapi": anonymous.get("/openapi.json"),
            "preflight": anonymous.options(
                "/v1/sessions",
                headers={
                    "access-control-request-method": "POST",
                    "access-control-request-headers": "authorization",
                },
            ),
        }
    statuses = {name: r.status_code for name, r in answers.items()}
    assert statuses == {
        "page": 200,
        "file": 200,
        "no such file": 404,
        "no token": 401,
        "token in a query": 401,
        "foreign host": 403,
        "no route": 404,
        "no method": 405,
        "bad body": 400,
        "unknown field": 400,
        "no session": 404,
        "no trace": 404,
        "wrong capability": 404,
        "health": 200,
        "openapi": 200,
        "preflight": 401,
    }
    for name, r in answers.items():
        csp = r.headers.get("content-security-policy", "")
        assert "default-src 'none'" in csp, (name, dict(r.headers))
        assert "frame-ancestors 'none'" in csp, (name, csp)
        assert r.headers.get("x-content-type-options") == "nosniff", (name, dict(r.headers))
        assert r.headers.get("referrer-policy") == "no-referrer", (name, dict(r.headers))
        assert not [h for h in r.headers if h.startswith("access-control-")], (name, r.headers)
        if r.status_code >= 400:
            assert r.headers["content-type"] == "application/json", (name, r.headers)
            assert set(r.json()) == {"error", "hint"}, (name, r.text)


def test_a_401_says_nothing_of_what_exists(served: Served, anthropic: AnthropicServer) -> None:
    """Without the token, a real session, a made-up one, an unloaded one and a route that does
    not exist get the same answer: the token is asked for before anything is looked up."""
    sid = new_session(served)
    gone = new_session(served)
    with served.client() as c:
        assert c.delete(f"/v1/sessions/{gone}").status_code == 204
    paths = [
        f"/v1/sessions/{sid}",
        "/v1/sessions/20990101-000000-abcdef",
        f"/v1/sessions/{gone}/messages",
        f"/v1/sessions/{sid}/trace",
        "/v1/sessions/20990101-000000-abcdef/trace",
        "/v1/no-such-route",
    ]
    for token in (None, "wrong-token"):
        with served.client(token) as c:
            answers = {
                (r.status_code, r.text, r.headers.get("www-authenticate"))
                for r in map(c.get, paths)
            }
        assert len(answers) == 1, answers
        status, _, challenge = answers.pop()
        assert (status, challenge) == (401, "Bearer")
