"""Output styles, in Claude Code's format: how the agent talks and works, chosen by the
`outputStyle` setting or `/output-style NAME`.

A style is a Markdown file in `~/.claude/output-styles/` (the user's) or `.claude/output-styles/`
(the project's, in each directory from the project root down to the working directory), with
optional frontmatter: `name` (else the file name without `.md`), `description`, and
`keep-coding-instructions` (false by default: the style replaces keel's work-style instructions
and keeps only who the agent is and the safety rules). Its text closes the system prompt in an
`<output-style>` section. A plugin that runs brings the styles in its `output-styles/` folder,
named `plugin:style`. Built in, as in Claude Code (with keel's own texts): Default (keel's own
prompt), Explanatory, Learning, Proactive and Concise (all keep the work-style instructions). A later file replaces an earlier style of the same name;
names match whatever their case.

The style is part of the system prompt, so a change applies from the next fresh context
(DESIGN.md, invariant 1). This module reads files and nothing else.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from keel.agent.prompt import BASE_PROMPT, SAFETY
from keel.frozen import frozen

#: Where styles live, relative to the home directory or a project directory.
STYLES_DIR = Path(".claude") / "output-styles"
DEFAULT = "Default"


@frozen
class OutputStyle:
    name: str
    description: str
    #: What joins the system prompt ("" for Default).
    text: str
    keep_coding_instructions: bool
    #: The file it came from (None: built in).
    path: Path | None = None


BUILTIN = (
    OutputStyle(DEFAULT, "keel's own prompt: get the work done, report briefly", "", True),
    OutputStyle(
        "Explanatory",
        "does the work and explains the choices behind it",
        "While you work, teach. Before or after a change that involves a real choice (a design, "
        "a library, a pattern the codebase uses), add a short passage headed `Insight` that says "
        "what you chose, what the alternative was and why this fits this codebase. Keep each "
        "insight to a few sentences and about this project, not general programming.",
        True,
    ),
    OutputStyle(
        "Learning",
        "works with you: leaves small, meaningful pieces for you to write",
        "Work with the user as a pair who wants to learn. Do the routine parts yourself, but "
        "when a piece of logic is small and worth writing by hand (a condition, a loop, a "
        "function of a few lines), leave it for the user: write a `TODO(human)` comment where it "
        "goes, say what it must do and what to consider, and stop so they can write it. Add an "
        "`Insight` passage where a choice teaches something about this codebase. Then review "
        "what they wrote when they tell you it is done.",
        True,
    ),
    OutputStyle(
        "Proactive",
        "acts at once on reasonable assumptions instead of stopping to ask",
        "Act rather than plan aloud. When a routine decision has a sensible default (a name, a "
        "file layout, which of two equivalent approaches), take it, say in one line what you "
        "assumed, and go on. Stop to ask only when a choice is costly to undo or the request is "
        "truly ambiguous. The permission mode still decides what runs without asking.",
        True,
    ),
    OutputStyle(
        "Concise",
        "leads with the result and keeps answers short",
        "Put the result first. No preamble, no narration of what you are about to do, no "
        "summary of what you just showed. Answer in as few sentences as the question needs; use "
        "a list only for several separate items. Do the work itself as thoroughly as ever.",
        True,
    ),
)


def style_dirs(chain: list[Path], *, home: Path) -> list[Path]:
    """The folders styles are read from, lowest precedence first."""
    return [home / STYLES_DIR, *(d / STYLES_DIR for d in chain)]


def load_styles(
    dirs: list[Path], warnings: list[str], plugins: Sequence[tuple[str, Path]] = ()
) -> list[OutputStyle]:
    """Every style: the built-in ones, those of the plugins that run (`(name, root)`: the files
    in `output-styles/`, named `plugin:style`), then those of `dirs` in order, a later one
    replacing an earlier one of the same name. A file that cannot be used is named in
    `warnings`."""
    styles = {s.name.lower(): s for s in BUILTIN}
    found = [(f"{name}:", root / "output-styles") for name, root in plugins]
    for prefix, directory in [*found, *(("", d) for d in dirs)]:
        for path in sorted(directory.glob("*.md")):
            style = read_style(path, warnings)
            if style is not None:
                style = dataclasses.replace(style, name=prefix + style.name)
                styles[style.name.lower()] = style
    return list(styles.values())


def read_style(path: Path, warnings: list[str]) -> OutputStyle | None:
    from keel.skills.skills import read_markdown  # PyYAML: only when styles exist

    doc = read_markdown(path, warnings, "output style not used")
    if doc is None:
        return None
    name = doc.meta.get("name", path.stem)
    description = doc.meta.get("description", "")
    keep = doc.meta.get("keep-coding-instructions", False)
    if not isinstance(name, str) or not name.strip():
        warnings.append(f"{path}: name must be a non-empty string; output style not used")
        return None
    if not isinstance(keep, bool):
        warnings.append(f"{path}: keep-coding-instructions must be true or false; read as false")
        keep = False
    return OutputStyle(name.strip(), str(description), doc.body, keep, path)


def find_style(name: str, styles: list[OutputStyle]) -> OutputStyle | None:
    return next((s for s in styles if s.name.lower() == name.strip().lower()), None)


#: Who the agent is, for a style that replaces keel's work-style instructions.
IDENTITY = """\
You are keel, an agent that works in the user's project through tools. How you work and how you \
answer are set by the output style at the end of this prompt."""


def base_prompt(style: OutputStyle | None) -> str:
    """The system prompt's opening under `style`: keel's whole base prompt, or only who the
    agent is and the safety rules for a style that does not keep the coding instructions."""
    if style is None or style.keep_coding_instructions:
        return BASE_PROMPT
    return f"{IDENTITY}\n\n{SAFETY}"


def style_section(style: OutputStyle) -> str:
    """The system prompt's closing section for `style` ("" for one without text)."""
    if not style.text:
        return ""
    return f"<output-style>\nOutput style: {style.name}\n\n{style.text}\n</output-style>"


__all__ = [
    "BUILTIN",
    "DEFAULT",
    "IDENTITY",
    "STYLES_DIR",
    "OutputStyle",
    "base_prompt",
    "find_style",
    "load_styles",
    "read_style",
    "style_dirs",
    "style_section",
]
