"""LM Studio (`lmstudio/…` models): Chat Completions, plus the window the model is loaded with.

LM Studio speaks OpenAI's Chat Completions at `…/v1`; its own REST API
(`GET /api/v0/models/{model}`) says how long a context the model was loaded with
(`loaded_context_length`) or can take (`max_context_length`). This module asks once per model
before the first request, so compaction and the context meter use the window the server really
has rather than a guess. A server that does not answer (an older LM Studio, another server behind
the same URL) leaves the catalog's window standing.

It must never fail a request because the model information could not be read.
"""

from __future__ import annotations

from keel.llm.http import HTTPSettings
from keel.llm.providers.openai_chat import OpenAIChatProvider
from keel.llm.request import Request


class LMStudioProvider(OpenAIChatProvider):
    """`OpenAIChatProvider` that learns each model's loaded window from LM Studio."""

    def __init__(self, *, base_url: str, api_key: str, settings: HTTPSettings) -> None:
        super().__init__(base_url=base_url, api_key=api_key, settings=settings)
        #: Model → its loaded window (0: the server did not say).
        self.windows: dict[str, int] = {}

    def reported_window(self, model: str) -> int:
        return self.windows.get(model, 0)

    async def prepare(self, request: Request) -> None:
        if request.model in self.windows:
            return
        root = self.base_url.removesuffix("/v1")
        response = await self._http().get(
            f"{root}/api/v0/models/{request.model}", headers=self.headers()
        )
        window = 0
        if response.status_code == 200:
            try:
                info = response.json()
            except ValueError:
                info = None  # not LM Studio's REST API behind this URL
            if isinstance(info, dict):
                length = info.get("loaded_context_length") or info.get("max_context_length")
                window = length if isinstance(length, int) and length > 0 else 0
        self.windows[request.model] = window
