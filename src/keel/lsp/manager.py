"""The language servers of one session: which one handles a file, starting it on the first
change of such a file (one process per server and root, kept warm), restarting it after a crash
(a bounded number of times), and turning what it reports into the short block the model reads.

After `write`, `edit` or `multi_edit` (`after_write`): the changed file is sent to its server,
and the errors it reports for that file, plus new errors in open files that import it (a
bounded number), come back as a block for the tool result. The wait is bounded (`timeout`):
what arrives later is kept and handed to the next tool result as a note (`take_late`). A file
no server handles costs one dictionary lookup.

It must never import the loop or a front end, and never let a server's failure end a run: a
server that cannot start is named in one result and then stays off; one that dies is restarted
for the next change (a bounded number of times), then named once and left off.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import field
from pathlib import Path

from keel.frozen import mutable
from keel.lsp.client import Diagnostic, LspClient, LspError, path_to_uri
from keel.lsp.servers import ServerSpec, server_root

#: Seconds an edit's result waits for diagnostics, unless settings say (`lsp.timeout`).
DEFAULT_TIMEOUT = 3.0
#: After the changed file's diagnostics came, how long the server must stay quiet before keel
#: takes them as complete (a server may publish syntax errors first, then type errors).
SETTLE = 0.25
#: The longest a check may go on in the background after its edit's result went back.
LATE_LIMIT = 60.0
#: Bounds of a block: lines for the changed file, importing files looked at, their lines, and
#: the length of one message.
MAX_FILE_LINES = 20
MAX_IMPORTERS = 5
MAX_IMPORTER_LINES = 10
MAX_MESSAGE = 400
#: The search for importing files: how many files and bytes of each it reads, for how long.
SCAN_FILES = 5000
SCAN_BYTES = 256 * 1024
SCAN_SECONDS = 0.3
#: How long one search's answer is reused for the same file (edits come in runs).
IMPORTERS_TTL = 60.0
_SKIP_DIRS = frozenset(
    {".git", "node_modules", ".venv", "venv", "__pycache__", ".tox", ".nox", ".mypy_cache",
     ".ruff_cache", ".pytest_cache", "target", "dist", "build", ".cache", ".next", "out"}
)  # fmt: skip
_SEVERITY = {1: "error", 2: "warning", 3: "info", 4: "hint"}


@mutable
class _Server:
    """One running (or failed) server process for one root."""

    spec: ServerSpec
    root: Path
    client: LspClient | None = None
    restarts: int = 0
    #: Why it is down for good ("" while it may run).
    down: str = ""
    #: URI → the version last sent (documents open in it).
    versions: dict[str, int] = field(default_factory=dict)
    #: URI → the errors last reported to the model for it (what "new" is measured against).
    reported: dict[str, set[tuple[int, int, str]]] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    starts: int = 0
    #: Whether a result already said why it is down (said once, then silence).
    told: bool = False


@mutable
class _Check:
    """What one change's check found."""

    server: str
    path: Path
    errors: list[Diagnostic]
    #: (importing file, its new errors).
    importers: list[tuple[Path, list[Diagnostic]]]
    problem: str = ""


class LspManager:
    def __init__(
        self,
        specs: Sequence[ServerSpec],
        *,
        project_root: Path,
        cwd: Path | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        warnings: bool = False,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.project_root = project_root
        self.cwd = cwd or project_root
        self.timeout = timeout
        self.warnings = warnings
        self.env = dict(os.environ if env is None else env)
        #: extension → the first available server that handles it (built lazily per suffix).
        self._specs = list(specs)
        self._by_suffix: dict[str, ServerSpec | None] = {}
        self._servers: dict[tuple[str, Path], _Server] = {}
        self._late: dict[str, asyncio.Task[_Check | None]] = {}
        self._late_notes: list[str] = []
        self._tasks: set[asyncio.Task[_Check | None]] = set()
        self.closed = False
        #: Why the model may not see a file's content (a `read` deny rule), or None: such a
        #: file is never opened as an importer, nor listed (set from `ToolContext`).
        self.content_denied: Callable[[Path], str | None] | None = None
        #: path → (when found, its importers): `find_importers`' answers, reused a while.
        self._importers: dict[Path, tuple[float, list[Path]]] = {}

    # -- which server --------------------------------------------------------------------------

    def spec_for(self, path: Path) -> ServerSpec | None:
        """The server that handles `path`: the first (settings, plugins, built-ins) that names
        its extension and can run here."""
        suffix = path.suffix.lower()
        if suffix not in self._by_suffix:
            self._by_suffix[suffix] = next(
                (s for s in self._specs if s.language_of(path) and s.available()), None
            )
        return self._by_suffix[suffix]

    def running(self) -> list[tuple[str, Path, int | None]]:
        """(server, root, pid) of each server process running now."""
        return [
            (s.spec.name, s.root, s.client.pid)
            for s in self._servers.values()
            if s.client is not None and s.client.alive
        ]

    # -- after a change ------------------------------------------------------------------------

    async def after_write(self, path: Path, text: str) -> str:
        """The block for the result of a change to `path` (now holding `text`): its errors and
        new errors in files importing it, or "" when there are none or no server handles it."""
        spec = self.spec_for(path) if not self.closed else None
        if spec is None:
            return ""
        uri = path_to_uri(path)
        # A check still going for an earlier change is superseded: it finishes (it holds the
        # server's lock) but what it finds is dropped; this change's check says what is true.
        self._late.pop(uri, None)
        task = asyncio.get_running_loop().create_task(self._check(spec, path, text))
        try:
            done, _ = await asyncio.wait({task}, timeout=self.timeout)
        except asyncio.CancelledError:
            task.cancel()
            raise
        if task in done:
            if (error := task.exception()) is not None:
                # A language server never fails the change itself: the file is written.
                return f"(no diagnostics for {self._show(path)}: {type(error).__name__}: {error})"
            return self._block(task.result())
        self._late[uri] = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(functools.partial(self._landed, uri))
        return (
            f"({spec.name} is still checking {self._show(path)}; "
            "its errors will come with a later result)"
        )

    def _landed(self, uri: str, task: asyncio.Task[_Check | None]) -> None:
        if self._late.get(uri) is not task:  # superseded by a later change, or closed
            return
        del self._late[uri]
        if task.cancelled() or task.exception() is not None:
            return
        block = self._block(task.result(), late=True)
        if block:
            self._late_notes.append(block)

    def take_late(self) -> str:
        """Diagnostics that arrived after their edit's result went back (then forgotten)."""
        notes, self._late_notes = self._late_notes, []
        return "\n".join(notes)

    async def _check(self, spec: ServerSpec, path: Path, text: str) -> _Check | None:
        """Send the change, open (a few) importing files, and collect what the server says."""
        root = server_root(spec, path, self.project_root)
        server = self._servers.setdefault((spec.name, root), _Server(spec, root))
        deadline = time.monotonic() + LATE_LIMIT
        async with server.lock:
            try:
                client = await self._client(server)
            except LspError as exc:
                if server.down and server.told:
                    return None  # the model was told it is off: nothing more to say
                server.told = bool(server.down)
                return _Check(spec.name, path, [], [], problem=str(exc))
            uri = path_to_uri(path)
            since = client.pushes
            try:
                await self._send(server, client, path, text)
                importers = await self._open_importers(server, client, path)
                await client.did_save(uri, text)
                errors, found = await self._collect(client, uri, importers, since, deadline)
            except LspError as exc:
                return _Check(spec.name, path, [], [], problem=str(exc))
            kept = self._kept(errors)
            server.reported[uri] = {d.key() for d in kept}
            news: list[tuple[Path, list[Diagnostic]]] = []
            for ipath, diags in zip(importers, found, strict=True):
                iuri = path_to_uri(ipath)
                before = server.reported.get(iuri, set())
                now = [d for d in diags if d.severity == 1]
                server.reported[iuri] = {d.key() for d in now}
                new = [d for d in now if d.key() not in before]
                if new:
                    news.append((ipath, new))
            return _Check(spec.name, path, kept, news)

    def _kept(self, diags: list[Diagnostic]) -> list[Diagnostic]:
        worst = 2 if self.warnings else 1
        return sorted((d for d in diags if d.severity <= worst), key=lambda d: d.key())

    async def _client(self, server: _Server) -> LspClient:
        """The server's client, started (or restarted after a crash, at most `max_restarts`
        times) when needed."""
        if server.down:
            raise LspError(server.down)
        client = server.client
        if client is not None and client.alive:
            return client
        if client is not None:  # it died
            why = client.failure or "stopped"
            await client.close()
            server.client = None
            server.versions.clear()
            if server.restarts >= server.spec.max_restarts:
                server.down = (
                    f"{server.spec.name} {why.removeprefix(server.spec.name + ' ')}; restarted "
                    f"{server.restarts} time(s), it stays off for this session"
                )
                raise LspError(server.down)
            server.restarts += 1
        env = _server_env(self.env, server.spec)
        client = LspClient(
            server.spec.argv(),
            root=server.root,
            env=env,
            init_options=server.spec.options(),
            settings=server.spec.config(),
            name=server.spec.name,
        )
        server.starts += 1
        try:
            await client.start(server.spec.startup_timeout)
        except LspError as exc:
            await client.close()
            server.down = f"{server.spec.name} could not start: {exc}"
            raise LspError(server.down) from None
        server.client = client
        return client

    async def _send(self, server: _Server, client: LspClient, path: Path, text: str) -> None:
        uri = path_to_uri(path)
        version = server.versions.get(uri)
        if version is None:
            language = server.spec.language_of(path) or ""
            server.versions[uri] = 1
            await client.did_open(uri, language, 1, text)
        else:
            server.versions[uri] = version + 1
            await client.did_change(uri, version + 1, text)

    async def _open_importers(self, server: _Server, client: LspClient, path: Path) -> list[Path]:
        """Files that import `path` (found by a bounded text search), opened in the server."""
        from keel.proc import in_worker

        known = self._importers.get(path)
        if known is not None and time.monotonic() - known[0] < IMPORTERS_TTL:
            found = known[1]
        else:
            found = await in_worker(
                lambda: find_importers(path, server.root, server.spec), name="keel lsp importers"
            )
            self._importers[path] = (time.monotonic(), found)
        if self.content_denied is not None:
            found = [p for p in found if self.content_denied(p) is None]
        for ipath in found:
            uri = path_to_uri(ipath)
            if uri in server.versions:
                continue
            try:
                text = ipath.read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            server.versions[uri] = 1
            await client.did_open(uri, server.spec.language_of(ipath) or "", 1, text)
        return found

    async def _collect(
        self,
        client: LspClient,
        uri: str,
        importers: list[Path],
        since: int,
        deadline: float,
    ) -> tuple[list[Diagnostic], list[list[Diagnostic]]]:
        iuris = [path_to_uri(p) for p in importers]
        if client.pulls:
            results = await asyncio.gather(*(client.pull(u) for u in [uri, *iuris]))
            got = [r if r is not None else client.pushed.get(u, []) for r, u in
                   zip(results, [uri, *iuris], strict=True)]  # fmt: skip
            return got[0], got[1:]
        await client.wait_pushed([uri], since, deadline, SETTLE)
        if client.failure:
            raise LspError(client.failure)
        return client.pushed.get(uri, []), [client.pushed.get(u, []) for u in iuris]

    # -- the block the model reads --------------------------------------------------------------

    def _show(self, path: Path) -> str:
        for base in (self.cwd, self.project_root):
            with contextlib.suppress(ValueError):
                return str(path.relative_to(base))
        return str(path)

    def line(self, path: Path, d: Diagnostic, *, label: bool = False) -> str:
        # The server's message as it wrote it; its further lines indented under the first.
        first, *rest = d.message.strip().splitlines() or [""]
        message = "\n".join(
            [first.rstrip(), *(ln.rstrip() if ln[:1].isspace() else "  " + ln for ln in rest)]
        )
        if len(message) > MAX_MESSAGE:
            message = message[: MAX_MESSAGE - 1] + "…"
        tag = " ".join(x for x in (d.source, d.code) if x)
        kind = f"{_SEVERITY.get(d.severity, 'error')}: " if label or d.severity != 1 else ""
        return f"{self._show(path)}:{d.line + 1}:{d.character + 1}: {kind}{message}" + (
            f" [{tag}]" if tag else ""
        )

    def _block(self, check: _Check | None, *, late: bool = False) -> str:
        if check is None:
            return ""
        name = self._show(check.path)
        if check.problem:
            if late:
                return ""
            return f"(no diagnostics for {name}: {check.problem})"
        if not check.errors and not check.importers:
            return ""
        lines: list[str] = []
        if late:
            lines.append(f"(these arrived after the result of the last change to {name})")
        for d in check.errors[:MAX_FILE_LINES]:
            lines.append(self.line(check.path, d))
        if len(check.errors) > MAX_FILE_LINES:
            lines.append(f"... and {len(check.errors) - MAX_FILE_LINES} more in {name}")
        shown = 0
        for ipath, diags in check.importers:
            if shown == 0:
                lines.append(f"new errors in files that import {name}:")
            for d in diags:
                if shown >= MAX_IMPORTER_LINES:
                    break
                lines.append(self.line(ipath, d))
                shown += 1
        return f'<diagnostics server="{check.server}">\n' + "\n".join(lines) + "\n</diagnostics>"

    # -- the diagnostics tool ------------------------------------------------------------------

    async def file_report(self, path: Path) -> str:
        """Errors and warnings of `path` now (opened in its server if it was not), one line
        each, for the `diagnostics` tool."""
        spec = self.spec_for(path)
        if spec is None:
            return ""
        root = server_root(spec, path, self.project_root)
        server = self._servers.setdefault((spec.name, root), _Server(spec, root))
        from keel.proc import in_worker

        text = await in_worker(
            lambda: path.read_text(encoding="utf-8", errors="replace"), name="keel lsp read"
        )
        async with server.lock:
            client = await self._client(server)
            uri = path_to_uri(path)
            since = client.pushes
            await self._send(server, client, path, text)
            errors, _ = await self._collect(
                client, uri, [], since, time.monotonic() + max(self.timeout, 5.0)
            )
        return "\n".join(self.line(path, d, label=True) for d in errors if d.severity <= 2)

    def open_files(self) -> list[tuple[Path, list[Diagnostic]]]:
        """Every file the servers have open, with what they last reported for it."""
        from keel.lsp.client import uri_to_path

        out: list[tuple[Path, list[Diagnostic]]] = []
        for server in self._servers.values():
            if server.client is None:
                continue
            for uri in sorted(server.versions):
                path = uri_to_path(uri)
                denied = self.content_denied(path) if self.content_denied and path else None
                if path is not None and denied is None:
                    out.append((path, server.client.pushed.get(uri, [])))
        return out

    # -- the end -------------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Every server shut down (its whole process group ended); checks still going are
        dropped."""
        self.closed = True
        for task in [*self._late.values(), *self._tasks]:
            task.cancel()
        self._late.clear()
        for server in self._servers.values():
            if server.client is not None:
                await server.client.close()
                server.client = None


def _server_env(env: Mapping[str, str], spec: ServerSpec) -> dict[str, str]:
    """What a server gets of keel's environment: what programs need to run and build (the
    sandbox's allow list), never a credential; then its entry's `env`."""
    from keel.permissions.sandbox import filter_env

    return {**filter_env(env), **dict(spec.env)}


def import_pattern(path: Path) -> re.Pattern[str]:
    """A line of another file that imports `path`'s module (searched for in each line), by its
    language's way of naming it: Python's dotted names and relative imports; a quoted path ending in the file's name
    (TypeScript and JavaScript, C's `#include`); Rust's `mod`/`use`; Go's package folder."""
    stem, parent = path.stem, path.parent.name
    if stem in ("__init__", "index", "mod"):
        stem, parent = parent, path.parent.parent.name  # a package's own file: its folder
    s, p = re.escape(stem), re.escape(parent)
    suffix = path.suffix.lower()
    if suffix in (".py", ".pyi"):
        return re.compile(
            rf"^\s*(?:from\s+[\w.]*\b{p}\.{s}\b|import\s+[\w., ]*\b{p}\.{s}\b"
            rf"|from\s+[\w.]*\b{p}\s+import\b.*\b{s}\b|from\s+\.+{s}\b"
            rf"|from\s+\.+\s+import\b.*\b{s}\b|from\s+{s}\b|import\s+{s}\b)"
        )
    if suffix == ".rs":
        return re.compile(rf"^\s*(?:pub\s+)?(?:mod\s+{s}\s*;|use\b.*\b{s}\b)")
    if suffix == ".go":
        return re.compile(rf"[\"/]{p}\"")
    return re.compile(
        rf"(?:\bimport\b|\bfrom\b|\bexport\b|\brequire\s*\(|#\s*include\b).*"
        rf"[\"'/]{s}(?:\.\w+)?[\"'>]"
    )


def find_importers(path: Path, root: Path, spec: ServerSpec) -> list[Path]:
    """Files under `root` handled by the same server with an import line naming `path`'s module
    (`import_pattern`): at most `MAX_IMPORTERS`, found within `SCAN_FILES` files and
    `SCAN_SECONDS`."""
    pattern = import_pattern(path)
    needle = path.stem if path.stem not in ("__init__", "index", "mod") else path.parent.name
    if path.suffix.lower() == ".go":
        needle = path.parent.name
    if not needle:
        return []
    suffixes = {ext for ext, _ in spec.languages}
    found: list[Path] = []
    deadline = time.monotonic() + SCAN_SECONDS
    seen = 0
    for directory, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.startswith("."))
        for name in sorted(files):
            candidate = Path(directory) / name
            if candidate.suffix.lower() not in suffixes or candidate == path:
                continue
            if path.suffix.lower() == ".go" and candidate.parent == path.parent:
                continue  # the same package: it needs no import
            seen += 1
            if seen > SCAN_FILES or time.monotonic() > deadline:
                return found
            try:
                with candidate.open("rb") as f:
                    head = f.read(SCAN_BYTES).decode("utf-8", "replace")
            except OSError:
                continue
            if needle not in head:
                continue
            if any(pattern.search(ln) for ln in head.splitlines()):
                found.append(candidate)
                if len(found) >= MAX_IMPORTERS:
                    return found
    return found


__all__ = ["DEFAULT_TIMEOUT", "LspManager", "find_importers", "import_pattern"]
