"""Claude Code rules: the Markdown files under a `.claude/rules/` folder (subfolders included),
the user's `~/.claude/rules/` and the project's, in each directory from the project root down to
the working directory (as settings files are read).

A rule without `paths:` frontmatter is always on: it joins the system prompt like a CLAUDE.md
(`keel.agent.prompt`). A rule with `paths:` (a list of globs, or one string of globs separated by
commas, relative to the project root, with `{a,b}` alternatives) is path-scoped: it reaches the
model as a note when the model first reads or edits a matching file
(`keel.agent.instruction_notes`). The globs are read as the `glob` tool reads its filters
(`keel.globs.glob_matcher`: git's pattern syntax, `{a,b}`, a glob without `/` matching the file
name at any depth, one with `/` anchored at the project root).

This module reads files and nothing else; a rule it cannot use is named in a warning.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from keel.frozen import frozen
from keel.globs import PatternError, glob_matcher

#: Where rules live, relative to a directory (the home directory or a project directory).
RULES_DIR = Path(".claude") / "rules"

#: A comma between globs, not one between `{a,b}` alternatives.
_OUTSIDE_BRACES_COMMA = re.compile(r",(?![^{]*\})")


@frozen
class Rule:
    path: Path
    #: The rule's text without its frontmatter.
    text: str
    #: Its `paths:` globs; empty for an always-on rule.
    patterns: tuple[str, ...] = ()


def rule_files(directory: Path) -> list[Path]:
    """The `.md` files under `directory`, subfolders included (linked ones followed once), in
    path order."""
    found: list[Path] = []
    seen: set[Path] = set()
    for top, dirs, files in os.walk(directory, followlinks=True):
        real = Path(top).resolve()
        if real in seen:  # a link back up: walked already
            dirs.clear()
            continue
        seen.add(real)
        dirs.sort()
        found += [Path(top) / name for name in sorted(files) if name.endswith(".md")]
    return sorted(found)


def read_rule(path: Path, warnings: list[str]) -> Rule | None:
    """The rule in `path`, or None (with a warning naming the file) when it cannot be used."""
    from keel.skills.skills import read_markdown  # PyYAML: only when rules exist

    doc = read_markdown(path, warnings, "rule not used")
    if doc is None:
        return None
    raw = doc.meta.get("paths")
    if raw is None:
        return Rule(path, doc.body)
    if isinstance(raw, str):
        raw = _OUTSIDE_BRACES_COMMA.split(raw)
    if not isinstance(raw, list) or not all(isinstance(p, str) for p in raw):
        warnings.append(f"{path}: paths must be a list of globs; rule not used")
        return None
    patterns = tuple(p.strip() for p in raw if p.strip())
    if not patterns:
        warnings.append(f"{path}: paths names no glob; rule not used")
        return None
    for pattern in patterns:
        try:
            glob_matcher(pattern)
        except PatternError as exc:
            warnings.append(f"{path}: paths: {pattern!r}: {exc}; rule not used")
            return None
    return Rule(path, doc.body, patterns)


class Matcher:
    """Which path-scoped rules match a path relative to the project root."""

    def __init__(self, rules: list[Rule]) -> None:
        self.rules = [(rule, [glob_matcher(p) for p in rule.patterns]) for rule in rules]

    def matching(self, rel: str) -> tuple[Rule, ...]:
        return tuple(rule for rule, tests in self.rules if any(test(rel) for test in tests))


__all__ = ["RULES_DIR", "Matcher", "Rule", "read_rule", "rule_files"]
