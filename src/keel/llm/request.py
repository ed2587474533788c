"""What the loop asks a provider for: one neutral request, no credentials, no transport."""

from __future__ import annotations

from dataclasses import field, replace
from typing import Any, Literal, TypeAlias

from keel.frozen import frozen
from keel.llm.messages import Message

Effort: TypeAlias = Literal["low", "medium", "high", "max"]


@frozen
class ToolSpec:
    """A tool as the model sees it."""

    name: str
    description: str
    input_schema: dict[str, Any]


@frozen
class Request:
    model: str
    system: str
    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...] = ()
    max_tokens: int = 16_000
    effort: Effort | None = None
    temperature: float | None = None
    top_p: float | None = None
    #: A stable key per conversation (the session id); providers that key their prompt cache
    #: on it (OpenAI's `prompt_cache_key`) send it.
    cache_key: str = ""
    metadata: dict[str, str] = field(default_factory=dict)


@frozen
class Sampling:
    """A user's sampling defaults for one model (`models.<id>.temperature` / `top_p` in settings),
    applied to requests that do not set their own."""

    temperature: float | None = None
    top_p: float | None = None

    def apply(self, request: Request) -> Request:
        temperature = request.temperature if request.temperature is not None else self.temperature
        top_p = request.top_p if request.top_p is not None else self.top_p
        if temperature == request.temperature and top_p == request.top_p:
            return request
        return replace(request, temperature=temperature, top_p=top_p)
