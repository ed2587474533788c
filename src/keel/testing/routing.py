"""Scripts for several conversations at once: a parent agent and its subagents.

Requests of concurrent conversations arrive in no fixed order, so one script queue cannot serve
them. Here each conversation has its own script, chosen by a key that appears in the
conversation's first user message (the parent's prompt, or the prompt a `task` call gave a
subagent), and each request gets the step numbered by the assistant messages already in it. A
request no key matches fails loudly, naming what it began with.

- `RoutedProvider`: an in-process provider for `Agent` tests.
- `routed_responder`: a `responder` for the loopback servers (Anthropic wire format), for tests
  that drive the real `keel` binary; it also survives a restart, since it counts the history.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from keel.llm.events import StreamEvent
from keel.llm.providers.scripted import ScriptedProvider
from keel.llm.request import Request
from keel.llm.script import ScriptDivergence, Step

if TYPE_CHECKING:
    from keel.testing.server import RecordedRequest


def _route(keys: Sequence[str], first_user_text: str) -> str:
    matching = [k for k in keys if k in first_user_text]
    if len(matching) != 1:
        what = "no script" if not matching else f"several scripts ({', '.join(matching)})"
        raise ScriptDivergence(
            f"{what} for a conversation starting {first_user_text[:120]!r}",
            hint="key each script by text that only its conversation's first message holds",
        )
    return matching[0]


class RoutedProvider:
    """One `ScriptedProvider` per conversation, picked by the first user message."""

    name = "scripted"

    def __init__(self, scripts: Mapping[str, Sequence[Step]], *, model: str = "scripted") -> None:
        self.routes = {
            key: ScriptedProvider(list(steps), model=model, by_history=True)
            for key, steps in scripts.items()
        }
        #: Every request, in arrival order, with the key it was routed to.
        self.requests: list[tuple[str, Request]] = []

    async def aclose(self) -> None:
        return None

    def stream(self, request: Request) -> AsyncGenerator[StreamEvent, None]:
        first = next((m for m in request.messages if m.role == "user"), None)
        key = _route(list(self.routes), first.text if first is not None else "")
        self.requests.append((key, request))
        return self.routes[key].stream(request)

    def of(self, key: str) -> list[Request]:
        """The requests of one conversation."""
        return [r for k, r in self.requests if k == key]


def routed_responder(
    scripts: Mapping[str, Sequence[Step]],
) -> Callable[[RecordedRequest], Step]:
    """A loopback-server responder playing `scripts` (Anthropic Messages request bodies)."""

    def respond(request: RecordedRequest) -> Step:
        body: dict[str, Any] = request.json or {}
        messages = body.get("messages", [])
        first = next((m for m in messages if m.get("role") == "user"), {"content": ""})
        key = _route(list(scripts), _text(first.get("content")))
        number = sum(1 for m in messages if m.get("role") == "assistant")
        steps = scripts[key]
        if number >= len(steps):
            raise ScriptDivergence(
                f"conversation {key!r} made request #{number + 1} but its script has "
                f"{len(steps)} step(s)"
            )
        return steps[number]

    return respond


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(
        b.get("text", "") for b in content or [] if isinstance(b, dict) and b.get("type") == "text"
    )


__all__ = ["RoutedProvider", "routed_responder"]
