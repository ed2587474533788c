"""The resume gate: whether a session may continue under the current configuration.

A resumed run must replay faithfully, so the fingerprint stored in `meta` (provider, model, a
hash of each part of the system prompt and of each tool definition, limits, thinking mode and
effort) is compared with the current one. A difference that decides whether the conversation can
go on is refused unless forced, naming exactly what changed (the instruction file, the working
directory, keel's base prompt and version, the tool); the memory index, the platform line and the
date are not compared (`NOT_COMPARED`), and limits given on resume are accepted. A provider change
is refused even when forced where the stored blocks cannot be replayed to the new provider.

Before a resumed run re-runs anything, `reap` kills the process groups the dead run left running
(recorded by `process` records, recognised by start time, never by name).
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import time
from pathlib import Path

from keel.errors import UserError
from keel.frozen import frozen
from keel.llm.messages import Thinking
from keel.session.fold import SessionState
from keel.session.records import Fingerprint, ProcessRecord

#: Parts of the system prompt that do not decide whether a conversation can go on, so a resume
#: does not compare them: the memory index (a snapshot of the notes when the session started: a
#: note saved since is in the conversation already, as the memory tool's call and result), the
#: platform line (a kernel update changes nothing the conversation relies on) and the date (the
#: day the session, or the one it was forked from, started).
NOT_COMPARED = frozenset({"<memory-index> section", "platform", "date"})
#: Changes to parts of the context that opens the conversation (keel.agent.prompt), which the
#: transcript keeps as it was sent.
CONTEXT_CHANGES = (
    "system prompt: instruction file ",
    "system prompt: <skills> section",
    "system prompt: working directory",
    "system prompt: git repository",
)
#: The limits: a resume keeps the session's own unless a flag gives others, and a flag given is
#: the user's choice (a higher budget after a `budget` stop), never a reason to refuse.
LIMITS = ("max_turns", "max_tokens", "max_usd")


class ConfigurationChanged(UserError):
    """The session was made under another configuration; `changes` names each difference."""

    def __init__(self, session_id: str, changes: list[str]) -> None:
        hint = "resume with the same model and settings, or pass --force to accept the change"
        if any(c.startswith(CONTEXT_CHANGES) for c in changes):
            # The context is in the transcript: --force goes on with the one the model was sent.
            hint += (
                " (the conversation keeps the instructions it was sent; changed ones reach the "
                "model at its next compaction or /clear)"
            )
        super().__init__(
            f"session {session_id} was made with a different configuration: " + "; ".join(changes),
            hint=hint,
        )
        self.session_id = session_id
        self.changes = changes


def fingerprint_diff(
    stored: Fingerprint, current: Fingerprint, *, keel_version: str = ""
) -> list[str]:
    """One line per difference, in the order a user reads them. `keel_version`: the version that
    made the session, named when keel's base prompt changed."""
    setup, reasoning = _config_diff(stored, current, keel_version)
    return setup + limits_diff(stored, current) + reasoning


def config_diff(stored: Fingerprint, current: Fingerprint, *, keel_version: str = "") -> list[str]:
    """The differences that make a resume refuse unless forced: provider, model, each part of the
    system prompt that changed (`NOT_COMPARED` left out), each tool definition, thinking and
    effort."""
    setup, reasoning = _config_diff(stored, current, keel_version)
    return setup + reasoning


def _config_diff(
    stored: Fingerprint, current: Fingerprint, keel_version: str
) -> tuple[list[str], list[str]]:
    setup = []
    if stored.provider != current.provider:
        setup.append(f"provider: {stored.provider} -> {current.provider}")
    if stored.model != current.model:
        setup.append(f"model: {stored.model} -> {current.model}")
    if stored.system_parts and current.system_parts:
        setup += _parts_diff(
            "system prompt", stored.system_parts, current.system_parts, keel_version
        )
    elif stored.system_hash != current.system_hash:
        # A file from before the parts were recorded: only the whole prompt's hash is known.
        setup.append("system prompt: changed (the session's file does not record which part)")
    if stored.tool_hashes and current.tool_hashes:
        setup += _parts_diff("tool", stored.tool_hashes, current.tool_hashes, "")
    elif stored.tools_hash != current.tools_hash:
        setup.append("tool definitions: changed")
    reasoning = []
    if stored.thinking:  # recorded (files from before it was are not compared)
        if stored.thinking != current.thinking:
            reasoning.append(f"thinking: {stored.thinking} -> {current.thinking}")
        if stored.effort != current.effort:
            reasoning.append(f"effort: {stored.effort or 'none'} -> {current.effort or 'none'}")
    return setup, reasoning


def limits_diff(stored: Fingerprint, current: Fingerprint) -> list[str]:
    """The limits that differ (`max_tokens: 10000000 -> 20000000`)."""
    out = []
    for name in LIMITS:
        old, new = getattr(stored, name), getattr(current, name)
        if old != new:
            out.append(f"{name}: {old} -> {new}")
    return out


def _parts_diff(
    what: str,
    stored: tuple[tuple[str, str], ...],
    current: tuple[tuple[str, str], ...],
    keel_version: str,
) -> list[str]:
    """`system prompt: instruction file /p/AGENTS.md changed`, `tool: task added`, …"""
    from keel import __version__

    before, after = dict(stored), dict(current)
    out = []
    for name in [*before, *(n for n in after if n not in before)]:
        if name in NOT_COMPARED or before.get(name) == after.get(name):
            continue
        how = "added" if name not in before else "removed" if name not in after else "changed"
        if name == "keel's base prompt" and keel_version and keel_version != __version__:
            how += f" (keel {keel_version} -> {__version__})"
        out.append(f"{what}: {name} {how}")
    return out


def check_resume(state: SessionState, current: Fingerprint, *, force: bool) -> list[str]:
    """Raise `ConfigurationChanged` if the session may not resume under `current` (a
    `UserError` when even `force` cannot help); otherwise return the differences accepted:
    the limits given, and with `force` the rest (empty when none)."""
    stored = state.meta.fingerprint
    if stored is None:
        return []
    config = config_diff(stored, current, keel_version=state.meta.keel_version)
    if not config:
        return limits_diff(stored, current)
    pending = state.pending
    if (
        stored.provider != current.provider
        and pending is not None
        and any(isinstance(b, Thinking) for b in pending.message.blocks)
    ):
        raise UserError(
            f"session {state.meta.id} stopped inside a tool round whose reasoning came from "
            f"{stored.provider}; {current.provider} cannot continue that round (the reasoning "
            "is bound to the provider that made it)",
            hint=f"resume with the original model ({state.meta.model}) to finish the round, "
            "then switch",
        )
    if not force:
        raise ConfigurationChanged(state.meta.id, config)
    return fingerprint_diff(stored, current, keel_version=state.meta.keel_version)


# -- what a dead run left running --------------------------------------------------------------

#: How long `reap` waits for a killed group to be gone before going on.
REAP_WAIT = 5.0


@frozen
class Reaped:
    """A process group of a dead run that was still running, and was killed."""

    tool_use_id: str
    pgid: int
    pids: tuple[int, ...]


def _stat(pid: int) -> tuple[str, int, int, int] | None:
    """(state, ppid, pgrp, starttime) of `pid` from /proc; None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    # `comm` (field 2) may hold spaces and parentheses: the fields after it start past the last
    # ')'. Then: state (3), ppid (4), pgrp (5), …, starttime (22).
    rest = data[data.rfind(b")") + 2 :].split()
    try:
        return rest[0].decode(), int(rest[1]), int(rest[2]), int(rest[19])
    except (IndexError, ValueError):
        return None


def start_time(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat: when the process started, in clock ticks since boot. With
    the pid it names one process for the life of the machine (a recycled pid starts later)."""
    stat = _stat(pid)
    return None if stat is None else stat[3]


@functools.cache
def boot_id() -> str:
    """This boot's id: start times count from the boot, so a record from an earlier boot names
    nothing alive."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        return ""


@frozen
class _Proc:
    pid: int
    ppid: int
    pgrp: int
    started: int


def _table() -> dict[int, _Proc]:
    """Every live process (zombies left out: they run nothing)."""
    table = {}
    for entry in os.scandir("/proc"):
        stat = _stat(int(entry.name)) if entry.name.isdigit() else None
        if stat is not None and stat[0] != "Z":
            table[int(entry.name)] = _Proc(int(entry.name), stat[1], stat[2], stat[3])
    return table


def _tree(table: dict[int, _Proc], pgid: int, leader_start: int) -> set[int]:
    """What a process record names that still runs: the members of its group and all their
    descendants (a supervisor's command may run in a group of its own). Nothing when the pid is
    alive with another start time (recycled). With the leader gone, members of its group that
    started no earlier than it did count (the kernel does not reuse a pid that still names a
    group)."""
    leader = table.get(pgid)
    if leader is not None and leader.started != leader_start:
        return set()
    found = {p.pid for p in table.values() if p.pgrp == pgid and p.started >= leader_start}
    children: dict[int, list[int]] = {}
    for p in table.values():
        children.setdefault(p.ppid, []).append(p.pid)
    todo = list(found)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found and table[child].started >= leader_start:
                found.add(child)
                todo.append(child)
    return found


def _signal(pids: set[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def reap(processes: list[ProcessRecord], *, wait: float = REAP_WAIT) -> list[Reaped]:
    """Kill every process a dead run's tool calls left running: for each recorded group still
    alive (recognised by its leader's start time and this boot's id, never by a name), the group
    and every descendant. Called on resume, holding the session's lock (so the run that started
    them is dead), before anything runs again. Everything is stopped first (SIGSTOP, so nothing
    forks away meanwhile), then killed (SIGKILL); returns once it is gone, or after `wait` s."""
    if not processes or not os.path.isdir("/proc"):
        return []
    boot = boot_id()
    wanted = {
        (p.pgid, p.start_time): p.tool_use_id
        for p in processes
        if not (p.boot_id and boot and p.boot_id != boot)
    }
    victims: dict[tuple[int, int], set[int]] = {}
    for _ in range(50):  # stop the trees, again until no new member appears
        table = _table()
        new = False
        for key in wanted:
            tree = _tree(table, *key)
            known = victims.setdefault(key, set())
            if tree - known:
                _signal(tree - known, signal.SIGSTOP)
                known |= tree
                new = True
        if not new:
            break
    every: set[int] = set().union(*victims.values())
    _signal(every, signal.SIGKILL)
    deadline = time.monotonic() + wait
    while every and time.monotonic() < deadline:
        table = _table()
        every = {pid for pid in every if pid in table}
        if every:
            time.sleep(0.02)
    return [
        Reaped(tool_use_id, key[0], tuple(sorted(victims[key])))
        for key, tool_use_id in wanted.items()
        if victims.get(key)
    ]


def left_running(path: Path, processes: list[ProcessRecord]) -> list[ProcessRecord]:
    """What a dead run may have left running: `processes` (the session's own, since its last
    terminal record) and those its subagents' sessions recorded since theirs (a subagent runs in
    the parent's process, so it died with it). A subagent's file that is locked (written by a
    live process) or unreadable is passed over."""
    from keel.session.fold import FoldError, fold
    from keel.session.index import child_sessions, is_locked
    from keel.session.journal import read_records

    out = list(processes)
    for child in child_sessions(path):
        if is_locked(child):
            continue
        with contextlib.suppress(UserError, FoldError, OSError):
            out += fold(read_records(child).records).processes
    return out
