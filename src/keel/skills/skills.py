"""Agent Skills in Claude Code's format: discovery, the system-prompt index, `/name` expansion and
the read-only `skill` tool. Also the pieces custom commands share with skills: where the project
directories are, Markdown frontmatter, and `$ARGUMENTS`/`$1`…`$9` substitution.

A skill is a folder holding `SKILL.md`: YAML frontmatter (`name`, `description`, optional
`disable-model-invocation`, `user-invocable`, `allowed-tools`, `argument-hint`) then Markdown
instructions. Folders are looked for, lowest precedence first, in Codex's `~/.codex/skills`,
OpenCode's `~/.config/opencode/skill(s)`, `~/.claude/skills`, `<keel user config dir>/skills`,
then `.codex/skills`, `.opencode/skill(s)`, `.claude/skills` and `.keel/skills` in each directory
from the project root (the git root, else cwd) down to cwd; a later skill replaces an earlier one
of the same name. A file that cannot be used is skipped with
a warning naming it (and the line, where there is one); loading never raises for a user's file.

This module reads files and nothing else: it must never run a command, write a file, or import
PyYAML at import time (startup stays cheap). It knows no UI: warnings are returned as text.
"""

from __future__ import annotations

import contextlib
import re
import shlex
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any, Literal

from keel.agent.prompt import git_root
from keel.frozen import frozen
from keel.tools.base import FunctionTool, ToolContext, ToolError, tool

#: A skill name keel can offer as `/name` and the model can pass to the `skill` tool: up to 64
#: characters without whitespace or `/`. (The Agent Skills spec asks for a-z, 0-9 and `-`;
#: Claude Code loads other names too, so keel does.)
SKILL_NAME = re.compile(r"[^\s/]{1,64}")
#: Claude Code skill frontmatter keel does not honour: each is named in a warning.
UNSUPPORTED_SKILL_KEYS = ("model", "hooks", "context", "agent")
#: A description longer than this is clipped in the index (it is sent with every request).
MAX_INDEX_DESCRIPTION = 250

INDEX_HEADER = (
    "Skills are instructions for particular tasks, kept in folders with any files they need. "
    "When a task matches a skill's description, call the skill tool with its name before you "
    "start, then follow the instructions it returns."
)


# ---------------------------------------------------------------------------------------------
# Where extensions live.


def project_dirs(cwd: Path) -> list[Path]:
    """The directories from the project root (git root, else cwd) down to cwd, root first."""
    root = git_root(cwd) or cwd
    chain = [cwd, *cwd.parents]
    return list(reversed(chain[: chain.index(root) + 1])) if root in chain else [cwd]


def search_dirs(
    cwd: Path, *, user_dir: Path | None, home: Path, kind: Literal["skills", "commands", "agents"]
) -> list[Path]:
    """Where `kind` are looked for, lowest precedence first. A directory reached twice (a project
    at the home directory) keeps only its later, higher-precedence place."""
    from keel.config.foreign import FOREIGN_SKILL_DIRS, codex_dir

    # Codex's and OpenCode's skill folders (the same SKILL.md format) come first at each level.
    foreign = FOREIGN_SKILL_DIRS if kind == "skills" else ()
    opencode = home / ".config" / "opencode"
    dirs = [
        *([codex_dir(home) / "skills", opencode / "skill", opencode / "skills"] if foreign else []),
        home / ".claude" / kind,
    ]
    if user_dir is not None:
        dirs.append(user_dir / kind)
    for directory in project_dirs(cwd.absolute()):
        dirs += [directory / rel for rel in foreign]
        dirs += [directory / ".claude" / kind, directory / ".keel" / kind]
    dirs = [d.absolute() for d in dirs]
    seen: set[Path] = set()
    kept: list[Path] = []
    for d in reversed(dirs):
        key = d.resolve()
        if key not in seen:
            seen.add(key)
            kept.append(d)
    return list(reversed(kept))


def markdown_files(root: Path, warnings: list[str], *, max_depth: int) -> list[tuple[Path, str]]:
    """(file, namespaced name) of each `*.md` below `root`, sorted, subfolders included down to
    `max_depth` levels (`frontend/component.md` is `frontend:component`). Symlinks are followed;
    the depth bound stops a symlink loop. Hidden entries are skipped."""
    found: list[tuple[Path, str]] = []

    def walk(directory: Path, namespace: tuple[str, ...]) -> None:
        try:
            entries = sorted(directory.iterdir())
        except OSError as exc:
            warnings.append(f"{directory}: cannot list it ({exc.strerror})")
            return
        for entry in entries:
            if entry.name.startswith("."):
                continue
            if entry.is_dir():
                if len(namespace) < max_depth:
                    walk(entry, (*namespace, entry.name))
            elif entry.suffix == ".md" and entry.is_file():
                found.append((entry, ":".join((*namespace, entry.stem))))

    if root.is_dir():
        walk(root, ())
    return found


# ---------------------------------------------------------------------------------------------
# Markdown with YAML frontmatter.


class Unusable(Exception):
    """A user's file keel cannot use; `line` is the file's line number when one is to blame."""

    def __init__(self, message: str, line: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.line = line


class Document:
    """A Markdown file read: frontmatter and body. (A plain class: a `@frozen` one costs about a
    millisecond of startup, and this never leaves the package.)"""

    __slots__ = ("body", "key_lines", "lenient", "meta")

    def __init__(
        self,
        meta: dict[str, Any],
        body: str,
        key_lines: dict[str, int],
        lenient: tuple[tuple[int, str], ...] = (),
    ) -> None:
        #: The frontmatter as a mapping ({} without frontmatter).
        self.meta = meta
        #: The text after the frontmatter, leading blank lines and trailing whitespace removed.
        self.body = body
        #: The file line of each top-level frontmatter key, for warnings.
        self.key_lines = key_lines
        #: Values that were not valid YAML and were read as plain text: (line, key).
        self.lenient = lenient


_TOP_LEVEL_KEY = re.compile(r"([A-Za-z_][\w-]*):(?:[ \t]+(\S.*))?$")


def read_document(text: str) -> Document:
    """Split `text` into frontmatter and body. Raises `Unusable` for frontmatter that is not
    closed, not YAML (after the leniency below) or not a mapping.

    Leniency: Claude Code accepts frontmatter that strict YAML rejects, and skills in the wild rely
    on it (`description: Use when: …`, Claude Code's own `argument-hint: [pr] [priority]`). A
    top-level `key: value` line that is not valid YAML on its own is read as the plain text
    `value`; anything else that does not parse makes the file unusable."""
    lines = text.removeprefix("\ufeff").replace("\r\n", "\n").split("\n")
    if lines[0].rstrip() != "---":
        return Document({}, _clean_body(lines), {})
    end = next((i for i in range(1, len(lines)) if lines[i].rstrip() == "---"), None)
    if end is None:
        raise Unusable("the frontmatter has no closing --- line", 1)
    front = lines[1:end]
    key_lines: dict[str, int] = {}
    for i, line in enumerate(front):
        if m := _TOP_LEVEL_KEY.match(line):
            key_lines.setdefault(m.group(1), i + 2)
    meta, lenient = _load_yaml(front)
    return Document(meta, _clean_body(lines[end + 1 :]), key_lines, lenient)


def _clean_body(lines: list[str]) -> str:
    return "\n".join(lines).lstrip("\n").rstrip()


def _load_yaml(front: list[str]) -> tuple[dict[str, Any], tuple[tuple[int, str], ...]]:
    import yaml  # lazily: PyYAML costs ~10 ms to import and most runs have no extensions

    try:
        return _mapping(yaml.safe_load("\n".join(front))), ()
    except yaml.YAMLError as exc:
        error = exc
    repaired, lenient = _quote_failing_values(front)
    if lenient:
        # If the repaired text fails too, the original error is the one to report.
        with contextlib.suppress(yaml.YAMLError):
            return _mapping(yaml.safe_load("\n".join(repaired))), lenient
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    raise Unusable(
        f"the frontmatter is not valid YAML: {problem}", mark.line + 2 if mark is not None else None
    )


def _quote_failing_values(
    front: list[str],
) -> tuple[list[str], tuple[tuple[int, str], ...]]:
    """`front` with each top-level `key: value` line that is not YAML by itself turned into
    `key: "value"`, and the (file line, key) of each line changed."""
    import json

    import yaml

    repaired = list(front)
    changed: list[tuple[int, str]] = []
    for i, line in enumerate(front):
        m = _TOP_LEVEL_KEY.match(line)
        if m is None or m.group(2) is None:
            continue
        try:
            yaml.safe_load(line)
        except yaml.YAMLError:
            repaired[i] = f"{m.group(1)}: {json.dumps(m.group(2).strip())}"
            changed.append((i + 2, m.group(1)))
    return repaired, tuple(changed)


def _mapping(data: object) -> dict[str, Any]:
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise Unusable("the frontmatter must be `key: value` lines", 2)
    return {str(k): v for k, v in data.items()}


def where(path: Path, line: int | None) -> str:
    return f"{path}:{line}" if line is not None else str(path)


def read_markdown(path: Path, warnings: list[str], lost: str) -> Document | None:
    """The frontmatter document in `path` (text that is not UTF-8 read with replacement
    characters), or None with a one-line warning naming the file, and the line where it can,
    ending in `lost` (what is not used)."""
    try:
        return read_document(path.read_text(encoding="utf-8", errors="replace"))
    except OSError as exc:
        warnings.append(f"{path}: unreadable ({exc.strerror}); {lost}")
    except Unusable as exc:
        warnings.append(f"{where(path, exc.line)}: {exc.message}; {lost}")
    return None


def lenient_warnings(path: Path, doc: Document) -> list[str]:
    return [
        f"{path}:{line}: `{key}` is not valid YAML; read as plain text (quote the value)"
        for line, key in doc.lenient
    ]


def text_field(doc: Document, key: str) -> str | None:
    """A text value of the frontmatter (numbers are read as text), None when absent."""
    value = doc.meta.get(key)
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    raise Unusable(f"`{key}` must be text", doc.key_lines.get(key))


def flag_field(doc: Document, key: str, default: bool) -> bool:
    value = doc.meta.get(key)
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise Unusable(f"`{key}` must be true or false, got {value!r}", doc.key_lines.get(key))


def hint_field(doc: Document) -> str:
    """`argument-hint`: YAML reads the usual `[message]` as a list; show it as written."""
    value = doc.meta.get("argument-hint")
    if isinstance(value, list):
        return " ".join(f"[{item}]" for item in value)
    return text_field(doc, "argument-hint") or ""


def tools_field(doc: Document, key: str = "allowed-tools") -> tuple[str, ...]:
    """`allowed-tools` (or another `key`) as a list of rules: a YAML list, or one string
    separated by commas or spaces outside parentheses (`Bash(git add:*), Read` and `Read Grep`
    both work)."""
    value = doc.meta.get(key)
    if value is None:
        return ()
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return tuple(item.strip() for item in value if item.strip())
    if not isinstance(value, str):
        raise Unusable(f"`{key}` must be a list or a string", doc.key_lines.get(key))
    rules: list[str] = []
    depth, current = 0, ""
    for char in value:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth <= 0 and (char == "," or char.isspace()):
            rules.append(current)
            current = ""
        else:
            current += char
    return tuple(r for r in (*rules, current) if r)


# ---------------------------------------------------------------------------------------------
# Arguments.

_PLACEHOLDER = re.compile(r"\$(ARGUMENTS|[1-9](?!\d))")
_SLASH = re.compile(r"/(\S+)(?:\s+(.*))?", re.DOTALL)


def parse_slash(text: str) -> tuple[str, str] | None:
    """(`name`, argument string) for a prompt `/name args…`, else None."""
    m = _SLASH.fullmatch(text.strip())
    return (m.group(1), (m.group(2) or "").strip()) if m else None


def split_arguments(arguments: str) -> list[str]:
    """Shell-like words: quotes group (`"a b"` is one word, `""` an empty one), backslashes are
    literal, `#` starts no comment. Unbalanced quotes fall back to splitting on whitespace."""
    lexer = shlex.shlex(arguments, posix=True)
    lexer.whitespace_split = True
    lexer.commenters = ""
    lexer.escape = ""
    try:
        return list(lexer)
    except ValueError:
        return arguments.split()


def substitute(template: str, arguments: str, words: list[str] | None = None) -> str:
    """`$ARGUMENTS` → the whole argument string; `$1`…`$9` → the words of it (missing ones
    empty; `$10` is left alone). One pass: substituted text is not looked at again."""
    words = split_arguments(arguments) if words is None else words

    def value(m: re.Match[str]) -> str:
        key = m.group(1)
        if key == "ARGUMENTS":
            return arguments
        index = int(key) - 1
        return words[index] if index < len(words) else ""

    return _PLACEHOLDER.sub(value, template)


def append_arguments(template: str, text: str, arguments: str) -> str:
    """Claude Code's rule: arguments given to a template without `$ARGUMENTS` are appended."""
    if arguments and "$ARGUMENTS" not in template:
        return f"{text}\n\nARGUMENTS: {arguments}"
    return text


@frozen
class Expansion:
    """What a `/name args…` prompt becomes: `text` is sent instead of the prompt."""

    kind: Literal["skill", "command"]
    name: str
    arguments: str
    text: str
    #: The file it came from.
    path: Path
    #: `` !`cmd` `` substitutions not run because they need permission (commands only).
    refused: tuple[str, ...] = ()
    #: `` !`cmd` `` substitutions stopped at the time limit (commands only).
    timed_out: tuple[str, ...] = ()
    #: The model the turn uses (commands with `model:`; None: the session's).
    model: str | None = None
    #: The `@path`s of the file whose contents were attached (commands only).
    attached: tuple[str, ...] = ()
    #: `@path`s of the file not attached, each with why (commands only).
    not_attached: tuple[str, ...] = ()


# ---------------------------------------------------------------------------------------------
# Skills.


@frozen
class Skill:
    name: str
    description: str
    #: The instructions: SKILL.md without its frontmatter.
    body: str
    #: The SKILL.md file.
    path: Path
    #: Hidden from the model: not in the index, refused by the `skill` tool; `/name` still works.
    disable_model_invocation: bool = False
    #: False: not offered as `/name`.
    user_invocable: bool = True
    #: The tool rules Claude Code pre-approves while the skill runs (not honoured by keel: a
    #: warning says so when the skill is loaded).
    allowed_tools: tuple[str, ...] = ()
    argument_hint: str = ""

    @property
    def directory(self) -> Path:
        return self.path.parent

    def render(self, arguments: str = "") -> str:
        """The body with its arguments, under a line naming the skill's folder (so the paths
        in the body can be found)."""
        text = append_arguments(self.body, substitute(self.body, arguments), arguments)
        return f"Base directory for this skill: {self.directory}\n\n{text}"


class SkillSet:
    """The skills that apply in one directory, by name, and what loading them reported."""

    def __init__(
        self,
        skills: Iterable[Skill] = (),
        *,
        warnings: Iterable[str] = (),
        shadowed: Iterable[Skill] = (),
        builtins: Collection[str] = (),
    ) -> None:
        self.skills: dict[str, Skill] = {s.name: s for s in skills}
        self.warnings: list[str] = list(warnings)
        #: Skills replaced by a later one of the same name (for a `/skills` listing).
        self.shadowed: tuple[Skill, ...] = tuple(shadowed)
        #: Built-in slash commands: `/name` of these never reaches a skill.
        self.builtins = frozenset(builtins)

    def get(self, name: str) -> Skill | None:
        return self.skills.get(name)

    def model_invocable(self) -> list[Skill]:
        return sorted(
            (s for s in self.skills.values() if not s.disable_model_invocation),
            key=lambda s: s.name,
        )

    def user_invocable(self) -> list[Skill]:
        """The skills offered as `/name`, sorted by name."""
        return sorted(
            (s for s in self.skills.values() if s.user_invocable and s.name not in self.builtins),
            key=lambda s: s.name,
        )

    def index_section(self) -> str:
        """The system-prompt section listing the skills the model may load ("" if none)."""
        skills = self.model_invocable()
        if not skills:
            return ""
        lines = [f"- {s.name}: {_one_line(s.description)}" for s in skills]
        return "\n".join(["<skills>", INDEX_HEADER, *lines, "</skills>"])

    def expand(self, text: str) -> Expansion | None:
        """The expansion of a prompt `/name args…` naming a user-invocable skill, else None."""
        parsed = parse_slash(text)
        if parsed is None:
            return None
        name, arguments = parsed
        skill = self.skills.get(name)
        if skill is None or not skill.user_invocable or name in self.builtins:
            return None
        return Expansion("skill", name, arguments, skill.render(arguments), skill.path)


def skill_name(written: str, folder: str) -> str | None:
    """The name a skill is called by: `written` when it is usable, else the folder's name, else
    `written` (or the folder's name) in lower case with each run of other characters turned into
    `-`, cut at 64; None when nothing usable is left."""
    for candidate in (written, folder):
        if SKILL_NAME.fullmatch(candidate):
            return candidate
    for candidate in (written, folder):
        slug = re.sub(r"[^a-z0-9]+", "-", candidate.lower()).strip("-")[:64].strip("-")
        if slug:
            return slug
    return None


def _one_line(description: str) -> str:
    text = " ".join(description.split())
    if len(text) > MAX_INDEX_DESCRIPTION:
        text = text[: MAX_INDEX_DESCRIPTION - 1].rstrip() + "…"
    return text


def load_skills(
    cwd: Path, *, user_dir: Path | None, home: Path, builtins: Collection[str] = ()
) -> SkillSet:
    """Every skill that applies in `cwd` (see the module docstring for where and in what order)."""
    found: dict[str, Skill] = {}
    shadowed: list[Skill] = []
    warnings: list[str] = []
    for root in search_dirs(cwd, user_dir=user_dir, home=home, kind="skills"):
        for path in _skill_files(root, warnings):
            skill = _read_skill(path, warnings)
            if skill is None:
                continue
            if skill.name in found:
                shadowed.append(found.pop(skill.name))
            found[skill.name] = skill
    found.update(_plugin_skills(cwd, user_dir, home, warnings))
    for name in sorted(set(found) & set(builtins)):
        skill = found[name]
        use = "the model can still use it" if not skill.disable_model_invocation else "it is unused"
        warnings.append(
            f"{skill.path}: skill {name} has the name of a built-in command: /{name} runs the "
            f"built-in; {use}"
        )
    return SkillSet(found.values(), warnings=warnings, shadowed=shadowed, builtins=builtins)


def _plugin_skills(
    cwd: Path, user_dir: Path | None, home: Path, warnings: list[str]
) -> dict[str, Skill]:
    """The skills of the plugins that run here (`keel.plugins`), named `plugin:skill` as
    Claude Code names them."""
    import dataclasses

    from keel.plugins import plugin_components

    found: dict[str, Skill] = {}
    for plugin in plugin_components(cwd, user_dir=user_dir, home=home):
        for root in plugin.skills:
            for path in _skill_files(root, warnings):
                skill = _read_skill(path, warnings)
                if skill is not None:
                    name = f"{plugin.name}:{skill.name}"
                    body = plugin.expand(skill.body)  # `${CLAUDE_PLUGIN_ROOT}`, as Claude Code
                    found[name] = dataclasses.replace(skill, name=name, body=body)
    return found


def _skill_files(root: Path, warnings: list[str]) -> list[Path]:
    if not root.is_dir():
        return []
    try:
        entries = sorted(root.iterdir())
    except OSError as exc:
        warnings.append(f"{root}: cannot list skills ({exc.strerror})")
        return []
    # `is_file` follows symlinks, so a linked skill folder counts.
    return [
        e / "SKILL.md" for e in entries if not e.name.startswith(".") and (e / "SKILL.md").is_file()
    ]


def read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise Unusable("not UTF-8 text") from None
    except OSError as exc:
        raise Unusable(f"unreadable ({exc.strerror})") from None


def _read_skill(path: Path, warnings: list[str]) -> Skill | None:
    try:
        doc = read_document(read_text(path))
        warnings += lenient_warnings(path, doc)
        return _skill(path, doc, warnings)
    except Unusable as exc:
        warnings.append(f"{where(path, exc.line)}: {exc.message}; skipped")
        return None


def _skill(path: Path, doc: Document, warnings: list[str]) -> Skill:
    written = (text_field(doc, "name") or "").strip() or path.parent.name
    name = skill_name(written, path.parent.name)
    if name is None:
        raise Unusable(
            f"skill name {written!r} has no letter or digit to call it by",
            doc.key_lines.get("name"),
        )
    if name != written:
        warnings.append(
            f"{where(path, doc.key_lines.get('name'))}: skill name {written!r} cannot be typed "
            f"as a command (spaces, `/`, or over 64 characters); it is offered as /{name}"
        )
    description = (text_field(doc, "description") or "").strip()
    if not description:
        raise Unusable(
            "no description in the frontmatter (it tells the model when to use the skill)",
            doc.key_lines.get("description"),
        )
    allowed = tools_field(doc)
    if allowed:
        warnings.append(
            f"{where(path, doc.key_lines.get('allowed-tools'))}: `allowed-tools` of a skill is "
            f"not honoured by keel: the tools {name} needs ask as usual"
        )
    for key in UNSUPPORTED_SKILL_KEYS:
        if key in doc.meta:
            warnings.append(
                f"{where(path, doc.key_lines.get(key))}: `{key}` in a skill is not supported by "
                f"keel; {name} runs without it"
            )
    return Skill(
        name=name,
        description=description,
        body=doc.body,
        path=path,
        disable_model_invocation=flag_field(doc, "disable-model-invocation", False),
        user_invocable=flag_field(doc, "user-invocable", True),
        allowed_tools=allowed,
        argument_hint=hint_field(doc),
    )


# ---------------------------------------------------------------------------------------------
# The `skill` tool.


def skill_tool(skills: SkillSet) -> FunctionTool:
    """The read-only `skill` tool over `skills`: it returns a skill's instructions."""

    @tool(name="skill", read_only=True, kind="builtin")
    async def skill(ctx: ToolContext, name: str, arguments: str = "") -> str:
        """Load a skill: returns its full instructions, to follow for the task at hand. The
        skills you can load are listed under <skills> in the <context> block that opens the
        conversation; load one when the task matches its description, before starting the work.

        Args:
            name: The skill's name, as listed.
            arguments: What the task says the skill should work on, if anything (fills the
                skill's $ARGUMENTS).
        """
        found = skills.get(name)
        if found is None:
            names = [s.name for s in skills.model_invocable()]
            listing = f"available: {', '.join(names)}" if names else "no skills are available"
            raise ToolError(f"unknown skill {name!r}; {listing}")
        if found.disable_model_invocation:
            raise ToolError(f"skill {name!r} is only for the user to start; do the task without it")
        return found.render(arguments)

    return skill
