"""The Provider protocol, the retry wrapper every client gets, and `make_provider`.

A provider is three things (DESIGN.md): an adapter (the wire format), a client (URL, auth, HTTP,
retries) and a profile (catalog facts). The loop sees only `Provider.stream`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from keel.errors import UserError
from keel.frozen import frozen
from keel.llm.catalog import ModelInfo, ModelRef, lookup
from keel.llm.errors import APIError, StallError
from keel.llm.events import SHOWN, Notice, StreamEvent
from keel.llm.request import Request


@runtime_checkable
class Provider(Protocol):
    """Streams one model call. Yields display deltas and notices, then exactly one `Done`."""

    @property
    def name(self) -> str:
        """Provider family, as in `anthropic/…`."""
        ...

    def stream(self, request: Request) -> AsyncGenerator[StreamEvent, None]: ...

    async def aclose(self) -> None: ...


@frozen
class RetryPolicy:
    """Retries of one model call: `attempts` in all, waiting `base * 2**n` seconds plus up to
    `jitter` seconds between them, or the server's `Retry-After` when it is at most
    `max_retry_after`. A retry happens only while nothing has been shown to the user."""

    attempts: int = 4
    base: float = 1.0
    jitter: float = 0.5
    max_retry_after: float = 60.0

    def delay(self, attempt: int, retry_after: float | None) -> float | None:
        """Seconds to wait before retry number `attempt` (1-based), or None to give up."""
        if retry_after is not None:
            return retry_after if retry_after <= self.max_retry_after else None
        return float(self.base * 2.0 ** (attempt - 1) + random.uniform(0, self.jitter))


@dataclass
class RetryingProvider:
    """Wraps a provider with `RetryPolicy`. Stalls and connection failures are retried like
    retryable statuses, but only before any delta reached the screen."""

    inner: Provider
    policy: RetryPolicy = field(default_factory=RetryPolicy)
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep

    @property
    def name(self) -> str:
        return self.inner.name

    async def stream(self, request: Request) -> AsyncGenerator[StreamEvent, None]:
        attempt = 0
        while True:
            attempt += 1
            shown = False
            try:
                stream = self.inner.stream(request)
                async with contextlib.aclosing(stream):
                    async for event in stream:
                        if isinstance(event, SHOWN):
                            shown = True
                        yield event
                return
            except (APIError, StallError) as exc:
                retryable = exc.retryable if isinstance(exc, APIError) else True
                retry_after = exc.retry_after if isinstance(exc, APIError) else None
                wait = self.policy.delay(attempt, retry_after) if retryable else None
                if shown or wait is None or attempt >= self.policy.attempts:
                    raise
                yield Notice(
                    f"{exc.message}; retrying in {wait:.1f} s "
                    f"(attempt {attempt + 1} of {self.policy.attempts})",
                    "warning",
                )
                await self.sleep(wait)

    async def aclose(self) -> None:
        await self.inner.aclose()


def env_key(names: tuple[str, ...], env: Mapping[str, str]) -> str:
    for name in names:
        value = env.get(name, "").strip()
        if value:
            return value
    return ""


@frozen
class ProviderConfig:
    """Per-provider settings from the settings file (base URL, key variable, timeouts)."""

    base_url: str = ""
    api_key_env: str = ""
    stall_timeout: float | None = None
    call_timeout: float | None = None


def make_provider(
    ref: ModelRef,
    *,
    config: ProviderConfig | None = None,
    env: Mapping[str, str] | None = None,
    retry: RetryPolicy | None = None,
    session_id: str = "",
) -> Provider:
    """Build the client for `ref`, wrapped in retries. Raises `UserError` for a missing key."""
    from keel.llm.http import DEFAULT_STALL_TIMEOUT, LOCAL_STALL_TIMEOUT, HTTPSettings

    env = os.environ if env is None else env
    config = config or ProviderConfig()
    if ref.provider == "scripted":
        from keel.llm.providers.scripted import load_script_provider

        return load_script_provider(ref.model)

    local = ref.provider == "openai-compatible"
    default_stall = LOCAL_STALL_TIMEOUT if local else DEFAULT_STALL_TIMEOUT
    settings = HTTPSettings(
        stall_timeout=config.stall_timeout if config.stall_timeout is not None else default_stall,
        call_timeout=config.call_timeout if config.call_timeout is not None else 900.0,
    )
    inner: Provider
    if ref.provider == "anthropic":
        from keel.llm.providers.anthropic import AnthropicProvider

        key_names = (config.api_key_env,) if config.api_key_env else AnthropicProvider.key_envs
        # A token from ANTHROPIC_AUTH_TOKEN (gateways, proxies) goes as a bearer token.
        bearer = not config.api_key_env and not env_key(("ANTHROPIC_API_KEY",), env)
        inner = AnthropicProvider(
            base_url=config.base_url
            or env.get("ANTHROPIC_BASE_URL")
            or AnthropicProvider.default_url,
            api_key=_require_key(ref, key_names, env),
            settings=settings,
            bearer=bearer,
        )
    elif ref.provider == "openai":
        from keel.llm.providers.openai_responses import OpenAIResponsesProvider

        key_names = (config.api_key_env,) if config.api_key_env else ("OPENAI_API_KEY",)
        inner = OpenAIResponsesProvider(
            base_url=config.base_url
            or env.get("OPENAI_BASE_URL")
            or OpenAIResponsesProvider.default_url,
            api_key=_require_key(ref, key_names, env),
            settings=settings,
        )
    elif ref.provider == "openai-compatible":
        from keel.llm.providers.openai_chat import OpenAIChatProvider

        base_url = config.base_url or env.get("OPENAI_COMPATIBLE_BASE_URL", "")
        if not base_url:
            raise UserError(
                "openai-compatible needs a base URL",
                hint='set providers."openai-compatible".base_url in settings, '
                "or OPENAI_COMPATIBLE_BASE_URL",
            )
        key_env = config.api_key_env or "OPENAI_COMPATIBLE_API_KEY"
        inner = OpenAIChatProvider(
            base_url=base_url, api_key=env.get(key_env, ""), settings=settings
        )
    else:
        raise UserError(f"unknown provider {ref.provider!r}")
    return RetryingProvider(inner, retry or RetryPolicy())


def _require_key(ref: ModelRef, names: tuple[str, ...], env: Mapping[str, str]) -> str:
    key = env_key(names, env)
    if not key:
        raise UserError(
            f"{names[0]} is not set; {ref.provider} needs an API key",
            hint=f"export {names[0]}=… , or try keel offline with --model scripted:examples/demo.yaml",
        )
    return key


def model_info(ref: ModelRef, overrides: dict[str, ModelInfo] | None = None) -> ModelInfo:
    return lookup(ref.model, overrides)
