"""`keel serve`: keel's sessions over HTTP with Server-Sent Events (docs/server.md).

A front end like the TUI: it builds agents through `keel.app`, turns their events into SSE
messages (`ring`), and routes answers to their questions; it decides nothing about permissions
(the gate, hooks and sandbox apply as in the TUI). Imported only by `keel serve`: Starlette and
uvicorn stay out of `keel --version` and `keel -p`.
"""
