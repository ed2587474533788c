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
from dataclasses import field, replace
from typing import TYPE_CHECKING, Protocol, assert_never, runtime_checkable

from keel.errors import UserError
from keel.frozen import frozen, mutable
from keel.llm.catalog import ModelInfo, ModelRef, lookup, parse_model
from keel.llm.errors import APIError, CallTimeout, ConnectionRefused, StallError
from keel.llm.events import SHOWN, Done, Notice, StreamEvent
from keel.llm.request import Request, Sampling

if TYPE_CHECKING:
    from keel.llm.fallback import Cooldowns
    from keel.llm.http import HTTPProvider, HTTPSettings
    from keel.llm.presets import Preset


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
class ModelFacts:
    """What a model's server says about it before the first request. `window`: the context it
    serves the model with (0: not said, the catalog's stands). `tools`: whether tool definitions
    reach the model (None: not said). `warning`: something the user should hear once (a chat
    template without tools), with what to do about it."""

    window: int = 0
    tools: bool | None = None
    warning: str = ""


async def model_facts(provider: Provider, model: str) -> ModelFacts:
    """What `provider`'s server says about `model`. A provider may answer `model_facts(model)`
    (keel's do; a local server's adapter asks the server once per model, a hosted one says
    nothing without asking); one that lacks the method (a caller's own) knows nothing. Never
    fails: a server that does not answer leaves nothing known."""
    ask: Callable[[str], Awaitable[ModelFacts]] | None = getattr(provider, "model_facts", None)
    return await ask(model) if ask is not None else ModelFacts()


@frozen
class RetryPolicy:
    """Retries of one model call: `attempts` in all, waiting `base * 2**n` seconds plus up to
    `jitter` seconds between them, or the server's `Retry-After` when it is at most
    `max_retry_after`. A retry happens only while nothing has been shown to the user.

    A call that ran out of time (its deadline, `CallTimeout`, or a stall) is retried at most
    `timeout_retries` times: waiting that long again rarely helps twice. A refused connection
    (nothing listening: a local server that is not running) is retried at most
    `refused_retries` times, after `refused_wait` seconds."""

    attempts: int = 4
    base: float = 1.0
    jitter: float = 0.5
    max_retry_after: float = 60.0
    timeout_retries: int = 1
    refused_retries: int = 1
    refused_wait: float = 0.5

    def allowed(self, exc: APIError | StallError) -> int:
        """How many attempts in all a call failing with `exc` may take."""
        if isinstance(exc, CallTimeout | StallError):
            return min(self.attempts, 1 + self.timeout_retries)
        if isinstance(exc, ConnectionRefused):
            return min(self.attempts, 1 + self.refused_retries)
        return self.attempts

    def delay(self, attempt: int, retry_after: float | None) -> float | None:
        """Seconds to wait before retry number `attempt` (1-based), or None to give up."""
        if retry_after is not None:
            return retry_after if retry_after <= self.max_retry_after else None
        return float(self.base * 2.0 ** (attempt - 1) + random.uniform(0, self.jitter))


@mutable
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
                if isinstance(exc, ConnectionRefused) and wait is not None:
                    wait = self.policy.refused_wait
                allowed = self.policy.allowed(exc)
                if shown or wait is None or attempt >= allowed:
                    raise
                yield Notice(
                    f"{exc.message}; retrying in {wait:.1f} s (attempt {attempt + 1} of {allowed})",
                    "warning",
                )
                await self.sleep(wait)

    async def model_facts(self, model: str) -> ModelFacts:
        return await model_facts(self.inner, model)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def final_reply(
    provider: Provider,
    request: Request,
    observe: Callable[[StreamEvent], None] | None = None,
) -> Done | None:
    """Stream `request` to the end and keep only its `Done` (None if the stream ended without
    one): for calls nobody watches live (a compaction summary, a prompt hook, MCP sampling).
    `observe` sees every other event on the way (a clock timing the request)."""
    done: Done | None = None
    stream = provider.stream(request)
    async with contextlib.aclosing(stream):
        async for event in stream:
            if isinstance(event, Done):
                done = event
            elif observe is not None:
                observe(event)
    return done


def env_key(names: tuple[str, ...], env: Mapping[str, str]) -> str:
    for name in names:
        value = env.get(name, "").strip()
        if value:
            return value
    return ""


@frozen
class ProviderConfig:
    """Per-provider settings from the settings files (base URL, key variable, timeouts; `wire`
    makes a custom provider; `num_ctx` is the window asked of Ollama). `base_url` is the user's
    own; `project_base_url` came from an approved project file and loses to the user's settings
    and environment (docs/security.md)."""

    base_url: str = ""
    api_key_env: str = ""
    stall_timeout: float | None = None
    call_timeout: float | None = None
    wire: str = ""
    num_ctx: int | None = None
    project_base_url: str = ""


class ProviderSettings(Protocol):
    """What `make_provider` reads from the user's settings (`keel.config.settings.Settings` is
    one; `keel.llm` cannot import it)."""

    @property
    def providers(self) -> Mapping[str, ProviderConfig]: ...

    @property
    def models(self) -> Mapping[str, ModelInfo]: ...

    @property
    def sampling(self) -> Mapping[str, Sampling]: ...

    @property
    def fallbacks(self) -> Mapping[str, tuple[str, ...]]: ...


def make_provider(
    ref: ModelRef,
    *,
    settings: ProviderSettings | None = None,
    config: ProviderConfig | None = None,
    env: Mapping[str, str] | None = None,
    retry: RetryPolicy | None = None,
    session_id: str = "",
    cooldowns: Cooldowns | None = None,
    unattended: bool = True,
) -> Provider:
    """Build the client for `ref`, wrapped in retries, and in fallbacks when settings name some
    for it. Raises `UserError` for an unknown provider or a missing key. `config` overrides the
    settings' entry for `ref.provider` (for callers without settings). `unattended` (nobody
    watching: `keel -p`, the library) picks the shorter default per-call deadline."""
    env = os.environ if env is None else env
    policy = retry or RetryPolicy()
    if ref.provider == "scripted":
        from keel.llm.providers.scripted import load_script_provider

        return load_script_provider(ref.model)

    def build(candidate: ModelRef) -> Provider:
        conf = config if config is not None and candidate is ref else None
        client = _client(candidate, settings, conf, env, unattended=unattended)
        return RetryingProvider(client, policy)

    primary = build(ref)
    chain = fallback_chain(ref, settings)
    if not chain:
        return primary
    from keel.llm.fallback import Candidate, FallbackProvider

    models = settings.models if settings is not None else {}
    candidates = [Candidate(r, lookup(r.model, models)) for r in (ref, *chain)]
    return FallbackProvider(candidates, build, primary=primary, cooldowns=cooldowns)


def fallback_chain(ref: ModelRef, settings: ProviderSettings | None) -> tuple[ModelRef, ...]:
    """The models to fall back to from `ref` (settings `fallbacks`, keyed `provider/model`)."""
    if settings is None:
        return ()
    specs = settings.fallbacks.get(str(ref)) or settings.fallbacks.get(ref.model) or ()
    return tuple(parse_model(spec) for spec in specs if spec != str(ref))


def preset_for(name: str, settings: ProviderSettings | None, spec: str = "") -> Preset:
    """The row of `keel.llm.presets` for provider `name`, or the custom provider settings
    define. Raises `UserError` for a name neither knows."""
    from keel.llm.presets import PRESETS, custom_preset, unknown_provider

    preset = PRESETS.get(name)
    if preset is not None:
        return preset
    conf = settings.providers.get(name) if settings is not None else None
    if conf is None or not conf.wire:
        raise unknown_provider(name, spec or name)
    return custom_preset(
        name,
        wire=conf.wire,
        base_url=conf.base_url or conf.project_base_url,
        api_key_env=conf.api_key_env,
    )


def _client(
    ref: ModelRef,
    settings: ProviderSettings | None,
    override: ProviderConfig | None,
    env: Mapping[str, str],
    *,
    unattended: bool = True,
) -> Provider:
    """One adapter for `ref`, configured from its preset, settings and the environment."""
    from keel.llm.http import (
        DEFAULT_STALL_TIMEOUT,
        LOCAL_STALL_TIMEOUT,
        HTTPSettings,
        default_call_timeout,
    )

    preset = preset_for(ref.provider, settings, str(ref))
    config = override or (settings.providers.get(ref.provider) if settings else None)
    config = config or ProviderConfig()
    stall = LOCAL_STALL_TIMEOUT if preset.local else DEFAULT_STALL_TIMEOUT
    http = HTTPSettings(
        stall_timeout=config.stall_timeout if config.stall_timeout is not None else stall,
        call_timeout=config.call_timeout
        if config.call_timeout is not None
        else default_call_timeout(local=preset.local, unattended=unattended),
    )
    key_names = (config.api_key_env,) if config.api_key_env else preset.key_envs
    key = env_key(key_names, env)
    if preset.key_required and not key:
        raise _missing_key(ref, key_names)
    base_url = base_url_for(preset, config, env)
    adapter = _adapter(preset, base_url, key, http, config, key_names, env)
    adapter.name = preset.name
    adapter.key_env = key_names[0] if key_names else ""
    adapter.unreachable_hint = unreachable_hint(preset)
    adapter.sampling = sampling_for(ref, settings)
    adapter.local = preset.local
    if preset.wire in ("openai-chat", "ollama"):
        from keel.llm.salvage import SalvagingProvider

        return SalvagingProvider(adapter)
    return adapter


def base_url_for(preset: Preset, config: ProviderConfig, env: Mapping[str, str]) -> str:
    """Where `preset`'s requests (and its key) go: the user's own settings, then the user's
    environment, then a project file the user approved, then the provider's default. Raises
    `UserError` when none says."""
    base_url = (
        config.base_url
        or env_key(preset.url_envs, env)
        or config.project_base_url
        or preset.base_url
    )
    if not base_url:
        raise UserError(
            f"{preset.name} needs a base URL",
            hint=f'set providers."{preset.name}".base_url in settings'
            + (f", or {preset.url_envs[0]}" if preset.url_envs else ""),
        )
    return base_url


def _adapter(
    preset: Preset,
    base_url: str,
    key: str,
    http: HTTPSettings,
    config: ProviderConfig,
    key_names: tuple[str, ...],
    env: Mapping[str, str],
) -> HTTPProvider:
    match preset.wire:
        case "anthropic":
            from keel.llm.providers.anthropic import AnthropicProvider

            # A token from ANTHROPIC_AUTH_TOKEN (gateways, proxies) goes as a bearer token.
            bearer = key_names[0] == "ANTHROPIC_API_KEY" and not env_key(key_names[:1], env)
            return AnthropicProvider(base_url=base_url, api_key=key, settings=http, bearer=bearer)
        case "openai-responses":
            from keel.llm.providers.openai_responses import OpenAIResponsesProvider

            return OpenAIResponsesProvider(base_url=base_url, api_key=key, settings=http)
        case "openai-chat" if preset.name == "lmstudio":
            from keel.llm.providers.lmstudio import LMStudioProvider

            return LMStudioProvider(base_url=base_url, api_key=key, settings=http)
        case "openai-chat":
            from keel.llm.providers.openai_chat import OpenAIChatProvider

            return OpenAIChatProvider(base_url=base_url, api_key=key, settings=http)
        case "gemini":
            from keel.llm.providers.gemini import GeminiProvider

            return GeminiProvider(base_url=base_url, api_key=key, settings=http)
        case "ollama":
            from keel.llm.providers.ollama import DEFAULT_NUM_CTX, OllamaProvider, ollama_url

            return OllamaProvider(
                base_url=ollama_url(base_url),
                api_key=key,
                settings=http,
                num_ctx=config.num_ctx or DEFAULT_NUM_CTX,
            )
        case _:
            assert_never(preset.wire)


def unreachable_hint(preset: Preset) -> str:
    """What to check when `preset`'s server cannot be reached: for a local one, where its URL
    is set."""
    if not preset.local:
        return "check the server is running and the base URL is right"
    where = f'providers."{preset.name}".base_url'
    if preset.url_envs:
        where += f" (or {preset.url_envs[0]})"
    return f"check the {preset.name} server is running and {where} points at it"


def sampling_for(ref: ModelRef, settings: ProviderSettings | None) -> Sampling:
    """The user's temperature / top_p for `ref` (`provider/model` beats the bare model id)."""
    if settings is None:
        return Sampling()
    return settings.sampling.get(str(ref)) or settings.sampling.get(ref.model) or Sampling()


def _missing_key(ref: ModelRef, names: tuple[str, ...]) -> UserError:
    return UserError(
        f"{names[0]} is not set; {ref.provider} needs an API key",
        hint=f"export {names[0]}=… , or try keel offline with --model scripted:demo",
    )


def model_info(ref: ModelRef, overrides: Mapping[str, ModelInfo] | None = None) -> ModelInfo:
    """Facts for `ref`: the user's `models` entry (keyed `provider/model` or by the model id) wins,
    then the catalog. A model on the user's own machine (a local preset) costs nothing; its tokens
    still count."""
    if overrides and str(ref) in overrides:
        return overrides[str(ref)]
    info = lookup(ref.model, overrides)
    if overrides and ref.model in overrides:
        return info
    from keel.llm.presets import PRESETS

    preset = PRESETS.get(ref.provider)
    if preset is None or not preset.local:
        return info
    return replace(
        info, input_price=0.0, output_price=0.0, cache_read_price=0.0, cache_write_price=0.0
    )
