"""The NATS JetStream key-value backend of `MemoryStore`, for teams and the fleet.

Keys are `<prefix>.<scope key>.<name>` in one bucket (`project-<project key>` and
`user-<login>` as scope keys); a value is the note's Markdown form (`keel.memory.note.render`);
a revision is the KV revision. Create is the bucket's create (fails if the key holds a value);
update and delete are revision-checked (the server's compare-and-swap), so of two writers that
read the same revision one wins and the other gets `StaleNote`.

The bucket is bound if it exists and created (no TTL, history 1) if not; a bucket whose values
expire (a TTL) or cannot hold a whole note is refused. The `nats` package is imported here
only, and this module only when the backend is chosen. Connecting waits at most a few seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING

from keel.memory.note import (
    MAX_BODY_BYTES,
    MAX_NOTES,
    MemoryError_,
    Note,
    Scope,
    check_name,
    check_note,
)
from keel.memory.note import parse as parse_note
from keel.memory.note import render as render_note
from keel.memory.store import (
    Entry,
    StoreUnavailable,
    exists,
    not_found,
    stale,
    stamped,
    too_many,
)

if TYPE_CHECKING:
    from nats.aio.client import Client
    from nats.js.kv import KeyValue

#: A whole entry: the body at its limit plus the frontmatter.
MAX_VALUE_BYTES = MAX_BODY_BYTES + 4096
CONNECT_TIMEOUT = 3.0
#: JetStream's error code for a revision-checked write whose revision is not the last.
WRONG_LAST_SEQUENCE = 10071


def key_token(text: str) -> str:
    """`text` as one key token (no dots, only the characters NATS keys allow)."""
    return re.sub(r"[^A-Za-z0-9_=-]", "_", text) or "_"


async def _quiet(_exc: Exception) -> None:
    return None


class NatsStore:
    backend = "nats"

    def __init__(
        self, url: str, bucket: str, *, prefix: str, project_key: str, user_key: str
    ) -> None:
        self.url = url
        self.bucket = bucket
        self.prefix = prefix
        self.scope_keys: dict[Scope, str] = {
            "project": f"project-{key_token(project_key)}",
            "user": f"user-{key_token(user_key)}",
        }
        self.warnings: list[str] = []
        self._nc: Client | None = None
        self._kv: KeyValue | None = None

    def where(self, scope: Scope) -> str:
        return f"{self.url} bucket {self.bucket}, keys {self._key(scope, '*')}"

    def _key(self, scope: Scope, name: str) -> str:
        head = f"{self.prefix}." if self.prefix else ""
        return f"{head}{self.scope_keys[scope]}.{name}"

    async def _bucket(self) -> KeyValue:
        if self._kv is not None:
            return self._kv
        import nats
        from nats.js.errors import BadRequestError, BucketNotFoundError

        from keel.natsurl import refused

        if (why := await refused(self.url, CONNECT_TIMEOUT)) is not None:
            raise StoreUnavailable(f"cannot reach the memory server {self.url}: {why}")
        try:
            # Bounded: nats-py may retry a failed first connect despite allow_reconnect=False.
            nc = await asyncio.wait_for(
                nats.connect(
                    self.url,
                    connect_timeout=CONNECT_TIMEOUT,
                    allow_reconnect=False,
                    max_reconnect_attempts=1,
                    # nats' default reports each failure as a logged traceback on stderr; keel
                    # says it in one line (the exception below, or the call that failed).
                    error_cb=_quiet,
                ),
                CONNECT_TIMEOUT * 2,
            )
        except Exception as exc:  # nats raises several unrelated types for one cause
            why = "no answer" if isinstance(exc, TimeoutError) else f"{type(exc).__name__}: {exc}"
            raise StoreUnavailable(f"cannot reach the memory server {self.url}: {why}") from exc
        self._nc = nc
        js = nc.jetstream()
        try:
            kv = await js.key_value(self.bucket)
        except BucketNotFoundError:
            try:
                kv = await js.create_key_value(
                    bucket=self.bucket,
                    history=1,
                    max_value_size=MAX_VALUE_BYTES,
                    description="keel memory notes",
                )
            except BadRequestError:  # another process created it first
                kv = await js.key_value(self.bucket)
        status = await kv.status()
        config = status.stream_info.config
        if status.ttl:
            raise StoreUnavailable(
                f"the memory bucket {self.bucket} has a TTL ({status.ttl:g} s): notes would "
                "expire unseen; use a bucket without one"
            )
        limit = config.max_msg_size
        if limit is not None and 0 < limit < MAX_VALUE_BYTES:
            raise StoreUnavailable(
                f"the memory bucket {self.bucket} holds values of at most {limit} bytes; a note "
                f"needs {MAX_VALUE_BYTES}"
            )
        self._kv = kv
        return kv

    async def _names(self, kv: KeyValue, scope: Scope) -> list[str]:
        """The scope's names: a watch filtered by the server to the scope's keys (`keys()`
        filters on the client, after fetching every key of the bucket)."""
        watcher = await kv.watch(self._key(scope, "*"), ignore_deletes=True, meta_only=True)
        names = []
        try:
            async for entry in watcher:
                if entry is None:  # the end of what is stored now
                    break
                names.append(entry.key.rsplit(".", 1)[-1])
        finally:
            await watcher.stop()  # type: ignore[no-untyped-call]
        return sorted(set(names))

    async def _get(self, kv: KeyValue, scope: Scope, name: str) -> Entry | None:
        from nats.js.errors import KeyNotFoundError

        try:
            got = await kv.get(self._key(scope, name))
        except KeyNotFoundError:  # KeyDeletedError is one
            return None
        if got.value is None or got.revision is None:
            return None
        return Entry(scope, parse_note(got.value.decode("utf-8"), name), str(got.revision))

    async def _list(self, scope: Scope) -> list[Entry]:
        import asyncio

        kv = await self._bucket()

        async def get(name: str) -> Entry | None:
            try:
                return await self._get(kv, scope, check_name(name))
            except (UnicodeDecodeError, MemoryError_) as exc:  # a key or value not a note
                self.warnings.append(f"memory key {self._key(scope, name)}: {exc}; skipped")
                return None

        # One request each, sent together: the index of a fresh context waits for all of them.
        got = await asyncio.gather(*(get(n) for n in await self._names(kv, scope)))
        return [e for e in got if e is not None]

    async def _read(self, scope: Scope, name: str) -> Entry:
        check_name(name)
        entry = await self._get(await self._bucket(), scope, name)
        if entry is None:
            raise not_found(scope, name)
        return entry

    async def _save(self, scope: Scope, note: Note, *, revision: str | None) -> Entry:
        from nats.js.errors import KeyWrongLastSequenceError

        check_note(note)
        kv = await self._bucket()
        key = self._key(scope, note.name)
        if revision is None:
            if len(await self._names(kv, scope)) >= MAX_NOTES:
                raise too_many(scope)
            stored = stamped(note, None)
            try:
                rev = await kv.create(key, render_note(stored).encode("utf-8"))
            except KeyWrongLastSequenceError as exc:
                raise exists(scope, note.name) from exc
            return Entry(scope, stored, str(rev))
        previous = await self._get(kv, scope, note.name)
        if previous is None or previous.revision != revision:
            raise stale(scope, note.name)
        stored = stamped(note, previous.note)
        try:
            rev = await kv.update(key, render_note(stored).encode("utf-8"), last=int(revision))
        except KeyWrongLastSequenceError as exc:
            raise stale(scope, note.name) from exc
        return Entry(scope, stored, str(rev))

    async def _delete(self, scope: Scope, name: str, *, revision: str | None) -> None:
        from nats.js.errors import BadRequestError, KeyWrongLastSequenceError

        check_name(name)
        kv = await self._bucket()
        current = await self._get(kv, scope, name)
        if current is None:
            raise stale(scope, name) if revision is not None else not_found(scope, name)
        if revision is not None and current.revision != revision:
            raise stale(scope, name)
        try:
            await kv.delete(self._key(scope, name), last=int(current.revision))
        except KeyWrongLastSequenceError as exc:
            raise stale(scope, name) from exc
        except BadRequestError as exc:  # a delete's wrong revision comes back as this
            if exc.err_code == WRONG_LAST_SEQUENCE:
                raise stale(scope, name) from exc
            raise

    # The interface: every failure of the server or the connection is `StoreUnavailable`, one
    # line, never a nats exception into the tool runner or the CLI.

    async def list(self, scope: Scope) -> list[Entry]:
        with self._server_errors():
            return await self._list(scope)

    async def read(self, scope: Scope, name: str) -> Entry:
        with self._server_errors():
            return await self._read(scope, name)

    async def save(self, scope: Scope, note: Note, *, revision: str | None) -> Entry:
        with self._server_errors():
            return await self._save(scope, note, revision=revision)

    async def delete(self, scope: Scope, name: str, *, revision: str | None) -> None:
        with self._server_errors():
            await self._delete(scope, name, revision=revision)

    @contextlib.contextmanager
    def _server_errors(self) -> Iterator[None]:
        import nats.errors

        try:
            yield
        except (nats.errors.Error, OSError) as exc:  # TimeoutError is an OSError
            raise StoreUnavailable(
                f"the memory server {self.url} failed: {type(exc).__name__}: {exc}"
            ) from exc

    async def aclose(self) -> None:
        nc, self._nc, self._kv = self._nc, None, None
        if nc is not None:
            await nc.close()
