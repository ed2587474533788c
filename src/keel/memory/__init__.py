"""Memory: notes the model keeps across sessions, per project and per user (docs/memory.md).

This package owns the note format and its checks (`note`), the store interface and the file
backend (`store`), the NATS JetStream KV backend (`nats_store`, imported only when chosen), the
`memory` tool and the system-prompt index (`tool`), and here: choosing a store from settings
and the environment (`open_store`) and giving an agent its memory (`add_memory`).

The index is read once per fresh context and fixed with the system prompt; a resumed session
keeps the index it started with (a snapshot by session id beside the notes; a fork, the one the
session it was forked from started with), so its prompt prefix does not change because a note was
saved since. The resume gate does not compare the index either (`keel.session.resume.
NOT_COMPARED`): a session whose snapshot is gone resumes with none.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from keel.memory.note import (
    MAX_BODY_BYTES,
    MAX_DESCRIPTION,
    MAX_NOTES,
    SCOPES,
    InvalidNote,
    LooksLikeSecret,
    MemoryError_,
    Note,
    Scope,
)
from keel.memory.store import (
    Entry,
    FileStore,
    MemoryStore,
    NoteExists,
    NoteNotFound,
    StaleNote,
    StoreUnavailable,
)

if TYPE_CHECKING:
    from keel.agent.events import Event
    from keel.agent.loop import Agent
    from keel.config.settings import MemorySettings

#: Sections that are the memory index start with this (subagents that get the tool keep it).
INDEX_TAG = "<memory-index>"


def memory_base(env: Mapping[str, str] | None = None) -> Path:
    from keel.session.store import keel_home

    return keel_home(env) / "memory"


def scope_key(root: Path, config: MemorySettings) -> str:
    """This project's scope key: the `project` setting, else a key of the git root's path
    (as sessions are kept)."""
    from keel.config.trust import project_key

    return config.project or project_key(root)


def open_store(
    config: MemorySettings, root: Path, env: Mapping[str, str] | None = None
) -> MemoryStore:
    """The store `config` and the environment choose: `KEEL_MEMORY_URL=nats://…` (or the
    setting's backend nats) for JetStream KV, else files under keel's data folder."""
    env = os.environ if env is None else env
    url = env.get("KEEL_MEMORY_URL") or (config.url if config.backend == "nats" else "")
    key = scope_key(root, config)
    if url:
        from keel.memory.nats_store import NatsStore

        user = env.get("KEEL_MEMORY_USER") or _login()
        return NatsStore(url, config.bucket, prefix=config.prefix, project_key=key, user_key=user)
    return FileStore(memory_base(env), key)


def _login() -> str:
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container)
        return f"uid-{os.getuid()}"


# -- the index snapshot of a session ---------------------------------------------------------------


def _snapshot(session_id: str, env: Mapping[str, str] | None = None) -> Path:
    return memory_base(env) / "_index" / f"{session_id}.md"


def save_snapshot(session_id: str, section: str, env: Mapping[str, str] | None = None) -> None:
    path = _snapshot(session_id, env)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(section)
    os.replace(tmp, path)


def load_snapshot(session_id: str, env: Mapping[str, str] | None = None) -> str:
    """The index a session started with ("" : none was kept, it had no notes)."""
    try:
        fd = os.open(_snapshot(session_id, env), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return ""
    with os.fdopen(fd, encoding="utf-8") as f:
        return f.read()


# -- an agent's memory -----------------------------------------------------------------------------


async def add_memory(
    agent: Agent,
    config: MemorySettings,
    notice: Callable[[Event], None],
    *,
    resumed: bool = False,
    lineage: Sequence[str] = (),
) -> MemoryStore | None:
    """Offer the `memory` tool and put the index into the system prompt (before its first
    use). A store that cannot be reached is one warning, and the run goes on without memory.
    `resumed`: the index the session started with, looked up by the session's id, then by the
    ids in `lineage` (the sessions it was forked from, nearest first)."""
    if not config.enabled:
        return None
    from keel.llm.events import Notice
    from keel.memory.tool import MemoryTool, index_section

    store = open_store(config, agent.ctx.root, agent.ctx.env)
    try:
        if resumed:
            section = ""
            for session_id in dict.fromkeys((agent.session_id, *lineage)):
                section = load_snapshot(session_id, agent.ctx.env)
                if section:
                    break
        else:
            project, user = await store.list("project"), await store.list("user")
            section = index_section(project, user)
            if section:
                save_snapshot(agent.session_id, section, agent.ctx.env)
    except (MemoryError_, OSError) as exc:
        await store.aclose()
        notice(Notice(f"memory is off for this session: {exc}", "warning"))
        return None
    for warning in store.warnings:
        notice(Notice(f"memory: {warning}", "warning"))
    store.warnings.clear()
    agent.on_close.append(store.aclose)
    agent.add_tools([MemoryTool(store).tool()])
    if section:
        agent.extra_sections.append(section)
    return store


__all__ = [
    "INDEX_TAG",
    "MAX_BODY_BYTES",
    "MAX_DESCRIPTION",
    "MAX_NOTES",
    "SCOPES",
    "Entry",
    "FileStore",
    "InvalidNote",
    "LooksLikeSecret",
    "MemoryError_",
    "MemoryStore",
    "Note",
    "NoteExists",
    "NoteNotFound",
    "Scope",
    "StaleNote",
    "StoreUnavailable",
    "add_memory",
    "memory_base",
    "open_store",
]
