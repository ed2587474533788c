"""The interactive front end's built-in slash commands: their table, parsing a line into one, and
the reports the read-only ones show (`/help`, `/cost`, `/context`, `/permissions`, `/skills`,
`/mcp`). Reports are Markdown strings built from the agent's public state; nothing here runs a
prompt or changes anything.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from keel.agent.compaction import estimate_tokens
from keel.errors import UserError
from keel.frozen import frozen
from keel.llm.messages import Text, Thinking, ToolResult, ToolUse
from keel.permissions.gate import PermissionGate
from keel.tui.format import context_meter, cost, spend_text, tokens

if TYPE_CHECKING:
    from keel.agent.events import AgentSpend
    from keel.agent.loop import Agent
    from keel.agent.output_styles import OutputStyle


@frozen
class Builtin:
    name: str
    arguments: str
    summary: str
    #: Safe while a prompt runs (it only reads).
    while_busy: bool = False


BUILTINS: dict[str, Builtin] = {
    b.name: b
    for b in (
        Builtin("help", "", "commands, keys and skills", while_busy=True),
        Builtin("clear", "", "start a fresh conversation (a new session)"),
        Builtin("compact", "[instructions]", "summarize the conversation now"),
        Builtin(
            "pin", "[TEXT]", "pin a fact every summary must keep (no text: list)", while_busy=True
        ),
        Builtin("unpin", "N", "unpin the fact /pin lists as N", while_busy=True),
        Builtin("init", "[AGENTS.md|CLAUDE.md]", "study the project and write its AGENTS.md"),
        Builtin("model", "[provider/model]", "switch the model (a picker without an argument)"),
        Builtin("mode", "[mode]", "permission mode: default, accept-edits, plan, bypass, auto"),
        Builtin("output-style", "[name]", "how the agent answers, from the next fresh context"),
        Builtin("undo", "", "put back the files the last prompt changed"),
        Builtin("rewind", "", "go back to an earlier prompt (forks the session)"),
        Builtin("resume", "[id]", "open another session of this project"),
        Builtin("cost", "", "what this session has cost", while_busy=True),
        Builtin("context", "", "what fills the context window", while_busy=True),
        Builtin("skills", "", "skills and custom commands", while_busy=True),
        Builtin(
            "memory",
            "[show|add|delete NAME] [--user]",
            "the model's memory notes: list, show, add (NAME: description, body below), delete",
        ),
        Builtin("hooks", "[approve]", "hooks that run here; approve the project's"),
        Builtin("mcp", "[approve [name]]", "MCP servers and their tools; approve the project's"),
        Builtin(
            "plugin",
            "[list|install|enable|disable|update|uninstall NAME@MARKETPLACE]",
            "Claude Code plugins: what runs here, and switching them",
        ),
        Builtin("trust", "[approve|revoke]", "what the project's files ask for; approve it"),
        Builtin("permissions", "", "mode, rules and the sandbox", while_busy=True),
        Builtin("doctor", "", "check keys, settings, ripgrep and the sandbox", while_busy=True),
        Builtin("debug", "[on|off]", "write a debug trace of this session (keel trace views it)"),
        Builtin("exit", "", "quit keel", while_busy=True),
        Builtin("quit", "", "quit keel (the same as /exit)", while_busy=True),
    )
}

KEYS = (
    ("Enter", "send"),
    ("Ctrl+J / Shift+Enter", "new line"),
    ("↑ / ↓", "prompt history"),
    ("Esc", "interrupt the running prompt (twice: quit)"),
    ("Shift+Tab", "next permission mode"),
    ("Ctrl+O", "expand or collapse thinking and tool output"),
    ("Ctrl+C", "interrupt what runs; else clear the prompt; twice on an empty prompt: quit"),
    ("@path", "attach a file or folder (Tab completes)"),
    ("!command", "run a shell command; the model sees its output with your next prompt"),
)

_NAME = re.compile(r"/([A-Za-z0-9_][\w:.-]*)(?:\s+(.*))?", re.DOTALL)


def parse_command(line: str) -> tuple[str, str] | None:
    """(name, arguments) for a line `/name args…`; None for anything else (`/etc/hosts …` is a
    prompt, not a command)."""
    m = _NAME.fullmatch(line.strip())
    return (m.group(1), (m.group(2) or "").strip()) if m else None


def closest(name: str, names: Iterable[str]) -> str | None:
    """The known command name most like `name` (a typo's likely meaning), or None when none is
    close enough to suggest."""
    found = difflib.get_close_matches(name, list(names), n=1, cutoff=0.6)
    return found[0] if found else None


def extension_names(agent: Agent) -> dict[str, str]:
    """`/name` → description for the skills and custom commands a user can invoke."""
    out: dict[str, str] = {}
    if agent.skills is not None:
        for skill in agent.skills.user_invocable():
            out[skill.name] = skill.description
    if agent.commands is not None:
        for command in agent.commands.all():
            out.setdefault(command.name, command.description or str(command.path.name))
    return out


def help_text(agent: Agent) -> str:
    lines = ["**Commands**", ""]
    lines += [
        f"- `/{b.name}{' ' + b.arguments if b.arguments else ''}`: {b.summary}"
        for b in BUILTINS.values()
    ]
    extensions = extension_names(agent)
    if extensions:
        lines += ["", "**Skills and custom commands**", ""]
        lines += [
            f"- `/{name}`: {desc or '(no description)'}"
            for name, desc in sorted(extensions.items())
        ]
    lines += ["", "**Keys**", ""]
    lines += [f"- `{key}`: {what}" for key, what in KEYS]
    return "\n".join(lines)


def cost_text(agent: Agent, context: int, rows: Sequence[AgentSpend] = ()) -> str:
    """`/cost`: the session's spend (its subagents' included), and each agent's own once it
    started subagents (`rows`)."""
    usage = agent.spend.usage
    info = agent.info
    lines = [
        f"**Session cost:** {cost(agent.spend.cost)} over {agent.total_turns} model turns",
        "",
        f"- input: {tokens(usage.input)}, output: {tokens(usage.output)}",
        f"- cache read: {tokens(usage.cache_read)}, cache write: {tokens(usage.cache_write)}",
        f"- context now: {context_meter(context, info.window)[0]}",
    ]
    if info.priced:
        lines.append(
            f"- prices ({agent.model}): ${info.input_price:g}/M input, "
            f"${info.output_price:g}/M output, ${info.cache_read_price or 0:g}/M cache read"
        )
    else:
        lines.append(f"- {agent.model} has no prices in the catalog: cost shows as $0")
    limits = agent.limits
    if limits.max_usd is not None or limits.max_tokens is not None:
        caps = []
        if limits.max_usd is not None:
            caps.append(f"${limits.max_usd:g}")
        if limits.max_tokens is not None:
            caps.append(f"{tokens(limits.max_tokens)} tokens")
        lines.append(f"- budget: {' and '.join(caps)}")
    if rows:
        lines += ["", "**By agent:**", ""]
        for row in rows:
            label = f"{spend_text(row)} ({row.description})" if row.description else spend_text(row)
            running = row.status == "running" and row.agent != "main"
            lines.append(f"- {label}{' · running' if running else ''}")
    return "\n".join(lines)


def context_text(agent: Agent, context: int) -> str:
    """Estimates (characters / 4) of what the next request will hold, by kind."""
    window = agent.info.window
    kinds = {"user text": 0, "assistant text": 0, "thinking": 0, "tool calls": 0, "tool results": 0}
    for message in agent.messages:
        for block in message.blocks:
            if isinstance(block, Thinking):
                kinds["thinking"] += len(block.text) // 4
            elif isinstance(block, Text):
                kinds["user text" if message.role == "user" else "assistant text"] += (
                    len(block.text) // 4
                )
            elif isinstance(block, ToolUse):
                kinds["tool calls"] += len(str(block.input)) // 4
            elif isinstance(block, ToolResult):
                kinds["tool results"] += len(block.text) // 4
    system = len(agent.system) // 4
    tools = sum(len(s.description) + len(str(s.input_schema)) for s in agent.tool_specs) // 4
    messages = estimate_tokens(agent.messages)
    total = system + tools + messages
    meter, _ = context_meter(context, window)
    lines = [
        f"**Context window:** {tokens(window)} tokens ({agent.model}); the last request held "
        f"{meter if context else 'nothing yet'}",
        "",
        "Estimated for the next request (characters / 4):",
        "",
        "| part | tokens |",
        "|---|---:|",
        f"| system prompt | {tokens(system)} |",
        f"| tool definitions ({len(agent.tool_specs)} tools) | {tokens(tools)} |",
        f"| messages ({len(agent.messages)}) | {tokens(messages)} |",
    ]
    lines += [f"| · {kind} | {tokens(n)} |" for kind, n in kinds.items() if n]
    lines.append(
        f"| **total** | **{tokens(total)}** ({round(100 * total / window) if window else 0}%) |"
    )
    auto = "on" if agent.auto_compact else "off (auto_compact: false)"
    at = round(agent.compaction.threshold * 100)
    lines += ["", f"Automatic compaction at {at}%: {auto}. `/compact` now."]
    lines += _instruction_lines(agent)
    return "\n".join(lines)


def _instruction_lines(agent: Agent) -> list[str]:
    """The instruction files in this context (read from its text itself, so it is what the
    model has), their `@path` imports indented, and what was not followed."""
    from keel.agent.prompt import instruction_sources, load_instructions
    from keel.config.settings import user_config_dir

    tags = re.findall(
        r'^<instructions source="([^"]*)"( imported-from="[^"]*")?>', agent.prompt_text, re.M
    )
    lines = ["", "**Instruction files**", ""] if tags else ["", "**Instruction files:** none"]
    lines += [
        f"{'  - ' if via else '- '}`{path}`{' (import)' if via else ''}" for path, via in tags
    ]
    loaded = load_instructions(
        agent.cwd, user_dir=user_config_dir(agent.ctx.env), refuse=agent.import_refusal
    )
    lines += [f"- warning: {w}" for w in loaded.warnings]
    opened = {Path(path) for path, _ in tags}
    sent = [
        p
        for m in agent.messages
        if m.role == "user"
        for p in instruction_sources(m.text)
        if p not in opened
    ]
    if sent:
        lines += ["", "**Sent as notes** (files the model read or edited brought them)", ""]
        lines += [f"- `{path}`" for path in dict.fromkeys(sent)]
    return lines


def pins_text(pins: Sequence[str], keep: Sequence[str]) -> str:
    """`/pin`: the facts every summary must keep: the session's `pins`, numbered for `/unpin`,
    then those of the `compaction.keep` setting."""
    if not pins and not keep:
        return "**Pinned facts:** none. `/pin TEXT` pins one: every summary must keep it."
    lines = ["**Pinned facts** (every summary must keep them, word for word)", ""]
    lines += [f"{i}. {fact}" for i, fact in enumerate(pins, 1)]
    lines += [f"- {fact} (settings: compaction.keep)" for fact in keep]
    if pins:
        lines += ["", "`/unpin N` unpins one of this session's."]
    return "\n".join(lines)


def output_styles_text(agent: Agent, styles: list[OutputStyle], chosen: str) -> str:
    """The output styles there are, marking this context's and the one the next will have."""
    from keel.agent.output_styles import DEFAULT

    now = agent.output_style.name if agent.output_style is not None else DEFAULT
    chosen = chosen or DEFAULT
    lines = ["**Output styles** (`/output-style NAME` picks one for the next fresh context)", ""]
    for style in styles:
        marks = [
            m
            for m, on in (
                ("this context", style.name == now),
                ("next", style.name.lower() == chosen.lower()),
            )
            if on
        ]
        mark = f" ({', '.join(marks)})" if marks else ""
        where = f" · {style.path}" if style.path is not None else " · built in"
        lines.append(f"- **{style.name}**{mark}: {style.description or 'no description'}{where}")
    return "\n".join(lines)


def permissions_text(agent: Agent, saved_to: str) -> str:
    gate = agent.gate
    if not isinstance(gate, PermissionGate):
        return "This agent has no permission gate: every tool call runs."
    sandbox = (
        "on: bash runs without asking inside it" if gate.sandboxed else "off: bash commands ask"
    )
    lines = [f"**Mode:** {gate.mode}", f"**Sandbox:** {sandbox}", ""]
    allow = [r for r in gate.rules if r.effect == "allow"]
    deny = [r for r in gate.rules if r.effect == "deny"]
    for title, rules in (("Deny rules", deny), ("Allow rules", allow)):
        lines.append(f"**{title}**")
        lines += [f"- `{r}` ({r.source or 'settings'})" for r in rules] or ["- none"]
        lines.append("")
    lines.append("**Allowed for this session**")
    lines += [f"- `{r}`" for r in gate.session_rules] or ["- none"]
    lines += ["", f'"Always allow" answers are saved to `{saved_to}`.']
    return "\n".join(lines)


def debug_command(agent: Agent, args: str, *, retention_days: int | None = None) -> str:
    """`/debug on|off` (and `/debug` alone: the state and the folder). Tracing goes on with
    the next prompt; a new agent after /clear or /resume keeps it (`keel.trace.follow`)."""
    import keel.trace
    from keel.trace.tracer import Tracer

    word = args.strip().lower()
    if word not in ("", "on", "off"):
        raise UserError(f"/debug {args.strip()}: unknown", hint="/debug, /debug on or /debug off")
    tracer = agent.tracer if isinstance(agent.tracer, Tracer) else None
    if word == "on":
        if tracer is None or tracer.closed:
            tracer = keel.trace.attach(agent, retention_days=retention_days)
        return f"Debug trace **on**: writing to `{tracer.directory}` (view it with `keel trace`)."
    if word == "off":
        keel.trace.detach(agent)
        if tracer is None:
            return "Debug trace is already off."
        return f"Debug trace **off**; what was written stays in `{tracer.directory}`."
    if tracer is None:
        return "Debug trace is **off** (`/debug on` starts one)."
    if tracer.closed:
        return f"Debug trace **stopped**: {tracer.error or 'closed'} (`/debug on` starts again)."
    return f"Debug trace is **on**: `{tracer.directory}` (`/debug off` stops it)."


def skills_text(agent: Agent) -> str:
    lines: list[str] = []
    if agent.skills is not None and agent.skills.skills:
        lines += ["**Skills**", ""]
        for skill in sorted(agent.skills.skills.values(), key=lambda s: s.name):
            how = []
            if skill.user_invocable and skill.name not in agent.skills.builtins:
                how.append(f"`/{skill.name}`")
            if not skill.disable_model_invocation:
                how.append("the model")
            lines.append(f"- **{skill.name}** ({', '.join(how) or 'hidden'}): {skill.description}")
        lines.append("")
    if agent.commands is not None and agent.commands.all():
        lines += ["**Custom commands**", ""]
        for command in agent.commands.all():
            hint = f" {command.argument_hint}" if command.argument_hint else ""
            lines.append(f"- `/{command.name}{hint}`: {command.description or command.path}")
    return "\n".join(lines) or (
        "No skills or custom commands here (add them under `.claude/skills` or `.claude/commands`)."
    )


__all__ = [
    "BUILTINS",
    "KEYS",
    "Builtin",
    "closest",
    "context_text",
    "cost_text",
    "debug_command",
    "extension_names",
    "help_text",
    "parse_command",
    "permissions_text",
    "skills_text",
]
