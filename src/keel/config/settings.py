"""Settings files and their precedence.

Files, later winning for scalar values:
1. user: `$KEEL_CONFIG_DIR/settings.json`, else `$XDG_CONFIG_HOME/keel/settings.json`, else
   `~/.config/keel/settings.json`
2. project (shared): `<project>/.keel/settings.json`
3. project (personal, git-ignored): `<project>/.keel/settings.local.json`

A file that is not valid JSON is skipped with a warning naming the file, line and column; an
unknown key is skipped with a warning naming it. Loading never raises for a bad file: keel starts
with the valid parts and says what it skipped.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from keel.llm.catalog import ModelInfo
from keel.llm.presets import PRESETS, WIRES
from keel.llm.provider import ProviderConfig
from keel.llm.request import Effort, Sampling

KNOWN_KEYS = frozenset(
    {
        "model",
        "providers",
        "models",
        "max_turns",
        "effort",
        "budget",
        "permissions",
        "sandbox",
        "auto_compact",
        "fallbacks",
        # Read by keel.hooks.config and keel.mcp.config, which own their formats.
        "hooks",
        "mcp_servers",
        "$schema",
    }
)
PERMISSION_KEYS = frozenset({"allow", "deny", "default_mode"})
SANDBOX_KEYS = frozenset({"enabled", "network"})
PROVIDER_KEYS = frozenset(
    {"base_url", "api_key_env", "stall_timeout", "call_timeout", "wire", "num_ctx"}
)
EFFORTS: dict[str, Effort] = {"low": "low", "medium": "medium", "high": "high", "max": "max"}
MODEL_KEYS = frozenset(
    {"window", "max_output", "input_price", "output_price", "cache_read_price", "cache_write_price"}
)
SAMPLING_KEYS = frozenset({"temperature", "top_p"})


@dataclass
class Settings:
    model: str | None = None
    effort: Effort | None = None
    max_turns: int | None = None
    budget_usd: float | None = None
    budget_tokens: int | None = None
    providers: dict[str, ProviderConfig] = field(default_factory=dict)
    models: dict[str, ModelInfo] = field(default_factory=dict)
    #: Sampling defaults per model (`models.<id>.temperature` / `top_p`).
    sampling: dict[str, Sampling] = field(default_factory=dict)
    #: `provider/model` → the models to fall back to, in order.
    fallbacks: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: Permission rules as written, with the file each came from: (rule text, source).
    allow: list[tuple[str, str]] = field(default_factory=list)
    deny: list[tuple[str, str]] = field(default_factory=list)
    default_mode: str | None = None
    auto_compact: bool = True
    sandbox: bool = True
    sandbox_network: bool = False
    files: list[Path] = field(default_factory=list)
    #: Each settings file's `mcp_servers` value as written, with its path (keel.mcp parses them).
    mcp_servers: list[tuple[Path, object]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def provider(self, name: str) -> ProviderConfig:
        return self.providers.get(name, ProviderConfig())


def user_config_dir(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    if env.get("KEEL_CONFIG_DIR"):
        return Path(env["KEEL_CONFIG_DIR"]).expanduser()
    base = env.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "keel"


def settings_files(project: Path, env: Mapping[str, str] | None = None) -> list[Path]:
    return [
        user_config_dir(env) / "settings.json",
        project / ".keel" / "settings.json",
        project / ".keel" / "settings.local.json",
    ]


def read_json_object(path: Path, warnings: list[str], *, skipped: str) -> dict[str, Any] | None:
    """The JSON object in `path`: None if the file is missing or unusable (with a warning naming
    the file, and the line for bad JSON, ending in `skipped`: what is lost), {} if it is empty."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        warnings.append(f"{path}: cannot read ({exc.strerror}); {skipped}")
        return None
    if not text.strip():
        return {}
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        warnings.append(f"{path}:{exc.lineno}:{exc.colno}: invalid JSON ({exc.msg}); {skipped}")
        return None
    if not isinstance(data, dict):
        warnings.append(f"{path}: must hold a JSON object; {skipped}")
        return None
    return data


def _number(value: Any, where: str, warnings: list[str], kind: type = float) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        warnings.append(f"{where} must be a number; ignored")
        return None
    return kind(value)


def _merge_scalar(settings: Settings, key: str, value: Any, where: str) -> None:
    w = settings.warnings
    if key == "model":
        if isinstance(value, str) and value:
            settings.model = value
        else:
            w.append(
                f"{where} must be a non-empty string like anthropic/claude-sonnet-4-5; ignored"
            )
    elif key == "effort":
        if value in EFFORTS:
            settings.effort = EFFORTS[value]
        else:
            w.append(f"{where} must be low, medium, high or max; ignored")
    elif key == "max_turns":
        n = _number(value, where, w, int)
        if n is not None:
            settings.max_turns = n
    elif key == "auto_compact":
        if isinstance(value, bool):
            settings.auto_compact = value
        else:
            w.append(f"{where} must be true or false; ignored")


def _merge_file(settings: Settings, path: Path, data: dict[str, Any]) -> None:
    for key, value in data.items():
        where = f"{path}: {key}"
        if key not in KNOWN_KEYS:
            known = ", ".join(sorted(KNOWN_KEYS - {"$schema"}))
            settings.warnings.append(f"{path}: unknown key {key!r} skipped (known: {known})")
        elif key == "budget":
            _merge_budget(settings, value, where)
        elif key == "providers":
            _merge_providers(settings, value, where)
        elif key == "models":
            _merge_models(settings, value, where)
        elif key == "fallbacks":
            _merge_fallbacks(settings, value, where)
        elif key == "permissions":
            _merge_permissions(settings, value, where, shared=_shared(path))
        elif key == "sandbox":
            _merge_sandbox(settings, value, where, shared=_shared(path))
        elif key == "mcp_servers":
            settings.mcp_servers.append((path, value))
        elif key == "hooks":
            pass
        else:
            _merge_scalar(settings, key, value, where)


def _merge_budget(settings: Settings, value: Any, where: str) -> None:
    if not isinstance(value, dict):
        settings.warnings.append(f'{where} must be an object like {{"usd": 5}}; ignored')
        return
    for k, v in value.items():
        if k == "usd":
            settings.budget_usd = _number(v, f"{where}.usd", settings.warnings)
        elif k == "tokens":
            settings.budget_tokens = _number(v, f"{where}.tokens", settings.warnings, int)
        else:
            settings.warnings.append(f"{where}: unknown key {k!r} skipped (known: usd, tokens)")


def _merge_providers(settings: Settings, value: Any, where: str) -> None:
    if not isinstance(value, dict):
        settings.warnings.append(f"{where} must be an object keyed by provider name; ignored")
        return
    for name, conf in value.items():
        if not isinstance(conf, dict):
            settings.warnings.append(f"{where}.{name} must be an object; ignored")
            continue
        unknown = set(conf) - PROVIDER_KEYS
        if unknown:
            settings.warnings.append(
                f"{where}.{name}: unknown key(s) {', '.join(sorted(unknown))} skipped "
                f"(known: {', '.join(sorted(PROVIDER_KEYS))})"
            )
        old = settings.provider(name)
        settings.providers[name] = ProviderConfig(
            base_url=str(conf.get("base_url", old.base_url) or ""),
            api_key_env=str(conf.get("api_key_env", old.api_key_env) or ""),
            stall_timeout=conf.get("stall_timeout", old.stall_timeout),
            call_timeout=conf.get("call_timeout", old.call_timeout),
            wire=_wire(name, conf, old.wire, f"{where}.{name}", settings.warnings),
            num_ctx=_num_ctx(conf, old.num_ctx, f"{where}.{name}", settings.warnings),
        )


def _wire(name: str, conf: dict[str, Any], old: str, where: str, warnings: list[str]) -> str:
    """`wire` makes `name` a custom provider; a built-in one already has its wire API."""
    if "wire" not in conf:
        return old
    wire = conf["wire"]
    if name in PRESETS:
        warnings.append(f"{where}.wire ignored: {name} is built in")
        return old
    if wire not in WIRES:
        warnings.append(f"{where}.wire must be one of {', '.join(WIRES)}; ignored")
        return old
    return str(wire)


def _num_ctx(conf: dict[str, Any], old: int | None, where: str, warnings: list[str]) -> int | None:
    if "num_ctx" not in conf:
        return old
    value = conf["num_ctx"]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        warnings.append(f"{where}.num_ctx must be a positive number of tokens; ignored")
        return old
    return value


def _merge_fallbacks(settings: Settings, value: Any, where: str) -> None:
    if not isinstance(value, dict):
        settings.warnings.append(
            f'{where} must be an object like {{"anthropic/claude-sonnet-4-5": ["openai/gpt-5"]}}; '
            "ignored"
        )
        return
    for model, chain in value.items():
        if isinstance(chain, str):
            chain = [chain]
        settings.fallbacks[model] = tuple(_strings(chain, f"{where}.{model}", settings.warnings))


def _merge_models(settings: Settings, value: Any, where: str) -> None:
    if not isinstance(value, dict):
        settings.warnings.append(f"{where} must be an object keyed by model id; ignored")
        return
    for model, conf in value.items():
        if not isinstance(conf, dict):
            settings.warnings.append(f"{where}.{model} must be an object; ignored")
            continue
        sampling = _sampling(conf, f"{where}.{model}", settings.warnings)
        if sampling is not None:
            settings.sampling[model] = sampling
        if set(conf) <= SAMPLING_KEYS:
            continue  # sampling only: the catalog's facts stand
        if not {"window", "max_output"} <= set(conf):
            settings.warnings.append(
                f"{where}.{model} needs at least window and max_output; ignored"
            )
            continue
        unknown = set(conf) - MODEL_KEYS - SAMPLING_KEYS
        if unknown:
            settings.warnings.append(
                f"{where}.{model}: unknown key(s) {', '.join(sorted(unknown))} skipped"
            )
        settings.models[model] = ModelInfo(
            int(conf["window"]),
            int(conf["max_output"]),
            conf.get("input_price"),
            conf.get("output_price"),
            conf.get("cache_read_price"),
            conf.get("cache_write_price"),
        )


def _sampling(conf: dict[str, Any], where: str, warnings: list[str]) -> Sampling | None:
    values = {k: _number(conf[k], f"{where}.{k}", warnings) for k in SAMPLING_KEYS if k in conf}
    if not any(v is not None for v in values.values()):
        return None
    return Sampling(values.get("temperature"), values.get("top_p"))


def _shared(path: Path) -> bool:
    """The project's shared file (committed to git) may only tighten security."""
    return path.name == "settings.json" and path.parent.name == ".keel"


def _strings(value: Any, where: str, warnings: list[str]) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        warnings.append(f"{where} must be a list of strings; ignored")
        return []
    return list(value)


def _merge_permissions(settings: Settings, value: Any, where: str, *, shared: bool) -> None:
    w = settings.warnings
    if not isinstance(value, dict):
        w.append(f'{where} must be an object like {{"allow": [...], "deny": [...]}}; ignored')
        return
    for k, v in value.items():
        if k not in PERMISSION_KEYS:
            w.append(
                f"{where}: unknown key {k!r} skipped (known: {', '.join(sorted(PERMISSION_KEYS))})"
            )
        elif k == "deny":
            settings.deny += [(r, where.split(": ")[0]) for r in _strings(v, f"{where}.deny", w)]
        elif shared:
            w.append(
                f"{where}.{k} ignored: the shared project file may only add deny rules "
                "(put it in .keel/settings.local.json or your user settings)"
            )
        elif k == "allow":
            settings.allow += [(r, where.split(": ")[0]) for r in _strings(v, f"{where}.allow", w)]
        elif k == "default_mode":
            if v in ("default", "accept-edits", "plan", "bypass"):
                settings.default_mode = v
            else:
                w.append(
                    f"{where}.default_mode must be default, accept-edits, plan or bypass; ignored"
                )


def _merge_sandbox(settings: Settings, value: Any, where: str, *, shared: bool) -> None:
    w = settings.warnings
    if not isinstance(value, dict):
        w.append(f'{where} must be an object like {{"enabled": true}}; ignored')
        return
    for k, v in value.items():
        if k not in SANDBOX_KEYS:
            w.append(f"{where}: unknown key {k!r} skipped (known: enabled, network)")
        elif not isinstance(v, bool):
            w.append(f"{where}.{k} must be true or false; ignored")
        elif shared and ((k == "enabled" and not v) or (k == "network" and v)):
            w.append(f"{where}.{k} ignored: the shared project file may only tighten the sandbox")
        elif k == "enabled":
            settings.sandbox = v
        else:
            settings.sandbox_network = v


def load_settings(project: Path, env: Mapping[str, str] | None = None) -> Settings:
    settings = Settings()
    for path in settings_files(project, env):
        data = read_json_object(path, settings.warnings, skipped="file skipped")
        if data is None:
            continue
        settings.files.append(path)
        _merge_file(settings, path, data)
    return settings
