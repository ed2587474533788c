"""Codex's and OpenCode's configuration, read so that their users keep what they set up
(docs/extensions.md, "Codex and OpenCode").

Owns the reading of these files (JSONC and TOML, with one-line warnings naming the file and
line) and their translation into what keel already has:

- OpenCode's `permission` rules become keel rules (deny and ask apply at once; allow rules from
  a project file wait for approval like a project settings file's);
- MCP servers (`[mcp_servers.*]` in `~/.codex/config.toml`, `mcp` in `opencode.json`);
- the model, when keel's own settings and flags name none;
- commands (`~/.codex/prompts/*.md`, `.opencode/command/`, `command` entries), agents
  (`.opencode/agent/`, `agent` entries) and skills (`.codex/skills/`).

Whatever keel does not use is named once, with the file (`Foreign.unused`). Which files came
with the project is `keel.config.intake`'s answer, never decided here. It must never print,
start anything, or import anything above `keel.config`; it is imported only when one of these
files exists.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

#: A JSON string (kept as it is), or a comma before a closing bracket (dropped).
_TRAILING_COMMA = re.compile(r'("(?:[^"\\]|\\.)*")|,(\s*[}\]])')


def _strip_jsonc(text: str) -> str:
    """`text` with JSONC's comments and trailing commas blanked out (line breaks kept, so that
    a JSON error still names the right line)."""
    out: list[str] = []
    i, n = 0, len(text)
    in_string = False
    while i < n:
        c = text[i]
        if in_string:
            step = 2 if c == "\\" else 1
            out.append(text[i : i + step])
            in_string = c != '"'
            i += step
        elif c == '"':
            in_string = True
            out.append(c)
            i += 1
        elif text.startswith(("//", "/*"), i):
            close = "\n" if text[i + 1] == "/" else "*/"
            end = text.find(close, i + 2)
            end = n if end < 0 else end + (0 if close == "\n" else 2)
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:end]))
            i = end
        else:
            out.append(c)
            i += 1
    return _TRAILING_COMMA.sub(lambda m: m.group(1) or " " + m.group(2), "".join(out))


def read_jsonc(path: Path, warnings: list[str] | None = None) -> dict[str, Any] | None:
    """The object in a JSON-with-comments file (`//` and `/* */` comments, trailing commas):
    None when the file is missing or unusable, with a one-line warning in `warnings` naming the
    file and, for bad JSON, the line."""
    said = warnings if warnings is not None else []
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        why = "not UTF-8 text" if isinstance(exc, UnicodeDecodeError) else "cannot read it"
        said.append(f"{path}: {why}; ignored")
        return None
    if not text.strip():
        return {}
    try:
        data = json.loads(_strip_jsonc(text))
    except json.JSONDecodeError as exc:
        said.append(f"{path}:{exc.lineno}:{exc.colno}: invalid JSON ({exc.msg}); ignored")
        return None
    except RecursionError:
        said.append(f"{path}: nested too deeply; ignored")
        return None
    if not isinstance(data, dict):
        said.append(f"{path}: must hold a JSON object; ignored")
        return None
    return data


def read_toml(path: Path, warnings: list[str] | None = None) -> dict[str, Any] | None:
    """The table in a TOML file: None when the file is missing or unusable, with a one-line
    warning in `warnings` naming the file and, for bad TOML, the line."""
    import tomllib

    said = warnings if warnings is not None else []
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        why = "not UTF-8 text" if isinstance(exc, UnicodeDecodeError) else "cannot read it"
        said.append(f"{path}: {why}; ignored")
        return None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        # Python 3.14 gives lineno; older ones end the message with "(at line L, column C)".
        line = getattr(exc, "lineno", None)
        msg = getattr(exc, "msg", str(exc))
        where = f"{path}:{line}" if line else str(path)
        said.append(f"{where}: invalid TOML ({msg}); ignored")
        return None
