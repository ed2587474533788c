"""The bash sandbox: bubblewrap on Linux.

Inside: `/` read-only; the project (git root), a private temp dir (`$TMPDIR`; the literal `/tmp`
stays read-only) and existing build caches (`~/.cache`, `~/.npm`, cargo, go, gradle, maven)
read-write; protected paths (`.git/hooks`, `.git/config`,
keel's `.keel/`, `.claude/`, `.mcp.json`) re-bound read-only over the writable project; no network
unless allowed; its own pid namespace; killed with keel. A probe runs `true` in it once per process:
if bubblewrap is missing or cannot start here, keel says so once and bash falls back to asking.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from keel.permissions.boundary import PROTECTED

#: Placeholders for protected paths that do not exist yet, so a command cannot create them.
_PLACEHOLDER_DIRS = (".keel", ".git/hooks")


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


@dataclass
class Sandbox:
    root: Path
    network: bool = False
    extra_writable: tuple[Path, ...] = field(default_factory=build_caches)
    tmpdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="keel-sandbox-")))

    def argv(self, command: list[str], cwd: Path) -> list[str]:
        """`command` wrapped in bubblewrap."""
        bwrap = bwrap_path()
        if bwrap is None:
            raise RuntimeError("bubblewrap is not available")
        root = self.root.resolve()
        args = [
            bwrap,
            "--die-with-parent",
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--ro-bind",
            "/",
            "/",
            "--dev",
            "/dev",
            "--proc",
            "/proc",
            "--bind",
            str(root),
            str(root),
            "--bind",
            str(self.tmpdir),
            str(self.tmpdir),
        ]
        for extra in self.extra_writable:
            if extra.exists():
                args += ["--bind", str(extra), str(extra)]
        if not self.network:
            args.append("--unshare-net")
        for rel in PROTECTED:
            target = root / rel
            if rel in _PLACEHOLDER_DIRS and not target.exists() and target.parent.is_dir():
                with contextlib.suppress(OSError):
                    target.mkdir(mode=0o700)
            if target.exists():
                args += ["--ro-bind", str(target), str(target)]
        args += ["--chdir", str(cwd), "--", *command]
        return args

    def env(self, env: dict[str, str]) -> dict[str, str]:
        tmp = str(self.tmpdir)
        return {**env, "TMPDIR": tmp, "TMP": tmp, "TEMP": tmp, "KEEL_SANDBOX": "1"}

    def cleanup(self) -> None:
        shutil.rmtree(self.tmpdir, ignore_errors=True)


@dataclass(frozen=True)
class Probe:
    ok: bool
    detail: str


@functools.cache
def probe() -> Probe:
    """Whether a sandboxed command really runs here (once per process)."""
    bwrap = bwrap_path()
    if bwrap is None:
        if os.environ.get("KEEL_NO_SANDBOX"):
            return Probe(False, "sandbox turned off (KEEL_NO_SANDBOX)")
        return Probe(False, "bubblewrap (bwrap) is not installed; install the `bubblewrap` package")
    with tempfile.TemporaryDirectory(prefix="keel-probe-") as tmp:
        box = Sandbox(Path(tmp), tmpdir=Path(tmp))
        try:
            out = subprocess.run(
                box.argv(["/bin/sh", "-c", "echo ok"], Path(tmp)),
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return Probe(False, f"bubblewrap failed to start: {exc}")
    if out.returncode == 0 and out.stdout.strip() == "ok":
        return Probe(True, f"bubblewrap works ({bwrap})")
    err = (out.stderr.strip().splitlines() or ["no output"])[-1]
    return Probe(
        False,
        f"bubblewrap cannot start here: {err} (user namespaces may be disabled; "
        "in Docker run with --security-opt seccomp=unconfined)",
    )
