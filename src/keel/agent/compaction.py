"""Compaction: replacing a long conversation with a summary, in one clean cut.

The summary is asked of the same model with the same system prompt and tools, so the request
reads the conversation from the provider's prompt cache. The conversation then becomes one user
message: a fixed preamble, the summary, the unfinished todo items, and where the session file is
(with a hint to grep it for exact details the summary left out).

When the summary request itself does not fit (a small local window, or a server that found the
overflow before keel did), `trimmed` cuts the transcript sent for the summary: the longest tool
results first, then the oldest rounds after the first prompt, and the request says what was left
out (the session file keeps everything).

This module builds the request and the new message and parses the reply; the loop decides when
to compact and journals the result.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from keel.frozen import frozen
from keel.llm.messages import Block, Message, Text, ToolResult, ToolUse, tool_result
from keel.tools.builtin.todo import latest_todos

#: Compact when the last request filled more than this share of the window.
THRESHOLD = 0.8
#: …and the conversation has at least this many messages.
MIN_MESSAGES = 4
SUMMARY_MAX_TOKENS = 32_000
SUMMARY_MIN_TOKENS = 1_000
#: Characters per token when estimating (errs low on purpose: a real count is usually higher).
CHARS_PER_TOKEN = 4

COMPACT_PROMPT = """\
The conversation so far is about to be replaced by a summary, because the context window is \
nearly full. Write that summary now, inside <summary></summary> tags. Do not call any tools.

Cover, in this order:
1. The user's requests and instructions: keep their words as close to verbatim as you can.
2. The problems found and the options considered.
3. Decisions made and constraints to respect, verbatim where they matter.
4. The current state: what is done, what files were changed and how, what was verified.
5. Open items: what remains to do, and what you were doing when this summary was asked for.
6. Exact details worth keeping: commands, file paths, error messages, names, numbers.

Condense your own reasoning; keep the user's words."""

PREAMBLE = (
    "This session continues from an earlier conversation that was summarized because the "
    "context window filled up. The summary below replaces the earlier messages."
)
CONTINUE = "Continue the task from where it left off."

#: A tool result longer than this is the first thing left out of a summary request that does not fit.
LARGE_RESULT_CHARS = 2_000
TRIMMED_NOTE = (
    "Some earlier messages or long tool results were left out of this request so that it fits "
    "the context window; summarize what is here, and say that older details are in the session "
    "file."
)

_OPEN = re.compile(r"<summary>", re.IGNORECASE)
_CLOSE = re.compile(r"</summary>", re.IGNORECASE)


def summary_cap(window: int, max_output: int) -> int:
    """Output tokens allowed for the summary: 32k, the model's max output, a quarter of the
    window, whichever is least, and never below 1,000."""
    return max(SUMMARY_MIN_TOKENS, min(SUMMARY_MAX_TOKENS, max_output, window // 4))


def estimate_tokens(messages: Sequence[Message]) -> int:
    chars = 0
    for message in messages:
        for block in message.blocks:
            text = getattr(block, "text", None)
            if isinstance(text, str):
                chars += len(text)
            elif isinstance(block, ToolUse):
                chars += len(str(block.input))
            else:
                chars += 6400  # an image, roughly 1,600 tokens
    return chars // CHARS_PER_TOKEN


def compaction_messages(
    messages: Sequence[Message], instructions: str = "", *, trimmed: bool = False
) -> tuple[Message, ...]:
    """The conversation with the summary request appended: the earlier messages stay exactly as
    they were sent (so the prompt cache serves them); tool calls still waiting for results get
    stand-in results, since every provider needs them answered. `trimmed`: `messages` is a cut
    transcript (`trimmed`), and the request says so."""
    prompt = COMPACT_PROMPT + (f"\n\n{TRIMMED_NOTE}" if trimmed else "")
    prompt += f"\n\nAlso: {instructions.strip()}" if instructions.strip() else ""
    out = list(messages)
    last = out[-1] if out else None
    if last is not None and last.role == "assistant" and last.tool_uses:
        waiting = tuple(
            tool_result(c.id, "not run yet: the conversation is being summarized", is_error=True)
            for c in last.tool_uses
        )
        out.append(Message("user", (*waiting, Text(prompt))))
    elif last is not None and last.role == "user":
        out[-1] = Message("user", (*last.blocks, Text(prompt)))
    else:
        out.append(Message("user", (Text(prompt),)))
    return tuple(out)


def trimmed(messages: Sequence[Message], budget: int) -> list[Message] | None:
    """`messages` cut to about `budget` estimated tokens for a summary request: the longest tool
    results replaced by a stub first, then the oldest rounds after the first message dropped
    (whole rounds, so every call keeps its result and the roles still alternate). None when the
    first message and the last round alone do not fit."""
    out = list(messages)
    if estimate_tokens(out) <= budget:
        return out
    large = sorted(
        (
            (len(block.text), i, j)
            for i, message in enumerate(out)
            for j, block in enumerate(message.blocks)
            if isinstance(block, ToolResult) and len(block.text) > LARGE_RESULT_CHARS
        ),
        reverse=True,
    )
    total = estimate_tokens(out)
    for size, i, j in large:
        result = out[i].blocks[j]
        assert isinstance(result, ToolResult)
        stub = tool_result(
            result.tool_use_id,
            f"[{size} characters left out of the summary request]",
            is_error=result.is_error,
        )
        blocks: list[Block] = list(out[i].blocks)
        blocks[j] = stub
        out[i] = Message(out[i].role, tuple(blocks), out[i].provider, out[i].model)
        total -= (size - len(stub.text)) // CHARS_PER_TOKEN
        if total <= budget:
            return out
    # Drop the oldest rounds: cut before an assistant message, keeping the first message and
    # the last two (the last reply and what answers it).
    starts = [k for k in range(2, len(out) - 1) if out[k].role == "assistant"]
    for k in starts:
        kept = [out[0], *out[k:]]
        if estimate_tokens(kept) <= budget:
            return kept
    return None


def parse_summary(reply: str) -> str:
    """The text inside <summary> tags. No tag: the whole reply; an opening without a closing tag:
    everything after it; several openings: the last one."""
    openings = list(_OPEN.finditer(reply))
    if not openings:
        return reply.strip()
    start = openings[-1].end()
    close = _CLOSE.search(reply, start)
    return reply[start : close.start() if close else len(reply)].strip()


@frozen
class Compacted:
    """The conversation that replaces the old one, as one user message's text."""

    text: str
    tokens_after: int


def compacted_message(
    summary: str,
    messages: Sequence[Message],
    *,
    session_path: str | None,
    mid_turn: bool,
) -> Compacted:
    parts = [PREAMBLE, f"<summary>\n{summary}\n</summary>"]
    open_todos = [t for t in latest_todos(list(messages)) if t.status != "completed"]
    if open_todos:
        lines = "\n".join(
            f"- [{'>' if t.status == 'in_progress' else ' '}] {t.content}" for t in open_todos
        )
        parts.append(f"Unfinished todo items:\n{lines}")
    if session_path:
        parts.append(
            f"The full transcript before this point is in {session_path} (JSON lines). If you "
            "need an exact detail the summary left out (a command, an error, a path), grep it "
            "there rather than guessing."
        )
    if mid_turn:
        parts.append(CONTINUE)
    text = "\n\n".join(parts)
    return Compacted(text, len(text) // CHARS_PER_TOKEN)
