"""LM Studio (`lmstudio/…` models): Chat Completions, plus the window the model is loaded with.

LM Studio speaks OpenAI's Chat Completions at `…/v1`; its own REST API (`GET /api/v0/models`)
says how long a context each model was loaded with (`loaded_context_length`) or can take
(`max_context_length`). This module asks before a model's first request, so compaction and the context meter use the window the server really
has rather than a guess. A server that does not answer (an older LM Studio, another server behind
the same URL) leaves the catalog's window standing.

It must never fail a request because the model information could not be read.
"""

from __future__ import annotations

import contextlib

from keel.llm.http import HTTPSettings
from keel.llm.provider import ModelFacts
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

    async def model_facts(self, model: str) -> ModelFacts:
        import httpx

        with contextlib.suppress(httpx.HTTPError):  # no answer: nothing known
            await self.prepare(Request(model=model, system="", messages=()))
        return ModelFacts(self.windows.get(model, 0))

    async def prepare(self, request: Request) -> None:
        if request.model in self.windows:
            return
        # The list, not `/api/v0/models/{model}`: LM Studio's ids hold slashes (`qwen/qwen3-8b`).
        root = self.base_url.removesuffix("/v1")
        response = await self._http().get(f"{root}/api/v0/models", headers=self.headers())
        listed: object = None
        if response.status_code == 200:
            try:
                listed = response.json()
            except ValueError:
                listed = None  # not LM Studio's REST API behind this URL
        entries = listed.get("data") if isinstance(listed, dict) else None
        for entry in entries if isinstance(entries, list) else ():
            if isinstance(entry, dict) and isinstance(entry.get("id"), str):
                length = entry.get("loaded_context_length") or entry.get("max_context_length")
                self.windows[entry["id"]] = length if isinstance(length, int) else 0
        self.windows.setdefault(request.model, 0)
