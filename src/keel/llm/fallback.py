"""Fallbacks: when a model fails before it has shown anything, the next model in the user's list
answers instead (settings `fallbacks = {"anthropic/claude-sonnet-4-5": ["openai/gpt-5", …]}`).

This module owns when to switch (401, 402, 403, 404, 408, 429, 5xx, an unreachable server or a
stall: never a context overflow or a bad request, which another model would not fix), the notice
each switch gives, and the cooldown that keeps a failing model out of the way for a while (one
minute after a rate limit or a server error, ten otherwise). The last model in the list is always
tried. Each candidate keeps its own retries (`RetryingProvider`), so a switch comes only after
they are spent.

It must never switch once output has been shown: the user would see two models' words spliced.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import replace
from typing import Final

from keel.errors import UserError
from keel.frozen import frozen
from keel.llm.catalog import ModelInfo, ModelRef
from keel.llm.errors import APIError, ContextOverflow, StallError
from keel.llm.events import SHOWN, Notice, StreamEvent
from keel.llm.provider import ModelFacts, Provider, model_facts
from keel.llm.request import Request

#: Seconds a model sits out after a rate limit or a server error (soon over), or anything else
#: (a bad key, an unknown model, a dead server: not over soon).
SHORT_COOLDOWN: Final = 60.0
LONG_COOLDOWN: Final = 600.0
#: Statuses that make keel try the next model; other 4xx (400, 409, 413…) would fail there too.
_SWITCH_STATUSES: Final = frozenset({0, 401, 402, 403, 404, 408, 429})


def cooldown_after(error: APIError | StallError) -> float | None:
    """How long the failed model sits out, or None when this failure must not switch models."""
    if isinstance(error, StallError):
        return LONG_COOLDOWN
    if isinstance(error, ContextOverflow):
        return None
    if error.status == 429 or error.status >= 500:
        return SHORT_COOLDOWN
    if error.status in _SWITCH_STATUSES:
        return LONG_COOLDOWN
    return None


class Cooldowns:
    """When each `provider/model` may be tried again. Share one between the providers of a
    process (subagents, a model switch) so they all skip a model that just failed."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._until: dict[str, float] = {}

    def remaining(self, key: str) -> float:
        return max(0.0, self._until.get(key, 0.0) - self.clock())

    def start(self, key: str, seconds: float) -> None:
        self._until[key] = self.clock() + seconds


@frozen
class Candidate:
    ref: ModelRef
    info: ModelInfo


class FallbackProvider:
    """Tries `candidates` in order (the first is the model the user chose). `build` makes a
    candidate's provider the first time it is needed; a fallback that cannot be built (its key is
    missing) is skipped with a notice."""

    def __init__(
        self,
        candidates: list[Candidate],
        build: Callable[[ModelRef], Provider],
        *,
        primary: Provider,
        cooldowns: Cooldowns | None = None,
    ) -> None:
        self.candidates = candidates
        self.cooldowns = cooldowns or Cooldowns()
        self._build = build
        self._providers: dict[ModelRef, Provider] = {candidates[0].ref: primary}

    @property
    def name(self) -> str:
        return self.candidates[0].ref.provider

    async def stream(self, request: Request) -> AsyncGenerator[StreamEvent, None]:
        last = len(self.candidates) - 1
        for index, candidate in enumerate(self.candidates):
            key = str(candidate.ref)
            following = str(self.candidates[index + 1].ref) if index < last else ""
            wait = self.cooldowns.remaining(key)
            if wait and index < last:
                yield Notice(f"{key} is cooling down ({wait:.0f} s left); trying {following}")
                continue
            try:
                provider = self._provider(candidate.ref)
            except UserError as exc:
                if index == last:
                    raise
                yield Notice(f"skipping {key}: {exc.one_line()}", "warning")
                continue
            shown = False
            try:
                stream = provider.stream(self._request_for(index, request))
                async with contextlib.aclosing(stream):
                    async for event in stream:
                        shown = shown or isinstance(event, SHOWN)
                        yield event
                return
            except (APIError, StallError) as exc:
                seconds = cooldown_after(exc)
                if shown or seconds is None or index == last:
                    raise
                self.cooldowns.start(key, seconds)
                yield Notice(
                    f"{key} failed ({exc.message}); falling back to {following}", "warning"
                )

    def _provider(self, ref: ModelRef) -> Provider:
        provider = self._providers.get(ref)
        if provider is None:
            provider = self._providers[ref] = self._build(ref)
        return provider

    def _request_for(self, index: int, request: Request) -> Request:
        """The request as a fallback model gets it: its own model id, and no more output than
        it can give."""
        if index == 0:
            return request
        info = self.candidates[index].info
        return replace(
            request,
            model=self.candidates[index].ref.model,
            max_tokens=min(request.max_tokens, info.request_max_tokens),
        )

    async def model_facts(self, model: str) -> ModelFacts:
        """The facts of the model the user chose (a fallback's window is not the run's)."""
        return await model_facts(self._providers[self.candidates[0].ref], model)

    async def aclose(self) -> None:
        for provider in self._providers.values():
            await provider.aclose()
