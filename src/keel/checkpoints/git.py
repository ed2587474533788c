"""The few git commands the shell capture needs, run read-only.

`status` lists the paths that differ from the last commit (untracked files included);
`head_entries` and `blobs` fetch what the last commit holds for paths a command changed. Git runs
with `GIT_OPTIONAL_LOCKS=0` (no index refresh written back) and without fsmonitor, so it never
stages, commits or takes a lock a user's own git command could trip on. Paths are bytes from git,
decoded with the file-system encoding. Nothing here knows about units or snapshots.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable
from pathlib import Path

from keel.frozen import frozen

#: Paths per `git ls-tree` call (keeps the command line short).
_ARGV_BATCH = 500


class GitError(Exception):
    """A git command failed; `str()` is a short reason (its first line of stderr)."""


@frozen
class HeadEntry:
    mode: str
    kind: str
    sha: str
    size: int


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(GIT_OPTIONAL_LOCKS="0", GIT_LITERAL_PATHSPECS="1", LC_ALL="C")
    for name in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):
        env.pop(name, None)
    return env


async def _git(top: Path, *args: str | bytes, stdin: bytes | None = None) -> bytes:
    argv = ["git", "-C", str(top), "-c", "core.fsmonitor=false"]
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            *args,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=_env(),
        )
    except FileNotFoundError as exc:
        raise GitError("git is not installed") from exc
    try:
        out, err = await proc.communicate(stdin)
    except BaseException:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        raise
    if proc.returncode != 0:
        first = err.decode("utf-8", "replace").strip().splitlines()
        raise GitError(first[0] if first else f"git {args[0]!r} exited with {proc.returncode}")
    return out


def repo_top(cwd: Path) -> Path | None:
    """The work tree containing `cwd` (the nearest ancestor holding `.git`), found without a
    subprocess."""
    for d in (cwd, *cwd.parents):
        if (d / ".git").exists():
            return d
    return None


async def status(top: Path) -> list[str]:
    """Absolute paths of everything `git status` reports in `top`: changed, staged, deleted and
    untracked files (every one, not just their directories). Submodules and nested repositories
    (reported as directories) are left out."""
    out = await _git(top, "status", "--porcelain=v1", "-z", "--untracked-files=all", "--no-renames")
    paths = []
    for entry in out.split(b"\0"):
        if len(entry) < 4 or entry.endswith(b"/"):
            continue
        paths.append(os.path.join(str(top), os.fsdecode(entry[3:])))
    return paths


async def head_entries(top: Path, paths: Iterable[str]) -> dict[str, HeadEntry]:
    """What the last commit holds at each of `paths` (absolute, inside `top`); paths it does not
    hold are missing from the answer. An empty repository holds nothing."""
    rel = [os.fsencode(os.path.relpath(p, top)) for p in paths]
    found: dict[str, HeadEntry] = {}
    for i in range(0, len(rel), _ARGV_BATCH):
        try:
            out = await _git(
                top, "ls-tree", "-z", "-l", "--full-tree", "HEAD", "--", *rel[i : i + _ARGV_BATCH]
            )
        except GitError:
            if not await _has_head(top):
                return {}
            raise
        for entry in out.split(b"\0"):
            if not entry:
                continue
            meta, _, name = entry.partition(b"\t")
            mode, kind, sha, size = meta.decode().split()
            path = os.path.join(str(top), os.fsdecode(name))
            found[path] = HeadEntry(mode, kind, sha, int(size) if size.isdigit() else 0)
    return found


async def _has_head(top: Path) -> bool:
    try:
        await _git(top, "rev-parse", "--verify", "-q", "HEAD")
    except GitError:
        return False
    return True


async def blobs(top: Path, shas: Iterable[str]) -> dict[str, bytes]:
    """The content of each blob in `shas`, from one `git cat-file --batch`."""
    wanted = list(dict.fromkeys(shas))
    if not wanted:
        return {}
    out = await _git(top, "cat-file", "--batch", stdin="".join(f"{s}\n" for s in wanted).encode())
    found: dict[str, bytes] = {}
    pos = 0
    for sha in wanted:
        end = out.index(b"\n", pos)
        header = out[pos:end].split()
        if len(header) != 3:  # `<sha> missing`
            raise GitError(f"git cat-file: object {sha} is missing")
        size = int(header[2])
        found[sha] = out[end + 1 : end + 1 + size]
        pos = end + 1 + size + 1
    return found
