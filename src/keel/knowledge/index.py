"""The knowledge index: one SQLite file per project with the project's docs cut into chunks,
searched with FTS5's BM25 (and, with embeddings on, vectors fused with it).

Where: `<keel data dir>/knowledge/<project key>/index.sqlite` (the project is the enclosing git
work tree, keyed as sessions key projects), 0600 in 0700 directories, never inside the
repository. What: Markdown and text files (`.md .markdown .txt .text`) under the project, or
under the paths given, that `.gitignore` does not ignore (the walk `grep` and `glob` use: no
dot-folders, no symlinks), at most `MAX_FILE_BYTES` each and valid UTF-8.

Concurrency: one writer at a time (an exclusive `flock` on `index.lock` beside the database;
a second writer is told who holds it, or waits with `wait=True`), and readers never block: the
database is in WAL mode, an update is one transaction, and a reader sees the index as it was
before that transaction or after it, never half of it. Readers open the file read-only.

Incremental: a file whose SHA-256 is unchanged keeps its chunks (their rows are not touched);
a changed file's chunks are replaced; a file no longer found is dropped with its chunks. Rules
that changed (`CHUNKER_VERSION`, the schema) make one full rebuild.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import re
import sqlite3
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from keel.errors import UserError
from keel.frozen import mutable
from keel.knowledge.chunking import CHUNKER_VERSION, Chunk, chunk_markdown, chunk_text
from keel.knowledge.embeddings import (
    Embedder,
    EmbeddingsError,
    cosine,
    fuse,
    normalised,
    pack,
    unpack,
)

# Where the index lives (re-exported: callers of the index find it here too).
from keel.knowledge.paths import index_path as index_path
from keel.knowledge.paths import project_root as project_root

SCHEMA_VERSION = 1
SUFFIXES = {".md": "markdown", ".markdown": "markdown", ".txt": "text", ".text": "text"}
MAX_FILE_BYTES = 512 * 1024
#: More files than this in one index is refused (a walk gone wrong, not docs).
MAX_FILES = 20_000
#: Candidates each ranking contributes before fusion.
OVERFETCH = 50
#: BM25 weights of (heading path, text): a word in a heading counts more.
BM25_WEIGHTS = (4.0, 1.0)

FTS5_MISSING = "this Python's sqlite3 has no FTS5 full-text search, which keel knowledge needs"
FTS5_HINT = "use a Python whose SQLite has FTS5 (python.org's and most distributions' builds do)"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS files (
    path TEXT PRIMARY KEY, sha256 TEXT NOT NULL, size INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL, chunks INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS chunks (
    id INTEGER PRIMARY KEY, path TEXT NOT NULL, ordinal INTEGER NOT NULL, anchor TEXT NOT NULL,
    heading TEXT NOT NULL, body TEXT NOT NULL, start_line INTEGER NOT NULL,
    end_line INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS chunks_path ON chunks(path);
CREATE VIRTUAL TABLE IF NOT EXISTS chunks_fts USING fts5(
    heading, body, tokenize = 'porter unicode61'
);
CREATE TABLE IF NOT EXISTS vectors (
    chunk_id INTEGER PRIMARY KEY, model TEXT NOT NULL, dim INTEGER NOT NULL, vec BLOB NOT NULL
);
"""


def has_fts5() -> bool:
    try:
        db = sqlite3.connect(":memory:")
        try:
            db.execute("CREATE VIRTUAL TABLE t USING fts5(x)")
        finally:
            db.close()
    except sqlite3.OperationalError:
        return False
    return True


def require_fts5() -> None:
    if not has_fts5():
        raise UserError(FTS5_MISSING, hint=FTS5_HINT)


# -- the writer's lock --------------------------------------------------------------------------


class IndexBusy(UserError):
    """Another process is writing this index."""


@contextmanager
def writer_lock(db_path: Path, *, wait: bool = False) -> Iterator[None]:
    """Hold the index's one-writer lock (an flock, released if the holder dies)."""
    db_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    lock_path = db_path.with_name("index.lock")
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            raise IndexBusy(
                f"another `keel knowledge index` is writing this project's index (pid {holder})",
                hint="wait for it to finish, or pass --wait to wait for it",
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)  # releases the flock


# -- connections --------------------------------------------------------------------------------


def _open_writer(db_path: Path) -> sqlite3.Connection:
    db_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(db_path.parent, 0o700)
    if not db_path.exists():
        os.close(os.open(db_path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600))
    db = sqlite3.connect(db_path, isolation_level=None, timeout=30)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.executescript(_SCHEMA)
    for side in ("-wal", "-shm"):
        extra = db_path.with_name(db_path.name + side)
        if extra.exists():
            os.chmod(extra, 0o600)
    return db


def open_reader(db_path: Path) -> sqlite3.Connection:
    """A read-only connection (it never takes the write lock, so it never waits for a writer)."""
    db = sqlite3.connect(f"{db_path.as_uri()}?mode=ro", uri=True, isolation_level=None, timeout=5)
    db.execute("PRAGMA query_only=1")
    return db


def _meta(db: sqlite3.Connection) -> dict[str, str]:
    return dict(db.execute("SELECT key, value FROM meta").fetchall())


# -- what to index ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    rel: str
    path: Path
    data: bytes
    sha256: str
    size: int
    mtime_ns: int


def resolve_scope(root: Path, paths: Sequence[str], cwd: Path) -> list[str]:
    """PATHS as paths relative to the project root ("." for all of it); each must exist and be
    inside the project."""
    scope: list[str] = []
    for raw in paths:
        given = Path(raw).expanduser()
        path = (given if given.is_absolute() else cwd / given).resolve()
        if not path.is_relative_to(root):
            raise UserError(
                f"{raw} is outside the project ({root})",
                hint="the index holds this project's docs; run keel from the other project",
            )
        if not path.exists():
            raise UserError(f"{raw} does not exist", hint="give files or folders of the project")
        rel = path.relative_to(root).as_posix()
        scope.append(rel or ".")
    return sorted(set(scope)) or ["."]


def _in_scope(rel: str, scope: Sequence[str]) -> bool:
    return any(s == "." or rel == s or rel.startswith(s.rstrip("/") + "/") for s in scope)


def collect(root: Path, scope: Sequence[str]) -> tuple[list[Candidate], list[tuple[str, str]]]:
    """The files to index (sorted by path) and those left out with why (too big, binary)."""
    from keel.tools.builtin.search import walk_files

    found: list[Candidate] = []
    skipped: list[tuple[str, str]] = []
    for path in walk_files(root):
        rel = path.relative_to(root).as_posix()
        if path.suffix.lower() not in SUFFIXES or not _in_scope(rel, scope):
            continue
        try:
            st = path.stat()
            if st.st_size > MAX_FILE_BYTES:
                skipped.append((rel, f"over {MAX_FILE_BYTES // 1024} KiB"))
                continue
            data = path.read_bytes()
        except OSError as exc:
            skipped.append((rel, f"unreadable ({exc.strerror})"))
            continue
        if b"\0" in data[:8192] or not _is_utf8(data):
            skipped.append((rel, "not UTF-8 text"))
            continue
        found.append(
            Candidate(rel, path, data, hashlib.sha256(data).hexdigest(), st.st_size, st.st_mtime_ns)
        )
        if len(found) > MAX_FILES:
            raise UserError(
                f"more than {MAX_FILES:,} docs under {', '.join(scope)}",
                hint="give the folders that hold the docs: keel knowledge index docs/",
            )
    return sorted(found, key=lambda c: c.rel), skipped


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def chunks_of(candidate: Candidate) -> list[Chunk]:
    text = candidate.data.decode("utf-8")
    if SUFFIXES[Path(candidate.rel).suffix.lower()] == "markdown":
        return chunk_markdown(text)
    return chunk_text(text)


# -- updating -----------------------------------------------------------------------------------


@mutable
class IndexReport:
    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    chunks: int = 0  # in the index after the update
    chunks_written: int = 0
    vectors_written: int = 0
    #: One line each: embeddings that failed (the index is still built, lexical only).
    warnings: list[str] = field(default_factory=list)
    rebuilt: bool = False
    seconds: float = 0.0


def update(
    root: Path,
    db_path: Path,
    *,
    paths: Sequence[str] | None = None,
    cwd: Path | None = None,
    embedder: Embedder | None = None,
    wait: bool = False,
    before_commit: Callable[[], None] | None = None,
) -> IndexReport:
    """Bring the index up to date with the files (under `paths`, else the paths the index was
    built from, else the whole project). `before_commit` is called inside the transaction,
    just before it commits (tests use it to look at the index mid-write)."""
    require_fts5()
    started = time.monotonic()
    with writer_lock(db_path, wait=wait):
        db = _open_writer(db_path)
        try:
            report = _update(db, root, paths, cwd or root, embedder, before_commit)
        finally:
            db.close()
    report.seconds = time.monotonic() - started
    return report


def _update(
    db: sqlite3.Connection,
    root: Path,
    paths: Sequence[str] | None,
    cwd: Path,
    embedder: Embedder | None,
    before_commit: Callable[[], None] | None,
) -> IndexReport:
    meta = _meta(db)
    scope = resolve_scope(root, paths, cwd) if paths else json.loads(meta.get("scope", '["."]'))
    report = IndexReport()
    rebuild = meta.get("schema") not in (None, str(SCHEMA_VERSION)) or meta.get("chunker") not in (
        None,
        str(CHUNKER_VERSION),
    )
    report.rebuilt = rebuild and bool(meta)
    files, report.skipped = collect(root, scope)
    known = {} if rebuild else dict(db.execute("SELECT path, sha256 FROM files").fetchall())
    fresh: dict[str, list[Chunk]] = {}
    for c in files:
        if c.rel not in known:
            report.added.append(c.rel)
        elif known[c.rel] != c.sha256:
            report.changed.append(c.rel)
        else:
            report.unchanged.append(c.rel)
            continue
        fresh[c.rel] = chunks_of(c)
    present = {c.rel for c in files}
    report.removed = sorted(set(known) - present)
    vectors = _new_vectors(db, embedder, fresh, rebuild, report)

    db.execute("BEGIN IMMEDIATE")
    try:
        if rebuild:
            for table in ("files", "chunks", "chunks_fts", "vectors"):
                db.execute(f"DELETE FROM {table}")  # the names are the code's
        for rel in [*report.removed, *report.changed]:
            _drop_file(db, rel)
        by_rel = {c.rel: c for c in files}
        pending_text: dict[tuple[str, int], int] = {}
        for rel, chunks in fresh.items():
            c = by_rel[rel]
            for ordinal, chunk in enumerate(chunks):
                cur = db.execute(
                    "INSERT INTO chunks (path, ordinal, anchor, heading, body, start_line, "
                    "end_line) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (
                        rel,
                        ordinal,
                        chunk.anchor,
                        chunk.heading,
                        chunk.text,
                        chunk.start_line,
                        chunk.end_line,
                    ),
                )
                rowid = cur.lastrowid
                assert rowid is not None
                pending_text[(rel, ordinal)] = rowid
                db.execute(
                    "INSERT INTO chunks_fts (rowid, heading, body) VALUES (?, ?, ?)",
                    (rowid, chunk.heading, chunk.text),
                )
            db.execute(
                "INSERT INTO files (path, sha256, size, mtime_ns, chunks) VALUES (?, ?, ?, ?, ?)",
                (rel, c.sha256, c.size, c.mtime_ns, len(chunks)),
            )
            report.chunks_written += len(chunks)
        for c in files:  # an unchanged file touched on disk: remember its new stamp
            if c.rel in report.unchanged:
                db.execute(
                    "UPDATE files SET size = ?, mtime_ns = ? WHERE path = ?",
                    (c.size, c.mtime_ns, c.rel),
                )
        _store_vectors(db, vectors, pending_text, embedder, report)
        _set_meta(db, scope)
        (report.chunks,) = db.execute("SELECT count(*) FROM chunks").fetchone()
        if before_commit is not None:
            before_commit()
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    return report


def _drop_file(db: sqlite3.Connection, rel: str) -> None:
    ids = [row[0] for row in db.execute("SELECT id FROM chunks WHERE path = ?", (rel,))]
    db.executemany("DELETE FROM chunks_fts WHERE rowid = ?", [(i,) for i in ids])
    db.executemany("DELETE FROM vectors WHERE chunk_id = ?", [(i,) for i in ids])
    db.execute("DELETE FROM chunks WHERE path = ?", (rel,))
    db.execute("DELETE FROM files WHERE path = ?", (rel,))


@mutable
class _Vectors:
    #: For chunks written now: (path, ordinal) -> vector.
    fresh: dict[tuple[str, int], list[float]] = field(default_factory=dict)
    #: For chunks already stored that have no vector of the configured model: id -> vector.
    backfill: dict[int, list[float]] = field(default_factory=dict)


def _embed_text(heading: str, body: str) -> str:
    return f"{heading}\n\n{body}" if heading else body


def _new_vectors(
    db: sqlite3.Connection,
    embedder: Embedder | None,
    fresh: dict[str, list[Chunk]],
    rebuild: bool,
    report: IndexReport,
) -> _Vectors:
    """Vectors for the new chunks and for stored ones that lack one (asked before the write
    transaction opens, so a slow endpoint holds no lock readers could notice)."""
    out = _Vectors()
    if embedder is None:
        return out
    keys = [(rel, i) for rel, chunks in fresh.items() for i in range(len(chunks))]
    texts = [_embed_text(fresh[rel][i].heading, fresh[rel][i].text) for rel, i in keys]
    stale: list[tuple[int, str]] = []
    if not rebuild:
        changing = set(fresh) | set(report.removed)
        for chunk_id, path, heading, body in db.execute(
            "SELECT c.id, c.path, c.heading, c.body FROM chunks c LEFT JOIN vectors v "
            "ON v.chunk_id = c.id AND v.model = ? WHERE v.chunk_id IS NULL",
            (embedder.config.model,),
        ):
            if path not in changing:
                stale.append((chunk_id, _embed_text(heading, body)))
    if not texts and not stale:
        return out
    try:
        vectors = embedder.embed([*texts, *(t for _, t in stale)])
    except EmbeddingsError as exc:
        report.warnings.append(f"embeddings: {exc}; the index is lexical only until they work")
        return out
    out.fresh = dict(zip(keys, vectors[: len(keys)], strict=True))
    out.backfill = dict(zip((i for i, _ in stale), vectors[len(keys) :], strict=True))
    return out


def _store_vectors(
    db: sqlite3.Connection,
    vectors: _Vectors,
    ids: dict[tuple[str, int], int],
    embedder: Embedder | None,
    report: IndexReport,
) -> None:
    if embedder is None:
        return
    model = embedder.config.model
    rows = [(ids[key], vec) for key, vec in vectors.fresh.items()]
    rows += list(vectors.backfill.items())
    if rows:
        # Vectors of another model (the setting changed) are replaced, not mixed.
        db.execute("DELETE FROM vectors WHERE model != ?", (model,))
    db.executemany(
        "INSERT OR REPLACE INTO vectors (chunk_id, model, dim, vec) VALUES (?, ?, ?, ?)",
        [(chunk_id, model, len(vec), pack(vec)) for chunk_id, vec in rows],
    )
    report.vectors_written = len(rows)


def _set_meta(db: sqlite3.Connection, scope: Sequence[str]) -> None:
    values = {
        "schema": str(SCHEMA_VERSION),
        "chunker": str(CHUNKER_VERSION),
        "scope": json.dumps(list(scope)),
        "indexed_at": str(time.time()),
    }
    db.executemany("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", values.items())


# -- searching ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Hit:
    path: str
    anchor: str
    heading: str
    text: str
    start_line: int
    end_line: int
    #: BM25 (lower is better; FTS5's sign) or None when only the vectors found it.
    bm25: float | None
    #: Cosine similarity with the query, when vectors ranked it.
    cosine: float | None

    @property
    def cite(self) -> str:
        return f"{self.path}#{self.anchor}"


@mutable
class SearchResult:
    hits: list[Hit]
    #: "lexical" or "hybrid".
    ranking: str
    #: One line each, for the reader of the results (embeddings down, the index stale).
    notices: list[str] = field(default_factory=list)


class NoIndex(UserError):
    """The project has no knowledge index (or it cannot be read)."""


def fts_query(query: str) -> str:
    """The words of `query` as an FTS5 expression matching any of them (BM25 ranks chunks with
    more of them, and rarer ones, first). Quoting each word keeps FTS5's syntax out of it."""
    words = re.findall(r"\w+", query.lower())
    return " OR ".join(f'"{w}"' for w in dict.fromkeys(words))


def open_index(db_path: Path) -> sqlite3.Connection:
    if not db_path.is_file():
        raise NoIndex(
            "this project has no knowledge index", hint="build one with `keel knowledge index`"
        )
    require_fts5()
    try:
        db = open_reader(db_path)
        meta = _meta(db)
    except sqlite3.Error as exc:
        raise NoIndex(
            f"the knowledge index {db_path} cannot be read ({exc})",
            hint="rebuild it: delete the file, then `keel knowledge index`",
        ) from exc
    if meta.get("schema") != str(SCHEMA_VERSION):
        db.close()
        raise NoIndex(
            "the knowledge index was built by another version of keel",
            hint="rebuild it with `keel knowledge index`",
        )
    return db


def search(
    db_path: Path,
    query: str,
    *,
    top_k: int = 5,
    embedder: Embedder | None = None,
    exclude: Collection[str] = (),
) -> SearchResult:
    """The `top_k` best chunks for `query`: BM25 alone, or fused with cosine similarity by
    reciprocal rank fusion when an embedder is given and the index has its model's vectors.
    An embeddings failure is a notice and lexical results, never an exception. Chunks of the
    files `exclude` names (indexed paths) are never candidates: the best `top_k` of the rest
    come back, so what they hold does not show in how many results there are."""
    db = open_index(db_path)
    try:
        return _search(db, query, top_k, embedder, sorted(set(exclude)))
    finally:
        db.close()


def indexed_paths(db_path: Path) -> list[str]:
    """The paths of the files in the index (relative to its project), sorted."""
    db = open_index(db_path)
    try:
        return [p for (p,) in db.execute("SELECT path FROM files ORDER BY path")]
    finally:
        db.close()


def _search(
    db: sqlite3.Connection,
    query: str,
    top_k: int,
    embedder: Embedder | None,
    exclude: list[str],
) -> SearchResult:
    expression = fts_query(query)
    hidden = ""
    if exclude:
        marks = ", ".join("?" * len(exclude))
        hidden = f" AND rowid NOT IN (SELECT id FROM chunks WHERE path IN ({marks}))"
    lexical: list[tuple[int, float]] = []
    if expression:
        lexical = db.execute(
            "SELECT rowid, bm25(chunks_fts, ?, ?) AS score FROM chunks_fts WHERE chunks_fts "
            f"MATCH ?{hidden} ORDER BY score, rowid LIMIT ?",
            (*BM25_WEIGHTS, expression, *exclude, OVERFETCH),
        ).fetchall()
    notices: list[str] = []
    similar: list[tuple[int, float]] = []
    ranking = "lexical"
    if embedder is not None:
        similar, notice = _similar(db, query, embedder, exclude)
        if notice:
            notices.append(notice)
        else:
            ranking = "hybrid"
    if ranking == "hybrid":
        order = fuse([i for i, _ in lexical], [i for i, _ in similar])[:top_k]
    else:
        order = [i for i, _ in lexical][:top_k]
    bm25 = dict(lexical)
    cos = dict(similar)
    hits = [_hit(db, i, bm25.get(i), cos.get(i)) for i in order]
    return SearchResult(hits, ranking, notices)


def _similar(
    db: sqlite3.Connection, query: str, embedder: Embedder, exclude: list[str]
) -> tuple[list[tuple[int, float]], str]:
    model = embedder.config.model
    stored = db.execute("SELECT count(*), max(dim) FROM vectors WHERE model = ?", (model,))
    count, dim = stored.fetchone()
    if not count:
        return [], (
            f"[no vectors of {model} in the index (build it with embeddings on: "
            "`keel knowledge index`); lexical results only]"
        )
    try:
        (vector,) = embedder.embed([query])
    except EmbeddingsError as exc:
        return [], f"[embeddings unavailable: {exc}; lexical results only]"
    if len(vector) != dim:
        return [], (
            f"[the endpoint's vectors have {len(vector)} dimensions, the index's {dim} "
            "(rebuild it with `keel knowledge index`); lexical results only]"
        )
    query_vec = normalised(vector)
    marks = ", ".join("?" * len(exclude))
    hidden = f" AND chunk_id NOT IN (SELECT id FROM chunks WHERE path IN ({marks}))"
    scored = [
        (chunk_id, cosine(query_vec, unpack(blob)))
        for chunk_id, blob in db.execute(
            "SELECT chunk_id, vec FROM vectors WHERE model = ?" + (hidden if exclude else ""),
            (model, *exclude),
        )
    ]
    scored.sort(key=lambda s: (-s[1], s[0]))
    return scored[:OVERFETCH], ""


def _hit(db: sqlite3.Connection, chunk_id: int, bm25: float | None, cos: float | None) -> Hit:
    path, anchor, heading, body, start, end = db.execute(
        "SELECT path, anchor, heading, body, start_line, end_line FROM chunks WHERE id = ?",
        (chunk_id,),
    ).fetchone()
    return Hit(path, anchor, heading, body, start, end, bm25, cos)


def stale_files(db_path: Path, root: Path, paths: Sequence[str]) -> list[str]:
    """Of `paths` (indexed, relative), those whose file changed or vanished since indexing."""
    db = open_index(db_path)
    try:
        stamps = {
            p: (size, mtime)
            for p, size, mtime in db.execute("SELECT path, size, mtime_ns FROM files")
        }
    finally:
        db.close()
    out: list[str] = []
    for rel in dict.fromkeys(paths):
        try:
            st = (root / rel).stat()
        except OSError:
            out.append(rel)
            continue
        if stamps.get(rel) != (st.st_size, st.st_mtime_ns):
            out.append(rel)
    return out


# -- status -------------------------------------------------------------------------------------


@mutable
class Status:
    db_path: Path
    root: Path
    scope: list[str]
    files: int
    chunks: int
    indexed_at: float
    #: model -> chunks with a vector of it.
    vectors: dict[str, int]
    #: Indexed files changed or gone since they were indexed.
    stale: list[str]


def status(db_path: Path, root: Path) -> Status:
    db = open_index(db_path)
    try:
        meta = _meta(db)
        (files,) = db.execute("SELECT count(*) FROM files").fetchone()
        (chunks,) = db.execute("SELECT count(*) FROM chunks").fetchone()
        vectors = dict(db.execute("SELECT model, count(*) FROM vectors GROUP BY model"))
        indexed = [p for (p,) in db.execute("SELECT path FROM files ORDER BY path")]
    finally:
        db.close()
    return Status(
        db_path,
        root,
        json.loads(meta.get("scope", '["."]')),
        files,
        chunks,
        float(meta.get("indexed_at", "0")),
        vectors,
        stale_files(db_path, root, indexed),
    )
