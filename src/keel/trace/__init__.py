"""Debug traces (docs/traces.md): `attach` a tracer to an agent and every request, response,
tool, permission, hook and HTTP exchange of its runs is written to `<session>.trace/`.

Importing this package imports nothing beyond the standard library: the tracer and its
collaborators load when a trace is turned on (`attach`), so `keel` without `--debug` pays
nothing for them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from pathlib import Path

    from keel.agent.loop import Agent
    from keel.llm.request import Request
    from keel.trace.tracer import Tracer

_TRUE = ("1", "true", "yes", "on")


class _DebugSetting(Protocol):
    debug: bool


def enabled(settings: _DebugSetting | None, env: Mapping[str, str], flag: bool) -> bool:
    """Whether to trace: `--debug` (`flag`), `KEEL_DEBUG=1`, or the `debug` setting."""
    if flag or env.get("KEEL_DEBUG", "").strip().lower() in _TRUE:
        return True
    return bool(settings is not None and settings.debug)


def attach(
    agent: Agent, *, directory: Path | None = None, retention_days: int | None = None
) -> Tracer:
    """Trace `agent` (see `keel.trace.tracer.attach`)."""
    from keel.trace.tracer import attach as _attach

    return _attach(agent, directory=directory, retention_days=retention_days)


def detach(agent: Agent) -> None:
    """Stop tracing `agent`."""
    from keel.trace.tracer import detach as _detach

    _detach(agent)


def follow(old: Agent, new: Agent) -> Tracer | None:
    """Keep tracing when a front end replaces `old` with `new` (`/clear`, `/resume`)."""
    from keel.trace.tracer import follow as _follow

    return _follow(old, new)


def read(directory: Path) -> list[dict[str, Any]]:
    """The records of a trace folder, in order."""
    from keel.trace.delta import read as _read

    return _read(directory)


def http_bodies(directory: Path, records: list[dict[str, Any]]) -> dict[int, bytes]:
    """The exact request body of every `http` record of a trace, by its number `n`."""
    from keel.trace.delta import http_bodies as _bodies

    return _bodies(directory, records)


def rebuild_requests(records: list[dict[str, Any]]) -> list[tuple[str, Request]]:
    """Every request of a trace as sent: (agent label, Request)."""
    from keel.trace.delta import rebuild_requests as _rebuild

    return _rebuild(records)


__all__ = ["attach", "detach", "enabled", "follow", "http_bodies", "read", "rebuild_requests"]
