"""The model's streamed text as a Markdown widget. A module of its own because Textual's Markdown
brings markdown-it, linkify and pygments (about a tenth of the terminal UI's start-up): the app
imports it in the background once the prompt is up (`KeelApp.on_mount`), not before."""

from __future__ import annotations

from textual.widgets import Markdown


class Reply(Markdown):
    """The model's text, rendered as Markdown as it streams."""

    def __init__(self) -> None:
        super().__init__(classes="reply")
        self.text = ""

    async def add(self, text: str) -> None:
        self.text += text
        await self.append(text)


__all__ = ["Reply"]
