"""Prompt or command? What `keel WORD …` means when WORD is not one of keel's subcommands.

`keel sesions list` or `keel login` must not become a model request: it would be paid for, and
in a project the model may act on it. The rule (docs/interactive.md, "Prompt or command?"):

- a first word that is a command of other tools (login, update, config, help…) or close to one
  of keel's (a typo, or a prefix of three letters or more), followed by nothing or only by
  argument-like words (an action such as `list` or `show`, an id, a path, an option), is an
  unknown command: one line, exit 2, nothing sent;
- anything else is a prompt: a sentence (`keel explain this code`, `keel update the readme`),
  a quoted argument holding spaces (`keel "sesions list"`), a single word far from every command
  (`keel fix`), and every word after `--` (`keel -- login`).

This module only decides; `keel.cli.main` raises what it returns. Nothing is imported at import
time beyond the standard library.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence

from keel.errors import UserError

_KEYS = (
    "keel has no login: it reads provider keys from the environment (export "
    "ANTHROPIC_API_KEY=…, OPENAI_API_KEY=… or GEMINI_API_KEY=…); `keel doctor` shows which are set"
)
_UPDATE = (
    "keel is updated by the tool that installed it (pip install -U keel, pipx upgrade keel, "
    "uv tool upgrade keel); `keel --version` prints the version"
)
_SETTINGS = (
    "settings are JSON files (~/.config/keel/settings.json, .keel/settings.json in a project): "
    "`keel doctor` lists them and what they set"
)
_HELP = "`keel --help` lists the commands, `keel COMMAND --help` each one's options"
_RUN = 'to run a prompt: keel -p "what to do" (headless) or keel "what to do" (interactive)'

#: Commands of other tools that a user may type out of habit, with what to do instead in keel.
FOREIGN: dict[str, str] = {
    "login": _KEYS,
    "logout": _KEYS,
    "signin": _KEYS,
    "auth": _KEYS,
    "whoami": _KEYS,
    "account": _KEYS,
    "key": _KEYS,
    "keys": _KEYS,
    "update": _UPDATE,
    "upgrade": _UPDATE,
    "install": _UPDATE,
    "uninstall": _UPDATE,
    "version": _UPDATE,
    "config": _SETTINGS,
    "configure": _SETTINGS,
    "settings": _SETTINGS,
    "setup": _SETTINGS,
    "env": _SETTINGS,
    "status": "`keel doctor` shows what keel sees here, `keel sessions list` the sessions, "
    "`keel fleet status` the fleet",
    "info": "`keel doctor` shows what keel sees here",
    "help": _HELP,
    "commands": _HELP,
    "list": "`keel sessions list` lists sessions, `keel runs list` fleet runs, `keel models` models",
    "ls": "`keel sessions list` lists sessions, `keel runs list` fleet runs, `keel models` models",
    "show": "`keel sessions show ID` shows a session, `keel runs show RUN` a fleet run",
    "rm": "`keel sessions rm ID` removes a session",
    "delete": "`keel sessions rm ID` removes a session",
    "run": _RUN,
    "start": _RUN,
    "chat": _RUN,
    "ask": _RUN,
    "exec": _RUN,
    "stop": "`keel suspend ID` stops a running session at its next safe point, "
    "`keel runs cancel RUN` a fleet run",
    "kill": "`keel suspend ID` stops a running session at its next safe point, "
    "`keel runs cancel RUN` a fleet run",
    "cancel": "`keel runs cancel RUN` cancels a fleet run, `keel suspend ID` stops a session",
    "new": "`keel` opens a new session, `keel init` writes AGENTS.md for this project",
    "create": "`keel` opens a new session, `keel init` writes AGENTS.md for this project",
    "logs": "`keel sessions show ID` prints a session, `keel trace ID` its debug trace",
    "log": "`keel sessions show ID` prints a session, `keel trace ID` its debug trace",
    "history": "`keel sessions list` lists this project's sessions",
}

#: Words that read as a command's arguments rather than as English: keel's (and other tools')
#: subcommand actions. A word that is none of these, has no digit and no `/ . _ : = @ # -` is
#: taken for English, and the words for a prompt.
ACTIONS = frozenset(
    {
        "list", "ls", "show", "rm", "remove", "delete", "path", "approve", "revoke", "login",
        "logout", "up", "down", "status", "init", "index", "search", "stats", "wait", "cancel",
        "answer", "set", "get", "unset", "add", "edit", "enable", "disable", "on", "off", "all",
        "help", "version", "start", "stop", "restart", "new", "open", "info", "clear", "reset",
        "check", "allow", "deny", "json", "html", "atif", "yes", "model", "key", "token",
        "default", "global",
    }
)  # fmt: skip

_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")
_ARGUMENT = re.compile(r"[^\s]*[0-9/._:=@#-][^\s]*")

#: How alike a word must be to a subcommand to count as a typo of it (difflib's ratio:
#: `sesions`/`sessions` 0.93, `modles`/`models` 0.83; `lint`/`init` 0.75 is a prompt).
CUTOFF = 0.8


def mistyped_command(words: Sequence[str], commands: Collection[str]) -> UserError | None:
    """The error for `keel WORDS…` when it reads as a mistyped command rather than a prompt
    (`commands`: keel's subcommands); None when it is a prompt."""
    if not words or not _WORD.fullmatch(words[0]):
        return None
    if not all(_argument_like(word) for word in words[1:]):
        return None  # a sentence: a prompt
    word = words[0].lower()
    if word in FOREIGN:
        return UserError(f"unknown command '{words[0]}'", hint=FOREIGN[word])
    if words[0] in commands:
        # Only reached with -p (`keel init` itself runs the command): a command as the prompt.
        return UserError(
            f"'{words[0]}' is a keel command, not a prompt",
            hint=f"run `keel {word}`, or `keel -p -- {' '.join(words)}` to send it to the model",
        )
    close = _closest(word, commands)
    if close is None:
        return None
    return UserError(f"unknown command '{words[0]}' (did you mean '{close}'?)")


def _argument_like(word: str) -> bool:
    return (
        word.lower() in ACTIONS or word.startswith("-") or bool(_ARGUMENT.fullmatch(word))
    ) and not any(c.isspace() for c in word)


def _closest(word: str, commands: Collection[str]) -> str | None:
    import difflib

    close = difflib.get_close_matches(word, sorted(commands), n=1, cutoff=CUTOFF)
    if close:
        return close[0]
    if len(word) >= 3:
        starting = sorted(c for c in commands if c.startswith(word))
        if len(starting) == 1:
            return starting[0]
    return None


__all__ = ["ACTIONS", "CUTOFF", "FOREIGN", "mistyped_command"]
