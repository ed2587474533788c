"""Text from elsewhere (a model, a tool's output, a file's name, a server's error) made safe to
write to a terminal: every control character becomes a visible stand-in of the same length, so
no escape sequence in it can set the window title, write the clipboard, clear the screen or
move the cursor over what was shown. Newlines and tabs stay. No imports: the CLI's error line
uses it at startup.
"""

from __future__ import annotations

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


__all__ = ["terminal_safe"]
