"""`keel trace`: look at a session's debug trace (docs/traces.md).

keel trace [SESSION] [--no-open] [--port N]   the live viewer in the browser (127.0.0.1 only)
keel trace --html [SESSION] -o FILE           one self-contained static page
keel trace stats [SESSION] [--json]           numbers about the run, in the terminal
                                              (`keel trace SESSION stats` works too)
keel trace --atif [SESSION] [-o FILE]         the session as an ATIF trajectory (JSON)

SESSION is an id or a unique prefix, as for `keel sessions` (default: this project's latest
session). The viewer, the stats and the exports are imported only for the action asked, and
none of this module is imported by `keel --version`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from keel.cli.main import ArgumentError, _Parser
from keel.errors import UserError

USAGE = (
    "usage: keel trace [SESSION] [--no-open] [--port N] | --html [SESSION] -o FILE | "
    "stats [SESSION] [--json] | SESSION stats [--json] | --atif [SESSION] [-o FILE]"
)
NO_TRACE_HINT = (
    "traces are recorded with debug mode on: run `keel -p --debug …`, type `/debug on` in the "
    "TUI, or set KEEL_DEBUG=1"
)


def trace_dir_of(session: Path) -> Path:
    """The trace folder beside a session file (`<dir>/<id>.trace/`, trace format v1)."""
    return session.with_name(f"{session.stem}.trace")


def _session(arg: str | None) -> Path:
    from keel.session.index import find_session, latest_session

    return latest_session(Path.cwd()) if arg is None else find_session(arg, Path.cwd())


def resolve_trace(arg: str | None) -> Path:
    """The trace folder of session `arg` (the latest of this project when None), or a UserError
    that says how to record one."""
    session = _session(arg)
    directory = trace_dir_of(session)
    if not (directory / "events.jsonl").is_file():
        raise UserError(f"session {session.stem} has no trace", hint=NO_TRACE_HINT)
    return directory


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="keel trace", description="Look at a session's debug trace.", epilog=USAGE)
    p.add_argument("session", nargs="?", metavar="SESSION", help="session id or unique prefix")
    p.add_argument("--no-open", action="store_true", help="print the viewer's URL, open nothing")
    p.add_argument("--port", type=int, default=0, help="the viewer's port (default: a free one)")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--html", action="store_true", help="write one static page (needs -o)")
    what.add_argument("--atif", action="store_true", help="write an ATIF trajectory (JSON)")
    p.add_argument("-o", "--output", metavar="FILE", help="where --html or --atif writes")
    return p


def trace(argv: list[str]) -> int:
    if argv and argv[0] == "stats":
        return stats(argv[1:])
    if len(argv) > 1 and argv[1] == "stats" and not argv[0].startswith("-"):
        return stats([argv[0], *argv[2:]])  # `keel trace ID stats`: the same
    args = _parser().parse_args(argv)
    if args.html:
        if not args.output:
            raise ArgumentError("--html needs -o FILE")
        from keel.trace import viewer

        out = Path(args.output)
        viewer.write_html(resolve_trace(args.session), out)
        print(f"wrote {out}", file=sys.stderr)
        return 0
    if args.atif:
        return _atif(resolve_trace(args.session), args.output)
    if args.output:
        raise ArgumentError("-o goes with --html or --atif")
    if not 0 <= args.port <= 65535:
        raise ArgumentError(f"--port must be from 0 to 65535, not {args.port}")
    directory = resolve_trace(args.session)
    from keel.trace import viewer

    viewer.serve(directory, open_browser=not args.no_open, port=args.port)
    return 0


def stats(argv: list[str]) -> int:
    p = _Parser(prog="keel trace stats", description="Numbers about a traced run.")
    p.add_argument("session", nargs="?", metavar="SESSION", help="session id or unique prefix")
    p.add_argument("--json", action="store_true", help="one JSON object")
    args = p.parse_args(argv)
    directory = resolve_trace(args.session)
    from keel.trace.stats import compute, render, to_json

    result = compute(_records(directory))
    if args.json:
        print(json.dumps(to_json(result), indent=2))
    else:
        sys.stdout.write(render(result))
    return 0


def _records(directory: Path) -> list[dict[str, Any]]:
    from keel.trace.stats import load_records

    try:
        return load_records(directory)
    except (OSError, ValueError) as exc:
        raise UserError(
            f"cannot read the trace {directory}: {exc}",
            hint="the trace is damaged; the session file itself is unaffected",
        ) from exc


def _atif(directory: Path, output: str | None) -> int:
    from keel.trace.atif import subagents, to_atif

    records = _records(directory)
    children = subagents(records)
    out = None if output is None else Path(output)
    paths = (
        {}
        if out is None
        else {c.call_id: f"{out.stem}.{_safe(c.name)}{out.suffix or '.json'}" for c in children}
    )
    try:
        trajectory = to_atif(records, subagent_paths=paths)
        children_t = {name: to_atif(records, subagent=call_id) for call_id, name in paths.items()}
    except ValueError as exc:
        raise UserError(
            f"cannot export {directory.name}: {exc}", hint="run a prompt first"
        ) from exc
    if out is None:
        json.dump(trajectory, sys.stdout, indent=2, ensure_ascii=False)
        sys.stdout.write("\n")
        return 0
    _write(out, trajectory)
    for name, child in children_t.items():
        _write(out.with_name(name), child)
    extra = f" and {len(paths)} subagent trajectories beside it" if paths else ""
    print(f"wrote {out}{extra}", file=sys.stderr)
    return 0


def _safe(label: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in label) or "subagent"


def _write(path: Path, trajectory: dict[str, Any]) -> None:
    text = json.dumps(trajectory, indent=2, ensure_ascii=False) + "\n"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror or exc}") from exc
