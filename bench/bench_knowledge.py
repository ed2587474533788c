"""Benchmark: the knowledge index (keel.knowledge) on keel's own docs and on a generated tree.

- a full index, a re-index with nothing changed, and one with one file changed;
- `search` latency (median and worst of 50 queries), lexical;
- the hybrid ranking's cost on its own: scoring every stored vector in Python (the index keeps
  float32 vectors in SQLite and scans them; no vector extension), for 768-dimension vectors.

Run: `python bench/bench_knowledge.py [--files N] [--json out.json]`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from keel.knowledge.embeddings import cosine, normalised, pack, unpack
from keel.knowledge.index import search, update

REPO = Path(__file__).resolve().parents[1]
WORDS = [
    "install",
    "configure",
    "provider",
    "sandbox",
    "session",
    "journal",
    "resume",
    "permission",
    "rule",
    "hook",
    "skill",
    "server",
    "model",
    "token",
    "budget",
    "cache",
    "prefix",
    "compaction",
    "fork",
    "rewind",
    "trace",
    "viewer",
    "memory",
    "remote",
    "tool",
    "result",
    "error",
    "retry",
    "stall",
    "window",
    "output",
    "price",
    "catalog",
    "bubblewrap",
    "network",
    "secret",
]


def generated_tree(root: Path, files: int, rng: random.Random) -> None:
    for i in range(files):
        sections = []
        for s in range(6):
            paragraphs = [
                " ".join(rng.choice(WORDS) for _ in range(60)) for _ in range(rng.randint(1, 4))
            ]
            sections.append(f"## Section {s} {rng.choice(WORDS)}\n\n" + "\n\n".join(paragraphs))
        path = root / "docs" / f"d{i // 100}" / f"doc{i}.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# Doc {i}\n\n" + "\n\n".join(sections) + "\n", encoding="utf-8")


def timed_index(root: Path, db: Path) -> tuple[float, int, int]:
    started = time.perf_counter()
    report = update(root, db)
    files = len(report.added) + len(report.changed) + len(report.unchanged)
    return time.perf_counter() - started, files, report.chunks


def timed_searches(db: Path, rng: random.Random, count: int = 50) -> dict[str, float]:
    times = []
    for _ in range(count):
        query = " ".join(rng.sample(WORDS, 3))
        started = time.perf_counter()
        search(db, query, top_k=5)
        times.append(time.perf_counter() - started)
    return {"median_ms": statistics.median(times) * 1000, "max_ms": max(times) * 1000}


def bench_tree(name: str, root: Path, rng: random.Random) -> dict[str, Any]:
    db = Path(tempfile.mkdtemp()) / "index.sqlite"
    full, files, chunks = timed_index(root, db)
    unchanged, _, _ = timed_index(root, db)
    target = sorted(root.rglob("*.md"))[0]
    target.write_text(target.read_text(encoding="utf-8") + "\nOne more line.\n", "utf-8")
    one, _, _ = timed_index(root, db)
    return {
        "tree": name,
        "files": files,
        "chunks": chunks,
        "index_s": round(full, 3),
        "reindex_unchanged_s": round(unchanged, 3),
        "reindex_one_changed_s": round(one, 3),
        "db_kb": round(db.stat().st_size / 1024),
        **{k: round(v, 2) for k, v in timed_searches(db, rng).items()},
    }


def bench_vectors(count: int, dim: int, rng: random.Random) -> dict[str, Any]:
    blobs = [pack(normalised([rng.random() for _ in range(dim)])) for _ in range(count)]
    query = normalised([rng.random() for _ in range(dim)])
    started = time.perf_counter()
    scored = [cosine(query, unpack(b)) for b in blobs]
    elapsed = time.perf_counter() - started
    assert len(scored) == count
    return {"vectors": count, "dim": dim, "scan_ms": round(elapsed * 1000, 1)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--json")
    args = parser.parse_args()
    rng = random.Random(7)
    os.environ.setdefault("KEEL_HOME", tempfile.mkdtemp())
    results: dict[str, Any] = {"trees": [], "vectors": []}
    with tempfile.TemporaryDirectory() as tmp:
        own = Path(tmp) / "keel-docs"
        (own / "docs").mkdir(parents=True)
        for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
            (own / "docs" / path.name).write_text(path.read_text(encoding="utf-8"), "utf-8")
        results["trees"].append(bench_tree("keel's docs", own, rng))
        generated = Path(tmp) / "generated"
        generated_tree(generated, args.files, rng)
        results["trees"].append(bench_tree(f"{args.files} generated docs", generated, rng))
    for count in (1_000, 10_000):
        results["vectors"].append(bench_vectors(count, 768, rng))
    for row in results["trees"]:
        print(
            f"{row['tree']}: {row['files']} files, {row['chunks']} chunks, {row['db_kb']} kB; "
            f"index {row['index_s']} s, again unchanged {row['reindex_unchanged_s']} s, one "
            f"changed {row['reindex_one_changed_s']} s; search median {row['median_ms']} ms, "
            f"max {row['max_ms']} ms"
        )
    for row in results["vectors"]:
        print(f"cosine scan of {row['vectors']} x {row['dim']}-d vectors: {row['scan_ms']} ms")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
