"""How notes read for people (`keel memory`, `/memory`): the listing, one note, and the JSON
form. Front ends share these; nothing here does more than format."""

from __future__ import annotations

from keel.memory.note import MAX_NOTES, SCOPES, Scope
from keel.memory.store import Entry, MemoryStore


def entry_json(entry: Entry) -> dict[str, str]:
    n = entry.note
    return {
        "scope": entry.scope,
        "name": n.name,
        "type": n.type,
        "description": n.description,
        "created": n.created,
        "updated": n.updated,
        "revision": entry.revision,
        "body": n.body,
    }


def show_text(entry: Entry) -> str:
    n = entry.note
    return (
        f"{n.name} ({entry.scope} note, type {n.type}, updated {n.updated or 'unknown'})\n"
        f"{n.description}\n\n{n.body}"
    )


async def list_text(store: MemoryStore, scopes: tuple[Scope, ...] = SCOPES) -> str:
    lines = []
    for scope in SCOPES:
        if scope not in scopes:
            continue
        entries = await store.list(scope)
        lines.append(f"{scope} ({store.where(scope)}): {len(entries)} of {MAX_NOTES}")
        lines += [f"  {e.note.name} [{e.note.type}]: {e.note.description}" for e in entries]
    return "\n".join(lines)
