"""Remote tools: tools one keel agent serves to others over NATS, agent to agent
(docs/remote-tools.md).

- `keel.remote.protocol`: subjects, limits and every message as versioned, validated JSON;
- `keel.remote.server`: `ToolServer`, what `keel serve-tools` runs (which tools may be served,
  the serving side's gate that never asks);
- `keel.remote.client`: `Peer` (discovery and calls: ack, keepalives, capacity retries, cancel)
  and `RemoteTool`, the tools `remote_tools` in the settings import.

Nothing here is imported by `keel` or `keel -p` unless remote tools are configured or served:
nats-py loads lazily.
"""
