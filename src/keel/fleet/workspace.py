"""Workspaces that move with a fleet run: a git clone whose state travels on a run branch, a
directory every worker shares, or a private scratch directory.

A run request names its workspace as a JSON-able spec (`parse_workspace`: `{"git": URL, "ref":
REF}`, `{"path": DIR}`, `{}`; on the command line `git:URL#REF`, `path:DIR`, `none`). A worker
calls `Workspace.prepare(spec, run_id, scratch)` before the run's first model request, gives the
agent `.path` as its working directory, calls `save(message)` after every tool round (before the
next model request) and `cleanup()` when the run is done or handed back.

A git workspace is cloned into `scratch/<run>/work` (0700). If the remote already has the run's
branch `keel/run-<run>`, a previous worker started the run and the clone continues from that
branch (`resumed_from`); otherwise the branch starts at `ref` and is pushed at once, which pins
the start for every later worker (a `ref` that moves on does not change a started run). `save`
commits whatever the round changed (one `git status` when nothing did) and pushes it to the run
branch with a lease on the commit this workspace last pushed, so a worker that lost the run
cannot overwrite the branch of the one that took it over (`WorkspaceConflict`). What a crash
can lose is in `LOSS`. A save keeps to `WorkspaceLimits` (the worker's `KEEL_FLEET_MAX_FILE`,
`KEEL_FLEET_MAX_ROUND`, `KEEL_FLEET_MAX_RUN`): what is over them is left out of the commit, never
pushed, and `take_notes` words it for the model. A path workspace, and a git remote on the worker's own filesystem, must
lie under a directory the worker's operator shares with runs (`KEEL_WORKSPACE_ROOTS`): a run
request does not get to point the agent, or git, at any directory of the worker.

git runs here outside the agent's sandbox, on a repository that the remote and the agent both
shaped, so it is held tightly: only the `file`, `https`, `ssh` and `git` transports (`ext::` and
other remote helpers run programs), no templates, no hooks, no fsmonitor, no submodules, no
credential prompts (`GIT_TERMINAL_PROMPT=0`, no controlling terminal), commits built with
plumbing (`write-tree`/`commit-tree`, fixed author, never signed). Before each save the clone's
`.git` is checked to be the directory, with the config, that `prepare` left (the sandbox and the
file tools hold them read-only; a changed one means something got past them, and keel refuses
rather than run git under a config it did not write). Nested repositories the agent created are
left out of saves (`skipped`): `git add` would run `git status` inside them, under their own
config, which the sandbox does not protect.

Every call blocks (a git subprocess with a deadline); an async worker calls them through
`asyncio.to_thread`. This module never runs git on a URL it has not checked, and never removes
a `path` workspace.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Literal
from urllib.parse import unquote, urlsplit

from keel.errors import UserError
from keel.fleet.streams import check_run_id
from keel.frozen import frozen

Kind = Literal["git", "path", "none"]

#: The transports a git workspace may use (git's own names, as `protocol.<name>.allow` has them).
TRANSPORTS = ("file", "https", "ssh", "git")

#: What a worker's crash can and cannot lose, per workspace kind (docs/fleet.md quotes it).
LOSS: dict[Kind, str] = {
    "git": (
        "at most the file edits of the tool round in flight: each round's changes are committed "
        "and pushed to the run branch keel/run-<id> before the next model request, and a "
        "resuming worker checks that branch out (files the repository ignores, nested "
        "repositories and files over the workspace limits are never saved)"
    ),
    "path": (
        "nothing of the files, which stay on the shared filesystem; but a tool round in flight "
        "may have half-applied its edits, and the resumed run sees them as they were left"
    ),
    "none": (
        "everything in the scratch directory: a run resumed on any worker, this one included, "
        "starts with an empty directory"
    ),
}

#: The worker's setting that lists the directories runs may name (path workspaces, local git
#: remotes), `:`-separated. Unset: none.
ROOTS_ENV = "KEEL_WORKSPACE_ROOTS"

#: The worker's settings for how much a run may save to a git workspace: the largest file, what
#: one tool round may add, what the whole run may add over its start (a size: `10M`, `1G`,
#: `512k`, bytes; decimal units, `Mi`/`Gi` binary; `off`: no limit).
MAX_FILE_ENV = "KEEL_FLEET_MAX_FILE"
MAX_ROUND_ENV = "KEEL_FLEET_MAX_ROUND"
MAX_RUN_ENV = "KEEL_FLEET_MAX_RUN"

AUTHOR_NAME = "keel"
AUTHOR_EMAIL = "keel@localhost"

#: Deadlines for one git command: one that talks to the remote, and one that does not.
NETWORK_TIMEOUT = 600.0
LOCAL_TIMEOUT = 120.0

#: `-c` settings on every git command: no hooks, no fsmonitor, only the allowed transports, no
#: submodules, no signing, no background maintenance that would outlive the command.
_CONFIG = (
    "core.hooksPath=/dev/null",
    "core.fsmonitor=false",
    "protocol.allow=never",
    *(f"protocol.{name}.allow=always" for name in TRANSPORTS),
    "protocol.ext.allow=never",
    "submodule.recurse=false",
    "fetch.recurseSubmodules=false",
    "push.recurseSubmodules=no",
    "status.submoduleSummary=false",
    "commit.gpgSign=false",
    "tag.gpgSign=false",
    "gc.auto=0",
    "maintenance.auto=false",
    "advice.detachedHead=false",
)

#: The worker's own GIT_* variables that are kept (how it reaches its remotes); every other one
#: (GIT_DIR, GIT_CONFIG_PARAMETERS, GIT_TEMPLATE_DIR...) is dropped.
_ENV_KEEP = (
    "GIT_SSH",
    "GIT_SSH_COMMAND",
    "GIT_SSH_VARIANT",
    "GIT_ASKPASS",
    "GIT_CONFIG_GLOBAL",
    "GIT_CONFIG_SYSTEM",
    "GIT_CONFIG_NOSYSTEM",
    "GIT_EXEC_PATH",
    "GIT_SSL_CAINFO",
    "GIT_SSL_CAPATH",
)

#: A local remote's own side of a clone or push (upload-pack, receive-pack) runs on this worker
#: under that repository's config, which git does not let `-c` reach: keel starts it with hooks
#: and fsmonitor off itself (a remote over ssh or https runs its hooks on its own server).
_REMOTE_SIDE = (
    "git -c core.hooksPath=/dev/null -c core.fsmonitor=false -c core.alternateRefsCommand=true"
)

_HELPER = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*::")
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_SCP = re.compile(r"^(?:([^@/:]+)@)?([^@/:]+):(.*)$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_SHA = re.compile(r"^[0-9a-f]{40}$|^[0-9a-f]{64}$")

_HINT_SPEC = "use git:URL#REF, path:/shared/dir or none (or the JSON forms)"


class WorkspaceError(UserError):
    """A workspace cannot be prepared or saved: a bad spec, a refused URL, a failed git."""


class WorkspaceConflict(WorkspaceError):
    """Another worker moved the run branch since this workspace last pushed: this worker no
    longer owns the run and must stop without saving anything more."""


_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*(?:([kmgt])(i)?b?|b)?$", re.IGNORECASE)
_POWERS = {"k": 1, "m": 2, "g": 3, "t": 4}


def parse_size(text: str, name: str) -> int | None:
    """Bytes from a size: `10M`, `1.5G`, `512k`, `2Mi` (binary), `123` (bytes); None for `off`.
    `name` is the setting, for the one-line error."""
    raw = text.strip()
    if raw.lower() in ("off", "none"):
        return None
    match = _SIZE.match(raw)
    hint = "write a size such as 10M, 1G or 500000 (bytes), or off for no limit"
    if match is None:
        raise WorkspaceError(f"{name}={text!r} is not a size", hint=hint)
    number, unit, binary = match.groups()
    value = int(float(number) * (1024 if binary else 1000) ** _POWERS.get((unit or "").lower(), 0))
    if value < 1:
        raise WorkspaceError(f"{name}={text!r} is less than one byte", hint=hint)
    return value


def size_text(size: int) -> str:
    """`104.9 MB`, `10 MB`, `512 B` (decimal units, as the settings read them)."""
    value, unit = float(size), "B"
    for name in ("kB", "MB", "GB", "TB"):
        if value < 1000:
            break
        value, unit = value / 1000, name
    if unit == "B":
        return f"{size} B"
    return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"


@frozen
class WorkspaceLimits:
    """How much a run may save to its git workspace, in bytes (None: no limit): the largest file
    (`per_file`), what one tool round may add (`per_round`), what the run branch may add over
    what the remote's other branches and tags already hold (`per_run`). What the run did not
    add or change (the files of its start commit) never counts."""

    per_file: int | None = 10_000_000
    per_round: int | None = 50_000_000
    per_run: int | None = 200_000_000

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> WorkspaceLimits:
        """The worker's limits: `KEEL_FLEET_MAX_FILE`, `KEEL_FLEET_MAX_ROUND`,
        `KEEL_FLEET_MAX_RUN` (unset: the defaults); a one-line `WorkspaceError` for a bad one."""
        base = os.environ if env is None else env
        default = cls()

        def read(name: str, fallback: int | None) -> int | None:
            raw = base.get(name, "").strip()
            return parse_size(raw, name) if raw else fallback

        return cls(
            per_file=read(MAX_FILE_ENV, default.per_file),
            per_round=read(MAX_ROUND_ENV, default.per_round),
            per_run=read(MAX_RUN_ENV, default.per_run),
        )

    def describe(self) -> str:
        """One line for a worker's log."""

        def show(limit: int | None) -> str:
            return "no limit" if limit is None else size_text(limit)

        return (
            f"workspace limits: {show(self.per_file)} a file, {show(self.per_round)} a round, "
            f"{show(self.per_run)} a run"
        )


@frozen
class _Change:
    """A changed file of the work tree: its path and the blob HEAD holds for it (None: new)."""

    path: str
    blob: str | None


@frozen
class LeftOut:
    """A file a save did not commit: its path (relative to the workspace), its size, and which
    limit kept it out (`file`, `round` or `run`)."""

    path: str
    size: int
    limit: Literal["file", "round", "run"]


@frozen
class WorkspaceSpec:
    """Where a run's files come from. `kind` decides which fields matter: `url` and `ref` (empty:
    the remote's HEAD) for git, `path` for path; none has neither."""

    kind: Kind
    url: str = ""
    ref: str = ""
    path: str = ""

    def to_dict(self) -> dict[str, str]:
        """The JSON form a run request carries (`parse_workspace` reads it back)."""
        if self.kind == "git":
            return {"git": self.url, "ref": self.ref} if self.ref else {"git": self.url}
        if self.kind == "path":
            return {"path": self.path}
        return {}

    def text(self) -> str:
        """The command-line form."""
        if self.kind == "git":
            return f"git:{self.url}#{self.ref}" if self.ref else f"git:{self.url}"
        if self.kind == "path":
            return f"path:{self.path}"
        return "none"


def parse_workspace(value: str | Mapping[str, object] | None) -> WorkspaceSpec:
    """A workspace spec from its command-line text (`git:URL#REF`, `git:URL`, `path:/dir`,
    `none`, or JSON) or its JSON form (a dict). Checked here, on the submitting side, as far as
    it can be without the worker's filesystem; `WorkspaceError` (one line, a hint) otherwise."""
    if value is None:
        return WorkspaceSpec("none")
    if isinstance(value, str):
        return _parse_text(value.strip())
    return _parse_dict(value)


def _parse_text(text: str) -> WorkspaceSpec:
    if text in ("", "none"):
        return WorkspaceSpec("none")
    if text.startswith("{"):
        try:
            loaded = json.loads(text)
        except ValueError as exc:
            raise WorkspaceError(f"workspace {text!r} is not valid JSON", hint=_HINT_SPEC) from exc
        if not isinstance(loaded, dict):
            raise WorkspaceError(f"workspace {text!r} is not a JSON object", hint=_HINT_SPEC)
        return _parse_dict(loaded)
    kind, sep, rest = text.partition(":")
    if sep and kind == "git":
        url, _, ref = rest.rpartition("#") if "#" in rest else (rest, "", "")
        return _git_spec(url, ref)
    if sep and kind == "path":
        return _path_spec(rest)
    raise WorkspaceError(f"workspace {text!r} is not one keel knows", hint=_HINT_SPEC)


def _parse_dict(data: Mapping[str, object]) -> WorkspaceSpec:
    keys = set(data)
    if not keys:
        return WorkspaceSpec("none")
    if "git" in keys and keys <= {"git", "ref"}:
        url, ref = data["git"], data.get("ref", "")
        if not isinstance(url, str) or not isinstance(ref, str):
            raise WorkspaceError("workspace git URL and ref must be strings", hint=_HINT_SPEC)
        return _git_spec(url, ref)
    if keys == {"path"}:
        path = data["path"]
        if not isinstance(path, str):
            raise WorkspaceError("workspace path must be a string", hint=_HINT_SPEC)
        return _path_spec(path)
    raise WorkspaceError(
        f"workspace {dict(data)!r} has unknown or conflicting keys {sorted(keys)}",
        hint='use {"git": URL, "ref": REF}, {"path": DIR} or {}',
    )


def _git_spec(url: str, ref: str) -> WorkspaceSpec:
    check_git_url(url)
    check_ref(ref)
    return WorkspaceSpec("git", url=url, ref=ref)


def _path_spec(path: str) -> WorkspaceSpec:
    if not path or _CONTROL.search(path) or not os.path.isabs(path):
        raise WorkspaceError(
            f"workspace path {path!r} is not an absolute path",
            hint="a path workspace is a directory every worker mounts at the same absolute path",
        )
    return WorkspaceSpec("path", path=os.path.normpath(path))


def check_git_url(url: str) -> str:
    """`url` when git may fetch from it: an absolute path, `file:///…`, `https://…`, `ssh://…`,
    `git://…` or scp-like `[user@]host:path`. Refused: remote helpers (`ext::`, `fd::` and any
    `<transport>::`), other schemes (`http` included), relative paths, a host or user that
    would read as an option, and a password in the URL (a run request never carries one)."""
    refuse = _url_refusal(url)
    if refuse:
        reason, hint = refuse
        raise WorkspaceError(f"git workspace {_redact(url)!r} refused: {reason}", hint=hint)
    return url


def _url_refusal(url: str) -> tuple[str, str] | None:  # noqa: C901 (one rule per line)
    allowed = "allowed: an absolute path, file:///, https://, ssh://, git:// or host:path"
    if not url:
        return "no URL", allowed
    if _CONTROL.search(url):
        return "it holds control characters", allowed
    if url.startswith("-"):
        return "it starts with '-' (git would read it as an option)", allowed
    if _HELPER.match(url):
        return "remote-helper transports (ext::, fd::, <name>::) run programs", allowed
    scheme = _SCHEME.match(url)
    if scheme:
        name = scheme.group(1).lower()
        if name == "http":
            return "plain http is not allowed", "use https://"
        if name not in TRANSPORTS:
            return f"transport {name!r} is not allowed", allowed
        try:
            parts = urlsplit(url)
            _ = parts.port  # a port that is not a number (`host:-oProxyCommand=…`) raises
        except ValueError:
            return "it is not a valid URL (its host or port cannot be read)", allowed
        if parts.password:
            return (
                "it carries a password",
                "a run request never carries a credential: give the workers a credential helper",
            )
        user, host = unquote(parts.username or ""), unquote(parts.hostname or "")
        if user.startswith("-") or host.startswith("-"):
            return "its user or host starts with '-' (ssh would read it as an option)", allowed
        if name == "file" and (parts.netloc not in ("", "localhost") or not parts.path):
            return "a file URL names a local path", "write file:///absolute/path"
        if name != "file" and not host:
            return "it has no host", allowed
        return None
    if url.startswith("/"):
        return None
    scp = _SCP.match(url)
    if scp and "/" not in url.split(":", 1)[0]:
        user, host = scp.group(1) or "", scp.group(2)
        if user.startswith("-") or host.startswith("-"):
            return "its user or host starts with '-' (ssh would read it as an option)", allowed
        return None
    return (
        "a local repository must be an absolute path",
        "write /absolute/path or file:///absolute/path (the path on every worker)",
    )


def check_ref(ref: str) -> str:
    """`ref` (a branch, tag or commit; empty: the remote's HEAD) when it cannot be mistaken for
    an option or a revision expression."""
    if ref and (
        ref.startswith("-")
        or _CONTROL.search(ref)
        or any(c in ref for c in " ~^:?*[\\")
        or ".." in ref
        or "@{" in ref
    ):
        raise WorkspaceError(
            f"git ref {ref!r} is not a branch, tag or commit name",
            hint="name a branch (main), a tag (v1.2) or a full commit id",
        )
    return ref


def allowed_roots(env: Mapping[str, str] | None = None) -> tuple[Path, ...]:
    """The directories runs may name on this worker (`KEEL_WORKSPACE_ROOTS`, `:`-separated,
    absolute): path workspaces and local git remotes must lie under one. None by default."""
    base = os.environ if env is None else env
    raw = base.get(ROOTS_ENV, "")
    return tuple(Path(p) for p in raw.split(os.pathsep) if p and os.path.isabs(p))


def check_under_roots(path: Path, roots: tuple[Path, ...], what: str) -> Path:
    """`path` when it lies under one of `roots` once symlinks are resolved; refused otherwise
    (a run request must not point the agent, or git outside the sandbox, at any directory of
    the worker it likes)."""
    if under_roots(path, roots):
        return path
    shared = ", ".join(str(r) for r in roots) if roots else "none are set"
    raise WorkspaceError(
        f"{what} {path} is not under a directory this worker shares with runs ({shared})",
        hint=f"the worker's operator lists them in {ROOTS_ENV}=/shared/dir[:/other]",
    )


def under_roots(path: Path, roots: tuple[Path, ...]) -> bool:
    """Whether `path` lies under one of `roots` once symlinks are resolved."""
    resolved = path.resolve()
    return any(resolved.is_relative_to(root.resolve()) for root in roots)


def check_here(spec: WorkspaceSpec, env: Mapping[str, str] | None = None) -> list[str]:
    """Check, on the machine that submits a run whose workers run here too (a local fleet), what
    a worker started from this shell would check later: a path workspace or a local git remote
    exists (a directory; a git repository) and lies under `KEEL_WORKSPACE_ROOTS`. A
    `WorkspaceError` for what is certain; returns the warnings for what depends on the workers'
    own environment (no roots set in this one)."""
    if spec.kind == "path":
        where, what = Path(spec.path), "workspace path"
        if not where.is_dir():
            raise WorkspaceError(
                f"workspace path {where} is not a directory",
                hint="a path workspace names a directory that exists on the workers (here)",
            )
    elif spec.kind == "git" and (local := _local_path(spec.url)) is not None:
        where, what = local, "git workspace"
        if not where.is_dir():
            raise WorkspaceError(
                f"git workspace {where} does not exist",
                hint=f"name a repository that exists, or make one: git clone --bare REPO {where}",
            )
        if not ((where / "HEAD").is_file() or (where / ".git").exists()):
            raise WorkspaceError(
                f"git workspace {where} is not a git repository",
                hint=f"make one: git clone --bare REPO {where}",
            )
    else:
        return []
    roots = allowed_roots(env)
    if not roots:
        return [
            f"{ROOTS_ENV} is not set here: a worker started from this shell refuses {what} "
            f"{where} (start the workers with {ROOTS_ENV}={where} or a folder above it)"
        ]
    if not under_roots(where, roots):
        raise WorkspaceError(
            f"{what} {where} is not under {ROOTS_ENV} "
            f"({', '.join(str(r) for r in roots)}): a worker would refuse it",
            hint=f"name one under those folders, or add a folder above it to {ROOTS_ENV}",
        )
    return []


def _local_path(url: str) -> Path | None:
    """The directory a local git URL (a path or `file://`) names; None for a remote one."""
    if url.startswith("/"):
        return Path(url)
    if url.lower().startswith("file://"):
        return Path(unquote(urlsplit(url).path))
    return None


def run_branch(run_id: str) -> str:
    """The branch a run's rounds are saved to."""
    return f"keel/run-{check_run_id(run_id)}"


def _redact(url: str) -> str:
    """`url` without a password (for messages and `describe`)."""
    if "@" in url and _SCHEME.match(url):
        try:
            parts = urlsplit(url)
            if parts.password is not None:
                host = parts.netloc.rpartition("@")[2]
                return parts._replace(netloc=f"{parts.username}:***@{host}").geturl()
        except ValueError:
            return "<a URL that cannot be read>"
    return url


def git_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment git runs with: the worker's, minus GIT_* variables that would point it
    elsewhere or add config, plus no prompts, the transport allow list and keel's identity."""
    base = os.environ if env is None else env
    out = {k: v for k, v in base.items() if not k.startswith("GIT_") or k in _ENV_KEEP}
    out.update(
        GIT_TERMINAL_PROMPT="0",
        GIT_PROTOCOL_FROM_USER="0",
        GIT_ALLOW_PROTOCOL=":".join(TRANSPORTS),
        GCM_INTERACTIVE="never",
        SSH_ASKPASS_REQUIRE="never",
        GIT_AUTHOR_NAME=AUTHOR_NAME,
        GIT_AUTHOR_EMAIL=AUTHOR_EMAIL,
        GIT_COMMITTER_NAME=AUTHOR_NAME,
        GIT_COMMITTER_EMAIL=AUTHOR_EMAIL,
        LC_ALL="C",
    )
    return out


def git(
    args: list[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    timeout: float = LOCAL_TIMEOUT,
    stdin: bytes | None = None,
    check: bool = True,
) -> subprocess.CompletedProcess[bytes]:
    """One git command with keel's `-c` settings, no terminal (its own session, stdin closed or
    given) and a deadline after which its whole process group is killed."""
    argv = ["git", *(a for item in _CONFIG for a in ("-c", item)), *args]
    try:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except FileNotFoundError as exc:
        if not cwd.is_dir():
            raise WorkspaceError(
                f"the workspace directory {cwd} is gone",
                hint="the run's saved rounds are on its run branch; resume it on another worker",
            ) from exc
        raise WorkspaceError(
            "git is not installed on this worker", hint="install git (apt install git)"
        ) from exc
    try:
        out, err = proc.communicate(stdin, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise WorkspaceError(
            f"git {args[0]} did not finish in {timeout:.0f}s",
            hint="check that the workers reach the remote",
        ) from exc
    except BaseException:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        raise
    result = subprocess.CompletedProcess(argv, proc.returncode, out, err)
    if check and result.returncode != 0:
        raise WorkspaceError(f"git {args[0]} failed: {_first_line(err)}", hint=_git_hint(args[0]))
    return result


def _first_line(err: bytes) -> str:
    lines = [ln.strip() for ln in err.decode("utf-8", "replace").splitlines() if ln.strip()]
    fatal = [ln for ln in lines if ln.startswith(("fatal:", "error:"))]
    # What a remote says reaches a terminal through this line: no escape sequences.
    return _CONTROL.sub("?", (fatal or lines or ["(no message)"])[0])[:300]


def _git_hint(command: str) -> str:
    if command in ("clone", "push", "fetch"):
        return "check the URL and that this worker can reach the remote (its own credentials)"
    return "the workspace clone may be damaged; the run can resume from its run branch"


def _private_dir(path: Path) -> None:
    """`path` as a fresh empty directory only this user can enter (whatever was there is gone)."""
    _remove(path)
    path.mkdir(mode=0o700, parents=True)
    path.chmod(0o700)


def _remove(path: Path) -> None:
    """`path` gone, without following symlinks; directories the run made unwritable or
    unreadable are opened up first so that they can be emptied."""
    if path.is_symlink() or path.is_file():
        path.unlink()
        return
    if not path.exists():
        return
    os.chmod(path, 0o700)
    for root, dirs, _ in os.walk(path, onerror=lambda _e: None):
        for name in dirs:
            child = os.path.join(root, name)
            if not os.path.islink(child):
                os.chmod(child, 0o700)
    try:
        shutil.rmtree(path)
    except OSError as exc:
        raise WorkspaceError(
            f"cannot remove the workspace directory {path}: {exc.strerror}",
            hint="remove it by hand; nothing of the run depends on it",
        ) from exc


class Workspace:
    """A prepared workspace: `path` is the agent's working directory; `resumed_from` the commit
    of the run branch a git workspace continued from (None: a fresh start, or not git)."""

    def __init__(
        self,
        spec: WorkspaceSpec,
        run_id: str,
        path: Path,
        *,
        private: Path | None = None,
        resumed_from: str | None = None,
        env: Mapping[str, str] | None = None,
        limits: WorkspaceLimits | None = None,
    ) -> None:
        self.spec = spec
        self.run_id = run_id
        self.path = path
        self.resumed_from = resumed_from
        self.limits = limits or WorkspaceLimits()
        #: Nested repositories the last save left out (paths relative to `path`).
        self.skipped: tuple[str, ...] = ()
        #: Files the last save left out for a limit.
        self.left_out: tuple[LeftOut, ...] = ()
        #: Bytes the run branch adds over the remote's other branches and tags (a git
        #: workspace: counted at `prepare`, then grown by each save).
        self.run_added = 0
        #: Files the model has been told about, and the limit it was told of.
        self._told: dict[str, str] = {}
        self._notes: list[str] = []
        self._private = private
        self._env = dict(env) if env is not None else {}
        #: The commit the run branch holds as far as this workspace knows (the push lease);
        #: None: the branch must not exist yet.
        self._pushed = resumed_from
        self._config = b""

    @property
    def branch(self) -> str:
        return run_branch(self.run_id)

    @classmethod
    def prepare(
        cls,
        spec: WorkspaceSpec,
        run_id: str,
        scratch: Path,
        *,
        env: Mapping[str, str] | None = None,
        roots: tuple[Path, ...] | None = None,
        limits: WorkspaceLimits | None = None,
        timeout: float = NETWORK_TIMEOUT,
    ) -> Workspace:
        """The workspace for `run_id` on this worker. git: a fresh clone in
        `scratch/<run>/work` on the run branch (the remote's if it has one); path: the shared
        directory (it must exist); none: an empty `scratch/<run>/work`. A path workspace and a
        git remote on this machine must lie under one of `roots` (default: `KEEL_WORKSPACE_ROOTS`
        in `env`), the directories this worker's operator shares with runs. A git workspace's
        saves keep to `limits` (default: `WorkspaceLimits.from_env(env)`)."""
        check_run_id(run_id)
        roots = allowed_roots(env) if roots is None else roots
        limits = WorkspaceLimits.from_env(env) if limits is None else limits
        if spec.kind == "path":
            shared = Path(_path_spec(spec.path).path)
            if not shared.is_dir():
                raise WorkspaceError(
                    f"workspace path {shared} is not a directory on this worker",
                    hint="mount the shared filesystem at the same path on every worker",
                )
            check_under_roots(shared, roots, "workspace path")
            return cls(spec, run_id, shared)
        if spec.kind == "git":
            check_git_url(spec.url)
            check_ref(spec.ref)
            if (local := _local_path(spec.url)) is not None:
                check_under_roots(local, roots, "git workspace")
        private = scratch / run_id
        _private_dir(private)
        work = private / "work"
        if spec.kind == "none":
            work.mkdir(mode=0o700)
            return cls(spec, run_id, work, private=private)
        workspace = cls(spec, run_id, work, private=private, env=git_env(env), limits=limits)
        try:
            workspace._clone(timeout)
        except BaseException:
            _remove(private)
            raise
        return workspace

    def _git(
        self, *args: str, timeout: float = LOCAL_TIMEOUT, stdin: bytes | None = None
    ) -> subprocess.CompletedProcess[bytes]:
        where = ("--git-dir", str(self.path / ".git"), "--work-tree", str(self.path))
        return git([*where, *args], cwd=self.path, env=self._env, timeout=timeout, stdin=stdin)

    def _rev(self, name: str) -> str | None:
        where = ["--git-dir", str(self.path / ".git")]
        args = [*where, "rev-parse", "--verify", "-q", "--end-of-options", f"{name}^{{commit}}"]
        result = git(args, cwd=self.path, env=self._env, check=False)
        return result.stdout.decode().strip() if result.returncode == 0 else None

    def _clone(self, timeout: float) -> None:
        assert self._private is not None
        args = ["clone", "--no-checkout", "--no-recurse-submodules", "--template=", "--quiet"]
        if self._local_remote():
            # The git transport, not a copy of the source's files; its upload-pack held too.
            args += ["--no-local", f"--upload-pack={_REMOTE_SIDE} upload-pack"]
        git(
            [*args, "--", self.spec.url, str(self.path)],
            cwd=self._private,
            env=self._env,
            timeout=timeout,
        )
        self.path.chmod(0o700)
        branch = self.branch
        saved = self._rev(f"refs/remotes/origin/{branch}")
        if saved is not None:
            self._git("checkout", "--quiet", "--no-track", "-B", branch, saved)
            self.resumed_from = self._pushed = saved
            self.run_added = self._run_size(saved)
        else:
            start = self._start_commit()
            if start is None:  # an empty repository: the first save makes the root commit
                self._git("symbolic-ref", "HEAD", f"refs/heads/{branch}")
            else:
                self._git("checkout", "--quiet", "--no-track", "-B", branch, start)
                # Pinned at once: a resuming worker starts from this commit even if `ref` has
                # moved on, and two workers starting the run together find out here.
                self._push(start)
        self._config = self._config_bytes()

    def _local_remote(self) -> bool:
        return _local_path(self.spec.url) is not None

    def _start_commit(self) -> str | None:
        ref = self.spec.ref
        if not ref:
            head = self._rev("refs/remotes/origin/HEAD")
            if head is None and self._rev("HEAD") is None and not self._has_refs():
                return None
            if head is None:
                raise WorkspaceError(
                    f"the remote {_redact(self.spec.url)} has no default branch",
                    hint="name one: git:URL#BRANCH",
                )
            return head
        candidates = [f"refs/remotes/origin/{ref}", f"refs/tags/{ref}"]
        if _SHA.match(ref):
            candidates.append(ref)
        for name in candidates:
            found = self._rev(name)
            if found is not None:
                return found
        raise WorkspaceError(
            f"ref {ref!r} is not a branch, tag or commit of {_redact(self.spec.url)}",
            hint="check the ref (a commit must be reachable from a branch or tag)",
        )

    def _has_refs(self) -> bool:
        out = self._git("for-each-ref", "--count=1", "--format=%(refname)").stdout
        return bool(out.strip())

    def _config_bytes(self) -> bytes:
        return (self.path / ".git" / "config").read_bytes()

    def _check_git_dir(self) -> None:
        """The clone's `.git` is still the directory and config `prepare` left; refuse otherwise."""
        dot_git = self.path / ".git"
        try:
            st = os.lstat(dot_git)
            ok = stat.S_ISDIR(st.st_mode) and self._config_bytes() == self._config
        except OSError:
            ok = False
        if ok and not os.path.lexists(dot_git / "commondir"):
            return
        raise WorkspaceError(
            f"the workspace's .git in {self.path} was changed during the run; keel will not run "
            "git under a configuration it did not write",
            hint="the run's saved rounds are on its run branch; resume it on another worker",
        )

    def save(self, message: str) -> str | None:
        """Commit what changed since the last save and push it to the run branch; the commit, or
        None when nothing changed (then it costs one `git status`). Path and none: None.

        Nothing over `limits` is committed: a file over the per-file limit is never even hashed;
        when a round's files would add more than the round or run allows, the largest are left
        out until the rest fits. Left-out files stay in the clone (`left_out`; `take_notes`
        says so once per file). Commits made in the clone since the last push (the agent's own)
        are pushed as they are when they fit, else undone into the round's changes first."""
        if self.spec.kind != "git":
            return None
        self._check_git_dir()
        head, nested, changes, dirty = self._status()
        pending = 0
        if head is not None and head != self._pushed:
            pending = self._unpushed(head)
            if pending < 0:
                self._rewind()
                head, nested, changes, dirty = self._status()
                pending = 0
        left: list[LeftOut] = []
        added = 0
        if dirty:
            head, added, left = self._commit(message, nested, changes, head, pending)
        self._tell(left)
        if head is None or head == self._pushed:
            return None
        self._push(head)
        self.run_added += pending + added
        return head

    def _status(self) -> tuple[str | None, list[str], list[_Change], bool]:
        """HEAD (None: no commit yet), the untracked nested repositories, the changed files
        (paths with their blob in HEAD, if any), whether anything is to be committed."""
        out = self._git(
            "status", "--porcelain=v2", "--branch", "-z", "--untracked-files=all",
            "--ignore-submodules=all", "--no-renames",
        ).stdout  # fmt: skip
        head: str | None = None
        nested: list[str] = []
        changes: list[_Change] = []
        dirty = False
        for entry in out.split(b"\0"):
            if entry.startswith(b"# branch.oid "):
                oid = entry[len(b"# branch.oid ") :].decode()
                head = None if oid == "(initial)" else oid
            elif entry.startswith(b"? ") and entry.endswith(b"/"):
                nested.append(os.fsdecode(entry[2:-1]))
            elif entry and not entry.startswith(b"#"):
                dirty = True
                if entry.startswith(b"? "):
                    changes.append(_Change(os.fsdecode(entry[2:]), None))
                elif entry.startswith(b"1 "):
                    fields = entry.split(b" ", 8)
                    changes.append(_Change(os.fsdecode(fields[8]), fields[6].decode()))
        self.skipped = tuple(nested)
        return head, nested, changes, dirty

    def _gitlinks(self) -> list[str]:
        """Paths the index holds as submodules: `git add` would run `git status` in them."""
        out = self._git("ls-files", "--stage", "-z").stdout
        found = []
        for entry in out.split(b"\0"):
            if entry.startswith(b"160000 "):
                found.append(os.fsdecode(entry.partition(b"\t")[2]))
        return found

    def _commit(
        self,
        message: str,
        nested: list[str],
        changes: list[_Change],
        head: str | None,
        pending: int,
    ) -> tuple[str | None, int, list[LeftOut]]:
        """Commit the round's changes within the limits: the commit (HEAD when nothing is left
        to commit), the bytes it adds, what it left out."""
        too_big = self._too_big_on_disk(changes)
        skip = [*nested, *self._gitlinks(), *(item.path for item in too_big)]
        specs = [".", *(f":(exclude,literal){p}" for p in skip)]
        self._git(
            "add", "--all", "--pathspec-from-file=-", "--pathspec-file-nul",
            stdin=b"\0".join(os.fsencode(s) for s in specs),
        )  # fmt: skip
        # The sizes git stored decide (a file may have grown since it was measured on disk).
        added, left = self._fit(self._staged(head), pending)
        if left:
            self._unstage(head, [item.path for item in left])
        tree = self._git("write-tree").stdout.decode().strip()
        left = [*too_big, *left]
        if head is not None and self._git("rev-parse", f"{head}^{{tree}}").stdout.strip() == (
            tree.encode()
        ):
            return head, 0, left  # only left-out paths changed
        parents = ["-p", head] if head is not None else []
        commit = self._git(
            "commit-tree", "--no-gpg-sign", *parents, "-F", "-", tree,
            stdin=(message.strip() or "keel: save").encode() + b"\n",
        ).stdout.decode().strip()  # fmt: skip
        # The old value pins what HEAD held (empty: it must not exist yet).
        self._git("update-ref", "-m", "keel save", "HEAD", commit, head or "")
        return commit, added, left

    def _too_big_on_disk(self, changes: list[_Change]) -> list[LeftOut]:
        """Changed files over the per-file limit by their apparent size on disk (a sparse file
        counts whole: git would store it whole), unless HEAD already holds that path over the
        limit (a large file that came with the repository may be changed)."""
        limit = self.limits.per_file
        if limit is None:
            return []
        found: list[tuple[_Change, int]] = []
        for change in changes:
            try:
                st = os.lstat(self.path / change.path)
            except OSError:
                continue  # deleted
            if stat.S_ISREG(st.st_mode) and st.st_size > limit:
                found.append((change, st.st_size))
        held = self._sizes(c.blob for c, _ in found if c.blob)
        return [
            LeftOut(change.path, size, "file")
            for change, size in found
            if not (change.blob and held.get(change.blob, 0) > limit)
        ]

    def _staged(self, head: str | None) -> list[tuple[str, int, int]]:
        """What the index adds over `head`: each added or changed file's path, its size and the
        size HEAD held (0: none)."""
        base = head or self._empty_tree()
        out = self._git("diff-index", "--cached", "-z", "--no-renames", "--raw", base).stdout
        items = out.split(b"\0")
        entries: list[tuple[str, str, str]] = []
        for meta, path in zip(items[0::2], items[1::2], strict=False):
            fields = meta.decode().split()
            if len(fields) < 5 or fields[4] == "D" or fields[1] == "160000":
                continue
            old = fields[2] if fields[0] != ":000000" else ""
            entries.append((os.fsdecode(path), fields[3], old))
        sizes = self._sizes(oid for _, new, old in entries for oid in (new, old) if oid)
        return [(path, sizes.get(new, 0), sizes.get(old, 0)) for path, new, old in entries]

    def _fit(self, staged: list[tuple[str, int, int]], pending: int) -> tuple[int, list[LeftOut]]:
        """The bytes the staged files add once the limits hold, and the files to leave out: each
        one over the per-file limit (unless HEAD held it over the limit already), then the
        largest until the round and the run fit."""
        limits = self.limits
        out: list[LeftOut] = []
        kept: list[tuple[str, int]] = []
        for path, size, held in staged:
            if limits.per_file is not None and size > limits.per_file >= held:
                out.append(LeftOut(path, size, "file"))
            else:
                kept.append((path, size))
        total = pending + sum(size for _, size in kept)
        for path, size in sorted(kept, key=lambda item: (-item[1], item[0])):
            over_round = limits.per_round is not None and total > limits.per_round
            over_run = limits.per_run is not None and self.run_added + total > limits.per_run
            if not (over_round or over_run):
                break
            out.append(LeftOut(path, size, "round" if over_round else "run"))
            total -= size
        return total - pending, out

    def _unstage(self, head: str | None, paths: list[str]) -> None:
        """The index entries of `paths` back to what HEAD holds (nothing, if it holds none)."""
        specs = b"\0".join(os.fsencode(f":(literal){p}") for p in paths)
        flags = ("--pathspec-from-file=-", "--pathspec-file-nul")
        if head is None:
            self._git("rm", "--quiet", "--cached", "--ignore-unmatch", *flags, stdin=specs)
        else:
            self._git("reset", "--quiet", *flags, head, stdin=specs)

    def _unpushed(self, head: str) -> int:
        """The bytes the commits since the last push add (the agent's own, or a save whose push
        failed); -1 when they hold a file over the per-file limit or more than the round or run
        may add (they are not pushed as they are)."""
        since = ["--not", self._pushed] if self._pushed else []
        out = self._git("rev-list", "--objects", head, *since).stdout.decode()
        sizes = self._sizes(line.split(" ", 1)[0] for line in out.splitlines() if line)
        total = sum(sizes.values())
        limits = self.limits
        if (
            (limits.per_file is not None and max(sizes.values(), default=0) > limits.per_file)
            or (limits.per_round is not None and total > limits.per_round)
            or (limits.per_run is not None and self.run_added + total > limits.per_run)
        ):
            return -1
        return total

    def _rewind(self) -> None:
        """Undo the commits since the last push, keeping their files: HEAD and the index go back
        to the pushed commit, so the next commit measures their changes file by file."""
        if self._pushed is None:
            self._git("update-ref", "-d", "HEAD")
            self._git("read-tree", "--empty")
        else:
            self._git("update-ref", "-m", "keel: over the workspace limits", "HEAD", self._pushed)
            self._git("read-tree", self._pushed)
        self._notes.append(
            "Commits made in the workspace since the last save were not pushed: they held more "
            "than the run's workspace may keep. Their changes were saved as keel's own commit, "
            "without the files over the limits."
        )

    def _run_size(self, head: str) -> int:
        """The bytes of the blobs `head` holds that no other branch or tag of the remote does:
        what the run added (a resumed run's count)."""
        out = self._git(
            "rev-list", "--objects", head, "--not", f"--exclude=origin/{self.branch}",
            "--exclude=origin/HEAD", "--remotes=origin", "--tags",
        ).stdout.decode()  # fmt: skip
        return sum(self._sizes(line.split(" ", 1)[0] for line in out.splitlines() if line).values())

    def _sizes(self, oids: Iterable[str]) -> dict[str, int]:
        """The size of each blob among `oids` (other objects are left out)."""
        unique = sorted(set(oids))
        if not unique:
            return {}
        out = self._git(
            "cat-file", "--batch-check=%(objectname) %(objecttype) %(objectsize)",
            stdin="\n".join(unique).encode() + b"\n",
        ).stdout.decode()  # fmt: skip
        sizes = {}
        for line in out.splitlines():
            fields = line.split()
            if len(fields) == 3 and fields[1] == "blob":
                sizes[fields[0]] = int(fields[2])
        return sizes

    def _empty_tree(self) -> str:
        return self._git("hash-object", "-t", "tree", "--stdin", stdin=b"").stdout.decode().strip()

    def _tell(self, left: list[LeftOut]) -> None:
        """Record what this save left out; a note for each file the model has not been told
        about for that limit (once per file: a file saved or gone since may be told again)."""
        self.left_out = tuple(left)
        now = {item.path: item for item in left}
        self._told = {path: limit for path, limit in self._told.items() if path in now}
        for item in left:
            if self._told.get(item.path) != item.limit:
                self._told[item.path] = item.limit
                self._notes.append(self._note(item))

    def _note(self, item: LeftOut) -> str:
        limits = self.limits
        lost = "It will be lost if the run moves to another worker."
        what = f"{item.path} ({size_text(item.size)})"
        if item.limit == "file":
            assert limits.per_file is not None
            return (
                f"{what} was not saved to the run's workspace: files over "
                f"{size_text(limits.per_file)} are not kept ({MAX_FILE_ENV}); delete it or make "
                f"it smaller. {lost}"
            )
        if item.limit == "round":
            assert limits.per_round is not None
            return (
                f"{what} was not saved with this tool round: one round may add at most "
                f"{size_text(limits.per_round)} ({MAX_ROUND_ENV}) and this one added more. It is "
                f"saved with a later round that has room for it; until then {lost[0].lower()}"
                f"{lost[1:]}"
            )
        assert limits.per_run is not None
        return (
            f"{what} was not saved to the run's workspace: a run may add at most "
            f"{size_text(limits.per_run)} to it ({MAX_RUN_ENV}) and this run had added "
            f"{size_text(self.run_added)} before this round; delete it or make it smaller. {lost}"
        )

    def take_notes(self) -> list[str]:
        """What the model should be told since the last call: files left out for a limit (once
        per file), commits undone. The worker queues them for the next model request."""
        notes, self._notes = self._notes, []
        return notes

    def _push(self, head: str) -> None:
        ref = f"refs/heads/{self.branch}"
        lease = f"--force-with-lease={ref}:{self._pushed or ''}"
        local = [f"--receive-pack={_REMOTE_SIDE} receive-pack"] if self._local_remote() else []
        result = git(
            [
                "--git-dir", str(self.path / ".git"), "push", "--porcelain", "--no-verify",
                "--no-recurse-submodules", lease, *local, "origin", f"{head}:{ref}",
            ],
            cwd=self.path, env=self._env, timeout=NETWORK_TIMEOUT, check=False,
        )  # fmt: skip
        if result.returncode == 0:  # also when an earlier push stored it and its answer was lost
            self._pushed = head
            return
        lines = result.stdout.decode("utf-8", "replace").splitlines()
        rejected = [ln for ln in lines if ln.startswith("!")]
        conflict = ("stale info", "fetch first", "non-fast-forward", "already exists")
        if any(word in ln for ln in rejected for word in conflict):
            raise WorkspaceConflict(
                f"another worker moved {self.branch} since this one last saved it; "
                "this worker no longer owns the run",
                hint="stop this run here: the worker that moved the branch carries it on",
            )
        reason = rejected[0].split("\t")[-1] if rejected else _first_line(result.stderr)
        raise WorkspaceError(
            f"git push of {self.branch} failed: {reason}",
            hint=_git_hint("push"),
        )

    @property
    def pushed(self) -> str | None:
        """The commit the run branch holds as far as this workspace knows (after `prepare`: the
        one it resumed from; after each `save`: the one it pushed, or the same as before when
        nothing changed). A worker journals it after each save, for `resume_note`."""
        return self._pushed

    def resume_note(self, last_saved: str | None, rounds_since: int) -> str | None:
        """What to tell the model on resume when file edits were lost: `last_saved` is the last
        `pushed` the journal recorded, `rounds_since` how many tool rounds the journal holds
        after that record. Edits were lost when rounds ran since and the run branch holds no
        later save (a branch ahead of the journal means the round in flight was saved and only
        its record was lost). None when nothing was lost or this is not a git workspace."""
        if self.spec.kind != "git" or rounds_since <= 0 or self.resumed_from != last_saved:
            return None
        have = self.resumed_from[:12] if self.resumed_from else f"the start of {self.spec.text()}"
        rounds = "tool round" if rounds_since == 1 else f"{rounds_since} tool rounds"
        return (
            f"This run moved to another worker. Its files were restored from {self.branch} at "
            f"{have}: file changes made by the last {rounds} before the move were lost. "
            "Check the files again before relying on those changes."
        )

    def cleanup(self) -> None:
        """Remove the private directory (a clone or the scratch dir); a path workspace stays."""
        if self._private is not None:
            _remove(self._private)

    def describe(self) -> str:
        """One line for `keel runs show`."""
        if self.spec.kind == "path":
            return f"path {self.path} (shared, used in place)"
        if self.spec.kind == "none":
            return f"none (private scratch directory {self.path}, not kept)"
        ref = self.spec.ref or "the remote's HEAD"
        line = f"git {_redact(self.spec.url)} at {ref}, saved to {self.branch}"
        if self.resumed_from:
            line += f" (resumed from {self.resumed_from[:12]})"
        return line
