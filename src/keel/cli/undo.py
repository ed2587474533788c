"""`keel undo SESSION [--list] [N]`: put back the files a stopped session's last prompt(s) changed,
for sessions run from any front end (`keel -p`, the library, the TUI). The checkpoints live beside
the session file; the undo is recorded in the session, and the model is told with the session's
next prompt. The session must not be running (its lock is taken, like `keel resume`)."""

from __future__ import annotations

import argparse
from datetime import UTC
from pathlib import Path
from typing import TYPE_CHECKING

from keel.cli.main import _Parser
from keel.errors import UserError

if TYPE_CHECKING:
    from keel.checkpoints import UndoSummary, UnitInfo


def parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="keel undo",
        description="Put back the files changed by a session's last prompt that changed files "
        "(N: that many prompts, newest first). The session must not be running.",
    )
    p.add_argument("session", metavar="ID", help="session id or a unique prefix")
    p.add_argument("count", nargs="?", default="1", metavar="N", help="how many prompts (1)")
    p.add_argument("--list", action="store_true", help="list what can be undone, newest first")
    return p


def _count(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 1000:
        raise UserError(f"N must be a whole number from 1 to 1000, not {text!r}")
    return int(text)


def undo(argv: list[str]) -> int:
    from keel.checkpoints import Checkpoints, NothingToUndo, undo_last
    from keel.session.fold import FoldError, fold
    from keel.session.index import find_session
    from keel.session.journal import Journal
    from keel.session.store import SessionLog

    args = parser().parse_args(argv)
    count = _count(args.count)
    path = find_session(args.session, Path.cwd())
    journal, loaded = Journal.open(path)  # locks: not while the session runs
    try:
        try:
            meta = fold(loaded.records).meta
        except FoldError as exc:
            raise UserError(f"{path}: {exc}", hint="the file was left untouched") from exc
        cwd = Path(meta.cwd)
        store = Checkpoints.for_session(path)
        units = store.units()
        if args.list:
            _print_units(units, cwd)
            return 0
        if not units:
            raise UserError(
                f"nothing to undo in session {meta.id}",
                hint="undo covers keel's file edits and bash commands' changes in the project; "
                "`keel undo ID --list` shows what can be undone",
            )
        session = SessionLog(journal, meta.id)
        done: list[UndoSummary] = []
        for _ in range(count):
            try:
                summary, _note = undo_last(store, cwd=cwd, record=session.undo)
            except NothingToUndo:
                break
            done.append(summary)
        for summary in done:
            _print_summary(summary, cwd)
        if len(done) < count:
            print(f"keel: only {len(done)} prompt(s) had changes to undo")
        print(f'keel: the model is told with the next prompt: keel -p --resume {meta.id} "…"')
        return 0
    finally:
        journal.close()


def _rel(path: Path, cwd: Path) -> str:
    return str(path.relative_to(cwd)) if path.is_relative_to(cwd) else str(path)


def _label(text: str) -> str:
    label = " ".join(text.split())
    return label if len(label) <= 60 else label[:59] + "…"


def _print_units(units: list[UnitInfo], cwd: Path) -> None:
    if not units:
        print("nothing to undo")
        return
    for n, unit in enumerate(reversed(units), 1):
        when = unit.time.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        files = ", ".join(_rel(p, cwd) for p in unit.files) or "(no files)"
        print(f"{n}  {when}  “{_label(unit.label)}”  {files}")


def _print_summary(summary: UndoSummary, cwd: Path) -> None:
    print(f"undone: “{_label(summary.label)}”")
    for p in summary.restored:
        print(f"  restored {_rel(p, cwd)}")
    for p in summary.removed:
        print(f"  removed {_rel(p, cwd)} (the prompt created it)")
    for f in summary.overwritten:
        print(f"  restored {_rel(f.path, cwd)} over a later change: {f.why}")
    for f in summary.failed:
        print(f"  not restored {_rel(f.path, cwd)}: {f.why}")
    for note in summary.notes:
        print(f"  {note}")
    from keel.checkpoints import check_line

    for check in summary.checks:
        print(f"  {check_line(check, cwd=cwd)}")


__all__ = ["undo"]
