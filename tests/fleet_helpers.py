"""Shared pieces of the fleet tests: streams on a real nats-server, `keel` commands as real
processes, worker processes, scripted runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from keel.fleet.connect import Bridge
from keel.fleet.journal import JetStreamStore
from keel.fleet.setup import ensure_streams_sync
from keel.session.records import Record


def setup_fleet(url: str, replicas: int = 1) -> None:
    bridge = Bridge(url)
    try:
        ensure_streams_sync(bridge, replicas=replicas)
    finally:
        bridge.close()


def with_fleet(url: str, fn: Any) -> Any:
    """`await fn(fleet)` with a `Fleet` client open on `url`, from synchronous test code."""
    import asyncio

    from keel.fleet.runs import Fleet

    async def go() -> Any:
        fleet = await Fleet.open(url)
        try:
            return await fn(fleet)
        finally:
            await fleet.close()

    return asyncio.run(go())


def keel(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "keel", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env or dict(os.environ),
        check=False,
    )


def keel_json(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> Any:
    out = keel(*args, "--json", env=env, timeout=timeout)
    assert out.returncode in (0, 1), out
    return json.loads(out.stdout)


class WorkerProc:
    """One `keel worker` process; its stderr goes to a file (read it with `log`)."""

    def __init__(
        self,
        url: str,
        scratch: Path,
        name: str,
        *,
        concurrency: int = 1,
        env: dict[str, str] | None = None,
        labels: str = "",
    ) -> None:
        self.name = name
        self.log_path = scratch.parent / f"{name}.log"
        self._log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "keel",
                "worker",
                "--nats",
                url,
                "--scratch",
                str(scratch),
                "--name",
                name,
                "--concurrency",
                str(concurrency),
                *(["--labels", labels] if labels else []),
            ],
            stdout=subprocess.DEVNULL,
            stderr=self._log,
            # The worker shares the test's directory with runs (path workspaces, local git
            # remotes are refused outside KEEL_WORKSPACE_ROOTS).
            env={"KEEL_WORKSPACE_ROOTS": str(scratch.parent), **(env or os.environ)},
            start_new_session=True,
        )

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def terminate(self, wait: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(wait)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode

    def close(self) -> None:
        self.kill()
        # Whatever the worker's tools started in their own groups goes with the test.
        self._log.close()


def script(path: Path, turns: list[dict[str, Any]]) -> str:
    """A scripted model file; returns the `--model` value that plays it."""
    path.write_text(json.dumps({"model": path.stem, "turns": turns}), encoding="utf-8")
    return f"scripted:{path}"


def edit_script(tmp: Path, name: str, marker: str) -> str:
    """A scripted model that writes `marker` to out.txt (one `write` call), then says so."""
    return script(
        tmp / f"{name}.json",
        [
            {
                "text": "I'll write the file.",
                "tool_calls": [
                    {
                        "id": f"toolu_{name}_1",
                        "name": "write",
                        "input": {"path": "out.txt", "content": marker},
                    }
                ],
            },
            {"text": f"Wrote {marker}."},
        ],
    )


def read_run(url: str, run: str, scratch: Path) -> list[Record]:
    store = JetStreamStore.connect(url, scratch=scratch)
    try:
        return store.read(run).records
    finally:
        store.close()


def wait_for(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")
