"""Forking a session: a new session file holding a copy of another's records up to a prompt
boundary (`keel sessions fork`, the TUI's `/rewind`, the server's fork route), and reading a
fork's lineage back (`lineage`: a resumed fork rebuilds the prompt its first ancestor started
with: that session's date and memory index)."""

from __future__ import annotations

from pathlib import Path

from keel.errors import UserError
from keel.llm.messages import without_context
from keel.session.journal import Journal, read_records
from keel.session.records import (
    PROMPT_BOUNDARY,
    DecisionRecord,
    Meta,
    RecordError,
    UserRecord,
    decode,
)
from keel.session.store import new_session_id


def fork_session(path: Path, at: int | None) -> tuple[Path, str]:
    """Create the fork; returns its path and the text of the prompt at `at` (if any)."""
    records = read_records(path).records
    meta = records[0].payload
    if not isinstance(meta, Meta):
        raise UserError(f"{path}: the first record is not meta")
    at_prompt = ""
    if at is not None:
        target = next((r for r in records if r.seq == at), None)
        if target is None or not (
            isinstance(target.payload, UserRecord) and target.payload.source == "prompt"
        ):
            prompts = [
                str(r.seq)
                for r in records
                if isinstance(r.payload, UserRecord) and r.payload.source == "prompt"
            ]
            raise UserError(
                f"seq {at} of session {meta.id} is not a prompt; forks start at a prompt boundary",
                hint=f"prompts are at seq {', '.join(prompts) or '(none)'}",
            )
        at_prompt = without_context(target.payload.message.text)
        kept = [r for r in records[1:] if r.seq < at]
    else:
        from keel.session.fold import FoldError, fold

        try:  # the fold counts a run killed after its final answer as ended
            last = fold(records).terminal
        except FoldError as exc:
            raise UserError(f"{path}: {exc}", hint="the file was left untouched") from exc
        if last is None or last.reason not in PROMPT_BOUNDARY:
            raise UserError(
                f"session {meta.id} did not end at a prompt boundary (it is "
                f"{'running or crashed' if last is None else last.reason})",
                hint="fork it at a prompt with --at SEQ (`keel sessions show` lists them), or resume it first",
            )
        kept = records[1:]
    new_id = new_session_id()
    parent_seq = kept[-1].seq if kept else 1
    new_meta = Meta(
        new_id, meta.cwd, meta.model, meta.fingerprint, meta.id, parent_seq, meta.keel_version
    )
    new_path = path.with_name(f"{new_id}.jsonl")
    journal = Journal.create(new_path, new_meta)
    try:
        for record in kept:
            if isinstance(record.payload, DecisionRecord):
                continue  # permission outcomes belong to the run that made them
            journal.append(record.payload, durable=False)
        journal.sync()
    finally:
        journal.close()
    return new_path, at_prompt


#: How many forks back `lineage` follows (a cycle cannot happen, a very long chain is cut).
MAX_LINEAGE = 100


def lineage(path: Path, meta: Meta, started: str) -> list[tuple[str, str]]:
    """(id, start time) of the session in `path` (`meta`, `started`) and of each session it was
    forked from, nearest first, as far as their files are still beside it. A subagent's session
    names the session that ran it as its parent, not one it was copied from: it is not followed."""
    out = [(meta.id, started)]
    seen = {meta.id}
    while meta.parent and not meta.agent and len(out) < MAX_LINEAGE:
        parent = path.with_name(f"{meta.parent}.jsonl")
        try:
            with parent.open("rb") as f:
                first = decode(f.readline())
        except (OSError, RecordError):
            break
        if not isinstance(first.payload, Meta) or first.payload.id in seen:
            break
        meta = first.payload
        seen.add(meta.id)
        out.append((meta.id, first.ts))
    return out
