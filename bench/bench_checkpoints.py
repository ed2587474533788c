"""Benchmark: what /undo's capture of bash changes costs in a project without git.

A tree of N files (default 10,000 in 100 directories of 10 subdirectories, 200 B to 8 kB each,
about 40 MB, the shape of a mid-sized source tree) and a small one (100 files). For each, the
bash tool runs `true` (and a command that edits 10 files) with a checkpoint store and without one,
in-process and unsandboxed, so the difference is the capture: the scan before and after, the
copies of changed files, and, at a unit's first command, the tree's digest. Measured:

- first command of a session: scan + copy every file into the store (its cold cost);
- later commands: scan before and after (stat only) when nothing changed;
- a command that changes 10 files: the above plus keeping their earlier content;
- `undo` of that command, with the tree check (scan + hash of what was restored).

Run: `python bench/bench_checkpoints.py [--files 10000] [--repeats 5] [--json out.json]`.
Nothing is asserted; the numbers are for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from keel.checkpoints import Checkpoints
from keel.tools.base import ToolContext
from keel.tools.builtin import bash


def make_tree(root: Path, files: int) -> int:
    rng = random.Random(1)
    total = 0
    for i in range(files):
        d = root / f"pkg{i // 100:03d}" / f"mod{(i // 10) % 10}"
        d.mkdir(parents=True, exist_ok=True)
        data = rng.randbytes(rng.randint(200, 8000))
        (d / f"file{i}.py").write_bytes(data)
        total += len(data)
    return total


async def call(ctx: ToolContext, command: str) -> float:
    start = time.perf_counter()
    out = await bash.run(ctx, {"command": command})
    assert not out.is_error, out.content
    return (time.perf_counter() - start) * 1000


def ms(values: list[float]) -> dict[str, float]:
    return {"median_ms": round(statistics.median(values), 1), "min_ms": round(min(values), 1)}


async def measure(files: int, repeats: int, work: Path) -> dict[str, Any]:
    root = work / f"tree{files}"
    root.mkdir()
    size = make_tree(root, files)
    edit = " && ".join(
        f"echo x >> pkg000/mod{j}/file{j * 10}.py" for j in range(min(10, files // 10))
    )
    bare = ToolContext(cwd=root, root=root, env=dict(os.environ))
    plain = [await call(bare, "true") for _ in range(repeats)]

    first, warm, edits, undos = [], [], [], []
    for n in range(repeats):
        store = Checkpoints(work / f"s{files}-{n}" / "x.checkpoints")
        ctx = ToolContext(cwd=root, root=root, env=dict(os.environ), checkpoints=store)
        store.begin_unit("first")
        first.append(await call(ctx, "true"))
        store.begin_unit("warm")
        warm.append(await call(ctx, "true"))
        store.begin_unit("edit")
        edits.append(await call(ctx, edit))
        start = time.perf_counter()
        summary = store.undo()
        undos.append((time.perf_counter() - start) * 1000)
        assert summary.checks, summary
        assert summary.checks[0].matches, summary
        store.close()
    return {
        "files": files,
        "bytes": size,
        "bash_true_without_store": ms(plain),
        "first_command": ms(first),
        "later_command_nothing_changed": ms(warm),
        "command_changing_10_files": ms(edits),
        "undo_with_tree_check": ms(undos),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--files", type=int, default=10_000, help="files in the large tree (10000)")
    p.add_argument("--repeats", type=int, default=5, help="runs of each measurement (5)")
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="keel-bench-checkpoints-") as tmp:
        results = [
            asyncio.run(measure(100, args.repeats, Path(tmp))),
            asyncio.run(measure(args.files, args.repeats, Path(tmp))),
        ]
    for r in results:
        print(f"{r['files']:,} files, {r['bytes'] / 2**20:.1f} MB")
        for key, value in r.items():
            if isinstance(value, dict):
                print(
                    f"  {key:32} median {value['median_ms']:8.1f} ms  min {value['min_ms']:8.1f} ms"
                )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
