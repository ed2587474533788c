"""A read-only sandbox for code that must not change anything: a project's guard hooks that the
user has not approved yet (DESIGN.md, invariant 5; docs/security.md).

Such a hook runs under the same mechanism and policy object as sandboxed bash
(`keel.permissions.sandbox`), with three differences: the project is not writable (its scratch
root is a private temporary directory; the rest of the file system, the project included, is
read-only), there is never a network, and its environment is filtered by the sandbox's deny
patterns with no passthrough. Home credential files are hidden as for bash. Where no sandbox
runs, `running` yields None: the caller must not run the hook then.

It must never run anything itself, and never widen the policy it was built from.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

from keel.permissions.sandbox import (
    SandboxError,
    bwrap_argv,
    bwrap_path,
    filter_env,
    probe,
    project_policy,
    seatbelt_argv,
)

#: Variables a guard hook gets besides the filtered environment (they name no secret).
_PASSED = ("CLAUDE_PROJECT_DIR", "KEEL_PROJECT_DIR", "CLAUDE_PLUGIN_ROOT", "CLAUDE_PLUGIN_DATA")


@contextlib.contextmanager
def running(
    command: list[str], cwd: Path, env: Mapping[str, str]
) -> Iterator[tuple[list[str], dict[str, str]] | None]:
    """`command` wrapped so that it can read what it needs and write nothing: (argv, env), or
    None when no sandbox runs here (then the command must not run). The scratch directory that
    is its only writable place is removed at the end of the block."""
    if not probe().ok:
        yield None
        return
    scratch = Path(tempfile.mkdtemp(prefix="keel-guard-")).resolve()
    try:
        base = project_policy(scratch, network=False)
        seen = (cwd.resolve(), *(Path(env[k]).resolve() for k in _PASSED[:2] if env.get(k)))
        policy = dataclasses.replace(
            base,
            protected=(),
            writable_inside_protected=(),
            writable=(),
            network=False,
            # The project may live under /tmp, which is private inside: bound back read-only.
            readable=(*base.readable, *dict.fromkeys(seen)),
        )
        try:
            if sys.platform == "darwin":
                argv = seatbelt_argv(policy, command)
            else:
                bwrap = bwrap_path()
                if bwrap is None:
                    yield None
                    return
                argv = bwrap_argv(policy, command, cwd, bwrap=bwrap, userns=probe().userns)
        except SandboxError:
            yield None
            return
        inner = filter_env(env, allow=policy.env_allow, deny=policy.env_deny)
        inner.update((k, env[k]) for k in _PASSED if k in env)
        tmp = str(scratch)
        yield argv, {**inner, "TMPDIR": tmp, "TMP": tmp, "TEMP": tmp, "KEEL_SANDBOX": "1"}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


__all__ = ["running"]
