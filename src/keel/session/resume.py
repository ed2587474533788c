"""The resume gate: whether a session may continue under the current configuration.

A resumed run must replay faithfully, so the fingerprint stored in `meta` (provider, model,
hashes of the system prompt and the tool definitions, limits, thinking mode and effort) is compared
with the current one.
Any difference is refused with a per-field diff unless forced. A provider change is refused even
when forced where the stored blocks cannot be replayed to the new provider.

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


def fingerprint_diff(stored: Fingerprint, current: Fingerprint) -> list[str]:
    """One line per field that differs, in the order a user reads them."""
    out = []
    if stored.provider != current.provider:
        out.append(f"provider: {stored.provider} -> {current.provider}")
    if stored.model != current.model:
        out.append(f"model: {stored.model} -> {current.model}")
    if stored.system_hash != current.system_hash:
        out.append("system prompt: changed (instruction files, working directory or keel version)")
    if stored.tools_hash != current.tools_hash:
        out.append("tool definitions: changed")
    for name in ("max_turns", "max_tokens", "max_usd"):
        old, new = getattr(stored, name), getattr(current, name)
        if old != new:
            out.append(f"{name}: {old} -> {new}")
    if stored.thinking:  # recorded (files from before it was are not compared)
        if stored.thinking != current.thinking:
            out.append(f"thinking: {stored.thinking} -> {current.thinking}")
        if stored.effort != current.effort:
            out.append(f"effort: {stored.effort or 'none'} -> {current.effort or 'none'}")
    return out


def check_resume(state: SessionState, current: Fingerprint, *, force: bool) -> list[str]:
    """Raise `UserError` if the session may not resume under `current`; otherwise return the
    differences that `force` accepted (empty when none)."""
    stored = state.meta.fingerprint
    if stored is None:
        return []
    diff = fingerprint_diff(stored, current)
    if not diff:
        return []
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
        raise UserError(
            f"session {state.meta.id} was made with a different configuration: " + "; ".join(diff),
            hint="resume with the same model and settings, or pass --force to accept the change",
        )
    return diff


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
