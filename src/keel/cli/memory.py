"""`keel memory list|show NAME|rm NAME [--scope project|user] [--json]`: the notes the model
keeps for this project and for the user, in the store the settings choose (keel.memory).

The user acts directly here: `rm` needs no earlier read (the model's tool does)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from keel.agent.prompt import git_root
from keel.config.settings import load_settings
from keel.errors import UserError
from keel.memory import SCOPES, MemoryError_, MemoryStore, StoreUnavailable, open_store
from keel.memory.text import entry_json, list_text, show_text


def parser() -> argparse.ArgumentParser:
    from keel.cli.main import _Parser

    p = _Parser(prog="keel memory", description="The model's memory notes (docs/memory.md).")
    sub = p.add_subparsers(dest="action", required=True)
    for name, help_text in (
        ("list", "the notes of both scopes (or of --scope)"),
        ("show", "one note"),
        ("rm", "delete one note"),
    ):
        s = sub.add_parser(name, help=help_text)
        if name != "list":
            s.add_argument("name")
        s.add_argument("--scope", choices=SCOPES, default=None if name == "list" else "project")
        s.add_argument("--json", action="store_true", help="JSON output")
    return p


async def _run(args: argparse.Namespace, store: MemoryStore) -> int:
    try:
        if args.action == "list":
            scopes = (args.scope,) if args.scope else SCOPES
            if args.json:
                entries = [e for s in scopes for e in await store.list(s)]
                print(json.dumps([entry_json(e) for e in entries], indent=2))
            else:
                print(await list_text(store, scopes))
        elif args.action == "show":
            entry = await store.read(args.scope, args.name)
            print(json.dumps(entry_json(entry), indent=2) if args.json else show_text(entry))
        else:
            await store.delete(args.scope, args.name, revision=None)
            print(f"deleted the {args.scope} note {args.name}")
        for warning in store.warnings:
            print(f"keel: warning: {warning}", file=sys.stderr)
    except StoreUnavailable as exc:
        hint = "check the server, or KEEL_MEMORY_URL and the `memory` setting"
        raise UserError(str(exc), hint=hint) from exc
    except MemoryError_ as exc:
        raise UserError(str(exc), hint="`keel memory list` shows the notes") from exc
    finally:
        await store.aclose()
    return 0


def memory(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    cwd = Path.cwd()
    settings = load_settings(cwd)
    if not settings.memory.enabled:
        print("keel: note: memory is off in your settings (`memory: false`)", file=sys.stderr)
    store = open_store(settings.memory, git_root(cwd) or cwd)
    return asyncio.run(_run(args, store))
