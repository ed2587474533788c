"""Custom slash commands in Claude Code's format: a Markdown file is a command named after it.

This module owns finding command files, resolving their names (a file in a subfolder is namespaced:
`frontend/component.md` is `/frontend:component`), name clashes with skills and built-in commands,
and expanding a prompt `/name args…`: `$ARGUMENTS` and `$1`…`$9` as for skills (see
`keel.skills.skills.substitute`), and each `` !`cmd` `` of the file replaced by the command's
output. Files are looked for, lowest precedence first, in `~/.claude/commands`,
`<keel user config dir>/commands`, then `.claude/commands` and `.keel/commands` in each directory
from the project root down to cwd; a later file replaces an earlier one of the same name.

It must never run a `` !`cmd` `` that the caller's `allow_shell` did not approve, never treat text
that came from the user's arguments or from a command's output as a substitution, and never write
a file. `@path` references are left for the UI.
"""

from __future__ import annotations

import inspect
import os
import re
from collections.abc import Awaitable, Callable, Collection, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

from keel.agent.prompt import git_root
from keel.frozen import frozen
from keel.skills.skills import (
    Document,
    Expansion,
    SkillSet,
    Unusable,
    append_arguments,
    hint_field,
    lenient_warnings,
    markdown_files,
    parse_slash,
    read_document,
    read_text,
    search_dirs,
    split_arguments,
    substitute,
    text_field,
    tools_field,
    where,
)

if TYPE_CHECKING:
    from keel.permissions.sandbox import Sandbox

#: Seconds a `` !`cmd` `` may run.
SHELL_TIMEOUT = 30.0
#: Bytes of a `` !`cmd` ``'s output kept in the expansion.
SHELL_OUTPUT_LIMIT = 10_000
#: How deep namespaces go (`a:b:c` is depth 2); deeper folders, or symlink loops, are not read.
MAX_DEPTH = 8

#: `` !`cmd` `` on one line, the `!` not inside a word or right after a backquote (so that a
#: code span such as `` `!` `` in prose is not taken for a command).
_SHELL = re.compile(r"(?<![\w`])!`([^`\n]+)`")

#: keel's built-in slash commands (the interactive UI's): a skill or command file of one of these
#: names is skipped with a warning.
BUILTIN_COMMANDS = (
    "help", "clear", "compact", "model", "mode", "undo", "rewind", "resume", "cost",
    "context", "skills", "hooks", "mcp", "permissions", "doctor", "exit",
)  # fmt: skip

#: Whether a command line would run without asking (the caller asks its permission gate).
AllowShell: TypeAlias = Callable[[str], bool | Awaitable[bool]]


@frozen
class Command:
    name: str
    #: The template: the file without its frontmatter.
    body: str
    #: The Markdown file.
    path: Path
    description: str = ""
    argument_hint: str = ""
    #: Kept for later: the tool rules Claude Code pre-approves while the command runs.
    allowed_tools: tuple[str, ...] = ()
    #: Kept for later: the model Claude Code switches to for the command.
    model: str | None = None


class CommandSet:
    """The custom commands that apply in one directory, by name."""

    def __init__(
        self,
        commands: Iterable[Command] = (),
        *,
        root: Path,
        warnings: Iterable[str] = (),
        shadowed: Iterable[Command] = (),
    ) -> None:
        self.commands: dict[str, Command] = {c.name: c for c in commands}
        #: Where `` !`cmd` `` substitutions run: the project root.
        self.root = root
        self.warnings: list[str] = list(warnings)
        #: Commands replaced by a later file of the same name.
        self.shadowed: tuple[Command, ...] = tuple(shadowed)

    def get(self, name: str) -> Command | None:
        return self.commands.get(name)

    def all(self) -> list[Command]:
        return sorted(self.commands.values(), key=lambda c: c.name)

    async def expand(
        self,
        text: str,
        *,
        allow_shell: AllowShell,
        timeout: float = SHELL_TIMEOUT,  # noqa: ASYNC109 - a limit per substitution, not a deadline
        sandbox: Sandbox | None = None,
    ) -> Expansion | None:
        """The expansion of a prompt `/name args…` naming a command, else None.

        Each `` !`cmd` `` of the file (after argument substitution inside it) is run with
        `bash -c` in the project root (inside `sandbox` when given: pass it when `allow_shell`
        counts on the sandbox) if `allow_shell(cmd)` is true; otherwise it becomes
        `[not run: !`cmd` needs permission]`."""
        parsed = parse_slash(text)
        if parsed is None or (command := self.commands.get(parsed[0])) is None:
            return None
        name, arguments = parsed
        words = split_arguments(arguments)
        body = command.body
        parts: list[str] = []
        refused: list[str] = []
        timed_out: list[str] = []
        position = 0
        for m in _SHELL.finditer(body):
            parts.append(substitute(body[position : m.start()], arguments, words))
            line = substitute(m.group(1), arguments, words).strip()
            if not await _allowed(allow_shell, line):
                refused.append(line)
                parts.append(f"[not run: !`{line}` needs permission]")
            else:
                output, finished = await self._run(line, timeout, sandbox)
                if not finished:
                    timed_out.append(line)
                parts.append(output)
            position = m.end()
        parts.append(substitute(body[position:], arguments, words))
        expanded = append_arguments(body, "".join(parts), arguments)
        return Expansion(
            "command", name, arguments, expanded, command.path, tuple(refused), tuple(timed_out)
        )

    async def _run(self, line: str, time_limit: float, sandbox: Sandbox | None) -> tuple[str, bool]:
        """(what replaces the substitution, whether the command finished in time)."""
        from keel.tools.builtin.shell import run_command  # lazily: it loads every built-in tool

        try:
            output, code, timed_out = await run_command(
                line, cwd=str(self.root), env=os.environ, time_limit=time_limit, sandbox=sandbox
            )
        except OSError as exc:
            return f"[not run: !`{line}` could not start ({exc.strerror})]", True
        if timed_out:
            return f"[timed out: !`{line}` did not finish in {time_limit:g} s]", False
        output = output.rstrip("\n")
        data = output.encode()
        if len(data) > SHELL_OUTPUT_LIMIT:
            output = data[:SHELL_OUTPUT_LIMIT].decode("utf-8", "ignore")
            output += f"\n[output cut at {SHELL_OUTPUT_LIMIT} bytes]"
        return output + (f"\n[exit code {code}]" if code else ""), True


async def _allowed(allow_shell: AllowShell, line: str) -> bool:
    answer = allow_shell(line)
    if inspect.isawaitable(answer):
        answer = await answer
    return answer is True


def load_commands(
    cwd: Path,
    *,
    user_dir: Path | None,
    home: Path,
    skills: SkillSet | None = None,
    builtins: Collection[str] = (),
) -> CommandSet:
    """Every custom command that applies in `cwd`. A command named like a built-in command or a
    skill is dropped with a warning: built-ins win over both, and skills over commands."""
    found: dict[str, Command] = {}
    shadowed: list[Command] = []
    warnings: list[str] = []
    for root in search_dirs(cwd, user_dir=user_dir, home=home, kind="commands"):
        for path, name in markdown_files(root, warnings, max_depth=MAX_DEPTH):
            command = _read_command(path, name, warnings)
            if command is None:
                continue
            if name in found:
                shadowed.append(found.pop(name))
            found[name] = command
    for name in sorted(found):
        path = found[name].path
        if name in builtins:
            del found[name]
            warnings.append(f"{path}: command /{name} is hidden by the built-in /{name}")
        elif skills is not None and (skill := skills.get(name)) is not None:
            del found[name]
            warnings.append(f"{path}: command /{name} is hidden by the skill in {skill.path}")
    cwd = cwd.absolute()
    return CommandSet(
        found.values(), root=git_root(cwd) or cwd, warnings=warnings, shadowed=shadowed
    )


def _read_command(path: Path, name: str, warnings: list[str]) -> Command | None:
    if re.search(r"\s", name):
        warnings.append(f"{path}: a command name cannot contain spaces; skipped")
        return None
    try:
        doc = read_document(read_text(path))
        warnings += lenient_warnings(path, doc)
        return _command(path, name, doc)
    except Unusable as exc:
        warnings.append(f"{where(path, exc.line)}: {exc.message}; skipped")
        return None


def _command(path: Path, name: str, doc: Document) -> Command:
    return Command(
        name=name,
        body=doc.body,
        path=path,
        description=(text_field(doc, "description") or "").strip(),
        argument_hint=hint_field(doc),
        allowed_tools=tools_field(doc),
        model=text_field(doc, "model"),
    )
