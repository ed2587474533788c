"""What a front end asks for when it builds an agent: the command line's flags, or a server's
request body, as one value (`Options`), and the limits that follow from it and the settings."""

from __future__ import annotations

import argparse
from dataclasses import field
from pathlib import Path
from typing import Any

from keel.agent.limits import DEFAULT_MAX_TURNS, DEFAULT_UNATTENDED_TOKENS, Limits
from keel.config.settings import Settings
from keel.errors import UserError
from keel.frozen import mutable


@mutable
class Options:
    """How to build an agent. None means "what the settings say, else keel's default"."""

    cwd: Path
    model: str | None = None
    effort: str | None = None
    #: Permission mode: default | accept-edits | plan | bypass | auto (None: the settings' default).
    mode: str | None = None
    allowed_tools: list[str] = field(default_factory=list)
    disallowed_tools: list[str] = field(default_factory=list)
    max_turns: int | None = None
    max_tokens_budget: int | None = None
    max_budget_usd: float | None = None
    #: Subagents one prompt may start (`--max-subagents`; None: the settings', else keel's).
    max_subagents: int | None = None
    max_retries: int = 3
    #: Someone can answer questions: they become events (`Agent.answer`), and model calls get
    #: the longer deadline of a watched run. False: what would ask is refused, as `keel -p`.
    interactive: bool = False
    no_session: bool = False
    #: Trace the run (`--debug`, `KEEL_DEBUG=1`, the `debug` setting also turn it on).
    debug: bool = False
    #: Resume despite a changed configuration (`--force`).
    force: bool = False
    #: Calls of unknown outcome to run again / to skip when resuming.
    rerun: list[str] = field(default_factory=list)
    skip: list[str] = field(default_factory=list)

    @classmethod
    def from_args(cls, args: argparse.Namespace, *, cwd: Path) -> Options:
        """The options of a command line (`keel`, `keel -p`, `keel resume`)."""

        def get(name: str, default: Any = None) -> Any:
            value = getattr(args, name, default)
            return default if value is None else value

        return cls(
            cwd=cwd,
            model=get("model"),
            effort=get("effort"),
            mode=get("mode"),
            allowed_tools=list(get("allowed_tools", [])),
            disallowed_tools=list(get("disallowed_tools", [])),
            max_turns=get("max_turns"),
            max_tokens_budget=get("max_tokens_budget"),
            max_budget_usd=get("max_budget_usd"),
            max_subagents=get("max_subagents"),
            max_retries=get("max_retries", 3),
            interactive=not get("headless", True),
            no_session=bool(get("no_session", False)),
            debug=bool(get("debug", False)),
            force=bool(get("force", False)),
            rerun=list(get("rerun", [])),
            skip=list(get("skip", [])),
        )

    def check(self) -> None:
        if self.max_retries < 0:
            raise UserError("--max-retries must be 0 or more")


def first(*values: Any) -> Any:
    """The first value that was given (0 counts as given, so it can be refused)."""
    return next((v for v in values if v is not None), None)


def token_budget(*values: int | None) -> int | None:
    """The first token budget given (flag, setting, default); 0 means none."""
    given = first(*values)
    return None if given == 0 else given


def fresh_limits(options: Options, settings: Settings) -> Limits:
    """A new run's limits: flags, then settings, then defaults. Nobody watches a run that cannot
    ask: it has a token budget unless told otherwise."""
    return Limits(
        max_turns=first(options.max_turns, settings.max_turns, DEFAULT_MAX_TURNS),
        max_tokens=token_budget(
            options.max_tokens_budget,
            settings.budget_tokens,
            None if options.interactive else DEFAULT_UNATTENDED_TOKENS,
        ),
        max_usd=first(options.max_budget_usd, settings.budget_usd),
        **min_output(settings),
    )


def min_output(settings: Settings) -> dict[str, int]:
    """`budget.min_output_tokens` as a `Limits` keyword (none: keel's default)."""
    floor = settings.budget_min_output_tokens
    return {} if floor is None else {"min_output_tokens": floor}
