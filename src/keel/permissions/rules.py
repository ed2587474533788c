"""Permission rules: `tool` or `tool(pattern)`, allow, ask or deny, and how each kind of tool
matches. Rules are written in keel's spelling or Claude Code's (`bash(...)` or `Bash(...)`,
`web_fetch` or `WebFetch`; `keel.tools.names`).

- `bash(git commit*)`, `Bash(npm run test:*)`: a prefix pattern on each command of the command
  line (see `keel.permissions.shell`); deny and ask rules also look inside substitutions and
  `bash -c`.
- File tools: `read(src/**)`, `Edit(./src/**)`: a gitignore pattern with git's rules
  (`keel.globs`: classes such as `[Ss]ecret.env`, the escapes `\\#`, `\\!` and `\\ `, `**`, a
  trailing `/` for directories only). Anchors: `//x` is absolute, `~/x` is below the home
  directory, `./x` and any pattern with a `/` inside are relative to the project root, a
  pattern with no `/` (`*.env`, `.env`) matches at any depth, and `/x` is relative to the
  folder that holds the settings file's `.claude/` (Claude Code's files) or absolute (keel's
  own files). A match of a directory covers everything below it. A pattern keel cannot apply
  (`Read(./[z-a])`, a negation `Read(!x)`) fails closed: a deny or ask rule with one covers
  every path of its tool, an allow rule with one covers none (`Rule.problem` says why).
  Families: an `edit` rule covers every tool that writes files (`write`, `edit`, `multi_edit`);
  a deny or ask rule of `write` or `multi_edit` does too; a `read` rule covers the tools that
  read files (`read`, `grep`, `glob`, `ls`), and a `read` deny rule also keeps a file's content
  out of every result that would quote it (`PermissionGate.content_denied`).
- `web_fetch(domain:example.com)`: the domain and its subdomains.
- `mcp__server` and `mcp__server__*`: every tool of that MCP server; `mcp__server__tool` one.
- A bare tool name matches every call of that tool (or family); so does a deny or ask rule whose
  pattern is `*` or `**` alone (`Bash(*)`, `Read(**)`: Claude Code's spelling of the same).
  A deny rule that takes in every call of a tool (`covers_every_call`) also keeps the tool out
  of the tools offered to the model (`PermissionGate.withheld`).

Nothing here decides; `keel.permissions.gate` applies rules in the documented order.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from keel.errors import UserError
from keel.frozen import frozen
from keel.globs import PatternError, escape, rule_pattern
from keel.tools.names import CLAUDE_ONLY, from_claude

Effect = Literal["allow", "ask", "deny"]

#: Tools whose rule pattern is a path glob, and the argument holding the path.
FILE_TOOLS = {
    "read": "path",
    "write": "path",
    "edit": "path",
    "multi_edit": "path",
    "ls": "path",
    "grep": "path",
    "glob": "path",
}
WRITE_FAMILY = frozenset({"write", "edit", "multi_edit"})
READ_FAMILY = frozenset({"read", "grep", "glob", "ls"})

#: Patterns that stand for every call of their tool in a deny or ask rule (`Bash(*)` is `Bash`).
EVERY_CALL = frozenset({"*", "**"})

_RULE = re.compile(r"^(?P<tool>[A-Za-z0-9_.*-]+)(?:\((?P<pattern>.*)\))?$", re.DOTALL)


@frozen
class Rule:
    tool: str
    pattern: str | None
    effect: Effect
    source: str = ""
    #: The directory a Claude Code `/x` path pattern is relative to (None: `/x` is absolute).
    anchor: Path | None = None
    #: Why the path pattern cannot be applied ("" when it can): the rule then fails closed (a
    #: deny or ask rule covers every path of its tool, an allow rule none).
    problem: str = ""
    #: Holds for one turn only (a custom command's `disallowed-tools`): enforced, but it never
    #: withholds a tool from the context's tools (`PermissionGate.withheld`).
    for_turn: bool = False

    def __str__(self) -> str:
        return f"{self.tool}({self.pattern})" if self.pattern is not None else self.tool

    @property
    def unknown_tool(self) -> bool:
        """A Claude Code tool keel does not have: the rule matches nothing (callers say so)."""
        return self.tool in CLAUDE_ONLY


def parse_rule(text: str, effect: Effect, source: str = "", *, anchor: Path | None = None) -> Rule:
    """`bash(git commit*)`, `Read(./.env)`, `web_fetch(domain:x.org)`, `mcp__github`, `edit`.
    A path pattern keel cannot apply is not an error here: the rule carries the `problem`."""
    m = _RULE.match(text.strip())
    if not m or (m.group("pattern") is not None and not m.group("pattern").strip()):
        raise UserError(
            f"{source + ': ' if source else ''}{text!r} is not a permission rule",
            hint='rules look like "Bash(git commit *)", "Edit(./src/**)", '
            '"WebFetch(domain:python.org)" or "Read"',
        )
    written = m.group("tool")
    if written.startswith("mcp__"):
        tool = written.removesuffix("__*")
    else:
        mapped = from_claude(written)
        tool = written if mapped is None else mapped.lower()
    pattern = m.group("pattern")
    if pattern is None:
        return Rule(tool, None, effect, source, anchor)
    pattern = _trimmed(pattern)
    problem = path_problem(pattern) if tool in FILE_TOOLS else ""
    return Rule(tool, pattern, effect, source, anchor, problem)


def _trimmed(pattern: str) -> str:
    """`pattern` without surrounding whitespace, except a trailing space escaped with `\\`
    (git's way to end a pattern with a space)."""
    trimmed = pattern.strip()
    backslashes = len(trimmed) - len(trimmed.rstrip("\\"))
    if backslashes % 2 and len(pattern.rstrip()) < len(pattern):
        trimmed += " "
    return trimmed


def path_problem(pattern: str) -> str:
    """Why a file tool's path pattern cannot be applied, or "" when it can."""
    _base_dir, rest, anchored = _base(pattern, Path("."), None)
    if not rest.rstrip("/"):
        return ""
    try:
        rule_pattern(("/" if anchored else "") + rest)
    except PatternError as exc:
        return str(exc)
    return ""


def parse_rules(texts: Iterable[str], effect: Effect, source: str = "") -> list[Rule]:
    return [parse_rule(t, effect, source) for t in texts]


def settings_rules(
    entries: Iterable[tuple[str, str]], effect: Effect
) -> tuple[list[Rule], list[str]]:
    """Rules as settings files wrote them, `(text, file)`, with the warnings about them. A deny
    or ask rule keel cannot read stops the run (UserError naming the file and the rule: skipping
    it would let through what it was meant to stop); an allow rule is skipped with a warning
    (skipping it only asks more). A deny or ask rule whose path pattern keel cannot apply is
    kept and covers every path of its tool, with a warning; such an allow rule is skipped with
    one. A rule naming a Claude Code tool keel lacks is kept and named in a warning (it matches
    nothing)."""
    rules: list[Rule] = []
    warnings: list[str] = []
    for text, source in entries:
        try:
            rule = parse_rule(text, effect, source, anchor=claude_anchor(source))
        except UserError as exc:
            if effect != "allow":
                raise
            warnings.append(f"{exc.message}; skipped")
            continue
        if rule.problem:
            if effect == "allow":
                warnings.append(f"{source}: allow rule {text!r}: {rule.problem}; skipped")
                continue
            warnings.append(
                f"{source}: {effect} rule {text!r}: {rule.problem}; it covers every path of "
                f"{rule.tool} until it is fixed"
            )
        if rule.unknown_tool:
            warnings.append(
                f"{source}: {effect} rule {text!r} names Claude Code's {rule.tool}, which keel "
                "does not have; it matches nothing"
            )
        rules.append(rule)
    return rules, warnings


def claude_anchor(source: str) -> Path | None:
    """Where `/x` patterns of rules from the settings file `source` point: the folder holding its
    `.claude/` for Claude Code's files; None (absolute) for keel's own."""
    path = Path(source)
    return path.parent.parent if path.parent.name == ".claude" else None


def _base(pattern: str, root: Path, anchor: Path | None) -> tuple[Path, str, bool]:
    """The directory `pattern` is relative to, the rest of it, and whether it is anchored there
    (an unanchored pattern matches at any depth, as in .gitignore)."""
    if pattern.startswith("//"):
        return Path("/"), pattern[2:], True
    if pattern == "~" or pattern.startswith("~/"):
        return Path.home(), pattern[2:], True
    if pattern.startswith("/"):
        return (anchor if anchor is not None else Path("/")), pattern[1:], True
    if pattern.startswith("./"):
        return root, pattern[2:], True
    return root, pattern, "/" in pattern.rstrip("/")


def path_matches(pattern: str, path: Path, root: Path, anchor: Path | None = None) -> bool:
    """Whether `path` (absolute, resolved) matches a rule's path pattern (module docstring);
    `root` is resolved too. A pattern that cannot be applied raises PatternError (`path_problem`
    says so beforehand)."""
    base, rest, anchored = _base(pattern, root, anchor)
    try:
        rel = path.relative_to(base if base in (root, Path("/")) else base.resolve()).as_posix()
    except ValueError:
        return False
    if not rest.rstrip("/"):
        return True  # the base itself and everything below it
    if rel == ".":
        return False
    compiled = rule_pattern(("/" if anchored else "") + rest)
    # As a directory only when that is what makes it match (one stat, seldom).
    return compiled.matches(rel, False) or (compiled.matches(rel, True) and path.is_dir())


def target_path(raw: object, cwd: Path) -> Path:
    """The file a file tool's path argument names: relative to cwd, `~` expanded, symlinks
    resolved (what a rule's pattern is matched against)."""
    target = Path(str(raw)).expanduser()
    return (target if target.is_absolute() else cwd / target).resolve()


def covers_path(rule: Rule, target: Path, root: Path) -> bool:
    """Whether a file tool's rule takes in `target` (`target_path`), `root` resolved: a rule
    without a pattern covers every path; one whose pattern cannot be applied fails closed (a
    deny or ask rule covers every path, an allow rule none)."""
    if rule.pattern is None or _unlimited(rule):
        return True
    if rule.problem:
        return rule.effect != "allow"
    return path_matches(rule.pattern, target, root, rule.anchor)


def _domain_matches(pattern: str, url: str) -> bool:
    domain = pattern.removeprefix("domain:").lower().lstrip(".")
    host = (urlsplit(url).hostname or "").lower()
    return host == domain or host.endswith("." + domain)


def covers_tool(rule: Rule, tool: str) -> bool:
    """Whether `rule`'s tool (or its family) takes in a call of `tool`."""
    if rule.tool.startswith("mcp__"):
        return tool == rule.tool or tool.startswith(rule.tool + "__")
    if rule.tool == tool:
        return True
    if tool in WRITE_FAMILY:
        return rule.tool == "edit" or (rule.tool in WRITE_FAMILY and rule.effect != "allow")
    return rule.tool == "read" and tool in READ_FAMILY


def covers_every_call(rule: Rule, tool: str) -> bool:
    """Whether `rule` takes in every call of `tool`, whatever its arguments: a bare name (`Bash`,
    `Read` for the whole read family, `mcp__server` for every tool of that server), or a deny or
    ask rule whose pattern is `*` or `**` alone. `matches` is true for every such call."""
    return covers_tool(rule, tool) and _unlimited(rule)


def _unlimited(rule: Rule) -> bool:
    """The rule's pattern, if any, narrows nothing (`*` or `**` in a deny or ask rule)."""
    return rule.pattern is None or (rule.effect != "allow" and rule.pattern in EVERY_CALL)


def matches(rule: Rule, tool: str, args: dict[str, Any], root: Path, cwd: Path) -> bool:
    """Whether `rule` covers this call (for deny and ask rules of bash, every command the line
    could start counts, substitutions included)."""
    import keel.permissions.shell as shell

    if not covers_tool(rule, tool):
        return False
    if rule.pattern is None or covers_every_call(rule, tool):
        return True
    if tool == "bash":
        command = str(args.get("command", ""))
        if rule.effect != "allow":
            return shell.rule_denies([rule.pattern], command) is not None
        return shell.rule_allows([rule.pattern], command)
    if tool in FILE_TOOLS:
        return covers_path(rule, target_path(args.get(FILE_TOOLS[tool], "."), cwd), root.resolve())
    if tool == "web_fetch" and rule.pattern.startswith("domain:"):
        return _domain_matches(rule.pattern, str(args.get("url", "")))
    return rule.pattern == "*"


def suggest(tool: str, args: dict[str, Any], cwd: Path | None = None) -> str:
    """The rule an "always allow" answer saves: `bash(git commit*)`, `web_fetch(domain:x.org)`,
    `read(//home/me/notes/**)` for a read outside the project (the file's directory, not every
    read), or the bare tool name."""
    import keel.permissions.shell as shell

    if tool == "bash":
        return shell.suggest_rule(str(args.get("command", "")))
    if tool == "web_fetch":
        host = urlsplit(str(args.get("url", ""))).hostname
        return f"web_fetch(domain:{host})" if host else "web_fetch"
    if tool in READ_FAMILY and cwd is not None:
        target = (cwd / Path(str(args.get(FILE_TOOLS[tool]) or ".")).expanduser()).resolve()
        folder = target if target.is_dir() else target.parent
        return f"{tool}(//{escape(folder.as_posix().lstrip('/'))}/**)"
    return tool
