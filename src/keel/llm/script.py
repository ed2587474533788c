"""The script language shared by `ScriptedProvider` and the loopback servers in `keel.testing`.

A script is a list of steps, one per model request: a `Reply` (what the model says) or a `Fault`
(what goes wrong). Replies are neutral assistant messages, so the same script drives every wire API.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import field
from typing import Any, Literal, TypeAlias

from keel.errors import ModelBehaviorError
from keel.frozen import mutable
from keel.llm.messages import Block, Message, StopReason, Text, Thinking, ToolUse, Usage
from keel.llm.request import Request

_ids = itertools.count(1)


def next_tool_id(prefix: str = "toolu_") -> str:
    return f"{prefix}{next(_ids):06d}"


@mutable
class Reply:
    """One model response. `stop_reason` defaults to `tool_use` when the message calls tools and
    `end_turn` otherwise. `truncate_tool_json` cuts the last tool call's arguments in half and ends
    with `max_tokens`, as a model that ran out of output mid-call does. `delay` is server-side
    think time before the first byte (seconds)."""

    message: Message
    usage: Usage = field(default_factory=lambda: Usage(input=100, output=20))
    stop_reason: StopReason | None = None
    truncate_tool_json: bool = False
    delay: float = 0.0
    #: Optional check of the request this reply answers; raise AssertionError to fail loudly.
    expect: Callable[[Request], None] | None = None

    @property
    def final_stop_reason(self) -> StopReason:
        if self.truncate_tool_json:
            return "max_tokens"
        if self.stop_reason is not None:
            return self.stop_reason
        return "tool_use" if self.message.tool_uses else "end_turn"


FaultKind: TypeAlias = Literal["status", "disconnect", "stall", "overflow"]


@mutable
class Fault:
    """Something going wrong on one request.

    - `status`: an error response with `status` (and `Retry-After: retry_after` if set).
    - `overflow`: the provider's prompt-too-long error.
    - `disconnect`: stream `reply` but drop the connection after `after_events` events.
    - `stall`: stream `reply`, go silent for `seconds` after `after_events` events, then finish.
    """

    kind: FaultKind
    status: int = 500
    retry_after: float | None = None
    after_events: int = 0
    seconds: float = 0.0
    reply: Reply | None = None
    message: str = ""


Step: TypeAlias = Reply | Fault


def reply(
    text: str = "",
    *tool_calls: tuple[str, dict[str, Any]],
    thinking: str = "",
    signature: str = "",
    usage: Usage | None = None,
    stop_reason: StopReason | None = None,
    provider: str = "",
    model: str = "",
) -> Reply:
    """A reply from parts: `reply("Done.")`, `reply("", ("read", {"path": "a.py"}))`."""
    blocks: list[Block] = []
    if thinking:
        blocks.append(Thinking(thinking, signature or f"sig-{next(_ids)}", source=provider))
    if text:
        blocks.append(Text(text))
    for name, args in tool_calls:
        blocks.append(ToolUse(next_tool_id(), name, args))
    msg = Message("assistant", tuple(blocks), provider=provider, model=model)
    r = Reply(msg, stop_reason=stop_reason)
    if usage is not None:
        r.usage = usage
    return r


class ScriptDivergence(ModelBehaviorError, AssertionError):
    """The run asked for something the script did not plan for."""
