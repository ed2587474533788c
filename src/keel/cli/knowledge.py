"""`keel knowledge`: build and search the project's knowledge index (docs/knowledge.md).

keel knowledge index [PATHS…] [--wait]     index the docs under PATHS (default: the paths the
                                           index was built from, else the whole project)
keel knowledge search QUERY… [--top-k N] [--json]
keel knowledge status [--json]

The project is the git work tree around the current directory. This module only parses and
prints; keel.knowledge does the work.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from keel.cli.main import ArgumentError, _Parser, _whole

USAGE = (
    "usage: keel knowledge index [PATHS…] [--wait] | search QUERY… [--top-k N] [--json] | "
    "status [--json]"
)
#: Skipped files named in the index summary before "…".
NAMED = 5


def knowledge(argv: list[str]) -> int:
    commands = {"index": index, "search": search, "status": status}
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    if argv[0] not in commands:
        raise ArgumentError(f"unknown knowledge command {argv[0]!r}; {USAGE}")
    return commands[argv[0]](argv[1:])


def _project() -> tuple[Path, Path]:
    from keel.knowledge.index import index_path, project_root

    root = project_root(Path.cwd())
    return root, index_path(root)


def _embedder() -> Any:
    from keel.config.settings import load_settings
    from keel.knowledge import embeddings_config
    from keel.knowledge.embeddings import Embedder

    settings = load_settings(Path.cwd())
    for warning in settings.warnings:
        if "knowledge" in warning:
            print(f"keel: warning: {warning}", file=sys.stderr)
    config = embeddings_config(settings.knowledge)
    return Embedder(config) if config is not None else None


def index(argv: list[str]) -> int:
    p = _Parser(prog="keel knowledge index", description="Index the project's docs.")
    p.add_argument("paths", nargs="*", metavar="PATH", help="files or folders of the project")
    p.add_argument("--wait", action="store_true", help="wait for another indexer to finish")
    args = p.parse_args(argv)
    from keel.knowledge.index import update

    root, db_path = _project()
    report = update(
        root, db_path, paths=args.paths, cwd=Path.cwd(), embedder=_embedder(), wait=args.wait
    )
    files = len(report.added) + len(report.changed) + len(report.unchanged)
    parts = [
        f"{len(report.added)} new",
        f"{len(report.changed)} changed",
        f"{len(report.unchanged)} unchanged",
        f"{len(report.removed)} removed",
    ]
    line = f"indexed {files} file(s) ({', '.join(parts)}): {report.chunks} chunk(s)"
    if report.chunks_written:
        line += f", {report.chunks_written} written"
    if report.vectors_written:
        line += f", {report.vectors_written} vector(s)"
    print(f"{line} in {report.seconds:.2f} s")
    if report.rebuilt:
        print("rebuilt: the index was made by other chunking rules")
    if report.skipped:
        named = ", ".join(f"{rel} ({why})" for rel, why in report.skipped[:NAMED])
        more = f", and {len(report.skipped) - NAMED} more" if len(report.skipped) > NAMED else ""
        print(f"skipped {len(report.skipped)} file(s): {named}{more}")
    for warning in report.warnings:
        print(f"keel: warning: {warning}", file=sys.stderr)
    return 0


def search(argv: list[str]) -> int:
    p = _Parser(prog="keel knowledge search", description="Search the project's docs.")
    p.add_argument("query", nargs="+", metavar="QUERY", help="a few words")
    p.add_argument("--top-k", type=_whole(1, 20, ""), default=5, help="results (default 5)")
    p.add_argument("--json", action="store_true", help="one JSON object")
    args = p.parse_args(argv)
    from keel.knowledge.index import search as run_search

    _root, db_path = _project()
    query = " ".join(args.query)
    result = run_search(db_path, query, top_k=args.top_k, embedder=_embedder())
    if args.json:
        out = {
            "query": query,
            "ranking": result.ranking,
            "notices": result.notices,
            "results": [
                {
                    "cite": h.cite,
                    "path": h.path,
                    "chunk": h.anchor,
                    "heading": h.heading,
                    "lines": [h.start_line, h.end_line],
                    "bm25": None if h.bm25 is None else round(h.bm25, 4),
                    "cosine": None if h.cosine is None else round(h.cosine, 4),
                    "text": h.text,
                }
                for h in result.hits
            ],
        }
        print(json.dumps(out, indent=2))
        return 0
    for notice in result.notices:
        print(notice)
    if not result.hits:
        print(f"no section of the indexed docs matches {query!r}")
        return 0
    for rank, h in enumerate(result.hits, start=1):
        title = f"  {h.heading}" if h.heading else ""
        print(f"{rank}. {h.cite} (lines {h.start_line}-{h.end_line}){title}")
        for line in _preview(h.text):
            print(f"   {line}")
    return 0


def _preview(text: str, lines: int = 3, width: int = 100) -> list[str]:
    """The first lines of a chunk's text after its heading line, clipped for a terminal."""
    body = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    out = [ln if len(ln) <= width else ln[: width - 1] + "…" for ln in body[:lines]]
    if len(body) > lines:
        out.append("…")
    return out


def status(argv: list[str]) -> int:
    p = _Parser(prog="keel knowledge status", description="The project's knowledge index.")
    p.add_argument("--json", action="store_true", help="one JSON object")
    args = p.parse_args(argv)
    from keel.knowledge.index import NoIndex, has_fts5
    from keel.knowledge.index import status as read_status

    root, db_path = _project()
    try:
        st = read_status(db_path, root)
    except NoIndex as exc:
        if args.json:
            print(json.dumps({"index": None, "project": str(root), "why": exc.message}))
        else:
            print(f"{exc.message} ({root}); {exc.hint}")
        return 0
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(st.indexed_at))
    if args.json:
        out = {
            "index": str(st.db_path),
            "project": str(st.root),
            "paths": st.scope,
            "files": st.files,
            "chunks": st.chunks,
            "indexed_at": stamp,
            "vectors": st.vectors,
            "changed": st.stale,
            "fts5": has_fts5(),
        }
        print(json.dumps(out, indent=2))
        return 0
    vectors = (
        ", ".join(f"{n} of {st.chunks} chunks have vectors of {m}" for m, n in st.vectors.items())
        or "none (lexical ranking)"
    )
    print(f"index:     {st.db_path}")
    print(f"project:   {st.root}")
    print(f"paths:     {' '.join(st.scope)}")
    print(f"contents:  {st.files} file(s), {st.chunks} chunk(s)")
    print(f"indexed:   {stamp}")
    print(f"vectors:   {vectors}")
    if st.stale:
        named = ", ".join(st.stale[:NAMED]) + (", …" if len(st.stale) > NAMED else "")
        print(
            f"changed:   {len(st.stale)} file(s) changed since indexing ({named}); "
            "`keel knowledge index` refreshes the index"
        )
    return 0
