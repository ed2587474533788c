"""Session file records: typed, versioned, one JSON object per line.

Every line carries `v` (format version), `seq` (contiguous from 1), `type` and `ts`. Old versions
are read through numbered migration functions in `MIGRATIONS`; records are never rewritten on
disk. This module only converts between records and JSON; it does no I/O.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import field
from datetime import UTC, datetime
from typing import Any, Literal, TypeAlias

from keel.frozen import frozen
from keel.llm.messages import (
    Message,
    ToolResult,
    Usage,
    block_from_json,
    block_to_json,
    message_from_json,
    message_to_json,
)

#: Current record format. Bump it and add `MIGRATIONS[old]` when a record's shape changes or a
#: record type is added (an older keel then stops at such a line with "newer format", instead of
#: taking it for corruption). Each line carries the lowest format that can read it, so a session
#: that uses none of the newer types stays readable by an older keel.
FORMAT = 5

TerminalReason: TypeAlias = Literal[
    "completed",
    "suspended",
    "error",
    "budget",
    "max_turns",
    "interrupted",
    "loop",
    "hook_stopped",
    "blocked",
    "refusal",
    "max_tokens",
    "unknown_outcome",
    "cancelled",
    "empty_response",
    "context_full",
    "unrun_tool_call",
]
#: Terminal reasons where the model ended the turn itself: the session stops at a prompt boundary.
PROMPT_BOUNDARY: frozenset[TerminalReason] = frozenset(
    {"completed", "refusal", "max_tokens", "empty_response", "context_full", "unrun_tool_call"}
)
UserSource: TypeAlias = Literal["prompt", "note", "task_notification", "hook_feedback", "command"]


@frozen
class Fingerprint:
    """What must match for a resume to replay faithfully."""

    provider: str
    model: str
    system_hash: str
    tools_hash: str
    max_turns: int
    max_tokens: int | None = None
    max_usd: float | None = None
    #: Thinking mode (`off`, `on`) and reasoning effort; "" in files written before they were
    #: recorded (not compared then).
    thinking: str = ""
    effort: str | None = None
    #: (name, hash) of each part of the system prompt (`keel.agent.prompt.part_hashes`) and of
    #: each tool definition, so that a refused resume names what changed; empty in files written
    #: before they were recorded (then `system_hash` and `tools_hash` are compared whole).
    system_parts: tuple[tuple[str, str], ...] = ()
    tool_hashes: tuple[tuple[str, str], ...] = ()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "provider": self.provider,
            "model": self.model,
            "system_hash": self.system_hash,
            "tools_hash": self.tools_hash,
            "max_turns": self.max_turns,
            "max_tokens": self.max_tokens,
            "max_usd": self.max_usd,
            "thinking": self.thinking,
            "effort": self.effort,
        }
        if self.system_parts:
            out["system_parts"] = dict(self.system_parts)
        if self.tool_hashes:
            out["tool_hashes"] = dict(self.tool_hashes)
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Fingerprint:
        return cls(
            d.get("provider", ""),
            d.get("model", ""),
            d.get("system_hash", ""),
            d.get("tools_hash", ""),
            int(d.get("max_turns", 0)),
            d.get("max_tokens"),
            d.get("max_usd"),
            str(d.get("thinking") or ""),
            d.get("effort"),
            _pairs(d.get("system_parts")),
            _pairs(d.get("tool_hashes")),
        )


def _pairs(value: Any) -> tuple[tuple[str, str], ...]:
    """A recorded name -> hash object as pairs, in the recorded order (anything else: none)."""
    if not isinstance(value, dict):
        return ()
    return tuple((str(k), str(v)) for k, v in value.items())


@frozen
class Meta:
    id: str
    cwd: str
    model: str
    fingerprint: Fingerprint | None = None
    parent: str | None = None
    parent_seq: int | None = None
    keel_version: str = ""
    #: A subagent's session: its agent type (`parent` is the session that started it).
    agent: str = ""
    type: Literal["meta"] = "meta"


@frozen
class UserRecord:
    message: Message
    source: UserSource = "prompt"
    type: Literal["user"] = "user"


@frozen
class ReplyTiming:
    """How the model request behind an assistant record went (the journal's copy of the loop's
    `RequestTiming`, same fields): `sent_at` is wall-clock seconds since the epoch, the rest
    milliseconds from it (None: the phase did not happen)."""

    sent_at: float
    ttft_ms: float | None
    thinking_ms: float | None
    generating_ms: float | None
    duration_ms: float
    output_tokens_per_s: float | None
    attempts: int = 1
    notices: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "sent_at": self.sent_at,
            "ttft_ms": self.ttft_ms,
            "thinking_ms": self.thinking_ms,
            "generating_ms": self.generating_ms,
            "duration_ms": self.duration_ms,
            "output_tokens_per_s": self.output_tokens_per_s,
            "attempts": self.attempts,
            "notices": list(self.notices),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ReplyTiming:
        def ms(key: str) -> float | None:
            value = d.get(key)
            return None if value is None else float(value)

        return cls(
            float(d.get("sent_at", 0.0)),
            ms("ttft_ms"),
            ms("thinking_ms"),
            ms("generating_ms"),
            float(d.get("duration_ms", 0.0)),
            ms("output_tokens_per_s"),
            int(d.get("attempts", 1)),
            tuple(str(n) for n in d.get("notices", ())),
        )


@frozen
class AssistantRecord:
    message: Message
    usage: Usage
    cost: float
    stop_reason: str
    turn: int
    #: Absent in files written before requests were timed.
    timing: ReplyTiming | None = None
    type: Literal["assistant"] = "assistant"


@frozen
class ToolResultRecord:
    result: ToolResult
    seconds: float = 0.0
    #: Wall clock (seconds since the epoch) the call started; 0.0: unknown, or it never ran.
    started_at: float = 0.0
    #: The tool's kind (builtin, local, mcp, memory, remote, subagent); "" unknown (an unknown
    #: tool, or a file written before kinds): left out of the line when unset.
    kind: str = ""
    type: Literal["tool_result"] = "tool_result"


@frozen
class NoteRecord:
    text: str
    type: Literal["note"] = "note"


@frozen
class CompactionRecord:
    """The conversation was replaced: `summary` is the whole text of the one user message that
    replaces it. `usage`/`cost` are the summary request's."""

    summary: str
    trigger: str
    tokens_before: int = 0
    tokens_after: int = 0
    usage: Usage = field(default_factory=Usage)
    cost: float = 0.0
    #: The check of the summary (docs/compaction.md): pinned facts and unfinished todos `kept`
    #: by the first summary, `missing_first` from it, `repaired` by the one repair request,
    #: `lost` from the summary in the end (pinned ones appended word for word). Left out of the
    #: line when nothing was checked.
    kept: tuple[str, ...] = ()
    missing_first: tuple[str, ...] = ()
    repaired: tuple[str, ...] = ()
    lost: tuple[str, ...] = ()
    #: The repair request's share of `usage` (None: none was sent), so a reader can tell the
    #: two requests' contexts apart.
    repair_usage: Usage | None = None
    type: Literal["compaction"] = "compaction"


@frozen
class PinRecord:
    """The user pinned a fact (`/pin`), or unpinned it (`pinned` false): every compaction's
    summary must keep the session's pins (format 5)."""

    text: str
    pinned: bool = True
    type: Literal["pin"] = "pin"


@frozen
class DecisionRecord:
    tool_use_id: str
    tool: str
    outcome: str
    source: str
    reason: str = ""
    #: How long the question waited for the user's answer (0.0: nobody was asked).
    waited_ms: float = 0.0
    type: Literal["decision"] = "decision"


@frozen
class UndoRecord:
    """An `/undo`: the files of one checkpoint unit were put back (docs/checkpoints.md). The
    conversation is untouched; the model learns of it through a note on the next prompt."""

    unit: str
    label: str = ""
    #: Files written back to their earlier content, and files the unit had created, deleted.
    restored: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    #: `path: why` for each file that could not be put back.
    failed: tuple[str, ...] = ()
    #: What the model is told (with the next prompt); kept so a resume still tells it.
    note: str = ""
    type: Literal["undo"] = "undo"


@frozen
class TerminalRecord:
    reason: TerminalReason
    message: str = ""
    #: Session totals at this point, so listing sessions needs only each file's tail.
    turns: int = 0
    cost: float = 0.0
    prompt: str = ""
    type: Literal["terminal"] = "terminal"


@frozen
class ToolStartedRecord:
    """A call that is not safe to repeat (a push, a deploy, a payment) is about to run. Durable
    before the call starts: a resume that finds it without a result knows the outcome is unknown
    and does not run the call again without asking (format 2)."""

    tool_use_id: str
    tool: str
    #: Why the call is not safe to repeat (the tool's declaration, or the matching pattern).
    reason: str = ""
    #: What it runs, for the question a resume asks (a command line, a tool's arguments).
    summary: str = ""
    #: The tool's kind, as on `ToolResultRecord` ("" unset: left out of the line).
    kind: str = ""
    type: Literal["tool_started"] = "tool_started"


@frozen
class ProcessRecord:
    """A tool call started a process group. A resume kills the groups a dead run left behind,
    recognised by the leader's start time (so a recycled pid is never touched) (format 2)."""

    tool_use_id: str
    pgid: int
    #: Field 22 of /proc/<pgid>/stat: the leader's start, in clock ticks since boot.
    start_time: int
    #: /proc/sys/kernel/random/boot_id: start times count from this boot only.
    boot_id: str = ""
    type: Literal["process"] = "process"


@frozen
class ClaimRecord:
    """A fleet worker took the run over (format 3). Written before the worker reads the tail or
    runs anything: a worker that still thinks it owns the run is refused at its next append."""

    worker: str
    #: Which delivery of the run's queue message this is (1 for the first).
    attempt: int = 1
    type: Literal["claim"] = "claim"


@frozen
class ParkRecord:
    """A fleet run waits for a person (format 3): a permission question, a plan approval or a
    tool whose answer comes later. The worker released the run; an answer resumes it anywhere."""

    request_id: str
    tool_use_id: str
    tool: str
    #: "permission", "plan" or "deferred".
    waits_for: str
    question: str = ""
    type: Literal["park"] = "park"


Payload: TypeAlias = (
    Meta
    | UserRecord
    | AssistantRecord
    | ToolResultRecord
    | NoteRecord
    | CompactionRecord
    | DecisionRecord
    | UndoRecord
    | TerminalRecord
    | ToolStartedRecord
    | ProcessRecord
    | ClaimRecord
    | ParkRecord
    | PinRecord
)


@frozen
class Record:
    seq: int
    ts: str
    payload: Payload
    #: In memory every record is of the current format (older ones are migrated when read);
    #: `encode` writes the lowest format that reads it.
    v: int = FORMAT
    extra: dict[str, Any] = field(default_factory=dict)


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# -- encoding ------------------------------------------------------------------------------------


def _payload_json(p: Payload) -> dict[str, Any]:  # noqa: C901 - one case per record type
    match p:
        case Meta():
            return {
                "id": p.id,
                "cwd": p.cwd,
                "model": p.model,
                "fingerprint": p.fingerprint.to_json() if p.fingerprint else None,
                "parent": p.parent,
                "parent_seq": p.parent_seq,
                "keel_version": p.keel_version,
                **({"agent": p.agent} if p.agent else {}),
            }
        case UserRecord():
            return {"message": message_to_json(p.message), "source": p.source}
        case AssistantRecord():
            return {
                "message": message_to_json(p.message),
                "usage": p.usage.to_json(),
                "cost": p.cost,
                "stop_reason": p.stop_reason,
                "turn": p.turn,
                # Optional fields are left out when unset: older readers keep them as extras.
                **({"timing": p.timing.to_json()} if p.timing is not None else {}),
            }
        case ToolResultRecord():
            return {
                "result": block_to_json(p.result),
                "seconds": round(p.seconds, 4),
                **({"started_at": round(p.started_at, 6)} if p.started_at else {}),
                **({"kind": p.kind} if p.kind else {}),
            }
        case NoteRecord():
            return {"text": p.text}
        case CompactionRecord():
            return {
                "summary": p.summary,
                "trigger": p.trigger,
                "tokens_before": p.tokens_before,
                "tokens_after": p.tokens_after,
                "usage": p.usage.to_json(),
                "cost": p.cost,
                **(
                    {
                        "kept": list(p.kept),
                        "missing_first": list(p.missing_first),
                        "repaired": list(p.repaired),
                        "lost": list(p.lost),
                    }
                    if p.kept or p.missing_first
                    else {}
                ),
                **({"repair_usage": p.repair_usage.to_json()} if p.repair_usage else {}),
            }
        case DecisionRecord():
            return {
                "tool_use_id": p.tool_use_id,
                "tool": p.tool,
                "outcome": p.outcome,
                "source": p.source,
                "reason": p.reason,
                **({"waited_ms": round(p.waited_ms, 1)} if p.waited_ms else {}),
            }
        case UndoRecord():
            return {
                "unit": p.unit,
                "label": p.label,
                "restored": list(p.restored),
                "removed": list(p.removed),
                "failed": list(p.failed),
                "note": p.note,
            }
        case TerminalRecord():
            return {
                "reason": p.reason,
                "message": p.message,
                "turns": p.turns,
                "cost": p.cost,
                "prompt": p.prompt,
            }
        case ToolStartedRecord():
            return {
                "tool_use_id": p.tool_use_id,
                "tool": p.tool,
                "reason": p.reason,
                "summary": p.summary,
                **({"kind": p.kind} if p.kind else {}),
            }
        case ProcessRecord():
            return {
                "tool_use_id": p.tool_use_id,
                "pgid": p.pgid,
                "start_time": p.start_time,
                "boot_id": p.boot_id,
            }
        case ClaimRecord():
            return {"worker": p.worker, "attempt": p.attempt}
        case ParkRecord():
            return {
                "request_id": p.request_id,
                "tool_use_id": p.tool_use_id,
                "tool": p.tool,
                "waits_for": p.waits_for,
                "question": p.question,
            }
        case PinRecord():
            return {"text": p.text, **({} if p.pinned else {"pinned": False})}


#: Record types newer than format 1, and the format that introduced them.
_TYPE_FORMAT = {"tool_started": 2, "process": 2, "claim": 3, "park": 3, "pin": 5}
#: Terminal reasons newer than format 1 (an older keel does not know them).
_REASON_FORMAT = {
    "unknown_outcome": 2,
    "cancelled": 3,
    "empty_response": 4,
    "context_full": 4,
    "unrun_tool_call": 4,
}


def line_format(payload: Payload) -> int:
    """The lowest format that can read a record of this payload."""
    if isinstance(payload, TerminalRecord):
        return _REASON_FORMAT.get(payload.reason, 1)
    return _TYPE_FORMAT.get(payload.type, 1)


def encode(record: Record) -> bytes:
    """One line of the session file, newline included. `v` is the lowest format that reads it."""
    head = {
        "v": line_format(record.payload),
        "seq": record.seq,
        "type": record.payload.type,
        "ts": record.ts,
    }
    body = {**head, **_payload_json(record.payload), **record.extra}
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


# -- decoding ------------------------------------------------------------------------------------


def _migrate_0_to_1(d: dict[str, Any]) -> dict[str, Any]:
    """Format 0 (pre-release) named the record type `kind` and kept time as epoch seconds."""
    d = dict(d)
    d["type"] = d.pop("kind", d.get("type"))
    ts = d.get("ts")
    if isinstance(ts, int | float):
        d["ts"] = (
            datetime.fromtimestamp(ts, UTC)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z")
        )
    d["v"] = 1
    return d


def _migrate_1_to_2(d: dict[str, Any]) -> dict[str, Any]:
    """Format 2 added record types (`tool_started`, `process`) and the terminal reason
    `unknown_outcome`; format-1 records are unchanged."""
    return {**d, "v": 2}


def _migrate_2_to_3(d: dict[str, Any]) -> dict[str, Any]:
    """Format 3 added the fleet's record types (`claim`, `park`) and the terminal reason
    `cancelled`; format-2 records are unchanged."""
    return {**d, "v": 3}


def _migrate_3_to_4(d: dict[str, Any]) -> dict[str, Any]:
    """Format 4 added the terminal reasons `empty_response`, `context_full` and
    `unrun_tool_call`; format-3 records are unchanged."""
    return {**d, "v": 4}


def _migrate_4_to_5(d: dict[str, Any]) -> dict[str, Any]:
    """Format 5 added the `pin` record type; format-4 records are unchanged."""
    return {**d, "v": 5}


MIGRATIONS = {
    0: _migrate_0_to_1,
    1: _migrate_1_to_2,
    2: _migrate_2_to_3,
    3: _migrate_3_to_4,
    4: _migrate_4_to_5,
}


class RecordError(ValueError):
    """A line that is not a valid record."""


class NewerFormat(RecordError):
    """A record of a format this keel does not read (a newer keel wrote it)."""

    def __init__(self, version: int) -> None:
        from keel import __version__

        super().__init__(
            f"record format {version} is newer than this keel reads "
            f"(keel {__version__} reads formats up to {FORMAT}); a newer keel wrote it"
        )
        self.version = version


def _newer_payload(kind: str, d: dict[str, Any]) -> Payload:
    """The record types added after format 1."""
    if kind == "tool_started":
        return ToolStartedRecord(
            d["tool_use_id"],
            d["tool"],
            d.get("reason", ""),
            d.get("summary", ""),
            str(d.get("kind", "")),
        )
    if kind == "process":
        pgid, start = d["pgid"], d["start_time"]
        if not isinstance(pgid, int) or not isinstance(start, int) or pgid <= 1:
            raise RecordError("process record needs an integer pgid (> 1) and start_time")
        return ProcessRecord(d["tool_use_id"], pgid, start, d.get("boot_id", ""))
    if kind == "claim":
        return ClaimRecord(str(d["worker"]), int(d.get("attempt", 1)))
    if kind == "pin":
        text, pinned = d["text"], d.get("pinned", True)
        if not isinstance(text, str) or not isinstance(pinned, bool):
            raise RecordError("pin record needs a text string and a pinned boolean")
        return PinRecord(text, pinned)
    return ParkRecord(
        str(d["request_id"]),
        str(d["tool_use_id"]),
        str(d.get("tool", "")),
        str(d.get("waits_for", "")),
        str(d.get("question", "")),
    )


def _payload(kind: str, d: dict[str, Any]) -> Payload:
    if kind == "meta":
        fp = d.get("fingerprint")
        return Meta(
            d["id"],
            d.get("cwd", ""),
            d.get("model", ""),
            Fingerprint.from_json(fp) if fp else None,
            d.get("parent"),
            d.get("parent_seq"),
            d.get("keel_version", ""),
            d.get("agent", ""),
        )
    if kind == "user":
        return UserRecord(message_from_json(d["message"]), d.get("source", "prompt"))
    if kind == "assistant":
        timing = d.get("timing")
        return AssistantRecord(
            message_from_json(d["message"]),
            Usage.from_json(d.get("usage", {})),
            float(d.get("cost", 0.0)),
            d.get("stop_reason", ""),
            int(d.get("turn", 0)),
            ReplyTiming.from_json(timing) if isinstance(timing, dict) else None,
        )
    if kind == "tool_result":
        result = block_from_json(d["result"])
        if not isinstance(result, ToolResult):
            raise RecordError("tool_result record does not hold a tool result")
        return ToolResultRecord(
            result,
            float(d.get("seconds", 0.0)),
            float(d.get("started_at", 0.0)),
            str(d.get("kind", "")),
        )
    if kind == "note":
        return NoteRecord(d["text"])
    if kind == "compaction":
        return CompactionRecord(
            d["summary"],
            d.get("trigger", ""),
            int(d.get("tokens_before", 0)),
            int(d.get("tokens_after", 0)),
            Usage.from_json(d.get("usage", {})),
            float(d.get("cost", 0.0)),
            *_check_lists(d),
            Usage.from_json(d["repair_usage"]) if d.get("repair_usage") else None,
        )
    if kind == "decision":
        return DecisionRecord(
            d["tool_use_id"],
            d["tool"],
            d["outcome"],
            d.get("source", ""),
            d.get("reason", ""),
            float(d.get("waited_ms", 0.0)),
        )
    if kind == "undo":
        return UndoRecord(
            d["unit"],
            d.get("label", ""),
            tuple(d.get("restored", ())),
            tuple(d.get("removed", ())),
            tuple(d.get("failed", ())),
            d.get("note", ""),
        )
    if kind in _TYPE_FORMAT:
        return _newer_payload(kind, d)
    if kind == "terminal":
        return TerminalRecord(
            d["reason"],
            d.get("message", ""),
            int(d.get("turns", 0)),
            float(d.get("cost", 0.0)),
            d.get("prompt", ""),
        )
    raise RecordError(f"unknown record type {kind!r}")


_ENVELOPE = {"v", "seq", "type", "ts"}
#: A compaction record's lists of its summary's check (`CompactionRecord`).
_CHECK_LISTS = ("kept", "missing_first", "repaired", "lost")


def _check_lists(
    d: dict[str, Any],
) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    kept, missing, repaired, lost = (tuple(str(f) for f in d.get(k, ())) for k in _CHECK_LISTS)
    return kept, missing, repaired, lost


_KNOWN_FIELDS: dict[str, set[str]] = {
    "meta": {"id", "cwd", "model", "fingerprint", "parent", "parent_seq", "keel_version", "agent"},
    "user": {"message", "source"},
    "assistant": {"message", "usage", "cost", "stop_reason", "turn", "timing"},
    "tool_result": {"result", "seconds", "started_at", "kind"},
    "note": {"text"},
    "compaction": {
        "summary",
        "trigger",
        "tokens_before",
        "tokens_after",
        "usage",
        "cost",
        *_CHECK_LISTS,
        "repair_usage",
    },
    "decision": {"tool_use_id", "tool", "outcome", "source", "reason", "waited_ms"},
    "undo": {"unit", "label", "restored", "removed", "failed", "note"},
    "terminal": {"reason", "message", "turns", "cost", "prompt"},
    "tool_started": {"tool_use_id", "tool", "reason", "summary", "kind"},
    "process": {"tool_use_id", "pgid", "start_time", "boot_id"},
    "claim": {"worker", "attempt"},
    "park": {"request_id", "tool_use_id", "tool", "waits_for", "question"},
    "pin": {"text", "pinned"},
}
_ALLOWED = {kind: frozenset(fields | _ENVELOPE) for kind, fields in _KNOWN_FIELDS.items()}


@functools.cache
def _json_loads() -> Callable[[bytes | str], Any]:
    """orjson's parser when installed (2.5x faster on a long session), else the standard one.
    Loaded on first use: reading records is not on the startup path."""
    try:
        import orjson
    except ImportError:
        return json.loads

    def loads(line: bytes | str) -> Any:
        try:
            return orjson.loads(line)
        except orjson.JSONDecodeError:
            # orjson refuses integers beyond 64 bits, which the standard parser reads.
            return json.loads(line)

    return loads


def decode(line: bytes | str) -> Record:
    """Parse one line. Raises `RecordError` for anything that is not a valid record."""
    try:
        d = _json_loads()(line)
    except ValueError as exc:
        raise RecordError(f"not JSON: {exc}") from exc
    if not isinstance(d, dict):
        raise RecordError("not a JSON object")
    version = d.get("v", 0)
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise RecordError(f"record format {version!r} is not a format number")
    if version > FORMAT:
        raise NewerFormat(version)
    written = version
    while version < FORMAT:
        d = MIGRATIONS[version](d)
        version = d["v"]
    kind = d.get("type")
    seq = d.get("seq")
    if not isinstance(kind, str) or not isinstance(seq, int):
        raise RecordError("record lacks type or seq")
    if kind not in _ALLOWED:
        from keel import __version__

        raise RecordError(
            f"unknown record type {kind!r} in a format-{written} record (keel {__version__} "
            f"reads formats up to {FORMAT}; a newer keel may have written it)"
        )
    try:
        payload = _payload(kind, d)
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, RecordError):
            raise
        raise RecordError(f"bad {kind} record: {exc!r}") from exc
    allowed = _ALLOWED[kind]
    extra: dict[str, Any] = {}
    if not d.keys() <= allowed:  # fields a newer keel added: kept, not lost
        extra = {k: v for k, v in d.items() if k not in allowed}
    return Record(seq, str(d.get("ts", "")), payload, FORMAT, extra)
