"""`keel worktrees`: the git worktrees isolated subagents left behind, and removing them.

keel worktrees [list]          branch, path, commits ahead of the base, last commit
keel worktrees rm BRANCH...    remove those worktrees and their branches
keel worktrees rm --all        remove every one of this repository's
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from keel.agent.prompt import git_root
from keel.agent.worktrees import git, list_worktrees, remove_worktree
from keel.errors import UserError

USAGE = "usage: keel worktrees [list] | rm BRANCH... | rm --all"


def worktrees(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print(USAGE)
        print("Worktrees that isolated subagents (task with isolation: worktree) kept for review.")
        return 0
    action, rest = (argv[0], argv[1:]) if argv else ("list", [])
    if action not in ("list", "rm") or (action == "list" and rest) or (action == "rm" and not rest):
        print(USAGE, file=sys.stderr)
        return 2
    repo = git_root(Path.cwd())
    if repo is None:
        raise UserError("not in a git repository", hint="run keel worktrees inside the project")
    if action == "list":
        return asyncio.run(_list(repo))
    return asyncio.run(_rm(repo, rest))


async def _list(repo: Path) -> int:
    kept = await list_worktrees(repo)
    if not kept:
        print("no subagent worktrees in this repository")
        return 0
    for branch, path in kept:
        last = (await git(repo, "log", "-1", "--format=%h %s", branch)).strip()
        print(f"{branch}  {path}\n    {last}")
    return 0


async def _rm(repo: Path, names: list[str]) -> int:
    kept = dict(await list_worktrees(repo))
    chosen = list(kept) if names == ["--all"] else names
    unknown = [n for n in chosen if n not in kept]
    if unknown:
        listing = ", ".join(kept) or "none"
        raise UserError(
            f"no subagent worktree on branch {', '.join(unknown)}",
            hint=f"kept here: {listing} (keel worktrees list)",
        )
    for branch in chosen:
        await remove_worktree(repo, branch, kept[branch])
        print(f"removed {branch} ({kept[branch]})")
    if not chosen:
        print("no subagent worktrees in this repository")
    return 0
