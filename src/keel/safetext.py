"""Text from elsewhere (a model, a tool's output, a file's name, a server's error) made safe to
write to a terminal: every control character becomes a visible stand-in of the same length, so
no escape sequence in it can set the window title, write the clipboard, clear the screen or
move the cursor over what was shown. Newlines and tabs stay. No imports: the CLI's error line
uses it at startup.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

T = TypeVar("T")

#: C0 controls as their Control Pictures (U+2400 + code: ESC → ␛), DEL as ␡, the C1 controls
#: (an 8-bit CSI, 0x9B, is an escape on many terminals) as �; one character each.
_VISIBLE = {
    **{code: 0x2400 + code for code in range(32) if chr(code) not in "\n\t"},
    0x7F: 0x2421,
    **{code: 0xFFFD for code in range(0x80, 0xA0)},
}


def terminal_safe(text: str) -> str:
    """`text` with its control characters (but newlines and tabs) shown as stand-ins."""
    return text.translate(_VISIBLE)


def terminal_safe_copy(value: T) -> T:
    """`value` with `terminal_safe` applied to every string in it (through dataclasses, lists,
    tuples and dicts): the very same object where nothing needed it, so what a front end keys
    on an event's identity still holds in the usual case."""
    return _safe(value)  # type: ignore[no-any-return]


def _safe(value: Any) -> Any:
    if isinstance(value, str):
        safe = terminal_safe(value)
        return value if safe == value else safe
    if type(value) in (list, tuple):
        items = [_safe(v) for v in value]
        same = all(a is b for a, b in zip(items, value, strict=True))
        return value if same else type(value)(items)
    if type(value) is dict:
        pairs = [(_safe(k), _safe(v)) for k, v in value.items()]
        same = all(
            k is k0 and v is v0 for (k, v), (k0, v0) in zip(pairs, value.items(), strict=True)
        )
        return value if same else dict(pairs)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {
            f.name: new
            for f in dataclasses.fields(value)
            if f.init and (new := _safe(getattr(value, f.name))) is not getattr(value, f.name)
        }
        return dataclasses.replace(value, **changes) if changes else value
    return value


__all__ = ["terminal_safe", "terminal_safe_copy"]
