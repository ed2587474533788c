"""Benchmark: what language-server diagnostics cost an edit (keel.lsp, docs/lsp.md).

1. A plain edit where no server applies (a Markdown file), with the session's LSP manager and
   without one, interleaved: what the feature costs where it does nothing.
2. Edit to diagnostics with real servers (pyright, typescript-language-server from
   tests/lsp/node: `npm ci --prefix tests/lsp/node`): the first change (start + check) and warm
   changes, alternating a type error and its fix.
3. The search for files importing the changed one, over this repository.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from keel.lsp.manager import LspManager, find_importers
from keel.lsp.servers import BUILT_IN, load_specs
from keel.tools.base import ToolContext
from keel.tools.builtin.files import edit, read

REPO = Path(__file__).resolve().parent.parent
NODE_BIN = REPO / "tests" / "lsp" / "node" / "node_modules" / ".bin"


async def plain_edits(count: int) -> dict[str, float]:
    base = Path(tempfile.mkdtemp())
    manager = LspManager(load_specs([], warnings=[]), project_root=base)
    runs: dict[str, tuple[ToolContext, Path, list[float]]] = {}
    for label, lsp in (("without", None), ("with", manager)):
        path = base / f"{label}.md"
        path.write_text("v0\n" + "text\n" * 50, encoding="utf-8")
        ctx = ToolContext(cwd=base, root=base, lsp=lsp)
        await read.run(ctx, {"path": str(path)})
        runs[label] = (ctx, path, [])
    for i in range(count):
        for ctx, path, times in runs.values():
            start = time.perf_counter()
            out = await edit.run(
                ctx, {"path": str(path), "old_string": f"v{i}\n", "new_string": f"v{i + 1}\n"}
            )
            times.append((time.perf_counter() - start) * 1e6)
            assert not out.is_error, out.content
    return {label: statistics.median(times) for label, (_, _, times) in runs.items()}


async def real_servers(rounds: int) -> list[str]:
    lines: list[str] = []
    cases = (
        ("pyright", "pyright-langserver", ".py", "x: str = 1\n", "x: int = 1\n"),
        ("typescript", "typescript-language-server", ".ts", "const x: string = 1;\n",
         "const x: number = 1;\n"),
    )  # fmt: skip
    for name, program, suffix, bad, good in cases:
        if not (NODE_BIN / program).exists():
            lines.append(f"{name}: not installed (npm ci --prefix tests/lsp/node)")
            continue
        base = Path(tempfile.mkdtemp())
        (base / ".git").mkdir()
        specs = load_specs([("bench", {name: {"command": str(NODE_BIN / program)}})], warnings=[])
        manager = LspManager(specs, project_root=base, timeout=60)
        path = base / f"a{suffix}"
        seconds: list[float] = []
        try:
            for i in range(rounds):
                text = bad if i % 2 == 0 else good
                path.write_text(text, encoding="utf-8")
                start = time.monotonic()
                block = await manager.after_write(path, text)
                seconds.append(time.monotonic() - start)
                assert ("<diagnostics" in block) == (i % 2 == 0), block
        finally:
            await manager.aclose()
        warm = statistics.median(seconds[1:])
        lines.append(f"{name}: first change {seconds[0]:.2f} s, warm median {warm:.2f} s")
    return lines


def importer_search() -> list[str]:
    spec = BUILT_IN[0]
    lines = []
    for target in ("src/keel/frozen.py", "src/keel/tools/base.py", "src/keel/lsp/client.py"):
        start = time.perf_counter()
        found = find_importers(REPO / target, REPO, spec)
        ms = (time.perf_counter() - start) * 1000
        lines.append(f"importers of {target}: {len(found)} found in {ms:.0f} ms")
    return lines


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edits", type=int, default=400, help="plain edits of each kind")
    parser.add_argument("--rounds", type=int, default=7, help="changes per real server")
    args = parser.parse_args()
    plain = await plain_edits(args.edits)
    print(
        f"plain edit, no server applies: {plain['without']:.0f} us without the manager, "
        f"{plain['with']:.0f} us with it (median of {args.edits} each, interleaved)"
    )
    for line in await real_servers(args.rounds):
        print(line)
    for line in importer_search():
        print(line)


if __name__ == "__main__":
    asyncio.run(main())
