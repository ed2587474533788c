"""keel.skills: Agent Skills (`SKILL.md` folders) and custom slash commands (`*.md` files) in
Claude Code's formats, so a user's `.claude/skills` and `.claude/commands` run unchanged.

`load_extensions` finds both for a working directory; the caller puts
`SkillSet.index_section()` among the system prompt's extra sections, registers
`skill_tool(skills)`, and offers `SkillSet.expand` / `CommandSet.expand` for prompts starting
with `/`. Importing this package reads no files and imports no YAML parser.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

from keel.skills.commands import (
    BUILTIN_COMMANDS,
    SHELL_OUTPUT_LIMIT,
    SHELL_TIMEOUT,
    AllowShell,
    Command,
    CommandSet,
    load_commands,
)
from keel.skills.skills import Expansion, Skill, SkillSet, load_skills, skill_tool


def load_extensions(
    cwd: Path,
    *,
    user_dir: Path | None,
    home: Path,
    builtins: Collection[str] = BUILTIN_COMMANDS,
) -> tuple[SkillSet, CommandSet]:
    """The skills and custom commands that apply in `cwd`. `user_dir` is keel's user config dir
    (`keel.config.settings.user_config_dir()`), `home` the user's home directory, `builtins` the
    names of the built-in slash commands (without `/`), which win over both."""
    skills = load_skills(cwd, user_dir=user_dir, home=home, builtins=builtins)
    commands = load_commands(cwd, user_dir=user_dir, home=home, skills=skills, builtins=builtins)
    return skills, commands


__all__ = [
    "BUILTIN_COMMANDS",
    "SHELL_OUTPUT_LIMIT",
    "SHELL_TIMEOUT",
    "AllowShell",
    "Command",
    "CommandSet",
    "Expansion",
    "Skill",
    "SkillSet",
    "load_commands",
    "load_extensions",
    "load_skills",
    "skill_tool",
]
