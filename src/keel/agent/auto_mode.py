"""Auto mode inside a running agent: the gate's questions go to the classifier
(`keel.permissions.auto`) with the user's request and the recent conversation; its request is
reported like any other (`RequestStarted`/`RequestFinished` with purpose `auto-mode`), its cost
counts in the run's spend (so budgets hold it), and each verdict becomes an `AutoDecision` event.
The reason also reaches the journal and the trace through the gate's decision record.

It must never decide anything itself: a budget already spent, or a classifier that cannot be
built, is an `unsure` verdict (the gate then asks the user, or refuses headless).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from keel.agent.events import AutoDecision, Event, RequestFinished, RequestStarted, UsageUpdated
from keel.agent.limits import Spend
from keel.agent.timing import RequestClock, timed_reply
from keel.frozen import mutable
from keel.llm.catalog import ModelInfo
from keel.llm.events import Done
from keel.llm.messages import Message
from keel.llm.provider import Provider
from keel.llm.request import Request
from keel.permissions.auto import AutoClassifier
from keel.permissions.gate import AutoVerdict, PermissionRequest

PURPOSE = "auto-mode"


@mutable
class AutoMode:
    """Auto mode's classifier for one agent: `provider` and `info` are the classifier model's
    (None: the agent's own); `broken` says why the configured one cannot be used."""

    classifier: AutoClassifier
    provider: Provider | None = None
    info: ModelInfo | None = None
    broken: str = ""

    async def decide(
        self,
        asked: PermissionRequest,
        *,
        provider: Provider,
        info: ModelInfo,
        spend: Spend,
        exhausted: str | None,
        emit: Callable[[Event], None],
        prompt: str,
        context: Sequence[Message],
        turn: int,
        window: tuple[int, int],
    ) -> AutoVerdict:
        """The verdict on `asked`. `provider`/`info`: the agent's, used unless the classifier
        has its own; `exhausted`: the budget sentence when a cap is reached (the classifier is
        then not asked); `window`: (context tokens, window) for the usage event."""
        model = self.classifier.model
        if self.broken:
            verdict = AutoVerdict("unsure", self.broken)
        elif exhausted:
            verdict = AutoVerdict("unsure", f"the classifier was not asked: {exhausted}")
        else:
            provider = self.provider or provider
            facts = self.info or info
            cost = 0.0

            async def send(request: Request) -> Done | None:
                nonlocal cost
                emit(RequestStarted(turn, model, request, purpose=PURPOSE))
                done, timing = await timed_reply(provider, request, RequestClock())
                if done is not None:
                    cost = facts.cost(done.usage)
                    spend.add(done.usage, cost)
                    answered = done.message.model or model
                    emit(
                        RequestFinished(
                            PURPOSE,
                            answered,
                            done.message,
                            done.usage,
                            done.stop_reason,
                            cost,
                            timing,
                        )
                    )
                    emit(UsageUpdated(done.usage, spend.usage, spend.cost, *window))
                return done

            verdict = await self.classifier.classify(
                send, asked.call, asked.reason, prompt=prompt, context=context
            )
            emit(AutoDecision(asked.call, verdict.decision, verdict.reason, model, cost))
            return verdict
        emit(AutoDecision(asked.call, verdict.decision, verdict.reason, model))
        return verdict


__all__ = ["PURPOSE", "AutoMode"]
