"""keel's events and session records as Agent Client Protocol `session/update` payloads: the
pure half of `keel acp` (values in, protocol models out; no I/O, no connection).

What a tool call looks like to an editor (its kind, title, the files it touches, the diff an
edit makes), how a `todo_write` list becomes a `plan`, how a prompt's content blocks become the
text keel runs, how a journal replays as updates for `session/load`, and how keel's stop reasons
map onto ACP's. Must never import a front end (cli/, tui/) or touch the disk.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, TypeAlias
from urllib.parse import unquote, urlparse

from acp.helpers import (
    plan_entry,
    start_tool_call,
    text_block,
    tool_content,
    tool_diff_content,
    update_agent_message_text,
    update_agent_thought_text,
    update_plan,
    update_tool_call,
    update_user_message_text,
)
from acp.schema import (
    AgentMessageChunk,
    AgentPlanUpdate,
    AgentThoughtChunk,
    AudioContentBlock,
    ConfigOptionUpdate,
    ContentToolCallContent,
    CurrentModeUpdate,
    EmbeddedResourceContentBlock,
    FileEditToolCallContent,
    ImageContentBlock,
    PlanEntry,
    ResourceContentBlock,
    SessionConfigOptionBoolean,
    SessionConfigOptionSelect,
    SessionConfigSelectOption,
    SessionMode,
    SessionModeState,
    StopReason,
    TerminalToolCallContent,
    TextContentBlock,
    TextResourceContents,
    ToolCallLocation,
    ToolCallProgress,
    ToolCallStart,
    ToolCallStatus,
    ToolKind,
    UserMessageChunk,
)

from keel.agent.events import TurnStop
from keel.agent.mentions import typed_prompt
from keel.frozen import frozen
from keel.llm.messages import Image, Message, Text, Thinking, ToolResult, ToolUse
from keel.permissions.gate import MODES, Mode
from keel.session.records import AssistantRecord, Record, ToolResultRecord, UserRecord
from keel.tools.effects import call_summary

Update: TypeAlias = (
    AgentMessageChunk
    | AgentThoughtChunk
    | UserMessageChunk
    | ToolCallStart
    | ToolCallProgress
    | AgentPlanUpdate
    | CurrentModeUpdate
    | ConfigOptionUpdate
)
PromptBlock: TypeAlias = (
    TextContentBlock
    | ImageContentBlock
    | AudioContentBlock
    | ResourceContentBlock
    | EmbeddedResourceContentBlock
)
ToolContent: TypeAlias = ContentToolCallContent | FileEditToolCallContent | TerminalToolCallContent
ConfigOption: TypeAlias = SessionConfigOptionSelect | SessionConfigOptionBoolean

# -- modes -----------------------------------------------------------------------------------------

MODE_INFO: dict[Mode, tuple[str, str]] = {
    "default": ("Default", "Ask before edits and before commands outside the sandbox"),
    "accept-edits": ("Accept edits", "Edit files in the project without asking"),
    "plan": ("Plan", "Read and plan only: no edits, no commands that change anything"),
    "bypass": (
        "Bypass permissions",
        "Run every tool without asking (deny and ask rules still apply)",
    ),
    "auto": (
        "Auto",
        "A model classifier decides what would ask you (deny and ask rules still apply)",
    ),
}


def mode_state(current: Mode) -> SessionModeState:
    """keel's permission modes as ACP session modes, `current` selected."""
    return SessionModeState(
        current_mode_id=current,
        available_modes=[
            SessionMode(id=mode, name=MODE_INFO[mode][0], description=MODE_INFO[mode][1])
            for mode in MODES
        ],
    )


def mode_update(mode: Mode) -> CurrentModeUpdate:
    return CurrentModeUpdate(session_update="current_mode_update", current_mode_id=mode)


# -- session config options: the mode and the model ------------------------------------------------

#: The ids of keel's session config options (`session/set_config_option`).
MODE_OPTION = "mode"
MODEL_OPTION = "model"


@frozen
class ModelChoice:
    """A model an editor may pick: `provider/model` as keel parses it, and what to say of it."""

    spec: str
    description: str | None = None


def config_options(mode: Mode, model: str, models: Sequence[ModelChoice]) -> list[ConfigOption]:
    """The session's config options: the permission mode (the same values as its modes) and
    the model (`model` selected, offered first if `models` lacks it)."""
    if model not in [m.spec for m in models]:
        models = [ModelChoice(model), *models]
    return [
        SessionConfigOptionSelect(
            id=MODE_OPTION,
            name="Mode",
            description="How keel asks before it acts (the permission mode)",
            category="mode",
            type="select",
            current_value=mode,
            options=[
                SessionConfigSelectOption(
                    value=m, name=MODE_INFO[m][0], description=MODE_INFO[m][1]
                )
                for m in MODES
            ],
        ),
        SessionConfigOptionSelect(
            id=MODEL_OPTION,
            name="Model",
            description="The model the next request goes to (provider/model)",
            category="model",
            type="select",
            current_value=model,
            options=[
                SessionConfigSelectOption(value=m.spec, name=m.spec, description=m.description)
                for m in models
            ],
        ),
    ]


def config_update(options: list[ConfigOption]) -> ConfigOptionUpdate:
    return ConfigOptionUpdate(session_update="config_option_update", config_options=list(options))


# -- stop reasons ----------------------------------------------------------------------------------

#: keel's stop reasons (`error` aside: it is a JSON-RPC error) as ACP's. ACP has five; the rest
#: take the nearest meaning: a budget or a full context window is a token limit, the loop guard
#: ends the turn's requests, a hook's block or a tool call the model wrote as text and keel did
#: not run is the agent declining, an empty reply ends the turn, and a run stopped from outside
#: is cancelled.
STOP_REASONS: dict[TurnStop, StopReason] = {
    "end_turn": "end_turn",
    "max_tokens": "max_tokens",
    "max_turns": "max_turn_requests",
    "refusal": "refusal",
    "interrupted": "cancelled",
    "suspended": "cancelled",
    "budget": "max_tokens",
    "loop": "max_turn_requests",
    "blocked": "refusal",
    "hook_stopped": "end_turn",
    "unknown_outcome": "refusal",
    "error": "refusal",
    "empty_response": "end_turn",
    "context_full": "max_tokens",
    "unrun_tool_call": "refusal",
}


def stop_reason(reason: TurnStop) -> StopReason:
    return STOP_REASONS[reason]


# -- tool calls ------------------------------------------------------------------------------------

KINDS: dict[str, ToolKind] = {
    "read": "read",
    "ls": "read",
    "raw_output": "read",
    "bash_output": "read",
    "write": "edit",
    "edit": "edit",
    "multi_edit": "edit",
    "bash": "execute",
    "glob": "search",
    "grep": "search",
    "web_search": "search",
    "web_fetch": "fetch",
    "task": "think",
    "todo_write": "think",
    "exit_plan_mode": "switch_mode",
}

#: Tools whose output is plain text best shown verbatim (in a code fence).
_VERBATIM = {"bash", "bash_output", "read", "grep", "glob", "ls", "raw_output"}

#: Shown as a plan, never as a tool call.
PLAN_TOOL = "todo_write"


def kind(name: str) -> ToolKind:
    return KINDS.get(name, "other")


def _arg(call: ToolUse, key: str) -> str:
    value = (call.input or {}).get(key)
    return value if isinstance(value, str) else ""


def _one_line(text: str, width: int = 120) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def absolute(path: str, cwd: Path) -> str:
    """`path` as the absolute path ACP wants (relative paths are the session's cwd's)."""
    p = Path(path).expanduser()
    return str(p if p.is_absolute() else cwd / p)


def title(call: ToolUse) -> str:
    """What the call does, in a few words (editors render titles as Markdown)."""
    name = call.name
    path = _arg(call, "path")
    match name:
        case "bash":
            command = _one_line(_arg(call, "command"))
            return f"`{command}`" if command else "bash"
        case "read":
            offset = (call.input or {}).get("offset")
            where = f" (from line {offset})" if isinstance(offset, int) and offset > 1 else ""
            return f"Read {path}{where}"
        case "write":
            return f"Write {path}"
        case "edit" | "multi_edit":
            return f"Edit {path}"
        case "ls":
            return f"List {path or '.'}"
        case "glob":
            return f"Find `{_arg(call, 'pattern')}`" + (f" in {path}" if path else "")
        case "grep":
            return f"Search `{_arg(call, 'pattern')}`" + (f" in {path}" if path else "")
        case "web_fetch":
            return f"Fetch {_arg(call, 'url')}"
        case "web_search":
            return f"Search the web: {_one_line(_arg(call, 'query'))}"
        case "task":
            return f"Task: {_one_line(_arg(call, 'description') or _arg(call, 'prompt'))}"
        case "exit_plan_mode":
            return "Ready to code: approve the plan"
    summary = call_summary(name, call.input, width=100)
    return f"{name} {summary}" if summary and summary != "{}" else name


def locations(call: ToolUse, cwd: Path) -> list[ToolCallLocation]:
    """The files a call reads or changes (editors follow along)."""
    path = _arg(call, "path")
    if call.name in ("read", "write", "edit", "multi_edit", "ls", "grep", "glob") and path:
        line = (call.input or {}).get("offset") if call.name == "read" else None
        if isinstance(line, int) and line > 0:
            return [ToolCallLocation(path=absolute(path, cwd), line=line)]
        return [ToolCallLocation(path=absolute(path, cwd))]
    return []


def diffs(call: ToolUse, cwd: Path) -> list[ToolContent]:
    """What an edit tool would change, as ACP diffs (the edited text, not the whole file: what
    the model sent; `oldText` absent for a file `write` creates or replaces)."""
    args = call.input or {}
    path = _arg(call, "path")
    if not path:
        return []
    target = absolute(path, cwd)
    match call.name:
        case "write":
            content = args.get("content")
            return [tool_diff_content(target, content)] if isinstance(content, str) else []
        case "edit":
            old, new = args.get("old_string"), args.get("new_string")
            if isinstance(old, str) and isinstance(new, str):
                return [tool_diff_content(target, new, old)]
            return []
        case "multi_edit":
            edits = args.get("edits")
            out: list[ToolContent] = []
            for edit in edits if isinstance(edits, list) else []:
                if not isinstance(edit, dict):
                    continue
                old, new = edit.get("old_string"), edit.get("new_string")
                if isinstance(old, str) and isinstance(new, str):
                    out.append(tool_diff_content(target, new, old))
            return out
    return []


def announce(call: ToolUse, cwd: Path, *, label: str = "") -> ToolCallStart:
    """The `tool_call` for a call the model made (not run yet). `label` names a subagent."""
    heading = f"{label}: {title(call)}" if label else title(call)
    return start_tool_call(
        call.id,
        heading,
        kind=kind(call.name),
        status="pending",
        content=diffs(call, cwd) or None,
        locations=locations(call, cwd) or None,
        raw_input=call.input,
    )


def started(call: ToolUse) -> ToolCallProgress:
    return update_tool_call(call.id, status="in_progress")


def _fence(text: str) -> str:
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}\n{text.rstrip(chr(10))}\n{fence}"


def result_content(call: ToolUse, result: ToolResult, cwd: Path) -> list[ToolContent]:
    """What an editor shows for a finished call: an edit's diffs, else the result (images as
    images, text fenced when it is a file or command output)."""
    if not result.is_error and (changes := diffs(call, cwd)):
        return changes
    out: list[ToolContent] = []
    for block in result.content:
        if isinstance(block, Image):
            from acp.helpers import image_block

            out.append(tool_content(image_block(block.data, block.media_type)))
        elif isinstance(block, Text) and block.text:
            shown = _fence(block.text) if call.name in _VERBATIM else block.text
            out.append(tool_content(text_block(shown)))
    return out


def finished(call: ToolUse, result: ToolResult, cwd: Path) -> ToolCallProgress:
    status: ToolCallStatus = "failed" if result.is_error else "completed"
    return update_tool_call(call.id, status=status, content=result_content(call, result, cwd))


def plan(todos: Sequence[dict[str, Any]]) -> AgentPlanUpdate:
    """A `todo_write` list (its `display` JSON or its input) as the agent's plan."""
    entries: list[PlanEntry] = []
    for item in todos:
        status = item.get("status")
        content = item.get("content")
        if isinstance(content, str) and status in ("pending", "in_progress", "completed"):
            entries.append(plan_entry(content, priority="medium", status=status))
    return update_plan(entries)


def plan_of(call: ToolUse, result: ToolResult, display: str | None) -> AgentPlanUpdate | None:
    """The plan a finished `todo_write` call set, or None (it failed: the plan stands)."""
    if result.is_error:
        return None
    if display is not None:
        try:
            items = json.loads(display)
        except ValueError:
            items = None
        if isinstance(items, list):
            return plan([i for i in items if isinstance(i, dict)])
    todos = (call.input or {}).get("todos")
    return plan([i for i in todos if isinstance(i, dict)]) if isinstance(todos, list) else None


# -- text ------------------------------------------------------------------------------------------


def message_chunk(text: str) -> AgentMessageChunk:
    return update_agent_message_text(text)


def thought_chunk(text: str) -> AgentThoughtChunk:
    return update_agent_thought_text(text)


# -- prompts ---------------------------------------------------------------------------------------


class UnsupportedContent(ValueError):
    """A prompt block keel does not take (it did not advertise it)."""


def _file_path(uri: str) -> str | None:
    parsed = urlparse(uri)
    if parsed.scheme != "file":
        return None
    return unquote(parsed.path)


def _relative(path: str, cwd: Path) -> str:
    """`path` relative to the project when it is inside it (as typed mentions are)."""
    p = Path(path)
    return str(p.relative_to(cwd)) if p.is_absolute() and p.is_relative_to(cwd) else path


def _mention(path: str, cwd: Path) -> str:
    shown = _relative(path, cwd)
    return f'@"{shown}"' if any(c.isspace() for c in shown) else f"@{shown}"


@frozen
class Prompt:
    """A prompt's content blocks as keel takes them: the text as typed (mentions included) and
    the blocks to attach after it (embedded resources, as `<attached-file>` blocks)."""

    text: str
    attached: tuple[str, ...] = ()


def prompt_text(blocks: Iterable[PromptBlock], cwd: Path) -> Prompt:
    """The prompt keel runs for ACP content blocks: text as it is; a linked file as an
    `@path` mention (keel attaches it as it does for a typed one); an embedded text resource
    (an editor buffer, a selection) as an attached block after the text. Images and audio were
    not advertised and are refused (`UnsupportedContent`)."""
    parts: list[str] = []
    attached: list[str] = []
    for block in blocks:
        match block:
            case TextContentBlock():
                parts.append(block.text)
            case ResourceContentBlock():
                path = _file_path(block.uri)
                parts.append(_mention(path, cwd) if path else block.uri)
            case EmbeddedResourceContentBlock(resource=TextResourceContents() as res):
                path = _file_path(res.uri)
                shown = _relative(path, cwd) if path else res.uri
                attached.append(f'<attached-file path="{shown}">\n{res.text}\n</attached-file>')
            case EmbeddedResourceContentBlock():
                raise UnsupportedContent("binary resources are not supported by keel over ACP")
            case ImageContentBlock():
                raise UnsupportedContent("images are not supported by keel over ACP yet")
            case AudioContentBlock():
                raise UnsupportedContent("audio is not supported by keel over ACP")
    return Prompt(_join(parts), tuple(attached))


def _join(parts: list[str]) -> str:
    """Text blocks and mentions joined as typed: a space between two pieces unless one side
    already has whitespace there."""
    out = ""
    for part in parts:
        if out and part and not out[-1].isspace() and not part[0].isspace():
            out += " "
        out += part
    return out


# -- replay ----------------------------------------------------------------------------------------


def replay(records: Iterable[Record], cwd: Path) -> list[Update]:
    """A session's journal as the updates that redraw it (`session/load`): each typed prompt,
    the model's thinking and text, every tool call with its outcome, and the plans."""
    updates: list[Update] = []
    calls: dict[str, ToolUse] = {}
    for record in records:
        match record.payload:
            case UserRecord(message, "prompt"):
                text = typed_prompt(message.text)
                if text:
                    updates.append(update_user_message_text(text))
            case AssistantRecord(message):
                calls.update((c.id, c) for c in message.tool_uses)
                updates.extend(assistant_updates(message, cwd))
            case ToolResultRecord(result):
                call = calls.get(result.tool_use_id)
                if call is None:
                    continue
                if call.name == PLAN_TOOL:
                    if (p := plan_of(call, result, None)) is not None:
                        updates.append(p)
                else:
                    updates.append(finished(call, result, cwd))
            case _:
                pass
    return updates


def assistant_updates(message: Message, cwd: Path, *, label: str = "") -> list[Update]:
    """An assistant message that was not streamed (replayed, or a subagent's): its thinking,
    text and tool calls."""
    out: list[Update] = []
    for block in message.blocks:
        match block:
            case Thinking(text=text, redacted=False) if text and not label:
                out.append(thought_chunk(text))
            case Text(text=text) if text and not label:
                out.append(message_chunk(text))
            case ToolUse() if block.name != PLAN_TOOL:
                out.append(announce(block, cwd, label=label))
            case _:
                pass
    return out


__all__ = [
    "KINDS",
    "MODEL_OPTION",
    "MODE_INFO",
    "MODE_OPTION",
    "PLAN_TOOL",
    "STOP_REASONS",
    "ConfigOption",
    "ModelChoice",
    "Prompt",
    "PromptBlock",
    "UnsupportedContent",
    "Update",
    "absolute",
    "announce",
    "assistant_updates",
    "config_options",
    "config_update",
    "diffs",
    "finished",
    "kind",
    "locations",
    "message_chunk",
    "mode_state",
    "mode_update",
    "plan",
    "plan_of",
    "prompt_text",
    "replay",
    "result_content",
    "started",
    "stop_reason",
    "thought_chunk",
    "title",
    "typed_prompt",
]
