"""`keel init`: the command line of the read-only run that writes AGENTS.md (or CLAUDE.md);
the run itself is `keel.app.init`, which the TUI's `/init` uses too."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from keel.app.init import (
    FILES,
    MAX_TURNS,
    TOKEN_BUDGET,
    Approval,
    Approver,
    InitOutcome,
    Proposal,
    init_project,
    summary,
)
from keel.cli import main as cli
from keel.cli.main import _dollars, _Parser, _whole
from keel.errors import UserError


def parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="keel init",
        description="Let the model study this project (with reading tools only) and write or "
        "update its AGENTS.md (CLAUDE.md where that is the only one): build and test commands, "
        "layout, conventions. keel shows the diff and asks before writing; without a terminal "
        "it prints the diff and writes nothing unless --yes.",
    )
    p.add_argument("-m", "--model", help="provider/model (default: as for keel -p)")
    p.add_argument("-y", "--yes", action="store_true", help="write the file without asking")
    p.add_argument(
        "--file", choices=FILES, help="which file to write (default: the one the project has)"
    )
    p.add_argument("--cwd", help="work in this directory instead of the current one")
    p.add_argument("--max-turns", type=int, help=f"model turns before stopping ({MAX_TURNS})")
    p.add_argument("--max-budget-usd", type=_dollars, help="stop once the run has cost this much")
    p.add_argument(
        "--max-tokens-budget",
        type=_whole(0, 10**12, " (0: no token budget)"),
        help=f"stop once the run has used this many tokens ({TOKEN_BUDGET}, 0 for none)",
    )
    p.add_argument(
        "--max-retries", type=_whole(0, 20, ""), default=3, help="retries of a failed request"
    )
    p.add_argument("--effort", choices=("low", "medium", "high", "max"), help="reasoning effort")
    p.add_argument(
        "--disallowed-tools",
        action="append",
        default=[],
        metavar="RULES",
        help='deny more, e.g. "bash(git log*)" (repeatable)',
    )
    p.add_argument("--no-session", action="store_true", help="do not write a session file")
    p.add_argument("-q", "--quiet", action="store_true", help="no tool activity on stderr")
    p.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    return p


def terminal_approver(stdin: Any, out: Any) -> Approver:
    """Show the diff and ask `Write NAME? [y/N]` on the terminal."""

    async def approve(proposal: Proposal) -> Approval:
        print(proposal.diff, end="", file=out, flush=True)
        question = f"Write {proposal.name}? [y/N] "
        print(question, end="", file=sys.stderr, flush=True)
        line = await asyncio.to_thread(stdin.readline)
        answer = line.strip().lower()
        return Approval(answer in ("y", "yes"), "" if answer else "no answer")

    return approve


def init(argv: list[str]) -> int:
    """`keel init`: exit 0 when the file was written or is up to date, `EXIT_NOT_WRITTEN` when
    a change was proposed but not written (declined, or no terminal and no --yes: the diff is on
    stdout), 1 when no proposal came, the run's own code when a limit stopped it."""
    from keel.app import choose_model
    from keel.cli.headless import Printer, _cwd, _settings

    args = parser().parse_args(argv)
    cwd = _cwd(args)
    settings = _settings(cwd)
    try:
        ref = choose_model(args.model, settings)
    except UserError as exc:
        # The offline demo plays a fixed conversation: it cannot write this project's AGENTS.md.
        raise UserError(
            exc.message,
            hint="keel init needs a real model: set ANTHROPIC_API_KEY, OPENAI_API_KEY or "
            "GEMINI_API_KEY, pass --model provider/model, or run a local one "
            "(--model ollama/qwen3:8b; docs/providers.md)",
        ) from exc
    printer = Printer("text", quiet=args.quiet, out=sys.stdout, err=sys.stderr)
    asking = not args.yes and sys.stdin.isatty()
    approve = terminal_approver(sys.stdin, sys.stdout) if asking else None

    outcome = asyncio.run(
        init_project(
            ref,
            cwd=cwd,
            settings=settings,
            args=args,
            printer=printer,
            approve=approve,
            yes=args.yes,
            file=args.file,
            keep_session=not args.no_session,
        )
    )
    return report(outcome)


def report(outcome: InitOutcome) -> int:
    """Print the outcome of `keel init` and return its exit code. The diff goes to stdout (what
    was written, or what was not: `git apply` takes it as it is) unless a person saw it already."""
    from keel.cli.headless import EXIT_CODES

    if outcome.diff and not outcome.unchanged and not outcome.asked:
        print(outcome.diff, end="", flush=True)
    line = summary(outcome)
    if outcome.written and outcome.session_path is not None:
        line += f" (`keel undo {outcome.session_id}` puts it back)"
    elif outcome.proposal is not None and outcome.not_written.startswith("nobody"):
        line += " (hint: `keel init --yes` writes without asking; or `git apply` the diff above)"
    elif outcome.proposal is None and outcome.result.stop_reason == "end_turn":
        line += " (hint: run keel init again, or try a more capable model)"
    print(f"keel: {'error: ' if outcome.failed else ''}{line}", file=sys.stderr, flush=True)
    if outcome.written or outcome.unchanged:
        return cli.EXIT_OK
    if outcome.proposal is not None:
        return cli.EXIT_ERROR if outcome.failed else EXIT_NOT_WRITTEN
    stop = outcome.result.stop_reason
    return cli.EXIT_ERROR if stop == "end_turn" else EXIT_CODES[stop]


EXIT_NOT_WRITTEN = cli.EXIT_NOT_WRITTEN

EXIT_NOT_WRITTEN = cli.EXIT_NOT_WRITTEN
