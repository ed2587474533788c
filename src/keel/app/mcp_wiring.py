"""What ties a session's MCP servers to its agent, for every front end: their notices and tool
progress become the agent's events (and an OAuth sign-in URL a notice), their prompts and
resources its `/mcp__…` commands,
`@server:uri` mentions and two read-only tools, and their requests of keel (sampling and
elicitation) are answered here.

Sampling (a server asking keel's model for a completion) runs the session's model without
tools; in an interactive session the user is asked first, through the permission gate's asker
(the same card as a tool call, named `mcp__<server>__sampling`). Headless runs refuse it unless
the user's settings say `"mcp_sampling": "allow"` (which also skips the question);
`"mcp_sampling": "deny"` refuses it everywhere. Elicitation (a server asking the user a
question) goes out as a `QuestionRequest` event in interactive sessions and is refused in
headless ones. Every refusal goes back to the server as an error saying why.

This module must never render anything itself: it only emits events and awaits replies.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from keel.agent.events import Event, ToolProgress
from keel.llm.events import Notice

if TYPE_CHECKING:
    from keel.agent.loop import Agent
    from keel.mcp.client import ElicitAsk, McpManager, SamplingAnswer, SamplingAsk

#: Seconds a question waits for the user before it is refused.
QUESTION_TIMEOUT = 600.0


def wire(agent: Agent, manager: McpManager, *, sampling: str = "ask") -> None:
    """Connect `manager` to `agent` (after its servers settled, before the first prompt)."""
    from keel.mcp.prompts import McpPrompts
    from keel.mcp.tools import build_resource_tools

    manager.on_notice = lambda text, level: agent.forward(
        Notice(text, "warning" if level == "warning" else "info")
    )
    manager.on_tool_progress = lambda call_id, progress, total, message: agent.forward(
        ToolProgress(call_id, progress, total, message or "")
    )
    agent.mcp_prompts = McpPrompts(manager)
    agent.add_tools(build_resource_tools(manager))

    async def sample(ask: SamplingAsk) -> SamplingAnswer | str:
        return await _sample(agent, ask, sampling)

    async def elicit(ask: ElicitAsk) -> dict[str, Any] | str | None:
        return await _elicit(agent, ask)

    manager.sampler = sample
    manager.elicitor = elicit


def sign_in_opener(printer: Callable[[Event], None]) -> Callable[[str, str], Awaitable[None]]:
    """How an interactive session shows an MCP server's OAuth sign-in: a notice with the URL,
    and the browser opened on it when there is one."""

    async def open_url(server: str, url: str) -> None:
        printer(Notice(f"MCP server {server} needs you to sign in: open {url}", "warning"))
        import webbrowser

        with contextlib.suppress(webbrowser.Error, OSError):  # no browser: the notice does
            await asyncio.to_thread(webbrowser.open, url)

    return open_url


async def _sample(agent: Agent, ask: SamplingAsk, policy: str) -> SamplingAnswer | str:
    from keel.llm.messages import Message, Text
    from keel.llm.provider import final_reply
    from keel.llm.request import Request
    from keel.mcp.client import SamplingAnswer

    if policy == "deny":
        return 'sampling is turned off in keel\'s settings ("mcp_sampling": "deny")'
    if policy != "allow":
        refusal = await _approve_sampling(agent, ask)
        if refusal:
            return refusal
    messages = tuple(
        Message("assistant" if role == "assistant" else "user", (Text(text),))
        for role, text in ask.messages
    )
    if not messages or messages[-1].role != "user":
        return "sampling needs a conversation that ends with a user message"
    limit = max(1, min(ask.max_tokens, agent.info.request_max_tokens or ask.max_tokens))
    request = Request(model=agent.model, system=ask.system, messages=messages, max_tokens=limit)
    done = await final_reply(agent.provider, request)
    if done is None:
        return f"{agent.provider.name} ended the stream without a reply"
    agent.spend.add(done.usage, agent.info.cost(done.usage))
    stop = {"max_tokens": "maxTokens"}.get(str(done.stop_reason), "endTurn")
    return SamplingAnswer(done.message.text, agent.model, stop)


async def _approve_sampling(agent: Agent, ask: SamplingAsk) -> str:
    """'' if the user lets the server use the model, else why not."""
    from keel.llm.messages import ToolUse
    from keel.permissions.gate import PermissionGate, PermissionRequest

    gate = agent.gate
    asker = gate.asker if isinstance(gate, PermissionGate) else None
    if not agent.takes_questions or asker is None:
        return (
            f'MCP server "{ask.server}" asked for a model completion (sampling); refused: '
            'nobody can approve it in a headless run (set "mcp_sampling": "allow" in your '
            "keel settings to allow it)"
        )
    last = ask.messages[-1][1] if ask.messages else ""
    call = ToolUse(
        f"sampling-{uuid.uuid4().hex[:8]}",
        f"mcp__{ask.server}__sampling",
        {"system": ask.system, "prompt": last[:2000], "max_tokens": ask.max_tokens},
    )
    reason = (
        f'MCP server "{ask.server}" asks to use your model ({agent.model}) for a completion '
        f"of up to {ask.max_tokens} tokens"
    )
    reply = await asker(PermissionRequest(call, reason, ""))
    if reply.allow:
        return ""
    why = f": {reply.reason}" if reply.reason else ""
    return f"the user declined the sampling request{why}"


async def _elicit(agent: Agent, ask: ElicitAsk) -> dict[str, Any] | str | None:
    """The user's answer to a server's question, unless an Elicitation hook gives one (then
    nobody is asked, headless runs included); an ElicitationResult hook may change the user's
    answer. Decline and cancel are both a decline."""
    fields: dict[str, Any] = {"mcp_server_name": ask.server, "message": ask.message}
    fields.update(mode="form", requested_schema=ask.schema)
    hooked = await _elicitation_hook(agent, "Elicitation", fields, ask.server)
    if hooked is not None:
        return hooked[1] if hooked[0] == "accept" else None
    if not agent.takes_questions:
        return (
            f'MCP server "{ask.server}" asked the user a question (elicitation); refused: '
            "nobody can answer in a headless run"
        )
    question, future = agent.questions.question(ask.server, ask.message, ask.schema)
    agent.forward(question)
    told = asyncio.create_task(_notify_dialog(agent, ask))  # beside the question, as in Claude Code
    by = "user"
    try:
        async with asyncio.timeout(QUESTION_TIMEOUT):
            answer = await future
    except TimeoutError:
        by = "no-answer"
        return f"nobody answered within {QUESTION_TIMEOUT:g} s"
    except asyncio.CancelledError:
        by = "cancelled"
        raise
    finally:
        agent.questions.done(question.request_id, by=by)
        await told
    if isinstance(answer, str):
        return answer
    fields = {"mcp_server_name": ask.server, "mode": "form"}
    fields.update(action="accept" if answer is not None else "decline", content=answer)
    changed = await _elicitation_hook(agent, "ElicitationResult", fields, ask.server)
    if changed is None:
        return answer
    return changed[1] if changed[0] == "accept" else None


async def _notify_dialog(agent: Agent, ask: ElicitAsk) -> None:
    """Notification hooks hear `elicitation_dialog`: a server's question waits for the user."""
    hooks = agent.hooks
    if hooks is None or not hooks.has("Notification"):
        return
    fields = {
        "message": f"MCP server {ask.server} asks: {ask.message}",
        "notification_type": "elicitation_dialog",
    }
    result = await hooks.run("Notification", fields, match="elicitation_dialog")
    for problem in result.errors:
        agent.forward(Notice(problem, "warning"))


async def _elicitation_hook(
    agent: Agent, event: str, fields: dict[str, Any], server: str
) -> tuple[str, dict[str, Any]] | None:
    """An Elicitation or ElicitationResult hook's answer: (action, content), ("decline", {})
    for an exit 2, None when no hook answered."""
    hooks = agent.hooks
    if hooks is None or not hooks.has(event):
        return None
    result = await hooks.run(event, fields, match=server)
    for message in result.messages:
        agent.forward(Notice(message, "info"))
    for problem in result.errors:
        agent.forward(Notice(problem, "warning"))
    if result.block:
        return "decline", {}
    if result.elicitation_action is None:
        return None
    return result.elicitation_action, result.elicitation_content or {}


__all__ = ["QUESTION_TIMEOUT", "sign_in_opener", "wire"]
