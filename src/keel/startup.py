"""The collector waits out a headless run's start-up.

Start-up allocates a few hundred thousand long-lived objects (modules, classes, functions) and
few cycles; the cyclic collector would walk them over and over while keel imports itself and
aiohttp (about 15 ms of `keel -p`'s ~210 ms to its first request, bench/bench_loop.py). So
`keel -p` and `keel resume` pause it first thing (`pause_gc`), and the first model reply of the
process resumes it (`resume_gc`, called by the agent loop; a no-op when nothing paused it, as in
a program using keel as a library). Resuming freezes what start-up built (`gc.freeze`): those
objects live as long as the process, and later full collections no longer walk them.
Imports nothing from keel.
"""

from __future__ import annotations

import gc

_paused = False


def pause_gc() -> None:
    """Pause the cyclic collector until `resume_gc` (only when it is on, and only once)."""
    global _paused
    if not _paused and gc.isenabled():
        gc.disable()
        _paused = True


def resume_gc() -> None:
    """Turn the collector back on after `pause_gc`, freezing what exists now; else nothing."""
    global _paused
    if _paused:
        _paused = False
        gc.freeze()
        gc.enable()


def gc_paused() -> bool:
    return _paused


__all__ = ["gc_paused", "pause_gc", "resume_gc"]
