"""Where each provider lives: its wire API, default base URL, the environment variables that
override the URL and hold the key, and whether it runs on the user's machine.

This table is the single place a provider name is given meaning: `make_provider` builds clients
from it, `keel models` and the docs list it, and a custom provider from settings
(`providers.<name> = {base_url, api_key_env, wire}`) becomes one more row. It must never import an
adapter (they are loaded only when a provider is built) nor read the environment itself.
"""

from __future__ import annotations

from typing import Final, Literal, TypeAlias, cast, get_args

from keel.errors import UserError
from keel.frozen import frozen

Wire: TypeAlias = Literal["anthropic", "openai-responses", "openai-chat", "gemini", "ollama"]
WIRES: Final[tuple[str, ...]] = get_args(Wire)


@frozen
class Preset:
    """How to reach one provider. `key_required` providers refuse to start without a key; a
    `local` one runs on the user's machine (its models cost nothing, and it may be slow to
    start, so it gets the long stall timeout). A `web_search` provider runs web searches on its
    side for the models whose catalog entry says so (a custom provider or a reseller may not:
    they offer none)."""

    name: str
    wire: Wire
    base_url: str
    url_envs: tuple[str, ...] = ()
    key_envs: tuple[str, ...] = ()
    key_required: bool = True
    local: bool = False
    web_search: bool = False


def _hosted(name: str, base_url: str, key_env: str) -> Preset:
    """A hosted OpenAI-compatible API: Chat Completions, a key, `<NAME>_BASE_URL` to move it."""
    prefix = name.upper()
    return Preset(name, "openai-chat", base_url, (f"{prefix}_BASE_URL",), (key_env,))


def _local(name: str, wire: Wire, base_url: str, url_env: str, key_env: str) -> Preset:
    return Preset(name, wire, base_url, (url_env,), (key_env,), key_required=False, local=True)


PRESETS: Final[dict[str, Preset]] = {
    p.name: p
    for p in (
        Preset(
            "anthropic",
            "anthropic",
            "https://api.anthropic.com",
            ("ANTHROPIC_BASE_URL",),
            ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN"),
            web_search=True,
        ),
        Preset(
            "openai",
            "openai-responses",
            "https://api.openai.com/v1",
            ("OPENAI_BASE_URL",),
            ("OPENAI_API_KEY",),
            web_search=True,
        ),
        Preset(
            "gemini",
            "gemini",
            "https://generativelanguage.googleapis.com",
            ("GEMINI_BASE_URL", "GOOGLE_GEMINI_BASE_URL"),
            ("GEMINI_API_KEY", "GOOGLE_API_KEY"),
            web_search=True,
        ),
        # No default URL: it is whatever server the user runs.
        _local(
            "openai-compatible",
            "openai-chat",
            "",
            "OPENAI_COMPATIBLE_BASE_URL",
            "OPENAI_COMPATIBLE_API_KEY",
        ),
        _local("ollama", "ollama", "http://localhost:11434", "OLLAMA_HOST", "OLLAMA_API_KEY"),
        _local(
            "lmstudio",
            "openai-chat",
            "http://localhost:1234/v1",
            "LMSTUDIO_BASE_URL",
            "LMSTUDIO_API_KEY",
        ),
        _local("vllm", "openai-chat", "http://localhost:8000/v1", "VLLM_BASE_URL", "VLLM_API_KEY"),
        _hosted("openrouter", "https://openrouter.ai/api/v1", "OPENROUTER_API_KEY"),
        _hosted("groq", "https://api.groq.com/openai/v1", "GROQ_API_KEY"),
        _hosted("deepseek", "https://api.deepseek.com/v1", "DEEPSEEK_API_KEY"),
        _hosted("xai", "https://api.x.ai/v1", "XAI_API_KEY"),
        _hosted("mistral", "https://api.mistral.ai/v1", "MISTRAL_API_KEY"),
        _hosted("together", "https://api.together.xyz/v1", "TOGETHER_API_KEY"),
    )
}

#: Every name `provider/model` may start with, besides custom providers from settings.
BUILTIN_NAMES: Final[tuple[str, ...]] = (*PRESETS, "scripted")


def custom_preset(name: str, *, wire: str, base_url: str, api_key_env: str) -> Preset:
    """A provider defined in settings. Its key is required exactly when it names a variable."""
    if wire not in WIRES:
        raise UserError(
            f"providers.{name}.wire is {wire!r}",
            hint=f"use one of: {', '.join(WIRES)}",
        )
    if not base_url:
        raise UserError(
            f"custom provider {name!r} has no base_url",
            hint=f'set providers.{name}.base_url in settings, e.g. "https://host/v1"',
        )
    keys = (api_key_env,) if api_key_env else ()
    return Preset(name, cast(Wire, wire), base_url, key_envs=keys, key_required=bool(api_key_env))


def unknown_provider(name: str, spec: str) -> UserError:
    return UserError(
        f"unknown provider {name!r} in model {spec!r}",
        hint=f"known providers: {', '.join(BUILTIN_NAMES)}; or define providers.{name} "
        "with base_url and wire in settings",
    )
