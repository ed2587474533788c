"""A tiny language server for keel's LSP tests: it speaks LSP over stdio (Content-Length framed
JSON-RPC) and pushes diagnostics that the document's text asks for.

- a line `ERR message` gives an error at that line (`fake` as its source, code `E1`);
  `WARN message` a warning;
- `SLOW` anywhere: the diagnostics are published 1.5 s late;
- `CRASH` anywhere: the server exits at once with code 3;
- with `FAKE_LSP_PIDS` set, it starts a child (`sleep 300`, in its own process group) and
  appends "<its pid> <the child's pid>" to that file, so a test can check both are gone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

OUT = sys.stdout.buffer
LOCK = threading.Lock()


def send(message: dict[str, object]) -> None:
    body = json.dumps({"jsonrpc": "2.0", **message}).encode()
    with LOCK:
        OUT.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        OUT.flush()


def read() -> dict[str, object] | None:
    length = 0
    while True:
        line = sys.stdin.buffer.readline()
        if not line:
            return None
        if line in (b"\r\n", b"\n"):
            break
        name, _, value = line.decode().partition(":")
        if name.lower() == "content-length":
            length = int(value)
    data: dict[str, object] = json.loads(sys.stdin.buffer.read(length))
    return data


def diagnostics(text: str) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for number, line in enumerate(text.splitlines()):
        for marker, severity in (("ERR ", 1), ("WARN ", 2)):
            at = line.find(marker)
            if at >= 0:
                out.append(
                    {
                        "range": {
                            "start": {"line": number, "character": at},
                            "end": {"line": number, "character": len(line)},
                        },
                        "severity": severity,
                        "source": "fake",
                        "code": "E1",
                        "message": line[at + len(marker) :],
                    }
                )
    return out


def publish(uri: str, version: int, text: str) -> None:
    if "CRASH" in text:
        os._exit(3)
    if "SLOW" in text:
        time.sleep(1.5)
    params = {"uri": uri, "version": version, "diagnostics": diagnostics(text)}
    send({"method": "textDocument/publishDiagnostics", "params": params})


def main() -> None:
    pids = os.environ.get("FAKE_LSP_PIDS")
    if pids:
        child = subprocess.Popen(["sleep", "300"])
        with open(pids, "a", encoding="utf-8") as f:
            f.write(f"{os.getpid()} {child.pid}\n")
    while (message := read()) is not None:
        method = message.get("method")
        params = message.get("params")
        assert isinstance(params, dict) or params is None
        if method == "initialize":
            capabilities = {"textDocumentSync": {"openClose": True, "change": 1}}
            send({"id": message["id"], "result": {"capabilities": capabilities}})
        elif method == "shutdown":
            send({"id": message["id"], "result": None})
        elif method == "exit":
            return
        elif method == "textDocument/didOpen" and params is not None:
            doc = params["textDocument"]
            threading.Thread(target=publish, args=(doc["uri"], doc["version"], doc["text"])).start()
        elif method == "textDocument/didChange" and params is not None:
            doc, changes = params["textDocument"], params["contentChanges"]
            text = changes[-1]["text"]
            threading.Thread(target=publish, args=(doc["uri"], doc["version"], text)).start()
        elif "id" in message:
            send({"id": message["id"], "result": None})


if __name__ == "__main__":
    main()
