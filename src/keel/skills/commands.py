"""Custom slash commands in Claude Code's format: a Markdown file is a command named after it.

This module owns finding command files, resolving their names (a file in a subfolder is namespaced:
`frontend/component.md` is `/frontend:component`), name clashes with skills and built-in commands,
and expanding a prompt `/name args…`: `$ARGUMENTS` and `$1`…`$9` as for skills (see
`keel.skills.skills.substitute`), and each `` !`cmd` `` of the file replaced by the command's
output. Files are looked for, lowest precedence first, in `~/.claude/commands`,
`<keel user config dir>/commands`, then `.claude/commands` and `.keel/commands` in each directory
from the project root down to cwd; a later file replaces an earlier one of the same name.

Frontmatter, as Claude Code reads it: `description`, `argument-hint`; `model` (the command's turn
uses that model: `Expansion.model`, applied by `keel.agent.command_turn`); `disallowed-tools`
(rules denied for the command's turn; the tool list itself stays as it is, for the prompt cache);
`allowed-tools` (rules allowed without asking for the command's turn, honoured only for the user's
own commands: a project's command file came with the repository and may only tighten, so there
it is ignored with a warning); `hooks` (not supported: a warning names the file). `@path` in the
body attaches that file like a prompt's `@path` (`keel.agent.mentions`), a project's command only
files inside the project, and each only if `allow_read` agrees.

It must never run a `` !`cmd` `` that the caller's `allow_shell` did not approve, never attach a
file `allow_read` refused, never treat text that came from the user's arguments or from a
command's output as a substitution or an `@path`, and never write a file.
"""

from __future__ import annotations

import inspect
import os
import re
from collections.abc import Awaitable, Callable, Collection, Iterable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypeAlias

from keel.agent.mentions import Attachment, attachment_blocks, mentions, read_mention
from keel.agent.prompt import git_root, without_code
from keel.config.intake import Intake, intake_for
from keel.errors import UserError
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

#: Frontmatter that runs a command elsewhere than in the session (OpenCode's `agent` and
#: `subtask`, Claude Code's `context: fork`): keel names it and runs the command in the session.
_SESSION_KEYS = ("agent", "subtask", "context")
#: Placeholders of a Codex custom prompt: `$$`, `$1`…`$9`, `$ARGUMENTS`, `$NAME`.
_CODEX_PLACEHOLDER = re.compile(r"\$(\$|[1-9](?!\d)|[A-Z][A-Z0-9_]*)")
_CODEX_NAME = re.compile(r"[A-Z][A-Z0-9_]*")
#: Any placeholder of a command (`keel.skills.skills.substitute`).
_ANY_PLACEHOLDER = re.compile(r"\$(ARGUMENTS|[1-9](?!\d))")

#: keel's built-in slash commands (the interactive UI's): a skill or command file of one of these
#: names is skipped with a warning.
BUILTIN_COMMANDS = (
    "help", "clear", "compact", "model", "mode", "undo", "rewind", "resume", "cost",
    "context", "skills", "hooks", "mcp", "permissions", "doctor", "exit",
)  # fmt: skip

#: Whether a command line would run without asking (the caller asks its permission gate).
AllowShell: TypeAlias = Callable[[str], bool | Awaitable[bool]]
#: Whether a file may be attached for a command's `@path` (the caller asks its permission gate).
AllowRead: TypeAlias = Callable[[Path], bool | Awaitable[bool]]


@frozen
class Command:
    name: str
    #: The template: the file without its frontmatter.
    body: str
    #: The Markdown file.
    path: Path
    description: str = ""
    argument_hint: str = ""
    #: Rules allowed without asking during the command's turn (the user's own commands only:
    #: a project's `allowed-tools` is dropped with a warning when it is loaded).
    allowed_tools: tuple[str, ...] = ()
    #: The model the command's turn uses (None: the session's).
    model: str | None = None
    #: Rules denied during the command's turn (Claude Code's `disallowed-tools`).
    disallowed_tools: tuple[str, ...] = ()
    #: From the user's own folders (`~/.claude/commands`, keel's user config), not the project's.
    user_level: bool = False
    #: `codex`: one of Codex's custom prompts (`/prompts:<name>`), expanded as Codex does
    #: (`codex_prompt`: no `` !`cmd` `` or `@path`). `opencode`: arguments given to a template
    #: without any placeholder are appended as they are (OpenCode's rule).
    dialect: Literal["claude", "codex", "opencode"] = "claude"


class CommandSet:
    """The custom commands that apply in one directory, by name."""

    def __init__(
        self,
        commands: Iterable[Command] = (),
        *,
        root: Path,
        cwd: Path | None = None,
        warnings: Iterable[str] = (),
        shadowed: Iterable[Command] = (),
    ) -> None:
        self.commands: dict[str, Command] = {c.name: c for c in commands}
        #: Where `` !`cmd` `` substitutions run: the project root.
        self.root = root
        #: What a body's `@path` is relative to (the working directory, as for a prompt).
        self.cwd = cwd or root
        self.warnings: list[str] = list(warnings)
        #: Commands replaced by a later file of the same name.
        self.shadowed: tuple[Command, ...] = tuple(shadowed)

    def get(self, name: str) -> Command | None:
        return self.commands.get(name)

    def find(self, text: str) -> Command | None:
        """The command a prompt `/name args…` names, else None."""
        parsed = parse_slash(text)
        return self.commands.get(parsed[0]) if parsed is not None else None

    def all(self) -> list[Command]:
        return sorted(self.commands.values(), key=lambda c: c.name)

    async def expand(
        self,
        text: str,
        *,
        allow_shell: AllowShell,
        timeout: float = SHELL_TIMEOUT,  # noqa: ASYNC109 - a limit per substitution, not a deadline
        sandbox: Sandbox | None = None,
        allow_read: AllowRead | None = None,
    ) -> Expansion | None:
        """The expansion of a prompt `/name args…` naming a command, else None.

        Each `` !`cmd` `` of the file (after argument substitution inside it) is run with
        `bash -c` in the project root (inside `sandbox` when given: pass it when `allow_shell`
        counts on the sandbox) if `allow_shell(cmd)` is true; otherwise it becomes
        `[not run: !`cmd` needs permission]`. Each `@path` of the file (not of the arguments)
        naming a file is attached after the text if it may be: see `_attachments`."""
        parsed = parse_slash(text)
        if parsed is None or (command := self.commands.get(parsed[0])) is None:
            return None
        name, arguments = parsed
        if command.dialect == "codex":
            text = codex_prompt(command.body, arguments)
            return Expansion("command", name, arguments, text, command.path)
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
        expanded = "".join(parts)
        if command.dialect != "opencode":
            expanded = append_arguments(body, expanded, arguments)
        elif arguments and not _ANY_PLACEHOLDER.search(body):
            expanded += f"\n\n{arguments}"
        attached, not_attached = await self._attachments(command, allow_read)
        if attached:
            expanded += "\n\n" + attachment_blocks(attached)
        return Expansion(
            "command",
            name,
            arguments,
            expanded,
            command.path,
            tuple(refused),
            tuple(timed_out),
            model=command.model,
            attached=tuple(a.path for a in attached),
            not_attached=tuple(not_attached),
        )

    async def _attachments(
        self, command: Command, allow_read: AllowRead | None
    ) -> tuple[list[Attachment], list[str]]:
        """The files the body's `@path` mentions attach (outside code spans and fences, without
        `$` placeholders), and a reason for each one not attached. A project's command attaches
        only files inside the project (symlinks resolved): a repository's file must not send the
        user's other files to the model."""
        attached: list[Attachment] = []
        refused: list[str] = []
        for written in mentions(without_code(command.body)):
            if "$" in written or (found := read_mention(written, self.cwd)) is None:
                continue
            inside = found.resolved == self.root.resolve() or self.root.resolve() in (
                found.resolved.parents
            )
            if not command.user_level and not inside:
                refused.append(
                    f"@{written}: outside the project; a project's command may not attach it"
                )
            elif allow_read is not None and not await _allowed(allow_read, found.resolved):
                refused.append(f"@{written}: reading it is not allowed")
            else:
                attached.append(found)
        return attached, refused

    async def _run(self, line: str, time_limit: float, sandbox: Sandbox | None) -> tuple[str, bool]:
        """(what replaces the substitution, whether the command finished in time)."""
        from keel.tools.base import ToolError
        from keel.tools.builtin.shell import run_command  # lazily: it loads every built-in tool

        try:
            output, code, timed_out = await run_command(
                line, cwd=str(self.root), env=os.environ, time_limit=time_limit, sandbox=sandbox
            )
        except OSError as exc:
            return f"[not run: !`{line}` could not start ({exc.strerror})]", True
        except ToolError as exc:  # the sandbox refused it (a protected path is a symlink…)
            return f"[not run: !`{line}`: {exc}]", True
        if timed_out:
            return f"[timed out: !`{line}` did not finish in {time_limit:g} s]", False
        output = output.rstrip("\n")
        data = output.encode()
        if len(data) > SHELL_OUTPUT_LIMIT:
            output = data[:SHELL_OUTPUT_LIMIT].decode("utf-8", "ignore")
            output += f"\n[output cut at {SHELL_OUTPUT_LIMIT} bytes]"
        return output + (f"\n[exit code {code}]" if code else ""), True


async def _allowed(allow: AllowShell | AllowRead, value: str | Path) -> bool:
    answer = allow(value)  # type: ignore[arg-type]
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
    user_roots = {(home / ".claude" / "commands").absolute()}
    if user_dir is not None:
        user_roots.add((user_dir / "commands").absolute())
    intake = intake_for(cwd, user_dir=user_dir, home=home)
    for carried in _foreign_commands(intake, warnings):
        found[carried.name] = carried
    for root in search_dirs(cwd, user_dir=user_dir, home=home, kind="commands"):
        # The user's own folder, unless it lies inside the project tree (then it came with it).
        user_level = root in user_roots and not intake.supplied(root)
        for path, name in markdown_files(root, warnings, max_depth=MAX_DEPTH):
            command = _read_command(path, name, warnings, user_level=user_level)
            if command is None:
                continue
            if name in found:
                shadowed.append(found.pop(name))
            found[name] = command
    found.update(_plugin_commands(cwd, user_dir, home, warnings))
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
        found.values(), root=git_root(cwd) or cwd, cwd=cwd, warnings=warnings, shadowed=shadowed
    )


def _plugin_commands(
    cwd: Path, user_dir: Path | None, home: Path, warnings: list[str]
) -> dict[str, Command]:
    """The commands of the plugins that run here (`keel.plugins`), named `/plugin:command` as
    Claude Code names them (`commands/git/push.md` is `/plugin:git:push`)."""
    import dataclasses

    from keel.plugins import plugin_components

    found: dict[str, Command] = {}
    for plugin in plugin_components(cwd, user_dir=user_dir, home=home):
        for root in plugin.commands:
            files = (
                [(root, root.stem)]
                if root.is_file()
                else markdown_files(root, warnings, max_depth=MAX_DEPTH)
            )
            for path, name in files:
                full = f"{plugin.name}:{name}"
                command = _read_command(path, full, warnings, user_level=plugin.user_level)
                if command is not None:  # `${CLAUDE_PLUGIN_ROOT}` filled in, as Claude Code does
                    found[full] = dataclasses.replace(
                        command,
                        body=plugin.expand(command.body),
                        allowed_tools=tuple(map(plugin.expand, command.allowed_tools)),
                        disallowed_tools=tuple(map(plugin.expand, command.disallowed_tools)),
                    )
    return found


def _foreign_commands(intake: Intake, warnings: list[str]) -> list[Command]:
    """Codex's custom prompts (`/prompts:<name>`) and OpenCode's commands (folders and
    `command` entries of `opencode.json`), lowest precedence first (`keel.config.foreign`)."""
    from keel.config.foreign import command_places, load_foreign, model_spec

    found: list[Command] = []
    for place in command_places(intake):
        user_level = not intake.supplied(place.folder)
        depth = MAX_DEPTH if place.nested else 0
        for path, name in markdown_files(place.folder, warnings, max_depth=depth):
            command = _read_command(path, place.prefix + name, warnings, user_level=user_level)
            if command is not None:
                found.append(replace(command, dialect=place.dialect))
    for path, name, entry in load_foreign(intake).commands:
        template = entry.get("template")
        if not isinstance(template, str) or not template.strip():
            warnings.append(f"{path}: command.{name} has no template (text); skipped")
            continue
        unused = [k for k in entry if k not in ("template", "description", "model")]
        if unused:
            warnings.append(f"{path}: command.{name}: keel does not use {', '.join(unused)}")
        description = entry.get("description")
        found.append(
            Command(
                name,
                template,
                path,
                description=description if isinstance(description, str) else "",
                model=entry.get("model") if isinstance(entry.get("model"), str) else None,
                user_level=not intake.supplied(path),
                dialect="opencode",
            )
        )
    kept: list[Command] = []
    for command in found:
        if command.model is not None and "/" in command.model:
            mapped = model_spec(command.model)
            if mapped is None:
                warnings.append(
                    f"{command.path}: /{command.name}: model {command.model!r} names a provider "
                    "keel does not have; the command uses the session's model"
                )
            command = replace(command, model=mapped)
        kept.append(command)
    return kept


def codex_prompt(body: str, arguments: str) -> str:
    """A Codex custom prompt with its arguments in place: `$1`…`$9` and `$ARGUMENTS` as for
    commands, `$NAME` from a `NAME=value` argument (those are not positional), `$$` kept."""
    named: dict[str, str] = {}
    words: list[str] = []
    for word in split_arguments(arguments):
        key, eq, given = word.partition("=")
        if eq and _CODEX_NAME.fullmatch(key):
            named[key] = given
        else:
            words.append(word)

    def value(m: re.Match[str]) -> str:
        key = m.group(1)
        if key == "$":
            return "$$"
        if key == "ARGUMENTS":
            return " ".join(words)
        if key.isdigit():
            return words[int(key) - 1] if int(key) <= len(words) else ""
        return named.get(key, m.group(0))

    return _CODEX_PLACEHOLDER.sub(value, body)


def _read_command(
    path: Path, name: str, warnings: list[str], *, user_level: bool
) -> Command | None:
    if re.search(r"\s", name):
        warnings.append(f"{path}: a command name cannot contain spaces; skipped")
        return None
    try:
        doc = read_document(read_text(path))
        warnings += lenient_warnings(path, doc)
        return _command(path, name, doc, warnings, user_level=user_level)
    except Unusable as exc:
        warnings.append(f"{where(path, exc.line)}: {exc.message}; skipped")
        return None


def _command(
    path: Path, name: str, doc: Document, warnings: list[str], *, user_level: bool
) -> Command:
    if "hooks" in doc.meta:
        warnings.append(
            f"{where(path, doc.key_lines.get('hooks'))}: `hooks` in a command's frontmatter is "
            f"not supported by keel; /{name} runs without them"
        )
    for key in _SESSION_KEYS:
        if key in doc.meta:
            warnings.append(
                f"{where(path, doc.key_lines.get(key))}: `{key}` in a command's frontmatter is "
                f"not used by keel; /{name} runs in the session"
            )
    # A deny rule keel cannot read makes the command unusable: running it without the limit
    # would allow what the file meant to stop.
    denied = tools_field(doc, "disallowed-tools")
    _check_rules(doc, "disallowed-tools", denied, fatal=True)
    allowed = tools_field(doc)
    if allowed and not user_level:
        warnings.append(
            f"{where(path, doc.key_lines.get('allowed-tools'))}: `allowed-tools` of a project's "
            f"command is not honoured (a file that came with the repository may not widen "
            f"permissions); /{name} asks as usual. Put it in ~/.claude/commands to pre-approve"
        )
        allowed = ()
    allowed = tuple(
        r for r in allowed if _check_rules(doc, "allowed-tools", (r,), warnings=warnings, path=path)
    )
    return Command(
        name=name,
        body=doc.body,
        path=path,
        description=(text_field(doc, "description") or "").strip(),
        argument_hint=hint_field(doc),
        allowed_tools=allowed,
        model=(text_field(doc, "model") or "").strip() or None,
        disallowed_tools=denied,
        user_level=user_level,
    )


def _check_rules(
    doc: Document,
    key: str,
    rules: Iterable[str],
    *,
    fatal: bool = False,
    warnings: list[str] | None = None,
    path: Path | None = None,
) -> bool:
    """Whether every rule parses as a permission rule. One that does not raises `Unusable` when
    `fatal`, else is reported in `warnings` (it is then dropped)."""
    from keel.permissions.rules import parse_rule

    for rule in rules:
        try:
            parse_rule(rule, "deny" if fatal else "allow")
        except UserError:
            message = f"`{key}` has {rule!r}, which is not a permission rule"
            if fatal:
                raise Unusable(message, doc.key_lines.get(key)) from None
            if warnings is not None and path is not None:
                warnings.append(f"{where(path, doc.key_lines.get(key))}: {message}; dropped")
            return False
    return True
