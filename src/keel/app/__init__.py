"""Putting an agent together, for every front end (DESIGN.md: the loop knows nothing about the
UI): settings and options → a ready `Agent` with its session; nothing here prints.

`open_agent` builds one for a new session, `resume_agent` reopens a session from its journal;
the TUI, line mode, `keel -p`, `keel serve` and `keel acp` all start here and then only render
events and route answers (`Agent.answer`).
"""

from keel.app.assembly import (
    DEFAULT_MODELS,
    Notify,
    Opened,
    build_agent,
    choose_model,
    connect_mcp,
    open_agent,
    open_session,
    read_settings,
    resume_agent,
    resume_from_store,
)
from keel.app.options import Options, fresh_limits

__all__ = [
    "DEFAULT_MODELS",
    "Notify",
    "Opened",
    "Options",
    "build_agent",
    "choose_model",
    "connect_mcp",
    "fresh_limits",
    "open_agent",
    "open_session",
    "read_settings",
    "resume_agent",
    "resume_from_store",
]
