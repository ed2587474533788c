"""Limits on a run: model turns per prompt, a token budget and a USD budget.

Budgets count the four usage tiers together (input, output, cache reads, cache writes), so local
and subscription models count too. Each budget warns once at `warn_at` of its cap and stops the
turn with `budget` once reached. Unattended runs (`keel -p`, subagents) get a token budget of
`DEFAULT_UNATTENDED_TOKENS` unless one is configured; interactive runs get none by default.

A subagent has a `Spend` of its own whose additions also count in its parent's, so its own cap
and every cap above it hold at once (`Agent.budgets`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from keel.errors import UserError
from keel.frozen import frozen
from keel.llm.catalog import SMALL_WINDOW
from keel.llm.messages import Usage

DEFAULT_MAX_TURNS = 200
#: The token budget of a run nobody watches, all four tiers. Every request rereads the whole
#: context (mostly as cache reads, which count), so a session spends about turns x context: a
#: long coding task of 100-200 turns at a 30k-50k-token context counts 3M to 10M. 10M lets
#: that finish and still stops a runaway (a loop on a 100k-token context after some 100 turns:
#: about $3 at Sonnet-class cache-read prices, $30 uncached). The seed's 200,000 stopped a task
#: on a 2 kB file after 37 turns.
DEFAULT_UNATTENDED_TOKENS = 10_000_000


@frozen
class Limits:
    max_turns: int = DEFAULT_MAX_TURNS
    max_tokens: int | None = None
    max_usd: float | None = None
    warn_at: float = 0.8

    def __post_init__(self) -> None:
        if self.max_turns < 1:
            raise UserError("max turns must be at least 1")
        if self.max_tokens is not None and self.max_tokens <= 0:
            raise UserError("the token budget must be positive")
        if self.max_usd is not None and not (math.isfinite(self.max_usd) and self.max_usd > 0):
            raise UserError(f"the USD budget must be a positive number, not {self.max_usd}")
        if not 0 < self.warn_at <= 1:
            raise UserError("warn_at must be in (0, 1]")


@dataclass
class Spend:
    """What a session has used, and which budget warnings were already given."""

    usage: Usage = field(default_factory=Usage)
    cost: float = 0.0
    warned: set[str] = field(default_factory=set)
    #: A subagent's spend also counts in its parent's.
    parent: Spend | None = None

    def add(self, usage: Usage, cost: float) -> None:
        spend: Spend | None = self
        while spend is not None:
            spend.usage = spend.usage + usage
            spend.cost += cost
            spend = spend.parent


@frozen
class BudgetCheck:
    exhausted: str | None  # a sentence for the user, when a cap is reached
    #: Caps past `warn_at`, as (cap name, sentence); the caller warns once per cap.
    warnings: tuple[tuple[str, str], ...]


def check_budget(limits: Limits, spend: Spend) -> BudgetCheck:
    """Pure: where `spend` stands against `limits`."""
    exhausted = None
    warnings = []
    caps = (
        ("tokens", limits.max_tokens, float(spend.usage.total), "{:,.0f} tokens"),
        ("usd", limits.max_usd, spend.cost, "${:.4f}"),
    )
    for name, cap, used, fmt in caps:
        if cap is None:
            continue
        if used >= cap:
            exhausted = f"budget reached: {fmt.format(used)} of {fmt.format(cap)}"
        elif used >= cap * limits.warn_at:
            kind = "token" if name == "tokens" else "USD"
            warnings.append(
                (
                    name,
                    f"{used / cap:.0%} of the {kind} budget used ({fmt.format(used)} of {fmt.format(cap)})",
                )
            )
    return BudgetCheck(exhausted, tuple(warnings))


#: The least `max_tokens` a request asks for, however full the window: when even that does not
#: fit, the server says the prompt is too long, and overflow recovery takes over.
MIN_OUTPUT_TOKENS = 512
#: Kept free beside an estimated context, as a share of it: estimates count 4 characters a
#: token, and tokenizers find more tokens than that in code.
ESTIMATE_MARGIN = 0.1
#: In a small window, one reply gets at most 1/this of it.
SMALL_REPLY_SHARE = 4


def output_budget(window: int, context: int, max_output: int) -> int:
    """`max_tokens` for a request holding about `context` tokens: what the model may write
    (`max_output`), but no more than the window leaves after the context and a margin, and never
    below `MIN_OUTPUT_TOKENS` (nor above `max_output`). A 4k window with 3k of context asks for
    about 800 tokens, not the 16k an unknown model may write; a large window changes nothing.
    In a small window (`SMALL_WINDOW`: a local model) one reply gets at most a quarter of it: a
    small model that starts repeating itself would otherwise write until the window is full, at
    a few tokens a second."""
    room = window - context - int(context * ESTIMATE_MARGIN)
    if 0 < window <= SMALL_WINDOW:
        room = min(room, window // SMALL_REPLY_SHARE)
    return max(min(MIN_OUTPUT_TOKENS, max_output), min(max_output, room))
