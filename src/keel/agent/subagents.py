"""Subagents: the `task` tool hands a self-contained job to a child agent with its own context.

A child gets a fresh system prompt for its agent type, a subset of the parent's tools, its own
turn limit (100 unless its definition says otherwise), a token budget of its own (the session's
token cap, else `DEFAULT_UNATTENDED_TOKENS`), and the parent's permission gate, hooks
(`SubagentStop` instead of `Stop`), sandbox and checkpoint store. What it spends also counts in
the parent's spend as it happens, and the parent's budgets hold over it. Only its final message
comes back, cut like any tool output. It journals to its own session file beside the parent's
(`<parent id>.agents/<child id>.jsonl`, `meta.parent` and `meta.agent` set).

Agent types: the built-ins `general` (every tool) and `explore` (read-only tools), plus
definitions in Claude Code's format (`.claude/agents/**/*.md`, subfolders included,
`.keel/agents/`, `~/.claude/agents`, `~/.config/keel/agents`): frontmatter `name`,
`description`, `tools` (omitted: all; Claude Code's names or keel's, through `keel.tools.names`;
a name keel has no tool for is dropped with a warning, and a definition left with no tool is not
registered), `disallowedTools`, `model` (`inherit`, `provider/model`, or `sonnet`/`opus`/`haiku`
on Anthropic), `max_turns` (or `maxTurns`); the body is the child's prompt. Claude Code keys keel
does not honour (`hooks`, `mcpServers`, `permissionMode`, …) are named in a warning.

Several `task` calls in one round run concurrently (the tool is read-only: it never asks; the
child's own calls go through the gate), at most `MAX_CONCURRENT` at once
(`subagents.max_concurrent`; more wait), and one prompt starts at most `MAX_TOTAL`
(`subagents.max_total`; more are refused with a tool error). Each child's spend is reported as
`AgentSpend` events (when it starts, after each reply, when it ends). With
`run_in_background` the call returns a task id at once and the result arrives later as a
`<task-notification>`.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from keel.agent.events import Event, SubagentEvent, UsageUpdated
from keel.agent.instruction_notes import InstructionNotes
from keel.agent.limits import DEFAULT_UNATTENDED_TOKENS, Limits, Spend, check_budget
from keel.agent.prompt import SAFETY, build_context, build_system_prompt
from keel.config.settings import (
    SHARED_CONCURRENT_CEILING,
    SHARED_SUBAGENTS_CEILING,
    user_config_dir,
)
from keel.errors import KeelError
from keel.frozen import frozen
from keel.llm.events import Notice
from keel.permissions.gate import PermissionGate
from keel.tools.base import (
    FunctionTool,
    Tool,
    ToolContext,
    ToolError,
    ToolOutput,
    current_call_id,
    tool,
)

if TYPE_CHECKING:
    from keel.agent.loop import Agent, RunResult
    from keel.agent.worktrees import Worktree
    from keel.llm.catalog import ModelInfo
    from keel.llm.provider import Provider
    from keel.tools.background import BackgroundTask, Status

#: Turns a child may take unless its definition says otherwise.
CHILD_MAX_TURNS = 100
#: Subagents running at once, per parent (foreground and background together): more wait for a
#: slot (`subagents.max_concurrent`).
MAX_CONCURRENT = SHARED_CONCURRENT_CEILING
#: Subagents one prompt may start in all (`subagents.max_total`): more are refused.
MAX_TOTAL = SHARED_SUBAGENTS_CEILING
#: Tools a child never gets: delegation, the parent's task list and plan approval, and the
#: background tools (a child's background work would outlive it).
PARENT_ONLY = frozenset(
    {"task", "task_wait", "task_stop", "bash_output", "bash_kill", "todo_write", "exit_plan_mode"}
)
#: Tools a child gets only when its definition names them in `tools:` (memory: notes about
#: the user and the project are the parent's to keep).
NAMED_ONLY = frozenset({"memory"})
#: The read-only tools the `explore` type gets.
EXPLORE_TOOLS = ("glob", "grep", "ls", "raw_output", "read", "web_fetch", "web_search")
#: Claude Code's names for the same agent types.
TYPE_ALIASES = {"general-purpose": "general", "Explore": "explore"}
#: Claude model aliases a definition may name, as catalog ids (used on Anthropic only).
MODEL_ALIASES = {
    "sonnet": "claude-sonnet-4-5",
    "opus": "claude-opus-4-1",
    "haiku": "claude-haiku-4-5",
}
#: How deep `.claude/agents/` subfolders are searched for definitions.
MAX_AGENT_DEPTH = 8
#: Frontmatter keys of Claude Code's agent format that keel does not honour: a definition with
#: one loads with a warning naming the file and the key (never silently).
UNSUPPORTED_KEYS = ("hooks", "mcpServers", "permissionMode", "skills", "memory", "isolation")

REPORT_FOOTER = (
    "You are working for another agent, which gave you the task below and sees nothing of "
    "your work but your final message. When you are done, end with a complete, self-contained "
    "report: what you found or changed (with file paths and line numbers where they matter), "
    "and anything left undone. Do not ask questions: nobody can answer them; make reasonable "
    "choices and say what you chose."
)
GENERAL_PROMPT = (
    "You are a keel subagent: a coding agent doing one task for another agent. Work through "
    "the task with your tools (find with glob and grep, look with read, change with edit or "
    "write, verify with bash) until it is done."
)
EXPLORE_PROMPT = (
    "You are a keel explore subagent: you investigate a codebase and report, without changing "
    "anything. Search broadly with glob and grep, read what matters, and answer the question "
    "you were given precisely."
)


@frozen
class AgentType:
    name: str
    description: str
    #: The child's role prompt (a definition's body).
    prompt: str
    #: The tools it may use (None: all the parent's, less `PARENT_ONLY`).
    tools: tuple[str, ...] | None = None
    #: `provider/model`, an alias, or None to use the parent's model.
    model: str | None = None
    max_turns: int = CHILD_MAX_TURNS
    #: The definition file (None for a built-in).
    path: Path | None = None

    def allows(self, name: str) -> bool:
        if name in PARENT_ONLY:
            return False
        if name in NAMED_ONLY:
            return self.tools is not None and name in self.tools
        if self.tools is None:
            return True
        return any(name == t or name.startswith(f"{t}__") for t in self.tools)


BUILTIN_TYPES = {
    "general": AgentType(
        "general",
        "A general-purpose agent for multi-step tasks: researching, changing code, running "
        "commands. Has every tool.",
        GENERAL_PROMPT,
    ),
    "explore": AgentType(
        "explore",
        "Fast, read-only exploration: finding files, searching code, answering questions "
        "about the codebase. Cannot change anything.",
        EXPLORE_PROMPT,
        EXPLORE_TOOLS,
    ),
}


@frozen
class AgentTypes:
    types: dict[str, AgentType]
    warnings: tuple[str, ...] = ()

    def get(self, name: str) -> AgentType | None:
        return self.types.get(TYPE_ALIASES.get(name, name))


def load_agent_types(
    cwd: Path, *, user_dir: Path | None = None, home: Path | None = None
) -> AgentTypes:
    """The built-in agent types plus the definitions found for `cwd` (later folders win; a
    definition may replace a built-in). A broken definition is skipped with a warning."""
    from keel.skills.skills import Unusable, markdown_files, search_dirs, where

    types = dict(BUILTIN_TYPES)
    warnings: list[str] = []
    home = home or Path.home()
    for kind in _opencode_agents(cwd, user_dir, home, warnings):
        types[kind.name] = kind
    for folder in search_dirs(cwd, user_dir=user_dir, home=home, kind="agents"):
        # Claude Code finds definitions in subfolders too (`.claude/agents/review/security.md`).
        for path, _ in markdown_files(folder, warnings, max_depth=MAX_AGENT_DEPTH):
            try:
                kind = _read_definition(path, warnings)
            except Unusable as exc:
                warnings.append(f"{where(path, exc.line)}: {exc.message}; skipped")
                continue
            types[kind.name] = kind
    types.update(_plugin_agents(cwd, user_dir, home, warnings))
    return AgentTypes(types, tuple(warnings))


def _plugin_agents(
    cwd: Path, user_dir: Path | None, home: Path, warnings: list[str]
) -> dict[str, AgentType]:
    """The agents of the plugins that run here (`keel.plugins`), named `plugin:agent` as Claude
    Code names them."""
    import dataclasses

    from keel.plugins import plugin_components
    from keel.skills.skills import Unusable, markdown_files, where

    found: dict[str, AgentType] = {}
    for plugin in plugin_components(cwd, user_dir=user_dir, home=home):
        for folder in plugin.agents:
            files = (
                [(folder, folder.stem)]
                if folder.is_file()
                else markdown_files(folder, warnings, max_depth=MAX_AGENT_DEPTH)
            )
            for path, _ in files:
                try:
                    kind = _read_definition(path, warnings)
                except Unusable as exc:
                    warnings.append(f"{where(path, exc.line)}: {exc.message}; skipped")
                    continue
                name = f"{plugin.name}:{kind.name}"
                prompt = plugin.expand(kind.prompt)  # `${CLAUDE_PLUGIN_ROOT}`, as Claude Code
                found[name] = dataclasses.replace(kind, name=name, prompt=prompt)
    return found


def _opencode_agents(
    cwd: Path, user_dir: Path | None, home: Path, warnings: list[str]
) -> list[AgentType]:
    """OpenCode's agents (`.opencode/agent(s)/`, `~/.config/opencode/agent(s)/`, `agent` entries
    of `opencode.json`; `keel.config.foreign`), lowest precedence first."""
    from keel.config.foreign import agent_places, load_foreign, opencode_agent
    from keel.config.intake import intake_for
    from keel.skills.skills import Unusable, markdown_files, read_document, read_text, where

    intake = intake_for(cwd, user_dir=user_dir, home=home)
    entries: list[tuple[Path, str, dict[str, Any]]] = []
    for place in agent_places(intake):
        for path, name in markdown_files(place.folder, warnings, max_depth=MAX_AGENT_DEPTH):
            try:
                doc = read_document(read_text(path))
            except Unusable as exc:
                warnings.append(f"{where(path, exc.line)}: {exc.message}; skipped")
                continue
            entries.append((path, name, {**doc.meta, "prompt": doc.body}))
    entries += load_foreign(intake).agents
    kinds: list[AgentType] = []
    for path, name, entry in entries:
        agent = opencode_agent(name, entry, path, intake)
        if isinstance(agent, str):
            warnings.append(f"{path}: {agent}; not offered as a subagent")
            continue
        if agent.unused:
            warnings.append(f"{path}: agent {name}: keel does not use {'; '.join(agent.unused)}")
        tools = None
        if agent.denied:
            every = (t for t in _all_tool_names() if t not in NAMED_ONLY)
            tools = tuple(t for t in every if t not in agent.denied)
        turns = agent.max_turns or CHILD_MAX_TURNS
        kinds.append(
            AgentType(agent.name, agent.description, agent.prompt, tools, agent.model, turns, path)
        )
    return kinds


def _read_definition(path: Path, warnings: list[str]) -> AgentType:
    from keel.skills.skills import (
        Unusable,
        read_document,
        read_text,
        text_field,
        tools_field,
        where,
    )

    doc = read_document(read_text(path))
    name = text_field(doc, "name") or path.stem
    description = " ".join((text_field(doc, "description") or "").split())
    if not description:
        raise Unusable("no description (it tells the parent when to use this agent)", 1)
    if not doc.body.strip():
        raise Unusable("the body is empty: it is the agent's prompt")
    for key in UNSUPPORTED_KEYS:
        if key in doc.meta:
            warnings.append(
                f"{where(path, doc.key_lines.get(key))}: `{key}` in an agent definition is not "
                f"supported by keel; agent {name} runs without it"
            )
    listed = tools_field(doc, "tools")
    tools = _tool_names(path, doc.key_lines.get("tools"), listed, warnings)
    if listed and not tools:
        raise Unusable(
            f"none of its tools ({', '.join(listed)}) exists in keel: the agent would have no "
            "tools, so it is not registered",
            doc.key_lines.get("tools"),
        )
    denied = _tool_names(
        path, doc.key_lines.get("disallowedTools"), tools_field(doc, "disallowedTools"), warnings
    )
    if denied:
        every = tuple(t for t in _all_tool_names() if t not in NAMED_ONLY)
        tools = tuple(t for t in (tools or every) if t not in denied)
        if not tools:
            raise Unusable("`disallowedTools` removes every tool; not registered")
    turns = doc.meta.get("max_turns", doc.meta.get("maxTurns", CHILD_MAX_TURNS))
    if isinstance(turns, bool) or not isinstance(turns, int) or turns < 1:
        key = "max_turns" if "max_turns" in doc.meta else "maxTurns"
        raise Unusable(f"{key} must be a positive whole number", doc.key_lines.get(key))
    model = text_field(doc, "model")
    return AgentType(
        name,
        description,
        doc.body,
        tools or None,
        None if model in (None, "inherit") else model,
        turns,
        path,
    )


def _all_tool_names() -> tuple[str, ...]:
    """Every tool keel can give a child (the built-ins, skills, and delegation)."""
    from keel.tools.builtin import builtin_tools

    return tuple(sorted({t.name for t in builtin_tools()} | {"skill", "task", *NAMED_ONLY}))


def _tool_names(
    path: Path, line: int | None, listed: Iterable[str], warnings: list[str]
) -> tuple[str, ...]:
    """keel's names for the tools a definition lists (Claude Code's spelling, any case, or
    keel's); each name keel has no tool for is dropped with a warning naming the file and the
    tool."""
    from keel.skills.skills import where
    from keel.tools.names import CLAUDE_ONLY, CLAUDE_TO_KEEL, from_claude

    known = set(_all_tool_names())
    folded = {claude.lower(): keel for claude, keel in CLAUDE_TO_KEEL.items()}
    claude_names = {c.lower() for c in (*CLAUDE_TO_KEEL, *CLAUDE_ONLY)}
    found: list[str] = []
    for written in listed:
        name = from_claude(written) or ""
        if name not in known:
            name = folded.get(written.lower(), written.lower())
        if name in known or written.startswith("mcp__"):
            name = written if written.startswith("mcp__") else name
            if name not in found:
                found.append(name)
            continue
        if "(" in written:
            what = "a rule with a pattern; an agent's `tools:` takes tool names only"
        elif written.lower() in claude_names:
            what = "a Claude Code tool keel does not have"
        else:
            what = "not a tool keel knows"
        warnings.append(f"{where(path, line)}: tool {written!r} is {what}; dropped from the agent")
    return tuple(found)


# ---------------------------------------------------------------------------------------------
# Running a child.


class Subagents:
    """The `task` tool of one parent agent and the children it runs."""

    def __init__(
        self,
        parent: Agent,
        types: AgentTypes,
        *,
        max_total: int = MAX_TOTAL,
        max_concurrent: int = MAX_CONCURRENT,
    ) -> None:
        self.parent = parent
        self.types = types
        self.max_total = max_total
        self.max_concurrent = max_concurrent
        self._slots = asyncio.Semaphore(max_concurrent)
        #: Subagents started for the parent's current prompt (`started_in` says which prompt).
        self.started = 0
        self._started_in = 0
        #: Subagents running now, and the most that ever ran at once.
        self.running = 0
        self.most_at_once = 0

    def _spawn(self, kind: AgentType) -> None:
        """Count one more subagent of the parent's current prompt, or refuse it (`ToolError`,
        for the model) when the prompt has started `max_total` already."""
        if self._started_in != self.parent.prompts:
            self._started_in, self.started = self.parent.prompts, 0
        if self.started >= self.max_total:
            raise ToolError(
                f"not started: this prompt has started {self.started} subagent(s), the most it "
                f"may (subagents.max_total = {self.max_total}); do the {kind.name} task yourself, "
                "or wait for the reports you have"
            )
        self.started += 1

    def tool(self) -> FunctionTool:
        names = ", ".join(f"{k.name} ({k.description})" for k in self.types.types.values())
        subagents = self

        # Read-only for the gate: the child's own calls go through it. Not idempotent: running it
        # again repeats the child's work.
        @tool(name="task", read_only=True, idempotent=False, kind="subagent")
        async def task(
            ctx: ToolContext,
            description: str,
            prompt: str,
            subagent_type: str = "general",
            run_in_background: bool = False,
            isolation: str = "",
        ) -> ToolOutput:
            """Hand a self-contained task to a subagent with its own fresh context; only its
            final report comes back. Use it for broad searches and for independent pieces of
            work, to keep your own context small; start several in one turn to run them side by
            side. The subagent knows nothing of this conversation: put everything it needs in
            the prompt.

            Args:
                description: A 3-5 word label for the task.
                prompt: The full task: what to do, what to report back, any paths and context.
                subagent_type: Which kind of agent runs it.
                run_in_background: Return a task id at once and keep working; the report
                    arrives later (or wait for it with task_wait).
                isolation: "worktree" to work in a new git worktree on its own branch (only in
                    a git repository); the report says which branch holds its changes.
            """
            return await subagents.start(
                ctx, description, prompt, subagent_type, run_in_background, isolation
            )

        schema = task.input_schema
        properties = {
            **schema["properties"],
            "subagent_type": {
                **schema["properties"]["subagent_type"],
                "enum": list(self.types.types),
            },
        }
        return dataclasses.replace(
            task,
            description=f"{task.description}\n\nAgent types: {names}.",
            input_schema={**schema, "properties": properties},
        )

    async def start(
        self,
        ctx: ToolContext,
        description: str,
        prompt: str,
        subagent_type: str,
        background: bool,
        isolation: str,
    ) -> ToolOutput:
        kind = self.types.get(subagent_type)
        if kind is None:
            known = ", ".join(self.types.types)
            raise ToolError(f"unknown subagent_type {subagent_type!r}; available: {known}")
        if not prompt.strip():
            raise ToolError("prompt is empty: say what the subagent should do")
        if isolation not in ("", "worktree"):
            raise ToolError('isolation must be "worktree" or omitted')
        if background and ctx.background is None:
            raise ToolError("background tasks are not available here; run it in the foreground")
        self._spawn(kind)
        tool_use_id = current_call_id.get()
        if not background:
            text, is_error = await self.run(kind, prompt, description, tool_use_id, isolation)
            return ToolOutput(text, is_error=is_error)
        assert ctx.background is not None

        async def work(task: BackgroundTask) -> tuple[Status, str]:
            text, is_error = await self.run(
                kind, prompt, description, tool_use_id, isolation, task_id=task.id
            )
            return ("failed" if is_error else "completed"), text

        started = ctx.background.start("agent", description or kind.name, work, agent=kind.name)
        return ToolOutput(
            f"started {started.id}: a {kind.name} subagent working on {description!r} in the "
            "background. Its report will arrive as a task notification; task_wait waits for "
            "it, task_stop stops it."
        )

    async def run(
        self,
        kind: AgentType,
        prompt: str,
        description: str,
        tool_use_id: str,
        isolation: str = "",
        *,
        task_id: str = "",
    ) -> tuple[str, bool]:
        """Run one child to its end: (its report or what went wrong, whether it failed)."""
        async with self._slots:
            worktree = None
            try:
                if isolation == "worktree":
                    from keel.agent.worktrees import create_worktree

                    worktree = await create_worktree(self.parent, description or kind.name)
                child = self._child(kind, worktree)
            except KeelError as exc:
                return f"the {kind.name} subagent could not start: {exc.one_line()}", True

            parent = self.parent

            def forward(event: Event) -> None:
                parent.forward(SubagentEvent(tool_use_id, kind.name, description, event, task_id))
                if isinstance(event, UsageUpdated):
                    parent.forward(child.spend_row(kind.name, description, "running", tool_use_id))

            if not parent.has_subagents:  # the first: the main agent's row opens the tree's
                parent.has_subagents = True
                parent.forward(parent.spend_row())
            parent.forward(child.spend_row(kind.name, description, "running", tool_use_id))
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
            status = "interrupted"  # unless it returns: a child that raises was cancelled
            try:
                prompt = await self._subagent_start(child, kind, prompt)
                result = await child.run(prompt, forward)
                status = result.stop_reason
            finally:
                self.running -= 1
                await _close_child(child, self.parent)
                parent.forward(child.spend_row(kind.name, description, status, tool_use_id))
            text, failed = _report(result, kind, budget=_budget_stop(child))
            if worktree is not None:
                try:
                    text += "\n\n" + await worktree.finish(description or kind.name)
                except KeelError as exc:
                    text += f"\n\n[worktree] {exc.one_line()} (worktree {worktree.path})"
            return text, failed

    async def _subagent_start(self, child: Agent, kind: AgentType, prompt: str) -> str:
        """SubagentStart hooks (matcher: the agent type); their additionalContext goes to the
        child ahead of its prompt."""
        hooks = self.parent.hooks
        if hooks is None or not hooks.has("SubagentStart"):
            return prompt
        agent_id = child.session.id if child.session is not None else child.session_id
        fields = {"agent_id": agent_id, "agent_type": kind.name}
        started = await hooks.run("SubagentStart", fields, match=kind.name)
        for message in started.messages:
            self.parent.forward(Notice(message, "info"))
        for error in started.errors:
            self.parent.forward(Notice(error, "warning"))
        notes = [
            f'<hook-context source="SubagentStart">\n{c}\n</hook-context>' for c in started.context
        ]
        return "\n\n".join([*notes, prompt])

    def _child(self, kind: AgentType, worktree: Worktree | None) -> Agent:
        from keel.agent.loop import Agent

        parent = self.parent
        provider, model, info = parent.provider, parent.model, parent.info
        if kind.model is not None:
            provider, model, info = self._model(kind)
        cwd = worktree.cwd if worktree else parent.cwd
        gate = parent.gate
        if worktree is not None and isinstance(gate, PermissionGate):
            # The child's writes are confined to its worktree, under the parent's rules.
            gate = dataclasses.replace(gate, root=worktree.path, cwd=cwd, record=None)
        tools: list[Tool] = [t for t in parent.registry if kind.allows(t.name)]
        system = build_system_prompt(base=f"{kind.prompt}\n\n{REPORT_FOOTER}\n\n{SAFETY}")
        context = build_context(
            cwd,
            user_dir=user_config_dir(parent.ctx.env),
            extra_sections=_inherited_sections(parent, tools),
        )
        # Nobody watches a subagent: it has a token budget of its own (the session's cap, else
        # the unattended default), and the parent's caps hold over it too.
        tokens = parent.limits.max_tokens or DEFAULT_UNATTENDED_TOKENS
        limits = Limits(kind.max_turns, tokens, min_output_tokens=parent.limits.min_output_tokens)
        child = Agent(
            provider=provider,
            model=model,
            info=info,
            tools=tools,
            cwd=cwd,
            system=system,
            context=context,
            limits=limits,
            effort=parent.effort,
            env=parent.ctx.env,
            gate=gate,
        )
        child.spend = Spend(parent=parent.spend)  # its cost counts in the parent's spend too
        child.enclosing_budgets = [(parent.limits, parent.spend), *parent.enclosing_budgets]
        child.is_subagent = True
        child.agent_type = kind.name
        # Its context holds the instruction files: what its reads bring comes as notes too.
        child.instruction_notes = InstructionNotes(
            cwd,
            user_dir=user_config_dir(parent.ctx.env),
            home=Path.home(),
            refuse=child.import_refusal,
        )
        child.hooks = parent.hooks
        child.auto_compact = parent.auto_compact
        # Its threshold and prompt additions; the facts to keep are the parent's own.
        child.compaction = dataclasses.replace(parent.compaction, keep=())
        child.tool_profile = parent.tool_profile  # its own window decides `auto`
        child.tool_call_text = parent.tool_call_text
        if kind.model is None and kind.allows("web_search"):
            # The parent's provider and model, so the same server-side search (or none).
            child.web_search = parent.web_search
        child.ctx.background = None
        child.ctx.unsafe_to_repeat = parent.ctx.unsafe_to_repeat
        child.ctx.max_file_size = parent.ctx.max_file_size
        child.ctx.max_file_reason = parent.ctx.max_file_reason
        if cwd == parent.cwd:
            # The parent's sandbox, and its checkpoint store: the child's edits belong to the
            # parent's turn, and one /undo reverts both. A worktree child changes nothing here.
            child.ctx.sandbox = parent.ctx.sandbox
            child.ctx.checkpoints = parent.ctx.checkpoints
            child.ctx.lsp = parent.ctx.lsp  # the parent's warm language servers
            child.ctx.checkpoint_limits = parent.ctx.checkpoint_limits
        if parent.session is not None:
            from keel.session.store import SessionLog

            directory = parent.session.path.with_name(f"{parent.session_id}.agents")
            child.session = SessionLog.create(
                cwd=cwd,
                model=f"{provider.name}/{model}",
                fingerprint=child.fingerprint(),
                directory=directory,
                parent=parent.session_id,
                agent=kind.name,
            )
        return child

    def _model(self, kind: AgentType) -> tuple[Provider, str, ModelInfo]:
        """The provider, model and catalog entry a definition's `model` names."""
        from keel.llm.catalog import lookup, parse_model
        from keel.llm.provider import make_provider

        parent, spec = self.parent, kind.model or ""
        if spec in MODEL_ALIASES:
            if parent.provider.name != "anthropic":
                parent.forward(
                    Notice(
                        f"agent type {kind.name} asks for {spec!r}, a Claude alias; using "
                        f"{parent.model} instead",
                        "info",
                    )
                )
                return parent.provider, parent.model, parent.info
            return parent.provider, MODEL_ALIASES[spec], lookup(MODEL_ALIASES[spec])
        ref = parse_model(spec)
        if ref.provider == parent.provider.name:
            return parent.provider, ref.model, lookup(ref.model)
        return make_provider(ref, env=parent.ctx.env), ref.model, lookup(ref.model)


def _inherited_sections(parent: Agent, tools: Iterable[Tool]) -> list[str]:
    """The parent's extra prompt sections a child keeps: the skills index, if it may load
    skills, and the memory index, if it may use memory."""
    names = {t.name for t in tools}
    keep = [
        tag for tool, tag in (("skill", "<skills>"), ("memory", "<memory-index>")) if tool in names
    ]
    return [s for s in parent.extra_sections if s.startswith(tuple(keep))] if keep else []


async def _close_child(child: Agent, parent: Agent) -> None:
    """Close what is the child's own (its journal, its provider if it has one); the gate,
    hooks, sandbox and provider it shares with the parent stay open."""
    if child.session is not None:
        child.session.close()
    if child.provider is not parent.provider:
        await child.provider.aclose()


def _budget_stop(child: Agent) -> tuple[str, bool] | None:
    """Why a child stopped at a budget, and whether the budget was its own (else the session's
    above it); None when no cap says so."""
    if child.over_budget is not None:  # a request it could not pay for was not sent
        return child.over_budget.message, child.over_budget.own
    own = check_budget(child.limits, child.spend).exhausted
    return (own, True) if own else None


def _report(
    result: RunResult, kind: AgentType, *, budget: tuple[str, bool] | None = None
) -> tuple[str, bool]:
    """What the parent sees of a finished child."""
    text = result.text.strip()
    match result.stop_reason:
        case "end_turn" if text:
            return text, False
        case "end_turn":
            return f"the {kind.name} subagent finished without a final message", True
        case "max_turns":
            why = f"ran out of turns ({kind.max_turns}) before finishing"
        case "loop":
            why = "was stopped for repeating the same tool calls"
        case "interrupted":
            why = "was interrupted"
        case "budget" if budget is not None and budget[1]:
            why = f"stopped at its own token budget ({budget[0]})"
        case "budget" if budget is not None:
            why = f"stopped at the session's budget ({budget[0]})"
        case "budget":
            why = "stopped: the session's budget is spent"
        case "error":
            why = f"failed: {result.error}"
        case other:
            why = f"stopped ({other})"
    partial = f"\n\nIts last message:\n{text}" if text else ""
    return f"the {kind.name} subagent {why}{partial}", True


def enable_subagents(
    agent: Agent,
    types: AgentTypes | None = None,
    *,
    max_total: int | None = None,
    max_concurrent: int | None = None,
) -> Subagents:
    """Give `agent` the `task` tool (before its first prompt: tools are fixed per context), with
    the caps on the subagents a prompt starts (None: keel's defaults)."""
    subagents = Subagents(
        agent,
        types or AgentTypes(dict(BUILTIN_TYPES)),
        max_total=MAX_TOTAL if max_total is None else max_total,
        max_concurrent=max_concurrent or MAX_CONCURRENT,
    )
    agent.add_tools([subagents.tool()])
    return subagents


__all__ = [
    "BUILTIN_TYPES",
    "AgentType",
    "AgentTypes",
    "Subagents",
    "enable_subagents",
    "load_agent_types",
]
