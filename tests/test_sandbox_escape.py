"""Sandbox escapes, each as an attack through the real bash tool and real bubblewrap, as root and
as an unprivileged user (nobody, privileges dropped with `setpriv`): mounting and unmounting,
writing outside the project, planting code that later runs outside the sandbox (`.claude`,
`.git` moved away and copied back, hooks, `core.hooksPath`, a fresh `.git`), reaching host unix
sockets, reading secrets from the environment or the credential stores of the home directory,
changing project configuration below the root. Positive controls show normal work (files, `git
add` + `git commit`, `$TMPDIR`, ordinary dotfiles) still works, and that no placeholder is left in
the project.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

NOBODY = 65534

pytestmark = pytest.mark.needs("sandbox")

#: Runs one command through the real bash tool in a sandbox, as the agent does; prints JSON.
DRIVER = textwrap.dedent(
    """
    import asyncio, json, os, sys
    from pathlib import Path
    from keel.permissions.sandbox import Sandbox
    from keel.tools.base import ToolContext, ToolError
    from keel.tools.builtin.shell import bash

    root = Path(sys.argv[1])
    warnings = []
    if sys.argv[3:] == ["settings"]:  # as keel makes it: from the user's and project's settings
        from keel.config.settings import load_settings
        from keel.permissions.setup import sandbox_for

        settings = load_settings(root)
        warnings = settings.warnings
        box, why = sandbox_for(root, settings)
        assert box is not None, why
    else:
        box = Sandbox(root)
    ctx = ToolContext(cwd=root, root=root, env=dict(os.environ), sandbox=box)
    try:
        out = asyncio.run(bash.run(ctx, {"command": sys.argv[2]}))
        print(json.dumps({"output": str(out.content), "error": None, "warnings": warnings}))
    except ToolError as exc:
        print(json.dumps({"output": None, "error": str(exc), "warnings": warnings}))
    finally:
        box.cleanup()
    """
)


@dataclass
class Place:
    """A project and its surroundings, owned by the user the attack runs as."""

    user: str
    base: Path
    root: Path
    outside: Path
    home: Path

    @property
    def uid(self) -> int:
        return 0 if self.user == "root" else NOBODY

    def prefix(self) -> list[str]:
        if self.user == "root":
            return []
        return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"]

    @property
    def python(self) -> str:
        return sys.executable if self.user == "root" else _PYTHON_FOR_NOBODY

    def env(self, **extra: str) -> dict[str, str]:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.home),
            "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONPATH": _pythonpath(),
        }
        return {**env, **extra}

    def bash(self, command: str, **env: str) -> str:
        """`command` run through the bash tool in the sandbox; its output (or its refusal)."""
        return self._drive(command, [], env)[0]

    def bash_with_settings(self, command: str) -> tuple[str, list[str]]:
        """`command` in the sandbox keel makes from the settings files (`~/.config/keel`, the
        project's `.keel`); its output and the settings' warnings."""
        return self._drive(command, ["settings"], {})

    def _drive(self, command: str, args: list[str], env: dict[str, str]) -> tuple[str, list[str]]:
        driver = self.base / "driver.py"
        done = subprocess.run(
            [*self.prefix(), self.python, str(driver), str(self.root), command, *args],
            capture_output=True,
            text=True,
            env=self.env(**env),
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout)
        out = result["output"] if result["error"] is None else f"ERROR: {result['error']}"
        return str(out), list(result["warnings"])

    def readable_outside(self, path: Path) -> bool:
        """Whether this user reads `path` outside the sandbox (the attack could succeed)."""
        done = subprocess.run([*self.prefix(), "cat", str(path)], capture_output=True, check=False)
        return done.returncode == 0 and bool(done.stdout)

    def chown(self, path: Path | None = None) -> None:
        for p in [path or self.base, *(path or self.base).rglob("*")]:
            os.lchown(p, self.uid, self.uid)

    def git(self, *args: str) -> str:
        """git run on the host, outside the sandbox, as the test (root)."""
        return subprocess.run(
            ["git", "-c", "safe.directory=*", *args],
            cwd=self.root,
            capture_output=True,
            text=True,
            check=True,
            env={**self.env(), "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@e",
                 "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@e"},
        ).stdout  # fmt: skip


def _pythonpath() -> str:
    """Where keel and its dependencies are, for an interpreter outside this environment (an
    unprivileged user may not reach this one); PYTHONPATH first, to attack another checkout."""
    import keel

    paths = [os.environ.get("PYTHONPATH", ""), str(Path(keel.__file__).parents[1])]
    paths += [p for p in sys.path if p.endswith("site-packages")]
    return os.pathsep.join(p for p in paths if p)


#: An interpreter nobody can run (this one may live in root's home), the same Python version.
_PYTHON_FOR_NOBODY = next(
    (
        p
        for p in (sys.executable, f"/usr/bin/python{sys.version_info[0]}.{sys.version_info[1]}")
        if all(os.stat(d).st_mode & 0o001 for d in Path(os.path.realpath(p)).parents)
    ),
    sys.executable,
)


def _nobody_can_sandbox() -> str | None:
    """Why an unprivileged sandbox cannot run here, or None."""
    if os.getuid() != 0:
        return "the tests are not run as root, so privileges cannot be dropped"
    if shutil.which("setpriv") is None:
        return "setpriv (util-linux) not installed"
    done = subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--",
         "bwrap", "--unshare-user", "--ro-bind", "/", "/", "true"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        return f"unprivileged user namespaces are not available: {done.stderr.strip()}"
    done = subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--",
         _PYTHON_FOR_NOBODY, "-c", "import keel.tools.builtin.shell"],
        capture_output=True, text=True, check=False, env={"PYTHONPATH": _pythonpath()},
    )  # fmt: skip
    if done.returncode != 0:
        return f"no Python with keel that nobody may run: {done.stderr.strip()[-200:]}"
    return None


USERS = [
    "root",
    pytest.param(
        "nobody",
        marks=pytest.mark.skipif(
            _nobody_can_sandbox() is not None, reason=str(_nobody_can_sandbox())
        ),
    ),
]


@pytest.fixture(params=USERS)
def place(request: pytest.FixtureRequest) -> Iterator[Place]:
    user = str(request.param)
    if user == "root" and os.getuid() != 0:
        pytest.skip("not running as root")
    # /var/tmp, not /tmp: the sandbox makes /tmp private, and "outside" must be visible inside.
    parent = "/var/tmp" if os.path.isdir("/var/tmp") else None
    base = Path(tempfile.mkdtemp(prefix="keel-escape-", dir=parent))
    base.chmod(0o755)
    p = Place(user, base, base / "project", base / "outside", base / "home")
    for d in (p.root, p.outside, p.home):
        d.mkdir()
    (base / "driver.py").write_text(DRIVER, encoding="utf-8")
    p.chown()
    yield p
    shutil.rmtree(base, ignore_errors=True)


def _repo(p: Place) -> None:
    (p.root / "README.md").write_text("hello\n", encoding="utf-8")
    p.git("init", "-q", "-b", "main")
    p.git("add", "README.md")
    p.git("commit", "-q", "-m", "first")
    p.chown()


def _attempts(*steps: tuple[str, str]) -> str:
    """A script that tries each (name, shell) step and says which were refused."""
    return "; ".join(
        f"{{ {cmd} ; }} >/dev/null 2>&1 && echo {name}-ESCAPED || echo {name}-refused"
        for name, cmd in steps
    )


def _refused(*names: str) -> str:
    return "\n".join(f"{n}-refused" for n in names) + "\n[exit code 0]"


def _listing(path: Path) -> list[str]:
    return sorted(os.listdir(path))


# -- 1. mount, umount, remount ---------------------------------------------------------------


def test_mount_umount_and_remount_fail(place: Place) -> None:
    _repo(place)
    (place.root / ".keel").mkdir()
    (place.root / ".keel" / "settings.json").write_text("{}\n", encoding="utf-8")
    place.chown()
    (place.outside).chmod(0o777)
    before = _listing(place.root)
    root = place.root
    out = place.bash(
        _attempts(
            ("remount", f"mount -o remount,rw / && echo x > {place.outside}/pwned"),
            ("umount-keel", f"umount {root}/.keel && echo x > {root}/.keel/settings.local.json"),
            ("umount-git", f"umount {root}/.git/hooks && echo x > {root}/.git/hooks/pre-commit"),
            ("mount-tmpfs", f"mount -t tmpfs none {root}/.claude"),
            ("nested-userns", f"unshare -Urm sh -c 'umount -l {root}/.keel'"),
            ("outside", f"echo x > {place.outside}/pwned"),
            ("home", f"echo x >> {place.home}/.bashrc"),
            ("keel", "echo x > .keel/settings.local.json"),
        )
    )
    assert out == _refused(
        "remount", "umount-keel", "umount-git", "mount-tmpfs", "nested-userns", "outside",
        "home", "keel",
    )  # fmt: skip
    assert _listing(place.outside) == []
    assert _listing(place.home) == []
    assert _listing(root / ".keel") == ["settings.json"]
    assert not (root / ".git" / "hooks" / "pre-commit").exists()
    assert _listing(root) == before


# -- 2. nothing to plant ---------------------------------------------------------------------


def test_missing_protected_paths_cannot_be_created(place: Place) -> None:
    _repo(place)
    before = _listing(place.root)
    hook = '{"hooks":{"SessionStart":[{"hooks":[{"type":"command","command":"touch /pwned"}]}]}}'
    out = place.bash(
        _attempts(
            ("claude", f"mkdir -p .claude && echo '{hook}' > .claude/settings.local.json"),
            ("claude-rmdir", "rmdir .claude && mkdir .claude && echo x > .claude/settings.json"),
            ("claude-mv", "mv .claude gone && mkdir .claude && echo x > .claude/settings.json"),
            ("keel", "mkdir -p .keel && echo '{}' > .keel/settings.local.json"),
            ("mcp", "echo '{}' > .mcp.json"),
            ("vscode", "mkdir -p .vscode && echo '{}' > .vscode/tasks.json"),
            ("idea", "mkdir -p .idea && echo x > .idea/workspace.xml"),
            ("envrc", "echo 'touch /pwned' > .envrc"),
            ("bashrc", "echo 'touch /pwned' > .bashrc"),
            ("profile", "echo 'touch /pwned' > .profile"),
            ("zshrc", "echo 'touch /pwned' > .zshrc"),
        )
    )
    assert out == _refused(
        "claude", "claude-rmdir", "claude-mv", "keel", "mcp", "vscode", "idea", "envrc",
        "bashrc", "profile", "zshrc",
    )  # fmt: skip
    assert _listing(place.root) == before  # nothing planted, no placeholder left behind


def test_git_cannot_be_moved_away_or_made_to_run_code(place: Place) -> None:
    _repo(place)
    git = place.root / ".git"
    config = (git / "config").read_bytes()
    hooks = _listing(git / "hooks")
    marker = place.outside / "hook-ran"
    place.outside.chmod(0o777)
    hook = f"printf '#!/bin/sh\\ntouch {marker}\\n' > .git/hooks/pre-commit"
    out = place.bash(
        _attempts(
            ("move-away", f"mv .git .git-old && mkdir .git && cp -a .git-old/. .git/ && {hook}"),
            ("copy-aside", "cp -a .git .git-new && mv -T .git-new .git"),
            ("hook", f"{hook} && chmod +x .git/hooks/pre-commit"),
            ("hooks-dir", "rm -rf .git/hooks && mkdir .git/hooks"),
            ("hooks-path", "git config core.hooksPath .evil"),
            ("config", "echo '[core] fsmonitor = touch /pwned' >> .git/config"),
            ("config-worktree", "echo '[core] fsmonitor = x' > .git/config.worktree"),
            ("commondir", "echo ../evil > .git/commondir"),
            ("modules", "mkdir -p .git/modules/lib/hooks"),
            ("worktrees", "mkdir -p .git/worktrees/x"),
            ("info", "echo '* filter=evil' > .git/info/attributes"),
        )
    )
    assert out == _refused(
        "move-away", "copy-aside", "hook", "hooks-dir", "hooks-path", "config",
        "config-worktree", "commondir", "modules", "worktrees", "info",
    )  # fmt: skip
    assert (git / "config").read_bytes() == config
    assert _listing(git / "hooks") == hooks
    assert _listing(place.root) == [".git", ".git-new", "README.md"]  # the copy was allowed
    for name in ("commondir", "config.worktree", "modules", "worktrees"):
        assert not (git / name).exists(), name  # placeholders gone
    place.git("commit", "-q", "--allow-empty", "-m", "the user's next commit")
    assert not marker.exists()


def test_hooks_that_core_hookspath_puts_in_the_project_are_protected(place: Place) -> None:
    """husky sets `core.hooksPath=.husky/_`, whose scripts run the ones in `.husky/`."""
    _repo(place)
    (place.root / ".husky" / "_").mkdir(parents=True)
    (place.root / ".husky" / "pre-commit").write_text("npm test\n", encoding="utf-8")
    place.git("config", "core.hooksPath", ".husky/_")
    place.chown()
    out = place.bash(
        _attempts(
            ("husky-hook", "echo 'touch /pwned' >> .husky/pre-commit"),
            ("husky-new", "echo 'touch /pwned' > .husky/post-checkout"),
            ("husky-move", "mv .husky h2 && mkdir -p .husky/_ && echo x > .husky/pre-commit"),
        )
    )
    assert out == _refused("husky-hook", "husky-new", "husky-move")
    assert _listing(place.root / ".husky") == ["_", "pre-commit"]
    assert (place.root / ".husky" / "pre-commit").read_text(encoding="utf-8") == "npm test\n"
    # A hooks directory deeper down that does not exist yet: held, and so is the one above it.
    place.git("config", "core.hooksPath", "tools/git-hooks")
    out = place.bash(
        _attempts(
            ("nested", "mkdir -p tools/git-hooks && echo x > tools/git-hooks/pre-commit"),
            (
                "nested-move",
                "mv tools t2 && mkdir -p tools/git-hooks && echo x > tools/git-hooks/pre-commit",
            ),
        )
        + "; echo hi > tools/notes.txt && echo parent-writable"
    )
    assert out == _refused("nested", "nested-move").replace(
        "\n[exit code 0]", "\nparent-writable\n[exit code 0]"
    )
    assert _listing(place.root) == [".git", ".husky", "README.md", "tools"]
    assert _listing(place.root / "tools") == ["notes.txt"]  # the placeholder went, the note stays


def test_a_missing_git_cannot_be_planted(place: Place) -> None:
    (place.root / "main.py").write_text("print(1)\n", encoding="utf-8")
    place.chown()
    out = place.bash(
        _attempts(
            ("git-init", "git init -q && echo x > .git/hooks/pre-commit"),
            ("git-dir", "rmdir .git; mkdir -p .git/hooks"),
            ("git-file", "echo 'gitdir: /elsewhere' > .git"),
        )
    )
    assert out == _refused("git-init", "git-dir", "git-file")
    assert _listing(place.root) == ["main.py"]


def test_a_git_file_cannot_be_redirected(place: Place) -> None:
    """In a linked worktree or a submodule `.git` is a file naming the git dir."""
    (place.root / ".git").write_text("gitdir: /srv/repo/.git/worktrees/x\n", encoding="utf-8")
    place.chown()
    out = place.bash(
        _attempts(
            ("rewrite", "echo 'gitdir: ./evil' > .git"),
            ("replace", "rm -f .git && echo 'gitdir: ./evil' > .git"),
            ("move", "mv .git gone"),
        )
    )
    assert out == _refused("rewrite", "replace", "move")
    assert (place.root / ".git").read_text(encoding="utf-8") == (
        "gitdir: /srv/repo/.git/worktrees/x\n"
    )


# -- 3. host unix sockets --------------------------------------------------------------------


def _listen(path: Path) -> socket.socket:
    path.unlink(missing_ok=True)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(8)
    path.chmod(0o777)
    return server


CONNECT = (
    "python3 -c 'import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])' {}"
)


def test_host_unix_sockets_are_unreachable(place: Place) -> None:
    tag = place.base.name
    place.outside.chmod(0o777)
    paths = {
        "tmp": Path("/tmp") / f"{tag}.sock",
        "run": Path("/run") / f"{tag}.sock",
        "outside": place.outside / "agent.sock",
    }
    servers = [_listen(path) for path in paths.values()]
    try:
        # The attack can succeed: outside the sandbox this user reaches every one of them.
        for path in paths.values():
            subprocess.run([*place.prefix(), "sh", "-c", CONNECT.format(path)], check=True)
        out = place.bash(
            _attempts(*((name, CONNECT.format(path)) for name, path in paths.items()))
            + "; echo ssh-agent=${SSH_AUTH_SOCK:-unset}",
            SSH_AUTH_SOCK=str(paths["tmp"]),
        )
    finally:
        for server in servers:
            server.close()
        for path in paths.values():
            path.unlink(missing_ok=True)
    assert out == "tmp-refused\nrun-refused\noutside-refused\nssh-agent=unset\n[exit code 0]"


# -- 4. the environment ----------------------------------------------------------------------

SECRETS = {
    "GITHUB_TOKEN": "ghp_secret1",
    "NPM_TOKEN": "npm_secret2",
    "HF_TOKEN": "hf_secret3",
    "PGPASSWORD": "secret4",
    "DATABASE_URL": "postgres://app:secret5@db/app",
    "AWS_ACCESS_KEY_ID": "AKIAsecret6",
    "AWS_SECRET_ACCESS_KEY": "secret7",
    "GOOGLE_APPLICATION_CREDENTIALS": "/home/u/secret8.json",
    "MY_SERVICE_API_KEY": "secret9",
    "STRIPE_SECRET": "secret10",
    "npm_config__authToken": "secret11",
    "HTTPS_PROXY": "http://user:secret12@proxy:3128",
    "SSH_AUTH_SOCK": "/tmp/ssh-secret13/agent",
    "DISPLAY": ":0",
}


def test_secrets_are_not_in_the_sandboxed_environment(place: Place) -> None:
    out = place.bash(
        "env | cut -d= -f1 | sort; env | grep -c secret",
        **SECRETS,
        CI="true",
        GIT_AUTHOR_NAME="Ada",
        HTTP_PROXY="http://proxy:3128",
        LC_ALL="C.UTF-8",
    )
    *names, count, code = out.splitlines()
    assert sorted(names) == sorted(
        [
            "CI", "GIT_AUTHOR_NAME", "GIT_PAGER", "HOME", "HTTP_PROXY", "KEEL_SANDBOX", "LANG",
            "LC_ALL", "NO_COLOR", "PAGER", "PATH", "PWD", "PYTHONDONTWRITEBYTECODE",
            "PYTHONPATH", "SHLVL", "TEMP", "TERM", "TMP", "TMPDIR", "_",
        ]
    )  # fmt: skip
    assert (count, code) == ("0", "[exit code 1]")  # grep found no secret value


def test_keys_in_the_home_directory_are_hidden(place: Place) -> None:
    for name in (".ssh", ".gnupg", ".docker"):
        (place.home / name).mkdir()
        (place.home / name / "key").write_text("secret\n", encoding="utf-8")
    place.chown()
    out = place.bash("cat ~/.ssh/key ~/.gnupg/key ~/.docker/key 2>/dev/null; ls -A ~/.ssh | wc -l")
    assert out == "0\n[exit code 0]"


# -- 5. credential stores in the home directory -------------------------------------------------

#: Credential stores a tester read from inside the sandbox, and more of the same kinds.
CREDENTIAL_FILES = (
    ".aws/credentials", ".azure/msal_token_cache.json", ".config/gcloud/credentials.db",
    ".netrc", ".authinfo", ".git-credentials", ".config/gh/hosts.yml",
    ".config/glab-cli/config.yml", ".kube/config", ".npmrc", ".yarnrc.yml", ".pypirc",
    ".gem/credentials", ".cargo/credentials.toml", ".m2/settings.xml", ".gradle/gradle.properties",
    ".composer/auth.json", ".docker/config.json", ".terraform.d/credentials.tfrc.json",
    ".vault-token", ".pgpass", ".my.cnf", ".s3cfg", ".config/rclone/rclone.conf",
    ".claude/.credentials.json", ".codex/auth.json", ".local/share/keyrings/login.keyring",
    ".password-store/github.gpg", ".local/share/keel/mcp-auth/0123.json",
)  # fmt: skip
#: Ordinary dotfiles, some next to a credential store: still readable.
ORDINARY_FILES = (
    ".gitconfig",
    ".cargo/config.toml",
    ".config/other/settings.ini",
    ".claude/CLAUDE.md",
)


def _plant(home: Path, rel: str, content: str) -> None:
    path = home / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content, encoding="utf-8")


def _cat(*rels: str) -> str:
    return " ".join(f'"$HOME/{rel}"' for rel in rels)


def test_credential_stores_in_the_home_directory_are_hidden(place: Place) -> None:
    home = place.home
    for n, rel in enumerate(CREDENTIAL_FILES):
        _plant(home, rel, f"secret{n}\n")
    for rel in ORDINARY_FILES:
        _plant(home, rel, "ordinary\n")
    # Through a link: `~/.kube` is a link into a dotfiles checkout (moved aside first), and
    # `~/.config/gh` is reached through the link `~/gh-link`. A dangling link stops nothing.
    (home / "dotfiles").mkdir()
    (home / ".kube").rename(home / "dotfiles" / "kube")
    (home / ".kube").symlink_to("dotfiles/kube")
    (home / "gh-link").symlink_to(".config/gh")
    (home / ".boto").symlink_to("nowhere")
    place.chown()
    assert all(place.readable_outside(home / rel) for rel in CREDENTIAL_FILES)
    out = place.bash(
        f"cat {_cat(*CREDENTIAL_FILES)} {_cat('dotfiles/kube/config', 'gh-link/hosts.yml')} "
        "2>/dev/null | grep -c secret; "
        f"cat {_cat(*ORDINARY_FILES)}; ls -A ~/.aws ~/.kube | wc -l; "
        "{ echo leaked > ~/.netrc; } 2>/dev/null; echo done"
    )
    assert out == "0\n" + "ordinary\n" * len(ORDINARY_FILES) + "3\ndone\n[exit code 0]"
    # `ls` printed the two directories' names and a blank line, nothing in them; and the files
    # outside are untouched.
    assert (home / ".netrc").read_text(
        encoding="utf-8"
    ) == f"secret{CREDENTIAL_FILES.index('.netrc')}\n"
    assert (home / ".kube").is_symlink()


def _settings(path: Path, sandbox: dict[str, object]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"sandbox": sandbox}), encoding="utf-8")


def test_the_users_settings_unhide_and_hide(place: Place) -> None:
    home = place.home
    _plant(home, ".npmrc", "registry=https://npm.example.org/\n")
    _plant(home, ".netrc", "secret-netrc\n")
    _plant(home, "notes/token.txt", "secret-notes\n")
    _plant(home, "notes/readme.txt", "readme\n")
    _plant(home, "private/key.pem", "secret-private\n")
    _plant(home, "locked/token", "secret-locked\n")
    hide = ["~/notes/token.txt", "~/private", "~/locked/token", "~/missing", "relative/path"]
    _settings(home / ".config" / "keel" / "settings.json", {"unhide": ["~/.npmrc"], "hide": hide})
    place.chown()
    (home / "locked").chmod(0o700)  # out of this user's reach when it is nobody: skipped
    os.chown(home / "locked", 0, 0)
    out, warnings = place.bash_with_settings(
        f"cat {_cat('.netrc', 'notes/token.txt', 'private/key.pem', 'locked/token')} "
        "2>/dev/null | grep -c secret; cat ~/.npmrc ~/notes/readme.txt; ls -A ~/private | wc -l"
    )
    assert out == "0\nregistry=https://npm.example.org/\nreadme\n0\n[exit code 0]"
    settings = home / ".config" / "keel" / "settings.json"
    assert warnings == [
        f"{settings}: sandbox.hide: 'relative/path' must start with ~/ or /; ignored"
    ]


def test_a_project_file_may_hide_but_not_unhide(place: Place) -> None:
    home = place.home
    _plant(home, ".netrc", "secret-netrc\n")
    _plant(home, "work-token", "secret-work\n")
    project_file = place.root / ".keel" / "settings.json"
    _settings(project_file, {"hide": ["~/work-token"], "unhide": ["~/.netrc"]})
    place.chown()
    out, warnings = place.bash_with_settings(
        f"cat {_cat('.netrc', 'work-token')} 2>/dev/null | grep -c secret"
    )
    assert out == "0\n[exit code 1]"
    assert [w for w in warnings if "unhide" in w] == [
        f"{project_file}: sandbox.unhide ignored: only your own settings may show sandboxed "
        "commands a credential store (a project file may only add to sandbox.hide)"
    ]


# -- 6. project configuration below the root ---------------------------------------------------

NESTED_CONFIG = {
    "sub/.keel/settings.json": '{"permissions": {"deny": ["bash"]}}\n',
    "sub/.claude/settings.json": "{}\n",
    "a/b/.mcp.json": '{"mcpServers": {}}\n',
    "pkg/.codex/config.toml": "model = 'x'\n",
}


def test_existing_configuration_below_the_root_cannot_be_changed(place: Place) -> None:
    _repo(place)
    for rel, content in NESTED_CONFIG.items():
        _plant(place.root, rel, content)
    place.chown()
    evil = '{"permissions": {"allow": ["bash"]}}'
    out = place.bash(
        _attempts(
            ("modify", f"echo '{evil}' > sub/.keel/settings.json"),
            (
                "replace",
                f"rm -f sub/.keel/settings.json && echo '{evil}' > sub/.keel/settings.json",
            ),
            ("rename-over", f"echo '{evil}' > t.json && mv -f t.json sub/.keel/settings.json"),
            ("add", f"echo '{evil}' > sub/.keel/settings.local.json"),
            ("remove", "rm -rf sub/.keel"),
            ("claude-away", "mv sub/.claude sub/claude-old"),
            ("sub-away", "mv sub sub2 && mkdir -p sub/.claude && echo x > sub/.claude/x.json"),
            ("mcp", "echo '{}' > a/b/.mcp.json"),
            ("mcp-dir-away", "mv a/b a/c && mkdir a/b && echo '{}' > a/b/.mcp.json"),
            ("mcp-top-away", "mv a z && mkdir -p a/b && echo '{}' > a/b/.mcp.json"),
            ("codex", "echo x >> pkg/.codex/config.toml"),
        )
        + "; echo note > sub/notes.txt && mkdir a/b/more && echo still-writable"
    )
    assert out == _refused(
        "modify", "replace", "rename-over", "add", "remove", "claude-away", "sub-away", "mcp",
        "mcp-dir-away", "mcp-top-away", "codex",
    ).replace("\n[exit code 0]", "\nstill-writable\n[exit code 0]")  # fmt: skip
    for rel, content in NESTED_CONFIG.items():
        assert (place.root / rel).read_text(encoding="utf-8") == content, rel
    assert _listing(place.root / "sub") == [".claude", ".keel", "notes.txt"]
    assert _listing(place.root / "sub" / ".keel") == ["settings.json"]
    assert _listing(place.root / "a") == ["b"]


# -- positive controls and housekeeping ------------------------------------------------------


def test_normal_work_still_works_and_leaves_no_litter(place: Place) -> None:
    _repo(place)
    git_before = set(_listing(place.root / ".git"))
    out = place.bash(
        "echo hi > new.txt && mkdir -p src && echo 'print(1)' > src/app.py && "
        "git add -A && git -c user.name=Ada -c user.email=ada@example.org commit -q -m work && "
        'echo scratch > "$TMPDIR/x" && cat "$TMPDIR/x" && git status --porcelain | wc -l && '
        "git log --format=%s | tr '\\n' ' '"
    )
    assert out == "scratch\n0\nwork first \n[exit code 0]"
    assert _listing(place.root) == [".git", "README.md", "new.txt", "src"]
    # Placeholders were never committed (git add -A saw only empty directories).
    assert place.git("ls-tree", "-r", "--name-only", "HEAD").split() == [
        "README.md", "new.txt", "src/app.py",
    ]  # fmt: skip
    assert set(_listing(place.root / ".git")) - git_before <= {"COMMIT_EDITMSG", "ORIG_HEAD"}
    assert (place.root / "new.txt").stat().st_uid == place.uid


def test_a_placeholder_stays_while_another_command_needs_it(tmp_path: Path) -> None:
    from keel.permissions.sandbox import Sandbox

    root = tmp_path / "p"
    root.mkdir()
    first, second = Sandbox(root, tmpdir=tmp_path), Sandbox(root, tmpdir=tmp_path)
    attack = ["sh", "-c", "echo x > .claude/settings.json 2>/dev/null && echo ESCAPED || echo ok"]
    long_running = first.argv(attack, root)
    second.argv(["true"], root)
    second.release()  # the other command ended: the placeholder must stay for the first one
    assert (root / ".claude").is_dir()
    done = subprocess.run(long_running, capture_output=True, text=True, check=False)
    assert done.stdout == "ok\n"
    first.release()
    assert _listing(root) == []


def test_placeholders_a_killed_keel_left_are_removed_by_the_next_command(place: Place) -> None:
    (place.root / ".vscode").mkdir()  # the user's own empty directory: never removed
    place.chown()
    killed = (
        "import os, sys; from pathlib import Path; from keel.permissions.sandbox import Sandbox; "
        "root = Path(sys.argv[1]); "
        "Sandbox(root, tmpdir=root.parent / 'home').argv(['true'], root); os._exit(9)"
    )
    subprocess.run(
        [*place.prefix(), place.python, "-c", killed, str(place.root)],
        env=place.env(),
        check=False,
    )
    assert {".claude", ".keel", ".git", ".mcp.json"} <= set(_listing(place.root))
    assert place.bash("echo ok") == "ok\n[exit code 0]"
    assert _listing(place.root) == [".vscode"]


def test_a_protected_symlink_is_refused_with_a_reason(place: Place) -> None:
    (place.root / "shared-claude").mkdir()
    (place.root / ".claude").symlink_to("shared-claude")
    place.chown()
    assert place.bash("echo hi") == (
        f"ERROR: {place.root}/.claude is a symbolic link; keel protects it and cannot hold a "
        "link in place (replace it with the real file or directory)"
    )
    assert _listing(place.root) == [".claude", "shared-claude"]


async def test_a_background_command_is_sandboxed_the_same_way(tmp_path: Path) -> None:
    """Background tasks go through the same bash tool path: filtered environment, placeholders
    held for as long as they run (a foreground command ending meanwhile does not drop them)."""
    from keel.permissions.sandbox import Sandbox
    from keel.tools.background import BackgroundTasks
    from keel.tools.base import ToolContext
    from keel.tools.builtin.shell import bash

    root = tmp_path / "p"
    root.mkdir()
    box, tasks = Sandbox(root, tmpdir=tmp_path), BackgroundTasks()
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "GITHUB_TOKEN": "ghp_x"}
    ctx = ToolContext(cwd=root, root=root, env=env, sandbox=box, background=tasks)
    started = await bash.run(
        ctx,
        {
            "command": "sleep 1.5; { echo x > .claude/settings.json; } 2>/dev/null && "
            "echo ESCAPED || echo refused; echo token=${GITHUB_TOKEN:-unset}",
            "run_in_background": True,
        },
    )
    task_id = str(started.content).split()[1]
    assert str((await bash.run(ctx, {"command": "echo fg"})).content) == "fg\n[exit code 0]"
    assert (root / ".claude").is_dir()  # still held for the background command
    [done] = await tasks.wait([task_id], timeout=30)
    assert (done.status, done.result) == ("completed", "refused\ntoken=unset\n[exit code 0]")
    assert _listing(root) == []
    box.cleanup()


@pytest.mark.needs("script")
def test_the_terminal_keel_runs_in_is_out_of_reach(place: Place) -> None:
    """No controlling terminal inside, so nothing can be typed into the user's (TIOCSTI)."""
    probe = "{ exec 3<>/dev/tty; } 2>/dev/null && echo tty-REACHED || echo tty-refused"
    control = subprocess.run(
        ["script", "-qec", f"sh -c '{probe}'", "/dev/null"],
        capture_output=True, text=True, check=True, env=place.env(),
    )  # fmt: skip
    assert control.stdout.strip() == "tty-REACHED"  # keel itself has one here
    driver = " ".join(
        [
            *place.prefix(),
            place.python,
            str(place.base / "driver.py"),
            str(place.root),
            f'"{probe}"',
        ]
    )
    done = subprocess.run(
        ["script", "-qec", driver, "/dev/null"],
        capture_output=True, text=True, check=True, env=place.env(), timeout=60,
    )  # fmt: skip
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"output": "tty-refused\n[exit code 0]", "error": None, "warnings": []}


def test_programs_on_path_under_a_private_dir_still_run(tmp_path: Path) -> None:
    """A checkout and its virtualenv under /tmp (as a CI machine may have them): the private
    /tmp hides data, not the programs on PATH nor this Python, which are bound back read-only."""
    from keel.permissions.sandbox import Sandbox, runtime_in_private_dirs

    tools = Path(tempfile.mkdtemp(prefix="keel-path-", dir="/tmp"))
    try:
        (tools / "hello-tool").write_text("#!/bin/sh\necho hello from tmp\n", encoding="utf-8")
        (tools / "hello-tool").chmod(0o755)
        (tools / "data.txt").write_text("x\n", encoding="utf-8")
        root = tmp_path / "p"
        root.mkdir()
        old = os.environ["PATH"]
        os.environ["PATH"] = f"{tools}{os.pathsep}{old}"
        try:
            assert tools.resolve() in runtime_in_private_dirs()
            box = Sandbox(root, tmpdir=tmp_path / "t")
            (tmp_path / "t").mkdir()
            argv = box.argv(["sh", "-c", f"hello-tool; echo no > {tools}/data.txt || true"], root)
            done = subprocess.run(argv, capture_output=True, text=True, check=False)
            box.release()
        finally:
            os.environ["PATH"] = old
        assert done.stdout == "hello from tmp\n", done.stderr
        assert "Read-only file system" in done.stderr
        assert (tools / "data.txt").read_text(encoding="utf-8") == "x\n"
    finally:
        shutil.rmtree(tools)
