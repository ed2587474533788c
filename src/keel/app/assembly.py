"""The agent every front end runs, put together from settings and options: the model and its
provider, the permission gate and sandbox, hooks, skills and commands, subagents, memory, MCP
servers, and the session (a new one, or one reopened from its journal with the resume checks).

What building has to say (settings warnings, servers that failed, hooks awaiting approval) goes
to `notice` as `Notice` events; nothing here prints.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Callable, Sequence
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING

from keel.agent.events import Event
from keel.agent.limits import DEFAULT_MAX_TURNS, Limits
from keel.agent.loop import Agent
from keel.app.options import Options, first, fresh_limits, min_output, token_budget
from keel.config.settings import EFFORTS, Settings, load_settings
from keel.errors import UserError
from keel.frozen import mutable
from keel.llm.catalog import ModelInfo, ModelRef, parse_model
from keel.llm.events import Notice
from keel.llm.provider import Provider, RetryPolicy, make_provider, model_info
from keel.permissions.gate import PermissionGate, PermissionHook, PermissionRequest

if TYPE_CHECKING:
    from keel.agent.auto_mode import AutoMode
    from keel.agent.output_styles import OutputStyle
    from keel.checkpoints.tree import TreeLimits
    from keel.hooks.runner import HookRunner
    from keel.permissions.sandbox import Sandbox
    from keel.session.backend import AppendLog
    from keel.session.fold import SessionState
    from keel.session.journal import Loaded
    from keel.session.records import Fingerprint, Record
    from keel.session.store import SessionLog
    from keel.tools.base import Tool

#: Where build notices go.
Notify = Callable[[Event], None]


def _drop(_event: Event) -> None:
    return None


def read_settings(cwd: Path, notice: Notify) -> Settings:
    """The settings for `cwd`; each problem with them is one warning (the entry skipped)."""
    settings = load_settings(cwd)
    for warning in settings.warnings:
        notice(Notice(warning, "warning"))
    return settings


async def open_agent(
    options: Options,
    notice: Notify = _drop,
    *,
    settings: Settings | None = None,
    ref: ModelRef | None = None,
    provider: Provider | None = None,
    session: bool = True,
    session_id: str | None = None,
    tools: Sequence[Tool] = (),
) -> Agent:
    """A ready agent for a new session: built, its MCP servers connected, its session file
    created (unless `options.no_session` or `session` is False: a front end that creates it at
    the first prompt). With `options.interactive` the gate's questions become events."""
    settings = settings if settings is not None else read_settings(options.cwd, notice)
    ref = ref or choose_model(options.model, settings)
    agent = build_agent(
        ref,
        cwd=options.cwd,
        limits=fresh_limits(options, settings),
        settings=settings,
        options=options,
        notice=notice,
        provider=provider,
        session_id=session_id,
    )
    try:
        await add_memory(agent, settings, notice)
        await connect_mcp(agent, settings, notice, interactive=options.interactive)
        await connect_remote(agent, settings, notice)
        agent.add_tools(tools)  # a library caller's own (a fleet worker's, say)
        if session and not options.no_session:
            from keel.app.stores import jetstream_url
            from keel.session.store import SessionLog

            if url := jetstream_url():
                agent.session = _jetstream_session(agent, url, options.cwd, str(ref))
            else:
                agent.session = SessionLog.create(
                    cwd=options.cwd,
                    model=str(ref),
                    fingerprint=agent.fingerprint(),
                    session_id=agent.session_id,
                )
        _trace_if_asked(agent, options, settings)
    except BaseException:
        await agent.aclose()
        raise
    return agent


def _jetstream_session(agent: Agent, url: str, cwd: Path, model: str) -> SessionLog:
    """A new session whose journal is in JetStream (`KEEL_STORE=nats://…`)."""
    from keel import __version__
    from keel.app.stores import StoreJournal, open_jetstream
    from keel.session.records import Meta
    from keel.session.store import SessionLog

    store = open_jetstream(url)
    try:
        meta = Meta(agent.session_id, str(cwd), model, agent.fingerprint(), None, None, __version__)
        journal = StoreJournal(store.create(meta), store)
    except BaseException:
        store.close()
        raise
    return SessionLog(journal, agent.session_id)


async def resume_from_store(
    session_id: str,
    options: Options,
    notice: Notify = _drop,
    *,
    provider_for: Callable[[ModelRef], Provider] | None = None,
) -> Opened:
    """`resume_agent` for a session in JetStream (`KEEL_STORE=nats://…`): this process claims
    it (a claim record first, so a writer still holding it is fenced), then continues it."""
    from keel.app.stores import StoreJournal, jetstream_url, open_jetstream

    store = open_jetstream(jetstream_url())
    try:
        journal, loaded = store.open(session_id, worker=f"keel pid {os.getpid()}")
    except BaseException:
        store.close()
        raise
    agent, state, journal2, ref = await continue_session(
        StoreJournal(journal, store),
        loaded,
        options,
        notice,
        where=f"session {session_id} in {store.name}",
        provider_for=provider_for,
    )
    for note in state.undo_notes:
        agent.add_note(note)
    return Opened(agent, state, journal2, ref)


@mutable
class Opened:
    """A session reopened from its journal: the agent that continues it, what the journal
    held, and the model it runs with."""

    agent: Agent
    state: SessionState
    journal: AppendLog
    ref: ModelRef
    #: The journal's records as opened (a front end replays them without reading the file again).
    records: Sequence[Record] = ()


async def resume_agent(
    path: Path,
    options: Options,
    notice: Notify = _drop,
    *,
    provider_for: Callable[[ModelRef], Provider] | None = None,
) -> Opened:
    """The session in `path`, locked (a second opener gets `SessionLocked`) and rebuilt, with an
    agent that continues it (`agent.resumable`: its last turn left work to finish). Notes of
    undos the model was not told of yet are queued."""
    from keel.session.journal import Journal

    opened, loaded = Journal.open(path)  # locks: one writer per session
    agent, state, journal, ref = await continue_session(
        opened, loaded, options, notice, where=str(path), provider_for=provider_for
    )
    for note in state.undo_notes:
        agent.add_note(note)
    return Opened(agent, state, journal, ref, loaded.records)


def _trace_if_asked(agent: Agent, options: Options, settings: Settings) -> None:
    """Attach a tracer when `--debug`, `KEEL_DEBUG=1` or the `debug` setting asks for one (the
    trace folder is made at the first record, beside the session file once there is one), or
    when an OpenTelemetry export is on (then, without debug, nothing is written to disk)."""
    import keel.trace as trace

    debug = trace.enabled(settings, os.environ, options.debug)
    export = None
    if settings.otel is not None or os.environ.get("KEEL_OTEL"):
        from keel.trace import otel

        export = otel.sink_from(settings, os.environ)
    if not debug and export is None:
        return
    tracer = trace.attach(agent, retention_days=settings.trace_retention_days)
    if export is not None:
        tracer.files = debug
        tracer.add_sink(export)
        if agent.session is not None:
            otel.observe_journal(agent.session.journal)


#: Models picked when none is configured, by which key is present.
DEFAULT_MODELS = (
    ("ANTHROPIC_API_KEY", "anthropic/claude-sonnet-4-5"),
    ("ANTHROPIC_AUTH_TOKEN", "anthropic/claude-sonnet-4-5"),
    ("OPENAI_API_KEY", "openai/gpt-5"),
    ("GEMINI_API_KEY", "gemini/gemini-3-flash-preview"),
    ("GOOGLE_API_KEY", "gemini/gemini-3-flash-preview"),
)


def choose_model(flag: str | None, settings: Settings) -> ModelRef:
    if flag:
        return parse_model(flag)
    if settings.model:
        return parse_model(settings.model)
    for var, model in DEFAULT_MODELS:
        if os.environ.get(var):
            return parse_model(model)
    raise UserError(
        "no model chosen and no API key found",
        hint="set ANTHROPIC_API_KEY, OPENAI_API_KEY or GEMINI_API_KEY, pass --model "
        "provider/model, "
        "or try keel offline with --model scripted:demo",
    )


def build_agent(
    ref: ModelRef,
    *,
    cwd: Path,
    limits: Limits,
    settings: Settings,
    options: Options,
    notice: Notify,
    today: date | None = None,
    session_id: str | None = None,
    provider: Provider | None = None,
) -> Agent:
    options.check()
    provider = provider or make_provider(
        ref,
        settings=settings,
        retry=RetryPolicy(attempts=options.max_retries + 1),
        # The interactive UI (no -p) has someone watching: a longer default call deadline.
        unattended=not options.interactive,
    )
    info = model_info(ref, settings.models)
    from keel.tools.builtin import builtin_tools

    gate, sandbox = build_gate(cwd, settings, options, notice)
    agent = Agent(
        provider=provider,
        model=ref.model,
        tools=builtin_tools(),
        cwd=cwd,
        limits=limits,
        info=info,
        effort=EFFORTS[options.effort] if options.effort else settings.effort,
        today=today,
        session_id=session_id,
        gate=gate,
    )
    agent.ctx.sandbox = sandbox  # the gate's (the Agent takes it from there too)
    # Commands not safe to repeat after a crash: the defaults and what settings add.
    agent.ctx.unsafe_to_repeat = (*agent.ctx.unsafe_to_repeat, *settings.unsafe_to_repeat)
    agent.ctx.checkpoint_limits = checkpoint_limits(settings)
    agent.ctx.extra_roots = gate.extra_roots
    agent.auto_compact = settings.auto_compact
    agent.compaction = settings.compaction
    agent.tool_profile = settings.tool_profile
    agent.tool_call_text = settings.tool_call_text
    from keel.tools.builtin.web_search import web_search_options

    agent.web_search, why_not = web_search_options(ref, info, settings, gate)
    if why_not:
        notice(Notice(why_not, "warning"))
    agent.hooks = build_hooks(cwd, gate, notice)
    if options.interactive:
        agent.ask_through_events()
    if agent.hooks is not None:
        agent.hooks.model = settings.hooks_model  # prompt hooks that name no model
    add_auto_mode(agent, settings, notice, unattended=not options.interactive)
    add_extensions(agent, notice)
    add_output_style(agent, settings, notice)
    add_subagents(agent, notice, settings, options)
    add_knowledge(agent, settings)
    add_lsp(agent, settings, notice)
    if not info.known and ref.provider != "scripted":
        from keel.llm.presets import PRESETS

        preset = PRESETS.get(ref.provider)
        if preset is not None and preset.local:  # its server says (`Agent._learn_model`)
            guess = (
                f"the server is asked for its window ({info.window // 1000}k if it does not say)"
            )
        else:
            guess = f"assuming a {info.window // 1000}k window and no prices"
        notice(Notice(f"{ref.model} is not in keel's catalog; {guess}", "info"))
    if limits.max_usd is not None and not info.priced and ref.provider != "scripted":
        notice(
            Notice(
                f"{ref.model} has no prices in the catalog; --max-budget-usd cannot "
                "be enforced (add prices under `models` in settings)",
                "warning",
            )
        )
    return agent


def add_auto_mode(agent: Agent, settings: Settings, notice: Notify, *, unattended: bool) -> None:
    """Auto mode's classifier as the user's settings say (`auto_mode`; a project's are ignored
    when loaded): its model (else the session's), policy, deadline and context. A model that
    cannot be used is said once; auto mode then asks the user (or refuses headless). The
    classifier itself is made at auto mode's first question (its modules are not imported
    before that)."""
    conf = settings.auto_mode
    model = agent.model
    provider: Provider | None = None
    info: ModelInfo | None = None
    broken = ""
    if conf.model:
        try:
            ref = parse_model(conf.model)
            provider = make_provider(ref, settings=settings, unattended=unattended)
        except UserError as exc:
            broken = f"the classifier model {conf.model} cannot be used: {exc}"
            notice(Notice(f"auto_mode.model: {broken}", "warning"))
        else:
            info = model_info(ref, settings.models)
            model = ref.model
            agent.on_close.append(provider.aclose)

    def build() -> AutoMode:
        from keel.agent.auto_mode import AutoMode
        from keel.permissions.auto import AutoClassifier

        classifier = AutoClassifier(
            model, timeout=conf.timeout, context_messages=conf.context_messages
        )
        if conf.prompt:
            classifier.policy = conf.prompt
        return AutoMode(classifier, provider, info, broken)

    agent.auto_mode_factory = build


def split_rules(values: list[str]) -> list[str]:
    """`--allowed-tools "bash(npm test*),edit"` → the rules, splitting on commas outside
    parentheses (a bash pattern may contain commas)."""
    out: list[str] = []
    for value in values:
        depth, current = 0, ""
        for ch in value:
            if ch == "," and depth == 0:
                out.append(current)
                current = ""
                continue
            depth += (ch == "(") - (ch == ")")
            current += ch
        out.append(current)
    return [r.strip() for r in out if r.strip()]


def checkpoint_limits(settings: Settings) -> TreeLimits | None:
    """The bounds of /undo's capture of bash changes outside git, from settings `checkpoints`
    (None: none set, the defaults apply)."""
    if not settings.checkpoints:
        return None
    from keel.checkpoints.tree import TreeLimits

    return dataclasses.replace(TreeLimits(), **settings.checkpoints)  # type: ignore[arg-type]


def build_gate(
    cwd: Path, settings: Settings, options: Options, notice: Notify
) -> tuple[PermissionGate, Sandbox | None]:
    """The permission gate for a run from the command line (headless: nobody to ask, what would
    ask is denied) and the bash sandbox, if it works here: `build_permissions` with the flags'
    mode and rules; what it has to say (the sandbox status) is printed at start."""
    from keel.permissions.rules import parse_rule
    from keel.permissions.setup import build_permissions

    flags = [
        parse_rule(t, "deny", "--disallowed-tools") for t in split_rules(options.disallowed_tools)
    ]
    flags += [parse_rule(t, "allow", "--allowed-tools") for t in split_rules(options.allowed_tools)]
    gate = build_permissions(cwd, settings, mode=options.mode, extra_rules=flags, notice=notice)
    return gate, gate.sandbox


def build_hooks(cwd: Path, gate: PermissionGate, notice: Notify) -> HookRunner | None:
    """The hooks that may run here: personal ones, the project's once approved (`keel trust
    approve hooks`), and until then the project's guards, sandboxed read-only and heard only
    when they block; says what it skipped and what awaits approval."""
    from keel.config.settings import user_config_dir
    from keel.config.trust import project_key
    from keel.hooks.config import approved_pins, load_hooks

    user_dir = user_config_dir()
    config = load_hooks(cwd, keel_user_dir=user_dir)
    for warning in config.warnings:
        if warning not in config.unreadable:  # the settings' own warnings said it
            notice(Notice(warning, "warning"))
    pins = approved_pins(user_dir, project_key(gate.root), "hooks")
    runnable = config.runnable(pins)
    guards = config.guards(pins)
    waiting = len(config.hooks) - len(runnable)
    if waiting:
        state = (
            f"not approved: {len(guards)} guard hook(s) among them run in a read-only sandbox "
            "and may only block, the rest will not run"
            if guards
            else "not approved and will not run"
        )
        notice(
            Notice(
                f"{waiting} project hook(s) are {state}; review them with `keel hooks list`, "
                "then `keel hooks approve`",
                "warning",
            )
        )
    runnable += guards
    if not runnable:
        return None
    # Only now: the runner and the guards' sandbox are start-up cost a run without hooks skips.
    from keel.hooks.runner import HookRunner
    from keel.permissions import guard_sandbox

    runner = HookRunner(
        runnable,
        cwd,
        gate.root,
        dict(os.environ),
        mode=lambda: gate.mode,
        guard_box=guard_sandbox.running,
    )
    if runner.has("Notification"):
        running: set[asyncio.Task[None]] = set()

        async def notify(message: str) -> None:
            fields = {"message": message, "notification_type": "permission_prompt"}
            result = await runner.run("Notification", fields, match="permission_prompt")
            for error in result.errors:
                notice(Notice(error, "warning"))

        def fire(message: str) -> None:  # fire and forget: the question does not wait
            task = asyncio.get_running_loop().create_task(notify(message))
            running.add(task)
            task.add_done_callback(running.discard)

        gate.notify = fire
    if runner.has("PermissionRequest"):
        gate.permission_hook = permission_hook(
            runner, cwd, notice, answered=lambda: gate.asker is not None
        )
    return runner


def permission_hook(
    runner: HookRunner, cwd: Path, notice: Notify, *, answered: Callable[[], bool]
) -> PermissionHook:
    """PermissionRequest hooks, asked whenever the user would be: their `decision.behavior`
    answers for the user. An allow that rewrites the input (`updatedInput`) is not applied:
    the question goes to the user (headless: refused), never the original call allowed. A
    hook that fails decides nothing: its warning says who answers instead (`answered`: whether
    someone can answer questions)."""
    from keel.hooks import claude
    from keel.permissions.gate import PermissionReply

    async def decide(request: PermissionRequest) -> PermissionReply | None:
        call = request.call
        fields = {
            "tool_name": claude.tool_name(call.name),
            "tool_input": claude.tool_input(call.name, call.input or {}, cwd),
            "permission_suggestions": [],
        }
        result = await runner.run("PermissionRequest", fields, match=call.name)
        for message in result.messages:
            notice(Notice(message, "info"))
        after = ""
        if result.request_decision is None:
            after = (
                " (it made no decision; the question goes to you)"
                if answered()
                else " (it made no decision; with nobody to answer the question, the call "
                "is refused)"
            )
        for error in result.errors:
            notice(Notice(error + after, "warning"))
        if result.request_decision == "deny":
            return PermissionReply(allow=False, reason=result.request_message)
        if result.request_decision == "allow" and result.request_updated_input is not None:
            notice(
                Notice(
                    "a PermissionRequest hook allowed with an updatedInput keel does not apply "
                    "there; asking instead",
                    "warning",
                )
            )
            return None
        if result.request_decision == "allow":
            return PermissionReply(allow=True)
        return None

    return decide


def add_extensions(agent: Agent, notice: Notify) -> None:
    """Skills (indexed in the context, loaded with the `skill` tool or `/name`) and custom
    slash commands, from the project's and the user's folders."""
    from keel.config.settings import user_config_dir
    from keel.plugins import load_plugins
    from keel.skills import load_extensions, skill_tool

    # Each plugin that waits for approval, is not installed, or brings what keel does not use
    # yet, named once (the loaders below read the plugins that run).
    plugins = load_plugins(agent.cwd, user_dir=user_config_dir(), home=Path.home())
    skills, commands = load_extensions(agent.cwd, user_dir=user_config_dir(), home=Path.home())
    for warning in [*plugins.notices(), *skills.warnings, *commands.warnings]:
        notice(Notice(warning, "warning"))
    from keel.agent.prompt import load_instructions  # imports of instruction files not followed

    loaded = load_instructions(agent.cwd, user_dir=user_config_dir(), refuse=agent.import_refusal)
    for warning in loaded.warnings:
        notice(Notice(warning, "warning"))
    agent.skills, agent.commands = skills, commands
    if skills.model_invocable():
        agent.add_tools([skill_tool(skills)])
        agent.extra_sections.append(skills.index_section())


def add_output_style(agent: Agent, settings: Settings, notice: Notify) -> None:
    """The `outputStyle` setting's style, for the system prompt of the agent's contexts; a name
    no style has is one warning (keel's own prompt is used)."""
    if not settings.output_style:
        return
    from keel.agent.output_styles import DEFAULT, find_style

    warnings: list[str] = []
    styles = available_styles(agent.cwd, warnings)
    for warning in warnings:
        notice(Notice(warning, "warning"))
    style = find_style(settings.output_style, styles)
    if style is None:
        known = ", ".join(s.name for s in styles)
        notice(
            Notice(
                f"{settings.output_style_file}: outputStyle {settings.output_style!r} is no "
                f"output style (known: {known}); keel's own prompt is used",
                "warning",
            )
        )
    elif style.name != DEFAULT:
        agent.output_style = style


def available_styles(cwd: Path, warnings: list[str]) -> list[OutputStyle]:
    """The output styles there are in `cwd`: built in, the plugins' that run, yours, the
    project's."""
    from keel.agent.output_styles import load_styles, style_dirs
    from keel.agent.prompt import project_chain
    from keel.config.settings import user_config_dir
    from keel.plugins.active import plugin_components

    home = Path.home()
    active = plugin_components(cwd, user_dir=user_config_dir(), home=home)
    plugins = [(p.name, p.root) for p in active]
    return load_styles(style_dirs(project_chain(cwd), home=home), warnings, plugins)


def add_subagents(agent: Agent, notice: Notify, settings: Settings, options: Options) -> None:
    """The `task` tool, with the built-in agent types and the definitions found here, and the
    caps on the subagents a prompt starts (`--max-subagents`, then `subagents` in settings)."""
    from keel.agent.subagents import enable_subagents, load_agent_types
    from keel.config.settings import user_config_dir

    types = load_agent_types(agent.cwd, user_dir=user_config_dir(), home=Path.home())
    for warning in types.warnings:
        notice(Notice(warning, "warning"))
    enable_subagents(
        agent,
        types,
        max_total=first(options.max_subagents, settings.subagents_max_total),
        max_concurrent=settings.subagents_max_concurrent,
    )


async def add_memory(
    agent: Agent,
    settings: Settings,
    notice: Notify,
    *,
    resumed: bool = False,
    lineage: Sequence[str] = (),
) -> None:
    """The `memory` tool and the notes' index in the context, unless `memory` is off
    (a resumed session keeps the index it started with, a fork the one of the sessions it was
    forked from, `lineage`; keel.memory)."""
    if not settings.memory.enabled:
        return
    from keel.memory import add_memory as wire_memory

    await wire_memory(agent, settings.memory, notice, resumed=resumed, lineage=lineage)


def add_knowledge(agent: Agent, settings: Settings) -> None:
    """`knowledge_search`, when the project has a knowledge index and `knowledge` is not off
    (keel.knowledge; nothing is opened until the model searches)."""
    from keel.knowledge import tool_for_project

    found = tool_for_project(agent.cwd, settings.knowledge)
    if found is not None:
        agent.add_tools([found])


def add_lsp(agent: Agent, settings: Settings, notice: Notify) -> None:
    """Language servers for diagnostics after edits, and the `diagnostics` tool, where one can
    run here (keel.lsp; docs/lsp.md): the servers of the settings (a project's once approved),
    of the plugins that run, and the built-in ones whose program is on PATH. Nothing starts
    until a matching file changes; the servers stop with the agent. `KEEL_LSP=0` in the
    environment turns them off for one run (a script, a test suite)."""
    if not settings.lsp_enabled or os.environ.get("KEEL_LSP") == "0":
        return
    from keel.lsp.servers import load_specs, plugin_servers

    warnings: list[str] = []
    plugins = plugin_servers(agent.cwd, agent.ctx.env or os.environ, warnings)
    specs = load_specs(
        [(str(path), servers) for path, servers in settings.lsp_servers],
        plugins=plugins,
        warnings=warnings,
    )
    for spec in specs:
        if spec.source != "built-in" and not spec.available():
            notice(
                Notice(
                    f"{spec.source}: lsp server {spec.name!r} not used: {spec.command} is not "
                    "installed here (not on PATH)",
                    "warning",
                )
            )
    for warning in warnings:
        notice(Notice(warning, "warning"))
    if not any(spec.available() for spec in specs):
        return  # (the client and the manager are not even imported)
    from keel.lsp.manager import LspManager

    manager = LspManager(
        specs,
        project_root=agent.ctx.root,
        cwd=agent.cwd,
        timeout=settings.lsp_timeout,
        warnings=settings.lsp_warnings,
    )
    from keel.lsp.tool import diagnostics

    agent.ctx.lsp = manager
    manager.content_denied = agent.ctx.content_denied
    agent.on_close.append(manager.aclose)
    agent.add_tools([diagnostics])


def keep_knowledge_as_it_was(agent: Agent, settings: Settings, stored: Fingerprint | None) -> None:
    """On resume, offer `knowledge_search` as the session did when that alone makes its tool
    set the session's again: an index built (or deleted) since it started does not make the
    resume refuse a changed configuration. Without an index the tool answers how to build one."""
    if stored is None or agent.fingerprint().tools_hash == stored.tools_hash:
        return
    from keel.knowledge import NAME, offered_anyway

    had = agent.registry.get(NAME)
    if had is not None:
        agent.registry.remove(NAME)
    else:
        agent.registry.add(offered_anyway(agent.cwd, settings.knowledge))
    agent.add_tools([])  # the tool definitions again, from the registry
    if agent.fingerprint().tools_hash != stored.tools_hash:  # not what differs: as it was
        if had is not None:
            agent.registry.add(had)
        else:
            agent.registry.remove(NAME)
        agent.add_tools([])


def keep_diagnostics_as_it_was(agent: Agent, stored: Fingerprint | None) -> None:
    """On resume, offer the `diagnostics` tool as the session did when that alone makes its
    tool set the session's again: a language server installed (or removed) since it started,
    or `KEEL_LSP=0` on one run, does not make the resume refuse a changed configuration.
    Without a server the tool answers that none runs here."""
    if stored is None or agent.fingerprint().tools_hash == stored.tools_hash:
        return
    from keel.lsp.tool import diagnostics

    had = agent.registry.get(diagnostics.name)
    if had is not None:
        agent.registry.remove(diagnostics.name)
    else:
        agent.registry.add(diagnostics)
    agent.add_tools([])  # the tool definitions again, from the registry
    if agent.fingerprint().tools_hash != stored.tools_hash:  # not what differs: as it was
        if had is not None:
            agent.registry.add(had)
        else:
            agent.registry.remove(diagnostics.name)
        agent.add_tools([])


#: How long a run waits for MCP servers to connect before its first prompt.
MCP_WAIT = 30.0


async def connect_mcp(
    agent: Agent, settings: Settings, notice: Notify, *, interactive: bool = False
) -> None:
    """Start the project's MCP servers (the shared ones only once approved), wait for them to
    connect, and offer their tools. The agent stops the servers when it closes. `interactive`:
    someone can sign in to a server that asks for OAuth (the URL is shown as a notice)."""
    root = agent.ctx.root
    home = Path.home()
    from keel.config.foreign import mcp_files

    foreign = mcp_files(root, home, agent.ctx.env)
    if (
        not settings.mcp_servers
        and not settings.enabled_plugins
        and not any(p.exists() for p in (root / ".mcp.json", home / ".claude.json", *foreign))
    ):
        return
    from keel.config.settings import user_config_dir
    from keel.config.trust import project_key
    from keel.hooks.config import approved_pins
    from keel.mcp.config import load_servers
    from keel.session.store import keel_home

    servers, warnings = load_servers(root, settings.mcp_servers, agent.ctx.env, home=home)
    for warning in warnings:
        notice(Notice(warning, "warning"))
    if not servers:
        return
    from keel.mcp.client import McpManager

    manager = McpManager(
        servers,
        root=root,
        env=agent.ctx.env,
        log_dir=keel_home() / "mcp-logs" / project_key(root),
        approved=approved_pins(user_config_dir(), project_key(root), "mcp"),
        auth_dir=keel_home() / "mcp-auth",
    )
    agent.on_close.append(manager.aclose)
    if interactive:
        from keel.app.mcp_wiring import sign_in_opener

        manager.open_url = sign_in_opener(notice)
    manager.start()
    await manager.wait_ready(MCP_WAIT)
    waiting = []
    for server in manager.status():
        if server.state == "failed":
            notice(Notice(f"MCP server {server.name} failed: {server.detail}", "warning"))
        elif server.state == "connecting":
            notice(
                Notice(
                    f"MCP server {server.name} did not connect within {MCP_WAIT:g} s; its tools "
                    "are not offered in this run",
                    "warning",
                )
            )
        elif server.state == "needs approval":
            waiting.append(server.name)
    if waiting:
        notice(
            Notice(
                f"project MCP server(s) {', '.join(waiting)} are not approved and were not "
                "started; review them with `keel mcp list`, then `keel mcp approve`",
                "warning",
            )
        )
    from keel.app.mcp_wiring import wire

    wire(agent, manager, sampling=settings.mcp_sampling)
    agent.add_tools(manager.tools())


async def connect_remote(agent: Agent, settings: Settings, notice: Notify) -> None:
    """Discover the peers of `remote_tools` and offer their tools (docs/remote-tools.md); a
    peer that cannot be reached is a `UserError`, or a warning for an `optional` one. nats-py
    is imported only when there are peers."""
    if not settings.remote_tools:
        return
    from keel.remote.client import import_remote_tools

    await import_remote_tools(agent, settings, notice)


async def open_session(
    path: Path,
    options: Options,
    notice: Notify,
    *,
    provider_for: Callable[[ModelRef], Provider] | None = None,
) -> tuple[Agent, SessionState, AppendLog, ModelRef]:
    """Lock the session in `path`, rebuild it, and build an agent that continues it (the resume
    gate checked). The caller closes the journal (the agent's `aclose` does)."""
    from keel.session.journal import Journal

    journal, loaded = Journal.open(path)  # locks: one writer per session
    return await continue_session(
        journal, loaded, options, notice, where=str(path), provider_for=provider_for
    )


async def continue_session(
    journal: AppendLog,
    loaded: Loaded,
    options: Options,
    notice: Notify,
    *,
    where: str,
    provider_for: Callable[[ModelRef], Provider] | None = None,
    cwd: Path | None = None,
    tools: Sequence[Tool] = (),
) -> tuple[Agent, SessionState, AppendLog, ModelRef]:
    """The rest of `open_session`, for a journal taken over from any store (a fleet worker's
    JetStream journal too). `cwd`: the session's workspace now, when it moved (a fleet run resumed
    on another worker): the system prompt names the working directory, so that one difference of
    the fingerprint is expected and accepted; any other is checked as usual. The journal is closed
    here when this fails."""
    from keel.session.fold import FoldError, fold
    from keel.session.fork import lineage
    from keel.session.resume import check_resume, left_running, limits_diff, reap
    from keel.session.store import SessionLog

    agent: Agent | None = None
    try:
        try:
            state = fold(loaded.records)
        except FoldError as exc:
            raise UserError(f"{where}: {exc}", hint="the session was left untouched") from exc
        meta = state.meta
        # Before anything runs, and before the agent is built: a command the dead run left
        # running still holds the sandbox's placeholders in the tree (an empty `.git`, say),
        # which would change what the system prompt says about the project.
        stopped = reap(left_running(journal.path, state.processes))
        moved = cwd is not None and str(cwd) != meta.cwd
        cwd = cwd or Path(meta.cwd)
        if not cwd.is_dir():
            raise UserError(f"session {meta.id} worked in {cwd}, which no longer exists")
        settings = read_settings(cwd, notice)
        ref = parse_model(options.model or meta.model)
        stored = meta.fingerprint
        # A fork goes on with the prompt its first ancestor started with: that day's date and,
        # below, that session's memory index.
        ancestors = lineage(journal.path, meta, state.created)
        started = ancestors[-1][1] or state.created
        limits = Limits(
            max_turns=first(
                options.max_turns, stored.max_turns if stored else None, DEFAULT_MAX_TURNS
            ),
            max_tokens=token_budget(
                options.max_tokens_budget, stored.max_tokens if stored else None
            ),
            max_usd=first(options.max_budget_usd, stored.max_usd if stored else None),
            **min_output(settings),
        )
        agent = build_agent(
            ref,
            cwd=cwd,
            limits=limits,
            settings=settings,
            options=options,
            notice=notice,
            today=date.fromisoformat(started[:10]) if started else None,
            session_id=meta.id,
            provider=provider_for(ref) if provider_for is not None else None,
        )
        await add_memory(
            agent, settings, notice, resumed=True, lineage=[i for i, _ in ancestors[1:]]
        )
        await connect_mcp(agent, settings, notice, interactive=options.interactive)
        await connect_remote(agent, settings, notice)
        agent.add_tools(tools)
        keep_knowledge_as_it_was(agent, settings, stored)
        keep_diagnostics_as_it_was(agent, stored)
        current = agent.fingerprint()
        if moved:
            # The context names the working directory: compare it as it reads with the old
            # one, so that a real change (an instruction file) is still caught.
            from keel.agent.prompt import part_hashes, short_hash

            as_before = agent.prompt_text.replace(str(cwd), meta.cwd)
            current = dataclasses.replace(
                current,
                system_hash=short_hash(agent.system.replace(str(cwd), meta.cwd)),
                system_parts=part_hashes(as_before),
            )
        given = limits_diff(stored, current) if stored else []
        for change in check_resume(state, current, force=options.force):
            if change in given:
                notice(Notice(f"resuming with {change} (as given)"))
            else:
                notice(Notice(f"resuming despite a changed configuration: {change}", "warning"))
        agent.restore(state)
        resolve_unknown(agent, state, options)
        agent.session = SessionLog(journal, meta.id)
        _trace_if_asked(agent, options, settings)
        # Every check passed: only now is anything written (the torn tail cut, kept beside).
        saved = journal.repair()
    except BaseException:
        journal.close()
        if agent is not None:
            await agent.aclose()
        raise
    if saved is not None:
        notice(
            Notice(
                f"cut {loaded.repaired_bytes} bytes of a torn last record (a crash mid-write); "
                f"they are kept in {saved}"
            )
        )
    for reaped in stopped:
        notice(
            Notice(
                f"stopped what the killed run left running for call {reaped.tool_use_id}: "
                f"process group {reaped.pgid} (pids {', '.join(map(str, reaped.pids))})",
                "warning",
            )
        )
    return agent, state, journal, ref


def resolve_unknown(agent: Agent, state: SessionState, options: Options) -> None:
    """Apply `keel resume --rerun/--skip CALL_ID` to the calls of unknown outcome."""
    unknown = [r.tool_use_id for r in state.unknown_outcome]
    for flag in ("rerun", "skip"):
        for call_id in getattr(options, flag):
            if call_id not in unknown:
                raise UserError(
                    f"--{flag} {call_id}: not a call of session {state.meta.id} whose outcome is "
                    f"unknown (those are: {', '.join(unknown) or 'none'})",
                    hint="the message of the run that stopped names the call ids",
                )
            agent.resolve_unknown(call_id, "rerun" if flag == "rerun" else "skip")
