"""The model catalog: context window, max output and prices per model, and `provider/model` parsing.

Capability facts live here (STYLE.md 4), so nothing else needs to sniff model names. Prices are
USD per million tokens. Users override or add entries with the `models` settings key.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace

from keel.errors import UserError
from keel.frozen import frozen
from keel.llm.messages import Usage

#: Defaults for a model the catalog does not know.
UNKNOWN_WINDOW = 128_000
UNKNOWN_MAX_OUTPUT = 16_000
#: A single response never asks for more than this, whatever the model allows.
MAX_OUTPUT_CAP = 64_000
#: A window this small (a local model on a laptop) gets the compact tool set by default
#: (`keel.tools.profile`) and replies of at most a quarter of it (`keel.agent.limits`).
SMALL_WINDOW = 16_384


@frozen
class ModelInfo:
    window: int
    max_output: int
    input_price: float | None = None
    output_price: float | None = None
    cache_read_price: float | None = None
    cache_write_price: float | None = None
    known: bool = True
    #: The provider can run web searches for this model beside keel's own tools
    #: (`keel.llm.request.WebSearchOptions`), at this many USD per search.
    web_search: bool = False
    web_search_price: float = 0.0

    @property
    def priced(self) -> bool:
        return self.input_price is not None and self.output_price is not None

    @property
    def request_max_tokens(self) -> int:
        return min(self.max_output, MAX_OUTPUT_CAP)

    def cost(self, usage: Usage) -> float:
        """USD for `usage`; 0.0 when the model has no prices (see `priced`)."""
        if self.input_price is None or self.output_price is None:
            return 0.0
        return (
            usage.input * self.input_price
            + usage.output * self.output_price
            + usage.cache_read * (self.cache_read_price or 0.0)
            + usage.cache_write * (self.cache_write_price or 0.0)
        ) / 1_000_000 + usage.web_searches * self.web_search_price


def _claude(window: int, out: int, inp: float, outp: float) -> ModelInfo:
    # Anthropic: cache reads cost 0.1x input, 5-minute cache writes 1.25x input.
    return ModelInfo(window, out, inp, outp, round(inp * 0.1, 6), round(inp * 1.25, 6))


def _openai(window: int, out: int, inp: float, outp: float, cached: float) -> ModelInfo:
    # OpenAI: cached input is discounted; writing the cache costs nothing extra. Gemini, DeepSeek,
    # xAI and Groq price their automatic caches the same way.
    return ModelInfo(window, out, inp, outp, cached, 0.0)


def _flat(window: int, out: int, inp: float, outp: float) -> ModelInfo:
    # Hosts without a cache discount: a cache read costs what any input token costs.
    return ModelInfo(window, out, inp, outp, inp, 0.0)


_GEMINI_WINDOW = 1_048_576


#: Known models by the provider that serves them. Hosts that resell others' models (OpenRouter)
#: resolve to these entries through `lookup`'s bare-id fallback.
BY_PROVIDER: dict[str, dict[str, ModelInfo]] = {
    "anthropic": {
        "claude-opus-5": _claude(1_000_000, 128_000, 5.0, 25.0),
        "claude-sonnet-5": _claude(1_000_000, 128_000, 2.0, 10.0),
        "claude-opus-4-7": _claude(1_000_000, 128_000, 5.0, 25.0),
        "claude-opus-4-6": _claude(1_000_000, 128_000, 5.0, 25.0),
        "claude-sonnet-4-6": _claude(1_000_000, 64_000, 3.0, 15.0),
        "claude-opus-4-5": _claude(200_000, 64_000, 5.0, 25.0),
        "claude-opus-4-1": _claude(200_000, 32_000, 15.0, 75.0),
        "claude-opus-4": _claude(200_000, 32_000, 15.0, 75.0),
        "claude-sonnet-4-5": _claude(200_000, 64_000, 3.0, 15.0),
        "claude-sonnet-4": _claude(200_000, 64_000, 3.0, 15.0),
        "claude-3-7-sonnet": _claude(200_000, 64_000, 3.0, 15.0),
        "claude-haiku-4-5": _claude(200_000, 64_000, 1.0, 5.0),
        "claude-3-5-haiku": _claude(200_000, 8_192, 0.8, 4.0),
        "claude-3-5-sonnet": _claude(200_000, 8_192, 3.0, 15.0),
    },
    "openai": {
        # Prompts over 272k tokens cost more and are not modelled here.
        "gpt-5.5": _openai(1_050_000, 128_000, 5.0, 30.0, 0.5),
        "gpt-5.1": _openai(400_000, 128_000, 1.25, 10.0, 0.125),
        "gpt-5": _openai(400_000, 128_000, 1.25, 10.0, 0.125),
        "gpt-5-codex": _openai(400_000, 128_000, 1.25, 10.0, 0.125),
        "gpt-5-mini": _openai(400_000, 128_000, 0.25, 2.0, 0.025),
        "gpt-5-nano": _openai(400_000, 128_000, 0.05, 0.40, 0.005),
        "gpt-4.1": _openai(1_047_576, 32_768, 2.0, 8.0, 0.5),
        "gpt-4.1-mini": _openai(1_047_576, 32_768, 0.4, 1.6, 0.1),
        "gpt-4.1-nano": _openai(1_047_576, 32_768, 0.1, 0.4, 0.025),
        "gpt-4o": _openai(128_000, 16_384, 2.5, 10.0, 1.25),
        "gpt-4o-mini": _openai(128_000, 16_384, 0.15, 0.6, 0.075),
        "o1": _openai(200_000, 100_000, 15.0, 60.0, 7.5),
        "o3": _openai(200_000, 100_000, 2.0, 8.0, 0.5),
        "o3-mini": _openai(200_000, 100_000, 1.1, 4.4, 0.55),
        "o4-mini": _openai(200_000, 100_000, 1.1, 4.4, 0.275),
    },
    # Gemini (prompts up to 200k tokens; longer ones cost more and are not modelled here)
    "gemini": {
        "gemini-3-pro-preview": _openai(_GEMINI_WINDOW, 65_536, 2.0, 12.0, 0.2),
        "gemini-3-flash-preview": _openai(_GEMINI_WINDOW, 65_536, 0.5, 3.0, 0.05),
        "gemini-2.5-pro": _openai(_GEMINI_WINDOW, 65_536, 1.25, 10.0, 0.125),
        "gemini-2.5-flash": _openai(_GEMINI_WINDOW, 65_536, 0.3, 2.5, 0.03),
        "gemini-2.5-flash-lite": _openai(_GEMINI_WINDOW, 65_536, 0.1, 0.4, 0.01),
        "gemini-2.0-flash": _openai(_GEMINI_WINDOW, 8_192, 0.1, 0.4, 0.025),
    },
    "deepseek": {
        "deepseek-chat": _openai(131_072, 8_192, 0.28, 0.42, 0.028),
        "deepseek-reasoner": _openai(131_072, 65_536, 0.28, 0.42, 0.028),
    },
    "xai": {
        "grok-4": _openai(256_000, 64_000, 3.0, 15.0, 0.75),
        "grok-4-fast": _openai(2_000_000, 30_000, 0.2, 0.5, 0.05),
        "grok-code-fast-1": _openai(256_000, 10_000, 0.2, 1.5, 0.02),
        "grok-3-mini": _openai(131_072, 16_000, 0.3, 0.5, 0.075),
    },
    "groq": {
        "llama-3.3-70b-versatile": _flat(131_072, 32_768, 0.59, 0.79),
        "llama-3.1-8b-instant": _flat(131_072, 131_072, 0.05, 0.08),
        "qwen/qwen3-32b": _flat(131_072, 40_960, 0.29, 0.59),
        "moonshotai/kimi-k2-instruct-0905": _openai(262_144, 16_384, 1.0, 3.0, 0.5),
    },
    "mistral": {
        "mistral-large-latest": _flat(262_144, 32_768, 0.5, 1.5),
        "mistral-medium-latest": _flat(131_072, 32_768, 0.4, 2.0),
        "codestral-latest": _flat(256_000, 32_768, 0.3, 0.9),
        "devstral-medium-latest": _flat(131_072, 32_768, 0.4, 2.0),
        "devstral-small-latest": _flat(131_072, 32_768, 0.1, 0.3),
    },
    "together": {
        "Qwen/Qwen3-Coder-480B-A35B-Instruct-FP8": _flat(262_144, 65_536, 2.0, 2.0),
        "meta-llama/Llama-3.3-70B-Instruct-Turbo": _flat(131_072, 32_768, 0.88, 0.88),
        "deepseek-ai/DeepSeek-V3": _flat(131_072, 32_768, 1.25, 1.25),
        "moonshotai/Kimi-K2-Instruct-0905": _flat(262_144, 32_768, 1.0, 3.0),
    },
}

#: USD per server-side web search, by model. Anthropic: $10 per 1,000 searches for every model.
#: OpenAI: $10 per 1,000 calls for reasoning models, $25 for gpt-4o and gpt-4.1 (not -nano, and
#: not o1 or o3-mini, which have no web search). Gemini: Gemini 3 only (2.x cannot ground with
#: Search and call functions in one request), $14 per 1,000 search queries.
_WEB_SEARCH_PRICES: dict[str, dict[str, float]] = {
    "anthropic": dict.fromkeys(BY_PROVIDER["anthropic"], 0.01),
    "openai": {
        **dict.fromkeys(
            ("gpt-5.5", "gpt-5.1", "gpt-5", "gpt-5-codex", "gpt-5-mini", "gpt-5-nano"), 0.01
        ),
        **dict.fromkeys(("o3", "o4-mini"), 0.01),
        **dict.fromkeys(("gpt-4.1", "gpt-4.1-mini", "gpt-4o", "gpt-4o-mini"), 0.025),
    },
    "gemini": dict.fromkeys(("gemini-3-pro-preview", "gemini-3-flash-preview"), 0.014),
}
for _provider, _prices in _WEB_SEARCH_PRICES.items():
    for _model, _price in _prices.items():
        BY_PROVIDER[_provider][_model] = replace(
            BY_PROVIDER[_provider][_model], web_search=True, web_search_price=_price
        )

#: Every known model by its id (and, for ids with an organisation, by the part after it too).
CATALOG: dict[str, ModelInfo] = {
    key: info
    for models in BY_PROVIDER.values()
    for model, info in models.items()
    for key in {model, model.rsplit("/", 1)[-1]}
}

UNKNOWN = ModelInfo(UNKNOWN_WINDOW, UNKNOWN_MAX_OUTPUT, known=False)

_DATED = re.compile(r"(-\d{8}|-latest)$")


def lookup(model: str, overrides: Mapping[str, ModelInfo] | None = None) -> ModelInfo:
    """Facts for `model` (a wire id such as `claude-sonnet-4-5-20250929`,
    `anthropic/claude-sonnet-4-5`, or OpenRouter's `anthropic/claude-sonnet-4.5`). Overrides win;
    unknown models get 128k / 16k, unpriced."""
    bare = model.rsplit("/", 1)[-1]
    undated = _DATED.sub("", bare)
    for key in (model, bare, undated, undated.replace(".", "-")):
        if overrides and key in overrides:
            return overrides[key]
        if key in CATALOG:
            return CATALOG[key]
    return UNKNOWN


def with_window(info: ModelInfo, window: int) -> ModelInfo:
    """The same facts with a window a provider reported (local servers know their own)."""
    return replace(info, window=window)


# ---------------------------------------------------------------------------------------------
# provider/model addressing

#: What a provider name may look like (built-in names, presets and custom providers alike).
_PROVIDER_NAME = re.compile(r"[a-z0-9][a-z0-9._-]*")

_BARE_ROUTES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^claude-"), "anthropic"),
    (re.compile(r"^(gpt-|o\d(-|$)|chatgpt-)"), "openai"),
    (re.compile(r"^gemini-"), "gemini"),
)


@frozen
class ModelRef:
    provider: str
    model: str

    def __str__(self) -> str:
        sep = ":" if self.provider == "scripted" else "/"
        return f"{self.provider}{sep}{self.model}"


def parse_model(spec: str) -> ModelRef:
    """`anthropic/claude-sonnet-4-5` → ModelRef; a bare `claude-*`, `gpt-*`, `o3` or `gemini-*`
    routes by prefix; `scripted:NAME` plays a script packaged with keel (`scripted:demo`) and
    `scripted:PATH` a script file. Whether the provider exists is
    `make_provider`'s question: only it sees the custom providers settings define."""
    spec = spec.strip()
    if not spec:
        raise UserError(
            "no model given", hint="use --model provider/model, e.g. anthropic/claude-sonnet-4-5"
        )
    if spec.startswith("scripted:"):
        path = spec.removeprefix("scripted:")
        if not path:
            raise UserError(
                "scripted: needs a script", hint="--model scripted:demo, or scripted:PATH"
            )
        return ModelRef("scripted", path)
    if "/" in spec:
        provider, model = spec.split("/", 1)
        if not _PROVIDER_NAME.fullmatch(provider):
            raise UserError(
                f"{provider!r} in model {spec!r} is not a provider name",
                hint="write the model as provider/model, e.g. ollama/qwen3:8b",
            )
        if not model:
            raise UserError(f"model {spec!r} names no model", hint=f"e.g. {provider}/MODEL")
        return ModelRef(provider, model)
    for pattern, provider in _BARE_ROUTES:
        if pattern.match(spec):
            return ModelRef(provider, spec)
    raise UserError(
        f"unknown model {spec!r}",
        hint="write it as provider/model, e.g. anthropic/claude-sonnet-4-5 or openai/gpt-5",
    )
