"""`keel models`: the models keel knows, with their window, most output per response and prices
(USD per million tokens: input, output, cache read, cache write), as a table or `--json`.

The rows are the catalog's (`keel.llm.catalog.BY_PROVIDER`) with the user's `models` settings
entries laid over them: an entry keyed like a catalog row replaces it, any other is added. Models
on the user's own machine (Ollama, LM Studio, vLLM, any OpenAI-compatible server) are not listed:
keel does not know which ones a server has until it asks, and they cost nothing.

It must never reach the network.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from keel.config.settings import load_settings
from keel.llm.catalog import BY_PROVIDER, ModelInfo
from keel.llm.presets import PRESETS

HEADER = ("MODEL", "WINDOW", "MAX OUT", "INPUT", "OUTPUT", "CACHE R", "CACHE W")


def parser() -> argparse.ArgumentParser:
    from keel.cli.main import _Parser

    p = _Parser(
        prog="keel models",
        description="Models keel knows: context window, most output per response, and prices in "
        "USD per million tokens (input, output, cache read, cache write). Entries under `models` "
        "in settings override the catalog or add models.",
    )
    p.add_argument("provider", nargs="?", help="only this provider's models, e.g. gemini")
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
    selected = rows(settings.models)
    if args.provider:
        selected = [row for row in selected if row[0].startswith(f"{args.provider}/")]
        if not selected:
            from keel.errors import UserError

            hint = "local servers list their own models (ollama list; LM Studio's model list)"
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
