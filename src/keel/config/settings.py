"""Settings files and their precedence.

Files, later winning for scalar values:
1. user: `$KEEL_CONFIG_DIR/settings.json`, else `$XDG_CONFIG_HOME/keel/settings.json`, else
   `~/.config/keel/settings.json`
2. project (shared): `<project>/.keel/settings.json`
3. project (personal, git-ignored): `<project>/.keel/settings.local.json`

Then Codex's and OpenCode's files (`keel.config.foreign`): OpenCode's permission rules join the
rules (a project `opencode.json`'s allow rules gated like a project settings file's), and their
model is taken when no keel file names one.

A file that is not valid JSON is skipped with a warning naming the file, line and column; an
unknown key, or a value of the wrong type or out of range (`nan`, a negative limit), is skipped
with a warning naming the file and key and saying what is expected. Loading never raises for a
bad file: keel starts with the valid parts and says what it skipped.

Trust (docs/security.md): the shared file (2), and a personal one that git tracks (it came with
the repository), are untrusted. What they say that decides where a credential goes, runs code or
widens a permission (`keel.config.trust.gated_entries`) applies only once the user approved it
(`keel trust approve`, pinned to a hash of those entries); until then it is skipped with a
warning and listed in `Settings.pending`. They may lower `max_turns` and budgets, never raise
them. A provider URL from a project file, even approved, loses to the user's own settings and
environment (`ANTHROPIC_BASE_URL`…).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from keel.config.intake import Intake, intake_for
from keel.config.intake import user_config_dir as user_config_dir  # re-exported
from keel.config.trust import Gated, approved_pins, gated_entries, settings_pin
from keel.frozen import frozen, mutable
from keel.llm.catalog import ModelInfo
from keel.llm.presets import PRESETS, WIRES
from keel.llm.provider import ProviderConfig
from keel.llm.request import Effort, Sampling

if TYPE_CHECKING:
    from keel.agent.events import ToolCallText
    from keel.tools.profile import ToolProfile

KNOWN_KEYS = frozenset(
    {
        "model",
        "providers",
        "models",
        "max_turns",
        "effort",
        "budget",
        # Caps on the subagents a prompt's tree starts (Settings.subagents_max_*).
        "subagents",
        "permissions",
        "sandbox",
        "auto_compact",
        "web_search",
        "fallbacks",
        # Claude Code's status line command (Settings.status_line; run by keel.tui.statusline).
        "statusLine",
        # Claude Code's output style (Settings.output_style; keel.agent.output_styles).
        "outputStyle",
        # Read by keel.hooks.config and keel.mcp.config, which own their formats.
        "hooks",
        "mcp_servers",
        "mcp_sampling",
        "unsafe_to_repeat",
        # The model prompt hooks use when they name none (keel.hooks.model).
        "hooks_model",
        # Debug traces (keel.trace): on for every run, and how long traces are kept.
        "debug",
        "trace_retention_days",
        # OpenTelemetry export of traces (keel.trace.otel); your own settings only.
        "otel",
        # Tools other keel agents serve over NATS (keel.remote; docs/remote-tools.md).
        "remote_tools",
        # Project knowledge (keel.knowledge): the search tool, and its optional embeddings.
        "knowledge",
        # Memory notes (keel.memory): on by default; a project file may only turn it off.
        "memory",
        # The tools offered to the model (keel.tools.profile): `{"profile": ...}`.
        "tools",
        # A tool call the model writes as text and keel does not run (keel.llm.salvage):
        # nudge, stop or ignore.
        "tool_call_text",
        # Claude Code plugins (keel.plugins): which are on, and where else to find them.
        "enabledPlugins",
        "extraKnownMarketplaces",
        # Language servers for diagnostics after edits (keel.lsp; docs/lsp.md).
        "lsp",
        # Bounds of /undo's capture of bash changes outside git (keel.checkpoints.tree).
        "checkpoints",
        # Compaction (keel.agent.compaction): threshold, facts to keep, a prompt addition.
        "compaction",
        # Auto mode's classifier (keel.permissions.auto): your own settings only.
        "auto_mode",
        "$schema",
    }
)
PERMISSION_KEYS = frozenset(
    {"allow", "ask", "deny", "default_mode", "defaultMode", "additionalDirectories"}
)
#: Claude Code's permission modes, and keel's name for each.
CLAUDE_MODES = {
    "default": "default",
    "acceptEdits": "accept-edits",
    "plan": "plan",
    "bypassPermissions": "bypass",
}
#: Keys of Claude Code's settings files that keel reads elsewhere (hooks, the status line) or
#: here (permissions); every other key is named in a warning.
CLAUDE_KEYS = frozenset(
    {
        "permissions",
        "hooks",
        "statusLine",
        "outputStyle",
        "enabledPlugins",
        "extraKnownMarketplaces",
        "$schema",
    }
)
SANDBOX_KEYS = frozenset({"enabled", "network", "env_passthrough", "env_deny", "hide", "unhide"})
PROVIDER_KEYS = frozenset(
    {"base_url", "api_key_env", "stall_timeout", "call_timeout", "wire", "num_ctx"}
)
TOOL_CALL_TEXT: dict[str, ToolCallText] = {"nudge": "nudge", "stop": "stop", "ignore": "ignore"}
EFFORTS: dict[str, Effort] = {"low": "low", "medium": "medium", "high": "high", "max": "max"}
MODEL_KEYS = frozenset(
    {"window", "max_output", "input_price", "output_price", "cache_read_price", "cache_write_price"}
)
SAMPLING_KEYS = frozenset({"temperature", "top_p"})


#: The most turns a shared project file may ask for when the user set none
#: (`keel.agent.limits.DEFAULT_MAX_TURNS`; a test keeps the two equal).
SHARED_MAX_TURNS_CEILING = 200
#: The most subagents, in all and at once, a project file may ask for when the user set none
#: (`keel.agent.subagents.MAX_TOTAL` and `MAX_CONCURRENT`; a test keeps them equal).
SHARED_SUBAGENTS_CEILING = 32
SHARED_CONCURRENT_CEILING = 4

#: `checkpoints.*`: (kind, lowest, the default: the most a project file may ask for). The
#: defaults are `keel.checkpoints.tree.TreeLimits`' (a test keeps the two equal).
CHECKPOINT_KEYS: dict[str, tuple[type, float, float]] = {
    "file_bytes": (int, 0, 4 * 2**20),
    "total_bytes": (int, 0, 256 * 2**20),
    "max_files": (int, 0, 50_000),
    "scan_seconds": (float, 0, 3.0),
}

#: Environment variable names (for `api_key_env`).
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@frozen
class PendingFile:
    """The entries of one untrusted project file that wait for the user's approval."""

    path: Path
    pin: str
    entries: tuple[Gated, ...]
    approved: bool


@frozen
class StatusLineConfig:
    """Claude Code's `statusLine` setting: `{"type": "command", "command": …, "padding": 0}`."""

    command: str
    padding: int
    #: The settings file it came from.
    source: Path


#: Keys of the `otel` setting.
OTEL_KEYS = frozenset({"endpoint", "capture_content", "headers"})


@frozen
class OtelSettings:
    """The `otel` setting: export traces as OpenTelemetry spans and metrics over OTLP/HTTP to
    `endpoint` (the base URL; `/v1/traces` and `/v1/metrics` are appended), with `headers`
    (an API key of the collector), prompts and tool inputs and outputs only with
    `capture_content`."""

    endpoint: str
    capture_content: bool = False
    headers: tuple[tuple[str, str], ...] = ()


#: Keys of the `memory` setting.
MEMORY_KEYS = frozenset({"enabled", "backend", "url", "bucket", "prefix", "project"})
#: A NATS KV bucket name, and a key prefix (tokens joined by dots).
_BUCKET = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_KEY_PREFIX = re.compile(r"^(?:[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*)?$")


@frozen
class MemorySettings:
    """The `memory` setting (docs/memory.md): on or off, and where notes are kept: `files`
    (the default, under keel's data folder) or `nats` (a JetStream KV `bucket` on the server
    at `url`, keys under `prefix`). `project` names this project's scope in a shared store
    ("" : a key made from the git root's path)."""

    enabled: bool = True
    backend: str = "files"
    url: str = ""
    bucket: str = "keel-memory"
    prefix: str = "keel"
    project: str = ""


#: Keys of the `knowledge` setting and of its `embeddings` object.
KNOWLEDGE_KEYS = frozenset({"enabled", "embeddings"})
EMBEDDINGS_KEYS = frozenset({"url", "model", "api_key_env"})


@frozen
class KnowledgeSettings:
    """The `knowledge` setting: whether the `knowledge_search` tool is offered (where the project
    has an index), and the OpenAI-compatible endpoint (`embeddings_url` + `/embeddings`) whose
    vectors are fused with BM25 (empty: lexical only)."""

    enabled: bool = True
    embeddings_url: str = ""
    embeddings_model: str = ""
    #: The variable holding a bearer token for the endpoint ("" = none).
    embeddings_key_env: str = ""


#: Keys of the `compaction` setting, and the range of its threshold (a fraction of the window).
COMPACTION_KEYS = frozenset({"threshold", "keep", "prompt"})
COMPACTION_THRESHOLDS = (0.1, 0.95)
#: The longest fact to keep and prompt addition (characters), and the most facts.
COMPACTION_FACT_CHARS = 1_000
COMPACTION_PROMPT_CHARS = 4_000
COMPACTION_MAX_FACTS = 100


@frozen
class PromptAddition:
    """One file's `compaction.prompt`: `project` when the file came with the project (the
    summary request marks it as the project's)."""

    text: str
    source: str
    project: bool


@frozen
class CompactionSettings:
    """The `compaction` setting (docs/compaction.md): compact when the last request filled
    more than `threshold` of the window; the facts every summary must keep (`keep`, each
    file adds); the summary prompt's additions, each with the file it came from."""

    threshold: float = 0.8
    keep: tuple[str, ...] = ()
    prompts: tuple[PromptAddition, ...] = ()


#: Keys of one `remote_tools` entry.
REMOTE_TOOLS_KEYS = frozenset({"identity", "url", "tools", "alias", "optional", "timeout"})
#: An identity or alias of remote tools: one NATS subject token.
_REMOTE_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@frozen
class RemotePeer:
    """One `remote_tools` entry (docs/remote-tools.md): the tools the keel agent `identity`
    serves over NATS at `url` ("" : `KEEL_NATS_URL`), only those named in `tools` (None: all),
    named `<alias or identity>_<tool>` on a clash; `optional`: unreachable at setup is a warning,
    not an error; `timeout`: seconds the peer may stay silent during a call (None: 30)."""

    identity: str
    url: str = ""
    tools: tuple[str, ...] | None = None
    alias: str = ""
    optional: bool = False
    timeout: float | None = None
    source: str = ""


#: Keys of the `auto_mode` setting (docs/permissions.md "Auto mode").
AUTO_MODE_KEYS = frozenset({"model", "prompt", "timeout", "context_messages"})


@frozen
class AutoModeSettings:
    """The `auto_mode` setting: the classifier's model (`provider/model`; "" : the session's),
    its policy (`prompt`; "" : keel's), seconds it may take (`timeout`) and how many recent
    messages it reads (`context_messages`). Only your own settings may set it, and only they
    may make `auto` the default mode: it decides what runs without asking you."""

    model: str = ""
    prompt: str = ""
    timeout: float = 30.0
    context_messages: int = 6


@mutable
class Settings:
    model: str | None = None
    effort: Effort | None = None
    max_turns: int | None = None
    budget_usd: float | None = None
    budget_tokens: int | None = None
    #: `budget.min_output_tokens`: the least reply a budget must pay for (None: keel's default).
    budget_min_output_tokens: int | None = None
    #: `subagents.max_total` / `max_concurrent`: subagents a prompt may start, and run at once
    #: (None: keel's defaults). A project file may lower them.
    subagents_max_total: int | None = None
    subagents_max_concurrent: int | None = None
    providers: dict[str, ProviderConfig] = field(default_factory=dict)
    models: dict[str, ModelInfo] = field(default_factory=dict)
    #: Sampling defaults per model (`models.<id>.temperature` / `top_p`).
    sampling: dict[str, Sampling] = field(default_factory=dict)
    #: `provider/model` → the models to fall back to, in order.
    fallbacks: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: Permission rules as written, with the file each came from: (rule text, source).
    allow: list[tuple[str, str]] = field(default_factory=list)
    ask: list[tuple[str, str]] = field(default_factory=list)
    deny: list[tuple[str, str]] = field(default_factory=list)
    #: `permissions.additionalDirectories`: where else writes may go, with the file each came from.
    additional_dirs: list[tuple[Path, str]] = field(default_factory=list)
    default_mode: str | None = None
    auto_compact: bool = True
    #: `compaction`: threshold, facts to keep, prompt additions (any file; a project's prompt
    #: addition is marked as the project's).
    compaction: CompactionSettings = field(default_factory=CompactionSettings)
    #: `tools.profile`: full, compact, or auto (compact for a small window; keel.tools.profile).
    tool_profile: ToolProfile = "auto"
    #: `tool_call_text`: what a tool call the model wrote as text and keel did not run leads to.
    tool_call_text: ToolCallText = "nudge"
    #: The provider's own web search (`web_search`: true/false, or an object with `enabled`,
    #: `max_uses`, `allowed_domains`, `blocked_domains`); on where the provider has one.
    web_search: bool = True
    web_search_max_uses: int | None = None
    web_search_allowed_domains: tuple[str, ...] = ()
    web_search_blocked_domains: tuple[str, ...] = ()
    sandbox: bool = True
    sandbox_network: bool = False
    #: Variables sandboxed commands get by name, secrets included (yours only).
    sandbox_env_passthrough: tuple[str, ...] = ()
    #: More patterns of variables sandboxed commands never see.
    sandbox_env_deny: tuple[str, ...] = ()
    #: More paths (`~/...` or absolute) sandboxed commands cannot read; every file adds.
    sandbox_hide: tuple[str, ...] = ()
    #: Credential stores hidden by default that sandboxed commands may read (yours only).
    sandbox_unhide: tuple[str, ...] = ()
    files: list[Path] = field(default_factory=list)
    #: Each settings file's `mcp_servers` value as written, with its path (keel.mcp parses them).
    mcp_servers: list[tuple[Path, object]] = field(default_factory=list)
    #: MCP servers' sampling requests: ask (interactive only), allow (also headless), deny.
    mcp_sampling: str = "ask"
    #: The model `prompt` hooks ask when they name none ("" = the session's model).
    hooks_model: str = ""
    #: Write a debug trace of every run (`debug`; your own settings only).
    debug: bool = False
    #: Traces older than this many days are pruned when tracing starts (your own settings only).
    trace_retention_days: int = 14
    #: OpenTelemetry export (`otel`; your own settings only). None: off.
    otel: OtelSettings | None = None
    #: Project knowledge (`knowledge`): a project file may turn it off, not set embeddings.
    knowledge: KnowledgeSettings = field(default_factory=KnowledgeSettings)
    #: Memory notes (`memory`): a project file may only turn them off.
    memory: MemorySettings = field(default_factory=MemorySettings)
    #: Bash command patterns (`git push *`) not safe to run twice after a crash, beyond
    #: keel.tools.effects' defaults. Every file only adds to them.
    unsafe_to_repeat: list[str] = field(default_factory=list)
    #: Peers whose tools are imported (`remote_tools`); every file adds (a project's once
    #: approved: they send tool inputs to another machine).
    remote_tools: list[RemotePeer] = field(default_factory=list)
    #: Untrusted project files with entries that need approval (approved or not).
    pending: list[PendingFile] = field(default_factory=list)
    #: The status line command (the last file that sets one wins; a project's once approved).
    status_line: StatusLineConfig | None = None
    #: `outputStyle`: the output style's name and the file that named it (prompt text: any
    #: file may set it; the last one wins). "" for keel's own prompt.
    output_style: str = ""
    output_style_file: Path | None = None
    #: `enabledPlugins`: `name@marketplace` → (on or off, the file that says so); a later file
    #: wins, a project's once approved (keel.plugins reads it).
    enabled_plugins: dict[str, tuple[bool, Path]] = field(default_factory=dict)
    #: `extraKnownMarketplaces`: name → (its `source` object as written, the file).
    marketplaces: dict[str, tuple[object, Path]] = field(default_factory=dict)
    #: `lsp` (keel.lsp, docs/lsp.md): language servers' diagnostics after edits; only your own
    #: settings may turn them back on. `lsp_servers`: each file's `lsp.servers` object, with the
    #: file (a project's entries that run a command only once approved: keel.config.trust).
    lsp_enabled: bool = True
    lsp_timeout: float = 3.0
    lsp_warnings: bool = False
    lsp_servers: list[tuple[Path, object]] = field(default_factory=list)
    #: `checkpoints`: bounds of bash capture outside git, by key of `CHECKPOINT_KEYS` (those
    #: not set keep keel.checkpoints.tree.TreeLimits' defaults). A project file may only lower.
    checkpoints: dict[str, float] = field(default_factory=dict)
    #: `auto_mode`: auto mode's classifier (your own settings only).
    auto_mode: AutoModeSettings = field(default_factory=AutoModeSettings)
    warnings: list[str] = field(default_factory=list)

    def provider(self, name: str) -> ProviderConfig:
        return self.providers.get(name, ProviderConfig())


def settings_files(
    project: Path,
    env: Mapping[str, str] | None = None,
    *,
    user_dir: Path | None = None,
    home: Path | None = None,
) -> list[Path]:
    """keel's files and Claude Code's, in the order they are merged (later wins for a single
    value; rules add up): user, then at each directory from the project root down to `project`
    (the working directory) shared, then personal; Claude Code's before keel's at each level
    (`keel.config.intake.Intake.settings_files`). Hooks are read from the same files."""
    return intake_for(project, env, user_dir=user_dir, home=home).settings_files()


def is_claude_file(path: Path) -> bool:
    return path.parent.name == ".claude"


def read_json_object(
    path: Path, warnings: list[str], *, skipped: str, comments: bool = False
) -> dict[str, Any] | None:
    """The JSON object in `path`: None if the file is missing or unusable (with a warning naming
    the file, and the line for bad JSON, ending in `skipped`: what is lost), {} if it is empty.
    `comments`: JSON with comments (JSONC: `//` and `/* */` comments, trailing commas, a
    byte-order mark), as OpenCode and editors write it."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        # An empty directory is the sandbox's placeholder for a missing protected file (while a
        # command runs): the file is missing. A directory with something in it is a mistake.
        if not any(path.iterdir()):
            return None
        warnings.append(f"{path}: is a directory, not a file; {skipped}")
        return None
    except OSError as exc:
        warnings.append(f"{path}: cannot read ({exc.strerror}); {skipped}")
        return None
    except UnicodeDecodeError:
        warnings.append(f"{path}: not UTF-8 text; {skipped}")
        return None
    if comments:
        from keel.config.foreign import strip_jsonc

        text = strip_jsonc(text.removeprefix("\ufeff"))
    if not text.strip():
        return {}
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        warnings.append(f"{path}:{exc.lineno}:{exc.colno}: invalid JSON ({exc.msg}); {skipped}")
        return None
    except RecursionError:
        warnings.append(f"{path}: nested too deeply; {skipped}")
        return None
    if not isinstance(data, dict):
        warnings.append(f"{path}: must hold a JSON object; {skipped}")
        return None
    return data


def _number(
    value: Any,
    where: str,
    warnings: list[str],
    kind: type = float,
    *,
    low: float = 0.0,
    high: float = 1e9,
    low_open: bool = True,
) -> Any:
    """`value` as a `kind` within (low, high] (or [low, high] when `low_open` is false); None
    with a warning naming `where` and the range otherwise (nan, infinities and booleans too)."""
    bound = f"{'more than' if low_open else 'at least'} {low:g} and at most {high:g}"
    if isinstance(value, bool) or not isinstance(value, int | float):
        warnings.append(f"{where} must be a number {bound}; ignored")
        return None
    if kind is int and isinstance(value, float) and not value.is_integer():
        warnings.append(f"{where} must be a whole number; ignored")
        return None
    if not math.isfinite(value) or value > high or value < low or (low_open and value == low):
        warnings.append(f"{where} must be {bound} (got {value!r}); ignored")
        return None
    return kind(value)


class _Merge:
    """Merges one file's object into `settings`. `untrusted` files (shared, or come with the
    repository) may only lower limits; their gated entries were split off before."""

    def __init__(self, settings: Settings, path: Path, *, untrusted: bool) -> None:
        self.settings = settings
        self.path = path
        self.untrusted = untrusted
        self.w = settings.warnings

    def file(self, data: dict[str, Any]) -> None:
        for key, value in data.items():
            where = f"{self.path}: {key}"
            if key not in KNOWN_KEYS:
                known = ", ".join(sorted(KNOWN_KEYS - {"$schema"}))
                self.w.append(f"{self.path}: unknown key {key!r} skipped (known: {known})")
            elif key == "budget":
                self.budget(value, where)
            elif key == "providers":
                self.providers(value, where)
            elif key == "models":
                self.models(value, where)
            elif key == "fallbacks":
                self.fallbacks(value, where)
            elif key == "permissions":
                self.permissions(value, where)
            elif key in (
                "sandbox",
                "knowledge",
                "memory",
                "tools",
                "lsp",
                "checkpoints",
                "compaction",
                "subagents",
                "auto_mode",
            ):  # a method of its name
                getattr(self, key)(value, where)
            elif key == "web_search":
                self._web_search(value, where)
            elif key == "mcp_servers":
                self.settings.mcp_servers.append((self.path, value))
            elif key in ("unsafe_to_repeat", "remote_tools"):  # lists every file adds to
                getattr(self, key)(value, where)
            elif key in ("statusLine", "outputStyle", "enabledPlugins", "extraKnownMarketplaces"):
                self.claude({key: value})  # Claude Code's keys, read the same in keel's files
            elif key in ("hooks", "$schema"):
                pass
            else:
                self.scalar(key, value, where)

    def auto_mode(self, value: Any, where: str) -> None:
        """`auto_mode`: the classifier that decides for you in auto mode. A project file may not
        set it (a permissive prompt, or a model that answers as the project likes, would let
        anything run), not even once approved."""
        if self.untrusted:
            self.w.append(f"{where} ignored: only your own settings may configure auto mode")
            return
        if not isinstance(value, dict):
            self.w.append(f'{where} must be an object like {{"model": "provider/model"}}; ignored')
            return
        conf = self.settings.auto_mode
        for k, v in value.items():
            at = f"{where}.{k}"
            if k not in AUTO_MODE_KEYS:
                known = ", ".join(sorted(AUTO_MODE_KEYS))
                self.w.append(f"{at}: unknown key skipped (known: {known})")
            elif k in ("model", "prompt"):
                if not isinstance(v, str) or not v.strip():
                    self.w.append(f"{at} must be a non-empty string; ignored")
                elif k == "model":
                    conf = dataclasses.replace(conf, model=v.strip())
                else:
                    conf = dataclasses.replace(conf, prompt=v.strip())
            elif k == "timeout":
                seconds = _number(v, at, self.w, float, low=0, high=600)
                if seconds is not None:
                    conf = dataclasses.replace(conf, timeout=seconds)
            else:
                n = _number(v, at, self.w, int, low=0, high=100, low_open=False)
                if n is not None:
                    conf = dataclasses.replace(conf, context_messages=n)
        self.settings.auto_mode = conf

    def _web_search(self, value: Any, where: str) -> None:
        """`web_search`: a project file may turn it off, lower `max_uses` and block domains,
        never turn it back on or widen `allowed_domains` (only your own settings may)."""
        s = self.settings
        conf = {"enabled": value} if isinstance(value, bool) else value
        if not isinstance(conf, dict):
            self.w.append(f"{where} must be true, false or an object; ignored")
            return
        for k, v in conf.items():
            at = f"{where}.{k}"
            if k == "enabled":
                if not isinstance(v, bool):
                    self.w.append(f"{at} must be true or false; ignored")
                elif v and not s.web_search and self.untrusted:
                    self.w.append(f"{at} ignored: only your own settings may turn web search on")
                else:
                    s.web_search = v
            elif k == "max_uses":
                n = _number(v, at, self.w, int, low=1, high=1_000, low_open=False)
                if n is not None and self._lower_only(s.web_search_max_uses, n, at, 1_000):
                    s.web_search_max_uses = n
            elif k == "blocked_domains":
                s.web_search_blocked_domains += tuple(_strings(v, at, self.w))
            elif k == "allowed_domains":
                if self.untrusted and s.web_search_allowed_domains:
                    self.w.append(f"{at} ignored: your own settings already narrow the domains")
                else:
                    s.web_search_allowed_domains = tuple(_strings(v, at, self.w))
            else:
                self.w.append(f"{at}: unknown key skipped")

    def _lower_only(self, old: float | None, new: float, where: str, ceiling: float) -> bool:
        """Whether an untrusted file's limit `new` may replace `old` (it may only lower it)."""
        if not self.untrusted or new <= (old if old is not None else ceiling):
            return True
        self.w.append(f"{where} ignored: a project file may lower this limit, not raise it")
        return False

    def scalar(self, key: str, value: Any, where: str) -> None:
        s = self.settings
        if key == "hooks_model":
            if isinstance(value, str) and value.strip():
                s.hooks_model = value.strip()
            else:
                self.w.append(
                    f"{where} must be a non-empty model name like claude-haiku-4-5; ignored"
                )
        elif key == "model":
            if isinstance(value, str) and value.strip():
                s.model = value.strip()
            else:
                self.w.append(
                    f"{where} must be a non-empty string like anthropic/claude-sonnet-4-5; ignored"
                )
        elif key == "effort":
            if isinstance(value, str) and value in EFFORTS:
                s.effort = EFFORTS[value]
            else:
                self.w.append(f"{where} must be low, medium, high or max; ignored")
        elif key == "max_turns":
            n = _number(value, where, self.w, int, low=1, high=100_000, low_open=False)
            if n is not None and self._lower_only(s.max_turns, n, where, SHARED_MAX_TURNS_CEILING):
                s.max_turns = n
        elif key in ("auto_compact", "debug", "trace_retention_days"):
            self._switch(key, value, where)
        elif key == "otel":
            self.otel(value, where)
        elif key in ("mcp_sampling", "tool_call_text"):
            self._choice(key, value, where)

    def _choice(self, key: str, value: Any, where: str) -> None:
        """`mcp_sampling` (only your own settings may allow it) and `tool_call_text` (any file:
        each value still says what was not run)."""
        s = self.settings
        if key == "tool_call_text":
            if value in TOOL_CALL_TEXT:
                s.tool_call_text = TOOL_CALL_TEXT[value]
            else:
                self.w.append(f"{where} must be nudge, stop or ignore; ignored")
        elif value not in ("ask", "allow", "deny"):
            self.w.append(f"{where} must be ask, allow or deny; ignored")
        elif self.untrusted and value == "allow":
            self.w.append(f"{where} ignored: only your own settings may allow sampling")
        else:
            s.mcp_sampling = value

    def _switch(self, key: str, value: Any, where: str) -> None:
        """`auto_compact`, and the trace settings `debug` and `trace_retention_days`: what is
        written to your disk and for how long is yours to say; a project file may not (it could
        record your sessions, or prune them)."""
        s = self.settings
        if key != "auto_compact" and self.untrusted:
            self.w.append(f"{where} ignored: only your own settings may set it")
        elif key in ("auto_compact", "debug"):
            if isinstance(value, bool):
                setattr(s, key, value)
            else:
                self.w.append(f"{where} must be true or false; ignored")
        else:
            days = _number(value, where, self.w, int, low=1, high=36_500, low_open=False)
            if days is not None:
                s.trace_retention_days = days

    def otel(self, value: Any, where: str) -> None:
        """`otel`: where traces go as OpenTelemetry data. It sends what your sessions do (and,
        with capture_content, what they say) to a server, so only your own settings may set it;
        `false` or null turns it off."""
        if self.untrusted:
            self.w.append(f"{where} ignored: only your own settings may export telemetry")
            return
        if value is False or value is None:
            self.settings.otel = None
            return
        if not isinstance(value, dict):
            self.w.append(f'{where} must be an object like {{"endpoint": URL}}; ignored')
            return
        unknown = set(value) - OTEL_KEYS
        if unknown:
            self.w.append(
                f"{where}: unknown key(s) {', '.join(sorted(unknown))} skipped "
                f"(known: {', '.join(sorted(OTEL_KEYS))})"
            )
        endpoint = value.get("endpoint")
        if not isinstance(endpoint, str) or not re.match(r"^https?://[^\s/]+", endpoint):
            self.w.append(f"{where}.endpoint must be an http:// or https:// URL; otel ignored")
            return
        capture = value.get("capture_content", False)
        if not isinstance(capture, bool):
            self.w.append(f"{where}.capture_content must be true or false; otel ignored")
            return
        headers = value.get("headers", {})
        if not isinstance(headers, dict) or not all(
            isinstance(k, str) and k.strip() and isinstance(v, str) for k, v in headers.items()
        ):
            self.w.append(f"{where}.headers must be an object of strings; otel ignored")
            return
        self.settings.otel = OtelSettings(endpoint, capture, tuple(sorted(headers.items())))

    def memory(self, value: Any, where: str) -> None:
        """`memory`: true / false, or an object (`enabled`, `backend`, `url`, `bucket`,
        `prefix`, `project`). Where notes go (a server could collect your user-scope notes) is
        yours to say: a project file may only turn memory off."""
        conf = {"enabled": value} if isinstance(value, bool) else value
        if not isinstance(conf, dict):
            self.w.append(
                f'{where} must be true, false or an object like {{"backend": "files"}}; ignored'
            )
            return
        if self.untrusted:
            if conf.get("enabled") is False:
                self.settings.memory = dataclasses.replace(self.settings.memory, enabled=False)
            rest = sorted(set(conf) - {"enabled"}) or (["enabled"] if conf.get("enabled") else [])
            if rest:
                self.w.append(
                    f"{where}: {', '.join(rest)} ignored: a project file may only turn memory "
                    "off (where notes are kept is for your own settings)"
                )
            return
        unknown = set(conf) - MEMORY_KEYS
        if unknown:
            self.w.append(
                f"{where}: unknown key(s) {', '.join(sorted(unknown))} skipped "
                f"(known: {', '.join(sorted(MEMORY_KEYS))})"
            )
        m = self.settings.memory
        changes: dict[str, Any] = {}
        enabled = conf.get("enabled", m.enabled)
        if isinstance(enabled, bool):
            changes["enabled"] = enabled
        else:
            self.w.append(f"{where}.enabled must be true or false; ignored")
        backend = conf.get("backend", m.backend)
        if backend in ("files", "nats"):
            changes["backend"] = backend
        else:
            self.w.append(f"{where}.backend must be files or nats; ignored")
        url = conf.get("url", m.url)
        if isinstance(url, str) and (not url or re.match(r"^(nats|tls|ws|wss)://\S+$", url)):
            changes["url"] = url
        else:
            self.w.append(f"{where}.url must be a nats:// URL; ignored")
        for key, pattern in (
            ("bucket", _BUCKET),
            ("prefix", _KEY_PREFIX),
            ("project", _KEY_PREFIX),
        ):
            text = conf.get(key, getattr(m, key))
            if isinstance(text, str) and pattern.match(text) and (text or key != "bucket"):
                changes[key] = text
            else:
                self.w.append(
                    f"{where}.{key} must be letters, digits, '-' and '_'"
                    f"{' (dots between parts)' if key != 'bucket' else ''}; ignored"
                )
        if changes.get("backend") == "nats" and not changes.get("url"):
            self.w.append(f"{where}: backend nats needs a url (nats://host:4222); using files")
            changes["backend"] = "files"
        self.settings.memory = dataclasses.replace(m, **changes)

    def lsp(self, value: Any, where: str) -> None:
        """`lsp`: `false`, or `{"enabled", "timeout", "warnings", "servers"}`. A project file may
        turn it off, not back on; its server entries that run a command were split off for
        approval before (keel.config.trust), so what reaches here may run."""
        s = self.settings
        conf = {"enabled": value} if isinstance(value, bool) else value
        if not isinstance(conf, dict):
            self.w.append(f'{where} must be false or an object like {{"timeout": 3}}; ignored')
            return
        for key, v in conf.items():
            at = f"{where}.{key}"
            if key == "enabled":
                if not isinstance(v, bool):
                    self.w.append(f"{at} must be true or false; ignored")
                elif v and not s.lsp_enabled and self.untrusted:
                    self.w.append(f"{at} ignored: only your own settings may turn it back on")
                else:
                    s.lsp_enabled = v
            elif key == "timeout":
                seconds = _number(v, at, self.w, high=60)
                if seconds is not None:
                    s.lsp_timeout = seconds
            elif key == "warnings":
                if isinstance(v, bool):
                    s.lsp_warnings = v
                else:
                    self.w.append(f"{at} must be true or false; ignored")
            elif key == "servers":
                s.lsp_servers.append((self.path, v))
            else:
                self.w.append(
                    f"{at}: unknown key skipped (known: enabled, servers, timeout, warnings)"
                )

    def tools(self, value: Any, where: str) -> None:
        """`tools`: `{"profile": "full" | "compact" | "auto"}`, any file (a profile offers fewer
        or more tools, never widens what they may do)."""
        from keel.tools.profile import PROFILES

        if not isinstance(value, dict):
            self.w.append(f'{where} must be an object like {{"profile": "compact"}}; ignored')
            return
        for k, v in value.items():
            if k != "profile":
                self.w.append(f"{where}.{k}: unknown key skipped (known: profile)")
            elif (profile := next((p for p in PROFILES if p == v), None)) is None:
                self.w.append(f"{where}.profile must be {', '.join(PROFILES)}; ignored")
            else:
                self.settings.tool_profile = profile

    def compaction(self, value: Any, where: str) -> None:
        """`compaction`: `{"threshold": 0.1-0.95, "keep": [facts], "prompt": text}`, any file
        (a later file's threshold wins; facts and prompts add up). A project's prompt addition
        is sent marked as the project's, after the built-in rules it cannot remove."""
        if not isinstance(value, dict):
            self.w.append(
                f'{where} must be an object like {{"threshold": 0.7, "keep": ["a fact"]}}; ignored'
            )
            return
        for key in sorted(set(value) - COMPACTION_KEYS):
            self.w.append(f"{where}: unknown key {key!r} skipped (known: keep, prompt, threshold)")
        c = self.settings.compaction
        low, high = COMPACTION_THRESHOLDS
        threshold = value.get("threshold", c.threshold)
        if isinstance(threshold, bool) or not isinstance(threshold, int | float):
            threshold = math.nan
        if not low <= threshold <= high:  # nan fails too
            self.w.append(
                f"{where}.threshold must be a fraction of the context window from {low:g} to "
                f"{high:g} (got {value.get('threshold')!r}); ignored (hint: 0.8 compacts when a "
                "request fills 80% of the window)"
            )
            threshold = c.threshold
        keep = list(c.keep)
        for i, fact in enumerate(_strings(value.get("keep", []), f"{where}.keep", self.w)):
            fact = " ".join(fact.split())
            if not fact or len(fact) > COMPACTION_FACT_CHARS:
                self.w.append(
                    f"{where}.keep[{i}] must be a fact of 1 to {COMPACTION_FACT_CHARS} "
                    "characters; skipped"
                )
            elif len(keep) >= COMPACTION_MAX_FACTS:
                self.w.append(
                    f"{where}.keep: more than {COMPACTION_MAX_FACTS} facts; the rest skipped"
                )
                break
            elif fact not in keep:
                keep.append(fact)
        prompts = c.prompts
        if "prompt" in value:
            text = value["prompt"]
            if not isinstance(text, str) or not text.strip() or len(text) > COMPACTION_PROMPT_CHARS:
                self.w.append(
                    f"{where}.prompt must be text of 1 to {COMPACTION_PROMPT_CHARS} characters; "
                    "ignored"
                )
            else:
                addition = PromptAddition(text.strip(), str(self.path), self.untrusted)
                prompts = (*prompts, addition)
        self.settings.compaction = CompactionSettings(float(threshold), tuple(keep), prompts)

    def knowledge(self, value: Any, where: str) -> None:
        """`knowledge`: `false`, or `{"enabled", "embeddings": {"url", "model", "api_key_env"}}`.
        Embeddings send the project's docs and the model's queries to a server (and a key, with
        api_key_env), so only your own settings may set them; a project file may only turn
        knowledge off. The URL is https, or http to a loopback address (a local server)."""
        from dataclasses import replace

        s = self.settings
        conf = {"enabled": value} if isinstance(value, bool) else value
        if not isinstance(conf, dict):
            self.w.append(f"{where} must be false or an object with enabled, embeddings; ignored")
            return
        for key in sorted(set(conf) - KNOWLEDGE_KEYS):
            self.w.append(f"{where}: unknown key {key!r} skipped (known: embeddings, enabled)")
        if "enabled" in conf:
            enabled = conf["enabled"]
            if not isinstance(enabled, bool):
                self.w.append(f"{where}.enabled must be true or false; ignored")
            elif enabled and not s.knowledge.enabled and self.untrusted:
                self.w.append(f"{where}.enabled ignored: only your own settings may turn it on")
            else:
                s.knowledge = replace(s.knowledge, enabled=enabled)
        if "embeddings" in conf:
            self._embeddings(conf["embeddings"], f"{where}.embeddings")

    def _embeddings(self, value: Any, where: str) -> None:
        from dataclasses import replace

        s = self.settings
        if self.untrusted:
            self.w.append(
                f"{where} ignored: only your own settings may send the docs to an embeddings server"
            )
            return
        if value is False or value is None:
            s.knowledge = replace(
                s.knowledge, embeddings_url="", embeddings_model="", embeddings_key_env=""
            )
            return
        if not isinstance(value, dict):
            self.w.append(f"{where} must be an object with url and model; ignored")
            return
        for key in sorted(set(value) - EMBEDDINGS_KEYS):
            self.w.append(f"{where}: unknown key {key!r} skipped (known: api_key_env, model, url)")
        url, model, key_env = value.get("url"), value.get("model"), value.get("api_key_env", "")
        if not isinstance(url, str) or not _embeddings_url_ok(url):
            self.w.append(
                f"{where}.url must be an https:// URL, or http:// to 127.0.0.1, ::1 or "
                "localhost (a local server); embeddings ignored"
            )
        elif not isinstance(model, str) or not model.strip():
            self.w.append(f"{where}.model must be a non-empty model name; embeddings ignored")
        elif not isinstance(key_env, str) or not (key_env == "" or _ENV_NAME.match(key_env)):
            self.w.append(
                f"{where}.api_key_env must name an environment variable; embeddings ignored"
            )
        else:
            s.knowledge = replace(
                s.knowledge,
                embeddings_url=url.rstrip("/"),
                embeddings_model=model.strip(),
                embeddings_key_env=key_env,
            )

    def remote_tools(self, value: Any, where: str) -> None:
        """`remote_tools`: a list of `{identity, url?, tools?, alias?, optional?, timeout?}`;
        each bad entry is skipped with a warning, a second entry for one identity too."""
        if not isinstance(value, list):
            self.w.append(f'{where} must be a list of objects like {{"identity": "NAME"}}; ignored')
            return
        taken = {p.identity for p in self.settings.remote_tools}
        for i, entry in enumerate(value):
            peer = self._remote_peer(entry, f"{where}[{i}]")
            if peer is None:
                continue
            if peer.identity in taken:
                self.w.append(f"{where}[{i}]: {peer.identity} is already imported; skipped")
                continue
            taken.add(peer.identity)
            self.settings.remote_tools.append(peer)

    def _remote_peer(self, entry: Any, where: str) -> RemotePeer | None:
        if not isinstance(entry, dict):
            self.w.append(f"{where} must be an object with an identity; skipped")
            return None
        if unknown := set(entry) - REMOTE_TOOLS_KEYS:
            known = ", ".join(sorted(REMOTE_TOOLS_KEYS))
            self.w.append(
                f"{where}: unknown key(s) {', '.join(sorted(unknown))} (known: {known}); skipped"
            )
            return None
        identity, alias = entry.get("identity"), entry.get("alias", "")
        url, tools, optional = (
            entry.get("url", ""),
            entry.get("tools"),
            entry.get("optional", False),
        )
        timeout = entry.get("timeout")
        problem = ""
        if not isinstance(identity, str) or not _REMOTE_NAME.match(identity):
            problem = "identity must be 1 to 64 letters, digits, '-' or '_'"
        elif not isinstance(alias, str) or (alias and not _REMOTE_NAME.match(alias)):
            problem = "alias must be 1 to 64 letters, digits, '-' or '_'"
        elif not isinstance(url, str) or (url and not re.match(r"^(nats|tls|ws|wss)://\S+$", url)):
            problem = "url must be a nats:// (or tls://, ws://, wss://) URL"
        elif tools is not None and (
            not isinstance(tools, list) or not all(isinstance(t, str) and t for t in tools)
        ):
            problem = "tools must be a list of tool names"
        elif not isinstance(optional, bool):
            problem = "optional must be true or false"
        elif timeout is not None and (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not 1 <= timeout <= 3600
        ):
            problem = "timeout must be a number of seconds from 1 to 3600"
        if problem:
            self.w.append(f"{where}: {problem}; skipped")
            return None
        assert isinstance(identity, str)
        return RemotePeer(
            identity=identity,
            url=url,
            tools=tuple(tools) if tools is not None else None,
            alias=alias,
            optional=optional,
            timeout=float(timeout) if timeout is not None else None,
            source=str(self.path),
        )

    def unsafe_to_repeat(self, value: Any, where: str) -> None:
        """More patterns of commands not safe to repeat; any file may add, none may remove."""
        for pattern in _strings(value, where, self.w):
            if not pattern.strip():
                self.w.append(f"{where}: an empty pattern skipped")
            elif pattern.strip() not in self.settings.unsafe_to_repeat:
                self.settings.unsafe_to_repeat.append(pattern.strip())

    def budget(self, value: Any, where: str) -> None:
        s = self.settings
        if not isinstance(value, dict):
            self.w.append(f'{where} must be an object like {{"usd": 5}}; ignored')
            return
        for k, v in value.items():
            if k == "usd":
                usd = _number(v, f"{where}.usd", self.w, high=1e6)
                if usd is not None and self._lower_only(s.budget_usd, usd, where, math.inf):
                    s.budget_usd = usd
            elif k == "tokens":
                tokens = _number(v, f"{where}.tokens", self.w, int, high=1e12)
                if tokens is not None and self._lower_only(
                    s.budget_tokens, tokens, where, math.inf
                ):
                    s.budget_tokens = tokens
            elif k == "min_output_tokens":
                # Any file: the floor only decides when to stop, never lets a cap be crossed.
                floor = _number(v, f"{where}.min_output_tokens", self.w, int, high=1e6)
                if floor is not None:
                    s.budget_min_output_tokens = floor
            else:
                self.w.append(
                    f"{where}: unknown key {k!r} skipped (known: usd, tokens, min_output_tokens)"
                )

    def subagents(self, value: Any, where: str) -> None:
        """`subagents`: `{"max_total": N, "max_concurrent": N}`; a project file may lower
        them, never raise them."""
        s = self.settings
        if not isinstance(value, dict):
            self.w.append(f'{where} must be an object like {{"max_total": 10}}; ignored')
            return
        for k, v in value.items():
            at = f"{where}.{k}"
            if k == "max_total":
                n = _number(v, at, self.w, int, low=0, high=10_000, low_open=False)
                if n is not None and self._lower_only(
                    s.subagents_max_total, n, at, SHARED_SUBAGENTS_CEILING
                ):
                    s.subagents_max_total = n
            elif k == "max_concurrent":
                n = _number(v, at, self.w, int, low=1, high=64, low_open=False)
                if n is not None and self._lower_only(
                    s.subagents_max_concurrent, n, at, SHARED_CONCURRENT_CEILING
                ):
                    s.subagents_max_concurrent = n
            else:
                self.w.append(f"{at}: unknown key skipped (known: max_concurrent, max_total)")

    def providers(self, value: Any, where: str) -> None:
        if not isinstance(value, dict):
            self.w.append(f"{where} must be an object keyed by provider name; ignored")
            return
        for name, conf in value.items():
            if not isinstance(conf, dict):
                self.w.append(f"{where}.{name} must be an object; ignored")
                continue
            unknown = set(conf) - PROVIDER_KEYS
            if unknown:
                self.w.append(
                    f"{where}.{name}: unknown key(s) {', '.join(sorted(unknown))} skipped "
                    f"(known: {', '.join(sorted(PROVIDER_KEYS))})"
                )
            self.provider(name, conf, f"{where}.{name}")

    def provider(self, name: str, conf: dict[str, Any], where: str) -> None:
        old = self.settings.provider(name)
        url = self._url(conf, old.project_base_url if self.untrusted else old.base_url, where)
        key_env = old.api_key_env
        if "api_key_env" in conf:
            v = conf["api_key_env"]
            if isinstance(v, str) and (v == "" or _ENV_NAME.match(v)):
                key_env = v
            else:
                self.w.append(
                    f"{where}.api_key_env must name an environment variable, like "
                    "MY_PROVIDER_KEY; ignored"
                )
        self.settings.providers[name] = ProviderConfig(
            base_url=old.base_url if self.untrusted else url,
            api_key_env=key_env,
            stall_timeout=self._seconds(conf, "stall_timeout", old.stall_timeout, where),
            call_timeout=self._seconds(conf, "call_timeout", old.call_timeout, where),
            wire=_wire(name, conf, old.wire, where, self.w),
            num_ctx=_num_ctx(conf, old.num_ctx, where, self.w),
            project_base_url=url if self.untrusted else old.project_base_url,
        )

    def _url(self, conf: dict[str, Any], old: str, where: str) -> str:
        if "base_url" not in conf:
            return old
        v = conf["base_url"]
        if isinstance(v, str) and (v == "" or v.startswith(("http://", "https://"))):
            return v
        self.w.append(f"{where}.base_url must be an http:// or https:// URL; ignored")
        return old

    def _seconds(self, conf: dict[str, Any], key: str, old: float | None, where: str) -> Any:
        if key not in conf:
            return old
        n = _number(conf[key], f"{where}.{key}", self.w, high=86_400)
        return old if n is None else n

    def fallbacks(self, value: Any, where: str) -> None:
        if not isinstance(value, dict):
            self.w.append(
                f'{where} must be an object like {{"anthropic/claude-sonnet-4-5": '
                '["openai/gpt-5"]}; ignored'
            )
            return
        for model, chain in value.items():
            if isinstance(chain, str):
                chain = [chain]
            self.settings.fallbacks[model] = tuple(_strings(chain, f"{where}.{model}", self.w))

    def models(self, value: Any, where: str) -> None:
        if not isinstance(value, dict):
            self.w.append(f"{where} must be an object keyed by model id; ignored")
            return
        for model, conf in value.items():
            if not isinstance(conf, dict):
                self.w.append(f"{where}.{model} must be an object; ignored")
                continue
            self.model(model, conf, f"{where}.{model}")

    def model(self, model: str, conf: dict[str, Any], where: str) -> None:
        s = self.settings
        sampling = _sampling(conf, where, self.w)
        if sampling is not None:
            s.sampling[model] = sampling
        if set(conf) <= SAMPLING_KEYS:
            return  # sampling only: the catalog's facts stand
        unknown = set(conf) - MODEL_KEYS - SAMPLING_KEYS
        if unknown:
            self.w.append(f"{where}: unknown key(s) {', '.join(sorted(unknown))} skipped")
        if not {"window", "max_output"} <= set(conf):
            self.w.append(f"{where} needs at least window and max_output; ignored")
            return
        window = _number(conf["window"], f"{where}.window", self.w, int, high=1e8)
        max_output = _number(conf["max_output"], f"{where}.max_output", self.w, int, high=1e8)
        prices = [
            _number(conf[k], f"{where}.{k}", self.w, high=1e6, low_open=False)
            if k in conf
            else None
            for k in _PRICES
        ]
        if window is None or max_output is None:
            return
        if any(p is None and k in conf for p, k in zip(prices, _PRICES, strict=True)):
            return
        s.models[model] = ModelInfo(
            window,
            max_output,
            input_price=prices[0],
            output_price=prices[1],
            cache_read_price=prices[2],
            cache_write_price=prices[3],
        )

    def permissions(self, value: Any, where: str) -> None:
        s, w = self.settings, self.w
        if not isinstance(value, dict):
            w.append(f'{where} must be an object like {{"allow": [...], "deny": [...]}}; ignored')
            return
        source = str(self.path)
        for k, v in value.items():
            if k not in PERMISSION_KEYS:
                known = ", ".join(sorted(PERMISSION_KEYS))
                w.append(f"{where}: unknown key {k!r} skipped (known: {known})")
            elif k in ("allow", "ask", "deny"):
                rules: list[tuple[str, str]] = getattr(s, k)
                rules += [(r, source) for r in _strings(v, f"{where}.{k}", w)]
            elif k == "additionalDirectories":
                self.directories(v, f"{where}.{k}")
            elif v == "auto" and self.untrusted:
                w.append(
                    f"{where}.{k} ignored: only your own settings may turn auto mode on (a "
                    "model would decide for you what runs)"
                )
            elif v in CLAUDE_MODES or v in CLAUDE_MODES.values() or v == "auto":
                s.default_mode = CLAUDE_MODES.get(v, v)
            else:
                w.append(
                    f"{where}.{k} must be default, accept-edits (acceptEdits), plan, bypass "
                    "(bypassPermissions) or auto; ignored"
                )

    def directories(self, value: Any, where: str) -> None:
        """`additionalDirectories`: absolute, `~/`, or relative to the folder holding the
        settings file's `.claude/` or `.keel/` (the project for a project file)."""
        base = self.path.parent.parent
        for raw in _strings(value, where, self.w):
            path = Path(raw).expanduser()
            path = path if path.is_absolute() else base / path
            if path.is_dir():
                self.settings.additional_dirs.append((path.resolve(), str(self.path)))
            else:
                self.w.append(f"{where}: {raw} is not a directory; ignored")

    def claude(self, data: dict[str, Any]) -> None:
        """A Claude Code settings file: keel takes its permissions (hooks and the status line are
        read by their own modules) and names every other key it leaves out."""
        unsupported = sorted(set(data) - CLAUDE_KEYS)
        if unsupported:
            self.w.append(
                f"{self.path}: Claude Code settings keel does not use: {', '.join(unsupported)} "
                "(docs/extensions.md lists what is supported)"
            )
        if "permissions" in data:
            self.permissions(data["permissions"], f"{self.path}: permissions")
        if "statusLine" in data:
            self.status_line(data["statusLine"])
        if "outputStyle" in data:
            self.output_style(data["outputStyle"])
        for key in ("enabledPlugins", "extraKnownMarketplaces"):
            if key in data:
                self.plugins(key, data[key])

    def plugins(self, key: str, value: Any) -> None:
        """`enabledPlugins` (`{"name@marketplace": true}`) and `extraKnownMarketplaces`
        (`{"name": {"source": {...}}}`); the sources are checked where they are used."""
        where = f"{self.path}: {key}"
        if not isinstance(value, dict):
            self.w.append(f"{where} must be an object; ignored")
            return
        for name, entry in value.items():
            if key == "extraKnownMarketplaces":
                source = entry.get("source") if isinstance(entry, dict) else None
                if isinstance(source, dict):
                    self.settings.marketplaces[name] = (source, self.path)
                else:
                    self.w.append(f'{where}.{name} must be {{"source": {{...}}}}; ignored')
            elif not isinstance(entry, bool) or name.count("@") != 1:
                self.w.append(f"{where}: {name!r} must be name@marketplace: true or false; ignored")
            else:
                self.settings.enabled_plugins[name] = (entry, self.path)

    def output_style(self, value: Any) -> None:
        if isinstance(value, str) and value.strip():
            self.settings.output_style, self.settings.output_style_file = value.strip(), self.path
        else:
            self.w.append(f"{self.path}: outputStyle must be a style's name; ignored")

    def status_line(self, value: Any) -> None:
        """`statusLine`; `{}` is what is left of a project's entry that waits for approval."""
        where = f"{self.path}: statusLine"
        if value == {}:
            return
        if not isinstance(value, dict):
            self.w.append(f"{where} must be an object with type and command; ignored")
            return
        if value.get("type", "command") != "command":
            kind = value.get("type")
            self.w.append(f"{where}: type {kind!r} is not supported (only command); ignored")
            return
        command, padding = value.get("command"), value.get("padding", 0)
        if not isinstance(command, str) or not command.strip():
            self.w.append(f"{where}.command must be a non-empty string; ignored")
        elif isinstance(padding, bool) or not isinstance(padding, int) or not 0 <= padding <= 20:
            self.w.append(f"{where}.padding must be a whole number from 0 to 20; ignored")
        else:
            self.settings.status_line = StatusLineConfig(command, padding, self.path)
            for key in sorted(set(value) - {"type", "command", "padding"}):
                self.w.append(f"{where}: unknown key {key!r} skipped")

    def checkpoints(self, value: Any, where: str) -> None:
        """`checkpoints`: `{"file_bytes", "total_bytes", "max_files", "scan_seconds"}`, the
        bounds of /undo's capture of bash changes outside git. A project file may lower them
        (its tree is large), not raise them (each command would scan and copy more)."""
        if not isinstance(value, dict):
            self.w.append(f'{where} must be an object like {{"file_bytes": 4194304}}; ignored')
            return
        s = self.settings
        for k, v in value.items():
            at = f"{where}.{k}"
            if k not in CHECKPOINT_KEYS:
                known = ", ".join(sorted(CHECKPOINT_KEYS))
                self.w.append(f"{at}: unknown key skipped (known: {known})")
                continue
            kind, low, default = CHECKPOINT_KEYS[k]
            n = _number(v, at, self.w, kind, low=low, high=1e12, low_open=False)
            if n is not None and self._lower_only(s.checkpoints.get(k), n, at, default):
                s.checkpoints[k] = n

    def sandbox(self, value: Any, where: str) -> None:
        s, w = self.settings, self.w
        if not isinstance(value, dict):
            w.append(f'{where} must be an object like {{"enabled": true}}; ignored')
            return
        for k, v in value.items():
            if k not in SANDBOX_KEYS:
                known = ", ".join(sorted(SANDBOX_KEYS))
                w.append(f"{where}: unknown key {k!r} skipped (known: {known})")
            elif k in ("env_passthrough", "env_deny"):
                names = tuple(_strings(v, f"{where}.{k}", w))
                if k == "env_deny":
                    s.sandbox_env_deny += names
                else:
                    s.sandbox_env_passthrough += names
            elif k == "unhide" and self.untrusted:
                w.append(
                    f"{where}.unhide ignored: only your own settings may show sandboxed commands "
                    "a credential store (a project file may only add to sandbox.hide)"
                )
            elif k in ("hide", "unhide"):
                paths = _strings(v, f"{where}.{k}", w)
                for bad in [p for p in paths if not p.startswith(("~/", "/"))]:
                    w.append(f"{where}.{k}: {bad!r} must start with ~/ or /; ignored")
                kept = tuple(p for p in paths if p.startswith(("~/", "/")))
                if k == "hide":
                    s.sandbox_hide += kept
                else:
                    s.sandbox_unhide += kept
            elif not isinstance(v, bool):
                w.append(f"{where}.{k} must be true or false; ignored")
            elif k == "enabled":
                s.sandbox = v
            else:
                s.sandbox_network = v


_PRICES = ("input_price", "output_price", "cache_read_price", "cache_write_price")


def _embeddings_url_ok(url: str) -> bool:
    """https anywhere; http only to a loopback host (the docs would cross a network in clear)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
    except ValueError:
        return False
    if parts.scheme == "https":
        return bool(host)
    return parts.scheme == "http" and host in ("127.0.0.1", "::1", "localhost")


def _wire(name: str, conf: dict[str, Any], old: str, where: str, warnings: list[str]) -> str:
    """`wire` makes `name` a custom provider; a built-in one already has its wire API."""
    if "wire" not in conf:
        return old
    wire = conf["wire"]
    if name in PRESETS:
        warnings.append(f"{where}.wire ignored: {name} is built in")
        return old
    if not isinstance(wire, str) or wire not in WIRES:
        warnings.append(f"{where}.wire must be one of {', '.join(WIRES)}; ignored")
        return old
    return wire


def _num_ctx(conf: dict[str, Any], old: int | None, where: str, warnings: list[str]) -> int | None:
    if "num_ctx" not in conf:
        return old
    value = conf["num_ctx"]
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 100_000_000:
        warnings.append(f"{where}.num_ctx must be a positive number of tokens; ignored")
        return old
    return value


def _sampling(conf: dict[str, Any], where: str, warnings: list[str]) -> Sampling | None:
    highs = {"temperature": 2.0, "top_p": 1.0}
    values = {
        k: _number(conf[k], f"{where}.{k}", warnings, high=highs[k], low_open=False)
        for k in SAMPLING_KEYS
        if k in conf
    }
    if not any(v is not None for v in values.values()):
        return None
    return Sampling(values.get("temperature"), values.get("top_p"))


def _strings(value: Any, where: str, warnings: list[str]) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        warnings.append(f"{where} must be a list of strings; ignored")
        return []
    return list(value)


def _keel_written(
    intake: Intake, path: Path, data: dict[str, Any]
) -> tuple[dict[str, Any], list[str]]:
    """Split off the `permissions.allow` rules keel itself saved into this project file for the
    user ("always allow", recorded outside the project): (the rest of `data`, those rules)."""
    permissions = data.get("permissions")
    if not isinstance(permissions, dict) or not isinstance(permissions.get("allow"), list):
        return data, []
    allow = permissions["allow"]
    mine = [r for r in allow if isinstance(r, str) and intake.written(path, "permissions.allow", r)]
    if not mine:
        return data, []
    rest = [r for r in allow if r not in mine]
    permissions = {k: v for k, v in permissions.items() if k != "allow" or rest}
    if rest:
        permissions["allow"] = rest
    return {**data, "permissions": permissions}, mine


def _gate(
    settings: Settings, intake: Intake, path: Path, data: dict[str, Any], approved: set[str]
) -> dict[str, Any]:
    """What of a project-supplied file's `data` applies now: everything once its gated entries
    are approved, else the rest (the gated entries wait in `settings.pending`, with a warning)."""
    safe, gated = gated_entries(data)
    if not gated:
        return data
    pin = settings_pin(path, gated, rel=intake.rel(path))
    ok = pin in approved
    settings.pending.append(PendingFile(path, pin, tuple(gated), ok))
    if ok:
        return data
    keys = ", ".join(g.key for g in gated)
    personal = (
        " (a settings.local.json counts as yours only for what keel itself wrote into it)"
        if path.name == "settings.local.json"
        else ""
    )
    settings.warnings.append(
        f"{path}: not applied until you approve them: {keys} (this file came with the "
        f"project{personal}; `keel trust list` shows why each needs approval, "
        "`keel trust approve` applies them)"
    )
    return safe


def load_settings(project: Path, env: Mapping[str, str] | None = None) -> Settings:
    """The settings for a run in `project` (the working directory): the user's files, then the
    project's at every directory from the project root down to it. Every file inside the project
    tree came with the project (`keel.config.intake`): what it says beyond tightening applies
    only once approved, apart from the rules keel itself saved there for the user."""
    settings = Settings()
    intake = intake_for(project, env)
    approved: set[str] | None = None
    for path in intake.settings_files():
        data = read_json_object(path, settings.warnings, skipped="file skipped")
        if data is None:
            continue
        settings.files.append(path)
        supplied = intake.supplied(path)
        if supplied:
            data, mine = _keel_written(intake, path, data)
            if mine:
                settings.allow += [(rule, str(path)) for rule in mine]
            if approved is None:
                approved = approved_pins(intake.user_dir, intake.key, "settings")
            data = _gate(settings, intake, path, data, approved)
        merge = _Merge(settings, path, untrusted=supplied)
        if is_claude_file(path):
            merge.claude(data)
        else:
            merge.file(data)
    _take_foreign(settings, intake, env)
    return settings


def _take_foreign(settings: Settings, intake: Intake, env: Mapping[str, str] | None) -> None:
    """Codex's and OpenCode's permission rules and model (`keel.config.foreign`): a project
    file's rules pass the same approval as a project settings file's (its deny and ask rules
    apply at once); the model only when keel's own files name none, with the provider Codex
    defines for it when keel's files define none of that name."""
    from keel.config.foreign import load_foreign

    foreign = load_foreign(intake, env)
    settings.warnings += [*foreign.warnings, *foreign.unused_lines()]
    approved = approved_pins(intake.user_dir, intake.key, "settings")
    for path, data in foreign.settings:
        supplied = intake.supplied(path)
        if supplied:
            data = _gate(settings, intake, path, data, approved)
        _Merge(settings, path, untrusted=supplied).file(data)
    if settings.model is None and foreign.model is not None:
        missing = foreign.missing_key(os.environ if env is None else env)
        if missing:
            settings.warnings.append(
                f"{foreign.model_file}: model {foreign.model} not used: {missing} is not set "
                "(keel needs an API key; set it, or name a model with --model or in settings)"
            )
            return
        settings.model = foreign.model
        if foreign.provider is not None:
            path, name, entry = foreign.provider
            if foreign.model.startswith(f"{name}/") and name not in settings.providers:
                provider: dict[str, Any] = {"providers": {name: entry}}
                supplied = intake.supplied(path)
                if supplied:
                    provider = _gate(settings, intake, path, provider, approved)
                _Merge(settings, path, untrusted=supplied).file(provider)
