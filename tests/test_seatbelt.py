"""The macOS sandbox: the Seatbelt profile generated from a `SandboxPolicy`, tested as text.

sandbox-exec cannot run on the Linux machines keel is tested on, so the profile is checked three
ways: against a golden file (tests/snapshots/seatbelt_profile.sb; `KEEL_UPDATE_SNAPSHOTS=1`
rewrites it), structurally against the policy (every writable path in an allow rule, every
protected and pinned path in a deny rule after it, no network), and against the bubblewrap argv
generated from the same policy (the same paths writable, read-only, hidden), so the two cannot
drift. On macOS keel's probe also runs the real profile once (a rejected profile means no
sandbox, and bash asks)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from keel.permissions.boundary import GIT_PROTECTED, PROTECTED
from keel.permissions.sandbox import (
    SANDBOX_EXEC,
    Placeholders,
    Sandbox,
    SandboxError,
    SandboxPolicy,
    bwrap_argv,
    hidden_candidates,
    hidden_targets,
    project_policy,
    seatbelt_argv,
    seatbelt_profile,
)

SNAPSHOT = Path(__file__).parent / "snapshots" / "seatbelt_profile.sb"
HOME = Path("/Users/dev")
ROOT = HOME / "project"
TMPDIR = Path("/private/var/folders/xy/T/keel-sandbox-1")


def policy_for(root: Path, home: Path, tmpdir: Path, *, network: bool = False) -> SandboxPolicy:
    """What `project_policy` makes for a git project, spelled out (it reads the disk)."""
    git = root / ".git"
    protected = [root / rel for rel in PROTECTED if rel != ".git" and not rel.startswith(".git/")]
    protected += [git, *(git / rel for rel in GIT_PROTECTED)]
    return SandboxPolicy(
        root=root,
        writable=(tmpdir, home / ".cache"),
        protected=tuple(protected),
        writable_inside_protected=(git,),
        hidden=tuple(home / d for d in (".ssh", ".gnupg", ".docker")),
        network=network,
    )


# -- a small SBPL reader: enough to see the profile as rules ----------------------------------------

Expr = str | list["Expr"]
_TOKEN = re.compile(r'\s+|;[^\n]*|#"(?:[^"\\]|\\.)*"|"(?:[^"\\]|\\.)*"|[()]|[^\s()";]+')


def parse(text: str) -> list[Expr]:
    stack: list[list[Expr]] = [[]]
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        assert m is not None, f"cannot read the profile at {text[pos : pos + 40]!r}"
        token, pos = m.group(), m.end()
        if token.isspace() or token.startswith(";"):
            continue
        if token == "(":
            stack.append([])
        elif token == ")":
            done = stack.pop()
            stack[-1].append(done)
        else:
            stack[-1].append(token)
    assert len(stack) == 1, "unbalanced parentheses"
    return stack[0]


def string(token: Expr) -> str:
    assert isinstance(token, str), token
    assert token.startswith('"'), token
    return token[1:-1].replace('\\"', '"').replace("\\\\", "\\")


def rules(text: str) -> list[tuple[str, set[str], list[tuple[str, str]]]]:
    """Each `(allow|deny OPS... FILTERS...)` as (action, ops, [(filter kind, path)]); a rule
    with no filter at all gets the filter ("any", "")."""
    out = []
    for form in parse(text):
        assert isinstance(form, list)
        head = form[0]
        if head == "version":
            continue
        assert head in ("allow", "deny"), form
        ops = {x for x in form[1:] if isinstance(x, str)}
        filters = []
        for f in form[1:]:
            if (
                isinstance(f, list)
                and f[0] in ("subpath", "literal")
                and isinstance(f[1], str)
                and f[1].startswith('"')
            ):
                filters.append((str(f[0]), string(f[1])))
        if not any(isinstance(f, list) for f in form[1:]):
            filters.append(("any", ""))
        out.append((str(head), ops, filters))
    return out


def last_rule_for(text: str, op: str, path: str) -> str:
    """What the last rule that names `path` (as it is or as a parent subpath) says for `op`:
    in SBPL the later rule wins."""
    verdict = "default"
    for action, ops, filters in rules(text):
        if not any(o == op or (o.endswith("*") and op.startswith(o[:-1])) for o in ops):
            continue
        for kind, p in filters:
            if kind == "any" or p == path or (kind == "subpath" and path.startswith(p + "/")):
                verdict = action
    return verdict


# -- the tests ----------------------------------------------------------------------------------------


def test_profile_matches_the_golden_file() -> None:
    profile = seatbelt_profile(policy_for(ROOT, HOME, TMPDIR))
    if os.environ.get("KEEL_UPDATE_SNAPSHOTS"):
        SNAPSHOT.write_text(profile, encoding="utf-8")
    assert SNAPSHOT.exists(), f"no snapshot {SNAPSHOT.name}: run with KEEL_UPDATE_SNAPSHOTS=1"
    assert profile == SNAPSHOT.read_text(encoding="utf-8")


def test_every_path_of_the_policy_is_where_it_belongs() -> None:
    policy = policy_for(ROOT, HOME, TMPDIR)
    profile = seatbelt_profile(policy)
    parsed = rules(profile)
    assert parsed[0] == ("deny", {"default"}, [("any", "")])  # closed by default
    assert ("allow", {"file-read*"}, [("any", "")]) in parsed
    # Writable: the project, the temp dir, the caches, and what is below them.
    for path in (ROOT, TMPDIR, HOME / ".cache"):
        assert last_rule_for(profile, "file-write-create", f"{path}/new-file") == "allow"
        assert last_rule_for(profile, "file-write-data", f"{path}/a/b") == "allow"
    # The rest of the disk is read-only, readable.
    for elsewhere in ("/etc/hosts", f"{HOME}/notes.txt", "/usr/bin/env", "/private/tmp/x"):
        assert last_rule_for(profile, "file-write-create", elsewhere) == "default"
        assert last_rule_for(profile, "file-read-data", elsewhere) == "allow"
    # Protected: denied after the project's allow, whether or not they exist, and below them.
    for path in policy.protected:
        if path == ROOT / ".git":
            continue
        assert last_rule_for(profile, "file-write-create", str(path)) == "deny", path
        assert last_rule_for(profile, "file-write-data", f"{path}/x") == "deny", path
        assert last_rule_for(profile, "file-read-data", str(path)) == "allow", path
    # git's own data stays writable, but `.git` itself (and the root) cannot be moved away.
    assert last_rule_for(profile, "file-write-create", f"{ROOT}/.git/objects/ab/cd") == "allow"
    assert last_rule_for(profile, "file-write-data", f"{ROOT}/.git/index") == "allow"
    for pinned in (ROOT / ".git", ROOT):
        assert last_rule_for(profile, "file-write-unlink", str(pinned)) == "deny"
    assert last_rule_for(profile, "file-write-data", f"{ROOT}/.git/hooks/pre-commit") == "deny"
    assert last_rule_for(profile, "file-write-data", f"{ROOT}/.git/config") == "deny"
    # Hidden: neither readable nor writable.
    for hidden in policy.hidden:
        assert last_rule_for(profile, "file-read-data", f"{hidden}/id_ed25519") == "deny"
        assert last_rule_for(profile, "file-write-create", f"{hidden}/x") == "deny"
    # No network: nothing allows any network operation.
    assert not [r for r in parsed if r[0] == "allow" and any(o.startswith("network") for o in r[1])]
    assert "(allow network" not in profile
    assert "system-socket" not in profile


def test_network_when_allowed_reaches_ip_but_no_host_unix_socket() -> None:
    profile = seatbelt_profile(policy_for(ROOT, HOME, TMPDIR, network=True))
    network = [line for line in profile.splitlines() if "network" in line and "global" not in line]
    assert network == [
        "; network: allowed (sandbox.network)",
        '(allow network-outbound (remote ip "*:*"))',
        '(allow network-outbound (literal "/private/var/run/mDNSResponder"))',
        '(allow network-inbound (local ip "*:*"))',
        '(allow network-bind (local ip "*:*"))',
    ]
    assert "unix-socket" not in profile
    # Everything else is the same profile.
    without = seatbelt_profile(policy_for(ROOT, HOME, TMPDIR))
    assert profile.split("; network:")[0] == without.split("; network:")[0]


def test_paths_are_quoted_and_control_characters_refused() -> None:
    odd = Path('/Users/dev/my "quoted" \\ project')
    profile = seatbelt_profile(policy_for(odd, HOME, TMPDIR))
    assert '(subpath "/Users/dev/my \\"quoted\\" \\\\ project")' in profile
    assert string('"/Users/dev/my \\"quoted\\" \\\\ project"') == str(odd)
    parse(profile)  # still balanced
    with pytest.raises(SandboxError, match="control character"):
        seatbelt_profile(policy_for(Path("/Users/dev/a\n(allow default)"), HOME, TMPDIR))


def test_a_protected_symlink_is_refused_as_bubblewrap_refuses_it(tmp_path: Path) -> None:
    root = tmp_path / "project"
    root.mkdir()
    (root / "elsewhere").mkdir()
    (root / ".envrc").symlink_to(root / "elsewhere")
    policy = SandboxPolicy(root=root, protected=(root / ".envrc",))
    with pytest.raises(SandboxError, match="is a symbolic link"):
        seatbelt_profile(policy)


def test_a_root_holding_shared_directories_is_refused() -> None:
    with pytest.raises(SandboxError, match="contains /"):
        seatbelt_profile(SandboxPolicy(root=Path("/")))


def test_seatbelt_and_bubblewrap_come_from_the_same_policy(tmp_path: Path) -> None:
    """Generated from one real project policy: the paths bubblewrap binds writable, re-binds
    read-only and hides are exactly the ones the profile allows, denies and hides."""
    root = (tmp_path / "project").resolve()
    (root / ".git" / "objects").mkdir(parents=True)
    home = (tmp_path / "home").resolve()
    for name in (".ssh", ".gnupg", ".docker", ".cache"):
        (home / name).mkdir(parents=True)
    tmpdir = (tmp_path / "tmpdir").resolve()
    tmpdir.mkdir()
    policy = project_policy(
        root,
        writable=(tmpdir, home / ".cache"),
        hidden=tuple(home / n for n in (".ssh", ".gnupg", ".docker")),
    )
    holder = Placeholders(root)
    holder.hold(policy)  # bubblewrap needs every protected path to exist
    try:
        argv = bwrap_argv(policy, ["true"], root, bwrap="bwrap")
    finally:
        holder.release()
    pairs = list(zip(argv, argv[1:], argv[2:], strict=False))
    binds = {Path(a) for flag, a, b in pairs if flag == "--bind" and a == b}
    # The runtime bound back into bubblewrap's private /tmp is read-only there and everywhere
    # in Seatbelt (which has no private /tmp): not a protected path.
    read_only = {
        Path(a)
        for flag, a, b in pairs
        if flag == "--ro-bind" and a == b and a != "/" and Path(a) not in policy.readable
    }
    hidden = {Path(a) for flag, a, _ in pairs if flag == "--tmpfs" and a.startswith(str(home))}
    profile = seatbelt_profile(policy)
    allowed = {
        Path(p)
        for a, ops, fs in rules(profile)
        if a == "allow" and "file-write*" in ops
        for k, p in fs
        if k == "subpath"
    }
    pinned = {
        Path(p)
        for a, ops, fs in rules(profile)
        if a == "deny" and ops == {"file-write*"}
        for k, p in fs
        if k == "literal"
    }
    denied = {
        Path(p)
        for a, ops, fs in rules(profile)
        if a == "deny" and ops == {"file-write*"}
        for k, p in fs
        if k == "subpath"
    }
    masked = {
        Path(p)
        for a, ops, fs in rules(profile)
        if a == "deny" and "file-read*" in ops
        for k, p in fs
    }
    assert allowed == {root, tmpdir, home / ".cache"}
    assert binds == allowed | pinned  # bubblewrap's writable binds: the writable and the pinned
    assert pinned == {root, root / ".git"}
    assert (
        read_only
        == denied
        == {p for p in policy.protected if p not in policy.writable_inside_protected}
    )
    assert hidden == masked == set(policy.hidden)
    assert "--unshare-net" in argv
    assert "(allow network" not in profile


def test_hidden_files_and_configuration_below_the_root_come_from_the_same_policy(
    tmp_path: Path,
) -> None:
    """A hidden file (bubblewrap: /dev/null over it; Seatbelt: denied like a directory), a hidden
    directory reached through a link (its target is hidden), and configuration that exists below
    the root (read-only, the directories on the way pinned, shallowest first)."""
    root = (tmp_path / "project").resolve()
    for rel in ("sub/.keel", "a/b", "node_modules/x/.claude", ".git/objects"):
        (root / rel).mkdir(parents=True)
    (root / "a" / "b" / ".mcp.json").write_text("{}", encoding="utf-8")
    home = (tmp_path / "home").resolve()
    (home / "dotfiles" / "kube").mkdir(parents=True)
    (home / ".kube").symlink_to("dotfiles/kube")
    (home / ".netrc").write_text("machine x password y\n", encoding="utf-8")
    policy = project_policy(root, hidden=(home / ".kube", home / ".netrc", home / ".aws"))
    assert policy.hidden == (home / "dotfiles" / "kube", home / ".netrc")
    nested = [root / "sub" / ".keel", root / "a" / "b" / ".mcp.json"]
    assert [p for p in policy.protected if p in nested] == nested  # node_modules not walked
    assert not [p for p in policy.protected if "node_modules" in p.parts]
    holder = Placeholders(root)
    holder.hold(policy)
    try:
        argv = bwrap_argv(policy, ["true"], root, bwrap="bwrap")
    finally:
        holder.release()
    pairs = list(zip(argv, argv[1:], argv[2:], strict=False))
    binds = [Path(a) for flag, a, b in pairs if flag == "--bind" and a == b]
    assert sorted(binds) == [root, root / ".git", root / "a", root / "a" / "b", root / "sub"]
    depths = [len(p.parts) for p in binds]
    assert depths == sorted(depths)  # `a` bound after `a/b` would cover the `a/b` bind
    assert [(a, b) for flag, a, b in pairs if flag == "--ro-bind" and b.startswith(str(home))] == [
        ("/dev/null", str(home / ".netrc"))
    ]
    assert [a for flag, a, _ in pairs if flag == "--tmpfs" and a.startswith(str(home))] == [
        str(home / "dotfiles" / "kube")
    ]
    last_bind = max(i for i, flag in enumerate(argv) if flag in ("--bind", "--ro-bind"))
    assert argv[last_bind : last_bind + 3] == ["--ro-bind", "/dev/null", str(home / ".netrc")]
    profile = seatbelt_profile(policy)
    for hidden in policy.hidden:
        assert last_rule_for(profile, "file-read-data", str(hidden)) == "deny"
    for path in nested:
        assert last_rule_for(profile, "file-write-data", f"{path}/x") == "deny"
    for pinned in (root / "a", root / "a" / "b", root / "sub"):
        assert last_rule_for(profile, "file-write-unlink", str(pinned)) == "deny"
    assert last_rule_for(profile, "file-write-data", f"{root}/a/b/notes.txt") == "allow"


def test_what_is_hidden_follows_links_and_skips_what_is_missing(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".config" / "gh").mkdir(parents=True)
    (home / ".config" / "gh" / "hosts.yml").write_text("token\n", encoding="utf-8")
    (home / ".npmrc").symlink_to("nowhere")  # dangling: nothing to hide
    (home / ".aws").symlink_to(home)  # would hide the project: skipped
    (home / "kube.yaml").write_text("token\n", encoding="utf-8")
    elsewhere = tmp_path / "xdg-config"
    env = {
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(elsewhere),
        "KUBECONFIG": f"{home / 'kube.yaml'}:relative/ignored.yaml",
        "CARGO_HOME": str(tmp_path / "cargo"),
        "KEEL_HOME": str(tmp_path / "keel-data"),
    }
    named = hidden_candidates(
        hide=(home / "extra", home / ".config"), unhide=(home / ".ssh", home / ".cargo"), env=env
    )
    assert home / ".ssh" not in named
    assert not [p for p in named if p.is_relative_to(home / ".cargo")]
    assert {
        home / ".config" / "gh",
        elsewhere / "gh",
        home / "kube.yaml",
        tmp_path / "cargo" / "credentials.toml",
        tmp_path / "keel-data" / "mcp-auth",
        home / ".gnupg",
    } <= set(named)
    assert named[-2:] == (home / "extra", home / ".config")  # `hide` last
    root = home / "project"
    root.mkdir()
    # `.config` is hidden whole, so `.config/gh` inside it is left to it.
    assert hidden_targets(named, root) == (home / "kube.yaml", home / ".config")


def test_on_macos_the_sandbox_wraps_commands_in_sandbox_exec(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The platform switch (the command itself cannot run here): what bash would execute."""
    root = tmp_path / "project"
    root.mkdir()
    box = Sandbox(root, tmpdir=tmp_path / "tmp", extra_writable=(), hidden=())
    monkeypatch.setattr(sys, "platform", "darwin")
    try:
        argv = box.argv(["bash", "-c", "make"], root)
    finally:
        box.release()
    assert argv == [SANDBOX_EXEC, "-p", seatbelt_profile(box.policy()), "bash", "-c", "make"]
    assert argv == seatbelt_argv(box.policy(), ["bash", "-c", "make"])
    assert not any(root.iterdir())  # no placeholders: Seatbelt rules name missing paths
    env = box.env({"PATH": "/usr/bin", "GITHUB_TOKEN": "x", "HOME": "/Users/dev"})
    assert env == {
        "PATH": "/usr/bin",
        "HOME": "/Users/dev",
        "TMPDIR": str(tmp_path / "tmp"),
        "TMP": str(tmp_path / "tmp"),
        "TEMP": str(tmp_path / "tmp"),
        "KEEL_SANDBOX": "1",
    }


@pytest.mark.skipif(sys.platform != "darwin", reason="sandbox-exec runs on macOS only")
def test_on_macos_a_write_outside_the_project_is_refused(tmp_path: Path) -> None:
    root = tmp_path.resolve() / "project"
    root.mkdir()
    outside = tmp_path.resolve() / "outside"
    box = Sandbox(root, hidden=())
    argv = box.argv(["/bin/sh", "-c", f"touch {outside}; touch {root}/inside"], root)
    done = subprocess.run(argv, cwd=root, capture_output=True, text=True, check=False)
    assert not outside.exists(), done.stderr
    assert (root / "inside").exists(), done.stderr
