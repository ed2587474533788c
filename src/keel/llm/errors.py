"""Provider errors, normalised so the loop and front ends never see a transport's exceptions."""

from __future__ import annotations

from keel.errors import RunError


class LLMError(RunError):
    """A model request failed."""


class APIError(LLMError):
    """The provider answered with an error, or could not be reached (`status` 0).

    `retryable` says whether the same request may succeed later; `retry_after` is the wait the
    server asked for, in seconds, when it said.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int,
        retryable: bool,
        retry_after: float | None = None,
        provider: str = "",
        hint: str = "",
    ) -> None:
        super().__init__(message, hint=hint)
        self.status = status
        self.retryable = retryable
        self.retry_after = retry_after
        self.provider = provider


class ContextOverflow(APIError):
    """The prompt no longer fits the model's context window."""

    def __init__(self, message: str, *, provider: str = "", status: int = 400) -> None:
        super().__init__(
            message,
            status=status,
            retryable=False,
            provider=provider,
            hint="compact the conversation or start a fresh one",
        )


class CallTimeout(APIError):
    """The whole call (connect, request, every byte of the reply) took longer than `seconds`,
    counted from the request's start: the per-call deadline, enforced whether or not bytes
    arrive."""

    def __init__(self, seconds: float, *, provider: str = "") -> None:
        name = provider or "provider"
        super().__init__(
            f"{name} call did not finish within {seconds:g} s (call_timeout)",
            status=408,
            retryable=True,
            provider=provider,
            hint=f'raise providers."{name}".call_timeout in settings for slow servers or long replies',
        )
        self.seconds = seconds


class ConnectionRefused(APIError):
    """Nothing listens at the provider's address (a local server that is not running)."""


class StallError(LLMError):
    """No bytes arrived for `seconds`; the request was abandoned."""

    def __init__(self, seconds: float, *, provider: str = "") -> None:
        super().__init__(
            f"{provider or 'provider'} sent nothing for {seconds:g} s; request abandoned",
            hint="the server may be overloaded; raise stall_timeout for slow local models",
        )
        self.seconds = seconds
        self.provider = provider


RETRYABLE_STATUSES = frozenset({408, 409, 429})


def is_retryable_status(status: int) -> bool:
    return status in RETRYABLE_STATUSES or status >= 500 or status == 0
