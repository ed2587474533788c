"""`web_search`: whether the provider's own server-side search is offered, and with what options.

keel runs no search itself and registers no tool function for it: the provider searches (Anthropic's
`web_search` server tool, OpenAI's `web_search`, Gemini's Search grounding) and the reply carries
`WebSearch` blocks and citations. This module owns the one decision, made once per context since
the declaration is part of the prompt prefix: offered when the provider's preset and the model's
catalog entry both say it can search (capability facts, never a model name test), the
`web_search` setting leaves it on, and no permission rule forbids it.

A search has no local side effect and sends the query to the provider that already holds the
conversation, so the gate's modes allow it (plan mode too, as reading tools). keel cannot ask
before a search the provider runs, so an ask rule for `web_search` (`WebSearch`) takes it away,
as a deny rule does: failing closed, with a notice.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from keel.llm.messages import Citation
from keel.llm.presets import PRESETS
from keel.llm.request import WebSearchOptions
from keel.permissions.rules import covers_tool, matches

if TYPE_CHECKING:
    from keel.config.settings import Settings
    from keel.llm.catalog import ModelInfo, ModelRef
    from keel.permissions.gate import PermissionGate

NAME = "web_search"
#: Wire APIs whose search can be told to leave domains out (OpenAI's and Gemini's cannot).
_WIRES_THAT_BLOCK = frozenset({"anthropic"})


def provider_searches(ref: ModelRef, info: ModelInfo) -> bool:
    """Whether `ref`'s provider runs web searches for this model (a custom provider, a reseller
    or a model the catalog does not list: no)."""
    preset = PRESETS.get(ref.provider)
    return preset is not None and preset.web_search and info.web_search


def web_search_options(
    ref: ModelRef,
    info: ModelInfo,
    settings: Settings,
    gate: PermissionGate | None,
) -> tuple[WebSearchOptions | None, str]:
    """The search to offer (None: none) and, when a rule took it away, why (for a notice)."""
    if not settings.web_search or not provider_searches(ref, info):
        return None, ""
    blocked = list(settings.web_search_blocked_domains)
    for rule in gate.rules if gate is not None else ():
        if rule.effect == "allow" or not covers_tool(rule, NAME):
            continue
        if rule.pattern and rule.pattern.startswith("domain:"):
            # `web_search(domain:x.org)`: keel cannot ask either, so an ask rule blocks too.
            blocked.append(rule.pattern.removeprefix("domain:"))
        elif gate is not None and matches(rule, NAME, {}, gate.root, gate.cwd):
            if rule.effect == "deny":
                return None, ""
            return None, (
                f"web search is off: the ask rule {rule} ({rule.source or 'settings'}) cannot "
                "be asked before a search the provider runs"
            )
    preset = PRESETS[ref.provider]
    if blocked and preset.wire not in _WIRES_THAT_BLOCK:
        return None, (
            f"web search is off: {ref.provider}'s search cannot leave out domains, and "
            f"{', '.join(blocked)} must be left out (web_search.blocked_domains or a rule)"
        )
    allowed = settings.web_search_allowed_domains
    if allowed and blocked:
        # Anthropic takes one list or the other: a blocked domain under an allowed one cannot
        # be expressed, so no search; one that is not under any is left out anyway.
        inside = [b for b in blocked if any(b == a or b.endswith("." + a) for a in allowed)]
        if inside:
            return None, (
                f"web search is off: {', '.join(inside)} must be left out of the allowed "
                f"domains {', '.join(allowed)}, which {ref.provider}'s search cannot express"
            )
        blocked = []
    options = WebSearchOptions(
        max_uses=settings.web_search_max_uses,
        allowed_domains=allowed,
        blocked_domains=tuple(dict.fromkeys(blocked)),
    )
    return options, ""


def sources(citations: list[Citation]) -> str:
    """The sources an answer cites, as shown under it (headless text and the TUI): one numbered
    line per URL, in the order they are first cited; "" when it cites none."""
    urls = list(dict.fromkeys(c.url for c in citations if c.url))
    if not urls:
        return ""
    titles = {c.url: c.title for c in reversed(citations) if c.title}
    lines = ["Sources:"]
    for number, url in enumerate(urls, 1):
        title = titles.get(url, "")
        lines.append(f"  [{number}] {title} — {url}" if title else f"  [{number}] {url}")
    return "\n".join(lines)


__all__ = ["NAME", "provider_searches", "sources", "web_search_options"]
