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


def context_shape(context: ssl.SSLContext) -> dict[str, object]:
    """What decides whom a client context trusts and how it talks."""
    return {
        "store": context.cert_store_stats(),
        "ca_names": sorted(str(c.get("subject")) for c in context.get_ca_certs()),
        "verify_mode": context.verify_mode,
        "check_hostname": context.check_hostname,
        "options": context.options,
        "minimum_version": context.minimum_version,
        "maximum_version": context.maximum_version,
        "verify_flags": context.verify_flags,
        "protocol": context.protocol,
    }


@pytest.mark.parametrize("source", ["SSL_CERT_FILE", "SSL_CERT_DIR", "certifi"])
def test_the_tls_context_is_the_one_httpx_builds(
    source: str, cert: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """keel builds its context itself (an https run does not import httpx for it); it must trust
    exactly what httpx's `create_ssl_context(trust_env=True)` trusts, from the same source."""
    import httpx

    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    if source == "SSL_CERT_FILE":
        monkeypatch.setenv("SSL_CERT_FILE", str(cert[0]))
    elif source == "SSL_CERT_DIR":
        # A hashed directory is read lazily (on a handshake); one file, loaded the same way.
        folder = tmp_path / "certs"
        folder.mkdir()
        (folder / "keel.pem").write_bytes(cert[0].read_bytes())
        monkeypatch.setenv("SSL_CERT_DIR", str(folder))
    shared_ssl_context.cache_clear()
    try:
        mine = shared_ssl_context()
    finally:
        shared_ssl_context.cache_clear()
    theirs = httpx.create_ssl_context(trust_env=True)
    assert context_shape(mine) == context_shape(theirs)
    if source == "SSL_CERT_FILE":
        assert mine.cert_store_stats()["x509_ca"] == 1  # only the file named
    if source == "certifi":
        assert mine.cert_store_stats()["x509_ca"] > 50  # the bundle, not an empty store
