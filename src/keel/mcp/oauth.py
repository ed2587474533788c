"""OAuth sign-in for remote (streamable HTTP) MCP servers: the authorization code grant with
PKCE (S256) on a loopback redirect, as the MCP authorization spec and RFC 8252 describe.

The `mcp` SDK's `OAuthClientProvider` runs the protocol (discovery from the server's 401,
dynamic client registration, the code exchange, refresh); this module gives it what is
keel's: `FileTokenStorage` keeps each server's tokens and client registration in one JSON file
under keel's data directory (0600 in a 0700 directory, written atomically), `LoopbackCallback`
is the one-shot listener on 127.0.0.1 that receives the browser's redirect, and
`oauth_provider` ties them to a way of showing the user the sign-in URL. Without one (a
headless run) the sign-in is refused with a hint instead of waiting for nobody.

This module must never import the SDK at module level, listen anywhere but 127.0.0.1, or write
a token file another user can read.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import socket
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

if TYPE_CHECKING:
    from mcp.client.auth import OAuthClientProvider
    from mcp.shared.auth import AuthorizationCodeResult, OAuthClientInformationFull, OAuthToken

#: Seconds the user has to finish signing in in the browser.
SIGN_IN_TIMEOUT = 300.0
CALLBACK_PATH = "/callback"
_PAGE = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nConnection: close\r\n\r\n"
    b"<!doctype html><title>keel</title><p>Signed in. You can close this tab and go back "
    b"to keel.</p>"
)
_NOT_FOUND = b"HTTP/1.1 404 Not Found\r\nConnection: close\r\n\r\n"

#: Shows the user the sign-in URL (server name, URL).
OpenUrl = Callable[[str, str], Awaitable[None]]


class SignInRefused(Exception):
    """Nobody can sign in here (a headless run); the message says what to do."""


def token_path(auth_dir: Path, url: str) -> Path:
    """The file that holds the tokens of the server at `url`."""
    return auth_dir / f"{hashlib.sha256(url.encode()).hexdigest()[:32]}.json"


class FileTokenStorage:
    """The SDK's `TokenStorage` in one JSON file: `tokens`, `client_info` and the loopback
    `port` the client was registered with (a registration names its redirect URI)."""

    def __init__(self, path: Path, url: str) -> None:
        self.path = path
        self.url = url

    def read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict) or data.get("server_url") != self.url:
            return {}
        return data

    def _write(self, **changes: Any) -> None:
        data = {**self.read(), "server_url": self.url, **changes}
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.path.parent, 0o700)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".tokens-")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:  # mkstemp makes it 0600
                json.dump(data, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    @property
    def port(self) -> int | None:
        port = self.read().get("port")
        return port if isinstance(port, int) else None

    def set_port(self, port: int) -> None:
        self._write(port=port)

    async def get_tokens(self) -> OAuthToken | None:
        from mcp.shared.auth import OAuthToken

        raw = self.read().get("tokens")
        return OAuthToken.model_validate(raw) if isinstance(raw, dict) else None

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self._write(tokens=tokens.model_dump(mode="json", exclude_none=True))

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        from mcp.shared.auth import OAuthClientInformationFull

        raw = self.read().get("client_info")
        return OAuthClientInformationFull.model_validate(raw) if isinstance(raw, dict) else None

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self._write(client_info=client_info.model_dump(mode="json", exclude_none=True))


class LoopbackCallback:
    """Receives the one redirect `GET /callback?code=…&state=…` on 127.0.0.1:`port`."""

    def __init__(self, port: int) -> None:
        self.port = port
        self._server: asyncio.Server | None = None
        self._result: asyncio.Future[tuple[str | None, str | None, str | None, str | None]] | None
        self._result = None

    @property
    def redirect_uri(self) -> str:
        return f"http://127.0.0.1:{self.port}{CALLBACK_PATH}"

    async def start(self) -> None:
        self._result = asyncio.get_running_loop().create_future()
        try:
            self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        except OSError as exc:
            raise SignInRefused(
                f"cannot listen on 127.0.0.1:{self.port} for the sign-in redirect "
                f"({exc.strerror}); close what uses the port and try again"
            ) from None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), 10)
            parts = line.decode("latin-1").split()
            target = urlsplit(parts[1]) if len(parts) >= 2 else None
            if target is None or target.path != CALLBACK_PATH or self._result is None:
                writer.write(_NOT_FOUND)
                return
            query = parse_qs(target.query)

            def one(key: str) -> str | None:
                return query.get(key, [None])[0]

            if not self._result.done():
                self._result.set_result((one("code"), one("state"), one("iss"), one("error")))
            writer.write(_PAGE)
        except (TimeoutError, OSError, UnicodeDecodeError):
            return
        finally:
            with contextlib.suppress(OSError):
                await writer.drain()
            writer.close()

    async def wait(self, timeout: float = SIGN_IN_TIMEOUT) -> AuthorizationCodeResult:  # noqa: ASYNC109
        from mcp.client.auth.exceptions import OAuthFlowError
        from mcp.shared.auth import AuthorizationCodeResult

        assert self._result is not None
        try:
            code, state, iss, error = await asyncio.wait_for(self._result, timeout)
        except TimeoutError:
            raise OAuthFlowError(f"nobody finished signing in within {timeout:g} s") from None
        finally:
            self.close()
        if error:
            raise OAuthFlowError(f"the authorization server refused the sign-in: {error}")
        return AuthorizationCodeResult(code=code or "", state=state, iss=iss)

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None


def free_loopback_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def oauth_provider(
    name: str,
    url: str,
    auth_dir: Path,
    *,
    open_url: OpenUrl | None,
    on_wait: Callable[[], None] = lambda: None,
) -> OAuthClientProvider:
    """The httpx auth for server `name` at `url`. `open_url` shows the sign-in URL to the user
    (None: a sign-in is refused with a hint); `on_wait` is called before waiting for the user
    (to lift the connect deadline)."""
    from mcp.client.auth import OAuthClientProvider
    from mcp.shared.auth import OAuthClientMetadata

    storage = FileTokenStorage(token_path(auth_dir, url), url)
    port = storage.port
    if port is None:
        port = free_loopback_port()
        storage.set_port(port)
    callback = LoopbackCallback(port)

    async def redirect(authorization_url: str) -> None:
        if open_url is None:
            raise SignInRefused(
                f'mcp server "{name}" needs you to sign in (OAuth); start keel interactively, '
                f"or run `keel mcp login {name}`"
            )
        await callback.start()
        on_wait()
        await open_url(name, authorization_url)

    metadata = OAuthClientMetadata.model_validate(
        {
            "client_name": "keel",
            "redirect_uris": [callback.redirect_uri],
            "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"],
            "token_endpoint_auth_method": "none",
        }
    )
    return OAuthClientProvider(
        server_url=url,
        client_metadata=metadata,
        storage=storage,
        redirect_handler=redirect,
        callback_handler=callback.wait,
    )


__all__ = [
    "SIGN_IN_TIMEOUT",
    "FileTokenStorage",
    "LoopbackCallback",
    "OpenUrl",
    "SignInRefused",
    "oauth_provider",
    "token_path",
]
