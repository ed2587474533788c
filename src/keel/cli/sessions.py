"""`keel sessions list|show|rm|path`, `keel fork` and `keel suspend`: working with session files
from the shell. Output is plain text for people; `--json` where a script would want it."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from keel.cli.main import ArgumentError, _Parser
from keel.errors import UserError
from keel.llm.messages import Image, Text, Thinking, ToolUse, WebSearch, without_context
from keel.session.fork import fork_session
from keel.session.index import (
    SessionSummary,
    child_sessions,
    find_session,
    lock_holder,
    session_files,
    summarize,
)
from keel.session.journal import Journal, read_records
from keel.session.records import (
    AssistantRecord,
    ClaimRecord,
    CompactionRecord,
    DecisionRecord,
    Meta,
    NoteRecord,
    ParkRecord,
    PinRecord,
    ProcessRecord,
    Record,
    ReplyTiming,
    TerminalRecord,
    ToolResultRecord,
    ToolStartedRecord,
    UndoRecord,
    UserRecord,
)


def _parser(prog: str, description: str) -> argparse.ArgumentParser:
    return _Parser(prog=prog, description=description)


# -- keel sessions -----------------------------------------------------------------------------


def sessions(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(
            "usage: keel sessions list [--all] [--json] | show ID [--json] | rm ID [--force] | path ID"
        )
        return 0 if argv else 2
    action, rest = argv[0], argv[1:]
    handlers: dict[str, Callable[[list[str]], int]] = {
        "list": _list,
        "ls": _list,
        "show": _show,
        "rm": _rm,
        "path": _path,
    }
    if action not in handlers:
        raise ArgumentError(f"unknown sessions command {action!r} (list, show, rm, path)")
    return handlers[action](rest)


def _list(argv: list[str]) -> int:
    p = _parser(
        "keel sessions list", "Sessions of this project (newest first), or of all projects."
    )
    p.add_argument("--all", action="store_true", help="every project's sessions")
    p.add_argument("--json", action="store_true", help="one JSON object per session")
    p.add_argument("-n", "--limit", type=int, default=0, help="at most this many")
    args = p.parse_args(argv)
    summaries = _summaries(None if args.all else Path.cwd(), args.limit)
    if args.json:
        for s in summaries:
            print(
                json.dumps(
                    {
                        "id": s.id,
                        "started": s.started,
                        "status": s.status,
                        "last_prompt": s.last_prompt,
                        "turns": s.turns,
                        "cost_usd": s.cost,
                        "model": s.model,
                        "cwd": s.cwd,
                        "parent": s.parent,
                        "path": str(s.path),
                    }
                )
            )
        return 0
    if not summaries:
        where = "any project" if args.all else str(Path.cwd())
        print(f"no sessions for {where}", file=sys.stderr)
        return 0
    print(f"{'ID':<23} {'STARTED':<17} {'STATUS':<12} {'TURNS':>5} {'COST':>9}  LAST PROMPT")
    for s in summaries:
        started = s.started[:16].replace("T", " ")
        turns = "?" if s.turns is None else str(s.turns)
        cost = "?" if s.cost is None else f"${s.cost:.4f}"
        prompt = s.last_prompt + (f"  (fork of {s.parent})" if s.parent else "")
        print(f"{s.id:<23} {started:<17} {s.status:<12} {turns:>5} {cost:>9}  {prompt}")
    return 0


def _jetstream_url() -> str:
    """`keel.app.stores.jetstream_url`, without importing `keel.app` (the whole assembly: ~100
    modules, ~60 ms) when `KEEL_STORE` is not set, as session files need none of it."""
    from keel.session.backend import store_url

    if not store_url():
        return ""
    from keel.app.stores import jetstream_url

    return jetstream_url()


def _summaries(cwd: Path | None, limit: int) -> list[SessionSummary]:
    """The sessions to list: from the session files, or the JetStream store (`KEEL_STORE`)."""
    if url := _jetstream_url():
        from keel.app.stores import open_jetstream

        store = open_jetstream(url)
        try:
            found = store.summaries(cwd)
        finally:
            store.close()
        return found[:limit] if limit > 0 else found
    files = session_files(cwd)
    if limit > 0:
        files = files[:limit]
    summaries = []
    for path in files:
        try:
            summaries.append(summarize(path))
        except (UserError, OSError) as exc:
            print(f"keel: warning: skipped {path}: {exc}", file=sys.stderr)
    return summaries


def _show_stored(session_id: str, url: str, as_json: bool) -> int:
    from keel.app.stores import open_jetstream
    from keel.session.records import encode

    store = open_jetstream(url)
    try:
        records = store.read(session_id).records
    finally:
        store.close()
    for record in records:
        if as_json:
            sys.stdout.write(encode(record).decode())
            continue
        for line in describe(record):
            print(line)
    return 0


def _show(argv: list[str]) -> int:
    p = _parser("keel sessions show", "A session's transcript.")
    p.add_argument("session", metavar="ID")
    p.add_argument("--json", action="store_true", help="the records, one JSON object per line")
    args = p.parse_args(argv)
    if url := _jetstream_url():
        return _show_stored(args.session, url, args.json)
    path = find_session(args.session, Path.cwd())
    if args.json:
        sys.stdout.write(path.read_text(encoding="utf-8"))
        return 0
    loaded = read_records(path)
    for record in loaded.records:
        for line in describe(record):
            print(line)
    if loaded.repaired_bytes:
        print(
            f"(a torn last record of {loaded.repaired_bytes} bytes follows; a resume keeps it "
            "beside the file and cuts it off)"
        )
    _show_children(path, "")
    return 0


def _show_children(path: Path, indent: str) -> None:
    """The subagents a session started, as a tree (`keel sessions show CHILD_ID` for one)."""
    children = child_sessions(path)
    if children and not indent:
        print("subagents:")
    for child in children:
        s = summarize(child)
        kind = s.agent or "subagent"
        turns = "?" if s.turns is None else str(s.turns)
        cost = "?" if s.cost is None else f"${s.cost:.4f}"
        print(f"{indent}  └ {s.id}  {kind}  {s.status}, {turns} turns, {cost}: {s.last_prompt}")
        _show_children(child, indent + "    ")


def _clip(text: str, width: int = 400) -> str:
    text = text.strip()
    return text if len(text) <= width else text[:width] + f"… [{len(text) - width} more chars]"


def _lineage(meta: Meta) -> str:
    if meta.agent:
        return f", {meta.agent} subagent of {meta.parent}"
    return f", fork of {meta.parent} at {meta.parent_seq}" if meta.parent else ""


def _block_line(block: object) -> str:
    """An assistant message's block as one line of `keel sessions show` ("" to leave it out)."""
    if isinstance(block, Thinking):
        return f"    (thinking) {_clip(block.text, 200)}"
    if isinstance(block, Text):
        return f"    {_clip(block.text)}"
    if isinstance(block, ToolUse):
        args = json.dumps(block.input) if block.input is not None else block.raw_input
        return f"    → {block.name} {_clip(args, 200)}  [{block.id}]"
    if isinstance(block, WebSearch):  # the provider searched on its side
        found = block.error or f"{len(block.results)} results"
        return f"    (web search) {_clip(block.query or block.url, 200)}: {found}"
    return ""


def describe(record: Record) -> list[str]:
    """A record as readable lines, prefixed with its seq."""
    head = f"[{record.seq}]"
    p = record.payload
    match p:
        case Meta():
            return [
                f"{head} session {p.id} in {p.cwd}, model {p.model}, started {record.ts}"
                + _lineage(p)
            ]
        case UserRecord(message, source):
            label = "user" if source == "prompt" else source
            return [f"{head} {label}: {_clip(without_context(message.text))}"]
        case AssistantRecord(message, usage, cost, stop_reason, _turn, timing):
            lines = [
                f"{head} assistant ({message.model or 'model'}, {usage.total} tokens, "
                f"${cost:.4f}, {stop_reason}):{_timing_text(timing)}"
            ]
            lines += [line for line in map(_block_line, message.blocks) if line]
            return lines
        case ToolResultRecord(result, seconds):
            mark = "✗" if result.is_error else "←"
            images = sum(isinstance(b, Image) for b in result.content)
            extra = f" (+{images} image)" if images else ""
            return [
                f"{head} {mark} {result.tool_use_id} ({seconds:.2f}s){extra}: {_clip(result.text, 300)}"
            ]
        case CompactionRecord(summary, trigger):
            lost = f" (lost from the summary: {'; '.join(p.lost)})" if p.lost else ""
            return [f"{head} compaction ({trigger}){lost}: {_clip(summary, 300)}"]
        case DecisionRecord(tool_use_id, tool, outcome, source, reason, waited_ms):
            waited = f" (answered in {waited_ms / 1000:.1f}s)" if waited_ms else ""
            return [
                f"{head} decision: {tool} {tool_use_id} {outcome} by {source} {reason}".rstrip()
                + waited
            ]
        case UndoRecord():
            files = len(p.restored) + len(p.removed)
            lost = f", {len(p.failed)} not restored" if p.failed else ""
            return [f"{head} undo {p.label or p.unit}: {files} file(s) put back{lost}"]
        case TerminalRecord(reason, message, turns, cost):
            detail = f": {message}" if message else ""
            return [f"{head} ── {reason}{detail} ({turns} turns, ${cost:.4f} in all)"]
        case NoteRecord() | ToolStartedRecord() | ProcessRecord():
            return [f"{head} {_brief(p)}"]
        case ClaimRecord():
            return [f"{head} claimed by worker {p.worker} (delivery {p.attempt})"]
        case ParkRecord():
            return [f"{head} parked: waits for {p.waits_for} on {p.tool} {p.tool_use_id}"]
        case PinRecord(text, pinned):
            return [f"{head} {'pinned' if pinned else 'unpinned'}: {_clip(text)}"]


def _timing_text(timing: ReplyTiming | None) -> str:
    """` ttft 0.42s · thought 1.30s · 54 tok/s · 1.52s in all` (what was measured of the
    request behind an assistant record), or "" for a record written before requests were timed."""
    if timing is None:
        return ""
    parts = []
    if timing.ttft_ms is not None:
        parts.append(f"ttft {timing.ttft_ms / 1000:.2f}s")
    if timing.thinking_ms is not None:
        parts.append(f"thought {timing.thinking_ms / 1000:.2f}s")
    if timing.output_tokens_per_s is not None:
        parts.append(f"{timing.output_tokens_per_s:.0f} tok/s")
    parts.append(f"{timing.duration_ms / 1000:.2f}s in all")
    if timing.attempts > 1:
        parts.append(f"{timing.attempts} attempts")
    return " " + " · ".join(parts)


def _brief(p: NoteRecord | ToolStartedRecord | ProcessRecord) -> str:
    if isinstance(p, NoteRecord):
        return f"note: {_clip(p.text)}"
    if isinstance(p, ProcessRecord):
        return f"process group {p.pgid} for {p.tool_use_id}"
    return f"started {p.tool} {p.tool_use_id} (not safe to repeat: {p.reason})"


#: Directories kept beside a session file, named after it.
BESIDE = (".agents", ".raw", ".checkpoints")


def _rm(argv: list[str]) -> int:
    p = _parser("keel sessions rm", "Delete a session file.")
    p.add_argument("session", metavar="ID")
    p.add_argument("--force", action="store_true", help="delete even while it is running")
    args = p.parse_args(argv)
    path = find_session(args.session, Path.cwd())
    holder = lock_holder(path)
    if holder is not None and not args.force:
        raise UserError(
            f"session {path.stem} is running (pid {holder})",
            hint="suspend it first with `keel suspend`, or pass --force",
        )
    path.unlink()
    Journal.lock_path(path).unlink(missing_ok=True)
    print(f"removed {path}")
    # What lives beside it: subagents' sessions, full tool outputs, /undo snapshots.
    for suffix in BESIDE:
        extra = path.with_name(path.stem + suffix)
        if extra.is_dir():
            shutil.rmtree(extra)
            print(f"removed {extra}")
    return 0


def _path(argv: list[str]) -> int:
    p = _parser("keel sessions path", "Print a session file's path.")
    p.add_argument("session", metavar="ID")
    args = p.parse_args(argv)
    print(find_session(args.session, Path.cwd()))
    return 0


# -- keel fork ---------------------------------------------------------------------------------


def fork(argv: list[str]) -> int:
    p = _parser(
        "keel fork",
        "Copy a session into a new one that continues on its own. With --at SEQ (the seq of a "
        "user prompt, as `keel sessions show` numbers them) the copy stops just before that "
        "prompt: a rewind.",
    )
    p.add_argument("session", metavar="ID")
    p.add_argument("--at", type=int, metavar="SEQ", help="fork just before the prompt at SEQ")
    args = p.parse_args(argv)
    path = find_session(args.session, Path.cwd())
    new_path, at_prompt = fork_session(path, args.at)
    print(new_path.stem)
    hint = f'continue it: keel -p --resume {new_path.stem} "…"'
    if at_prompt:
        hint += f"\nthe prompt you rewound past: {_clip(at_prompt, 300)}"
    print(hint, file=sys.stderr)
    return 0


# -- keel suspend ------------------------------------------------------------------------------


def suspend(argv: list[str]) -> int:
    p = _parser("keel suspend", "Ask a running session to stop at its next safe point.")
    p.add_argument("session", metavar="ID")
    args = p.parse_args(argv)
    path = find_session(args.session, Path.cwd())
    pid = lock_holder(path)
    if pid is None:
        raise UserError(
            f"session {path.stem} is not running", hint=f"resume it with keel resume {path.stem}"
        )
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError as exc:
        raise UserError(f"session {path.stem}'s process (pid {pid}) is gone") from exc
    print(f"asked pid {pid} to suspend session {path.stem}; resume with: keel resume {path.stem}")
    return 0


COMMANDS: dict[str, Callable[[list[str]], int]] = {
    "sessions": sessions,
    "fork": fork,
    "suspend": suspend,
}
