"""Git worktrees for isolated subagents (`task` with `isolation: "worktree"`).

Each isolated subagent works in a new worktree on its own branch `keel/task-<hex>`, created from
HEAD (uncommitted changes in the main tree are not included) under
`<KEEL_HOME>/worktrees/<project>/`. When it finishes, whatever it left uncommitted is committed
(`--no-verify`, as "keel"); a worktree with no commits is removed with its branch, otherwise both
are kept and the report names the branch and its diff stat. `keel worktrees` lists the kept ones
and removes them. Git commands on one repository run one at a time.
"""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path
from typing import TYPE_CHECKING

from keel.agent.prompt import git_root
from keel.errors import UserError
from keel.permissions.gate import PermissionGate

if TYPE_CHECKING:
    from keel.agent.loop import Agent

BRANCH_PREFIX = "keel/task-"
_IDENTITY = ("-c", "user.name=keel", "-c", "user.email=keel@localhost")
_locks: dict[Path, asyncio.Lock] = {}


class GitError(UserError):
    pass


async def git(repo: Path, *args: str) -> str:
    """Run git in `repo`; its stdout, or `GitError` with its stderr's last line."""
    proc = await asyncio.create_subprocess_exec(
        "git",
        "-C",
        str(repo),
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    if proc.returncode != 0:
        last = (err.decode(errors="replace").strip().splitlines() or ["no message"])[-1]
        raise GitError(f"git {args[0]} failed: {last}")
    return out.decode(errors="replace")


def _lock(repo: Path) -> asyncio.Lock:
    return _locks.setdefault(repo, asyncio.Lock())


def worktrees_dir(repo: Path) -> Path:
    from keel.config.trust import project_key
    from keel.session.store import keel_home

    return keel_home() / "worktrees" / project_key(repo)


class Worktree:
    def __init__(self, repo: Path, path: Path, cwd: Path, branch: str, base: str) -> None:
        self.repo = repo
        self.path = path
        #: Where the subagent works: the parent's directory, inside the worktree.
        self.cwd = cwd
        self.branch = branch
        self.base = base

    async def finish(self, description: str) -> str:
        """Commit what was left, then keep the worktree (with commits) or remove it; says which."""
        async with _lock(self.repo):
            if (await git(self.path, "status", "--porcelain")).strip():
                await git(self.path, "add", "-A")
                message = f"keel task: {description}"
                await git(self.path, *_IDENTITY, "commit", "--no-verify", "-q", "-m", message)
            commits = int(
                (await git(self.repo, "rev-list", "--count", f"{self.base}..{self.branch}")).strip()
            )
            if commits == 0:
                await git(self.repo, "worktree", "remove", "--force", str(self.path))
                await git(self.repo, "branch", "-D", self.branch)
                return "[worktree] The subagent changed nothing; its worktree was removed."
            stat = (await git(self.repo, "diff", "--stat", f"{self.base}...{self.branch}")).rstrip()
        return (
            f"[worktree] The subagent's changes are on branch {self.branch} ({commits} "
            f"commit(s), worktree {self.path}):\n{stat}\n"
            f"Review with `git diff {self.base[:12]}...{self.branch}`; merge with "
            f"`git merge {self.branch}`; remove with `keel worktrees rm {self.branch}`."
        )


async def create_worktree(parent: Agent, description: str) -> Worktree:
    """A new worktree on a new branch from HEAD, for one subagent of `parent`."""
    repo = git_root(parent.cwd)
    if repo is None:
        raise UserError(
            'isolation "worktree" needs a git repository',
            hint="run the task without isolation",
        )
    if isinstance(parent.gate, PermissionGate) and parent.gate.mode == "plan":
        raise UserError("plan mode does not create worktrees", hint="leave plan mode first")
    branch = BRANCH_PREFIX + secrets.token_hex(3)
    path = worktrees_dir(repo) / branch.removeprefix("keel/")
    path.parent.mkdir(parents=True, exist_ok=True)
    async with _lock(repo):
        base = (await git(repo, "rev-parse", "HEAD")).strip()
        await git(repo, "worktree", "add", "-q", "-b", branch, str(path), base)
    cwd = path / parent.cwd.relative_to(repo)
    return Worktree(repo, path, cwd if cwd.is_dir() else path, branch, base)


async def list_worktrees(repo: Path) -> list[tuple[str, Path]]:
    """(branch, path) of each kept subagent worktree of `repo`."""
    out = await git(repo, "worktree", "list", "--porcelain")
    found, path = [], None
    for line in out.splitlines():
        if line.startswith("worktree "):
            path = Path(line.removeprefix("worktree "))
        elif line.startswith("branch refs/heads/" + BRANCH_PREFIX) and path is not None:
            found.append((line.removeprefix("branch refs/heads/"), path))
    return found


async def remove_worktree(repo: Path, branch: str, path: Path) -> None:
    async with _lock(repo):
        await git(repo, "worktree", "remove", "--force", str(path))
        await git(repo, "branch", "-D", branch)
