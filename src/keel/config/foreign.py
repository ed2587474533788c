"""Codex's and OpenCode's configuration, read so that their users keep what they set up
(docs/extensions.md, "Codex and OpenCode").

Owns the reading of these files (JSONC and TOML, with one-line warnings naming the file and
line) and their translation into what keel already has:

- OpenCode's `permission` rules become keel rules (deny and ask apply at once; allow rules from
  a project file wait for approval like a project settings file's);
- MCP servers (`[mcp_servers.*]` in `~/.codex/config.toml`, `mcp` in `opencode.json`);
- the model, when keel's own settings and flags name none;
- commands (`~/.codex/prompts/*.md`, `.opencode/command/`, `command` entries), agents
  (`.opencode/agent/`, `agent` entries) and skills (`.codex/skills/`).

Whatever keel does not use is named once, in one line with the file (`Found.line`). Which
files came with the project is `keel.config.intake`'s answer, never decided here. It must never
print, start anything, or import anything above `keel.config`; importing it stays cheap (the
TOML parser loads only when a TOML file is there to read).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import field
from pathlib import Path
from typing import Any, Literal

from keel.config.intake import Intake
from keel.frozen import frozen, mutable

#: A JSON string (kept as it is), or a comma before a closing bracket (dropped).
_TRAILING_COMMA = re.compile(r'("(?:[^"\\]|\\.)*")|,(\s*[}\]])')


def strip_jsonc(text: str) -> str:
    """`text` with JSONC's comments and trailing commas blanked out (line breaks kept, so that
    a JSON error still names the right line)."""
    out: list[str] = []
    i, n = 0, len(text)
    in_string = False
    while i < n:
        c = text[i]
        if in_string:
            step = 2 if c == "\\" else 1
            out.append(text[i : i + step])
            in_string = c != '"'
            i += step
        elif c == '"':
            in_string = True
            out.append(c)
            i += 1
        elif text.startswith(("//", "/*"), i):
            close = "\n" if text[i + 1] == "/" else "*/"
            end = text.find(close, i + 2)
            end = n if end < 0 else end + (0 if close == "\n" else 2)
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:end]))
            i = end
        else:
            out.append(c)
            i += 1
    return _TRAILING_COMMA.sub(lambda m: m.group(1) or " " + m.group(2), "".join(out))


def read_jsonc(path: Path, warnings: list[str] | None = None) -> dict[str, Any] | None:
    """The object in a JSON-with-comments file (`//` and `/* */` comments, trailing commas):
    None when the file is missing or unusable, with a one-line warning in `warnings` naming the
    file and, for bad JSON, the line."""
    from keel.config.settings import read_json_object

    said = warnings if warnings is not None else []
    return read_json_object(path, said, skipped="ignored", comments=True)


def read_toml(path: Path, warnings: list[str] | None = None) -> dict[str, Any] | None:
    """The table in a TOML file: None when the file is missing or unusable, with a one-line
    warning in `warnings` naming the file and, for bad TOML, the line."""
    said = warnings if warnings is not None else []
    try:
        text = path.read_text(encoding="utf-8").removeprefix("\ufeff")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        why = "not UTF-8 text" if isinstance(exc, UnicodeDecodeError) else "cannot read it"
        said.append(f"{path}: {why}; ignored")
        return None
    import tomllib  # only for a file that is there (a few ms of start-up otherwise)

    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        # The message ends "(at line L, column C)" (Python 3.14 also gives `lineno`).
        msg = str(exc)
        m = re.search(r" \(at line (\d+), column (\d+)\)$", msg)
        where = f"{path}:{m.group(1)}:{m.group(2)}" if m else str(path)
        said.append(f"{where}: invalid TOML ({msg[: m.start()] if m else msg}); ignored")
        return None


# -- where the files are -----------------------------------------------------------------------

#: OpenCode's config file names, in the order OpenCode reads them (a later one wins).
OPENCODE_FILES = ("opencode.json", "opencode.jsonc")
#: OpenCode's folders of Markdown agents and commands, in both spellings.
OPENCODE_AGENT_DIRS = ("agent", "agents")
OPENCODE_COMMAND_DIRS = ("command", "commands")


def codex_dir(home: Path, env: Mapping[str, str] | None = None) -> Path:
    """Codex's folder: `$CODEX_HOME`, else `~/.codex`."""
    env = os.environ if env is None else env
    return Path(env["CODEX_HOME"]).expanduser() if env.get("CODEX_HOME") else home / ".codex"


def codex_home(intake: Intake, env: Mapping[str, str] | None = None) -> Path:
    return codex_dir(intake.home, env)


def opencode_home(intake: Intake) -> Path:
    return intake.home / ".config" / "opencode"


def mcp_files(root: Path, home: Path, env: Mapping[str, str]) -> tuple[Path, ...]:
    """The files of these tools that may define MCP servers for the project at `root`."""
    opencode = home / ".config" / "opencode"
    config = codex_dir(home, env) / "config.toml"
    return (config, *(d / n for d in (opencode, root) for n in OPENCODE_FILES))


def _opencode_dirs(intake: Intake) -> list[Path]:
    """Where OpenCode's files are, lowest precedence first: the user's config folder, then each
    directory from the project root down to the working directory."""
    return list(dict.fromkeys([opencode_home(intake), *intake.chain()]))


def opencode_files(intake: Intake) -> list[Path]:
    """Every `opencode.json(c)` that applies, lowest precedence first (the user's, then the
    project's from its root down to the working directory)."""
    return [
        d / name for d in _opencode_dirs(intake) for name in OPENCODE_FILES if (d / name).is_file()
    ]


def _opencode_config_dirs(intake: Intake) -> list[Path]:
    """The folders that may hold OpenCode's `agent/` and `command/` folders."""
    return [opencode_home(intake), *(d / ".opencode" for d in intake.chain())]


#: Codex's and OpenCode's skill folders (the SKILL.md format) in a project directory.
FOREIGN_SKILL_DIRS = (".codex/skills", ".opencode/skill", ".opencode/skills")


def skill_dirs(intake: Intake, env: Mapping[str, str] | None = None) -> list[Path]:
    """Codex's and OpenCode's skill folders, lowest precedence first: the user's, then those of
    each directory from the project root down (as `keel.skills.skills.search_dirs` reads them)."""
    opencode = opencode_home(intake)
    user = [codex_home(intake, env) / "skills", opencode / "skill", opencode / "skills"]
    return [*user, *(d / rel for d in intake.chain() for rel in FOREIGN_SKILL_DIRS)]


@frozen
class Place:
    """A folder of Markdown commands or agents in another tool's format."""

    folder: Path
    #: What names from it start with (`prompts:` for Codex's custom prompts).
    prefix: str
    #: `codex` (custom prompts: `$1`…`$9`, `$ARGUMENTS`, `$NAME`) or `opencode`.
    dialect: Literal["codex", "opencode"]
    #: Whether subfolders are read too.
    nested: bool


def command_places(intake: Intake, env: Mapping[str, str] | None = None) -> list[Place]:
    """Codex's custom prompts (`/prompts:<name>`) and OpenCode's command folders, lowest
    precedence first."""
    places = [Place(codex_home(intake, env) / "prompts", "prompts:", "codex", False)]
    for base in _opencode_config_dirs(intake):
        places += [Place(base / d, "", "opencode", True) for d in OPENCODE_COMMAND_DIRS]
    return places


def agent_places(intake: Intake) -> list[Place]:
    """OpenCode's agent folders, lowest precedence first."""
    return [
        Place(base / d, "", "opencode", True)
        for base in _opencode_config_dirs(intake)
        for d in OPENCODE_AGENT_DIRS
    ]


# -- OpenCode's permission rules ------------------------------------------------------------------

#: OpenCode's permission names → keel's rule tool, for those keel has.
_PERMISSION_TOOLS = {
    "bash": "bash",
    "edit": "edit",
    "write": "edit",
    "patch": "edit",
    "multiedit": "edit",
    "read": "read",
    "glob": "glob",
    "grep": "grep",
    "list": "ls",
    "webfetch": "web_fetch",
    "websearch": "web_search",
    "task": "task",
    "skill": "skill",
    "todowrite": "todo_write",
}
#: The tools a catch-all deny or ask (`"permission": "deny"`, `"*": "ask"`) covers.
_EVERY_TOOL = ("bash", "edit", "read", "glob", "grep", "ls", "web_fetch", "web_search", "task")
_ACTIONS = ("allow", "ask", "deny")
_URL_HOST = re.compile(r"^(?:https?://)?(?:\*\.)?([A-Za-z0-9.-]+\.[A-Za-z]{2,})(?:/\*?)?$")


def opencode_rules(
    permission: object, where: str
) -> tuple[dict[str, list[str]], list[str], list[str]]:
    """OpenCode's `permission` as keel rules `{"deny": [...], "ask": [...], "allow": [...]}`,
    with the keys keel does not use and notes on what applies differently (each naming the key).

    OpenCode takes the last pattern that matches; keel applies every deny rule, then every ask
    rule, then allow rules. So an earlier deny or ask entry still holds where a later allow
    entry of the same tool would have let a call through (stricter, and named), except a
    catch-all `"*": "ask"` followed by allow entries: that is keel's default (what no allow rule
    covers asks), so it is left to it. A pattern keel cannot match exactly fails closed: a deny
    or ask rule covers more, an allow rule is not applied."""
    rules: dict[str, list[str]] = {"deny": [], "ask": [], "allow": []}
    unused: list[str] = []
    notes: list[str] = []
    if isinstance(permission, str):
        permission = {"*": permission}
    if not isinstance(permission, dict):
        return rules, [f"{where} (not an object)"], notes
    names = list(permission)
    for i, (name, value) in enumerate(permission.items()):
        key = f"{where}.{name}"
        if name == "*":
            # A tool named after the catch-all has its own entry, which wins in OpenCode.
            own = {_PERMISSION_TOOLS.get(n) for n in names[i + 1 :]}
            if value in ("deny", "ask"):
                rules[value] += [t for t in _EVERY_TOOL if t not in own]
            elif value == "allow":
                notes.append(f'{key}: "allow" for every tool is not applied (keel asks as usual)')
            else:
                unused.append(key)
            continue
        tool = _PERMISSION_TOOLS.get(name)
        if tool is None:
            unused.append(key)
            continue
        entries = {"*": value} if isinstance(value, str) else value
        if not isinstance(entries, dict) or not all(v in _ACTIONS for v in entries.values()):
            unused.append(f"{key} (not allow, ask or deny)")
            continue
        items = list(entries.items())
        for i, (pattern, action) in enumerate(items):
            later_allow = any(
                a == "allow" and _rule(tool, str(p), a) is not None for p, a in items[i + 1 :]
            )
            if pattern == "*" and action == "ask" and later_allow:
                notes.append(f'{key}: "*": "ask" is keel\'s default for what no allow rule covers')
                continue
            rule = _rule(tool, str(pattern), action)
            if rule is None:
                notes.append(f"{key}: {pattern!r}: {action!r} not applied (keel cannot match it)")
                continue
            if action != "allow" and later_allow:
                notes.append(
                    f"{key}: {pattern!r}: {action!r} holds even where a later allow entry "
                    "matches (keel applies deny and ask rules before allow rules)"
                )
            rules[action].append(rule)
    return rules, unused, notes


def _rule(tool: str, pattern: str, action: str) -> str | None:
    """One keel rule for an OpenCode pattern, None where an allow rule cannot be matched
    exactly (a deny or ask rule is widened instead)."""
    if pattern in ("*", "**"):
        return tool
    if not pattern.strip():
        return None  # matches only an empty input in OpenCode: nothing to hold or allow
    if tool == "bash":
        if "?" in pattern:  # keel's patterns have no one-character wildcard
            return None if action == "allow" else f"bash({pattern.replace('?', '*')})"
        return f"bash({pattern})"
    if tool == "web_fetch":
        m = _URL_HOST.match(pattern)
        if m and action != "allow":
            return f"web_fetch(domain:{m.group(1)})"
        return None if action == "allow" else tool
    if tool in ("edit", "read", "glob", "grep", "ls"):
        return f"{tool}({pattern})"
    return None if action == "allow" else tool


def _legacy_tools(tools: object, where: str) -> tuple[list[str], list[str]]:
    """OpenCode's older `tools: {"bash": false}`: deny rules for the tools turned off, and the
    entries keel does not use."""
    deny: list[str] = []
    unused: list[str] = []
    if not isinstance(tools, dict):
        return deny, [where]
    for name, on in tools.items():
        tool = _PERMISSION_TOOLS.get(name)
        if on is False and tool is not None:
            deny.append(tool)
        elif on is not True:
            unused.append(f"{where}.{name}")
    return deny, unused


# -- the model ------------------------------------------------------------------------------------

#: OpenCode's and Codex's provider ids that name a keel provider by another name.
_PROVIDER_NAMES = {"google": "gemini", "togetherai": "together", "oss": "ollama"}


def keel_model(provider: str, model: str) -> str | None:
    """`provider/model` in keel's names, None when keel has no such provider."""
    from keel.llm.presets import PRESETS

    name = _PROVIDER_NAMES.get(provider, provider)
    return f"{name}/{model}" if name in PRESETS and model else None


def model_spec(spec: str) -> str | None:
    """An OpenCode `provider/model` in keel's names, None when keel has no such provider."""
    provider, _, model = spec.partition("/")
    return keel_model(provider, model)


# -- OpenCode agents -------------------------------------------------------------------------------

#: Agent keys keel uses (`prompt` is the body of a Markdown agent).
_AGENT_USED = frozenset(
    {"description", "mode", "model", "prompt", "maxSteps", "steps", "tools", "disable", "name"}
)
#: OpenCode's tool names in an agent's `tools` → keel's tools they turn off.
_AGENT_TOOLS = {
    "bash": ("bash",),
    "edit": ("edit", "multi_edit", "write"),
    "write": ("write",),
    "patch": ("edit", "multi_edit"),
    "read": ("read",),
    "grep": ("grep",),
    "glob": ("glob",),
    "list": ("ls",),
    "webfetch": ("web_fetch",),
    "websearch": ("web_search",),
    "todowrite": ("todo_write",),
    "task": ("task",),
}


@frozen
class OpenCodeAgent:
    """An OpenCode agent as keel's subagent definition needs it."""

    name: str
    description: str
    prompt: str
    #: keel's tools it turns off (`tools: {"bash": false}`).
    denied: tuple[str, ...]
    model: str | None
    max_turns: int | None
    #: Keys keel does not use, and why anything written is not used.
    unused: tuple[str, ...]


def opencode_agent(
    name: str, entry: dict[str, Any], path: Path, intake: Intake
) -> OpenCodeAgent | str:
    """An OpenCode agent (a Markdown file's frontmatter plus `prompt`, or an `agent` entry of
    `opencode.json`), or why it is not offered as a subagent. A project's agent reads a
    `{file:…}` prompt only from inside the project (it must not send your files to the model)."""
    if entry.get("disable") is True:
        return f"agent {name} is disabled there"
    if entry.get("mode") == "primary":
        return f"agent {name} is a primary agent (keel offers subagents only)"
    description = entry.get("description")
    if not isinstance(description, str) or not description.strip():
        return f"agent {name} has no description (it tells keel's model when to use it)"
    prompt = entry.get("prompt", "")
    if isinstance(prompt, str) and prompt.startswith("{file:") and prompt.endswith("}"):
        target = (path.parent / Path(prompt[6:-1].strip()).expanduser()).resolve()
        if intake.supplied(path) and not intake.in_project(target):
            return f"agent {name}: its prompt file {target} lies outside the project"
        try:
            prompt = target.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return f"agent {name}: its prompt file {target} cannot be read"
    if not isinstance(prompt, str) or not prompt.strip():
        return f"agent {name} has no prompt"
    unused = [k for k in entry if k not in _AGENT_USED]
    denied: list[str] = []
    tools = entry.get("tools", {})
    for tool, on in tools.items() if isinstance(tools, dict) else ():
        if on is False and tool in _AGENT_TOOLS:
            denied += _AGENT_TOOLS[tool]
        elif on is not True:
            unused.append(f"tools.{tool}")
    model = entry.get("model")
    mapped = model_spec(model) if isinstance(model, str) else None
    if model is not None and mapped is None:
        unused.append(f"model {model!r} (not a keel provider/model: the parent's model is used)")
    steps = entry.get("maxSteps", entry.get("steps"))
    turns = steps if isinstance(steps, int) and not isinstance(steps, bool) and steps > 0 else None
    return OpenCodeAgent(
        name,
        " ".join(description.split()),
        prompt,
        tuple(dict.fromkeys(denied)),
        mapped,
        turns,
        tuple(unused),
    )


# -- MCP servers ----------------------------------------------------------------------------------

_CODEX_MCP_KEYS = frozenset(
    {"command", "args", "env", "cwd", "url", "http_headers", "env_http_headers",
     "bearer_token_env_var", "enabled", "tool_timeout_sec"}
)  # fmt: skip
_OPENCODE_MCP_KEYS = frozenset({"type", "command", "environment", "url", "headers", "enabled"})


def codex_server(entry: object, where: str) -> tuple[object, list[str]]:
    """A `[mcp_servers.<name>]` table as an entry in keel's (Claude Code's) shape, with the keys
    keel does not use. A value of the wrong shape is passed on as it is: keel's MCP loader says
    what is wrong with it, naming the file."""
    if not isinstance(entry, dict):
        return entry, []
    out: dict[str, Any] = {}
    if "url" in entry:
        out["type"] = "http"
        out["url"] = entry["url"]
        plain, from_env = entry.get("http_headers"), entry.get("env_http_headers")
        headers = dict(plain) if isinstance(plain, dict) else {}
        for header, var in from_env.items() if isinstance(from_env, dict) else ():
            headers[header] = f"${{{var}}}"
        if isinstance(entry.get("bearer_token_env_var"), str):
            headers["Authorization"] = f"Bearer ${{{entry['bearer_token_env_var']}}}"
        if headers:
            out["headers"] = headers
    else:
        for key in ("command", "args", "env", "cwd"):
            if key in entry:
                out[key] = entry[key]
    if entry.get("enabled") is False:
        out["disabled"] = True
    if "tool_timeout_sec" in entry:
        out["timeout"] = entry["tool_timeout_sec"]
    return out, [f"{where}.{k}" for k in entry if k not in _CODEX_MCP_KEYS]


_OPENCODE_ENV = re.compile(r"\{env:([A-Za-z_][A-Za-z0-9_]*)\}")


def _env_references(value: Any) -> Any:
    """OpenCode's `{env:NAME}` in every string of `value` as keel's `${NAME}`."""
    if isinstance(value, str):
        return _OPENCODE_ENV.sub(r"${\1}", value)
    if isinstance(value, list):
        return [_env_references(v) for v in value]
    if isinstance(value, dict):
        return {k: _env_references(v) for k, v in value.items()}
    return value


def opencode_server(entry: object, where: str) -> tuple[object, list[str]]:
    """An `mcp.<name>` entry of `opencode.json` in keel's shape, with the keys keel does not
    use (`command` is one list: the program and its arguments; `{env:NAME}` is `${NAME}`)."""
    if not isinstance(entry, dict):
        return entry, []
    spec: dict[str, Any] = _env_references(entry)
    out: dict[str, Any] = {}
    if spec.get("type") == "remote":
        out["type"] = "http"
        out["url"] = spec.get("url")
        if "headers" in spec:
            out["headers"] = spec["headers"]
    else:
        command = spec.get("command")
        if isinstance(command, list) and command:
            out["command"], out["args"] = command[0], command[1:]
        else:
            out["command"] = command
        if "environment" in spec:
            out["env"] = spec["environment"]
    if spec.get("enabled") is False:
        out["disabled"] = True
    unused = [f"{where}.{k}" for k in spec if k not in _OPENCODE_MCP_KEYS]
    if "{file:" in json.dumps(spec):
        unused.append(f"{{file:…}} in {where} (the text stays as written)")
    return out, unused


# -- everything found -----------------------------------------------------------------------------

#: `opencode.json` keys keel reads (`instructions` by the instruction-file loader).
_OPENCODE_USED = frozenset(
    {"$schema", "permission", "tools", "mcp", "model", "provider", "command", "agent",
     "instructions"}
)  # fmt: skip
#: The AI SDK package OpenCode reaches OpenAI-compatible servers with.
_OPENAI_COMPATIBLE = "@ai-sdk/openai-compatible"
_KEY_REFERENCE = re.compile(r"^\{env:([A-Za-z_][A-Za-z0-9_]*)\}$")
_CODEX_USED = frozenset(
    {"model", "model_provider", "model_providers", "profile", "profiles", "mcp_servers"}
)
#: Codex's `wire_api` → keel's wire.
_CODEX_WIRES = {"chat": "openai-chat", "responses": "openai-responses"}
#: `[model_providers.<id>]` keys keel uses (`name` is only what Codex shows).
_CODEX_PROVIDER_KEYS = frozenset({"name", "base_url", "env_key", "wire_api"})


@frozen
class Found:
    """One file or folder of another tool's configuration, and what keel took from it."""

    path: Path
    tool: Literal["Codex", "OpenCode"]
    #: Whether it came with the project (`keel.config.intake`).
    supplied: bool
    took: tuple[str, ...] = ()
    #: Keys keel does not use.
    unused: tuple[str, ...] = ()
    #: Entries keel applies differently from the other tool, or not at all, each with why.
    notes: tuple[str, ...] = ()

    def line(self) -> str:
        """The one line naming what keel does not use of it ("" when it uses everything)."""
        parts = [f"keel does not use {', '.join(self.unused)}"] if self.unused else []
        parts += self.notes
        return f"{self.path}: {'; '.join(parts)}" if parts else ""


@mutable
class Foreign:
    """What keel takes from Codex's and OpenCode's configuration for one working directory."""

    found: list[Found] = field(default_factory=list)
    #: Files that could not be read, one line each (file and line).
    warnings: list[str] = field(default_factory=list)
    #: Per file, keel settings to merge (`{"permissions": {...}}`), lowest precedence first.
    settings: list[tuple[Path, dict[str, Any]]] = field(default_factory=list)
    #: Per file, MCP server entries in keel's shape, by name.
    servers: list[tuple[Path, dict[str, Any]]] = field(default_factory=list)
    #: The model to use when keel's own settings and flags name none (the last file's), and
    #: the file it came from.
    model: str | None = None
    model_file: Path | None = None
    #: A provider Codex's `[model_providers.<id>]` defines for its model: (file, id, keel's
    #: `providers.<id>` entry).
    provider: tuple[Path, str, dict[str, Any]] | None = None
    #: OpenCode's `command` and `agent` entries: (file, name, entry).
    commands: list[tuple[Path, str, dict[str, Any]]] = field(default_factory=list)
    agents: list[tuple[Path, str, dict[str, Any]]] = field(default_factory=list)

    def unused_lines(self) -> list[str]:
        return [line for f in self.found if (line := f.line())]

    def missing_key(self, env: Mapping[str, str]) -> str:
        """The variable the model's provider needs for its key and `env` lacks ("" when none
        is missing). Codex may sign in with ChatGPT instead: keel cannot use that sign-in."""
        from keel.llm.presets import PRESETS

        if self.model is None:
            return ""
        name = self.model.partition("/")[0]
        if self.provider is not None and self.provider[1] == name:
            var = self.provider[2].get("api_key_env", "")
            return var if var and not env.get(var) else ""
        preset = PRESETS.get(name)
        if preset is None or not preset.key_required or any(env.get(v) for v in preset.key_envs):
            return ""
        return " or ".join(preset.key_envs)


def load_foreign(intake: Intake, env: Mapping[str, str] | None = None) -> Foreign:
    """Every Codex and OpenCode file that applies in the intake's working directory, read and
    translated (module docstring). Reads files only; never raises for a broken one."""
    foreign = Foreign()
    _codex(foreign, intake, env)
    for path in opencode_files(intake):
        _opencode(foreign, intake, path)
    for place in [*command_places(intake, env), *agent_places(intake)]:
        names = _markdown_names(place)
        if names:
            what = "agents" if place.folder.name in OPENCODE_AGENT_DIRS else "commands"
            shown = ", ".join(names) if what == "agents" else ", ".join(f"/{n}" for n in names)
            foreign.found.append(_found(intake, place.folder, place.dialect, (f"{what}: {shown}",)))
    for base in _opencode_config_dirs(intake):
        for name in ("plugin", "plugins", "tool", "tools"):
            if (base / name).is_dir():
                what = "plugins" if name.startswith("plugin") else "custom tools"
                why = f"OpenCode {what} (JavaScript or TypeScript that OpenCode runs)"
                foreign.found.append(_found(intake, base / name, "opencode", (), (why,)))
    for folder in skill_dirs(intake, env):
        skills = sorted(p.parent.name for p in folder.glob("*/SKILL.md")) if folder.is_dir() else []
        if skills:
            dialect = "opencode" if "opencode" in folder.parent.name else "codex"
            took = (f"skills: {', '.join(skills)}",)
            foreign.found.append(_found(intake, folder, dialect, took))
    return foreign


def _found(
    intake: Intake,
    path: Path,
    dialect: str,
    took: tuple[str, ...],
    unused: Iterable[str] = (),
    notes: Iterable[str] = (),
) -> Found:
    tool: Literal["Codex", "OpenCode"] = "Codex" if dialect == "codex" else "OpenCode"
    return Found(path, tool, intake.supplied(path), took, tuple(unused), tuple(notes))


def _markdown_names(place: Place) -> list[str]:
    if not place.folder.is_dir():
        return []
    pattern = "**/*.md" if place.nested else "*.md"
    return sorted(
        place.prefix + p.relative_to(place.folder).with_suffix("").as_posix().replace("/", ":")
        for p in place.folder.glob(pattern)
        if p.is_file()
    )


def _take_model(
    foreign: Foreign,
    path: Path,
    model: object,
    provider: object,
    took: list[str],
    unused: list[str],
) -> None:
    if not isinstance(model, str) or not isinstance(provider, str):
        unused.append("model (not text)")
        return
    mapped = keel_model(provider, model)
    if mapped is None:
        written = model if path.suffix == ".toml" else f"{provider}/{model}"
        unused.append(f"model {written!r} (provider {provider!r} is not one of keel's)")
        return
    foreign.model, foreign.model_file = mapped, path
    took.append(f"model {mapped}")


def _take_servers(
    foreign: Foreign,
    path: Path,
    key: str,
    servers: object,
    translate: Callable[[object, str], tuple[object, list[str]]],
    took: list[str],
    unused: list[str],
) -> None:
    if not isinstance(servers, dict):
        unused.append(f"{key} (not a table of servers)")
        return
    entries: dict[str, Any] = {}
    for name, entry in servers.items():
        entries[name], skipped = translate(entry, f"{key}.{name}")
        unused += skipped
    foreign.servers.append((path, entries))
    if entries:
        took.append(f"MCP servers: {', '.join(entries)}")


def _codex_profile(data: dict[str, Any], unused: list[str]) -> dict[str, Any]:
    """`model` and `model_provider` as Codex uses them: the active `profile`'s over the top
    level's. Every other profile key, and every other profile, is named in `unused`."""
    chosen = dict(data)
    active = data.get("profile")
    profiles = data.get("profiles")
    profiles = profiles if isinstance(profiles, dict) else {}
    for name, table in profiles.items():
        if name != active or not isinstance(table, dict):
            unused.append(f"profiles.{name} (not the active profile)")
            continue
        chosen.update({k: table[k] for k in ("model", "model_provider") if k in table})
        unused += [f"profiles.{name}.{k}" for k in table if k not in ("model", "model_provider")]
    if active is not None and active not in profiles:
        unused.append(f"profile {active!r} (no [profiles.{active}] table)")
    return chosen


def _custom_provider(
    foreign: Foreign,
    path: Path,
    model: object,
    provider: str,
    table: object,
    took: list[str],
    unused: list[str],
) -> None:
    """A model on a provider `[model_providers.<id>]` defines: keel's `providers.<id>` entry
    (`base_url`, `env_key` as `api_key_env`, `wire_api` as the wire). A built-in provider's id
    keeps keel's provider, as Codex keeps its own."""
    from keel.llm.presets import PRESETS

    where = f"model_providers.{provider}"
    if provider in PRESETS or not isinstance(table, dict):
        unused.append(f"{where} (keel's own {provider} provider is used)")
        _take_model(foreign, path, model, provider, took, unused)
        return
    wire = _CODEX_WIRES.get(str(table.get("wire_api", "chat")))
    if not isinstance(model, str) or not isinstance(table.get("base_url"), str) or wire is None:
        unused.append(f"model on {where} (needs a base_url and wire_api chat or responses)")
        return
    entry: dict[str, Any] = {"base_url": table["base_url"], "wire": wire}
    if isinstance(table.get("env_key"), str):
        entry["api_key_env"] = table["env_key"]
    unused += [f"{where}.{k}" for k in table if k not in _CODEX_PROVIDER_KEYS]
    foreign.provider = (path, provider, entry)
    foreign.model, foreign.model_file = f"{provider}/{model}", path
    took.append(f"model {foreign.model} on its provider {provider} ({table['base_url']})")


def _opencode_model(
    foreign: Foreign, path: Path, data: dict[str, Any], took: list[str], unused: list[str]
) -> None:
    """`model` (`provider/model`), on the provider the `provider` section configures for it
    when that is an OpenAI-compatible server (`_compatible`), else on keel's own provider."""
    providers = data.get("provider")
    providers = providers if isinstance(providers, dict) else {}
    model = data.get("model")
    provider, _, name = model.partition("/") if isinstance(model, str) else ("", "", "")
    unused += [f"provider.{p} (not the provider of the model)" for p in providers if p != provider]
    table = providers.get(provider)
    found = _compatible(provider, table, unused) if name and isinstance(table, dict) else None
    if found is not None:
        keel_name, entry = found
        foreign.provider = (path, keel_name, entry)
        foreign.model, foreign.model_file = f"{keel_name}/{name}", path
        took.append(f"model {foreign.model} on its provider {keel_name} ({entry['base_url']})")
        return
    if table is not None:
        unused.append(f"provider.{provider} (keel uses only an OpenAI-compatible baseURL)")
    if model is not None:
        _take_model(
            foreign, path, name if isinstance(model, str) else model, provider, took, unused
        )


def _compatible(
    provider: str, table: dict[str, Any], unused: list[str]
) -> tuple[str, dict[str, Any]] | None:
    """keel's provider for an OpenCode provider entry that reaches an OpenAI-compatible server
    (`npm: @ai-sdk/openai-compatible`, or a keel provider that speaks Chat Completions) at
    `options.baseURL`, its key from `options.apiKey: "{env:NAME}"`: (its name, its
    `providers.<name>` entry); None for anything else."""
    from keel.llm.presets import PRESETS

    where = f"provider.{provider}"
    options = table.get("options")
    url = options.get("baseURL") if isinstance(options, dict) else None
    preset = PRESETS.get(_PROVIDER_NAMES.get(provider, provider))
    chat = preset.wire == "openai-chat" if preset else table.get("npm") == _OPENAI_COMPATIBLE
    if not isinstance(options, dict) or not isinstance(url, str) or not chat:
        return None
    entry: dict[str, Any] = {"base_url": url}
    if preset is None:
        entry["wire"] = "openai-chat"
    key = options.get("apiKey")
    if isinstance(key, str) and (m := _KEY_REFERENCE.match(key)):
        entry["api_key_env"] = m.group(1)
    elif key is not None:
        unused.append(f"{where}.options.apiKey (keel reads keys only from {{env:NAME}})")
    unused += [f"{where}.options.{k}" for k in options if k not in ("baseURL", "apiKey")]
    unused += [f"{where}.{k}" for k in table if k not in ("npm", "name", "options", "models")]
    return (preset.name if preset else provider), entry


def _codex(foreign: Foreign, intake: Intake, env: Mapping[str, str] | None) -> None:
    path = codex_home(intake, env) / "config.toml"
    data = read_toml(path, foreign.warnings)
    if data is None:
        if path.exists():
            foreign.found.append(_found(intake, path, "codex", ("nothing: it cannot be read",)))
        return
    took: list[str] = []
    unused = [k for k in data if k not in _CODEX_USED]
    chosen = _codex_profile(data, unused)
    if "model_provider" in chosen and "model" not in chosen:
        unused.append("model_provider (no model with it)")
    providers = data.get("model_providers")
    providers = providers if isinstance(providers, dict) else {}
    provider = chosen.get("model_provider", "openai")
    for name in providers:
        if name != provider or "model" not in chosen:
            unused.append(f"model_providers.{name} (not the provider of the model)")
    if "model" in chosen and provider in providers:
        _custom_provider(
            foreign, path, chosen["model"], provider, providers[provider], took, unused
        )
    elif "model" in chosen:
        _take_model(foreign, path, chosen["model"], provider, took, unused)
    if "mcp_servers" in data:
        _take_servers(foreign, path, "mcp_servers", data["mcp_servers"], codex_server, took, unused)
    foreign.found.append(_found(intake, path, "codex", tuple(took), unused))


def _opencode(foreign: Foreign, intake: Intake, path: Path) -> None:
    data = read_jsonc(path, foreign.warnings)
    if data is None:
        foreign.found.append(_found(intake, path, "opencode", ("nothing: it cannot be read",)))
        return
    took: list[str] = []
    unused = [k for k in data if k not in _OPENCODE_USED]
    rules: dict[str, list[str]] = {"deny": [], "ask": [], "allow": []}
    notes: list[str] = []
    if "permission" in data:
        rules, skipped, notes = opencode_rules(data["permission"], "permission")
        unused += skipped
    if "tools" in data:
        denied, skipped = _legacy_tools(data["tools"], "tools")
        rules["deny"] += denied
        unused += skipped
    rules = {k: list(dict.fromkeys(v)) for k, v in rules.items() if v}
    if rules:
        foreign.settings.append((path, {"permissions": rules}))
        took += [f"{k} rules: {', '.join(v)}" for k, v in rules.items()]
    if "model" in data or "provider" in data:
        _opencode_model(foreign, path, data, took, unused)
    if "mcp" in data and path.parent not in (intake.root, opencode_home(intake)):
        # As `.mcp.json`: servers come from the project root's file only.
        notes.append("mcp: read only from the project root's file")
    elif "mcp" in data:
        _take_servers(foreign, path, "mcp", data["mcp"], opencode_server, took, unused)
    instructions = data.get("instructions")
    if isinstance(instructions, list) and instructions:
        took.append(f"instructions: {', '.join(map(str, instructions))}")
    for key, into in (("command", foreign.commands), ("agent", foreign.agents)):
        value = data.get(key, {})
        if not isinstance(value, dict):
            unused.append(f"{key} (not an object)")
            continue
        into += [(path, n, e) for n, e in value.items() if isinstance(e, dict)]
        unused += [
            f"{key}.{n} (not an object)" for n, e in value.items() if not isinstance(e, dict)
        ]
        if value:
            took.append(f"{key}s: {', '.join(value)}")
    foreign.found.append(_found(intake, path, "opencode", tuple(took), unused, notes))
