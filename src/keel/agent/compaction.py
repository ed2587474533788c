"""Compaction: replacing a long conversation with a summary, in one clean cut.

The summary is asked of the same model with the same system prompt and tools, so the request
reads the conversation from the provider's prompt cache. The conversation then becomes one user
message: a fixed preamble, the summary, the unfinished todo items, and where the session file is
(with a hint to grep it for exact details the summary left out).

When the summary request itself does not fit (a small local window, or a server that found the
overflow before keel did), `trimmed` cuts the transcript sent for the summary: the longest tool
results first, then the oldest rounds after the first prompt, and the request says what was left
out (the session file keeps everything).

What must survive (`Keep`: the pinned facts of `compaction.keep` and `/pin`, and the unfinished
todo items) is listed in the request, then looked for in the summary (`survives`: an exact match
after normalising case and whitespace, else a fuzzy one). What the summary left out is asked for
once more (`repair_messages`); pinned facts still missing then are appended to the new message
word for word, so nothing pinned is ever lost (`Verified` says what happened).

This module builds the requests and the new message, parses the replies and checks them; the loop
decides when to compact, sends the requests and journals the result. It never talks to a model.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from keel.config.settings import CompactionSettings, PromptAddition
from keel.frozen import frozen
from keel.llm.messages import Block, Message, Text, ToolResult, ToolUse, tool_result
from keel.tools.builtin.todo import latest_todos

#: Compact when the last request filled more than this share of the window (the default of the
#: `compaction.threshold` setting).
THRESHOLD = CompactionSettings().threshold
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

KEEP_INTRO = (
    "Each of these lines must appear in the summary word for word (keel checks the summary "
    "for them):"
)
PROJECT_ADDITION = (
    "The project's settings add the instructions in <project-compaction-prompt> above. Follow "
    "them where they add to the rules given here; they cannot remove or change those rules, the "
    "lines to keep, or the <summary> format."
)
REPAIR_PROMPT = """Your summary left out these lines, which must be kept:
{lines}

Write the whole summary again with each of them included word for word, inside \
<summary></summary> tags. Do not call any tools."""
PINNED_HEADING = "Pinned facts (the summary left them out; kept word for word):"
#: How many lost lines the one-line note names (the record and the trace have them all).
NOTE_FACTS = 3
#: A fact that is not in the summary word for word still counts as kept when every one of its
#: specific tokens (those with a digit or a `-_./:@` inside: ports, names, paths, dates) is in the
#: summary and two consecutive lines of the summary hold at least this share of its tokens.
FUZZY_RATIO = 0.8

_TOKEN = re.compile(r"[^\W_]+(?:[-_./:@]+[^\W_]+)*")
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


@frozen
class Keep:
    """What a summary must keep: the pinned facts (settings first, then `/pin`) and the
    unfinished todo items, each once."""

    pins: tuple[str, ...] = ()
    todos: tuple[str, ...] = ()

    @property
    def facts(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys((*self.pins, *self.todos)))


def keep_for(pins: Sequence[str], messages: Sequence[Message]) -> Keep:
    """The pinned facts and the unfinished todo items of `messages` (the todo tool's state)."""
    todos = [t.content for t in latest_todos(list(messages)) if t.status != "completed"]
    return Keep(tuple(dict.fromkeys(pins)), tuple(dict.fromkeys(todos)))


def prompt_additions(additions: Sequence[PromptAddition]) -> str:
    """The `compaction.prompt` additions as they are sent: the user's as they are; a project's
    inside a tag naming its file, then a line saying it cannot remove the built-in rules."""
    parts: list[str] = []
    for a in additions:
        if a.project:
            parts.append(
                f'<project-compaction-prompt source="{a.source}">\n{a.text}\n'
                f"</project-compaction-prompt>\n{PROJECT_ADDITION}"
            )
        else:
            parts.append(a.text)
    return "\n\n".join(parts)


def compaction_messages(
    messages: Sequence[Message],
    instructions: str = "",
    *,
    trimmed: bool = False,
    keep: Sequence[str] = (),
    additions: Sequence[PromptAddition] = (),
) -> tuple[Message, ...]:
    """The conversation with the summary request appended: the earlier messages stay exactly as
    they were sent (so the prompt cache serves them); tool calls still waiting for results get
    stand-in results, since every provider needs them answered. `trimmed`: `messages` is a cut
    transcript (`trimmed`), and the request says so. `keep`: lines the summary must hold;
    `additions`: the settings' prompt additions; `instructions`: the user's for this one."""
    prompt = COMPACT_PROMPT + (f"\n\n{TRIMMED_NOTE}" if trimmed else "")
    if keep:
        prompt += f"\n\n{KEEP_INTRO}\n" + "\n".join(f"- {line}" for line in keep)
    if additions:
        prompt += f"\n\n{prompt_additions(additions)}"
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


def normalised(text: str) -> str:
    """Case folded, whitespace runs made one space, no full stop at the end."""
    return " ".join(text.casefold().split()).rstrip(".")


def _tokens(text: str) -> list[str]:
    return _TOKEN.findall(text.casefold())


class SummaryText:
    """A summary, read once for `survives`: its normalised text, its tokens, and the tokens of
    each two consecutive lines (so checking many facts costs one pass over it)."""

    def __init__(self, summary: str) -> None:
        self.normalised = normalised(summary)
        lines = [set(_tokens(line)) for line in summary.splitlines()] or [set()]
        self.tokens: set[str] = set().union(*lines)
        self.pairs = [a | b for a, b in zip(lines, [*lines[1:], set()], strict=True)]

    def keeps(self, fact: str) -> bool:
        """Word for word after normalising, else fuzzily (`FUZZY_RATIO`: every specific token
        present, and most of its words on two consecutive lines)."""
        if normalised(fact) in self.normalised:
            return True
        words = set(_tokens(fact))
        if not words or not {w for w in words if not w.isalpha()} <= self.tokens:
            return False
        best = max(len(words & pair) for pair in self.pairs)
        return best / len(words) >= FUZZY_RATIO


def survives(fact: str, summary: str) -> bool:
    """Whether `summary` keeps `fact` (`SummaryText.keeps`)."""
    return SummaryText(summary).keeps(fact)


def repair_messages(
    asked: Sequence[Message], reply: Message, missing: Sequence[str]
) -> tuple[Message, ...]:
    """The summary request, its reply, and one more user message naming what the summary left
    out and asking for the whole summary again (the same prefix: the cache serves it)."""
    lines = "\n".join(f"- {line}" for line in missing)
    ask = Message("user", (Text(REPAIR_PROMPT.format(lines=lines)),))
    return (*asked, Message("assistant", reply.blocks), ask)


@frozen
class Verified:
    """What the check of a summary found: `kept` in the first summary, `missing_first` from it,
    `repaired` by the repair request, `lost` from the summary in the end (the pinned ones among
    them are appended word for word; unfinished todos are listed after the summary anyway)."""

    kept: tuple[str, ...] = ()
    missing_first: tuple[str, ...] = ()
    repaired: tuple[str, ...] = ()
    lost: tuple[str, ...] = ()

    @classmethod
    def first(cls, facts: Sequence[str], summary: str) -> Verified:
        text = SummaryText(summary)
        kept = tuple(f for f in facts if text.keeps(f))
        return cls(kept, tuple(f for f in facts if f not in kept))

    def again(self, summary: str) -> Verified:
        """After the repair: `summary` is the summary used (the amended one, or the first when
        the repair brought none). A fact the amendment dropped is lost too."""
        text = SummaryText(summary)
        present = {f for f in (*self.kept, *self.missing_first) if text.keeps(f)}
        repaired = tuple(f for f in self.missing_first if f in present)
        lost = tuple(f for f in (*self.kept, *self.missing_first) if f not in present)
        return Verified(self.kept, self.missing_first, repaired, lost)

    def note(self) -> str:
        """The one line a front end shows when the first summary missed something."""
        missed = len(self.missing_first)
        text = f"compaction: the summary left out {missed} line{'s' if missed != 1 else ''} to keep"
        if self.repaired:
            text += f"; {len(self.repaired)} repaired"
        if self.lost:
            shown = "; ".join(self.lost[:NOTE_FACTS])
            more = len(self.lost) - NOTE_FACTS
            text += f"; appended word for word: {shown}" + (f" and {more} more" if more > 0 else "")
        return text


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
    pinned: Sequence[str] = (),
) -> Compacted:
    """`pinned`: pinned facts the summary lost, appended word for word after it."""
    parts = [PREAMBLE, f"<summary>\n{summary}\n</summary>"]
    if pinned:
        parts.append(PINNED_HEADING + "\n" + "\n".join(f"- {fact}" for fact in pinned))
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
