"""Rebuilding a session from its records: the conversation, the tool batch left half-answered (if
any), and the counters. Pure: no I/O, no model call, no tool run.

Rules: an assistant record opens a tool batch when it calls tools; tool_result records answer it;
the batch becomes one user message (results in call order) when every call is answered, or when
the next assistant record arrives. A batch still unanswered at the end is `pending`: resume runs
only its unanswered calls. A user record merges into a trailing user message, as the live loop
does, so roles keep alternating.

A run killed after journaling its final answer (an assistant message that calls no tool) but
before its terminal record ended its turn all the same: the fold supplies the terminal record the
run would have written (`recovered`), so the session reads as completed, not crashed. `started`
holds the calls that are not safe to repeat (a `tool_started` record) and have no result yet;
`processes` the process groups recorded since the last terminal record (a dead run's, on resume).
"""

from __future__ import annotations

from dataclasses import field

from keel.frozen import mutable
from keel.llm.messages import (
    Conversation,
    Message,
    Text,
    ToolResult,
    ToolUse,
    Usage,
    tool_result,
    without_context,
)
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
    TerminalReason,
    TerminalRecord,
    ToolResultRecord,
    ToolStartedRecord,
    UndoRecord,
    UserRecord,
)

#: Stands in (in the rebuilt conversation only) for a result the journal never got, when a later
#: record shows the run moved on without it.
MISSING_RESULT = "tool call did not produce a result"


@mutable
class PendingBatch:
    """An assistant message whose tool calls are not all answered."""

    message: Message
    results: dict[str, ToolResult] = field(default_factory=dict)

    @property
    def unanswered(self) -> list[ToolUse]:
        return [c for c in self.message.tool_uses if c.id not in self.results]

    def answered_in_order(self) -> list[ToolResult]:
        return [self.results[c.id] for c in self.message.tool_uses if c.id in self.results]


@mutable
class SessionState:
    meta: Meta
    conversation: Conversation = field(default_factory=Conversation)
    pending: PendingBatch | None = None
    usage: Usage = field(default_factory=Usage)
    cost: float = 0.0
    #: Model turns in all, and since the last prompt (for max_turns across a resume).
    turns: int = 0
    turns_since_prompt: int = 0
    last_prompt: str = ""
    terminal: TerminalRecord | None = None
    last_seq: int = 0
    created: str = ""
    #: Tokens the context held after the last response (for the compaction threshold).
    last_context: int = 0
    #: Notes of `/undo`s after the last prompt: the model has not been told yet. A front end
    #: resuming the session queues them again (`Agent.add_note`).
    undo_notes: list[str] = field(default_factory=list)
    #: Calls not safe to repeat that started (a `tool_started` record) and have no result.
    started: dict[str, ToolStartedRecord] = field(default_factory=dict)
    #: Process groups tool calls started since the last terminal record.
    processes: list[ProcessRecord] = field(default_factory=list)
    #: The terminal record was supplied by the fold: the run was killed after its final answer.
    recovered: bool = False
    #: What a parked fleet run waits for (a `park` record whose call has no result yet).
    parked: ParkRecord | None = None
    #: Fleet claims: (worker, attempt) of each `claim` record, oldest first.
    claims: list[tuple[str, int]] = field(default_factory=list)
    #: Facts pinned with `/pin` and not unpinned, in the order they were pinned.
    pins: list[str] = field(default_factory=list)

    @property
    def unknown_outcome(self) -> list[ToolStartedRecord]:
        """Unanswered calls of the pending batch whose outcome is unknown: they started, were not
        safe to repeat, and never reported back."""
        if self.pending is None:
            return []
        return [self.started[c.id] for c in self.pending.unanswered if c.id in self.started]

    @property
    def messages(self) -> list[Message]:
        return self.conversation.messages

    @property
    def status(self) -> str:
        """`running or crashed` when the last activity has no terminal record after it."""
        return self.terminal.reason if self.terminal is not None else "open"

    @property
    def needs_model(self) -> bool:
        """True when the conversation ends on a user message: the model owes a reply."""
        return bool(self.messages) and self.messages[-1].role == "user" and self.pending is None


class FoldError(ValueError):
    """Records that cannot form a session (the caller adds the path)."""


class _Folder:
    """Applies records one by one to a `SessionState`."""

    def __init__(self, meta: Meta, created: str) -> None:
        self.state = SessionState(meta, created=created)
        self.batch: PendingBatch | None = None

    def add(self, record: Record) -> None:  # noqa: C901 - one case per record type
        p = record.payload
        match p:
            case Meta():
                raise FoldError(f"a second meta record at seq {record.seq}")
            case UserRecord():
                self._user(p)
            case AssistantRecord():
                self._assistant(p)
            case ToolResultRecord():
                self._tool_result(record.seq, p.result)
            case CompactionRecord():
                self._close(fill_missing=True)
                self.state.conversation = Conversation([Message("user", (Text(p.summary),))])
                self.state.usage = self.state.usage + p.usage
                self.state.cost += p.cost
                self.state.last_context = 0
            case TerminalRecord():
                self.state.terminal = p
                self.state.processes.clear()  # a run that ended cleanly stopped its processes
            case ToolStartedRecord():
                self.state.started[p.tool_use_id] = p
            case ProcessRecord():
                self.state.processes.append(p)
            case UndoRecord():
                if p.note:  # the conversation is untouched; the note rides the next prompt
                    self.state.undo_notes.append(p.note)
            case ClaimRecord():
                self.state.claims.append((p.worker, p.attempt))
            case ParkRecord():
                self.state.parked = p
            case PinRecord(text, pinned):
                if pinned and text not in self.state.pins:
                    self.state.pins.append(text)
                elif not pinned and text in self.state.pins:
                    self.state.pins.remove(text)
            case NoteRecord() | DecisionRecord():
                pass

    def _user(self, p: UserRecord) -> None:
        self._close(fill_missing=True)
        self.state.conversation.append(p.message)
        if p.source == "prompt":
            self.state.undo_notes.clear()  # delivered: a prompt carries the pending notes
            self.state.last_prompt = without_context(p.message.text)
            self.state.turns_since_prompt = 0

    def _assistant(self, p: AssistantRecord) -> None:
        self._close(fill_missing=True)
        state = self.state
        state.conversation.append(p.message)
        state.usage = state.usage + p.usage
        state.cost += p.cost
        state.last_context = p.usage.context or state.last_context
        state.turns += 1
        state.turns_since_prompt += 1
        if p.message.tool_uses:
            self.batch = state.pending = PendingBatch(p.message)

    def _tool_result(self, seq: int, result: ToolResult) -> None:
        batch = self.batch
        if batch is None or result.tool_use_id not in {c.id for c in batch.message.tool_uses}:
            raise FoldError(
                f"tool_result at seq {seq} answers no open tool call ({result.tool_use_id})"
            )
        batch.results[result.tool_use_id] = result
        self.state.started.pop(result.tool_use_id, None)
        if self.state.parked is not None and self.state.parked.tool_use_id == result.tool_use_id:
            self.state.parked = None
        if not batch.unanswered:
            self._close(fill_missing=False)

    def _close(self, *, fill_missing: bool) -> None:
        """Turn the open batch into its results message. Without `fill_missing`, only a fully
        answered batch closes; with it (a later record shows the run moved on), results the
        journal never got are stood in for in the rebuilt conversation."""
        batch = self.batch
        if batch is None:
            return
        results = []
        for call in batch.message.tool_uses:
            result = batch.results.get(call.id)
            if result is None:
                if not fill_missing:
                    return
                result = tool_result(call.id, MISSING_RESULT, is_error=True)
            results.append(result)
        self.state.conversation.append(Message("user", tuple(results)))
        self.state.pending = self.batch = None
        self.state.started.clear()


def fold(records: list[Record]) -> SessionState:
    if not records or not isinstance(records[0].payload, Meta):
        raise FoldError("the first record is not meta")
    folder = _Folder(records[0].payload, records[0].ts)
    for record in records[1:]:
        folder.add(record)
    state = folder.state
    state.last_seq = records[-1].seq
    # Activity after the last terminal record means the run went on (was resumed) and then
    # stopped without one: it crashed, or is running now.
    if state.terminal is not None and _activity_after_terminal(records):
        state.terminal = None
    if state.terminal is None and (reason := _final_answer(records)) is not None:
        state.terminal = TerminalRecord(
            reason,
            "recovered: the run was killed after its final answer",
            state.turns,
            round(state.cost, 8),
            state.last_prompt[:200],
        )
        state.recovered = True
    return state


#: How a final answer's stop reason ends the turn (the loop's own mapping, for a terminal
#: record the run did not live to write); any other ends it `completed`, except `pause_turn`
#: (the provider paused: the turn was not over).
_FINAL: dict[str, TerminalReason | None] = {
    "max_tokens": "max_tokens",
    "refusal": "refusal",
    "pause_turn": None,
}


def _final_answer(records: list[Record]) -> TerminalReason | None:
    """The terminal reason a run would have written when its last activity is a final answer
    (an assistant message calling no tool); None when the run stopped anywhere else."""
    for record in reversed(records):
        p = record.payload
        if isinstance(p, AssistantRecord):
            if p.message.tool_uses:
                return None
            return _FINAL.get(p.stop_reason, "completed")
        if isinstance(p, ToolResultRecord | UserRecord | CompactionRecord | TerminalRecord):
            return None
    return None


def _activity_after_terminal(records: list[Record]) -> bool:
    for record in reversed(records):
        if isinstance(record.payload, TerminalRecord):
            return False
        if isinstance(record.payload, AssistantRecord | ToolResultRecord | UserRecord):
            return True
    return False
