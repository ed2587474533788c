"""`keel replay SESSION [--until N] [--json] [--recorded-results | --run-tools] [--against REF]`:
re-drive a recorded session through the real loop, offline, in a scratch copy of its workspace,
and say whether every request keel builds now is the recorded one (docs/replay.md). Exit 0:
identical, 1: diverged, 2: the replay could not run."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from keel.cli.main import ArgumentError, _Parser
from keel.errors import KeelError

EXIT_IDENTICAL, EXIT_DIVERGED, EXIT_FAILED = 0, 1, 2


def parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="keel replay",
        description="Re-drive a recorded session offline and report the first request that "
        "keel now builds differently (system prompt, tools, messages), with a diff.",
    )
    p.add_argument("session", metavar="SESSION", help="session id, a unique prefix, or a file")
    p.add_argument("--until", type=int, metavar="N", help="compare only the first N requests")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    tools = p.add_mutually_exclusive_group()
    tools.add_argument(
        "--recorded-results",
        action="store_true",
        help="answer each tool call with its recorded result instead of running it",
    )
    tools.add_argument(
        "--run-tools",
        action="store_true",
        help="run the tools for real in the scratch copy (the default when the session's "
        "starting state can be rebuilt)",
    )
    p.add_argument(
        "--against",
        metavar="REF",
        help="git ref the session ran at, to rebuild the recorded system prompt and tools "
        "when they differ (default HEAD)",
    )
    p.add_argument(
        "--mode",
        help="permission mode for the replayed run (default accept-edits; bypass only with "
        "--recorded-results)",
    )
    p.add_argument(
        "--live",
        action="store_true",
        help="send the recorded prompts (not the replies) to --model in a scratch copy and "
        "report both sessions side by side",
    )
    p.add_argument("--model", metavar="PROVIDER/MODEL", help="the model for --live")
    p.add_argument("--keep", metavar="DIR", help="keep the scratch workspace and journal in DIR")
    p.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    return p


def _path(session: str) -> Path:
    from keel.session.index import find_session

    as_file = Path(session)
    if session.endswith(".jsonl") and as_file.is_file():
        return as_file
    return find_session(session, Path.cwd())


def replay(argv: list[str]) -> int:
    from keel.replay.run import ToolsMode
    from keel.replay.run import replay as run_replay

    try:
        args = parser().parse_args(argv)
    except ArgumentError as exc:
        print(f"keel: error: {exc} (hint: run `keel replay --help`)", file=sys.stderr)
        return EXIT_FAILED
    if args.live:
        return _live(args)
    if args.model:
        print(
            "keel: error: --model is for --live (hint: keel replay ID --live --model M)",
            file=sys.stderr,
        )
        return EXIT_FAILED
    if args.until is not None and args.until < 1:
        print("keel: error: --until must be 1 or more", file=sys.stderr)
        return EXIT_FAILED
    tools: ToolsMode = "recorded" if args.recorded_results else "run" if args.run_tools else "auto"
    keep = Path(args.keep) if args.keep else None
    report = _report(
        args,
        lambda: run_replay(
            _path(args.session),
            until=args.until,
            tools=tools,
            against=args.against,
            mode=args.mode,
            keep=keep,
        ),
        render,
    )
    if report is None:
        return EXIT_FAILED
    return EXIT_IDENTICAL if report.identical else EXIT_DIVERGED


def _live(args: argparse.Namespace) -> int:
    from keel.replay.run import live

    if not args.model:
        print("keel: error: --live needs --model PROVIDER/MODEL", file=sys.stderr)
        return EXIT_FAILED
    if args.recorded_results or args.run_tools or args.until or args.against:
        print(
            "keel: error: --live takes no --recorded-results, --run-tools, --until or --against "
            "(hint: the live model's own tool calls run in the scratch copy)",
            file=sys.stderr,
        )
        return EXIT_FAILED
    keep = Path(args.keep) if args.keep else None
    report = _report(
        args, lambda: live(_path(args.session), args.model, mode=args.mode, keep=keep), render_live
    )
    return EXIT_FAILED if report is None else EXIT_IDENTICAL


def _report(
    args: argparse.Namespace,
    work: Callable[[], Coroutine[Any, Any, Any]],
    show: Callable[[Any], str],
) -> Any:
    """Run `work` and print its report (`--json`, or `show`); None after a one-line error
    (`--debug`: the traceback)."""
    try:
        report = asyncio.run(work())
    except (KeelError, OSError) as exc:
        if args.debug:
            raise
        line = exc.one_line() if isinstance(exc, KeelError) else f"{type(exc).__name__}: {exc}"
        print(f"keel: error: {line}", file=sys.stderr)
        return None
    print(json.dumps(report.to_json(), indent=2) if args.json else show(report))
    return report


def render_live(report: object) -> str:
    from keel.replay.run import LiveReport, SessionStats

    assert isinstance(report, LiveReport)

    def row(name: str, get: Callable[[SessionStats], str]) -> str:
        return f"{name:<16}{get(report.recorded):<32}{get(report.live)}"

    lines = [
        f"session {report.session}: recorded vs live",
        row("model", lambda s: s.model),
        row("turns", lambda s: str(s.turns)),
        row("tokens in/out", lambda s: f"{s.input}/{s.output}"),
        row("cache read/write", lambda s: f"{s.cache_read}/{s.cache_write}"),
        row("cost", lambda s: f"${s.cost:.4f}"),
        row("time", lambda s: f"{s.seconds:.1f}s"),
        row("stop", lambda s: s.stop or "-"),
        row("files changed", lambda s: ", ".join(s.files_changed) or "-"),
    ]
    if report.final_diff:
        lines += ["final workspace, recorded -> live:", report.final_diff]
    else:
        lines.append("final workspace: the same")
    lines.extend(f"note: {n}" for n in report.notes)
    return "\n".join(lines)


def render(report: object) -> str:
    from keel.replay.run import ReplayReport

    assert isinstance(report, ReplayReport)
    lines = [f"session {report.session}: {report.requests_recorded} recorded request(s)"]
    lines.append(f"tools: {report.tools} ({report.tools_why})")
    for setting in report.settings:
        lines.append(f"setting changed: {setting}")
    d = report.divergence
    if d is None and not report.identical:
        lines.append("diverged: every request matched, but the journals differ")
    elif d is None:
        upto = f" (first {report.until})" if report.until else ""
        lines.append(f"identical: {report.requests_replayed} request(s) match{upto}")
        if not report.until:
            lines.append(f"journal hash {report.replay_journal_hash[:16]} (normalised) matches")
    else:
        lines.append(f"diverged at request {d.request}: {d.summary}")
        if d.changed:
            lines.append("changed: " + ", ".join(d.changed))
        if d.diff:
            lines.append(d.diff)
    lines.extend(f"note: {n}" for n in report.notes)
    return "\n".join(lines)
