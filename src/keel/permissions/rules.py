"""Permission rules: `tool` or `tool(pattern)`, allow or deny, and how each kind of tool matches.

- `bash(git commit*)`: a prefix pattern on each command of the command line (see
  `keel.permissions.shell`); a deny rule also looks inside substitutions and `bash -c`.
- File tools (`read`, `write`, `edit`, `multi_edit`, `ls`, `grep`, `glob`): `read(src/**)`, a glob
  on the path relative to the project root (`**` crosses directories).
- `web_fetch(domain:example.com)`: the domain and its subdomains.
- `mcp__server`: every tool of that MCP server; `mcp__server__tool` one tool.
- A bare tool name matches every call of that tool.

Nothing here decides; `keel.permissions.gate` applies rules in the documented order.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import keel.permissions.shell as shell
from keel.errors import UserError
from keel.frozen import frozen
from keel.globs import compile_glob

Effect = Literal["allow", "deny"]

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

_RULE = re.compile(r"^(?P<tool>[A-Za-z0-9_.-]+)(?:\((?P<pattern>.*)\))?$", re.DOTALL)


@frozen
class Rule:
    tool: str
    pattern: str | None
    effect: Effect
    source: str = ""

    def __str__(self) -> str:
        return f"{self.tool}({self.pattern})" if self.pattern is not None else self.tool


def parse_rule(text: str, effect: Effect, source: str = "") -> Rule:
    """`bash(git commit*)`, `read(src/**)`, `web_fetch(domain:x.org)`, `mcp__github`, `edit`."""
    m = _RULE.match(text.strip())
    if not m or (m.group("pattern") is not None and not m.group("pattern").strip()):
        raise UserError(
            f"{source + ': ' if source else ''}{text!r} is not a permission rule",
            hint='rules look like "bash(git commit*)", "edit(src/**)", "web_fetch(domain:python.org)" or "read"',
        )
    tool = m.group("tool").lower() if not m.group("tool").startswith("mcp__") else m.group("tool")
    pattern = m.group("pattern")
    return Rule(tool, pattern.strip() if pattern is not None else None, effect, source)


def parse_rules(texts: Iterable[str], effect: Effect, source: str = "") -> list[Rule]:
    return [parse_rule(t, effect, source) for t in texts]


def path_matches(pattern: str, path: Path, root: Path) -> bool:
    """Whether `path` (absolute) matches a glob relative to the project root. A pattern that
    starts with `/` or `~` is absolute."""
    if pattern.startswith("~"):
        pattern = str(Path(pattern).expanduser())
    if pattern.startswith("/"):
        return compile_glob(pattern).match(str(path)) is not None
    try:
        rel = path.relative_to(root).as_posix()
    except ValueError:
        return False
    return compile_glob(pattern).match(rel) is not None or fnmatch.fnmatchcase(rel, pattern)


def _domain_matches(pattern: str, url: str) -> bool:
    domain = pattern.removeprefix("domain:").lower().lstrip(".")
    host = (urlsplit(url).hostname or "").lower()
    return host == domain or host.endswith("." + domain)


def matches(rule: Rule, tool: str, args: dict[str, Any], root: Path, cwd: Path) -> bool:
    """Whether `rule` covers this call (for deny rules of bash, substitutions count too)."""
    if rule.tool.startswith("mcp__") and rule.pattern is None:
        return tool == rule.tool or tool.startswith(rule.tool + "__")
    if rule.tool != tool:
        return False
    if rule.pattern is None:
        return True
    if tool == "bash":
        command = str(args.get("command", ""))
        if rule.effect == "deny":
            return shell.rule_denies([rule.pattern], command) is not None
        return shell.rule_allows([rule.pattern], command)
    if tool in FILE_TOOLS:
        raw = args.get(FILE_TOOLS[tool], ".")
        target = Path(str(raw)).expanduser()
        target = (target if target.is_absolute() else cwd / target).resolve()
        return path_matches(rule.pattern, target, root)
    if tool == "web_fetch" and rule.pattern.startswith("domain:"):
        return _domain_matches(rule.pattern, str(args.get("url", "")))
    return rule.pattern == "*"


def suggest(tool: str, args: dict[str, Any]) -> str:
    """The rule an "always allow" answer saves: `bash(git commit*)`, `web_fetch(domain:x.org)`,
    or the bare tool name."""
    if tool == "bash":
        return shell.suggest_rule(str(args.get("command", "")))
    if tool == "web_fetch":
        host = urlsplit(str(args.get("url", ""))).hostname
        return f"web_fetch(domain:{host})" if host else "web_fetch"
    return tool
