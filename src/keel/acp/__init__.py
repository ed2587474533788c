"""keel as an Agent Client Protocol agent (`keel acp`): editors such as Zed drive keel's sessions
over JSON-RPC on stdio (docs/acp.md).

- `keel.acp.updates`: events and journal records as `session/update` payloads (pure).
- `keel.acp.agent`: the protocol's agent side: sessions, prompts, permission questions, modes.
- `keel.acp.lines`: the framing (capped JSON lines; what is not a message is answered).
- `keel.acp.stdio`: the transport (stdin/stdout taken for the protocol alone).

A front end like the TUI: it builds agents through `keel.app` and only renders events and routes
answers. Imports the `acp` package, so nothing on `keel --version`'s or `keel -p`'s path may
import this package.
"""
