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
class WebSearchOptions:
    """The provider's own server-side web search, offered with the tools (Anthropic's
    `web_search` tool, OpenAI's `web_search`, Gemini's `google_search` grounding). keel runs
    nothing: the provider searches and the reply carries `WebSearch` blocks and citations.
    Fixed per context, like the tools, since it is part of the prompt prefix.

    `max_uses` caps searches per request (Anthropic only; None: the provider's default).
    `allowed_domains` / `blocked_domains` narrow the results where the provider can (Anthropic
    takes one or the other, OpenAI only allowed ones, Gemini only blocked ones)."""

    max_uses: int | None = None
    allowed_domains: tuple[str, ...] = ()
    blocked_domains: tuple[str, ...] = ()


@frozen
class Request:
    model: str
    system: str
    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...] = ()
    #: The provider's server-side search, when the model's profile has one and it is on.
    web_search: WebSearchOptions | None = None
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
