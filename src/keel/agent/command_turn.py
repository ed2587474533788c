"""One turn of a custom command, with what its frontmatter asks for (Claude Code's semantics):
`model:` switches the model for that turn, `disallowed-tools:` denies those rules through the
permission gate for that turn, and `allowed-tools:` (the user's own commands only) allows those
rules without asking for that turn. Everything is undone when the turn ends, whatever way it
ends (`Agent.after_turn`).

The tool list is never changed (it is part of the cached prompt prefix, DESIGN.md invariant 1):
a disallowed tool stays offered and is refused by the gate with the command named. A model keel
cannot switch to (no key, an alias on a provider that has no such model) is reported and the
turn keeps the session's model: never silently.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from keel.errors import KeelError
from keel.llm.events import Notice
from keel.llm.messages import ToolUse
from keel.permissions.gate import Deny, PermissionGate

if TYPE_CHECKING:
    from keel.agent.events import Event
    from keel.agent.loop import Agent
    from keel.skills import Command, Expansion
    from keel.skills.commands import AllowShell

Emit = Callable[["Event"], None]


async def expand_command(
    agent: Agent, prompt: str, emit: Emit, *, allow_shell: AllowShell
) -> Expansion | None:
    """The expansion of a prompt naming one of `agent`'s custom commands (else None), with the
    command's frontmatter applied to this turn."""
    commands = agent.commands
    if commands is None or (command := commands.find(prompt)) is None:
        return None
    _limit_tools(agent, command, emit)
    _switch_model(agent, command, emit)
    expansion = await commands.expand(
        prompt,
        allow_shell=allow_shell,
        sandbox=agent.ctx.sandbox,
        allow_read=lambda path: _may_read(agent, path),
    )
    if expansion is not None:
        for why in expansion.not_attached:
            emit(Notice(f"/{command.name}: {why}; not attached ({command.path})", "warning"))
    return expansion


def _limit_tools(agent: Agent, command: Command, emit: Emit) -> None:
    """`disallowed-tools` as deny rules and a user command's `allowed-tools` as allow rules, for
    this turn only."""
    if not command.disallowed_tools and not command.allowed_tools:
        return
    gate = agent.gate
    if not isinstance(gate, PermissionGate):
        if command.disallowed_tools:
            # No gate to deny through: refuse rather than run the command without its limits.
            raise KeelError(
                f"/{command.name} limits its tools (disallowed-tools), but this agent has no "
                "permission gate to hold them; not run"
            )
        return
    from keel.permissions.rules import parse_rule

    source = f"{command.path} (/{command.name})"
    denied = [
        dataclasses.replace(parse_rule(r, "deny", source), for_turn=True)
        for r in command.disallowed_tools
    ]
    allowed = [parse_rule(r, "allow", source) for r in command.allowed_tools]
    gate.rules[:0] = denied  # first: a deny rule wins wherever it stands
    gate.session_rules.extend(allowed)

    def undo() -> None:
        for rule in denied:
            gate.rules.remove(rule)
        for rule in allowed:
            gate.session_rules.remove(rule)

    agent.after_turn.append(undo)
    if denied:
        emit(Notice(f"/{command.name}: denied for this turn: {', '.join(map(str, denied))}"))
    if allowed:
        emit(Notice(f"/{command.name}: allowed for this turn: {', '.join(map(str, allowed))}"))


def _switch_model(agent: Agent, command: Command, emit: Emit) -> None:
    """`model:` for this turn: an alias (`haiku`, `sonnet`, `opus`) on Anthropic, a bare model
    id on the session's provider, or `provider/model`."""
    spec = command.model
    if spec is None or spec == "inherit":
        return
    from keel.agent.subagents import MODEL_ALIASES
    from keel.llm.catalog import lookup, parse_model
    from keel.llm.provider import make_provider

    provider, model = agent.provider, spec
    if spec in MODEL_ALIASES:
        if provider.name != "anthropic":
            emit(
                Notice(
                    f"/{command.name} asks for model {spec!r}, a Claude alias, but this session "
                    f"runs on {provider.name}; the turn uses {agent.model} ({command.path})",
                    "warning",
                )
            )
            return
        model = MODEL_ALIASES[spec]
    elif "/" in spec or ":" in spec:
        try:
            ref = parse_model(spec)
            if ref.provider != provider.name:
                provider = make_provider(ref, env=agent.ctx.env)
        except KeelError as exc:
            emit(
                Notice(
                    f"/{command.name} asks for model {spec!r}: {exc.one_line()}; the turn uses "
                    f"{agent.model} ({command.path})",
                    "warning",
                )
            )
            return
        model = ref.model
    if model == agent.model and provider is agent.provider:
        return
    old = (agent.provider, agent.model, agent.info)
    agent.provider, agent.model, agent.info = provider, model, lookup(model)
    emit(Notice(f"/{command.name}: this turn uses {provider.name}/{model}"))

    def undo() -> None:
        agent.provider, agent.model, agent.info = old

    agent.after_turn.append(undo)
    if provider is not old[0]:
        agent.on_close.append(provider.aclose)


async def _may_read(agent: Agent, path: Path) -> bool:
    """Whether the gate lets `read` open `path` (deny and ask rules apply; a refusal is
    recorded like any other decision)."""
    gate = agent.gate
    if not isinstance(gate, PermissionGate):
        return True
    call = ToolUse("command-attachment", "read", {"path": str(path)})
    return not isinstance(await gate.authorize(call, read_only=True), Deny)


__all__ = ["expand_command"]
