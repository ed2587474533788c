"""The bash sandbox: bubblewrap on Linux, Seatbelt (`sandbox-exec`) on macOS, none elsewhere (bash
then asks). It owns the sandbox policy (`SandboxPolicy`: what is writable, what is protected,
network, which environment variables get in), the two things generated from that one policy (the
bubblewrap argv, `bwrap_argv`, and the Seatbelt profile, `seatbelt_profile`, so they cannot
drift), and the placeholders that hold protected paths which do not exist yet (bubblewrap only:
a Seatbelt rule names a path whether or not it exists).

Inside: `/` read-only; the project (git root), a private temp dir (`$TMPDIR`) and existing build
caches read-write; `/tmp`, `/run` and `/dev` private (so no host unix socket is reachable: docker,
ssh-agent, X11, tmux, databases) and `/tmp` read-only apart from `$TMPDIR`; a user namespace with
every capability dropped and no nested user namespaces, so nothing can mount, unmount or remount
(as root too); its own pid namespace and session; no network unless allowed; killed with keel.

Credential stores (`DEFAULT_HIDDEN` in the home directory, the stores environment variables such
as `KUBECONFIG` point at, keel's MCP sign-ins; `sandbox.hide` adds, the user's `sandbox.unhide`
takes out) are hidden: each that exists, its links resolved, becomes an empty read-only
directory or an empty file (/dev/null). One that is missing, dangling or unreachable needs
nothing and is skipped without a word; none stops a command.

The protected set (`PROTECTED`: `.keel`, `.claude`, `.git` apart from what `git add`/`commit`
need, `.mcp.json`, `.vscode`, `.idea`, `.envrc`, shell rc files; plus a `core.hooksPath` inside
the project) is re-bound read-only whether or not each path exists: a missing one is held by an
empty placeholder created on the host for the command and removed afterwards when still empty.
A mount point cannot be renamed or removed (EBUSY), and the directories between the root and a
protected path are bound onto themselves, so nothing can be moved away and replaced. Project
configuration below the root (`keel.config.intake.CONFIG_DIRS`, `CONFIG_FILES`: `sub/.keel`,
`a/b/.mcp.json`) is protected the same way when it already exists, as far as a bounded walk
(`existing_config`: 5,000 directories or 50 ms, no dependencies, virtualenvs, build output or
caches) finds it. Known limit: configuration missing below the root is not held, so a command
can create `sub/.keel/settings.json`; the project intake (`keel.config.intake`) treats what it
finds there as having come with the project, and the write tools refuse it at any depth. Listening
host unix sockets elsewhere get /dev/null bound over them. The environment is filtered by an
allow list with deny patterns on top. A probe runs `echo ok` in it once per process: if
bubblewrap is missing or cannot start here, keel says so once and bash falls back to asking.

On macOS the same policy becomes a Seatbelt profile (`(deny default)`, reads allowed but for the
hidden paths, writes only to the project, `$TMPDIR` and caches, protected paths and the
directories on the way to them denied after those allows, no network unless allowed and never
host unix sockets) run as `/usr/bin/sandbox-exec -p PROFILE`. It cannot run on the Linux machines
keel is tested on: the profile text is checked against the policy by golden tests
(tests/test_seatbelt.py), and the probe runs the real profile once, so a profile macOS rejects
means "no sandbox" (bash asks), never an unsandboxed command.

This module must never widen what a command may do beyond the policy, and never leave a
placeholder behind that it did not record.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import hashlib
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import field
from fnmatch import fnmatchcase
from pathlib import Path

from keel.config.intake import CONFIG_DIRS, CONFIG_FILES
from keel.frozen import frozen, mutable
from keel.permissions.boundary import GIT_PROTECTED, PROTECTED

#: Variables a sandboxed command sees (case-insensitive fnmatch patterns): what programs need
#: to run and build, nothing that names a secret. Anything else is left out.
DEFAULT_ENV_ALLOW: tuple[str, ...] = (
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM", "TZ", "LANG", "LANGUAGE", "LC_*",
    "PWD", "TMPDIR", "TMP", "TEMP", "KEEL_SANDBOX", "NO_COLOR", "FORCE_COLOR", "CLICOLOR",
    "PAGER", "GIT_PAGER", "EDITOR", "VISUAL", "COLUMNS", "LINES",
    "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME",
    "GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL",
    "VIRTUAL_ENV", "CONDA_PREFIX", "CONDA_DEFAULT_ENV", "PYTHONPATH", "PYTHONHOME",
    "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED", "PYTHONIOENCODING", "PYTHONUTF8",
    "PIP_CACHE_DIR", "UV_CACHE_DIR", "UV_PYTHON",
    "CARGO_HOME", "RUSTUP_HOME", "RUSTUP_TOOLCHAIN", "RUSTFLAGS", "RUST_BACKTRACE", "RUST_LOG",
    "GOPATH", "GOROOT", "GOFLAGS", "GOCACHE", "GOMODCACHE", "GOOS", "GOARCH", "CGO_ENABLED",
    "GO111MODULE", "GOTOOLCHAIN", "JAVA_HOME", "GRADLE_USER_HOME", "MAVEN_OPTS",
    "NODE_ENV", "NODE_PATH", "NVM_DIR", "NVM_BIN", "PNPM_HOME", "NPM_CONFIG_CACHE",
    "YARN_CACHE_FOLDER", "BUN_INSTALL", "DENO_DIR",
    "CC", "CXX", "CFLAGS", "CXXFLAGS", "CPPFLAGS", "LDFLAGS", "PKG_CONFIG_PATH",
    "LD_LIBRARY_PATH", "LIBRARY_PATH", "CPATH", "MAKEFLAGS", "CMAKE_GENERATOR",
    "CMAKE_PREFIX_PATH", "CI",
    "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY",
)  # fmt: skip

#: Variables never passed in, even when an allow pattern matches (case-insensitive): secrets by
#: name, cloud credentials, and addresses of host services (agent sockets, displays, buses).
DEFAULT_ENV_DENY: tuple[str, ...] = (
    "*TOKEN*", "*SECRET*", "*PASSWORD*", "*PASSWD*", "*_PASS", "*_KEY", "*_KEY_*", "*APIKEY*",
    "*CREDENTIAL*", "*_AUTH", "*COOKIE*", "DATABASE_URL", "*_DATABASE_URL", "*_DSN",
    "AWS_*", "AZURE_*", "GOOGLE_APPLICATION_CREDENTIALS", "CLOUDSDK_*", "KUBECONFIG",
    "SSH_AUTH_SOCK", "SSH_AGENT_PID", "GPG_AGENT_INFO", "DOCKER_HOST", "DBUS_SESSION_BUS_ADDRESS",
    "DISPLAY", "WAYLAND_DISPLAY", "XAUTHORITY", "XDG_RUNTIME_DIR",
)  # fmt: skip

#: A value that carries a password in a URL (`https://user:secret@host`) never gets in.
_URL_WITH_PASSWORD = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/\s@:]*:[^/\s@]+@")

#: Credential stores in the home directory (relative to it), hidden from sandboxed commands: a
#: directory becomes an empty read-only one, a file an empty one. `sandbox.unhide` in the user's
#: settings takes entries out, `sandbox.hide` adds. Not hidden: `~/.config/pip` (pip.conf seldom
#: holds a secret, and without it pip quietly falls back to the public index).
DEFAULT_HIDDEN: tuple[str, ...] = (
    # keys, agents, keyrings
    ".ssh", ".gnupg", ".password-store", ".local/share/keyrings",
    # cloud
    ".aws", ".azure", ".config/gcloud", ".oci", ".config/doctl", ".config/hcloud", ".s3cfg",
    ".boto", ".config/rclone", ".databrickscfg", ".pulumi/credentials.json", ".fly/config.yml",
    # containers and clusters
    ".docker", ".kube", ".config/containers/auth.json",
    # git, forges, netrc
    ".git-credentials", ".config/git/credentials", ".config/gh", ".config/glab-cli",
    ".config/hub", ".netrc", ".authinfo", ".authinfo.gpg",
    # package registries
    ".npmrc", ".yarnrc.yml", ".pypirc", ".gem/credentials", ".cargo/credentials",
    ".cargo/credentials.toml", ".m2/settings.xml", ".m2/settings-security.xml",
    ".gradle/gradle.properties", ".nuget/NuGet/NuGet.Config", ".config/NuGet/NuGet.Config",
    ".composer/auth.json", ".config/composer/auth.json",
    # infrastructure, databases
    ".terraform.d/credentials.tfrc.json", ".vault-token", ".pgpass", ".my.cnf", ".mylogin.cnf",
    # tokens of coding agents and model hubs (keel's own MCP sign-ins: `_keel_credentials`)
    ".claude/.credentials.json", ".codex/auth.json", ".gemini/oauth_creds.json",
    ".config/github-copilot", ".cache/huggingface/token", ".huggingface/token",
)  # fmt: skip

#: Environment variables that move a credential store out of its default place, with what to
#: hide inside the path each names ("": the path itself; `KUBECONFIG` may list several).
_HIDDEN_FROM_ENV: dict[str, tuple[str, ...]] = {
    "AWS_SHARED_CREDENTIALS_FILE": ("",), "AWS_CONFIG_FILE": ("",), "AZURE_CONFIG_DIR": ("",),
    "CLOUDSDK_CONFIG": ("",), "GOOGLE_APPLICATION_CREDENTIALS": ("",), "KUBECONFIG": ("",),
    "DOCKER_CONFIG": ("",), "GH_CONFIG_DIR": ("",), "GNUPGHOME": ("",),
    "PASSWORD_STORE_DIR": ("",), "NETRC": ("",), "NPM_CONFIG_USERCONFIG": ("",),
    "CARGO_HOME": ("credentials", "credentials.toml"), "GRADLE_USER_HOME": ("gradle.properties",),
    "CLAUDE_CONFIG_DIR": (".credentials.json",), "CODEX_HOME": ("auth.json",), "HF_HOME": ("token",),
}  # fmt: skip

#: Placeholder files (relative to the project root) and their content, for protected paths that
#: a program reads as a file when present; every other placeholder is an empty directory (git
#: shows no empty directory, and neither can be written inside the sandbox). `commondir` holding
#: `.` means what its absence means (the git dir is its own common dir).
_FILE_PLACEHOLDERS: dict[str, bytes] = {".git/commondir": b".\n", ".git/config.worktree": b""}

#: Host paths that are replaced by a private tmpfs inside the sandbox.
_PRIVATE_DIRS = ("/tmp", "/run", "/var/run")


class SandboxError(RuntimeError):
    """The sandbox cannot run this command safely; the message says why, for the model."""


def _matches(name: str, patterns: tuple[str, ...]) -> bool:
    upper = name.upper()
    return any(fnmatchcase(upper, p.upper()) for p in patterns)


@frozen
class SandboxPolicy:
    """Everything a sandboxed command may and may not do, independent of the mechanism: the
    bubblewrap argv is generated from it (`bwrap_argv`), and so can a Seatbelt profile be."""

    #: The project (git root); writable apart from `protected`.
    root: Path
    #: Read-write besides the project: the private temp dir, build caches.
    writable: tuple[Path, ...] = ()
    #: Read-only even inside writable paths, whether or not they exist (absolute).
    protected: tuple[Path, ...] = ()
    #: Writable although inside a protected path (`.git` itself, for git's own files).
    writable_inside_protected: tuple[Path, ...] = ()
    #: Hidden (absolute, existing, links resolved: `hidden_targets`): a directory becomes an
    #: empty read-only one, anything else an empty file.
    hidden: tuple[Path, ...] = ()
    #: Host unix sockets outside the project (listening ones, from /proc/net/unix): /dev/null
    #: is bound over each, because a read-only mount does not stop a connect().
    hidden_sockets: tuple[Path, ...] = ()
    network: bool = False
    env_allow: tuple[str, ...] = DEFAULT_ENV_ALLOW
    env_deny: tuple[str, ...] = DEFAULT_ENV_DENY
    #: Read-only inside the private directories: the programs a command needs that live there
    #: (a Python or a virtualenv under /tmp, PATH entries), so a private /tmp hides only data.
    readable: tuple[Path, ...] = ()

    def env(self, env: Mapping[str, str]) -> dict[str, str]:
        return filter_env(env, allow=self.env_allow, deny=self.env_deny)


def filter_env(
    env: Mapping[str, str],
    *,
    allow: tuple[str, ...] = DEFAULT_ENV_ALLOW,
    deny: tuple[str, ...] = DEFAULT_ENV_DENY,
) -> dict[str, str]:
    """`env` filtered: allowed names, minus denied names and values with a URL password."""
    return {
        k: v
        for k, v in env.items()
        if _matches(k, allow) and not _matches(k, deny) and not _URL_WITH_PASSWORD.search(v)
    }


def project_policy(
    root: Path,
    *,
    network: bool = False,
    writable: tuple[Path, ...] = (),
    hidden: tuple[Path, ...] | None = None,
    hide: tuple[Path, ...] = (),
    unhide: tuple[Path, ...] = (),
    env_allow: tuple[str, ...] = DEFAULT_ENV_ALLOW,
    env_deny: tuple[str, ...] = DEFAULT_ENV_DENY,
    config_walk: ConfigWalk | None = None,
) -> SandboxPolicy:
    """The policy for a project as it is now (what `.git` is decides what is protected in it;
    the configuration already below the root is protected too). `hidden` None: the credential
    stores of `hidden_candidates` (less `unhide`), else exactly `hidden`; `hide` adds to both."""
    root = root.resolve()
    protected: list[Path] = []
    inside: list[Path] = []
    git = root / ".git"
    for rel in PROTECTED:
        if rel != ".git" and not rel.startswith(".git/"):
            protected.append(root / rel)
    # `.git` as a whole is protected; when it is a directory git's own files inside stay
    # writable (objects, refs, index, HEAD, logs...) but what can make git run code does not.
    protected.append(git)
    if git.is_dir() and not git.is_symlink():
        inside.append(git)
        protected += [git / rel for rel in GIT_PROTECTED]
    if git.exists() and (hooks := hooks_path(root)) is not None:
        protected.append(hooks)
    held = tuple(protected)
    protected += [
        p for p in existing_config(root, config_walk) if not any(_within(p, q) for q in held)
    ]
    named = hidden_candidates(hide=hide, unhide=unhide) if hidden is None else (*hidden, *hide)
    hidden_paths = hidden_targets(named, root)
    return SandboxPolicy(
        readable=runtime_in_private_dirs(),
        hidden_sockets=host_sockets(keep=(root, *hidden_paths)),
        root=root,
        writable=writable,
        protected=tuple(protected),
        writable_inside_protected=tuple(inside),
        hidden=hidden_paths,
        network=network,
        env_allow=env_allow,
        env_deny=env_deny,
    )


def hidden_candidates(
    *,
    hide: tuple[Path, ...] = (),
    unhide: tuple[Path, ...] = (),
    env: Mapping[str, str] | None = None,
) -> tuple[Path, ...]:
    """The credential stores sandboxed commands do not see, as named (existing or not, links not
    resolved): `DEFAULT_HIDDEN` under the home directory (and under `$XDG_CONFIG_HOME` and
    `$XDG_DATA_HOME` where those move `.config` and `.local/share`), the stores environment
    variables point at, keel's own MCP sign-ins; less what `unhide` names or holds; plus `hide`
    (absolute paths, `~` expanded by the caller)."""
    env = os.environ if env is None else env
    home = Path(env["HOME"]) if env.get("HOME") else Path.home()
    defaults = [home / rel for rel in DEFAULT_HIDDEN]
    for var, prefix in (("XDG_CONFIG_HOME", ".config/"), ("XDG_DATA_HOME", ".local/share/")):
        moved = Path(env.get(var) or ".")
        if moved.is_absolute() and moved != home / prefix:
            moved_rels = [r.removeprefix(prefix) for r in DEFAULT_HIDDEN if r.startswith(prefix)]
            defaults += [moved / rel for rel in moved_rels]
    for var, inside in _HIDDEN_FROM_ENV.items():
        for value in env.get(var, "").split(os.pathsep):
            base = Path(value)
            if base.is_absolute():
                defaults += [base / rel if rel else base for rel in inside]
    defaults += _keel_credentials(env)
    gone = [Path(os.path.normpath(u)) for u in unhide]
    kept = [p for p in defaults if not any(p == u or p.is_relative_to(u) for u in gone)]
    return tuple(dict.fromkeys([*kept, *hide]))


def _keel_credentials(env: Mapping[str, str]) -> list[Path]:
    """Where keel keeps its own secrets: the MCP servers' OAuth tokens (`keel.mcp.oauth`)."""
    from keel.session.store import keel_home  # lazy: the sandbox needs only the path

    return [keel_home(env) / "mcp-auth"]


def hidden_targets(paths: tuple[Path, ...], root: Path) -> tuple[Path, ...]:
    """What of `paths` to hide around the project at `root`: each existing one with its links
    resolved (reading through a link reaches the target, so the target is what is hidden).
    Skipped, silently: a path that is missing, dangling or out of this user's reach (a command,
    with fewer rights, cannot read it either), one that holds the project or a private
    directory (hiding it would hide the work), and one inside another hidden directory."""
    keep = (root.resolve(), *(Path(p).resolve() for p in _PRIVATE_DIRS))
    found: dict[Path, bool] = {}
    for path in paths:
        try:
            target = Path(os.path.realpath(path))
            is_dir = stat.S_ISDIR(target.stat().st_mode)
        except (OSError, ValueError):  # ValueError: a NUL in the path
            continue
        if not any(_within(k, target) for k in keep):
            found[target] = is_dir
    dirs = [p for p, is_dir in found.items() if is_dir]
    return tuple(p for p in found if not any(p != d and _within(p, d) for d in dirs))


def _within(path: Path, base: Path) -> bool:
    """`path.is_relative_to(base)` for absolute, normalised paths, without pathlib's cost (it
    runs for every pair of paths on every command)."""
    text, prefix = str(path), str(base)
    return text == prefix or text.startswith(prefix if prefix.endswith("/") else prefix + "/")


#: Directories the walk for project configuration below the root does not enter: version
#: control, dependencies, virtual environments, build output (and hidden caches: `_skip_walk`).
_WALK_SKIP = frozenset(
    {
        ".git", ".hg", ".svn", "node_modules", ".venv", "venv", "__pycache__", ".tox", ".nox",
        "target", "dist", "build", ".eggs", ".direnv", ".terraform", ".next", ".gradle",
    }
)  # fmt: skip
#: The walk's bounds: what it found by then is protected (every command's start waits for it).
_WALK_MAX_DIRS = 5000
_WALK_SECONDS = 0.05
#: A listing is remembered only when its directory's mtime is older than this (nanoseconds): a
#: file system with a coarse clock could change a directory again within the same tick.
_WALK_RACY_NS = 2_000_000_000


@mutable
class ConfigWalk:
    """What `existing_config` listed, kept between commands (one per `Sandbox`): a directory is
    listed again only when its mtime changed (an entry was added, removed or renamed in it), so
    a repeated walk costs a `stat` per directory."""

    #: Per directory: its mtime, its subdirectories to walk, its configuration entries (with
    #: whether each is a link, resolved on every walk).
    listings: dict[str, tuple[int, list[str], list[tuple[str, bool]]]] = field(default_factory=dict)

    def listing(self, path: str) -> tuple[list[str], list[tuple[str, bool]]] | None:
        try:
            mtime = os.stat(path, follow_symlinks=False).st_mtime_ns
        except OSError:
            return None
        known = self.listings.get(path)
        if known is not None and known[0] == mtime:
            return known[1], known[2]
        listed_at = time.time_ns()
        subdirs: list[str] = []
        config: list[tuple[str, bool]] = []
        try:
            with os.scandir(path) as entries:
                for entry in entries:
                    with contextlib.suppress(OSError):
                        if entry.name in CONFIG_DIRS or entry.name in CONFIG_FILES:
                            config.append((entry.path, entry.is_symlink()))
                        elif entry.is_dir(follow_symlinks=False) and not _skip_walk(entry.name):
                            subdirs.append(entry.path)
        except OSError:
            return None
        if listed_at - mtime > _WALK_RACY_NS:
            self.listings[path] = (mtime, subdirs, config)
        return subdirs, config


def existing_config(root: Path, walk: ConfigWalk | None = None) -> tuple[Path, ...]:
    """Project configuration (`CONFIG_DIRS`, `CONFIG_FILES`) that exists below `root` now, found
    breadth-first without entering `_WALK_SKIP`, hidden caches or the configuration itself, and
    given up after `_WALK_MAX_DIRS` directories or `_WALK_SECONDS` (`walk` remembers listings
    from the last time). A link counts by its target when that lies inside the project (a link
    itself cannot be held in place)."""
    walk = ConfigWalk() if walk is None else walk
    deadline = time.monotonic() + _WALK_SECONDS
    found: list[Path] = []
    queue: deque[str] = deque([str(root)])
    visited: set[str] = set()
    while queue and len(visited) < _WALK_MAX_DIRS and time.monotonic() < deadline:
        path = queue.popleft()
        visited.add(path)
        if (listing := walk.listing(path)) is None:
            continue
        subdirs, config = listing
        queue.extend(subdirs)
        for entry, is_link in config:
            with contextlib.suppress(OSError):
                found += _link_target(Path(entry), root) if is_link else [Path(entry)]
    if not queue:  # a whole walk: directories gone since are forgotten
        for gone in walk.listings.keys() - visited:
            del walk.listings[gone]
    return tuple(found)


def _link_target(link: Path, root: Path) -> list[Path]:
    target = Path(os.path.realpath(link))
    inside = target != root and target.is_relative_to(root)
    return [target] if inside and target.exists() else []


def _skip_walk(name: str) -> bool:
    return name in _WALK_SKIP or (name.startswith(".") and "cache" in name.lower())


def runtime_in_private_dirs() -> tuple[Path, ...]:
    """The directories of this Python, its environment and `PATH` that lie inside a directory the
    sandbox makes private (`/tmp`, `/run`): bound back read-only so the commands they hold still
    run (a checkout and its virtualenv under /tmp, as CI machines have)."""
    private = tuple(Path(p).resolve() for p in _PRIVATE_DIRS)
    candidates = [Path(sys.prefix), Path(sys.base_prefix), Path(sys.executable).parent]
    candidates += [Path(p) for p in os.environ.get("PATH", "").split(os.pathsep) if p]
    found: dict[Path, None] = {}
    for path in candidates:
        with contextlib.suppress(OSError):
            path = path.resolve()
            if path.is_dir() and any(path.is_relative_to(p) and path != p for p in private):
                found[path] = None
    return tuple(found)


def hooks_path(root: Path) -> Path | None:
    """The project directory that holds git's hooks when `core.hooksPath` (in any config) points
    into the project, such as husky's `.husky/_`, whose scripts run what is in `.husky/`: then
    `.husky` as a whole. None when hooks live in `.git/hooks` or outside the project."""
    git = shutil.which("git")
    if git is None:
        return None
    try:
        done = subprocess.run(
            [git, "-C", str(root), "config", "--type=path", "--get", "core.hooksPath"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    value = done.stdout.strip()
    if done.returncode != 0 or not value:
        return None
    path = Path(os.path.normpath(root / value))  # relative: to the top of the work tree
    if not path.is_relative_to(root):
        return None
    if path.name == "_" and path.parent != root:
        path = path.parent
    if path == root:
        raise SandboxError(
            "core.hooksPath is the project root, so any file there could become a git hook; "
            "keel cannot protect that (point core.hooksPath at a directory)"
        )
    return path


def host_sockets(*, keep: tuple[Path, ...] = ()) -> tuple[Path, ...]:
    """Listening unix sockets with a path on this host (this network namespace), apart from
    those under `keep` (the project; hidden directories) or in the private directories."""
    try:
        lines = Path("/proc/net/unix").read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ()
    skip = (*keep, *(Path(p).resolve() for p in _PRIVATE_DIRS))
    found: dict[Path, None] = {}
    for line in lines[1:]:
        parts = line.split(maxsplit=7)
        if len(parts) < 8 or not parts[7].startswith("/"):
            continue
        path = Path(parts[7])
        if path in found or any(path.is_relative_to(k) for k in skip):
            continue
        with contextlib.suppress(OSError):
            if stat.S_ISSOCK(path.lstat().st_mode):
                found[path] = None
    return tuple(found)


def bwrap_argv(
    policy: SandboxPolicy, command: list[str], cwd: Path, *, bwrap: str, userns: bool = True
) -> list[str]:
    """`command` under bubblewrap as `policy` says. Every protected path must exist by now
    (`Placeholders.hold` makes sure). `userns` false leaves out the user namespace (for a
    bubblewrap or kernel without it); capabilities are dropped either way."""
    root = policy.root
    _check_root(root)
    args = [bwrap, "--die-with-parent", "--new-session"]
    if userns:
        args += ["--unshare-user", "--disable-userns"]
    args += ["--cap-drop", "ALL", "--unshare-pid", "--unshare-ipc", "--unshare-uts"]
    if not policy.network:
        args.append("--unshare-net")
    args += ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    private = [p for p in _PRIVATE_DIRS if Path(p).is_dir() and not Path(p).is_symlink()]
    args += _private_dirs(policy, private)
    # The directories between the project and a protected path are bound onto themselves:
    # still writable, but a mount point cannot be renamed, so none can be moved away with
    # the protected path in it and replaced (`mv .git .git-old && mkdir .git`).
    # Shallowest first: a bind is recursive from the host's tree, so binding `a` after `a/b`
    # would cover the `a/b` bind.
    pinned = dict.fromkeys(a for path in policy.protected for a in _between(root, path))
    pinned.update(dict.fromkeys(policy.writable_inside_protected))
    for writable in (root, *policy.writable, *sorted(pinned, key=lambda p: len(p.parts))):
        if writable.exists():
            args += ["--bind", str(writable), str(writable)]
    for sock in policy.hidden_sockets:
        args += ["--ro-bind", "/dev/null", str(sock)]
    for path in policy.protected:
        if path not in policy.writable_inside_protected and _must_bind(path):
            args += ["--ro-bind", str(path), str(path)]
    # Last, so that no bind of a project, cache or protected path brings a hidden one back.
    for hidden in policy.hidden:
        args += _hide(hidden)
    for tmpfs in private:
        args += ["--remount-ro", tmpfs]
    args += ["--chdir", str(cwd), "--", *command]
    return args


def _hide(path: Path) -> list[str]:
    """bubblewrap's arguments that hide `path`: an empty read-only tmpfs over a directory,
    /dev/null over anything else; nothing when it is gone or became a link since the policy
    was made (then there is nothing to read, or the link's target is hidden itself)."""
    try:
        mode = path.lstat().st_mode
    except OSError:
        return []
    if stat.S_ISDIR(mode):
        return ["--tmpfs", str(path), "--remount-ro", str(path)]
    if stat.S_ISLNK(mode):
        return []
    return ["--ro-bind", "/dev/null", str(path)]


def _private_dirs(policy: SandboxPolicy, private: list[str]) -> list[str]:
    """A tmpfs over each private directory, with what must stay visible bound back read-only."""
    args: list[str] = []
    for tmpfs in private:
        args += ["--tmpfs", tmpfs]
    for readable in policy.readable:
        args += ["--ro-bind", str(readable), str(readable)]
    if policy.network:
        # DNS still works when resolv.conf lives in the now private /run.
        resolv = Path("/etc/resolv.conf").resolve()
        if resolv.is_file() and any(resolv.is_relative_to(p) for p in private):
            args += ["--ro-bind", str(resolv), str(resolv)]
    return args


def _check_root(root: Path) -> None:
    for shared in ("/", *_PRIVATE_DIRS):
        if Path(shared).resolve().is_relative_to(root):
            raise SandboxError(
                f"the project root {root} contains {shared}; keel cannot sandbox a project "
                "that holds the system's shared directories (start keel in the project)"
            )


def _must_bind(path: Path) -> bool:
    """Whether protected `path` is there to be bound read-only; refuses what cannot be held."""
    if path.is_symlink():
        raise SandboxError(
            f"{path} is a symbolic link; keel protects it and cannot hold a link in place "
            "(replace it with the real file or directory)"
        )
    if path.exists():
        return True
    if path.parent.is_dir() and not os.access(path.parent, os.W_OK):
        return False  # it cannot be created in there, inside the sandbox either
    raise SandboxError(
        f"{path} is protected but cannot be held in place (is {path.parent} a file or a link?)"
    )


def _between(root: Path, path: Path) -> list[Path]:
    """The directories strictly between `root` and `path`, nearest to `path` first."""
    if not _within(path, root):
        return []
    parts = path.parts[len(root.parts) :]
    return [root.joinpath(*parts[:n]) for n in range(len(parts) - 1, 0, -1)]


#: Where macOS keeps `sandbox-exec` (an absolute path: never looked up on PATH).
SANDBOX_EXEC = "/usr/bin/sandbox-exec"

#: The fixed part of every Seatbelt profile: deny everything, then what any program needs to run
#: (processes, signals and process info within the sandbox, sysctl reads, semaphores, ptys, the
#: few system services that user lookups, temp dirs and logging go through). No service that
#: starts programs outside the sandbox (LaunchServices, Apple events) is reachable.
_SEATBELT_BASE = """(version 1)
(deny default)
(allow process-exec)
(allow process-fork)
(allow signal (target same-sandbox))
(allow process-info* (target same-sandbox))
(allow sysctl-read)
(allow user-preference-read)
(allow ipc-posix-sem)
(allow pseudo-tty)
; host_processor_info(), for programs that count CPUs (Node's os.cpus())
(allow mach-host*)
(allow iokit-open (iokit-registry-entry-class "RootDomainUserClient"))
(allow mach-lookup
  (global-name "com.apple.system.opendirectoryd.libinfo")
  (global-name "com.apple.system.opendirectoryd.membership")
  (global-name "com.apple.bsd.dirhelper")
  (global-name "com.apple.system.notification_center")
  (global-name "com.apple.system.logger")
  (global-name "com.apple.logd")
  (global-name "com.apple.PowerManagement.control"))
(allow file-ioctl (literal "/dev/ptmx") (literal "/dev/tty") (regex #"^/dev/ttys[0-9]+$"))
"""

#: Devices a command may write, as in bubblewrap's private /dev.
_SEATBELT_DEVICES = (
    '(literal "/dev/null")',
    '(literal "/dev/zero")',
    '(literal "/dev/tty")',
    '(literal "/dev/ptmx")',
    '(literal "/dev/dtracehelper")',
    '(regex #"^/dev/ttys[0-9]+$")',
    '(regex #"^/dev/fd/[0-9]+$")',
)

#: With network allowed: IP sockets, and the services name resolution and TLS checks use. Unix
#: sockets stay unreachable (bubblewrap's private /tmp and /run and masked sockets) apart from
#: the resolver's.
_SEATBELT_NETWORK = """(allow network-outbound (remote ip "*:*"))
(allow network-outbound (literal "/private/var/run/mDNSResponder"))
(allow network-inbound (local ip "*:*"))
(allow network-bind (local ip "*:*"))
(allow system-socket)
(allow mach-lookup
  (global-name "com.apple.SystemConfiguration.DNSConfiguration")
  (global-name "com.apple.SystemConfiguration.configd")
  (global-name "com.apple.trustd.agent")
  (global-name "com.apple.ocspd")
  (global-name "com.apple.networkd"))
"""


def _sbpl(path: Path) -> str:
    """`path` as an SBPL string literal; a path with control characters is refused."""
    text = str(path)
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in text):
        raise SandboxError(f"{text!r} holds a control character; keel cannot sandbox it")
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _real(path: Path) -> Path:
    """What Seatbelt sees: the path with symbolic links resolved (`/tmp` is `/private/tmp` and
    `/var` is `/private/var` on macOS), whether or not it exists."""
    return Path(os.path.realpath(path))


def seatbelt_profile(policy: SandboxPolicy) -> str:
    """The Seatbelt (SBPL) profile for `policy`: the same policy as `bwrap_argv`'s. Later rules
    win in SBPL, so each deny comes after the allows it narrows."""
    root = _real(policy.root)
    _check_root(root)
    for path in policy.protected:
        if path.is_symlink():  # Seatbelt matches the link's target, not the link: refused
            raise SandboxError(
                f"{path} is a symbolic link; keel protects it and cannot hold a link in place "
                "(replace it with the real file or directory)"
            )
    writable = [_real(p) for p in (policy.root, *policy.writable)]
    # The root and the directories on the way to a protected path cannot be renamed or removed
    # (bubblewrap binds them onto themselves): their own node is denied, their content is not.
    pinned = dict.fromkeys([root])
    pinned.update(dict.fromkeys(_real(a) for p in policy.protected for a in _between(root, p)))
    pinned.update(dict.fromkeys(_real(p) for p in policy.writable_inside_protected))
    inside = set(policy.writable_inside_protected)
    protected = [_real(p) for p in policy.protected if p not in inside]
    hidden = [_real(p) for p in policy.hidden]
    lines = [
        "; keel's sandbox profile, generated from its SandboxPolicy (keel.permissions.sandbox)",
        _SEATBELT_BASE.rstrip("\n"),
        "; reading: everything but the hidden directories (below)",
        "(allow file-read*)",
        "; writing: the project, the private temp dir and the build caches",
        "(allow file-write*",
        *(f"  {d}" for d in _SEATBELT_DEVICES),
        *(f"  (subpath {_sbpl(p)})" for p in writable),
        ")",
        "; pinned: cannot be renamed or removed, so nothing protected is moved away",
        "(deny file-write*",
        *(f"  (literal {_sbpl(p)})" for p in pinned),
        ")",
    ]
    if hidden:
        lines += [
            "; hidden: keys and sockets in the home directory",
            "(deny file-read* file-write*",
            *(f"  (subpath {_sbpl(p)})" for p in hidden),
            ")",
        ]
    if protected:
        lines += [
            "; protected: read-only whether or not they exist",
            "(deny file-write*",
            *(f"  (subpath {_sbpl(p)})" for p in protected),
            ")",
        ]
    if policy.network:
        lines += ["; network: allowed (sandbox.network)", _SEATBELT_NETWORK.rstrip("\n")]
    else:
        lines += ["; network: none (nothing above allows network*)"]
    return "\n".join(lines) + "\n"


def seatbelt_argv(policy: SandboxPolicy, command: list[str]) -> list[str]:
    """`command` under Seatbelt as `policy` says (the caller runs it in the working directory)."""
    return [SANDBOX_EXEC, "-p", seatbelt_profile(policy), *command]


def _lock_dir() -> Path:
    """A directory only this user can write, for the placeholder records."""
    path = Path(tempfile.gettempdir()) / f"keel-placeholders-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise SandboxError(f"{path} is not a private directory of this user; remove it and retry")
    return path


class Placeholders:
    """Empty placeholders that hold missing protected paths while sandboxed commands run.

    Every running command holds a shared lock on a file for its project (one file per project,
    in a private temp directory) that also records the placeholders created; the command that
    ends last (it gets the lock exclusively) removes those still empty. So a placeholder is
    never removed under a command that relies on it (in this process or another keel), and one
    left by a killed keel is removed by the next command that ends."""

    def __init__(self, root: Path) -> None:
        digest = hashlib.sha256(str(root).encode()).hexdigest()[:20]
        self.record = _lock_dir() / f"{digest}.lock"
        self._held: list[int] = []

    def hold(self, policy: SandboxPolicy) -> None:
        """Lock (shared) and create what is missing of `policy.protected`."""
        fd = os.open(self.record, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            for path in policy.protected:
                if path.exists() or path.is_symlink():
                    continue
                # Missing directories on the way are made too (and bound onto themselves).
                for parent in reversed(_between(policy.root, path)):
                    if not parent.exists() and not parent.is_symlink():
                        self._create(fd, parent, policy.root, directory=True)
                if path.parent.is_dir() and not path.parent.is_symlink():
                    self._create(fd, path, policy.root)
        except BaseException:
            os.close(fd)
            raise
        self._held.append(fd)

    def _create(self, fd: int, path: Path, root: Path, *, directory: bool = False) -> None:
        content = None if directory else _FILE_PLACEHOLDERS.get(path.relative_to(root).as_posix())
        # Recorded before it is made, so a kill in between leaves nothing unrecorded.
        os.write(fd, os.fsencode(str(path)) + b"\n")
        try:
            if content is None:
                path.mkdir(mode=0o700)
            else:
                with path.open("xb") as f:
                    f.write(content)
        except FileExistsError:
            return
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
                return  # a sandboxed command (same user, fewer rights) cannot create it either
            raise SandboxError(f"cannot hold protected path {path}: {exc.strerror}") from exc

    def release(self) -> None:
        """End one command's hold; the last one removes the placeholders still empty."""
        if not self._held:
            return
        os.close(self._held.pop())
        self.sweep()

    def sweep(self) -> None:
        """Remove the recorded placeholders still empty, unless a command holds them: run after
        each command, and when a sandbox is made (a keel killed mid-command left its own)."""
        try:
            fd = os.open(self.record, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return  # another command still runs; it cleans up when it ends
            recorded = os.read(fd, 1 << 20).decode(errors="surrogateescape").splitlines()
            for line in reversed(recorded):
                _remove_placeholder(Path(line))
            os.ftruncate(fd, 0)
        finally:
            os.close(fd)

    def release_all(self) -> None:
        while self._held:
            self.release()


def is_placeholder(path: Path, root: Path) -> bool:
    """Whether `path` is an empty directory a sandboxed command's hold made (recorded for the
    project at `root`): while a command runs, or after a stalled keel left it, the tree shows
    keel's placeholder, not the user's file. Reads the record without locking."""
    try:
        if not path.is_dir() or any(path.iterdir()):
            return False
        digest = hashlib.sha256(str(root).encode()).hexdigest()[:20]
        record = Path(tempfile.gettempdir()) / f"keel-placeholders-{os.getuid()}" / f"{digest}.lock"
        lines = record.read_bytes().splitlines()
    except OSError:
        return False
    return os.fsencode(str(path)) in lines


def _remove_placeholder(path: Path) -> None:
    """Remove `path` if it is still what keel made: an empty directory, or a placeholder file
    with its original content."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        return
    if stat.S_ISDIR(info.st_mode):
        with contextlib.suppress(OSError):  # not empty (the user put something in it): kept
            path.rmdir()
        return
    if stat.S_ISREG(info.st_mode):
        content = next(
            (c for r, c in _FILE_PLACEHOLDERS.items() if path.as_posix().endswith(r)), None
        )
        if content is not None and info.st_size == len(content):
            with contextlib.suppress(OSError):
                if path.read_bytes() == content:
                    path.unlink()


@functools.cache
def bwrap_path() -> str | None:
    if os.environ.get("KEEL_NO_SANDBOX"):
        return None
    return shutil.which("bwrap")


def build_caches() -> tuple[Path, ...]:
    """Build-tool caches a sandboxed build may write (pip, npm, cargo, go, uv…), when they exist.
    (They are shared with builds run outside the sandbox: a known, accepted gap.)"""
    home = Path.home()
    candidates = [
        home / ".cache",
        home / ".npm",
        home / ".cargo" / "registry",
        home / "go" / "pkg",
        home / ".gradle",
        home / ".m2",
    ]
    return tuple(p for p in candidates if p.is_dir())


@mutable
class Sandbox:
    root: Path
    network: bool = False
    extra_writable: tuple[Path, ...] = field(default_factory=build_caches)
    tmpdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="keel-sandbox-")))
    env_allow: tuple[str, ...] = DEFAULT_ENV_ALLOW
    env_deny: tuple[str, ...] = DEFAULT_ENV_DENY
    #: Variables passed in by name whatever the patterns say (`sandbox.env_passthrough`).
    env_passthrough: tuple[str, ...] = ()
    #: Credential stores hidden inside (None: `hidden_candidates`, less `unhide`).
    hidden: tuple[Path, ...] | None = None
    #: More paths hidden (`sandbox.hide`), and defaults shown (`sandbox.unhide`, the user's).
    hide: tuple[Path, ...] = ()
    unhide: tuple[Path, ...] = ()
    _placeholders: Placeholders | None = field(default=None, init=False, repr=False)
    _config_walk: ConfigWalk = field(default_factory=ConfigWalk, init=False, repr=False)

    def __post_init__(self) -> None:
        # A keel killed while a command ran left that command's placeholders (an empty `.git`
        # would make the project look like a repository): gone before anything reads the tree.
        with contextlib.suppress(SandboxError, OSError):
            Placeholders(self.root.resolve()).sweep()

    def policy(self) -> SandboxPolicy:
        return project_policy(
            self.root,
            network=self.network,
            writable=(self.tmpdir, *self.extra_writable),
            hidden=self.hidden,
            hide=self.hide,
            unhide=self.unhide,
            env_allow=self.env_allow,
            env_deny=self.env_deny,
            config_walk=self._config_walk,
        )

    def argv(self, command: list[str], cwd: Path) -> list[str]:
        """`command` wrapped in bubblewrap (Seatbelt on macOS). Placeholders are made for missing
        protected paths: call `release()` when the command has ended (or use `running()`)."""
        if sys.platform == "darwin":
            return seatbelt_argv(self.policy(), command)  # no placeholders: rules name paths
        bwrap = bwrap_path()
        if bwrap is None:
            raise SandboxError("bubblewrap is not available")
        policy = self.policy()
        if self._placeholders is None:
            self._placeholders = Placeholders(policy.root)
        self._placeholders.hold(policy)
        try:
            return bwrap_argv(policy, command, cwd, bwrap=bwrap, userns=_userns_works())
        except BaseException:
            self._placeholders.release()
            raise

    def release(self) -> None:
        """One command started with `argv()` has ended: placeholders no longer needed go."""
        if self._placeholders is not None:
            self._placeholders.release()

    @contextlib.contextmanager
    def running(self, command: list[str], cwd: Path) -> Iterator[list[str]]:
        """`argv()` for the duration of a `with` block, released at its end."""
        argv = self.argv(command, cwd)
        try:
            yield argv
        finally:
            self.release()

    def env(self, env: Mapping[str, str]) -> dict[str, str]:
        """The environment the sandboxed command gets: `env` filtered by the policy, plus the
        private temp dir."""
        tmp = str(self.tmpdir)
        out = filter_env(env, allow=self.env_allow, deny=self.env_deny)
        out.update((name, env[name]) for name in self.env_passthrough if name in env)
        return {**out, "TMPDIR": tmp, "TMP": tmp, "TEMP": tmp, "KEEL_SANDBOX": "1"}

    def cleanup(self) -> None:
        if self._placeholders is not None:
            self._placeholders.release_all()
        shutil.rmtree(self.tmpdir, ignore_errors=True)


@frozen
class Probe:
    ok: bool
    detail: str
    #: Whether bubblewrap can make a user namespace here (else capabilities are only dropped).
    userns: bool = True


def _run_probe(bwrap: str, userns: bool) -> subprocess.CompletedProcess[str] | str:
    with tempfile.TemporaryDirectory(prefix="keel-probe-") as tmp:
        policy = SandboxPolicy(root=Path(tmp).resolve(), hidden=())
        try:
            return subprocess.run(
                bwrap_argv(
                    policy, ["/bin/sh", "-c", "echo ok"], Path(tmp), bwrap=bwrap, userns=userns
                ),
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired, SandboxError) as exc:
            return f"bubblewrap failed to start: {exc}"


#: How to get bubblewrap, for the one line that says it is missing (and `keel doctor`).
BWRAP_INSTALL = (
    "install it with `sudo apt install bubblewrap` (Debian, Ubuntu), `sudo dnf install "
    "bubblewrap` (Fedora) or `sudo pacman -S bubblewrap` (Arch)"
)


class _Background:
    """A probe started ahead of its first use (`start_probe`)."""

    def __init__(self) -> None:
        self.result: Probe | None = None
        self.thread = threading.Thread(target=self._run, name="keel-sandbox-probe", daemon=True)

    def _run(self) -> None:
        self.result = _probe()


_background: _Background | None = None


def start_probe() -> None:
    """Run the probe on a thread now, so that its wait for bubblewrap (~30 ms, a process start)
    overlaps start-up's own work (`keel -p` starts it before importing the loop); `probe`
    then takes its result. Only once per process, and not when a probe has already run."""
    global _background
    if _background is None and probe.cache_info().currsize == 0:
        _background = _Background()
        _background.thread.start()


@functools.cache
def probe() -> Probe:
    """Whether a sandboxed command really runs here (once per process): on Linux under
    bubblewrap with a user namespace, else with capabilities dropped only; on macOS under the
    Seatbelt profile keel generates; elsewhere there is no sandbox."""
    global _background
    background, _background = _background, None
    if background is not None:
        background.thread.join()
        if background.result is not None:
            return background.result
    return _probe()


def _probe() -> Probe:
    if os.environ.get("KEEL_NO_SANDBOX"):
        return Probe(False, "sandbox turned off (KEEL_NO_SANDBOX is set; unset it to turn it on)")
    if sys.platform == "darwin":
        return _probe_seatbelt()
    if not sys.platform.startswith("linux"):
        return Probe(
            False,
            f"keel has no sandbox on this system ({sys.platform}); it sandboxes bash with "
            "bubblewrap on Linux and Seatbelt on macOS",
        )
    bwrap = bwrap_path()
    if bwrap is None:
        return Probe(False, f"bubblewrap (bwrap) is not installed; {BWRAP_INSTALL}")
    detail = ""
    for userns in (True, False):
        out = _run_probe(bwrap, userns)
        if isinstance(out, str):
            return Probe(False, out)
        if out.returncode == 0 and out.stdout.strip() == "ok":
            how = "" if userns else " (no user namespace here: capabilities dropped only)"
            return Probe(True, f"bubblewrap works ({bwrap}){how}", userns=userns)
        detail = detail or (out.stderr.strip().splitlines() or ["no output"])[-1]
    return Probe(
        False,
        f"bubblewrap cannot start here: {detail} (user namespaces may be disabled; "
        "in Docker run with --security-opt seccomp=unconfined)",
    )


def _probe_seatbelt() -> Probe:
    """Run `echo ok` under the profile keel generates (for a scratch project), so a profile this
    macOS rejects means no sandbox (bash asks), never an unsandboxed command."""
    if not os.access(SANDBOX_EXEC, os.X_OK):
        return Probe(False, f"{SANDBOX_EXEC} is missing; macOS ships it, so this system is unusual")
    with tempfile.TemporaryDirectory(prefix="keel-probe-") as tmp:
        root = Path(tmp).resolve()
        policy = SandboxPolicy(root=root, protected=(root / ".keel",), hidden=())
        try:
            out = subprocess.run(
                seatbelt_argv(policy, ["/bin/sh", "-c", "echo ok"]),
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
                cwd=tmp,
            )
        except (OSError, subprocess.TimeoutExpired, SandboxError) as exc:
            return Probe(False, f"sandbox-exec failed to start: {exc}")
    if out.returncode == 0 and out.stdout.strip() == "ok":
        return Probe(True, f"Seatbelt works ({SANDBOX_EXEC})")
    detail = (out.stderr.strip().splitlines() or ["no output"])[-1]
    return Probe(False, f"sandbox-exec refused keel's profile: {detail}")


def _userns_works() -> bool:
    result = probe()
    return result.userns if result.ok else True
