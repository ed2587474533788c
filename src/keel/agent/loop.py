"""The agent loop: one prompt in, model turns and tool rounds until the model stops calling tools.

`Agent._turn` is the loop and fits on one screen; everything else is a collaborator it calls. The
loop knows nothing about a UI (it emits `keel.agent.events`), journals before side effects (the
assistant message is durable before any of its tools runs; each tool result the moment it exists),
and keeps the prompt prefix byte-stable (system prompt and tools are fixed per context).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import os
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import field
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, Self, assert_never

from keel.agent.compaction import (
    CHARS_PER_TOKEN,
    MIN_MESSAGES,
    Keep,
    Verified,
    compacted_message,
    compaction_messages,
    estimate_tokens,
    keep_for,
    parse_summary,
    repair_messages,
    summary_cap,
    trimmed,
)
from keel.agent.events import (
    MODEL_ENDED,
    AgentSpend,
    AssistantMessage,
    BackgroundFinished,
    ContextCompacted,
    Event,
    PermissionAsked,
    QuestionRequest,
    RequestFinished,
    RequestStarted,
    RequestTiming,
    ToolCallText,
    ToolFinished,
    TurnFinished,
    TurnStarted,
    TurnStop,
    UsageUpdated,
)
from keel.agent.instruction_notes import InstructionNotes
from keel.agent.limits import (
    ESTIMATE_MARGIN,
    UNSEEN_PROMPT_TOKENS,
    Admission,
    BudgetCheck,
    Limits,
    OverBudget,
    RequestCost,
    Spend,
    admit,
    check_budget,
    output_budget,
)
from keel.agent.output_styles import OutputStyle, base_prompt, style_section
from keel.agent.prompt import (
    build_context,
    build_system_prompt,
    context_text,
    git_root,
    part_hashes,
    short_hash,
)
from keel.agent.questions import QuestionReply, Questions
from keel.agent.timing import RequestClock, journal_timing, timed_reply
from keel.agent.tool_runner import Choice, ToolRunner
from keel.config.settings import CompactionSettings, user_config_dir
from keel.errors import KeelError, RunError, UserError
from keel.frozen import frozen, mutable
from keel.llm.catalog import ModelInfo, ModelRef, lookup, parse_model, with_window
from keel.llm.errors import APIError, ContextOverflow, LLMError
from keel.llm.events import Done, Notice, TextDelta
from keel.llm.messages import Conversation, Message, Text, ToolResult, ToolUse, Usage, tool_result
from keel.llm.provider import Provider, make_provider, model_facts, model_info
from keel.llm.request import Effort, Request, ToolSpec, WebSearchOptions
from keel.permissions.gate import (
    AllowAll,
    AutoVerdict,
    Gate,
    Mode,
    PermissionGate,
    PermissionReply,
    PermissionRequest,
)
from keel.session.fold import PendingBatch, SessionState
from keel.session.journal import JournalWriteError
from keel.session.records import CompactionRecord, Fingerprint, TerminalReason
from keel.session.store import SessionLog, new_session_id
from keel.startup import resume_gc
from keel.tools.background import BackgroundTask, BackgroundTasks
from keel.tools.base import Tool, ToolContext
from keel.tools.profile import ToolProfile, chosen, offered
from keel.tools.registry import Registry

if TYPE_CHECKING:
    from keel.agent.auto_mode import AutoMode
    from keel.checkpoints import UndoSummary
    from keel.hooks.runner import AsyncOutcome, HookResult, HookRunner
    from keel.hooks.transcript import ClaudeTranscript
    from keel.mcp.prompts import McpPrompts
    from keel.permissions.sandbox import Sandbox
    from keel.skills import CommandSet, SkillSet

INTERRUPTED_MARK = "[interrupted by user]"
MAX_STOP_CONTINUATIONS = 5
NOT_RUN_SUMMARIZED = (
    "not run: the conversation was summarized before this call ran; call it again if it is "
    "still needed"
)
LOOP_REPEATS = 4
LOOP_WINDOW = 8
PLAN_MODE_NOTE = (
    "Plan mode is on: research with the read-only tools and read-only commands (ls, git log, "
    "grep…), change nothing, and when you know what to do, call exit_plan_mode with your plan "
    "for the user to approve."
)
EMPTY_RESPONSE = "(empty response)"
#: What the model is told, once per prompt, when its reply wrote a tool call as text that was not
#: run (`tool_call_text: nudge`), and when it ended with nothing right after tool results.
UNRUN_NUDGE = (
    "That was not run: {what}. To use a tool, call it with the tool-calling format, not as text "
    "in your reply; if you have finished, answer in plain words. The tools you can call: {tools} "
    "(run commands with bash)."
)
EMPTY_NUDGE = (
    "You ended your turn without a reply. Continue the task, or answer with what you found."
)
#: Tokens short of the window that still count as filling it (a server keeps a few for itself).
WINDOW_SLACK = 16
#: How many times a summary request that does not fit is cut and sent again.
SUMMARY_TRIMS = 4
#: The share of the window (less the summary's output) a trimmed summary request aims to fill:
#: the estimate errs low, so this leaves room for what it misses.
COMPACT_FILL = 0.6
#: The prompt of the turn keel starts itself to deliver background results.
NOTIFICATIONS_PROMPT = (
    "Background task results arrived. Continue with them as appropriate; if nothing needs "
    "doing, reply briefly."
)

Emit = Callable[[Event], None]


class Tracing(Protocol):
    """What the loop needs of a tracer (`keel.trace.Tracer`): a sink that records events
    before passing them on, and the gate's decisions nobody was asked about."""

    def wrap(self, sink: Emit | None) -> Emit: ...

    def decision(self, call: ToolUse, outcome: str, source: str, reason: str) -> None: ...


# -- next steps: what the loop does after a model response (a tagged union) ----------------------


@frozen
class Finish:
    reason: TurnStop
    #: Tool calls of the last response that will not run; each still gets a result.
    unanswered: tuple[ToolUse, ...] = ()
    why: str = ""


@frozen
class RunTools:
    calls: tuple[ToolUse, ...]


@frozen
class Resend:
    """The provider paused a long turn (`pause_turn`); send the conversation again as it is."""


@frozen
class Nudge:
    """Tell the model what went wrong in a user message and ask again (once per prompt and
    `kind`: `unrun` for a tool call written as text, `empty` for an empty reply)."""

    kind: str
    text: str


Step = Finish | RunTools | Resend | Nudge


@frozen
class RunResult:
    stop_reason: TurnStop
    text: str
    usage: Usage
    cost: float
    turns: int
    session_id: str
    error: str | None = None

    @classmethod
    def from_event(cls, e: TurnFinished) -> RunResult:
        return cls(e.stop_reason, e.text, e.usage, e.cost, e.turns, e.session_id, e.error)


_TERMINAL: dict[TurnStop, TerminalReason] = {
    "end_turn": "completed",
    "max_tokens": "max_tokens",
    "refusal": "refusal",
    "blocked": "blocked",
    "hook_stopped": "hook_stopped",
    "error": "error",
    "interrupted": "interrupted",
    "max_turns": "max_turns",
    "budget": "budget",
    "loop": "loop",
    "suspended": "suspended",
    "unknown_outcome": "unknown_outcome",
    "empty_response": "empty_response",
    "context_full": "context_full",
    "unrun_tool_call": "unrun_tool_call",
}


@mutable
class _TurnState:
    """What the current prompt has done so far (reset per prompt)."""

    turns: int = 0
    usage: Usage = field(default_factory=Usage)
    cost: float = 0.0
    partial: list[str] = field(default_factory=list)
    last_text: str = ""
    stop_continuations: int = 0
    loop_warned: bool = False
    #: The kinds of `Nudge` sent for this prompt.
    nudged: set[str] = field(default_factory=set)
    #: The last request's `max_tokens`, and whether its reply was empty (no text, no call).
    max_tokens: int = 0
    empty_reply: bool = False
    #: A budget lowered the last request's `max_tokens` (`limits.admit`); said once per prompt.
    budget_lowered: bool = False
    budget_said: bool = False


def _directory(cwd: object) -> Path:
    """`Agent(cwd=…)` as a resolved Path (None: the process's working directory)."""
    if cwd is None:
        return Path.cwd().resolve()
    path = os.fspath(cwd) if isinstance(cwd, str | os.PathLike) else cwd
    if not isinstance(path, str):
        raise UserError(
            f"Agent(cwd=…) takes a directory as a str or os.PathLike, not {type(path).__name__}",
            hint='e.g. Agent(..., cwd="path/to/project")',
        )
    return Path(path).resolve()


class Agent:
    """One conversation with one model. Not safe for two prompts at once."""

    def __init__(
        self,
        *,
        provider: Provider,
        model: str,
        tools: Iterable[Tool] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        system: str | None = None,
        context: str | None = None,
        limits: Limits | None = None,
        session: SessionLog | None = None,
        info: ModelInfo | None = None,
        effort: Effort | None = None,
        env: Mapping[str, str] | None = None,
        session_id: str | None = None,
        today: date | None = None,
        gate: Gate | None = None,
    ) -> None:
        self.provider = provider
        self.model = model
        self.info = info or lookup(model)
        self.cwd = _directory(cwd)
        self.limits = limits or Limits()
        self.session = session
        self.session_id = session.id if session else (session_id or new_session_id())
        self.effort = effort
        self.registry = tools if isinstance(tools, Registry) else Registry(tools or ())
        self.conversation = Conversation()
        self.spend = Spend()
        #: The caps of the runs this one belongs to (a subagent's parent), with their spend:
        #: each holds as well as this run's own `limits`.
        self.enclosing_budgets: list[tuple[Limits, Spend]] = []
        #: Why the last prompt stopped before a request its budget could not pay for (None: it
        #: did not): which cap, and what was left and needed.
        self.over_budget: OverBudget | None = None
        #: Prompts run so far (a subagent cap counts per prompt), and whether this agent has
        #: started a subagent (then each response also reports its row of the tree's spend).
        self.prompts = 0
        self.has_subagents = False
        self.ctx = ToolContext(
            cwd=self.cwd,
            root=git_root(self.cwd) or self.cwd,
            session_id=self.session_id,
            env=dict(os.environ if env is None else env),
        )
        #: Background commands and subagents; their results reach the model as notifications.
        self.background = BackgroundTasks()
        self.ctx.background = self.background
        self.background.on_finish.append(
            lambda t: self.forward(BackgroundFinished(t.id, t.kind, t.status, t.description))
        )
        self._emit: Emit | None = None  # the running prompt's event sink
        #: Questions waiting for the user (`answer`); emitted like every other event.
        self.questions = Questions(self.forward)
        self._system_override = system
        #: The caller's context (None: built here, unless the caller gave its own system prompt,
        #: which then stands alone).
        self._context_override = context
        #: Nested instruction files and path-scoped rules, delivered as notes when the model
        #: reads or edits a file they cover (None: not delivered, as with a system prompt of the
        #: caller's own).
        self.instruction_notes: InstructionNotes | None = None
        #: The output style of the system prompt (None: keel's own); read when a context's
        #: prompt is built, so a change applies from the next fresh context.
        self.output_style: OutputStyle | None = None
        if system is None:
            self.instruction_notes = InstructionNotes(
                self.cwd,
                user_dir=user_config_dir(self.ctx.env),
                home=Path.home(),
                refuse=self.import_refusal,
            )
        self._today = today
        #: More context sections (the skills and memory indexes), fixed per context.
        self.extra_sections: list[str] = []
        self._system: str | None = None
        self._context: str | None = None
        #: The tool profile (keel.tools.profile), read with the window when a context's tools
        #: are chosen (`offer`). Full unless set: front ends set the `tools.profile` setting's
        #: (auto by default).
        self.tool_profile: ToolProfile = "full"
        self._offered: tuple[tuple[ToolSpec, ...], WebSearchOptions | None] | None = None
        self._notes: list[str] = []
        self._resume_notes: list[str] = []
        #: Called before each model request of a turn is built, after the tool round before it
        #: (a fleet worker saves the round's files here); what they queue with
        #: `add_request_note` goes with that very request.
        self.before_request: list[Callable[[], None]] = []
        #: The permission mode the model last heard of, and whether the user changed it since.
        self._mode_heard: Mode | None = None
        self._mode_changed = False
        self._unit_label: str | None = None
        if gate is None:
            # Safe by default, as `keel -p` is: the settings' rules for this cwd, the sandbox
            # when it works here, nobody to ask. Only an explicit allow-all gate runs all.
            from keel.permissions.setup import Permissions

            gate = Permissions.from_settings(self.cwd, env=self.ctx.env)
        self.gate: Gate = gate
        if isinstance(self.gate, PermissionGate):
            self.ctx.content_denied = self.import_refusal  # grep, knowledge_search ask it
            if self.gate.record is None:
                self.gate.record = self._record_decision
            if self.gate.classifier is None:
                self.gate.classifier = self._auto_decide
            if self.gate.sandbox is not None and self.ctx.sandbox is None:
                self.ctx.sandbox = self._own_sandbox(self.gate)
        self._runner = ToolRunner(self.registry, self.ctx, self.gate)
        self._task: asyncio.Task[Any] | None = None
        self._interrupt_requested = False
        self._interrupt_detail = ""
        self._suspend_requested = False
        self._state = _TurnState()
        #: A tool batch left half-answered (by a suspend, or found in a resumed session).
        self._pending: PendingBatch | None = None
        self._restored_turns = 0
        self.total_turns = 0
        self.last_prompt = ""
        #: Compact automatically above `compaction.threshold` of the window (`auto_compact`).
        self.auto_compact = True
        #: The `compaction` setting: threshold, facts to keep, prompt additions.
        self.compaction = CompactionSettings()
        #: Facts the user pinned in this session (`/pin`; journaled, so a resume has them).
        self.pins: list[str] = []
        #: What a tool call written as text that was not run leads to (`tool_call_text`
        #: setting): nudge the model once per prompt, stop the turn, or ignore it.
        self.tool_call_text: ToolCallText = "nudge"
        #: The provider's own web search, offered with the tools (None: not offered). Part of the
        #: prompt prefix like the tools: set it before the first prompt.
        self.web_search: WebSearchOptions | None = None
        #: Someone is watching: the loop guard warns instead of stopping.
        self.interactive = False
        #: Someone can answer an MCP server's questions (elicitation, sampling approval): they go
        #: out as events and wait for `answer` (the TUI, `keel serve`); else they are refused.
        #: Apart from `interactive`: a served session can be answered but nobody need watch it.
        self.takes_questions = False
        #: PreCompact hooks: called with (trigger, instructions) before a compaction.
        self.pre_compact: list[Callable[[str, str], Awaitable[None]]] = []
        self._last_context = 0  # tokens in the context after the last response
        self._model_asked = False  # whether the provider was asked what it serves the model with
        self._context_mark = 0  # messages up to here are counted in _last_context
        self._compaction_failed = False
        self._just_compacted = False  # no model reply since the last compaction
        self._rounds: deque[bytes] = deque(maxlen=LOOP_WINDOW)
        #: Hooks (None: none configured). SessionStart fires with this source at the next prompt.
        self.hooks: HookRunner | None = None
        #: The session in Claude Code's transcript format, for hooks (`transcript_path`).
        self._claude_transcript: ClaudeTranscript | None = None
        self.session_start_source: str | None = "startup"
        #: A subagent, or a turn keel started itself: no SessionStart / UserPromptSubmit hooks.
        self.is_subagent = False
        #: A subagent's type (its SubagentStart / SubagentStop hooks see it as `agent_type`).
        self.agent_type = ""
        self.self_started = False
        self.pre_compact.append(self._pre_compact_hook)
        #: What a prompt `/name args…` can expand to (None: prompts are sent as typed).
        self.skills: SkillSet | None = None
        self.commands: CommandSet | None = None
        #: MCP prompts as `/mcp__server__prompt` and `@server:uri` resource mentions.
        self.mcp_prompts: McpPrompts | None = None
        #: Where events of background subagents go while no prompt is running.
        self.on_background_event: Emit | None = None
        #: The debug tracer (`keel.trace.attach`); None: events go to the caller's sink as is.
        self.tracer: Tracing | None = None
        #: Auto mode's classifier, made at its first question by `auto_mode_factory` (the
        #: settings'), else the session's model with keel's policy (its modules load only then).
        self.auto_mode: AutoMode | None = None
        self.auto_mode_factory: Callable[[], AutoMode] | None = None
        #: Called by `aclose` (MCP servers to stop, for example).
        self.on_close: list[Callable[[], Awaitable[None]]] = []
        #: Called once when the current turn ends, however it ends (a custom command's model or
        #: tool limits for its turn are undone here).
        self.after_turn: list[Callable[[], None]] = []

    @staticmethod
    def _own_sandbox(gate: PermissionGate) -> Sandbox | None:
        """The gate's sandbox, for the gate's project: a gate copied for another root (a
        worktree subagent's) gets one of its own, so bash the gate allows as sandboxed is."""
        sandbox = gate.sandbox
        if sandbox is not None and sandbox.root.resolve() != gate.root.resolve():
            sandbox = gate.sandbox = dataclasses.replace(sandbox, root=gate.root)
        return sandbox

    @classmethod
    def from_model(
        cls,
        spec: str | ModelRef,
        *,
        tools: Iterable[Tool] | None = None,
        env: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> Agent:
        """An agent for `provider/model` (e.g. `anthropic/claude-sonnet-4-5`), keys from `env`."""
        ref = parse_model(spec) if isinstance(spec, str) else spec
        provider = make_provider(ref, env=env)
        if tools is None:
            from keel.tools.builtin import builtin_tools

            tools = builtin_tools()
        kwargs.setdefault("info", model_info(ref))  # a local model's tokens cost nothing
        return cls(provider=provider, model=ref.model, tools=tools, env=env, **kwargs)

    # -- public API --------------------------------------------------------------------------------

    @property
    def system(self) -> str:
        """The system prompt (built on first use, then fixed): the same bytes in every session
        and project with the same settings (`keel.agent.prompt`)."""
        if self._system is None:
            style = self.output_style
            self._system = self._system_override or build_system_prompt(
                base=base_prompt(style), sections=[style_section(style) if style else ""]
            )
        return self._system

    @property
    def context(self) -> str:
        """The current context's environment and instruction files (built on first use, again
        after a compaction), which open its first user message; "" with a caller's own system
        prompt and no context of the caller's."""
        if self._context is None:
            if self._context_override is not None:
                self._context = self._context_override
            elif self._system_override is not None:
                self._context = ""
            else:
                self._context = build_context(
                    self.cwd,
                    today=self._today,
                    user_dir=user_config_dir(self.ctx.env),
                    extra_sections=self.extra_sections,
                    refuse=self.import_refusal,
                )
            if self.instruction_notes is not None:
                # Its files count as delivered when it opens this context (a resumed
                # conversation holds the context it was sent).
                sent = "" if self.messages else self._context
                self.instruction_notes.reset(sent, self.messages)
        return self._context

    @property
    def prompt_text(self) -> str:
        """The system prompt and the context as one text: what the resume fingerprint's parts
        (so a changed instruction file is named) and the instruction hooks read."""
        return f"{self.system}\n\n{self.context}" if self.context else self.system

    def _opening(self, text: str) -> tuple[Text, ...]:
        """The blocks of a user message with `text`: the context first when it opens a fresh
        context (an empty conversation)."""
        if self.conversation.messages or not self.context:
            return (Text(text),)
        return (Text(context_text(self.context)), Text(text))

    def import_refusal(self, path: Path) -> str | None:
        """Why the model may not see `path`'s content (an instruction file's import, an `@file`
        mention, a file grep finds): a `read` deny rule (`PermissionGate.content_denied`)."""
        if not isinstance(self.gate, PermissionGate):
            return None
        rule = self.gate.content_denied(path)
        return None if rule is None else f"denied by rule {rule} ({rule.source or 'settings'})"

    @property
    def messages(self) -> list[Message]:
        return self.conversation.messages

    @property
    def tool_specs(self) -> tuple[ToolSpec, ...]:
        """The tool definitions this context offers (`offer`); before its first request, what
        it would offer if it started now (nothing is fixed here: a window learnt before the
        first request still chooses the profile)."""
        return (self._offered or self._offer_now())[0]

    def fingerprint(self) -> Fingerprint:
        specs = [[s.name, s.description, s.input_schema] for s in self.tool_specs]
        tools = json.dumps(specs, sort_keys=True)
        return Fingerprint(
            provider=self.provider.name,
            model=self.model,
            system_hash=hashlib.sha256(self.system.encode()).hexdigest()[:16],
            tools_hash=hashlib.sha256(tools.encode()).hexdigest()[:16],
            max_turns=self.limits.max_turns,
            max_tokens=self.limits.max_tokens,
            max_usd=self.limits.max_usd,
            # Thinking follows effort in keel (no effort: no thinking), recorded apart as fisk-ai
            # does so that a diff names both.
            thinking="off" if self.effort is None else "on",
            effort=self.effort,
            system_parts=part_hashes(self.prompt_text),
            tool_hashes=tuple(
                (str(spec[0]), short_hash(json.dumps(spec, sort_keys=True))) for spec in specs
            ),
        )

    def restore(self, state: SessionState) -> None:
        """Take over a folded session: its conversation, spend, turn counts and any half-answered
        tool batch. `resume()` then continues it without replaying anything."""
        self.conversation = Conversation(list(state.messages))
        if self.instruction_notes is not None and self._context is not None:
            # What its context and notes delivered counts as delivered (the context was built for
            # the resume check; built later, it counts them itself).
            self.instruction_notes.reset("", self.messages)
        self.spend = Spend(state.usage, state.cost, own_usage=state.usage, own_cost=state.cost)
        self._pending = state.pending
        self._runner.restore(state)  # calls of unknown outcome wait for a decision
        self._restored_turns = state.turns_since_prompt
        self.total_turns = state.turns
        self.last_prompt = state.last_prompt
        self.session_start_source = "resume"
        self._last_context = state.last_context
        self._context_mark = len(self.conversation.messages)
        self.pins = list(state.pins)

    def resolve_unknown(self, call_id: str, choice: Choice) -> None:
        """For a restored call of unknown outcome (it started, is not safe to repeat, and never
        reported back): run it again, or answer it as not re-run. Unresolved, `resume` asks
        through the gate's asker, or stops with `unknown_outcome` when nobody can be asked."""
        self._runner.resolve(call_id, choice)

    @property
    def resumable(self) -> bool:
        """Whether `resume()` has work: unanswered tool calls, or a conversation ending on a user
        message (tool results the model has not seen yet)."""
        msgs = self.conversation.messages
        return self._pending is not None or (bool(msgs) and msgs[-1].role == "user")

    @property
    def unanswered_calls(self) -> bool:
        """Whether the last reply has tool calls that were never answered (a crash or suspend
        between the reply and its results): `resume()` settles them."""
        return self._pending is not None

    def set_mode(self, mode: Mode) -> None:
        """Change the permission mode; the model learns of it with the next prompt (the prompt
        prefix is not touched), in one note that carries the mode it is then in: changes in
        between are not notes of their own, and a mode back where it was is no note at all."""
        if not isinstance(self.gate, PermissionGate):
            raise UserError("this agent has no permission gate to change the mode of")
        if self._mode_heard is None:
            self._mode_heard = self.gate.mode
        self.gate.mode = mode
        self._mode_changed = True

    def _mode_note(self) -> None:
        """Queue the note of the user's mode changes since the last prompt, if they add up to a
        change (a plan approval the model asked for needs none: it knows)."""
        if not isinstance(self.gate, PermissionGate):
            return
        if self._mode_changed and self.gate.mode != self._mode_heard:
            self._notes.append(f"The permission mode is now {self.gate.mode}.")
        self._mode_heard, self._mode_changed = self.gate.mode, False

    def add_tools(self, tools: Iterable[Tool]) -> None:
        """Offer more tools (skills, MCP servers' tools). The tool definitions open every request,
        so add them before the first prompt: later additions change the cached prefix."""
        for t in tools:
            self.registry.add(t)
        self._offered = None

    def offer(self) -> tuple[tuple[ToolSpec, ...], WebSearchOptions | None]:
        """What the context offers the model besides its messages: the tool definitions and the
        provider's web search. Chosen at the context's first request (`keel.tools.profile`: the
        profile, the window the model is known to have by then, and the deny rules that
        withhold whole tools), then fixed: they open every request. A deny rule added later is
        applied by the gate at once, and to the tools offered from the next fresh context."""
        if self._offered is None:
            self._offered = self._offer_now()
        return self._offered

    def _offer_now(self) -> tuple[tuple[ToolSpec, ...], WebSearchOptions | None]:
        profile = chosen(self.tool_profile, self.info.window)
        gate = self.gate if isinstance(self.gate, PermissionGate) else None
        specs = offered(
            self.registry,
            profile,
            withheld=gate.withheld if gate is not None else lambda name: None,
            plan_mode=gate is not None and gate.mode == "plan",
        )
        return specs, self.web_search if profile == "full" else None

    def pin(self, text: str) -> None:
        """Pin a fact for this session (`/pin`): every summary must keep it, word for word."""
        fact = " ".join(text.split())
        if not fact:
            raise UserError("nothing to pin", hint="/pin TEXT pins a line; /pin lists the pins")
        if fact in self.pins or fact in self.compaction.keep:
            raise UserError(f"already pinned: {fact}", hint="/pin lists the pins")
        self.pins.append(fact)
        if self.session is not None:
            self.session.pin(fact)

    def unpin(self, number: int) -> str:
        """Unpin this session's pin `number` (from 1, as `/pin` lists them); returns its text."""
        if not 1 <= number <= len(self.pins):
            raise UserError(
                f"no pin {number}",
                hint=f"/pin lists them; this session has {len(self.pins)}"
                + ("" if not self.compaction.keep else " (those in settings are removed there)"),
            )
        fact = self.pins.pop(number - 1)
        if self.session is not None:
            self.session.pin(fact, pinned=False)
        return fact

    def add_note(self, text: str) -> None:
        """Queue a note for the model; it is prepended to the next user message."""
        self._notes.append(text)

    def on_answer_later(self, handler: Callable[[ToolUse, str], Awaitable[None]] | None) -> None:
        """Who takes a call whose tool raised `AnswerLater` (a fleet worker: it parks the run)."""
        self._runner.on_answer_later = handler

    def supply_result(self, call_id: str, text: str, *, is_error: bool = False) -> None:
        """Answer a restored, unanswered call of the pending round with `text` instead of running
        its tool (a parked fleet run's deferred answer): journaled like any result."""
        pending = self._pending
        if pending is None or call_id not in {c.id for c in pending.unanswered}:
            raise UserError(f"no unanswered call {call_id} in this run's last round")
        result = tool_result(call_id, text, is_error=is_error)
        self._record_result(result, 0.0)
        pending.results[call_id] = result

    def add_resume_note(self, text: str) -> None:
        """Queue a note for the model that `resume()` delivers before its next model call, after
        the tool results of the round it finishes (a fleet run moved to another worker whose
        files lost the last round's edits). Journaled as a `note` user message."""
        self._resume_notes.append(text)

    def add_request_note(self, text: str) -> None:
        """Queue a note for the model that goes with the next model request of the running turn,
        after the tool results of the round before it (a fleet run's files its save left out).
        Journaled as a `note` user message, as resume notes are."""
        self._resume_notes.append(text)

    def _deliver_resume_notes(self) -> None:
        if not self._resume_notes:
            return
        message = Message("user", (Text("\n".join(self._resume_notes)),))
        self._resume_notes.clear()
        if self.session is not None:
            self.session.user(message, "note")
        self.conversation.append(message)  # joins the tool results before it

    async def run(
        self, prompt: str, on_event: Emit | None = None, *, label: str | None = None
    ) -> RunResult:
        """Run one prompt to its end. Events go to `on_event` as they happen. What the prompt
        changes in files is one `/undo` unit named `label` (default: the prompt)."""
        self._unit_label = label
        return await self._run(prompt, on_event)

    async def resume(self, on_event: Emit | None = None) -> RunResult:
        """Continue a restored or suspended run: answer its unanswered tool calls (through the
        gate again), then let the model go on. Raises `UserError` when there is nothing to do."""
        if not self.resumable:
            raise UserError(
                "nothing to resume: the last turn of this session completed",
                hint="give a new prompt to continue the conversation",
            )
        return await self._run(None, on_event)

    async def _run(self, prompt: str | None, on_event: Emit | None) -> RunResult:
        if self.tracer is not None:
            on_event = self.tracer.wrap(on_event)
        emit = on_event or (lambda _event: None)
        self._task = asyncio.current_task()
        self._emit = emit
        self._interrupt_requested = False
        self._interrupt_detail = ""
        self._suspend_requested = False
        try:
            return await self._drive(prompt, emit)
        finally:
            self._task = None
            self._emit = None

    async def run_notifications(self, on_event: Emit | None = None) -> RunResult | None:
        """Deliver finished background tasks' results in a turn keel starts itself (no prompt
        hooks), for when no prompt is running. None if there is nothing to deliver."""
        if not self.undelivered:
            return None
        self.self_started = True
        try:
            return await self._run(NOTIFICATIONS_PROMPT, on_event)
        finally:
            self.self_started = False

    def ask_through_events(self) -> None:
        """Someone can answer: what the gate would ask is emitted as `PermissionAsked` and waits
        for `answer` (without this, a question is refused, as in a headless run)."""
        if isinstance(self.gate, PermissionGate):
            self.gate.asker = self.questions.ask_permission

    def answer(
        self,
        request_id: str,
        reply: PermissionReply | QuestionReply,
        *,
        waited_ms: float | None = None,
    ) -> bool:
        """Answer a waiting question (`PermissionAsked`: a `PermissionReply`; `QuestionRequest`:
        the values, None to decline, or a string saying why not). False: nothing waits under
        that id. `waited_ms`: how long the question really waited, when it was answered before
        it was asked here (a fleet run answered while parked)."""
        return self.questions.answer(request_id, reply, waited_ms=waited_ms)

    def pending_questions(self) -> list[PermissionAsked | QuestionRequest]:
        return self.questions.pending()

    def forward(self, event: Event) -> None:
        """Pass an event (a subagent's) to whoever watches this agent: the running prompt's
        sink, else `on_background_event`."""
        sink = self._emit
        if sink is None:
            sink = self.on_background_event
            if self.tracer is not None:
                sink = self.tracer.wrap(sink)
        if sink is not None:
            sink(event)

    async def stream(self, prompt: str) -> AsyncIterator[Event]:
        """Run one prompt, yielding its events; the last one is `TurnFinished`."""
        queue: asyncio.Queue[Event] = asyncio.Queue()
        task = asyncio.create_task(self.run(prompt, queue.put_nowait))
        try:
            while True:
                event = await queue.get()
                yield event
                if isinstance(event, TurnFinished):
                    break
            await task
        finally:
            if not task.done():
                self.interrupt()
                await asyncio.gather(task, return_exceptions=True)

    @property
    def busy(self) -> bool:
        """A prompt is running."""
        return self._task is not None and not self._task.done()

    def request_suspend(self) -> None:
        """Stop at the loop boundary: the model reply in flight and every tool call of its batch
        finish and are journaled, no new model call starts, and the run ends with `suspended`
        (resumable: `resume` continues with the next model call)."""
        if self._task is not None and not self._task.done():
            self._suspend_requested = True

    def interrupt(self, detail: str = "") -> None:
        """Cancel the running prompt: partial text is kept with a mark, tool calls that have not
        finished get `interrupted by user` results, and the prompt ends with `interrupted`.
        `detail` (who stopped it, e.g. "output closed") goes into the terminal record."""
        if self._task is not None and not self._task.done():
            self._interrupt_requested = True
            self._interrupt_detail = detail
            self._task.cancel()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        """`async with Agent(...) as agent:` closes it (provider connections, MCP servers,
        background tasks, the session file) however the block ends."""
        await self.aclose()

    async def aclose(self, reason: str = "exit") -> None:
        self.questions.cancel_all("the session closed")
        await self.background.aclose()
        if self.hooks is not None and self.hooks.has("SessionEnd") and not self.is_subagent:
            from keel.hooks.claude import session_end_reason

            why = session_end_reason(reason)
            await self.hooks.run("SessionEnd", {"reason": why}, match=why)
        if self.hooks is not None and not self.is_subagent:
            await self.hooks.aclose()
        for close in self.on_close:
            await close()
        self.on_close.clear()
        await self.provider.aclose()
        if self.ctx.sandbox is not None:
            self.ctx.sandbox.cleanup()
        if self.ctx.checkpoints is not None and not self.is_subagent:
            self.ctx.checkpoints.drop_copies()  # the units stay; the copies of the tree go
        if self.session is not None:
            self.session.close()

    # -- the loop ----------------------------------------------------------------------------------

    async def _turn(self, prompt: str | None, emit: Emit) -> TurnStop:
        if prompt is not None:
            if (stop := await self._begin(prompt, emit)) is not None:
                return stop
        else:
            if (stop := await self._finish_pending(emit)) is not None:
                return stop
            self._deliver_resume_notes()
        while True:
            if (stop := self._check_limits(emit)) is not None:
                return stop
            self._deliver_notifications()
            for hook in self.before_request:
                hook()
            self._deliver_resume_notes()
            step = self._next_step(await self._ask_model(emit))
            match step:
                case Finish(reason, unanswered, why):
                    self._answer_unrun(unanswered, why, emit)
                    if (stop := await self._stop_hook(reason, emit)) is not None:
                        return stop
                case Resend():
                    continue
                case Nudge(kind, text):
                    self._nudge(kind, text, emit)
                case RunTools(calls):
                    if (stop := await self._run_tools(calls, emit)) is not None:
                        return stop
                    if (stop := self._loop_guard(calls, emit)) is not None:
                        return stop
                case _:
                    assert_never(step)

    # -- collaborators -----------------------------------------------------------------------------

    async def _drive(self, prompt: str | None, emit: Emit) -> RunResult:
        self._state = _TurnState(turns=0 if prompt is not None else self._restored_turns)
        self.over_budget = None
        if prompt is not None:
            self.prompts += 1
        if self.session is not None:
            self.ctx.raw_dir = self.session.path.with_name(self.session.path.stem + ".raw")
        if self.hooks is not None and not self.is_subagent:  # a subagent shares them
            from keel.hooks.claude import hook_session_id

            self.hooks.base.update(
                session_id=hook_session_id(self.session_id),
                transcript_path=self.hook_transcript_path(),
            )
            self.hooks.effort = self.effort
            self.hooks.on_async = self._async_hook_done
            if self.hooks.ask_model is None:
                from keel.hooks.model import model_call

                self.hooks.ask_model = model_call(
                    self.provider, session_model=self.model, default=self.hooks.model
                )
        if self.hooks is not None and self.is_subagent and self.hooks.has("SubagentStop"):
            self.hook_transcript_path()  # what SubagentStop hooks read (`agent_transcript_path`)
        self._runner.hooks = self.hooks
        self._runner.session = self.session
        self._restored_turns = 0
        emit(TurnStarted(prompt or "", self.session_id, resumed=prompt is None))
        if isinstance(self.gate, PermissionGate):
            # What building the gate had to say (the sandbox status): once, at the first prompt.
            while self.gate.notices:
                emit(self.gate.notices.pop(0))
        error: str | None = None
        try:
            stop = await self._turn(prompt, emit)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if not self._interrupt_requested or task is None:
                self._terminal("interrupted", "cancelled")
                raise
            task.uncancel()
            stop = "interrupted"
        except OverBudget as exc:  # a request the budget could not pay for was not sent
            emit(Notice(exc.message, "warning"))
            stop, self.over_budget = "budget", exc
        except KeelError as exc:
            stop, error = "error", exc.one_line()
            await self._stop_failure_hook(exc, emit)
        finally:
            while self.after_turn:
                self.after_turn.pop()()
        detail = self._interrupt_detail if stop == "interrupted" else ""
        self._terminal(_TERMINAL[stop], error or detail)
        s = self._state
        finished = TurnFinished(stop, s.last_text, s.usage, s.cost, s.turns, self.session_id, error)
        emit(finished)
        return RunResult.from_event(finished)

    async def _begin(self, prompt: str, emit: Emit) -> TurnStop | None:
        _ = self.system, self.context  # fix the prefix for this context on its first prompt
        if (stop := await self._prompt_hooks(prompt, emit)) is not None:
            return stop
        self._begin_unit(prompt, emit)
        await self._maybe_compact(emit, mid_turn=False)
        self._mode_note()
        if isinstance(self.gate, PermissionGate) and self.gate.mode == "plan":
            self._notes.append(PLAN_MODE_NOTE)
        if (stop := await self._expansion_hook(prompt, emit)) is not None:
            return stop
        text = await self._expand(prompt, emit)
        self._deliver_notifications()
        if self._notes:
            notes = "\n".join(self._notes)
            text = f"<system-note>\n{notes}\n</system-note>\n\n{text}"
            self._notes.clear()
        message = Message("user", self._opening(text))
        if self.session is not None:
            # Durable before the request, its fsync off the event loop thread (a server's other
            # sessions go on meanwhile).
            self.session.user(message, durable=False)
            await self.session.make_durable()
        self.conversation.append(message)
        self.last_prompt = prompt
        return None

    def _begin_unit(self, prompt: str, emit: Emit) -> None:
        """Start the prompt's `/undo` unit, for every front end. The store is opened beside the
        session file the first time; without a session file only a store the caller set counts.
        Subagents begin none: their edits belong to the prompt that started them."""
        label, self._unit_label = self._unit_label, None
        if self.is_subagent:
            return
        store = self.ctx.checkpoints
        if store is None:
            if self.session is None:
                return
            from keel.checkpoints import Checkpoints

            try:
                store = Checkpoints.for_session(self.session.path)
            except OSError as exc:  # an unreadable store must not stop the run
                emit(
                    Notice(
                        f"/undo is off for this prompt: cannot open checkpoints: {exc}", "warning"
                    )
                )
                return
            self.ctx.checkpoints = store
        store.begin_unit(prompt if label is None else label)

    def undo(self) -> UndoSummary:
        """Put back the files of the last prompt that changed files (`/undo`); the model is
        told with the next prompt and the session records it. Raises `NothingToUndo`. Call it
        between prompts."""
        from keel.checkpoints import NothingToUndo, undo_last

        if self.ctx.checkpoints is None:
            raise NothingToUndo
        summary, note = undo_last(
            self.ctx.checkpoints,
            cwd=self.cwd,
            record=self.session.undo if self.session is not None else None,
        )
        self.add_note(note)
        return summary

    async def _expand(self, prompt: str, emit: Emit) -> str:
        """What is sent for `prompt`: a skill's instructions or a custom command's text for
        `/name args…`, an MCP prompt's text (with `@server:uri` resources attached), else the
        prompt itself."""
        if self.mcp_prompts is not None and (got := await self.mcp_prompts.expand(prompt)):
            return got
        if not prompt.startswith("/"):
            return prompt
        expansion = self.skills.expand(prompt) if self.skills is not None else None
        if expansion is None and self.commands is not None:
            from keel.agent.command_turn import expand_command  # its frontmatter, for this turn

            expansion = await expand_command(self, prompt, emit, allow_shell=self._shell_allowed)
        if expansion is None:
            return prompt
        for line in expansion.refused:
            emit(
                Notice(
                    f"/{expansion.name}: !`{line}` was not run: it needs permission "
                    "(allow it with a bash rule in settings or --allowed-tools)",
                    "warning",
                )
            )
        for line in expansion.timed_out:
            emit(Notice(f"/{expansion.name}: !`{line}` timed out", "warning"))
        return expansion.text

    def _shell_allowed(self, line: str) -> bool:
        """A command file's `` !`cmd` `` runs only if the gate would let bash run it unasked."""
        if isinstance(self.gate, PermissionGate):
            return self.gate.would_allow("bash", {"command": line})
        return isinstance(self.gate, AllowAll)

    # -- hooks: SessionStart, UserPromptSubmit, Stop (tool hooks live in the tool runner) ---------

    def _hook_report(self, result: HookResult, emit: Emit) -> None:
        for message in result.messages:
            emit(Notice(message, "info"))
        for error in result.errors:
            emit(Notice(error, "warning"))

    async def _prompt_hooks(self, prompt: str, emit: Emit) -> TurnStop | None:
        """SessionStart once per fresh context, then UserPromptSubmit; neither for subagents or
        turns keel starts itself."""
        hooks = self.hooks
        if hooks is None or self.is_subagent or self.self_started:
            return None
        if self.session_start_source is not None:
            source, self.session_start_source = self.session_start_source, None
            started = await hooks.run(
                "SessionStart", {"source": source, "model": self.model}, match=source
            )
            self._hook_report(started, emit)
            reason = "compact" if source == "compact" else "session_start"
            await self._instructions_hook(self.prompt_text, reason, emit)
            self._notes += [
                f'<hook-context source="SessionStart">\n{c}\n</hook-context>'
                for c in started.context
            ]
        import uuid  # here, not at the top: ~4 ms of `keel -p`'s start-up

        hooks.prompt_id = str(uuid.uuid4())  # Claude Code: one per prompt the user sends
        if self._claude_transcript is not None:
            self._claude_transcript.prompt_id = hooks.prompt_id
        submitted = await hooks.run("UserPromptSubmit", {"prompt": prompt})
        self._hook_report(submitted, emit)
        if submitted.halt:
            emit(Notice(f"stopped by a UserPromptSubmit hook: {submitted.stop_reason}", "warning"))
            return "hook_stopped"
        if submitted.block:
            emit(
                Notice(f"prompt blocked by a UserPromptSubmit hook: {submitted.reason}", "warning")
            )
            return "blocked"
        self._notes += [
            f'<hook-context source="UserPromptSubmit">\n{c}\n</hook-context>'
            for c in submitted.context
        ]
        return None

    async def _expansion_hook(self, prompt: str, emit: Emit) -> TurnStop | None:
        """UserPromptExpansion: the prompt is a slash command the user typed (a skill, a custom
        command, an MCP prompt) about to expand. Exit 2 blocks the prompt (nothing expands, no
        `!cmd` runs); what the hook prints reaches the model."""
        hooks = self.hooks
        if hooks is None or self.is_subagent or self.self_started:
            return None
        if not hooks.has("UserPromptExpansion") or (found := self._slash(prompt)) is None:
            return None
        kind, name, arguments, source = found
        fields = {
            "expansion_type": kind,
            "command_name": name,
            "command_args": arguments,
            "command_source": source,
            "prompt": prompt,
        }
        result = await hooks.run("UserPromptExpansion", fields, match=name)
        self._hook_report(result, emit)
        if result.block or result.halt:
            why = result.reason or result.stop_reason or "no reason given"
            emit(Notice(f"/{name} blocked by a UserPromptExpansion hook: {why}", "warning"))
            return "blocked"
        self._notes += [
            f'<hook-context source="UserPromptExpansion">\n{c}\n</hook-context>'
            for c in result.context
        ]
        return None

    def _slash(self, prompt: str) -> tuple[str, str, str, str] | None:
        """(expansion type, name, arguments, source) in Claude Code's terms when `prompt` names
        a skill, a custom command or an MCP prompt; None otherwise."""
        from keel.skills.skills import parse_slash

        parsed = parse_slash(prompt) if prompt.startswith("/") else None
        if parsed is None:
            return None
        name, arguments = parsed
        if name.startswith("mcp__"):
            return None if self.mcp_prompts is None else ("mcp_prompt", name, arguments, "mcp")
        skill = self.skills.skills.get(name) if self.skills is not None else None
        command = self.commands.commands.get(name) if self.commands is not None else None
        if skill is not None and skill.user_invocable:
            path = skill.path
        elif command is not None:
            path = command.path
        else:
            return None
        if ":" in name:
            source = "plugin"  # plugins namespace what they bring
        elif path.is_relative_to(self.ctx.root):
            source = "projectSettings"
        else:
            source = "userSettings"
        return "slash_command", name, arguments, source

    async def _stop_hook(self, reason: TurnStop, emit: Emit) -> TurnStop | None:
        """The model is done. A Stop hook may send it back to work (at most 5 times per prompt)
        with its reason as feedback, or halt. Returns the stop reason, or None to go on."""
        event = "SubagentStop" if self.is_subagent else "Stop"
        if self.hooks is None or not self.hooks.has(event) or reason not in MODEL_ENDED:
            return reason
        state = self._state
        last = self.messages[-1] if self.messages else None
        fields: dict[str, object] = {
            "stop_hook_active": state.stop_continuations > 0,
            "last_assistant_message": last.text if last and last.role == "assistant" else "",
            "background_tasks": [_background_task(t) for t in self.background.running()],
            "session_crons": [],  # keel schedules nothing inside a session
        }
        if self.is_subagent:
            fields = {
                "agent_id": self.session.id if self.session else self.session_id,
                "agent_type": self.agent_type,
                "agent_transcript_path": self.hook_transcript_path(),
                **fields,
            }
        result = await self.hooks.run(event, fields, match=self.agent_type)
        self._hook_report(result, emit)
        if result.halt:
            emit(Notice(f"stopped by a {event} hook: {result.stop_reason}", "warning"))
            return "hook_stopped"
        if not result.block or state.stop_continuations >= MAX_STOP_CONTINUATIONS:
            return reason
        state.stop_continuations += 1
        feedback = (
            f'<hook-feedback source="{event}">\n{result.reason or "keep going"}\n</hook-feedback>'
        )
        message = Message("user", (Text(feedback),))
        if self.session is not None:
            self.session.user(message, "hook_feedback")
        self.conversation.append(message)
        return None

    async def _pre_compact_hook(self, trigger: str, instructions: str) -> None:
        if self.hooks is not None and self.hooks.has("PreCompact"):
            claude_trigger = "manual" if trigger == "manual" else "auto"
            await self.hooks.run(
                "PreCompact",
                {"trigger": claude_trigger, "custom_instructions": instructions},
                match=claude_trigger,
            )

    async def _post_compact_hook(self, trigger: str, summary: str, emit: Emit) -> None:
        if self.hooks is not None and self.hooks.has("PostCompact"):
            claude_trigger = "manual" if trigger == "manual" else "auto"
            fields = {"trigger": claude_trigger, "compact_summary": summary}
            self._hook_report(
                await self.hooks.run("PostCompact", fields, match=claude_trigger), emit
            )

    async def _stop_failure_hook(self, error: KeelError, emit: Emit) -> None:
        """StopFailure: an error ended the turn (its output changes nothing, as in Claude
        Code)."""
        if self.hooks is None or not self.hooks.has("StopFailure") or self.is_subagent:
            return
        from keel.hooks.claude import stop_failure_kind

        kind = stop_failure_kind(error.status if isinstance(error, APIError) else None)
        last = self.messages[-1] if self.messages else None
        fields: dict[str, object] = {"error": kind, "error_details": error.one_line()}
        if last is not None and last.role == "assistant" and last.text:
            fields["last_assistant_message"] = last.text
        result = await self.hooks.run("StopFailure", fields, match=kind)
        for problem in result.errors:
            emit(Notice(problem, "warning"))

    async def _post_tool_batch_hook(self, emit: Emit) -> TurnStop | None:
        """PostToolBatch: once the round's results are in. Its context joins them as a note;
        its exit 2 (or `continue: false`) stops the turn."""
        batch, self._runner.batch = self._runner.batch, []
        if self.hooks is None or not self.hooks.has("PostToolBatch") or not batch:
            return None
        result = await self.hooks.run("PostToolBatch", {"tool_calls": batch})
        self._hook_report(result, emit)
        if result.context:
            context = "\n".join(
                f'<hook-context source="PostToolBatch">\n{c}\n</hook-context>'
                for c in result.context
            )
            message = Message("user", (Text(context),))
            if self.session is not None:
                self.session.user(message, "note")
            self.conversation.append(message)
        if result.block or result.halt:
            why = result.stop_reason or result.reason or "no reason given"
            emit(Notice(f"stopped by a PostToolBatch hook: {why}", "warning"))
            return "hook_stopped"
        return None

    def hook_transcript_path(self) -> str:
        """The Claude Code–format transcript hooks and the status line read (`transcript_path`),
        kept beside the session file from the first time it is asked for ("" without a session
        file, or when it cannot be written: said once)."""
        session = self.session
        if session is None:
            return ""
        if session.on_record is not None:
            return str(self._claude_transcript.path) if self._claude_transcript else ""
        from keel import __version__
        from keel.hooks.claude import hook_session_id
        from keel.hooks.transcript import ClaudeTranscript, transcript_path
        from keel.session.journal import read_records

        sid = hook_session_id(self.session_id)
        name, agent = sid, ""
        if self.is_subagent and self.hooks is not None:
            # A subagent's lines belong to its parent's session, as Claude Code's do.
            agent = session.id
            sid, name = str(self.hooks.base.get("session_id") or sid), f"agent-{agent}"
        writer = ClaudeTranscript(
            transcript_path(session.path, name),
            session_uuid=sid,
            cwd=self.cwd,
            version=__version__,
            agent_id=agent,
        )
        try:
            earlier = [] if writer.path.exists() else read_records(session.path).records
            writer.open([r.payload for r in earlier])
        except (OSError, KeelError) as exc:
            if self._emit is not None:
                self._emit(Notice(f"no transcript for hooks: {exc}", "warning"))
            session.on_record = lambda _record: None
            return ""
        self._claude_transcript = writer
        session.on_record = writer.record
        self._runner.on_response = writer.tool_response
        return str(writer.path)

    def _async_hook_done(self, outcome: AsyncOutcome) -> None:
        """A background hook ended: an `asyncRewake` hook's feedback wakes an idle session, as a
        finished background task does."""
        if outcome.wake:
            hook = f"{outcome.event} hook `{outcome.label}`"
            self.forward(BackgroundFinished("asyncRewake", "hook", "exited 2", hook))

    @property
    def undelivered(self) -> bool:
        """Something finished in the background that the model has not been told: a background
        task, or a background hook that wakes the session."""
        hooks = self.hooks
        woken = hooks is not None and any(o.wake for o in hooks.async_outcomes)
        return bool(self.background.undelivered()) or woken

    async def _ask_model(self, emit: Emit) -> Done:
        """One model request, compacting first when the context is nearly full, and once more
        (then retrying once) when the provider says the prompt no longer fits."""
        await self._learn_model(emit)
        await self._maybe_compact(emit, mid_turn=True)
        try:
            return await self._query(emit)
        except ContextOverflow as exc:
            # Nothing to compact, or it was just compacted: another summary would not help.
            if len(self.messages) < 2 or self._just_compacted:
                raise _overflow_error(exc, nothing_to_compact=len(self.messages) < 2) from exc
        emit(
            Notice(
                "the prompt no longer fits the context window; compacting and retrying", "warning"
            )
        )
        await self._compact(emit, trigger="overflow", mid_turn=True)
        try:
            return await self._query(emit)
        except ContextOverflow as exc:
            raise _overflow_error(exc, nothing_to_compact=False) from exc

    async def _maybe_compact(self, emit: Emit, *, mid_turn: bool) -> None:
        if not self.auto_compact or self._compaction_failed or len(self.messages) < MIN_MESSAGES:
            return
        if self._context_tokens() <= self.compaction.threshold * self.info.window:
            return
        try:
            await self._compact(emit, trigger="auto", mid_turn=mid_turn)
        except OverBudget:
            raise  # the turn stops with `budget`, not with a failed compaction
        except RunError as exc:  # a model error, or a summary that cannot fit
            # Not retried until a compaction succeeds; overflow recovery stays armed.
            self._compaction_failed = True
            emit(Notice(f"compaction failed: {exc.one_line()}", "warning"))

    def _context_tokens(self) -> int:
        """What the next request will hold: the last response's whole context, plus an estimate
        of what was added since."""
        return self._last_context + estimate_tokens(self.messages[self._context_mark :])

    async def _learn_model(self, emit: Emit) -> None:
        """Once, before the first request: what the provider's server serves the model with (a
        local server's window: compaction, the meter and `max_tokens` use it from the first
        request on; a chat template without tools: said once)."""
        if self._model_asked:
            return
        self._model_asked = True
        facts = await model_facts(self.provider, self.model)
        if facts.window and facts.window != self.info.window:
            self.info = with_window(self.info, facts.window)
        if facts.warning and not self.is_subagent:
            emit(Notice(facts.warning, "warning"))

    def _input_tokens(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec]
    ) -> tuple[int, int]:
        """About how many tokens a request of `messages` with this context's system prompt and
        `tools` holds, as (known, estimated): the last response's context as its server counted
        it, and an estimate of what was added since."""
        mark = self._context_mark
        if self._last_context and list(messages[:mark]) == self.messages[:mark]:
            return self._last_context, estimate_tokens(messages[mark:])
        # The first request of a context: its system prompt and tools count too.
        specs = json.dumps([[t.name, t.description, t.input_schema] for t in tools])
        return 0, (len(self.system) + len(specs)) // CHARS_PER_TOKEN + estimate_tokens(messages)

    def _admitted(
        self, max_output: int, messages: Sequence[Message], tools: Sequence[ToolSpec]
    ) -> Admission:
        """`max_tokens` for a request of `messages` with this context's system prompt and
        `tools`: `max_output`, or what the window leaves (`output_budget`), or what the budgets
        left pay for (`limits.admit`, which raises `OverBudget` when that is too little)."""
        known, estimated = self._input_tokens(messages, tools)
        asked = output_budget(self.info.window, known + estimated, max_output)
        budgets = self._budgets()
        if not budgets:
            return Admission(asked, False, 0.0, 0)
        info = self.info
        # The worst case: nothing cached, every input token at the dearer of the input and the
        # cache-write price, and the estimate's margin on top of what was estimated.
        tokens = known + estimated + int(estimated * ESTIMATE_MARGIN)
        if not known:  # the server has not counted this context yet
            tokens += UNSEEN_PROMPT_TOKENS
        cost = RequestCost(tokens, 0.0, 0.0)  # a model without prices: the token caps only
        if info.input_price is not None and info.output_price is not None:
            input_price = max(info.input_price, info.cache_write_price or 0.0)
            cost = RequestCost(tokens, tokens * input_price / 1e6, info.output_price / 1e6)
        return admit(budgets, asked, cost)

    def _budgets(self) -> list[tuple[Limits, Spend, str]]:
        """The caps a request must fit: this run's, then those of the runs it belongs to."""
        budgets = []
        if self.limits.max_usd is not None or self.limits.max_tokens is not None:
            budgets.append((self.limits, self.spend, "the"))
        for limits, spend in self.enclosing_budgets:
            if limits.max_usd is not None or limits.max_tokens is not None:
                budgets.append((limits, spend, "the session's"))
        return budgets

    async def compact(
        self, instructions: str = "", on_event: Emit | None = None
    ) -> CompactionRecord:
        """Summarize the conversation now (`/compact`, `keel compact`)."""
        if len(self.messages) < 2:
            raise UserError("nothing to compact yet", hint="compaction needs a conversation")
        if self.tracer is not None:
            on_event = self.tracer.wrap(on_event)
        emit = on_event or (lambda _e: None)
        await self._learn_model(emit)  # a resumed session's first request may be this one
        return await self._compact(
            emit,
            trigger="manual",
            mid_turn=False,
            instructions=instructions,
        )

    async def _compact(
        self, emit: Emit, *, trigger: str, mid_turn: bool, instructions: str = ""
    ) -> CompactionRecord:
        for hook in self.pre_compact:
            await hook(trigger, instructions)
        if self._pending is not None:
            # A round stopped half-way (a suspend): its calls that never ran are answered, in the
            # journal too, so the summary and the model both know they did not run.
            self._close_pending(NOT_RUN_SUMMARIZED)
            mid_turn = True
        before = self._context_tokens()
        emit(Notice(f"compacting the conversation (~{before // 1000}k tokens)…", "info"))
        keep = keep_for((*self.compaction.keep, *self.pins), self.messages)
        done, timing, asked = await self._summarize(emit, instructions, keep)
        if done is None:
            raise LLMError(f"{self.provider.name} ended the summary stream without a reply")
        cost = self.info.cost(done.usage)
        model = done.message.model or self.model
        emit(
            RequestFinished(
                "compaction", model, done.message, done.usage, done.stop_reason, cost, timing
            )
        )
        # Counted now: it was paid for, even when its summary is empty, and the budget must see
        # it before a repair request is admitted.
        self.spend.add(done.usage, cost)
        summary = parse_summary(done.message.text)
        if not summary:
            raise LLMError("the model returned an empty summary")
        summary, verified, amended = await self._checked(emit, asked, done, summary, keep)
        repair = amended.usage if amended is not None else Usage()
        repair_cost = self.info.cost(repair) if amended is not None else 0.0
        usage, cost = done.usage + repair, cost + repair_cost
        path = str(self.session.path) if self.session is not None else None
        lost_pins = [f for f in verified.lost if f in keep.pins]
        new = compacted_message(
            summary, self.messages, session_path=path, mid_turn=mid_turn, pinned=lost_pins
        )
        # A fresh context: its context is read again (instruction files may have changed) and
        # opens the one message, as it opened the first.
        self.ctx.read_ranges.clear()  # the model no longer has what it read
        self.conversation = Conversation()
        self._context = None
        text = "\n\n".join(b.text for b in self._opening(new.text))
        tokens_after = new.tokens_after + (len(text) - len(new.text)) // CHARS_PER_TOKEN
        record = CompactionRecord(
            text,
            trigger,
            before,
            tokens_after,
            usage,
            cost,
            *_lists(verified),
            amended.usage if amended is not None else None,
        )
        if self.session is not None:
            self.session.compaction(record)
        self.conversation = Conversation([Message("user", (Text(text),))])
        self._context_mark, self._last_context = 0, 0
        self._compaction_failed = False
        self._just_compacted = True
        self.session_start_source = "compact"  # Claude Code: SessionStart(compact) next
        if self.instruction_notes is not None:  # only what this context holds was delivered
            self.instruction_notes.reset("", self.messages)
        self.spend.add(repair, repair_cost)
        emit(ContextCompacted(trigger, before, tokens_after, *_lists(verified)))
        if verified.missing_first:
            emit(Notice(verified.note(), "warning" if verified.lost else "info"))
        await self._post_compact_hook(trigger, summary, emit)
        emit(
            Notice(
                f"compacted: ~{before // 1000}k tokens → ~{tokens_after // 1000}k ({trigger})",
                "info",
            )
        )
        return record

    async def _summary_reply(
        self, emit: Emit, messages: tuple[Message, ...], cap: int
    ) -> tuple[Done | None, RequestTiming]:
        """One compaction request (a summary, or its repair) of `messages`, admitted by the
        budgets like a turn's (`OverBudget` before anything is sent) and its worst case held
        while it is in flight; the caller adds its cost before it next awaits."""
        tools, web_search = self.offer()
        admitted = self._admitted(cap, messages, tools)
        request = Request(
            model=self.model,
            system=self.system,
            messages=messages,
            tools=tools,
            web_search=web_search,
            max_tokens=admitted.max_tokens,
            cache_key=self.session_id,
        )
        emit(RequestStarted(self._state.turns, self.model, request, "compaction"))
        self.spend.hold(admitted.held_usd, admitted.held_tokens)
        try:
            return await timed_reply(self.provider, request, RequestClock())
        finally:
            self.spend.hold(-admitted.held_usd, -admitted.held_tokens)

    async def _summarize(
        self, emit: Emit, instructions: str, keep: Keep
    ) -> tuple[Done | None, RequestTiming, tuple[Message, ...]]:
        """The summary reply, and the messages that asked for it. The whole conversation is
        asked first (the prompt cache serves it); when that does not fit the window, a trimmed
        transcript (`trimmed`), each time about half as long, up to `SUMMARY_TRIMS` times."""
        cap = summary_cap(self.info.window, self.info.request_max_tokens)
        messages, budget = list(self.messages), 0
        for attempt in range(SUMMARY_TRIMS + 1):
            asked = compaction_messages(
                messages,
                instructions,
                trimmed=attempt > 0,
                keep=keep.facts,
                additions=self.compaction.prompts,
            )
            try:
                return (*await self._summary_reply(emit, asked, cap), asked)
            except ContextOverflow as exc:
                overflow = exc
            # Aim below what the window leaves and below half of what was just refused.
            room = int(COMPACT_FILL * max(0, self.info.window - cap))
            budget = min(room, (budget or estimate_tokens(self.messages)) // 2)
            cut = trimmed(self.messages, budget)
            if cut is None:
                break
            messages = cut
            emit(
                Notice(
                    "the summary request does not fit the context window either; "
                    f"summarizing a trimmed transcript (~{estimate_tokens(cut) // 1000}k tokens)",
                    "warning",
                )
            )
        raise RunError(
            f"the conversation cannot be summarized within the model's context window: {overflow}",
            hint="give the model a larger window (llama-server -c / --ctx-size, "
            'providers."ollama".num_ctx, LM Studio\'s context length), or start a fresh session',
        ) from overflow

    async def _checked(
        self, emit: Emit, asked: Sequence[Message], done: Done, summary: str, keep: Keep
    ) -> tuple[str, Verified, Done | None]:
        """The summary to use, what its check found, and the repair's reply (None: no repair
        was asked, or it failed). A summary that misses a line to keep is asked for once more."""
        verified = Verified.first(keep.facts, summary)
        if not verified.missing_first:
            return summary, verified, None
        amended = await self._repair(emit, asked, done, verified.missing_first)
        if amended is not None:
            summary = parse_summary(amended.message.text) or summary
        return summary, verified.again(summary), amended

    async def _repair(
        self, emit: Emit, asked: Sequence[Message], done: Done, missing: Sequence[str]
    ) -> Done | None:
        """The one request for an amended summary that names what the first left out; None when
        it fails (the compaction goes on: what is missing is appended or reported)."""
        messages = repair_messages(asked, done.message, missing)
        cap = summary_cap(self.info.window, self.info.request_max_tokens)
        try:
            amended, timing = await self._summary_reply(emit, messages, cap)
        except OverBudget as exc:  # not sent: what is missing is appended instead
            emit(Notice(f"the summary's repair request was not sent: {exc.one_line()}", "warning"))
            return None
        except LLMError as exc:
            emit(Notice(f"the summary's repair request failed: {exc.one_line()}", "warning"))
            return None
        if amended is not None:
            cost = self.info.cost(amended.usage)
            model = amended.message.model or self.model
            emit(
                RequestFinished(
                    "compaction",
                    model,
                    amended.message,
                    amended.usage,
                    amended.stop_reason,
                    cost,
                    timing,
                )
            )
        return amended

    def _loop_guard(self, calls: tuple[ToolUse, ...], emit: Emit) -> TurnStop | None:
        """The same round of calls with the same results 4 times in the last 8 rounds: stop an
        unattended run; tell an interactive user once per turn."""
        results = self.messages[-1].tool_results
        digest = hashlib.sha256(
            json.dumps([[c.name, c.input] for c in calls], sort_keys=True, default=str).encode()
            + "\x00".join(r.text for r in results).encode()
        ).digest()
        self._rounds.append(digest)
        if self._rounds.count(digest) < LOOP_REPEATS:
            return None
        message = (
            f"the same tool round repeated {LOOP_REPEATS} times in the last {LOOP_WINDOW} rounds"
        )
        if not self.interactive:
            emit(Notice(f"stopped: {message}", "warning"))
            return "loop"
        if not self._state.loop_warned:
            self._state.loop_warned = True
            emit(Notice(f"{message}; the agent may be stuck (press Esc to interrupt)", "warning"))
        return None

    def _check_limits(self, emit: Emit) -> TurnStop | None:
        if self._suspend_requested:
            return "suspended"
        if self._state.turns >= self.limits.max_turns:
            emit(Notice(f"stopped after {self._state.turns} model turns (max_turns)", "warning"))
            return "max_turns"
        budget = self._budget()
        for name, warning in budget.warnings:
            if name not in self.spend.warned:
                self.spend.warned.add(name)
                emit(Notice(warning, "warning"))
        if budget.exhausted:
            emit(Notice(budget.exhausted, "warning"))
            return "budget"
        return None

    def _budget(self) -> BudgetCheck:
        """Where the spend stands: this run's caps (and their warnings), then the caps of the
        runs it belongs to."""
        budget = check_budget(self.limits, self.spend)
        for limits, spend in self.enclosing_budgets:
            if budget.exhausted:
                break
            outer = check_budget(limits, spend)
            if outer.exhausted:
                budget = BudgetCheck(outer.exhausted, budget.warnings)
        return budget

    def _request(self, emit: Emit) -> tuple[Request, Admission]:
        """The next turn's request, its `max_tokens` within the window and the budgets (raises
        `OverBudget`, before anything is sent, when the budgets cannot pay for it)."""
        tools, web_search = self.offer()
        messages = self.conversation.messages
        admitted = self._admitted(self.info.request_max_tokens, messages, tools)
        if admitted.lowered and not self._state.budget_said:
            self._state.budget_said = True
            emit(
                Notice(
                    f"the budget left pays for {admitted.max_tokens:,} output tokens: "
                    "max_tokens lowered to that",
                    "info",
                )
            )
        request = Request(
            model=self.model,
            system=self.system,
            messages=tuple(messages),
            tools=tools,
            web_search=web_search,
            max_tokens=admitted.max_tokens,
            effort=self.effort,
            cache_key=self.session_id,
        )
        return request, admitted

    async def _query(self, emit: Emit) -> Done:
        state = self._state
        request, admitted = self._request(emit)
        state.turns += 1
        self.total_turns += 1
        state.partial = []
        state.max_tokens = request.max_tokens
        state.budget_lowered = admitted.lowered
        emit(RequestStarted(state.turns, self.model, request, "turn"))
        clock = RequestClock()
        # The worst case is held while the request is in flight, so that the other requests of
        # the tree (parallel subagents) see it spent; released once the reply's cost is added.
        self.spend.hold(admitted.held_usd, admitted.held_tokens)
        try:
            done = await self._stream(request, clock, emit)
        finally:
            self.spend.hold(-admitted.held_usd, -admitted.held_tokens)
        if self.session is not None:
            # The one fdatasync before anything the reply leads to, off the event loop thread.
            await self.session.make_durable()
        return done

    async def _stream(self, request: Request, clock: RequestClock, emit: Emit) -> Done:
        """Send `request`, pass its stream on as events, and record the reply (not yet
        durable: `_query` makes it so)."""
        state = self._state
        done: Done | None = None
        stream = self.provider.stream(request)
        try:
            # aclosing: the provider's stream (and its HTTP response) is closed here, in this
            # task, whatever happens, never later by the garbage collector.
            async with contextlib.aclosing(stream):
                async for event in stream:
                    if isinstance(event, Done):
                        done = event
                        continue
                    # The clock: once the output began, one comparison per delta.
                    if isinstance(event, TextDelta):
                        state.partial.append(event.text)
                        if clock.output is None:
                            clock.see(event)
                    elif clock.output is None or isinstance(event, Notice):
                        clock.see(event)
                    emit(event)
        except asyncio.CancelledError:
            self._keep_partial(emit, clock)
            raise
        if done is None:
            raise LLMError(f"{self.provider.name} stream ended without a final message")
        resume_gc()  # paused by `keel -p`'s start-up until the first reply (keel.startup)
        timing = clock.timing(done.usage.output)
        message = done.message
        state.empty_reply = not message.tool_uses and not message.text.strip()
        if not message.blocks:
            message = Message("assistant", (Text(EMPTY_RESPONSE),), message.provider, message.model)
            done = dataclasses.replace(done, message=message)
        self._record_assistant(done, emit, timing, durable=False)
        return done

    def _record_assistant(
        self, done: Done, emit: Emit, timing: RequestTiming | None = None, *, durable: bool = True
    ) -> None:
        self._just_compacted = False
        if done.window and done.window != self.info.window:
            # A local server loaded the model with this window: compaction and the meter use it.
            self.info = with_window(self.info, done.window)
        cost = self._answered_by(done.message).cost(done.usage)
        if timing is not None:
            model = done.message.model or self.model
            emit(
                RequestFinished(
                    "turn", model, done.message, done.usage, done.stop_reason, cost, timing
                )
            )
        if self.session is not None:
            self.session.assistant(
                done.message,
                done.usage,
                cost,
                done.stop_reason,
                self._state.turns,
                journal_timing(timing) if timing is not None else None,
                durable=durable,
            )
        self.conversation.append(done.message)
        state = self._state
        state.usage = state.usage + done.usage
        state.cost += cost
        if done.message.text:
            state.last_text = done.message.text
        self.spend.add(done.usage, cost)
        if done.usage.total:
            self._last_context = done.usage.context
            self._context_mark = len(self.messages)
        emit(AssistantMessage(done.message, done.usage, done.stop_reason, cost, timing))
        emit(
            UsageUpdated(
                done.usage, self.spend.usage, self.spend.cost, done.usage.context, self.info.window
            )
        )
        if self.has_subagents:
            emit(self.spend_row())

    def spend_row(
        self, agent: str = "main", description: str = "", status: str = "running", call: str = ""
    ) -> AgentSpend:
        """This agent's row of its tree's spend (`AgentSpend`)."""
        root = self.spend
        while root.parent is not None:
            root = root.parent
        spend = self.spend
        return AgentSpend(
            self.session.id if self.session is not None else self.session_id,
            agent,
            description,
            status,
            spend.own_usage,
            spend.own_cost,
            root.usage,
            root.cost,
            call,
        )

    def _answered_by(self, message: Message) -> ModelInfo:
        """Facts (prices) of the model that wrote `message`: a fallback's tokens cost its own."""
        if not message.provider or message.provider == self.provider.name:
            return self.info
        return model_info(ModelRef(message.provider, message.model or self.model))

    def _keep_partial(self, emit: Emit, clock: RequestClock) -> None:
        """Store what the user already saw of an interrupted response (timed up to now)."""
        text = "".join(self._state.partial)
        if not text:
            return
        message = Message(
            "assistant", (Text(f"{text}\n\n{INTERRUPTED_MARK}"),), self.provider.name, self.model
        )
        self._record_assistant(Done(message, Usage(), "end_turn"), emit, clock.timing(0))

    def _next_step(self, done: Done) -> Step:
        calls = tuple(done.message.tool_uses)
        if not calls:
            if done.stop_reason == "pause_turn":
                return Resend()
            if done.stop_reason == "max_tokens":
                if self._state.budget_lowered:
                    return Finish(
                        "budget",
                        why="the reply was cut at the output tokens the budget left paid for",
                    )
                if (why := self._context_full(done)) is not None:
                    return Finish("context_full", why=why)
                return Finish("max_tokens", why="the response hit the output token limit")
            if done.stop_reason == "refusal":
                return Finish("refusal", why="the model declined to answer")
            if done.unrun_calls:
                return self._unrun_calls(done.unrun_calls)
            if self._state.empty_reply:
                return self._empty_reply()
            return Finish("end_turn")
        budget = self._budget()
        if budget.exhausted:
            return Finish("budget", calls, f"not run: {budget.exhausted}")
        return RunTools(calls)

    def _context_full(self, done: Done) -> str | None:
        """Why a reply cut at `max_tokens` was cut by the context window, not the output limit
        (None: the output limit). Provider-neutral: the prompt and the reply reached the window;
        or the reply stopped short of the `max_tokens` asked for (a local server cuts where its
        window ends); or `max_tokens` was lowered below the model's own limit to fit the window."""
        window, asked, usage = self.info.window, self._state.max_tokens, done.usage
        filled = usage.context >= window - WINDOW_SLACK
        short = 0 < usage.output < asked - WINDOW_SLACK
        if not (filled or short or 0 < asked < self.info.request_max_tokens):
            return None
        size = f"{window:,}-token" if filled or not short else f"~{usage.context:,}-token"
        return (
            f"the reply was cut: the prompt and the reply filled the model's {size} context "
            "window (compact the conversation with /compact or keel compact, or load the model "
            "with a larger window: llama-server -c, Ollama's num_ctx)"
        )

    def _unrun_calls(self, problems: tuple[str, ...]) -> Step:
        """A reply that wrote tool calls as text keel did not run (`keel.llm.salvage`)."""
        what = "; ".join(problems)
        if self.tool_call_text == "ignore":
            return Finish("end_turn")
        if self.tool_call_text == "stop":
            return Finish("unrun_tool_call")  # the provider's notice said what was not run
        if "unrun" not in self._state.nudged:
            # A small model calls tools it imagines (`sort`, `unittest`): name the real ones.
            tools = ", ".join(sorted(spec.name for spec in self.tool_specs))
            return Nudge("unrun", UNRUN_NUDGE.format(what=what, tools=tools))
        return Finish(
            "unrun_tool_call",
            why="the model wrote a tool call as text again after it was asked to use the "
            "tool-calling format",
        )

    def _empty_reply(self) -> Step:
        """No text and no call. Right after tool results the model is asked once to go on."""
        before = self.messages[-2] if len(self.messages) > 1 else None
        after_tools = before is not None and any(isinstance(b, ToolResult) for b in before.blocks)
        if after_tools and "empty" not in self._state.nudged:
            return Nudge("empty", EMPTY_NUDGE)
        return Finish("empty_response", why="the model ended its turn with no text and no call")

    def _nudge(self, kind: str, text: str, emit: Emit) -> None:
        self._state.nudged.add(kind)
        emit(Notice(f"asking the model again: {text}", "info"))
        message = Message("user", (Text(text),))
        if self.session is not None:
            self.session.user(message, "note")
        self.conversation.append(message)

    async def _run_tools(
        self,
        calls: tuple[ToolUse, ...],
        emit: Emit,
        answered: dict[str, ToolResult] | None = None,
    ) -> TurnStop | None:
        """Run the calls not already `answered`, then append the whole batch's results as one
        message. A suspend request does not stop a batch: it is honoured at the loop boundary,
        once every call has its result journaled, so a suspended conversation is coherent."""
        results = dict(answered or {})
        todo = tuple(c for c in calls if c.id not in results)
        try:
            # No stop callback: a suspend waits for the whole batch (the loop boundary).
            await self._runner.run(todo, emit, results, self._record_result, self._barrier)
        except asyncio.CancelledError:
            # Every tool_use gets its tool_result, even when the round was interrupted.
            for call in calls:
                if call.id not in results:
                    result = tool_result(call.id, "interrupted by user", is_error=True)
                    kind = self._runner.kind_of(call.name)
                    self._record_result(result, 0.0, kind=kind)
                    results[call.id] = result
                    emit(ToolFinished(call, result, 0.0, kind=kind))
            self.conversation.append(Message("user", tuple(results[c.id] for c in calls)))
            raise
        if any(c.id not in results for c in calls):
            assistant = next(m for m in reversed(self.messages) if m.role == "assistant")
            self._pending = PendingBatch(assistant, results)
            return "unknown_outcome" if self._runner.stopped_unknown else "suspended"
        self._pending = None
        self.conversation.append(Message("user", tuple(results[c.id] for c in calls)))
        if (note := self._deliver_instruction_note(calls, results, emit)) is not None:
            await self._instructions_hook(note, "nested_traversal", emit)
        if (stop := await self._post_tool_batch_hook(emit)) is not None:
            return stop
        if (halt := self._runner.halt_reason) is not None:
            self._runner.halt_reason = None
            emit(Notice(f"stopped by a hook: {halt}", "warning"))
            return "hook_stopped"
        return None

    async def _finish_pending(self, emit: Emit) -> TurnStop | None:
        """On resume: the unanswered calls of a half-answered batch run (each authorised again);
        the answered ones are not repeated."""
        pending = self._pending
        if pending is None:
            return None
        emit(Notice(f"resuming: {len(pending.unanswered)} unanswered tool call(s) to run", "info"))
        return await self._run_tools(tuple(pending.message.tool_uses), emit, dict(pending.results))

    def _close_pending(self, why: str) -> None:
        pending = self._pending
        assert pending is not None
        for call in pending.unanswered:
            result = tool_result(call.id, why, is_error=True)
            self._record_result(result, 0.0)
            pending.results[call.id] = result
        self.conversation.append(
            Message("user", tuple(pending.results[c.id] for c in pending.message.tool_uses))
        )
        self._pending = None

    def _answer_unrun(self, calls: tuple[ToolUse, ...], why: str, emit: Emit) -> None:
        if why:
            emit(Notice(why, "warning"))
        if not calls:
            return
        results = [tool_result(c.id, why, is_error=True) for c in calls]
        for r in results:
            self._record_result(r, 0.0)
        self.conversation.append(Message("user", tuple(results)))

    def _deliver_instruction_note(
        self, calls: tuple[ToolUse, ...], results: dict[str, ToolResult], emit: Emit
    ) -> str | None:
        """What the files this round read or edited bring (nested instruction files, path-scoped
        rules) and the model has not had in this context: a note after the results. Returns
        the note's text (None: nothing new)."""
        notes = self.instruction_notes
        if notes is None:
            return None
        _ = self.context  # a resumed run's first round: the context's files count as delivered
        text = notes.note_for(calls, results)
        while notes.warnings:
            emit(Notice(notes.warnings.pop(0), "warning"))
        if text is None:
            return None
        message = Message("user", (Text(f"<system-note>\n{text}\n</system-note>"),))
        if self.session is not None:
            self.session.user(message, "note")
        self.conversation.append(message)  # joins the tool results before it
        return text

    async def _instructions_hook(self, text: str, reason: str, emit: Emit) -> None:
        """InstructionsLoaded, once per instruction file `text` (a system prompt or a note)
        brings. `reason`: `session_start` or `compact` for a system prompt, `nested_traversal`
        for a note (a rule in it counts as `path_glob_match`, an imported file as `include`).
        It only observes."""
        hooks = self.hooks
        if hooks is None or self.is_subagent or not hooks.has("InstructionsLoaded"):
            return
        from keel.hooks.claude import instructions_loaded

        for fields in instructions_loaded(text, reason, root=self.ctx.root):
            result = await hooks.run("InstructionsLoaded", fields, match=fields["load_reason"])
            for problem in result.errors:
                emit(Notice(problem, "warning"))

    def _deliver_notifications(self) -> None:
        """Finished background tasks, and what background hooks left for the model, ride along
        with the next request, as a user message; their errors go to the user."""
        text = self.background.take_notifications()
        if self.hooks is not None and not self.is_subagent:
            outcomes = self.hooks.take_async()
            for problem in (e for o in outcomes for e in o.errors):
                if self._emit is not None:
                    self._emit(Notice(problem, "warning"))
            text = "\n".join(t for t in (text, *(c for o in outcomes for c in o.context)) if t)
        if not text:
            return
        message = Message("user", (Text(text),))
        if self.session is not None:
            self.session.user(message, "task_notification")
        self.conversation.append(message)

    def _record_result(
        self, result: ToolResult, seconds: float, started_at: float = 0.0, kind: str = ""
    ) -> None:
        if self.session is not None:
            self.session.tool_result(result, seconds, started_at, kind)

    def _record_decision(
        self, call: ToolUse, outcome: str, source: str, reason: str, waited_ms: float = 0.0
    ) -> None:
        # How long the user took, when the decision was theirs (a question that was answered).
        waited_ms = self.questions.waited_ms.pop(call.id, waited_ms)
        if self.session is not None:
            self.session.decision(call.id, call.name, outcome, source, reason, waited_ms)
        if self.tracer is not None:
            self.tracer.decision(call, outcome, source, reason)

    async def _auto_decide(self, asked: PermissionRequest) -> AutoVerdict:
        """Auto mode: the classifier's verdict on a question of the gate (keel.agent.auto_mode)."""
        if self.auto_mode is None and self.auto_mode_factory is not None:
            self.auto_mode = self.auto_mode_factory()
        auto = self.auto_mode
        if auto is None:
            from keel.agent.auto_mode import AutoMode
            from keel.permissions.auto import AutoClassifier

            auto = AutoMode(AutoClassifier(self.model))
        return await auto.decide(
            asked,
            provider=self.provider,
            info=self.info,
            spend=self.spend,
            exhausted=self._budget().exhausted,
            emit=self.forward,
            prompt=self.last_prompt,
            context=self.messages,
            turn=self._state.turns,
            window=(self._last_context, self.info.window),
        )

    def _barrier(self) -> None:
        if self.session is not None:
            self.session.barrier()

    def _terminal(self, reason: TerminalReason, message: str) -> None:
        if self.session is None:
            return
        try:
            self.session.terminal(
                reason,
                message,
                turns=self.total_turns,
                cost=self.spend.cost,
                prompt=self.last_prompt,
            )
        except JournalWriteError:
            pass  # the run already failed on the journal; the file stays readable


def _background_task(task: BackgroundTask) -> dict[str, str]:
    """A running background task as Claude Code's Stop hooks see it (`background_tasks`)."""
    if task.kind == "shell":
        return {
            "id": task.id,
            "type": "shell",
            "status": task.status,
            "description": task.description,
            "command": task.description,
        }
    return {
        "id": task.id,
        "type": "subagent",
        "status": task.status,
        "description": task.description,
        "agent_type": task.agent,
    }


def _lists(
    verified: Verified,
) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """A compaction's check, in the order its record and event take it."""
    return verified.kept, verified.missing_first, verified.repaired, verified.lost


def _overflow_error(exc: ContextOverflow, *, nothing_to_compact: bool) -> RunError:
    if nothing_to_compact:
        return RunError(
            f"the prompt alone does not fit the model's context window: {exc}",
            hint="shorten the prompt, or use a model with a larger window",
        )
    return RunError(
        f"the conversation does not fit the context window even after compacting: {exc}",
        hint="start a fresh session, or use a model with a larger window",
    )


__all__ = ["Agent", "Emit", "RunResult"]
