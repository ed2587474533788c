"""What the loop asks a provider for: one neutral request, no credentials, no transport."""

from __future__ import annotations

from dataclasses import field
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
