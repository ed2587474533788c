"""keel's data folder (`KEEL_HOME`, else the platform's user data directory) as the command
line checks it: before a run starts, so that a folder keel cannot write, or a `KEEL_HOME` that
names a file, is one line with what to do instead, never an internal error or a warning about
something else (the memory folder) first.

`check_data_folder` runs before a run builds anything; `data_folder_error` turns an `OSError` on
a path inside the folder that still got through (a resumed session's file, say) into the same
kind of line. Nothing here runs at import time.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from keel.errors import UserError

_WRITE_HINT = (
    "set KEEL_HOME to a folder you can write, or run with --no-session to write no session file"
)
_FOLDER_HINT = "point KEEL_HOME at a folder, or unset it; keel creates the folder if missing"


def _home() -> Path:
    from keel.session.store import keel_home

    return keel_home()


def check_data_folder(*, writing: bool) -> None:
    """Refuse now, in one line, a data folder that is a file (always) or that keel cannot write
    its sessions into (when `writing`: a session file will be written). Creates the sessions
    folder (0700) as the session would a moment later."""
    home = _home()
    if home.exists() and not home.is_dir():
        raise UserError(
            f"keel's data folder {home} is not a folder",
            hint=_FOLDER_HINT,
        )
    if not writing:
        return
    from keel.session.journal import make_dirs

    sessions = home / "sessions"
    try:
        make_dirs(sessions)
    except OSError as exc:
        raise _cannot_write(home, exc) from None
    if not os.access(sessions, os.W_OK | os.X_OK):
        raise UserError(f"keel cannot write its data folder {home}", hint=_WRITE_HINT)


def data_folder_error(exc: OSError) -> UserError | None:
    """The one-line error for `exc` when it concerns a path inside the data folder; else None."""
    if not isinstance(exc.filename, str | os.PathLike):
        return None
    home = _home()
    try:
        inside = Path(os.fsdecode(exc.filename)).absolute().is_relative_to(home.absolute())
    except (OSError, ValueError):
        return None
    if not inside:
        return None
    if isinstance(exc, NotADirectoryError) and home.exists() and not home.is_dir():
        return UserError(
            f"keel's data folder {home} is not a folder",
            hint=_FOLDER_HINT,
        )
    return _cannot_write(home, exc)


def _cannot_write(home: Path, exc: OSError) -> UserError:
    verb = "write" if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS) else "use"
    why = exc.strerror or type(exc).__name__
    named = None if exc.filename is None else Path(os.fsdecode(exc.filename))
    where = "" if named is None or named == home else f" ({named})"
    return UserError(f"keel cannot {verb} its data folder {home}: {why}{where}", hint=_WRITE_HINT)


__all__ = ["check_data_folder", "data_folder_error"]
