"""Benchmark: cold start, keel beside Codex. Process start → the first model request, in a fresh
project and a fresh home each run (what a CI job or a script pays every time), both talking to one
loopback server that speaks OpenAI's Responses API (`keel.testing.openai_server`).

keel runs `keel -p PROMPT --model openai/gpt-5` with `OPENAI_BASE_URL` pointed at the server;
Codex runs `codex exec PROMPT` with a custom provider whose `wire_api` is `responses`, written
into a fresh `CODEX_HOME`. The clock starts just before the process is spawned and stops when
the server receives the first `POST …/responses`; the reply is a one-line answer, so both
processes end at once. Runs interleave (keel, Codex, keel, …) so both meet the same machine.

Codex is not a dependency of keel: `--install-codex` puts `@openai/codex@VERSION` in
`~/.cache/keel-bench/` with npm (once), or `--codex PATH` names a binary you have.

`--baseline SRC` adds a third contender, "before": this keel with another checkout's `src/`
first on PYTHONPATH (say, `git worktree add /tmp/before <commit>`; its dependencies must be
installed here), to read a change's effect in the same interleaved run.

`--stages` runs keel alone under `bench/cold_stages.py` and tables where its time goes: each
stage's start and end (medians, wall and CPU milliseconds from process start), from the
interpreter's own start-up through the imports, settings, the agent's assembly, the session
file and the `/undo` unit to the first request.

Run: `python bench/bench_cold_start.py [--runs 7] [--install-codex] [--baseline SRC]
[--json out.json] [--stages]`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from keel.llm.messages import Message, Text, Usage
from keel.llm.script import Reply, Step
from keel.testing.openai_server import OpenAIResponsesServer
from keel.testing.server import RecordedRequest, ResponseWriter

HERE = Path(__file__).resolve().parent
CODEX_VERSION = "0.169.1"
CACHE = Path.home() / ".cache" / "keel-bench"
PROMPT = "say hello"


class ColdServer(OpenAIResponsesServer):
    """Answers every model request with one line, and notes when the first one arrived."""

    def __init__(self) -> None:
        super().__init__(responder=self.answer)
        self.first_at: float | None = None
        self.arrived = threading.Event()

    @staticmethod
    def answer(request: RecordedRequest) -> Step:
        return Reply(Message("assistant", (Text("hello"),)), Usage(input=900, output=3))

    def reset(self) -> None:
        self.first_at = None
        self.arrived.clear()
        self.requests.clear()

    async def handle(self, request: RecordedRequest, response: ResponseWriter) -> None:
        path = request.path.split("?")[0]
        if request.method == "POST" and path.endswith("/responses") and self.first_at is None:
            self.first_at = time.perf_counter()
            self.arrived.set()
        await super().handle(request, response)


def keel_command() -> list[str]:
    script = Path(sys.executable).parent / "keel"
    return [str(script)] if script.exists() else [sys.executable, "-m", "keel"]


def install_codex() -> Path:
    prefix = CACHE / f"codex-{CODEX_VERSION}"
    binary = prefix / "node_modules" / ".bin" / "codex"
    if not binary.exists():
        prefix.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["npm", "install", "--prefix", str(prefix), "--no-audit", "--no-fund",
             "--loglevel=error", f"@openai/codex@{CODEX_VERSION}"],
            check=True,
        )  # fmt: skip
    return binary


def fresh_project(root: Path) -> Path:
    project = root / "project"
    project.mkdir()
    (project / "README.md").write_text("# a project\n", encoding="utf-8")
    (project / "main.py").write_text("print('hello')\n", encoding="utf-8")
    return project


def keel_run(
    url: str, root: Path, src: Path | None = None
) -> tuple[list[str], dict[str, str], Path]:
    home = root / "home"
    home.mkdir()
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(home),
        "KEEL_HOME": str(home / ".keel"),
        "OPENAI_API_KEY": "bench",
        "OPENAI_BASE_URL": url + "/v1",
        "LANG": "C.UTF-8",
    }
    if src is not None:
        env["PYTHONPATH"] = str(src)
    return [*keel_command(), "-p", PROMPT, "--model", "openai/gpt-5", "-q"], env, home


def codex_run(codex: Path, url: str, root: Path) -> tuple[list[str], dict[str, str], Path]:
    home = root / "home"
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True)
    (codex_home / "config.toml").write_text(
        'model = "gpt-5"\n'
        'model_provider = "loopback"\n'
        "[model_providers.loopback]\n"
        'name = "loopback"\n'
        f'base_url = "{url}/v1"\n'
        'wire_api = "responses"\n'
        'env_key = "LOOPBACK_API_KEY"\n',
        encoding="utf-8",
    )
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(home),
        "CODEX_HOME": str(codex_home),
        "LOOPBACK_API_KEY": "bench",
        "LANG": "C.UTF-8",
    }
    cmd = [str(codex), "exec", "--skip-git-repo-check", PROMPT]
    return cmd, env, home


def time_one(
    server: ColdServer, who: str, codex: Path | None, baseline: Path | None = None
) -> float:
    """Milliseconds from spawn to the first model request, in a fresh project and home."""
    with tempfile.TemporaryDirectory(prefix=f"cold-{who}-") as tmp:
        root = Path(tmp)
        project = fresh_project(root)
        if who == "keel":
            cmd, env, _ = keel_run(server.url, root)
        elif who == "before":
            cmd, env, _ = keel_run(server.url, root, baseline)
        else:
            assert codex is not None
            cmd, env, _ = codex_run(codex, server.url, root)
        server.reset()
        start = time.perf_counter()
        proc = subprocess.Popen(
            cmd,
            cwd=project,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        if not server.arrived.wait(60):
            proc.kill()
            _, err = proc.communicate()
            raise RuntimeError(f"{who} made no model request: {err.decode()[-2000:]}")
        assert server.first_at is not None
        took = (server.first_at - start) * 1000
        _, err = proc.communicate(timeout=60)
        if proc.returncode != 0:
            raise RuntimeError(f"{who} exited {proc.returncode}: {err.decode()[-2000:]}")
        return took


def stages_once(server: ColdServer) -> dict[str, tuple[float, float]]:
    """One run under bench/cold_stages.py: each stage's (wall, CPU) ms from process start."""
    with tempfile.TemporaryDirectory(prefix="cold-stages-") as tmp:
        root = Path(tmp)
        project = fresh_project(root)
        cmd, env, _ = keel_run(server.url, root)
        out = root / "stages.json"
        cmd = [sys.executable, str(HERE / "cold_stages.py"), str(out), *cmd[1:]]
        server.reset()
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=project, env=env, capture_output=True, timeout=60)
        if proc.returncode != 0 or server.first_at is None:
            raise RuntimeError(f"keel failed under cold_stages: {proc.stderr.decode()[-2000:]}")
        outside = (server.first_at - start) * 1000
        marks = {k: (v[0], v[1]) for k, v in json.loads(out.read_text()).items()}
        # The script's clock starts once the interpreter runs it: shift by what came before.
        before = outside - marks["first request"][0]
        shifted = {k: (wall + before, cpu) for k, (wall, cpu) in marks.items()}
        shifted["interpreter start-up>"] = (0.0, 0.0)
        shifted["<interpreter start-up"] = (before, 0.0)
        return shifted


def stages(server: ColdServer, runs: int) -> list[dict[str, Any]]:
    """The medians of `runs` runs' stages, in the order they start."""
    stages_once(server)  # unmeasured: the page cache
    samples = [stages_once(server) for _ in range(runs)]
    names = [k[:-1] for k in samples[0] if k.endswith(">")]
    rows: list[dict[str, Any]] = []
    for name in names:
        begin = [s[name + ">"] for s in samples if name + ">" in s]
        end = [s["<" + name] for s in samples if "<" + name in s]
        rows.append({
            "stage": name,
            "start_ms": round(statistics.median(b[0] for b in begin), 1),
            "end_ms": round(statistics.median(e[0] for e in end), 1),
            "cpu_ms": round(statistics.median(e[1] - b[1] for b, e in zip(begin, end, strict=True)), 1),
        })  # fmt: skip
    rows.sort(key=lambda r: r["start_ms"])
    request = statistics.median(s["first request"][0] for s in samples)
    rows.append({"stage": "first request", "start_ms": round(request, 1), "end_ms": None})
    return rows


def print_stages(rows: list[dict[str, Any]]) -> None:
    print(f"{'stage':34} {'start':>8} {'end':>8} {'took':>7} {'cpu':>6}  (ms, medians)")
    for r in rows:
        if r["end_ms"] is None:
            print(f"{r['stage']:34} {r['start_ms']:8.1f}")
            continue
        took = r["end_ms"] - r["start_ms"]
        print(
            f"{r['stage']:34} {r['start_ms']:8.1f} {r['end_ms']:8.1f} {took:7.1f} {r['cpu_ms']:6.1f}"
        )


NO_CODEX = Path("/nonexistent/codex")


def find_codex(args: argparse.Namespace) -> Path:
    """The codex binary to run: --codex, the cached install, or one on PATH (else NO_CODEX)."""
    if args.codex:
        return Path(args.codex)
    if args.install_codex or (CACHE / f"codex-{CODEX_VERSION}").exists():
        return install_codex()
    found = shutil.which("codex")
    return Path(found) if found else NO_CODEX


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--codex", type=Path, help="a codex binary (else --install-codex)")
    parser.add_argument("--install-codex", action="store_true")
    parser.add_argument("--keel-only", action="store_true")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--baseline", type=Path, help="another checkout's src/, run as 'before'")
    parser.add_argument("--stages", action="store_true", help="keel alone: where its time goes")
    args = parser.parse_args(argv)
    if args.stages:
        with ColdServer() as server:
            rows = stages(server, args.runs)
        print_stages(rows)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
        return 0
    codex = None if args.keel_only else find_codex(args)
    if codex == NO_CODEX:
        print("no codex: pass --codex PATH or --install-codex (or --keel-only)")
        return 2
    who = ["keel"] + ([] if codex is None else ["codex"])
    if args.baseline is not None:
        if not (args.baseline / "keel" / "__init__.py").is_file():
            print(f"--baseline {args.baseline}: not a src/ folder holding keel/")
            return 2
        who.append("before")
    times: dict[str, list[float]] = {w: [] for w in who}
    with ColdServer() as server:
        for w in who:  # one unmeasured run each: the page cache, npm's and Python's
            time_one(server, w, codex, args.baseline)
        for _ in range(args.runs):
            for w in who:
                times[w].append(time_one(server, w, codex, args.baseline))
    result: dict[str, Any] = {
        w: {
            "median_ms": round(statistics.median(t), 1),
            "min_ms": round(min(t), 1),
            "max_ms": round(max(t), 1),
        }
        for w, t in times.items()
    }
    if codex is not None:
        result["ratio_keel_to_codex"] = round(
            result["keel"]["median_ms"] / result["codex"]["median_ms"], 3
        )
    for w in who:
        r = result[w]
        print(f"{w:6} median {r['median_ms']:7.1f} ms  (min {r['min_ms']}, max {r['max_ms']})")
    if "ratio_keel_to_codex" in result:
        print(f"keel / codex: {result['ratio_keel_to_codex']}")
    if "before" in result and codex is not None:
        result["ratio_before_to_codex"] = round(
            result["before"]["median_ms"] / result["codex"]["median_ms"], 3
        )
        print(f"before / codex: {result['ratio_before_to_codex']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
