"""Benchmark: the import audit. Which modules `keel --version` and `keel -p` (up to the moment its
first model request leaves the process) import, what they cost, and whether a heavy one is among
them.

Exits 1 when a module of the deny list below is imported on either path (the benchmark's check,
not the tests'). The `-p` run talks to the loopback Anthropic server (`bench_server.py`, its own
process); the moment of the first request is the first `socket.connect` to that server's port,
caught with an audit hook (which imports nothing), where the keel process writes `sys.modules`.

Run: `python bench/bench_imports.py [--json out.json] [--top N]`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_loop import MODEL, bench_server, make_project  # noqa: E402

#: Heavy packages (and keel's own front ends that pull them in) that neither path may import.
DENY = (
    "anthropic",
    "openai",
    # Model calls go over keel's own client when no proxy is set, and keel builds its own TLS
    # context: httpx (~80 ms) is for proxies, the web tools and MCP; aiohttp is not used.
    "httpx",
    "aiohttp",
    "google.genai",
    "textual",
    "rich",
    "mcp",
    "starlette",
    "uvicorn",
    "nats",
    "playwright",
    "opentelemetry",
    "pydantic",
    "pydantic_core",
    "acp",
    "keel.acp",
    "keel.server",
    "keel.tui.app",
    "keel.fleet",
    "keel.remote",
)

#: Run in the keel process: record the modules at the first connect to `port`, then run keel.
PRELUDE = r"""
import sys
_port, _out = int(sys.argv[1]), sys.argv[2]
del sys.argv[1:3]
_done = []
def _hook(event, args):
    if _done or event != "socket.connect":
        return
    addr = args[1]
    if isinstance(addr, tuple) and len(addr) >= 2 and addr[1] == _port:
        _done.append(1)
        with open(_out, "w", encoding="utf-8") as f:
            f.write("\n".join(sorted(k for k, v in sys.modules.items() if v is not None)))
sys.addaudithook(_hook)
from keel.cli.main import main
rc = main(sys.argv[1:])
if _port == 0:
    with open(_out, "w", encoding="utf-8") as f:
        f.write("\n".join(sorted(k for k, v in sys.modules.items() if v is not None)))
sys.exit(rc)
"""

_LINE = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)")


def denied(modules: list[str]) -> list[str]:
    return sorted(m for m in modules if any(m == d or m.startswith(d + ".") for d in DENY))


def import_costs(stderr: str, modules: set[str]) -> dict[str, int]:
    """Self time (µs) of every module in `modules`, from `-X importtime` output."""
    costs: dict[str, int] = {}
    for line in stderr.splitlines():
        m = _LINE.match(line)
        if m and m.group(4) in modules:
            costs[m.group(4)] = int(m.group(1))
    return costs


def audit(args: list[str], *, port: int, env: dict[str, str], cwd: Path) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".txt", delete=False) as tmp:
        out = Path(tmp.name)
    try:
        proc = subprocess.run(
            [sys.executable, "-X", "importtime", "-c", PRELUDE, str(port), str(out), *args],
            capture_output=True,
            text=True,
            env=env,
            cwd=cwd,
            check=False,
        )
        modules = out.read_text(encoding="utf-8").split("\n") if out.stat().st_size else []
    finally:
        out.unlink(missing_ok=True)
    if not modules:
        raise RuntimeError(f"no module list for {args}: rc {proc.returncode}: {proc.stderr[-500:]}")
    costs = import_costs(proc.stderr, set(modules))
    keel_costs = {k: v for k, v in costs.items() if k == "keel" or k.startswith("keel.")}
    return {
        "modules": len(modules),
        "keel_modules": len(keel_costs),
        "import_ms": sum(costs.values()) / 1000,
        "keel_import_ms": sum(keel_costs.values()) / 1000,
        "denied": denied(modules),
        "top": sorted(costs.items(), key=lambda kv: -kv[1]),
        "all": modules,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--top", type=int, default=15, help="show the N costliest modules")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="keel-bench-imports-"))
    project = make_project(work / "project")
    results: dict[str, Any] = {}
    with bench_server() as url:
        port = int(url.rsplit(":", 1)[1])
        env = {
            **os.environ,
            "ANTHROPIC_API_KEY": "bench",
            "ANTHROPIC_BASE_URL": url,
            "KEEL_HOME": str(work / "home"),
        }
        results["version"] = audit(["--version"], port=0, env=env, cwd=project)
        prompt = ["-p", "turns=0 hello", "--model", f"anthropic/{MODEL}", "-q"]
        audit(prompt, port=port, env=env, cwd=project)  # warm the page cache
        results["print_first_request"] = audit(prompt, port=port, env=env, cwd=project)
    failed = False
    for name, r in results.items():
        print(
            f"{name}: {r['modules']} modules ({r['keel_modules']} of keel), "
            f"import self-time {r['import_ms']:.1f} ms (keel's {r['keel_import_ms']:.1f} ms)"
        )
        for module, micros in r["top"][: args.top]:
            print(f"    {micros / 1000:7.2f} ms  {module}")
        if r["denied"]:
            failed = True
            print(f"  HEAVY MODULES IMPORTED: {', '.join(r['denied'])}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print("import audit:", "FAILED" if failed else "ok (no module of the deny list)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
