"""A memory note as a value: its fields, the limits and checks every store applies (name
syntax, description, body size, credential-looking content), and its one on-disk and on-wire
form, Markdown with YAML frontmatter (`render` / `parse`).

This module does no I/O and imports nothing above `keel.errors`.
"""

from __future__ import annotations

import functools
import math
import re
from collections import Counter
from datetime import UTC, datetime
from typing import Literal, TypeAlias

from keel.frozen import frozen

Scope: TypeAlias = Literal["project", "user"]
SCOPES: tuple[Scope, ...] = ("project", "user")
NoteType: TypeAlias = Literal["user", "feedback", "project", "reference"]
NOTE_TYPES: tuple[NoteType, ...] = ("user", "feedback", "project", "reference")
_TYPES: dict[str, NoteType] = {t: t for t in NOTE_TYPES}

#: Names: lower case letters, digits, `-` and `_`, starting with a letter or digit, ≤ 64.
NAME = re.compile(r"\A[a-z0-9][a-z0-9_-]{0,63}\Z")
#: The most bytes (UTF-8) a note's body may hold.
MAX_BODY_BYTES = 8 * 1024
#: The most notes one scope may hold.
MAX_NOTES = 200
#: The longest description (one line).
MAX_DESCRIPTION = 150


class MemoryError_(Exception):
    """A store operation that failed in a way the caller (the model, the CLI) can act on; the
    message says what to do. (The trailing underscore: `MemoryError` is Python's.)"""


class InvalidNote(MemoryError_):
    """A name, description, type or body that breaks a rule or a limit."""


class LooksLikeSecret(InvalidNote):
    """A note whose text looks like a credential."""


@frozen
class Note:
    name: str
    description: str
    body: str
    type: NoteType = "project"
    #: ISO 8601 UTC, seconds ("" until saved).
    created: str = ""
    updated: str = ""


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def check_name(name: str) -> str:
    if not NAME.match(name):
        raise InvalidNote(
            f"invalid note name {name!r}: use lower case letters, digits, '-' and '_' "
            "(starting with a letter or digit, at most 64), e.g. test-commands"
        )
    return name


def check_note(note: Note) -> Note:
    """`note` if it keeps every rule, else `InvalidNote` naming the first it breaks."""
    check_name(note.name)
    if note.type not in _TYPES:
        raise InvalidNote(f"invalid type {note.type!r}: one of {', '.join(NOTE_TYPES)}")
    description = note.description.strip()
    if not description:
        raise InvalidNote("a note needs a description: one line saying what it is for")
    if "\n" in description or "\r" in description:
        raise InvalidNote("the description must be one line (put details in the body)")
    if len(description) > MAX_DESCRIPTION:
        raise InvalidNote(
            f"the description is {len(description)} characters; at most {MAX_DESCRIPTION} "
            "(put details in the body)"
        )
    size = len(note.body.encode("utf-8"))
    if size > MAX_BODY_BYTES:
        raise InvalidNote(
            f"the body is {size} bytes; at most {MAX_BODY_BYTES} (keep notes short: split it "
            "or keep only what a future session needs)"
        )
    if not note.body.strip():
        raise InvalidNote("the body is empty: say what to remember")
    if (why := credential_reason(f"{description}\n{note.body}")) is not None:
        raise LooksLikeSecret(
            f"refused: the note looks like it holds a credential ({why}); never save secrets "
            "in memory (say where the secret is kept instead, e.g. 'the token is in $GH_TOKEN')"
        )
    return note


# -- credentials -----------------------------------------------------------------------------------


@functools.cache
def _patterns() -> tuple[tuple[str, re.Pattern[str]], ...]:
    """Keys known by their prefix or shape, matched on the text as written and on the text with
    a run of characters written apart (`s k - a n t - …`) joined up. Compiled at the first
    check, not at import (a run that saves nothing never pays)."""
    return (
        ("an Anthropic API key", re.compile(r"sk-ant-[A-Za-z0-9_-]{16,}")),
        ("an API key starting sk-", re.compile(r"\bsk-(?:proj-|live-|test-)?[A-Za-z0-9_-]{20,}")),
        ("an AWS access key id", re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")),
        ("a GitHub token", re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[\w]{40,})")),
        ("a Slack token", re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}")),
        ("a Google API key", re.compile(r"\bAIza[0-9A-Za-z_-]{35}\b")),
        ("a URL with a password", re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s/:@]+:[^\s/@]{3,}@")),
    )


@functools.cache
def _compact_patterns() -> tuple[tuple[str, re.Pattern[str]], ...]:
    """Keys whose prefix is distinctive enough to find in the text with all whitespace taken
    out (a key split into groups, a JWT with spaces round its dots), in any case where the
    format allows it."""
    return (
        ("an Anthropic API key", re.compile(r"sk-ant-[A-Za-z0-9_-]{16,}")),
        # Words run together can spell AKIA…; a real key id almost always holds a digit.
        ("an AWS access key id", re.compile(r"(?:AKIA|ASIA)(?=[A-Z]{0,15}[0-9])[0-9A-Z]{16}")),
        ("a GitHub token", re.compile(r"(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[\w]{40,})")),
        ("a Slack token", re.compile(r"xox[abprs]-[A-Za-z0-9-]{10,}")),
        ("a Google API key", re.compile(r"AIza[0-9A-Za-z_-]{35}")),
        ("a private key", re.compile(r"(?i)-----begin[a-z0-9]*privatekey(?:block)?-----")),
        (
            "a JSON web token",
            re.compile(r"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),
        ),
    )


#: Six or more single characters written apart by spaces or tabs.
_SPACED_OUT = r"(?<!\S)(?:\S[ \t]+){5,}\S(?!\S)"

#: `key = value` or `key: value` where the key names a secret (`db_password`, `"api_key"`,
#: `x-api-key`, `REFRESH_TOKEN`); not `max_tokens` or `tokenizer` (the word must end the key).
_ASSIGNMENT = (
    r"(?i)(?<![\w.-])[\w.-]*?(?:password|passwd|pwd|passphrase|secret|token|api[_-]?key|"
    r"access[_-]?key|private[_-]?key)[\"']?[ \t]*(?P<op>[:=])[ \t]*(?P<quote>[\"']?)"
    r"(?P<value>[^\s\"'<>$]*)(?P<rest>[^\n]*)"
)
#: Values that name no secret: placeholders, and code or places that hold one.
_NOT_A_VALUE = (
    r"(?i)(?:none|null|nil|true|false|redacted|string|[*x.]+)"
    r"|.*[(\[{].*|[a-z_]\w*(?:\.[a-z_]\w*)+|[/~.].*|.*://.*"
)

#: A run of 32 or more hex digits (a hash, or a key written in hex).
_HEX = r"(?<![0-9A-Za-z])[0-9a-fA-F]{32,}(?![0-9A-Za-z])"
#: Words that introduce a hash, so the hex after them is one (commit 3f2a…, sha256 9f86…).
_HASH_WORD = (
    r"(?i)\b(?:commit|commits|sha|sha-?1|sha-?256|sha-?512|hash|digest|checksum|md5|rev|"
    r"revision|object|blob|tree|head|merge|fingerprint|etag)\b"
)
#: Words that say the hex next to them is a key.
_KEY_WORD = (
    r"(?i)(?<![a-z])(?:key|secret|token|password|passwd|passphrase|credentials?|hmac)s?(?![a-z])"
)

#: A long run of token characters with high entropy (a generated secret), checked apart.
_TOKEN = r"[A-Za-z0-9+/=_-]{32,}"


def _entropy(text: str) -> float:
    counts = Counter(text)
    return -sum(n / len(text) * math.log2(n / len(text)) for n in counts.values())


def credential_reason(text: str) -> str | None:
    """What in `text` looks like a credential, or None. Whitespace inside a key does not hide
    it, nor does the case of a marker; hex is a key next to a key word or at 64 digits and
    more, unless a hash word introduces it (commit ids, checksums); words joined by `-`/`_`
    are not tokens; a long mixed-case-and-digits run of high entropy is."""
    joined = re.sub(_SPACED_OUT, lambda m: re.sub(r"\s", "", m.group(0)), text)
    for why, pattern in _patterns():
        if pattern.search(text) or pattern.search(joined):
            return why
    compact = re.sub(r"\s", "", text)
    for why, pattern in _compact_patterns():
        if pattern.search(compact):
            return why
    if any(_assigns_a_secret(m) for m in re.finditer(_ASSIGNMENT, text)):
        return "a password or secret assignment"
    if (hex_why := _hex_reason(text)) is not None:
        return hex_why
    for match in re.finditer(_TOKEN, text):
        token = match.group(0)
        if re.fullmatch(r"[0-9a-fA-F]+", token):
            continue
        classes = sum(bool(re.search(p, token)) for p in ("[a-z]", "[A-Z]", "[0-9]"))
        if classes == 3 and _entropy(token) >= 4.3:
            return "a long random-looking token"
    return None


def _assigns_a_secret(match: re.Match[str]) -> bool:
    value = match["value"]
    if re.fullmatch(_NOT_A_VALUE, value):
        return False
    if match["quote"]:
        return bool(value)
    if len(value) < 4:
        return False
    if match["op"] == "=":
        return True
    # `key: value` in prose ("Password: stored in 1Password") is a secret when the value is
    # the whole rest of the line, or a word no prose has (one with a digit or a symbol).
    return not match["rest"].strip() or not value.isalpha()


def _hex_reason(text: str) -> str | None:
    for match in re.finditer(_HEX, text):
        line_start = text.rfind("\n", 0, match.start()) + 1
        line_end = text.find("\n", match.end())
        before = text[max(line_start, match.start() - 40) : match.start()]
        after = text[match.end() : min(match.end() + 24, len(text) if line_end < 0 else line_end)]
        if re.search(_HASH_WORD, before):
            continue
        if re.search(_KEY_WORD, before) or re.search(_KEY_WORD, after):
            return "a hex-encoded key"
        if len(match.group(0)) >= 64:
            return "a long hex value"
    return None


# -- the file form ---------------------------------------------------------------------------------


def render(note: Note) -> str:
    """The Markdown form: frontmatter (name, description, type, created, updated), then the
    body. Deterministic, so equal notes are equal bytes."""
    import json

    # JSON strings are YAML strings: quoted and escaped the same way on every run.
    lines = [
        "---",
        f"name: {note.name}",
        f"description: {json.dumps(note.description, ensure_ascii=False)}",
        f"type: {note.type}",
        f"created: {json.dumps(note.created)}",
        f"updated: {json.dumps(note.updated)}",
        "---",
        note.body.rstrip("\n"),
        "",
    ]
    return "\n".join(lines)


def parse(text: str, name: str) -> Note:
    """A note from its Markdown form; `name` is the file's (or key's) name, which wins over the
    frontmatter's. A plain Markdown file (no frontmatter) is a note whose first line is its
    description. Raises `InvalidNote` for frontmatter that is not a YAML mapping."""
    lines = text.removeprefix("\ufeff").replace("\r\n", "\n").split("\n")
    if lines[0].rstrip() != "---":
        first = next((line for line in lines if line.strip()), "")
        description = first.lstrip("#").strip()[:MAX_DESCRIPTION]
        return Note(name, description, text.strip("\n"), "project")
    end = next((i for i in range(1, len(lines)) if lines[i].rstrip() == "---"), None)
    if end is None:
        raise InvalidNote(f"note {name}: the frontmatter has no closing --- line")
    meta = _own_frontmatter(lines[1:end])
    if meta is None:  # written or edited by hand: YAML
        import yaml

        try:
            meta = yaml.safe_load("\n".join(lines[1:end])) or {}
        except yaml.YAMLError as exc:
            raise InvalidNote(f"note {name}: the frontmatter is not valid YAML") from exc
    if not isinstance(meta, dict):
        raise InvalidNote(f"note {name}: the frontmatter must be `key: value` lines")
    kind = str(meta.get("type") or "project")
    return Note(
        name,
        " ".join(str(meta.get("description") or "").split()),
        "\n".join(lines[end + 1 :]).strip("\n"),
        _TYPES.get(kind, "project"),
        str(meta.get("created") or ""),
        str(meta.get("updated") or ""),
    )


_OWN_LINE = re.compile(r'(name|description|type|created|updated): ("(?:[^"\\]|\\.)*"|[a-z0-9_-]*)')


def _own_frontmatter(lines: list[str]) -> dict[str, str] | None:
    """The frontmatter as `render` writes it (known keys, JSON strings or plain words), read
    without a YAML parser (five times faster at the start of every context); None for
    anything else, which YAML reads."""
    import json

    out: dict[str, str] = {}
    for line in lines:
        m = _OWN_LINE.fullmatch(line)
        if m is None:
            return None
        value = m.group(2)
        out[m.group(1)] = json.loads(value) if value.startswith('"') else value
    return out
