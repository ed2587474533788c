"""What a front end shows: the loop's events, plus the few things that happen in the front end
itself (a prompt the user sent, a `!cmd` line, a slash command's output).

`ViewEvent` is the one stream every front end renders, live or replayed from a session file.
"""

from __future__ import annotations

from typing import Literal, TypeAlias

from keel.agent.events import Event
from keel.frozen import frozen


@frozen
class PromptSubmitted:
    """A prompt as the user typed it (files it mentions are attached to what the model gets)."""

    text: str
    attachments: tuple[str, ...] = ()


@frozen
class ShellRan:
    """A `!cmd` line the user ran directly; its output goes to the model with the next prompt."""

    command: str
    output: str
    exit_code: int | None
    seconds: float


@frozen
class Output:
    """What a slash command says: Markdown, plain text, or an error line."""

    text: str
    kind: Literal["markdown", "text", "error"] = "markdown"
    title: str = ""


@frozen
class Choice:
    """One entry of a picker (`/model`, `/resume`, `/rewind`)."""

    value: str
    label: str
    detail: str = ""
    #: Shown greyed out (a model whose provider has no key): it can be picked, and is refused.
    muted: bool = False


ViewEvent: TypeAlias = Event | PromptSubmitted | ShellRan | Output

__all__ = ["Choice", "Output", "PromptSubmitted", "ShellRan", "ViewEvent"]
