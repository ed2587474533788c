"""Benchmark: async HTTP clients on keel's streaming path, side by side.

Each client POSTs the same Messages API body (a 40-message conversation, about 20 kB) to the
loopback Anthropic server (`bench_server.py`, its own process; each SSE event is its own write,
as the real API sends them) and reads the streamed reply through keel's own SSE decoder
(`keel.llm.http.iter_sse`), on one kept-alive connection:

- `keel`: keel's own HTTP/1.1 client (`keel.llm.h1`), what model calls use when no proxy is set
- `httpx+keel`: httpx with keel's transport (httpcore's pool on keel's asyncio backend), the
  proxy path
- `httpx`: httpx with its default transport (anyio backend), for reference
- `httpcore`: httpcore's pool on keel's asyncio backend, without httpx on top
- `aiohttp`: aiohttp's client (its C-accelerated HTTP parser when built with it), if installed

Per client: harness time per request (wall minus the server's busy time) and this process's CPU
time per request, over `--requests` requests, in `--rounds` rounds with the clients interleaved;
median of the rounds and the best round. Measurement only: aiohttp is not a keel dependency (it carried keel's model calls until
keel's own client replaced it: its import cost a third of `keel -p`'s start-up).

Run: `python bench/bench_http_clients.py [--requests 300] [--rounds 5] [--json out.json]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_loop import MODEL, bench_server, server_call  # noqa: E402
from keel.llm.http import iter_sse  # noqa: E402

HEADERS = {
    "content-type": "application/json",
    "accept": "text/event-stream",
    "x-api-key": "bench",
    "anthropic-version": "2023-06-01",
}


def request_body() -> bytes:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "turns=100000 read the files"}]
    for i in range(20):
        messages.append(
            {
                "role": "assistant",
                "content": [{"type": "text", "text": f"Reading file {i} of the project now."}],
            }
        )
        messages.append({"role": "user", "content": "line of the file\n" * 50})
    body = {"model": MODEL, "max_tokens": 8192, "stream": True, "messages": messages}
    return json.dumps(body).encode()


async def drain(chunks: AsyncIterator[bytes]) -> int:
    events = 0
    async for sse in iter_sse(chunks):
        json.loads(sse.data)
        events += 1
    return events


async def with_keel(url: str, body: bytes, n: int) -> int:
    from keel.llm import h1
    from keel.llm.http import shared_ssl_context

    client = h1.Client(tls=shared_ssl_context, connect_timeout=15, stall_timeout=60)
    try:
        events = 0
        for _ in range(n):
            response = await client.post(url, body, HEADERS)
            try:
                events += await drain(_readany(response))
            finally:
                response.release()
        return events
    finally:
        await client.close()


async def _readany(response: Any) -> AsyncIterator[bytes]:
    while chunk := await response.readany():
        yield chunk


async def with_httpx_keel(url: str, body: bytes, n: int) -> int:
    import httpx

    from keel.llm.netio import http_transport

    transport = http_transport(ssl_context=None, max_connections=8, max_keepalive=8)
    async with httpx.AsyncClient(transport=transport, timeout=60) as client:
        events = 0
        for _ in range(n):
            async with client.stream("POST", url, content=body, headers=HEADERS) as response:
                events += await drain(response.aiter_raw())
        return events


async def with_httpx_default(url: str, body: bytes, n: int) -> int:
    import httpx

    async with httpx.AsyncClient(timeout=60) as client:
        events = 0
        for _ in range(n):
            async with client.stream("POST", url, content=body, headers=HEADERS) as response:
                events += await drain(response.aiter_raw())
        return events


async def with_httpcore(url: str, body: bytes, n: int) -> int:
    import httpcore

    from keel.llm.netio import AsyncioBackend

    async with httpcore.AsyncConnectionPool(network_backend=AsyncioBackend()) as pool:
        events = 0
        headers = list(HEADERS.items())
        for _ in range(n):
            async with pool.stream("POST", url, headers=headers, content=body) as response:
                events += await drain(response.aiter_stream())
        return events


async def with_aiohttp(url: str, body: bytes, n: int) -> int:
    import aiohttp  # type: ignore[import-not-found,unused-ignore]  # installed only to measure it

    async with aiohttp.ClientSession() as session:
        events = 0
        for _ in range(n):
            async with session.post(url, data=body, headers=HEADERS) as response:
                events += await drain(response.content.iter_any())
        return events


CLIENTS: dict[str, Callable[[str, bytes, int], Coroutine[Any, Any, int]]] = {
    "keel": with_keel,
    "httpx+keel": with_httpx_keel,
    "httpx": with_httpx_default,
    "httpcore": with_httpcore,
    "aiohttp": with_aiohttp,
}


def available() -> dict[str, Callable[[str, bytes, int], Coroutine[Any, Any, int]]]:
    try:
        import aiohttp  # noqa: F401
    except ImportError:
        return {k: v for k, v in CLIENTS.items() if k != "aiohttp"}
    return CLIENTS


def aiohttp_parser() -> str:
    try:
        from aiohttp import http_parser
    except ImportError:
        return "not installed"
    cls = http_parser.HttpResponseParser
    return "C" if cls.__module__.endswith("_http_parser") else "pure Python"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    body = request_body()
    clients = available()
    walls: dict[str, list[float]] = {name: [] for name in clients}
    cpus: dict[str, list[float]] = {name: [] for name in clients}
    with bench_server() as base:
        url = base + "/v1/messages"
        for name, run in clients.items():  # warm up, and check each gets the same events
            events = asyncio.run(run(url, body, 3))
            assert events == asyncio.run(with_httpx_keel(url, body, 3)), name
        for _ in range(args.rounds):
            for name, run in clients.items():
                server_call(base, "/_reset")
                cpu0, start = time.process_time(), time.perf_counter()
                asyncio.run(run(url, body, args.requests))
                wall, cpu = time.perf_counter() - start, time.process_time() - cpu0
                busy = server_call(base, "/_stats")["busy_seconds"]
                walls[name].append((wall - busy) / args.requests * 1e6)
                cpus[name].append(cpu / args.requests * 1e6)
    results: dict[str, Any] = {"aiohttp_parser": aiohttp_parser(), "body_bytes": len(body)}
    print(f"body {len(body)} bytes; aiohttp's parser: {results['aiohttp_parser']}")
    print(f"{'client':<12} {'µs/request (median, best)':>28} {'CPU µs/request':>16}")
    for name in clients:
        results[name] = {
            "median_us": statistics.median(walls[name]),
            "best_us": min(walls[name]),
            "cpu_median_us": statistics.median(cpus[name]),
        }
        r = results[name]
        print(f"{name:<12} {r['median_us']:18.0f} {r['best_us']:9.0f} {r['cpu_median_us']:16.0f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
