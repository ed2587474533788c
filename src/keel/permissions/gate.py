"""The permission gate: whether each tool call may run, asked one call at a time, in order.

Decision order (first that applies wins; docs/permissions.md):
1. A write outside the project (symlinks resolved) or to a protected path: deny, in every mode.
2. A deny rule matches: deny. When a deny rule applies to bash, a command line whose programs
   keel cannot tell (`$(…)` or a variable as the program, a pipe into a shell, `source`…) is
   denied too: the rule could not see what it runs. A deny rule that takes in every call of a
   tool (`withheld`) also keeps the tool out of the tools offered to the model; a call of it
   anyway is denied here.
3. An ask rule matches: ask, in every mode (sandboxed bash and `bypass` included).
   A tool that needs confirmation (`tool_meta(t).confirm`; docs/tools.md "Tool metadata"):
   allow in `bypass` mode; deny in `plan` mode unless it is read-only; else ask, every call.
   Allow rules, hooks, the sandbox, read-only and `accept-edits` do not stand in for the user
   (a PermissionRequest hook may decline for the user, not confirm); "session" or "always"
   answers remember the confirmation for this run only. Declined, the model gets a result that
   is not an error: the user's decision, not a failure of the tool.
4. A PreToolUse hook said allow: allow; said ask: ask.
5. `exit_plan_mode`: ask, in every mode, `bypass` too (the question is the plan approval).
6. `bypass` mode: allow. `memory` (its saves and deletes too): allow, in every mode (a deny
   rule blocks it; docs/memory.md).
7. A read-only tool: allow (a file tool reading outside the project and the additional
   directories asks, unless an allow rule covers it).
8. `plan` mode: bash that only reads (the safe list) runs; any other bash line is refused (it
   may change something); web_fetch asks; anything else is refused.
9. Allow rules cover the call (for bash: every command of the line): allow.
10. bash in the sandbox (unless the call asked for `sandbox: false`): allow.
11. bash that only reads (the safe list): allow.
12. A write inside the project in `accept-edits` mode: allow.
13. Otherwise ask; without anyone to ask (headless), deny with a hint.

`auto` mode is `default` with one change: the question of step 13 goes first to a model
classifier (`keel.permissions.auto`), which allows or refuses with a reason. Every other question
(an ask rule, a hook's ask, a confirmation, a plan approval, a read outside the project, bash
that asks to leave a working sandbox) still goes to the user: the classifier decides only inside
the boundaries, and steps 1-2 refuse before it is asked. It fails closed: when it errs, times
out or answers out of format, the question goes to the user, or is refused when nobody can be
asked.

The gate knows nothing about a UI: asking goes through an `Asker` callback.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeAlias

from keel.errors import UserError
from keel.frozen import frozen, mutable
from keel.llm.messages import ToolUse
from keel.permissions.boundary import PROTECTED, outside_project, protected_path, refuse_write
from keel.permissions.rules import (
    FILE_TOOLS,
    READ_FAMILY,
    Rule,
    covers_every_call,
    covers_path,
    covers_tool,
    matches,
    suggest,
    target_path,
)

if TYPE_CHECKING:
    from keel.llm.events import Notice
    from keel.permissions.sandbox import Sandbox

Mode: TypeAlias = Literal["default", "accept-edits", "plan", "bypass", "auto"]
MODES: tuple[Mode, ...] = ("default", "accept-edits", "plan", "bypass", "auto")

#: Tools that change files, and the argument naming the file.
WRITE_TOOLS = {"write": "path", "edit": "path", "multi_edit": "path"}
#: Tools that change something yet run unasked in every mode, plan included (step 6): what
#: they change is keel's own state, not the project.
ALLOWED_BY_DEFAULT = frozenset({"memory"})


@frozen
class Allow:
    source: str = "default"
    #: Worth a `decision` record (not the routine allow of a read-only tool).
    notable: bool = False
    #: Why, when someone gave a reason (auto mode's classifier).
    reason: str = ""


@frozen
class Deny:
    reason: str
    source: str = "default"
    #: Whether the model's result for the call is an error result: every refusal is, except a
    #: declined confirmation (the user's decision about a call that did nothing wrong).
    is_error: bool = True


Decision: TypeAlias = Allow | Deny


HookOpinion: TypeAlias = Literal["allow", "ask"] | None


@frozen
class AutoVerdict:
    """What auto mode's classifier said about one question: `allow` or `deny` with its reason,
    or `unsure` (it failed, timed out or answered out of format: the question goes on to the
    user, or is refused headless), the reason saying what went wrong."""

    decision: Literal["allow", "deny", "unsure"]
    reason: str


class Gate(Protocol):
    """`confirm`: the tool needs the user's confirmation for every call (its metadata)."""

    async def authorize(
        self,
        call: ToolUse,
        *,
        read_only: bool,
        hook: HookOpinion = None,
        confirm: bool = False,
        hook_reason: str = "",
    ) -> Decision: ...


class AllowAll:
    """Every call runs, unasked, and bash runs without a sandbox: only for trusted scripts, and
    only when chosen explicitly (`Permissions.allow_all()`); a library `Agent` without a gate is
    gated like `keel -p`. Tools that need confirmation run unasked too, as in `bypass`."""

    async def authorize(
        self,
        call: ToolUse,
        *,
        read_only: bool,
        hook: HookOpinion = None,
        confirm: bool = False,
        hook_reason: str = "",
    ) -> Decision:
        return Allow("allow-all")


@frozen
class PermissionRequest:
    """A question for the user about one call. `suggestion` is the rule "always allow" saves;
    `plan` is set for `exit_plan_mode` (the plan to approve)."""

    call: ToolUse
    reason: str
    suggestion: str
    plan: str = ""
    #: The tool needs confirmation: nothing is saved, "always" lasts as long as "session".
    confirm: bool = False


@frozen
class PermissionReply:
    allow: bool
    #: once | session (remember for this run) | always (save the suggested rule)
    scope: Literal["once", "session", "always"] = "once"
    reason: str = ""
    #: For a plan approval: the mode to switch to.
    mode: Mode | None = None


Asker: TypeAlias = Callable[[PermissionRequest], Awaitable[PermissionReply]]
#: PermissionRequest hooks: asked first, whenever the user would be; a reply answers for the
#: user, None leaves the question to the user (or, headless, to the headless refusal).
PermissionHook: TypeAlias = Callable[[PermissionRequest], Awaitable[PermissionReply | None]]
#: Auto mode's classifier, as the gate sees it (an `Agent` supplies one that knows the
#: conversation): asked the question of step 13 in `auto` mode.
Classifier: TypeAlias = Callable[[PermissionRequest], Awaitable[AutoVerdict]]


def parse_mode(value: str) -> Mode:
    for mode in MODES:
        if value == mode:
            return mode
    raise UserError(f"unknown mode {value!r}", hint=f"modes: {', '.join(MODES)}")


@mutable
class PermissionGate:
    mode: Mode
    root: Path
    cwd: Path
    rules: list[Rule] = field(default_factory=list)
    #: bash runs in a working sandbox (probed); sandboxed commands need no prompt.
    sandboxed: bool = False
    #: The sandbox bash runs in (an `Agent` given this gate uses it); set with `sandboxed`.
    sandbox: Sandbox | None = None
    #: What building this gate had to say (rule warnings, the sandbox status) that nobody has
    #: been shown yet: an `Agent` emits them as `Notice` events at its first prompt.
    notices: list[Notice] = field(default_factory=list)
    asker: Asker | None = None
    #: Called for every notable decision: (call, outcome, source, reason).
    record: Callable[[ToolUse, str, str, str], None] | None = None
    #: Directories besides the root that writes may go to (`permissions.additionalDirectories`).
    extra_roots: tuple[Path, ...] = ()
    #: Rules granted "for this session" by the user.
    session_rules: list[Rule] = field(default_factory=list)
    #: Tools needing confirmation that the user confirmed "for this session" (by name).
    confirmed: set[str] = field(default_factory=set)
    #: Where "always allow" rules are saved (personal project settings).
    save_rule: Callable[[str], None] | None = None
    #: Told (message) each time the user is about to be asked (Notification hooks); it must not
    #: block: the question does not wait for it.
    notify: Callable[[str], None] | None = None
    permission_hook: PermissionHook | None = None
    #: Auto mode's classifier (None: in `auto` mode every question goes to the user).
    classifier: Classifier | None = None
    headless_hint: str = (
        "permission needed, but keel is running non-interactively; allow it with "
        "--allowed-tools or --mode"
    )

    async def authorize(
        self,
        call: ToolUse,
        *,
        read_only: bool,
        hook: HookOpinion = None,
        confirm: bool = False,
        hook_reason: str = "",
    ) -> Decision:
        """`hook` is what PreToolUse hooks said (a hook's deny never reaches the gate: it wins
        over everything), `hook_reason` why. A hook's allow or ask comes after deny rules and
        before the mode. `confirm`: the tool needs the user's confirmation (step 3)."""
        decision = await self._decide(call, read_only, hook, confirm, hook_reason)
        notable = isinstance(decision, Deny) or decision.notable
        if notable and self.record is not None:
            outcome = "deny" if isinstance(decision, Deny) else "allow"
            self.record(call, outcome, decision.source, decision.reason)
        return decision

    async def _decide(
        self,
        call: ToolUse,
        read_only: bool,
        hook: HookOpinion = None,
        confirm: bool = False,
        hook_reason: str = "",
    ) -> Decision:
        args: dict[str, Any] = call.input or {}
        tool = call.name
        if (refused := self._refused(tool, args)) is not None:
            return refused
        if (asked := self._asked_by(tool, args)) is not None:
            reason = f"{tool} matches the ask rule {asked} ({asked.source})"
            return await self._ask(call, reason, confirm=confirm)
        if confirm:
            return await self._confirm(call, read_only)
        if hook == "allow":
            return Allow("hook", notable=True)
        if hook == "ask":
            why = f": {hook_reason}" if hook_reason else ""
            return await self._ask(call, f"run {tool}, which a PreToolUse hook asks about{why}")
        if tool == "exit_plan_mode":
            # The question is the plan approval, so it is asked in every mode, bypass too.
            plan = str(args.get("plan", ""))
            if not plan.strip():
                return Deny("the plan is empty; write out the steps you will take", "validation")
            return await self._ask(call, "approve the plan", plan=plan)
        if self.mode == "bypass":
            return Allow("mode:bypass")
        if tool in ALLOWED_BY_DEFAULT:
            return Allow("default")
        if read_only:
            return await self._read_only(call, tool, args)
        if self.mode == "plan":
            return await self._in_plan_mode(call, tool, args)
        if (allowed := self._allowed_without_asking(tool, args)) is not None:
            return allowed
        # Leaving a working sandbox is the user's to allow, never the classifier's.
        leaves = tool == "bash" and self.sandboxed and args.get("sandbox", True) is False
        return await self._ask(call, self._why(tool, args), classify=not leaves)

    def _refused(self, tool: str, args: dict[str, Any]) -> Deny | None:
        """Steps 1-2: the project boundary and deny rules (bash lines they cannot see into)."""
        if (refusal := self._boundary(tool, args)) is not None:
            return Deny(refusal, "boundary")
        if (rule := self._denied_by(tool, args)) is not None:
            return Deny(f"denied by rule {rule} ({rule.source or 'settings'})", "rule")
        return self._hidden_from_deny_rules(tool, args)

    def would_allow(self, tool: str, args: dict[str, Any], *, confirm: bool = False) -> bool:
        """Whether a call of a non-read-only `tool` would run without asking anyone (nothing is
        recorded or asked). Used for work keel does on the user's behalf, such as the
        `` !`cmd` `` lines of a slash command. `confirm`: the tool needs confirmation (only
        `bypass` runs it unasked)."""
        import keel.permissions.shell as shell

        if self._boundary(tool, args) is not None or self._denied_by(tool, args) is not None:
            return False
        if self._hidden_from_deny_rules(tool, args) is not None:
            return False
        if self._asked_by(tool, args) is not None:
            return False
        if self.mode == "bypass":
            return True
        if confirm:
            return False
        if self.mode == "plan":
            return tool == "bash" and shell.is_read_only(str(args.get("command", "")))
        return self._allowed_without_asking(tool, args) is not None

    async def _in_plan_mode(self, call: ToolUse, tool: str, args: dict[str, Any]) -> Decision:
        """Step 8: what plan mode does with a call that is not read-only. bash runs when keel
        can prove the line only reads (the safe list, as Claude Code runs read-only commands
        while planning); allow rules and the sandbox do not widen it: they allow writes."""
        import keel.permissions.shell as shell

        if tool == "web_fetch":
            return await self._ask(call, "fetch a web page in plan mode")
        if tool == "bash":
            command = str(args.get("command", ""))
            if shell.is_read_only(command):
                return Allow("mode:plan safe-list")
            return Deny(
                f"`{_clip(command)}` is refused in plan mode: keel cannot tell that it only "
                "reads, so it may change something. Only commands keel knows to be read-only "
                "run until the plan is approved (ls, cat, grep, wc, git status/diff/log/show "
                "and pipes between them, without redirects to files); call exit_plan_mode with "
                "the plan",
                "mode:plan",
            )
        return Deny(
            f"{tool} is not available in plan mode: only reading tools run until the plan "
            "is approved (call exit_plan_mode with the plan)",
            "mode:plan",
        )

    def _allowed_without_asking(self, tool: str, args: dict[str, Any]) -> Allow | None:
        """Steps 7-10: allow rules, the sandbox, the safe list, accept-edits."""
        import keel.permissions.shell as shell

        if (source := self._allowed_by(tool, args)) is not None:
            return Allow(source, notable=True)
        if tool == "bash":
            if self.sandboxed and args.get("sandbox", True) is not False:
                return Allow("sandbox")
            if shell.is_read_only(str(args.get("command", ""))):
                return Allow("safe-list")
        if tool in WRITE_TOOLS and self.mode == "accept-edits":
            return Allow("mode:accept-edits", notable=True)
        return None

    async def _read_only(self, call: ToolUse, tool: str, args: dict[str, Any]) -> Decision:
        if (outside := self._reads_outside(tool, args)) is not None:
            return await self._ask(call, outside)  # outside the project: the user's, always
        return Allow("read-only")

    def _reads_outside(self, tool: str, args: dict[str, Any]) -> str | None:
        """Why a reading file tool asks: its path lies outside the project and the additional
        directories (as in Claude Code; a README cannot make the model read `~/.ssh` unasked),
        unless an allow rule covers it. None when it may read at once."""
        if tool not in READ_FAMILY:
            return None
        raw = str(args.get(FILE_TOOLS[tool]) or ".")
        if outside_project(raw, self.cwd, self.root, self.extra_roots) is None:
            return None
        if self._allowed_by(tool, args) is not None:
            return None
        return f"read {raw}, outside the project"

    def _boundary(self, tool: str, args: dict[str, Any]) -> str | None:
        if tool not in WRITE_TOOLS:
            return None
        raw = str(args.get(WRITE_TOOLS[tool], ""))
        return refuse_write(raw, self.cwd, self.root, self.extra_roots)

    def withheld(self, tool: str) -> Rule | None:
        """The deny rule that takes in every call of `tool` (`Bash`, `Bash(*)`, `mcp__server`;
        `rules.covers_every_call`), if any: the one answer to "is this tool wholly denied".
        Such a tool is not offered to the model (`keel.tools.profile`); a call of it anyway (a
        model that names it from memory) is refused at step 2 like every denied call. A rule
        for one turn (`Rule.for_turn`) withholds nothing: the context's tools outlive it."""
        deny = (r for r in self.rules if r.effect == "deny" and not r.for_turn)
        return next((r for r in deny if covers_every_call(r, tool)), None)

    def deny_rule(self, tool: str, args: dict[str, Any]) -> Rule | None:
        """The deny rule that forbids this call, if any (nothing is recorded or asked)."""
        return self._first("deny", tool, args)

    def content_denied(self, path: Path) -> Rule | None:
        """The `read` deny rule that keeps `path`'s content from the model, if any: the one
        answer for everything that would show a file's content without a `read` call of its
        own (matches of `grep`, sections of `knowledge_search`, `@file` mentions, files an
        instruction file imports). A path relative to cwd; symlinks are resolved. The same
        test as a `read` call of `path` meets at step 2 (`covers_tool`, `covers_path`), with the
        path resolved once: grep asks it for every file of a tree."""
        rules = [r for r in self.rules if r.effect == "deny" and covers_tool(r, "read")]
        if not rules:
            return None
        target, root = target_path(path, self.cwd), self.root.resolve()
        return next((r for r in rules if covers_path(r, target, root)), None)

    def _denied_by(self, tool: str, args: dict[str, Any]) -> Rule | None:
        return self._first("deny", tool, args)

    def _asked_by(self, tool: str, args: dict[str, Any]) -> Rule | None:
        """An ask rule: the call asks in every mode, sandboxed bash and bypass included."""
        return self._first("ask", tool, args)

    def _first(self, effect: str, tool: str, args: dict[str, Any]) -> Rule | None:
        for rule in self.rules:
            if rule.effect == effect and matches(rule, tool, args, self.root, self.cwd):
                return rule
        return None

    def _hidden_from_deny_rules(self, tool: str, args: dict[str, Any]) -> Deny | None:
        """Step 2 for bash, failing closed: with a deny rule for bash, a line whose programs (or
        the words a rule looks at) cannot be known without running it is refused, in every mode
        and in the sandbox too. A line with no deny rule for bash is not looked at here."""
        import keel.permissions.shell as shell

        if tool != "bash":
            return None
        rules = [r for r in self.rules if r.effect == "deny" and r.tool == "bash" and r.pattern]
        if not rules:
            return None
        command = str(args.get("command", ""))
        reasons = shell.opaque_reasons(command)
        why, named = (reasons[0], rules) if reasons else ("", [])
        for rule in [] if reasons else rules:
            unreadable = shell.unreadable_arguments(rule.pattern or "", command)
            if unreadable is not None:
                why, named = f"the words of `{_clip(unreadable)}` are not literal", [rule]
                break
        if not why:
            return None
        shown = ", ".join(f"{r} ({r.source or 'settings'})" for r in named[:3])
        more = f" and {len(named) - 3} more" if len(named) > 3 else ""
        which = f"deny rule{'s' if len(named) > 1 else ''} {shown}{more}"
        return Deny(
            f"refused: {why}, so keel cannot tell whether {which} would match what runs; write "
            "the command plainly (literal program names and arguments: no variables, "
            "substitutions, eval, sourced scripts or pipes into a shell)",
            "rule",
        )

    def _allowed_by(self, tool: str, args: dict[str, Any]) -> str | None:
        import keel.permissions.shell as shell

        allows = [r for r in (*self.rules, *self.session_rules) if r.effect == "allow"]
        if tool == "bash":
            # Each command of the line may be covered by a different rule.
            patterns = [r.pattern for r in allows if r.tool == "bash" and r.pattern is not None]
            if any(r.tool == "bash" and r.pattern is None for r in allows):
                return "rule:bash"
            if patterns and shell.rule_allows(patterns, str(args.get("command", ""))):
                return "rule:" + ", ".join(f"bash({p})" for p in patterns)
            return None
        for rule in allows:
            if matches(rule, tool, args, self.root, self.cwd):
                return f"rule:{rule}"
        return None

    def _why(self, tool: str, args: dict[str, Any]) -> str:
        import keel.permissions.shell as shell

        if tool == "bash":
            reasons = shell.analyze(str(args.get("command", ""))).needs_approval
            base = "run a command" + (" outside the sandbox" if self.sandboxed else "")
            return f"{base} ({'; '.join(reasons)})" if reasons else base
        if tool in WRITE_TOOLS:
            return f"change {args.get(WRITE_TOOLS[tool], 'a file')}"
        return f"use {tool}"

    async def _confirm(self, call: ToolUse, read_only: bool) -> Decision:
        """Step 3 for a tool that needs confirmation: only `bypass` and the user's own answer
        (this call, or "for this session") let it run."""
        tool = call.name
        if self.mode == "bypass":
            return Allow("mode:bypass", notable=True)
        if self.mode == "plan" and not read_only:
            return Deny(
                f"{tool} is not available in plan mode: only reading tools run until the plan "
                "is approved (call exit_plan_mode with the plan)",
                "mode:plan",
            )
        if tool in self.confirmed:
            return Allow("user:session", notable=True)
        return await self._ask(call, f"run {tool}, which needs your confirmation", confirm=True)

    async def _ask(
        self,
        call: ToolUse,
        reason: str,
        *,
        plan: str = "",
        confirm: bool = False,
        classify: bool = False,
    ) -> Decision:
        """Ask the user (`classify`: in `auto` mode the classifier first)."""
        if confirm:
            return await self._ask_confirmation(call, reason)
        if classify and self.mode == "auto":
            decided = await self._auto(call, reason)
            if not isinstance(decided, str):
                return decided
            reason = f"{reason}; auto mode could not decide: {decided}"
        if self.permission_hook is not None:
            request = PermissionRequest(
                call, reason, suggest(call.name, call.input or {}, self.cwd), plan
            )
            answer = await self.permission_hook(request)
            if answer is not None and not answer.allow:
                why = f": {answer.reason}" if answer.reason else ""
                return Deny(f"denied by a PermissionRequest hook{why}", "hook")
            if answer is not None:
                if call.name == "exit_plan_mode" and self.mode == "plan":
                    self.mode = "default"
                return Allow("hook:PermissionRequest", notable=True)
        if self.asker is None:
            what = "approve a plan" if call.name == "exit_plan_mode" else reason
            return Deny(f"{self.headless_hint} (needed to {what})", "headless")
        if self.notify is not None:
            self.notify(f"keel needs your permission to {reason}")
        reply = await self.asker(
            PermissionRequest(call, reason, suggest(call.name, call.input or {}, self.cwd), plan)
        )
        if not reply.allow:
            why = f": {reply.reason}" if reply.reason else ""
            return Deny(f"the user denied this{why}", "user")
        if reply.scope in ("session", "always"):
            from keel.permissions.rules import parse_rule

            rule = parse_rule(suggest(call.name, call.input or {}, self.cwd), "allow", "session")
            self.session_rules.append(rule)
            if reply.scope == "always" and self.save_rule is not None:
                self.save_rule(str(rule))
        if call.name == "exit_plan_mode" and reply.mode is not None:
            self.mode = reply.mode
        return Allow(f"user:{reply.scope}", notable=True)

    async def _auto(self, call: ToolUse, reason: str) -> Decision | str:
        """Auto mode: the classifier's decision, or (failing closed) why it gave none."""
        if self.classifier is None:
            return "no classifier is set up"
        verdict = await self.classifier(
            PermissionRequest(call, reason, suggest(call.name, call.input or {}, self.cwd))
        )
        if verdict.decision == "allow":
            return Allow("auto", notable=True, reason=verdict.reason)
        if verdict.decision == "deny":
            return Deny(
                f"auto mode refused this call: {verdict.reason}. Do not retry it in another "
                "form; do something else, or ask the user to run it",
                "auto",
            )
        return verdict.reason

    async def _ask_confirmation(self, call: ToolUse, reason: str) -> Decision:
        """The question for a tool that needs confirmation. Only a person confirms: a
        PermissionRequest hook may decline, and with nobody to ask the call is refused. A
        "session" or "always" answer is remembered for this run only (no rule is saved: an
        allow rule would not stand in for a confirmation anyway)."""
        tool = call.name
        request = PermissionRequest(call, reason, tool, confirm=True)
        if self.permission_hook is not None:
            answer = await self.permission_hook(request)
            if answer is not None and not answer.allow:
                why = f": {answer.reason}" if answer.reason else ""
                return Deny(f"denied by a PermissionRequest hook{why}", "hook")
        if self.asker is None:
            return Deny(
                f"{tool} needs the user's confirmation for every call, but keel is running "
                "non-interactively and nobody can confirm it (allow rules do not stand in "
                "for a confirmation); run it interactively, or use --mode bypass",
                "headless",
            )
        if self.notify is not None:
            self.notify(f"keel needs your confirmation to {reason}")
        reply = await self.asker(request)
        if not reply.allow:
            why = f" ({reply.reason})" if reply.reason else ""
            return Deny(
                f"the user declined to run this call of {tool}{why}. This is the user's "
                "decision, not a failure of the tool: it did not run. Do not call it again "
                "unless the user asks for it; go on without it or ask the user what to do",
                "user",
                is_error=False,
            )
        if reply.scope in ("session", "always"):
            self.confirmed.add(tool)
        return Allow(f"user:{reply.scope}", notable=True)


def _clip(text: str, limit: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def tool_rules(allowed: Iterable[str], denied: Iterable[str], source: str) -> list[Rule]:
    from keel.permissions.rules import parse_rules

    return [*parse_rules(denied, "deny", source), *parse_rules(allowed, "allow", source)]


__all__ = [
    "FILE_TOOLS",
    "MODES",
    "PROTECTED",
    "Allow",
    "AllowAll",
    "Asker",
    "AutoVerdict",
    "Classifier",
    "Decision",
    "Deny",
    "Gate",
    "Mode",
    "PermissionGate",
    "PermissionHook",
    "PermissionReply",
    "PermissionRequest",
    "parse_mode",
    "protected_path",
    "tool_rules",
]
