"""Instruction text that a file brings with it when the model reads or edits it: the
path-scoped rules whose `paths:` globs match the file (`keel.agent.rules`), and the instruction
files of the directories between those already in the context and the file's own
(Claude Code's nested CLAUDE.md; agents.md's "closest AGENTS.md to the edited file"), with the
precedence of the context's loader (`keel.agent.prompt.directory_files`).

Each file reaches the model once per context, as a `<system-note>` after the tool results of
the round that touched it: the system prompt and the tools stay as they were (DESIGN.md,
invariant 1) and the transcript only grows (invariant 2). After a compaction or in a fresh
context it is delivered again when a file brings it again.

A tool call costs a dictionary lookup for a path seen before in the context. A new path costs
one lookup per directory (what each holds is read once per context) and a test of each rule's
compiled globs (`keel.agent.rules.Matcher`). This module reads files and nothing else.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

from keel.agent.prompt import (
    InstructionReader,
    directory_files,
    git_root,
    instruction_sources,
    load_rules,
    project_chain,
    rule_dirs,
)
from keel.agent.rules import Matcher
from keel.config.intake import Intake
from keel.llm.messages import Message, ToolResult, ToolUse

#: The tools whose `path` argument names a file the model reads or edits.
TOUCHING_TOOLS = frozenset({"read", "write", "edit", "multi_edit"})


class InstructionNotes:
    """The instruction notes of one agent: what each file brings, and what was delivered in the
    current context."""

    def __init__(
        self,
        cwd: Path,
        *,
        user_dir: Path,
        home: Path,
        refuse: Callable[[Path], str | None] | None = None,
    ) -> None:
        self.cwd = Path(os.path.normpath(cwd.absolute()))
        self.user_dir = user_dir
        self.home = home
        self.refuse = refuse
        self.intake = Intake(self.cwd, user_dir=user_dir, home=home, root=git_root(self.cwd))
        self._cwd, self._root = str(self.cwd), str(self.intake.root).rstrip("/") + "/"
        #: What could not be read or followed (one line each, naming the file), to be shown.
        self.warnings: list[str] = []
        self._rules: Matcher | None = None
        self.reset("")

    def reset(self, system: str, messages: Iterable[Message] = ()) -> None:
        """A new context whose system prompt is `system`: its instruction files count as
        delivered, as do those of notes in `messages` (a resumed conversation), nothing else."""
        self._reader = InstructionReader(
            self.cwd, user_dir=self.user_dir, home=self.home, refuse=self.refuse
        )
        texts = [system, *(m.text for m in messages if m.role == "user")]
        self._reader.seen.update(p.resolve() for t in texts for p in instruction_sources(t))
        self._loaded = {d.resolve() for d in project_chain(self.cwd)}
        #: Files looked at in this context (delivered, or had nothing new), as named.
        self._offered: set[Path] = set()
        self._directories: dict[str, tuple[Path, ...]] = {}
        #: What each path the model named brings, as (the file, what it brings).
        self._brought: dict[str, tuple[Path, list[tuple[Path, str | None]]]] = {}

    def note_for(self, calls: Iterable[ToolUse], results: dict[str, ToolResult]) -> str | None:
        """The note for a finished round: what the files its successful reads and edits touched
        bring that was not delivered yet, in order; None when there is nothing new."""
        sections: list[str] = []
        for call in calls:
            result = results.get(call.id)
            path = (call.input or {}).get("path")
            if call.name not in TOUCHING_TOOLS or result is None or result.is_error:
                continue
            if not isinstance(path, str) or not path:
                continue
            brought = self._brought.get(path)
            if brought is None:
                named = os.path.normpath(os.path.join(self._cwd, os.path.expanduser(path)))
                brought = self._brought[path] = (Path(named), self.brought_by(named))
            target, files = brought
            for file, text in files:
                if file in self._offered:
                    continue
                self._offered.add(file)
                # A project's file a `read` deny rule covers stays out, as its imports would.
                refused = self.refuse and self.intake.supplied(file) and self.refuse(file.resolve())
                if refused:
                    self.warnings.append(f"{file}: not sent to the model: {refused}")
                    continue
                for read in self._reader.read(file, text, self.warnings):
                    sections.append(_section(read.path, read.imported_from, read.text, target))
        if not sections:
            return None
        return "\n\n".join(sections)

    def brought_by(self, target: str) -> list[tuple[Path, str | None]]:
        """(file, its text where it is not the file's: a rule's body) for what the file `target`
        (absolute, normalised) brings, delivered or not: instruction files from the outermost
        directory down, then rules."""
        found: list[tuple[Path, str | None]] = [
            (f, None) for f in self._directory(os.path.dirname(target))
        ]
        if self._rules is None:
            # Read once per agent; the system prompt's loader already named unusable ones.
            dirs = rule_dirs(self.cwd, user_dir=self.user_dir, home=self.home)
            self._rules = Matcher([r for d in dirs for r in load_rules(d, []) if r.patterns])
        # The globs are relative to the project root: outside it nothing matches.
        if target.startswith(self._root):
            found += [(r.path, r.text) for r in self._rules.matching(target[len(self._root) :])]
        return found

    def _directory(self, directory: str) -> tuple[Path, ...]:
        """The instruction files of `directory` and of its parents up to the first one whose
        files are in the context, outermost first; () outside the project."""
        cached = self._directories.get(directory)
        if cached is not None:
            return cached
        path = Path(directory)
        parent = os.path.dirname(directory)
        if (
            path.resolve() in self._loaded
            or not self.intake.in_project(path)
            or parent == directory
        ):
            found: tuple[Path, ...] = ()
        else:
            found = (*self._directory(parent), *directory_files(path))
        self._directories[directory] = found
        return found


def _section(path: Path, parent: Path | None, text: str, target: Path) -> str:
    source = f'source="{path}"'
    if parent is not None:
        source += f' imported-from="{parent}"'
    return f'<instructions {source} for="{target}">\n{text}\n</instructions>'


__all__ = ["TOUCHING_TOOLS", "InstructionNotes"]
