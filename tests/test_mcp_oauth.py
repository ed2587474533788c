"""OAuth sign-in for remote MCP servers against a loopback authorization server written for the
test (`tests/mcp_servers/oauth_server.py`, the SDK's resource and authorization server on
127.0.0.1): the authorization code grant with PKCE on a loopback redirect, tokens kept 0600 and
used again, and a headless run that refuses to wait for a sign-in nobody can do."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from keel.mcp import McpManager, load_servers
from keel.mcp.oauth import token_path
from tests.helpers import free_port, unsandboxed_line_dropped, user_settings_file

SERVER = str(Path(__file__).parent / "mcp_servers" / "oauth_server.py")


@pytest.fixture
def oauth_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    port, log = free_port(), tmp_path / "authorizations.jsonl"
    with (tmp_path / "server.log").open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, SERVER, str(port), str(log)], stdout=out, stderr=subprocess.STDOUT
        )
    try:
        for _ in range(200):
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.1):
                    break
            except OSError:
                time.sleep(0.05)
        else:
            raise AssertionError("the oauth test server did not start")
        yield f"http://127.0.0.1:{port}/mcp", log
    finally:
        process.terminate()
        process.wait(5)


def manager_for(tmp_path: Path, url: str, auth_dir: Path) -> McpManager:
    servers, warnings = load_servers(
        tmp_path, [(user_settings_file(), {"remote": {"type": "http", "url": url}})], {}
    )
    assert warnings == []
    return McpManager(servers, root=tmp_path, env={}, log_dir=tmp_path / "logs", auth_dir=auth_dir)


@pytest.mark.asyncio
async def test_sign_in_with_pkce_on_a_loopback_redirect_then_tokens_are_reused(
    tmp_path: Path, oauth_server: tuple[str, Path]
) -> None:
    url, log = oauth_server
    auth_dir = tmp_path / "mcp-auth"
    shown: list[tuple[str, str]] = []

    async def browser(server: str, authorization_url: str) -> None:
        """The user's browser: it opens the URL and follows the redirect back to keel."""
        shown.append((server, authorization_url))
        async with httpx.AsyncClient(follow_redirects=True) as client:
            answer = await client.get(authorization_url)
        assert "Signed in" in answer.text

    manager = manager_for(tmp_path, url, auth_dir)
    manager.open_url = browser
    async with manager:
        assert await manager.wait_ready(60)
        status = manager.server("remote")
        assert status.state == "connected", status.detail
        result = await manager.call("remote", "secret", {})
        assert [getattr(c, "text", "") for c in result.content] == ["the protected answer"]
    assert len(shown) == 1
    query = httpx.URL(shown[0][1]).params
    assert (query["response_type"], query["code_challenge_method"]) == ("code", "S256")
    assert len(query["code_challenge"]) == 43
    assert query["state"]
    redirect = query["redirect_uri"]
    assert redirect.startswith("http://127.0.0.1:")
    assert redirect.endswith("/callback")
    assert [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()] == [
        {"redirect_uri": redirect, "state": True}
    ]
    # Tokens are kept 0600 in a 0700 directory, and hold no more than the server gave.
    tokens = token_path(auth_dir, url)
    assert stat.S_IMODE(tokens.stat().st_mode) == 0o600
    assert stat.S_IMODE(auth_dir.stat().st_mode) == 0o700
    stored = json.loads(tokens.read_text(encoding="utf-8"))
    assert sorted(stored) == ["client_info", "port", "server_url", "tokens"]
    assert stored["tokens"]["token_type"].lower() == "bearer"
    # The next run signs in silently with the stored token: no browser.
    again = manager_for(tmp_path, url, auth_dir)

    async def no_browser(server: str, authorization_url: str) -> None:
        raise AssertionError("asked to sign in again")

    again.open_url = no_browser
    async with again:
        assert await again.wait_ready(30)
        assert again.server("remote").state == "connected", again.server("remote").detail


@pytest.mark.asyncio
async def test_a_headless_run_refuses_to_wait_for_a_sign_in(
    tmp_path: Path, oauth_server: tuple[str, Path]
) -> None:
    url, log = oauth_server
    manager = manager_for(tmp_path, url, tmp_path / "mcp-auth")  # open_url None: nobody to ask
    started = time.monotonic()
    async with manager:
        assert await manager.wait_ready(30)
        status = manager.server("remote")
    assert time.monotonic() - started < 20
    assert (status.state, status.detail) == (
        "failed",
        'mcp server "remote" needs you to sign in (OAuth); start keel interactively, or run '
        "`keel mcp login remote`",
    )
    assert not log.exists()  # no authorization was ever requested


@pytest.mark.asyncio
async def test_a_server_with_its_own_authorization_header_gets_no_oauth(
    tmp_path: Path, oauth_server: tuple[str, Path]
) -> None:
    url, _log = oauth_server
    servers, _ = load_servers(
        tmp_path,
        [
            (
                user_settings_file(),
                {"remote": {"type": "http", "url": url, "headers": {"Authorization": "Bearer x"}}},
            )
        ],
        {},
    )
    auth_dir = tmp_path / "mcp-auth"
    async with McpManager(
        servers, root=tmp_path, env=os.environ, log_dir=tmp_path / "l", auth_dir=auth_dir
    ) as m:
        assert await m.wait_ready(30)
        status = m.server("remote")
    assert status.state == "failed"
    assert status.detail.startswith("HTTP 401")
    assert not auth_dir.exists()


def test_keel_mcp_login_then_runs_use_the_token(
    tmp_path: Path, oauth_server: tuple[str, Path]
) -> None:
    """`keel mcp login NAME` end to end: the browser ($BROWSER, a stand-in that follows the
    redirect) signs in, and `keel mcp list` afterwards connects with the stored token."""
    url, log = oauth_server
    home = Path(os.environ["HOME"])
    (home / ".claude.json").parent.mkdir(parents=True, exist_ok=True)
    (home / ".claude.json").write_text(
        json.dumps({"mcpServers": {"remote": {"type": "http", "url": url}}}), encoding="utf-8"
    )
    project = tmp_path / "project"
    project.mkdir()
    browser = Path(__file__).parent / "mcp_servers" / "fake_browser.py"
    env = {**os.environ, "BROWSER": f"{sys.executable} {browser} %s"}

    def keel(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "keel", "mcp", *args],
            cwd=project, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    login = keel("login", "remote")
    assert login.returncode == 0, login.stderr
    lines = login.stdout.splitlines()
    assert lines[0].startswith("MCP server remote needs you to sign in: open http://127.0.0.1:")
    assert lines[-1] == "signed in to remote (1 tool); keel keeps the token for later runs"
    assert len(log.read_text(encoding="utf-8").splitlines()) == 1
    listed = keel("list")
    assert listed.returncode == 0, listed.stderr
    assert "remote  connected  (http, user)  1 tool" in listed.stdout
    assert len(log.read_text(encoding="utf-8").splitlines()) == 1  # no second sign-in


def test_a_headless_refusal_is_one_line_without_the_sdks_traceback(
    tmp_path: Path, oauth_server: tuple[str, Path]
) -> None:
    """The SDK logs the refused sign-in with a traceback before it raises; keel's one line is
    all a user sees (the traceback comes back with --debug)."""
    url, log = oauth_server
    home = Path(os.environ["HOME"])
    home.mkdir(parents=True, exist_ok=True)
    (home / ".claude.json").write_text(
        json.dumps({"mcpServers": {"remote": {"type": "http", "url": url}}}), encoding="utf-8"
    )
    project = tmp_path / "project"
    (project / ".git").mkdir(parents=True)
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"model": "test", "turns": [{"text": "done"}]}), encoding="utf-8")

    def keel(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "keel", "-p", "hi", "--model", f"scripted:{script}", *extra],
            cwd=project, capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    quiet = keel()
    assert (quiet.returncode, quiet.stdout) == (0, "done\n")
    assert unsandboxed_line_dropped(quiet.stderr) == (
        'keel: warning: MCP server remote failed: mcp server "remote" needs you to sign in '
        "(OAuth); start keel interactively, or run `keel mcp login remote`\n"
    )
    debug = keel("--debug")
    assert debug.returncode == 0
    assert unsandboxed_line_dropped(debug.stderr).startswith(
        "OAuth flow error\nTraceback (most recent call last):\n"
    )
    assert not log.exists()
