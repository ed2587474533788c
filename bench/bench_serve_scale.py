"""`keel serve` holding many sessions (issue 32): memory per idle session, event latency to an SSE
subscriber, requests/s on the API, time to the first answered request, and a soak.

Three processes on this machine: a real `keel serve` (fresh KEEL_HOME and project, its own port),
the loopback Anthropic model server of bench/bench_server.py (each reply: a `read` tool call
until the run has `turns=N` results, then an answer), and this one, the clients (httpx, asyncio).
The server runs through `--serve` below: keel's own `main(["serve", ...])` with one route of this
benchmark's added, `GET /bench/stats` (hosted sessions, ring events and their size, subscribers,
asyncio tasks, threads, the cyclic collector's full collections and their longest pause;
`?gc=1`: a full collection first, timed; `?malloc=1`: a tracemalloc diff since the last call,
when KEEL_BENCH_TRACEMALLOC=1; `?profile=` / `?profile=FILE`: cProfile on, then off into FILE,
which `--profile F` does around the active phase). KEEL_BENCH_GC_THRESHOLD=a,b,c sets the server's `gc.set_threshold`.
RSS, open fds and threads are read from /proc/<pid>.

Measured:

- start-up: process start -> `GET /v1/info` answered, and -> the first prompt's answer (the
  real `python -m keel serve`, no stats route, from bytecode; median of `--startup-runs`, after
  an untimed start that writes the bytecode);
- memory per idle session: RSS after N idle sessions are created (POST /v1/sessions) minus RSS
  before, over N; one session was created and run before the baseline, so the modules a first
  session imports are not counted;
- event latency: every text delta the model server sends carries the CLOCK_MONOTONIC time it was
  written to the socket (each delta's text is the stamp); the subscriber reading the session's
  `/events` stream compares it with its own clock when it has parsed the frame. So a latency is
  model server -> keel's provider -> agent -> ring -> SSE -> httpx client, all on one clock;
- requests/s: GET /v1/sessions, GET /v1/sessions/{id}, GET /v1/info and POST …/prompt (202,
  each to a different idle session) from `--concurrency` concurrent clients;
- active: `--active` sessions running at once, runs/s and latency p50/p99;
- soak: `--active` clients for `--soak-seconds` (at most `--soak-runs` runs) in the mix clients
  make: each keeps a session for 1-8 runs (`--think`: a pause between them), then deletes it
  and creates a new one; a third of the subscribers disconnect after their first text delta. Every `--sample-every` seconds the server's
  RSS, fds, threads, asyncio tasks, hosted sessions, ring events and subscribers are sampled
  (also written, one JSON line each, to `--samples F` as they come); reported: the RSS slope
  (MB/hour, least squares over the samples after the first tenth) and the first-vs-last tenth.

Nothing is asserted (tests/test_serve_scale.py runs `--quick` and checks the JSON's shape).
Run: `python bench/bench_serve_scale.py [--quick] [--idle N] [--active M] [--soak-seconds S]`;
JSON on stdout, progress on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from timings import summary

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "bench-token-0123456789abcdef"
MODEL = "anthropic/claude-sonnet-4-5"
#: A text delta's stamp before the model server writes it: "T" and 19 characters.
HOLE = b"?" * 19
STAMP = re.compile(r"T(\d{6,}\.\d{6})")


#: The server's counts a soak follows from sample to sample (`/bench/stats` and /proc).
COUNTS = ("rss_mb", "fds", "os_threads", "tasks", "hosted", "ring_events", "subscribers")


def log(text: str) -> None:
    print(f"bench_serve_scale: {text}", file=sys.stderr, flush=True)


# -- the model server process (`--model-server`) ---------------------------------------------------

TURNS = re.compile(r"turns=(\d+)")


def this_prompt(body: dict[str, Any]) -> tuple[int, int]:
    """(tool results so far, `turns=N` wanted) of the latest prompt in a Messages API body: a
    session that runs again starts counting afresh."""
    results, wanted = 0, 0
    for message in body.get("messages", []):
        content = message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if message.get("role") != "user" or not isinstance(blocks, list):
            continue
        texts = [b.get("text", "") for b in blocks if b.get("type") == "text"]
        found = [m for m in map(TURNS.search, texts) if m]
        if found:
            results, wanted = 0, int(found[-1].group(1))
        results += sum(1 for b in blocks if b.get("type") == "tool_result")
    return results, wanted


def model_server() -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    from bench_server import BenchServer
    from keel.llm.messages import Message, Text, ToolUse, Usage
    from keel.llm.script import Reply, Step, next_tool_id
    from keel.testing.anthropic_server import DELTA_PIECES
    from keel.testing.server import RecordedRequest

    hole = ("T" + HOLE.decode()) * DELTA_PIECES  # one stamp per streamed piece

    def respond(request: RecordedRequest) -> Step:
        results, wanted = this_prompt(request.json)
        usage = Usage(input=1200 + 40 * results, output=30, cache_read=0, cache_write=0)
        if results < wanted:
            call = ToolUse(next_tool_id(), "read", {"path": f"file{results % 10}.txt"})
            return Reply(Message("assistant", (Text(hole), call)), usage)
        return Reply(Message("assistant", (Text(hole),)), usage)

    class Stamped(BenchServer):
        def __init__(self) -> None:
            super().__init__()
            self.responder = respond

        def render_stream(self, step: Reply, request: RecordedRequest) -> Iterator[bytes]:
            for chunk in super().render_stream(step, request):
                # Stamped as it is handed to the socket writer (the generator is lazy).
                yield chunk.replace(HOLE, b"%019.6f" % time.monotonic())

    server = Stamped().start()
    print(f"PORT {server.port}", flush=True)
    sys.stdin.read()  # serve until the parent closes our stdin
    server.stop()


# -- keel serve with the stats route (`--serve ARGS`) ----------------------------------------------


def serve_with_stats(argv: list[str]) -> int:
    import gc
    import tracemalloc

    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    from keel.cli.main import main
    from keel.server import http

    #: The full collections' pauses so far (each walks every object not frozen).
    full: list[float] = []
    began: list[float] = [0.0]
    asked = [False]  # a collection of the stats route's own (not counted)

    def timed(phase: str, info: dict[str, Any]) -> None:
        if info["generation"] != 2 or asked[0]:
            return
        if phase == "start":
            began[0] = time.perf_counter()
        else:
            full.append(time.perf_counter() - began[0])

    gc.callbacks.append(timed)
    if thresholds := os.environ.get("KEEL_BENCH_GC_THRESHOLD"):  # to try other settings
        gc.set_threshold(*map(int, thresholds.split(",")))
    import cProfile

    profiler = cProfile.Profile()
    profiling: list[cProfile.Profile] = []
    tracing = os.environ.get("KEEL_BENCH_TRACEMALLOC") == "1"
    if tracing:
        tracemalloc.start(8)
    last: list[Any] = []
    original = http.Api.routes

    def routes(api: http.Api) -> list[Route]:
        async def stats(request: Request) -> Response:
            host = api.host
            body: dict[str, Any] = {
                "hosted": len(host.sessions),
                "ring_events": sum(len(h.ring._ring) for h in host.sessions.values()),
                "ring_kb": round(
                    sum(getattr(h.ring, "held_bytes", 0) for h in host.sessions.values()) / 1024
                ),
                "subscribers": sum(h.ring.subscribers for h in host.sessions.values()),
                "tasks": len(asyncio.all_tasks()),
                "threads": threading.active_count(),
                "gc_enabled": gc.isenabled(),
                "gc_frozen": gc.get_freeze_count(),
                "gc_full_collections": len(full),
                "gc_full_max_ms": round(max(full, default=0.0) * 1000, 1),
            }
            if request.query_params.get("gc"):
                asked[0] = True
                took = time.perf_counter()
                gc.collect()
                body["gc_collect_ms"] = round((time.perf_counter() - took) * 1000, 1)
                asked[0] = False
                body["gc_objects"] = len(gc.get_objects())
            if (where := request.query_params.get("profile")) is not None:
                # `?profile=` starts cProfile, `?profile=FILE` stops it and writes FILE.
                if where and profiling:
                    profiling.pop().disable()
                    import pstats

                    pstats.Stats(profiler).dump_stats(where)
                elif not where and not profiling:
                    profiling.append(profiler)
                    profiler.enable()
            if tracing and request.query_params.get("malloc"):
                asked[0] = True
                gc.collect()
                asked[0] = False
                snap = tracemalloc.take_snapshot()
                if last:
                    diff = snap.compare_to(last[0], "traceback")
                    body["malloc"] = [
                        {
                            "kb": round(d.size_diff / 1024, 1),
                            "count": d.count_diff,
                            "at": d.traceback.format()[-6:],
                        }
                        for d in diff[:25]
                    ]
                last[:] = [snap]
            return JSONResponse(body)

        return [*original(api), Route("/bench/stats", stats, methods=["GET"])]

    http.Api.routes = routes  # type: ignore[method-assign,assignment]
    return main(["serve", *argv])


# -- processes -------------------------------------------------------------------------------------


def proc_stats(pid: int) -> dict[str, float]:
    status = Path(f"/proc/{pid}/status").read_text(encoding="utf-8")
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return {
        "rss_mb": round(int(fields["VmRSS"].split()[0]) / 1024, 2),
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
        "os_threads": int(fields["Threads"]),
    }


def first_line(proc: subprocess.Popen[str], what: str) -> str:
    got: list[str] = []
    assert proc.stdout is not None
    out = proc.stdout
    reader = threading.Thread(target=lambda: got.append(out.readline()), daemon=True)
    reader.start()
    reader.join(60)
    if not got or not got[0]:
        raise SystemExit(f"bench_serve_scale: {what} printed nothing (exit {proc.poll()})")
    return got[0].strip()


def start_model_server() -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, __file__, "--model-server"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    line = first_line(proc, "the model server")
    return proc, f"http://127.0.0.1:{line.split()[1]}"


def make_world() -> tuple[Path, dict[str, str]]:
    base = Path(tempfile.mkdtemp(prefix="bench-serve-scale-"))
    project = base / "project"
    project.mkdir()
    for n in range(10):
        (project / f"file{n}.txt").write_text(f"line of file {n}\n" * 20, encoding="utf-8")
    home = base / "home"
    env = {
        **os.environ,
        "KEEL_HOME": str(home),
        "KEEL_CONFIG_DIR": str(home / "config"),
        "HOME": str(home / "user-home"),
        "KEEL_LSP": "0",
        "KEEL_SERVER_TOKEN": TOKEN,
        "ANTHROPIC_API_KEY": "sk-ant-bench",
    }
    return project, env


def start_serve(
    project: Path, env: dict[str, str], model_url: str, *, stats: bool
) -> tuple[subprocess.Popen[str], str, float]:
    """A `keel serve` on a free port: (process, url, time.monotonic() at its start)."""
    command = (
        [sys.executable, __file__, "--serve"] if stats else [sys.executable, "-m", "keel", "serve"]
    )
    began = time.monotonic()
    proc = subprocess.Popen(
        [*command, "--port", "0"],
        cwd=project,
        env={**env, "ANTHROPIC_BASE_URL": model_url},
        stdout=subprocess.PIPE,
        text=True,
    )
    line = first_line(proc, "keel serve")
    if not line.startswith("keel serve: listening on "):
        raise SystemExit(f"bench_serve_scale: keel serve said {line!r}")
    # Its stdout is not read again: drain it so that it never blocks.
    assert proc.stdout is not None
    out = proc.stdout
    threading.Thread(target=out.read, daemon=True).start()
    return proc, line.split()[4], began


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


# -- numbers ---------------------------------------------------------------------------------------


def slope_per_hour(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, value), per hour."""
    if len(points) < 2:
        return 0.0
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return 0.0 if den == 0 else sum((x - mx) * (y - my) for x, y in points) / den * 3600


# -- clients ---------------------------------------------------------------------------------------


class Bench:
    def __init__(self, url: str, pid: int, concurrency: int) -> None:
        import httpx

        self.pid = pid
        limits = httpx.Limits(max_connections=concurrency * 4 + 16, max_keepalive_connections=64)
        self.client = httpx.AsyncClient(
            base_url=url,
            headers={"authorization": f"Bearer {TOKEN}"},
            timeout=httpx.Timeout(120.0),
            limits=limits,
        )
        self.latencies: list[float] = []
        self.runs = 0
        self.errors: list[str] = []

    async def aclose(self) -> None:
        await self.client.aclose()

    async def stats(self, **params: str) -> dict[str, Any]:
        r = await self.client.get("/bench/stats", params=params)
        r.raise_for_status()
        return {**proc_stats(self.pid), **r.json()}

    async def create(self) -> str:
        r = await self.client.post("/v1/sessions", json={"model": MODEL})
        if r.status_code != 201:
            raise RuntimeError(f"create: {r.status_code} {r.text}")
        return str(r.json()["id"])

    async def delete(self, sid: str) -> None:
        r = await self.client.delete(f"/v1/sessions/{sid}")
        if r.status_code != 204:
            raise RuntimeError(f"delete: {r.status_code} {r.text}")

    async def run(self, sid: str, *, turns: int, leave_early: bool = False) -> None:
        """One prompt on `sid`, followed over SSE until its `result` (or, `leave_early`, its first
        text delta); the POST waits for the run's end either way."""
        subscribed = asyncio.Event()
        follow = asyncio.create_task(self._follow(sid, subscribed, leave_early))
        try:
            await asyncio.wait_for(subscribed.wait(), 60)
            r = await self.client.post(
                f"/v1/sessions/{sid}/prompt", json={"text": f"read turns={turns}", "wait": True}
            )
            if r.status_code != 200 or r.json().get("is_error"):
                raise RuntimeError(f"prompt: {r.status_code} {r.text[:300]}")
            await asyncio.wait_for(follow, 60)
        finally:
            follow.cancel()
        self.runs += 1

    async def _follow(self, sid: str, subscribed: asyncio.Event, leave_early: bool) -> None:
        event = ""
        async with self.client.stream("GET", f"/v1/sessions/{sid}/events") as response:
            async for line in response.aiter_lines():
                if line.startswith("retry:"):
                    subscribed.set()  # the ring has this subscriber: nothing after is missed
                elif line.startswith("event: "):
                    event = line[7:]
                elif line.startswith("data: "):
                    if event == "text_delta":
                        now = time.monotonic()
                        text = json.loads(line[6:])["text"]
                        self.latencies.extend(now - float(s) for s in STAMP.findall(text))
                        if leave_early:
                            return
                    elif event == "result":
                        return

    async def rate(self, fn: Any, seconds: float, concurrency: int) -> dict[str, float]:
        """Requests/s of `fn(i)` from `concurrency` clients for `seconds`."""
        done = 0
        times: list[float] = []
        end = time.monotonic() + seconds

        async def client(k: int) -> None:
            nonlocal done
            i = k
            while time.monotonic() < end:
                began = time.monotonic()
                if not await fn(i):
                    return
                times.append(time.monotonic() - began)
                done += 1
                i += concurrency

        began = time.monotonic()
        await asyncio.gather(*(client(k) for k in range(concurrency)))
        took = time.monotonic() - began
        return {"requests": done, "per_second": round(done / took, 1), **summary(times)}


async def gather_limited(count: int, concurrency: int, fn: Any) -> list[Any]:
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> Any:
        async with gate:
            return await fn(i)

    return list(await asyncio.gather(*(one(i) for i in range(count))))


# -- phases ----------------------------------------------------------------------------------------


def startup(project: Path, env: dict[str, str], model_url: str, runs: int) -> dict[str, Any]:
    """Process start -> GET /v1/info 200, and -> the first prompt's result (real `keel serve`)."""
    import httpx

    to_info: list[float] = []
    to_answer: list[float] = []
    to_listening: list[float] = []
    # As an installed keel starts: from bytecode (kept outside the tree), which a first, untimed
    # start writes.
    env = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(project.parent / "pycache")
    for n in range(runs + 1):
        if n == 1:
            for kept in (to_info, to_answer, to_listening):
                kept.clear()
        proc, url, began = start_serve(project, env, model_url, stats=False)
        to_listening.append(time.monotonic() - began)
        try:
            with httpx.Client(
                base_url=url, headers={"authorization": f"Bearer {TOKEN}"}, timeout=60
            ) as c:
                assert c.get("/v1/info").status_code == 200
                to_info.append(time.monotonic() - began)
                sid = c.post("/v1/sessions", json={"model": MODEL}).json()["id"]
                r = c.post(
                    f"/v1/sessions/{sid}/prompt", json={"text": "read turns=1", "wait": True}
                )
                assert r.status_code == 200, r.text
                to_answer.append(time.monotonic() - began)
        finally:
            stop(proc)
    return {
        "runs": runs,
        "listening_ms": round(statistics.median(to_listening) * 1000, 1),
        "info_ms": round(statistics.median(to_info) * 1000, 1),
        "first_answer_ms": round(statistics.median(to_answer) * 1000, 1),
    }


async def scale(args: argparse.Namespace, url: str, pid: int) -> dict[str, Any]:
    bench = Bench(url, pid, max(args.active, args.concurrency))
    out: dict[str, Any] = {}
    try:
        out.update(await load_idle(bench, args))
        out["requests"] = await requests(bench, args, out.pop("_idle"))
        out["active"] = await active(bench, args)
        out["soak"] = await soak(bench, args)
        out["errors"] = bench.errors[:20]
    finally:
        await bench.aclose()
    return out


async def load_idle(bench: Bench, args: argparse.Namespace) -> dict[str, Any]:
    # The first session imports the agent, its tools and the provider: not a per-session cost.
    warm = await bench.create()
    await bench.run(warm, turns=1)
    await bench.delete(warm)
    bench.latencies.clear()
    await asyncio.sleep(0.2)
    before = await bench.stats(gc="1")
    began = time.monotonic()
    ids = await gather_limited(args.idle, 8, lambda i: bench.create())
    took = time.monotonic() - began
    await asyncio.sleep(0.2)
    after = await bench.stats(gc="1")
    per_kb = (after["rss_mb"] - before["rss_mb"]) * 1024 / args.idle
    log(
        f"{args.idle} idle sessions: {after['rss_mb'] - before['rss_mb']:.1f} MB, {per_kb:.1f} KB each"
    )
    return {
        "idle": {
            "sessions": args.idle,
            "created_per_second": round(args.idle / took, 1),
            "rss_before_mb": before["rss_mb"],
            "rss_after_mb": after["rss_mb"],
            "per_session_kb": round(per_kb, 1),
            "fds_before": before["fds"],
            "fds_after": after["fds"],
            "gc_objects_per_session": round(
                (after["gc_objects"] - before["gc_objects"]) / args.idle, 1
            ),
            "full_collection_ms_before": before["gc_collect_ms"],
            "full_collection_ms_after": after["gc_collect_ms"],
        },
        "_idle": ids,
    }


async def requests(bench: Bench, args: argparse.Namespace, ids: list[str]) -> dict[str, Any]:
    c = bench.client

    async def ok(r: Any) -> bool:
        if r.status_code >= 400:
            bench.errors.append(f"{r.request.method} {r.request.url.path}: {r.status_code}")
        return True

    async def list_sessions(i: int) -> bool:
        return await ok(await c.get("/v1/sessions"))

    async def get_session(i: int) -> bool:
        return await ok(await c.get(f"/v1/sessions/{ids[i % len(ids)]}"))

    async def info(i: int) -> bool:
        return await ok(await c.get("/v1/info"))

    prompted: list[str] = []

    async def prompt(i: int) -> bool:
        if i >= len(ids):
            return False  # each idle session is prompted once
        prompted.append(ids[i])
        r = await c.post(f"/v1/sessions/{ids[i]}/prompt", json={"text": "read turns=0"})
        return await ok(r)

    seconds, n = args.request_seconds, args.concurrency
    out = {
        "get_sessions_list": await bench.rate(list_sessions, seconds, n),
        "get_session": await bench.rate(get_session, seconds, n),
        "get_info": await bench.rate(info, seconds, n),
        "post_prompt": await bench.rate(prompt, seconds, n),
    }
    # The prompted runs end before the next phase.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        busy = [s for s in prompted if (await c.get(f"/v1/sessions/{s}")).json()["busy"]]
        if not busy:
            break
        await asyncio.sleep(0.2)
    log("requests/s: " + ", ".join(f"{k} {v['per_second']}" for k, v in out.items()))
    return out


async def active(bench: Bench, args: argparse.Namespace) -> dict[str, Any]:
    sids = await gather_limited(args.active, 8, lambda i: bench.create())
    if args.profile:
        await bench.client.get("/bench/stats", params={"profile": ""})
    bench.latencies.clear()
    began, runs0 = time.monotonic(), bench.runs
    for _ in range(args.active_rounds):
        await asyncio.gather(*(bench.run(s, turns=args.turns) for s in sids))
    took = time.monotonic() - began
    if args.profile:
        await bench.client.get(
            "/bench/stats", params={"profile": str(Path(args.profile).resolve())}
        )
    lat = summary(bench.latencies)
    for s in sids:
        await bench.delete(s)
    log(f"{args.active} active: {(bench.runs - runs0) / took:.1f} runs/s, latency {lat}")
    return {
        "sessions": args.active,
        "rounds": args.active_rounds,
        "turns_per_run": args.turns + 1,
        "runs_per_second": round((bench.runs - runs0) / took, 2),
        "latency": lat,
    }


async def soak(bench: Bench, args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(32)
    bench.latencies.clear()
    samples: list[dict[str, Any]] = []
    sink: TextIO | None = args.sink
    began = time.monotonic()
    end = began + args.soak_seconds
    runs0 = bench.runs
    start = await bench.stats(gc="1")
    counts = {"created": 0, "deleted": 0, "left_early": 0}
    most: int = args.soak_runs

    def more() -> bool:
        return time.monotonic() < end and bench.runs - runs0 < most

    async def client() -> None:
        while more():
            sid = await bench.create()
            counts["created"] += 1
            for _ in range(rng.randint(1, 8)):
                if not more():
                    break
                early = rng.random() < 1 / 3
                counts["left_early"] += early
                try:
                    await bench.run(sid, turns=args.turns, leave_early=early)
                except (RuntimeError, TimeoutError) as exc:
                    bench.errors.append(str(exc)[:200])
                if args.think:
                    await asyncio.sleep(rng.uniform(0, 2 * args.think))
            await bench.delete(sid)
            counts["deleted"] += 1

    async def take(**stats: str) -> dict[str, Any]:
        """One sample of the server's counts, kept and written to the samples file."""
        sample = {
            "t": round(time.monotonic() - began, 1),
            "runs": bench.runs - runs0,
            **await bench.stats(**stats),
        }
        samples.append(sample)
        if sink is not None:
            sink.write(json.dumps(sample) + "\n")
            sink.flush()
        return sample

    async def sampler() -> None:
        while True:
            await take()
            if not more():
                return
            await asyncio.sleep(args.sample_every)

    sampling = asyncio.create_task(sampler())
    await asyncio.gather(*(client() for _ in range(args.active)))
    await asyncio.sleep(0.5)  # the last deletes' streams end
    sampling.cancel()
    final = await take(gc="1")  # the last one after a full collection
    took = time.monotonic() - began
    tenth = max(1, len(samples) // 10)
    settled = samples[tenth:] if len(samples) > 3 else samples

    def window(part: list[dict[str, Any]]) -> dict[str, float]:
        return {k: round(statistics.fmean(s[k] for s in part), 2) for k in COUNTS}

    out = {
        "seconds": round(took, 1),
        "runs": bench.runs - runs0,
        "runs_per_second": round((bench.runs - runs0) / took, 2),
        **counts,
        "latency": summary(bench.latencies),
        "samples": len(samples),
        "rss_slope_mb_per_hour": round(slope_per_hour([(s["t"], s["rss_mb"]) for s in settled]), 2),
        "first_window": window(samples[:tenth]),
        "last_window": window(samples[-tenth:]),
        "start": {k: start[k] for k in (*COUNTS, "gc_objects")},
        "end": {
            k: final[k]
            for k in (
                "gc_enabled",
                "gc_frozen",
                "gc_full_collections",
                "gc_full_max_ms",
                *COUNTS,
                "gc_objects",
            )
        },
    }
    log(
        f"soak: {out['runs']} runs in {out['seconds']} s, RSS slope {out['rss_slope_mb_per_hour']} MB/h"
    )
    return out


# -- main ------------------------------------------------------------------------------------------


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--quick", action="store_true", help="small counts and a short soak (a smoke run)"
    )
    p.add_argument("--idle", type=int, default=1000, help="idle sessions loaded (default 1000)")
    p.add_argument("--active", type=int, default=50, help="sessions running at once (default 50)")
    p.add_argument(
        "--active-rounds", type=int, default=5, help="rounds of the active phase (default 5)"
    )
    p.add_argument("--turns", type=int, default=2, help="tool calls per run (default 2)")
    p.add_argument("--concurrency", type=int, default=16, help="API clients at once (default 16)")
    p.add_argument(
        "--request-seconds", type=float, default=5.0, help="seconds per route (default 5)"
    )
    p.add_argument("--startup-runs", type=int, default=5, help="server starts timed (default 5)")
    p.add_argument("--soak-seconds", type=float, default=3600.0, help="soak length (default 3600)")
    p.add_argument("--soak-runs", type=int, default=1_000_000, help="at most this many soak runs")
    p.add_argument(
        "--sample-every", type=float, default=30.0, help="seconds between samples (default 30)"
    )
    p.add_argument(
        "--think",
        type=float,
        default=0.0,
        help="soak clients wait 0 to 2x this many seconds between runs (default 0: none)",
    )
    p.add_argument("--samples", metavar="F", help="also write each soak sample to F (JSON lines)")
    p.add_argument(
        "--profile", metavar="F", help="cProfile the server through the active phase into F"
    )
    p.add_argument("--no-startup", action="store_true", help="skip the start-up measure")
    p.add_argument("--startup-only", action="store_true", help="only the start-up measure")
    args = p.parse_args(argv)
    if args.quick:
        given = set(argv)
        for flag, value in (
            ("--idle", 20),
            ("--active", 5),
            ("--active-rounds", 2),
            ("--request-seconds", 0.5),
            ("--startup-runs", 1),
            ("--soak-seconds", 5.0),
            ("--sample-every", 1.0),
            ("--concurrency", 4),
        ):
            if flag not in given:
                setattr(args, flag[2:].replace("-", "_"), value)
    return args


def main(argv: list[str]) -> int:
    if argv[:1] == ["--model-server"]:
        model_server()
        return 0
    if argv[:1] == ["--serve"]:
        return serve_with_stats(argv[1:])
    args = parse(argv)
    project, env = make_world()
    model, model_url = start_model_server()
    try:
        result: dict[str, Any] = {
            "idle_sessions": args.idle,
            "active_sessions": args.active,
            "python": sys.version.split()[0],
            "cores": os.cpu_count(),
        }
        if not args.no_startup:
            result["startup"] = startup(project, env, model_url, args.startup_runs)
            log(f"start-up: {result['startup']}")
        if args.startup_only:
            print(json.dumps(result, indent=2))
            return 0
        proc, url, _ = start_serve(project, env, model_url, stats=True)
        try:
            with contextlib.ExitStack() as stack:
                given = Path(args.samples) if args.samples else None
                args.sink = (
                    stack.enter_context(given.open("w", encoding="utf-8")) if given else None
                )
                result.update(asyncio.run(scale(args, url, proc.pid)))
        finally:
            stop(proc)
    finally:
        if model.stdin is not None:
            model.stdin.close()
        stop(model)
        shutil.rmtree(project.parent, ignore_errors=True)  # thousands of session files
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
