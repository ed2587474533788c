"""A tiny language server for keel's LSP tests: it speaks LSP over stdio (Content-Length framed
JSON-RPC) and pushes diagnostics that the document's text asks for.

- a line `ERR message` gives an error at that line (`fake` as its source, code `E1`);
  `WARN message` a warning;
- `SLOW` anywhere: the diagnostics are published 1.5 s late;
- `CRASH` anywhere: the server exits at once with code 3;
- with `FAKE_LSP_PIDS` set, it starts a child (`sleep 300`, in its own process group) and
  appends "<its pid> <the child's pid>" to that file, so a test can check both are gone;
- with `FAKE_LSP_PULL=1` it offers pull diagnostics (`diagnosticProvider`) and pushes none;
  then it also asks the client for its `fake.level` configuration once initialized, and
  answers diagnostic requests only once it has the answer, with one more error saying it.
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


class Pull:
    """Pull mode: the documents' texts, the configuration once answered, waiting requests."""

    def __init__(self) -> None:
        self.texts: dict[str, str] = {}
        self.level: object = None
        self.answered = False
        self.waiting: list[tuple[object, str]] = []

    def report(self, rid: object, uri: str) -> None:
        items = diagnostics(self.texts.get(uri, ""))
        items.append(
            {
                "range": {"start": {"line": 0, "character": 0}, "end": {"line": 0, "character": 0}},
                "severity": 1,
                "message": f"level is {json.dumps(self.level)}",
            }
        )
        send({"id": rid, "result": {"kind": "full", "items": items}})


def serve_pull(message: dict[str, object], pull: Pull) -> bool:
    """Handle `message` in pull mode; False when it is not pull mode's to handle."""
    method, params = message.get("method"), message.get("params")
    if method == "initialized":
        send({"id": "config", "method": "workspace/configuration",
              "params": {"items": [{"section": "fake.level"}]}})  # fmt: skip
    elif message.get("id") == "config" and method is None:
        result = message.get("result")
        pull.level = result[0] if isinstance(result, list) and result else None
        pull.answered = True
        for rid, uri in pull.waiting:
            pull.report(rid, uri)
        pull.waiting.clear()
    elif method in ("textDocument/didOpen", "textDocument/didChange") and isinstance(params, dict):
        doc = params["textDocument"]
        text = doc["text"] if method.endswith("didOpen") else params["contentChanges"][-1]["text"]
        if "CRASH" in text:
            os._exit(3)
        pull.texts[doc["uri"]] = text
    elif method == "textDocument/diagnostic" and isinstance(params, dict):
        uri = params["textDocument"]["uri"]
        if pull.answered:
            pull.report(message["id"], uri)
        else:
            pull.waiting.append((message["id"], uri))
    else:
        return False
    return True


def main() -> None:
    pull = Pull() if os.environ.get("FAKE_LSP_PULL") == "1" else None
    pids = os.environ.get("FAKE_LSP_PIDS")
    if pids:
        child = subprocess.Popen(["sleep", "300"])
        with open(pids, "a", encoding="utf-8") as f:
            f.write(f"{os.getpid()} {child.pid}\n")
    while (message := read()) is not None:
        method = message.get("method")
        params = message.get("params")
        assert isinstance(params, dict) or params is None
        if pull is not None and serve_pull(message, pull):
            continue
        if method == "initialize":
            capabilities: dict[str, object] = {"textDocumentSync": {"openClose": True, "change": 1}}
            if pull is not None:
                capabilities["diagnosticProvider"] = {
                    "interFileDependencies": False,
                    "workspaceDiagnostics": False,
                }
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
