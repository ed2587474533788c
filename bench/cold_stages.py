"""Where `keel -p`'s start-up time goes, stage by stage: run keel under this script instead of
its entry point (`python bench/cold_stages.py OUT.json -p PROMPT …`) and it writes, when the
process exits, the wall and CPU milliseconds since the interpreter started at which each stage
began and ended: the imports of the CLI, the headless front end and the loop, argument parsing,
settings, each part of `build_agent`, the session file, the `/undo` unit and the first model
request. `bench_cold_start.py --stages` runs it in fresh homes and tables the medians.

The stages are found by wrapping functions as their modules finish importing (a meta-path hook),
so nothing in keel knows about this. The wrappers cost a few microseconds each.

Run as the terminal UI (`python bench/cold_stages.py OUT.json --model M` in a terminal), it also
marks the app's mount and its first frame after it (the prompt on screen), and exits there.
"""

from __future__ import annotations

import time

#: perf_counter and process_time when this script started (the interpreter's own start-up is
#: before it: the caller measures that from outside).
T0 = time.perf_counter()
C0 = time.process_time()

import atexit  # noqa: E402 - after the clock starts: these imports are the script's own cost
import importlib.abc  # noqa: E402
import importlib.machinery  # noqa: E402
import inspect  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from types import ModuleType  # noqa: E402
from typing import Any  # noqa: E402

MARKS: list[tuple[str, float, float]] = [("stage script's imports>", T0, C0)]
#: Where the stages go (the first argument).
OUT: str | None = None

#: Module → functions whose calls are stages (the first call of each counts).
STAGES: dict[str, tuple[str, ...]] = {
    "keel.cli.main": ("build_parser",),
    "keel.cli.headless": ("run_headless", "_settings"),
    "keel.app.assembly": (
        "open_agent",
        "build_agent",
        "build_gate",
        "build_hooks",
        "add_extensions",
        "add_subagents",
        "add_lsp",
        "add_memory",
    ),
    "keel.session.store": ("create",),
    "keel.cli.interactive": ("run_interactive", "pick_model", "_prune_checkpoints"),
}
#: Modules whose import is a stage of its own.
IMPORTS = (
    "keel.tui.app",
    "textual.app",
    "keel.cli.main",
    "keel.permissions",
    "keel.permissions.sandbox",
    "keel.cli.headless",
    "keel.agent.loop",
)


def mark(name: str) -> None:
    """Note that stage `name` (`name>`) began or (`<name`) ended, now."""
    MARKS.append((name, time.perf_counter(), time.process_time()))


def _wrapped(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    if inspect.iscoroutinefunction(fn):

        async def stage_async(*args: Any, **kwargs: Any) -> Any:
            mark(f"{name}>")
            try:
                return await fn(*args, **kwargs)
            finally:
                mark(f"<{name}")

        return stage_async

    def stage(*args: Any, **kwargs: Any) -> Any:
        mark(f"{name}>")
        try:
            return fn(*args, **kwargs)
        finally:
            mark(f"<{name}")

    return stage


def _after_import(fullname: str, module: ModuleType) -> None:
    for name in STAGES.get(fullname, ()):
        owner: Any = module
        if fullname == "keel.session.store":
            owner = module.SessionLog  # `SessionLog.create`, a classmethod
            fn = owner.create.__func__
            setattr(owner, name, classmethod(_wrapped("session file", fn)))
            continue
        setattr(owner, name, _wrapped(name, getattr(owner, name)))
    if fullname == "keel.agent.loop":
        agent = module.Agent
        agent._begin_unit = _wrapped("undo unit", agent._begin_unit)
    if fullname == "keel.tui.app":  # the terminal UI: its mount, then its first frame
        app = module.KeelApp
        mount = app.on_mount

        async def on_mount(self: Any) -> None:  # (Textual passes the event to a wider one)
            mark("KeelApp.on_mount>")
            await mount(self)
            mark("<KeelApp.on_mount")

        app.on_mount = on_mount
    if fullname == "textual.app":
        display = module.App._display

        def first_frame(self: Any, *args: Any, **kwargs: Any) -> Any:
            done = display(self, *args, **kwargs)
            if any(name == "<KeelApp.on_mount" for name, _, _ in MARKS):
                mark("first frame after mount")
                if OUT is not None:
                    _dump(OUT)
                os._exit(0)  # (measured: nothing after it matters)
            return done

        module.App._display = first_frame
    if fullname == "keel.llm.h1":
        for cls in list(vars(module).values()):
            if isinstance(cls, type) and "post" in vars(cls):
                client: Any = cls
                original = client.post

                async def post(self: Any, *args: Any, _original: Any = original, **kw: Any) -> Any:
                    mark("first request")
                    return await _original(self, *args, **kw)

                client.post = post


class _Hook(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in STAGES and fullname not in IMPORTS and fullname != "keel.llm.h1":
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        loader: Any = spec.loader
        original = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            mark(f"import {fullname}>")
            original(module)
            mark(f"<import {fullname}")
            _after_import(fullname, module)

        loader.exec_module = exec_module
        return spec


def _dump(out: str) -> None:
    first: dict[str, tuple[float, float]] = {}
    for name, wall, cpu in MARKS:
        first.setdefault(name, ((wall - T0) * 1000, (cpu - C0) * 1000))
    with open(out, "w", encoding="utf-8") as f:
        json.dump(first, f)


mark("<stage script's imports")  # (json, inspect, importlib: keel imports them later anyway)


def main() -> None:
    global OUT
    out = OUT = sys.argv[1]
    sys.argv = ["keel", *sys.argv[2:]]
    sys.meta_path.insert(0, _Hook())
    atexit.register(_dump, out)
    from keel.cli.main import main as keel_main

    sys.exit(keel_main())


if __name__ == "__main__":
    main()
