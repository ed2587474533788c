"""Language servers (LSP) for diagnostics after edits: the client (`client`), which servers
there are (`servers`), the session's servers and the blocks the model reads (`manager`), and the
`diagnostics` tool (`tool`). Import the modules themselves: the package imports none of them, so
that checking whether any server can run here (`servers`) loads no client."""
