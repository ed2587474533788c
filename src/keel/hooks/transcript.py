"""The session as Claude Code writes its transcripts, for the hooks that read `transcript_path`
(a cost ledger sums `message.usage` of assistant lines; a guard scans the last user prompt).

A derived view, never read back by keel: one JSON line per prompt, assistant message and tool
result of the session, appended as the journal records them, in Claude Code's shape (`type`,
`uuid`, `parentUuid` chaining each line to the one before, `sessionId` the hooks' session UUID,
`timestamp`, `cwd`, `promptId` on user lines, `message` with Anthropic's content blocks in
Claude Code's tool names and fields, assistant `usage` in Anthropic's token fields). Notes,
decisions and keel's other records have no Claude Code line and are left out. A tool result's
line carries the call's `toolUseResult` when the tool runner told it (`tool_response`). It lives beside
the session file (`<id>.transcript/<session UUID>.jsonl`, a file name as Claude Code's; a
subagent's, `agent-<its id>.jsonl`, has `isSidechain` and `agentId` set, as Claude Code's). A
transcript started late (hooks added to a resumed session) first writes the lines of what the
journal already holds.

It writes only, a line at a time; what is lost on a crash is at most the last line, and the
journal stays the truth.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import orjson

from keel.hooks import claude
from keel.llm.messages import (
    Image,
    Message,
    Text,
    Thinking,
    ToolResult,
    ToolUse,
    Usage,
    without_context,
)
from keel.session.records import AssistantRecord, Payload, ToolResultRecord, UserRecord

#: keel's user records that are a person's prompt (the others are notes keel adds).
_PROMPTS = frozenset({"prompt"})


def transcript_path(session_path: Path, name: str) -> Path:
    """Where the transcript `name` (the session's UUID, or `agent-<id>` for a subagent) of the
    session stored at `session_path` lives."""
    return session_path.with_name(f"{session_path.stem}.transcript") / f"{name}.jsonl"


class ClaudeTranscript:
    """Appends Claude Code transcript lines for journal records (`record`)."""

    def __init__(
        self, path: Path, *, session_uuid: str, cwd: Path, version: str, agent_id: str = ""
    ) -> None:
        self.path = path
        self.session_uuid = session_uuid
        self.cwd = cwd
        self.version = version
        #: A subagent's transcript: its lines are a side chain of the parent's session.
        self.agent_id = agent_id
        #: The running prompt's id (`promptId` on user lines).
        self.prompt_id = ""
        self._parent: str | None = None
        #: The uuid of the assistant line of each tool call (`sourceToolAssistantUUID`).
        self._calls: dict[str, str] = {}
        #: Each call's `tool_response`, until its result's line takes it (`toolUseResult`).
        self._responses: dict[str, object] = {}

    def tool_response(self, tool_use_id: str, response: object) -> None:
        """What Claude Code records of a call's outcome (`toolUseResult` of its result's line),
        told before the result is journaled."""
        self._responses[tool_use_id] = response

    def open(self, earlier: list[Payload]) -> None:
        """Start: a new file first gets the lines of `earlier` (the journal's records so far);
        an existing one is chained on from its last line."""
        if self.path.exists():
            self._parent = _last_uuid(self.path)
            return
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.path.touch(mode=0o600)
        for payload in earlier:
            self.record(payload)

    def record(self, payload: Payload) -> None:
        """The line of one journal record (none for records Claude Code has no line for)."""
        if isinstance(payload, UserRecord):
            self._user(payload)
        elif isinstance(payload, AssistantRecord):
            self._assistant(payload.message, payload.usage, payload.stop_reason)
        elif isinstance(payload, ToolResultRecord):
            self._tool_result(payload.result)

    def _user(self, record: UserRecord) -> None:
        if record.source not in _PROMPTS:
            return
        self._write(
            "user",
            {"role": "user", "content": without_context(record.message.text)},
            promptId=self.prompt_id or None,
        )

    def _assistant(self, message: Message, usage: Usage, stop_reason: str) -> None:
        content = [b for b in (self._block(b) for b in message.blocks) if b is not None]
        body = {
            "id": f"msg_{uuid.uuid4().hex[:24]}",
            "type": "message",
            "role": "assistant",
            "model": message.model,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": {
                "input_tokens": usage.input,
                "cache_creation_input_tokens": usage.cache_write,
                "cache_read_input_tokens": usage.cache_read,
                "output_tokens": usage.output,
            },
        }
        line = self._write("assistant", body)
        for block in message.blocks:
            if isinstance(block, ToolUse):
                self._calls[block.id] = line

    def _tool_result(self, result: ToolResult) -> None:
        texts = [b.text for b in result.content if isinstance(b, Text)]
        block: dict[str, Any] = {
            "tool_use_id": result.tool_use_id,
            "type": "tool_result",
            "content": "\n".join(texts),
        }
        if result.is_error:
            block["is_error"] = True
        source = self._calls.pop(result.tool_use_id, None)
        self._write(
            "user",
            {"role": "user", "content": [block]},
            promptId=self.prompt_id or None,
            toolUseResult=self._responses.pop(result.tool_use_id, None),
            sourceToolAssistantUUID=source,
        )

    def _block(self, block: object) -> dict[str, Any] | None:
        if isinstance(block, Text):
            return {"type": "text", "text": block.text}
        if isinstance(block, Thinking):
            return {"type": "thinking", "thinking": block.text, "signature": block.signature or ""}
        if isinstance(block, ToolUse):
            return {
                "type": "tool_use",
                "id": block.id,
                "name": claude.tool_name(block.name),
                "input": claude.tool_input(block.name, block.input or {}, self.cwd),
            }
        if isinstance(block, Image):
            return {"type": "image", "source": {"type": "base64", "media_type": block.media_type}}
        return None

    def _write(self, kind: str, message: dict[str, Any], **extra: Any) -> str:
        line_uuid = str(uuid.uuid4())
        line: dict[str, Any] = {"parentUuid": self._parent, "isSidechain": bool(self.agent_id)}
        line.update((k, v) for k, v in extra.items() if k == "promptId" and v)
        line.update(type=kind, message=message, uuid=line_uuid, timestamp=_now())
        line.update((k, v) for k, v in extra.items() if k != "promptId" and v is not None)
        line.update(
            userType="external",
            entrypoint="keel",
            cwd=str(self.cwd),
            sessionId=self.session_uuid,
            version=self.version,
        )
        if self.agent_id:
            line["agentId"] = self.agent_id
        self._parent = line_uuid
        # Opened per line: nothing to close, and a reader sees each line whole.
        with self.path.open("ab") as f:
            f.write(orjson.dumps(line, option=orjson.OPT_APPEND_NEWLINE))
        return line_uuid


def _now() -> str:
    now = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z"


def _last_uuid(path: Path) -> str | None:
    """The uuid of the last complete line of `path` (None: none)."""
    with path.open("rb") as f:
        f.seek(0, 2)
        f.seek(max(0, f.tell() - 65536))
        lines = f.read().splitlines()
    for raw in reversed(lines):
        try:
            found = orjson.loads(raw).get("uuid")
        except (orjson.JSONDecodeError, AttributeError):
            continue
        if isinstance(found, str):
            return found
    return None


__all__ = ["ClaudeTranscript", "transcript_path"]
