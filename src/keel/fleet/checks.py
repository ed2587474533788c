"""What `keel submit` (and `POST /v1/runs`) checks against the fleet before it queues a run.

The request's own form (mode, model name, workspace form, limits, size) is checked where it is
parsed. This module checks what depends on the fleet:

- the model's provider is one keel knows (a built-in provider or preset, `scripted`, a provider
  the submitter's settings define, or one a live worker says it can serve);
- when workers are up (the `keel-workers` bucket): some live worker can serve the run: one has
  the model's provider, one shares a `path:` workspace or a local `git:` remote under its
  roots, one has every label the run needs. What no live worker can serve is refused with the
  reason and what the workers have; `--no-check` queues it anyway (for workers not up yet).
- with no worker up, nothing more can be known: a warning says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from keel.errors import UserError

if TYPE_CHECKING:
    from keel.fleet.runs import Fleet, RunRequest

NO_CHECK_HINT = "--no-check queues it anyway (for workers that are not up yet)"


def known_provider(provider: str, settings_providers: Mapping[str, Any]) -> bool:
    """Whether `provider` is a provider keel can build without a worker's help: a preset,
    `scripted`, or a custom provider the given settings define (with a wire)."""
    from keel.llm.presets import BUILTIN_NAMES

    if provider in BUILTIN_NAMES:
        return True
    conf = settings_providers.get(provider)
    return conf is not None and bool(getattr(conf, "wire", ""))


def _local_dir(spec: Mapping[str, Any]) -> Path | None:
    """The directory a `path:` workspace or a local `git:` remote names; None otherwise."""
    if spec.get("path"):
        return Path(str(spec["path"]))
    url = str(spec.get("git") or "")
    if url.startswith("file://"):
        return Path(url.removeprefix("file://"))
    if url.startswith("/"):
        return Path(url)
    return None


def _under(path: Path, roots: Sequence[str]) -> bool:
    text = str(path)
    for root in roots:
        root = root.rstrip("/") or "/"
        if text == root or text.startswith(root + "/") or root == "/":
            return True
    return False


def _live(worker: Mapping[str, Any]) -> bool:
    """Up: not marked silent or stopping, and (for an entry not read through the registry) a
    heartbeat within `streams.WORKER_SILENT` seconds."""
    import time

    from keel.fleet import streams

    if worker.get("silent") or worker.get("stopping"):
        return False
    beat = worker.get("beat_at")
    return not isinstance(beat, int | float) or time.time() - beat <= streams.WORKER_SILENT


def _names(workers: Sequence[Mapping[str, Any]]) -> str:
    names = [str(w.get("name", "?")) for w in workers]
    more = f" and {len(names) - 4} more" if len(names) > 4 else ""
    return ", ".join(names[:4]) + more


def check_against_workers(
    req: RunRequest, workers: Sequence[Mapping[str, Any]], settings_providers: Mapping[str, Any]
) -> list[str]:
    """Refuse (a `UserError`) what no live worker in `workers` can serve; return warnings."""
    from keel.llm.catalog import parse_model
    from keel.llm.presets import unknown_provider

    live = [w for w in workers if _live(w)]
    warnings: list[str] = []
    provider = parse_model(req.model).provider if req.model else ""
    offered = {str(p) for w in live for p in (w.get("providers") or ())}
    if provider and not known_provider(provider, settings_providers) and provider not in offered:
        raise unknown_provider(provider, str(req.model))
    if not live:
        return [
            "no worker is up: what the workers need (a key for the model, the workspace under "
            "their roots, labels) is checked when one takes the run"
        ]
    if provider and provider != "scripted" and any("providers" in w for w in live):
        can = [w for w in live if provider in (w.get("providers") or ())]
        if not can:
            have = sorted(offered) or ["none"]
            raise UserError(
                f"no live worker can run model {req.model}: none has the provider {provider!r} "
                f"configured (they have: {', '.join(have)})",
                hint=f"give a worker a key for {provider}, or name another model; {NO_CHECK_HINT}",
            )
        live = can
    where = _local_dir(req.workspace or {})
    if where is not None and any("roots" in w for w in live):
        can = [w for w in live if _under(where, [str(r) for r in w.get("roots") or ()])]
        if not can:
            roots = sorted({str(r) for w in live for r in (w.get("roots") or ())})
            raise UserError(
                f"workspace {where} is not under any live worker's roots "
                f"({', '.join(roots) if roots else 'none set'})",
                hint="name a workspace under those folders, or add a folder above it to the "
                f"workers' KEEL_WORKSPACE_ROOTS; {NO_CHECK_HINT}",
            )
        live = can
    needs = [str(n) for n in getattr(req, "needs", None) or ()]
    if needs:
        can = [w for w in live if set(needs) <= {str(x) for x in (w.get("labels") or ())}]
        if not can:
            warnings.append(
                f"no live worker has the labels {', '.join(needs)} "
                f"(up: {_names(live)}); the run waits for one (keel worker --labels "
                f"{','.join(needs)})"
            )
    return warnings


async def check_request(fleet: Fleet, req: RunRequest, cwd: Path | None = None) -> list[str]:
    """`check_against_workers` with the fleet's live workers (none when the fleet has no
    registry) and the providers the settings at `cwd` (default: here) define; `Fleet.check_fits`
    first. What `keel submit` and `POST /v1/runs` (and their schedules) run before queueing."""
    from keel.config.settings import load_settings
    from keel.fleet.registry import live_workers

    fleet.check_fits(req)
    try:
        providers: Mapping[str, Any] = load_settings(cwd or Path.cwd()).providers
    except UserError:  # a broken settings file is the workers' concern, not this check's
        providers = {}
    try:
        workers = list(await live_workers(fleet))
    except UserError:  # no registry to read: nothing to check against
        workers = []
    return check_against_workers(req, workers, providers)
