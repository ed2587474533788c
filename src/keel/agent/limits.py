"""Limits on a run: model turns per prompt, a token budget and a USD budget.

Budgets count the four usage tiers together (input, output, cache reads, cache writes), so local
and subscription models count too. Each budget warns once at `warn_at` of its cap and stops the
turn with `budget` once reached. Unattended runs (`keel -p`, subagents) get a token budget of
`DEFAULT_UNATTENDED_TOKENS` unless one is configured; interactive runs get none by default.

A subagent has a `Spend` of its own whose additions also count in its parent's, so its own cap
and every cap above it hold at once (`Agent.budgets`).

Caps hold before a request is sent, not only after (`admit`): the request's input is priced as if
nothing were cached, its `max_tokens` is lowered to what the remainder pays for at the output
price, and that worst case is held (`Spend.hold`) until the reply is counted, so requests of a
tree in flight at once (parallel subagents) cannot together spend past a cap. When the remainder
cannot pay for the input and `min_output_tokens` of reply, the request is not sent (`OverBudget`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import field

from keel.errors import RunError, UserError
from keel.frozen import frozen, mutable
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
#: The least reply a budget must still pay for, in output tokens, for a request to be sent
#: (`budget.min_output_tokens`): below it, a reply is too short to be of use, and the run stops.
DEFAULT_MIN_OUTPUT_TOKENS = 1024
#: Tokens a provider adds to a request that no estimate of its text sees (a tool-use prompt of
#: its own, ~350 tokens on Anthropic; message framing): counted when a budget prices a request
#: whose input is estimated, not yet counted by its server.
UNSEEN_PROMPT_TOKENS = 400


@frozen
class Limits:
    max_turns: int = DEFAULT_MAX_TURNS
    max_tokens: int | None = None
    max_usd: float | None = None
    warn_at: float = 0.8
    min_output_tokens: int = DEFAULT_MIN_OUTPUT_TOKENS

    def __post_init__(self) -> None:
        if self.max_turns < 1:
            raise UserError("max turns must be at least 1")
        if self.max_tokens is not None and self.max_tokens <= 0:
            raise UserError("the token budget must be positive")
        if self.max_usd is not None and not (math.isfinite(self.max_usd) and self.max_usd > 0):
            raise UserError(f"the USD budget must be a positive number, not {self.max_usd}")
        if not 0 < self.warn_at <= 1:
            raise UserError("warn_at must be in (0, 1]")
        if self.min_output_tokens < 1:
            raise UserError("budget.min_output_tokens must be at least 1")


@mutable
class Spend:
    """What a session has used (its subagents' spend included), and which budget warnings were
    already given."""

    usage: Usage = field(default_factory=Usage)
    cost: float = 0.0
    warned: set[str] = field(default_factory=set)
    #: A subagent's spend also counts in its parent's.
    parent: Spend | None = None
    #: What this run used itself, without its subagents' (the per-agent view of a tree).
    own_usage: Usage = field(default_factory=Usage)
    own_cost: float = 0.0
    #: The worst case of the requests in flight in this tree (`hold`), as (USD, tokens).
    held_usd: float = 0.0
    held_tokens: int = 0

    def add(self, usage: Usage, cost: float) -> None:
        self.own_usage = self.own_usage + usage
        self.own_cost += cost
        spend: Spend | None = self
        while spend is not None:
            spend.usage = spend.usage + usage
            spend.cost += cost
            spend = spend.parent

    def hold(self, usd: float, tokens: int) -> None:
        """Count a request's worst case against this spend and every one above it until
        `hold(-usd, -tokens)` releases it (after its reply was added)."""
        spend: Spend | None = self
        while spend is not None:
            spend.held_usd += usd
            spend.held_tokens += tokens
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


class OverBudget(RunError):
    """A request was not sent: the budget left cannot pay for its input and a useful reply.
    The loop stops the turn with `budget`; the message says what was left and what was needed,
    `cap` which cap (`usd` or `tokens`), `own` whether it is the run's own (else a cap of the
    run it belongs to)."""

    def __init__(self, message: str, *, cap: str, own: bool) -> None:
        super().__init__(message, hint="raise the budget, or lower budget.min_output_tokens")
        self.cap = cap
        self.own = own


@frozen
class RequestCost:
    """What a request costs before its reply: its input at worst (`input_tokens`, nothing cached,
    priced at `input_usd`) and the price of one output token (USD; 0 when unpriced)."""

    input_tokens: int
    input_usd: float
    output_usd: float


@frozen
class Admission:
    """A request's `max_tokens` after the budgets (`lowered`: a budget lowered it), and the worst
    case to hold while it is in flight."""

    max_tokens: int
    lowered: bool
    held_usd: float
    held_tokens: int


def admit(budgets: Sequence[tuple[Limits, Spend, str]], asked: int, cost: RequestCost) -> Admission:
    """Pure: `asked` (the request's `max_tokens`) lowered to what every budget's remainder pays
    for after the input, or `OverBudget` when one cannot pay for the input plus its limits'
    `min_output_tokens` (or `asked`, if less). `budgets`: (limits, spend, whose: "the" or "the
    session's") from the run's own out to the outermost."""
    max_tokens = asked
    for limits, spend, whose in budgets:
        floor = min(limits.min_output_tokens, asked)
        if limits.max_usd is not None and cost.output_usd > 0:
            left = limits.max_usd - spend.cost - spend.held_usd
            pays = math.floor((left - cost.input_usd) / cost.output_usd)
            if pays < floor:
                raise OverBudget(
                    f"budget: ${max(left, 0.0):.4f} left of {whose} ${limits.max_usd:.4f} USD "
                    f"budget; the next request needs ~${cost.input_usd + floor * cost.output_usd:.4f} "
                    f"(~{cost.input_tokens:,} input tokens, ${cost.input_usd:.4f}, and at least "
                    f"{floor:,} output tokens, ${floor * cost.output_usd:.4f})",
                    cap="usd",
                    own=whose == "the",
                )
            max_tokens = min(max_tokens, pays)
        if limits.max_tokens is not None:
            left_tokens = limits.max_tokens - spend.usage.total - spend.held_tokens
            pays = left_tokens - cost.input_tokens
            if pays < floor:
                raise OverBudget(
                    f"budget: {max(left_tokens, 0):,} tokens left of {whose} {limits.max_tokens:,}-"
                    f"token budget; the next request needs ~{cost.input_tokens + floor:,} "
                    f"(~{cost.input_tokens:,} input and at least {floor:,} output tokens)",
                    cap="tokens",
                    own=whose == "the",
                )
            max_tokens = min(max_tokens, pays)
    return Admission(
        max_tokens,
        max_tokens < asked,
        cost.input_usd + max_tokens * cost.output_usd,
        cost.input_tokens + max_tokens,
    )
