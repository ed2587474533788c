"""`keel models`: the models keel knows, with their window, most output per response and prices
(USD per million tokens: input, output, cache read, cache write), as a table or `--json`.

The rows are the catalog's (`keel.llm.catalog.BY_PROVIDER`) with the user's `models` settings
entries laid over them: an entry keyed like a catalog row replaces it, any other is added. Models
on the user's own machine cost nothing and are not in the catalog; `keel models ollama` asks the
user's Ollama server (`/api/tags`) which ones it has; `keel models openai-compatible` (or `vllm`)
asks that server which models it serves, with the window and tool support it reports for each.

It must never reach a hosted API: the only requests it makes are to the user's own server, and
only when asked for its models.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from keel.config.settings import Settings, load_settings
from keel.llm.catalog import BY_PROVIDER, ModelInfo
from keel.llm.presets import PRESETS
from keel.llm.providers.ollama import DEFAULT_NUM_CTX

HEADER = ("MODEL", "WINDOW", "MAX OUT", "INPUT", "OUTPUT", "CACHE R", "CACHE W")


def parser() -> argparse.ArgumentParser:
    from keel.cli.main import _Parser

    p = _Parser(
        prog="keel models",
        description="Models keel knows: context window, most output per response, and prices in "
        "USD per million tokens (input, output, cache read, cache write). Entries under `models` "
        "in settings override the catalog or add models.",
    )
    p.add_argument(
        "provider",
        nargs="?",
        help="only this provider's models, e.g. gemini; ollama, openai-compatible and vllm ask "
        "your server",
    )
    p.add_argument("--json", action="store_true", help="one JSON object per model, as a list")
    return p


def rows(overrides: dict[str, ModelInfo]) -> list[tuple[str, ModelInfo, str]]:
    """(`provider/model`, facts, where they come from: catalog or settings), in catalog order
    (each provider's newest first). A settings key that matches no catalog row is added at the
    end, as written."""
    out: dict[str, tuple[str, ModelInfo, str]] = {}
    for provider, models in BY_PROVIDER.items():
        for model, info in models.items():
            name = f"{provider}/{model}"
            user = overrides.get(name) or overrides.get(model)
            out[name] = (name, user, "settings") if user else (name, info, "catalog")
    for key, info in overrides.items():
        known = key in out or any(name.split("/", 1)[1] == key for name in out)
        if not known:
            out[key] = (key, info, "settings")
    return list(out.values())


def _price(value: float | None) -> str:
    """Dollars with two decimals, or three when the third matters (0.025)."""
    if value is None:
        return "-"
    text = f"{value:.3f}"
    return text[:-1] if text.endswith("0") else text


def table(selected: list[tuple[str, ModelInfo, str]]) -> str:
    lines = [HEADER]
    for name, info, source in selected:
        mark = " *" if source == "settings" else ""
        lines.append(
            (
                name + mark,
                f"{info.window:,}",
                f"{info.max_output:,}",
                _price(info.input_price),
                _price(info.output_price),
                _price(info.cache_read_price),
                _price(info.cache_write_price),
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(HEADER))]
    text = [
        "  ".join(
            cell.ljust(widths[i]) if i == 0 else cell.rjust(widths[i])
            for i, cell in enumerate(line)
        ).rstrip()
        for line in lines
    ]
    return "\n".join(text)


def _json_row(name: str, info: ModelInfo, source: str) -> dict[str, Any]:
    return {
        "model": name,
        "window": info.window,
        "max_output": info.max_output,
        "input_price": info.input_price,
        "output_price": info.output_price,
        "cache_read_price": info.cache_read_price,
        "cache_write_price": info.cache_write_price,
        "source": source,
    }


def models(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    settings = load_settings(Path.cwd())
    for warning in settings.warnings:
        print(f"keel: warning: {warning}", file=sys.stderr)
    if args.provider == "ollama":
        return _ollama(settings, args.json)
    if args.provider in SERVED:
        return _served(settings, args.provider, args.json)
    selected = rows(settings.models)
    if args.provider:
        selected = [row for row in selected if row[0].startswith(f"{args.provider}/")]
        if not selected:
            from keel.errors import UserError

            hint = "a local server lists its own models (keel models ollama; LM Studio's list)"
            if args.provider not in PRESETS:
                hint = f"known providers: {', '.join(BY_PROVIDER)}"
            raise UserError(f"no known models for provider {args.provider!r}", hint=hint)
    if args.json:
        print(json.dumps([_json_row(*row) for row in selected], indent=2))
        return 0
    print(table(selected))
    local = ", ".join(f"{p.name}/" for p in PRESETS.values() if p.local)
    print(
        f"\nPrices in USD per million tokens; * from your settings. Models on your own machine "
        f"({local}) cost nothing, and their window is what the server reports."
    )
    return 0


#: Local Chat Completions servers whose own model list (and facts) `keel models NAME` shows.
SERVED = ("openai-compatible", "vllm")


def _served(settings: Settings, name: str, as_json: bool) -> int:
    """The models a local llama.cpp or vLLM server serves, with the window and tool support it
    reports for each (what keel will use)."""
    import asyncio

    from keel.errors import UserError
    from keel.llm.http import HTTPSettings
    from keel.llm.provider import ModelFacts, base_url_for, env_key, unreachable_hint
    from keel.llm.providers.openai_chat import OpenAIChatProvider

    preset, config = PRESETS[name], settings.provider(name)
    base = base_url_for(preset, config, os.environ)
    key = env_key((config.api_key_env,) if config.api_key_env else preset.key_envs, os.environ)

    async def ask() -> list[tuple[str, ModelFacts]] | None:
        server = OpenAIChatProvider(base_url=base, api_key=key, settings=HTTPSettings())
        server.local = True
        try:
            listed = await server.listed_models()
            return None if listed is None else [(m, await server.model_facts(m)) for m in listed]
        finally:
            await server.aclose()

    found = asyncio.run(ask())
    if found is None:
        raise UserError(f"cannot list {name}'s models at {base}", hint=unreachable_hint(preset))
    if as_json:
        listed = [
            {"model": f"{name}/{m}", "window": f.window or None, "tools": f.tools, "source": base}
            for m, f in found
        ]
        print(json.dumps(listed, indent=2))
        return 0
    lines = [("MODEL", "WINDOW", "TOOLS")]
    for model, facts in found:
        tools = {True: "yes", False: "no (template)", None: "?"}[facts.tools]
        lines.append((f"{name}/{model}", f"{facts.window:,}" if facts.window else "?", tools))
    widths = [max(len(line[i]) for line in lines) for i in range(3)]
    for line in lines:
        print("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(line)).rstrip())
    print(
        f"\n{len(found)} model(s) at {base}; they cost nothing. WINDOW is what the server serves "
        "each with (one slot's context on llama.cpp); ? where it does not say."
    )
    for warning in sorted({facts.warning for _, facts in found if facts.warning}):
        print(f"keel: warning: {warning}", file=sys.stderr)
    return 0


def _ollama(settings: Settings, as_json: bool) -> int:
    """The models the user's Ollama server has (where `keel -p --model ollama/…` would look)."""
    import httpx

    from keel.errors import UserError
    from keel.llm.provider import unreachable_hint
    from keel.llm.providers.ollama import local_models, server_url

    preset = PRESETS["ollama"]
    base = server_url(settings.provider("ollama").base_url, os.environ)
    try:
        response = httpx.get(f"{base}/api/tags", timeout=5.0)
        tags = response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError) as exc:
        raise UserError(
            f"cannot list ollama's models at {base}: {exc or type(exc).__name__}",
            hint=unreachable_hint(preset),
        ) from exc
    if not isinstance(tags, dict):
        raise UserError(
            f"{base}/api/tags answered {response.status_code}, not Ollama's model list",
            hint=unreachable_hint(preset),
        )
    found = local_models(tags)
    if as_json:
        listed = [
            {
                "model": f"ollama/{m.name}",
                "parameter_size": m.parameter_size,
                "quantization": m.quantization,
                "family": m.family,
                "size_bytes": m.size,
                "source": base,
            }
            for m in found
        ]
        print(json.dumps(listed, indent=2))
        return 0
    lines = [("MODEL", "PARAMS", "QUANT", "SIZE")]
    lines += [
        (f"ollama/{m.name}", m.parameter_size, m.quantization, f"{m.size / 1e9:.1f} GB")
        for m in found
    ]
    widths = [max(len(line[i]) for line in lines) for i in range(4)]
    for line in lines:
        print("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(line)).rstrip())
    print(
        f"\n{len(found)} model(s) at {base}; they cost nothing. keel asks for a "
        f"{settings.provider('ollama').num_ctx or DEFAULT_NUM_CTX:,}-token window "
        "(providers.ollama.num_ctx), or less if the model has less."
    )
    return 0
