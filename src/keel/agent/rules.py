"""Claude Code rules: the Markdown files under a `.claude/rules/` folder (subfolders included),
the user's `~/.claude/rules/` and the project's, in each directory from the project root down to
the working directory (as settings files are read).

A rule without `paths:` frontmatter is always on: it joins the system prompt like a CLAUDE.md
(`keel.agent.prompt`). A rule with `paths:` (a list of globs, or one string of globs separated by
commas, relative to the project root, with `{a,b}` alternatives) is path-scoped: it reaches the
model as a note when the model first reads or edits a matching file
(`keel.agent.instruction_notes`). The globs are matched as gitignore patterns (`pathspec`), so
`*.ts` matches at any depth, as `**/*.ts` does.

This module reads files and nothing else; a rule it cannot use is named in a warning.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from keel.frozen import frozen

if TYPE_CHECKING:
    import pathspec

#: Where rules live, relative to a directory (the home directory or a project directory).
RULES_DIR = Path(".claude") / "rules"

_BRACES = re.compile(r"\{([^{}]*)\}")
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
    from keel.skills.skills import Unusable, read_document, where  # PyYAML: only when rules exist

    try:
        doc = read_document(path.read_text(encoding="utf-8", errors="replace"))
    except OSError as exc:
        warnings.append(f"{path}: unreadable ({exc.strerror}); rule not used")
        return None
    except Unusable as exc:
        warnings.append(f"{where(path, exc.line)}: {exc.message}; rule not used")
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
    try:
        unusable = [p.pattern for p in spec(patterns).patterns if p.regex is None]
    except ValueError as exc:
        warnings.append(f"{path}: paths: {exc}; rule not used")
        return None
    if unusable:  # pathspec reads it as matching nothing: say so rather than fail silently
        warnings.append(f"{path}: paths: {unusable[0]!r} is not a glob; rule not used")
        return None
    return Rule(path, doc.body, patterns)


def spec(patterns: tuple[str, ...]) -> pathspec.GitIgnoreSpec:
    """`patterns` as gitignore patterns, `{a,b}` expanded. Raises `ValueError` for one that
    is not a pattern."""
    import pathspec

    return pathspec.GitIgnoreSpec.from_lines([p for g in patterns for p in expand_braces(g)])


def expand_braces(pattern: str) -> list[str]:
    """`src/*.{ts,tsx}` as `src/*.ts` and `src/*.tsx` (nested and repeated groups too)."""
    match = _BRACES.search(pattern)
    if match is None:
        return [pattern]
    head, tail = pattern[: match.start()], pattern[match.end() :]
    return [out for part in match.group(1).split(",") for out in expand_braces(head + part + tail)]


class Matcher:
    """Which path-scoped rules match a path relative to the project root. One regular expression
    over every rule's globs answers "none", the common case, in one step; a path it matches is
    checked rule by rule, each rule's globs as one expression (a rule with a `!` glob, which
    takes a match away, by `pathspec` itself)."""

    def __init__(self, rules: list[Rule]) -> None:
        self.rules: list[tuple[Rule, re.Pattern[str] | pathspec.GitIgnoreSpec]] = []
        every: list[str] = []
        for rule in rules:
            compiled = spec(rule.patterns)
            parts = [
                _NAMED_GROUP.sub("(?:", p.regex.pattern)
                for p in compiled.patterns
                if p.include and isinstance(p.regex, re.Pattern)
            ]
            every += parts
            plain = all(p.include is not False for p in compiled.patterns)
            self.rules.append((rule, _either(parts) if plain else compiled))
        self.any = _either(list(dict.fromkeys(every)))

    def matching(self, rel: str) -> tuple[Rule, ...]:
        if self.any.search(rel) is None:
            return ()
        return tuple(
            rule
            for rule, test in self.rules
            if (
                test.search(rel) is not None
                if isinstance(test, re.Pattern)
                else test.match_file(rel)
            )
        )


def _either(parts: list[str]) -> re.Pattern[str]:
    """One expression for any of `parts`; one that matches nothing for none."""
    return re.compile("|".join(f"(?:{p})" for p in parts) if parts else "(?!)")


_NAMED_GROUP = re.compile(r"\(\?P<[^>]+>")


__all__ = ["RULES_DIR", "Matcher", "Rule", "expand_braces", "read_rule", "rule_files", "spec"]
