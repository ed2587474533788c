"""Splitting a document into the chunks the knowledge index stores and cites.

Markdown is cut at ATX headings (`#` to `######` outside code fences); each chunk keeps the
path of headings above it, and its anchor is GitHub's for its heading (`Install on Linux` →
`install-on-linux`, a repeated heading `-1`, `-2`), so `docs/setup.md#install-on-linux` is also
a link that works on a forge. A section longer than `MAX_CHARS` is cut at paragraph boundaries
into parts (`#install.2`); a code fence is never cut, however long. Text without headings (a
`.txt` file, the lines before a Markdown file's first heading) is cut at paragraphs the same way
and cited by its number (`notes.txt#3`). This module is pure: no files, no database.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from keel.frozen import mutable

#: Bump when the rules change: an index chunked by other rules is chunked again.
CHUNKER_VERSION = 1
#: A section longer than this is cut into parts at paragraph boundaries.
MAX_CHARS = 1500
#: Parts are filled up to about this much.
TARGET_CHARS = 1200

_HEADING = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")


@dataclass(frozen=True)
class Chunk:
    #: What follows `#` in the citation: a heading's anchor (`.N` for the Nth part of a long
    #: section) or, for text under no heading, the chunk's number among those.
    anchor: str
    #: The headings above and of this chunk, outermost first, joined by " > ".
    heading: str
    text: str
    #: 1-based, inclusive.
    start_line: int
    end_line: int


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`([^`]*)`", r"\1", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@mutable
class _Block:
    """A paragraph, a fence or a heading line: what a long section may be cut between."""

    lines: list[str]
    start: int  # 1-based line number
    fence: bool = False

    @property
    def size(self) -> int:
        return sum(len(line) + 1 for line in self.lines)


@mutable
class _Section:
    heading_path: list[str]
    title: str | None  # None: text under no heading
    blocks: list[_Block]
    #: 1-based line of the heading (None: text under no heading).
    heading_line: int | None = None


def _closes(m: re.Match[str] | None, fence: tuple[str, int]) -> bool:
    """Whether a line (its `_FENCE` match) closes the open fence: the same character, at least
    as many, nothing after them."""
    return bool(
        m and m.group(1)[0] == fence[0] and len(m.group(1)) >= fence[1] and not m.group(2).strip()
    )


def _blocks(lines: list[str], first_line: int) -> list[_Block]:
    """Paragraphs (separated by blank lines) and whole fences; `lines` hold no heading."""
    blocks: list[_Block] = []
    current: _Block | None = None
    fence: tuple[str, int] | None = None  # (char, length) of the open fence
    for offset, line in enumerate(lines):
        number = first_line + offset
        if fence is not None:
            assert current is not None
            current.lines.append(line)
            if _closes(_FENCE.match(line), fence):
                fence = None
                current = None
            continue
        m = _FENCE.match(line)
        if m and not (m.group(1)[0] == "`" and "`" in m.group(2)):
            fence = (m.group(1)[0], len(m.group(1)))
            current = _Block([line], number, fence=True)
            blocks.append(current)
            continue
        if not line.strip():
            current = None
            continue
        if current is None or current.fence:
            current = _Block([], number)
            blocks.append(current)
        current.lines.append(line)
    return blocks


def _sections(text: str) -> list[_Section]:
    lines = text.splitlines()
    sections: list[_Section] = []
    path: list[tuple[int, str]] = []
    title: str | None = None
    heading_line: int | None = None
    body_start = 0  # index into lines
    fence: tuple[str, int] | None = None
    for i, line in enumerate(lines):
        m = _FENCE.match(line)
        if fence is not None:
            if _closes(m, fence):
                fence = None
            continue
        if m and not (m.group(1)[0] == "`" and "`" in m.group(2)):
            fence = (m.group(1)[0], len(m.group(1)))
            continue
        h = _HEADING.match(line)
        if not h:
            continue
        blocks = _blocks(lines[body_start:i], body_start + 1)
        sections.append(_Section([t for _, t in path], title, blocks, heading_line))
        level, heading_text = len(h.group(1)), (h.group(2) or "").strip()
        path = [(lv, t) for lv, t in path if lv < level] + [(level, heading_text)]
        title, heading_line, body_start = heading_text, i + 1, i + 1
    blocks = _blocks(lines[body_start:], body_start + 1)
    sections.append(_Section([t for _, t in path], title, blocks, heading_line))
    return sections


def _parts(blocks: list[_Block]) -> list[list[_Block]]:
    """Blocks packed into parts of at most MAX_CHARS (one part if they fit); a block bigger
    than that (a long fence) is a part of its own, uncut; a long paragraph is cut at lines."""
    total = sum(b.size for b in blocks)
    if total <= MAX_CHARS:
        return [blocks]
    pieces: list[_Block] = []
    for block in blocks:
        if block.fence or block.size <= MAX_CHARS:
            pieces.append(block)
            continue
        current = _Block([], block.start)
        for offset, line in enumerate(block.lines):
            while len(line) > MAX_CHARS:  # one enormous line: cut at the cap
                if current.lines:
                    pieces.append(current)
                pieces.append(_Block([line[:MAX_CHARS]], block.start + offset))
                line = line[MAX_CHARS:]
                current = _Block([], block.start + offset)
            if current.lines and current.size + len(line) + 1 > TARGET_CHARS:
                pieces.append(current)
                current = _Block([], block.start + offset)
            current.lines.append(line)
        if current.lines:
            pieces.append(current)
    parts: list[list[_Block]] = []
    size = 0
    for piece in pieces:
        if parts and size + piece.size <= TARGET_CHARS:
            parts[-1].append(piece)
            size += piece.size
        else:
            parts.append([piece])
            size = piece.size
    return parts


def _render(blocks: list[_Block], all_lines: list[str]) -> tuple[str, int, int]:
    first = blocks[0].start
    last = blocks[-1].start + len(blocks[-1].lines) - 1
    text = "\n".join(all_lines[first - 1 : last])
    return text, first, last


def chunk_markdown(text: str) -> list[Chunk]:
    """The chunks of a Markdown document, in order (sections with no text of their own, only
    a heading and sub-sections, make no chunk: their heading is in their children's path)."""
    return _chunk(text, headings=True)


def chunk_text(text: str) -> list[Chunk]:
    """The chunks of a plain text document: paragraphs packed up to the size cap."""
    return _chunk(text, headings=False)


def _chunk(text: str, *, headings: bool) -> list[Chunk]:
    lines = text.splitlines()
    sections = _sections(text) if headings else [_Section([], None, _blocks(lines, 1))]
    chunks: list[Chunk] = []
    seen: dict[str, int] = {}
    untitled = 0
    for section in sections:
        if not section.blocks:
            continue
        base: str | None = None
        if section.title is not None:
            base = slug(section.title)
            n = seen.get(base, 0)
            seen[base] = n + 1
            base = base if n == 0 else f"{base}-{n}"
        heading = " > ".join(section.heading_path)
        for number, part in enumerate(_parts(section.blocks), start=1):
            body, first, last = _render(part, lines)
            if base is None:
                untitled += 1
                anchor = str(untitled)
            else:
                anchor = base if number == 1 else f"{base}.{number}"
            if number == 1 and section.heading_line is not None:
                # The heading line opens the chunk, so a quoted chunk shows where it is.
                first = section.heading_line
                body = "\n".join(lines[first - 1 : last])
            chunks.append(Chunk(anchor, heading, body, first, last))
    return chunks
