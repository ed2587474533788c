"""Helpers for the interactive front end's tests: a controller over a scripted provider, a front
end that records what it is shown and answers from a list, and a provider that holds a stream
open until the test lets it go (to interrupt mid-stream)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence
from pathlib import Path

from keel.cli.main import build_parser
from keel.config.settings import load_settings
from keel.llm.catalog import ModelRef
from keel.llm.events import Done, StreamEvent, TextDelta
from keel.llm.messages import Message, Text, Usage
from keel.llm.request import Request
from keel.permissions.gate import PermissionReply, PermissionRequest
from keel.testing import ScriptedProvider
from keel.testing import Step as ScriptStep
from keel.tui.control import AgentFactory, Controller
from keel.tui.view import Choice, ViewEvent

MODEL = ModelRef("anthropic", "claude-sonnet-4-5")


class Hang:
    """A step of `HangingProvider`: stream `text` in pieces, then wait until cancelled."""

    def __init__(self, text: str) -> None:
        self.text = text


class HangingProvider:
    """Answers each request with its next step: a script `Reply`, or a `Hang` (a model caught
    mid-answer, to be interrupted). `streaming` is set once a hang has streamed its text."""

    name = "scripted"

    def __init__(self, *steps: ScriptStep | Hang) -> None:
        self.steps = list(steps)
        self.requests: list[Request] = []
        self.streaming = asyncio.Event()

    async def aclose(self) -> None:
        return None

    async def stream(self, request: Request) -> AsyncGenerator[StreamEvent, None]:
        self.requests.append(request)
        step = self.steps.pop(0)
        if isinstance(step, Hang):
            for i in range(0, len(step.text), 8):
                yield TextDelta(step.text[i : i + 8])
            self.streaming.set()
            await asyncio.sleep(3600)
            yield Done(Message("assistant", (Text(step.text),)), Usage(1, 1), "end_turn")
            return
        async for event in ScriptedProvider([step], model=MODEL.model).stream(request):
            yield event


class Recorder:
    """A front end that keeps what it is shown and answers questions and picks from lists."""

    def __init__(
        self, answers: Sequence[PermissionReply] = (), picks: Sequence[str | None] = ()
    ) -> None:
        self.events: list[ViewEvent] = []
        self.answers = list(answers)
        self.picks = list(picks)
        self.asked: list[PermissionRequest] = []
        self.offered: list[tuple[str, list[Choice]]] = []
        self.inputs: list[str] = []
        self.exited = False

    def show(self, event: ViewEvent) -> None:
        self.events.append(event)

    def reset(self, events: Sequence[ViewEvent]) -> None:
        self.events = list(events)

    def refresh_status(self) -> None:
        return None

    def set_input(self, text: str) -> None:
        self.inputs.append(text)

    def exit(self) -> None:
        self.exited = True

    async def ask(self, request: PermissionRequest) -> PermissionReply:
        self.asked.append(request)
        return self.answers.pop(0)

    async def pick(self, title: str, choices: Sequence[Choice]) -> str | None:
        self.offered.append((title, list(choices)))
        return self.picks.pop(0)


async def make_controller(
    project: Path, provider: object, *argv: str, start: bool = True
) -> Controller:
    """A controller for `project` whose every agent talks to `provider` (named as the model's
    provider, so a session it wrote resumes under the same fingerprint)."""
    provider.name = MODEL.provider  # type: ignore[attr-defined]
    args = build_parser().parse_args(["--model", str(MODEL), *argv])
    factory = AgentFactory(
        args,
        cwd=project,
        settings=load_settings(project),
        provider_for=lambda _ref: provider,  # type: ignore[arg-type,return-value]
    )
    controller = Controller(factory)
    if start:
        await controller.start_fresh(MODEL)
    return controller


def sent_text(request: Request) -> str:
    """The text of the last user message of a request (notes and tool results included)."""
    message = request.messages[-1]
    return "\n".join(getattr(block, "text", "") for block in message.blocks)
