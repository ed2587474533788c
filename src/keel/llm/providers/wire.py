"""Small pieces the Gemini and Ollama adapters share (the OpenAI ones share theirs through
`openai_responses`): which tool a result answers, and the JSON text of a whole tool call.

Both wire APIs name the function a tool result answers, where the neutral model keeps only the
call's id; `CallNames` remembers the names as assistant messages are encoded. Nothing here knows
a wire format.
"""

from __future__ import annotations

import json

from keel.llm.messages import Message, ToolUse


class CallNames:
    """Tool-call id → tool name, filled as assistant messages are encoded. Encoding runs in
    conversation order and a result always follows its call, so a result's name is known by the
    time it is encoded."""

    #: The name sent for a result whose call was never seen (a hand-built transcript).
    UNKNOWN = "unknown_tool"

    def __init__(self) -> None:
        self._names: dict[str, str] = {}

    def learn(self, message: Message) -> None:
        for block in message.blocks:
            if isinstance(block, ToolUse):
                self._names[block.id] = block.name

    def __getitem__(self, call_id: str) -> str:
        return self._names.get(call_id, self.UNKNOWN)


def call_json(arguments: object) -> str:
    """A whole call's arguments as the single `ToolUseDelta` of an API that sends calls whole."""
    return json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))
