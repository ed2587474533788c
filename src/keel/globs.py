"""Path patterns with git's rules, compiled by `pathspec` (a maintained implementation of
gitignore matching): the one place keel turns a path pattern into a matcher.

- `gitignore`: the lines of a `.gitignore` file (the search fallback's walk and `ls`).
- `rule_pattern`: the path pattern of a permission rule (`Read(./[Ss]ecret.env)`), one gitignore
  pattern; `keel.permissions.rules` anchors it.
- `glob_matcher`: a `glob` filter of the `glob` and `grep` tools, as ripgrep's `--glob` reads
  it: gitignore syntax plus `{a,b}` alternation, matched against a file's path (a pattern that
  names a directory does not take in the files below it), `!` in front inverting it.

Git's syntax throughout: `*`, `?`, `[...]` classes (`[!...]` negated), `**`, a trailing `/` for
directories only, `\\` escapes (`\\#`, `\\!`, `\\ ` for a trailing space; unescaped trailing
spaces are dropped). Not supported (pathspec does not implement them): POSIX classes such as
`[[:digit:]]` and a `[` inside `[...]`; such a pattern is a `PatternError` (a .gitignore line of
that kind is left out). Imports nothing from keel.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from functools import lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathspec import GitIgnoreSpec
    from pathspec.patterns.gitignore.spec import (
        GitIgnoreSpecPattern,
    )  # 1.x; 0.12 names it otherwise

#: Alternatives one `{a,b}` glob may expand to.
MAX_ALTERNATIVES = 256
#: The named group pathspec's patterns use for a match that ended at a directory of the path
#: (`*.py` taking in `x.py/inner.md`); a glob filter matches files by their own name only.
_DIRECTORY_MATCH = "ps_d"


class PatternError(ValueError):
    """A pattern keel cannot apply; the message says why."""


def _set_trouble(pattern: str) -> str | None:
    """Why a `[...]` of `pattern` cannot be applied, else None: pathspec passes a class to
    Python's `re`, which has no POSIX classes and warns about a `[` (or `&&`, `||`, `~~`)
    inside one."""
    i, end = 0, len(pattern)
    while i < end:
        char = pattern[i]
        if char == "\\":
            i += 2
            continue
        if char == "[":
            j = i + 1
            if j < end and pattern[j] in "!^":
                j += 1
            if j < end and pattern[j] == "]":
                j += 1
            close = pattern.find("]", j)
            if close < 0:
                return None  # an unclosed `[`: pathspec compiles it to nothing (below)
            body = pattern[i + 1 : close]
            if "[" in body or any(op in body for op in ("&&", "||", "~~")):
                return (
                    "POSIX classes ([[:digit:]]) and '[', '&&', '||' or '~~' inside [...] are "
                    "not supported; list the characters ([0-9]) or escape them"
                )
            i = close + 1
            continue
        i += 1
    return None


@lru_cache(maxsize=4096)
def _spec(line: str) -> GitIgnoreSpec:
    """`line` as a one-pattern spec; PatternError when it cannot be compiled or applied."""
    from pathspec import GitIgnoreSpec  # imported on first use: a run without patterns skips it

    if (trouble := _set_trouble(line)) is not None:
        raise PatternError(trouble)
    try:
        spec = GitIgnoreSpec.from_lines([line])
    except (ValueError, re.error) as exc:  # pathspec's pattern errors are ValueErrors
        raise PatternError(f"not a valid gitignore pattern ({exc})") from None
    if not spec.patterns or spec.patterns[0].include is None:
        raise PatternError(
            "it matches nothing as a gitignore pattern (a comment, or an unclosed '['); "
            "write \\# or \\[ for the character itself"
        )
    return spec


def gitignore(lines: Iterable[str]) -> GitIgnoreSpec:
    """The lines of a .gitignore file as one spec (last match wins, `!` re-includes). Blank
    lines and comments are skipped, and so is a line keel cannot apply (git ignores a malformed
    line too)."""
    from pathspec import GitIgnoreSpec

    patterns: list[GitIgnoreSpecPattern] = []
    for line in lines:
        if not line.strip() or line.startswith("#"):
            continue
        try:
            patterns.extend(_spec(line).patterns)
        except PatternError:
            continue
    return GitIgnoreSpec(patterns)


def ignored(spec: GitIgnoreSpec, rel: str, is_dir: bool) -> bool | None:
    """What `spec` says of `rel` (relative to the .gitignore's folder, `/`-separated): True
    ignored, False re-included by a `!` line, None when no line matches."""
    return spec.check_file(rel + "/" if is_dir else rel).include


class RulePattern:
    """One gitignore pattern, for a permission rule's path."""

    __slots__ = ("_spec",)

    def __init__(self, spec: GitIgnoreSpec) -> None:
        self._spec = spec

    def matches(self, rel: str, is_dir: bool) -> bool:
        """Whether the pattern takes in `rel` (relative to the rule's base): the path itself,
        or a directory above it (a matched directory covers everything in it)."""
        return self._spec.match_file(rel + "/" if is_dir else rel)


def rule_pattern(text: str) -> RulePattern:
    """`text` (anchored with a leading `/` where the rule is) as a matcher; PatternError when
    it cannot be applied. A `!` in front is refused: a rule names what it covers."""
    if text.startswith("!"):
        raise PatternError("a rule's pattern cannot be negated with '!' (write \\! for a '!')")
    return RulePattern(_spec(text))


def _alternatives(pattern: str) -> list[str]:
    """`pattern` with each `{a,b}` group expanded (nested groups too), as ripgrep expands it;
    braces inside `[...]` and escaped ones are literal."""
    i, end = 0, len(pattern)
    while i < end:
        char = pattern[i]
        if char == "\\":
            i += 2
            continue
        if char == "[":
            close = pattern.find("]", i + 2)
            i = close + 1 if close > 0 else i + 1
            continue
        if char == "}":
            raise PatternError("a '}' closes no '{' (escape it as \\})")
        if char == "{":
            depth, j, parts, start = 1, i + 1, [], i + 1
            while j < end and depth:
                if pattern[j] == "\\":
                    j += 2
                    continue
                if pattern[j] == "{":
                    depth += 1
                elif pattern[j] == "}":
                    depth -= 1
                elif pattern[j] == "," and depth == 1:
                    parts.append(pattern[start:j])
                    start = j + 1
                j += 1
            if depth:
                raise PatternError("a '{' is never closed (escape it as \\{)")
            parts.append(pattern[start : j - 1])
            head, tails = pattern[:i], _alternatives(pattern[j:])
            out = [head + a + t for part in parts for a in _alternatives(part) for t in tails]
            if len(out) > MAX_ALTERNATIVES:
                raise PatternError(f"it expands to more than {MAX_ALTERNATIVES} alternatives")
            return out
        i += 1
    return [pattern]


def _as_glob_line(alternative: str) -> str:
    """A glob alternative as a gitignore line: a leading `#` or `!` and trailing spaces are
    the characters themselves in a glob."""
    if alternative.startswith(("#", "!")):
        alternative = "\\" + alternative
    stripped = alternative.rstrip(" ")
    return stripped + "\\ " * (len(alternative) - len(stripped))


@lru_cache(maxsize=256)
def glob_matcher(pattern: str) -> Callable[[str], bool]:
    """A `glob` filter (ripgrep's `--glob`) as a test of a file's path relative to the search
    root: a pattern without `/` (other than a trailing one) matches the file name at any depth,
    one with a `/` is anchored at the root; PatternError when it cannot be applied."""
    negated = pattern.startswith("!")
    body = pattern[1:] if negated else pattern
    if not body:
        raise PatternError("the glob is empty")
    regexes = []
    for alternative in _alternatives(body):
        for compiled in _spec(_as_glob_line(alternative)).patterns:
            assert compiled.regex is not None  # _spec refuses patterns that match nothing
            regexes.append(compiled.regex)

    def matches(rel: str) -> bool:
        for regex in regexes:
            found = regex.match(rel)
            if found is not None and found.groupdict().get(_DIRECTORY_MATCH) is None:
                return not negated
        return negated

    return matches


_SPECIAL = re.compile(r"([\\*?\[\]])")


def escape(text: str) -> str:
    """`text` as a pattern that matches exactly it (a path written into a rule)."""
    text = _SPECIAL.sub(r"\\\1", text)
    if text.startswith(("#", "!")):
        text = "\\" + text
    stripped = text.rstrip(" ")
    return stripped + "\\ " * (len(text) - len(stripped))
