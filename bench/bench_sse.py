"""`keel serve`'s event stream under load: events per second through SSE to 1 and to 20
subscribers, and the latency the server adds between an event being published and an SSE
client having parsed it.

The server is keel's own app (`keel.server.http`: the guard, the routes, the ring, uvicorn) in a
process of its own, with one session whose ring is fed by a publisher route of this benchmark's
(so the model's speed is not what is measured). The subscribers are httpx streaming clients in a
second process, as a browser or script on the same machine would be. Event times are
CLOCK_MONOTONIC, which Linux shares between processes.

Run: `python bench/bench_sse.py [--quick]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TOKEN = "bench-token-0123456789abcdef"
SESSION = "bench"


# -- the server process ----------------------------------------------------------------------------


def serve() -> None:
    import socket

    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    from keel.server.host import Host, Hosted
    from keel.server.http import Api, Guard
    from keel.server.ring import EventRing

    host = Host(Path(tempfile.mkdtemp()))
    ring = EventRing(SESSION)
    # The events route reads only the ring: no agent is needed to stream.
    host.sessions[SESSION] = Hosted(agent=None, ring=ring, options=None)  # type: ignore[arg-type]
    text = "x" * 40  # about a text delta's size

    async def publish(request: Request) -> Response:
        spec = await request.json()
        count, interval = int(spec["count"]), float(spec["interval"])
        started = time.monotonic()
        for n in range(count):
            ring.publish({"type": "text_delta", "text": text, "t": time.monotonic(), "n": n})
            if interval:
                await asyncio.sleep(interval)
            elif n % 64 == 63:
                await asyncio.sleep(0)  # as a model stream would: events come between reads
        return JSONResponse({"seconds": time.monotonic() - started})

    async def subscribers(request: Request) -> Response:
        return JSONResponse({"subscribers": ring.subscribers, "last_seq": ring.last_seq})

    routes = [
        *Api(host).routes(),
        Route("/bench/publish", publish, methods=["POST"]),
        Route("/bench/subscribers", subscribers, methods=["GET"]),
    ]
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    hosts = frozenset({f"127.0.0.1:{port}"})
    app = Guard(Starlette(routes=routes), token=TOKEN, hosts=hosts)
    print(f"PORT {port}", flush=True)
    config = uvicorn.Config(app, log_level="warning", access_log=False, ws="none", lifespan="off")
    asyncio.run(uvicorn.Server(config).serve(sockets=[sock]))


# -- the subscribers' process ----------------------------------------------------------------------


async def subscribe(url: str, count: int, subs: int, interval: float) -> dict[str, Any]:
    import httpx

    headers = {"authorization": f"Bearer {TOKEN}"}
    received = [0] * subs
    latencies: list[float] = []
    finished = [0.0] * subs
    dropped = [False] * subs

    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as client:
        before = (await client.get("/bench/subscribers")).json()["last_seq"]

        async def one(i: int) -> None:
            async with client.stream("GET", f"/v1/sessions/{SESSION}/events") as r:
                async for line in r.aiter_lines():
                    if line.startswith("event: dropped"):
                        dropped[i] = True
                        return
                    if not line.startswith("data: "):
                        continue
                    now = time.monotonic()
                    data = json.loads(line[6:])
                    if data["seq"] <= before:
                        continue
                    latencies.append(now - data["t"])
                    received[i] += 1
                    if data["n"] == count - 1:
                        finished[i] = now
                        return

        tasks = [asyncio.create_task(one(i)) for i in range(subs)]
        # The count is in the server process: polled, there is no event to wait on here.
        while (await client.get("/bench/subscribers")).json()["subscribers"] < subs:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        started = time.monotonic()
        await client.post("/bench/publish", json={"count": count, "interval": interval})
        await asyncio.wait_for(asyncio.gather(*tasks), 120)
    took = max(finished) - started
    return {
        "subscribers": subs,
        "events": count,
        "delivered": sum(received),
        "dropped": sum(dropped),
        "seconds": took,
        "events_per_s": count / took,
        "deliveries_per_s": sum(received) / took,
        "latency_ms_p50": statistics.median(latencies) * 1000,
        "latency_ms_p99": statistics.quantiles(latencies, n=100)[98] * 1000,
    }


def client(url: str, count: int, subs: int, interval: float) -> None:
    print(json.dumps(asyncio.run(subscribe(url, count, subs, interval))), flush=True)


# -- the benchmark ---------------------------------------------------------------------------------


def run_case(url: str, count: int, subs: int, interval: float) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--client", url, str(count), str(subs), str(interval)],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    result: dict[str, Any] = json.loads(out.stdout.splitlines()[-1])
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    scale = 4 if args.quick else 1
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve"], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline().split()[1])
        url = f"http://127.0.0.1:{port}"
        cases = [
            ("throughput, 1 subscriber", 40_000 // scale, 1, 0.0),
            ("throughput, 20 subscribers", 10_000 // scale, 20, 0.0),
            ("latency, 1 subscriber (an event every 2 ms)", 1000 // scale, 1, 0.002),
            ("latency, 20 subscribers (an event every 2 ms)", 1000 // scale, 20, 0.002),
        ]
        print(
            f"{'case':48} {'events/s':>10} {'deliveries/s':>13} {'p50 ms':>8} {'p99 ms':>8} drops"
        )
        for name, count, subs, interval in cases:
            r = run_case(url, count, subs, interval)
            print(
                f"{name:48} {r['events_per_s']:>10,.0f} {r['deliveries_per_s']:>13,.0f} "
                f"{r['latency_ms_p50']:>8.2f} {r['latency_ms_p99']:>8.2f} {r['dropped']}"
            )
    finally:
        server.terminate()
        server.wait(10)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        serve()
    elif sys.argv[1:2] == ["--client"]:
        client(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]))
    else:
        main()
