"""The model catalog: context window, max output and prices per model, and `provider/model` parsing.

Capability facts live here (STYLE.md 4), so nothing else needs to sniff model names. Prices are
USD per million tokens. Users override or add entries with the `models` settings key.
"""

from __future__ import annotations

import re
from dataclasses import replace

from keel.errors import UserError
from keel.frozen import frozen
from keel.llm.messages import Usage

#: Defaults for a model the catalog does not know.
UNKNOWN_WINDOW = 128_000
UNKNOWN_MAX_OUTPUT = 16_000
#: A single response never asks for more than this, whatever the model allows.
MAX_OUTPUT_CAP = 64_000


@frozen
class ModelInfo:
    window: int
    max_output: int
    input_price: float | None = None
    output_price: float | None = None
    cache_read_price: float | None = None
    cache_write_price: float | None = None
    known: bool = True

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
        ) / 1_000_000


def _claude(window: int, out: int, inp: float, outp: float) -> ModelInfo:
    # Anthropic: cache reads cost 0.1x input, 5-minute cache writes 1.25x input.
    return ModelInfo(window, out, inp, outp, round(inp * 0.1, 6), round(inp * 1.25, 6))


def _openai(window: int, out: int, inp: float, outp: float, cached: float) -> ModelInfo:
    # OpenAI: cached input is discounted; writing the cache costs nothing extra.
    return ModelInfo(window, out, inp, outp, cached, 0.0)


CATALOG: dict[str, ModelInfo] = {
    # Anthropic
    "claude-opus-5": _claude(1_000_000, 128_000, 5.0, 25.0),
    "claude-sonnet-5": _claude(1_000_000, 128_000, 2.0, 10.0),
    "claude-opus-4-5": _claude(200_000, 64_000, 5.0, 25.0),
    "claude-opus-4-1": _claude(200_000, 32_000, 15.0, 75.0),
    "claude-opus-4": _claude(200_000, 32_000, 15.0, 75.0),
    "claude-sonnet-4-5": _claude(200_000, 64_000, 3.0, 15.0),
    "claude-sonnet-4": _claude(200_000, 64_000, 3.0, 15.0),
    "claude-3-7-sonnet": _claude(200_000, 64_000, 3.0, 15.0),
    "claude-haiku-4-5": _claude(200_000, 64_000, 1.0, 5.0),
    "claude-3-5-haiku": _claude(200_000, 8_192, 0.8, 4.0),
    "claude-3-5-sonnet": _claude(200_000, 8_192, 3.0, 15.0),
    # OpenAI
    "gpt-5.5": ModelInfo(400_000, 128_000),
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
}

UNKNOWN = ModelInfo(UNKNOWN_WINDOW, UNKNOWN_MAX_OUTPUT, known=False)

_DATED = re.compile(r"(-\d{8}|-latest)$")


def lookup(model: str, overrides: dict[str, ModelInfo] | None = None) -> ModelInfo:
    """Facts for `model` (a wire id such as `claude-sonnet-4-5-20250929` or
    `anthropic/claude-sonnet-4-5`). Overrides win; unknown models get 128k / 16k, unpriced."""
    bare = model.rsplit("/", 1)[-1]
    for key in (model, bare, _DATED.sub("", bare)):
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

#: Providers keel can talk to. `scripted` plays a conversation from a file (no network).
PROVIDER_NAMES = ("anthropic", "openai", "openai-compatible", "scripted")

_BARE_ROUTES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^claude-"), "anthropic"),
    (re.compile(r"^(gpt-|o\d(-|$)|chatgpt-)"), "openai"),
)


@frozen
class ModelRef:
    provider: str
    model: str

    def __str__(self) -> str:
        sep = ":" if self.provider == "scripted" else "/"
        return f"{self.provider}{sep}{self.model}"


def parse_model(spec: str) -> ModelRef:
    """`anthropic/claude-sonnet-4-5` → ModelRef; a bare `claude-*`, `gpt-*` or `o3` routes by prefix;
    `scripted:PATH` plays a script file."""
    spec = spec.strip()
    if not spec:
        raise UserError(
            "no model given", hint="use --model provider/model, e.g. anthropic/claude-sonnet-4-5"
        )
    if spec.startswith("scripted:"):
        path = spec.removeprefix("scripted:")
        if not path:
            raise UserError("scripted: needs a file", hint="--model scripted:examples/demo.yaml")
        return ModelRef("scripted", path)
    if "/" in spec:
        provider, model = spec.split("/", 1)
        if provider not in PROVIDER_NAMES:
            raise UserError(
                f"unknown provider {provider!r} in model {spec!r}",
                hint=f"known providers: {', '.join(PROVIDER_NAMES)}",
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
