"""`keel bench`: run graded tasks against models and report (docs/bench.md).

keel bench --models a,b [--runs N] [--tasks t1,t2] [--mode MODE] [--keep-failed]
           [--json | --markdown] [--out DIR] [--list] [--approve | --revoke]

Tasks that came with the project (`.keel/bench/` anywhere in the project tree, tracked by git or not) run their scripts on this
machine, so they run only once approved, pinned to their content (`--approve`).

This module only parses, prints progress on stderr and writes the report; keel.bench does the
work. Exit 0 when every graded run passed, 1 when any failed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from keel.cli.main import EXIT_ERROR, EXIT_OK, ArgumentError, _Parser, _whole
from keel.errors import UserError

if TYPE_CHECKING:
    from keel.bench import RunResult, Task


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="keel bench",
        description="Run graded tasks in throwaway directories and compare models.",
    )
    p.add_argument(
        "--models",
        help="comma-separated models (provider/model); scripted:oracle plays each task's "
        "reference solution",
    )
    p.add_argument("--runs", type=_whole(1, 100, ""), default=1, help="runs per model and task")
    p.add_argument("--tasks", help="comma-separated task names (default: all)")
    p.add_argument(
        "--mode",
        choices=("default", "accept-edits", "plan", "bypass"),
        default="accept-edits",
        help="permission mode of the runs (default accept-edits: edits and sandboxed commands "
        "run, an unsandboxed command is refused; bypass also runs unsandboxed commands)",
    )
    p.add_argument(
        "--keep-failed", action="store_true", help="keep the work directory of a failed run"
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--markdown", action="store_true", help="print the report as Markdown")
    p.add_argument(
        "--out",
        type=Path,
        help="where report.json, report.md and plot.svg go (default bench-results/TIME)",
    )
    p.add_argument("--list", action="store_true", help="list the tasks and exit")
    p.add_argument(
        "--approve",
        action="store_true",
        help="approve the selected tasks that came with this project (they run their setup "
        "and grading scripts on this machine), then exit",
    )
    p.add_argument(
        "--revoke", action="store_true", help="forget this project's bench task approvals"
    )
    p.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    return p


def bench(argv: list[str]) -> int:
    from keel.bench import BenchOptions, discover, run_bench, select, write_report

    if argv and argv[0] in ("-h", "--help"):
        _parser().print_help()
        return EXIT_OK
    args = _parser().parse_args(argv)
    cwd = Path.cwd()
    if args.revoke:
        from keel.bench import revoke_tasks

        print(f"revoked {revoke_tasks(cwd)} bench task approval(s) for this project")
        return EXIT_OK
    tasks = discover(cwd)
    if args.list:
        for t in tasks:
            print(f"{t.name:24} {t.source:8} {t.description}")
        return EXIT_OK
    names = [n.strip() for n in args.tasks.split(",") if n.strip()] if args.tasks else None
    chosen = select(tasks, names)
    if _trusted(chosen, cwd, approve=args.approve):
        return EXIT_OK
    if not args.models:
        raise ArgumentError("keel bench needs --models (e.g. --models scripted:oracle)")
    if args.json and args.markdown:
        raise ArgumentError("--json and --markdown cannot be used together")
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    _check_sandbox(args.mode)
    out = args.out or cwd / "bench-results" / time.strftime("%Y%m%d-%H%M%S")
    keep_dir = out / "kept" if args.keep_failed else None
    if keep_dir is not None:
        keep_dir.mkdir(parents=True, exist_ok=True)
    report = run_bench(
        chosen,
        models,
        runs=args.runs,
        options=BenchOptions(mode=args.mode, keep_failed=args.keep_failed, keep_dir=keep_dir),
        progress=_progress,
    )
    paths = write_report(report, out)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    elif args.markdown:
        print(report.markdown(), end="")
    else:
        print(report.table(), end="")
    print(
        f"keel bench: report in {paths['json']}, {paths['markdown'].name}, {paths['plot'].name}",
        file=sys.stderr,
    )
    return EXIT_OK if report.all_passed else EXIT_ERROR


def _progress(r: RunResult) -> None:
    where = f" (kept: {r.workdir})" if r.workdir else ""
    why = f": {r.reason}" if r.reason else ""
    print(
        f"keel bench: {r.model} {r.task} #{r.run}: {r.status} in {r.wall_s:.1f}s{why}{where}",
        file=sys.stderr,
    )


def _trusted(chosen: list[Task], cwd: Path, *, approve: bool) -> bool:
    """With `approve`, approve the tasks that wait for it and say so (True: done, exit). Else
    refuse while any task that came with the project is not approved."""
    from keel.bench import approve_tasks, scripts_of, unapproved

    waiting = unapproved(chosen, cwd)
    if approve:
        for t in waiting:
            shown = ", ".join(str(p.relative_to(cwd)) for p in scripts_of(t)) or "no scripts"
            print(f"approved {t.name} ({t.directory.relative_to(cwd)}): runs {shown}")
        approve_tasks(waiting, cwd)
        if not waiting:
            print("nothing to approve: every selected task is built in, yours, or approved")
        return True
    if waiting:
        raise UserError(
            f"{len(waiting)} bench task(s) came with this project and are not approved: "
            f"{', '.join(t.name for t in waiting)} (their setup and grading scripts run on this "
            "machine, outside the sandbox)",
            hint="read them, then run `keel bench --approve`; a change needs a new approval",
        )
    return False


def _check_sandbox(mode: str) -> None:
    """Outside bypass, a run's commands run only sandboxed: without a sandbox every one would be
    refused, and the report would blame the model. Refuse up front instead."""
    if mode == "bypass":
        return
    from keel.permissions.sandbox import probe

    sandbox = probe()
    if not sandbox.ok:
        raise UserError(
            f"no sandbox here ({sandbox.detail}), so every command of a --mode {mode} "
            "run would be refused",
            hint="install bubblewrap, or pass --mode bypass to run commands unsandboxed "
            "in the throwaway directories",
        )
