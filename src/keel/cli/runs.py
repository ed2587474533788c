"""`keel submit`, `keel worker` and `keel runs`: queued runs on the fleet (docs/fleet.md).

Every command finds the fleet's NATS server through `--nats`, `KEEL_NATS_URL` or the local fleet
(`keel fleet up`). `--json` prints one JSON document for scripts. `submit` needs `--workspace`
(`none` for an empty directory), and against a server on this machine's loopback (so its workers
run here) refuses what they would: a workspace that is missing or outside the roots, no model.
A RUN argument is an id or a unique prefix.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from keel.cli.main import _Parser, _whole
from keel.cli.schedules import add_schedule_options, planned
from keel.errors import UserError
from keel.fleet.connect import is_loopback, resolve_url

if TYPE_CHECKING:
    from keel.fleet.workspace import WorkspaceSpec


#: Runs `keel runs list` shows a page (`--limit`, `--all`).
LIST_LIMIT = 50


def _seconds(text: str) -> float:
    import math

    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds")
    return value


def _money(text: str) -> float:
    import math

    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive amount of dollars")
    return value


def _with(
    fn: Callable[[Any, argparse.Namespace], Awaitable[int]],
    args: argparse.Namespace,
    url: str = "",
) -> int:
    from keel.fleet.runs import Fleet

    async def go() -> int:
        fleet = await Fleet.open(url or resolve_url(given=args.nats or ""))
        try:
            return await fn(fleet, args)
        finally:
            await fleet.close()

    return asyncio.run(go())


# -- keel submit ----------------------------------------------------------------------------------


def submit_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="keel submit",
        description="Queue a run for the fleet's workers; prints its id (docs/fleet.md). The "
        "request names a model, never a key: workers use their own settings and environment.",
    )
    p.add_argument("prompt", nargs="+", help="what the run should do")
    p.add_argument("--model", help="the model (default: the worker's settings)")
    p.add_argument("--mode", help="permission mode: default, accept-edits, plan, bypass")
    p.add_argument(
        "--workspace",
        metavar="W",
        help="where the run's files are (required): git:URL[#REF], path:/shared/dir, or none "
        "(an empty scratch directory)",
    )
    p.add_argument("--max-turns", type=_whole(1, 100_000, " turns"))
    p.add_argument("--max-tokens-budget", type=_whole(0, 10**12, " tokens"))
    p.add_argument("--max-budget-usd", type=_money)
    p.add_argument(
        "--max-attempts",
        type=_whole(1, 100, ""),
        metavar="N",
        help="end the run failed after N attempts in a row lost without progress (workers that "
        "died running it) or N workers that cannot serve it (default: the worker's "
        "KEEL_FLEET_MAX_ATTEMPTS, else 3)",
    )
    p.add_argument(
        "--notify",
        metavar="URL",
        help="POST the run's events (it parked, it ended) as JSON to this http(s) URL",
    )
    p.add_argument(
        "--priority",
        choices=["high", "normal", "low"],
        default="normal",
        help="workers take higher priorities first (default: normal)",
    )
    p.add_argument(
        "--needs",
        metavar="LABELS",
        default="",
        help="worker labels the run needs, comma-separated (gpu,python): only a worker started "
        "with all of them (keel worker --labels) takes it",
    )
    add_schedule_options(p)  # --at, --every, --tz (keel/cli/schedules.py)
    p.add_argument("--wait", action="store_true", help="wait for the run to end; print its answer")
    p.add_argument(
        "--no-check",
        action="store_true",
        help="queue the run even when no live worker can serve it (its model's provider, its "
        "workspace's root, its labels): for workers that are not up yet",
    )
    p.add_argument("--json", action="store_true")
    p.add_argument("--nats", metavar="URL", help="the fleet's NATS server (default: KEEL_NATS_URL)")
    p.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    return p


def submit(argv: list[str]) -> int:
    from keel.fleet.queues import parse_labels
    from keel.fleet.runs import RunRequest
    from keel.fleet.workspace import parse_workspace
    from keel.permissions.gate import parse_mode
    from keel.session.store import new_session_id

    args = submit_parser().parse_args(argv)
    scheduled = planned(args)  # --at/--every: a schedule is stored instead of a run queued
    if args.mode:
        parse_mode(args.mode)  # refused here, not on a worker later
    if args.notify:
        from keel.fleet.view import check_notify_url

        check_notify_url(args.notify)
    if args.model:
        from keel.llm.catalog import parse_model

        parse_model(args.model)
    if args.workspace is None:
        raise UserError(
            "keel submit needs --workspace: where the run's files are",
            hint="--workspace git:URL[#REF] (a repository the workers clone), path:/shared/dir "
            "(a directory every worker mounts), or none (an empty scratch directory)",
        )
    spec = parse_workspace(args.workspace)
    needs = parse_labels(args.needs, what="need")
    url = resolve_url(given=args.nats or "")
    if is_loopback(url):  # the workers run on this machine: check what they will
        for warning in _check_here(spec, args.model):
            print(f"keel: warning: {warning}", file=sys.stderr)
    req = RunRequest(
        run=new_session_id(),
        prompt=" ".join(args.prompt),
        model=args.model,
        mode=args.mode,
        workspace=spec.to_dict(),
        max_turns=args.max_turns,
        max_tokens_budget=args.max_tokens_budget,
        max_budget_usd=args.max_budget_usd,
        max_attempts=args.max_attempts,
        notify=args.notify or None,
        priority=args.priority,
        needs=needs,
    )

    async def go(fleet: Any, args: argparse.Namespace) -> int:
        from keel.fleet.checks import check_request

        if not args.no_check:
            for warning in await check_request(fleet, req):
                print(f"keel: warning: {warning}", file=sys.stderr)
        if scheduled is not None:
            return await scheduled.store(fleet, req, as_json=args.json)
        summary = await fleet.submit(req)
        if not args.wait:
            print(json.dumps(summary) if args.json else req.run)
            return 0
        (done,) = await fleet.wait([req.run], None)
        return _print_result(done, args.json)

    return _with(go, args, url)


def _check_here(spec: WorkspaceSpec, model: str | None) -> list[str]:
    """What a worker of a local fleet would refuse, refused now (a `UserError`), and the
    warnings for what depends on the workers' own environment."""
    from keel.fleet.workspace import check_here

    warnings = check_here(spec)
    if not model:
        from keel.app import choose_model
        from keel.config.settings import load_settings

        try:
            choose_model(None, load_settings(Path.cwd()))
        except UserError:
            raise UserError(
                "keel submit needs --model here: the fleet is on this machine, and its settings "
                "and environment choose no model for a worker",
                hint="--model provider/model (e.g. anthropic/claude-sonnet-4-5), or "
                "--model scripted:demo to try the fleet offline",
            ) from None
    return warnings


def _print_result(summary: dict[str, Any], as_json: bool) -> int:
    if as_json:
        print(json.dumps(summary))
    elif summary.get("status") == "completed":
        print(summary.get("text", ""))
    else:
        print(f"run {summary.get('id')}: {_status(summary)}", file=sys.stderr)
    return 0 if summary.get("status") == "completed" else 1


# -- keel worker ----------------------------------------------------------------------------------


def worker_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="keel worker",
        description="Run queued runs until SIGTERM or SIGINT (then each run suspends at its loop "
        "boundary and goes back to the queue). Keys and base URLs come from this worker's own "
        "settings and environment. KEEL_FLEET_MAX_FILE, KEEL_FLEET_MAX_ROUND and "
        "KEEL_FLEET_MAX_RUN bound what a run saves to a git workspace (default 10M, 50M, 200M; "
        "off for none).",
    )
    p.add_argument("--concurrency", type=_whole(1, 256, ""), default=1, help="runs at once")
    p.add_argument("--scratch", help="where workspaces live (default: KEEL_HOME/fleet/work)")
    p.add_argument("--name", help="this worker's name in claims and summaries")
    p.add_argument(
        "--labels",
        metavar="LABELS",
        default="",
        help="what this worker offers, comma-separated (python,gpu): it takes a run only when "
        "it has every label the run needs (keel submit --needs)",
    )
    p.add_argument("--nats", metavar="URL", help="the fleet's NATS server (default: KEEL_NATS_URL)")
    p.add_argument("--debug", action="store_true", help="tracebacks for errors")
    return p


def worker(argv: list[str]) -> int:
    from keel.fleet.queues import parse_labels
    from keel.fleet.worker import run_worker
    from keel.fleet.workspace import WorkspaceLimits

    args = worker_parser().parse_args(argv)
    labels = parse_labels(args.labels)
    # A bad KEEL_FLEET_MAX_* is one line now, not a refusal of every git run later.
    limits = WorkspaceLimits.from_env()

    def say(line: str) -> None:
        print(f"keel worker: {line}", file=sys.stderr, flush=True)

    say(limits.describe())
    return run_worker(
        resolve_url(given=args.nats or ""),
        concurrency=args.concurrency,
        scratch=Path(args.scratch).expanduser().resolve() if args.scratch else None,
        name=args.name or "",
        say=say,
        labels=labels,
    )


# -- keel workers ---------------------------------------------------------------------------------


def workers_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="keel workers",
        description="The fleet's workers, from their heartbeats in the keel-workers bucket: what "
        "each runs, its labels, its last heartbeat. A worker without a heartbeat for "
        "a few seconds is marked silent (dead, stopped or cut off); its entry goes after a minute.",
    )
    p.add_argument("--json", action="store_true")
    p.add_argument("--nats", metavar="URL", help="the fleet's NATS server (default: KEEL_NATS_URL)")
    p.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    return p


def workers(argv: list[str]) -> int:
    from keel.fleet.registry import read_workers

    args = workers_parser().parse_args(argv)

    async def go(fleet: Any, args: argparse.Namespace) -> int:
        found = await read_workers(fleet)
        print(json.dumps(found) if args.json else _workers_table(found))
        return 0

    return _with(go, args)


def _workers_table(found: list[dict[str, Any]]) -> str:
    from keel.fleet.registry import ago

    if not found:
        return "no workers (none has sent a heartbeat in the last minute)"
    rows = []
    for w in found:
        running = [str(r) for r in w.get("running") or []]
        state = "silent" if w.get("silent") else "stopping" if w.get("stopping") else "live"
        rows.append(
            (
                str(w.get("name", "")),
                state,
                ago(float(w.get("age") or 0.0)),
                f"{len(running)}/{w.get('concurrency', '?')}",
                ",".join(str(x) for x in w.get("labels") or []) or "-",
                " ".join(running) or "-",
            )
        )
    head = ("WORKER", "STATE", "HEARTBEAT", "BUSY", "LABELS", "RUNS")
    widths = [max(len(r[i]) for r in (head, *rows)) for i in range(5)]
    return "\n".join(
        "  ".join(f"{r[i]:<{widths[i]}}" for i in range(5)) + f"  {r[5]}" for r in (head, *rows)
    )


# -- keel runs ------------------------------------------------------------------------------------


def runs_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="keel runs", description="The fleet's runs (docs/fleet.md).")
    p.add_argument("--nats", metavar="URL", help="the fleet's NATS server (default: KEEL_NATS_URL)")
    p.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    ls = sub.add_parser(
        "list",
        help="the runs, newest first: status, what it waits on, turns, cost, why",
        description="The runs, newest first, a page at a time (the footer says how many more). "
        "--watch then prints one line per status change as it happens, until Ctrl-C.",
    )
    ls.add_argument(
        "--status",
        action="append",
        default=[],
        metavar="S",
        help="only runs with this status (repeat it, or a comma list); active = queued, "
        "running, parked",
    )
    ls.add_argument(
        "--limit",
        type=_whole(1, 1_000_000, " runs"),
        default=LIST_LIMIT,
        metavar="N",
        help=f"runs a page (default {LIST_LIMIT})",
    )
    ls.add_argument("--all", action="store_true", help="every matching run (no paging)")
    ls.add_argument(
        "--page",
        type=_whole(1, 10**9, ""),
        default=1,
        metavar="K",
        help="the K-th page (1: newest)",
    )
    ls.add_argument("--after", metavar="RUN", help="the page after this run (older runs)")
    ls.add_argument(
        "--watch", action="store_true", help="then print each status change as it happens"
    )
    ls.add_argument(
        "--timeout", type=_seconds, metavar="S", help="with --watch: stop after S seconds"
    )
    ls.add_argument(
        "--json",
        action="store_true",
        help="the page as a JSON array; with --watch, one JSON object per change instead",
    )
    show = sub.add_parser("show", help="one run's summary")
    show.add_argument("run", help="a run id or a unique prefix (as for every RUN here)")
    show.add_argument("--json", action="store_true")
    wait = sub.add_parser("wait", help="wait until runs end (or park)")
    wait.add_argument("run", nargs="*")
    wait.add_argument("--all", action="store_true", help="until the queue is drained")
    wait.add_argument("--timeout", type=float, help="give up after this many seconds")
    wait.add_argument("--json", action="store_true")
    cancel = sub.add_parser("cancel", help="stop a run at its next loop boundary")
    cancel.add_argument("run")
    retry = sub.add_parser(
        "retry",
        help="queue a failed run again: a worker resumes it from its journal",
        description="Queue a run that ended failed (its attempt limit, no worker could serve it) "
        "or error again. Its lost and refused counts start over; its attempt log stays.",
    )
    retry.add_argument("run")
    answer = sub.add_parser("answer", help="answer what a parked run waits for")
    answer.add_argument("run")
    answer.add_argument("request", help="the request id `keel runs show` names")
    answer.add_argument("reply", nargs="?", choices=["allow", "deny"], help="for a question")
    answer.add_argument("--reason", default="", help="why (the model reads it on a denial)")
    answer.add_argument("--result", help="for a tool that answers later: its result")
    answer.add_argument("--error", action="store_true", help="the result is an error")
    return p


def _status(s: dict[str, Any]) -> str:
    status = str(s.get("status", "?"))
    waits = s.get("waits_on") or {}
    if status == "parked" and waits:
        return f"parked: waits for {waits.get('waits_for')} on {waits.get('tool')} ({waits.get('request')})"
    if s.get("error"):
        return f"{status}: {str(s['error']).splitlines()[0][:100]}"
    return status


def _show(summary: dict[str, Any]) -> str:
    """`keel runs show`: one line per field, the attempts as a count and one line each."""
    lines = []
    for key, value in summary.items():
        if key in ("attempt_log", "lost_in_a_row"):
            continue
        if key == "attempts":
            lost = int(summary.get("lost") or 0)
            value = f"{value}" + (f" ({lost} lost)" if lost else "")
        lines.append(f"{key}: {json.dumps(value) if isinstance(value, dict | list) else value}")
    for n, entry in enumerate(summary.get("attempt_log") or [], 1):
        if not isinstance(entry, dict):
            continue
        how = entry.get("ended") or "running"
        if how == "lost" and entry.get("progress"):
            how = "lost after some progress"
        why = f": {entry['reason']}" if entry.get("reason") else ""
        lines.append(
            f"  attempt {n}: {entry.get('worker')} from {entry.get('started')}, {how}{why}"
        )
    return "\n".join(lines)


def _table(summaries: list[dict[str, Any]]) -> str:
    import shutil

    from keel.fleet.view import table

    width = shutil.get_terminal_size((80, 24)).columns if sys.stdout.isatty() else 80
    return table(summaries, width)


async def _list(fleet: Any, args: argparse.Namespace) -> int:
    """`keel runs list`: one page of the runs; with --watch, then each change as it happens."""
    from keel.fleet.view import SummaryWatch, change, change_line, footer, parse_statuses, select

    if args.timeout is not None and not args.watch:
        raise UserError("--timeout goes with --watch", hint="keel runs list --watch --timeout S")
    statuses = parse_statuses(args.status)
    watch = SummaryWatch(await fleet.kv())
    try:
        page = select(
            await watch.start(),
            statuses=statuses,
            limit=None if args.all else args.limit,
            page=args.page,
            after=args.after,
        )
        if args.json and not args.watch:
            print(json.dumps(page.runs))
        elif not args.json:
            print(_table(page.runs))
            if page.total and (page.more or page.skipped):
                print(footer(page))
        if not args.watch:
            return 0
        deadline = None if args.timeout is None else time.monotonic() + args.timeout
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return 0
            try:
                async with asyncio.timeout(left):
                    before, after = await watch.next()
            except TimeoutError:
                return 0
            item = change(before, after)
            if item is None or (statuses is not None and item["status"] not in statuses):
                continue
            print(json.dumps({**item, "summary": after}) if args.json else change_line(item))
            sys.stdout.flush()
    finally:
        await watch.stop()


def runs(argv: list[str]) -> int:
    args = runs_parser().parse_args(argv)

    async def go(fleet: Any, args: argparse.Namespace) -> int:
        if args.command == "list":
            return await _list(fleet, args)
        if args.command in ("show", "cancel", "answer", "retry"):
            args.run = await fleet.resolve(args.run)
        if args.command == "show":
            summary = await fleet.summary(args.run)
            if summary is None:
                raise UserError(f"no run {args.run!r}", hint="`keel runs list` shows the runs")
            if args.json:
                print(json.dumps(summary))
            else:
                print(_show(summary))
            return 0
        if args.command == "retry":
            await fleet.retry(args.run)
            print(f"run {args.run}: queued again; a worker resumes it from its journal")
            return 0
        if args.command == "wait":
            if not args.run and not args.all:
                raise UserError("keel runs wait needs run ids or --all")
            done = await fleet.wait([await fleet.resolve(r) for r in args.run], args.timeout)
            if args.json:
                print(json.dumps(done))
            else:
                print(_table(done))
            return 0 if all(s.get("status") == "completed" for s in done) else 1
        if args.command == "cancel":
            summary = await fleet.cancel(args.run)
            from keel.fleet.runs import ACTIVE

            over = summary.get("status") not in ACTIVE
            print(f"run {args.run}: {_status(summary) if over else 'cancel requested'}")
            return 0
        allow = None if args.reply is None else args.reply == "allow"
        await fleet.answer(
            args.run, args.request, allow, args.reason, result=args.result, is_error=args.error
        )
        what = args.reply or ("an error" if args.error else "a result")
        print(f"run {args.run}: answered {args.request} ({what}); queued to go on")
        return 0

    try:
        return _with(go, args)
    except KeyboardInterrupt:
        if args.command == "list" and args.watch:
            return 0  # Ctrl-C is how a watch ends
        raise
