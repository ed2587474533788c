"""Driving a replay: read the recorded session, rebuild its requests from the journal, make a
scratch copy of the workspace (put back to the session's starting state from its checkpoints
when it can be), build the agent with `open_agent` and the replay provider, send the recorded
prompts, and compare. The original workspace and the original session are only read.

A recorded request is rebuilt from the journal: its messages are the conversation as folded up
to the assistant record that answered it; its system prompt and tools are known by the hashes of
the session's fingerprint. When a hash differs, the full recorded texts are rebuilt from the
project at a git ref (`against`, HEAD by default): the rebuild counts only when its hashes are
the recorded ones, and then the report names the section or tool that changed, with its diff."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections import defaultdict, deque
from collections.abc import Iterator
from dataclasses import field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from keel.agent.events import MODEL_ENDED
from keel.errors import UserError
from keel.frozen import mutable
from keel.llm.messages import without_context
from keel.replay.provider import Divergence, Expected, Paths, Recorded, ReplayProvider
from keel.session.records import (
    AssistantRecord,
    CompactionRecord,
    Fingerprint,
    Meta,
    Record,
    ToolResultRecord,
    UserRecord,
)

ToolsMode = Literal["auto", "run", "recorded"]
#: The replay's permission mode: the scratch copy is thrown away, so edits in it need no
#: question; bash runs as the settings and the sandbox allow (confined to the copy).
DEFAULT_MODE = "accept-edits"
NOTE_OPEN = "<system-note>\n"
NOTE_CLOSE = "\n</system-note>\n\n"


@mutable
class ReplayReport:
    session: str
    path: str
    identical: bool
    requests_recorded: int
    requests_replayed: int
    tools: Literal["run-tools", "recorded-results"]
    tools_why: str = ""
    divergence: Divergence | None = None
    until: int | None = None
    #: Fingerprint fields (other than the hashes) that differ: "max_turns: 10 -> 2".
    settings: list[str] = field(default_factory=list)
    journal_hash: str = ""
    replay_journal_hash: str = ""
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "session": self.session,
            "path": self.path,
            "result": "identical" if self.identical else "diverged",
            "requests_recorded": self.requests_recorded,
            "requests_replayed": self.requests_replayed,
            "until": self.until,
            "tools": self.tools,
            "tools_why": self.tools_why,
            "settings": self.settings,
            "journal_hash": self.journal_hash,
            "replay_journal_hash": self.replay_journal_hash,
            "divergence": self.divergence.to_json() if self.divergence else None,
            "notes": self.notes,
        }


# -- reading the recorded session ---------------------------------------------------------------


def read_session(path: Path) -> list[Record]:
    from keel.session.journal import read_records

    records = read_records(path).records
    if not records or not isinstance(records[0].payload, Meta):
        raise UserError(f"{path}: not a session file (no meta record first)")
    if any(isinstance(r.payload, CompactionRecord) for r in records):
        raise UserError(
            f"{path}: the session was compacted; replay does not re-drive compactions yet",
            hint="replay a session (or a fork, keel fork ID --at SEQ) from before the compaction",
        )
    return records


def expected_requests(records: list[Record]) -> list[Expected]:
    """Each assistant record with the request that got it: the conversation folded up to it."""
    from keel.replay.diff import canonical_message
    from keel.session.fold import fold

    out = []
    for i, record in enumerate(records):
        p = record.payload
        if isinstance(p, AssistantRecord):
            messages = fold(records[:i]).messages
            out.append(
                Expected(
                    tuple(canonical_message(m) for m in messages), p.message, p.usage, p.stop_reason
                )
            )
    return out


def prompts(records: list[Record]) -> list[str]:
    """The prompts as typed: each `prompt` user record, without the notes the loop put first
    (the replayed loop adds its own)."""
    out = []
    for record in records:
        p = record.payload
        if isinstance(p, UserRecord) and p.source == "prompt":
            text = without_context(p.message.text)
            if text.startswith(NOTE_OPEN) and NOTE_CLOSE in text:
                text = text.split(NOTE_CLOSE, 1)[1]
            out.append(text)
    return out


def normalised_journal(records: list[Record], paths: Paths | None = None) -> str:
    """sha256 of the normalised journal (`normalised_lines`)."""
    return hashlib.sha256("\n".join(normalised_lines(records, paths)).encode()).hexdigest()


def normalised_lines(records: list[Record], paths: Paths | None = None) -> list[str]:
    """The journal, one JSON line a record, the journal with what differs by nature left out: timestamps, sequence
    numbers, the session id,
    timing, tool durations, process ids, the keel version, the system prompt's hashes (they hold
    the directory and the date; compared per request instead) and the scratch directory."""
    from keel.session.records import encode

    lines = []
    for record in records:
        d = json.loads(encode(record))
        d.pop("ts", None)
        d.pop("seq", None)  # a left-out process record shifts the numbers
        kind = d.get("type")
        if kind == "meta":
            for key in ("id", "cwd", "keel_version", "parent", "parent_seq"):
                d.pop(key, None)
            if isinstance(d.get("fingerprint"), dict):
                d["fingerprint"].pop("system_hash", None)
                d["fingerprint"].pop("system_parts", None)
        elif kind == "assistant":
            d.pop("timing", None)
        elif kind == "tool_result":
            d.pop("seconds", None)
            d.pop("started_at", None)
        elif kind == "decision":
            d.pop("waited_ms", None)
        elif kind in ("process", "claim"):
            continue
        text = json.dumps(d, sort_keys=True, ensure_ascii=False)
        lines.append(paths.to_recorded(text) if paths else text)
    return lines


def settings_diff(recorded: Fingerprint, now: Fingerprint) -> list[str]:
    out = []
    a, b = recorded.to_json(), now.to_json()
    for key in a:
        if key in ("system_hash", "tools_hash", "system_parts", "tool_hashes"):
            continue  # compared per request, where a difference is shown with its diff
        if key in ("thinking",) and not a[key]:
            continue  # not recorded by older files
        if a[key] != b[key]:
            out.append(f"{key}: {a[key]!r} -> {b[key]!r}")
    return out


# -- the scratch workspace ----------------------------------------------------------------------


def _git(cwd: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, check=False, timeout=60)


def workspace_root(cwd: Path) -> Path:
    from keel.agent.prompt import git_root

    return git_root(cwd) or cwd


def copy_workspace(root: Path, dest: Path) -> None:
    shutil.copytree(root, dest, symlinks=True)


def _oldest_saved(checkpoints: Path) -> tuple[dict[str, Any], list[str]]:
    """Per path, what the session's first write to it replaced (the oldest unit's copy), and
    the reasons a start state cannot be rebuilt."""
    from keel.checkpoints.snapshot import Saved

    units = []
    problems: list[str] = []
    if not checkpoints.is_dir():
        return {}, problems
    for unit in checkpoints.iterdir():
        manifest = unit / "manifest.jsonl"
        if not manifest.is_file():
            continue
        started, saved = 0.0, []
        for line in manifest.read_bytes().splitlines():
            try:
                d = json.loads(line)
            except ValueError:
                continue
            if not isinstance(d, dict):
                continue
            if d.get("op") == "unit":
                started = float(d.get("time", 0))
            elif d.get("op") in ("file", "absent", "symlink", "newdir", "uncaptured"):
                saved.append(Saved.from_json(d))
        units.append((started, unit, saved))
    first: dict[str, Any] = {}
    for _, unit, saved in sorted(units, key=lambda u: u[0]):
        for s in saved:
            if s.path not in first:
                first[s.path] = (unit, s)
                if s.kind == "uncaptured":
                    problems.append(f"{s.path}: its earlier content was not kept ({s.why})")
    return first, problems


def rebuild_start(checkpoints: Path, paths: Paths) -> tuple[int, list[str]]:
    """Put the scratch copy back to the session's starting state: each file the session
    changed gets what its first change replaced. Returns (files put back, problems)."""
    first, problems = _oldest_saved(checkpoints)
    if problems:
        return 0, problems
    count = 0
    for original, (unit, saved) in first.items():
        target = Path(paths.to_scratch(original))
        if not str(target).startswith(paths.scratch + os.sep):
            problems.append(f"{original}: outside the workspace")
            continue
        with contextlib.suppress(FileNotFoundError):
            if saved.kind in ("absent", "newdir"):
                if target.is_dir() and not target.is_symlink():
                    shutil.rmtree(target) if saved.kind == "newdir" else target.rmdir()
                else:
                    target.unlink()
        if saved.kind == "file":
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.is_symlink() or target.exists():
                target.unlink()
            shutil.copyfile(unit / saved.blob, target)
            os.chmod(target, saved.mode & 0o7777 or 0o644)
        elif saved.kind == "symlink":
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.is_symlink() or target.exists():
                target.unlink()
            target.symlink_to(saved.target)
        count += 1
    return count, problems


# -- recorded results -------------------------------------------------------------------------


class RecordedTool:
    """Stands in for a tool: returns the recorded result of the next call with the same
    arguments instead of running."""

    def __init__(self, tool: Any, results: dict[str, deque[Any]], paths: Paths) -> None:
        self.name: str = tool.name
        self.description: str = tool.description
        self.input_schema: dict[str, Any] = tool.input_schema
        self.read_only: bool = tool.read_only
        for attr in ("kind", "repeat_safe", "destructive", "idempotent", "confirm"):
            if hasattr(tool, attr):
                setattr(self, attr, getattr(tool, attr))
        self._results = results
        self._paths = paths

    async def run(self, ctx: Any, args: dict[str, Any]) -> Any:
        from keel.tools.base import ToolOutput

        key = self._paths.to_recorded(_call_key(self.name, args))
        queue = self._results.get(key)
        if not queue:
            return ToolOutput(
                "replay: the recorded session has no result for this call",
                is_error=True,
            )
        result = queue.popleft()
        return ToolOutput(tuple(result.content), is_error=result.is_error)


def _call_key(name: str, args: Any) -> str:
    return json.dumps([name, args], sort_keys=True, ensure_ascii=False)


def recorded_results(records: list[Record]) -> dict[str, deque[Any]]:
    calls: dict[str, str] = {}
    out: dict[str, deque[Any]] = defaultdict(deque)
    for record in records:
        p = record.payload
        if isinstance(p, AssistantRecord):
            for call in p.message.tool_uses:
                calls[call.id] = _call_key(call.name, call.input)
        elif isinstance(p, ToolResultRecord) and p.result.tool_use_id in calls:
            out[calls[p.result.tool_use_id]].append(p.result)
    return out


# -- the replay ---------------------------------------------------------------------------------


def _dates(created: str) -> tuple[tuple[str, str], ...]:
    from datetime import date

    today = date.today().isoformat()
    try:
        when = datetime.fromisoformat(created.replace("Z", "+00:00"))
    except ValueError:
        return ()
    days = {when.date().isoformat(), when.astimezone().date().isoformat()}
    return tuple((today, d) for d in sorted(days) if d != today)


@contextlib.contextmanager
def scratch_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="keel-replay-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _extract(root: Path, ref: str, tree: Path) -> str:
    """The project's tree at `ref` in `tree`, a git repository of its own (the system prompt
    names the git root); "" when done, else why not."""
    archive = _git(root, "archive", "--format=tar", ref)
    if archive.returncode != 0:
        why = archive.stderr.decode(errors="replace").strip()
        return f"git ref {ref!r} cannot be read: {why}"
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True, timeout=60)
    _git(tree, "init", "-q")
    return ""


async def _context_at(
    ref: str, root: Path, cwd: Path, model: str, scratch: Path, dates: tuple[tuple[str, str], ...]
) -> tuple[str, tuple[Any, ...]] | str:
    """The system prompt and tools keel builds for the project at git `ref` (paths and date as
    recorded), or why it cannot."""
    from keel.app.assembly import open_agent
    from keel.app.options import Options

    if not (root / ".git").exists():
        return "the project is not a git repository to rebuild the recorded one from"
    if shutil.which("git") is None:
        return "git is not installed"
    tree = scratch / "against"
    tree.mkdir()
    why = await asyncio.to_thread(_extract, root, ref, tree)
    if why:
        return why
    paths = Paths(str(root), str(tree), dates)
    target = tree / cwd.relative_to(root)
    stub = ReplayProvider(model.split("/")[0], (), Recorded("", ""), paths)
    agent = await open_agent(Options(cwd=target, model=model, no_session=True), provider=stub)
    try:
        system = paths.system_candidates(agent.system)
        tools = agent.tool_specs
    finally:
        await agent.aclose()
    return system[-1], tools


@mutable
class _Plan:
    """What the replay runs with: the scratch copy, the path mapping, and how tools answer."""

    root: Path
    cwd: Path
    scratch_cwd: Path
    paths: Paths
    tools: Literal["run-tools", "recorded-results"]
    why: str
    notes: list[str]

    def paths_scratch_root(self) -> Path:
        return Path(self.paths.scratch)


def _plan(
    path: Path, created: str, meta: Meta, expected: list[Expected], tools: ToolsMode, scratch: Path
) -> _Plan:
    """Copy the workspace into `scratch`, put it back to the session's starting state from the
    checkpoints, and choose how tools answer (`auto`: run them when the start was rebuilt)."""
    cwd = Path(meta.cwd)
    if not cwd.is_dir():
        raise UserError(
            f"the session's directory {cwd} is gone", hint="replay it where it was recorded"
        )
    root = workspace_root(cwd)
    ws = scratch / "workspace"
    copy_workspace(root, ws)
    paths = Paths(str(root), str(ws), _dates(created))
    put_back, problems = rebuild_start(path.with_name(path.stem + ".checkpoints"), paths)
    used_bash = any(c.name == "bash" for e in expected for c in e.reply.tool_uses)
    if used_bash and not (root / ".git").exists():
        problems.append("bash changes are not checkpointed outside a git repository")
    notes: list[str] = []
    if tools == "recorded":
        chosen, why = "recorded-results", "asked for (--recorded-results)"
    elif tools == "run":
        chosen, why = "run-tools", "asked for (--run-tools)"
        if problems:
            notes.append("the starting state may be incomplete: " + "; ".join(problems))
    elif problems:
        chosen = "recorded-results"
        why = "the starting state cannot be rebuilt (" + "; ".join(problems) + ")"
    else:
        chosen = "run-tools"
        why = f"starting state rebuilt from the checkpoints ({put_back} file(s) put back)"
    scratch_cwd = ws / cwd.relative_to(root)
    return _Plan(root, cwd, scratch_cwd, paths, chosen, why, notes)  # type: ignore[arg-type]


async def _explain_hashes(
    agent: Any, fp: Fingerprint, recorded: Recorded, plan: _Plan, meta: Meta, against: str | None,
    scratch: Path,
) -> None:  # fmt: skip
    """Before the first request: when the system prompt or tools hash differs from the recorded
    one, rebuild the recorded texts from the project at a git ref, so the report can say which
    section or tool changed."""
    from keel.replay.diff import system_hash, tools_hash

    now = plan.paths.system_candidates(agent.system)
    if any(system_hash(s) == fp.system_hash for s in now) and (
        tools_hash(agent.tool_specs) == fp.tools_hash
    ):
        return
    ref = against or "HEAD"
    built = await _context_at(ref, plan.root, plan.cwd, meta.model, scratch, plan.paths.dates)
    if isinstance(built, str):
        recorded.unknown_why = f"the recorded text could not be rebuilt: {built}"
        return
    system, specs = built
    if system_hash(system) == fp.system_hash:
        recorded.system = system
    if tools_hash(specs) == fp.tools_hash:
        recorded.tools = specs
    recorded.unknown_why = (
        f"the recorded text could not be rebuilt: the project at {ref} builds another one too "
        "(the change is outside the project: your user instructions or settings, or keel "
        "itself; or give --against REF, the commit the session ran at)"
    )


async def replay(
    path: Path,
    *,
    until: int | None = None,
    tools: ToolsMode = "auto",
    against: str | None = None,
    mode: str | None = None,
    keep: Path | None = None,
) -> ReplayReport:
    """Replay the session in `path` (see the module docstring); the report says whether every
    request matched and the journals agree, or where it diverged."""
    mode = mode or DEFAULT_MODE
    if mode == "bypass" and tools != "recorded":
        raise UserError(
            "--mode bypass would run every recorded call again without asking (a push, a "
            "deploy, a web request)",
            hint="replay with --recorded-results, or in a mode that checks (accept-edits, the "
            "default)",
        )
    records = read_session(path)
    meta = records[0].payload
    assert isinstance(meta, Meta)
    if meta.fingerprint is None:
        raise UserError(f"{path}: the session has no fingerprint to compare requests with")
    expected = expected_requests(records)
    with scratch_dir() as scratch:
        plan = _plan(path, records[0].ts, meta, expected, tools, scratch)
        recorded = Recorded(
            meta.fingerprint.system_hash,
            meta.fingerprint.tools_hash,
            unknown_why="the recorded text is not in the journal",
        )
        provider = ReplayProvider(
            meta.fingerprint.provider or "replay", expected, recorded, plan.paths, until
        )
        replayed, now_fp = await _drive(records, meta, plan, provider, mode, against, scratch)
        if keep is not None:
            shutil.copytree(scratch, keep, symlinks=True, dirs_exist_ok=True)
    return _report(path, records, replayed, meta.fingerprint, now_fp, plan, provider, until)


async def _drive(
    records: list[Record], meta: Meta, plan: _Plan, provider: ReplayProvider, mode: str,
    against: str | None, scratch: Path,
) -> tuple[list[Record], Fingerprint]:  # fmt: skip
    """Build the agent in the scratch copy and send the recorded prompts; the replay's records
    and its fingerprint."""
    from keel.app.assembly import open_agent, read_settings
    from keel.app.options import Options, first
    from keel.session.store import SessionLog

    fp = meta.fingerprint
    assert fp is not None
    settings = read_settings(plan.scratch_cwd, lambda _event: None)
    # A limit the settings do not set is the session's own: keel's default for it (a token
    # budget for `keel -p`, none interactively, another in another keel) is not a change.
    options = Options(
        cwd=plan.scratch_cwd,
        model=meta.model,
        mode=mode,
        no_session=True,
        max_turns=first(settings.max_turns, fp.max_turns or None),
        max_tokens_budget=first(settings.budget_tokens, fp.max_tokens, 0),
        max_budget_usd=first(settings.budget_usd, fp.max_usd),
    )
    agent = await open_agent(options, provider=provider, session=False, settings=settings)
    try:
        if plan.tools == "recorded-results":
            results = recorded_results(records)
            for tool in list(agent.registry):
                agent.registry.remove(tool.name)
                agent.registry.add(RecordedTool(tool, results, plan.paths))
        await _explain_hashes(agent, fp, provider.recorded, plan, meta, against, scratch)
        agent.session = SessionLog.create(
            cwd=plan.scratch_cwd,
            model=meta.model,
            fingerprint=agent.fingerprint(),
            directory=scratch / "journal",
            session_id=meta.id,
        )
        now_fp = agent.fingerprint()
        for prompt in prompts(records):
            await agent.run(prompt)
            if provider.divergence is not None or provider.reached_until:
                break
        replay_path = agent.session.path
    finally:
        await agent.aclose()
    return (read_session(replay_path) if replay_path.exists() else []), now_fp


def _report(
    path: Path, records: list[Record], replayed: list[Record], fp: Fingerprint,
    now_fp: Fingerprint, plan: _Plan, provider: ReplayProvider, until: int | None,
) -> ReplayReport:  # fmt: skip
    meta = records[0].payload
    assert isinstance(meta, Meta)
    settings = settings_diff(fp, now_fp)
    divergence = provider.divergence
    stopped_early = provider.reached_until
    expected = len(provider.expected)
    if divergence is None and not stopped_early and provider.served < expected:
        divergence = Divergence(
            provider.served + 1,
            "missing_request",
            f"the replay stopped after {provider.served} request(s); the recorded session "
            f"made {expected}" + (f" (settings now: {', '.join(settings)})" if settings else ""),
            tuple(settings),
        )
    original_hash = normalised_journal(records)
    replay_hash = normalised_journal(replayed, plan.paths) if replayed else ""
    notes = list(plan.notes)
    if divergence is None and not stopped_early and original_hash != replay_hash:
        was, now = normalised_lines(records), normalised_lines(replayed, plan.paths)
        first = next(
            (i for i in range(max(len(was), len(now))) if was[i : i + 1] != now[i : i + 1]), 0
        )
        notes.append(
            f"every request matched, but the journals differ from record {first + 1}: "
            f"recorded {(was[first : first + 1] or ['nothing'])[0][:300]}, "
            f"now {(now[first : first + 1] or ['nothing'])[0][:300]}"
        )
    return ReplayReport(
        session=meta.id,
        path=str(path),
        identical=divergence is None and (stopped_early or original_hash == replay_hash),
        requests_recorded=expected,
        requests_replayed=provider.served,
        tools=plan.tools,
        tools_why=plan.why,
        divergence=divergence,
        until=until,
        settings=settings,
        journal_hash=original_hash,
        replay_journal_hash=replay_hash,
        notes=notes,
    )


# -- live: the recorded prompts against another model ---------------------------------------------


@mutable
class SessionStats:
    model: str
    turns: int
    input: int
    output: int
    cache_read: int
    cache_write: int
    cost: float
    seconds: float
    stop: str
    files_changed: list[str]

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "turns": self.turns,
            "tokens": {
                "input": self.input,
                "output": self.output,
                "cache_read": self.cache_read,
                "cache_write": self.cache_write,
            },
            "cost_usd": round(self.cost, 6),
            "seconds": round(self.seconds, 3),
            "stop": self.stop,
            "files_changed": self.files_changed,
        }


@mutable
class LiveReport:
    session: str
    recorded: SessionStats
    live: SessionStats
    #: Unified diff from the recorded session's final workspace (the project as it is now) to
    #: the live run's, over the files either changed.
    final_diff: str
    tools_why: str
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "session": self.session,
            "recorded": self.recorded.to_json(),
            "live": self.live.to_json(),
            "same_final_workspace": not self.final_diff,
            "final_diff": self.final_diff,
            "start": self.tools_why,
            "notes": self.notes,
        }


def _tree(root: Path) -> dict[str, bytes]:
    """Every regular file under `root` (`.git` left out), by relative path."""
    out: dict[str, bytes] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != ".git"]
        for name in filenames:
            path = Path(dirpath) / name
            if path.is_file() and not path.is_symlink():
                out[str(path.relative_to(root))] = path.read_bytes()
    return out


def _changed(start: dict[str, bytes], end: dict[str, bytes]) -> list[str]:
    return sorted(p for p in start.keys() | end.keys() if start.get(p) != end.get(p))


def _file_diff(path: str, old: bytes | None, new: bytes | None) -> str:
    from keel.replay.diff import unified

    def lines(data: bytes | None) -> list[str]:
        return [] if data is None else data.decode(errors="replace").splitlines()

    return unified(lines(old), lines(new), f"recorded/{path}", f"live/{path}")


def stats(records: list[Record], model: str, changed: list[str]) -> SessionStats:
    from keel.llm.messages import Usage
    from keel.session.records import TerminalRecord

    usage, cost, turns, stop = Usage(), 0.0, 0, ""
    for record in records:
        p = record.payload
        if isinstance(p, AssistantRecord):
            usage, cost, turns = usage + p.usage, cost + p.cost, turns + 1
        elif isinstance(p, TerminalRecord):
            stop = p.reason

    def when(ts: str) -> float:
        return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()

    seconds = when(records[-1].ts) - when(records[0].ts) if records else 0.0
    return SessionStats(
        model,
        turns,
        usage.input,
        usage.output,
        usage.cache_read,
        usage.cache_write,
        cost,
        max(seconds, 0.0),
        stop,
        changed,
    )


async def live(
    path: Path, model: str, *, mode: str | None = None, keep: Path | None = None
) -> LiveReport:
    """Send the recorded session's prompts (not its replies) to `model`, in a scratch copy put
    back to the session's start, and report both sessions side by side."""
    from keel.app.assembly import open_agent
    from keel.app.options import Options
    from keel.session.store import SessionLog

    mode = mode or DEFAULT_MODE
    if mode == "bypass":
        raise UserError(
            "--live runs a real model's tool calls: --mode bypass would run them without asking",
            hint="use accept-edits (the default) or default",
        )
    records = read_session(path)
    meta = records[0].payload
    assert isinstance(meta, Meta)
    expected = expected_requests(records)
    with scratch_dir() as scratch:
        plan = _plan(path, records[0].ts, meta, expected, "auto", scratch)
        notes = list(plan.notes)
        if plan.tools != "run-tools":
            notes.append(f"the live run starts from the project as it is now: {plan.why}")
        start = _tree(plan.paths_scratch_root())
        options = Options(cwd=plan.scratch_cwd, model=model, mode=mode, no_session=True)
        agent = await open_agent(options)
        try:
            agent.session = SessionLog.create(
                cwd=plan.scratch_cwd,
                model=model,
                fingerprint=agent.fingerprint(),
                directory=scratch / "journal",
            )
            for prompt in prompts(records):
                result = await agent.run(prompt)
                if result.stop_reason not in MODEL_ENDED:
                    notes.append(f"the live run stopped: {result.stop_reason} {result.error or ''}")
                    break
            live_path = agent.session.path
        finally:
            await agent.aclose()
        live_end = _tree(plan.paths_scratch_root())
        recorded_end = _tree(plan.root)
        live_records = read_session(live_path)
        if keep is not None:
            shutil.copytree(scratch, keep, symlinks=True, dirs_exist_ok=True)
    recorded_changed = _changed(start, recorded_end)
    live_changed = _changed(start, live_end)
    diffs = [
        _file_diff(p, recorded_end.get(p), live_end.get(p))
        for p in sorted(set(recorded_changed) | set(live_changed))
        if recorded_end.get(p) != live_end.get(p)
    ]
    return LiveReport(
        session=meta.id,
        recorded=stats(records, meta.model, recorded_changed),
        live=stats(live_records, model, live_changed),
        final_diff="\n".join(diffs),
        tools_why=plan.why,
        notes=notes,
    )
