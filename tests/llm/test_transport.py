"""The HTTP transport: HTTPS through keel's asyncio network backend (a TLS loopback server with a
throwaway certificate, trusted via SSL_CERT_FILE), and proxies taken from the environment."""

from __future__ import annotations

import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from keel.llm.errors import APIError
from keel.llm.events import Done
from keel.llm.http import HTTPSettings, shared_ssl_context
from keel.llm.messages import Message, Text
from keel.llm.provider import RetryingProvider, RetryPolicy
from keel.llm.providers.anthropic import AnthropicProvider
from keel.llm.request import Request
from keel.llm.script import reply
from keel.testing.anthropic_server import AnthropicServer

pytestmark = pytest.mark.needs("openssl")


@pytest.fixture
def cert(tmp_path: Path) -> tuple[Path, Path]:
    key, crt = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(crt),
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    return crt, key


@pytest.fixture
def tls_server(cert: tuple[Path, Path]) -> Iterator[AnthropicServer]:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(*cert)
    server = AnthropicServer()
    server.tls = context
    with server:
        yield server


@pytest.fixture
def trust(cert: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("SSL_CERT_FILE", str(cert[0]))
    shared_ssl_context.cache_clear()
    yield
    shared_ssl_context.cache_clear()


def request() -> Request:
    return Request(model="claude-haiku-4-5", system="s", messages=(Message("user", (Text("hi"),)),))


async def test_https_stream_through_the_asyncio_backend(
    tls_server: AnthropicServer, trust: None
) -> None:
    tls_server.add(reply("over TLS"), reply("again, same connection"))
    provider = AnthropicProvider(base_url=tls_server.url, api_key="k", settings=HTTPSettings())
    try:
        for expected in ("over TLS", "again, same connection"):
            events = [e async for e in provider.stream(request())]
            done = events[-1]
            assert isinstance(done, Done)
            assert done.message.text == expected
    finally:
        await provider.aclose()
    assert tls_server.url.startswith("https://127.0.0.1:")
    assert len(tls_server.model_requests) == 2


async def test_untrusted_certificate_is_a_clear_connection_error(
    tls_server: AnthropicServer,
) -> None:
    shared_ssl_context.cache_clear()
    provider = RetryingProvider(
        AnthropicProvider(base_url=tls_server.url, api_key="k", settings=HTTPSettings()),
        RetryPolicy(attempts=1),
    )
    try:
        with pytest.raises(
            APIError,
            match=r"cannot reach anthropic at https://127\.0\.0\.1:.*CERTIFICATE_VERIFY_FAILED",
        ):
            async for _ in provider.stream(request()):
                pass
    finally:
        await provider.aclose()
        shared_ssl_context.cache_clear()
    assert tls_server.model_requests == []


async def test_proxy_from_the_environment_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """With HTTP(S)_PROXY set, requests go through the proxy (httpx's own transport)."""
    with AnthropicServer([reply("via the proxy")]) as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        provider = AnthropicProvider(
            base_url="http://api.anthropic.invalid", api_key="k", settings=HTTPSettings()
        )
        try:
            events = [e async for e in provider.stream(request())]
        finally:
            await provider.aclose()
        done = events[-1]
        assert isinstance(done, Done)
        assert done.message.text == "via the proxy"
        (recorded,) = proxy.model_requests
        assert recorded.proxied_to == "http://api.anthropic.invalid"
        assert recorded.path == "/v1/messages"
