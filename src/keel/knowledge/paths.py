"""Where a project's knowledge index lives: `<keel data dir>/knowledge/<project key>/index.sqlite`,
the project being the enclosing git work tree, keyed as sessions key projects (never inside the
repository). Cheap to import: building an agent asks whether an index exists through this."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from keel.config.trust import project_key


def project_root(cwd: Path) -> Path:
    """The enclosing git work tree (walking up for `.git`, as the agent does), else `cwd`."""
    cwd = cwd.resolve()
    for d in (cwd, *cwd.parents):
        if (d / ".git").exists():
            return d
    return cwd


def index_path(root: Path, env: Mapping[str, str] | None = None) -> Path:
    from keel.session.store import keel_home

    return keel_home(env) / "knowledge" / project_key(root) / "index.sqlite"
