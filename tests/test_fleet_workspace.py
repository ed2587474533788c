"""Fleet workspaces (keel.fleet.workspace) with real git: the "remote" is a bare repository in
tmp_path, each "worker" a scratch directory of its own. The attack tests each check first that
their payload really runs under plain git, then that it does not run under the workspace."""

from __future__ import annotations

import os
import stat
import subprocess
import time
from pathlib import Path

import pytest

from keel.errors import UserError
from keel.fleet import workspace as ws_module
from keel.fleet.workspace import (
    LOSS,
    Workspace,
    WorkspaceConflict,
    WorkspaceError,
    WorkspaceSpec,
    check_git_url,
    git,
    git_env,
    parse_workspace,
)

pytestmark = pytest.mark.needs("git")

RUN = "20261201-120000-abc123"
BRANCH = f"keel/run-{RUN}"
IDENTITY = {
    "GIT_AUTHOR_NAME": "Test",
    "GIT_AUTHOR_EMAIL": "test@example.invalid",
    "GIT_COMMITTER_NAME": "Test",
    "GIT_COMMITTER_EMAIL": "test@example.invalid",
}


def sh(*args: str, cwd: Path, env: dict[str, str] | None = None, check: bool = True) -> str:
    """Plain git (the test's own, not the workspace's): what a user or an attacker would run."""
    result = subprocess.run(
        ["git", *args],
        cwd=cwd,
        env={**os.environ, **IDENTITY, **(env or {})},
        capture_output=True,
        check=False,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"git {args} failed: {result.stderr.decode()}")
    return result.stdout.decode().strip()


def make_remote(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A bare repository with `main` (a.txt, b.txt; its HEAD), `dev` (adds dev.txt) and a tag
    `v1` on main's first commit. Returns it and the commits by name."""
    remote = tmp_path / "remote.git"
    sh("init", "--quiet", "--bare", "--initial-branch=main", str(remote), cwd=tmp_path)
    seed = tmp_path / "seed"
    sh("init", "--quiet", "--initial-branch=main", str(seed), cwd=tmp_path)
    (seed / "a.txt").write_text("a1\n", encoding="utf-8")
    (seed / "b.txt").write_text("b1\n", encoding="utf-8")
    sh("add", "-A", cwd=seed)
    sh("commit", "--quiet", "-m", "first", cwd=seed)
    first = sh("rev-parse", "HEAD", cwd=seed)
    sh("tag", "v1", cwd=seed)
    (seed / "a.txt").write_text("a2\n", encoding="utf-8")
    sh("commit", "--quiet", "-am", "second", cwd=seed)
    main = sh("rev-parse", "HEAD", cwd=seed)
    sh("checkout", "--quiet", "-b", "dev", cwd=seed)
    (seed / "dev.txt").write_text("dev\n", encoding="utf-8")
    sh("add", "-A", cwd=seed)
    sh("commit", "--quiet", "-m", "dev", cwd=seed)
    dev = sh("rev-parse", "HEAD", cwd=seed)
    sh("push", "--quiet", str(remote), "main", "dev", "v1", cwd=seed)
    return remote, {"first": first, "main": main, "dev": dev}


@pytest.fixture(autouse=True)
def shared_roots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """This worker shares tmp_path with runs (path workspaces, local remotes)."""
    monkeypatch.setenv("KEEL_WORKSPACE_ROOTS", str(tmp_path))


@pytest.fixture
def remote(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    return make_remote(tmp_path)


def remote_branch(remote: Path, branch: str = BRANCH) -> str | None:
    out = sh("rev-parse", "--verify", "-q", f"refs/heads/{branch}", cwd=remote, check=False)
    return out or None


def remote_files(remote: Path, commit: str) -> dict[str, str]:
    """Each path of `commit` and its content (a gitlink: `gitlink <commit>`)."""
    found = {}
    for line in sh("ls-tree", "-r", commit, cwd=remote).splitlines():
        meta, name = line.split("\t", 1)
        _, kind, sha = meta.split()
        found[name] = f"gitlink {sha}" if kind == "commit" else sh("show", sha, cwd=remote)
    return found


def files(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): p.read_text(encoding="utf-8")
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".git" not in p.relative_to(root).parts
    }


def prepare(remote: Path, scratch: Path, ref: str = "", **kw: object) -> Workspace:
    spec = parse_workspace({"git": str(remote), "ref": ref} if ref else {"git": str(remote)})
    return Workspace.prepare(spec, RUN, scratch, **kw)  # type: ignore[arg-type]


# --- specs -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "spec"),
    [
        ("git:/srv/repo.git#main", WorkspaceSpec("git", url="/srv/repo.git", ref="main")),
        ("git:/srv/repo.git", WorkspaceSpec("git", url="/srv/repo.git")),
        (
            "git:https://example.invalid/org/repo.git#v1.2",
            WorkspaceSpec("git", url="https://example.invalid/org/repo.git", ref="v1.2"),
        ),
        (
            "git:git@example.invalid:org/repo.git#feature/x",
            WorkspaceSpec("git", url="git@example.invalid:org/repo.git", ref="feature/x"),
        ),
        ("git:file:///srv/r.git", WorkspaceSpec("git", url="file:///srv/r.git")),
        (
            "git:ssh://git@example.invalid/r.git",
            WorkspaceSpec("git", url="ssh://git@example.invalid/r.git"),
        ),
        ("path:/shared/dir/", WorkspaceSpec("path", path="/shared/dir")),
        ("none", WorkspaceSpec("none")),
        ("", WorkspaceSpec("none")),
        (None, WorkspaceSpec("none")),
        ({}, WorkspaceSpec("none")),
        ({"git": "/srv/r.git", "ref": "main"}, WorkspaceSpec("git", url="/srv/r.git", ref="main")),
        ({"git": "git://example.invalid/r"}, WorkspaceSpec("git", url="git://example.invalid/r")),
        ({"path": "/shared"}, WorkspaceSpec("path", path="/shared")),
        ('{"git": "/srv/r.git", "ref": "dev"}', WorkspaceSpec("git", url="/srv/r.git", ref="dev")),
    ],
)
def test_parse_workspace_forms(given: object, spec: WorkspaceSpec) -> None:
    parsed = parse_workspace(given)  # type: ignore[arg-type]
    assert parsed == spec
    # Both serialised forms read back to the same spec.
    assert parse_workspace(parsed.to_dict()) == spec
    assert parse_workspace(parsed.text()) == spec


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("ext::sh -c touch% /tmp/x", "remote-helper transports"),
        ("fd::3", "remote-helper transports"),
        ("foo::bar", "remote-helper transports"),
        ("http://example.invalid/r.git", "plain http is not allowed"),
        ("ftp://example.invalid/r.git", "transport 'ftp' is not allowed"),
        ("rsync://example.invalid/r.git", "transport 'rsync' is not allowed"),
        ("relative/repo", "a local repository must be an absolute path"),
        ("./repo", "a local repository must be an absolute path"),
        ("--upload-pack=touch /tmp/x", "starts with '-'"),
        ("-u", "starts with '-'"),
        ("ssh://-oProxyCommand=touch%20x/r.git", "user or host starts with '-'"),
        ("ssh://%2DoProxyCommand=x@host/r.git", "user or host starts with '-'"),
        ("-oProxyCommand=x:repo", "starts with '-'"),
        ("git@-oProxyCommand=x:repo", "user or host starts with '-'"),
        ("https://user:s3cret@example.invalid/r.git", "it carries a password"),
        ("file://otherhost/srv/r.git", "a file URL names a local path"),
        ("https:///r.git", "it has no host"),
        ("https://[::1/r.git", "it is not a valid URL"),
        ("ssh://host:-oProxyCommand=x/r.git", "it is not a valid URL"),
        ("https://user:s3cret@[::1/r.git", "it is not a valid URL"),
        ("/srv/r.git\n--upload-pack=x", "control characters"),
        ("", "no URL"),
    ],
)
def test_refused_git_urls(given: str, message: str) -> None:
    with pytest.raises(WorkspaceError) as err:
        parse_workspace({"git": given})
    line = err.value.one_line()
    assert message in line
    assert "\n" not in line
    assert err.value.hint
    assert "s3cret" not in line


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"git": "/r", "ref": "--output=/tmp/x"}, "is not a branch, tag or commit name"),
        ({"git": "/r", "ref": "main~1"}, "is not a branch, tag or commit name"),
        ({"git": "/r", "ref": "a..b"}, "is not a branch, tag or commit name"),
        ({"git": "/r", "path": "/x"}, "unknown or conflicting keys"),
        ({"path": "/x", "ref": "main"}, "unknown or conflicting keys"),
        ({"svn": "/x"}, "unknown or conflicting keys"),
        ({"path": "relative"}, "is not an absolute path"),
        ({"path": 3}, "must be a string"),
        ("path:relative/dir", "is not an absolute path"),
        ("/srv/repo", "is not one keel knows"),
        ("svn:/srv/repo", "is not one keel knows"),
        ("{not json", "is not valid JSON"),
        ("[1]", "is not one keel knows"),
    ],
)
def test_refused_specs(given: object, message: str) -> None:
    with pytest.raises(WorkspaceError) as err:
        parse_workspace(given)  # type: ignore[arg-type]
    assert message in err.value.one_line()
    assert "\n" not in err.value.one_line()


def test_loss_is_stated_for_every_kind() -> None:
    assert sorted(LOSS) == ["git", "none", "path"]
    assert "tool round in flight" in LOSS["git"]
    assert "half-applied" in LOSS["path"]
    assert "empty directory" in LOSS["none"]


# --- git: clone, save, resume ----------------------------------------------------------------


def test_clone_creates_the_run_branch_from_the_ref(
    remote: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    repo, commits = remote
    ws = prepare(repo, tmp_path / "worker-a", ref="dev")
    assert ws.path == tmp_path / "worker-a" / RUN / "work"
    assert ws.resumed_from is None
    assert stat.S_IMODE((tmp_path / "worker-a" / RUN).stat().st_mode) == 0o700
    assert stat.S_IMODE(ws.path.stat().st_mode) == 0o700
    assert sh("symbolic-ref", "HEAD", cwd=ws.path) == f"refs/heads/{BRANCH}"
    assert sh("rev-parse", "HEAD", cwd=ws.path) == commits["dev"]
    assert files(ws.path) == {"a.txt": "a2\n", "b.txt": "b1\n", "dev.txt": "dev\n"}
    assert remote_branch(repo) == commits["dev"]  # pinned: a resume starts here whatever dev does
    assert ws.describe() == f"git {repo} at dev, saved to {BRANCH}"


@pytest.mark.parametrize(
    ("ref", "name"), [("", "main"), ("main", "main"), ("v1", "first"), ("@first", "first")]
)
def test_ref_defaults_to_the_remote_head_and_may_be_a_tag_or_commit(
    remote: tuple[Path, dict[str, str]], tmp_path: Path, ref: str, name: str
) -> None:
    repo, commits = remote
    ws = prepare(repo, tmp_path / "w", ref=commits[ref[1:]] if ref.startswith("@") else ref)
    assert sh("rev-parse", "HEAD", cwd=ws.path) == commits[name]
    assert remote_branch(repo) == commits[name]


def test_a_moved_ref_does_not_move_a_started_run(
    remote: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    repo, commits = remote
    prepare(repo, tmp_path / "worker-a", ref="main")
    sh("update-ref", "refs/heads/main", commits["dev"], cwd=repo)  # main moves on
    b = prepare(repo, tmp_path / "worker-b", ref="main")
    assert b.resumed_from == commits["main"]
    assert files(b.path) == {"a.txt": "a2\n", "b.txt": "b1\n"}


def test_two_workers_starting_together_the_second_is_refused(
    remote: tuple[Path, dict[str, str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo, commits = remote
    real = Workspace._start_commit
    first: list[Workspace] = []

    def a_starts_in_between(self: Workspace) -> str | None:
        # B has cloned (no run branch yet); A prepares the run before B pins its start.
        monkeypatch.setattr(Workspace, "_start_commit", real)
        first.append(prepare(repo, tmp_path / "worker-a", ref="dev"))
        return real(self)

    monkeypatch.setattr(Workspace, "_start_commit", a_starts_in_between)
    with pytest.raises(WorkspaceConflict):
        prepare(repo, tmp_path / "worker-b", ref="main")
    assert not (tmp_path / "worker-b" / RUN).exists()
    assert remote_branch(repo) == commits["dev"]
    assert first[0].resumed_from is None


def test_unknown_ref_is_one_line(remote: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    repo, _ = remote
    with pytest.raises(WorkspaceError) as err:
        prepare(repo, tmp_path / "w", ref="nope")
    assert err.value.one_line() == (
        f"ref 'nope' is not a branch, tag or commit of {repo} "
        "(hint: check the ref (a commit must be reachable from a branch or tag))"
    )
    assert not (tmp_path / "w" / RUN).exists()  # a failed prepare leaves nothing behind


def test_unreachable_remote_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(WorkspaceError) as err:
        prepare(tmp_path / "missing.git", tmp_path / "w")
    line = err.value.one_line()
    assert line.startswith("git clone failed: fatal:")
    assert "(hint: check the URL and that this worker can reach the remote" in line
    assert "\n" not in line


def test_save_commits_and_pushes_the_round(
    remote: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    repo, commits = remote
    ws = prepare(repo, tmp_path / "w")
    (ws.path / "a.txt").write_text("edited\n", encoding="utf-8")
    (ws.path / "b.txt").unlink()
    (ws.path / "new" / "deep").mkdir(parents=True)
    (ws.path / "new" / "deep" / "c.txt").write_text("c\n", encoding="utf-8")
    commit = ws.save("round 1: edit a, remove b, add c")
    assert commit is not None
    assert remote_branch(repo) == commit
    assert remote_files(repo, commit) == {"a.txt": "edited", "new/deep/c.txt": "c"}
    fmt = "%an <%ae>|%cn <%ce>|%P|%B"
    assert sh("log", "-1", f"--format={fmt}", commit, cwd=repo) == (
        f"keel <keel@localhost>|keel <keel@localhost>|{commits['main']}|round 1: edit a, remove b, add c"
    )
    assert sh("symbolic-ref", "HEAD", cwd=ws.path) == f"refs/heads/{BRANCH}"
    assert sh("rev-parse", "HEAD", cwd=ws.path) == commit
    assert sh("status", "--porcelain", cwd=ws.path) == ""
    # The next round builds on it.
    (ws.path / "a.txt").write_text("edited twice\n", encoding="utf-8")
    second = ws.save("round 2")
    assert second is not None
    assert remote_branch(repo) == second
    assert sh("rev-parse", f"{second}^", cwd=repo) == commit


def test_nothing_changed_is_one_git_status_and_no_commit(
    remote: tuple[Path, dict[str, str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo, _ = remote
    ws = prepare(repo, tmp_path / "w")
    (ws.path / "a.txt").write_text("x\n", encoding="utf-8")
    first = ws.save("round 1")
    calls: list[list[str]] = []
    real = ws_module.git

    def counting(args: list[str], **kw: object) -> subprocess.CompletedProcess[bytes]:
        calls.append(args)
        return real(args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(ws_module, "git", counting)
    started = time.perf_counter()
    assert ws.save("round 2: no changes") is None
    elapsed = time.perf_counter() - started
    assert [c[4] for c in calls] == ["status"]  # after --git-dir X --work-tree Y
    assert remote_branch(repo) == first
    print(f"save with no changes: {elapsed * 1000:.1f} ms")


def test_a_resuming_worker_checks_out_the_run_branch(
    remote: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    repo, _ = remote
    a = prepare(repo, tmp_path / "worker-a", ref="dev")
    (a.path / "a.txt").write_text("from a\n", encoding="utf-8")
    saved = a.save("round 1")
    # Worker B (another scratch dir) picks the run up; the ref no longer matters.
    b = prepare(repo, tmp_path / "worker-b", ref="main")
    assert b.resumed_from == saved
    assert sh("symbolic-ref", "HEAD", cwd=b.path) == f"refs/heads/{BRANCH}"
    assert files(b.path) == {"a.txt": "from a\n", "b.txt": "b1\n", "dev.txt": "dev\n"}
    assert b.describe() == f"git {repo} at main, saved to {BRANCH} (resumed from {saved[:12]})"  # type: ignore[index]
    (b.path / "b.txt").write_text("from b\n", encoding="utf-8")
    later = b.save("round 2")
    assert remote_branch(repo) == later
    assert sh("rev-parse", f"{later}^", cwd=repo) == saved


def test_a_lost_round_leaves_only_the_saved_rounds(
    remote: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    repo, _ = remote
    a = prepare(repo, tmp_path / "worker")
    (a.path / "a.txt").write_text("round 1\n", encoding="utf-8")
    a.save("round 1")
    (a.path / "b.txt").write_text("round 2, never saved\n", encoding="utf-8")
    (a.path / "lost.txt").write_text("lost\n", encoding="utf-8")
    # The worker dies: its clone is gone (or stale); the same machine prepares the run again.
    again = prepare(repo, tmp_path / "worker")
    assert files(again.path) == {"a.txt": "round 1\n", "b.txt": "b1\n"}


def test_two_workers_racing_the_second_is_refused(
    remote: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    repo, _ = remote
    a = prepare(repo, tmp_path / "worker-a")
    b = prepare(repo, tmp_path / "worker-b")
    (a.path / "a.txt").write_text("a wins\n", encoding="utf-8")
    (b.path / "a.txt").write_text("b loses\n", encoding="utf-8")
    kept = a.save("a's round")
    with pytest.raises(WorkspaceConflict) as err:
        b.save("b's round")
    assert err.value.one_line() == (
        f"another worker moved {BRANCH} since this one last saved it; this worker no longer owns "
        "the run (hint: stop this run here: the worker that moved the branch carries it on)"
    )
    assert remote_branch(repo) == kept
    # Both resume from the saved round; again only the first to save keeps the branch, and the
    # stale one stays refused however often it tries.
    c = prepare(repo, tmp_path / "worker-c")
    d = prepare(repo, tmp_path / "worker-d")
    assert c.resumed_from == d.resumed_from == kept
    (c.path / "c.txt").write_text("c\n", encoding="utf-8")
    (d.path / "d.txt").write_text("d\n", encoding="utf-8")
    newer = c.save("c's round")
    assert newer is not None
    for _ in range(2):
        with pytest.raises(WorkspaceConflict):
            d.save("d's round")
    assert remote_branch(repo) == newer
    assert remote_files(repo, newer) == {"a.txt": "a wins", "b.txt": "b1", "c.txt": "c"}


def test_a_failed_push_is_retried_by_the_next_save(
    remote: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    repo, commits = remote
    ws = prepare(repo, tmp_path / "w")
    (ws.path / "a.txt").write_text("x\n", encoding="utf-8")
    away = tmp_path / "away.git"
    repo.rename(away)
    with pytest.raises(WorkspaceError) as err:
        ws.save("round 1")
    assert err.value.one_line().startswith(f"git push of {BRANCH} failed:")
    away.rename(repo)
    assert remote_branch(repo) == commits["main"]
    commit = ws.save("round 2: nothing new, the commit of round 1 goes out")
    assert commit is not None
    assert remote_branch(repo) == commit
    assert remote_files(repo, commit)["a.txt"] == "x"


def test_a_commit_the_agent_made_itself_is_pushed(
    remote: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    repo, _ = remote
    ws = prepare(repo, tmp_path / "w")
    (ws.path / "a.txt").write_text("agent\n", encoding="utf-8")
    sh("commit", "--quiet", "-am", "agent's own commit", cwd=ws.path)
    commit = ws.save("round 1")
    assert commit == sh("rev-parse", "HEAD", cwd=ws.path)
    assert remote_branch(repo) == commit


def test_an_empty_remote_gets_a_root_commit(tmp_path: Path) -> None:
    repo = tmp_path / "empty.git"
    sh("init", "--quiet", "--bare", str(repo), cwd=tmp_path)
    ws = prepare(repo, tmp_path / "w")
    assert files(ws.path) == {}
    assert ws.save("nothing yet") is None
    (ws.path / "first.txt").write_text("1\n", encoding="utf-8")
    commit = ws.save("round 1")
    assert commit is not None
    assert remote_files(repo, commit) == {"first.txt": "1"}
    assert sh("log", "--format=%P", commit, cwd=repo) == ""


def test_ignored_files_are_not_saved(remote: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    repo, _ = remote
    ws = prepare(repo, tmp_path / "w")
    (ws.path / ".gitignore").write_text("build/\n", encoding="utf-8")
    (ws.path / "build").mkdir()
    (ws.path / "build" / "out.o").write_text("binary\n", encoding="utf-8")
    commit = ws.save("round 1")
    assert commit is not None
    assert sorted(remote_files(repo, commit)) == [".gitignore", "a.txt", "b.txt"]


def test_cleanup_removes_the_clone(remote: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    repo, commits = remote
    ws = prepare(repo, tmp_path / "w")
    ws.cleanup()
    assert not (tmp_path / "w" / RUN).exists()
    assert (tmp_path / "w").is_dir()
    assert remote_branch(repo) == commits["main"]


def test_a_bad_run_id_is_refused_before_anything_is_made(tmp_path: Path) -> None:
    with pytest.raises(UserError) as err:  # from check_run_id
        Workspace.prepare(WorkspaceSpec("none"), "../escape", tmp_path / "w")
    assert "is not a run id" in err.value.one_line()
    assert not (tmp_path / "w").exists()
    assert not (tmp_path / "escape").exists()


# --- attacks ----------------------------------------------------------------------------------


def test_ext_transport_cannot_run_a_command(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    url = f"ext::sh -c touch% {marker}"
    # The payload is real: plain git with ext allowed runs it.
    sh(
        "-c",
        "protocol.ext.allow=always",
        "clone",
        url,
        str(tmp_path / "plain"),
        cwd=tmp_path,
        check=False,
    )
    assert marker.exists()
    marker.unlink()
    # Refused at parse time, at prepare time (a spec built by hand), and by git's own transport
    # policy as keel runs git (if a URL check were ever bypassed).
    with pytest.raises(WorkspaceError, match="remote-helper transports"):
        parse_workspace(f"git:{url}")
    with pytest.raises(WorkspaceError, match="remote-helper transports"):
        Workspace.prepare(WorkspaceSpec("git", url=url), RUN, tmp_path / "w")
    result = git(
        ["clone", url, str(tmp_path / "direct")],
        cwd=tmp_path,
        env=git_env({**os.environ, "GIT_ALLOW_PROTOCOL": "ext"}),
        check=False,
    )
    assert result.returncode != 0
    assert b"transport 'ext' not allowed" in result.stderr
    assert not marker.exists()


def test_upload_pack_option_injection_cannot_run_a_command(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    url = f"--upload-pack=touch {marker};"
    with pytest.raises(WorkspaceError, match="starts with '-'"):
        check_git_url(url)
    with pytest.raises(WorkspaceError, match="starts with '-'"):
        Workspace.prepare(WorkspaceSpec("git", url=url), RUN, tmp_path / "w")
    assert not marker.exists()


def hook_dir(root: Path, marker: Path) -> Path:
    """A directory of every hook a clone, checkout, commit or push could run, each creating
    `marker` (with its name)."""
    hooks = root / "hooks"
    hooks.mkdir(parents=True)
    names = (
        "post-checkout", "pre-commit", "commit-msg", "post-commit", "pre-push", "post-merge",
        "reference-transaction", "post-index-change", "pre-receive", "update", "post-receive",
        "fsmonitor-watchman",
    )  # fmt: skip
    for name in names:
        hook = hooks / name
        hook.write_text(f"#!/bin/sh\necho {name} >> {marker}\n", encoding="utf-8")
        hook.chmod(0o755)
    return hooks


def test_hooks_from_templates_and_config_never_run(
    remote: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    repo, _ = remote
    marker = tmp_path / "pwned"
    template = tmp_path / "template"
    hooks = hook_dir(template, marker)
    global_config = tmp_path / "gitconfig"
    global_config.write_text(
        f"[init]\n\ttemplateDir = {template}\n[core]\n\thooksPath = {hooks}\n", encoding="utf-8"
    )
    env = {**os.environ, "GIT_CONFIG_GLOBAL": str(global_config), "GIT_TEMPLATE_DIR": str(template)}
    # The payload is real: plain git with this environment runs the hooks on clone.
    sh("clone", "--quiet", str(repo), str(tmp_path / "plain"), cwd=tmp_path, env=env)
    assert "post-checkout" in marker.read_text(encoding="utf-8")
    marker.unlink()
    # The remote itself is hostile too: its config names hooks and an fsmonitor.
    sh("config", "core.hooksPath", str(hooks), cwd=repo)
    sh("config", "core.fsmonitor", f"echo fsmonitor >> {marker}; false", cwd=repo)
    ws = prepare(repo, tmp_path / "w", env=env)
    assert not (ws.path / ".git" / "hooks").exists()
    (ws.path / "a.txt").write_text("x\n", encoding="utf-8")
    assert ws.save("round 1") is not None
    assert ws.save("round 2") is None
    b = prepare(repo, tmp_path / "w2", env=env)
    assert b.resumed_from is not None
    assert not marker.exists()


def test_a_hostile_source_repository_config_runs_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    source = tmp_path / "source"
    sh("init", "--quiet", "--initial-branch=main", str(source), cwd=tmp_path)
    (source / "f.txt").write_text("f\n", encoding="utf-8")
    sh("add", "-A", cwd=source)
    sh("commit", "--quiet", "-m", "f", cwd=source)
    hooks = hook_dir(tmp_path / "h", marker)
    for key, value in (
        ("core.hooksPath", str(hooks)),
        ("core.fsmonitor", f"echo fsmonitor >> {marker}; false"),
        ("uploadpack.packObjectsHook", f"echo pack >> {marker}; false"),
        ("core.sshCommand", f"echo ssh >> {marker}; false"),
    ):
        sh("config", key, value, cwd=source)
    sh("status", cwd=source)  # the payload is real: git in that repository runs its fsmonitor
    assert "fsmonitor" in marker.read_text(encoding="utf-8")
    marker.unlink()
    ws = Workspace.prepare(parse_workspace(f"git:{source}"), RUN, tmp_path / "w")
    assert files(ws.path) == {"f.txt": "f\n"}
    assert not marker.exists()


def nested_hostile_repo(parent: Path, marker: Path) -> Path:
    """What an agent can write inside its sandbox: a nested repository whose config (outside
    the protected top-level .git) has a clean filter that runs a command."""
    sub = parent / "sub"
    sh("init", "--quiet", str(sub), cwd=parent)
    (sub / "f").write_text("1\n", encoding="utf-8")
    (sub / ".gitattributes").write_text("f filter=evil\n", encoding="utf-8")
    sh("add", "-A", cwd=sub)
    sh("commit", "--quiet", "-m", "s", cwd=sub)
    sh("config", "filter.evil.clean", f"echo clean >> {marker}; cat", cwd=sub)
    sh("config", "core.fsmonitor", f"echo fsmonitor >> {marker}; false", cwd=sub)
    (sub / "f").write_text("2\n", encoding="utf-8")
    return sub


def test_a_nested_repository_the_agent_made_runs_nothing_and_is_left_out(
    remote: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    repo, _ = remote
    marker = tmp_path / "pwned"
    # The payload is real: plain `git add -A` in the parent runs the nested clean filter once the
    # nested repository is a gitlink in the index.
    plain = tmp_path / "plain"
    sh("clone", "--quiet", str(repo), str(plain), cwd=tmp_path)
    nested_hostile_repo(plain, marker)
    sh("add", "sub", cwd=plain)
    sh("add", "-A", cwd=plain)
    assert "clean" in marker.read_text(encoding="utf-8")
    marker.unlink()

    ws = prepare(repo, tmp_path / "w")
    nested_hostile_repo(ws.path, marker)
    (ws.path / "a.txt").write_text("round 1\n", encoding="utf-8")
    commit = ws.save("round 1")
    assert ws.skipped == ("sub",)
    assert commit is not None
    assert sorted(remote_files(repo, commit)) == ["a.txt", "b.txt"]
    (ws.path / "sub" / "f").write_text("3\n", encoding="utf-8")
    assert ws.save("round 2: only the nested repository changed") is None
    # The agent stages it as a gitlink itself (its git inside the sandbox): keel's save still
    # does not look inside; the commit carries the gitlink as staged (a pointer, no content).
    sh("add", "sub", cwd=ws.path)
    sub_head = sh("rev-parse", "HEAD", cwd=ws.path / "sub")
    (ws.path / "sub" / "f").write_text("4\n", encoding="utf-8")
    (ws.path / "b.txt").write_text("round 3\n", encoding="utf-8")
    third = ws.save("round 3")
    assert third is not None
    assert remote_files(repo, third) == {
        "a.txt": "round 1",
        "b.txt": "round 3",
        "sub": f"gitlink {sub_head}",
    }
    assert list(ws.skipped) == []
    assert ws.save("round 4: nothing") is None
    assert not marker.exists()


def test_a_changed_git_config_is_refused(
    remote: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    repo, commits = remote
    marker = tmp_path / "pwned"
    ws = prepare(repo, tmp_path / "w")
    # Something got past the sandbox and wrote the clone's config: a clean filter for every file.
    with (ws.path / ".git" / "config").open("a", encoding="utf-8") as config:
        config.write(f'[filter "evil"]\n\tclean = "echo clean >> {marker}; cat"\n')
    (ws.path / ".gitattributes").write_text("* filter=evil\n", encoding="utf-8")
    (ws.path / "a.txt").write_text("x\n", encoding="utf-8")
    with pytest.raises(WorkspaceError) as err:
        ws.save("round 1")
    assert err.value.one_line() == (
        f"the workspace's .git in {ws.path} was changed during the run; keel will not run git "
        "under a configuration it did not write (hint: the run's saved rounds are on its run "
        "branch; resume it on another worker)"
    )
    assert not marker.exists()
    assert remote_branch(repo) == commits["main"]


@pytest.mark.parametrize("how", ["gitfile", "commondir"])
def test_a_redirected_git_dir_is_refused(
    remote: tuple[Path, dict[str, str]], tmp_path: Path, how: str
) -> None:
    repo, _ = remote
    marker = tmp_path / "pwned"
    ws = prepare(repo, tmp_path / "w")
    evil = tmp_path / "evil"
    sh("init", "--quiet", str(evil), cwd=tmp_path)
    sh("config", "core.fsmonitor", f"echo fsmonitor >> {marker}; false", cwd=evil)
    if how == "gitfile":
        os.rename(ws.path / ".git", tmp_path / "moved")
        (ws.path / ".git").write_text(f"gitdir: {evil / '.git'}\n", encoding="utf-8")
    else:
        (ws.path / ".git" / "commondir").write_text(f"{evil / '.git'}\n", encoding="utf-8")
    with pytest.raises(WorkspaceError, match="was changed during the run"):
        ws.save("round 1")
    assert not marker.exists()


# --- path and none ---------------------------------------------------------------------------


def test_a_missing_path_workspace_is_one_line(tmp_path: Path) -> None:
    spec = parse_workspace(f"path:{tmp_path / 'missing'}")
    with pytest.raises(WorkspaceError) as err:
        Workspace.prepare(spec, RUN, tmp_path / "w")
    assert err.value.one_line() == (
        f"workspace path {tmp_path / 'missing'} is not a directory on this worker "
        "(hint: mount the shared filesystem at the same path on every worker)"
    )


def test_a_path_workspace_is_used_in_place_and_kept(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "f.txt").write_text("f\n", encoding="utf-8")
    ws = Workspace.prepare(parse_workspace({"path": str(shared)}), RUN, tmp_path / "w")
    assert ws.path == shared
    assert ws.resumed_from is None
    (shared / "g.txt").write_text("g\n", encoding="utf-8")
    assert ws.save("round 1") is None
    ws.cleanup()
    assert files(shared) == {"f.txt": "f\n", "g.txt": "g\n"}
    assert not (tmp_path / "w").exists()
    assert ws.describe() == f"path {shared} (shared, used in place)"


def test_none_is_an_empty_private_dir_every_time(tmp_path: Path) -> None:
    ws = Workspace.prepare(parse_workspace("none"), RUN, tmp_path / "w")
    assert ws.path == tmp_path / "w" / RUN / "work"
    assert list(ws.path.iterdir()) == []
    assert stat.S_IMODE(ws.path.stat().st_mode) == 0o700
    assert stat.S_IMODE(ws.path.parent.stat().st_mode) == 0o700
    (ws.path / "scratch.txt").write_text("x\n", encoding="utf-8")
    assert ws.save("round 1") is None
    assert ws.describe() == f"none (private scratch directory {ws.path}, not kept)"
    again = Workspace.prepare(parse_workspace({}), RUN, tmp_path / "w")
    assert list(again.path.iterdir()) == []
    again.cleanup()
    assert not (tmp_path / "w" / RUN).exists()


def test_a_push_stored_but_unanswered_is_not_a_conflict(
    remote: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    repo, _ = remote
    ws = prepare(repo, tmp_path / "w")
    (ws.path / "a.txt").write_text("x\n", encoding="utf-8")
    repo.rename(tmp_path / "away.git")  # round 1's push fails: the remote is away
    with pytest.raises(WorkspaceError):
        ws.save("round 1")
    (tmp_path / "away.git").rename(repo)
    head = sh("rev-parse", "HEAD", cwd=ws.path)
    # ... but say it was in fact stored and only the answer was lost.
    sh("push", "--quiet", "origin", f"HEAD:refs/heads/{BRANCH}", cwd=ws.path)
    assert ws.save("round 2") == head
    assert ws.pushed == head
    (ws.path / "b.txt").write_text("y\n", encoding="utf-8")
    later = ws.save("round 3")
    assert later is not None
    assert remote_branch(repo) == later


def test_resume_note_says_when_edits_were_lost(
    remote: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    repo, _ = remote
    a = prepare(repo, tmp_path / "worker-a")
    before = a.pushed
    assert before == sh("rev-parse", "refs/heads/main", cwd=repo)  # the pinned start
    (a.path / "a.txt").write_text("round 1\n", encoding="utf-8")
    saved = a.save("round 1")
    assert a.pushed == saved
    assert a.save("round 2: nothing") is None
    assert a.pushed == saved
    b = prepare(repo, tmp_path / "worker-b")
    assert saved is not None
    # The journal's last save record is round 1's and one tool round ran after it: lost.
    assert b.resume_note(saved, 1) == (
        f"This run moved to another worker. Its files were restored from {BRANCH} at "
        f"{saved[:12]}: file changes made by the last tool round before the move were lost. "
        "Check the files again before relying on those changes."
    )
    assert b.resume_note(saved, 0) is None  # no round after the save
    # The branch is ahead of the journal: the round in flight was saved, only its record lost.
    assert b.resume_note(None, 1) is None
    # Nothing was ever saved and a round ran: the files are the ref's again.
    (tmp_path / "other").mkdir()
    other, _ = make_remote(tmp_path / "other")
    fresh = prepare(other, tmp_path / "worker-c", ref="dev")
    assert fresh.resume_note(None, 2) == (
        f"This run moved to another worker. Its files were restored from {BRANCH} at the start "
        f"of git:{other}#dev: file changes made by the last 2 tool rounds before the move were "
        "lost. Check the files again before relying on those changes."
    )
    none = Workspace.prepare(WorkspaceSpec("none"), RUN, tmp_path / "n")
    assert none.resume_note(None, 3) is None


def test_cleanup_removes_what_the_run_locked_down(
    remote: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    repo, _ = remote
    ws = prepare(repo, tmp_path / "w")
    locked = ws.path / "locked" / "inner"
    locked.mkdir(parents=True)
    (locked / "f").write_text("f\n", encoding="utf-8")
    locked.chmod(0o000)
    (ws.path / "locked").chmod(0o500)
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o755)
    outside.chmod(0o755)
    (outside / "keep.txt").write_text("keep\n", encoding="utf-8")
    (ws.path / "link").symlink_to(outside)
    ws.cleanup()
    assert not (tmp_path / "w" / RUN).exists()
    assert files(outside) == {"keep.txt": "keep\n"}
    assert stat.S_IMODE(outside.stat().st_mode) == 0o755  # a link is never followed


def test_a_file_url_remote_works_like_a_path(
    remote: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    repo, commits = remote
    ws = Workspace.prepare(parse_workspace(f"git:file://{repo}#dev"), RUN, tmp_path / "w")
    assert sh("rev-parse", "HEAD", cwd=ws.path) == commits["dev"]
    (ws.path / "a.txt").write_text("x\n", encoding="utf-8")
    commit = ws.save("round 1")
    assert commit is not None
    assert remote_branch(repo) == commit


def test_a_run_cannot_name_a_directory_the_worker_does_not_share(
    remote: tuple[Path, dict[str, str]], tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    repo, _ = remote
    elsewhere = tmp_path_factory.mktemp("worker-private")
    (elsewhere / "secret.txt").write_text("s\n", encoding="utf-8")
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "escape").symlink_to(elsewhere)
    sh("clone", "--quiet", "--bare", str(repo), str(elsewhere / "private.git"), cwd=tmp_path)
    refused = [
        (parse_workspace(f"path:{elsewhere}"), f"workspace path {elsewhere}"),
        (
            parse_workspace(f"path:{tmp_path}/shared/escape"),
            f"workspace path {tmp_path}/shared/escape",
        ),
        (parse_workspace(f"git:{elsewhere}/private.git"), f"git workspace {elsewhere}/private.git"),
        (
            parse_workspace(f"git:file://{elsewhere}/private.git"),
            f"git workspace {elsewhere}/private.git",
        ),
    ]
    for spec, what in refused:
        with pytest.raises(WorkspaceError) as err:
            Workspace.prepare(spec, RUN, tmp_path / "w")
        assert err.value.one_line() == (
            f"{what} is not under a directory this worker shares with runs ({tmp_path}) "
            "(hint: the worker's operator lists them in KEEL_WORKSPACE_ROOTS=/shared/dir[:/other])"
        )
    assert not (tmp_path / "w" / RUN).exists()
    # With none configured, no path workspace and no local remote is allowed at all.
    with pytest.raises(WorkspaceError, match=r"\(none are set\)"):
        Workspace.prepare(parse_workspace(f"path:{tmp_path}"), RUN, tmp_path / "w", roots=())
    with pytest.raises(WorkspaceError, match=r"\(none are set\)"):
        prepare(repo, tmp_path / "w", roots=())
    # The git dirs of the refused remote were never touched.
    assert remote_branch(elsewhere / "private.git") is None


def sandboxed_bash(root: Path, command: str) -> str:
    """`command` through the real bash tool in the real sandbox, as the agent runs it in a fleet
    run's workspace; its output (or the tool's error)."""
    import asyncio

    from keel.permissions.sandbox import Sandbox
    from keel.tools.base import ToolContext, ToolError
    from keel.tools.builtin.shell import bash

    box = Sandbox(root)
    ctx = ToolContext(cwd=root, root=root, env=dict(os.environ), sandbox=box)
    try:
        return str(asyncio.run(bash.run(ctx, {"command": command})).content)
    except ToolError as exc:
        return f"tool error: {exc}"
    finally:
        box.cleanup()


@pytest.mark.needs("sandbox", "git")
def test_under_the_real_sandbox_the_agent_reaches_only_what_save_guards(
    remote: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    repo, _ = remote
    marker = tmp_path / "pwned"
    ws = prepare(repo, tmp_path / "w")
    config = (ws.path / ".git" / "config").read_bytes()
    out = sandboxed_bash(
        ws.path,
        f"printf '[core]\\n\\tfsmonitor = echo top >> {marker}\\n' >> .git/config"
        " && echo CONFIG-WRITTEN; "
        "git init -q sub && cd sub && echo 1 > f && echo 'f filter=evil' > .gitattributes"
        " && git add -A && git -c user.name=a -c user.email=a@a commit -qm s"
        f" && git config filter.evil.clean 'echo clean >> {marker}; cat'"
        " && echo 2 > f && cd .. && git add sub && echo NESTED-MADE; "
        "echo edited > a.txt",
    )
    # The sandbox holds the clone's config read-only; a nested repository it cannot stop.
    assert "CONFIG-WRITTEN" not in out
    assert "NESTED-MADE" in out, out
    assert (ws.path / ".git" / "config").read_bytes() == config
    commit = ws.save("round 1")
    assert commit is not None
    files_saved = remote_files(repo, commit)
    assert files_saved["a.txt"] == "edited"
    assert files_saved["sub"].startswith("gitlink ")
    (ws.path / "sub" / "f").write_text("3\n", encoding="utf-8")
    assert ws.save("round 2") is None
    assert not marker.exists()
