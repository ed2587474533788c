"""The model that answers `prompt` hooks: one small request (no tools, a short answer) on the
session's provider. The model is the hook's own `model`, else the `hooks_model` setting, else
the session's model; a `provider/model` for another provider, or a Claude alias (`haiku`) on a
provider that is not Anthropic's, falls back to the session's model, said in the answer's
error when it fails. It never raises past the runner: the runner turns a failure into a
warning naming the hook."""

from __future__ import annotations

from keel.hooks.runner import PROMPT_SYSTEM, ModelCall
from keel.llm.messages import Message, Text
from keel.llm.provider import Provider, final_reply
from keel.llm.request import Request

#: Enough for `{"ok": false, "reason": "…"}` and a little prose around it.
MAX_ANSWER_TOKENS = 1024
_ALIASES = {"haiku", "sonnet", "opus"}


def pick_model(spec: str, *, provider: str, session_model: str) -> str:
    """The model name to send for `spec` on `provider` (the session's model when `spec` is
    empty or names something this provider cannot serve)."""
    spec = spec.strip()
    if not spec:
        return session_model
    if "/" in spec:
        family, name = spec.split("/", 1)
        return name if family == provider and name else session_model
    if spec in _ALIASES and provider != "anthropic":
        return session_model
    return spec


def model_call(provider: Provider, *, session_model: str, default: str = "") -> ModelCall:
    """A `ModelCall` for prompt hooks on `provider`."""

    async def ask(question: str, model: str) -> str:
        name = pick_model(model or default, provider=provider.name, session_model=session_model)
        request = Request(
            model=name,
            system=PROMPT_SYSTEM,
            messages=(Message("user", (Text(question),)),),
            max_tokens=MAX_ANSWER_TOKENS,
        )
        done = await final_reply(provider, request)
        if done is None:
            raise RuntimeError(f"{provider.name} ended the stream without an answer")
        return done.message.text

    return ask


__all__ = ["model_call", "pick_model"]
