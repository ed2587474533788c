"""Doublestar globs (`*` and `?` within a path segment, `**` across segments) as regular
expressions: one translation for .gitignore handling, glob/grep filters and permission rules.
Imports nothing from keel."""

from __future__ import annotations

import re


def translate(pattern: str) -> str:
    """A glob as a regex body (no anchors)."""
    parts = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            parts.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            parts.append(".*")
            i += 2
        else:
            parts.append({"*": "[^/]*", "?": "[^/]"}.get(pattern[i], re.escape(pattern[i])))
            i += 1
    return "".join(parts)


def compile_glob(pattern: str) -> re.Pattern[str]:
    """A glob matched against a whole path."""
    return re.compile("^" + translate(pattern) + "$")
